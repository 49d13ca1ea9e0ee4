"""The warmup requests an export ships: `VERSION/assets.extra/tf_serving_warmup_requests`.

TensorFlow Serving replays this file when it loads a version, before the version is AVAILABLE
(TF Serving's "SavedModel Warmup" guide): a TFRecord file, each record a serialized
`tensorflow.serving.PredictionLog`, at most 1,000 of them. Without it the first requests after
a load pay TensorFlow's lazy work: the signature function's graph is optimised on its first call
(~0.7 s for the ELECTRA-Small classifier, against ~15 ms a request after), and every new input
shape builds its kernels (oneDNN primitives) once. The local server (`serving/warmup.py`)
replays the same file the same way.

The requests are made from the SavedModel's own SignatureDefs, so every signature an export
has is warmed, whatever its task family:

- string inputs (`text`, `text_pair`, `question`, ...) get sentences of words of the export's
  own vocabulary that are one piece each (`vocabulary_words`), at three lengths: a few words,
  about a Rotten Tomatoes sentence (~20 pieces), and longer than max_seq_length (packed at the
  full length); an input of rank 2 ([B, num_choices]) gets a sentence per cell;
- int32 token-id inputs (`serve_ids`) get ids 1..n (cycling below the export's vocabulary size,
  [PAD] = 0 on the masked tail), a mask of ones on the first n positions, segment 0, at the same
  lengths;
- classify / regress signatures (`tensorflow/serving/classify`, `.../regress`) get serialized
  `tf.Example`s with the text signature's string features.

Each at batch sizes 1 and 8: what an online service sends most, and a merged batch; and
`serving_default` at batch 1 at every length it pads to (`sweep`). The requests name the model and
signature as a client would (no version: TF Serving ignores it).

Order matters: each signature's FIRST request is one typical sentence (`TYPICAL_WORDS`, batch 1).
TensorFlow's oneDNN matmuls with constant weights (a frozen export's fused projections) keep the
weight in the blocked layout that the kernel's first call picks, and oneDNN picks it by the call's
row count (TF 2.21, AVX-512 and AVX2 alike: one layout for ~8-80 rows, another below and above).
A later call whose rows pick the other layout lays the whole weight out again, on every call:
with a 4-word request first, every one-sentence request after the warmup paid ~3 ms of
re-layouts on ELECTRA-Small (~20% of it; measured in docs/benchmarks.md), while a merged batch
pays the same ~3 ms on a call ten times longer.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np
import tensorflow as tf

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_RECORDS = 1000  # TF Serving refuses a file with more
BATCH_SIZES = (1, 8)
TYPICAL_WORDS = 20  # about a Rotten Tomatoes sentence: each signature's first request, at batch 1
PREDICT, CLASSIFY, REGRESS = ("tensorflow/serving/predict", "tensorflow/serving/classify",
                              "tensorflow/serving/regress")
# Plain review words: with any English WordPiece vocabulary they make real pieces, not [UNK]s.
_WORDS = ("the film is a moving and often funny story about people who find out what they "
          "want from life , and the actors make every scene feel honest .").split()


def vocabulary_words(export_path: str, limit: int = 40) -> tuple[str, ...]:
    """Up to `limit` words of the export's `assets/vocab.txt` that are one word piece each
    whatever the casing (lower-case ASCII letters: normalisation leaves them as they are and
    WordPiece matches them whole), so a sentence of n of them packs to exactly n + 2 positions.
    The plain English words when the export has no vocabulary or too few such words."""
    path = os.path.join(export_path, "assets", "vocab.txt")
    words = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                token = line.strip()
                if len(token) >= 2 and token.isascii() and token.isalpha() and token.islower():
                    words.append(token)
                    if len(words) == limit:
                        break
    return tuple(words) if len(words) >= 8 else tuple(_WORDS)


def sentence(num_words: int, offset: int = 0, words=_WORDS) -> str:
    """`num_words` of `words`, starting `offset` words into their cycle."""
    return " ".join(words[(offset + i) % len(words)] for i in range(num_words))


def typical(max_seq_length: int) -> int:
    """Word count of the typical warmup sentence."""
    return min(TYPICAL_WORDS, max_seq_length)


def lengths(max_seq_length: int) -> tuple[int, ...]:
    """Word counts of the warmup sentences: short, typical, past max_seq_length."""
    return tuple(sorted({4, typical(max_seq_length), max_seq_length + 8}))


def sweep(max_seq_length: int) -> tuple[int, ...]:
    """Word counts of the batch-1 sweep of `serving_default`: every packed length from 3 to
    max_seq_length (every k-th past 128 positions, so at most ~130 requests). The kernels are
    built per input shape (oneDNN's primitives are), and a text signature pads a batch only to
    its longest row: each new length costs its first request a few milliseconds more."""
    step = -(-max_seq_length // 128)
    return tuple(range(1, max_seq_length - 1, step))


def _text_value(shape: list, batch: int, words: int, vocabulary) -> np.ndarray:
    """Strings for an input of SignatureDef shape `shape` ([B] or [B, N])."""
    cells = [batch] + [d if d and d > 0 else 2 for d in shape[1:]]
    texts = [sentence(words, i, vocabulary).encode() for i in range(int(np.prod(cells)))]
    return np.array(texts, dtype=object).reshape(cells)


def vocabulary_size(export_path: str) -> int | None:
    """Lines of the export's `assets/vocab.txt` (None without one)."""
    path = os.path.join(export_path, "assets", "vocab.txt")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def _ids_value(key: str, shape: list, batch: int, words: int, max_seq_length: int,
               vocab_size: int | None = None) -> np.ndarray:
    """token ids / mask / segments of `words` positions padded to the signature's length; ids
    1, 2, ... cycling below `vocab_size` (a signature checks its ids' range)."""
    length = shape[-1] if shape[-1] and shape[-1] > 0 else min(words + 2, max_seq_length)
    real = min(words + 2, length)
    cells = [batch] + [d if d and d > 0 else 2 for d in shape[1:-1]] + [length]
    row = np.zeros(length, np.int32)
    if key == "input_ids":
        ids = np.arange(real)
        # (one id of margin: a last line without a token would not count)
        row[:real] = 1 + (ids % (vocab_size - 2) if vocab_size and vocab_size > 2 else ids)
    elif key == "input_mask":
        row[:real] = 1
    return np.broadcast_to(row, cells).copy()


def _tensor_info_shape(info) -> list:
    return [d.size for d in info.tensor_shape.dim]


def _example(features: Mapping[str, bytes]) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[v])) for k, v in features.items()
    })).SerializeToString()


def requests(signature_defs: Mapping, model_name: str, max_seq_length: int,
             vocabulary=_WORDS, vocab_size: int | None = None) -> list:
    """PredictionLogs warming every signature in `signature_defs` ({name: SignatureDef}), with
    sentences of `vocabulary`'s words and token ids below `vocab_size`."""
    from tensorflow_serving.apis import (classification_pb2, predict_pb2, prediction_log_pb2,
                                         regression_pb2)

    text_features = [k for k, v in signature_defs["serving_default"].inputs.items()
                     if v.dtype == tf.string.as_datatype_enum] if "serving_default" in signature_defs else []
    logs = []
    for name, sig in sorted(signature_defs.items()):
        if name.startswith("__"):
            continue
        # The first request fixes the kernels' weight layouts (module doc): what clients send
        # most, one sentence (`serve_ids` runs the rows' real length too, whatever the padding).
        first = (typical(max_seq_length), 1)
        cells = [first] + [(words, batch) for words in lengths(max_seq_length) for batch in BATCH_SIZES
                           if (words, batch) != first]
        if name == "serving_default":
            cells += [(words, 1) for words in sweep(max_seq_length)]
        for words, batch in cells:
            log = prediction_log_pb2.PredictionLog()
            if sig.method_name in (CLASSIFY, REGRESS):
                request = (classification_pb2.ClassificationRequest() if sig.method_name == CLASSIFY
                           else regression_pb2.RegressionRequest())
                request.model_spec.name, request.model_spec.signature_name = model_name, name
                for i in range(batch):
                    example = request.input.example_list.examples.add()
                    example.ParseFromString(_example(
                        {k: sentence(words, i + j, vocabulary).encode() for j, k in enumerate(text_features)}))
                target = log.classify_log if sig.method_name == CLASSIFY else log.regress_log
                target.request.CopyFrom(request)
            else:
                request = predict_pb2.PredictRequest()
                request.model_spec.name, request.model_spec.signature_name = model_name, name
                for key, info in sig.inputs.items():
                    shape = _tensor_info_shape(info)
                    if info.dtype == tf.string.as_datatype_enum:
                        value = _text_value(shape, batch, words, vocabulary)
                    else:
                        value = _ids_value(key, shape, batch, words, max_seq_length, vocab_size).astype(
                            tf.as_dtype(info.dtype).as_numpy_dtype)
                    request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
                log.predict_log.request.CopyFrom(request)
            logs.append(log)
    if len(logs) > MAX_RECORDS:
        raise ValueError(f"{len(logs)} warmup requests, more than TF Serving's {MAX_RECORDS}")
    return logs


def write(export_path: str, signature_defs: Mapping, model_name: str, max_seq_length: int) -> int:
    """Writes `export_path/assets.extra/tf_serving_warmup_requests`; returns the record count."""
    logs = requests(signature_defs, model_name, max_seq_length, vocabulary_words(export_path),
                    vocabulary_size(export_path))
    path = os.path.join(export_path, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return len(logs)


def read(path: str) -> list:
    """The PredictionLogs of a warmup file (for tests and the export report)."""
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        logs.append(log)
    return logs
