"""The tf.data reader: shapes, exactly-once sharding under an InputContext, corrupt shards, and
the check of every record before a run."""

import logging
import os
import re
import shutil

import pytest
from tfrecord_framing import record_offsets
import tensorflow as tf

from electra_tf.data.packing import parse_example
from electra_tf.data.pipeline import (CorruptShardError, check_shards, dataset_fn,
                                      distributed_iterator, list_shards, pretraining_dataset)
from electra_tf.data.text_files import BadInputError

SEQ = 64


def _rows(ds):
    """Every example of a dataset as a hashable (ids, mask, segments) tuple."""
    out = []
    for batch in ds:
        cols = [batch[k].numpy().tolist() for k in ("input_ids", "input_mask", "segment_ids")]
        out += [tuple(map(tuple, row)) for row in zip(*cols)]
    return out


@pytest.fixture(scope="module")
def all_examples(built_shards, helpers):
    from electra_tf.data.packing import parse_example

    out, _ = built_shards
    rows = []
    for f in helpers.shard_files(out):
        for r in helpers.read_records(f):
            ex = parse_example(r)
            rows.append(tuple(tuple(ex[k]) for k in ("input_ids", "input_mask", "segment_ids")))
    return rows


def test_batches_are_int32_with_static_shape(built_shards):
    out, manifest = built_shards
    ds = pretraining_dataset(os.path.join(out, "pretrain_data.tfrecord-*"), 8, SEQ, seed=0)
    assert ds.element_spec["input_ids"] == tf.TensorSpec([8, SEQ], tf.int32)
    batches = list(ds.take(manifest["num_examples"] // 8 + 3))  # repeats past one epoch
    assert len(batches) == manifest["num_examples"] // 8 + 3
    b = batches[0]
    assert set(b) == {"input_ids", "input_mask", "segment_ids"}
    assert all(v.dtype == tf.int32 and v.shape == (8, SEQ) for v in b.values())
    assert tf.reduce_all(tf.equal(b["input_mask"] == 0, b["input_ids"] == 0))


def test_every_pipeline_runs_untuned(built_shards, iterated_datasets):
    """tf.data's autotuner is off in every pipeline the data layer iterates (the training and the
    evaluation stream, the shard check, the vocabulary learner's counting): an autotuned
    iterator's destructor waits for the tuner's next wake-up, up to a minute after a long run
    (`pipeline.untuned`). The parallelism they keep is their own: 4 batches parsed side by side."""
    from electra_tf.data.tokenizer import learn_vocab

    pattern = os.path.join(built_shards[0], "pretrain_data.tfrecord-*")
    for is_training in (True, False):
        next(iter(pretraining_dataset(pattern, 8, SEQ, is_training=is_training)))
    check_shards(pattern, SEQ)
    learn_vocab(["the cat sat on the mat .", "a dog ran ."] * 20, vocab_size=120)
    assert len(iterated_datasets) >= 4
    for dataset in iterated_datasets:
        assert dataset.options().autotune.enabled is False, dataset
    parse = pretraining_dataset(pattern, 8, SEQ)
    while type(parse).__name__ != "_ParallelMapDataset":  # under the options and the prefetch
        parse = parse._input_dataset
    assert parse._num_parallel_calls.numpy() == 4


def test_eval_reads_every_example_once(built_shards, all_examples):
    out, _ = built_shards
    ds = pretraining_dataset(os.path.join(out, "pretrain_data.tfrecord-*"), 64, SEQ,
                             is_training=False, drop_remainder=False)
    assert sorted(_rows(ds)) == sorted(all_examples)


@pytest.mark.parametrize("num_files", [4, 1], ids=["by_file", "by_element"])
def test_two_replicas_read_each_example_exactly_once(built_shards, all_examples, tmp_path,
                                                     num_files):
    out, _ = built_shards
    if num_files == 1:  # fewer files than pipelines: sharding must go by element
        pattern = os.path.join(out, "pretrain_data.tfrecord-00000-of-00004")
        from electra_tf.data.packing import parse_example
        expected = [tuple(tuple(parse_example(r.numpy())[k])
                          for k in ("input_ids", "input_mask", "segment_ids"))
                    for r in tf.data.TFRecordDataset(pattern)]
    else:
        pattern = os.path.join(out, "pretrain_data.tfrecord-*")
        expected = all_examples
    seen = []
    for pipeline_id in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                         num_replicas_in_sync=2)
        ds = pretraining_dataset(pattern, 64, SEQ, input_context=ctx, is_training=False,
                                 drop_remainder=False)
        assert ds.element_spec["input_ids"].shape[0] in (32, None)  # global 64 -> 32 each
        rows = _rows(ds)
        assert rows, f"pipeline {pipeline_id} got nothing"
        seen += rows
    assert sorted(seen) == sorted(expected)  # nothing lost, nothing read twice


def test_training_shards_by_file_without_overlap(built_shards):
    out, _ = built_shards
    firsts = []
    for pipeline_id in range(2):
        ctx = tf.distribute.InputContext(2, pipeline_id, 2)
        ds = pretraining_dataset(os.path.join(out, "pretrain_data.tfrecord-*"), 4, SEQ,
                                 input_context=ctx, seed=1, shuffle_buffer=10)
        firsts.append({tuple(r[0]) for r in _rows(ds.take(30))})
    assert not firsts[0] & firsts[1]


def test_the_training_stream_is_a_function_of_the_seed_and_resumes_at_a_step(built_shards, all_examples):
    pattern = os.path.join(built_shards[0], "pretrain_data.tfrecord-*")

    def first_ids(seed, start_step, n):
        ds = pretraining_dataset(pattern, 8, SEQ, seed=seed, start_step=start_step, shuffle_buffer=50)
        return [b["input_ids"].numpy().tolist() for b in ds.take(n)]

    epoch = len(all_examples) // 8
    straight = first_ids(3, 0, epoch + 10)
    assert first_ids(3, epoch - 5, 15) == straight[epoch - 5:]  # across the end of an epoch
    assert first_ids(4, 0, 3) != straight[:3]


def test_dataset_fn_with_mirrored_strategy(built_shards, iterated_datasets):
    """Each replica gets its half of the global batch, and every dataset under the strategy's
    iterator, each device's buffer included (TensorFlow builds those), runs untuned."""
    out, _ = built_shards
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPUs configured in tests/conftest.py")
    strategy = tf.distribute.MirroredStrategy(devices)
    iterator = distributed_iterator(
        strategy, dataset_fn(os.path.join(out, "pretrain_data.tfrecord-*"), 8, SEQ, seed=0))
    batch = next(iterator)
    per_replica = strategy.experimental_local_results(batch["input_ids"])
    assert [t.shape for t in per_replica] == [(4, SEQ), (4, SEQ)]
    buffers = [d for d in iterated_datasets if isinstance(d.element_spec, dict)]
    assert len(buffers) == 2  # one per device (the others: each shard's first-record check)
    assert all(d.options().autotune.enabled is False for d in iterated_datasets)


def test_reads_the_original_tools_shard_names(built_shards, tmp_path, helpers):
    out, manifest = built_shards
    for i, f in enumerate(helpers.shard_files(out)):
        shutil.copy(f, tmp_path / f"pretrain_data.tfrecord-{i}-of-1000")
    ds = pretraining_dataset(str(tmp_path / "pretrain_data.tfrecord-*"), 64, SEQ,
                             is_training=False, drop_remainder=False)
    assert len(_rows(ds)) == manifest["num_examples"]


def test_data_may_name_the_build_folder_and_a_star_reads_only_its_shards(built_shards, tmp_path):
    out, manifest = built_shards
    folder = tmp_path / "build"
    shutil.copytree(out, folder)
    listed = sorted(str(folder / s["file"]) for s in manifest["shards"])
    # What an interrupted build and the builder's own bookkeeping leave beside the shards.
    (folder / ".pretrain_data.tfrecord-00001-of-00004.x1y2.tmp").write_bytes(b"half a shard")
    (folder / ".shard_stats").mkdir(exist_ok=True)
    (folder / "subfolder").mkdir()
    assert len(listed) == 4
    assert list_shards(str(folder)) == listed
    assert list_shards(str(folder) + "/") == listed
    assert list_shards(str(folder / "*")) == listed  # no manifest.json, hidden files or folders
    assert list_shards(str(folder / ".pretrain*")) == [str(folder / ".pretrain_data.tfrecord-00001-of-00004.x1y2.tmp")]
    ds = pretraining_dataset(str(folder), 64, SEQ, is_training=False, drop_remainder=False)
    assert len(_rows(ds)) == manifest["num_examples"]

    # Without a manifest: the folder's pretrain_data.tfrecord-* files (the authors' tool's names).
    os.remove(folder / "manifest.json")
    (folder / "notes.txt").write_text("not a shard")
    assert list_shards(str(folder)) == listed
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty': a folder with neither a manifest.json nor "
                                                "pretrain_data.tfrecord-"):
        list_shards(str(empty))

    # A manifest naming a shard that is gone is named, with the shard.
    shutil.copy(os.path.join(out, "manifest.json"), folder / "manifest.json")
    os.remove(listed[2])
    with pytest.raises(BadInputError, match=re.escape(f"{folder / 'manifest.json'} lists 4 shards but 1 "
                                                      f"are missing, first {listed[2]}")):
        list_shards(str(folder))


# ---- corrupt shards -------------------------------------------------------------------------


@pytest.fixture
def damaged_dir(built_shards, tmp_path, helpers):
    out, _ = built_shards
    files = helpers.shard_files(out)
    shutil.copy(files[0], tmp_path / "good.tfrecord")
    data = open(files[1], "rb").read()
    (tmp_path / "truncated.tfrecord").write_bytes(data[: len(data) * 2 // 3])
    return tmp_path


def test_truncated_shard_error_names_the_file(damaged_dir):
    ds = pretraining_dataset(str(damaged_dir / "*.tfrecord"), 1, SEQ, is_training=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _rows(ds)
    assert f"corrupt or truncated TFRecord shard {damaged_dir / 'truncated.tfrecord'}" \
        in str(err.value)


def test_corrupt_shard_is_skipped_with_a_warning(damaged_dir, helpers, capfd):
    good = len(helpers.read_records(damaged_dir / "good.tfrecord"))
    ds = pretraining_dataset(str(damaged_dir / "*.tfrecord"), 64, SEQ, is_training=False,
                             skip_corrupt=True, drop_remainder=False)
    n = len(_rows(ds))
    assert good < n < good + 10_000  # the good file plus the readable head of the damaged one
    assert f"{damaged_dir / 'truncated.tfrecord'}" in capfd.readouterr().err


def test_flipped_byte_and_garbage_name_the_file(damaged_dir, built_shards, helpers):
    out, _ = built_shards
    data = bytearray(open(helpers.shard_files(out)[2], "rb").read())
    data[len(data) // 2] ^= 0xFF  # CRC mismatch mid-file
    (damaged_dir / "flipped.tfrecord").write_bytes(bytes(data))
    os.remove(damaged_dir / "truncated.tfrecord")
    with pytest.raises(tf.errors.InvalidArgumentError, match="flipped.tfrecord"):
        _rows(pretraining_dataset(str(damaged_dir / "*.tfrecord"), 1, SEQ, is_training=False))
    (damaged_dir / "garbage.tfrecord").write_bytes(b"this is not a TFRecord file" * 10)
    with pytest.raises(CorruptShardError, match="garbage.tfrecord: corrupt or truncated"):
        pretraining_dataset(str(damaged_dir / "*.tfrecord"), 1, SEQ)


def test_wrong_seq_length_and_missing_files(built_shards, tmp_path):
    out, _ = built_shards
    with pytest.raises(CorruptShardError, match="00000-of-00004: feature 'input_ids' has "
                                                "length 64, expected seq_length=128"):
        pretraining_dataset(os.path.join(out, "pretrain_data.tfrecord-*"), 1, 128)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        pretraining_dataset(str(tmp_path / "nothing-here*"), 1, SEQ)


# ---- the check of every record before a run -------------------------------------------------


def test_check_shards_reads_every_record_of_intact_shards(built_shards, helpers):
    out, manifest = built_shards
    files = helpers.shard_files(out)
    result = check_shards(os.path.join(out, "pretrain_data.tfrecord-*"), SEQ)
    assert result.files == len(files) and result.damaged == ()
    assert result.records == manifest["num_examples"]
    assert result.bytes == sum(os.path.getsize(f) for f in files)


@pytest.fixture
def four_damages(built_shards, helpers, tmp_path):
    """Copies of the shards, each damaged another way at a known record."""
    files = helpers.shard_files(built_shards[0])
    data = [open(f, "rb").read() for f in files]
    offsets = [record_offsets(d) for d in data]
    flipped = bytearray(data[0])
    flipped[offsets[0][40] + 12 + 3] ^= 0x01  # one bit of record 40's data
    (tmp_path / "a_data.tfrecord").write_bytes(bytes(flipped))
    header = bytearray(data[1])
    header[offsets[1][7] + 1] ^= 0x80  # record 7's length field
    (tmp_path / "b_header.tfrecord").write_bytes(bytes(header))
    (tmp_path / "c_cut.tfrecord").write_bytes(data[2][:offsets[2][60] + 30])  # inside record 60
    (tmp_path / "d_cut_header.tfrecord").write_bytes(data[3][:offsets[3][20] + 5])
    return tmp_path, offsets, [len(o) for o in offsets]


def test_check_shards_names_the_record_its_offset_and_what_is_wrong(four_damages):
    folder, offsets, counts = four_damages
    with pytest.raises(CorruptShardError) as err:
        check_shards(str(folder / "*.tfrecord"), SEQ)
    assert str(err.value).startswith(
        f"damaged shard {folder / 'a_data.tfrecord'}: record 40 at byte {offsets[0][40]}: data "
        "checksum mismatch")
    assert "(3 more damaged shards logged)" in str(err.value)
    assert "\n" not in str(err.value)

    result = check_shards(str(folder / "*.tfrecord"), SEQ, skip_corrupt=True)
    found = {os.path.basename(d.path): d for d in result.damaged}
    assert [(d.record, d.offset) for d in found.values()] == [
        (40, offsets[0][40]), (7, offsets[1][7]), (60, offsets[2][60]), (20, offsets[3][20])]
    assert found["a_data.tfrecord"].problem.startswith("data checksum mismatch")
    assert found["b_header.tfrecord"].problem.startswith("length checksum mismatch")
    assert found["c_cut.tfrecord"].problem.startswith("truncated: the record needs")
    assert found["d_cut_header.tfrecord"].problem.startswith("the file ends 5 bytes into a record")
    # Skipped: record 40 and every record after it; the others' damage hides or ends the rest.
    assert found["a_data.tfrecord"].records_skipped == counts[0] - 40
    assert found["a_data.tfrecord"].exact and not found["b_header.tfrecord"].exact
    assert [d.records_skipped for d in result.damaged][1:] == [1, 1, 1]
    assert result.records == 40 + 7 + 60 + 20
    assert result.records_skipped == counts[0] - 40 + 3


def test_check_shards_counts_what_the_skipping_reader_reads(four_damages):
    folder, _, _ = four_damages
    result = check_shards(str(folder / "*.tfrecord"), SEQ, skip_corrupt=True)
    ds = pretraining_dataset(str(folder / "*.tfrecord"), 64, SEQ, is_training=False,
                             skip_corrupt=True, drop_remainder=False)
    assert len(_rows(ds)) == result.records


def test_check_shards_refuses_an_intact_record_that_is_not_a_pretraining_example(
        built_shards, helpers, tmp_path):
    records = helpers.read_records(helpers.shard_files(built_shards[0])[0])
    short = tf.train.Example(features=tf.train.Features(feature={
        n: tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * (SEQ - 1)))
        for n in ("input_ids", "input_mask", "segment_ids")})).SerializeToString()
    path, k = tmp_path / "odd.tfrecord", len(records) * 2 // 3  # past the first check batch
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records[:k] + [short] + records[k:]:
            writer.write(r)
    offset = sum(len(r) + 16 for r in records[:k])
    message = (f"{path}: record {k} at byte {offset}: feature 'input_ids' has length {SEQ - 1}, "
               f"expected seq_length={SEQ}")
    for skip in (False, True):  # the wrong data, not damage: skipping does not apply
        with pytest.raises(CorruptShardError, match=re.escape(message)):
            check_shards(str(path), SEQ, skip_corrupt=skip)


def test_check_shards_refuses_token_ids_outside_the_model_vocabulary(built_shards, helpers,
                                                                      tmp_path):
    out, manifest = built_shards
    vocab_size = manifest["vocab_size"]
    pattern = os.path.join(out, "pretrain_data.tfrecord-*")
    assert check_shards(pattern, SEQ, vocab_size=vocab_size).damaged == ()  # its own vocabulary

    records = helpers.read_records(helpers.shard_files(out)[0])
    largest = max(max(parse_example(r)["input_ids"]) for r in records)
    k = len(records) * 2 // 3  # past the first check batch
    for bad_id in (vocab_size, -1):  # one past the table, negative
        ids = [1, bad_id] + [0] * (SEQ - 2)
        odd = tf.train.Example(features=tf.train.Features(feature={
            n: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
            for n, v in (("input_ids", ids), ("input_mask", [1] * SEQ),
                         ("segment_ids", [0] * SEQ))})).SerializeToString()
        path = tmp_path / f"odd{bad_id}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for r in records[:k] + [odd] + records[k:]:
                writer.write(r)
        message = (f"{path}: record {k} has token id {bad_id}, outside the model's vocabulary "
                   f"(vocab_size={vocab_size}; the largest id in this shard is "
                   f"{max(largest, bad_id)}): the shards were built with another vocabulary; "
                   "give it with --vocab_file")
        for skip in (False, True):  # the wrong data, not damage: skipping does not apply
            with pytest.raises(CorruptShardError, match=re.escape(message)):
                check_shards(str(path), SEQ, skip_corrupt=skip, vocab_size=vocab_size)
    check_shards(str(tmp_path / "odd-1.tfrecord"), SEQ)  # without vocab_size, not checked


def test_check_shards_logs_progress_with_rate_and_eta(built_shards, caplog):
    out, _ = built_shards
    with caplog.at_level(logging.INFO):
        check_shards(os.path.join(out, "pretrain_data.tfrecord-*"), SEQ, log_every_seconds=0)
    lines = [r.getMessage() for r in caplog.records]
    progress = [line for line in lines if line.startswith("checking shards: ")]
    assert progress and all(" MB/s, ETA " in line for line in progress), lines
    assert any(line.startswith("checked 4 shards: ") and "MB/s" in line for line in lines)
