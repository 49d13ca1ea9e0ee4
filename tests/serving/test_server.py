"""serving.server over real sockets on 127.0.0.1, against real SavedModels (conftest.py)."""

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2

from electra_tf.serving import model_config
from electra_tf.serving.client import GrpcClient, RestClient, ServingRequestError
from electra_tf.serving import server as model_server
from electra_tf.serving.server import ModelServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_BODY = 64 * 1024
MAX_BATCH = 8


@pytest.fixture(scope="module")
def server(model_base):
    with ModelServer(model_base, max_body_bytes=MAX_BODY, max_batch_size=MAX_BATCH) as s:
        yield s


@pytest.fixture
def rest(server):
    return RestClient("127.0.0.1", server.rest_port, "tiny")


@pytest.fixture
def grpc_channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield channel


def http(server, method, path, body=None, raw=None, headers=None):
    """(status, parsed JSON) for one request; never raises on 4xx/5xx."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.rest_port}{path}", data=data, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


PAIR = {"instances": [{"text": "a b c", "text_pair": "d"}, {"text": "x", "text_pair": ""}]}


# ----------------------------------------------------------------------------- REST


def test_status(server):
    assert http(server, "GET", "/v1/models/tiny") == (200, {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})
    assert http(server, "GET", "/v1/models/tiny/versions/1")[0] == 200


def test_metadata_matches_tf_serving_shape(server):
    status, md = http(server, "GET", "/v1/models/tiny/metadata")
    assert status == 200
    assert md["model_spec"] == {"name": "tiny", "signature_name": "", "version": "1"}
    defs = md["metadata"]["signature_def"]["signature_def"]
    assert {"serving_default", "single_text", "serve_ids", "echo", "__saved_model_init_op"} <= set(defs)
    text = defs["serving_default"]["inputs"]["text"]
    assert text["dtype"] == "DT_STRING"
    assert text["tensor_shape"] == {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    assert text["name"].endswith(":0")
    probs = defs["serving_default"]["outputs"]["probabilities"]
    assert probs["dtype"] == "DT_FLOAT" and [d["size"] for d in probs["tensor_shape"]["dim"]] == ["-1", "2"]
    assert defs["serving_default"]["method_name"] == "tensorflow/serving/predict"
    assert http(server, "GET", "/v1/models/tiny/versions/1/metadata")[1] == md


def test_predict_row_multi_input_multi_output(server):
    status, body = http(server, "POST", "/v1/models/tiny:predict", PAIR)
    assert status == 200
    # 4 words -> logits [2, 1] -> negative; 1 word -> [0.5, 1] -> positive.
    assert [p["label"] for p in body["predictions"]] == ["negative", "positive"]
    assert body["predictions"][0]["probabilities"] == pytest.approx([0.7310586, 0.26894143])


def test_predict_row_single_input_bare_values_and_b64(server):
    body = {"signature_name": "single_text", "instances": ["a b c", {"b64": base64.b64encode(b"x").decode()}]}
    status, out = http(server, "POST", "/v1/models/tiny/versions/1:predict", body)
    assert status == 200, out
    assert [p["label"] for p in out["predictions"]] == ["negative", "positive"]
    # Named objects work for a one-input signature too.
    named = {"signature_name": "single_text", "instances": [{"text": "a b c"}, {"text": "x"}]}
    assert http(server, "POST", "/v1/models/tiny:predict", named)[1] == out


def test_predict_columnar_and_single_output(server):
    body = {"signature_name": "serve_ids",
            "inputs": {"input_ids": [[1, 2], [3, 4]], "input_mask": [[1, 1], [1, 0]], "segment_ids": [[0, 1], [0, 0]]}}
    assert http(server, "POST", "/v1/models/tiny:predict", body) == (200, {"outputs": [[4.0, 1.0], [3.0, 1.0]]})
    # Row format with a single output: predictions is a plain list, one entry per example.
    rows = {"signature_name": "serve_ids", "instances": [
        {"input_ids": [1, 2], "input_mask": [1, 1], "segment_ids": [0, 1]}]}
    assert http(server, "POST", "/v1/models/tiny:predict", rows) == (200, {"predictions": [[4.0, 1.0]]})
    # Columnar, several outputs: an object of named tensors.
    columnar = {"inputs": {"text": ["a b c", "x"], "text_pair": ["d", ""]}}
    status, out = http(server, "POST", "/v1/models/tiny:predict", columnar)
    assert status == 200 and out["outputs"]["label"] == ["negative", "positive"]


def test_string_outputs_that_are_not_utf8_come_back_as_b64(server):
    body = {"signature_name": "echo", "inputs": ["ok", {"b64": base64.b64encode(b"\x00\xfe").decode()}]}
    status, out = http(server, "POST", "/v1/models/tiny:predict", body)
    assert status == 200
    assert [base64.b64decode(o["b64"]) for o in out["outputs"]] == [b"ok\xff", b"\x00\xfe\xff"]


BAD_REQUESTS = [
    # (name, method, path, body or raw bytes, expected status, words in the message)
    ("invalid JSON", "POST", "/v1/models/tiny:predict", b'{"instances": [', 400, "JSON parse error"),
    ("neither key", "POST", "/v1/models/tiny:predict", {"examples": []}, 400, "exactly one of"),
    ("wrong signature", "POST", "/v1/models/tiny:predict", {"signature_name": "nope", "instances": ["a"]}, 400, '"nope" not found'),
    ("wrong input name", "POST", "/v1/models/tiny:predict", {"instances": [{"text": "a", "txt_pair": "b"}]}, 400, "'txt_pair' is not an input"),
    ("missing input", "POST", "/v1/models/tiny:predict", {"inputs": {"text": ["a"]}}, 400, "text_pair"),
    ("wrong dtype", "POST", "/v1/models/tiny:predict",
     {"signature_name": "serve_ids", "inputs": {"input_ids": [["a"]], "input_mask": [[1]], "segment_ids": [[0]]}}, 400, "expected an integer"),
    ("float for int", "POST", "/v1/models/tiny:predict",
     {"signature_name": "serve_ids", "inputs": {"input_ids": [[1.5]], "input_mask": [[1]], "segment_ids": [[0]]}}, 400, "int32"),
    ("ragged", "POST", "/v1/models/tiny:predict",
     {"signature_name": "serve_ids", "inputs": {"input_ids": [[1, 2], [1]], "input_mask": [[1, 1], [1]], "segment_ids": [[0, 0], [0]]}}, 400, "ragged"),
    ("wrong rank", "POST", "/v1/models/tiny:predict", {"signature_name": "single_text", "inputs": [["a"]]}, 400, "shape"),
    ("empty batch", "POST", "/v1/models/tiny:predict", {"instances": []}, 400, "empty"),
    ("empty columnar batch", "POST", "/v1/models/tiny:predict", {"signature_name": "single_text", "inputs": []}, 400, "empty"),
    ("batch too large", "POST", "/v1/models/tiny:predict", {"signature_name": "single_text", "instances": ["a"] * (MAX_BATCH + 1)}, 400, "max_batch_size"),
    ("bad b64", "POST", "/v1/models/tiny:predict", {"signature_name": "single_text", "instances": [{"b64": "%%%"}]}, 400, "base64"),
    ("non-UTF-8 body", "POST", "/v1/models/tiny:predict", b'{"instances": ["\xff\xfe"]}', 400, "UTF-8"),
    ("lone surrogate", "POST", "/v1/models/tiny:predict", b'{"signature_name": "single_text", "instances": ["\\ud800"]}', 400, "UTF-8"),
    ("unknown model", "POST", "/v1/models/nope:predict", PAIR, 404, "Servable not found"),
    ("unknown version", "POST", "/v1/models/tiny/versions/7:predict", PAIR, 404, "Specific(tiny, 7)"),
    ("unknown model status", "GET", "/v1/models/nope", None, 404, "nope"),
    ("unknown version status", "GET", "/v1/models/tiny/versions/7", None, 404, "version 7"),
    ("unknown version metadata", "GET", "/v1/models/tiny/versions/7/metadata", None, 404, "Specific(tiny, 7)"),
    ("unknown label", "GET", "/v1/models/tiny/labels/stable", None, 400, "Unrecognized servable version label: stable"),
    ("bad path", "GET", "/v2/whatever", None, 404, "Malformed request"),
    ("GET on predict", "GET", "/v1/models/tiny:predict", None, 405, "not allowed"),
    ("POST on status", "POST", "/v1/models/tiny", PAIR, 405, "not allowed"),
    ("classify", "POST", "/v1/models/tiny:classify", {"examples": [{}]}, 400, ":predict"),
]


@pytest.mark.parametrize("name,method,path,body,status,words", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_4xx_and_server_keeps_serving(server, name, method, path, body, status, words):
    raw = body if isinstance(body, bytes) else None
    got_status, got = http(server, method, path, body=None if raw else body, raw=raw)
    assert got_status == status, got
    assert set(got) == {"error"} and words in got["error"], got["error"]
    assert http(server, "POST", "/v1/models/tiny:predict", PAIR)[0] == 200


def test_oversized_body_gets_413(server):
    body = {"signature_name": "single_text", "instances": ["x" * MAX_BODY]}
    status, got = http(server, "POST", "/v1/models/tiny:predict", body)
    assert status == 413 and "exceeds the limit" in got["error"]
    assert http(server, "POST", "/v1/models/tiny:predict", PAIR)[0] == 200


def test_concurrent_requests(server):
    client = RestClient("127.0.0.1", server.rest_port, "tiny")
    expected = client.classify_texts(["a b c", "x"], ["d", ""])
    results, errors = [], []

    def worker(i):
        try:
            for _ in range(3):
                results.append(client.classify_texts(["a b c", "x"], ["d", ""]))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 24 and all(r == expected for r in results)


# ----------------------------------------------------------------------------- gRPC


def test_grpc_predict_matches_rest(server, grpc_channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc_channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto([b"a b c", b"x"]))
    request.inputs["text_pair"].CopyFrom(tf.make_tensor_proto([b"d", b""]))
    response = stub.Predict(request, timeout=30)
    assert response.model_spec.version.value == 1 and response.model_spec.signature_name == "serving_default"
    assert list(response.outputs["probabilities"].float_val)  # typed fields, as TF Serving writes them
    _, rest_out = http(server, "POST", "/v1/models/tiny:predict", {"inputs": {"text": ["a b c", "x"], "text_pair": ["d", ""]}})
    np.testing.assert_array_equal(
        tf.make_ndarray(response.outputs["probabilities"]), np.array(rest_out["outputs"]["probabilities"], np.float32))
    assert [b.decode() for b in tf.make_ndarray(response.outputs["label"])] == rest_out["outputs"]["label"]


def test_clients_agree(server):
    rest = RestClient("127.0.0.1", server.rest_port, "tiny")
    with GrpcClient("127.0.0.1", server.grpc_port, "tiny") as grpc_client:
        assert grpc_client.classify_texts(["a b c", "x"], ["d", ""]) == rest.classify_texts(["a b c", "x"], ["d", ""])
        ids = {"input_ids": [[1, 2]], "input_mask": [[1, 1]], "segment_ids": [[0, 1]]}
        for a, b in ((rest.predict(ids, "serve_ids"), grpc_client.predict(ids, "serve_ids")),
                     (rest.predict(["a b", "c"], "single_text"), grpc_client.predict(["a b", "c"], "single_text"))):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        assert grpc_client.status() == rest.status()
        assert grpc_client.metadata()["metadata"] == rest.metadata()["metadata"]
        with pytest.raises(ServingRequestError) as e:
            rest.predict({"text": ["a"]}, "nope")
        assert e.value.status == "NOT_FOUND"


def test_grpc_metadata_and_status(server, grpc_channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc_channel)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "tiny"
    response = stub.GetModelMetadata(request, timeout=30)
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(sig_map)
    assert sig_map.signature_def["serve_ids"].inputs["input_ids"].dtype == tf.int32.as_datatype_enum
    assert response.model_spec.version.value == 1

    status = model_service_pb2_grpc.ModelServiceStub(grpc_channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny"}), timeout=30)
    assert [(s.version, s.state) for s in status.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def _predict_request(signature="serving_default", **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny"
    request.model_spec.signature_name = signature
    for k, v in inputs.items():
        request.inputs[k].CopyFrom(tf.make_tensor_proto(v))
    return request


GRPC_BAD = [
    ("wrong input name", _predict_request(text=[b"a"], txt_pair=[b"b"]), grpc.StatusCode.INVALID_ARGUMENT, "'txt_pair'"),
    ("wrong dtype", _predict_request(text=[1], text_pair=[b"b"]), grpc.StatusCode.INVALID_ARGUMENT, "must be string"),
    ("empty batch", _predict_request("single_text", text=np.array([], dtype=object)), grpc.StatusCode.INVALID_ARGUMENT, "empty"),
    ("unknown signature", _predict_request("nope", text=[b"a"]), grpc.StatusCode.FAILED_PRECONDITION, '"nope" not found'),
    ("unknown model", predict_pb2.PredictRequest(model_spec={"name": "nope"}), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
]


@pytest.mark.parametrize("name,request_,code,words", GRPC_BAD, ids=[b[0] for b in GRPC_BAD])
def test_grpc_bad_requests(server, grpc_channel, name, request_, code, words):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc_channel)
    with pytest.raises(grpc.RpcError) as e:
        stub.Predict(request_, timeout=30)
    assert e.value.code() == code and words in e.value.details(), e.value.details()
    good = _predict_request(text=[b"a"], text_pair=[b"b"])
    assert stub.Predict(good, timeout=30).outputs["label"].string_val


def test_grpc_bad_metadata_and_status(server, grpc_channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc_channel)
    for fields, code in (([], grpc.StatusCode.INVALID_ARGUMENT), (["nope"], grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as e:
            stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(
                model_spec={"name": "tiny"}, metadata_field=fields), timeout=30)
        assert e.value.code() == code
    with pytest.raises(grpc.RpcError) as e:
        model_service_pb2_grpc.ModelServiceStub(grpc_channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny", "version": {"value": 9}}), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "version 9" in e.value.details()


# ----------------------------------------------------------------------------- versions


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_new_version_is_picked_up_and_broken_one_skipped(model_templates, install_version, tmp_path, caplog):
    base = str(tmp_path / "models" / "tiny")
    install_version(model_templates, base, 1)
    caplog.set_level("ERROR", logger="electra_tf.serving.manager")
    with ModelServer(base, poll_interval_seconds=0.3) as server:
        client = RestClient("127.0.0.1", server.rest_port, "tiny")
        before = client.predict({"text": ["x"], "text_pair": [""]})["probabilities"]

        install_version(model_templates, base, 2)
        assert _wait_for(lambda: client.metadata()["model_spec"]["version"] == "2")
        after = client.predict({"text": ["x"], "text_pair": [""]})["probabilities"]
        assert after[0, 1] > before[0, 1]  # version 2 has the larger bias
        states = {s["version"]: s["state"] for s in client.status()["model_version_status"]}
        assert states == {"2": "AVAILABLE", "1": "END"}  # latest policy: one version served

        # A broken version 3 is logged and skipped; version 2 keeps serving.
        os.makedirs(os.path.join(base, "3"))
        with open(os.path.join(base, "3", "saved_model.pb"), "wb") as f:
            f.write(b"not a SavedModel")
        # LOADING while it loads (as TF Serving), then END
        assert _wait_for(lambda: {s["version"]: s["state"] for s in client.status()["model_version_status"]}.get("3")
                         == "END")
        status3 = client.status(3)["model_version_status"][0]
        assert status3["state"] == "END" and status3["status"]["error_code"] != "OK"
        assert client.metadata()["model_spec"]["version"] == "2"
        assert client.predict({"text": ["x"], "text_pair": [""]})["probabilities"][0, 1] == after[0, 1]

        # Version 4 without its variables: TensorFlow's reason names the file it did not find.
        # The status tells the client that reason without the server's paths; the log has them.
        staging = tmp_path / "models" / ".staging-4"
        shutil.copytree(model_templates[2], staging)
        shutil.rmtree(staging / "variables")
        os.rename(staging, os.path.join(base, "4"))
        assert _wait_for(lambda: {s["version"]: s["state"] for s in client.status()["model_version_status"]}.get("4")
                         == "END")
        with GrpcClient("127.0.0.1", server.grpc_port, "tiny") as grpc_client:
            messages = {v: (client.status(v)["model_version_status"][0]["status"]["error_message"],
                            grpc_client.status(v)["model_version_status"][0]["status"]["error_message"])
                        for v in (3, 4)}
        for rest_message, grpc_message in messages.values():
            assert rest_message == grpc_message and str(tmp_path) not in rest_message and "\n" not in rest_message
        assert messages[3][0].startswith("Failed to load version 3 of model tiny: Error parsing message")
        assert messages[4][0].startswith("Failed to load version 4 of model tiny: ")
        assert "<tiny version 4>/variables/variables" in messages[4][0], messages[4][0]
        assert client.metadata()["model_spec"]["version"] == "2"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"tiny version 4 failed to load from {os.path.join(base, '4')}" in logged
    assert os.path.join(base, "4", "variables", "variables") in logged


def test_messages_for_clients_lose_the_servers_paths():
    from electra_tf.serving.errors import without_paths

    text = ("Failed to read /srv/models/tiny/3/variables/variables.index: not found; vocabulary '/opt/x/vocab.txt'"
            " (method tensorflow/serving/predict, node model/dense/MatMul, /v1)")
    assert without_paths(text, {"/srv/models/tiny/3": "<tiny version 3>"}) == (
        "Failed to read <tiny version 3>/variables/variables.index: not found; vocabulary '<path>'"
        " (method tensorflow/serving/predict, node model/dense/MatMul, /v1)")


def _taken_port() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1, as another server would."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_in_use_is_a_one_line_error(model_base):
    with _taken_port() as taken:
        port = taken.getsockname()[1]
        for what, ports in (("REST", {"rest_port": port, "grpc_port": 0}), ("gRPC", {"rest_port": 0, "grpc_port": port})):
            server = ModelServer(model_base, **ports)
            with pytest.raises(model_server.PortError) as e:
                server.start()
            assert str(e.value) == f"{what} port {port} on 127.0.0.1 is already in use"
            assert server.rest_port is None and server.grpc_port is None  # refused before anything opened


@pytest.mark.slow
def test_serve_binary_reports_a_port_in_use_in_one_line(model_base):
    with _taken_port() as taken:
        port = taken.getsockname()[1]
        runs = {what: subprocess.Popen(
            [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}", *flags],
            cwd=REPO, env=_python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for what, flags in (("REST", [f"--rest_api_port={port}", "--port=0"]),
                                ("gRPC", ["--rest_api_port=0", f"--port={port}"]))}
        for what, run in runs.items():
            _, stderr = run.communicate(timeout=120)
            assert run.returncode != 0 and "Traceback" not in stderr, stderr[-2000:]
            assert stderr.strip().splitlines()[-1] == f"electra-serve: error: {what} port {port} on 127.0.0.1 is already in use"


def test_model_config_round_trips_through_tf_serving_proto(tmp_path):
    configs = [
        model_config.ModelConfig("electra", "/models/electra"),
        model_config.ModelConfig("electra_pinned", "/models/electra", "specific", (1, 2)),
        model_config.ModelConfig("electra_all", "gs://bucket/electra", "all"),
    ]
    text = model_config.models_config_text(configs)
    parsed = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    entries = parsed.model_config_list.config
    assert [c.name for c in entries] == ["electra", "electra_pinned", "electra_all"]
    assert all(c.model_platform == "tensorflow" for c in entries)
    assert list(entries[1].model_version_policy.specific.versions) == [1, 2]
    assert entries[2].model_version_policy.HasField("all")
    assert model_config.parse_models_config(text) == configs
    for bad, field in ((("a/b", "/m"), "name"), (("ok", "relative/path"), "base_path"),
                       (("ok", "/m", "specific"), "versions"), (("ok", "/m", "newest"), "version_policy")):
        with pytest.raises(model_config.ModelConfigError, match=field):
            model_config.ModelConfig(*bad)
    with pytest.raises(model_config.ModelConfigError, match="duplicate"):
        model_config.models_config_text([configs[0], configs[0]])


def test_server_follows_models_config_version_policy(model_templates, install_version, tmp_path):
    base = str(tmp_path / "tiny")
    install_version(model_templates, base, 1)
    install_version(model_templates, base, 2)
    config_path = tmp_path / "models.config"
    config_path.write_text(model_config.models_config_text([model_config.ModelConfig("tiny", base, "specific", (1,))]))
    with ModelServer(models=model_config.read_models_config(str(config_path)), grpc_port=None) as server:
        client = RestClient("127.0.0.1", server.rest_port, "tiny")
        assert client.metadata()["model_spec"]["version"] == "1"
        assert [s["version"] for s in client.status()["model_version_status"]] == ["1"]


def test_version_labels_of_models_config_name_versions_over_rest_and_grpc(model_templates, install_version,
                                                                         tmp_path):
    """`version_labels` in models.config, resolved as TF Serving resolves them: a request by label
    (REST /labels/L, gRPC model_spec.version_label) is the request by the version it names; a
    label the model does not have is INVALID_ARGUMENT / 400 naming it."""
    base = str(tmp_path / "tiny")
    install_version(model_templates, base, 1)
    install_version(model_templates, base, 2)
    config_path = tmp_path / "models.config"
    config_path.write_text(model_config.models_config_text([model_config.ModelConfig(
        "tiny", base, "specific", (1, 2), version_labels={"stable": 1, "canary": 2})]))
    with ModelServer(models=model_config.read_models_config(str(config_path))) as server:
        def predict(where):
            return http(server, "POST", f"/v1/models/tiny{where}:predict", PAIR)

        by_version = {v: predict(f"/versions/{v}") for v in (1, 2)}
        assert by_version[1][0] == 200 and by_version[1] != by_version[2]  # version 2 answers otherwise
        assert predict("/labels/stable") == by_version[1] and predict("/labels/canary") == by_version[2]
        assert [s["version"] for s in http(server, "GET", "/v1/models/tiny/labels/canary")[1]["model_version_status"]] == ["2"]
        assert http(server, "GET", "/v1/models/tiny/labels/stable/metadata")[1]["model_spec"]["version"] == "1"
        assert predict("/labels/beta") == (400, {"error": "Unrecognized servable version label: beta"})
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.version_label = "tiny", "canary"
            request.model_spec.signature_name = "single_text"
            request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"a b"])))
            answer = stub.Predict(request, timeout=30)
            assert answer.model_spec.version.value == 2
            request.model_spec.version_label = "beta"
            with pytest.raises(grpc.RpcError) as e:
                stub.Predict(request, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert e.value.details() == "Unrecognized servable version label: beta"
        # Both clients take a label where they take a version number.
        for client in (RestClient("127.0.0.1", server.rest_port, "tiny"),
                       GrpcClient("127.0.0.1", server.grpc_port, "tiny")):
            with client:
                answers = {v: client.predict({"text": [b"a b"]}, "single_text", v)
                           for v in (1, 2, "stable", "canary")}
                for label, v in (("stable", 1), ("canary", 2)):
                    assert all(np.array_equal(answers[label][k], answers[v][k]) for k in answers[v])
                assert not np.array_equal(answers[1]["probabilities"], answers[2]["probabilities"])
                assert client.metadata("canary")["model_spec"]["version"] == "2"
                with pytest.raises(ServingRequestError, match="Unrecognized servable version label: beta"):
                    client.predict({"text": [b"a b"]}, "single_text", "beta")


def test_without_allow_version_labels_for_unavailable_models_labels_need_available_versions(
        model_templates, install_version, tmp_path):
    """TF Serving's default (its flag false): labels are checked before versions load, so any
    label at start is refused, by `electra-serve` in one line before TensorFlow loads; at a reload
    a label must name a version that is AVAILABLE then."""
    base = str(tmp_path / "tiny")
    install_version(model_templates, base, 1)
    M = model_config.ModelConfig
    labelled = M("tiny", base, "specific", (1,), version_labels={"stable": 1})
    sentence = "Request to assign label to version 1 of model tiny, which is not currently available for inference"
    with pytest.raises(model_server.ServingError) as e:
        ModelServer(models=[labelled], allow_version_labels_for_unavailable_models=False)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and e.value.message == sentence
    config_path = tmp_path / "models.config"
    config_path.write_text(model_config.models_config_text([labelled]))
    refused = subprocess.run([sys.executable, "-m", "electra_tf.tools.serve", f"--model_config_file={config_path}",
                              "--rest_api_port=0", "--port=0"], capture_output=True, text=True, timeout=120)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and sentence in lines[0], refused.stderr[-2000:]
    assert "--allow_version_labels_for_unavailable_models" in lines[0] and str(config_path) in lines[0]
    with ModelServer(models=[M("tiny", base, "specific", (1,))], allow_version_labels_for_unavailable_models=False) as server:
        server.manager.reload([labelled])  # version 1 is AVAILABLE: allowed
        assert http(server, "POST", "/v1/models/tiny/labels/stable:predict", PAIR)[0] == 200
        install_version(model_templates, base, 2)
        with pytest.raises(model_server.ServingError, match=sentence.replace("1 of", "2 of")):
            server.manager.reload([M("tiny", base, "specific", (1, 2), version_labels={"canary": 2})])
        assert server.manager.configs["tiny"] == labelled  # nothing changed


def test_a_reloaded_config_adds_removes_moves_and_relabels_models_as_tf_serving_does(
        model_templates, install_version, tmp_path):
    """ModelService.HandleReloadConfigRequest, sent with TF Serving's own stubs: the list it
    carries becomes the served models, the call returns once new models are AVAILABLE, and its
    refusals are TF Serving's (codes and words); what serves is untouched by a refused one."""
    from tensorflow_serving.apis import model_management_pb2

    base = str(tmp_path / "tiny")
    for version in (1, 2):
        install_version(model_templates, base, version)
    other = str(tmp_path / "other")
    install_version(model_templates, other, 1, source_version=2)
    moved = str(tmp_path / "moved")
    install_version(model_templates, moved, 2, source_version=1)  # version 2 there answers as version 1
    ghost = str(tmp_path / "ghost")
    os.makedirs(ghost)  # no version yet
    M = model_config.ModelConfig
    with ModelServer(models=[M("tiny", base, "specific", (1,))]) as server, \
            grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = model_service_pb2_grpc.ModelServiceStub(channel)

        def reload(*configs, raw=None):
            request = raw or model_management_pb2.ReloadConfigRequest()
            if raw is None:
                request.config.model_config_list.SetInParent()
                request.config.model_config_list.config.extend(c.to_proto() for c in configs)
            try:
                return stub.HandleReloadConfigRequest(request, timeout=60).status.error_code, ""
            except grpc.RpcError as e:
                return e.code(), e.details()

        def states(name):
            return {s["version"]: s["state"] for s in http(server, "GET", f"/v1/models/{name}")[1]["model_version_status"]}

        def answer(name):
            return http(server, "POST", f"/v1/models/{name}:predict", PAIR)

        as_version = {1: answer("tiny")}
        assert reload(M("tiny", base, "specific", (2,)), M("other", other)) == (0, "")
        assert states("tiny") == {"2": "AVAILABLE", "1": "END"} and states("other") == {"1": "AVAILABLE"}
        as_version[2] = answer("tiny")
        assert as_version[2][0] == 200 and as_version[2] != as_version[1]
        assert answer("other") == as_version[2]  # a copy of version 2

        # Labels as TF Serving's --allow_version_labels_for_unavailable_models (this server's
        # behaviour at start): a label that serves may not move to a version that does not.
        assert reload(M("tiny", base, "specific", (2,), version_labels={"stable": 2}), M("other", other)) == (0, "")
        assert http(server, "POST", "/v1/models/tiny/labels/stable:predict", PAIR) == as_version[2]
        serving = {"tiny": states("tiny"), "other": states("other")}
        code, words = reload(M("tiny", base, "specific", (1, 2), version_labels={"stable": 1}), M("other", other))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert words == "Request to assign label to version 1 of model tiny, which is not currently available for inference"
        assert {"tiny": states("tiny"), "other": states("other")} == serving
        assert reload(M("tiny", base, "specific", (1, 2), version_labels={"stable": 2, "canary": 1}),
                      M("other", other)) == (0, "")  # a new label may name a version it loads
        assert http(server, "POST", "/v1/models/tiny/labels/canary:predict", PAIR) == as_version[1]
        assert reload(M("tiny", base, "specific", (2,)), M("other", other)) == (0, "")

        code, words = reload(M("tiny", base, "specific", (2,)), M("other", other), M("ghost", ghost))
        assert code == grpc.StatusCode.UNKNOWN and words.startswith("1 model(s) did not become available: {ghost}")
        assert states("tiny") == serving["tiny"] and answer("other") == as_version[2]

        # The base path moves: the version there replaces the one loaded from the old path.
        assert reload(M("tiny", moved, "specific", (2,))) == (0, "")
        assert answer("tiny") == as_version[1] and states("tiny")["2"] == "AVAILABLE"
        assert answer("other")[0] == 404 and states("other") == {"1": "END"}  # left the config

        empty = model_management_pb2.ReloadConfigRequest()
        assert reload(raw=empty) == (grpc.StatusCode.INVALID_ARGUMENT,
                                     "ServerModelConfig type not supported by HandleReloadConfigRequest."
                                     " Only ModelConfigList is currently supported")
        twice = model_management_pb2.ReloadConfigRequest()
        twice.config.model_config_list.config.extend([M("tiny", moved).to_proto(), M("tiny", base).to_proto()])
        assert reload(raw=twice) == (grpc.StatusCode.INVALID_ARGUMENT, "model_config_list: duplicate model names ['tiny']")
        relative = model_management_pb2.ReloadConfigRequest()
        relative.config.model_config_list.config.add(name="tiny", base_path="models/tiny")
        code, words = reload(raw=relative)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and words.startswith(
            "model_config_list.config[0]: base_path of model 'tiny': 'models/tiny' must be absolute")
        assert answer("tiny") == as_version[1]  # all three refused before anything changed

        with GrpcClient("127.0.0.1", server.grpc_port, "tiny") as client:
            client.reload_config([])  # TF Serving: an empty list unloads every model
            assert answer("tiny")[0] == 404
            client.reload_config([M("tiny", base)])
        assert answer("tiny") == as_version[2]


def test_the_model_config_file_is_read_again_and_a_bad_one_changes_nothing(model_templates, install_version,
                                                                          tmp_path, caplog):
    """--model_config_file_poll_wait_seconds: a changed models.config is reloaded; one that does not
    parse is logged and the served models stay."""
    base, other = str(tmp_path / "tiny"), str(tmp_path / "other")
    install_version(model_templates, base, 1)
    install_version(model_templates, other, 1, source_version=2)
    M = model_config.ModelConfig
    path = tmp_path / "models.config"
    path.write_text(model_config.models_config_text([M("tiny", base)]))
    caplog.set_level("ERROR", logger="electra_tf.serving.manager")
    with ModelServer(models=model_config.read_models_config(str(path)), grpc_port=None,
                     model_config_file=str(path), model_config_poll_seconds=0.2) as server:
        def serves(name):
            return http(server, "POST", f"/v1/models/{name}:predict", PAIR)[0] == 200

        path.write_text(model_config.models_config_text([M("tiny", base), M("other", other)]))
        assert _wait_for(lambda: serves("other"))
        path.write_text('model_config_list { config { name: "tiny" base_path: "relative" } }')
        assert _wait_for(lambda: "cannot be used" in caplog.text)
        assert "base_path of model 'tiny': 'relative' must be absolute" in caplog.text
        assert serves("tiny") and serves("other")
        path.write_text(model_config.models_config_text([M("other", other)]))
        assert _wait_for(lambda: not serves("tiny"))
        assert serves("other")


# ----------------------------------------------------------------------------- binaries


def _python_env():
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    return env


@pytest.mark.slow
def test_serve_binary_starts_answers_and_stops_on_sigterm(model_base, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 8 }\nnum_batch_threads { value: 1 }\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}", "--rest_api_port=0",
         "--port=0", "--file_system_poll_wait_seconds=1", "--rest_idle_timeout_seconds=1",
         "--enable_batching", f"--batching_parameters_file={batching}"],
        cwd=REPO, env=_python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        ports, lines = {}, []
        deadline = time.monotonic() + 90
        while len(ports) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"(REST|gRPC) API at (?:http://)?127\.0\.0\.1:(\d+)", line)
            if m:
                ports[m.group(1)] = int(m.group(2))
        assert len(ports) == 2, "".join(lines)
        cores = os.cpu_count()  # one batch thread: its calls may use every core
        # read back from TensorFlow after setting it
        assert f"TensorFlow threads: {cores} per op, default inter-op (1 model calls at once on {cores} cores)" in "".join(lines)
        client = RestClient("127.0.0.1", ports["REST"], "tiny")
        assert client.status()["model_version_status"][0]["state"] == "AVAILABLE"
        with socket.create_connection(("127.0.0.1", ports["REST"]), timeout=10) as idle:
            assert idle.recv(1) == b""  # closed by the server after --rest_idle_timeout_seconds
        out = subprocess.run(
            [sys.executable, "-m", "electra_tf.tools.client", f"--server=127.0.0.1:{ports['gRPC']}", "--protocol=grpc",
             "--model_name=tiny", "--text=a b c", "--text_pair=d", "--text=x", "--text_pair="],
            cwd=REPO, env=_python_env(), capture_output=True, text=True, timeout=90,
        )
        assert out.returncode == 0, out.stderr
        lines_out = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
        assert [l["label"] for l in lines_out] == ["negative", "positive"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", ports["REST"]), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_serve_binary_rejects_a_bad_batching_file(model_base, tmp_path):
    batching = tmp_path / "batching.config"
    batching.write_text("max_batch_size { value: 8 }\nbatch_size { value: 4 }\n")
    out = subprocess.run(
        [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}", "--enable_batching",
         f"--batching_parameters_file={batching}"],
        cwd=REPO, env=_python_env(), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0
    assert f'{batching}: 2:1 : Message type "tensorflow.serving.BatchingParameters" has no field named "batch_size"' in out.stderr
    assert "Traceback" not in out.stderr


def test_intra_op_threads_share_the_cores_between_concurrent_model_calls():
    from electra_tf.serving.defaults import intra_op_threads  # not the binary: its flags are process-wide

    assert intra_op_threads(0, concurrent_calls=2, cores=2) == 1  # the default server on 2 cores
    assert intra_op_threads(0, concurrent_calls=1, cores=8) == 8
    assert intra_op_threads(0, concurrent_calls=3, cores=8) == 2
    assert intra_op_threads(0, concurrent_calls=16, cores=8) == 1
    assert intra_op_threads(4, concurrent_calls=2, cores=2) == 4  # an explicit value wins


def test_serve_binary_rejects_thread_counts_out_of_tensorflows_range():
    """Negative, or past the int32 TensorFlow's ConfigProto holds (that one was a traceback)."""
    for flag in ("--tensorflow_intra_op_parallelism=-1", "--tensorflow_inter_op_parallelism=-2",
                 "--tensorflow_intra_op_parallelism=99999999999999999999",
                 "--tensorflow_inter_op_parallelism=2147483648"):
        out = subprocess.run(
            [sys.executable, "-m", "electra_tf.tools.serve", "--model_base_path=/nonexistent", flag],
            cwd=REPO, env=_python_env(), capture_output=True, text=True, timeout=120,
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
        assert lines[0] == (f"electra-serve: error: {flag.split('=')[0]} must be from 0 to 2147483647,"
                            f" got {flag.split('=')[1]}")
