"""electra_tf.files: replace-never-write-through, folders swapped in whole, one writer per folder,
a full disk as one line. Real files, real links, real processes (no mocks)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from electra_tf import files


def plant_link(path, tmp_path):
    """A link at `path` to a victim file outside the folder; returns the victim."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, path)
    return victim


def test_a_write_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = plant_link(out / "manifest.json", tmp_path)
    files.write_json(out / "manifest.json", {"a": 1})
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(out / "manifest.json")
    assert (out / "manifest.json").read_text() == '{\n  "a": 1\n}\n'
    assert sorted(os.listdir(out)) == ["manifest.json"]  # no temporary left behind


def test_a_link_at_the_old_temporary_name_is_never_followed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, out / "vocab.txt.tmp")
    files.write_text(out / "vocab.txt", "[PAD]\n")
    assert victim.read_text() == "precious\n"
    assert (out / "vocab.txt").read_text() == "[PAD]\n"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    files.write_text(path, "old\n")
    with pytest.raises(RuntimeError):
        with files.replacing(path) as f:
            f.write("half")
            raise RuntimeError("killed")
    assert path.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


def test_written_files_have_the_mode_of_a_plain_open(tmp_path):
    path = tmp_path / "config.json"
    files.write_text(path, "{}\n")
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~files.umask()


def test_a_staged_folder_replaces_the_old_one_whole_or_not_at_all(tmp_path):
    final = tmp_path / "best"
    final.mkdir()
    (final / "model").write_text("old")
    with pytest.raises(RuntimeError):
        with files.staged_folder(final) as staging:
            (staging / "model").write_text("half")
            raise RuntimeError("failed")
    assert (final / "model").read_text() == "old"
    with files.staged_folder(final) as staging:
        (staging / "model").write_text("new")
        assert (final / "model").read_text() == "old"  # not visible until complete
    assert (final / "model").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["best"]
    assert os.stat(final).st_mode & 0o777 == 0o777 & ~files.umask()


def test_exchange_swaps_two_folders_in_one_step(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("b")
    if not files.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.skip("this kernel has no renameat2(RENAME_EXCHANGE)")
    assert (tmp_path / "a" / "x").read_text() == "b"
    assert (tmp_path / "b" / "x").read_text() == "a"


def test_a_folder_caught_between_the_two_fallback_renames_is_recovered(tmp_path):
    final = tmp_path / "discriminator"
    previous = tmp_path / ".discriminator.previous-0123"
    previous.mkdir()
    (previous / "model").write_text("old")
    staging = tmp_path / ".discriminator.staging-abcd"
    staging.mkdir()
    files.recover_folder(final)
    assert (final / "model").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["discriminator"]


def test_stale_temporaries_of_killed_writers_are_removed(tmp_path):
    (tmp_path / "ckpt-6_temp").mkdir()
    (tmp_path / "ckpt-6_temp" / "part-00000-of-00001.data-00000-of-00001").write_text("x")
    (tmp_path / os.path.basename(files.temporary_name(tmp_path / "pretraining_config.json"))).write_text("x")
    (tmp_path / ".best.staging-xyz").mkdir()
    (tmp_path / "ckpt-4.index").write_text("keep")
    (tmp_path / "my_temp").mkdir()  # a user's: not a name electra_tf or TensorFlow gives
    (tmp_path / ".notes.tmp").write_text("keep")
    removed = files.remove_stale_temporaries(tmp_path)
    assert len(removed) == 3
    assert sorted(os.listdir(tmp_path)) == [".notes.tmp", "ckpt-4.index", "my_temp"]


HOLD = textwrap.dedent("""
    import sys, time
    from electra_tf import files
    lock = files.FolderLock(sys.argv[1], "holder").acquire()
    print("locked", flush=True)
    time.sleep(60)
""")


@pytest.mark.real_process  # the holder's pid, and kill -9: the command must die with the process held
def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holder_frees_the_folder(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(files.FolderInUseError) as e:
            files.FolderLock(folder, "second").acquire()
        assert str(e.value) == (f"{folder} is in use by another run (pid {holder.pid}); wait for it "
                                "to end or use another folder")
    finally:
        holder.kill()
        holder.wait()
    with files.FolderLock(folder, "third"):  # kill -9 left no stale lock
        with files.FolderLock(folder, "nested"):  # the same process may nest
            pass
    assert os.listdir(folder) == [files.LOCK_NAME]
    assert os.path.getsize(folder / files.LOCK_NAME) == 0  # never written: refusals change nothing


def test_a_link_planted_as_the_lock_file_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    victim = plant_link(folder / files.LOCK_NAME, tmp_path)
    with pytest.raises(files.FolderInUseError, match="is a symbolic link"):
        files.FolderLock(folder, "x").acquire()
    assert victim.read_text() == "precious\n"


def test_a_full_disk_is_recognised_from_python_and_tensorflow_errors(tmp_path):
    import tensorflow as tf

    message = files.disk_full_message(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x")))
    assert message.startswith(f"No space left on device writing {tmp_path / 'x'} (")
    assert "MiB free on that disk" in message
    error = tf.errors.ResourceExhaustedError(None, None, f"{tmp_path}/ckpt-2_temp/part-0; No space left on device")
    assert files.disk_full_message(error).startswith(f"No space left on device writing {tmp_path}/ckpt-2_temp/part-0")
    error = tf.errors.OutOfRangeError(None, None, f"{tmp_path}/shard.tmp; File too large")
    assert files.disk_full_message(error).startswith("File too large writing")
    assert files.disk_full_message(ValueError("bad value")) is None
    assert files.disk_full_message(OSError(errno.ENOENT, "missing")) is None
    # TensorFlow's text names the device first: the path is the file, not `/job:localhost/...`.
    error = tf.errors.ResourceExhaustedError(
        None, None, f"{{function_node __inference_save}} /job:localhost/replica:0/task:0/device:CPU:0 "
                    f"{tmp_path}/ckpt-3_temp/part-0; No space left on device")
    assert files.disk_full_message(error).startswith(f"No space left on device writing {tmp_path}/ckpt-3_temp/part-0 (")
    # Without a path in the text, the folder the caller names.
    error = tf.errors.ResourceExhaustedError(None, None, "/job:localhost/replica:0: No space left on device")
    assert files.disk_full_message(error, where=str(tmp_path)).startswith(f"No space left on device writing {tmp_path} (")
