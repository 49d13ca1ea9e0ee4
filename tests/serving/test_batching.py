"""serving.batching: TF Serving's batching parameters, and batched answers against unbatched ones."""

import json
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from electra_tf.serving.batching_parameters import BatchingParameters, read_batching_parameters
from electra_tf.serving.server import ModelServer

# One batch thread and a 200 ms window: requests sent together land in one batch.
WINDOW = BatchingParameters(max_batch_size=16, batch_timeout_micros=200_000, max_enqueued_batches=4, num_batch_threads=1)


@pytest.fixture(scope="module")
def servers(model_base):
    with ModelServer(model_base, batching=WINDOW) as batched, ModelServer(model_base) as unbatched:
        yield batched, unbatched


def post(server, body) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.rest_port}/v1/models/tiny:predict", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def together(fn, items) -> list:
    """fn(item) for every item, from as many threads released at once."""
    results = [None] * len(items)
    barrier = threading.Barrier(len(items))

    def worker(i):
        barrier.wait()
        results[i] = fn(items[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_batching_parameters_read_tf_serving_text(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text(
        "# as in TF Serving's batching guide\n"
        "max_batch_size { value: 128 }\n"
        "batch_timeout_micros { value: 0 }\n"
        "max_enqueued_batches { value: 1000000 }\n"
        "num_batch_threads: { value: 8 }\n"
        'thread_pool_name { value: "batch_threads" }\n'
    )
    assert read_batching_parameters(str(path)) == BatchingParameters(128, 0, 1_000_000, 8)
    assert BatchingParameters.from_text("max_batch_size { value: 4 }") == BatchingParameters(max_batch_size=4)
    defaults = BatchingParameters()  # TF Serving's BasicBatchScheduler defaults
    assert (defaults.max_batch_size, defaults.batch_timeout_micros, defaults.max_enqueued_batches) == (1000, 0, 10)
    for text, words in (
        ("max_batch_sise { value: 4 }", 'no field named "max_batch_sise"'),
        ("max_batch_size { value: 0 }", "max_batch_size must be >= 1, got 0"),
        ("batch_timeout_micros { value: -1 }", "batch_timeout_micros must be >= 0"),
        ("allowed_batch_sizes: 2 allowed_batch_sizes: 8", "Last entry in allowed_batch_sizes must match max_batch_size;"
                                                         " last entry was 8; expected 1000"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: 4 allowed_batch_sizes: 2 allowed_batch_sizes: 8",
         "allowed_batch_sizes must be increasing"),
        ("max_batch_size { value: 8 } max_execution_batch_size { value: 9 }", "max_execution_batch_size must be from 1"),
        ("max_batch_size: 4", "max_batch_size"),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(")) as e:
            BatchingParameters.from_text(text, "batching.config")
        assert str(e.value).startswith("batching.config")


def test_batched_answers_equal_unbatched(servers):
    batched, unbatched = servers
    bodies = [{"inputs": {"text": ["a b c", "x"][: 1 + i % 2], "text_pair": ["d", ""][: 1 + i % 2]}} for i in range(4)]
    bodies += [{"signature_name": "single_text", "instances": [f"w{i} " * i]} for i in range(1, 4)]
    # Two sequence lengths: different non-batch dimensions go to different batches.
    bodies += [{"signature_name": "serve_ids", "inputs": {"input_ids": [[i] * n], "input_mask": [[1] * n],
                                                         "segment_ids": [[0] * n]}} for i, n in ((1, 2), (2, 2), (3, 5))]
    bodies += [{"signature_name": "lookup", "instances": [i % 4, 3 - i % 4]} for i in range(3)]
    before = dict(batched.scheduler.stats)
    answers = together(lambda body: post(batched, body), bodies)
    assert answers == [post(unbatched, body) for body in bodies]
    assert all(status == 200 for status, _ in answers)
    assert batched.scheduler.stats["merged"] - before["merged"] >= 8  # most requests shared a call


def test_an_error_in_a_batch_stays_with_its_request(servers):
    batched, _ = servers
    ids = [[0], [1], [7], [2], [3]]  # 7 is outside the table: the merged call fails
    before = dict(batched.scheduler.stats)
    answers = together(lambda i: post(batched, {"signature_name": "lookup", "instances": i}), ids)
    assert [status for status, _ in answers] == [200, 200, 400, 200, 200]
    assert [a["predictions"] for s, a in answers if s == 200] == [[1.0], [2.0], [3.0], [4.0]]  # version 1: +1
    assert "indices[0] = 7 is not in [0, 4)" in answers[2][1]["error"]
    assert batched.scheduler.stats["alone"] - before["alone"] >= 2


def test_grpc_requests_batch_with_rest_ones(servers):
    batched, unbatched = servers
    stub_channel = grpc.insecure_channel(f"127.0.0.1:{batched.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(stub_channel)

    def grpc_lookup(ids):
        request = predict_pb2.PredictRequest(model_spec={"name": "tiny", "signature_name": "lookup"})
        request.inputs["ids"].CopyFrom(tf.make_tensor_proto(np.array(ids, np.int32)))
        return tf.make_ndarray(stub.Predict(request, timeout=30).outputs["value"]).tolist()

    def either(item):
        kind, ids = item
        return grpc_lookup(ids) if kind == "grpc" else post(batched, {"signature_name": "lookup", "instances": ids})[1]["predictions"]

    items = [("grpc", [0, 1]), ("rest", [2]), ("grpc", [3]), ("rest", [1, 1, 0])]
    before = dict(batched.scheduler.stats)
    with stub_channel:
        answers = together(either, items)
    assert answers == [post(unbatched, {"signature_name": "lookup", "instances": ids})[1]["predictions"] for _, ids in items]
    assert batched.scheduler.stats["merged"] - before["merged"] >= 2


def test_a_request_larger_than_max_batch_size_is_refused(servers):
    batched, _ = servers
    status, answer = post(batched, {"signature_name": "lookup", "instances": [0] * 17})
    assert status == 400 and answer["error"] == "Task size 17 is larger than maximum batch size 16"


class Recorder:
    """A model call that records the rows and widths of each call and answers each row's sum."""

    name = "sum"

    def __init__(self):
        self.calls = []

    def call(self, inputs):
        ids = inputs["ids"]
        self.calls.append(ids.shape)
        return {"sum": ids.sum(axis=1), "ids": ids}


def test_tf_servings_allowed_sizes_large_batch_splitting_and_variable_lengths(tmp_path):
    from electra_tf.serving.batching import Batcher

    config = BatchingParameters.from_text(
        "max_batch_size { value: 8 } batch_timeout_micros { value: 300000 } num_batch_threads { value: 1 }"
        " allowed_batch_sizes: 2 allowed_batch_sizes: 4 allowed_batch_sizes: 8"
        " enable_large_batch_splitting { value: true } max_execution_batch_size { value: 4 }"
        " pad_variable_length_inputs: true")
    assert (config.allowed_batch_sizes, config.execution_batch_size) == ((2, 4, 8), 4)
    assert [config.padded_size(n) for n in (1, 2, 3, 5)] == [2, 2, 4, 8]
    batcher, model = Batcher(config), Recorder()
    try:
        # one row alone is padded to 2 with a copy of its first row; only its own answer comes back
        out = batcher.run(model, {"ids": np.array([[1, 2, 3]])})
        assert model.calls == [(2, 3)] and out["sum"].tolist() == [6]
        # a request of 6 rows, above the execution size of 4, runs as a batch of 4 and one of 2
        model.calls.clear()
        rows = np.arange(12).reshape(6, 2)
        out = batcher.run(model, {"ids": rows})
        assert sorted(model.calls) == [(2, 2), (4, 2)] and out["sum"].tolist() == rows.sum(axis=1).tolist()
        with pytest.raises(Exception, match="Task size 9 is larger than maximum batch size 8"):
            batcher.run(model, {"ids": np.zeros((9, 2), np.int64)})
        # requests of widths 2 and 3 share one call, the narrow one padded with its first value
        model.calls.clear()
        answers = together(lambda ids: batcher.run(model, {"ids": np.array(ids)}), [[[5, 1]], [[1, 1, 1]], [[2, 2, 2]]])
        assert model.calls == [(4, 3)], model.calls  # 3 rows, padded to the allowed 4
        assert [a["sum"].tolist() for a in answers] == [[11], [3], [6]]  # [5, 1] + 5: TF Serving's padding value
        assert answers[0]["ids"].tolist() == [[5, 1, 5]]  # the outputs keep the padded width, as in TF Serving
    finally:
        batcher.stop()
