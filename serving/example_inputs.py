"""A Classify / Regress / MultiInference request's `Input` as serialized tf.Examples: what the
Classify and Regress APIs (`inference_api.py`) and the warmup replay (`warmup.py`) both read.

Context features go into every example and an example's own features win: the context's
serialized bytes come first, then the example's, and a protobuf parser keeps the last value of
a map key."""

from __future__ import annotations

import numpy as np
from tensorflow_serving.apis import input_pb2

from electra_tf.serving.errors import invalid


def proto_examples(model_input: input_pb2.Input, max_batch_size: int) -> np.ndarray:
    """The serialized tf.Examples [B] of a gRPC request's `input` (with its context, if any)."""
    kind = model_input.WhichOneof("kind")
    if kind == "example_list":
        examples, context = model_input.example_list.examples, b""
    elif kind == "example_list_with_context":
        examples = model_input.example_list_with_context.examples
        context = model_input.example_list_with_context.context.SerializeToString()
    else:
        raise invalid("Input is empty: set input.example_list or input.example_list_with_context")
    check_count(len(examples), f"input.{kind}.examples", max_batch_size)
    return np.array([context + e.SerializeToString() for e in examples], dtype=object)


def check_count(count: int, where: str, max_batch_size: int) -> None:
    if not count:
        raise invalid(f"{where} is empty: a request needs at least one example")
    if count > max_batch_size:
        raise invalid(f"{where} holds {count} examples, more than the server's max_batch_size {max_batch_size}")
