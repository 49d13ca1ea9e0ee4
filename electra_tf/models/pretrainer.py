"""The replaced-token-detection pretrainer: generator + discriminator trained jointly.

`ElectraPretrainer.compute_objective` is the whole objective of the paper (Section 2) as one
in-graph function: dynamic masking, generator MLM, Gumbel-max sampling, replaced-token labels and
the weighted sum of the two losses. `train_step` wraps it with gradients and metrics; it runs under
`model.fit`, inside our custom loops' `strategy.run`, and under `jit_compile=True`.

The objective is an `Objective` object (`models/objectives.py`: the paper's Table 5 variants and
Electric), chosen by `config.objective`: it says which heads the discriminator has, builds the
generator it trains and computes the loss; this class holds the layers, metrics and steps.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from electra_tf.models.discriminator import Discriminator
from electra_tf.models.encoder import Embeddings, as_electra_config, register
from electra_tf.models.objectives import get_objective


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
        self.objective = objective = get_objective(c.objective)
        # --- layers ---
        embeddings = Embeddings(c, dtype=self.dtype_policy)
        self.discriminator = Discriminator(
            c, embeddings=embeddings, dtype=self.dtype_policy,
            rtd_head=objective.rtd_head, mlm_head=objective.mlm_head)
        self.generator = objective.build_generator(c, embeddings, self.discriminator,
                                                   self.dtype_policy)
        # --- metrics ---
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.step_metrics = {}
        for name in objective.metric_names:
            self.step_metrics[name] = keras.metrics.Mean(name=name)
        if objective.detection_metrics:
            self.disc_precision = keras.metrics.Precision(name="disc_precision")
            self.disc_recall = keras.metrics.Recall(name="disc_recall")
            self.disc_auc = keras.metrics.AUC(name="disc_auc", num_thresholds=200)
        else:
            self.disc_precision = self.disc_recall = self.disc_auc = None
        self.built = True

    @property
    def metrics(self):
        extra = [m for m in (self.disc_precision, self.disc_recall, self.disc_auc) if m is not None]
        return [self.loss_tracker, *self.step_metrics.values(), *extra]

    # --- the objective ---------------------------------------------------------------------------
    def call(self, inputs, training=False):
        return self.compute_objective(inputs, tf.constant([self.seed, 0], tf.int64), training)

    def loss_totals(self, features, seed):
        """float32 [k]: the global counts the losses of `features` are normalised by (live masked
        slots, weighted tokens; Electric adds its cloze candidates), summed over replicas in one
        all-reduce.

        Gradient accumulation computes them for the whole step's batch and passes them to
        `compute_objective` of each micro-batch (masks are keyed per example, so a micro-batch
        masks exactly as the whole batch does).
        """
        return self.objective.loss_totals(self, features, seed)

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
        return self.objective.compute(self, features, seed, training, totals=totals,
                                      micro_batch=micro_batch)

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
