"""tf.data input pipeline for pretraining shards (ours or the original tool's: same features).

Per input pipeline (one per worker under a `tf.distribute.InputContext`), one reader for the
training loop, the benchmarks and evaluation:

  sorted files -> shard by file (when there are at least as many files as pipelines) ->
  epochs: the file list shuffled by (seed, epoch) -> deterministic parallel interleave of TFRecord
  readers -> shard by element (when there are fewer files than pipelines) -> seeded shuffle
  buffer -> skip to `start_step` -> batch (per-replica size) -> parse -> int32 -> prefetch.
  Parallelism is fixed (files read side by side: the cycle length; batches parsed: 4, as the
  authors' reader), not autotuned (`untuned`: an autotuned iterator's end waits for the tuner).
  The stream is a function of (files, seed), so a resumed run reads what it would have read
  (`pretraining_dataset`).

Corrupt or truncated shards: TFRecordDataset's DataLossError does not say which file failed, so
every file is read through a checker: records are counted in bytes (length + 16 bytes of
framing) and compared with the file size at the file's end. A mismatch raises an
InvalidArgumentError whose message names the file ("corrupt or truncated TFRecord shard <path>"),
or, with `skip_corrupt=True`, prints a warning naming the file to stderr and goes on with the next
file (records before the damage are kept). Before anything runs, each file's first record is also
checked in Python for the three features at `seq_length`, so a shard built with another
--max_seq_length fails fast, naming the file.

`check_shards` reads every record of every shard once before a run (C++ reader for framing and
CRCs, `parse_example` for the features), so damage is found before step 1 and named by record
index and byte offset; it also counts what a skipping reader loses. Given the model's vocab_size
it also refuses token ids outside the vocabulary (shards built with a bigger one), which would
otherwise fail at step 1 as an embedding lookup out of range.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import threading
import time
from typing import NamedTuple, Sequence

import tensorflow as tf
from absl import logging

from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.data.manifest import MANIFEST, SHARD_PREFIX, listed_shards
from electra_tf.files import is_remote
from electra_tf.progress import format_duration

_RECORD_OVERHEAD = 16  # TFRecord framing: u64 length, u32 length crc, u32 data crc

# Batches parsed side by side, as the authors' reader (`pretrain_data.get_input_fn`:
# `map_and_batch(num_parallel_batches=num_cpu_threads)`, num_cpu_threads=4).
PARSE_CALLS = 4
PREFETCH_BATCHES = 2


def untuned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuner off; its parallelism is whatever its stages give.

    An autotuned iterator's destructor waits for the autotuner's thread to wake up, and the thread
    sleeps longer between rounds the longer the iterator lives (up to a minute). Seen in `gdb`
    (`~RootDataset::Iterator` waiting on the thread): the end of a pretraining run, of its
    step-path probe or of a fine-tuning run stood still up to ~60 s with no CPU used
    (docs/benchmarks.md, "An iterator's end waits for tf.data's autotuner"). Every pipeline of
    the package runs untuned, with its parallelism given explicitly.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


_DEVICE_BUFFERS_LOCK = threading.Lock()


def distributed_iterator(strategy: tf.distribute.Strategy, source):
    """`iter` of `source` distributed by `strategy`, untuned down to each device's buffer.

    `source` is a dataset (`experimental_distribute_dataset`) or a function of an InputContext
    (`distribute_datasets_from_function`); pass it untuned. A strategy's iterator feeds each
    device through a dataset of its own that TensorFlow builds with default options
    (`_create_device_dataset` of tensorflow/python/data/ops/multi_device_iterator_ops.py, no
    option reaches it), so freeing the iterator still waited for those datasets' autotuners: 35 s
    once at the end of a one-device run (`gdb`: `Model::OptimizeLoop` in the joined thread). That
    function is wrapped while the iterator is made, when the strategy's devices are CPUs (the
    options op is not placed on accelerators; those keep TensorFlow's buffers); a TensorFlow
    without the function is left alone.
    """
    from tensorflow.python.data.ops import multi_device_iterator_ops as device_buffers

    make = getattr(device_buffers, "_create_device_dataset", None)
    if callable(source) and not isinstance(source, tf.data.Dataset):
        distributed = strategy.distribute_datasets_from_function(source)
    else:
        distributed = strategy.experimental_distribute_dataset(source)
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: no device buffers
        devices = ()
    on_cpus = bool(devices) and all(tf.DeviceSpec.from_string(d).device_type == "CPU"
                                    for d in devices)
    if make is None or not on_cpus:
        return iter(distributed)
    with _DEVICE_BUFFERS_LOCK:  # one wrapper at a time, the original always put back
        device_buffers._create_device_dataset = lambda *args, **kwargs: untuned(make(*args, **kwargs))
        try:
            return iter(distributed)
        finally:
            device_buffers._create_device_dataset = make


class CorruptShardError(ValueError):
    """A shard cannot be read as pretraining data; the message names the file."""


def list_shards(file_pattern: str | Sequence[str]) -> list[str]:
    """Comma-separated globs or folders (or a list of them) -> sorted shard files.

    A folder stands for the shards its manifest.json lists (the folder `electra-build-data`
    wrote), or, without one, its `pretrain_data.tfrecord-*` files (the authors' tool's names).
    What a wildcard matches is read as a shell would: no hidden entries (an interrupted build's
    `.pretrain_data.tfrecord-*.tmp` files, `.shard_stats/`) unless the pattern's last part starts
    with a dot, no manifest.json and, on a local disk, no folders, so `DIR/*` is the shards of
    DIR. A pattern that leaves nothing raises FileNotFoundError naming it.
    """
    patterns = file_pattern.split(",") if isinstance(file_pattern, str) else list(file_pattern)
    files = set()
    for pattern in patterns:
        pattern = pattern.strip()
        matched = _pattern_files(pattern) if pattern else []
        if not matched:
            raise FileNotFoundError(f"{pattern or file_pattern!r}: no pretraining shards match")
        files.update(matched)
    return sorted(files)


def _pattern_files(pattern: str) -> list[str]:
    """The shard files one --data pattern names (see `list_shards`)."""
    magic = any(c in pattern for c in "*?[")
    if not magic and tf.io.gfile.isdir(pattern):
        listed = listed_shards(pattern)
        files = listed if listed is not None else _pattern_files(os.path.join(pattern, SHARD_PREFIX + "-*"))
        if not files:
            raise FileNotFoundError(f"{pattern!r}: a folder with neither a {MANIFEST} nor "
                                    f"{SHARD_PREFIX}-* shards in it; give a glob of its shards")
        return files
    if not magic:
        return tf.io.gfile.glob(pattern)  # a file named in full is read whatever its name
    hidden_ok = os.path.basename(pattern).startswith(".")
    # Folders are told apart on local disks only: on a remote filesystem (gs://...) each check
    # would be one more request per matched shard.
    local = not is_remote(pattern)
    return [f for f in tf.io.gfile.glob(pattern)
            if (hidden_ok or not os.path.basename(f).startswith("."))
            and os.path.basename(f) != MANIFEST and not (local and os.path.isdir(f))]


def _example_features(seq_length: int) -> dict:
    """The `tf.io.parse_example` spec of a pretraining example: three int64 [seq_length]."""
    return {n: tf.io.FixedLenFeature([seq_length], tf.int64) for n in INPUT_KEYS}


def _example_problem(serialized: bytes, seq_length: int) -> str | None:
    """Why a record is not a pretraining example at `seq_length` (None if it is one)."""
    try:
        example = tf.train.Example.FromString(serialized)
    except Exception as e:  # protobuf DecodeError
        return f"not a tf.train.Example ({e})"
    for name in INPUT_KEYS:
        feature = example.features.feature.get(name)
        if feature is None:
            return f"no feature {name!r}; not a pretraining shard"
        n = len(feature.int64_list.value)
        if n != seq_length:
            return (f"feature {name!r} has length {n}, expected seq_length={seq_length} (built "
                    "with another --max_seq_length?)")
    return None


def _check_first_record(path: str, seq_length: int, on_damage: str = "raise") -> None:
    """Raises CorruptShardError if the shard's first record is no pretraining example at
    `seq_length`: a shard of another length or kind fails in seconds. A first record that cannot
    be read raises too (`on_damage="raise"`), is named in a warning ("warn": the reader skips the
    damage), or is left to `check_shards`' search for the damage ("locate")."""
    try:
        first = next(iter(untuned(tf.data.TFRecordDataset(path).take(1))), None)
    except tf.errors.OpError as e:
        if on_damage == "locate":
            return
        if not isinstance(e, tf.errors.DataLossError):
            raise
        if on_damage == "warn":
            logging.warning("%s: corrupt TFRecord shard (%s); it will be skipped", path, e.message)
            return
        raise CorruptShardError(f"{path}: corrupt or truncated TFRecord shard ({e.message})") \
            from None
    if first is None:
        return  # an empty shard is valid (a tiny corpus over many shards)
    problem = _example_problem(first.numpy(), seq_length)
    if problem:
        raise CorruptShardError(f"{path}: {problem} (first record)")


# `_checked_records`' message when a shard ends short of its size.
_DAMAGED_SHARD = re.compile(r"corrupt or truncated TFRecord shard (.+?): read (\d+) of (\d+) bytes")


def damaged_shard(error: tf.errors.OpError) -> tuple[str, str, str] | None:
    """(path, bytes read, bytes in the file) when `error`, raised while reading the dataset, is
    `_checked_records`' damaged-shard assertion; else None."""
    found = _DAMAGED_SHARD.search(error.message)
    return found.groups() if found else None


def _checked_records(path, size, skip_corrupt: bool) -> tf.data.Dataset:
    """Records of one file; at its end, bytes read are compared with its size (see module doc).

    The bookkeeping runs on blocks of records, not per record: per-record scan/filter steps cost
    ~10x the reader's throughput.
    """
    blocks = tf.data.TFRecordDataset(path).ignore_errors(log_warning=False).batch(256)
    blocks = blocks.map(lambda b: (b, False))
    end_marker = (tf.constant([], tf.string), True)
    blocks = blocks.concatenate(tf.data.Dataset.from_tensors(end_marker))

    def count(total, block):
        records, is_end = block
        sizes = tf.cast(tf.strings.length(records), tf.int64) + _RECORD_OVERHEAD
        total += tf.reduce_sum(sizes)
        return total, (records, is_end, total)

    def check(records, is_end, total):
        ok = tf.logical_or(tf.logical_not(is_end), tf.equal(total, size))
        message = tf.strings.join([
            "corrupt or truncated TFRecord shard ", path, ": read ",
            tf.strings.as_string(total), " of ", tf.strings.as_string(size), " bytes",
        ])
        if skip_corrupt:
            def warn():
                tf.print("WARNING:", message, "; skipping the rest of it",
                         output_stream=sys.stderr)
                return tf.constant(True)
            tf.cond(ok, lambda: tf.constant(True), warn)
            return records
        with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
            return tf.identity(records)

    blocks = blocks.scan(tf.constant(0, tf.int64), count).map(check)
    return blocks.unbatch()


# ---- checking every record before a run -------------------------------------------------------
_CHECK_BATCH = 512  # records per parse_example call of the check


class ShardDamage(NamedTuple):
    """The first record of a shard that cannot be read; readers stop there (see check_shards)."""

    path: str
    record: int  # its index: the shard's readable records are the ones before it
    offset: int  # its byte offset
    problem: str
    records_skipped: int  # it and the records framed after it: what a skipping reader loses
    bytes_skipped: int  # from it to the end of the file
    exact: bool  # False when a damaged header hides where the records after it start

    def __str__(self) -> str:
        return f"{self.path}: record {self.record} at byte {self.offset}: {self.problem}"

    def skipped_description(self) -> str:
        """'the last 1,234 bytes (5 records)' for a log line."""
        records = f"{self.records_skipped} record{'s' if self.records_skipped > 1 else ''}"
        return (f"the last {self.bytes_skipped:,} bytes ({records}"
                f"{'' if self.exact else ' or more'})")


class ShardCheck(NamedTuple):
    """What `check_shards` found."""

    files: int
    records: int  # readable records, i.e. one pass over the data
    bytes: int
    seconds: float
    damaged: tuple[ShardDamage, ...]  # in file order

    @property
    def records_skipped(self) -> int:
        return sum(d.records_skipped for d in self.damaged)


def check_shards(file_pattern: str | Sequence[str], seq_length: int, skip_corrupt: bool = False,
                 log_every_seconds: float = 10.0, vocab_size: int | None = None) -> ShardCheck:
    """Reads every record of every shard once, so that damage is found before step 1.

    Framing and both CRC32Cs of every record are checked by TFRecordDataset's C++ reader, and
    every record is parsed as a pretraining tf.Example with the three features at `seq_length`
    (`tf.io.parse_example`, in batches). Bytes read (payload + 16 bytes of framing per record) are
    compared with each file's size, which also catches a file cut inside a record header (the
    reader takes that for a clean end). Shards are read in parallel, one per CPU core; progress
    with rate and ETA is logged every `log_every_seconds`.

    A shard that falls short is read again alone, record by record, to name the first bad record
    (index and byte offset) and what is wrong with it (its CRCs are recomputed in Python to tell
    a damaged header from damaged data). Readers stop at a shard's first damaged record
    (TFRecordDataset cannot find the next record after a bad length), so with `skip_corrupt` that
    record and the ones framed after it are skipped: each damaged shard is logged as a warning
    and counted in `records_skipped`. Without it, every damaged shard is logged and
    CorruptShardError names the first. A record that reads back intact but is not a pretraining
    example at `seq_length` is an error either way: that is the wrong data, not damage.

    With `vocab_size` (the model's), a token id outside [0, vocab_size) is such an error too,
    naming the file, the first record holding one, its largest id and vocab_size: shards built
    with a bigger vocabulary, which no manifest.json described, failed at step 1 with a
    traceback from the embedding lookup.
    """
    files = list_shards(file_pattern)
    for path in files:  # a shard of another length or kind fails in seconds, not after the scan
        _check_first_record(path, seq_length, "locate")
    sizes = [tf.io.gfile.stat(f).length for f in files]
    total = sum(sizes)
    features = _example_features(seq_length)

    def summarize(index, records):  # -> (file index, records, bytes, real tokens, id range)
        parsed = tf.io.parse_example(records, features)  # fails on a record that is no example
        tokens = tf.reduce_sum(parsed["input_mask"])  # consumes the parse, so it is not pruned
        size = tf.reduce_sum(tf.cast(tf.strings.length(records), tf.int64))
        n = tf.size(records, out_type=tf.int64)
        ids = parsed["input_ids"]  # [records, seq]
        return (index, n, size + n * _RECORD_OVERHEAD, tokens, tf.reduce_min(ids),
                tf.reduce_max(ids))

    def shard_blocks(index, path):
        # Damage ends a shard's records early and a block that does not parse is dropped: either
        # way the shard's byte count falls short of its size, and it is located below.
        blocks = tf.data.TFRecordDataset(path, buffer_size=1 << 20).ignore_errors(
            log_warning=False).batch(_CHECK_BATCH)
        blocks = blocks.map(lambda records: summarize(index, records))
        return blocks.ignore_errors(log_warning=False)

    d = tf.data.Dataset.from_tensor_slices((tf.range(len(files), dtype=tf.int64),
                                            tf.constant(files)))
    parallel = max(1, min(len(files), os.cpu_count() or 1))
    d = untuned(d.interleave(shard_blocks, cycle_length=parallel, num_parallel_calls=parallel,
                             deterministic=False))
    read, counts = [0] * len(files), [0] * len(files)
    smallest, largest = [0] * len(files), [0] * len(files)  # token ids
    start = last_log = time.time()
    done = 0
    for index, n, size, _, low, high in d.prefetch(4).as_numpy_iterator():
        read[index] += size
        counts[index] += n
        smallest[index], largest[index] = min(smallest[index], low), max(largest[index], high)
        done += size
        now = time.time()
        if now - last_log >= log_every_seconds:
            rate = done / (now - start)
            logging.info("checking shards: %.1f/%.1f MB (%.1f%%), %.1f MB/s, ETA %s",
                         done / 1e6, total / 1e6, 100.0 * done / max(total, 1), rate / 1e6,
                         format_duration((total - done) / rate if rate else float("inf")))
            last_log = now
    damaged = []
    for index, path in enumerate(files):
        if read[index] != sizes[index]:
            damage = _locate_damage(path, sizes[index], seq_length)
            if damage is not None:
                damaged.append(damage)
                counts[index] = damage.record
    seconds = time.time() - start
    result = ShardCheck(len(files), int(sum(counts)), total, seconds, tuple(damaged))
    logging.info("checked %d shards: %d records, %.1f MB in %.1fs (%.1f MB/s)", len(files),
                 result.records, total / 1e6, seconds, total / 1e6 / max(seconds, 1e-9))
    _report_damage(damaged, skip_corrupt)
    if vocab_size is not None:
        outside = [i for i in range(len(files)) if largest[i] >= vocab_size or smallest[i] < 0]
        if outside:
            raise CorruptShardError(_out_of_vocabulary(
                files[outside[0]], seq_length, vocab_size, int(largest[outside[0]]),
                len(outside) - 1))
    return result


def _out_of_vocabulary(path: str, seq_length: int, vocab_size: int, largest: int,
                       more: int) -> str:
    """The refusal of a shard with token ids outside [0, vocab_size): the first record holding
    one (read again, on this error path only), its largest id, the shard's and vocab_size."""
    features = {"input_ids": tf.io.FixedLenFeature([seq_length], tf.int64)}
    record, found = 0, None
    records = tf.data.TFRecordDataset(path).ignore_errors(log_warning=False)
    for batch in records.batch(_CHECK_BATCH):
        ids = tf.io.parse_example(batch, features)["input_ids"].numpy()  # [batch, seq]
        bad = ((ids >= vocab_size) | (ids < 0)).any(axis=1).nonzero()[0]
        if len(bad):
            record, row = record + int(bad[0]), ids[bad[0]]
            found = int(row.max()) if row.max() >= vocab_size else int(row.min())
            break
        record += len(ids)
    others = f"; {more} more shard{'s have' if more > 1 else ' has'} such ids" if more else ""
    return (f"{path}: record {record} has token id {found}, outside the model's vocabulary "
            f"(vocab_size={vocab_size}; the largest id in this shard is {largest}{others}): the "
            "shards were built with another vocabulary; give it with --vocab_file")


def _report_damage(damaged: list, skip_corrupt: bool) -> None:
    """Logs every damaged shard: as a warning when the run skips the damage, else as errors,
    raising CorruptShardError for the first."""
    if skip_corrupt:
        for damage in damaged:
            logging.warning("damaged shard %s; --skip_corrupt_records: the shard is read up to "
                            "it, skipping %s", damage, damage.skipped_description())
    elif damaged:
        for damage in damaged[1:]:  # the first is the error's message
            logging.error("damaged shard %s", damage)
        more = len(damaged) - 1
        more = f" ({more} more damaged shard{'s' if more > 1 else ''} logged)" if more else ""
        raise CorruptShardError(f"damaged shard {damaged[0]}{more}; --skip_corrupt_records "
                                "trains without the damaged records")


def _locate_damage(path: str, size: int, seq_length: int) -> ShardDamage | None:
    """The first record of `path` that cannot be read (None if the whole file reads back).

    Whole batches first, then record by record from the batch that failed. Raises
    CorruptShardError for an intact record that is not a pretraining example.
    """
    features = _example_features(seq_length)
    record = offset = 0
    batches = iter(tf.data.TFRecordDataset(path).batch(_CHECK_BATCH))
    while True:
        try:
            batch = next(batches)
            tf.io.parse_example(batch, features)
        except (StopIteration, tf.errors.OpError):
            break
        record += len(batch)
        offset += int(tf.reduce_sum(tf.strings.length(batch))) + len(batch) * _RECORD_OVERHEAD
    records = iter(tf.data.TFRecordDataset(path).skip(record))
    while True:
        try:
            serialized = next(records).numpy()
        except (StopIteration, tf.errors.OpError):
            break
        problem = _example_problem(serialized, seq_length)
        if problem:
            raise CorruptShardError(f"{path}: record {record} at byte {offset}: {problem}")
        record += 1
        offset += len(serialized) + _RECORD_OVERHEAD
    if offset == size:
        return None  # it reads back whole now: the first read failed for another reason
    problem, skipped, exact = _framing_problem(path, offset, size)
    return ShardDamage(path, record, offset, problem, skipped, size - offset, exact)


def _framing_problem(path: str, offset: int, size: int) -> tuple[str, int, bool]:
    """What is wrong with the record framed at `offset`; the records a reader stopping there
    skips (it and the complete records framed after it: headers checked, data not); and whether
    that framing reached the end of the file."""
    with tf.io.gfile.GFile(path, "rb") as f:
        f.seek(offset)
        header = f.read(12)
        if len(header) < 12:
            return f"the file ends {len(header)} bytes into a record header (truncated)", 1, True
        length, length_crc = struct.unpack("<QI", header)
        if _masked_crc32c(header[:8]) != length_crc:
            return "length checksum mismatch (damaged record header; the rest of the file " \
                "cannot be framed)", 1, False
        left = size - offset - 12
        if length + 4 > left:
            return (f"truncated: the record needs {length + 4} more bytes, the file has "
                    f"{left}"), 1, True
        data = f.read(length)
        (data_crc,) = struct.unpack("<I", f.read(4))
        if _masked_crc32c(data) != data_crc:
            problem = "data checksum mismatch (damaged record data)"
        else:
            problem = "unreadable record (its checksums match when read again: a read error?)"
        skipped, end = 1, f.tell()
        while end < size:
            header = f.read(12)
            if len(header) < 12:
                break
            length, length_crc = struct.unpack("<QI", header)
            if _masked_crc32c(header[:8]) != length_crc or end + 16 + length > size:
                break
            end += 16 + length
            f.seek(end)
            skipped += 1
        return problem, skipped, end == size


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # Castagnoli, reflected
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C, in Python: for one record on the error path only (the check
    leaves the bulk to TFRecordDataset's C++ reader; Python runs at a few MB/s)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _pipeline_files(file_pattern, input_context) -> tuple[list[str], bool]:
    """This pipeline's files, and whether the pipelines split the files (else the examples)."""
    files = list_shards(file_pattern)
    num = input_context.num_input_pipelines if input_context else 1
    index = input_context.input_pipeline_id if input_context else 0
    by_file = len(files) >= num
    return (files[index::num] if by_file and num > 1 else files), by_file


def _start_of_stream(file_pattern, files, by_file: bool, input_context, batch_size: int,
                     start_step: int) -> tuple[int, int]:
    """(epoch, examples into it) where the training stream of `start_step` begins."""
    num_pipelines = input_context.num_input_pipelines if input_context else 1
    position = start_step * (batch_size // num_pipelines)
    if not position:
        return 0, 0
    epoch_size = _records_per_epoch(files, by_file, input_context)
    if epoch_size == 0:
        raise ValueError(f"{file_pattern}: no examples for input pipeline "
                         f"{input_context.input_pipeline_id if input_context else 0}")
    return divmod(position, epoch_size)


def _records_per_epoch(files, by_file: bool, input_context) -> int:
    """Examples one pipeline reads per epoch: a damaged shard counts up to its first damaged
    record (the reader moves on to the next file there, as `_checked_records` does)."""
    records = tf.data.TFRecordDataset(files).ignore_errors(log_warning=False)
    count = int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    if by_file or input_context is None or input_context.num_input_pipelines == 1:
        return count
    num, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    return len(range(index, count, num))


def pretraining_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    seq_length: int,
    input_context: tf.distribute.InputContext | None = None,
    is_training: bool = True,
    seed: int = 0,
    start_step: int = 0,
    skip_corrupt: bool = False,
    cycle_length: int = 4,
    shuffle_buffer: int = 1000,
    drop_remainder: bool = True,
) -> tf.data.Dataset:
    """Pretraining examples as {input_ids, input_mask, segment_ids}: int32 [batch, seq_length].

    Training reads a stream that is a deterministic function of (files, seed), so a run resumed at
    step s reads what the uninterrupted run read from step s on: epoch e reads the pipeline's files
    in an order shuffled by (seed, e), interleaved deterministically, through a shuffle buffer
    seeded by `seed`. `start_step` starts the stream at example start_step * batch_size /
    pipelines: at epoch floor(position / epoch size), skipping the rest of it, so a resume reads
    at most one epoch of raw records (the epoch size is counted on resume only). Nothing about
    the position is stored, so checkpoints stay valid if the input files move.

    Args:
      file_pattern: glob, comma-separated globs, or a list of globs.
      batch_size: the global batch size; with `input_context` each pipeline yields
        `input_context.get_per_replica_batch_size(batch_size)`.
      seq_length: the shards' max_seq_length.
      input_context: from `strategy.distribute_datasets_from_function`; every example is read by
        exactly one pipeline per epoch (by file when files >= pipelines, else by element).
      is_training: the repeated, shuffled stream above; False reads each example of this
        pipeline's part once, in file order.
      seed: for the shuffles of the training stream.
      start_step: the optimizer step the training stream starts at.
      skip_corrupt: warn about and skip the damaged part of corrupt shards instead of failing.
      drop_remainder: keep batch shapes static (needed on TPU and by the training loop).
    """
    files, by_file = _pipeline_files(file_pattern, input_context)
    for path in files:
        _check_first_record(path, seq_length, "warn" if skip_corrupt else "raise")
    names = tf.constant(files)
    sizes = tf.constant([tf.io.gfile.stat(f).length for f in files], tf.int64)
    num_pipelines = input_context.num_input_pipelines if input_context else 1

    def records(order) -> tf.data.Dataset:  # this pipeline's part of the files, in `order`
        d = tf.data.Dataset.from_tensor_slices((tf.gather(names, order), tf.gather(sizes, order)))
        cycle = max(1, min(cycle_length, len(files)))  # files read side by side
        d = d.interleave(lambda path, size: _checked_records(path, size, skip_corrupt),
                         cycle_length=cycle, block_length=1, num_parallel_calls=cycle,
                         deterministic=True)
        if not by_file and num_pipelines > 1:
            d = d.shard(num_pipelines, input_context.input_pipeline_id)
        return d

    def epoch(e) -> tf.data.Dataset:
        order = tf.random.experimental.stateless_shuffle(
            tf.range(len(files)), tf.stack([tf.constant(seed, tf.int64), e]))
        # tf.data takes only a Python seed here: each epoch's buffer draws the same permutation
        # pattern, applied to that epoch's own file order.
        return records(order).shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)

    if is_training:
        first_epoch, offset = _start_of_stream(file_pattern, files, by_file, input_context,
                                               batch_size, start_step)
        d = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch).skip(offset)
    else:
        d = records(tf.range(len(files)))

    features = _example_features(seq_length)

    def parse(serialized):  # [batch] serialized -> dict of int32 [batch, seq_length]
        parsed = tf.io.parse_example(serialized, features)
        return {n: tf.cast(parsed[n], tf.int32) for n in INPUT_KEYS}

    per_replica_batch = (
        input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size)
    d = d.batch(per_replica_batch, drop_remainder=drop_remainder)
    d = d.map(parse, num_parallel_calls=PARSE_CALLS, deterministic=True)
    return untuned(d.prefetch(PREFETCH_BATCHES))


def dataset_fn(file_pattern, global_batch_size: int, seq_length: int, **kwargs):
    """A function of an InputContext, for `strategy.distribute_datasets_from_function`;
    `kwargs` are `pretraining_dataset`'s.

    Example:
      dist = strategy.distribute_datasets_from_function(
          dataset_fn("data/pretrain_data.tfrecord-*", 128, 128, seed=0, start_step=step))
    """

    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return pretraining_dataset(file_pattern, global_batch_size, seq_length,
                                   input_context=input_context, **kwargs)

    return fn
