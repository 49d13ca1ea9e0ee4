"""Replaying a version's warmup requests before it becomes AVAILABLE, as TF Serving does.

TF Serving reads `VERSION/assets.extra/tf_serving_warmup_requests` when it loads a version: a
TFRecord file of serialized `PredictionLog`s (predict, classify, regress or multi-inference
logs), at most 1,000 records. It runs each request once, and only then marks the version
AVAILABLE; a record it cannot parse or run fails the load. The same here: the first client
request to a new version then pays none of TensorFlow's first-call work (the signature graph's
optimisation, the kernels of each input shape), which is tens of times a request's time.

The requests run through the signatures directly (validated as a client's would be, without
the batching scheduler: a warmup is a load step, not traffic). A version without the file
loads as before.
"""

from __future__ import annotations

import logging
import os
import time

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from electra_tf.serving.example_inputs import proto_examples

log = logging.getLogger(__name__)

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_RECORDS = 1000  # TF Serving's limit
# The model's own requests: the server's --max_batch_size is for clients (TF Serving's warmup
# runs in the session, below its request limits).
_NO_BATCH_LIMIT = 1 << 30


class WarmupError(Exception):
    """A warmup file that cannot be read or a request in it that fails: the load fails."""


def _records(path: str):
    # No tf.data autotuning: an autotuned iterator's end waits for the tuner's next wake-up
    # (electra_tf.data.pipeline.untuned), and a load waits for this one.
    options = tf.data.Options()
    options.autotune.enabled = False
    try:
        for i, record in enumerate(tf.data.TFRecordDataset(path).with_options(options).as_numpy_iterator()):
            if i >= MAX_RECORDS:
                raise WarmupError(f"{WARMUP_FILE} has more than {MAX_RECORDS} records (TF Serving's limit)")
            yield i, record
    except tf.errors.OpError as e:
        raise WarmupError(f"{WARMUP_FILE} is not a readable TFRecord file: {e.message.splitlines()[0]}") from None


def _calls(record: prediction_log_pb2.PredictionLog):
    """(signature name, inputs) of each signature call a warmup record makes."""
    which = record.WhichOneof("log_type")
    if which == "predict_log":
        request = record.predict_log.request
        yield request.model_spec.signature_name, {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
    elif which in ("classify_log", "regress_log"):
        request = getattr(record, which).request
        yield request.model_spec.signature_name, {"inputs": proto_examples(request.input, _NO_BATCH_LIMIT)}
    elif which == "multi_inference_log":
        request = record.multi_inference_log.request
        examples = proto_examples(request.input, _NO_BATCH_LIMIT)
        for task in request.tasks:
            yield task.model_spec.signature_name, {"inputs": examples}
    else:
        raise WarmupError(f"log type {which!r} is not a warmup request TF Serving replays")


def replay(servable, iterations: int = 1) -> tuple[int, float] | None:
    """Runs every request of `servable.path`'s warmup file `iterations` times in a row (TF
    Serving's --num_request_iterations_for_warmup; < 1 is 1, as there); returns (records x
    iterations, seconds), or None when the version has no warmup file. Raises `WarmupError` naming the
    record."""
    iterations = max(int(iterations), 1)
    path = os.path.join(servable.path, WARMUP_FILE)
    if not os.path.isfile(path):
        return None
    start, count = time.monotonic(), 0
    for i, data in _records(path):
        record = prediction_log_pb2.PredictionLog()
        try:
            record.ParseFromString(data)
        except Exception:  # noqa: BLE001  (protobuf's DecodeError and friends)
            raise WarmupError(f"{WARMUP_FILE} record {i} is not a PredictionLog") from None
        try:
            calls = list(_calls(record))
            for _ in range(iterations):
                for name, inputs in calls:
                    servable.signature(name).run(inputs, _NO_BATCH_LIMIT)
        except WarmupError as e:
            raise WarmupError(f"{WARMUP_FILE} record {i}: {e}") from None
        except Exception as e:  # noqa: BLE001  (ServingError, OpError: the load fails with it)
            raise WarmupError(f"{WARMUP_FILE} record {i} failed: {' '.join(str(e).split())}") from None
        count += iterations
    return count, time.monotonic() - start
