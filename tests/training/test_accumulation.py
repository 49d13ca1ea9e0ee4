"""Gradient accumulation: N micro-batches give the update of the whole batch.

How the two paths are made comparable: masks are keyed per example (models/masking.py), so a
micro-batch masks its examples exactly as the whole batch does; dropout is off; and the
generator samples its argmax (temperature -> 0, as tests/models/test_distributed.py does), because
its Gumbel noise is drawn per call (each micro-batch, like each replica, folds its index into the
sampling seed). What is left to differ is the normalisation: the losses are means over the
GLOBAL batch's masked slots and real tokens, and the micro-batches below hold different token
counts, so averaging their own means gives another gradient (checked, so the test can fail).
Plain SGD with learning rate 1 makes the weight change the gradient itself; Adam's first step
(~ lr x sign(g)) would hide a wrong scale.
"""

from __future__ import annotations

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf import run_folder
from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import distributed_iterator, untuned
from electra_tf.models import ElectraPretrainer
from electra_tf.training import optimizer as optimizer_lib
from electra_tf.training.config import PretrainingConfig, PretrainingConfigError
from electra_tf.training.loop import run_pretraining
from electra_tf.training.steps import make_loop_fn
from electra_tf.training.strategy import create_strategy
from same_step import TOLERANCE, deterministic_config


def data():
    rng = np.random.default_rng(0)
    ids = rng.integers(200, 500, size=(8, 24)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    mask[2:4, 10:] = 0  # uneven real-token (and masked-slot) counts across the micro-batches
    mask[5:, 18:] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


@pytest.fixture(scope="module")
def initial_weights():
    # Seeded: an argmax sample is stable against float noise only away from near-ties.
    keras.utils.set_random_seed(0)
    return ElectraPretrainer(deterministic_config(), seed=1).get_weights()


def trainable(initial):
    """The trainable weights, in `trainable_variables` order, of a model set to `initial`."""
    model = ElectraPretrainer(deterministic_config(), seed=1)
    model.set_weights(initial)
    return [v.numpy() for v in model.trainable_variables]


def one_update(strategy, initial, n, make_optimizer):
    """(loss, metrics, trainable weights) after one optimizer step of `make_loop_fn` on data()
    with n micro-batches."""
    with strategy.scope():
        model = ElectraPretrainer(deterministic_config(), seed=1)
        model.set_weights(initial)
        model.optimizer = make_optimizer()
        model.optimizer.build(model.trainable_variables)
    dataset = untuned(tf.data.Dataset.from_tensors(data()).repeat())  # see pipeline.untuned
    iterator = distributed_iterator(strategy, dataset)
    loop = make_loop_fn(model, strategy, accumulation_steps=n)
    loss, bad_step, tokens, skipped, _ = loop(iterator, tf.constant(1), tf.constant(False))
    assert int(bad_step) == -1 and int(skipped) == 0
    assert int(model.optimizer.iterations.numpy()) == 1  # one optimizer step, whatever n
    assert int(tokens) == data()["input_mask"].sum()
    metrics = {m.name: float(m.result()) for m in model.metrics}
    return float(loss), metrics, [v.numpy() for v in model.trainable_variables]


def sgd():
    return keras.optimizers.SGD(learning_rate=1.0)


@pytest.fixture(scope="module")
def whole_batch(initial_weights):
    return one_update(create_strategy("one_device"), initial_weights, 1, sgd)


@pytest.mark.slow
@pytest.mark.parametrize("strategy_name,n", [("one_device", 2), ("one_device", 4),
                                              ("mirrored", 2)])
def test_micro_batches_give_the_whole_batch_update(strategy_name, n, initial_weights,
                                                   whole_batch):
    strategy = create_strategy(strategy_name)
    loss, metrics, weights = one_update(strategy, initial_weights, n, sgd)
    whole_loss, whole_metrics, whole_weights = whole_batch
    np.testing.assert_allclose(loss, whole_loss, **TOLERANCE)
    for name in ("loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy", "disc_auc"):
        np.testing.assert_allclose(metrics[name], whole_metrics[name], **TOLERANCE, err_msg=name)
    for a, b in zip(weights, whole_weights):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    changed = sum(not np.allclose(a, s)
                  for a, s in zip(whole_weights, trainable(initial_weights)))
    assert changed > 20  # the step really trained


@pytest.mark.slow
def test_averaging_the_micro_batches_own_means_would_be_caught(initial_weights, whole_batch):
    """The naive accumulation (mean of the slices' own normalised losses) differs from the whole
    batch by more than TOLERANCE on these uneven slices: the test above can fail."""
    model = ElectraPretrainer(deterministic_config(), seed=1)
    model.set_weights(initial_weights)
    batch = data()
    seed = tf.constant([1, 0], tf.int64)
    grads = None
    for half in (slice(0, 4), slice(4, 8)):
        part = {k: v[half] for k, v in batch.items()}
        with tf.GradientTape() as tape:
            loss = model.compute_objective(part, seed, training=True)["loss"] / 2
        g = [tf.convert_to_tensor(x) for x in tape.gradient(loss, model.trainable_variables)]
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    naive = [(v - g).numpy() for v, g in zip(model.trainable_variables, grads)]
    whole = whole_batch[2]
    assert any(not np.allclose(a, b, **TOLERANCE) for a, b in zip(naive, whole))


@pytest.mark.slow
def test_the_accumulated_gradient_is_clipped_once(initial_weights, whole_batch):
    # Clipping to a norm far below the gradient's: the update is c * g / |g| of the SUMMED
    # gradient; clipping each micro-batch's part would give another direction and length. The
    # clip is the runs' own (dense, after the replica sum: optimizer._ClipAfterAllReduce); stock
    # Keras measures an embedding's IndexedSlices gradient with its duplicate rows apart. The
    # whole batch's gradient g is the whole-batch update of plain SGD with learning rate 1
    # (`whole_batch`), so c * g / |g| is computed here rather than run a second time.
    class ClippedSGD(optimizer_lib._ClipAfterAllReduce, keras.optimizers.SGD):
        pass

    def clipped():
        return ClippedSGD(learning_rate=1.0, global_clipnorm=1e-3)

    start = [w.astype(np.float64) for w in trainable(initial_weights)]
    gradient = [s - w for s, w in zip(start, whole_batch[2])]
    norm = np.sqrt(sum(np.sum(g ** 2) for g in gradient))
    assert norm > 1e-2  # far above the clip norm
    whole = [s - 1e-3 * g / norm for s, g in zip(start, gradient)]
    _, _, accumulated = one_update(create_strategy("one_device"), initial_weights, 4, clipped)
    for a, b in zip(accumulated, whole):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    change = np.sqrt(sum(np.sum((a - s) ** 2) for a, s in zip(accumulated, start)))
    assert change == pytest.approx(1e-3, rel=1e-3)  # clipped, once, to the global norm


def test_micro_batches_must_divide_the_batch(pretrain_vocab, tmp_path, pretrain_shards):
    with pytest.raises(PretrainingConfigError,
                       match=r"PretrainingConfig.gradient_accumulation_steps: must divide "
                             r"train_batch_size \(8\)"):
        PretrainingConfig(train_batch_size=8, gradient_accumulation_steps=3)
    with pytest.raises(PretrainingConfigError, match=r"does not divide the per-replica batch of 4"):
        run_pretraining(
            ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab),
            PretrainingConfig(train_batch_size=8, gradient_accumulation_steps=8,
                              max_seq_length=32),
            pretrain_shards, str(tmp_path), create_strategy("mirrored"), check_shards=False)
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_a_run_counts_optimizer_steps_and_resumes_with_other_micro_batches(
        tmp_path, pretrain_shards, pretrain_vocab):
    # Several steps per loop: the accumulation loop nests in the steps_per_loop loop (the case
    # where TF's arithmetic optimizer broke loop-carried sums; see `gradient_sums`).
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    config = PretrainingConfig(
        train_batch_size=8, num_train_steps=6, learning_rate=1e-3, num_warmup_steps=1,
        max_seq_length=32, steps_per_loop=3, save_checkpoints_steps=3, summary_steps=3, seed=3,
        shuffle_buffer=64, gradient_accumulation_steps=4)
    model_dir = str(tmp_path / "run")
    result = run_pretraining(model_config, config, pretrain_shards, model_dir,
                                         create_strategy("one_device"), check_shards=False)
    assert result.step == 6 and np.isfinite(result.metrics["loss"])
    assert int(result.model.optimizer.iterations.numpy()) == 6
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "ckpt-*.index"))) \
        == ["ckpt-3.index", "ckpt-6.index"]
    record = json.loads(open(os.path.join(model_dir, run_folder.RECORD_FILE)).read())
    assert record["pretraining_config"]["gradient_accumulation_steps"] == 4
    # Out of memory? Resume with more, smaller micro-batches: the same global batch and stream
    # (and XLA-compiled, to cover it).
    more = config.replace(num_train_steps=8, steps_per_loop=2, gradient_accumulation_steps=8,
                          jit_compile=True)
    result = run_pretraining(model_config, more, pretrain_shards, model_dir,
                                         create_strategy("one_device"), check_shards=False)
    assert result.step == 8
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-8")
