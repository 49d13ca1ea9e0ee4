"""Dynamic masking and sampling, checked statistically against the authors' rules
(`pretrain/pretrain_helpers.py`)."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.models import masking

CLS, SEP, MASK, PAD = 101, 102, 103, 0
SPECIALS = (CLS, SEP, MASK)


def make_batch(lengths, seq_length=64, seed=0):
    """[CLS] w... [SEP] then padding; ordinary ids in [1000, 30000)."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), seq_length), np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1000, 30000, n)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
    return ids, mask


def run_mask(ids, mask, seed=(1, 2), num_slots=None, mask_prob=0.15):
    num_slots = num_slots or int((mask_prob + 0.005) * ids.shape[1])
    out = masking.mask_tokens(tf.constant(ids), tf.constant(mask), tf.constant(seed, tf.int64),
                              mask_prob=mask_prob, num_slots=num_slots, mask_token_id=MASK,
                              special_ids=SPECIALS)
    return {k: v.numpy() for k, v in out._asdict().items()}


def test_never_masks_specials_or_padding_and_masked_ids_are_the_originals():
    ids, mask = make_batch([64, 40, 10, 3] * 64)
    out = run_mask(ids, mask)
    special = np.isin(ids, SPECIALS) | (mask == 0)
    assert not (out["is_masked"] & special).any()
    rows = np.arange(len(ids))[:, None]
    live = out["weights"] > 0
    np.testing.assert_array_equal(out["masked_ids"][live], ids[rows, out["positions"]][live])
    np.testing.assert_array_equal(out["masked_ids"][~live], 0)
    np.testing.assert_array_equal(out["positions"][~live], 0)
    # Unchosen positions are untouched in the generator's input.
    np.testing.assert_array_equal(out["masked_input_ids"][~out["is_masked"]], ids[~out["is_masked"]])


@pytest.mark.parametrize("length,expected_slots", [
    (3, 1),    # round(0.45) = 0 -> at least one
    (10, 2),   # round(1.5) = 2 (half to even)
    (17, 2),   # round(2.55) = 3? no: 17 * 0.15 = 2.55 -> 3
    (64, 9),   # min(9, round(9.6) = 10) -> N = int(0.155 * 64) = 9
])
def test_count_rule(length, expected_slots):
    if length == 17:
        expected_slots = 3
    ids, mask = make_batch([length] * 2000, seed=length)
    out = run_mask(ids, mask)
    distinct = out["is_masked"].sum(1)
    # Duplicates collapse, so the distinct count is at most the slot count and reaches it often.
    assert distinct.max() == expected_slots
    assert (distinct >= 1).all()
    np.testing.assert_array_equal(distinct, out["weights"].sum(1))
    # Draws are with replacement: the mean distinct count matches K (1 - (1 - 1/K)^m).
    candidates = length - 2
    expected = candidates * (1 - (1 - 1 / candidates) ** expected_slots)
    assert abs(distinct.mean() - expected) < 0.05 * expected_slots + 0.02


def test_short_sequence_masks_its_only_word():
    ids, mask = make_batch([3] * 50)
    out = run_mask(ids, mask)
    assert out["is_masked"][:, 1].all() and out["is_masked"].sum() == 50


def test_fraction_uniformity_and_85_15_split():
    ids, mask = make_batch([128] * 4000, seq_length=128)
    out = run_mask(ids, mask)
    chosen = out["is_masked"]
    # 19 draws from 126 candidates with replacement: E[distinct] = 126 (1 - (125/126)^19).
    expected = 126 * (1 - (125 / 126) ** 19)
    assert abs(chosen.sum(1).mean() - expected) < 0.05
    shown_mask = out["masked_input_ids"] == MASK
    assert not (shown_mask & ~chosen).any()
    assert shown_mask.sum() / chosen.sum() == pytest.approx(0.85, abs=0.01)
    # Kept-original positions keep their token (no random-token branch).
    kept = chosen & ~shown_mask
    np.testing.assert_array_equal(out["masked_input_ids"][kept], ids[kept])
    # Uniform over the candidates 1..126.
    per_position = chosen[:, 1:127].mean(0)
    assert per_position.std() / per_position.mean() < 0.06


def test_masks_are_keyed_per_example_and_per_step():
    ids, mask = make_batch([50, 60, 30, 64], seed=3)
    full = run_mask(ids, mask, seed=(5, 7))
    alone = run_mask(ids[2:3], mask[2:3], seed=(5, 7))
    np.testing.assert_array_equal(full["is_masked"][2], alone["is_masked"][0])
    np.testing.assert_array_equal(full["masked_input_ids"][2], alone["masked_input_ids"][0])
    other_step = run_mask(ids, mask, seed=(5, 8))
    assert (other_step["is_masked"] != full["is_masked"]).any()


def test_gumbel_sampling_matches_the_softmax_and_disallow_correct():
    logits = np.log(np.array([[0.6, 0.3, 0.1]], np.float32))
    logits = np.repeat(logits[None], 20000, axis=1)  # [1, 20000, 3]
    sampled = masking.sample_replacements(tf.constant(logits), tf.constant([3, 4], tf.int64)).numpy()
    freq = np.bincount(sampled.ravel(), minlength=3) / sampled.size
    np.testing.assert_allclose(freq, [0.6, 0.3, 0.1], atol=0.015)
    # Temperature 0.5 sharpens: p^2 normalised.
    sharp = masking.sample_replacements(tf.constant(logits), tf.constant([3, 4], tf.int64),
                                        temperature=0.5).numpy()
    p2 = np.array([0.36, 0.09, 0.01]) / 0.46
    np.testing.assert_allclose(np.bincount(sharp.ravel(), minlength=3) / sharp.size, p2, atol=0.015)
    disallowed = np.zeros((1, 20000), np.int32)
    never_zero = masking.sample_replacements(tf.constant(logits), tf.constant([3, 4], tf.int64),
                                             disallow_ids=tf.constant(disallowed)).numpy()
    assert (never_zero != 0).all()


def test_the_noise_is_tensorflows_uniform_and_the_same_under_xla():
    """`stateless_unit_floats` is `tf.random.stateless_uniform` bit for bit as a graph, and gives
    the same floats inside an XLA cluster, where TensorFlow's own op converts the bits otherwise:
    so the XLA-compiled step samples the tokens the graph samples."""
    seed = tf.constant([5, 9], tf.int64)
    shape = [3, 37, 11]

    def draws():
        return (masking.stateless_unit_floats(shape, seed),
                tf.random.stateless_uniform(shape, seed, dtype=tf.float32))

    ours, theirs = tf.function(draws)()
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ours_xla, theirs_xla = tf.function(draws, jit_compile=True)()
    np.testing.assert_array_equal(ours_xla.numpy(), ours.numpy())
    assert not np.array_equal(theirs_xla.numpy(), theirs.numpy())  # why the helper exists
    assert 0.0 <= ours.numpy().min() and ours.numpy().max() < 1.0

    logits = tf.random.stateless_normal([4, 19, 50], [1, 1])
    sample = lambda: masking.sample_replacements(logits, seed)  # noqa: E731
    np.testing.assert_array_equal(tf.function(sample)().numpy(),
                                  tf.function(sample, jit_compile=True)().numpy())


def test_replace_tokens_labels_a_correct_sample_real():
    ids, mask = make_batch([40] * 8)
    out = run_mask(ids, mask)
    batch = masking.MaskedBatch(*[tf.constant(out[k]) for k in masking.MaskedBatch._fields])
    same, labels = masking.replace_tokens(tf.constant(ids), tf.constant(out["masked_ids"]), batch)
    np.testing.assert_array_equal(same.numpy(), ids)
    assert labels.numpy().sum() == 0
    wrong = tf.constant(out["masked_ids"] + 1)
    updated, labels = masking.replace_tokens(tf.constant(ids), wrong, batch)
    np.testing.assert_array_equal(labels.numpy(), out["is_masked"].astype(np.int32))
    np.testing.assert_array_equal(updated.numpy()[out["is_masked"]], ids[out["is_masked"]] + 1)
