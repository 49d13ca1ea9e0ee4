"""Fine-tuning tasks: what a task's examples look like, where its data comes from, how it is
scored, and the predefined tasks, each defined once in `TASKS`.

A `Task` names its family (`families/`: the family reads its files, featurizes, builds the head,
scores and serves), the columns holding the text, the text pair and the label, the label set,
where TFDS keeps it, the layout of its original GLUE files (`glue.py`), its metrics
(`metrics.py`) and the other names it answers to. A task the user describes on the command line
(`--task=classification --text_column=review`) is its family's generic task (`generic_task`)
with the columns changed; a predefined task with changed columns reads its files by those
columns (`Task.glue` is then None).

Example:
  task = get_task("mrpc")                     # also "glue/mrpc"
  task.glue.folder, task.metrics.main         # ("MRPC", ("f1", "accuracy"))
  custom = Task("my_sentiment", "classification", text_column="review", label_column="stars")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from electra_tf.finetune import metrics
from electra_tf.finetune.families import FAMILIES, get_family
from electra_tf.finetune.glue import BINARY, NLI, GlueTask, Layout, pair_files

_COLUMNS = ("text_column", "text_pair_column", "label_column", "has_header")


@dataclasses.dataclass(frozen=True)
class Task:
    """What a fine-tuning task's examples look like, where they come from and how they are scored.

    Args:
      name: task name.
      family: the task family (`families.FAMILIES`): "classification", "regression",
        "tagging", "qa" or "multiple_choice".
      label_names: classification / tagging label set; a label's id is its index here.
        None until set (`with_label_names`, `task_data.infer_label_names`).
      text_column: column (CSV/TSV header name, 0-based index for header-less TSV, or JSONL
        key) of the first text; for tagging the JSONL key of the word list; for multiple choice
        the JSONL key of the context (premise, question) every choice is paired with.
      text_pair_column: column of the second text of a pair task, or None; for multiple choice
        the JSONL key of the list of choices.
      label_column: column of the label; for tagging the JSONL key of the tag list.
      tfds_name: e.g. "glue/mrpc" or "squad/v2.0", or None.
      tfds_splits: our split name ("train", "dev", "test") -> TFDS split name.
      has_header: CSV/TSV files start with a header row (False: columns are indices).
      squad_v2: QA examples may be unanswerable (`is_impossible`).
      glue_files: the layout of the task's original GLUE files (`glue.GlueTask`), or None.
      scores: the metrics reported and the main score; None: the family's generic ones.
      aliases: other names `get_task` knows the task by (lower case).
      defaults: `FinetuningConfig` fields this task trains with unless told otherwise, over its
        family's (`TaskFamily.finetuning_defaults`), as (field, value) pairs; e.g. the original's
        10 epochs for RTE and STS-B.
    """

    name: str
    family: str
    label_names: tuple[str, ...] | None = None
    text_column: str | int = "text"
    text_pair_column: str | int | None = None
    label_column: str | int = "label"
    tfds_name: str | None = None
    tfds_splits: tuple[tuple[str, str], ...] = (("train", "train"), ("dev", "validation"), ("test", "test"))
    has_header: bool = True
    squad_v2: bool = False
    glue_files: GlueTask | None = None
    scores: metrics.TaskMetrics | None = None
    aliases: tuple[str, ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Task {self.name!r}: field 'family' is {self.family!r}, expected one of "
                             f"{tuple(FAMILIES)}")
        if self.label_names is not None:
            names = tuple(str(n) for n in self.label_names)
            if len(set(names)) != len(names) or not names:
                raise ValueError(f"Task {self.name!r}: field 'label_names' must be non-empty and unique")
            object.__setattr__(self, "label_names", names)

    @property
    def finetuning_defaults(self) -> dict[str, Any]:
        """The `FinetuningConfig` fields this task trains with by default: its family's, then its
        own (`FinetuningConfig.for_model_size(size, task)`)."""
        return {**get_family(self.family).finetuning_defaults, **dict(self.defaults)}

    @property
    def num_labels(self) -> int:
        return len(self.label_names or ())

    @property
    def glue(self) -> GlueTask | None:
        """The layout of the original GLUE files, while the task reads the columns it was defined
        with (changed columns read a TSV by those columns instead)."""
        if self.glue_files is None:
            return None
        defined = TASKS.get(self.name)
        if defined is None or any(getattr(self, f) != getattr(defined, f) for f in _COLUMNS):
            return None
        return self.glue_files

    @property
    def metrics(self) -> metrics.TaskMetrics:
        """The metrics the task reports and the one that selects the best checkpoint."""
        return self.scores or get_family(self.family).generic_metrics(self)

    def with_label_names(self, names: Sequence[str]) -> "Task":
        return dataclasses.replace(self, label_names=tuple(str(n) for n in names))

    def tfds_split(self, split: str) -> str:
        mapping = dict(self.tfds_splits)
        if split not in mapping:
            raise ValueError(f"Task {self.name!r}: unknown split {split!r}, expected one of {sorted(mapping)}")
        return mapping[split]


_MNLI_SPLITS = (("train", "train"), ("dev", "validation_matched"), ("test", "test_matched"))
_SQUAD_SPLITS = (("train", "train"), ("dev", "validation"))


def _glue(name, tfds_config, labels, text, pair, scores, files, family="classification",
          aliases=(), **kwargs):
    """A GLUE task: TFDS `glue/<config>` (whose column names are `text` and `pair`), the layout of
    its original files, also called `glue/<config>`. Label names are in TFDS's ClassLabel order,
    so a TFDS label id is our label id."""
    return Task(name, family, labels, text, pair, "label", f"glue/{tfds_config}",
                glue_files=files, scores=scores, aliases=(f"glue/{tfds_config}", *aliases),
                **kwargs)


ACCURACY, F1_ACCURACY = metrics.ACCURACY, metrics.F1_ACCURACY
# The authors' run_finetuning.py trains the two smallest GLUE sets, RTE and STS-B, 10 epochs.
_TEN_EPOCHS = (("num_train_epochs", 10.0),)
# The predefined tasks: one row each (family, labels, columns, data, metrics, other names).
TASKS: dict[str, Task] = {t.name: t for t in [
    _glue("cola", "cola", ("unacceptable", "acceptable"), "sentence", None, metrics.MCC_ACCURACY,
          GlueTask("CoLA", Layout((3, None), label=(1, None), header=False),
                   Layout((1, "sentence"), index=(0, "index")), BINARY,
                   tests=(("CoLA.tsv", "test.tsv"),))),
    _glue("sst-2", "sst2", ("negative", "positive"), "sentence", None, ACCURACY,
          GlueTask("SST-2", Layout((0, "sentence"), label=(1, "label")),
                   Layout((1, "sentence"), index=(0, "index")), BINARY,
                   tests=(("SST-2.tsv", "test.tsv"),)),
          aliases=("sst2",)),
    _glue("mrpc", "mrpc", ("not_equivalent", "equivalent"), "sentence1", "sentence2", F1_ACCURACY,
          pair_files("MRPC", (3, "#1 String"), (4, "#2 String"), (0, "Quality"), BINARY,
                     test_text=3, test_pair=4)),
    _glue("sts-b", "stsb", None, "sentence1", "sentence2", metrics.CORRELATION,
          pair_files("STS-B", (-3, "sentence1"), (-2, "sentence2"), (-1, "score"), None,
                     test_text=-2, test_pair=-1),
          family="regression", aliases=("stsb",), defaults=_TEN_EPOCHS),
    _glue("qqp", "qqp", ("not_duplicate", "duplicate"), "question1", "question2", F1_ACCURACY,
          GlueTask("QQP", Layout((3, "question1"), (4, "question2"), (5, "is_duplicate")),
                   Layout((1, "question1"), (2, "question2"), index=(0, "id")), BINARY,
                   tests=(("QQP.tsv", "test.tsv"),))),
    _glue("mnli", "mnli", ("entailment", "neutral", "contradiction"), "premise", "hypothesis",
          ACCURACY,
          GlueTask("MNLI", Layout((8, "sentence1"), (9, "sentence2"), (-1, "gold_label")),
                   Layout((8, "sentence1"), (9, "sentence2"), index=(0, "index")),
                   ("entailment", "neutral", "contradiction"),
                   dev=(("dev", "dev_matched.tsv"), ("dev_mismatched", "dev_mismatched.tsv")),
                   tests=(("MNLI-m.tsv", "test_matched.tsv"), ("MNLI-mm.tsv", "test_mismatched.tsv")),
                   diagnostic=True),
          tfds_splits=_MNLI_SPLITS, aliases=("mnli_matched",)),
    _glue("qnli", "qnli", ("entailment", "not_entailment"), "question", "sentence", ACCURACY,
          pair_files("QNLI", (1, "question"), (2, "sentence"), (3, "label"), NLI)),
    _glue("rte", "rte", ("entailment", "not_entailment"), "sentence1", "sentence2", ACCURACY,
          pair_files("RTE", (1, "sentence1"), (2, "sentence2"), (3, "label"), NLI), defaults=_TEN_EPOCHS),
    _glue("wnli", "wnli", ("not_entailment", "entailment"), "sentence1", "sentence2", ACCURACY,
          pair_files("WNLI", (1, "sentence1"), (2, "sentence2"), (3, "label"), BINARY)),
    # The paper's tables quote SQuAD exact match, so it selects the checkpoint.
    Task("squad1.1", "qa", tfds_name="squad/v1.1", tfds_splits=_SQUAD_SPLITS,
         scores=metrics.SQUAD_V1, aliases=("squadv1", "squad/v1.1")),
    # "squad": the original code's name for its v2.0 task.
    Task("squad2.0", "qa", tfds_name="squad/v2.0", tfds_splits=_SQUAD_SPLITS, squad_v2=True,
         scores=metrics.SQUAD_V2, aliases=("squad", "squad/v2.0")),
    # Rotten Tomatoes sentence polarity (SST-2's source): 0 = negative, 1 = positive.
    Task("rotten_tomatoes", "classification", ("negative", "positive"),
         tfds_splits=(("train", "train"), ("dev", "dev")), scores=ACCURACY),
]}
_BY_ALIAS = {alias: task for task in TASKS.values() for alias in task.aliases}


def get_task(name: str) -> Task:
    """A predefined task by its name or another name it has ("mrpc", "glue/mrpc", "sst2",
    "squad", ...)."""
    key = name.strip().lower()
    task = TASKS.get(key) or _BY_ALIAS.get(key)
    if task is None:
        raise ValueError(f"unknown task {name!r}; predefined tasks: {', '.join(TASKS)}")
    return task


def generic_task(family: str, version_2: bool = False) -> Task:
    """The generic task of a family, for local files (`electra-finetune --task=<family>`): named
    as the family, with the family's default columns (`TaskFamily.generic_columns`)."""
    options = dict(get_family(family).generic_columns)
    if version_2:
        options["squad_v2"] = True
    return Task(family, family, **options)


def takes_pairs(name: str | None) -> bool:
    """Whether the predefined task called `name` reads text pairs (False for any other name): what
    a sentence model saved before `head_config.json` recorded `text_pair` was trained on."""
    try:
        return get_task(name).text_pair_column is not None if name else False
    except ValueError:
        return False


def rotten_tomatoes_task() -> Task:
    """Rotten Tomatoes sentence polarity (SST-2's source): 0 = negative, 1 = positive."""
    return TASKS["rotten_tomatoes"]
