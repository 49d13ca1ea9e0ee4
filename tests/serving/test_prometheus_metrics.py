"""serving.metrics: TF Serving's Prometheus metrics, counted under load in a real server process."""

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import grpc
import pytest
import tensorflow as tf
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import (
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from electra_tf.serving import metrics as serving_metrics
from electra_tf.serving.errors import invalid
from electra_tf.serving.metrics import Metrics, parse_monitoring_config
from electra_tf.serving.server import ModelServer
from tests.server_process import serving

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUEST_COUNT = ":tensorflow:serving:request_count"
LATENCY = ":tensorflow:serving:request_latency"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _samples(page: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, its labels): value} of a Prometheus text page."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def _series(samples, name: str, **labels) -> dict[frozenset, float]:
    """The samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return {key: value for (sample, key), value in samples.items() if sample == name and want <= key}


def _value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# ----------------------------------------------------------------------------- the config file


def test_monitoring_config_is_tf_servings_text_proto():
    assert parse_monitoring_config('prometheus_config { enable: true path: "/metrics" }') == "/metrics"
    assert parse_monitoring_config("prometheus_config { enable: true }") == "/monitoring/prometheus/metrics"
    assert parse_monitoring_config('prometheus_config { path: "/metrics" }') is None  # not enabled
    assert parse_monitoring_config("") is None
    for text, words in (('prometheus_config { enable: true path: "metrics" }', "must start with '/'"),
                        ('prometheus_config { enable: true path: "/v1/models/x" }', "under /v1/"),
                        ("prometheus_config { enabled: true }", 'no field named "enabled"'),
                        ("prometheus_config { enable: true", "Expected")):
        with pytest.raises(ValueError) as e:
            parse_monitoring_config(text, "mon.config")
        assert str(e.value).startswith("mon.config: ") and words in str(e.value) and "\n" not in str(e.value)


def test_a_bad_monitoring_config_file_is_one_line_before_any_model_loads(tmp_path):
    bad = {"relative.config": 'prometheus_config { enable: true path: "metrics" }',
           "v1.config": 'prometheus_config { enable: true path: "/v1/metrics" }',
           "typo.config": "prometheus_config { enable: yes }"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    for path in [*(tmp_path / name for name in bad), tmp_path / "missing.config"]:
        out = subprocess.run(
            # A base path that does not exist: the error comes before the server looks at it.
            [sys.executable, "-m", "electra_tf.tools.serve", "--model_base_path=/nonexistent",
             f"--monitoring_config_file={path}"],
            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=60)
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert lines[0].startswith(f"electra-serve: error: --monitoring_config_file: {path}: "), lines[0]


# ----------------------------------------------------------------------------- the metrics object


def test_metrics_count_every_request_and_time_the_successful_ones():
    metrics = Metrics("/metrics", model_names=["tiny"])
    with metrics.request("tiny", "predict", "REST"):
        pass
    with pytest.raises(Exception):
        with metrics.request("tiny", "predict", "REST"):
            raise invalid("bad input")
    with pytest.raises(RuntimeError):
        with metrics.request("tiny", "Predict", "GRPC"):
            raise RuntimeError("a bug")
    with metrics.request("a name no one serves", "Predict", "GRPC") as call:
        call.status = grpc.StatusCode.NOT_FOUND  # as a gRPC method leaves it with context.abort
    metrics.observe_batch(3)
    metrics.observe_batch(8, padding=3)  # 5 rows padded to an allowed batch size of 8
    page = metrics.exposition().decode()
    samples = _samples(page)
    assert _series(samples, REQUEST_COUNT) == {
        frozenset({("model_name", "tiny"), ("status", "OK")}): 1,
        frozenset({("model_name", "tiny"), ("status", "INVALID_ARGUMENT")}): 1,
        frozenset({("model_name", "tiny"), ("status", "INTERNAL")}): 1,
        frozenset({("model_name", ""), ("status", "NOT_FOUND")}): 1,
    }
    assert _series(samples, LATENCY + "_count") == {
        frozenset({("model_name", "tiny"), ("API", "predict"), ("entrypoint", "REST")}): 1}
    # TF Serving's exposition: no `_total` suffix, bucket bounds in six digits.
    assert '\n:tensorflow:serving:request_count{model_name="tiny",status="OK"} 1.0\n' in page
    assert 'le="32.4"' in page and 'le="1.47476e+09"' in page
    assert _value(samples, ":tensorflow:serving:batching_session:processed_batch_size_sum") == 3 + 8
    padding = ":tensorflow:serving:batching_session:padding_size_sum"
    assert (_value(samples, padding, execution_batch_size="3"), _value(samples, padding, execution_batch_size="8")) == (0, 3)
    assert _value(samples, "process_resident_memory_bytes") > 0

    off = Metrics()
    with off.request("tiny", "predict", "REST"):
        pass
    off.observe_load("/m/tiny/1", 1.0)
    assert off.path is None and off.registry is None
    with pytest.raises(RuntimeError):
        off.exposition()


def test_grpc_requests_are_labelled_with_the_model_name_without_parsing_them():
    spec = {"name": "tiny", "signature_name": "single_text"}
    predict = predict_pb2.PredictRequest(model_spec=spec)
    predict.inputs["text"].CopyFrom(tf.make_tensor_proto([b"x" * 100_000]))
    multi = inference_pb2.MultiInferenceRequest(tasks=[inference_pb2.InferenceTask(model_spec=spec)])
    name = serving_metrics._request_model_name
    assert name(predict.SerializeToString(), 2) == "tiny"
    assert name(get_model_status_pb2.GetModelStatusRequest(model_spec=spec).SerializeToString(), 2) == "tiny"
    assert name(multi.SerializeToString(), 3) == "tiny"
    for garbage in (b"", b"\xff\xff\xff", b"\x0a\x05ab", predict.SerializeToString()[:3]):
        assert name(garbage, 2) == ""


def test_without_a_monitoring_config_the_metrics_path_is_not_found(model_base):
    with ModelServer(model_base, grpc_port=None) as server:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}/monitoring/prometheus/metrics", timeout=30)
        assert e.value.code == 404


# ----------------------------------------------------------------------------- a real server under load


def _rest_predict(rest_port: int, model: str, instances) -> int:
    body = json.dumps({"signature_name": "single_text", "instances": instances}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{rest_port}/v1/models/{model}:predict", data=body)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def _grpc_predict(stub, model: str, key: str, texts: list[bytes]) -> grpc.StatusCode:
    request = predict_pb2.PredictRequest(model_spec={"name": model, "signature_name": "single_text"})
    request.inputs[key].CopyFrom(tf.make_tensor_proto(texts))
    try:
        stub.Predict(request, timeout=60)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


@pytest.mark.multiprocess
def test_a_server_under_load_counts_each_request_by_status_api_and_entrypoint(model_base, tmp_path):
    config = tmp_path / "monitoring.config"
    config.write_text('prometheus_config {\n  enable: true\n  path: "/metrics"\n}\n')
    batching = tmp_path / "batching.config"
    batching.write_text("num_batch_threads { value: 1 }\nbatch_timeout_micros { value: 2000 }\n")
    rest, grpc_port = _free_port(), _free_port()
    command = [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}",
               f"--rest_api_port={rest}", f"--port={grpc_port}", "--file_system_poll_wait_seconds=0",
               f"--monitoring_config_file={config}", "--enable_batching", f"--batching_parameters_file={batching}"]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    with serving(command, f"http://127.0.0.1:{rest}/v1/models/tiny", cwd=REPO, env=env), \
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        rows = [b"a good film", b"bad"]  # two rows per good request
        # (what is sent, what it must get), each 12 / 6 / 3 times over REST and over gRPC.
        jobs = ([(lambda: _rest_predict(rest, "tiny", [r.decode() for r in rows]), 200)] * 12
                + [(lambda: _rest_predict(rest, "tiny", [{"no_such_input": "x"}]), 400)] * 6
                + [(lambda: _rest_predict(rest, "nosuch", ["x"]), 404)] * 3
                + [(lambda: _grpc_predict(stub, "tiny", "text", rows), grpc.StatusCode.OK)] * 12
                + [(lambda: _grpc_predict(stub, "tiny", "no_such_input", rows), grpc.StatusCode.INVALID_ARGUMENT)] * 6
                + [(lambda: _grpc_predict(stub, "nosuch", "text", rows), grpc.StatusCode.NOT_FOUND)] * 3)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # all at once, interleaved
            answers = list(pool.map(lambda job: job[0](), jobs))
        assert answers == [want for _, want in jobs]
        model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny"}), timeout=30)
        urllib.request.urlopen(f"http://127.0.0.1:{rest}/v1/models/tiny/metadata", timeout=30).read()
        with urllib.request.urlopen(f"http://127.0.0.1:{rest}/metrics", timeout=30) as answer:
            assert answer.headers["Content-Type"] == Metrics.content_type  # prometheus_client.CONTENT_TYPE_LATEST
            samples = _samples(answer.read().decode())

    def latency_count(api: str, entrypoint: str) -> float:
        return _value(samples, LATENCY + "_count", model_name="tiny", API=api, entrypoint=entrypoint)

    assert latency_count("predict", "REST") == 12 and latency_count("Predict", "GRPC") == 12
    assert latency_count("metadata", "REST") == 1 and latency_count("GetModelStatus", "GRPC") == 1
    polls = latency_count("status", "REST")  # `serving` asked the status until the model was AVAILABLE
    assert polls >= 1
    # Every request counted once by status; errors are counted and not timed.
    assert _series(samples, REQUEST_COUNT) == {
        frozenset({("model_name", "tiny"), ("status", "OK")}): 12 + 12 + 1 + 1 + polls,
        frozenset({("model_name", "tiny"), ("status", "INVALID_ARGUMENT")}): 6 + 6,
        frozenset({("model_name", ""), ("status", "NOT_FOUND")}): 3 + 3,  # names it does not serve
    }
    assert sum(_series(samples, LATENCY + "_count").values()) == 12 + 12 + 1 + 1 + polls
    version = os.path.join(model_base, "1")
    assert _value(samples, ":tensorflow:cc:saved_model:load_latency", model_path=version) > 0
    assert _value(samples, ":tensorflow:cc:saved_model:load_attempt_count", model_path=version, status="success") == 1
    # Only valid requests reach the batching scheduler: its batches hold their rows, no more.
    batch = ":tensorflow:serving:batching_session:processed_batch_size"
    assert _value(samples, batch + "_sum") == 24 * len(rows)
    assert 1 <= _value(samples, batch + "_count") <= 24
    assert _value(samples, "process_resident_memory_bytes") > 0
