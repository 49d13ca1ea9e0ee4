"""benchmarks/benchmark_pretrain.py end to end on a tiny model: rows in their own processes, the bound."""

import json
import os
import re
import subprocess
import sys

import pytest

from electra_tf import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_rows_bound_and_report(tmp_path):
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_pretrain", "--config=electra_tiny",
         "--rows=function,binary,model_garden", "--batch_size=2", "--seq_length=32", "--steps=2",
         "--rounds=2", "--warmup_steps=1", "--corpus_docs=40", f"--json_out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout
    assert "bare step, tf.function" in report and "binary" in report
    assert "row model_garden skipped: needs --model_garden_python" in report
    assert "Matmul bound" in report and "in the traced step's matmuls" in report
    # The binary row runs what electra-pretrain chooses by default: for its 1M steps, a probe.
    assert re.search(r"row binary runs the (graph|xla) step \(timed: graph \d+ ms/step, XLA "
                     r"\d+ ms/step, XLA \d\.\d\dx", report), report
    assert "CPU: " in report and " has " in report

    result = json.loads(out.read_text())
    assert set(result["seconds_per_step"]) == {"function", "binary"}
    assert all(s > 0 for s in result["seconds_per_step"].values())
    assert all(m > 100 for m in result["peak_rss_mib"].values())  # each row its own process
    assert result["matmul_bound_seconds"]["tf_bound"] > 0
    assert result["step_paths"]["binary"] in ("graph", "xla")
    assert result["cpu"] == cpu.cpu_description()


def test_unknown_row_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "benchmarks.benchmark_pretrain", "--rows=warp"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--rows: unknown row(s) warp" in run.stderr
    assert "Traceback" not in run.stderr


def test_row_environments_set_onednn_as_each_framework_would(monkeypatch):
    """Emulating an AVX2-only CPU: every row limited to AVX2 code; our rows with oneDNN on (what
    `electra_tf.cpu` sets there), Model Garden with TensorFlow's default there (off), PyTorch
    untouched. A TF_ENABLE_ONEDNN_OPTS the user set is left to every row."""
    from benchmarks import emulation as bench

    monkeypatch.delenv(cpu.ONEDNN_VARIABLE, raising=False)
    for row in ("binary", "binary_xla", "function"):
        env = bench.row_environment(row, emulate_avx2=True)
        assert env[cpu.ONEDNN_VARIABLE] == "1" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
        assert env["XLA_FLAGS"] == "--xla_cpu_max_isa=AVX2"
    assert bench.row_environment("model_garden", emulate_avx2=True)[cpu.ONEDNN_VARIABLE] == "0"
    torch_env = bench.row_environment("torch", emulate_avx2=True)
    assert cpu.ONEDNN_VARIABLE not in torch_env and torch_env["ATEN_CPU_CAPABILITY"] == "avx2"
    native = bench.row_environment("model_garden", emulate_avx2=False)
    _, flags = cpu.cpu_flags()
    default_on = any(name in flags for name in cpu.TF_ONEDNN_DEFAULT_ON)
    assert native[cpu.ONEDNN_VARIABLE] == ("1" if default_on else "0")
    assert "ONEDNN_MAX_CPU_ISA" not in native or native["ONEDNN_MAX_CPU_ISA"] == os.environ.get(
        "ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv(cpu.ONEDNN_VARIABLE, "0")
    assert bench.row_environment("binary", emulate_avx2=True)[cpu.ONEDNN_VARIABLE] == "0"
