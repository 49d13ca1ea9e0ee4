"""The pretraining objectives of the paper's Table 5 (Section 3.2), as `Objective` objects.

  electra         replaced-token detection: the discriminator's loss over all real tokens.
  electra_15      the same over the masked positions only.
  replace_mlm     the discriminator-size model does MLM on inputs whose masked positions hold
                  generator samples instead of [MASK].
  all_tokens_mlm  replace_mlm predicting every token, with the copy mechanism:
                  p(x_t) = D * [x_t == input_t] + (1 - D) * softmax(x_t), D = sigmoid(head).
  mlm             the BERT baseline: MLM on [MASK]ed inputs with the generator-style tied head,
                  no generator at all.
  electric        Electric (Clark et al., EMNLP 2020): `electra_tf.models.electric`.

Every one masks with `objective_terms.choose_masks` and normalises its losses by global counts
taken in one all-reduce; the ones with a generator train it with the MLM loss at the masked slots
(weighted by `gen_weight`) and feed the discriminator its samples.
"""

from __future__ import annotations

import tensorflow as tf

from electra_tf.models.electric import Electric
from electra_tf.models.generator import Generator
from electra_tf.models.objective_terms import (
    GENERATOR_METRICS, Objective, choose_masks, generator_terms, global_sum, int_features,
    mlm_loss_terms, weighted_mean)


class _MaskedGeneratorObjective(Objective):
    """The objectives whose generator (if any) is a masked LM and whose discriminator reads its
    samples: the shared step is `compute`; a subclass says what the discriminator is scored on
    (`discriminator_terms`) and which tokens weigh in it (`token_weights`)."""

    uses_generator = True

    def build_generator(self, config, embeddings, discriminator, dtype):
        if not self.uses_generator:
            return None
        gen_config = config.generator_config()
        if config.embedding_sharing == "all":  # one network: the generator is the discriminator
            return Generator(gen_config, embeddings=embeddings, encoder=discriminator.encoder,
                             embeddings_project=discriminator.embeddings_project, dtype=dtype)
        shared = embeddings if config.embedding_sharing == "embeddings" else None
        return Generator(gen_config, embeddings=shared, dtype=dtype)

    def token_weights(self, batch, input_mask):
        """int [batch, seq]: the tokens weighted in the discriminator-side terms (real ones)."""
        return input_mask

    def slot_positions(self, batch):
        """Positions the discriminator's MLM head scores (None: every position)."""
        return None

    def discriminator_terms(self, config, disc, batch, input_ids, disc_input_ids, input_mask,
                            token_weights, slot_total, token_total, out) -> tuple[dict, tf.Tensor]:
        """(the discriminator's terms, its weighted loss)."""
        raise NotImplementedError

    def _local_totals(self, batch, input_mask):
        """float32 [2]: this batch's live masked slots and weighted tokens; the token weights."""
        token_weights = self.token_weights(batch, input_mask)
        return tf.stack([tf.reduce_sum(batch.weights),
                         tf.reduce_sum(tf.cast(token_weights, tf.float32))]), token_weights

    def loss_totals(self, model, features, seed):
        input_ids = tf.cast(features["input_ids"], tf.int32)
        input_mask = tf.cast(features["input_mask"], tf.int32)
        batch = choose_masks(model.config, input_ids, input_mask, tf.cast(seed, tf.int64))
        return global_sum(self._local_totals(batch, input_mask)[0])

    def compute(self, model, features, seed, training=True, *, totals=None, micro_batch=None):
        c = model.config
        input_ids, input_mask, segment_ids = int_features(features)
        seed = tf.cast(seed, tf.int64)

        batch = choose_masks(c, input_ids, input_mask, seed)
        out = {"masked": batch}
        loss = tf.constant(0.0)
        # Token weights of the discriminator-side terms, then both global totals at once.
        local_totals, token_weights = self._local_totals(batch, input_mask)
        if totals is None:
            totals = global_sum(local_totals)
        slot_total, token_total = tf.unstack(totals)

        if model.generator is not None:
            out.update(generator_terms(model.generator, c, batch, input_ids, input_mask,
                                       segment_ids, seed, micro_batch, slot_total, training))
            disc_input_ids = out["disc_input_ids"]
            loss += c.gen_weight * out["mlm_loss"]
        else:
            disc_input_ids = batch.masked_input_ids  # the BERT baseline sees [MASK]

        disc = model.discriminator(
            {"input_ids": disc_input_ids, "input_mask": input_mask, "segment_ids": segment_ids},
            training=training, positions=self.slot_positions(batch))
        terms, weighted_loss = self.discriminator_terms(
            c, disc, batch, input_ids, disc_input_ids, input_mask, token_weights, slot_total,
            token_total, out)
        loss += weighted_loss
        out.update(terms)
        out["loss"] = loss
        return out


class ReplacedTokenDetection(_MaskedGeneratorObjective):
    """ELECTRA (paper Section 2): sigmoid cross-entropy of "replaced" per token, weighted by
    `disc_weight`; over every real token (`electra`) or the masked ones only (`electra_15`)."""

    rtd_head = True
    detection_metrics = True
    metric_names = GENERATOR_METRICS + ("disc_loss", "disc_accuracy")

    def __init__(self, name: str, masked_only: bool):
        self.name, self.masked_only = name, masked_only

    def token_weights(self, batch, input_mask):
        return tf.cast(batch.is_masked, tf.int32) if self.masked_only else input_mask

    def discriminator_terms(self, config, disc, batch, input_ids, disc_input_ids, input_mask,
                            token_weights, slot_total, token_total, out):
        labels = tf.cast(out["replaced_token_labels"], tf.float32)
        logits = disc["rtd_logits"]
        losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        correct = tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), labels), tf.float32)
        terms = dict(disc_loss=weighted_mean(losses, token_weights, token_total),
                     disc_accuracy=weighted_mean(correct, token_weights, token_total),
                     rtd_logits=logits, disc_weights=token_weights)
        return terms, config.disc_weight * terms["disc_loss"]


class MaskedLanguageModel(_MaskedGeneratorObjective):
    """The discriminator-size model as an MLM at the masked slots (the original's gather before
    the head): on generator samples (`replace_mlm`) or on [MASK] with no generator (`mlm`)."""

    mlm_head = True

    def __init__(self, name: str, uses_generator: bool):
        self.name, self.uses_generator = name, uses_generator
        self.metric_names = ((GENERATOR_METRICS if uses_generator else ())
                             + ("main_mlm_loss", "main_mlm_accuracy"))

    def slot_positions(self, batch):
        return batch.positions

    def discriminator_terms(self, config, disc, batch, input_ids, disc_input_ids, input_mask,
                            token_weights, slot_total, token_total, out):
        loss, correct = mlm_loss_terms(disc["mlm_logits"], batch.masked_ids, batch.weights,
                                       slot_total)
        terms = dict(main_mlm_loss=loss,
                     main_mlm_accuracy=weighted_mean(correct, batch.weights, slot_total))
        return terms, loss


class AllTokensMLM(_MaskedGeneratorObjective):
    """All-Tokens MLM: predict every input token's identity, with the copy gate D(x, t)."""

    name = "all_tokens_mlm"
    rtd_head = mlm_head = True
    metric_names = GENERATOR_METRICS + ("main_all_tokens_loss", "main_all_tokens_accuracy")

    def discriminator_terms(self, config, disc, batch, input_ids, disc_input_ids, input_mask,
                            token_weights, slot_total, token_total, out):
        log_probs = tf.nn.log_softmax(disc["mlm_logits"])  # [batch, seq, V]
        original_log_prob = tf.gather(log_probs, input_ids, batch_dims=2)  # [batch, seq]
        copy_prob = tf.sigmoid(disc["rtd_logits"])  # D(x, t)
        is_copy = tf.cast(tf.equal(disc_input_ids, input_ids), tf.float32)
        prob = copy_prob * is_copy + (1.0 - copy_prob) * tf.exp(original_log_prob)
        losses = -tf.math.log(prob + 1e-9)
        copy_argmax = tf.argmax(log_probs, -1, output_type=tf.int32)
        correct = tf.where((copy_prob > 0.5) & (is_copy > 0), 1.0,
                           tf.cast(tf.equal(copy_argmax, input_ids), tf.float32))
        terms = dict(main_all_tokens_loss=weighted_mean(losses, input_mask, token_total),
                     main_all_tokens_accuracy=weighted_mean(correct, input_mask, token_total))
        return terms, terms["main_all_tokens_loss"]


OBJECTIVES = {o.name: o for o in (
    ReplacedTokenDetection("electra", masked_only=False),
    ReplacedTokenDetection("electra_15", masked_only=True),
    MaskedLanguageModel("replace_mlm", uses_generator=True),
    AllTokensMLM(),
    MaskedLanguageModel("mlm", uses_generator=False),
    Electric(),
)}


def get_objective(name: str) -> Objective:
    """The objective called `name` (`ElectraConfig.objective`, validated against the same list)."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"objective must be one of {tuple(OBJECTIVES)}, got {name!r}") from None
