"""One pretraining shard, built in a worker process (or in the builder's own for one process).

Step 2 of `shards.py`: shard s reads its units back by byte offset, tokenizes lines in batches
through the fused tf-text op, packs them with an `ExampleBuilder` seeded from
sha256(f"{seed}:{s}"), and writes a temporary created exclusively and written through the
worker's own descriptor (`_own_temporary`), its stats, then renames it onto the shard's name. A
worker ignores SIGINT, deletes its temporary on SIGTERM and exits by itself within
`ORPHAN_POLL_SECONDS` of the builder dying."""

from __future__ import annotations

import contextlib
import gzip
import os
import random
import signal
import stat
import tempfile
import threading
import time

from absl import logging

from electra_tf import files
from electra_tf.data.manifest import shard_name
from electra_tf.data.packing import ExampleBuilder, ExampleSerializer
from electra_tf.data.shard_config import (
    ORPHAN_POLL_SECONDS, STATS_DIR, TOKENIZE_BATCH_LINES, BuildConfig, _write_json_atomic, shard_seed)
from electra_tf.data.text_files import BadInputError, UnitIndex


_WORKER: dict = {}
# Held while a finished shard is committed (its stats written, then the shard renamed): a worker
# orphaned by the builder's death exits before a commit starts or after it ends, never in its
# middle, where it would leave the stats' temporary behind (`_exit_when_orphaned`).
_COMMIT = threading.Lock()


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


def _exit_when_orphaned(builder_pid: int, stop=None):
    # Polling works on every platform (prctl(PR_SET_PDEATHSIG) is Linux-only) and costs nothing.
    while os.getppid() == builder_pid:
        time.sleep(ORPHAN_POLL_SECONDS)
    with _COMMIT:  # not in the middle of a commit (a SIGTERM's builder cleans up after one)
        (stop or _stop_worker)()


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
        with _COMMIT:
            # Checked again here, not only at the start: a link planted since is refused.
            stats_dir = files.own_folder(os.path.join(config.output_dir, STATS_DIR))
            _write_json_atomic(os.path.join(stats_dir, f"{shard:05d}.json"), stats)
            os.fsync(fd)
            _rename_own_temporary(fd, tmp, final)  # a final name only for a complete shard
            renamed = True
            _WORKER["tmp"] = None
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
