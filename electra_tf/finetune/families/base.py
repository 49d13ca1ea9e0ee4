"""`TaskFamily`: what one family of fine-tuning tasks does, from a file to a served answer.

The authors give each family one class (`finetune/task.py` of google-research/electra:
featurize, prediction module, scorer); so do we. A family owns, for every task of its kind:

- data: how its local files and TFDS records become examples (`read_file`,
  `example_from_tfds`, `labels_in_file`, `labels_used`, `file_extensions`);
- features: examples -> the head's arrays, for training and evaluation (`featurize`);
- the head: which Keras model of `heads.py` and with which options (`build_head`);
- scoring: its metrics, prediction records and prediction files, the GLUE submission file
  where it applies (`metrics`, `evaluate`, `write_predictions`, `write_submission`);
- the saved model: what `head_config.json` records beyond the common fields (`saved_fields`)
  and the exported SavedModel's text signature (`serving_signature`, `ids_shape`).

A `Task` (`tasks.py`: name, labels, columns, splits, metrics) names its family; `FAMILIES` maps
the name to the class. Families take the task as an argument and import nothing above them
(`examples.py`, `readers.py`, `glue.py`, `features.py`, `metrics.py`, `config.py`). The
fine-tuning loop (`trainer.py`) and the exporter (`export.py`) call these methods and never ask
which family they hold.

Importing this package does not import Keras or TensorFlow (a `Task` checks its family here):
the head class is looked up in `heads.py` when a head is built, TensorFlow is imported inside
the serving methods.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from electra_tf import files
from electra_tf.finetune.metrics import TaskMetrics

FAMILIES: dict[str, type["TaskFamily"]] = {}


def register_family(cls: type["TaskFamily"]) -> type["TaskFamily"]:
    """Class decorator: makes a family known by its `name` (to `Task`, the loop, the exporter)."""
    if not cls.name or not cls.head:
        raise ValueError(f"{cls.__name__}: a task family needs a `name` and a `head`")
    if FAMILIES.get(cls.name, cls) is not cls:
        raise ValueError(f"task family {cls.name!r} is already registered ({FAMILIES[cls.name].__name__})")
    FAMILIES[cls.name] = cls
    return cls


def get_family(name: str) -> "TaskFamily":
    """The family registered as `name` ("classification", "regression", "tagging", "qa",
    "multiple_choice", or one registered by the caller)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown task family {name!r}; expected one of {tuple(FAMILIES)}")
    return FAMILIES[name]()


@dataclasses.dataclass
class Features:
    """A set of examples featurized for the model.

    examples: the examples, in order.
    arrays: numpy [N, ...]: the head's inputs (`data.inputs.INPUT_KEYS`) and, for labelled examples,
      its labels (N windows for QA, N examples otherwise).
    extra: what maps the outputs back to the examples: QA windows, tagging word positions.
    """

    examples: list
    arrays: dict
    extra: Any = None


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def string_specs(*names):
    """`tf.TensorSpec`s of string [batch] inputs, one per name."""
    import tensorflow as tf

    return [tf.TensorSpec([None], tf.string, name=n) for n in names]


class TaskFamily:
    """Base class of the task families; subclasses set the class attributes and override the
    methods their tasks need (see the module docstring).

    Class attributes:
      name: the registry key, the value of `Task.family` and of `head_config.json`'s "family",
        and the name of the family's generic task (`electra-finetune --task=<name>`).
      head: the class name of its head in `heads.py`.
      file_extensions: what `task_data.data_files` looks for (`train.<ext>`, `dev.<ext>`).
      has_label_names: its labels are a set of names (classification, tagging), read from the
        training file when the task does not list them.
      generic_columns: column fields of its generic task (`tasks.generic_task`).
      generic_scores: the metrics of a task of this family that defines none (its generic task
        and custom tasks).
    """

    name: str = ""
    head: str = ""
    file_extensions: tuple[str, ...] = (".tsv", ".csv", ".jsonl")
    has_label_names: bool = False
    generic_columns: dict = {}
    generic_scores: TaskMetrics | None = None

    # `FinetuningConfig` fields every task of the family trains with unless told otherwise (a
    # task's row may add its own: `tasks.Task.defaults`).
    finetuning_defaults: dict[str, Any] = {}

    def __repr__(self):
        return f"{type(self).__name__}()"

    # --- data ----------------------------------------------------------------------------

    def read_file(self, task, path: str) -> list:
        """Examples of a local file (it exists)."""
        raise NotImplementedError

    def example_from_tfds(self, task, eid: int, record: dict):
        """One `tfds.as_numpy` record -> an example."""
        raise ValueError(f"Task {task.name!r}: the {self.name} family reads no TFDS data")

    def labels_in_file(self, task, path: str) -> set[str]:
        """The label strings a (training) file uses, for a family with label names."""
        raise ValueError(f"Task {task.name!r}: a {self.name} task has no label set")

    def unlabeled(self, examples: Sequence) -> int:
        """How many examples carry no label (fine-tuning and evaluation need every label)."""
        return sum(1 for e in examples if e.label is None)

    def labels_used(self, examples: Sequence) -> set[int]:
        """The label ids the examples use, for a family with label names (a training set that
        uses one is warned about: `task_data.warn_one_label`)."""
        return {e.label for e in examples if e.label is not None}

    # --- features and head -----------------------------------------------------------------

    def featurize(self, task, examples: Sequence, tokenizer, fc, training: bool) -> Features:
        """Examples -> `Features`; `fc` is the `FinetuningConfig` (max_seq_length, ...)."""
        raise NotImplementedError

    def head_options(self, task, fc) -> dict:
        """Keyword arguments of the head's constructor besides the encoder config."""
        return {}

    def build_head(self, config, task, fc):
        """The head (`heads.py`) for `task` over an encoder of `config`."""
        from electra_tf.finetune import heads

        return getattr(heads, self.head)(config, task_name=task.name, **self.head_options(task, fc))

    # --- evaluation ------------------------------------------------------------------------

    def generic_metrics(self, task) -> TaskMetrics:
        """The metrics of `task` when it defines none (`tasks.Task.metrics`)."""
        return self.generic_scores

    def evaluate(self, task, data: Features, outputs: dict, fc) -> tuple[dict, Any]:
        """(metrics incl. "main", prediction records) from the head's numpy `outputs` on
        `data.arrays` (inference mode)."""
        raise NotImplementedError

    def write_predictions(self, records, folder: Path, stem: str) -> list[Path]:
        """Writes the records of `evaluate`: `<stem>.jsonl`, one JSON object per example."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.jsonl"
        with files.replacing(path) as f:  # never through a link planted at the name
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return [path]

    def write_submission(self, task, path: Path, data: Features, outputs: dict) -> Path:
        """Writes test-set predictions in the benchmark's submission format (GLUE)."""
        raise ValueError(f"Task {task.name!r}: the {self.name} family writes no submission files")

    # --- saved model and serving ------------------------------------------------------------

    def saved_fields(self, task, fc) -> dict:
        """`FinetunedModelConfig` fields of this family beyond the common ones."""
        return {}

    def text_pair(self, description) -> bool:
        """Whether the text signature takes a second text (sentence pair tasks)."""
        return False

    def ids_shape(self, description) -> list:
        """Shape of the int32 inputs of the `serve_ids` signature."""
        return [None, None]  # [batch, seq]

    def infer(self, head, inputs: dict) -> dict:
        """The head's inference outputs on packed int inputs, as every signature runs it (the
        text signature on the packing's arrays, `serve_ids` on the client's): a family may run
        it another way that gives the same outputs (`SentenceFamily.infer`)."""
        return dict(head(inputs, training=False))

    def serving_signature(self, head, description, pre):
        """(function, input specs) of the SavedModel's `serving_default`: raw text in, packed
        by `pre` (`data.preprocessor.TextPreprocessor`), which also packed `featurize`'s arrays.

        `description` is the fine-tuned model's `saving.FinetunedModelConfig`. The function
        must be named `serve_text` (tests read its traced graph by that name)."""
        raise NotImplementedError

    def truncated(self, pre, inputs: dict, outputs: dict):
        """The text signature's `truncated` output, bool [B]: which rows had more than
        max_seq_length pieces and were cut, from the signature's `inputs` and `outputs` (dicts of
        tensors by name); None where the family has no simple answer (the signature then has no
        `truncated`)."""
        return None

    def example_signatures(self, head, description) -> dict:
        """TF Serving's Classify / Regress signatures of this family: {signature name: function
        from the text signature's outputs to the API's outputs}, {} for none. The export parses
        the `tf.Example`s into the text signature's inputs (`signatures._example_signature`)."""
        return {}


def label_names(description, head) -> list[str]:
    """The class names a served model answers with: the recorded label names, else "0", "1", ..."""
    names = description.label_names or [str(i) for i in range(head.num_labels)]
    if len(names) != head.num_labels:
        raise ValueError(f"head_config.json: {len(names)} label_names for a head with "
                         f"{head.num_labels} labels")
    return [str(n) for n in names]
