"""The fine-tuning configs: `FinetuningConfig`, every fine-tuning hyperparameter with the
original's default, and `FinetunedModelConfig`, the description of a fine-tuned model
(`best/head_config.json`).

Defaults are the authors' `configure_finetuning.py` (google-research/electra): learning rate
1e-4 (Small, Base) / 5e-5 (Large), layer-wise decay 0.8 / 0.8 / 0.9, weight decay 0.01, warmup
10% of the steps, batch 32, max length 128, 3 epochs; RTE and STS-B 10 epochs; SQuAD 2 epochs at
length 512; chunking at length 256. (The paper's Table 7 lists 3e-4 for Small; the released code,
which produced the published Small numbers' configs, defaults to 1e-4 and so do we.)

Example:
>>> config = FinetuningConfig.for_model_size("base", "rte")
>>> config.num_train_epochs, config.learning_rate
(10.0, 0.0001)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from electra_tf.config import MODEL_SIZES, ConfigError, JsonConfig, check_field_types

@dataclasses.dataclass(frozen=True)
class FinetuningConfig(JsonConfig):
    """Fine-tuning hyperparameters (defaults: ELECTRA-Small / Base on a GLUE task).

    Args:
      learning_rate: peak learning rate (linear warmup, then linear decay to 0).
      layerwise_lr_decay: per-layer learning-rate factor (0 or 1 disables it); see
        `training.optimizer.layerwise_lr_multipliers` (the top encoder layer gets decay², as the
        original, unless `match_original_layerwise` is false).
      match_original_layerwise: keep the original's depth quirk (head n+2, top layer decay²).
      weight_decay: decoupled weight decay rate (AdamWeightDecay).
      warmup_proportion: fraction of the training steps spent warming up.
      clip_norm: global gradient-norm clip (1.0).
      train_batch_size / eval_batch_size: global batch sizes.
      max_seq_length: tokens per input (128; SQuAD 512).
      num_train_epochs: passes over the training set (may be fractional).
      dropout: dropout on the [CLS] state of sentence heads (0.1).
      max_query_length / doc_stride / n_best_size / max_answer_length: span QA (64 / 128 / 20 / 30).
      answerable_classifier / answerable_weight: SQuAD 2.0 answerability head and its loss weight.
      null_score_diff_threshold: predict "no answer" above it (-2.75).
      log_every_steps: progress and TensorBoard summary interval.
      keep_best: keep the checkpoint with the best main metric (else the last epoch's).
    """

    learning_rate: float = 1e-4
    layerwise_lr_decay: float = 0.8
    match_original_layerwise: bool = True
    weight_decay: float = 0.01
    warmup_proportion: float = 0.1
    clip_norm: float = 1.0
    train_batch_size: int = 32
    eval_batch_size: int = 32
    max_seq_length: int = 128
    num_train_epochs: float = 3.0
    dropout: float = 0.1
    max_query_length: int = 64
    doc_stride: int = 128
    n_best_size: int = 20
    max_answer_length: int = 30
    answerable_classifier: bool = True
    answerable_weight: float = 0.5
    null_score_diff_threshold: float = -2.75
    log_every_steps: int = 100
    keep_best: bool = True

    def __post_init__(self):
        def fail(field, message):
            raise ConfigError(f"FinetuningConfig.{field}: {message} (got {getattr(self, field)!r})")

        check_field_types(self)
        for name in ("train_batch_size", "eval_batch_size", "max_query_length", "doc_stride",
                     "n_best_size", "max_answer_length", "log_every_steps"):
            if getattr(self, name) < 1:
                fail(name, "must be >= 1")
        if self.max_seq_length < 3:
            fail("max_seq_length", "must be >= 3 ([CLS] text [SEP])")
        if self.learning_rate <= 0:
            fail("learning_rate", "must be > 0")
        if not 0.0 <= self.layerwise_lr_decay <= 1.0:
            fail("layerwise_lr_decay", "must be in [0, 1] (0 or 1: no decay)")
        if self.weight_decay < 0:
            fail("weight_decay", "must be >= 0")
        if not 0.0 <= self.warmup_proportion <= 1.0:
            fail("warmup_proportion", "must be in [0, 1]")
        if self.clip_norm < 0:
            fail("clip_norm", "must be >= 0 (0: no clipping)")
        if self.num_train_epochs <= 0:
            fail("num_train_epochs", "must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            fail("dropout", "must be in [0, 1)")
        if self.answerable_weight < 0:
            fail("answerable_weight", "must be >= 0")

    @property
    def layerwise_decay_or_none(self) -> float | None:
        """The decay to give `create_optimizer`, None when it is disabled (0 or 1)."""
        return self.layerwise_lr_decay if 0.0 < self.layerwise_lr_decay < 1.0 else None

    @classmethod
    def for_model_size(cls, size: str = "small", task: str | None = None, **overrides) -> "FinetuningConfig":
        """The original's defaults for a model size ("small", "base", "large") and task name."""
        size = size.strip().lower()
        if size not in MODEL_SIZES:
            raise ConfigError(f"FinetuningConfig.model_size: must be one of {MODEL_SIZES} (got {size!r})")
        values: dict[str, Any] = {}
        if size == "large":
            values.update(learning_rate=5e-5, layerwise_lr_decay=0.9)
        name = (task or "").strip().lower()
        if name in ("rte", "sts-b", "stsb", "sts"):
            values["num_train_epochs"] = 10.0
        elif "squad" in name or name == "qa":
            values.update(max_seq_length=512, num_train_epochs=2.0)
        elif name in ("chunk", "tagging"):
            values["max_seq_length"] = 256
        return cls.from_dict({**values, **overrides}, source=f"FinetuningConfig.for_model_size({size!r})")



# ---------------------------------------------------------------------------------------
# The fine-tuned model's description: `best/head_config.json`.
# ---------------------------------------------------------------------------------------

FINETUNED_FORMAT = "electra_tf_finetuned"
# 1: the family was called "kind" and `text_pair` was not recorded; 2: today's fields.
FINETUNED_VERSIONS = (1, 2)


@dataclasses.dataclass(frozen=True)
class QAOptions(JsonConfig):
    """How a span-QA model was evaluated, kept with it for the exporter's span search
    (`FinetuningConfig`'s fields of the same names; `version_2`: SQuAD 2.0, unanswerable
    questions answered "")."""

    max_query_length: int = 64
    doc_stride: int = 128
    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float = -2.75
    version_2: bool = False

    def __post_init__(self):
        check_field_types(self)
        for name in ("max_query_length", "doc_stride", "n_best_size", "max_answer_length"):
            if getattr(self, name) < 1:
                raise ConfigError(f"QAOptions.{name}: must be >= 1 (got {getattr(self, name)!r})")

    @classmethod
    def of(cls, fc: FinetuningConfig, version_2: bool) -> "QAOptions":
        return cls(fc.max_query_length, fc.doc_stride, fc.n_best_size, fc.max_answer_length,
                   fc.null_score_diff_threshold, bool(version_2))


@dataclasses.dataclass(frozen=True)
class FinetunedModelConfig(JsonConfig):
    """What a fine-tuned model is: `best/head_config.json`, written by `saving.save_finetuned`,
    read by `saving.load_finetuned` and the exporter.

    Args:
      family: the task family (`families.FAMILIES`) whose head this is.
      head: the head's class name in `heads.py`.
      head_config: `head.get_config()`; `config` in it is the encoder's `ElectraConfig` dict.
      max_seq_length: the fine-tuning sequence length (the exporter pads to it).
      task: the task's name.
      num_labels: classes of a classifier or tagger (0 otherwise).
      label_names: the class names in id order, or None.
      lower_case: inputs were lower-cased and accent-stripped (the vocabulary's casing; the
        exporter's in-graph tokenizer follows it). Files without it: true.
      text_pair: a sentence task's inputs are text pairs; None (files without it): unknown, the
        exporter then asks the predefined task.
      qa: a span-QA model's `QAOptions`, else None.
      checkpoint, vocab: file names in the folder (`model`, `vocab.txt`).
      epoch, metrics, seed: the epoch saved, its evaluation metrics, the run's seed.
      format, version: "electra_tf_finetuned", and 2 (files of version 1 say "kind" for
        "family"; they load).

    Example:
    >>> model = FinetunedModelConfig.from_json("ft/rt/best/head_config.json")
    >>> model.family, model.label_names
    ('classification', ('negative', 'positive'))
    """

    family: str
    head: str
    head_config: dict
    max_seq_length: int
    task: str | None = None
    num_labels: int = 0
    label_names: tuple[str, ...] | None = None
    lower_case: bool = True
    text_pair: bool | None = None
    qa: QAOptions | None = None
    checkpoint: str = "model"
    vocab: str = "vocab.txt"
    epoch: float | None = None
    metrics: dict = dataclasses.field(default_factory=dict)
    seed: int | None = None
    format: str = FINETUNED_FORMAT
    version: int = FINETUNED_VERSIONS[-1]

    def __post_init__(self):
        from electra_tf.finetune.families import FAMILIES

        if self.format != FINETUNED_FORMAT:
            raise ConfigError(f"FinetunedModelConfig.format: must be {FINETUNED_FORMAT!r} (got {self.format!r})")
        check_field_types(self)
        if self.version not in FINETUNED_VERSIONS:
            raise ConfigError(f"FinetunedModelConfig.version: must be one of {FINETUNED_VERSIONS} "
                              f"(got {self.version!r})")
        if self.family not in FAMILIES:
            raise ConfigError(f"FinetunedModelConfig.family: must be one of {tuple(FAMILIES)} "
                              f"(got {self.family!r})")
        if self.max_seq_length < 3:
            raise ConfigError(f"FinetunedModelConfig.max_seq_length: must be >= 3 (got {self.max_seq_length!r})")
        if self.label_names is not None:
            if not isinstance(self.label_names, (list, tuple)) or not all(isinstance(n, str) for n in self.label_names):
                raise ConfigError(f"FinetunedModelConfig.label_names: must be a list of strings or null "
                                  f"(got {self.label_names!r})")
            object.__setattr__(self, "label_names", tuple(self.label_names))
            if self.num_labels and len(self.label_names) != self.num_labels:
                raise ConfigError(f"FinetunedModelConfig.label_names: {len(self.label_names)} names for "
                                  f"num_labels {self.num_labels}")
        if self.qa is not None and not isinstance(self.qa, QAOptions):
            raise ConfigError(f"FinetunedModelConfig.qa: must be a JSON object or null (got {self.qa!r})")

    @classmethod
    def for_head(cls, head, **fields) -> "FinetunedModelConfig":
        """The description of a head (`heads.py`: its family, class, config and label count)
        with the other fields given as keyword arguments ("kind", a version 1 key, is ignored:
        the head knows its family)."""
        fields.pop("kind", None)
        described = {"family": head.family, "head": type(head).__name__,
                     "head_config": head.get_config(), "num_labels": getattr(head, "num_labels", 0)}
        return cls.from_dict({**fields, **described}, source=f"the {type(head).__name__} head")

    @classmethod
    def from_dict(cls, values, source: str = "head_config.json"):
        """Also reads version 1 ("kind" for "family") and a nested "qa" object."""
        if isinstance(values, dict):
            values = dict(values)
            if "kind" in values and "family" not in values:
                values["family"] = values.pop("kind")
            if isinstance(values.get("qa"), dict):
                values["qa"] = QAOptions.from_dict(values["qa"], source=f"{source}: field 'qa'")
        return super().from_dict(values, source=source)

    def to_dict(self):
        values = dataclasses.asdict(self)
        values["label_names"] = None if self.label_names is None else list(self.label_names)
        return values
