"""Electric's generator and objective (models/electric.py), against independent rules.

References: Clark et al., EMNLP 2020 ("Pre-Training Transformers as Energy-Based Cloze Models")
and the authors' `run_pretraining.py` with `electric_objective` (`TwoTowerClozeTransformer`,
`_get_cloze_outputs`, `_get_fake_data`, `_get_discriminator_output`). Dropout is off wherever an
output is compared, so equalities are exact up to float32 rounding.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ConfigError, ElectraConfig
from electra_tf.data.pipeline import untuned
from electra_tf.models import ElectraPretrainer
from electra_tf.models.electric import (
    TwoTowerClozeGenerator, directional_attention_mask, noise_log_ratio)
from electra_tf.models.flops import training_flops_per_sequence
from same_step import assert_same_steps, sgd_steps
from two_cpus import two_cpu_mirrored

VOCAB, SEQ = 256, 24
PAD, CLS, SEP, MASK = 0, 2, 3, 4
FIRST_WORD = 5


def electric_config(**changes):
    values = dict(vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
                  mask_token_id=MASK, objective="electric", hidden_dropout=0.0,
                  attention_dropout=0.0)
    values.update(changes)
    return ElectraConfig.from_json("electra_tiny").replace(**values)


def batch(seed=0):
    """Rows of different lengths, a pair, a real [MASK] token, and padding."""
    rng = np.random.default_rng(seed)
    rows = []
    for words, pair, mask_at in ((22, 0, None), (9, 6, None), (14, 0, 5), (3, 0, None)):
        ids = [CLS, *rng.integers(FIRST_WORD, VOCAB, words), SEP]
        if pair:
            ids += [*rng.integers(FIRST_WORD, VOCAB, pair), SEP]
        if mask_at is not None:
            ids[mask_at] = MASK
        rows.append(ids + [PAD] * (SEQ - len(ids)))
    ids = np.array(rows, np.int32)
    return {"input_ids": ids, "input_mask": (ids != PAD).astype(np.int32),
            "segment_ids": np.zeros_like(ids)}


def as_tensors(features):
    return {k: tf.constant(v) for k, v in features.items()}


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def candidates_of(features):
    ids = features["input_ids"]
    return (features["input_mask"] > 0) & ~np.isin(ids, (CLS, SEP, MASK))


@pytest.fixture(scope="module")
def pretrainer():
    keras.utils.set_random_seed(0)
    return ElectraPretrainer(electric_config(), seed=3)


# --- the two-tower generator ---------------------------------------------------------------------
def towers(gen, features):
    inputs = as_tensors(features)
    out = []
    for tower, direction in ((gen.ltr, "ltr"), (gen.rtl, "rtl")):
        mask = directional_attention_mask(inputs["input_mask"], direction)
        out.append(tower.encode({**inputs, "input_mask": mask}, training=False).numpy())
    return out


def test_directional_masks_include_the_diagonal_and_exclude_padding():
    mask = np.array([[1, 1, 1, 0]], np.int32)
    ltr = directional_attention_mask(mask, "ltr").numpy()[0]
    rtl = directional_attention_mask(mask, "rtl").numpy()[0]
    np.testing.assert_array_equal(ltr, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(rtl, [[1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


def test_left_tower_ignores_later_tokens_and_right_tower_earlier_ones(pretrainer):
    gen = pretrainer.generator
    features = batch()
    k = 8
    later = {**features, "input_ids": features["input_ids"].copy()}
    later["input_ids"][:, k + 1:] = np.where(features["input_mask"][:, k + 1:] > 0,
                                             (features["input_ids"][:, k + 1:] + 7) % VOCAB, PAD)
    earlier = {**features, "input_ids": features["input_ids"].copy()}
    earlier["input_ids"][:, 1:k] = (features["input_ids"][:, 1:k] + 7) % VOCAB
    ltr, rtl = towers(gen, features)
    ltr_later, rtl_later = towers(gen, later)
    ltr_earlier, rtl_earlier = towers(gen, earlier)
    # Row 0 is real up to 23: its changes after k reach ltr only after k.
    np.testing.assert_allclose(ltr_later[0, :k + 1], ltr[0, :k + 1], atol=1e-6)
    assert not np.allclose(ltr_later[0, k + 1:], ltr[0, k + 1:], atol=1e-3)
    np.testing.assert_allclose(rtl_earlier[0, k:], rtl[0, k:], atol=1e-6)
    assert not np.allclose(rtl_earlier[0, :k], rtl[0, :k], atol=1e-3)
    # The other direction does see them (the towers are not constant).
    assert not np.allclose(rtl_later[0, :k + 1], rtl[0, :k + 1], atol=1e-3)
    assert not np.allclose(ltr_earlier[0, k:], ltr[0, k:], atol=1e-3)


def test_cloze_representation_at_t_is_left_t_minus_1_and_right_t_plus_1(pretrainer):
    gen = pretrainer.generator
    features = batch()
    ltr, rtl = towers(gen, features)
    out = gen(as_tensors(features), training=False)
    seq_out = out["sequence_output"].numpy()
    h = ltr.shape[-1]
    for t in range(SEQ):
        np.testing.assert_allclose(seq_out[:, t, :h], ltr[:, (t - 1) % SEQ], atol=1e-6)
        np.testing.assert_allclose(seq_out[:, t, h:], rtl[:, (t + 1) % SEQ], atol=1e-6)


def test_cloze_distribution_at_t_does_not_depend_on_token_t(pretrainer):
    gen = pretrainer.generator
    features = batch()
    base = gen(as_tensors(features), training=False)["cloze_logits"].numpy()
    for t in (1, 5, 12, 21):
        changed = {**features, "input_ids": features["input_ids"].copy()}
        changed["input_ids"][0, t] = (changed["input_ids"][0, t] + 11) % VOCAB or FIRST_WORD
        logits = gen(as_tensors(changed), training=False)["cloze_logits"].numpy()
        np.testing.assert_allclose(logits[0, t], base[0, t], atol=1e-5)
        # ... while its neighbours' do.
        assert not np.allclose(logits[0, t - 1], base[0, t - 1], atol=1e-4)
        assert not np.allclose(logits[0, t + 1], base[0, t + 1], atol=1e-4)


def test_generator_size_and_weight_sharing_follow_the_config():
    config = electric_config(generator_hidden_size=0.25)
    shared = ElectraPretrainer(config)
    gen = shared.generator
    assert gen.ltr.embeddings is shared.discriminator.embeddings is gen.rtl.embeddings
    assert gen.ltr.encoder is not gen.rtl.encoder
    assert gen.ltr.config.hidden_size == 16 == gen.rtl.config.hidden_size  # 64 * 0.25
    assert gen.ltr.embeddings_project is not gen.rtl.embeddings_project  # one per tower (E 32 != 16)
    assert tuple(gen.cloze_head.dense.kernel.shape) == (32, 32)  # 2 towers x 16 -> E
    untied = ElectraPretrainer(config.replace(embedding_sharing="untied")).generator
    assert untied.ltr.embeddings is not untied.rtl.embeddings
    assert untied.cloze_head.embeddings is untied.ltr.embeddings  # tied to the left tower's table
    assert tuple(untied.ltr.embeddings.word_embeddings.shape) == (VOCAB, 16)
    with pytest.raises(ConfigError, match="embedding_sharing"):
        electric_config(embedding_sharing="all", generator_hidden_size=1.0)


# --- the objective -------------------------------------------------------------------------------
def test_generator_reads_the_unmasked_input_and_cloze_loss_is_ce_over_candidates(pretrainer):
    features = batch()
    out = pretrainer.compute_objective(as_tensors(features), tf.constant([5, 1]), training=False)
    unmasked = pretrainer.generator(as_tensors(features), training=False)["cloze_logits"].numpy()
    np.testing.assert_allclose(out["cloze_logits"].numpy(), unmasked, atol=1e-5)
    log_q = log_softmax(unmasked)
    ids = features["input_ids"]
    ce = -np.take_along_axis(log_q, ids[..., None], -1)[..., 0]
    cand = candidates_of(features)
    np.testing.assert_array_equal(out["candidates"].numpy(), cand)
    assert cand.sum() < features["input_mask"].sum() - 8  # [CLS], [SEP]s and the [MASK] excluded
    np.testing.assert_allclose(float(out["cloze_loss"]), ce[cand].mean(), rtol=1e-5)


def test_masking_is_electras_and_samples_come_from_the_cloze_logits_there():
    features = batch(1)
    seed = tf.constant([9, 4])
    electric = ElectraPretrainer(electric_config(temperature=1e-7))
    electra = ElectraPretrainer(electric_config(objective="electra"))
    out = electric.compute_objective(as_tensors(features), seed, training=False)
    reference = electra.compute_objective(as_tensors(features), seed, training=False)["masked"]
    masked = out["masked"]
    for a, b in zip(masked, reference):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # At temperature -> 0 Gumbel-max sampling takes the argmax of the cloze logits at the slot.
    positions, weights = masked.positions.numpy(), masked.weights.numpy()
    logits = out["cloze_logits"].numpy()
    argmax = np.take_along_axis(logits.argmax(-1), positions, axis=1)
    live = weights > 0
    np.testing.assert_array_equal(out["sampled_ids"].numpy()[live], argmax[live])
    # ... written at the masked positions of the ORIGINAL ids, nothing else changed.
    disc_ids = out["disc_input_ids"].numpy()
    is_masked = masked.is_masked.numpy()
    np.testing.assert_array_equal(disc_ids[~is_masked], features["input_ids"][~is_masked])
    rows, cols = np.nonzero(live)
    np.testing.assert_array_equal(disc_ids[rows, positions[rows, cols]], argmax[rows, cols])


def test_every_sampled_position_is_fake_even_when_the_sample_is_the_original():
    """All words are one id whose output bias dominates: every sample equals the original.
    ELECTRA would label them real; Electric (NCE) labels every noise sample fake."""
    config = electric_config(temperature=1e-7)
    model = ElectraPretrainer(config)
    word = 17
    features = batch()
    ids = features["input_ids"]
    features["input_ids"] = np.where(candidates_of(features), word, ids).astype(np.int32)
    bias = model.generator.cloze_head.output_bias
    bias.assign(np.where(np.arange(VOCAB) == word, 100.0, 0.0).astype(np.float32))
    out = model.compute_objective(as_tensors(features), tf.constant([1, 2]), training=False)
    is_masked = out["masked"].is_masked.numpy()
    assert is_masked.sum() >= 8
    np.testing.assert_array_equal(out["disc_input_ids"].numpy(), features["input_ids"])
    np.testing.assert_array_equal(out["replaced_token_labels"].numpy(), is_masked.astype(np.int32))


def test_logit_is_energy_plus_log_q_of_the_token_present_plus_log_ratio(pretrainer):
    features = batch(2)
    out = pretrainer.compute_objective(as_tensors(features), tf.constant([3, 3]), training=False)
    disc_ids = out["disc_input_ids"].numpy()
    replaced = disc_ids != features["input_ids"]
    assert replaced.any()  # so "the token present" differs from "the original" somewhere
    energy = pretrainer.discriminator(
        {"input_ids": tf.constant(disc_ids), "input_mask": tf.constant(features["input_mask"]),
         "segment_ids": tf.constant(features["segment_ids"])}, training=False)["rtd_logits"].numpy()
    np.testing.assert_allclose(out["energy"].numpy(), energy, atol=1e-5)
    log_q = np.take_along_axis(log_softmax(out["cloze_logits"].numpy()), disc_ids[..., None], -1)[..., 0]
    ratio = math.log(0.15 / 0.85)
    assert noise_log_ratio(0.15) == pytest.approx(ratio)
    np.testing.assert_allclose(out["rtd_logits"].numpy(), energy + log_q + ratio, atol=1e-4)


def test_disc_loss_is_bce_over_real_tokens_and_total_is_the_weighted_sum():
    config = electric_config(gen_weight=0.7, disc_weight=13.0)
    model = ElectraPretrainer(config)
    features = batch(3)
    out = model.compute_objective(as_tensors(features), tf.constant([2, 8]), training=False)
    logits = out["rtd_logits"].numpy().astype(np.float64)
    labels = out["replaced_token_labels"].numpy()
    bce = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    real = features["input_mask"] > 0
    np.testing.assert_allclose(float(out["disc_loss"]), bce[real].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(out["loss"]),
                               0.7 * float(out["cloze_loss"]) + 13.0 * float(out["disc_loss"]),
                               rtol=1e-6)


def test_no_gradient_reaches_the_generator_through_log_q(pretrainer):
    features = as_tensors(batch(4))
    gen = pretrainer.generator
    own = [*gen.ltr.encoder.trainable_variables, *gen.rtl.encoder.trainable_variables,
           *gen.cloze_head.dense.trainable_variables, *gen.cloze_head.layer_norm.trainable_variables,
           gen.cloze_head.output_bias]
    with tf.GradientTape(persistent=True) as tape:
        out = pretrainer.compute_objective(features, tf.constant([4, 4]), training=True)
    disc_grads = tape.gradient(out["disc_loss"], own)
    cloze_grads = tape.gradient(out["cloze_loss"], own)
    assert all(g is None for g in disc_grads)
    assert all(g is not None for g in cloze_grads)


def test_trains_with_fit_and_reports_electric_metrics():
    model = ElectraPretrainer(electric_config(), seed=1)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = model.fit(untuned(tf.data.Dataset.from_tensors(batch()).repeat()), steps_per_epoch=3,
                        epochs=1, verbose=0).history
    for name in ("loss", "cloze_loss", "cloze_accuracy", "mlm_loss", "sampled_accuracy",
                 "disc_loss", "disc_accuracy", "disc_auc"):
        assert np.isfinite(history[name][-1]), name


def test_micro_batches_with_the_whole_batch_totals_add_up_to_the_whole_batch_loss():
    """Gradient accumulation's contract (`loss_totals`, `compute_objective(totals=...)`), with
    Electric's third count (cloze candidates). Argmax sampling: the micro-batch seed fold-in
    then changes nothing."""
    model = ElectraPretrainer(electric_config(temperature=1e-7))
    features = as_tensors(batch(6))
    seed = tf.constant([3, 7])
    whole = model.compute_objective(features, seed, training=False)
    totals = model.loss_totals(features, seed)
    assert totals.shape == (3,)
    parts = [model.compute_objective({k: v[i:i + 2] for k, v in features.items()}, seed,
                                     training=False, totals=totals, micro_batch=i // 2)
             for i in (0, 2)]
    for key in ("loss", "cloze_loss", "disc_loss", "mlm_loss"):
        np.testing.assert_allclose(sum(float(p[key]) for p in parts), float(whole[key]), rtol=1e-5)


def test_saves_and_loads_as_a_keras_model(tmp_path):
    model = ElectraPretrainer(electric_config(), seed=4)
    model.save(tmp_path / "electric.keras")
    loaded = keras.saving.load_model(tmp_path / "electric.keras")
    assert isinstance(loaded.generator, TwoTowerClozeGenerator)
    assert loaded.generator.ltr.embeddings is loaded.discriminator.embeddings  # sharing rebuilt
    seed = tf.constant([1, 1])
    a = model.compute_objective(as_tensors(batch()), seed, training=False)
    b = loaded.compute_objective(as_tensors(batch()), seed, training=False)
    np.testing.assert_array_equal(a["cloze_logits"].numpy(), b["cloze_logits"].numpy())
    np.testing.assert_array_equal(a["rtd_logits"].numpy(), b["rtd_logits"].numpy())


def test_flops_count_two_towers_and_a_cloze_head_at_every_position():
    config = electric_config()
    electra = training_flops_per_sequence(config.replace(objective="electra"), SEQ)
    electric = training_flops_per_sequence(config, SEQ)
    assert electric["discriminator_forward"] == electra["discriminator_forward"]
    g = config.generator_config()
    h, e, i = g.hidden_size, g.embedding_size, g.intermediate_size
    tower = SEQ * g.num_layers * (2 * (4 * h * h + 2 * h * i) + 4 * SEQ * h)  # E = h: no project
    head = SEQ * 2 * (2 * h * e + e * VOCAB)
    assert electric["generator_forward"] == 2 * tower + head


# --- under a strategy ----------------------------------------------------------------------------
def train_two_steps(strategy, initial_weights, features):
    """Two SGD steps of Electric (dropout off, argmax sampling: tests/same_step.py)."""
    return sgd_steps(strategy, lambda: ElectraPretrainer(electric_config(temperature=1e-7), seed=1),
                     initial_weights, features, ("loss", "cloze_loss", "disc_loss"))


@pytest.mark.slow
def test_mirrored_two_replicas_match_one_device():
    assert len(tf.config.list_logical_devices("CPU")) >= 2, "tests/conftest.py sets two CPUs"
    features = {k: np.concatenate([v, v[::-1]]) for k, v in batch(5).items()}  # 8 rows, uneven halves
    keras.utils.set_random_seed(0)
    initial = ElectraPretrainer(electric_config()).get_weights()
    assert_same_steps(train_two_steps(tf.distribute.OneDeviceStrategy("/cpu:0"), initial, features),
                      train_two_steps(two_cpu_mirrored(), initial, features), initial)
