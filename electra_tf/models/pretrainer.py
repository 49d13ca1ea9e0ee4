"""The replaced-token-detection pretrainer: generator + discriminator trained jointly.

`ElectraPretrainer.compute_objective` is the whole objective of the paper (Section 2) as one
in-graph function: dynamic masking, generator MLM, Gumbel-max sampling, replaced-token labels and
the weighted sum of the two losses. `train_step` wraps it with gradients and metrics; it runs under
`model.fit`, inside our custom loops' `strategy.run`, and under `jit_compile=True`.

The paper's Table 5 variants are selected by `config.objective`:
  electra         discriminator loss over all real tokens (default).
  electra_15      discriminator loss over the masked positions only.
  replace_mlm     the discriminator-size model does MLM on inputs whose masked positions hold
                  generator samples instead of [MASK].
  all_tokens_mlm  replace_mlm predicting every token, with the copy mechanism:
                  p(x_t) = D * [x_t == input_t] + (1 - D) * softmax(x_t), D = sigmoid(head).
  mlm             the BERT baseline: MLM on [MASK]ed inputs with the generator-style tied head,
                  no generator at all.
  electric        Electric (Clark et al., EMNLP 2020): a two-tower cloze generator and the
                  noise-contrastive discriminator loss; see models/electric.py.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from electra_tf.models import masking
from electra_tf.models.discriminator import Discriminator
from electra_tf.models.encoder import Embeddings, as_electra_config, register
from electra_tf.models.generator import Generator

_USES_GENERATOR = ("electra", "electra_15", "replace_mlm", "all_tokens_mlm")


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

    `global_total` is sum(weights) over all replicas (see `ElectraPretrainer.compute_objective`:
    every total of a step comes from ONE all-reduce, issued before any loss, so the replicas'
    collectives always line up).
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


def _replaced_token_terms(logits, labels, weights, token_total) -> dict:
    """ELECTRA's discriminator loss (paper Section 2): sigmoid cross-entropy of "replaced" over the
    weighted tokens (every real token; the masked ones for electra_15), and its accuracy."""
    labels = tf.cast(labels, tf.float32)
    losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    correct = tf.cast(tf.equal(tf.cast(logits > 0, tf.float32), labels), tf.float32)
    return dict(disc_loss=weighted_mean(losses, weights, token_total),
                disc_accuracy=weighted_mean(correct, weights, token_total),
                rtd_logits=logits, disc_weights=weights)


def _masked_lm_terms(mlm_logits, batch, slot_total) -> dict:
    """The discriminator as an MLM at the masked slots (mlm, replace_mlm): `mlm_logits` [batch, n,
    V] are already the slots' (`Discriminator.call(positions=...)`)."""
    loss, correct = mlm_loss_terms(mlm_logits, batch.masked_ids, batch.weights, slot_total)
    return dict(main_mlm_loss=loss,
                main_mlm_accuracy=weighted_mean(correct, batch.weights, slot_total))


def _all_tokens_terms(disc, input_ids, disc_input_ids, input_mask, token_total) -> dict:
    """All-Tokens MLM: predict every input token's identity, with the copy gate D(x, t)."""
    log_probs = tf.nn.log_softmax(disc["mlm_logits"])  # [batch, seq, V]
    original_log_prob = tf.gather(log_probs, input_ids, batch_dims=2)  # [batch, seq]
    copy_prob = tf.sigmoid(disc["rtd_logits"])  # D(x, t)
    is_copy = tf.cast(tf.equal(disc_input_ids, input_ids), tf.float32)
    prob = copy_prob * is_copy + (1.0 - copy_prob) * tf.exp(original_log_prob)
    losses = -tf.math.log(prob + 1e-9)
    copy_argmax = tf.argmax(log_probs, -1, output_type=tf.int32)
    correct = tf.where((copy_prob > 0.5) & (is_copy > 0), 1.0,
                       tf.cast(tf.equal(copy_argmax, input_ids), tf.float32))
    return dict(main_all_tokens_loss=weighted_mean(losses, input_mask, token_total),
                main_all_tokens_accuracy=weighted_mean(correct, input_mask, token_total))


@register
class ElectraPretrainer(keras.Model):
    """Generator and discriminator with the replaced-token-detection objective.

    Args:
      config: the discriminator's `ElectraConfig`; the generator's is derived from it.
      seed: base seed of the in-graph randomness; the step seed is (seed, optimizer iterations).

    Example:
    >>> pretrainer = ElectraPretrainer(ElectraConfig.from_json("electra_tiny"))
    >>> pretrainer.compile(optimizer=keras.optimizers.Adam(1e-3))
    >>> pretrainer.fit(dataset, steps_per_epoch=10)  # dicts of input_ids/input_mask/segment_ids
    >>> pretrainer.save("pretrainer.keras")  # weights, optimizer state, the seed
    >>> pretrainer = keras.saving.load_model("pretrainer.keras")  # shared embeddings re-tied
    """

    def __init__(self, config, seed: int = 0, **kwargs):
        kwargs.setdefault("name", "electra_pretrainer")
        super().__init__(**kwargs)
        self.config = c = as_electra_config(config)
        self.seed = int(seed)
        objective = c.objective
        # --- layers ---
        embeddings = Embeddings(c, dtype=self.dtype_policy)
        self.discriminator = Discriminator(
            c, embeddings=embeddings, dtype=self.dtype_policy,
            rtd_head=objective in ("electra", "electra_15", "all_tokens_mlm", "electric"),
            mlm_head=objective in ("replace_mlm", "all_tokens_mlm", "mlm"))
        self.generator = None
        if objective == "electric":
            from electra_tf.models.electric import TwoTowerClozeGenerator  # it imports this module

            shared = embeddings if c.embedding_sharing == "embeddings" else None
            self.generator = TwoTowerClozeGenerator(c.generator_config(), embeddings=shared,
                                                    dtype=self.dtype_policy)
        elif objective in _USES_GENERATOR:
            gen_config = c.generator_config()
            if c.embedding_sharing == "all":
                self.generator = Generator(
                    gen_config, embeddings=embeddings, encoder=self.discriminator.encoder,
                    embeddings_project=self.discriminator.embeddings_project,
                    dtype=self.dtype_policy)
            else:
                shared = embeddings if c.embedding_sharing == "embeddings" else None
                self.generator = Generator(gen_config, embeddings=shared, dtype=self.dtype_policy)
        # --- metrics ---
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.step_metrics = {}
        for name in self._metric_names():
            self.step_metrics[name] = keras.metrics.Mean(name=name)
        if self.discriminator.rtd_head is not None and objective != "all_tokens_mlm":
            self.disc_precision = keras.metrics.Precision(name="disc_precision")
            self.disc_recall = keras.metrics.Recall(name="disc_recall")
            self.disc_auc = keras.metrics.AUC(name="disc_auc", num_thresholds=200)
        else:
            self.disc_precision = self.disc_recall = self.disc_auc = None
        self.built = True

    def _metric_names(self):
        objective = self.config.objective
        if objective == "electric":
            from electra_tf.models.electric import METRIC_NAMES

            return list(METRIC_NAMES)
        names = []
        if self.generator is not None:
            names += ["mlm_loss", "mlm_accuracy", "sampled_accuracy"]
        if objective in ("electra", "electra_15"):
            names += ["disc_loss", "disc_accuracy"]
        if objective in ("replace_mlm", "mlm"):
            names += ["main_mlm_loss", "main_mlm_accuracy"]
        if objective == "all_tokens_mlm":
            names += ["main_all_tokens_loss", "main_all_tokens_accuracy"]
        return names

    @property
    def metrics(self):
        extra = [m for m in (self.disc_precision, self.disc_recall, self.disc_auc) if m is not None]
        return [self.loss_tracker, *self.step_metrics.values(), *extra]

    # --- the objective ---------------------------------------------------------------------------
    def call(self, inputs, training=False):
        return self.compute_objective(inputs, tf.constant([self.seed, 0], tf.int64), training)

    def _mask(self, input_ids, input_mask, seed):
        c = self.config
        return masking.mask_tokens(
            input_ids, input_mask, seed, mask_prob=c.mask_prob,
            num_slots=c.num_masked_slots(input_ids.shape[1]), mask_token_id=c.mask_token_id,
            special_ids=(c.cls_token_id, c.sep_token_id, c.mask_token_id))

    def _local_totals(self, batch, input_mask):
        """float32 [2]: this batch's live masked slots and its tokens weighted in the
        discriminator-side terms (the masked ones for electra_15, else the real ones)."""
        if self.config.objective == "electra_15":
            token_weights = tf.cast(batch.is_masked, tf.int32)
        else:
            token_weights = input_mask
        return tf.stack([tf.reduce_sum(batch.weights),
                         tf.reduce_sum(tf.cast(token_weights, tf.float32))]), token_weights

    def loss_totals(self, features, seed):
        """float32 [2]: the global counts the losses of `features` are normalised by (live masked
        slots, weighted tokens), summed over replicas; one all-reduce.

        Gradient accumulation computes them for the whole step's batch and passes them to
        `compute_objective` of each micro-batch (masks are keyed per example, so a micro-batch
        masks exactly as the whole batch does).
        """
        if self.config.objective == "electric":  # three counts: + the cloze candidates
            from electra_tf.models import electric

            return electric.loss_totals(self, features, seed)
        input_ids = tf.cast(features["input_ids"], tf.int32)
        input_mask = tf.cast(features["input_mask"], tf.int32)
        batch = self._mask(input_ids, input_mask, tf.cast(seed, tf.int64))
        return global_sum(self._local_totals(batch, input_mask)[0])

    def compute_objective(self, features, seed, training=True, *, totals=None,
                          micro_batch=None):
        """The pretraining loss and what the metrics need, for one replica's batch.

        Args:
          features: dict with int `input_ids`, `input_mask`, `segment_ids` [batch, seq].
          seed: int [2] step seed.
          totals: None, or `loss_totals` of a larger batch that `features` is a micro-batch of:
            the losses are then normalised by that batch's counts, so the micro-batches' losses
            add up to the larger batch's loss exactly.
          micro_batch: None, or the micro-batch's index (int32 scalar), folded into the sampling
            seed so that micro-batches draw independent generator samples.

        Returns a dict with "loss" (this replica's share of the global-batch loss) and the terms.
        """
        c = self.config
        if c.objective == "electric":
            from electra_tf.models import electric

            return electric.electric_objective(self, features, seed, training, totals=totals,
                                               micro_batch=micro_batch)
        input_ids = tf.cast(features["input_ids"], tf.int32)
        input_mask = tf.cast(features["input_mask"], tf.int32)
        segment_ids = tf.cast(features.get("segment_ids", tf.zeros_like(input_ids)), tf.int32)
        seed = tf.cast(seed, tf.int64)

        batch = self._mask(input_ids, input_mask, seed)
        out = {"masked": batch}
        loss = tf.constant(0.0)
        # Token weights of the discriminator-side terms, then both global totals at once.
        local_totals, token_weights = self._local_totals(batch, input_mask)
        if totals is None:
            totals = global_sum(local_totals)
        slot_total, token_total = tf.unstack(totals)

        if self.generator is not None:
            out.update(self._generator_terms(batch, input_ids, input_mask, segment_ids, seed,
                                             micro_batch, slot_total, training))
            disc_input_ids = out["disc_input_ids"]
            loss += c.gen_weight * out["mlm_loss"]
        else:
            disc_input_ids = batch.masked_input_ids  # the BERT baseline sees [MASK]

        disc_inputs = {"input_ids": disc_input_ids, "input_mask": input_mask,
                       "segment_ids": segment_ids}
        # The MLM objectives score the masked slots only (the original's gather before the head).
        slots = batch.positions if c.objective in ("replace_mlm", "mlm") else None
        disc = self.discriminator(disc_inputs, training=training, positions=slots)
        if c.objective in ("electra", "electra_15"):
            terms = _replaced_token_terms(disc["rtd_logits"], out["replaced_token_labels"],
                                          token_weights, token_total)
            loss += c.disc_weight * terms["disc_loss"]
        elif c.objective in ("replace_mlm", "mlm"):
            terms = _masked_lm_terms(disc["mlm_logits"], batch, slot_total)
            loss += terms["main_mlm_loss"]
        else:
            terms = _all_tokens_terms(disc, input_ids, disc_input_ids, input_mask, token_total)
            loss += terms["main_all_tokens_loss"]
        out.update(terms)
        out["loss"] = loss
        return out

    def _generator_terms(self, batch, input_ids, input_mask, segment_ids, seed, micro_batch,
                         slot_total, training) -> dict:
        """The generator's MLM loss and accuracy, its samples, and the discriminator's input
        with the samples written in (`replaced_token_labels`: 1 where a sample differs)."""
        c = self.config
        gen = self.generator(
            {"input_ids": batch.masked_input_ids, "input_mask": input_mask,
             "segment_ids": segment_ids}, training=training, positions=batch.positions)
        mlm_loss, mlm_correct = mlm_loss_terms(gen["mlm_logits"], batch.masked_ids,
                                               batch.weights, slot_total)
        sampled = masking.sample_replacements(
            gen["mlm_logits"], sampling_seed(seed, micro_batch), temperature=c.temperature,
            disallow_ids=batch.masked_ids if c.disallow_correct else None)
        disc_input_ids, labels = masking.replace_tokens(input_ids, sampled, batch)
        sampled_correct = tf.cast(tf.equal(sampled, batch.masked_ids), tf.float32)
        return dict(mlm_loss=mlm_loss,
                    mlm_accuracy=weighted_mean(mlm_correct, batch.weights, slot_total),
                    sampled_accuracy=weighted_mean(sampled_correct, batch.weights, slot_total),
                    sampled_ids=sampled, disc_input_ids=disc_input_ids,
                    replaced_token_labels=labels)

    # --- training ------------------------------------------------------------------------------
    def step_seed(self):
        """(seed, step): derived from the optimizer's step, so a resumed run re-draws the same."""
        step = tf.cast(self.optimizer.iterations, tf.int64) if self.optimizer is not None else 0
        return tf.stack([tf.constant(self.seed, tf.int64), tf.cast(step, tf.int64)])

    def update_metrics(self, out):
        """Updates the metrics from `compute_objective`'s output (inside the replica function).

        Loss terms are a replica's SHARE of the global mean; share x num_replicas averaged over
        the replicas (what a Mean metric does under a strategy) is the global value.
        """
        ctx = tf.distribute.get_replica_context()
        replicas = 1 if ctx is None else ctx.num_replicas_in_sync
        self.loss_tracker.update_state(out["loss"] * replicas)
        for name, metric in self.step_metrics.items():
            metric.update_state(out[name] * replicas)
        if self.disc_precision is not None:
            labels = out["replaced_token_labels"]
            probs = tf.sigmoid(out["rtd_logits"])
            weights = tf.cast(out["disc_weights"], tf.float32)
            for metric in (self.disc_precision, self.disc_recall, self.disc_auc):
                metric.update_state(labels, probs, sample_weight=weights)

    def train_step(self, data):
        features = data[0] if isinstance(data, tuple) else data
        with tf.GradientTape() as tape:
            out = self.compute_objective(features, self.step_seed(), training=True)
            loss = out["loss"]
            scaled_loss = self.optimizer.scale_loss(loss)
        variables = self.trainable_variables
        gradients = tape.gradient(scaled_loss, variables)
        self.optimizer.apply(gradients, variables)
        self.update_metrics(out)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        features = data[0] if isinstance(data, tuple) else data
        out = self.compute_objective(features, self.step_seed(), training=False)
        self.update_metrics(out)
        return {m.name: m.result() for m in self.metrics}

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "seed": self.seed}
