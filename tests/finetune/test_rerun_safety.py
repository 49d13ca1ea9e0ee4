"""A finished fine-tuned model is never lost: reruns, kill -9 at the worst moments, two runs on one
folder, links planted at the names it writes.

The binary runs as a real process on the tiny config; the moments to kill it are found by
watching its model_dir (a staging folder appears, holds a model, holds its results, `best/` is
swapped), not by sleeping. After every kill `best/` must load and `results.json` must describe
it (same seed and epoch as `best/head_config.json`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from electra_tf import files
from electra_tf.finetune.saving import load_finetuned
from tests.command_lines import snapshot

REPO = Path(__file__).resolve().parents[2]
RUN = ["--task=rotten_tomatoes", "--config=electra_tiny", "--max_train_examples=32",
       "--max_eval_examples=16", "--num_train_epochs=2", "--train_batch_size=16",
       "--max_seq_length=32", "--log_every_steps=1"]


def start(vocab_file, model_dir, *extra) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.finetune", *RUN, f"--vocab_file={vocab_file}",
         f"--model_dir={model_dir}", *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def finish(process, timeout=300) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def staging(model_dir: Path) -> list[Path]:
    return [model_dir / n for n in os.listdir(model_dir) if n.startswith(".best.staging-")]


folder_hashes = snapshot


def check_consistent(model_dir: Path) -> dict:
    """best/ loads, and results.json (top level and in best/) describes it."""
    head_config = json.loads((model_dir / "best" / "head_config.json").read_text())
    results = json.loads((model_dir / "results.json").read_text())
    assert results == json.loads((model_dir / "best" / "results.json").read_text())
    run = results["runs"][0] if "runs" in results else results
    assert (run["seed"], run["best_epoch"]) == (head_config["seed"], head_config["epoch"])
    assert run["best"] == head_config["metrics"]
    load_finetuned(model_dir)
    return results


# Moments of a rerun, each a test of the filesystem: kill -9 when it first holds.
MOMENTS = {
    "a staging folder appears": lambda d, inode: bool(staging(d)),
    "the staged model is complete": lambda d, inode: any((s / "head_config.json").exists() for s in staging(d)),
    "its results are written": lambda d, inode: any((s / "results.json").exists() for s in staging(d)),
    "best/ was swapped": lambda d, inode: os.stat(d / "best").st_ino != inode,
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, vocab_file):
    model_dir = tmp_path_factory.mktemp("ft") / "run"
    model_dir.mkdir()
    victim = model_dir.parent / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, model_dir / "results.json")  # planted where the run writes
    os.symlink(victim, model_dir / "finetuning_config.json")
    (model_dir / "predictions").mkdir()
    os.symlink(victim, model_dir / "predictions" / "epoch_1.jsonl")
    code, err = finish(start(vocab_file, model_dir))
    assert code == 0, err[-3000:]
    assert victim.read_text() == "precious\n"
    assert os.readlink(model_dir / "results.json") == "best/results.json"
    assert not os.path.islink(model_dir / "finetuning_config.json")
    assert not os.path.islink(model_dir / "predictions" / "epoch_1.jsonl")
    return model_dir


@pytest.mark.slow  # one refused run (TensorFlow start-up only), ~10 s
def test_a_rerun_with_other_settings_is_refused_and_the_folder_stays_byte_identical(finished, vocab_file):
    before = folder_hashes(finished)
    code, err = finish(start(vocab_file, finished, "--seed=3", "--learning_rate=0.001"))
    assert code == 1 and "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"electra-finetune: error: model_dir {finished} holds a finished model: it "
                           "was fine-tuned with ")
    assert "seed=0" in line and "seed=3" in line and "learning_rate" in line
    assert line.endswith("use another --model_dir, or --overwrite to replace it (the old model stays "
                         "until the new one is complete)")
    assert folder_hashes(finished) == before


def kill_when(process, holds, model_dir: Path, inode: int) -> bool:
    """Polls the folder until `holds`; then kill -9. False if the process ended first."""
    while process.poll() is None and not holds(model_dir, inode):
        time.sleep(0.0005)
    if process.poll() is not None:
        return False
    process.kill()
    return True


@pytest.mark.slow  # three interrupted runs, one refused and one complete, ~50 s
def test_kill_9_at_every_moment_of_an_overwriting_rerun_leaves_a_complete_model_described_by_results(
        finished, vocab_file):
    appears, complete, results_written, swapped = MOMENTS
    current = check_consistent(finished)["seeds"][0]

    # Run 1: when its staging folder appears the folder is in use (a second command is refused
    # at once, naming the holder); killed once the staged model is complete.
    inode = os.stat(finished / "best").st_ino
    process = start(vocab_file, finished, "--seed=1", "--overwrite")
    while process.poll() is None and not MOMENTS[appears](finished, inode):
        time.sleep(0.0005)
    process.send_signal(signal.SIGSTOP)
    code, err = finish(start(vocab_file, finished, "--seed=1", "--overwrite"))
    assert code == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"electra-finetune: error: {finished} is in use by another run (pid {process.pid}); wait "
        "for it to end or use another folder")
    process.send_signal(signal.SIGCONT)
    assert kill_when(process, MOMENTS[complete], finished, inode)
    process.communicate(timeout=60)
    assert check_consistent(finished)["seeds"] == [current]  # still the previous model

    # Runs 2 and 3: killed when the staged results are written (a few microseconds before the
    # swap: the kill may land on either side) and right after best/ was swapped.
    for seed, moment in ((2, results_written), (3, swapped)):
        inode = os.stat(finished / "best").st_ino
        process = start(vocab_file, finished, f"--seed={seed}", "--overwrite")
        caught = kill_when(process, MOMENTS[moment], finished, inode)
        process.communicate(timeout=60)
        seeds = check_consistent(finished)["seeds"]
        assert seeds in ([current], [seed]) if caught else seeds == [seed]
        current = seeds[0]

    # A complete rerun cleans what the killed ones left and swaps its model in.
    code, err = finish(start(vocab_file, finished, "--seed=9", "--overwrite"))
    assert code == 0, err[-3000:]
    assert check_consistent(finished)["seeds"] == [9]
    assert staging(finished) == []
    assert not [n for n in os.listdir(finished) if n.endswith(files._TEMP_SUFFIX)]


@pytest.mark.slow  # one run that fills its file-size limit, ~15 s
def test_a_full_disk_while_saving_the_model_is_one_line_and_keeps_the_finished_one(finished, vocab_file):
    import resource

    before = folder_hashes(finished / "best")
    results = (finished / "results.json").read_text()

    def limit():  # past RLIMIT_FSIZE a write fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    process = subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.finetune", *RUN, f"--vocab_file={vocab_file}",
         f"--model_dir={finished}", "--seed=11", "--overwrite"], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    code, err = finish(process)
    assert code == 1, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("electra-finetune: error: File too large writing "), err[-3000:]
    assert "Traceback" not in err
    assert folder_hashes(finished / "best") == before
    assert (finished / "results.json").read_text() == results
    assert staging(finished) == []
