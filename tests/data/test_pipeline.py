"""The tf.data reader: shapes, exactly-once sharding under an InputContext, corrupt shards."""

import os
import shutil

import pytest
import tensorflow as tf

from electra_tf.data.pipeline import CorruptShardError, dataset_fn, pretraining_dataset

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
    from electra_tf.data.pretraining_data import parse_example

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
        from electra_tf.data.pretraining_data import parse_example
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


def test_dataset_fn_with_mirrored_strategy(built_shards):
    out, _ = built_shards
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPUs configured in tests/conftest.py")
    strategy = tf.distribute.MirroredStrategy(devices)
    dist = strategy.distribute_datasets_from_function(
        dataset_fn(os.path.join(out, "pretrain_data.tfrecord-*"), 8, SEQ, seed=0))
    batch = next(iter(dist))
    per_replica = strategy.experimental_local_results(batch["input_ids"])
    assert [t.shape for t in per_replica] == [(4, SEQ), (4, SEQ)]


def test_reads_the_original_tools_shard_names(built_shards, tmp_path, helpers):
    out, manifest = built_shards
    for i, f in enumerate(helpers.shard_files(out)):
        shutil.copy(f, tmp_path / f"pretrain_data.tfrecord-{i}-of-1000")
    ds = pretraining_dataset(str(tmp_path / "pretrain_data.tfrecord-*"), 64, SEQ,
                             is_training=False, drop_remainder=False)
    assert len(_rows(ds)) == manifest["num_examples"]


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
