"""A task's data: its examples from local files, a prepared TFDS dataset or the packaged Rotten
Tomatoes corpus (`load_examples`), its files in a folder (`data_files`), its label set
(`infer_label_names`, saved beside a fine-tuned model).

The task (`tasks.Task`) says what an example looks like; its family (`families/`) reads the files
into examples (`examples.py`) with the readers of `readers.py` (the original GLUE TSVs by the
task's layout in `glue.py`, which still reads a TSV with its named columns: `sentence1`,
`sentence2`, `label`). `data_files(task, data_dir)` finds a task's train / dev (/ GLUE test)
files in a folder.

Bad input raises `TaskDataError` whose message starts with `file:line:` and names the field. A
training file with a single label is refused when the label set is inferred from it, and warned
about when the task declares its labels (`infer_label_names`, `load_examples`).

Example:
  task = Task("my_sentiment", "classification", text_column="review", label_column="stars")
  task = task.with_label_names(infer_label_names(task, "train.csv"))
  train = load_examples(task, "train", path="train.csv")
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

from absl import logging

from electra_tf import files
from electra_tf.finetune import glue, readers
from electra_tf.finetune.examples import SentenceExample, TaskDataError
from electra_tf.finetune.families import get_family
from electra_tf.finetune.tasks import Task

# ---------------------------------------------------------------------------------------
# Label sets.
# ---------------------------------------------------------------------------------------


def _sorted_labels(labels) -> tuple[str, ...]:
    labels = set(labels)
    if all(re.fullmatch(r"-?\d+", label) for label in labels):
        return tuple(sorted(labels, key=int))  # "2" before "10"
    return tuple(sorted(labels))


def infer_label_names(task: Task, path: str | os.PathLike) -> tuple[str, ...]:
    """The sorted set of labels in a (training) file, for a family with a label set
    (classification, tagging).

    Raises TaskDataError naming the file, the field and the label when the file has one label
    only. A model over one class learns nothing (its softmax is 1 whatever the input, the loss 0)
    and answers that class for everything, so the run would only cost time; a file with one
    label is nearly always a mistake: the wrong --label_column, a file sorted by label and cut,
    the positive half of a split. Training on it anyway takes declaring the label set (--labels),
    and `load_examples` still warns then.
    """
    path = os.fspath(path)
    found = get_family(task.family).labels_in_file(task, path)
    if not found:
        raise TaskDataError(f"{path}:1: field {task.label_column!r}: no labels in the file")
    if len(found) == 1:
        raise TaskDataError(
            f"{path}: field {task.label_column!r}: every label in the file is {next(iter(found))!r}; "
            "a classifier needs two classes or more to learn anything (check the label column, or "
            "declare the label set with --labels to train on this file anyway)")
    return _sorted_labels(found)


def save_label_names(path: str | os.PathLike, names: Sequence[str]) -> None:
    """Writes the label set as a JSON list (saved next to a fine-tuned model)."""
    files.write_json(path, list(names), indent=0)


def load_label_names(path: str | os.PathLike) -> tuple[str, ...]:
    with readers.open_text(os.fspath(path)) as f:
        names = readers.parse_json(os.fspath(path), f.read())
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TaskDataError(f"{os.fspath(path)}:1: field 'label_names': expected a JSON list of strings")
    return tuple(names)


# ---------------------------------------------------------------------------------------
# Entry point.
# ---------------------------------------------------------------------------------------


def load_examples(task: Task, split: str = "train", *, path: str | os.PathLike | None = None,
                  data_dir: str | None = None) -> list:
    """Examples of `task`'s `split`.

    Args:
      task: the task; classification and tagging need `label_names` set.
      split: "train", "dev" or "test" (selects the TFDS / Rotten Tomatoes split; for local files
        only recorded in messages).
      path: a local file: .csv, .tsv, .jsonl, .json (SQuAD), .txt/.conll (CoNLL columns).
      data_dir: TFDS data directory (used when `path` is None and the task has `tfds_name`).

    Raises TaskDataError naming the file and the split when a local file holds no example (a
    header and nothing else, say): training and evaluation need at least one. Warns when a
    training file uses one label only (`warn_one_label`).
    """
    if path is not None:
        examples = read_file(task, path)
        if not examples:
            raise TaskDataError(f"{os.fspath(path)}: no {split} examples in the file (task "
                                f"{task.name!r}): it has no data rows, only a header or blank "
                                "lines")
        if split == "train":
            warn_one_label(task, os.fspath(path), examples)
        return examples
    if task.name == "rotten_tomatoes":
        return rotten_tomatoes_examples(split)
    if task.tfds_name:
        return load_tfds(task, split, data_dir)
    raise ValueError(f"Task {task.name!r} has no tfds_name: pass path= to a local file")


def warn_one_label(task: Task, path: str, examples: Sequence) -> None:
    """Warns, naming the file and the label, when the training examples of a task with a label
    set all have one label.

    The label set is declared here (by the task, as GLUE's are, or by --labels): an inferred one
    with a single label has been refused by `infer_label_names`. Declared, the run may be meant
    (a one-class slice on purpose), so it goes on; but the model never sees the other classes and
    will answer the one it saw for everything, which a user who took the wrong file should hear.
    """
    family = get_family(task.family)
    if not family.has_label_names or not task.label_names:
        return
    used = family.labels_used(examples)
    if len(used) == 1:
        label = task.label_names[next(iter(used))]
        logging.warning("%s: every training label is %r, one of the %d labels of task %r (%s): the "
                        "model never sees another and will predict %r for everything; check the "
                        "file and the label column", path, label, task.num_labels, task.name,
                        ", ".join(task.label_names), label)


@dataclasses.dataclass
class DataFiles:
    """Local files of a task: training, evaluation sets by name ("dev" first), test sets by the
    GLUE submission file they produce (GLUE tasks only)."""

    train: str | None = None
    dev: dict = dataclasses.field(default_factory=dict)
    test: dict = dataclasses.field(default_factory=dict)


def _split_file(task: Task, folder: str, split: str, extensions: Sequence[str]) -> str | None:
    found = [os.path.join(folder, split + ext) for ext in extensions
             if os.path.exists(os.path.join(folder, split + ext))]
    if len(found) > 1:
        raise TaskDataError(f"{folder}: several {split} files ({', '.join(found)}); pass --{split}_file")
    return found[0] if found else None


def data_files(task: Task, data_dir: str | os.PathLike | None = None, *, train_path=None,
               eval_path=None) -> DataFiles:
    """The local files of `task`: `train_path` / `eval_path` as given, the rest from `data_dir`.

    For a GLUE task `data_dir` is its folder as the GLUE download script writes it
    (`glue_data/MRPC`, or `glue_data`): train.tsv, dev.tsv (MNLI: dev_matched.tsv, and
    dev_mismatched.tsv as the evaluation set "dev_mismatched") and the test files
    (the task's `glue_files`). For another task, `data_dir/train.<ext>` and `dev.<ext>` with the
    extensions its family reads (`TaskFamily.file_extensions`: .tsv/.csv/.jsonl; tagging
    .jsonl/.txt/.conll; QA .json; multiple choice .jsonl).
    """
    result = DataFiles(None if train_path is None else os.fspath(train_path),
                       {} if eval_path is None else {"dev": os.fspath(eval_path)})
    if data_dir is None:
        return result
    data_dir = os.path.expanduser(os.fspath(data_dir))
    if task.glue is not None:
        found = glue.glue_files(task, data_dir)
        where = glue.task_folder(task.glue, data_dir)
        found_train, found_dev = found.train, found.dev
        result.test = {name: str(path) for name, path in found.test.items()}
        wanted = f"train.tsv and {task.glue.dev[0][1]}"
    else:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"{data_dir}: no such folder (--data_dir for task {task.name!r})")
        where = data_dir
        extensions = get_family(task.family).file_extensions
        found_train = _split_file(task, data_dir, "train", extensions)
        dev = _split_file(task, data_dir, "dev", extensions)
        found_dev = {"dev": dev} if dev else {}
        wanted = "train.<ext> and dev.<ext> with <ext> one of " + "/".join(extensions)
    if result.train is None:
        if found_train is None:
            raise FileNotFoundError(f"{where}: no training file (looked for {wanted})")
        result.train = str(found_train)
    if not result.dev:
        if "dev" not in found_dev:
            raise FileNotFoundError(f"{where}: no evaluation file (looked for {wanted})")
        result.dev = {name: str(path) for name, path in found_dev.items()}
    return result


def read_file(task: Task, path: str | os.PathLike) -> list:
    """Reads a local file into examples, as the task's family reads its files."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (task {task.name!r})")
    return get_family(task.family).read_file(task, path)


# ---------------------------------------------------------------------------------------
# CSV / TSV / JSONL rows.
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# TFDS.
# ---------------------------------------------------------------------------------------


def load_tfds(task: Task, split: str, data_dir: str | None) -> list:
    """Examples from a prepared TFDS dataset (never downloads)."""
    if not task.tfds_name:
        raise ValueError(f"Task {task.name!r} has no tfds_name")
    tfds_split = task.tfds_split(split)
    import tensorflow_datasets as tfds  # optional dependency (extra "tfds")

    try:
        dataset = tfds.load(task.tfds_name, split=tfds_split, data_dir=data_dir, download=False)
    except Exception as e:  # tfds raises AssertionError / DatasetNotFoundError, by version
        raise FileNotFoundError(
            f"TFDS dataset {task.tfds_name!r} (split {tfds_split!r}) is not prepared under data_dir="
            f"{data_dir!r}; run tfds.builder({task.tfds_name!r}, data_dir=...).download_and_prepare() "
            f"where the download servers are reachable, then copy the data_dir here ({e})"
        ) from e
    return [tfds_record_to_example(task, i, record) for i, record in enumerate(tfds.as_numpy(dataset))]


def tfds_record_to_example(task: Task, eid: int, record: dict):
    """One `tfds.as_numpy` record of a GLUE or SQuAD dataset -> our example (by the family)."""
    return get_family(task.family).example_from_tfds(task, eid, record)


# ---------------------------------------------------------------------------------------
# Rotten Tomatoes (packaged data; the SST-2 stand-in).
# ---------------------------------------------------------------------------------------


ROTTEN_TOMATOES_SPLITS = ("train", "dev", "tune_train", "tune_eval", "fold<k>_train", "fold<k>_eval")


def rotten_tomatoes_examples(split: str = "train") -> list[SentenceExample]:
    """Rotten Tomatoes "train" or "dev" from `electra_tf.data.corpus.rotten_tomatoes_split`:
    a sentence is in dev when sha1("0:" + text) scaled to [0, 1) is below 0.1 (about 10%).

    "tune_train" / "tune_eval" cut "train" again (`corpus.rotten_tomatoes_tuning_split`, ~85% /
    ~15%): recipes are chosen on that pair, never on "dev". "fold<k>_eval" is fold k of
    `corpus.rotten_tomatoes_folds` (k < `corpus.CV_FOLDS`) and "fold<k>_train" the other folds.
    """
    from electra_tf.data import corpus

    fold = re.fullmatch(r"fold(\d+)_(train|eval)", split)
    if fold and int(fold.group(1)) < corpus.CV_FOLDS:
        folds, k = corpus.rotten_tomatoes_folds(), int(fold.group(1))
        labelled = folds[k] if fold.group(2) == "eval" else [
            row for j, rows in enumerate(folds) if j != k for row in rows]
        return [SentenceExample(i, text, None, int(label)) for i, (text, label) in enumerate(labelled)]
    if split not in ROTTEN_TOMATOES_SPLITS[:4]:
        raise ValueError(f"Task 'rotten_tomatoes': unknown split {split!r}, expected one of "
                         f"{', '.join(ROTTEN_TOMATOES_SPLITS)} (k < {corpus.CV_FOLDS})")
    if split.startswith("tune_"):
        tune_train, tune_eval = corpus.rotten_tomatoes_tuning_split()
        labelled = tune_train if split == "tune_train" else tune_eval
    else:
        train, dev = corpus.rotten_tomatoes_split()
        labelled = train if split == "train" else dev
    return [SentenceExample(i, text, None, int(label)) for i, (text, label) in enumerate(labelled)]
