"""A finished fine-tuned model is never lost: reruns, kill -9 at the worst moments, two runs on one
folder, links planted at the names it writes, a full disk, a diverging rerun.

The binary runs as a real process on the tiny config; the moments to kill it are found by
watching its model_dir (a staging folder appears, holds a model, holds its results, `best/` is
swapped), not by sleeping. After every kill `best/` must load and everything at the top level
must describe it (`described`: results.json with the seed and epoch of `best/head_config.json`,
predictions a link into `best/`, no config beside it).

One finished run (the module's `finished`) serves every test, in file order: the diverging
rerun and the killed `--overwrite` rerun that leaves the top level describing `best/` were
tests of test_finetune_refusals.py with a finished run of their own, and the binary's one-seed
run from random initialization (--config as a JSON file) was a second run of test_trainer.py's
binary test; their claims are checked here on this one.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from electra_tf import files
from electra_tf.finetune.saving import load_finetuned
from tests.command_lines import snapshot, tree

REPO = Path(__file__).resolve().parents[2]
RUN = ["--task=rotten_tomatoes", "--config=electra_tiny", "--max_train_examples=32",
       "--max_eval_examples=16", "--num_train_epochs=2", "--train_batch_size=16",
       "--max_seq_length=32", "--log_every_steps=1",
       "--learning_rate=0.0005"]  # given, so results.json records it (`described` compares it)


def binary(*args, **popen) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", "electra_tf.tools.finetune", *args], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **popen)


def start(vocab_file, model_dir, *extra) -> subprocess.Popen:
    return binary(*RUN, f"--vocab_file={vocab_file}", f"--model_dir={model_dir}", *extra)


def finish(process, timeout=300) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def staging(model_dir: Path) -> list[Path]:
    return [model_dir / n for n in os.listdir(model_dir) if n.startswith(".best.staging-")]


folder_hashes = snapshot


def described(model_dir: Path) -> dict:
    """best/ loads, and everything at the top level of model_dir describes it: results.json (the
    same as best/'s: its seed, best epoch and metrics), predictions (a link into best/, the best
    epoch's file equal to best/'s), and the config best/ was trained with (in best/, none at the
    top level)."""
    best = model_dir / "best"
    head_config = json.loads((best / "head_config.json").read_text())
    results = json.loads((model_dir / "results.json").read_text())
    assert results == json.loads((best / "results.json").read_text())
    run = results["runs"][0]
    assert (run["seed"], run["best_epoch"]) == (head_config["seed"], head_config["epoch"])
    assert run["best"] == head_config["metrics"]
    assert not os.path.lexists(model_dir / "finetuning_config.json")
    config = json.loads((best / "finetuning_config.json").read_text())
    assert config["learning_rate"] == run["settings"]["finetuning_config"]["learning_rate"]
    assert os.readlink(model_dir / "predictions") == "best/predictions"
    epoch = (model_dir / "predictions" / f"epoch_{head_config['epoch']:g}.jsonl").read_text()
    assert epoch == (best / "predictions.jsonl").read_text()
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
def finished(tmp_path_factory, vocab_file, tiny_config):
    """One seed from random initialization, the model config given as a JSON file (the tiny
    config over the fixture vocabulary, what --config=electra_tiny --vocab_file gives the
    reruns): model_dir itself is the run (`best/`, no seed_0/), and results.json records no
    init_checkpoint (claims of test_trainer.py's binary tests, checked on this run)."""
    model_dir = tmp_path_factory.mktemp("ft") / "run"
    model_dir.mkdir()
    config = model_dir.parent / "tiny.json"
    tiny_config.to_json(config)
    victim = model_dir.parent / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, model_dir / "results.json")  # planted where the run writes
    os.symlink(victim, model_dir / "finetuning_config.json")
    (model_dir / "predictions").mkdir()
    os.symlink(victim, model_dir / "predictions" / "epoch_1.jsonl")
    code, err = finish(start(vocab_file, model_dir, f"--config={config}"))
    assert code == 0, err[-3000:]
    run = json.loads((model_dir / "results.json").read_text())["runs"][0]
    assert run["init_checkpoint"] is None and run["train_steps"] == 4  # 32 examples / 16, 2 epochs
    assert (model_dir / "best" / "head_config.json").exists() and not (model_dir / "seed_0").exists()
    assert victim.read_text() == "precious\n"
    assert os.readlink(model_dir / "results.json") == "best/results.json"
    assert not os.path.islink(model_dir / "finetuning_config.json")
    assert not os.path.islink(model_dir / "predictions" / "epoch_1.jsonl")
    described(model_dir)
    # Every folder and file in the normal mode (0777 / 0666 less the umask), best/ included:
    # it was staged by mkdtemp, 0700, unreadable to a serving container under another user.
    modes = {str(p.relative_to(model_dir)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in model_dir.rglob("*") if not p.is_symlink()}
    assert "best" in modes and modes == {
        name: oct((0o777 if (model_dir / name).is_dir() else 0o666) & ~files.umask()) for name in modes}
    return model_dir


@pytest.mark.slow  # one refused run (TensorFlow start-up only), ~10 s
def test_a_rerun_with_other_settings_is_refused_and_the_folder_stays_byte_identical(finished, vocab_file):
    before = folder_hashes(finished)
    code, err = finish(start(vocab_file, finished, f"--config={finished.parent / 'tiny.json'}",
                             "--seed=3", "--learning_rate=0.001"))
    assert code == 1 and "Traceback" not in err, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"electra-finetune: error: model_dir {finished} holds a finished model: it "
                           "was fine-tuned with ")
    assert "seed=0" in line and "seed=3" in line and "learning_rate" in line
    assert "model_config" not in line  # the same --config (a file) as the finished run
    assert line.endswith("use another --model_dir, or --overwrite to replace it (the old model stays "
                         "until the new one is complete)")
    assert folder_hashes(finished) == before


@pytest.mark.slow  # one run into the finished folder, stopped at step 1 (~7 s)
def test_a_diverging_run_is_one_line_and_keeps_the_finished_model(finished, tmp_path, vocab_file):
    before = tree(finished)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"film number {i}", "label": 1e30}) + "\n"
                             for i in range(16)))
    _, err = (process := binary(
        "--task=regression", f"--train_file={train}", f"--eval_file={train}",
        "--config=electra_tiny", f"--vocab_file={vocab_file}", "--train_batch_size=8",
        "--max_seq_length=16", f"--model_dir={finished}", "--overwrite")).communicate(timeout=600)
    assert process.returncode == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "electra-finetune: error: training diverged: the loss is inf at step 1 (epoch 1); lower "
        "--learning_rate (it is 0.0001), or check the training labels (a label far larger than the "
        f"others, say); the finished model in {finished / 'best'} is kept")
    after = tree(finished)
    assert {k: v for k, v in after.items() if not k.startswith("logs")} == \
        {k: v for k, v in before.items() if not k.startswith("logs")}  # logs/ gains its events


def kill_when(process, holds, model_dir: Path, inode: int) -> bool:
    """Polls the folder until `holds`; then kill -9. False if the process ended first."""
    while process.poll() is None and not holds(model_dir, inode):
        time.sleep(0.0005)
    if process.poll() is not None:
        return False
    process.kill()
    return True


@pytest.mark.slow  # three interrupted runs, one refused and one complete, ~35 s
@pytest.mark.real_process  # kill -9 at chosen moments, SIGSTOP, the holder's pid in a message
def test_kill_9_at_every_moment_of_an_overwriting_rerun_leaves_a_complete_model_described_by_results(
        finished, vocab_file):
    """After each kill the previous model or the new one is `best/`, and the whole top level
    (results, predictions, no config) describes it. The killed runs' config and predictions were
    once written at the top level beside the old best/ (run 1 is given another learning rate,
    so a config of its own there would show); now they are staged with its model and published
    with it. The complete rerun at the end also starts from a folder of an earlier version
    (config and predictions at the top level beside best/): it files them into the best/ they
    describe before replacing it, then links."""
    appears, complete, results_written, swapped = MOMENTS
    old = described(finished)
    current = old["seeds"][0]

    # Run 1: when its staging folder appears the folder is in use (a second command is refused
    # at once, naming the holder); killed once the staged model is complete.
    inode = os.stat(finished / "best").st_ino
    rerun = ("--seed=1", "--learning_rate=0.002", "--overwrite")
    process = start(vocab_file, finished, *rerun)
    while process.poll() is None and not MOMENTS[appears](finished, inode):
        time.sleep(0.0005)
    process.send_signal(signal.SIGSTOP)
    code, err = finish(start(vocab_file, finished, *rerun))
    assert code == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"electra-finetune: error: {finished} is in use by another run (pid {process.pid}); wait "
        "for it to end or use another folder")
    process.send_signal(signal.SIGCONT)
    assert kill_when(process, MOMENTS[complete], finished, inode)
    process.communicate(timeout=60)
    staged = [s for s in staging(finished) if (s / "head_config.json").exists()]
    assert staged and (staged[0] / "predictions" / "epoch_1.jsonl").exists()  # staged, not at the top
    assert described(finished) == old  # still the previous model, and all of the top level

    # Runs 2 and 3: killed when the staged results are written (a few microseconds before the
    # swap: the kill may land on either side) and right after best/ was swapped.
    for seed, moment in ((2, results_written), (3, swapped)):
        inode = os.stat(finished / "best").st_ino
        process = start(vocab_file, finished, f"--seed={seed}", "--overwrite")
        caught = kill_when(process, MOMENTS[moment], finished, inode)
        process.communicate(timeout=60)
        seeds = described(finished)["seeds"]
        assert seeds in ([current], [seed]) if caught else seeds == [seed]
        current = seeds[0]

    # A folder of an earlier version: config and predictions at the top level beside best/.
    best = finished / "best"
    os.unlink(finished / "predictions")
    os.rename(best / "predictions", finished / "predictions")
    os.rename(best / "finetuning_config.json", finished / "finetuning_config.json")
    # A complete rerun cleans what the killed ones left and swaps its model in.
    code, err = finish(start(vocab_file, finished, "--seed=9", "--overwrite"))
    assert code == 0, err[-3000:]
    assert described(finished)["seeds"] == [9]
    assert staging(finished) == []
    assert not [n for n in os.listdir(finished) if n.endswith(files._TEMP_SUFFIX)]
    assert not [n for n in os.listdir(finished) if n.startswith(".")
                and n != ".electra_tf.lock"]  # no staging or temporary left


@pytest.mark.slow  # one run that fills its file-size limit, ~15 s
def test_a_full_disk_while_saving_the_model_is_one_line_and_keeps_the_finished_one(finished, vocab_file):
    import resource

    before = folder_hashes(finished / "best")
    results = (finished / "results.json").read_text()

    def limit():  # past RLIMIT_FSIZE a write fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (48 * 1024, 48 * 1024))

    process = binary(*RUN, f"--vocab_file={vocab_file}", f"--model_dir={finished}", "--seed=11",
                     "--overwrite", preexec_fn=limit)
    code, err = finish(process)
    assert code == 1, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("electra-finetune: error: File too large writing "), err[-3000:]
    assert "Traceback" not in err
    assert folder_hashes(finished / "best") == before
    assert (finished / "results.json").read_text() == results
    assert staging(finished) == []
