"""The fine-tuning hyperparameters: `FinetuningConfig`, every one with the original's default, and
`QAOptions`, the span-QA ones a fine-tuned QA model keeps for its exporter. The same idea for
another phase as `training/config.py` (a pretraining run's hyperparameters), both over
`electra_tf/config.py` (the encoder's); the description of a fine-tuned model
(`head_config.json`) is `saving.FinetunedModelConfig`. `check_model_dir` refuses an output folder
a run may not write (a file, read-only, a pretraining run's, its starting checkpoint's); it lives
here, below TensorFlow, so that the binary refuses before loading it.

Defaults are the authors' `configure_finetuning.py` (google-research/electra): learning rate
1e-4 (Small, Base) / 5e-5 (Large), layer-wise decay 0.8 / 0.8 / 0.9, weight decay 0.01, warmup
10% of the steps, batch 32, max length 128, 3 epochs; RTE and STS-B 10 epochs; SQuAD 2 epochs at
length 512; chunking at length 256. (The paper's Table 7 lists 3e-4 for Small; the released code,
which produced the published Small numbers' configs, defaults to 1e-4 and so do we.)

Example:
>>> from electra_tf.finetune.tasks import get_task
>>> config = FinetuningConfig.for_model_size("base", get_task("rte"))
>>> config.num_train_epochs, config.learning_rate
(10.0, 0.0001)
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from electra_tf import files
from electra_tf.config import MODEL_SIZES, ConfigError, JsonConfig, check_field_types
from electra_tf.run_folder import RECORD_FILE, RunFolderError

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
      jit_compile: XLA-compile the train step (True) or not (False); None: the faster of the
        two on this CPU (`training/step_path.py`), timed when the run is long enough for the
        probe to pay. Rounding only: not compared when a finished run is rerun.
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
    jit_compile: bool | None = None

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
    def for_model_size(cls, size: str = "small", task=None, **overrides) -> "FinetuningConfig":
        """The original's defaults for a model size ("small", "base", "large") and a task (a
        `tasks.Task`: its row's and its family's `finetuning_defaults`), then `overrides`."""
        size = size.strip().lower()
        if size not in MODEL_SIZES:
            raise ConfigError(f"FinetuningConfig.model_size: must be one of {MODEL_SIZES} (got {size!r})")
        values: dict[str, Any] = {}
        if size == "large":
            values.update(learning_rate=5e-5, layerwise_lr_decay=0.9)
        if task is not None:
            values.update(task.finetuning_defaults)
        return cls.from_dict({**values, **overrides}, source=f"FinetuningConfig.for_model_size({size!r})")



# ---------------------------------------------------------------------------------------
# What a span-QA model keeps for its exporter (`saving.FinetunedModelConfig.qa`).
# ---------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------
# Where a run may write: checked before anything is written or loaded.
# ---------------------------------------------------------------------------------------

def check_model_dir(model_dir, init_checkpoint=None) -> None:
    """Raises `RunFolderError` naming --model_dir when a fine-tuning run may not write there.

    Checked up front, before TensorFlow loads and before the run's lock file is made, so that a
    refused folder stays byte-identical:
    - a file (or a file on the way to it), a read-only or unwritable folder: the run would fail
      after the minutes of loading and featurizing, at its first write;
    - a pretraining run folder (`run_folder.RECORD_FILE` or a `ckpt-<n>.index`): fine-tuning
      writes `best/`, `logs/` and `results.json` among the run's checkpoints;
    - the folder of `init_checkpoint` itself or one holding it: its files mixed with the
      starting point's (a model of other settings there is replaced by `--overwrite`);
    - a link or a file planted at a folder the run makes there (`logs/`, its `train/` and
      `eval/`, and `predictions` unless it is the run's own link into `best/`): refused again
      by `files.own_folder` when the folder is made, so a link planted later is caught too.
    A remote folder (gs://) is not checked; an `init_checkpoint` that is not a local path (a
    released model's name) is not compared.
    """
    if model_dir is None or files.is_remote(model_dir):
        return
    model_dir = os.fspath(model_dir)
    flag = f"--model_dir {model_dir}"
    if os.path.lexists(model_dir) and not os.path.isdir(model_dir):
        raise RunFolderError(f"{flag} exists and is not a folder")
    existing = model_dir
    while not os.path.lexists(existing):  # the folder a missing model_dir is made in
        existing = os.path.dirname(os.path.abspath(existing))
    if not os.path.isdir(existing):
        raise RunFolderError(f"{flag}: {existing} exists and is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = os.statvfs(existing).f_flag & os.ST_RDONLY
        raise RunFolderError(f"{flag}: cannot write in {existing} "
                             f"({'read-only file system' if read_only else 'permission denied'})")
    if existing == model_dir:
        try:
            names = os.listdir(model_dir)
        except OSError:
            names = []
        found = [n for n in names if n == RECORD_FILE or re.fullmatch(r"ckpt-\d+\.index", n)]
        if found:
            raise RunFolderError(
                f"{flag} is a pretraining run folder (it holds {sorted(found)[-1]}); fine-tuning "
                "writes best/, logs/ and results.json there: give it a folder of its own")
        for folder in ("logs", "logs/train", "logs/eval", "predictions"):
            path = os.path.join(model_dir, folder)
            ours = folder == "predictions" and os.path.islink(path) and os.readlink(path) == "best/predictions"
            if os.path.lexists(path) and not ours and (os.path.islink(path) or not os.path.isdir(path)):
                files.own_folder(path)  # raises LinkedFolderError naming it
    if init_checkpoint is None or files.is_remote(init_checkpoint):
        return
    init_checkpoint = os.path.expanduser(os.fspath(init_checkpoint))
    if os.path.isdir(init_checkpoint):
        source = init_checkpoint
    elif os.path.lexists(init_checkpoint) or os.path.exists(init_checkpoint + ".index"):
        source = os.path.dirname(os.path.abspath(init_checkpoint))  # a file, a TF1 prefix
    else:
        return  # a released model's name: fetched into its library's cache
    source, target = os.path.realpath(source), os.path.realpath(model_dir)
    if os.path.commonpath([source, target]) == target:
        raise RunFolderError(
            f"{flag} {'is' if source == target else 'holds'} the folder of --init_checkpoint "
            f"{init_checkpoint}; fine-tuning would write its files among the checkpoint's: give "
            "it a folder of its own")
