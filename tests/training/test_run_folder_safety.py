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

from electra_tf import files


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
    victims.update(plant(out, ["manifest.json", "manifest.json.tmp"], vocab_dir))
    proc = tool("build_pretraining_data", f"--input={corpus}", f"--vocab_file={pretrain_vocab}",
                f"--output_dir={out}", "--max_seq_length=32", "--num_shards=2", "--num_processes=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not os.path.islink(out / "manifest.json")
    assert '"num_shards": 2' in (out / "manifest.json").read_text()
    assert_untouched(victims)


def wait_for(condition, process, what: str, timeout=120.0) -> None:
    """Polls the filesystem until `condition()`; fails if `process` ends first."""
    end = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"ended before {what}: {process.stdout.read()[-3000:]}"
        assert time.time() < end, f"no {what} after {timeout} s"
        time.sleep(0.005)


@pytest.mark.slow
@pytest.mark.multiprocess  # a stopped run, a refused one, a resumed one, ~40 s
def test_a_second_run_on_a_folder_in_use_is_refused_and_links_at_its_names_are_replaced(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    model_dir = tmp_path / "run"
    victims = plant(model_dir, ["pretraining_config.json", "pretraining_config.json.tmp"], tmp_path)
    first = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                              num_train_steps=4))
    try:
        wait_for(lambda: not os.path.islink(model_dir / "pretraining_config.json"), first,
                 "run record")
        first.send_signal(signal.SIGSTOP)  # holds the lock, mid-run
        second = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                                   num_train_steps=4))
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
    assert (model_dir / "discriminator" / "electra_tf_checkpoint.json").exists()


def limit_file_size(nbytes: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return apply


@pytest.mark.slow
@pytest.mark.multiprocess  # a run that fills its disk, a resumed one, ~30 s
def test_a_full_disk_at_a_checkpoint_is_one_line_cleans_its_partial_files_and_resumes(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    # Python ignores SIGXFSZ, so past RLIMIT_FSIZE a write fails with EFBIG ("File too large"),
    # as on a full disk: the first checkpoint's data file is larger than this limit.
    model_dir = tmp_path / "run"
    flags = th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir), num_train_steps=4)
    process = th.pretrain_process(flags, preexec_fn=limit_file_size(64 * 1024))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 1, out[-3000:]
    line = out.strip().splitlines()[-1]
    assert line.startswith("electra-pretrain: error: File too large writing "), out[-3000:]
    assert line.endswith("free space and rerun the same command (what was finished is kept)")
    assert "Traceback" not in out
    left = os.listdir(model_dir)
    assert not [n for n in left if n.endswith("_temp") or ".tempstate" in n or n.startswith("ckpt-2")], left

    # Debris of a killed save (TensorFlow's own temporary folder) is cleaned at the next start.
    os.makedirs(model_dir / "ckpt-2_temp")
    (model_dir / "ckpt-2_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x" * 10)
    process = th.pretrain_process(flags)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    assert not (model_dir / "ckpt-2_temp").exists()
    assert (model_dir / "ckpt-4.index").exists()


@pytest.mark.slow  # one tiny pretraining run in-process, ~10 s
def test_the_discriminator_folder_is_swapped_in_whole(tmp_path, pretrain_shards, pretrain_vocab):
    from electra_tf.config import ElectraConfig
    from electra_tf.training import pretraining
    from electra_tf.training.strategy import create_strategy

    model_dir = tmp_path / "run"
    old = model_dir / "discriminator"
    old.mkdir(parents=True)
    (old / "model.index").write_text("an earlier export")
    # A half-written one of a killed run, and a previous one caught between two renames.
    (model_dir / ".discriminator.staging-dead").mkdir()
    config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    run = pretraining.PretrainingConfig(train_batch_size=8, max_seq_length=32, num_train_steps=2,
                                        num_warmup_steps=1, steps_per_loop=2, save_checkpoints_steps=2)
    inode = os.stat(old).st_ino
    pretraining.run_pretraining(config, run, pretrain_shards, str(model_dir), create_strategy("one_device"),
                                vocab_file=pretrain_vocab)
    assert os.stat(old).st_ino != inode  # a new folder, not the old one rewritten
    assert (old / "electra_tf_checkpoint.json").exists() and (old / "vocab.txt").exists()
    assert not [n for n in os.listdir(model_dir) if "staging" in n or "previous" in n]
    assert files.LOCK_NAME in os.listdir(model_dir)


@pytest.mark.slow
@pytest.mark.multiprocess  # a 4-step run, two resumed runs killed while exporting, one finishing, ~60 s
def test_kill_9_while_the_discriminator_is_exported_keeps_the_previous_one_whole(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    from electra_tf.convert.pretrained import from_pretrained

    model_dir = tmp_path / "run"
    process = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                                num_train_steps=4))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    disc = model_dir / "discriminator"

    def staged(marker):
        names = [n for n in os.listdir(model_dir) if n.startswith(".discriminator.staging-")]
        return any((model_dir / n / marker).exists() if marker else True for n in names)

    # Resumed runs to 6 steps, killed when the new folder appears and when it holds its checkpoint.
    for marker in (None, "model.index"):
        before = os.stat(disc).st_ino
        process = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                                    num_train_steps=6))
        wait_for(lambda: staged(marker), process, f"staged discriminator ({marker})")
        process.kill()
        process.communicate(timeout=60)
        assert os.stat(disc).st_ino == before  # the previous export, untouched
        from_pretrained(str(disc))  # and whole
    process = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                                num_train_steps=6))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    from_pretrained(str(disc))
    assert not [n for n in os.listdir(model_dir) if n.startswith(".discriminator.")]
