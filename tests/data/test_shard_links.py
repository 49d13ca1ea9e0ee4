"""electra-build-data against a hostile or mistaken output folder, and shards whose token ids the
model's vocabulary cannot hold.

The rules pinned here: no file is written through a symbolic link planted at any name the builder
uses (before the run or while it runs), a shard's temporary swapped for a link is never written
through nor renamed onto the shard's name, a folder it makes inside --output_dir that is a link is
refused, and bad flags or output folders are refused in one line before any work. The binaries run
as real subprocesses on real files; refusals come before TensorFlow loads (about a second each).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from electra_tf.data.manifest import shard_name
from electra_tf.data.packing import parse_example

# Fresh interpreters, not preloaded forks (tests/preloaded.py): the binary stops itself
# (SIGSTOP) and is read in /proc.
pytestmark = pytest.mark.real_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_SHARDS = 4
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")

# The binary, stopped (SIGSTOP) as it opens its first shard's TFRecord writer: the moment between
# creating the shard's temporary file and writing it, when a link put at its name would be followed
# by a writer that opens by path.
_STOP_AT_FIRST_WRITER = """
import os, runpy, signal, sys
import tensorflow as tf
open_writer = tf.io.TFRecordWriter
def stop_then_open(path, *args, **kwargs):
    tf.io.TFRecordWriter = open_writer
    os.kill(os.getpid(), signal.SIGSTOP)
    return open_writer(path, *args, **kwargs)
tf.io.TFRecordWriter = stop_then_open
sys.argv = ["electra-build-data", *sys.argv[1:]]
runpy.run_module("electra_tf.tools.build_pretraining_data", run_name="__main__", alter_sys=True)
"""


def build_command(corpus, vocab_file, out, *extra, launcher=None) -> list[str]:
    start = ["-c", launcher] if launcher else ["-m", "electra_tf.tools.build_pretraining_data"]
    return [sys.executable, *start, f"--input={corpus}", f"--vocab_file={vocab_file}",
            f"--output_dir={out}", "--max_seq_length=64", f"--num_shards={NUM_SHARDS}",
            "--num_processes=1", "--progress_every=0", *extra]


def refusal(args, vocab_file, timeout=120) -> str:
    """The one line electra-build-data prints when it refuses `args` (asserted: exit 1, stderr
    that one line, no traceback)."""
    proc = subprocess.run([sys.executable, "-m", "electra_tf.tools.build_pretraining_data",
                           f"--vocab_file={vocab_file}", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert lines[0].startswith("electra-build-data: error: "), lines
    return lines[0]


class Victims:
    """Files outside the output folder, one per planted link, each with its own content."""

    def __init__(self, folder):
        self.folder = folder
        folder.mkdir()
        self.expected = {}

    def plant(self, path) -> bool:
        """A link at `path` to a new victim; False when something is there already."""
        if os.path.lexists(path):
            return False
        victim = self.folder / f"victim-{len(self.expected)}"
        content = f"precious {len(self.expected)} {path}\n".encode()
        victim.write_bytes(content)
        try:
            os.symlink(victim, path)
        except FileExistsError:
            victim.unlink()
            return False
        self.expected[victim] = content
        return True

    def assert_untouched(self):
        assert self.expected
        assert sorted(self.folder.iterdir()) == sorted(self.expected)  # no file appeared there
        for victim, content in self.expected.items():
            assert victim.read_bytes() == content, victim


def predictable_names(out) -> list:
    """Every name inside `out` the builder writes that a user can know in advance, with the fixed
    shard temporaries of earlier versions."""
    names = [out / "manifest.json", out / ".build_config.json"]
    for s in range(NUM_SHARDS):
        name = shard_name(s, NUM_SHARDS)
        names += [out / name, out / f".{name}.tmp", out / ".shard_stats" / f"{s:05d}.json"]
    return names


def wait_until_stopped(proc, timeout=180.0) -> None:
    end = time.time() + timeout
    while True:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert proc.poll() is None, f"ended before its first shard: {proc.stderr.read()[-3000:]}"
        assert time.time() < end, "never reached its first shard"
        time.sleep(0.01)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="watches the builder through /proc")
def test_links_at_every_name_before_and_during_a_build_and_a_swapped_temporary_are_never_followed(
        tmp_path, corpus_dir, vocab_file, helpers):
    out = tmp_path / "out"
    (out / ".shard_stats").mkdir(parents=True)
    victims = Victims(tmp_path / "victims")
    for path in predictable_names(out):
        assert victims.plant(path)

    # 1. Stopped at its first shard, the temporary it created is swapped for a link: the shard is
    # written into the file the builder created (never through the link), and since the name no
    # longer holds that file nothing is renamed onto the shard's name: one line, exit 1.
    command = build_command(corpus_dir, vocab_file, out, launcher=_STOP_AT_FIRST_WRITER)
    proc = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until_stopped(proc)
        first = shard_name(0, NUM_SHARDS)
        temporaries = [n for n in os.listdir(out)
                       if n.startswith(f".{first}.") and n != f".{first}.tmp"]
        assert len(temporaries) == 1 and temporaries[0].endswith(".tmp"), sorted(os.listdir(out))
        assert len(temporaries[0]) == len(f".{first}.") + 8 + len(".tmp")  # mkstemp's random part
        temporary = out / temporaries[0]
        assert os.path.isfile(temporary) and not os.path.islink(temporary)
        temporary.unlink()
        assert victims.plant(temporary)
        os.kill(proc.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    last = stderr.strip().splitlines()[-1]
    assert proc.returncode == 1, stderr[-3000:]
    assert last == (f"electra-build-data: error: {temporary}: the shard's temporary file was "
                    "replaced while it was written (another process writes in --output_dir?); "
                    "nothing was renamed onto the shard's name: rerun the same command once "
                    "nothing else writes there"), last
    assert "Traceback" not in stderr
    victims.assert_untouched()
    assert all(os.path.islink(out / shard_name(s, NUM_SHARDS)) for s in range(NUM_SHARDS))

    assert not os.path.lexists(temporary)  # the builder removed its name (the link, not its target)

    # 2. The same command again, while a thread keeps planting links at every name it can predict
    # (a name the builder removed or has not written yet gets a new link at once).
    done = threading.Event()
    planted = []

    def keep_planting():
        while not done.is_set():
            for path in predictable_names(out):
                if victims.plant(path):
                    planted.append(path)
            time.sleep(0.001)

    planter = threading.Thread(target=keep_planting, daemon=True)
    planter.start()
    try:
        proc = subprocess.run(build_command(corpus_dir, vocab_file, out), cwd=REPO, env=ENV,
                              capture_output=True, text=True, timeout=300)
    finally:
        done.set()
        planter.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # It removed the links at the old fixed temporaries at its start, and the thread put new ones.
    assert any(path.name.endswith("-of-00004.tmp") for path in planted), planted
    victims.assert_untouched()
    manifest = json.loads((out / "manifest.json").read_text())
    for path in [out / "manifest.json", out / ".build_config.json", *(
            out / ".shard_stats" / f"{s:05d}.json" for s in range(NUM_SHARDS))]:
        assert os.path.isfile(path) and not os.path.islink(path), path
    for s, stats in enumerate(manifest["shards"]):
        path = out / shard_name(s, NUM_SHARDS)
        assert os.path.isfile(path) and not os.path.islink(path), path
        assert len(helpers.read_records(path)) == stats["examples"] > 0
    # No temporary of the builder is left (only the thread's links at the old fixed names).
    left = [n for n in os.listdir(out) if n.endswith(".tmp") and not os.path.islink(out / n)]
    assert left == []


def test_a_link_or_a_file_at_the_stats_folder_is_refused_in_one_line(tmp_path, corpus_dir,
                                                                     vocab_file):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine\n")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(target, out / ".shard_stats")
    line = refusal([f"--input={corpus_dir}", f"--output_dir={out}"], vocab_file)
    assert line == (f"electra-build-data: error: {out / '.shard_stats'} is a symbolic link; "
                    "electra_tf does not write through links (remove it or give another folder)")
    assert sorted(os.listdir(target)) == ["keep.txt"]  # no 00000.json, nothing else
    assert (target / "keep.txt").read_text() == "mine\n"
    assert sorted(os.listdir(out)) == [".shard_stats"]  # nothing written, not even the lock

    os.unlink(out / ".shard_stats")
    (out / ".shard_stats").write_text("a file\n")
    line = refusal([f"--input={corpus_dir}", f"--output_dir={out}"], vocab_file)
    assert line.endswith(f"{out / '.shard_stats'} exists and is not a folder"), line
    assert (out / ".shard_stats").read_text() == "a file\n"


def test_bad_flags_and_output_folders_are_refused_in_one_line_before_any_work(
        tmp_path, corpus_dir, vocab_file):
    corpus = os.path.join(corpus_dir, "part-0.txt")
    out = tmp_path / "out"
    good = [f"--input={corpus}", f"--output_dir={out}"]
    # Ranges, by absl before the command starts: a negative or too large shard count, a sequence
    # length too short for [CLS] A [SEP] B [SEP] or so long that padding fills the memory.
    for flag, message in [
            ("--num_shards=-1", "-1 is not an integer in the range [0, 99999]"),
            ("--num_shards=100000", "100000 is not an integer in the range [0, 99999]"),
            ("--max_seq_length=4", "4 is not an integer in the range [5, 65536]"),
            ("--max_seq_length=1000000000", "1000000000 is not an integer in the range [5, 65536]"),
            ("--num_processes=-1", "-1 is not a non-negative integer")]:
        assert refusal([*good, flag], vocab_file) == \
            f"electra-build-data: error: flag {flag}: {message}"
    # Inputs and output folders, by the builder before it loads TensorFlow.
    (tmp_path / "a_file").write_text("x\n")
    for args, message in [
            ([f"--input={tmp_path / 'nothing'}*.txt", f"--output_dir={out}"],
             f"--input: {tmp_path / 'nothing'}*.txt: no such file, directory or matching glob"),
            ([f"--input={corpus}", f"--output_dir={corpus}"],
             f"--output_dir {corpus} is not a folder: it is the --input file {corpus}"),
            ([f"--input={corpus}", f"--output_dir={tmp_path / 'a_file'}"],
             f"--output_dir {tmp_path / 'a_file'} is not a folder: it is a file"),
            ([f"--input={corpus}", f"--output_dir={tmp_path / 'a_file' / 'sub'}"],
             f"--output_dir {tmp_path / 'a_file' / 'sub'} is not a folder ({tmp_path / 'a_file'} "
             "is a file)"),
            ([f"--input={corpus_dir}", f"--output_dir={corpus_dir}"],
             f"--output_dir {corpus_dir} is the --input folder {corpus_dir}: a rerun would read "
             "the shards as text; put them elsewhere"),
            ([f"--input={corpus_dir}", f"--output_dir={corpus_dir}/shards"],
             f"--output_dir {corpus_dir}/shards is inside the --input folder {corpus_dir}: a "
             "rerun would read the shards as text; put them elsewhere"),
            ([f"--input={corpus}", "--output_dir="], "--output_dir is empty; give the folder the "
             "shards go to")]:
        assert refusal(args, vocab_file) == f"electra-build-data: error: {message}"
    assert not out.exists()
    assert sorted(os.listdir(corpus_dir)) == ["part-0.txt", "part-1.txt"]
    assert (tmp_path / "a_file").read_text() == "x\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only (chmod 0555) folder; "
                    "the file-as-folder cases of the test above cover a folder that cannot be "
                    "written")
def test_an_unwritable_output_folder_is_refused_in_one_line(tmp_path, corpus_dir, vocab_file):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        corpus = os.path.join(corpus_dir, "part-0.txt")
        assert refusal([f"--input={corpus}", f"--output_dir={locked}"], vocab_file) == (
            f"electra-build-data: error: --output_dir {locked} is not writable (Permission denied)")
        assert refusal([f"--input={corpus}", f"--output_dir={locked / 'sub'}"], vocab_file) == (
            f"electra-build-data: error: --output_dir {locked / 'sub'} cannot be created: "
            f"{locked} is not writable")
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o755)


def test_pretraining_refuses_shards_with_ids_past_the_model_vocabulary_in_one_line(
        tmp_path, built_shards, helpers):
    """Shards built with the data tests' vocabulary (about 700 tokens) and no manifest.json to say
    so, pretrained with a 200-token model: before, step 1 died with a traceback from the
    embedding lookup."""
    out, _ = built_shards
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in sorted(os.listdir(out)):
        if name.startswith("pretrain_data.tfrecord-"):
            shutil.copy(os.path.join(out, name), shards)
    model_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "electra_tf.tools.pretrain", "--config=electra_tiny",
         "--override=vocab_size=200", f"--data={shards}/pretrain_data.tfrecord-*",
         f"--model_dir={model_dir}", "--max_seq_length=64", "--train_batch_size=2",
         "--num_train_steps=1", "--num_warmup_steps=0", "--steps_per_loop=1"],
        cwd=REPO, env=dict(ENV, TF_NUM_INTRAOP_THREADS="1"), capture_output=True, text=True,
        timeout=300)
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith("electra-pretrain: error: ")]
    assert proc.returncode == 1 and len(errors) == 1, output[-3000:]
    ids = [[parse_example(r)["input_ids"] for r in helpers.read_records(shards / shard_name(s, 4))]
           for s in range(4)]
    record = next(i for i, row in enumerate(ids[0]) if max(row) >= 200)
    more = sum(max(map(max, shard)) >= 200 for shard in ids[1:])
    assert more == 3  # (every shard holds words past the 200th token of the vocabulary)
    assert errors[0] == (
        f"electra-pretrain: error: {shards / shard_name(0, 4)}: record {record} has token id {max(ids[0][record])}, "
        "outside the model's vocabulary (vocab_size=200; the largest id in this shard is "
        f"{max(map(max, ids[0]))}; 3 more shards have such ids): the shards were built with "
        "another vocabulary; give it with --vocab_file")
    assert "Traceback" not in output
    assert not model_dir.exists()
