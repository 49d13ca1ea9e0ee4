"""benchmarks/benchmark_serving.py end to end on a tiny model, beside its PyTorch and ONNX Runtime
rows (benchmarks/torch_serving.py); the summary of rounds and the reference rows' guards alone.

The end-to-end tests need torch, transformers, onnx and onnxruntime (`pip install -e '.[anchors]'`)
and skip without them.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import torch_serving
from benchmarks.serving_bench_model import summarize
from electra_tf import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tiny: the tiny model exported at 32 tokens, 2 requests per row and batch size (no time budget:
# the claims are about the rows and the report, not their speed).
SMALL_RUN = ["--config=electra_tiny", "--max_seq_length=32", "--batch_sizes=1,2", "--seconds=0",
             "--min_requests=2", "--rounds=1"]


def run_benchmark(*flags):
    run = subprocess.run([sys.executable, "-m", "benchmarks.benchmark_serving", *SMALL_RUN, *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def references():
    for row in torch_serving.ROWS:
        reason = torch_serving.missing(row)
        if reason:
            pytest.skip(f"row {row}: {reason}")


@pytest.mark.slow
def test_every_row_at_every_batch_size_with_ratios(references, tmp_path):
    out = tmp_path / "serving.json"
    report = run_benchmark(f"--json={out}", f"--work_dir={tmp_path / 'work'}")
    assert report.startswith("CPU: ")
    assert "Versions: tensorflow" in report and "onnxruntime" in report
    assert "agrees with PyTorch within" in report
    assert "p50 at batch 1   saved_model/torch" in report
    # The server rows ran against electra-serve in its own process, as deployed.
    assert re.search(r"The server \(electra-serve --model_threads=1 in a child process\) adds at batch 1, "
                     r"p50 less saved_model's: REST [+-]\d+\.\d ms, gRPC [+-]\d+\.\d ms", report), report

    result = json.loads(out.read_text())
    assert result["server_process"] == "child" and result["server_flags"] == ["--model_threads=1"]
    assert result["cpu"] == cpu.cpu_description()
    assert set(result["versions"]) >= {"tensorflow", "torch", "transformers", "onnxruntime"}
    cells = {(row["row"], row["batch"]): row for row in result["rows"]}
    assert set(cells) == {(row, b) for row in ("torch", "onnxruntime", "saved_model", "saved_model_ids", "REST", "gRPC")
                          for b in (1, 2)}
    for row in cells.values():
        assert row["requests"] >= 2 and len(row["rounds"]) == 1
        assert row["p50_ms"] > 0 and row["p99_ms"] >= row["p50_ms"] and row["examples_per_s"] > 0
    ratios = result["ratios"]
    assert set(ratios["p50_batch1"]) == {"saved_model/torch", "saved_model/onnxruntime"}
    for name in ("saved_model/torch", "saved_model/onnxruntime"):
        assert ratios["p50_batch1"][name] > 0
        assert set(ratios["examples_per_s"][name]) == {"1", "2"}
        assert all(value > 0 for value in ratios["examples_per_s"][name].values())
    assert result["skipped"] == {}


@pytest.mark.slow
def test_reference_rows_in_child_processes(references, tmp_path):
    """Also, on a CPU with AVX-512, as an emulated AVX2-only CPU: the benchmark restarted with
    oneDNN limited to AVX2 (its CPU line reads the restarted process's environment), and its
    torch child running ATen's AVX2 kernels."""
    out = tmp_path / "serving.json"
    emulate = "avx512f" in cpu.cpu_flags()[1]
    report = run_benchmark("--rows=onnxruntime,torch,saved_model,saved_model_variables",
                           "--reference_process=child", f"--json={out}", f"--work_dir={tmp_path / 'work'}",
                           *(["--emulate_avx2"] if emulate else []))
    assert "torch and onnxruntime run in child processes" in report
    result = json.loads(out.read_text())
    assert result["emulated_avx2"] is emulate
    if emulate:
        assert "EMULATED AVX2-only CPU: ONEDNN_MAX_CPU_ISA=AVX2" in report
        assert "its kernels limited to AVX2 by ONEDNN_MAX_CPU_ISA" in report.splitlines()[0]
        assert "ATen kernels AVX2," in report
        assert "onnxruntime: NOT limited to AVX2" in report
    rows = ("onnxruntime", "torch", "saved_model", "saved_model_variables")
    assert [(row["row"], row["batch"]) for row in result["rows"]] == [(row, b) for b in (1, 2) for row in rows]
    # The variables' export (freeze=False) beside the served one, not a version of it.
    work = tmp_path / "work"
    assert [p.name for p in (work / "export" / "electra_tiny").iterdir()] == ["1"]
    assert json.loads(next((work / "export_variables").glob("*/1/assets.extra/electra_export.json"))
                      .read_text())["frozen"] is False
    assert all(row["examples_per_s"] > 0 for row in result["rows"])


def test_unknown_row_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "benchmarks.benchmark_serving", "--rows=saved_model,tensorrt"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--rows: ['tensorrt']" in run.stderr
    assert "Traceback" not in run.stderr


def test_summary_is_the_median_over_rounds_and_ratios_to_saved_model():
    def sample(p50, throughput):
        return {"p50_ms": p50, "p99_ms": 2 * p50, "examples_per_s": throughput, "requests": 3}

    samples = {("torch", 1): [sample(10, 100), sample(30, 50), sample(20, 60)],
               ("saved_model", 1): [sample(5, 200), sample(5, 200), sample(8, 100)],
               ("torch", 8): [sample(40, 200)], ("saved_model", 8): [sample(40, 400)]}
    table, ratios = summarize(samples, [1, 8])
    torch_1 = next(t for t in table if (t["row"], t["batch"]) == ("torch", 1))
    assert (torch_1["p50_ms"], torch_1["p99_ms"], torch_1["examples_per_s"], torch_1["requests"]) == (20, 40, 60, 9)
    assert ratios["p50_batch1"] == {"saved_model/torch": 5 / 20}
    assert ratios["examples_per_s"] == {"saved_model/torch": {"1": 200 / 60, "8": 2.0}}


def test_a_row_without_its_package_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    assert "onnxruntime not installed" in torch_serving.missing("onnxruntime")
    assert "pip install" in torch_serving.missing("onnxruntime")


def test_a_wrong_export_is_not_timed():
    right = lambda texts: np.full([len(texts), 2], 0.5, np.float32)  # noqa: E731
    wrong = lambda texts: right(texts) + [[1e-3, -1e-3]]  # noqa: E731
    assert torch_serving.check_agreement(right, right, ["a", "b"]) == 0
    with pytest.raises(AssertionError, match="largest difference 1.00e-03"):
        torch_serving.check_agreement(right, wrong, ["a", "b"])


def test_the_timed_models_have_biases_and_scales_as_a_fine_tuned_model_has():
    """An initialised model's zero biases and unit scales would be folded out of the export's
    graph (constant weights), flattering the SavedModel rows; `like_trained` moves them, on both
    sides, and leaves every other weight as drawn."""
    from benchmarks.serving_bench_model import TRAINED_SPREAD, like_trained
    from electra_tf.config import ElectraConfig
    from electra_tf.finetune.heads import SentenceClassifier

    head = SentenceClassifier(ElectraConfig.from_json("electra_tiny"), num_labels=2)
    before = {v.path: v.numpy().copy() for v in head.weights}
    assert like_trained(head.weights) == sum(v.path.endswith(("/bias", "/beta", "/gamma")) for v in head.weights) > 0
    for v in head.weights:
        leaf = v.path.rsplit("/", 1)[-1]
        if leaf in ("bias", "beta", "gamma"):
            base = 1.0 if leaf == "gamma" else 0.0
            assert np.array_equal(before[v.path], np.full_like(before[v.path], base)), v.path
            assert np.all(v.numpy() != base) and np.std(v.numpy()) < 3 * TRAINED_SPREAD, v.path
        else:
            assert np.array_equal(v.numpy(), before[v.path]), v.path
    if torch_serving.missing("torch"):
        return
    import torch

    # Named as Hugging Face names ELECTRA's parameters (`...dense.bias`, `...LayerNorm.weight`).
    layer = torch.nn.ModuleDict({"dense": torch.nn.Linear(4, 3), "LayerNorm": torch.nn.LayerNorm(3)})
    named = dict(layer.named_parameters())
    kernel = named["dense.weight"].detach().clone()
    assert like_trained(layer.named_parameters()) == 3
    assert torch.all(named["dense.bias"] != 0) and torch.all(named["LayerNorm.bias"] != 0)
    assert torch.all(named["LayerNorm.weight"] != 1) and torch.equal(named["dense.weight"], kernel)
