"""What a pretraining run computes and how it runs: `PretrainingConfig` and the choices of the
pretraining binary, with no TensorFlow import (`electra-pretrain --help` reads them).

`ElectraConfig` (`electra_tf/config.py`) describes the model; this describes one pretraining run of
it, as `finetune/config.py`'s `FinetuningConfig` describes a fine-tuning run: the same idea (a
phase's hyperparameters, checked on construction, saved as JSON) for another phase. The loop that
runs it is `training/loop.py`.
"""

from __future__ import annotations

import dataclasses

from electra_tf.config import MODEL_SIZES, ConfigError, ElectraConfig, JsonConfig, check_field_types

# `tf.distribute` strategies `training/strategy.create_strategy` builds.
STRATEGIES = ("one_device", "mirrored", "multi_worker", "tpu")
MIXED_PRECISION = {"none": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
OPTIMIZERS = ("adamw", "lamb")


class PretrainingConfigError(ConfigError):
    """An invalid PretrainingConfig value; the message names the field."""


# PretrainingConfig fields a resumed run may change: how the run is executed and observed, not
# what it computes. A longer num_train_steps extends a run (its learning rate then decays to 0 at
# the new end, from the current step on); jit_compile changes rounding only (the XLA step draws
# what the graph's draws: `masking.stateless_unit_floats`), and
# gradient_accumulation_steps rounding and the generator's sampling draws (the update is that of
# the same global batch, so a run that ran out of memory can resume with more micro-batches).
RESUME_FREE_FIELDS = ("num_train_steps", "steps_per_loop", "save_checkpoints_steps",
                      "keep_checkpoint_max", "summary_steps", "jit_compile",
                      "gradient_accumulation_steps")
# Fields a resumed run changes only when asked to (`allow_changes`, --allow_config_change): the
# optimizer's hyperparameters, which leave the checkpoint loadable (e.g. a lower learning rate
# after a NaN). Every other field, and the whole model config, must match: they change the
# variables (model, optimizer, mixed_precision), or the example stream a resume re-derives from the
# step (train_batch_size, max_seq_length, seed, shuffle_buffer).
RESUME_ON_REQUEST_FIELDS = ("learning_rate", "num_warmup_steps", "weight_decay", "clip_norm",
                            "adam_beta_2")


# The paper's Table 6 (pre-training hyperparameters): learning rate, global batch, steps,
# sequence length. Warmup is 10,000 steps for every size.
_PAPER_SIZES = {
    "small": dict(learning_rate=5e-4, train_batch_size=128, num_train_steps=1_000_000,
                  max_seq_length=128),
    "base": dict(learning_rate=2e-4, train_batch_size=256, num_train_steps=766_000,
                 max_seq_length=512),
    "large": dict(learning_rate=2e-4, train_batch_size=2048, num_train_steps=400_000,
                  max_seq_length=512),
}


@dataclasses.dataclass(frozen=True)
class PretrainingConfig(JsonConfig):
    """Every hyperparameter of a pretraining run (defaults: ELECTRA-Small of the paper).

    Args:
      train_batch_size: GLOBAL batch size of one optimizer step (split evenly over the
        replicas, then into `gradient_accumulation_steps` micro-batches), as the authors'
        train_batch_size.
      num_train_steps: optimizer steps of the whole run (also the schedule's decay length).
      learning_rate: peak learning rate.
      num_warmup_steps: linear warmup multiplying the linear decay (paper: 10,000).
      max_seq_length: the shards' sequence length.
      steps_per_loop: the most steps per tf.function call and the interval of the progress log
        line; the loop keeps each call to about a second (fewer steps where one is slow), so a
        signal is acted on within about a second. Checkpoints, summaries and signals are handled
        between calls.
      save_checkpoints_steps: checkpoint when a multiple of this is passed (at loop boundaries).
      keep_checkpoint_max: checkpoints kept by the CheckpointManager.
      summary_steps: TensorBoard summaries when a multiple of this is passed (loop boundaries).
      optimizer: "adamw" (the original AdamWeightDecay) or "lamb".
      weight_decay: decoupled weight decay (0.01).
      clip_norm: global gradient-norm clip (1.0); 0 disables it.
      adam_beta_2: Adam's second-moment decay (0.999, the paper's). The original AdamWeightDecay
        has no bias correction, so in the first ~1/(1 - beta_2) steps its updates are several
        times the learning rate; the paper's 10,000 warmup steps hide that, a run of a few
        hundred steps does not (use e.g. 0.98 there).
      gradient_accumulation_steps: micro-batches per optimizer step: each replica computes
        the gradient of its batch in this many slices of batch / (replicas x N) examples, one
        after another, and applies their sum once (clipped once, one step counted). The update
        is that of the whole batch: the slices are normalised by the whole batch's counts of
        masked slots and tokens (see `accumulated_step`). Memory is that of one slice.
      jit_compile: XLA-compile the replica step (True), or not (False); None: whichever is
        faster on the CPU the run lands on (`training/step_path.py`: a short probe of both when
        the run is long enough for it to pay). Changes rounding only, never what is computed.
      mixed_precision: "none", "float16" (with dynamic loss scaling) or "bfloat16".
      seed: model initialisation, masking, dropout and input order.
      shuffle_buffer: examples in each input pipeline's shuffle buffer.
    """

    error_type = PretrainingConfigError

    train_batch_size: int = 128
    num_train_steps: int = 1_000_000
    learning_rate: float = 5e-4
    num_warmup_steps: int = 10_000
    max_seq_length: int = 128
    steps_per_loop: int = 100
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    summary_steps: int = 100
    optimizer: str = "adamw"
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    adam_beta_2: float = 0.999
    gradient_accumulation_steps: int = 1
    jit_compile: bool | None = None
    mixed_precision: str = "none"
    seed: int = 0
    shuffle_buffer: int = 1000

    def __post_init__(self):
        def fail(name, message):
            raise PretrainingConfigError(
                f"PretrainingConfig.{name}: {message} (got {getattr(self, name)!r})")

        check_field_types(self)
        for name in ("train_batch_size", "num_train_steps", "max_seq_length", "steps_per_loop",
                     "save_checkpoints_steps", "keep_checkpoint_max", "summary_steps",
                     "shuffle_buffer", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                fail(name, "must be >= 1")
        if self.train_batch_size % self.gradient_accumulation_steps:
            fail("gradient_accumulation_steps", f"must divide train_batch_size "
                 f"({self.train_batch_size}): each optimizer step's batch is split into this "
                 "many micro-batches")
        if self.num_warmup_steps < 0:
            fail("num_warmup_steps", "must be >= 0")
        if not self.learning_rate > 0:
            fail("learning_rate", "must be > 0")
        if self.weight_decay < 0:
            fail("weight_decay", "must be >= 0")
        if self.clip_norm < 0:
            fail("clip_norm", "must be >= 0 (0 disables clipping)")
        if not 0 <= self.adam_beta_2 < 1:
            fail("adam_beta_2", "must be in [0, 1)")
        if self.optimizer not in OPTIMIZERS:
            fail("optimizer", f"must be one of {', '.join(OPTIMIZERS)}")
        if self.mixed_precision not in MIXED_PRECISION:
            fail("mixed_precision", f"must be one of {', '.join(MIXED_PRECISION)}")

    @classmethod
    def for_model_size(cls, size, **overrides) -> "PretrainingConfig":
        """The paper's defaults for a model size: "small", "base" or "large", or the size
        (`ElectraConfig.model_size`) of an `ElectraConfig`, config name ("electra_base") or file."""
        if isinstance(size, ElectraConfig):
            size = size.model_size
        elif size not in MODEL_SIZES:
            size = ElectraConfig.from_json(size).model_size
        values = dict(_PAPER_SIZES[size])
        values.update(overrides)
        return cls(**values)
