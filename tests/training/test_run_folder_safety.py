"""The pretraining side never loses or exposes work: links planted at every name the data, vocabulary
and pretraining commands write; two runs on one folder; a full disk during a checkpoint; a
half-written discriminator. Real binaries in real processes, real files.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

import pytest

# Fresh interpreters, not preloaded forks (tests/preloaded.py): its commands stop themselves
# (SIGSTOP), are read in /proc and named by pid.
pytestmark = pytest.mark.real_process


def plant(folder, names, tmp_path) -> dict:
    """A link at each name in `folder` to its own victim file outside it; returns {victim: text}."""
    victims = {}
    os.makedirs(folder, exist_ok=True)
    for i, name in enumerate(names):
        victim = tmp_path / f"victim_{i}.txt"
        victim.write_text(f"precious {i}\n")
        os.symlink(victim, os.path.join(folder, name))
        victims[victim] = victim.read_text()
    return victims


def assert_untouched(victims: dict) -> None:
    for victim, text in victims.items():
        assert victim.read_text() == text, victim


def tool(module, *args, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", f"electra_tf.tools.{module}", *args], env=env,
                          capture_output=True, text=True, timeout=300, **kwargs)


@pytest.mark.slow  # the vocabulary and data binaries once each, ~15 s
def test_vocab_and_data_commands_replace_planted_links_and_never_write_through_them(
        tmp_path, pretrain_vocab):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\nit was a good mat.\n\nanother document here.\n" * 50)
    vocab_dir = tmp_path / "vocab"
    victims = plant(vocab_dir, ["vocab.txt", "vocab.txt.tmp"], tmp_path)
    proc = tool("build_vocab", f"--input={corpus}", f"--output={vocab_dir / 'vocab.txt'}", "--vocab_size=200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not os.path.islink(vocab_dir / "vocab.txt")
    assert "[CLS]" in (vocab_dir / "vocab.txt").read_text()

    out = tmp_path / "shards"
    victims.update(plant(out, ["manifest.json", "manifest.json.tmp", ".build_config.json",
                               "pretrain_data.tfrecord-00001-of-00002"], vocab_dir))
    (tmp_path / "elsewhere").mkdir()
    victims.update(plant(out / ".shard_stats", ["00000.json"], tmp_path / "elsewhere"))
    proc = tool("build_pretraining_data", f"--input={corpus}", f"--vocab_file={pretrain_vocab}",
                f"--output_dir={out}", "--max_seq_length=32", "--num_shards=2", "--num_processes=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not os.path.islink(out / "manifest.json")
    assert '"num_shards": 2' in (out / "manifest.json").read_text()
    for name in ("manifest.json", ".build_config.json", "pretrain_data.tfrecord-00001-of-00002",
                 ".shard_stats/00000.json"):
        assert os.path.isfile(out / name) and not os.path.islink(out / name), name
    assert_untouched(victims)


def wait_for(condition, process, what: str, timeout=120.0) -> None:
    """Polls the filesystem until `condition()`; fails if `process` ends first."""
    end = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"ended before {what}: {process.stdout.read()[-3000:]}"
        assert time.time() < end, f"no {what} after {timeout} s"
        time.sleep(0.005)


# `electra-pretrain` whose `files.publish_folder` first stops the process (SIGSTOP): the binary
# itself, held at the point between "staged folder complete" and "published".
_STOP_BEFORE_PUBLISH = """
import os, runpy, signal, sys
from electra_tf import files
publish = files.publish_folder
def stop_then_publish(staging, final):
    os.kill(os.getpid(), signal.SIGSTOP)
    return publish(staging, final)
files.publish_folder = stop_then_publish
sys.argv = ["electra-pretrain", *sys.argv[1:]]
runpy.run_module("electra_tf.tools.pretrain", run_name="__main__", alter_sys=True)
"""


def stopped(process) -> bool:
    with open(f"/proc/{process.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def limit_file_size(nbytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


@pytest.mark.slow
@pytest.mark.multiprocess  # five runs of the binary on one folder, ~60 s
def test_one_run_folder_through_a_second_writer_a_kill_during_export_and_a_full_disk(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    from electra_tf.convert.pretrained import from_pretrained

    model_dir = tmp_path / "run"
    disc = model_dir / "discriminator"

    def flags(steps):
        return th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir), num_train_steps=steps)

    # 1. Links at the names the run writes (TensorFlow's checkpoint files too) are replaced, not
    #    followed, and a link at a checkpoint's name is no checkpoint to resume; a second run on the
    #    folder while the first holds it (stopped mid-run) is refused at once, naming its pid.
    victims = plant(model_dir, ["pretraining_config.json", "pretraining_config.json.tmp", "ckpt-2.index",
                                "ckpt-4.data-00000-of-00001", "checkpoint"], tmp_path)
    first = th.pretrain_process(flags(4))
    try:
        wait_for(lambda: not os.path.islink(model_dir / "pretraining_config.json"), first,
                 "run record")
        first.send_signal(signal.SIGSTOP)
        second = th.pretrain_process(flags(4))
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 1, out[-3000:]
        assert out.strip().splitlines()[-1] == (
            f"electra-pretrain: error: {model_dir} is in use by another run (pid {first.pid}); "
            "wait for it to end or use another folder")
        assert "Traceback" not in out
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]
    assert_untouched(victims)
    from_pretrained(str(disc))

    # 2. kill -9 while the resumed run's discriminator is staged (its checkpoint written):
    #    the previous discriminator/ is untouched and whole.
    #    The window is milliseconds, so the binary stops itself (SIGSTOP) just before publishing
    #    the staged folder, and is killed there: the same point on every machine.
    before = os.stat(disc).st_ino
    process = th.pretrain_process(flags(6), launcher=_STOP_BEFORE_PUBLISH)
    wait_for(lambda: stopped(process), process, "staged discriminator")
    assert any((model_dir / n / "model.index").exists() for n in os.listdir(model_dir)
               if n.startswith(".discriminator.staging-")), os.listdir(model_dir)
    process.kill()
    process.communicate(timeout=60)
    assert os.stat(disc).st_ino == before
    from_pretrained(str(disc))

    # 3. A full disk at the next checkpoint. Python ignores SIGXFSZ, so past RLIMIT_FSIZE a write
    #    fails with EFBIG ("File too large") as on a full disk; the checkpoint's data file is
    #    larger than this limit. One line, and no partial checkpoint left.
    process = th.pretrain_process(flags(8), preexec_fn=limit_file_size(64 * 1024))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 1, out[-3000:]
    line = out.strip().splitlines()[-1]
    assert line.startswith("electra-pretrain: error: File too large writing "), out[-3000:]
    assert line.endswith("free space and rerun the same command (what was finished is kept)")
    assert "Traceback" not in out
    left = os.listdir(model_dir)
    assert not [n for n in left if n.endswith("_temp") or ".tempstate" in n or n.startswith("ckpt-8")], left

    # 4. Debris of a killed save (TensorFlow's temporary folder) and of the killed export is
    #    cleaned at the next start; the same command resumes and swaps in a new discriminator/.
    os.makedirs(model_dir / "ckpt-8_temp")
    (model_dir / "ckpt-8_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x" * 10)
    process = th.pretrain_process(flags(8))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    assert not (model_dir / "ckpt-8_temp").exists() and (model_dir / "ckpt-8.index").exists()
    assert os.stat(disc).st_ino != before
    from_pretrained(str(disc))
    assert not [n for n in os.listdir(model_dir) if n.startswith(".discriminator.")]
