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
