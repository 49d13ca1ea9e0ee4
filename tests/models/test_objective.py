"""The pretraining objective as `ElectraPretrainer` computes it, checked against independent rules.

Everything goes through the pretrainer (not only the `masking` helpers), so these tests also pin
what `compute_objective`, `step_seed` and the replica fold-in pass to the helpers: the special ids
masking skips, the count the MLM loss is normalised by, the sampling temperature, and fresh
randomness at every optimizer step and on every replica. References: Clark et al. 2020, Section 2,
and the authors' `pretrain/pretrain_helpers.py` (`mask`, `sample_from_softmax`) and
`run_pretraining.py` (`PretrainingModel`: the MLM and discriminator losses and their sum).
"""

import numpy as np
import pytest
import tensorflow as tf
import keras

from electra_tf.config import ElectraConfig
from electra_tf.models import ElectraPretrainer
from two_cpus import two_cpu_mirrored

VOCAB, SEQ = 512, 64
# A learned-vocab layout rather than BERT's 101/102/103, so the pretrainer must pass the ids of
# its config to masking (not defaults).
PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIALS = (CLS, SEP, MASK)
FIRST_WORD = 5


def tiny_config(**changes):
    """electra_tiny with the default objective (disc_weight 50, mask_prob 0.15, temperature 1)."""
    return ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
        mask_token_id=MASK, **changes)


def make_row(rng, segments, seq=SEQ, masks_at=()):
    """[CLS] A [SEP] (B [SEP]) then padding, words in [FIRST_WORD, VOCAB); [MASK] at `masks_at`."""
    ids = [CLS]
    for length in segments:
        ids += list(rng.integers(FIRST_WORD, VOCAB, length)) + [SEP]
    for i in masks_at:
        ids[i] = MASK
    assert len(ids) <= seq
    return ids + [PAD] * (seq - len(ids)), [1] * len(ids) + [0] * (seq - len(ids))


def padded_batch(seed=0):
    """Rows of different real lengths; single segments and pairs ([SEP] mid-row and at the end);
    a real [MASK] token in the input; a row with no maskable token at all."""
    rng = np.random.default_rng(seed)
    rows = [
        make_row(rng, [62]),                  # 64 real tokens, no padding: min(N = 9, round(9.6))
        make_row(rng, [10, 15]),              # pair, 28 real: round(4.2) = 4
        make_row(rng, [7, 7]),                # pair, 17 real: round(2.55) = 3 (2 without specials)
        make_row(rng, [28], masks_at=(5, 9)),  # 30 real with two [MASK]s: round(4.5) = 4 (to even)
        make_row(rng, [48]),                  # 50 real: round(7.5) = 8
        make_row(rng, [4, 3]),                # pair, 10 real: round(1.5) = 2
        make_row(rng, [1]),                   # [CLS] w [SEP]: round(0.45) = 0 -> at least 1
        make_row(rng, [0]),                   # [CLS] [SEP]: nothing to mask
    ]
    ids = np.array([r[0] for r in rows], np.int32)
    mask = np.array([r[1] for r in rows], np.int32)
    segments = np.zeros_like(ids)
    for row in range(len(ids)):  # segment 1 after the first [SEP]
        first_sep = np.flatnonzero(ids[row] == SEP)[0]
        segments[row, first_sep + 1:] = mask[row, first_sep + 1:]
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def as_tensors(features):
    return {k: tf.constant(v) for k, v in features.items()}


def slots_rule(input_mask, mask_prob, num_slots):
    """The original's count: max(1, min(N, round(num_real_tokens * mask_prob))), with
    num_real_tokens counting [CLS]/[SEP] and TF1's float32 half-to-even round."""
    num_real = input_mask.sum(1).astype(np.float32)
    rounded = np.round(num_real * np.float32(mask_prob)).astype(np.int64)  # numpy: half to even
    return np.maximum(1, np.minimum(num_slots, rounded))


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def sigmoid_xent(logits, labels):
    return np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))


# --- 1. the loss ---------------------------------------------------------------------------------
def test_loss_matches_a_numpy_reference_on_a_padded_batch():
    c = tiny_config()
    assert (c.disc_weight, c.mask_prob, c.temperature, c.objective) == (50.0, 0.15, 1.0, "electra")
    p = ElectraPretrainer(c, seed=3)
    features = padded_batch()
    ids, mask = features["input_ids"], features["input_mask"]
    out = p.compute_objective(as_tensors(features), tf.constant([3, 11], tf.int64), training=False)
    m = {k: v.numpy() for k, v in out["masked"]._asdict().items()}
    positions, weights, live = m["positions"], m["weights"], m["weights"] > 0
    assert live.sum() > 10
    rows = np.arange(len(ids))[:, None]
    np.testing.assert_array_equal(m["masked_ids"][live], ids[rows, positions][live])

    # MLM: the generator's logits over the whole [MASK]ed sequence, gathered here, then mean
    # cross-entropy over the LIVE slots (run_pretraining.py `_get_masked_lm_output`).
    gen_inputs = {"input_ids": tf.constant(m["masked_input_ids"]), "input_mask": tf.constant(mask),
                  "segment_ids": tf.constant(features["segment_ids"])}
    gen_logits = p.generator(gen_inputs, training=False)["mlm_logits"].numpy()  # [batch, seq, V]
    slot_logits = gen_logits[rows, positions]  # [batch, n, V]
    xent = -np.take_along_axis(log_softmax(slot_logits.astype(np.float64)),
                               m["masked_ids"][..., None], -1)[..., 0]
    mlm_loss = (xent * weights).sum() / weights.sum()
    np.testing.assert_allclose(out["mlm_loss"], mlm_loss, rtol=1e-5)

    # Discriminator input and labels rebuilt from the samples: originals with the samples written
    # in at the chosen positions; "replaced" = chosen and different (a correct sample is real).
    sampled = out["sampled_ids"].numpy()
    disc_ids = ids.copy()
    chosen = np.zeros(ids.shape, bool)
    for r, n in zip(*np.nonzero(live)):
        disc_ids[r, positions[r, n]] = sampled[r, n]
        chosen[r, positions[r, n]] = True
    np.testing.assert_array_equal(m["is_masked"], chosen)
    np.testing.assert_array_equal(out["disc_input_ids"], disc_ids)
    labels = (chosen & (disc_ids != ids)).astype(np.int32)
    np.testing.assert_array_equal(out["replaced_token_labels"], labels)
    disc_logits = p.discriminator(
        {"input_ids": tf.constant(disc_ids), "input_mask": tf.constant(mask),
         "segment_ids": tf.constant(features["segment_ids"])}, training=False)["rtd_logits"].numpy()
    np.testing.assert_allclose(out["rtd_logits"], disc_logits, rtol=1e-5, atol=1e-6)

    # RTD: sigmoid cross-entropy averaged over the REAL tokens ([CLS]/[SEP] in, padding out).
    rtd_loss = (sigmoid_xent(disc_logits.astype(np.float64), labels) * mask).sum() / mask.sum()
    np.testing.assert_allclose(out["disc_loss"], rtd_loss, rtol=1e-5)
    np.testing.assert_allclose(out["loss"], mlm_loss + 50.0 * rtd_loss, rtol=1e-5)


# --- 2. masking, as the pretrainer does it --------------------------------------------------------
def masks_over_seeds(p, features, seeds):
    """compute_objective over many step seeds; also records what the generator was fed."""
    fed = {}
    generator_call = p.generator.call

    def spy(inputs, *args, **kwargs):
        fed.update(inputs=dict(inputs), positions=kwargs.get("positions"))
        return generator_call(inputs, *args, **kwargs)

    tensors = as_tensors(features)

    @tf.function
    def run(seed):
        out = p.compute_objective(tensors, seed, training=False)
        return out["masked"]._asdict(), fed["inputs"], fed["positions"]

    p.generator.call = spy
    try:
        results = [run(tf.constant([7, s], tf.int64)) for s in seeds]
    finally:
        del p.generator.call
    masked = {k: np.stack([r[0][k].numpy() for r in results]) for k in results[0][0]}
    fed_inputs = {k: np.stack([r[1][k].numpy() for r in results]) for k in results[0][1]}
    fed_positions = np.stack([r[2].numpy() for r in results])
    return masked, fed_inputs, fed_positions


def test_masking_through_the_pretrainer_over_many_steps():
    c = tiny_config()
    p = ElectraPretrainer(c)
    features = padded_batch(seed=1)
    ids, mask = features["input_ids"], features["input_mask"]
    num_slots = c.num_masked_slots(SEQ)
    assert num_slots == 9  # int((0.15 + 0.005) * 64), the original's max_predictions_per_seq
    m, fed, fed_positions = masks_over_seeds(p, features, range(200))
    is_masked, weights, positions = m["is_masked"], m["weights"], m["positions"]  # [seeds, ...]
    assert weights.shape == (200, len(ids), num_slots)

    # Specials ([CLS], [SEP] mid-pair and final, [MASK]) and padding are never chosen.
    not_candidate = np.isin(ids, SPECIALS) | (mask == 0)
    assert not (is_masked & not_candidate[None]).any()
    # Every ordinary real token is chosen at some step (the candidates are exactly those).
    np.testing.assert_array_equal(is_masked.any(0), ~not_candidate)

    # The count rule. Slots are drawn with replacement and a duplicate slot is dropped (weight 0,
    # position 0), so from outside only this is exact: live slots lie within the first `rule`
    # slots, slot 0 is always live (a first draw is never a duplicate), live positions are
    # distinct, and the last live slot reaches `rule` at some step. A row with no candidate has
    # no live slot.
    rule = slots_rule(mask, c.mask_prob, num_slots)
    np.testing.assert_array_equal(rule, [9, 4, 3, 4, 8, 2, 1, 1])  # hand-computed in padded_batch
    has_candidates = (~not_candidate).any(1)
    live = weights > 0
    slot_index = np.arange(num_slots)
    assert not (live & (slot_index[None, None, :] >= rule[None, :, None])).any()
    np.testing.assert_array_equal(live[:, :, 0], np.broadcast_to(has_candidates, live.shape[:2]))
    assert not live[:, ~has_candidates].any()
    window = np.where(live, slot_index + 1, 0).max(2)  # [seeds, batch]: last live slot + 1
    np.testing.assert_array_equal(window.max(0), np.where(has_candidates, rule, 0))
    np.testing.assert_array_equal(is_masked.sum(2), weights.sum(2))  # one chosen position per slot
    # ... and statistically: `rule` draws with replacement from K candidates leave
    # K (1 - (1 - 1/K)^rule) distinct positions on average.
    k = (~not_candidate).sum(1)
    for row in np.flatnonzero(has_candidates):
        expected = k[row] * (1 - (1 - 1 / k[row]) ** rule[row])
        assert abs(is_masked[:, row].sum(1).mean() - expected) < 0.2, (row, rule[row], expected)

    # The generator is fed the [MASK]ed ids (85% [MASK], 15% the original token, no random
    # token), the unchanged input mask and segments, and the chosen positions.
    np.testing.assert_array_equal(fed["input_ids"], m["masked_input_ids"])
    np.testing.assert_array_equal(fed["input_mask"], np.broadcast_to(mask, fed["input_mask"].shape))
    np.testing.assert_array_equal(fed["segment_ids"],
                                  np.broadcast_to(features["segment_ids"], fed["input_mask"].shape))
    np.testing.assert_array_equal(fed_positions, positions)
    originals = np.broadcast_to(ids, is_masked.shape)
    np.testing.assert_array_equal(fed["input_ids"][~is_masked], originals[~is_masked])
    shown = fed["input_ids"][is_masked]
    assert ((shown == MASK) | (shown == originals[is_masked])).all()
    assert is_masked.sum() > 4000
    assert (shown == MASK).mean() == pytest.approx(0.85, abs=0.02)


# --- 3. sampling temperature ----------------------------------------------------------------------
def test_samples_follow_the_generator_softmax_at_temperature_one():
    p = ElectraPretrainer(tiny_config())
    head = p.generator.lm_head
    # LayerNorm gamma = beta = 0 makes the head's hidden state 0, so logits = output_bias exactly.
    head.layer_norm.gamma.assign(tf.zeros_like(head.layer_norm.gamma))
    head.layer_norm.beta.assign(tf.zeros_like(head.layer_norm.beta))
    tokens = np.array([300, 301, 302, 303, 304])
    probs = np.array([0.35, 0.25, 0.2, 0.15, 0.05])
    bias = np.full(VOCAB, -60.0, np.float32)  # never sampled at T <= 1: Gumbel noise is in [-3, 17]
    bias[tokens] = np.log(probs) + 1.7  # softmax is shift-invariant
    head.output_bias.assign(bias)
    rng = np.random.default_rng(5)
    rows = [make_row(rng, [62]) for _ in range(16)]
    features = as_tensors({"input_ids": np.array([r[0] for r in rows], np.int32),
                           "input_mask": np.array([r[1] for r in rows], np.int32)})

    @tf.function
    def run(seed):
        out = p.compute_objective(features, seed, training=False)
        return out["sampled_ids"], out["masked"].weights

    samples = []
    for step in range(40):
        sampled, weights = run(tf.constant([2, step], tf.int64))
        samples.append(sampled.numpy()[weights.numpy() > 0])
    samples = np.concatenate(samples)
    assert len(samples) > 5000 and np.isin(samples, tokens).all()
    counts = np.array([(samples == t).sum() for t in tokens])
    expected = probs * len(samples)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    # 18.47 is the 0.999 quantile of chi-square with 4 degrees of freedom. At T = 0.5 the
    # frequencies would be p^2 / sum(p^2) = (0.49, 0.25, 0.16, 0.09, 0.01): chi2 in the hundreds.
    assert chi2 < 18.47, (counts / len(samples), chi2)
    np.testing.assert_allclose(counts / len(samples), probs, atol=0.02)


# --- 4. fresh randomness per step and per replica -------------------------------------------------
def traced_train_step(p):
    """train_step in a tf.function (as fit runs it), also returning the seed and masks it drew."""
    seen = {}
    compute_objective = p.compute_objective

    def spy(features, seed, training=True):
        out = compute_objective(features, seed, training)
        seen.update(seed=seed, is_masked=out["masked"].is_masked, sampled=out["sampled_ids"])
        return out

    p.compute_objective = spy

    @tf.function
    def step(batch):
        p.train_step(batch)
        return seen["seed"], seen["is_masked"], seen["sampled"]

    return step


def test_masks_change_with_the_optimizer_step_and_resume_exactly():
    features = as_tensors(padded_batch(seed=2))
    p = ElectraPretrainer(tiny_config(), seed=4)
    p.compile(optimizer=keras.optimizers.Adam(1e-3))
    p.optimizer.build(p.trainable_variables)
    step = traced_train_step(p)
    seeds, masks, samples = zip(*[[x.numpy() for x in step(features)] for _ in range(3)])
    assert int(p.optimizer.iterations) == 3
    assert len({tuple(s) for s in seeds}) == 3
    for a, b in [(0, 1), (1, 2), (0, 2)]:
        assert (masks[a] != masks[b]).any(), (a, b)
    assert (samples[0] != samples[1]).any()
    # A run resumed at step 1 (same seed, optimizer at iteration 1) re-draws step 1's masks.
    resumed = ElectraPretrainer(tiny_config(), seed=4)
    resumed.compile(optimizer=keras.optimizers.Adam(1e-3))
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.optimizer.iterations.assign(1)
    seed, mask, _ = [x.numpy() for x in traced_train_step(resumed)(features)]
    np.testing.assert_array_equal(seed, seeds[1])
    np.testing.assert_array_equal(mask, masks[1])


def test_replicas_draw_different_samples_but_mask_an_example_the_same():
    devices = tf.config.list_logical_devices("CPU")
    assert len(devices) >= 2, "tests/conftest.py configures two logical CPUs"
    strategy = two_cpu_mirrored()
    with strategy.scope():
        p = ElectraPretrainer(tiny_config(), seed=6)
    features = as_tensors(padded_batch(seed=3))
    same_examples = strategy.experimental_distribute_values_from_function(lambda ctx: features)
    seed = tf.constant([6, 5], tf.int64)

    @tf.function
    def run(batch):
        def replica_fn(f):
            out = p.compute_objective(f, seed, training=False)
            masked = out["masked"]
            return masked.is_masked, masked.masked_input_ids, out["sampled_ids"], masked.weights
        return strategy.run(replica_fn, args=(batch,))

    per_replica = [[x.numpy() for x in strategy.experimental_local_results(t)]
                   for t in run(same_examples)]
    (mask0, mask1), (ids0, ids1), (sampled0, sampled1), (w0, w1) = per_replica
    # Masks are keyed per example: the same example gets the same mask on either replica, and the
    # same as on one device.
    np.testing.assert_array_equal(mask0, mask1)
    np.testing.assert_array_equal(ids0, ids1)
    one_device = p.compute_objective(features, seed, training=False)["masked"]
    np.testing.assert_array_equal(mask0, one_device.is_masked.numpy())
    # The generator samples fold in the replica id: a random-init generator over 512 ids would
    # agree with itself on well under half of the live slots.
    live = (w0 > 0) & (w1 > 0)
    assert live.sum() > 10
    assert (sampled0 != sampled1)[live].mean() > 0.5
