"""tf.data input pipeline for pretraining shards (ours or the original tool's: same features).

Per input pipeline (one per worker under a `tf.distribute.InputContext`):

  sorted files -> shard by file (when there are at least as many files as pipelines) ->
  shuffle the file list -> repeat -> parallel interleave of TFRecord readers -> shard by element
  (when there are fewer files than pipelines) -> shuffle buffer -> batch (per-replica size,
  drop_remainder) -> parse -> int32 -> prefetch.

Corrupt or truncated shards: TFRecordDataset's DataLossError does not say which file failed, so
every file is read through a checker: records are counted in bytes (length + 16 bytes of
framing) and compared with the file size at the file's end. A mismatch raises an
InvalidArgumentError whose message names the file ("corrupt or truncated TFRecord shard <path>"),
or, with `skip_corrupt=True`, prints a warning naming the file to stderr and goes on with the next
file (records before the damage are kept). Before anything runs, each file's first record is also
checked in Python for the three features at `seq_length`, so a shard built with another
--max_seq_length fails fast, naming the file.
"""

from __future__ import annotations

import sys
from typing import Sequence

import tensorflow as tf
from absl import logging

FEATURE_NAMES = ("input_ids", "input_mask", "segment_ids")
_RECORD_OVERHEAD = 16  # TFRecord framing: u64 length, u32 length crc, u32 data crc


class CorruptShardError(ValueError):
    """A shard cannot be read as pretraining data; the message names the file."""


def list_shards(file_pattern: str | Sequence[str]) -> list[str]:
    """Comma-separated globs or a list of globs -> sorted files; error naming empty patterns."""
    patterns = file_pattern.split(",") if isinstance(file_pattern, str) else list(file_pattern)
    files = set()
    for pattern in patterns:
        pattern = pattern.strip()
        matched = tf.io.gfile.glob(pattern) if pattern else []
        if not matched:
            raise FileNotFoundError(f"{pattern or file_pattern!r}: no pretraining shards match")
        files.update(matched)
    return sorted(files)


def _check_first_record(path: str, seq_length: int, skip_corrupt: bool) -> None:
    try:
        first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
    except tf.errors.DataLossError as e:
        if skip_corrupt:
            logging.warning("%s: corrupt TFRecord shard (%s); it will be skipped", path, e.message)
            return
        raise CorruptShardError(f"{path}: corrupt or truncated TFRecord shard ({e.message})") \
            from None
    if first is None:
        return  # an empty shard is valid (a tiny corpus over many shards)
    try:
        example = tf.train.Example.FromString(first.numpy())
    except Exception as e:  # protobuf DecodeError
        raise CorruptShardError(f"{path}: first record is not a tf.train.Example ({e})") from None
    for name in FEATURE_NAMES:
        feature = example.features.feature.get(name)
        if feature is None:
            raise CorruptShardError(f"{path}: first record has no feature {name!r}; "
                                    "not a pretraining shard")
        n = len(feature.int64_list.value)
        if n != seq_length:
            raise CorruptShardError(f"{path}: feature {name!r} has length {n}, expected "
                                    f"seq_length={seq_length} (built with another "
                                    "--max_seq_length?)")


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


def pretraining_dataset(
    file_pattern: str | Sequence[str],
    batch_size: int,
    seq_length: int,
    input_context: tf.distribute.InputContext | None = None,
    is_training: bool = True,
    seed: int | None = None,
    skip_corrupt: bool = False,
    cycle_length: int = 4,
    shuffle_buffer: int = 1000,
    drop_remainder: bool = True,
) -> tf.data.Dataset:
    """Pretraining examples as {input_ids, input_mask, segment_ids}: int32 [batch, seq_length].

    Args:
      file_pattern: glob, comma-separated globs, or a list of globs.
      batch_size: the global batch size; with `input_context` each pipeline yields
        `input_context.get_per_replica_batch_size(batch_size)`.
      seq_length: the shards' max_seq_length.
      input_context: from `strategy.distribute_datasets_from_function`; every example is read by
        exactly one pipeline per epoch (by file when files >= pipelines, else by element).
      is_training: shuffle files and examples and repeat forever; False reads each example of
        this pipeline's part once, in a deterministic order.
      seed: for the shuffles (None: nondeterministic).
      skip_corrupt: warn about and skip the damaged part of corrupt shards instead of failing.
      drop_remainder: keep batch shapes static (needed on TPU and by the training loop).
    """
    files = list_shards(file_pattern)
    for path in files:
        _check_first_record(path, seq_length, skip_corrupt)

    num_pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    per_replica_batch = (
        input_context.get_per_replica_batch_size(batch_size) if input_context else batch_size
    )
    shard_by_file = len(files) >= num_pipelines
    if num_pipelines > 1 and shard_by_file:
        files = files[pipeline_id::num_pipelines]
    sizes = [tf.io.gfile.stat(f).length for f in files]

    d = tf.data.Dataset.from_tensor_slices((tf.constant(files), tf.constant(sizes, tf.int64)))
    if is_training:
        if shard_by_file:  # element sharding needs the same file order in every pipeline
            d = d.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        d = d.repeat()
    d = d.interleave(
        lambda path, size: _checked_records(path, size, skip_corrupt),
        cycle_length=max(1, min(cycle_length, len(files))),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=not (is_training and shard_by_file),
    )
    if num_pipelines > 1 and not shard_by_file:
        d = d.shard(num_pipelines, pipeline_id)
    if is_training:
        d = d.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)

    features = {n: tf.io.FixedLenFeature([seq_length], tf.int64) for n in FEATURE_NAMES}

    def parse(records):  # [batch] serialized -> dict of int32 [batch, seq_length]
        parsed = tf.io.parse_example(records, features)
        return {n: tf.cast(parsed[n], tf.int32) for n in FEATURE_NAMES}

    d = d.batch(per_replica_batch, drop_remainder=drop_remainder)
    d = d.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not is_training)
    return d.prefetch(tf.data.AUTOTUNE)


def dataset_fn(file_pattern, global_batch_size: int, seq_length: int, **kwargs):
    """A function of an InputContext, for `strategy.distribute_datasets_from_function`.

    Example:
      dist = strategy.distribute_datasets_from_function(
          dataset_fn("data/pretrain_data.tfrecord-*", 128, 128, seed=0))
    """

    def fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        return pretraining_dataset(file_pattern, global_batch_size, seq_length,
                                   input_context=input_context, **kwargs)

    return fn


# Public names for the building blocks, for loops that assemble their own tf.data pipelines
# (electra_tf/training/pretraining.py). The underscored names stay as aliases.
check_first_record = _check_first_record
checked_records = _checked_records
