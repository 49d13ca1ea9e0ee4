"""Pretraining on bad input: another run's folder, damaged checkpoints, damaged shards.

The rule pinned here: bad input gives one line naming the file or field and what is wrong, no
traceback, and nothing already written is lost (folders are hashed before and after). The
binary runs as a real subprocess on the tiny config; shards and checkpoints are real files,
damaged by flipping a bit or cutting them. One finished run (over damaged shards, skipping their
damaged records) is made once and copied by the tests that damage or extend it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import run_folder
from electra_tf.config import ElectraConfig
from electra_tf.data import pipeline
from electra_tf.training.config import PretrainingConfig, PretrainingConfigError
from electra_tf.training.loop import check_run_folder


def run(th, *args, timeout=300) -> tuple[int, str]:
    process = th.pretrain_process(list(args))
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def error_line(out: str) -> str:
    """The binary's one-line error (sys.exit writes it last)."""
    lines = [line for line in out.splitlines() if line.startswith("electra-pretrain: error: ")]
    assert len(lines) == 1, out[-3000:]
    return lines[0]


def cut(path, keep: float) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])


def flip_bit(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x04]))


# --- the run folder, in process -----------------------------------------------------------------
def record_run(folder, model_config, config, with_checkpoint=True):
    """A run folder as run_pretraining leaves it, as far as check_run_folder reads it."""
    os.makedirs(folder, exist_ok=True)
    record = {"model_config": model_config.to_dict(), "pretraining_config": config.to_dict()}
    with open(os.path.join(folder, run_folder.RECORD_FILE), "w") as f:
        json.dump(record, f)
    if with_checkpoint:
        open(os.path.join(folder, "ckpt-2.index"), "wb").close()


def test_a_resumed_run_may_change_steps_and_intervals_but_not_the_model_or_the_data_stream(
        tmp_path):
    model = ElectraConfig.from_json("electra_tiny")
    config = PretrainingConfig(num_train_steps=100, learning_rate=1e-3)
    folder = str(tmp_path)
    record_run(folder, model, config)
    check = check_run_folder
    assert check(folder, model, config) == {}
    assert check(folder, model, config.replace(num_train_steps=200, summary_steps=7)) == {
        "num_train_steps": (100, 200), "summary_steps": (100, 7)}
    with pytest.raises(run_folder.RunFolderError) as err:
        check(folder, model.replace(hidden_size=128), config.replace(train_batch_size=64))
    assert str(err.value) == (
        f"model_dir {folder} holds a run with hidden_size=64, train_batch_size=128, this run "
        "asks for hidden_size=128, train_batch_size=64; use another --model_dir or the same "
        "flags")
    # The optimizer's settings change only on request (e.g. a lower learning rate after a NaN).
    lower = config.replace(learning_rate=5e-4)
    with pytest.raises(run_folder.RunFolderError,
                       match=r"learning_rate=0.001, this run asks for learning_rate=0.0005; .* "
                             r"\(or --allow_config_change=learning_rate to change it on purpose\)"):
        check(folder, model, lower)
    assert check(folder, model, lower, allow_changes=["learning_rate"]) == {
        "learning_rate": (1e-3, 5e-4)}
    with pytest.raises(PretrainingConfigError, match="--allow_config_change=seed: only "):
        check(folder, model, config, allow_changes=["seed"])


def test_the_run_record_of_an_older_version_and_a_folder_without_checkpoints(tmp_path):
    model = ElectraConfig.from_json("electra_tiny")
    config = PretrainingConfig()
    older = tmp_path / "older"  # written before adam_beta_2 existed: its default applies
    record_run(older, model, config)
    saved = json.loads((older / run_folder.RECORD_FILE).read_text())
    del saved["pretraining_config"]["adam_beta_2"]
    (older / run_folder.RECORD_FILE).write_text(json.dumps(saved))
    assert check_run_folder(str(older), model, config) == {}
    with pytest.raises(run_folder.RunFolderError, match="adam_beta_2=0.999, this run asks "):
        check_run_folder(str(older), model, config.replace(adam_beta_2=0.98))
    # A folder with no checkpoint holds nothing to resume: any run may use it.
    empty = tmp_path / "empty"
    record_run(empty, model, config, with_checkpoint=False)
    assert check_run_folder(str(empty), model.replace(hidden_size=128), config) == {}


def test_checkpoint_problem_names_the_damaged_file(tmp_path):
    values = {f"v{i}": tf.Variable(np.arange(4000, dtype=np.float32) + i) for i in range(4)}
    checkpoint = tf.train.Checkpoint(**values)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path / "good"), 3,
                                         checkpoint_name="ckpt")
    prefix = manager.save(checkpoint_number=7)
    assert run_folder.checkpoint_problem(prefix) is None

    def damaged(name, damage):
        folder = tmp_path / name
        shutil.copytree(tmp_path / "good", folder)
        copy = str(folder / "ckpt-7")
        damage(copy)
        return copy, run_folder.checkpoint_problem(copy)

    data = ".data-00000-of-00001"
    copy, problem = damaged("cut_data", lambda p: cut(p + data, 0.5))
    assert problem.startswith(f"{copy}{data}: cut short (")
    copy, problem = damaged("flipped_data", lambda p: flip_bit(p + data, 5000))
    assert problem.startswith(f"{copy}{data}: checksum mismatch in tensor v")
    copy, problem = damaged("cut_index", lambda p: cut(p + ".index", 0.5))
    assert problem.startswith(f"{copy}.index: unreadable index (cut or damaged")
    copy, problem = damaged("no_data", lambda p: os.remove(p + data))
    assert problem == f"{copy}{data}: missing"


def test_a_resume_with_skipped_records_starts_where_the_stream_was(tmp_path, pretrain_shards, th):
    """The epoch size a resume derives its position from counts what the skipping reader
    reads: a damaged shard up to its first damaged record."""
    for path in sorted(glob.glob(pretrain_shards)):
        shutil.copy(path, tmp_path)
    shard = sorted(glob.glob(str(tmp_path / "pretrain_data.tfrecord-*")))[1]
    with open(shard, "rb") as f:
        flip_bit(shard, th.record_offsets(f.read())[50] + 20)
    pattern = str(tmp_path / "pretrain_data.tfrecord-*")
    context = tf.distribute.InputContext()

    def batches(start_step, n):
        fn = pipeline.dataset_fn(pattern, 8, th.seq_length, seed=3, start_step=start_step,
                                 shuffle_buffer=64, skip_corrupt=True)
        return [b["input_ids"].numpy() for b in fn(context).take(n)]

    straight = batches(0, 300)  # an epoch is ~175 batches: this crosses into the second
    resumed = batches(200, 40)
    for a, b in zip(straight[200:], resumed):
        np.testing.assert_array_equal(a, b)


# --- the binary -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def damaged_shards(tmp_path_factory, pretrain_shards, th):
    """Copies of the 4 shards: record 50 of shard 1 has a flipped bit, shard 3 is cut inside
    record 300. Returns (pattern, the shards, {shard: its record offsets})."""
    folder = tmp_path_factory.mktemp("damaged") / "shards"
    folder.mkdir()
    for path in sorted(glob.glob(pretrain_shards)):
        shutil.copy(path, folder)
    shards = sorted(glob.glob(str(folder / "pretrain_data.tfrecord-*")))
    info = {}
    for path in shards:
        with open(path, "rb") as f:
            info[path] = th.record_offsets(f.read())
    flip_bit(shards[1], info[shards[1]][50] + 12 + 9)
    with open(shards[3], "r+b") as f:
        f.truncate(info[shards[3]][300] + 40)
    return str(folder / "pretrain_data.tfrecord-*"), shards, info


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, damaged_shards, pretrain_vocab, th):
    """A finished 6-step run (checkpoints at 2, 4 and 6) over the damaged shards with
    --skip_corrupt_records: its own test reads what it logged, the others copy the folder and
    pass `flags(...)`, the same flags. One run for every test that needs a finished one: what
    they change (the config, a checkpoint) does not depend on the data it read."""
    pattern = damaged_shards[0]
    model_dir = str(tmp_path_factory.mktemp("finished") / "run")

    def flags(model_dir, **extra):
        return th.tiny_flags(pattern, pretrain_vocab, model_dir, skip_corrupt_records=True,
                             **extra)

    code, out = run(th, *flags(model_dir))
    assert code == 0, out[-3000:]
    return model_dir, out, flags


def copy_run(finished_run, tmp_path) -> str:
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_run[0], model_dir)
    return model_dir


@pytest.mark.slow
@pytest.mark.multiprocess
def test_another_config_is_refused_in_one_line_and_the_folder_stays_byte_identical(
        finished_run, tmp_path, th):
    flags = finished_run[2]
    model_dir = copy_run(finished_run, tmp_path)
    before = th.folder_hashes(model_dir)
    code, out = run(th, *flags(model_dir, train_batch_size=16, override=["hidden_size=128"]))
    assert code == 1, out[-3000:]
    assert error_line(out) == (
        f"electra-pretrain: error: model_dir {model_dir} holds a run with hidden_size=64, train_batch_size=8, "
        "this run asks for hidden_size=128, train_batch_size=16; use another --model_dir or "
        "the same flags")
    assert "Traceback" not in out
    assert th.folder_hashes(model_dir) == before

    # Steps and intervals may change: 2 more steps extend the run.
    code, out = run(th, *flags(model_dir, num_train_steps=8, summary_steps=3))
    assert code == 0, out[-3000:]
    assert f"Resumed from {model_dir}/ckpt-6 at step 6" in out
    assert "Resuming with num_train_steps=8 (the run so far had 6)" in out
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-8")
    record = json.loads(open(os.path.join(model_dir, run_folder.RECORD_FILE)).read())
    assert record["pretraining_config"]["num_train_steps"] == 8


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_damaged_checkpoint_is_named_and_the_run_resumes_from_the_one_before(
        finished_run, tmp_path, th):
    model_dir = copy_run(finished_run, tmp_path)
    flags = finished_run[2](model_dir)
    expected = th.checkpoint_weights(os.path.join(model_dir, "ckpt-6"))
    data = os.path.join(model_dir, "ckpt-6.data-00000-of-00001")
    cut(data, 0.5)  # a save cut short, e.g. by a full disk
    code, out = run(th, *flags)
    assert code == 0, out[-3000:]
    assert f"damaged checkpoint {data}: cut short (" in out
    assert f"Resumed from {model_dir}/ckpt-4 at step 4" in out
    # Exact resume: steps 5 and 6 again give the checkpoint that was damaged.
    redone = th.checkpoint_weights(os.path.join(model_dir, "ckpt-6"))
    assert set(redone) == set(expected)
    for name in expected:
        np.testing.assert_allclose(redone[name], expected[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)

    # Every checkpoint damaged: one line naming each, and nothing changes.
    cut(os.path.join(model_dir, "ckpt-6.index"), 0.5)
    flip_bit(os.path.join(model_dir, "ckpt-4.data-00000-of-00001"), 20_000)
    cut(os.path.join(model_dir, "ckpt-2.data-00000-of-00001"), 0.5)
    before = th.folder_hashes(model_dir)
    code, out = run(th, *flags)
    assert code == 1, out[-3000:]
    line = error_line(out)
    assert line.startswith(f"electra-pretrain: error: model_dir {model_dir} has no checkpoint that reads back "
                           f"({model_dir}/ckpt-6.index: unreadable index"), line
    assert f"{model_dir}/ckpt-4.data-00000-of-00001: checksum mismatch in tensor " in line
    assert f"{model_dir}/ckpt-2.data-00000-of-00001: cut short (" in line
    assert "Traceback" not in out
    assert th.folder_hashes(model_dir) == before


@pytest.mark.slow
@pytest.mark.multiprocess
def test_damaged_shards_stop_the_run_before_step_1_or_are_skipped_and_counted(
        damaged_shards, finished_run, tmp_path, pretrain_vocab, th):
    pattern, shards, offsets = damaged_shards
    model_dir = str(tmp_path / "run")
    code, out = run(th, *th.tiny_flags(pattern, pretrain_vocab, model_dir))
    assert code == 1, out[-3000:]
    assert error_line(out) == (
        f"electra-pretrain: error: damaged shard {shards[1]}: record 50 at byte {offsets[shards[1]][50]}: data "
        "checksum mismatch (damaged record data) (1 more damaged shard logged); "
        "--skip_corrupt_records trains without the damaged records")
    assert (f"damaged shard {shards[3]}: record 300 at byte {offsets[shards[3]][300]}: "
            "truncated: the record needs ") in out
    assert "Traceback" not in out
    assert not os.path.exists(model_dir)  # nothing was written

    # The same command with --skip_corrupt_records: the module's finished run.
    model_dir, out, _ = finished_run
    skipped = len(offsets[shards[1]]) - 50 + 1  # record 50 on, and the cut record 300
    assert f"skipping {skipped} records per pass over the data" in out
    assert re.search(rf"damaged shard {re.escape(shards[1])}: record 50 .*the shard is read up "
                     rf"to it, skipping the last [\d,]+ bytes \({skipped - 1} records\)", out)
    assert th.scalar_values(model_dir, "data/corrupt_records_skipped") == [
        (2, skipped), (4, skipped), (6, skipped)]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_shard_damaged_past_the_check_stops_the_run_in_one_line_after_a_checkpoint(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    """With --nocheck_shards (or a shard damaged during the run) the reader finds the damage:
    the steps done are saved, and the error names the shard."""
    for path in sorted(glob.glob(pretrain_shards)):
        shutil.copy(path, tmp_path)
    shard = sorted(glob.glob(str(tmp_path / "pretrain_data.tfrecord-*")))[0]
    with open(shard, "rb") as f:
        offsets = th.record_offsets(f.read())
    with open(shard, "r+b") as f:  # cut inside one of its last records: reached mid-run
        f.truncate(offsets[-15] + 40)
    model_dir = str(tmp_path / "run")
    code, out = run(th, *th.tiny_flags(str(tmp_path / "pretrain_data.tfrecord-*"),
                                       pretrain_vocab, model_dir, check_shards=False,
                                       num_train_steps=300, steps_per_loop=5,
                                       save_checkpoints_steps=30, summary_steps=30))
    assert code == 1, out[-3000:]
    line = error_line(out)
    found = re.fullmatch(r"electra-pretrain: error: damaged shard (.+): read (\d+) of (\d+) bytes, reached at step "
                         r"(\d+) \(latest checkpoint (.+)\); --skip_corrupt_records trains "
                         r"without its damaged part", line)
    assert found, line
    path, done, size, step, latest = found.groups()
    assert (path, int(done), int(size)) == (shard, offsets[-15], offsets[-15] + 40)
    assert 30 < int(step) < 300 and int(step) % 30, step  # not a periodic checkpoint's step
    assert latest == os.path.join(model_dir, f"ckpt-{step}")
    assert tf.train.latest_checkpoint(model_dir) == latest
    assert "Traceback" not in out
