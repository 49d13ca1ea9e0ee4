"""The main job (`make demo`) at its smallest scale (`--scale=0.001`: 20 pretraining steps, 2 seeds
per encoder, each fine-tuned 2 epochs of 128 sentences), end to end as a real subprocess: its
results, another seed refused; and stopped by SIGTERM / SIGINT once in each of its six stages,
then finished by the same command: every stop is one line naming the stage, no next stage starts,
no stopped stage is recorded as done, the finishing run reuses every finished stage (1-5, as a
rerun of a finished demo does: only stage 6 has no result to reuse), and the results equal the
uninterrupted run's (electra_tf/experiments/demo.py). One uninterrupted run serves both tests."""

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCALE = "--scale=0.001"  # the smallest: 20 pretraining steps, 2 seeds per encoder, 2 epochs
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def command(workdir) -> list:
    return [sys.executable, "-m", "electra_tf.tools.demo", f"--workdir={workdir}", SCALE]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(workdir, the finished process) of the demo run straight through."""
    workdir = tmp_path_factory.mktemp("demo") / "reference"
    proc = subprocess.run(command(workdir), cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir, proc


@pytest.mark.slow
@pytest.mark.multiprocess
def test_demo_runs_end_to_end_and_served_answers_match(uninterrupted):
    workdir, proc = uninterrupted
    cmd = command(workdir)
    assert json.loads((workdir / "summary.json").read_text())["finetuning"]["epochs"] == 2
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["served"]["all_match"], summary["served"]
    assert len(summary["served"]["answers"]) == 4
    assert all(a["label"] in ("negative", "positive") for a in summary["served"]["answers"])
    export = Path(summary["export"])
    assert (export / "saved_model.pb").exists() and export.parent.name == "electra_rt"
    assert summary["pretraining"]["steps"] == 20
    # 20 steps teach the generator more than a uniform guess over the vocabulary (1,081 pieces
    # at this scale; the loss starts at about its log).
    vocab_size = len((workdir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert summary["pretraining"]["final_metrics"]["mlm_loss"] < math.log(vocab_size)
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
            assert [h["epoch"] for h in run["history"]] == [1.0, 2.0]
            assert value == run["history"][-1]["accuracy"]
    assert accuracy["gain_of_medians"] == pytest.approx(
        accuracy["pretrained"]["median"] - accuracy["random_init"]["median"])
    assert accuracy["pretrained_min_above_random_max"] == (
        accuracy["pretrained"]["min"] > accuracy["random_init"]["max"])
    assert "gain of pretraining" in proc.stdout and "median    min    max" in proc.stdout
    for stage in ("=== 1/6", "=== 3/6", "=== 6/6", "=== summary ==="):
        assert stage in proc.stdout
    # (A rerun reusing every finished stage: the stopped demo's last launch, below.)
    # Another seed in the same workdir: one line naming the folder and what differs, no
    # traceback, and the finished run's files untouched.
    before = (workdir / "summary.json").read_bytes()
    other = subprocess.run(cmd + ["--seed=1"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=600)
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-3000:]
    last = other.stderr.strip().splitlines()[-1]
    assert last.startswith("electra_tf.tools.demo: ") and str(workdir) in last and "seed" in last
    assert (workdir / "summary.json").read_bytes() == before


# --- stopped in every stage -------------------------------------------------------------


def start(workdir) -> tuple[subprocess.Popen, list]:
    """The demo as a process; its merged output lines are collected as they come."""
    env = {**ENV, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command(workdir), cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list = []
    threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
    return process, lines


def wait_for(process, lines, pattern, timeout=600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(re.search(pattern, line) for line in list(lines)):
            return
        assert process.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in:\n{''.join(lines)[-3000:]}")


def stop_in(workdir, stage: str, when: str, signum, delay: float = 0.0) -> str:
    """Runs the demo until a line matches `when` (in `stage`), sends `signum` `delay` seconds
    later; returns the demo's last line after checking it stopped there, non-zero, and started
    no next stage."""
    process, lines = start(workdir)
    wait_for(process, lines, when)
    time.sleep(delay)
    process.send_signal(signum)
    process.wait(timeout=300)
    time.sleep(0.2)  # the reader's last lines
    output = "".join(lines)
    assert process.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    number = int(stage[0])
    assert f"=== {number + 1}/6" not in output, output[-3000:]  # no next stage started
    last = output.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    assert last.startswith(f"electra_tf.tools.demo: stage {stage}: ") and name in last, output[-3000:]
    assert "run the same command" in last, last
    return last


def comparable(summary: dict) -> dict:
    """summary.json without what differs between two workdirs and two runs: paths, seconds, and
    the final pretraining metrics (means over the steps since the last summary that this process
    ran: a resumed run ran fewer of them; its weights are compared instead)."""
    out = {k: v for k, v in summary.items() if k not in ("workdir", "vocab", "shards", "export",
                                                         "seconds")}
    out["pretraining"] = {k: v for k, v in summary["pretraining"].items()
                          if k not in ("model_dir", "final_metrics")}
    return out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_demo_stopped_in_every_stage_resumes_to_the_results_of_an_uninterrupted_run(
        tmp_path, uninterrupted):
    (reference_dir, _), workdir = uninterrupted, tmp_path / "stopped"

    stop_in(workdir, "1/6 corpus and vocabulary", r"=== 1/6", signal.SIGTERM)
    assert not (workdir / "vocab.txt").exists()

    # Once the builder's workers are started: a signal while the builder spawns one makes that
    # child print a traceback (multiprocessing's spawn reads its start-up data from the parent).
    last = stop_in(workdir, "2/6 pretraining shards", r"Indexed \d+ files", signal.SIGINT, 0.5)
    assert "finished shard(s) kept" in last, last
    assert not (workdir / "shards_64" / "manifest.json").exists()

    last = stop_in(workdir, "3/6 pretraining", r"the train loop is traced", signal.SIGTERM)
    found = re.search(r"pretraining stopped on SIGTERM at step (\d+) of 20 \(checkpoint (\S+)\)",
                      last)
    assert found, last
    step, checkpoint = int(found.group(1)), found.group(2)
    assert 1 <= step < 20 and checkpoint == str(workdir / "pretrain" / f"ckpt-{step}")
    assert Path(checkpoint + ".index").exists()
    assert not (workdir / "pretrain" / "demo_pretraining.json").exists()  # not done
    assert not (workdir / "pretrain" / "discriminator").exists()

    last = stop_in(workdir, "4/6 fine-tuning", r"\] eval epoch 1:", signal.SIGINT)
    assert "nothing of this run is kept" in last
    done = json.loads((workdir / "pretrain" / "demo_pretraining.json").read_text())
    assert done["steps"] == 20 and done["discriminator"]  # resumed to its end
    assert not (workdir / "finetune_pretrained" / "results.json").exists()

    stop_in(workdir, "5/6 export", r"=== 5/6", signal.SIGTERM)
    stop_in(workdir, "6/6 serve", r"=== 6/6", signal.SIGTERM)
    assert not (workdir / "summary.json").exists()

    process, lines = start(workdir)
    assert process.wait(timeout=900) == 0, "".join(lines)[-3000:]
    time.sleep(0.2)
    # Stages 1-5 are finished here, as in a rerun of a finished demo: each is reused, not redone.
    output = "".join(lines)
    for done in ("imdb.txt", "vocab.txt", "pretrain", "finetune_pretrained", "finetune_random",
                 os.path.join("export", "electra_rt", "")):
        assert f"reusing {os.path.join(workdir, done)}" in output, (done, output[-3000:])
    assert "=== 6/6" in output and "=== summary ===" in output
    ours = json.loads((workdir / "summary.json").read_text())
    theirs = json.loads((reference_dir / "summary.json").read_text())
    # Every seed's accuracy, the spread, the served answers and their probabilities: equal.
    assert comparable(ours) == comparable(theirs)
    # The pretrained weights, resumed at `step`: bit for bit those trained straight through
    # (every step is keyed by the optimizer step, and the machine's kernels are deterministic).
    import tensorflow as tf

    def weights(run):
        checkpoint = str(run / "pretrain" / "ckpt-20")
        reader = tf.train.load_checkpoint(checkpoint)
        return {n: reader.get_tensor(n) for n, _ in tf.train.list_variables(checkpoint)
                if n.startswith("variables/")}

    a, b = weights(workdir), weights(reference_dir)
    assert set(a) == set(b) and len(a) > 10
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
