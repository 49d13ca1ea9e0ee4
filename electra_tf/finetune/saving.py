"""The fine-tuned model on disk: `best/`, what `seeds.finetune` writes, `load_finetuned` and the
exporter (`export.py`) read.

Words used across the package: a fine-tuned model is its *head* (the Keras model of `heads.py`,
encoder included) with its *description* (`FinetunedModelConfig`: family, task, labels, length,
casing, ...) and its vocabulary; functions take them as `head` and `description`.

Layout:

    best/
      head_config.json   `FinetunedModelConfig`: the family, the head's class and
                         get_config() (with the encoder's ElectraConfig), task, label names,
                         max_seq_length, lower_case, text_pair, QA options, the epoch, its
                         metrics and the seed
      config.json        the encoder's ElectraConfig (same as head_config["config"])
      model.index, model.data-00000-of-00001
                         tf.train.Checkpoint(model=head): the object graph of the head, i.e.
                         `model/encoder/...` (the Discriminator without RTD head) and
                         `model/<head layer>/...` (`classifier`, `qa_start`, ...). No optimizer.
      vocab.txt          the WordPiece vocabulary the inputs were tokenized with
      predictions.*      the evaluation predictions of that epoch (as in predictions/)
      submission/        GLUE test predictions of this model (GLUE tasks with test files)
      finetuning_config.json, results.json, predictions/
                         what the trainer writes with the model: the run that made it
                         (`publishing.py`'s layout)

Example:
    head, description, vocab_file = load_finetuned("ft/rt")  # a run's model_dir, or its best/
    description.family, description.label_names  # ("classification", ("negative", "positive"))
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from electra_tf import files
from electra_tf.config import ConfigError, JsonConfig, check_field_types
from electra_tf.finetune.config import FinetuningConfig, QAOptions
from electra_tf.finetune.families import FAMILIES, get_family
from electra_tf.finetune.tasks import Task

HEAD_CONFIG = "head_config.json"

FINETUNED_FORMAT = "electra_tf_finetuned"
# 1: the family was called "kind" and `text_pair` was not recorded; 2: today's fields.
FINETUNED_VERSIONS = (1, 2)


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
    >>> description = FinetunedModelConfig.from_json("ft/rt/best/head_config.json")
    >>> description.family, description.label_names
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
            repeated = sorted({n for n in self.label_names if self.label_names.count(n) > 1})
            if repeated:  # a served label (or Classify's classes) would not say which class
                raise ConfigError(f"FinetunedModelConfig.label_names: must be distinct ({repeated} "
                                  "repeated)")
        # Past the position embeddings, a served text would fail in the graph, not at export.
        positions = (self.head_config.get("config") or {}).get("max_position_embeddings")
        if isinstance(positions, int) and self.max_seq_length > positions:
            raise ConfigError(f"FinetunedModelConfig.max_seq_length: {self.max_seq_length} is more "
                              f"than the model's max_position_embeddings ({positions})")
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


def describe_finetuned(head, task: Task, fc: FinetuningConfig, **fields) -> FinetunedModelConfig:
    """The `FinetunedModelConfig` of `head` fine-tuned on `task` with `fc`; `fields`:
    lower_case, epoch, metrics, seed."""
    family = get_family(task.family)
    return FinetunedModelConfig.for_head(
        head, task=task.name, label_names=task.label_names, max_seq_length=fc.max_seq_length,
        **family.saved_fields(task, fc), **fields)


def save_finetuned(head, folder, description: FinetunedModelConfig, vocab_file) -> Path:
    """Writes `head` in the `best/` layout of the module docstring, described by `description`
    (`describe_finetuned`), into `folder`: made when missing, its model files replaced, the rest
    kept (the run folder, `publishing.FinetuningFolder`, gives a private staging folder that
    already holds the run's config and predictions, published as `best/` when the run is
    complete). `head_config.json` is written last: a folder with it holds a complete model."""
    import tensorflow as tf

    folder = Path(folder)
    if folder.is_symlink():
        folder.unlink()  # never write through a link we did not make
    files.own_folder(folder)
    tf.train.Checkpoint(model=head).write(str(folder / description.checkpoint))
    files.copy_file(vocab_file, folder / description.vocab)
    head.config.to_json(folder / "config.json")
    files.write_json(folder / HEAD_CONFIG, description.to_dict())
    return folder


def find_finetuned(path) -> Path:
    """The `best/` folder of a run folder, of a `run_seeds` folder (one seed or several), of a
    folder written before `model_dir/best/` held the best seed (its results.json names the
    seed's folder), or `best/` itself."""
    path = Path(path).expanduser()
    if (path / HEAD_CONFIG).exists():
        return path
    if (path / "best" / HEAD_CONFIG).exists():
        return path / "best"
    results = path / "results.json"
    if results.exists():
        best = json.loads(results.read_text()).get("best_model")  # relative to `path`
        if best and (path / best / HEAD_CONFIG).exists():
            return path / best
    raise FileNotFoundError(f"{path}: no fine-tuned model ({HEAD_CONFIG} in it, in best/, or a "
                            "results.json with best_model_dir)")


def load_finetuned(path):
    """(head, `FinetunedModelConfig`, vocab_path) from a folder written by `finetune` /
    `run_seeds`.

    `path` may be the run's `model_dir`, a `run_seeds` `model_dir` (its best seed is loaded) or
    the `best/` folder itself. Every variable of the head is restored (an error otherwise).
    `head_config.json` files of version 1 ("kind" for "family") load too.
    """
    import tensorflow as tf

    from electra_tf.convert.common import open_tf_checkpoint, reading_tf_tensors
    from electra_tf.finetune import heads

    folder = find_finetuned(path)
    description = FinetunedModelConfig.from_json(folder / HEAD_CONFIG)
    head_class = getattr(heads, get_family(description.family).head)
    head = head_class.from_config(description.head_config)
    prefix = str(folder / description.checkpoint)
    open_tf_checkpoint(prefix)  # a damaged file: a ConversionError (a ValueError) naming it
    with reading_tf_tensors(prefix):
        status = tf.train.Checkpoint(model=head).read(prefix)
    status.assert_existing_objects_matched()
    status.expect_partial()
    return head, description, str(folder / description.vocab)
