"""What every pretraining objective is built from: the step's masks, global normalisation, the
generator's terms, and the `Objective` interface that `ElectraPretrainer` holds.

A leaf of `electra_tf.models` (it imports `masking` and TensorFlow only), as the authors'
`pretrain/pretrain_helpers.py` is the leaf both of their objectives use: `objectives.py` (the
paper's Table 5 objectives) and `electric.py` (Electric) build on it, and the pretrainer on them.
"""

from __future__ import annotations

import tensorflow as tf

from electra_tf.models import masking


def global_sum(x):
    """Sums `x` over replicas when called in a multi-replica context (identity otherwise).

    Losses are normalised by the GLOBAL count of weighted tokens, so the per-replica losses add
    up to exactly the one-device loss of the same global batch.
    """
    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return x
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x)


def weighted_mean(values, weights, global_total):
    """sum(values * weights) / (global_total + 1e-6): a replica's share of the global mean.

    `global_total` is sum(weights) over all replicas (see `Objective.compute`: every total of a
    step comes from ONE all-reduce, issued before any loss, so the replicas' collectives always
    line up).
    """
    weights = tf.cast(weights, tf.float32)
    return tf.reduce_sum(values * weights) / (global_total + 1e-6)


def sampling_seed(seed, micro_batch=None):
    """The seed of the generator's samples: `seed` folded with the replica id (replicas sample
    different tokens, while masks stay keyed per example) and with the micro-batch index."""
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        seed = tf.random.experimental.stateless_fold_in(
            seed, tf.cast(ctx.replica_id_in_sync_group, tf.int64))
    if micro_batch is not None:
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(micro_batch, tf.int64))
    return seed


def mlm_loss_terms(logits, labels, weights, global_total):
    """Cross-entropy and correctness per slot. logits [..., V] float32, labels [...] int."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32),
                                                            logits=logits)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               tf.cast(labels, tf.int32)), tf.float32)
    return weighted_mean(losses, weights, global_total), correct


def choose_masks(config, input_ids, input_mask, seed) -> masking.MaskedBatch:
    """The step's masked positions (`masking.mask_tokens` with the config's rate, slot count and
    special ids): the same for every objective, so they are comparable step for step."""
    c = config
    return masking.mask_tokens(
        input_ids, input_mask, seed, mask_prob=c.mask_prob,
        num_slots=c.num_masked_slots(input_ids.shape[1]), mask_token_id=c.mask_token_id,
        special_ids=(c.cls_token_id, c.sep_token_id, c.mask_token_id))


def int_features(features):
    """(input_ids, input_mask, segment_ids) int32 [batch, seq]; segment ids default to 0."""
    input_ids = tf.cast(features["input_ids"], tf.int32)
    input_mask = tf.cast(features["input_mask"], tf.int32)
    segment_ids = tf.cast(features.get("segment_ids", tf.zeros_like(input_ids)), tf.int32)
    return input_ids, input_mask, segment_ids


def generator_terms(generator, config, batch, input_ids, input_mask, segment_ids, seed,
                    micro_batch, slot_total, training) -> dict:
    """A masked-LM generator's loss and accuracy at the masked slots, its samples (Gumbel-max,
    with the config's temperature and `disallow_correct`), and the discriminator's input with the
    samples written in (`replaced_token_labels`: 1 where a sample differs from the original)."""
    gen = generator({"input_ids": batch.masked_input_ids, "input_mask": input_mask,
                     "segment_ids": segment_ids}, training=training, positions=batch.positions)
    mlm_loss, mlm_correct = mlm_loss_terms(gen["mlm_logits"], batch.masked_ids, batch.weights,
                                           slot_total)
    sampled = masking.sample_replacements(
        gen["mlm_logits"], sampling_seed(seed, micro_batch), temperature=config.temperature,
        disallow_ids=batch.masked_ids if config.disallow_correct else None)
    disc_input_ids, labels = masking.replace_tokens(input_ids, sampled, batch)
    sampled_correct = tf.cast(tf.equal(sampled, batch.masked_ids), tf.float32)
    return dict(mlm_loss=mlm_loss,
                mlm_accuracy=weighted_mean(mlm_correct, batch.weights, slot_total),
                sampled_accuracy=weighted_mean(sampled_correct, batch.weights, slot_total),
                sampled_ids=sampled, disc_input_ids=disc_input_ids, replaced_token_labels=labels)


GENERATOR_METRICS = ("mlm_loss", "mlm_accuracy", "sampled_accuracy")


class Objective:
    """One pretraining objective: which heads the discriminator has, which generator (if any) it
    trains, the metrics it reports and the loss of a batch. `ElectraPretrainer` holds one
    (`objectives.get_objective(config.objective)`) and asks it; it never switches on the name.

    Objectives hold no weights or state: the pretrainer's layers are passed in.

    Attributes:
      name: the `ElectraConfig.objective` value.
      rtd_head, mlm_head: the discriminator's heads (`Discriminator(rtd_head=, mlm_head=)`).
      metric_names: the step metrics (keys of `compute`'s output averaged by the pretrainer).
      detection_metrics: whether precision / recall / AUC of `rtd_logits` against
        `replaced_token_labels` (weighted by `disc_weights`) are reported.
    """

    name = ""
    rtd_head = False
    mlm_head = False
    metric_names: tuple = ()
    detection_metrics = False

    def build_generator(self, config, embeddings, discriminator, dtype):
        """The generator this objective trains (None: none); `embeddings` is the
        discriminator's `Embeddings`, shared as `config.embedding_sharing` says."""
        return None

    def loss_totals(self, model, features, seed):
        """float32 [k]: the global counts the losses of `features` are normalised by, summed
        over replicas in one all-reduce (gradient accumulation computes them for the whole
        step's batch and passes them to `compute` of each micro-batch)."""
        raise NotImplementedError

    def compute(self, model, features, seed, training=True, *, totals=None, micro_batch=None):
        """The loss and what the metrics need for one replica's batch
        (`ElectraPretrainer.compute_objective`, which documents the arguments)."""
        raise NotImplementedError
