"""Request deadlines (serving.batching, "Deadlines"), TF Serving's REST thread and CORS flags.

A request still waiting for the model when its deadline passes (the gRPC client's, or
`--rest_api_timeout_in_ms` for REST) is answered at once and never run; one that gets the model
in time is answered as always. The model threads are held by the tests themselves (a slot of the
server's own scheduler, or a model call that waits for the test), so what waits is certain.
"""

import json
import random
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
import tensorflow as tf

from electra_tf.serving.batching import BATCH_QUEUE_TIMEOUT, Batcher, FifoSlots, Unbatched, request_deadline
from electra_tf.serving.batching_parameters import BatchingParameters
from electra_tf.serving.errors import ServingError
from electra_tf.serving.server import ModelServer

BODY = {"instances": [{"text": "a fine film", "text_pair": ""}]}


class GatedCall:
    """A model call that waits for the test to open its gate; counts the rows it ran."""

    name = "gated"

    def __init__(self):
        self.gate, self.entered = threading.Event(), threading.Event()
        self.ran: list[int] = []

    def call(self, inputs):
        self.entered.set()
        self.gate.wait(30)
        self.ran.extend(inputs["x"].tolist())
        return {"y": inputs["x"] * 2}


def in_thread(fn):
    """fn() started on its own thread; returns (thread, result dict with 'value' or 'error')."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def rows(*values):
    return {"x": np.array(values, dtype=np.int64)}


def deadline_run(scheduler, call, inputs, seconds):
    with request_deadline(seconds):
        return scheduler.run(call, inputs)


# ----------------------------------------------------------------------------- the schedulers


def test_unbatched_a_request_that_cannot_start_in_time_is_refused_unrun_and_the_slot_survives():
    scheduler, call = Unbatched(threads=1), GatedCall()
    holder, held = in_thread(lambda: scheduler.run(call, rows(1)))
    assert call.entered.wait(10)
    start = time.monotonic()
    with pytest.raises(ServingError) as e:
        deadline_run(scheduler, call, rows(2), 0.2)
    waited = time.monotonic() - start
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and 0.15 < waited < 5, waited
    assert "waited" in e.value.message and "one of 1 model threads" in e.value.message
    # A request in time waits its turn and runs; one with no deadline too; nothing ran row 2.
    late, out_late = in_thread(lambda: deadline_run(scheduler, call, rows(3), 30))
    free, out_free = in_thread(lambda: scheduler.run(call, rows(4)))
    time.sleep(0.2)
    call.gate.set()
    for thread in (holder, late, free):
        thread.join(10)
    assert held["value"]["y"].tolist() == [2] and out_late["value"]["y"].tolist() == [6]
    assert out_free["value"]["y"].tolist() == [8] and sorted(call.ran) == [1, 3, 4]
    # A deadline already past never runs, even with the slot free.
    with pytest.raises(ServingError, match="Deadline exceeded"):
        deadline_run(scheduler, call, rows(5), 0)
    assert 5 not in call.ran


def test_unbatched_does_not_start_a_call_that_could_not_end_before_its_deadline():
    """After calls of a signature on one row took ~0.4 s, a one-row request with 0.2 s left
    that has to wait for the thread is refused at once and unrun (starting it would answer too
    late and hold the thread); one with time to spare waits and runs. On a free thread the same
    request runs whatever the estimate (a slow first call must not refuse an idle server's
    requests), and its call brings the estimate down."""
    scheduler, call = Unbatched(threads=1), GatedCall()
    threading.Timer(0.4, call.gate.set).start()
    scheduler.run(call, rows(1))
    assert 0.35 < scheduler.expected_seconds(call, 1) < 5
    call.gate.clear()
    holder, _ = in_thread(lambda: scheduler.run(call, rows(0)))  # the thread is busy, no estimate for 0 rows
    call.entered.clear()
    time.sleep(0.1)
    start = time.monotonic()
    with pytest.raises(ServingError) as e:
        deadline_run(scheduler, call, rows(2), 0.2)
    assert time.monotonic() - start < 0.1  # at once, not at the deadline
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "could no longer end in time" in e.value.message
    spare, out_spare = in_thread(lambda: deadline_run(scheduler, call, rows(3), 30))
    time.sleep(0.2)
    call.gate.set()
    holder.join(10), spare.join(10)
    assert out_spare["value"]["y"].tolist() == [6]
    # Free thread: runs with less time left than the estimate; fast calls pull the estimate down.
    for value in (4, 5, 6):
        assert deadline_run(scheduler, call, rows(value), 0.2)["y"].tolist() == [2 * value]
    assert scheduler.expected_seconds(call, 1) < 0.1
    assert sorted(call.ran) == [0, 1, 3, 4, 5, 6]  # row 2 never ran


def test_fifo_slots_lose_no_slot_when_deadlines_end_as_slots_are_handed_over():
    """Waiters whose deadline ends as the holder hands its slot over (the race the hand-over
    check covers): after hundreds of them every slot is free again, no waiter left behind."""
    slots, rng, results = FifoSlots(2), random.Random(0), []

    def worker(seed):
        r = random.Random(seed)
        for _ in range(30):
            if slots.acquire(time.monotonic() + r.uniform(0, 0.003)):
                time.sleep(r.uniform(0, 0.002))
                slots.release()
                results.append(True)
            else:
                results.append(False)

    threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 360 and True in results and False in results
    assert slots._free == 2 and not slots._waiters
    assert slots.acquire(time.monotonic() + 1) and slots.acquire(time.monotonic() + 1)
    assert not slots.acquire(time.monotonic() + 0.05)  # both held: the third times out


def test_batcher_a_request_whose_deadline_passes_in_the_queue_is_tf_servings_resource_exhausted():
    batcher, call = Batcher(BatchingParameters(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1)), GatedCall()
    try:
        first, out_first = in_thread(lambda: batcher.run(call, rows(1)))
        assert call.entered.wait(10)  # the one batch thread is busy with row 1
        start = time.monotonic()
        with pytest.raises(ServingError) as e:
            deadline_run(batcher, call, rows(2), 0.2)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.message == BATCH_QUEUE_TIMEOUT
        assert 0.15 < time.monotonic() - start < 5
        assert batcher._queues == {}  # taken out of the queue, not left for the batch thread
        # Queued behind the busy thread: one in time, one that will not be when the thread frees.
        kept, out_kept = in_thread(lambda: deadline_run(batcher, call, rows(3), 30))
        time.sleep(0.1)
        expired, out_expired = in_thread(lambda: deadline_run(batcher, call, rows(4), 0.3))
        time.sleep(0.6)
        call.gate.set()
        for thread in (first, kept, expired):
            thread.join(10)
        assert out_first["value"]["y"].tolist() == [2] and out_kept["value"]["y"].tolist() == [6]
        assert isinstance(out_expired["error"], ServingError)
        assert out_expired["error"].code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sorted(call.ran) == [1, 3]  # rows 2 and 4 never ran
    finally:
        call.gate.set()
        batcher.stop()


# ----------------------------------------------------------------------------- the server


def _status(page: str, status: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(page) for s in family.samples
               if s.name == ":tensorflow:serving:request_count" and s.labels.get("status") == status)


def _post(port: int, body=BODY, headers=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/tiny:predict",
                                     data=json.dumps(body).encode(), headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), dict(e.headers)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def test_rest_timeout_and_grpc_deadline_refuse_requests_the_busy_model_cannot_start_in_time(model_base):
    with ModelServer(model_base, model_threads=1, rest_api_timeout_ms=300, metrics_path="/metrics") as server:
        assert _post(server.rest_port)[0] == 200
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}"))
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.inputs["text"].CopyFrom(tf.make_tensor_proto(["a fine film"]))
        request.inputs["text_pair"].CopyFrom(tf.make_tensor_proto([""]))
        stub.Predict(request, timeout=30)
        slots = server.scheduler._slots
        assert slots.acquire()  # the one model thread is busy
        try:
            start = time.monotonic()
            status, body, _ = _post(server.rest_port)
            assert status == 504 and "Deadline exceeded" in body["error"], (status, body)
            assert 0.25 < time.monotonic() - start < 5
            before = _status(_scrape(server.rest_port), "DEADLINE_EXCEEDED")
            with pytest.raises(grpc.RpcError) as e:
                stub.Predict(request, timeout=0.3)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # The server, not only the client, gave up on it: counted as such, never run.
            deadline = time.monotonic() + 5
            while _status(_scrape(server.rest_port), "DEADLINE_EXCEEDED") < before + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _status(_scrape(server.rest_port), "DEADLINE_EXCEEDED") == before + 1
            # A gRPC request with time to spare waits for the model and is answered.
            waiting, out = in_thread(lambda: stub.Predict(request, timeout=30))
            time.sleep(0.5)
            assert waiting.is_alive()
        finally:
            slots.release()
        waiting.join(10)
        assert list(out["value"].outputs["label"].string_val) in ([b"negative"], [b"positive"])
        assert _post(server.rest_port)[0] == 200
    # No timeout (<= 0): a REST request waits for the model as long as it takes.
    with ModelServer(model_base, model_threads=1, rest_api_timeout_ms=0) as server:
        assert server.rest_timeout_seconds is None
        server.scheduler._slots.acquire()
        waiting, out = in_thread(lambda: _post(server.rest_port))
        time.sleep(0.6)
        assert waiting.is_alive()
        server.scheduler._slots.release()
        waiting.join(10)
        assert out["value"][0] == 200


def test_rest_api_num_threads_handles_that_many_requests_at_once(model_base):
    with ModelServer(model_base, rest_api_num_threads=1) as server:
        slots = server._rest.request_slots
        assert slots.n == 1 and slots.acquire()
        try:
            waiting, out = in_thread(lambda: _post(server.rest_port))
            time.sleep(0.5)
            assert waiting.is_alive() and "value" not in out  # its turn has not come
        finally:
            slots.release()
        waiting.join(10)
        assert out["value"][0] == 200
    with ModelServer(model_base) as server:
        assert server._rest.request_slots is None


def test_cors_headers_and_preflight_as_tf_serving(model_base):
    cors = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "POST, GET",
            "Access-Control-Allow-Headers": "Content-Type"}

    def options(port, path="/v1/models/tiny:predict", origin="https://app.example"):
        headers = {"Origin": origin} if origin else {}
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="OPTIONS", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    with ModelServer(model_base, enable_cors=True) as on, ModelServer(model_base) as off:
        status, body, headers = _post(on.rest_port)
        assert status == 200 and all(headers.get(k) == v for k, v in cors.items()), headers
        status, body, headers = _post(on.rest_port, body={"instances": "not a list"})
        assert status == 400 and headers.get("Access-Control-Allow-Origin") == "*"  # errors too
        status, body, headers = options(on.rest_port)
        assert status == 200 and body == b"" and all(headers.get(k) == v for k, v in cors.items()), headers
        status, body, headers = options(on.rest_port, origin=None)
        assert status == 400 and json.loads(body)["error"] == "Origin header is missing in CORS preflight"
        assert options(on.rest_port, path="/elsewhere")[0] == 404
        status, body, headers = _post(off.rest_port)
        assert status == 200 and not any(k in headers for k in cors)
        status, body, headers = options(off.rest_port)
        assert status == 200 and not any(k in headers for k in cors)  # answered, nothing allowed
