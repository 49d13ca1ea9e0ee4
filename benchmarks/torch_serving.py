"""Hugging Face PyTorch and ONNX Runtime text classifiers: the reference rows of
`benchmarks/benchmark_serving.py`.

Each row is a callable taking a list of raw texts and returning the class probabilities (numpy
float32 [batch, num_labels]); everything a server would do per request happens inside the call:

  torch        `transformers.BertTokenizerFast` on the benchmark's vocabulary (lower-case, as our
               export), padding to the batch's longest row, cut to max_seq_length -> int64
               tensors -> `ElectraForSequenceClassification` under `torch.inference_mode()` ->
               softmax.
  onnxruntime  the same tokenizer with numpy outputs -> the same PyTorch model exported once
               with `torch.onnx.export` (batch and sequence axes dynamic) and run by an
               `onnxruntime.InferenceSession` (ORT_ENABLE_ALL, CPU provider) -> softmax in numpy.

The model is built from OUR `ElectraConfig` (`torch_reference.hf_config`: vocab size, E, H,
layers, heads, FFN width, exact GELU, LayerNorm epsilon), random weights, eval mode. Its
classification head (`ElectraClassificationHead`) is dense(H, GELU) -> dense(num_labels) on the
[CLS] state, one H x H product per example more than our `SentenceClassifier`'s single dense:
next to twelve encoder layers, work that does not show in the timings.

Attention is transformers' default implementation ("sdpa", in transformers 5). Both rows run
on `threads` intra-op threads (2 by default: the benchmark machine's cores); ONNX Runtime's
inter-op pool is 1 thread, as torch runs one graph node at a time.

`check_agreement` asserts at setup that the ONNX session answers what the PyTorch model answers
(probabilities within 1e-4): a wrong export must not be timed.

Run as `python -m benchmarks.torch_serving SETUP.json ROW`, the module is one row's child process
(`RowProcess` is the parent's end, `benchmarks/row_worker.Worker`'s pipe with one more command): it
builds the row (and checks the ONNX export), then times requests on the setup's texts when asked,
so the latencies carry no pipe overhead. The module imports without torch; `missing(row)` says
why a row cannot run.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

import numpy as np

INSTALL_HINT = "pip install -e '.[anchors]'"
ROWS = ("torch", "onnxruntime")
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
AGREEMENT_ATOL = 1e-4


def torch_missing() -> str | None:
    """None when torch and transformers' PyTorch ELECTRA classifier import, else why not."""
    try:
        import torch  # noqa: F401
        from transformers import BertTokenizerFast, ElectraForSequenceClassification  # noqa: F401
    except ImportError as e:
        return f"{e.name or e} not installed ({INSTALL_HINT})"
    return None


def onnxruntime_missing() -> str | None:
    """None when the ONNX row can run (it exports the PyTorch model), else why not."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes through it)
        import onnxruntime  # noqa: F401
    except ImportError as e:
        return f"{e.name or e} not installed ({INSTALL_HINT})"
    return torch_missing()


def missing(row: str) -> str | None:
    return {"torch": torch_missing, "onnxruntime": onnxruntime_missing}[row]()


def versions() -> dict:
    """{package: version} of the reference rows' packages that import."""
    found = {}
    for name in ("torch", "transformers", "onnxruntime", "onnx"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            pass
    return found


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class TorchClassifier:
    """`ElectraForSequenceClassification` (random weights, eval mode) and its fast tokenizer.

    Args:
      model_config: our `ElectraConfig` (its vocab_size that of `vocab_file`).
      vocab_file: the WordPiece vocabulary (lower-cased, as our export's).
      max_seq_length: rows are cut to this many tokens, [CLS] and [SEP] included.
      num_labels: classes of the head.
      threads: `torch.set_num_threads`.

    Example:
      classify = TorchClassifier(ElectraConfig.from_json("electra_tiny").with_vocab("vocab.txt"),
                                 "vocab.txt", 128)
      classify(["a gripping film", "dull"])  # float32 [2, 2]
    """

    def __init__(self, model_config, vocab_file: str, max_seq_length: int, num_labels: int = 2,
                 threads: int = 2, seed: int = 0):
        import torch
        from transformers import BertTokenizerFast, ElectraForSequenceClassification

        from benchmarks.serving_bench_model import like_trained
        from benchmarks.torch_reference import hf_config

        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.max_seq_length = int(max_seq_length)
        self.tokenizer = BertTokenizerFast(vocab_file, do_lower_case=True)
        self.model = ElectraForSequenceClassification._from_config(
            hf_config(model_config, num_labels=num_labels)).eval()
        like_trained(self.model.named_parameters(), seed)  # as the SavedModel row's head
        self.attention = self.model.config._attn_implementation

    def encode(self, texts, return_tensors: str) -> dict:
        """The tokenizer's `INPUT_NAMES` arrays, [batch, longest row <= max_seq_length]."""
        encoded = self.tokenizer(list(texts), padding="longest", truncation=True,
                                 max_length=self.max_seq_length, return_tensors=return_tensors)
        return {name: encoded[name] for name in INPUT_NAMES}

    def __call__(self, texts) -> np.ndarray:
        import torch

        with torch.inference_mode():
            logits = self.model(**self.encode(texts, "pt")).logits
            return torch.softmax(logits, dim=-1).numpy()


def export_onnx(classifier: TorchClassifier, path: str, sample_texts) -> str:
    """Writes `classifier.model` to `path` as ONNX with dynamic batch and sequence axes; returns
    which exporter did it. torch >= 2.9 defaults to the torch.export-based exporter, which needs
    `onnxscript`; without it (or if it fails) the TorchScript exporter (dynamo=False) is used."""
    import torch

    inputs = classifier.encode(sample_texts, "pt")
    args = tuple(inputs[name] for name in INPUT_NAMES)
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    common = dict(input_names=list(INPUT_NAMES), output_names=["logits"], dynamic_axes={**axes, "logits": {0: "batch"}})
    try:
        import onnxscript  # noqa: F401

        torch.onnx.export(classifier.model, args, path, external_data=False, **common)
        return f"torch.onnx.export (torch.export-based, opset {_opset(path)})"
    except Exception as e:  # noqa: BLE001  a failed new exporter falls back, and says why
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(classifier.model, args, path, dynamo=False, opset_version=17, **common)
    return f"torch.onnx.export(dynamo=False), opset {_opset(path)} (the torch.export-based exporter: {why})"


def _opset(path: str) -> int:
    import onnx

    return next(o.version for o in onnx.load(path, load_external_data=False).opset_import if o.domain in ("", "ai.onnx"))


class OnnxClassifier:
    """An `onnxruntime.InferenceSession` on `export_onnx`'s file, with the PyTorch row's tokenizer."""

    def __init__(self, path: str, classifier: TorchClassifier, threads: int = 2):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.encode = classifier.encode

    def __call__(self, texts) -> np.ndarray:
        feeds = {name: value.astype(np.int64, copy=False) for name, value in self.encode(texts, "np").items()}
        (logits,) = self.session.run(["logits"], feeds)
        return softmax(logits)


def check_agreement(torch_row: Callable, onnx_row: Callable, texts, atol: float = AGREEMENT_ATOL) -> float:
    """Asserts the two rows give the same probabilities on `texts` (one batch, padded to its
    longest, and each text alone); returns the largest difference."""
    worst = 0.0
    for batch in [list(texts)] + [[t] for t in texts]:
        expected, got = torch_row(batch), onnx_row(batch)
        worst = max(worst, float(np.abs(expected - got).max()))
    if not worst <= atol:
        raise AssertionError(f"the ONNX export answers other probabilities than the PyTorch model: "
                             f"largest difference {worst:.2e} > {atol:g}; it is not timed")
    return worst


def _cpu_capability() -> str:
    """The vector extension ATen's kernels use here ("AVX512", "AVX2", ...; ATEN_CPU_CAPABILITY
    caps it)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def build_rows(names, model_config, vocab_file: str, max_seq_length: int, work: str, check_texts,
               threads: int = 2) -> tuple[dict, dict]:
    """({row: callable}, {row: one-line description}) for `names` (rows whose packages import:
    see `missing`). The ONNX row is checked against the PyTorch model before it is returned."""
    rows, info = {}, {}
    if not names:
        return rows, info
    classifier = TorchClassifier(model_config, vocab_file, max_seq_length, threads=threads)
    if "torch" in names:
        rows["torch"] = classifier
        info["torch"] = (f"transformers ElectraForSequenceClassification, attention {classifier.attention!r}, "
                         f"{sum(p.numel() for p in classifier.model.parameters()) / 1e6:.1f}M weights, "
                         f"{threads} torch threads, ATen kernels {_cpu_capability()}, BertTokenizerFast")
    if "onnxruntime" in names:
        path = os.path.join(work, "electra_classifier.onnx")
        exporter = export_onnx(classifier, path, check_texts[:2])
        session = OnnxClassifier(path, classifier, threads)
        worst = check_agreement(classifier, session, check_texts)
        rows["onnxruntime"] = session
        info["onnxruntime"] = (f"{exporter}; ORT_ENABLE_ALL, {threads} intra-op / 1 inter-op threads, "
                               f"CPUExecutionProvider; agrees with PyTorch within {worst:.1e}")
    return rows, info


# --- a row in a child process ---------------------------------------------------------------
class RowProcess:
    """A reference row served by a child process (`python -m benchmarks.torch_serving SETUP`):
    `time(batch, seconds, min_requests)` runs `serving_bench_model.time_requests` there on the
    texts of that batch size and returns (latencies in s, wall s)."""

    def __init__(self, row: str, setup_file: str):
        from benchmarks.row_worker import Worker

        class _Worker(Worker):  # the pretraining rows' process and pipe; "time" is this row's command
            def time(self, command: str):
                return self._ask(command)

        self.name = row
        self._worker = _Worker([sys.executable, "-m", "benchmarks.torch_serving", setup_file, row], row)
        self.info = self._worker.info

    def time(self, batch: int, seconds: float, min_requests: int):
        answer = self._worker.time(f"time {batch} {seconds} {min_requests}")
        return np.array(answer["latencies"]), answer["wall"]

    def close(self):
        return self._worker.close()


def write_setup(path: str, *, config: str, vocab_file: str, max_seq_length: int, work: str,
                batches: dict, check_texts, threads: int = 2) -> None:
    """The settings a `RowProcess` child reads."""
    with open(path, "w") as f:
        json.dump({"config": config, "vocab_file": vocab_file, "max_seq_length": max_seq_length,
                   "work": work, "batches": {str(b): texts for b, texts in batches.items()},
                   "check_texts": list(check_texts), "threads": threads}, f)


def _serve_child(setup_file: str, row: str) -> None:
    """The child's loop: builds `row`, then answers "info" and "time BATCH SECONDS MIN" lines."""
    from electra_tf.config import ElectraConfig

    from benchmarks.serving_bench_model import time_requests

    with open(setup_file) as f:
        setup = json.load(f)
    model_config = ElectraConfig.from_json(setup["config"]).with_vocab(setup["vocab_file"])
    rows, info = build_rows([row], model_config, setup["vocab_file"], setup["max_seq_length"],
                            setup["work"], setup["check_texts"], setup["threads"])
    batches = {int(b): texts for b, texts in setup["batches"].items()}
    for line in sys.stdin:
        command, *arguments = line.split()
        try:
            if command == "info":
                answer = {**info, "pid": os.getpid()}
            elif command == "time":
                call, texts = rows[row], batches[int(arguments[0])]
                latencies, wall = time_requests(lambda: call(texts), float(arguments[1]), int(arguments[2]))
                answer = {"latencies": latencies.tolist(), "wall": wall}
            else:
                answer = {"error": f"unknown command {command!r}"}
        except Exception as e:  # reported to the parent, which names the row
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    _serve_child(*sys.argv[1:3])
