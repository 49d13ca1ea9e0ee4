"""The model the serving benchmarks time (an ELECTRA classifier exported with random weights), the
request timer they share and `benchmarks/benchmark_serving.py`'s summary of its rounds.

Used by `benchmarks/benchmark_serving.py`, its reference rows' child processes
(`benchmarks/torch_serving.py`) and `benchmarks/load_test_serving.py` (a module without flags, so
all of them can import it). Serving speed does not depend on the weights' values, with one
exception that `like_trained` removes: an initialised model's biases and normalisation offsets are
0 and its normalisation scales 1, and TensorFlow's graph optimiser folds an add of zeros and a
product with ones out of a graph whose weights are constants (an export's), which no fine-tuned
model would let it do. Tokenization does real WordPiece work on a vocabulary made from the Rotten
Tomatoes sentences unless one is given.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np


class ClassifierExport(NamedTuple):
    path: str  # the version folder, BASE/MODEL_NAME/1
    head: Any  # the SentenceClassifier
    tokenizer: Any  # its WordpieceTokenizer
    sentences: list  # the Rotten Tomatoes sentences
    seconds: float  # the export's wall time
    model_config: Any = None  # the head's ElectraConfig (vocab_size that of vocab_file)
    vocab_file: str = ""  # the vocabulary exported with the model
    model_name: str = "electra_small"  # the served name: the config's file name without .json
    description: Any = None  # what export_head was told besides the head (task, labels, length)


def config_name(config: str) -> str:
    """"electra_small" for "electra_small" or "path/to/electra_small.json"."""
    return Path(config).stem


# How far `like_trained` moves biases and offsets from 0 and scales from 1 (a standard deviation).
TRAINED_SPREAD = 0.02


def like_trained(weights, seed: int = 0) -> int:
    """Moves every bias and normalisation offset (Keras `bias`, `beta`; PyTorch `bias`) off 0 and
    every normalisation scale (Keras `gamma`; PyTorch `LayerNorm.weight`) off 1 by a seeded normal
    draw of `TRAINED_SPREAD`, as fine-tuning would. `weights`: Keras variables (`.path`) or
    PyTorch `(name, parameter)` pairs. Returns how many were moved."""
    rng = np.random.default_rng(seed)
    moved = 0
    for weight in weights:
        if isinstance(weight, tuple):  # PyTorch
            import torch

            name, parameter = weight
            base = (1.0 if "LayerNorm" in name and name.endswith(".weight")
                    else 0.0 if name.endswith(".bias") else None)
            if base is not None:
                with torch.no_grad():
                    parameter.copy_(torch.from_numpy(
                        rng.normal(base, TRAINED_SPREAD, tuple(parameter.shape)).astype(np.float32)))
        else:
            base = {"bias": 0.0, "beta": 0.0, "gamma": 1.0}.get(weight.path.rsplit("/", 1)[-1])
            if base is not None:
                weight.assign(rng.normal(base, TRAINED_SPREAD, tuple(weight.shape)).astype(np.float32))
        moved += base is not None
    return moved


def export_classifier(work: str, vocab_file: str | None, max_seq_length: int,
                      config: str = "electra_small") -> ClassifierExport:
    """The classifier on `config` (a name in configs/ or a JSON path; random weights with biases
    and normalisation parameters `like_trained`, 2 labels) exported to `work/export/NAME/1`, NAME
    the config's name."""
    from electra_tf.config import ElectraConfig
    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import WordpieceTokenizer, frequency_vocab, write_vocab
    from electra_tf.finetune.heads import SentenceClassifier
    from electra_tf.export import export_head

    os.makedirs(work, exist_ok=True)
    sentences = [text for text, _ in corpus.rotten_tomatoes()]
    if vocab_file is None:
        vocab_file = os.path.join(work, "vocab.txt")
        write_vocab(frequency_vocab(sentences), vocab_file)
    model_config = ElectraConfig.from_json(config).with_vocab(vocab_file)
    head = SentenceClassifier(model_config, num_labels=2)
    like_trained(head.weights)
    info = {"task": "rotten_tomatoes", "label_names": ["negative", "positive"],
            "max_seq_length": max_seq_length, "lower_case": True}
    name = config_name(config)
    start = time.perf_counter()
    path = export_head(head, info, vocab_file, os.path.join(work, "export"), name, verbose=False)
    return ClassifierExport(path, head, WordpieceTokenizer(vocab_file), sentences, time.perf_counter() - start,
                            model_config, vocab_file, name, info)


def export_small_classifier(work: str, vocab_file: str | None, max_seq_length: int) -> ClassifierExport:
    """The ELECTRA-Small classifier (random weights) exported to `work/export/electra_small/1`."""
    return export_classifier(work, vocab_file, max_seq_length, "electra_small")


def time_requests(call: Callable[[], Any], seconds: float, min_requests: int) -> tuple[np.ndarray, float]:
    """Latencies (s) of sequential calls after 2 warm-ups, and the wall time they took: at least
    `min_requests` calls, and more until `seconds` have passed."""
    for _ in range(2):
        call()
    latencies, start = [], time.perf_counter()
    while len(latencies) < min_requests or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t)
    return np.array(latencies), time.perf_counter() - start


def summarize(samples: dict, batch_sizes: list[int], references=("torch", "onnxruntime")) -> tuple[list[dict], dict]:
    """Per-round samples {(row, batch): [{"p50_ms", "p99_ms", "examples_per_s", "requests"}]} ->
    (table rows with the medians over rounds, ratios of saved_model to the reference rows)."""
    table = []
    for (row, batch), rounds in samples.items():
        table.append({"row": row, "batch": batch, "requests": sum(r["requests"] for r in rounds),
                      **{key: statistics.median(r[key] for r in rounds)
                         for key in ("p50_ms", "p99_ms", "examples_per_s")},
                      "rounds": rounds})
    cell = {(t["row"], t["batch"]): t for t in table}
    ratios = {"p50_batch1": {}, "examples_per_s": {}}
    for reference in references:
        ours, theirs = cell.get(("saved_model", 1)), cell.get((reference, 1))
        if ours and theirs:
            ratios["p50_batch1"][f"saved_model/{reference}"] = ours["p50_ms"] / theirs["p50_ms"]
        per_batch = {str(b): cell[("saved_model", b)]["examples_per_s"] / cell[(reference, b)]["examples_per_s"]
                     for b in batch_sizes if ("saved_model", b) in cell and (reference, b) in cell}
        if per_batch:
            ratios["examples_per_s"][f"saved_model/{reference}"] = per_batch
    return table, ratios
