"""In-graph dynamic masking and generator sampling (paper Section 2; the authors'
`pretrain/pretrain_helpers.py`: `mask`, `sample_from_softmax`).

Everything here is static-shape TensorFlow with stateless randomness, so it runs inside
`tf.function(jit_compile=True)` and on TPU with no host round trip.

Randomness for masking is keyed per example: a uniform draw is a hash of (step seed, the example's
token ids, slot index). The masks of an example therefore do not depend on which replica reads it
or on the per-replica batch size, which makes one-device and multi-replica runs comparable step for
step, and makes a resumed run re-draw exactly the masks of an uninterrupted one.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

_MASK32 = 0xFFFFFFFF


def _mix32(x):
    """A 32-bit integer finaliser (xorshift-multiply), computed in int64 without overflow."""
    x = tf.bitwise.bitwise_and(x, _MASK32)
    x = tf.bitwise.bitwise_and((x ^ tf.bitwise.right_shift(x, 16)) * 0x7FEB352D, _MASK32)
    x = tf.bitwise.bitwise_and((x ^ tf.bitwise.right_shift(x, 15)) * 0x2C1B3C6D, _MASK32)
    return x ^ tf.bitwise.right_shift(x, 16)


def example_keys(seed, input_ids):
    """One 32-bit key per example from the step seed and the example's ids. -> int64 [batch]."""
    ids = tf.cast(input_ids, tf.int64)
    positions = tf.range(tf.shape(ids)[1], dtype=tf.int64)[None, :]
    content = tf.reduce_sum(_mix32(ids * 1_000_003 + positions), axis=1)  # [batch]
    seed = tf.cast(seed, tf.int64)
    return _mix32(_mix32(content) ^ _mix32(seed[0] * 0x9E3779B1 + seed[1]))


def keyed_uniform(keys, num_draws: int, stream: int):
    """Uniform [0, 1) floats [batch, num_draws], a pure function of (key, stream, draw index)."""
    counters = tf.range(num_draws, dtype=tf.int64)[None, :] + stream * 0x10000
    bits = _mix32(_mix32(keys[:, None] ^ counters * 0x5BD1E995) + counters)
    return tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) / float(1 << 24)


class MaskedBatch(NamedTuple):
    """The result of `mask_tokens`.

    masked_input_ids: [batch, seq] ids fed to the generator ([MASK] at ~85% of the chosen positions).
    positions: [batch, n] chosen positions; unused and duplicate slots point at 0.
    masked_ids: [batch, n] original ids at `positions` (0 where the weight is 0).
    weights: [batch, n] 1.0 for a live slot, 0.0 for unused or duplicate slots.
    is_masked: [batch, seq] bool, True at every chosen position.
    """

    masked_input_ids: tf.Tensor
    positions: tf.Tensor
    masked_ids: tf.Tensor
    weights: tf.Tensor
    is_masked: tf.Tensor


def scatter_slots(values, positions, weights, seq_length):
    """Writes per-slot values [batch, n] at positions [batch, n] -> [batch, seq] (0 elsewhere).

    Uses a one-hot contraction instead of a scatter: static shapes, and fast on TPU/XLA.
    Slots with weight 0 write nothing; live slots never collide (duplicates are dropped).
    """
    one_hot = tf.one_hot(positions, seq_length, dtype=values.dtype)  # [batch, n, seq]
    live = tf.cast(weights, values.dtype)[:, :, None]
    return tf.reduce_sum(one_hot * live * values[:, :, None], axis=1)


def mask_tokens(input_ids, input_mask, seed, *, mask_prob: float, num_slots: int,
                mask_token_id: int, special_ids, keep_original_prob: float = 0.15) -> MaskedBatch:
    """Chooses positions to mask, as the original `pretrain_helpers.mask`.

    - Candidates: real tokens (input_mask = 1) that are not special ([CLS], [SEP], [MASK]).
    - Slots per sequence: max(1, min(num_slots, round(num_real_tokens * mask_prob))), where
      num_real_tokens counts [CLS] and [SEP] and `round` is half-to-even (TF1 `tf.round`).
    - Positions are drawn uniformly from the candidates with replacement; a duplicate slot keeps
      weight 0, so each chosen position is masked, predicted and counted once. (The original
      wrote duplicates once but counted them twice in the MLM loss; we count them once.)
    - 85% of the chosen positions show [MASK] to the generator, 15% keep their token. There is no
      random-token branch (unlike BERT).

    Args:
      input_ids, input_mask: int [batch, seq].
      seed: int [2], the step seed; draws are keyed per example (see module docstring).
    """
    input_ids = tf.convert_to_tensor(input_ids)
    batch_size, seq_length = tf.shape(input_ids)[0], input_ids.shape[1]
    real = tf.cast(input_mask, tf.bool)
    candidates = real
    for special in special_ids:
        candidates &= tf.not_equal(input_ids, special)
    candidates_i = tf.cast(candidates, tf.int32)  # [batch, seq]

    num_real = tf.reduce_sum(tf.cast(real, tf.float32), axis=1)
    num_to_predict = tf.maximum(1, tf.minimum(
        num_slots, tf.cast(tf.round(num_real * mask_prob), tf.int32)))  # [batch]
    num_candidates = tf.reduce_sum(candidates_i, axis=1)  # [batch]
    weights = tf.sequence_mask(num_to_predict, num_slots, dtype=tf.float32)  # [batch, n]
    weights *= tf.cast(num_candidates > 0, tf.float32)[:, None]

    keys = example_keys(seed, input_ids)
    u_position = keyed_uniform(keys, num_slots, stream=1)
    u_keep = keyed_uniform(keys, num_slots, stream=2)

    # k-th candidate, k uniform in [0, num_candidates): the first position whose running count of
    # candidates exceeds k. (Equal to sampling from the uniform distribution over candidates.)
    k = tf.minimum(tf.cast(u_position * tf.cast(num_candidates[:, None], tf.float32), tf.int32),
                   tf.maximum(num_candidates[:, None] - 1, 0))  # [batch, n]
    running = tf.cumsum(candidates_i, axis=1)  # [batch, seq]
    positions = tf.reduce_sum(
        tf.cast(running[:, None, :] <= k[:, :, None], tf.int32), axis=2)  # [batch, n]
    positions = tf.minimum(positions, seq_length - 1)

    # Drop duplicates: a slot whose position an earlier live slot already holds.
    same = tf.equal(positions[:, :, None], positions[:, None, :])  # [batch, n, n]
    earlier = tf.linalg.band_part(tf.ones((num_slots, num_slots), tf.bool), -1, 0)
    earlier &= ~tf.eye(num_slots, dtype=tf.bool)  # strictly lower triangle: m < n
    live_before = same & earlier[None] & (weights[:, None, :] > 0)
    weights *= 1.0 - tf.cast(tf.reduce_any(live_before, axis=2), tf.float32)
    positions *= tf.cast(weights, tf.int32)

    masked_ids = tf.gather(input_ids, positions, batch_dims=1) * tf.cast(weights, input_ids.dtype)
    is_masked = scatter_slots(weights, positions, weights, seq_length) > 0  # [batch, seq]
    show_mask = tf.cast(u_keep >= keep_original_prob, tf.float32)
    shows_mask = scatter_slots(show_mask, positions, weights, seq_length) > 0
    masked_input_ids = tf.where(shows_mask, tf.cast(mask_token_id, input_ids.dtype), input_ids)
    del batch_size
    return MaskedBatch(masked_input_ids, positions, masked_ids, weights, is_masked)


def stateless_unit_floats(shape, seed):
    """float32 uniforms in [0, 1): `tf.random.stateless_uniform(shape, seed)`'s values, made the
    same way inside and outside XLA.

    TensorFlow's kernel turns each 32-bit Philox output into a float by its 23 low bits (the
    mantissa of a number in [1, 2), minus 1); XLA's lowering of the same op converts the same
    bits otherwise, so a step compiled with XLA drew other Gumbel noise, and sampled other
    tokens, than the same step as a graph. The bits themselves agree, so the conversion is done
    here, as the kernel does it: the graph's draws are unchanged (bit for bit) and the XLA-
    compiled step draws them too (tests/models/test_masking.py)."""
    bits = tf.random.stateless_uniform(shape, seed, minval=None, maxval=None, dtype=tf.uint32)
    mantissa = tf.bitwise.bitwise_or(tf.bitwise.bitwise_and(bits, 0x7FFFFF), 0x3F800000)
    return tf.bitcast(mantissa, tf.float32) - 1.0


def sample_replacements(mlm_logits, seed, *, temperature: float = 1.0, disallow_ids=None):
    """Gumbel-max sampling from the generator: argmax(logits / T + g), g = -log(-log(u+1e-9)+1e-9).

    Args:
      mlm_logits: float32 [batch, n, vocab], the generator's logits at the masked slots.
      seed: int [2] stateless seed (fold the replica id in under a multi-replica strategy).
      disallow_ids: [batch, n] ids whose logit is lowered by 1000 (`disallow_correct`), or None.

    Returns [batch, n] int32 sampled ids. No gradient flows through the sample.
    """
    logits = tf.stop_gradient(tf.cast(mlm_logits, tf.float32)) / temperature
    if disallow_ids is not None:
        logits -= 1000.0 * tf.one_hot(disallow_ids, tf.shape(logits)[-1], dtype=tf.float32)
    uniform = stateless_unit_floats(tf.shape(logits), seed)
    gumbel = -tf.math.log(-tf.math.log(uniform + 1e-9) + 1e-9)
    return tf.argmax(logits + gumbel, axis=-1, output_type=tf.int32)


def replace_tokens(input_ids, sampled_ids, batch: MaskedBatch):
    """Writes the generator's samples into the ORIGINAL ids at every chosen position.

    Returns (discriminator input ids [batch, seq], replaced_token_labels [batch, seq] int32): a
    position is "replaced" (1) when it was chosen AND the sample differs from the original; a
    correct sample is labelled real (paper Section 2).
    """
    seq_length = input_ids.shape[1]
    sampled = tf.cast(sampled_ids, input_ids.dtype)
    written = scatter_slots(sampled, batch.positions, batch.weights, seq_length)
    updated = tf.where(batch.is_masked, written, input_ids)
    labels = tf.cast(batch.is_masked & tf.not_equal(updated, input_ids), tf.int32)
    return updated, labels
