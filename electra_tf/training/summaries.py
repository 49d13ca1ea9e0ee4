"""The pretraining run's TensorBoard summaries, and the warnings read from them.

`PretrainingSummaries` writes, at each summary step, the model's metrics with the rates of the
period since the last one (examples and tokens per second, the learning rate), the float16 loss
scale and the damaged records skipped; `collapse_warning` reads the discriminator's AUC.

`scalar` writes a scalar without the `tensorboard` package. `tf.summary.scalar` is implemented by
the tensorboard package, which we keep an optional extra (it is only the viewer). A scalar summary
is `tf.summary.write` of a float32 scalar with the "scalars" plugin's metadata, so that is what
`scalar` writes: TensorBoard shows it exactly as one written by `tf.summary.scalar`.
"""

from __future__ import annotations

import time

import keras
import tensorflow as tf
from absl import logging
from tensorflow.core.framework import summary_pb2

from electra_tf.training.config import PretrainingConfig
from electra_tf.training.steps import learning_rate

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars", content=b""))


def scalar(name: str, value, step) -> bool:
    """Writes `value` as scalar `name` at `step` to the default summary writer."""
    return tf.summary.write(name, tf.cast(value, tf.float32), step=step,
                            metadata=_SCALAR_METADATA.SerializeToString())


def collapse_warning(metrics: dict, step: int, config: PretrainingConfig,
                     objective: str = "electra") -> str | None:
    """A message when the discriminator is no better than chance well after the warmup.

    The usual cause is a learning rate too high for the warmup: every token's final hidden
    state collapses to one vector and the head predicts the base rate (AUC 0.5); fine-tuning
    from such an encoder learns nothing. Short runs are prone to it (see `adam_beta_2`).

    Not for Electric: its classifier's logit adds the generator's log q of the token present
    (the authors' run_pretraining.py), so its AUC measures the generator's calibration as much
    as the energy. While the cloze generator is under-confident, real tokens have a higher q
    than its own samples, and a healthy Electric run sits at or below 0.5 for thousands of
    steps (0.42 after 1,200 steps of a run whose scores rank 91.7% of held-out sentences above their shuffles).
    """
    auc = metrics.get("disc_auc")
    if auc is None or objective == "electric" or step < max(2 * config.num_warmup_steps, 100) or abs(auc - 0.5) > 0.01:
        return None
    return (f"step {step}: discriminator AUC {auc:.3f} = chance. Its token representations "
            f"have probably collapsed (learning rate {config.learning_rate:g} too high for "
            f"{config.num_warmup_steps} warmup steps); fine-tuning from it will not learn. "
            "Lower the learning rate, lengthen the warmup, or for a short run set "
            "adam_beta_2=0.98.")


class PretrainingSummaries:
    """The TensorBoard summaries: metrics at each summary step, with the rates of the period
    since the last one (examples and tokens per second), and the warnings read from them."""

    def __init__(self, model, opt, grad_norm, config: PretrainingConfig, writer, step: int,
                 skipped_records: int | None):
        self.model, self.opt, self.grad_norm, self.config, self.writer = (
            model, opt, grad_norm, config, writer)
        self.skipped_records = skipped_records  # per pass over the data, when known
        self.warned_collapse = False
        self._start_period(step)

    def _start_period(self, step: int) -> None:
        self.period_start, self.period_step, self.tokens, self.loss_scale_skips = (
            time.time(), step, 0, 0)

    def add(self, tokens: int, loss_scale_skips: int) -> None:
        self.tokens += tokens
        self.loss_scale_skips += loss_scale_skips

    def due(self, previous: int, step: int) -> bool:
        every = self.config.summary_steps
        return step // every > previous // every or step >= self.config.num_train_steps

    def write(self, step: int, metrics: dict) -> None:
        """Writes the period's summaries, then resets the metrics for the next one."""
        config, opt = self.config, self.opt
        elapsed = max(time.time() - self.period_start, 1e-9)
        examples = (step - self.period_step) * config.train_batch_size
        rates = {"examples_per_second": examples / elapsed,
                 "tokens_per_second": self.tokens / elapsed, "learning_rate": learning_rate(opt)}
        for name, value in {**metrics, **rates}.items():
            scalar(name, value, step=step)
        if self.skipped_records is not None:
            scalar("data/corrupt_records_skipped", self.skipped_records, step=step)
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            scalar("loss_scale/skipped_steps", self.loss_scale_skips, step=step)
            scalar("loss_scale/scale", float(opt.dynamic_scale.numpy()), step=step)
        warning = collapse_warning(metrics, step, config, self.model.config.objective)
        if warning and not self.warned_collapse:
            logging.warning("%s", warning)
            self.warned_collapse = True
        self.writer.flush()
        for m in (*self.model.metrics, self.grad_norm):
            m.reset_state()
        self._start_period(step)
