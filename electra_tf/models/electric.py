"""Electric (Clark et al., EMNLP 2020, "Pre-Training Transformers as Energy-Based Cloze Models").

Electric is ELECTRA read as an energy-based cloze model: the discriminator's head outputs an
energy E(x)_t per position, and p(x_t | x_\\t) is proportional to exp(-E(x)_t). It is trained
with noise-contrastive estimation against a generator q, as the authors' `run_pretraining.py`
does with `electric_objective` (which forces `two_tower_generator`):

- The generator is a two-tower cloze model (`TwoTowerClozeGenerator`): a left-to-right and a
  right-to-left transformer over the UNMASKED input. Position t is represented by the left
  tower's output at t-1 and the right tower's at t+1, so q(x_t | x_\\t) never sees x_t.
  Its loss is the cloze cross-entropy at every maskable position (real tokens other than
  [CLS], [SEP], [MASK]).
- Positions are chosen as for ELECTRA (`masking.mask_tokens`); the generator samples a token at
  each from its cloze distribution there, and EVERY sampled position is labelled fake, even
  where the sample equals the original (NCE counts noise samples, not differences).
- The discriminator's logit for "fake" is the NCE posterior's:
      E(x)_t + log q(x_t | x_\\t) + log(mask_prob / (1 - mask_prob)),
  with x_t the token actually present and no gradient through log q. It is trained with
  ELECTRA's binary cross-entropy over all real tokens; the total loss is
  gen_weight * cloze loss + disc_weight * discriminator loss.

The energy alone needs no generator at test time: -E(x)_t is the model's score of token t, and
their sum over a sentence approximates its pseudo-log-likelihood in one forward pass
(`electra_tf.scoring`).
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

from electra_tf.models import masking
from electra_tf.models.encoder import ElectraBackbone, Embeddings, as_electra_config, register
from electra_tf.models.generator import MaskedLMHead, gather_positions
from electra_tf.models.objective_terms import (
    GENERATOR_METRICS, Objective, choose_masks, global_sum, int_features, mlm_loss_terms,
    sampling_seed, weighted_mean)

def directional_attention_mask(input_mask, direction: str):
    """[batch, seq] padding mask -> [batch, seq (query), seq (key)] for one tower.

    "ltr": a query attends to keys at or before it; "rtl": at or after it (both include the
    diagonal, as the original's `matrix_band_part` masks), padding keys never.
    """
    input_mask = tf.cast(input_mask, tf.int32)
    seq = tf.shape(input_mask)[1]
    ones = tf.ones((seq, seq), tf.int32)
    if direction == "ltr":
        causal = tf.linalg.band_part(ones, -1, 0)
    elif direction == "rtl":
        causal = tf.linalg.band_part(ones, 0, -1)
    else:
        raise ValueError(f"direction must be 'ltr' or 'rtl', got {direction!r}")
    return input_mask[:, None, :] * causal[None, :, :]


def cloze_positions_output(ltr_output, rtl_output):
    """Position t <- [ltr[t-1], rtl[t+1]], [batch, seq, 2 H].

    Shifts wrap around as the original's `roll`: position 0 gets the left tower's LAST output
    and position seq-1 the right tower's first. Both are [CLS]/[SEP]/padding in packed inputs,
    which the cloze loss never scores.
    """
    return tf.concat([tf.roll(ltr_output, shift=1, axis=1),
                      tf.roll(rtl_output, shift=-1, axis=1)], axis=-1)


@register
class TwoTowerClozeGenerator(keras.Model):
    """Electric's generator: two one-directional transformers and a tied cloze softmax.

    The towers `generator_ltr` and `generator_rtl` have the generator's size (the config's
    `generator_hidden_size` / `generator_layers`, as an ELECTRA generator), read the same
    embeddings (shared with the discriminator unless `embedding_sharing` is "untied", when each
    tower has its own table of width = its hidden size and the head is tied to the left tower's,
    as the original), and each has its own `embeddings_project`. The head `cloze_predictions` is
    the masked-LM head (dense to E + GELU + LayerNorm, tied output embedding, output bias) on
    the two towers' concatenated, shifted outputs.

    Args:
      config: the generator's `ElectraConfig` (`generator_config()` of the pretraining config).
      embeddings: the discriminator's `Embeddings` to share (None: its own).

    Returns from a call on a feature dict: `cloze_logits` float32 [batch, seq, vocab] (the
    distribution q(x_t | x_\\t) at every position) and `sequence_output` [batch, seq, 2 H].

    Example:
    >>> gen = TwoTowerClozeGenerator(
    ...     ElectraConfig.from_json("electra_tiny").replace(objective="electric").generator_config())
    >>> gen(dummy_inputs(2, 8))["cloze_logits"].shape
    (2, 8, 30522)
    """

    def __init__(self, config, embeddings=None, **kwargs):
        kwargs.setdefault("name", "generator")
        super().__init__(**kwargs)
        self.config = c = as_electra_config(config)
        policy = self.dtype_policy
        # --- layers ---
        if c.embedding_sharing == "untied":
            shared = None  # each tower makes its own (`generator_ltr/embeddings`, ...)
        else:
            shared = embeddings or Embeddings(c, dtype=policy)
        self.ltr = ElectraBackbone(c, embeddings=shared, name="generator_ltr", dtype=policy)
        self.rtl = ElectraBackbone(c, embeddings=shared, name="generator_rtl", dtype=policy)
        self.embeddings = self.ltr.embeddings
        # The head reads both towers: its dense layer is 2 H -> E.
        self.cloze_head = MaskedLMHead(c.replace(hidden_size=2 * c.hidden_size), self.embeddings,
                                       name="cloze_predictions", dtype=policy)
        self.build()

    def build(self, input_shape=None):
        for part in (self.ltr, self.rtl, self.cloze_head):
            if not part.built:
                part.build()

    def call(self, inputs, training=None):
        # --- forward graph ---
        towers = []
        for tower, direction in ((self.ltr, "ltr"), (self.rtl, "rtl")):
            mask = directional_attention_mask(inputs["input_mask"], direction)
            towers.append(tower.encode({**inputs, "input_mask": mask}, training=training))
        sequence_output = cloze_positions_output(*towers)  # [batch, seq, 2 H]
        return {"sequence_output": sequence_output,
                "cloze_logits": self.cloze_head(sequence_output)}  # [batch, seq, vocab]

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def candidate_mask(input_ids, input_mask, config):
    """Real tokens other than [CLS], [SEP], [MASK]: where the cloze loss is taken and masks fall
    (the original's `get_candidates_mask`). bool [batch, seq]."""
    candidates = tf.cast(input_mask, tf.bool)
    for special in (config.cls_token_id, config.sep_token_id, config.mask_token_id):
        candidates &= tf.not_equal(input_ids, special)
    return candidates


def noise_log_ratio(mask_prob: float) -> float:
    """log(k / n) of NCE with k noise and n data tokens per sequence: log(p / (1 - p))."""
    return math.log(mask_prob / (1.0 - mask_prob))


def _local_totals(batch, input_mask, candidates):
    """float32 [3]: this batch's live masked slots, real tokens and cloze candidates."""
    return tf.stack([tf.reduce_sum(batch.weights), tf.reduce_sum(tf.cast(input_mask, tf.float32)),
                     tf.reduce_sum(tf.cast(candidates, tf.float32))])


class Electric(Objective):
    """Electric's objective (the rules are the module docstring's).

    Besides the loss terms, `compute` returns `cloze_logits`, `energy` (the discriminator head's
    raw output), `log_q` (the generator's log-probability of the token present, without
    gradient), `rtd_logits` (the NCE logit of "fake"), `replaced_token_labels`, `disc_weights`,
    `sampled_ids`, `disc_input_ids` and `candidates`.

    As the authors' eval metrics, mlm_loss / mlm_accuracy are the cloze model's at the masked
    positions only; cloze_loss (what is trained) and cloze_accuracy cover every candidate position.
    """

    name = "electric"
    rtd_head = True
    detection_metrics = True
    metric_names = GENERATOR_METRICS + ("cloze_loss", "cloze_accuracy", "disc_loss",
                                        "disc_accuracy")

    def build_generator(self, config, embeddings, discriminator, dtype):
        shared = embeddings if config.embedding_sharing == "embeddings" else None
        return TwoTowerClozeGenerator(config.generator_config(), embeddings=shared, dtype=dtype)

    def loss_totals(self, model, features, seed):
        """Three global counts: masked slots, real tokens, cloze candidates; one all-reduce."""
        input_ids = tf.cast(features["input_ids"], tf.int32)
        input_mask = tf.cast(features["input_mask"], tf.int32)
        batch = choose_masks(model.config, input_ids, input_mask, tf.cast(seed, tf.int64))
        return global_sum(_local_totals(batch, input_mask,
                                        candidate_mask(input_ids, input_mask, model.config)))

    def compute(self, model, features, seed, training=True, *, totals=None, micro_batch=None):
        c = model.config
        input_ids, input_mask, segment_ids = int_features(features)
        seed = tf.cast(seed, tf.int64)

        batch = choose_masks(c, input_ids, input_mask, seed)  # positions chosen as for ELECTRA
        candidates = candidate_mask(input_ids, input_mask, c)
        if totals is None:  # every global count of the step in ONE all-reduce (`weighted_mean`)
            totals = global_sum(_local_totals(batch, input_mask, candidates))
        slot_total, token_total, candidate_total = tf.unstack(totals)

        # --- the generator: a cloze model over the unmasked input ---
        gen = model.generator(
            {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids},
            training=training)
        log_q_all = tf.nn.log_softmax(gen["cloze_logits"])  # [batch, seq, vocab]
        cloze_log_probs = tf.gather(log_q_all, input_ids, batch_dims=2)  # [batch, seq]
        cloze_loss = weighted_mean(-cloze_log_probs, candidates, candidate_total)
        cloze_correct = tf.cast(tf.equal(tf.argmax(gen["cloze_logits"], -1, output_type=tf.int32),
                                         input_ids), tf.float32)

        # --- noise: samples at the masked positions, every one of them labelled fake ---
        masked_logits = gather_positions(gen["cloze_logits"], batch.positions)  # [batch, n, V]
        mlm_loss, mlm_correct = mlm_loss_terms(masked_logits, batch.masked_ids, batch.weights,
                                               slot_total)
        replica_seed = sampling_seed(seed, micro_batch)
        sampled = masking.sample_replacements(
            masked_logits, replica_seed, temperature=c.temperature,
            disallow_ids=batch.masked_ids if c.disallow_correct else None)
        disc_input_ids, _ = masking.replace_tokens(input_ids, sampled, batch)
        labels = tf.cast(batch.is_masked, tf.int32)  # NCE: a noise sample is fake even if correct
        sampled_correct = tf.cast(tf.equal(sampled, batch.masked_ids), tf.float32)

        # --- the discriminator: energy + log q(token present) + log(p / (1 - p)) ---
        disc = model.discriminator(
            {"input_ids": disc_input_ids, "input_mask": input_mask, "segment_ids": segment_ids},
            training=training)
        energy = disc["rtd_logits"]  # [batch, seq]
        log_q = tf.stop_gradient(tf.gather(log_q_all, disc_input_ids, batch_dims=2))
        logits = energy + log_q + noise_log_ratio(c.mask_prob)
        labels_f = tf.cast(labels, tf.float32)
        losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels_f, logits=logits)
        disc_loss = weighted_mean(losses, input_mask, token_total)
        disc_correct = tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), labels_f), tf.float32)

        return {
            "masked": batch, "loss": c.gen_weight * cloze_loss + c.disc_weight * disc_loss,
            "cloze_loss": cloze_loss,
            "cloze_accuracy": weighted_mean(cloze_correct, candidates, candidate_total),
            "mlm_loss": mlm_loss,
            "mlm_accuracy": weighted_mean(mlm_correct, batch.weights, slot_total),
            "sampled_accuracy": weighted_mean(sampled_correct, batch.weights, slot_total),
            "disc_loss": disc_loss,
            "disc_accuracy": weighted_mean(disc_correct, input_mask, token_total),
            "cloze_logits": gen["cloze_logits"], "energy": energy, "log_q": log_q,
            "rtd_logits": logits, "replaced_token_labels": labels, "disc_weights": input_mask,
            "sampled_ids": sampled, "disc_input_ids": disc_input_ids, "candidates": candidates,
        }
