"""The replaced-token-detection objective end to end."""

import numpy as np
import pytest
import tensorflow as tf
import keras

from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import untuned
from electra_tf.models import ElectraPretrainer

VOCAB = 512
CLS, SEP, MASK = 101, 102, 103


def tiny_config(**changes):
    return ElectraConfig.from_json("electra_tiny").replace(vocab_size=VOCAB, **changes)


def batch_of(token, batch=4, seq=24):
    ids = np.full((batch, seq), token, np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    return {"input_ids": tf.constant(ids), "input_mask": tf.ones_like(ids),
            "segment_ids": tf.zeros_like(ids)}


def force_generator(pretrainer, token):
    """Makes the generator put (almost) all probability on `token`."""
    bias = pretrainer.generator.lm_head.output_bias
    bias.assign(tf.one_hot(token, VOCAB) * 100.0)  # dominates; still < the 1000 of disallow


def test_always_correct_generator_gives_no_fake_labels():
    p = ElectraPretrainer(tiny_config())
    force_generator(p, 2000 % VOCAB)
    out = p.compute_objective(batch_of(2000 % VOCAB), tf.constant([1, 2]), training=False)
    assert out["masked"].is_masked.numpy().sum() > 0
    assert out["replaced_token_labels"].numpy().sum() == 0
    assert out["sampled_accuracy"].numpy() == pytest.approx(1.0, abs=1e-5)


def test_always_wrong_generator_fakes_exactly_the_masked_positions():
    p = ElectraPretrainer(tiny_config())
    force_generator(p, 300)
    out = p.compute_objective(batch_of(200), tf.constant([1, 2]), training=False)
    np.testing.assert_array_equal(out["replaced_token_labels"].numpy(),
                                  out["masked"].is_masked.numpy().astype(np.int32))
    disc_ids = out["disc_input_ids"].numpy()
    assert (disc_ids[out["masked"].is_masked.numpy()] == 300).all()


def test_disallow_correct_never_samples_the_original():
    p = ElectraPretrainer(tiny_config(disallow_correct=True))
    force_generator(p, 200)
    out = p.compute_objective(batch_of(200), tf.constant([1, 2]), training=False)
    np.testing.assert_array_equal(out["replaced_token_labels"].numpy(),
                                  out["masked"].is_masked.numpy().astype(np.int32))


def test_loss_is_mlm_plus_weighted_discriminator_loss_over_all_real_tokens():
    p = ElectraPretrainer(tiny_config(disc_weight=7.0))
    features = batch_of(250)
    features["input_mask"] = tf.constant(np.repeat([[1] * 20 + [0] * 4], 4, axis=0), tf.int32)
    out = p.compute_objective(features, tf.constant([1, 2]), training=False)
    np.testing.assert_allclose(out["loss"], out["mlm_loss"] + 7.0 * out["disc_loss"], rtol=1e-6)
    logits = out["rtd_logits"].numpy()
    labels = out["replaced_token_labels"].numpy()
    mask = features["input_mask"].numpy()
    xent = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    np.testing.assert_allclose(out["disc_loss"], (xent * mask).sum() / mask.sum(), rtol=1e-5)
    # electra_15: only the masked positions count.
    p15 = ElectraPretrainer(tiny_config(objective="electra_15"))
    out15 = p15.compute_objective(features, tf.constant([1, 2]), training=False)
    logits, labels = out15["rtd_logits"].numpy(), out15["replaced_token_labels"].numpy()
    masked = out15["masked"].is_masked.numpy()
    xent = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    np.testing.assert_allclose(out15["disc_loss"], xent[masked].mean(), rtol=1e-5)


def repeated_corpus(num=32, seq=24, seed=0):
    """A small corpus of a few 'sentences' repeated: learnable in a few dozen steps."""
    rng = np.random.default_rng(seed)
    sentences = rng.integers(200, 260, size=(4, seq))
    ids = sentences[rng.integers(0, 4, num)].astype(np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    return untuned(tf.data.Dataset.from_tensor_slices(  # see pipeline.untuned
        {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}))


@pytest.mark.parametrize("objective", ["mlm", "replace_mlm"])
def test_mlm_objectives_score_exactly_the_masked_slots(objective):
    """The discriminator's MLM head runs on the masked slots only; the loss is the one of the
    whole-sequence logits read at those slots (the original's gather, then cross-entropy)."""
    p = ElectraPretrainer(tiny_config(objective=objective))
    features = {k: v.numpy() for k, v in next(iter(repeated_corpus().batch(4))).items()}
    features["input_ids"][1, 6:], features["input_mask"][1, 6:] = 0, 0  # a short sentence
    features = {k: tf.constant(v) for k, v in features.items()}
    out = p.compute_objective(features, tf.constant([3, 1]), training=False)
    batch = out["masked"]
    disc_ids = out["disc_input_ids"] if objective == "replace_mlm" else batch.masked_input_ids
    full = p.discriminator({**features, "input_ids": disc_ids}, training=False)["mlm_logits"]
    assert full.shape[1] == features["input_ids"].shape[1]  # no positions: every token
    slots = np.take_along_axis(full.numpy(), batch.positions.numpy()[:, :, None], axis=1)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(batch.masked_ids, slots).numpy()
    weights = batch.weights.numpy()
    assert weights.sum() > 0 and (weights == 0).any()  # real and padded slots both exercised
    np.testing.assert_allclose(out["main_mlm_loss"], (losses * weights).sum() / weights.sum(),
                               rtol=1e-5)


@pytest.mark.parametrize("objective", ["electra", "electra_15", "replace_mlm", "all_tokens_mlm", "mlm"])
def test_loss_falls_for_every_objective(objective):
    keras.utils.set_random_seed(0)
    p = ElectraPretrainer(tiny_config(objective=objective, hidden_dropout=0.0, attention_dropout=0.0))
    p.compile(optimizer=keras.optimizers.Adam(2e-3))
    p.optimizer.build(p.trainable_variables)  # build before tracing: one trace, not two
    data = repeated_corpus().repeat().batch(8)
    step = tf.function(p.train_step)
    losses = [float(step(batch)["loss"]) for batch, _ in zip(data, range(1))]
    iterator = iter(data)
    for m in p.metrics:
        m.reset_state()
    first = float(p.compute_objective(next(iter(data)), tf.constant([9, 9]))["loss"])
    for _ in range(40):
        step(next(iterator))
    last = float(p.compute_objective(next(iter(data)), tf.constant([9, 9]))["loss"])
    assert np.isfinite(losses).all()
    assert last < 0.8 * first, (objective, first, last)


def test_train_step_compiles_with_xla():
    p = ElectraPretrainer(tiny_config(hidden_dropout=0.0, attention_dropout=0.0), seed=5)
    p.compile(optimizer=keras.optimizers.Adam(1e-3))
    p.optimizer.build(p.trainable_variables)
    batch = next(iter(repeated_corpus().batch(8)))
    seed = tf.constant([5, 0], tf.int64)
    expected = p.compute_objective(batch, seed, training=True)
    xla_objective = tf.function(lambda f, s: p.compute_objective(f, s, training=True),
                                jit_compile=True)
    got = xla_objective(batch, seed)
    # Masking is integer hashing, so XLA draws the same masks; the MLM loss depends on nothing
    # else. (Gumbel noise may differ: XLA has its own stateless RNG kernels.)
    np.testing.assert_array_equal(got["masked"].masked_input_ids, expected["masked"].masked_input_ids)
    np.testing.assert_allclose(got["mlm_loss"], expected["mlm_loss"], rtol=1e-4)
    step = tf.function(p.train_step, jit_compile=True)
    before = p.discriminator.encoder.layers[0].intermediate.kernel.numpy()
    results = [step(batch) for _ in range(2)]
    assert int(p.optimizer.iterations) == 2 and np.isfinite(float(results[-1]["loss"]))
    assert not np.allclose(before, p.discriminator.encoder.layers[0].intermediate.kernel.numpy())


def test_fit_reports_the_paper_metrics():
    p = ElectraPretrainer(tiny_config())
    p.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = p.fit(repeated_corpus().repeat().batch(8), steps_per_epoch=2, epochs=1, verbose=0)
    for name in ("loss", "mlm_loss", "mlm_accuracy", "sampled_accuracy", "disc_loss",
                 "disc_accuracy", "disc_precision", "disc_recall", "disc_auc"):
        assert name in history.history and np.isfinite(history.history[name][0]), name


def test_every_config_objective_is_an_objective_object_and_the_pretrainer_asks_it():
    """`config.OBJECTIVES` (what a config may name) and the objects the pretrainer holds are one
    list; the pretrainer's heads, generator and metrics are the objective's answers."""
    from electra_tf import config as config_module
    from electra_tf.models.objectives import OBJECTIVES, get_objective

    assert tuple(OBJECTIVES) == config_module.OBJECTIVES
    for name in OBJECTIVES:
        p = ElectraPretrainer(tiny_config(
            objective=name, embedding_sharing="untied" if name == "electric" else "embeddings"))
        objective = get_objective(name)
        assert p.objective is objective and objective.name == name
        assert (p.discriminator.rtd_head is not None) == objective.rtd_head, name
        assert (p.discriminator.mlm_head is not None) == objective.mlm_head, name
        assert (p.generator is None) == (name == "mlm"), name
        assert tuple(p.step_metrics) == objective.metric_names, name
        assert (p.disc_auc is not None) == objective.detection_metrics, name
    with pytest.raises(ValueError, match="objective must be one of"):
        get_objective("electra_16")


def test_electra_15_scores_the_discriminator_on_the_masked_positions_only():
    """Paper Table 5, "ELECTRA 15%": the discriminator loss comes only from the ~15% of tokens
    that were masked out (replaced or not); every other real token weighs 0."""
    features = next(iter(repeated_corpus().batch(8)))
    out = ElectraPretrainer(tiny_config(objective="electra_15"))(features)
    is_masked = out["masked"].is_masked.numpy()
    real = features["input_mask"].numpy() > 0
    assert 0 < is_masked.sum() < real.sum()  # the two weightings differ on this batch
    np.testing.assert_array_equal(out["disc_weights"].numpy(), is_masked.astype(np.int32))
    labels = out["replaced_token_labels"].numpy().astype(np.float64)
    logits = out["rtd_logits"].numpy().astype(np.float64)
    losses = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    np.testing.assert_allclose(out["disc_loss"], (losses * is_masked).sum() / is_masked.sum(),
                               rtol=1e-5)
