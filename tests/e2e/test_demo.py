"""The main job (`make demo`) at its smallest scale, end to end, as a real subprocess."""

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_demo_runs_end_to_end_and_served_answers_match(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "electra_tf.tools.demo", f"--workdir={workdir}", "--scale=0.01"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["served"]["all_match"], summary["served"]
    assert len(summary["served"]["answers"]) == 4
    assert all(a["label"] in ("negative", "positive") for a in summary["served"]["answers"])
    export = Path(summary["export"])
    assert (export / "saved_model.pb").exists() and export.parent.name == "electra_rt"
    assert summary["pretraining"]["steps"] >= 20
    # 60 steps teach the generator more than a uniform guess over the 8,000-token vocabulary.
    assert summary["pretraining"]["final_metrics"]["mlm_loss"] < math.log(8000) - 0.5
    # The demo's recipe: a same-size generator with every weight tied (paper, Section 3.2).
    record = json.loads((Path(summary["pretraining"]["model_dir"]) / "pretraining_config.json")
                        .read_text())
    assert (record["model_config"]["generator_hidden_size"],
            record["model_config"]["embedding_sharing"]) == (1.0, "all")
    assert summary["pretraining"]["model_overrides"] == {"generator_hidden_size": 1.0,
                                                         "embedding_sharing": "all"}
    # The randomly initialised encoder is built from the same overrides (one shape for both).
    random_config = json.loads((workdir / "finetune_random" / "best" / "config.json").read_text())
    assert all(random_config[k] == record["model_config"][k]
               for k in summary["pretraining"]["model_overrides"])
    # Both encoders, every seed's number, and the spread computed from them.
    accuracy = summary["rotten_tomatoes_dev_accuracy"]
    for name in ("pretrained", "random_init"):
        a = accuracy[name]
        assert a["seeds"] == [0, 1] and len(a["values"]) == 2
        assert a["median"] == statistics.median(a["values"])
        assert (a["min"], a["max"]) == (min(a["values"]), max(a["values"]))
        # Each seed is scored at its final epoch (no best-epoch pick on the reported split).
        folder = "finetune_pretrained" if name == "pretrained" else "finetune_random"
        for seed, value in zip(a["seeds"], a["values"]):
            run = json.loads((workdir / folder / f"seed_{seed}" / "results.json").read_text())
            assert value == run["history"][-1]["accuracy"]
    assert accuracy["gain_of_medians"] == pytest.approx(
        accuracy["pretrained"]["median"] - accuracy["random_init"]["median"])
    assert accuracy["pretrained_min_above_random_max"] == (
        accuracy["pretrained"]["min"] > accuracy["random_init"]["max"])
    assert "gain of pretraining" in proc.stdout and "median    min    max" in proc.stdout
    for stage in ("=== 1/6", "=== 3/6", "=== 6/6", "=== summary ==="):
        assert stage in proc.stdout
    # A rerun reuses every finished stage.
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("reusing") >= 5
    # Another seed in the same workdir: one line naming the folder and what differs, no
    # traceback, and the finished run's files untouched.
    before = (workdir / "summary.json").read_bytes()
    other = subprocess.run(cmd + ["--seed=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-3000:]
    last = other.stderr.strip().splitlines()[-1]
    assert last.startswith("electra_tf.tools.demo: ") and str(workdir) in last and "seed" in last
    assert (workdir / "summary.json").read_bytes() == before
