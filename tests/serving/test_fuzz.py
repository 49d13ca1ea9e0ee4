"""Fuzzing serving.server: thousands of random and mutated requests, REST and gRPC, from a fixed seed.

Every answer must be a well-formed error (REST: 4xx with a JSON {"error": "..."} body of one
line; gRPC: a status other than INTERNAL / UNKNOWN, with a message) or a valid prediction, and
the server must still serve a good request afterwards. A failure names the case's index and
request, which the seed reproduces.
"""

import http.client
import json
import random
import socket
import threading

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2

from electra_tf.serving.batching_parameters import BatchingParameters
from electra_tf.serving.errors import ServingError
from electra_tf.serving.json_api import json_to_array
from electra_tf.serving.server import ModelServer

SEED = 20261126
MAX_BODY = 64 * 1024
REST_CASES = 10000
GRPC_CASES = 5000
RAW_GRPC_CASES = 3000
THREADS = 4

VALID_BODIES = [
    {"instances": [{"text": "a b c", "text_pair": "d"}, {"text": "x", "text_pair": ""}]},
    {"inputs": {"text": ["a b c", "x"], "text_pair": ["d", ""]}},
    {"signature_name": "single_text", "instances": ["a b", {"b64": "eA=="}]},
    {"signature_name": "single_text", "inputs": ["a b"]},
    {"signature_name": "serve_ids", "inputs": {"input_ids": [[1, 2]], "input_mask": [[1, 1]], "segment_ids": [[0, 1]]}},
    {"signature_name": "serve_ids", "instances": [{"input_ids": [1, 2], "input_mask": [1, 1], "segment_ids": [0, 1]}]},
    {"signature_name": "echo", "inputs": ["ok", {"b64": "AP4="}]},
    {"signature_name": "lookup", "instances": [0, 3]},
]
DEEP = "\x00DEEP\x00"  # replaced by a deeply nested list in the serialized text
ODD_VALUES = [
    None, True, False, 0, -1, 1.5, -0.0, 2 ** 31, -(2 ** 31) - 1, 2 ** 63, 10 ** 400, 1e308, float("nan"),
    float("inf"), "", "x", "\ud800", "\x00", "a" * 300, {"b64": "%%%"}, {"b64": "eA=="}, {"b64": 5},
    {"b64": "eA==", "x": 1}, {"b64": "eA"}, [], [[]], [[[1]]], [1, [2]], [[1, 2], [3]], {}, {"text": "a"},
    {"signature_name": "nope"}, ["a"] * 9, [0] * 9, DEEP, DEEP, DEEP,
]
TOKENS = [b'"', b"[", b"]", b"{", b"}", b",", b":", b"null", b"1e999", b"-", b"\\u0000", b"\\ud800", b"\xff", b"\x00", b"NaN"]
PATHS = ["/v1/models/tiny:predict"] * 20 + ["/v1/models/tiny/versions/1:predict", "/v1/models/tiny/versions/99999999999999999999:predict",
                                            "/v1/models/tiny/labels/x:predict", "/v1/models/nope:predict", "/v1/models/tiny:regress"]


@pytest.fixture(scope="module")
def server(model_base):
    batching = BatchingParameters(max_batch_size=8, num_batch_threads=2)
    with ModelServer(model_base, max_body_bytes=MAX_BODY, max_batch_size=8, rest_idle_timeout_seconds=2.0,
                     batching=batching) as s:
        yield s


# ----------------------------------------------------------------------------- REST cases


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _mutate_tree(body, rng: random.Random):
    body = json.loads(json.dumps(body))
    paths = list(_paths(body))[1:]
    if not paths or rng.random() < 0.03:
        return rng.choice(ODD_VALUES)  # the whole body
    path = rng.choice(paths)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.6:
        parent[path[-1]] = rng.choice(ODD_VALUES)
    elif action < 0.75 and isinstance(parent, dict):
        del parent[path[-1]]
    elif action < 0.85 and isinstance(parent, dict):
        parent[rng.choice(["txt", "text", "inputs", "instances", "signature_name", "", "\ud800"])] = rng.choice(ODD_VALUES)
    else:
        parent[path[-1]] = [parent[path[-1]]] * rng.choice([0, 2, 9])
    return body


def _serialize(body, rng: random.Random) -> bytes:
    text = json.dumps(body)
    while json.dumps(DEEP) in text:
        deep = rng.choice([2, 33, 65, 900, 5000, 100_000])
        text = text.replace(json.dumps(DEEP), "[" * deep + rng.choice(["1", '"a"']) + "]" * deep, 1)
    return text.encode("utf-8", "surrogatepass")


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(data) + 1)
        op = rng.random()
        if op < 0.3 and data:
            data[min(i, len(data) - 1)] = rng.randrange(256)
        elif op < 0.5:
            data[i:i] = rng.choice(TOKENS)
        elif op < 0.7:
            del data[i:i + rng.randint(1, 8)]
        else:
            data[i:i] = data[i:i + rng.randint(1, 16)] * rng.randint(1, 3)
    return bytes(data)


def rest_cases(rng: random.Random) -> list[tuple[str, bytes]]:
    cases = []
    for _ in range(REST_CASES):
        kind = rng.random()
        path = rng.choice(PATHS)
        if kind < 0.15:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        elif kind < 0.45:
            body = _mutate_bytes(json.dumps(rng.choice(VALID_BODIES)).encode(), rng)
        elif kind < 0.93:
            body = rng.choice(VALID_BODIES)
            for _ in range(rng.randint(1, 3)):
                body = _mutate_tree(body, rng)
            body = _serialize(body, rng)
        elif kind < 0.95:
            body = json.dumps({"signature_name": "single_text", "instances": ["x" * MAX_BODY]}).encode()  # 413
        else:
            body = json.dumps(rng.choice(VALID_BODIES)).encode()
        cases.append((path, body))
    return cases


def check_rest_answer(status: int, body: bytes) -> str | None:
    """None if the answer is well formed, else what is wrong with it."""
    try:
        answer = json.loads(body)
    except ValueError:
        return f"{status} with a body that is not JSON: {body[:200]!r}"
    if status == 200:
        return None if isinstance(answer, dict) and set(answer) in ({"predictions"}, {"outputs"}) else f"200 with {answer!r:.200}"
    if not 400 <= status < 500:
        return f"{status}: {answer!r:.300}"
    if not (isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str) and answer["error"]):
        return f"{status} with {answer!r:.200}"
    if "\n" in answer["error"] or "Traceback" in answer["error"]:
        return f"{status} with a multi-line error: {answer['error'][:300]!r}"
    return None


def test_rest_fuzz(server):
    rng = random.Random(SEED)
    cases = rest_cases(rng)
    failures, statuses, lock = [], {}, threading.Lock()

    def worker(offset):
        connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
        for index in range(offset, len(cases), THREADS):
            path, body = cases[index]
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                status, data = response.status, response.read()
                problem = check_rest_answer(status, data)
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                status, problem = "no answer", f"{type(e).__name__}: {e}"
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if problem:
                    failures.append(f"case {index} POST {path} {body[:300]!r}: {problem}")
        connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, f"{len(failures)} bad answers (statuses {statuses}); first ones:\n" + "\n".join(failures[:10])
    assert statuses.get(200, 0) > 50 and len(statuses) > 3, statuses  # the cases reach the model and the checks
    _assert_serves(server)


def _read_answers(sock: socket.socket, seconds: float) -> list[tuple[int, bytes]]:
    """Every answer on `sock` until the server closes it (or `seconds` pass)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionError):
        pass
    answers = []
    while b"\r\n\r\n" in data:
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length:")), 0)
        answers.append((int(lines[0].split()[1]), data[:length]))
        data = data[length:]
    return answers


def test_rest_wrong_content_length(server):
    rng = random.Random(SEED + 1)
    sockets = []
    for i in range(40):
        body = json.dumps(rng.choice(VALID_BODIES)).encode()
        declared = max(0, len(body) + rng.choice([-len(body), -20, -5, -1, 1, 7, 1000]))
        sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
        sock.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (declared, body))
        sockets.append((i, declared, body, sock))
    failures = []
    for i, declared, body, sock in sockets:  # all sent first: the short bodies wait out the 2 s deadline together
        with sock:
            answers = _read_answers(sock, 10)
        if not answers:
            failures.append(f"case {i}: Content-Length {declared} for {len(body)} bytes: no answer")
        for status, data in answers:
            if problem := check_rest_answer(status, data):
                failures.append(f"case {i}: Content-Length {declared} for {len(body)} bytes: {problem}")
    assert not failures, "\n".join(failures[:10])
    _assert_serves(server)


def _assert_serves(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    connection.request("POST", "/v1/models/tiny:predict", body=json.dumps(VALID_BODIES[0]))
    response = connection.getresponse()
    assert response.status == 200 and [p["label"] for p in json.loads(response.read())["predictions"]] == ["negative", "positive"]
    connection.close()


# ----------------------------------------------------------------------------- gRPC cases

SIGNATURE_INPUTS = {"serving_default": ["text", "text_pair"], "single_text": ["text"], "echo": ["data"],
                    "serve_ids": ["input_ids", "input_mask", "segment_ids"], "lookup": ["ids"]}
DTYPES = [v.number for v in types_pb2.DataType.DESCRIPTOR.values] + [99, 1000, -1]
VALUE_FIELDS = ["half_val", "float_val", "double_val", "int_val", "string_val", "scomplex_val", "int64_val",
                "bool_val", "dcomplex_val", "uint32_val", "uint64_val"]


def _random_tensor(rng: random.Random, good_dtype: int) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto()
    proto.dtype = good_dtype if rng.random() < 0.5 else rng.choice(DTYPES)
    rank = rng.choice([0, 1, 1, 1, 2, 2, 3, 4])
    for _ in range(rank):
        proto.tensor_shape.dim.add(size=rng.choice([0, 1, 1, 2, 2, 3, 5, 9, -1, -7, 2 ** 20, 2 ** 40, 2 ** 62]))
    if rng.random() < 0.05:
        proto.tensor_shape.unknown_rank = True
    n = rng.choice([0, 1, 2, 3, 4, 6, 10])
    how = rng.random()
    if how < 0.25:
        proto.tensor_content = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 4, 8, 12, 16, 33])))
    elif how < 0.95:
        field = "string_val" if proto.dtype == types_pb2.DT_STRING and rng.random() < 0.7 else rng.choice(VALUE_FIELDS)
        values = getattr(proto, field)
        for _ in range(n):
            if field == "string_val":
                values.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 12))))
            elif field == "bool_val":
                values.append(rng.random() < 0.5)
            elif field in ("float_val", "double_val", "scomplex_val", "dcomplex_val"):
                values.append(rng.choice([0.0, -1.5, 1e30, float("nan"), float("inf")]))
            elif field in ("uint32_val", "uint64_val", "half_val"):
                values.append(rng.choice([0, 1, 7, 65535]))
            else:
                values.append(rng.choice([0, 1, 2, 3, 7, -1, -(2 ** 31), 2 ** 31 - 1]))
    if rng.random() < 0.05:
        proto.version_number = rng.randint(-5, 5)
    return proto


def grpc_case(rng: random.Random) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tiny" if rng.random() < 0.9 else rng.choice(["", "nope", "tiny\x00"])
    signature = rng.choice(list(SIGNATURE_INPUTS))
    if rng.random() < 0.8:
        request.model_spec.signature_name = signature
    elif rng.random() < 0.5:
        request.model_spec.signature_name = rng.choice(["nope", "__saved_model_init_op"])
    if rng.random() < 0.1:
        request.model_spec.version.value = rng.choice([0, 1, 2, -1, 2 ** 62])
    elif rng.random() < 0.05:
        request.model_spec.version_label = "stable"
    names = list(SIGNATURE_INPUTS[signature])
    if rng.random() < 0.2:
        names.append(rng.choice(["txt", "", "text_pair", "ids"]))
    if rng.random() < 0.2 and names:
        names.remove(rng.choice(names))
    good_dtype = types_pb2.DT_INT32 if signature in ("serve_ids", "lookup") else types_pb2.DT_STRING
    for name in names:
        request.inputs[name].CopyFrom(_random_tensor(rng, good_dtype))
    if rng.random() < 0.1:
        request.output_filter.append(rng.choice(["label", "logits", "nope", "value"]))
    return request


def _valid_request(rng: random.Random) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest(model_spec={"name": "tiny", "signature_name": "lookup"})
    ids = np.array([rng.randrange(4) for _ in range(rng.randint(1, 3))], np.int32)
    request.inputs["ids"].dtype = types_pb2.DT_INT32
    request.inputs["ids"].tensor_shape.dim.add(size=len(ids))
    request.inputs["ids"].int_val.extend(ids.tolist())
    return request


def check_grpc_outcome(call, codes: dict) -> str | None:
    """None if `call` answers or fails with a well-formed error, else what is wrong; counts codes."""
    try:
        call()
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
    codes[code.name] = codes.get(code.name, 0) + 1
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) or (code != grpc.StatusCode.OK and not details):
        return f"{code}: {details[:300]!r}"
    if "Traceback" in details or "\n" in details:
        return f"{code} with a multi-line message: {details[:300]!r}"
    return None


def test_grpc_fuzz(server):
    rng = random.Random(SEED + 2)
    failures, codes, raw_codes = [], {}, {}
    target = f"127.0.0.1:{server.grpc_port}"
    with grpc.insecure_channel(target) as channel:
        predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                      request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                      response_deserializer=predict_pb2.PredictResponse.FromString)
        for index in range(GRPC_CASES):
            request = grpc_case(rng)
            if problem := check_grpc_outcome(lambda: predict(request, timeout=30), codes):
                failures.append(f"case {index} {text_format.MessageToString(request, as_one_line=True)[:400]}: {problem}")

        raw_methods = [
            ("/tensorflow.serving.PredictionService/Predict", lambda: _valid_request(rng)),
            ("/tensorflow.serving.PredictionService/GetModelMetadata",
             lambda: get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "tiny"}, metadata_field=["signature_def"])),
            ("/tensorflow.serving.ModelService/GetModelStatus",
             lambda: get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny"})),
        ]
        for index in range(RAW_GRPC_CASES):
            method, make = rng.choice(raw_methods)
            raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            data = make().SerializeToString()
            data = _mutate_bytes(data, rng) if rng.random() < 0.9 else bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
            if problem := check_grpc_outcome(lambda: raw(data, timeout=30), raw_codes):
                failures.append(f"raw case {index} {method} {data!r:.300}: {problem}")
        assert not failures, f"{len(failures)} bad answers ({codes}, raw {raw_codes}); first ones:\n" + "\n".join(failures[:10])
        assert codes.get("OK", 0) > 20 and raw_codes.get("OK", 0) > 20 and len(codes) > 3, (codes, raw_codes)
        response = predict(_valid_request(random.Random(0)), timeout=30)
        assert response.outputs["value"].float_val
    _assert_serves(server)



# ----------------------------------------------------------------------------- what the fuzz found, pinned


@pytest.mark.parametrize("method,body,words", [
    # A :classify / :regress body whose signature_name is not a string: was 500 (unhashable type).
    ("regress", b'{"signature_name": [1], "instances": [1]}', "'signature_name' must be a string"),
    # JSON nested deeper than the parser's recursion limit: was 500 (RecursionError).
    ("predict", b"[" * 30_000 + b"]" * 30_000, "nested too deeply"),
    # An input nested deeper than numpy's 64 dimensions: was 500 (ValueError from numpy).
    ("predict", b'{"signature_name": "lookup", "inputs": ' + b"[" * 900 + b"1" + b"]" * 900 + b"}",
     "a value nested 900 lists deep; at most 32 dimensions are served"),
])
def test_found_rest_errors_are_400(server, method, body, words):
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    connection.request("POST", f"/v1/models/tiny:{method}", body=body)
    response = connection.getresponse()
    assert response.status == 400 and words in json.loads(response.read())["error"]
    connection.close()


def test_found_graph_errors_are_one_line(server):
    # Inputs of different lengths pass the signature's [?, ?] specs and fail inside the graph;
    # TF's message has a preamble, a stack-trace placeholder and the node over several lines.
    body = {"signature_name": "serve_ids", "inputs": {"input_ids": [[1, 2]], "input_mask": [[1, 1]], "segment_ids": [[0, 0, 0]]}}
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    connection.request("POST", "/v1/models/tiny:predict", body=json.dumps(body))
    response = connection.getresponse()
    error = json.loads(response.read())["error"]
    assert response.status == 400
    assert error == "running signature 'serve_ids' failed: Incompatible shapes: [1,2] vs. [1,3] (node add)"
    connection.close()


def test_found_grpc_errors_are_invalid_argument(server):
    tensor = tensor_pb2.TensorProto
    cases = [
        # dtype not in DataType: was INTERNAL (TypeError from tf.as_dtype).
        ({"ids": tensor(dtype=99, int_val=[1])}, "dtype 99 (not a DataType)"),
        # A shape TF would fill by repeating the last value: was INTERNAL (MemoryError).
        ({"ids": tensor(dtype=types_pb2.DT_INT32, tensor_shape={"dim": [{"size": 2 ** 40}]}, int_val=[1])}, "the server's limit"),
        ({"ids": tensor(dtype=types_pb2.DT_INT32, tensor_shape={"dim": [{"size": -3}]})}, "not a known shape"),
        ({"ids": tensor(dtype=types_pb2.DT_INT32, tensor_shape={"dim": [{"size": 3}]}, tensor_content=b"\x00" * 5)}, "not a valid int32 TensorProto"),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                      request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                      response_deserializer=predict_pb2.PredictResponse.FromString)
        for inputs, words in cases:
            request = predict_pb2.PredictRequest(model_spec={"name": "tiny", "signature_name": "lookup"})
            for key, proto in inputs.items():
                request.inputs[key].CopyFrom(proto)
            with pytest.raises(grpc.RpcError) as e:
                predict(request, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details(), e.value.details()
        # Bytes that are not a PredictRequest: grpcio's own answer would be INTERNAL.
        raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        with pytest.raises(grpc.RpcError) as e:
            raw(b"\x0a\xff\xff", timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid tensorflow.serving.PredictRequest" in e.value.details()


def test_found_json_numbers_out_of_range_for_floats_are_refused():
    # The tiny model has no float input, so the fuzz cannot reach this through the server.
    assert json_to_array([1.5, float("inf")], tf.float32, "x").tolist() == [1.5, float("inf")]
    for value, words in ((10 ** 400, "(401 characters) is out of range for float32"), (1e300, "1e+300 is out of range")):
        with pytest.raises(ServingError, match=r"out of range") as e:
            json_to_array([value], tf.float32, "input 'x'")
        assert words in e.value.message


# ----------------------------------------------------------------------------- every JSON type in every field

HUGE = "9" * 5000  # past CPython's 4300 digits for int(): was 500 "Exceeds the limit (4300 digits)"
# Raw JSON text, so that numbers json.dumps cannot write (HUGE) go in as they are.
JSON_VALUES = {
    "null": "null", "true": "true", "false": "false", "zero": "0", "negative": "-1", "float": "1.5",
    "huge integer": HUGE, "huge negative integer": "-" + HUGE, "long float": "1." + "0" * 5000, "huge exponent": "1e99999",
    "string": '"x"', "empty string": '""', "list": '["x"]', "empty list": "[]", "object": '{"text": "x"}',
    "empty object": "{}", "b64": '{"b64": "eA=="}',
    "deep list": "[" * 100_000 + "]" * 100_000, "deep object": '{"a":' * 100_000 + "1" + "}" * 100_000,
}
ALWAYS_REFUSED = {"huge integer", "huge negative integer", "deep list", "deep object"}


@pytest.fixture(scope="module")
def roomy_server(model_base):
    """The fuzz server's settings with room for a body of 100,000 nested lists (200 KB)."""
    batching = BatchingParameters(max_batch_size=8, num_batch_threads=2)
    with ModelServer(model_base, max_body_bytes=1 << 20, max_batch_size=8, batching=batching) as s:
        yield s
FIELDS = {  # "@" is where the value goes
    "the body": "@",
    "instances": '{"instances": @}',
    "inputs": '{"inputs": @}',
    "signature_name": '{"signature_name": @, "instances": [{"text": "a", "text_pair": "b"}]}',
    "an instance": '{"instances": [@, {"text": "a", "text_pair": "b"}]}',
    "an instance of a one-input signature": '{"signature_name": "single_text", "instances": ["a", @]}',
    "a value in an instance": '{"instances": [{"text": @, "text_pair": "b"}]}',
    "a columnar input": '{"inputs": {"text": @, "text_pair": ["b"]}}',
    "a value in a columnar input": '{"inputs": {"text": [@], "text_pair": ["b"]}}',
    "a token id": '{"signature_name": "serve_ids", "inputs": {"input_ids": [[1, @]], "input_mask": [[1, 1]], "segment_ids": [[0, 0]]}}',
    "an integer instance": '{"signature_name": "lookup", "instances": [1, @]}',
    "an unknown key": '{"instances": [{"text": "a", "text_pair": "b"}], "extra": @}',
}


def _post(connection, path: str, body: bytes, method: str = "POST") -> tuple[int, bytes]:
    connection.request(method, path, body=body if method == "POST" else None)
    response = connection.getresponse()
    return response.status, response.read()


def _errors_logged(caplog):
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records
            if r.exc_info or r.levelname in ("ERROR", "CRITICAL")]


def test_every_json_type_in_every_field_gets_an_answer_never_a_500(roomy_server, caplog):
    """Each JSON type (and numbers past what Python reads, and 100,000 levels of nesting) in each
    field of a :predict body: a valid answer or a one-line 4xx error; the refused kinds always 4xx.
    The server logs no traceback and keeps serving."""
    server = roomy_server
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    failures = []
    for field, template in FIELDS.items():
        for kind, value in JSON_VALUES.items():
            status, data = _post(connection, "/v1/models/tiny:predict", template.replace("@", value).encode())
            problem = check_rest_answer(status, data)
            if problem is None and kind in ALWAYS_REFUSED and status != 400:
                problem = f"{status} for a body that must be refused as bad JSON"
            if problem:
                failures.append(f"{kind} as {field}: {problem}")
    connection.close()
    assert not failures, "\n".join(failures)
    assert not _errors_logged(caplog)
    _assert_serves(server)


def test_huge_numbers_get_400_with_a_reason(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    for method in ("predict", "classify"):
        body = b'{"signature_name": %s, "instances": [1]}' % HUGE.encode()
        status, data = _post(connection, f"/v1/models/tiny:{method}", body)
        assert status == 400, (method, data[:300])
    status, data = _post(connection, "/v1/models/tiny:predict", b'{"instances": [%s]}' % HUGE.encode())
    assert (status, json.loads(data)) == (400, {"error": "JSON parse error: a number has more than 4300 digits"})
    status, data = _post(connection, "/v1/models/tiny/versions/%s:predict" % HUGE, json.dumps(VALID_BODIES[0]).encode())
    assert (status, json.loads(data)) == (400, {"error": f"Failed to convert version: {HUGE[:20]}... (5000 characters) to numeric."})
    connection.close()


# Every route with a version, label or model name that no server has: 4xx, never 200 or 500.
PATH_VALUES = {
    "version": [HUGE, "9" * 20, "9223372036854775807", "9223372036854775808", "0", "2", "-1", "1.0", "1e3", "null", "%31"],
    "label": [HUGE, "null", "1", "%00", "[]"],
    "model name": [HUGE, "null", "true", "1", "%00", "..", ".", "tiny%2F1", "[]", "{}", "%F0%9F%98%80", "tiny%00"],
}


def _routes(kind: str, value: str) -> list[tuple[str, str]]:
    model = value if kind == "model name" else "tiny"
    where = {"version": f"/versions/{value}", "label": f"/labels/{value}", "model name": ""}[kind]
    base = f"/v1/models/{model}{where}"
    return [("GET", base), ("GET", base + "/metadata"), ("POST", base + ":predict"), ("POST", base + ":classify")]


def test_every_version_label_and_model_name_in_the_path_gets_a_4xx(roomy_server, caplog):
    server = roomy_server
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    body = json.dumps(VALID_BODIES[0]).encode()
    failures = []
    for kind, values in PATH_VALUES.items():
        for value in values:
            for method, path in _routes(kind, value):
                status, data = _post(connection, path, body, method)
                problem = check_rest_answer(status, data) if status != 200 else "200"
                if problem:
                    failures.append(f"{method} {path[:80]}: {problem}")
    connection.close()
    assert not failures, "\n".join(failures)
    assert not _errors_logged(caplog)
    _assert_serves(server)


def test_grpc_numbers_at_the_ends_of_their_range(server):
    """model_spec.version and TensorProto dims at the ends of int64, over every method: errors
    with a status other than INTERNAL / UNKNOWN, and the server keeps serving."""
    ends = [-(2 ** 63), -1, 0, 1, 2, 2 ** 63 - 1]
    codes, failures = {}, []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        methods = {
            "Predict": (channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                            request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                            response_deserializer=predict_pb2.PredictResponse.FromString),
                        lambda: _valid_request(random.Random(0))),
            "GetModelMetadata": (channel.unary_unary("/tensorflow.serving.PredictionService/GetModelMetadata",
                                                     request_serializer=get_model_metadata_pb2.GetModelMetadataRequest.SerializeToString,
                                                     response_deserializer=get_model_metadata_pb2.GetModelMetadataResponse.FromString),
                                 lambda: get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "tiny"}, metadata_field=["signature_def"])),
            "GetModelStatus": (channel.unary_unary("/tensorflow.serving.ModelService/GetModelStatus",
                                                   request_serializer=get_model_status_pb2.GetModelStatusRequest.SerializeToString,
                                                   response_deserializer=get_model_status_pb2.GetModelStatusResponse.FromString),
                               lambda: get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "tiny"})),
        }
        for method, (call, make) in methods.items():
            for version in ends:
                request = make()
                request.model_spec.version.value = version
                if problem := check_grpc_outcome(lambda: call(request, timeout=30), codes):
                    failures.append(f"{method} version {version}: {problem}")
            request = make()
            request.model_spec.name = "x" * 50_000  # within the server's 64 KB messages
            if problem := check_grpc_outcome(lambda: call(request, timeout=30), codes):
                failures.append(f"{method} with a 50,000-character name: {problem}")
        predict = methods["Predict"][0]
        for dims in ([2 ** 63 - 1], [-(2 ** 63)], [2 ** 62, 2 ** 62], [2 ** 31, 0], [9], [1, 2 ** 40]):
            request = _valid_request(random.Random(0))
            del request.inputs["ids"].tensor_shape.dim[:]
            for d in dims:
                request.inputs["ids"].tensor_shape.dim.add(size=d)
            if problem := check_grpc_outcome(lambda: predict(request, timeout=30), codes):
                failures.append(f"Predict with dims {dims}: {problem}")
        assert not failures, "\n".join(failures)
        assert codes.get("OK", 0) == 3 and set(codes) == {"OK", "NOT_FOUND", "INVALID_ARGUMENT"}, codes  # version 2 of tiny does not exist
    _assert_serves(server)


def test_a_batch_over_the_limit_is_refused_on_its_shape_before_conversion(server):
    """The batch is counted on the shape a request declares, before any value is converted: the
    value that would fail conversion (a string among integers, bytes that are no int32) is never
    reached. Refusing a batch of a million values must not cost converting them."""
    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    status, data = _post(connection, "/v1/models/tiny:predict",
                         json.dumps({"signature_name": "lookup", "inputs": [0, 1, 2, 3, 0, 1, 2, 3, "x"]}).encode())
    assert (status, json.loads(data)["error"]) == (400, "input 'ids' has a batch of 9, more than the server's max_batch_size 8")
    status, data = _post(connection, "/v1/models/tiny:predict",
                         json.dumps({"signature_name": "lookup", "inputs": [[0], [1]]}).encode())
    assert (status, json.loads(data)["error"]) == (400, "input 'ids' has shape [2, 1] but signature 'lookup' expects [?]")
    connection.close()
    request = predict_pb2.PredictRequest(model_spec={"name": "tiny", "signature_name": "lookup"})
    request.inputs["ids"].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_INT32, tensor_shape={"dim": [{"size": 9}]},
                                                          tensor_content=b"\x00" * 5))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                      request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                      response_deserializer=predict_pb2.PredictResponse.FromString)
        with pytest.raises(grpc.RpcError) as e:
            predict(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "input 'ids' has a batch of 9, more than the server's max_batch_size 8"
