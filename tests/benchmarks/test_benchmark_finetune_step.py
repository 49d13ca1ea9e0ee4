"""benchmarks/benchmark_finetune_step.py end to end on a tiny model: our fine-tuning step on the
path electra-finetune chooses, against the Hugging Face PyTorch step, each in its own process."""

import json
import os
import re
import subprocess
import sys

import pytest

from electra_tf import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_our_chosen_step_against_the_pytorch_step(tmp_path):
    out = tmp_path / "result.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.benchmark_finetune_step", "--config=electra_tiny",
         "--rows=binary,torch", "--batch_size=4", "--seq_length=32", "--steps=2", "--rounds=2",
         "--warmup_steps=1", "--distinct_batches=2", f"--json_out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout
    assert "CPU: " in report and " has " in report and "sentence classifier" in report
    # The binary row runs what electra-finetune chooses for a long run: after a probe.
    assert re.search(r"row binary runs the (graph|xla) step \(timed: graph \d+ ms/step, XLA "
                     r"\d+ ms/step", report), report
    result = json.loads(out.read_text())
    assert result["cpu"] == cpu.cpu_description()
    assert result["step_paths"]["binary"] in ("graph", "xla")
    if "torch" in result["skipped"]:  # without the anchors extra: named, not a failure
        assert "not installed" in result["skipped"]["torch"]
        assert set(result["seconds_per_step"]) == {"binary"}
    else:
        assert set(result["seconds_per_step"]) == {"binary", "torch"}
        assert re.search(r"HF PyTorch\s+\d+\.\d+\s+\S+\s+\S+\s+\S+\s+1\.00", report), report
    assert all(s > 0 for s in result["seconds_per_step"].values())
    assert all(m > 100 for m in result["peak_rss_mib"].values())  # each row its own process


def test_unknown_row_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "benchmarks.benchmark_finetune_step",
                          "--rows=warp"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "--rows: unknown row(s) warp" in run.stderr
    assert "Traceback" not in run.stderr
