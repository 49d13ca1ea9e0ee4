"""The main job (`make demo`) at its smallest scale, end to end, as a real subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_demo_runs_end_to_end_and_served_answers_match(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "tools.demo", f"--workdir={workdir}", "--scale=0.01"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["served"]["all_match"], summary["served"]
    assert len(summary["served"]["answers"]) == 4
    assert all(a["label"] in ("negative", "positive") for a in summary["served"]["answers"])
    export = Path(summary["export"])
    assert (export / "saved_model.pb").exists() and export.parent.name == "electra_rt"
    assert 0 <= summary["rotten_tomatoes_dev_accuracy"]["pretrained"] <= 100
    assert summary["pretraining"]["steps"] >= 20
    for stage in ("=== 1/6", "=== 3/6", "=== 6/6", "=== summary ==="):
        assert stage in proc.stdout
    # A rerun reuses every finished stage.
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reusing") >= 5
