"""Fine-tuning tasks and their examples: local CSV/TSV/JSONL/CoNLL/SQuAD files, the original GLUE
TSV files (`glue.py`), TFDS, Rotten Tomatoes.

A `Task` says what an example looks like (which columns hold the text, the text pair and the
label; the label set; where TFDS keeps it) and which task family it belongs to (`families/`:
the family reads its files, featurizes, builds the head, scores and serves).
`load_examples(task, split, ...)` turns a local file, a prepared TFDS dataset or the packaged
Rotten Tomatoes corpus into a list of examples, by the task's family:

- `SentenceExample` for classification (label = index into `task.label_names`) and regression
  (label = float);
- `TaggingExample` for word-level tagging (labels = indices into `task.label_names`);
- `QAExample` for SQuAD-style span QA (v1.1, and v2.0 with `is_impossible`);
- `families.multiple_choice.ChoiceExample` for multiple choice.

This module holds the file readers the families share (CSV/TSV/JSONL rows, CoNLL, SQuAD JSON)
and the predefined tasks (`get_task`).

A predefined GLUE task reads the original GLUE files (`glue_data/MRPC/train.tsv`: CoLA without a
header, MRPC's `#1 String`, ...) by the task's layout in `glue.py`, and still reads a TSV with its
named columns (`sentence1`, `sentence2`, `label`). `data_files(task, data_dir)` finds a task's
train / dev (/ GLUE test) files in a folder.

Bad input raises `TaskDataError` whose message starts with `file:line:` and names the field.
Every reader opens files with `open_text`, which drops a UTF-8 byte-order mark (Excel and Notepad
write one before a CSV header). A training file with a single label is refused when the label set
is inferred from it, and warned about when the task declares its labels (`infer_label_names`,
`load_examples`).

Example:
  task = Task("my_sentiment", "classification", text_column="review", label_column="stars")
  task = task.with_label_names(infer_label_names(task, "train.csv"))
  train = load_examples(task, "train", path="train.csv")
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import re
from typing import Any, Iterator, Sequence

class TaskDataError(ValueError):
    """Bad task data; the message names the file, the line and the field."""


# ---------------------------------------------------------------------------------------
# Task definitions.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    """What a fine-tuning task's examples look like and where they come from.

    Args:
      name: task name (also the key for `metrics.TaskMetrics.for_task`).
      family: the task family (`families.FAMILIES`): "classification", "regression",
        "tagging", "qa" or "multiple_choice".
      label_names: classification / tagging label set; a label's id is its index here.
        None until set (`with_label_names`, `infer_label_names`).
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

    def __post_init__(self):
        from electra_tf.finetune.families import FAMILIES

        if self.family not in FAMILIES:
            raise ValueError(f"Task {self.name!r}: field 'family' is {self.family!r}, expected one of "
                             f"{tuple(FAMILIES)}")
        if self.label_names is not None:
            names = tuple(str(n) for n in self.label_names)
            if len(set(names)) != len(names) or not names:
                raise ValueError(f"Task {self.name!r}: field 'label_names' must be non-empty and unique")
            object.__setattr__(self, "label_names", names)

    @property
    def num_labels(self) -> int:
        return len(self.label_names or ())

    def with_label_names(self, names: Sequence[str]) -> "Task":
        return dataclasses.replace(self, label_names=tuple(str(n) for n in names))

    def tfds_split(self, split: str) -> str:
        mapping = dict(self.tfds_splits)
        if split not in mapping:
            raise ValueError(f"Task {self.name!r}: unknown split {split!r}, expected one of {sorted(mapping)}")
        return mapping[split]


@dataclasses.dataclass(frozen=True)
class SentenceExample:
    """One sentence (pair) with a class id or a regression target (None for unlabeled test data)."""

    eid: int
    text: str
    text_pair: str | None = None
    label: int | float | None = None


@dataclasses.dataclass(frozen=True)
class TaggingExample:
    """Words with one label id per word (None for unlabeled data)."""

    eid: int
    words: tuple[str, ...]
    labels: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class QAAnswer:
    text: str
    answer_start: int  # character offset into the context


@dataclasses.dataclass(frozen=True)
class QAExample:
    """A SQuAD question on its context; `answers[0]` is the training target."""

    qid: str
    question: str
    context: str
    answers: tuple[QAAnswer, ...] = ()
    is_impossible: bool = False


_MNLI_SPLITS = (("train", "train"), ("dev", "validation_matched"), ("test", "test_matched"))
_SQUAD_SPLITS = (("train", "train"), ("dev", "validation"))


def _glue(name, tfds_config, labels, text, pair=None, family="classification", **kwargs):
    return Task(name, family, labels, text, pair, "label", f"glue/{tfds_config}", **kwargs)


@functools.cache
def predefined_tasks() -> dict[str, Task]:
    """The predefined tasks by name. Label names are in TFDS's ClassLabel order, so a TFDS label
    id is our label id. (Built on first use: a `Task` checks its family against the registry,
    whose modules import this one.)"""
    return {t.name: t for t in [
        _glue("cola", "cola", ("unacceptable", "acceptable"), "sentence"),
        _glue("sst-2", "sst2", ("negative", "positive"), "sentence"),
        _glue("mrpc", "mrpc", ("not_equivalent", "equivalent"), "sentence1", "sentence2"),
        _glue("sts-b", "stsb", None, "sentence1", "sentence2", family="regression"),
        _glue("qqp", "qqp", ("not_duplicate", "duplicate"), "question1", "question2"),
        _glue("mnli", "mnli", ("entailment", "neutral", "contradiction"), "premise", "hypothesis",
              tfds_splits=_MNLI_SPLITS),
        _glue("qnli", "qnli", ("entailment", "not_entailment"), "question", "sentence"),
        _glue("rte", "rte", ("entailment", "not_entailment"), "sentence1", "sentence2"),
        _glue("wnli", "wnli", ("not_entailment", "entailment"), "sentence1", "sentence2"),
        Task("squad1.1", "qa", tfds_name="squad/v1.1", tfds_splits=_SQUAD_SPLITS),
        Task("squad2.0", "qa", tfds_name="squad/v2.0", tfds_splits=_SQUAD_SPLITS, squad_v2=True),
        Task("rotten_tomatoes", "classification", ("negative", "positive"),
             tfds_splits=(("train", "train"), ("dev", "dev"))),
    ]}


def get_task(name: str) -> Task:
    """A predefined task by name ("mrpc", "sst-2", "squad2.0", "rotten_tomatoes", ...)."""
    key = name.strip().lower()
    key = {"sst2": "sst-2", "stsb": "sts-b", "squad": "squad2.0", "squadv1": "squad1.1"}.get(key, key)
    tasks = predefined_tasks()
    if key not in tasks:
        raise ValueError(f"unknown task {name!r}; predefined tasks: {', '.join(tasks)}")
    return tasks[key]


def rotten_tomatoes_task() -> Task:
    """Rotten Tomatoes sentence polarity (SST-2's source): 0 = negative, 1 = positive."""
    return predefined_tasks()["rotten_tomatoes"]


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
    from electra_tf.finetune.families import get_family

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
    from electra_tf import files

    files.write_json(path, list(names), indent=0)


def load_label_names(path: str | os.PathLike) -> tuple[str, ...]:
    with open(path, encoding="utf-8") as f:
        try:
            names = json.load(f)
        except json.JSONDecodeError as e:
            raise TaskDataError(f"{os.fspath(path)}:{e.lineno}: field 'label_names': {e.msg}") from None
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
    from absl import logging

    from electra_tf.finetune.families import get_family

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
    (`glue.GLUE_TASKS`). For another task, `data_dir/train.<ext>` and `dev.<ext>` with the
    extensions its family reads (`TaskFamily.file_extensions`: .tsv/.csv/.jsonl; tagging
    .jsonl/.txt/.conll; QA .json; multiple choice .jsonl).
    """
    from electra_tf.finetune import glue
    from electra_tf.finetune.families import get_family

    files = DataFiles(None if train_path is None else os.fspath(train_path),
                      {} if eval_path is None else {"dev": os.fspath(eval_path)})
    if data_dir is None:
        return files
    data_dir = os.path.expanduser(os.fspath(data_dir))
    if glue.glue_task(task) is not None:
        found = glue.glue_files(task, data_dir)
        where = glue.task_folder(glue.GLUE_TASKS[task.name], data_dir)
        found_train, found_dev = found.train, found.dev
        files.test = {name: str(path) for name, path in found.test.items()}
        wanted = f"train.tsv and {glue.GLUE_TASKS[task.name].dev[0][1]}"
    else:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"{data_dir}: no such folder (--data_dir for task {task.name!r})")
        where = data_dir
        extensions = get_family(task.family).file_extensions
        found_train = _split_file(task, data_dir, "train", extensions)
        dev = _split_file(task, data_dir, "dev", extensions)
        found_dev = {"dev": dev} if dev else {}
        wanted = "train.<ext> and dev.<ext> with <ext> one of " + "/".join(extensions)
    if files.train is None:
        if found_train is None:
            raise FileNotFoundError(f"{where}: no training file (looked for {wanted})")
        files.train = str(found_train)
    if not files.dev:
        if "dev" not in found_dev:
            raise FileNotFoundError(f"{where}: no evaluation file (looked for {wanted})")
        files.dev = {name: str(path) for name, path in found_dev.items()}
    return files


def read_file(task: Task, path: str | os.PathLike) -> list:
    """Reads a local file into examples, as the task's family reads its files."""
    from electra_tf.finetune.families import get_family

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (task {task.name!r})")
    return get_family(task.family).read_file(task, path)


def read_sentence_file(task: Task, path: str, label) -> list[SentenceExample]:
    """Sentence (pair) examples of a CSV/TSV/JSONL file, or of an original GLUE TSV by the
    task's layout (`glue.py`); `label(task, loc, row)` reads a row's label (`class_label`,
    `regression_label`)."""
    if _extension(path) == ".tsv":
        from electra_tf.finetune import glue

        spec = glue.glue_task(task)
        if spec is not None:  # the original GLUE files, by the task's layout (glue.py)
            first = glue.first_row(path)
            layout = glue.detect_layout(spec, first)
            if layout is not None:
                return glue.read_glue_tsv(task, path, layout).examples
            if not all(c in first for c in (task.text_column, task.text_pair_column, task.label_column)
                       if c is not None):
                raise TaskDataError(
                    f"{path}:1: neither the original GLUE {spec.folder} layout ({spec.labeled.describe()}"
                    f" for train/dev, {spec.test.describe()} for test) nor the columns "
                    f"{[c for c in (task.text_column, task.text_pair_column, task.label_column) if c]}"
                    f"; the first row has {first[:12]}")
    examples = []
    for eid, (loc, row) in enumerate(rows(task, path)):
        text = text_field(loc, row, task.text_column)
        pair = text_field(loc, row, task.text_pair_column) if task.text_pair_column is not None else None
        examples.append(SentenceExample(eid, text, pair, label(task, loc, row)))
    return examples


# ---------------------------------------------------------------------------------------
# CSV / TSV / JSONL rows.
# ---------------------------------------------------------------------------------------


def open_text(path: str, newline: str | None = None):
    """Opens a task file for reading as UTF-8, without the byte-order mark some programs write
    first (Excel's and Notepad's "UTF-8" CSVs; MRPC's Microsoft file in GLUE). Left in, the mark
    sticks to the first header name (`'\\ufefftext'`) or the first JSON line. Every reader here and
    in `glue.py` opens files with it; `newline=""` for the csv module."""
    return open(path, encoding="utf-8-sig", newline=newline)


def _extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def rows(task: Task, path: str) -> Iterator[tuple[str, Any]]:
    """Yields ("file:line", row) where row is a dict (header / JSONL) or a list (no header)."""
    ext = _extension(path)
    if ext == ".jsonl":
        yield from jsonl_rows(path)
    elif ext in (".csv", ".tsv"):
        yield from _delimited_rows(task, path, ext == ".tsv")
    else:
        raise TaskDataError(f"{path}:1: unsupported file type {ext!r}; expected .csv, .tsv or .jsonl")


def jsonl_rows(path: str) -> Iterator[tuple[str, dict]]:
    with open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            loc = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskDataError(f"{loc}: malformed JSON line: {e.msg} at column {e.colno}") from None
            if not isinstance(row, dict):
                raise TaskDataError(f"{loc}: expected a JSON object per line, got {type(row).__name__}")
            yield loc, row


def _delimited_rows(task: Task, path: str, tsv: bool) -> Iterator[tuple[str, Any]]:
    # GLUE TSVs contain bare quote characters inside sentences: they must not start quoted fields.
    options = dict(delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else {}
    csv.field_size_limit(1 << 30)  # IMDB-length documents exceed the 128 KiB default
    with open_text(path, newline="") as f:
        reader = csv.reader(f, **options)
        header = None
        if task.has_header:
            try:
                header = next(reader)
            except StopIteration:
                raise TaskDataError(f"{path}:1: empty file, expected a header row") from None
            _check_header(task, path, header)
        for values in reader:
            loc = f"{path}:{reader.line_num}"
            if not values or (len(values) == 1 and not values[0].strip()):
                continue
            if header is None:
                yield loc, values
                continue
            if len(values) != len(header):
                raise TaskDataError(
                    f"{loc}: expected {len(header)} fields like the header, found {len(values)}")
            yield loc, dict(zip(header, values))


def _check_header(task: Task, path: str, header: list[str]) -> None:
    """Every column the task reads is in the header, once.

    A row becomes a dict by header name, so of two columns with one name the last would be read
    and the other dropped without a word. A repeated name the task does not read (two empty names
    of trailing commas, two "notes") is let be: nothing is read from it.
    """
    for column in (task.text_column, task.text_pair_column, task.label_column):
        if column is None:
            continue
        if column not in header:
            raise TaskDataError(f"{path}:1: field {column!r}: missing column; the header has {header}")
        positions = [i for i, name in enumerate(header) if name == column]
        if len(positions) > 1:
            raise TaskDataError(
                f"{path}:1: field {column!r}: the header has this column {len(positions)} times (at "
                f"0-based positions {positions}); rename the copies so the one to read is unique")


def field_value(loc: str, row, column) -> Any:
    try:
        return row[column]
    except (KeyError, IndexError, TypeError):
        raise TaskDataError(f"{loc}: field {column!r}: missing") from None


def text_field(loc: str, row, column) -> str:
    value = field_value(loc, row, column)
    if not isinstance(value, str):
        raise TaskDataError(f"{loc}: field {column!r}: expected a string, got {type(value).__name__}")
    if not value.strip():
        raise TaskDataError(f"{loc}: field {column!r}: empty text")
    return value


def raw_label(loc: str, row, column) -> str:
    value = field_value(loc, row, column)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TaskDataError(f"{loc}: field {column!r}: expected a string or integer label, got {value!r}")
    value = str(value).strip()
    if not value:
        raise TaskDataError(f"{loc}: field {column!r}: empty label")
    return value


def label_id(task: Task, loc: str, column, label: str) -> int:
    """Index of a label in `task.label_names`; 0-based indices are accepted too when no
    label name is itself a number (e.g. GLUE's "0"/"1" against TFDS's names)."""
    if task.label_names is None:
        raise ValueError(f"Task {task.name!r}: set label_names (with_label_names / infer_label_names) "
                         "before reading labeled examples")
    if label in task.label_names:
        return task.label_names.index(label)
    numeric_names = any(re.fullmatch(r"-?\d+", n) for n in task.label_names)
    if not numeric_names and re.fullmatch(r"\d+", label) and int(label) < len(task.label_names):
        return int(label)
    raise TaskDataError(
        f"{loc}: field {column!r}: label {label!r} is not in the label set {list(task.label_names)}")


def class_label(task: Task, loc: str, row) -> int:
    """A classification row's label: its id in `task.label_names`."""
    return label_id(task, loc, task.label_column, raw_label(loc, row, task.label_column))


def regression_label(task: Task, loc: str, row) -> float:
    """A regression row's label: a finite number."""
    value = field_value(loc, row, task.label_column)
    try:
        if isinstance(value, bool):
            raise ValueError
        label = float(value)
    except (TypeError, ValueError):
        raise TaskDataError(
            f"{loc}: field {task.label_column!r}: regression label {value!r} is not a number") from None
    if not math.isfinite(label):
        raise TaskDataError(f"{loc}: field {task.label_column!r}: regression label {value!r} is not finite")
    return label


# ---------------------------------------------------------------------------------------
# Tagging: JSONL {"tokens": [...], "labels": [...]} or CoNLL columns (word ... tag).
# ---------------------------------------------------------------------------------------


def tagged_sentences(task: Task, path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    ext = _extension(path)
    if ext == ".jsonl":
        for loc, row in jsonl_rows(path):
            words = field_value(loc, row, task.text_column)
            tags = field_value(loc, row, task.label_column)
            for column, value in ((task.text_column, words), (task.label_column, tags)):
                if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
                    raise TaskDataError(f"{loc}: field {column!r}: expected a list of non-empty strings")
            if not words:
                raise TaskDataError(f"{loc}: field {task.text_column!r}: empty sentence")
            if len(words) != len(tags):
                raise TaskDataError(
                    f"{loc}: field {task.label_column!r}: {len(tags)} labels for {len(words)} tokens")
            yield loc, words, tags
    elif ext in (".txt", ".conll"):
        yield from _conll_sentences(path)
    else:
        raise TaskDataError(f"{path}:1: unsupported tagging file type {ext!r}; expected .jsonl, .txt or .conll")


def _conll_sentences(path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """CoNLL-2000 style: one "word ... tag" line per word, blank lines between sentences."""
    words, tags, start = [], [], None
    with open_text(path) as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                if words:
                    yield f"{path}:{start}", words, tags
                words, tags, start = [], [], None
                continue
            if len(fields) < 2:
                raise TaskDataError(f"{path}:{line_no}: field 'label': expected 'word ... tag', got {line.strip()!r}")
            start = start or line_no
            words.append(fields[0])
            tags.append(fields[-1])
    if words:
        yield f"{path}:{start}", words, tags


def tag_ids(task: Task, loc: str, tags: Sequence[str]) -> tuple[int, ...]:
    return tuple(label_id(task, loc, task.label_column, tag) for tag in tags)


# ---------------------------------------------------------------------------------------
# SQuAD JSON (v1.1 / v2.0).
# ---------------------------------------------------------------------------------------


def _qid_line(raw: str, qid: str | None, fallback: int = 1) -> int:
    """Line of `"id": "<qid>"` in the raw JSON (json.load keeps no positions)."""
    if qid is None:
        return fallback
    match = re.search(r'"id"\s*:\s*' + re.escape(json.dumps(qid)), raw)
    return raw.count("\n", 0, match.start()) + 1 if match else fallback


def read_squad_json(path: str | os.PathLike, v2: bool = False) -> list[QAExample]:
    """Reads SQuAD v1.1 / v2.0 JSON. Every answer must be `context[start:start+len(text)]`."""
    path = os.fspath(path)
    with open_text(path) as f:
        raw = f.read()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{e.lineno}: malformed JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise TaskDataError(f"{path}:1: field 'data': expected a SQuAD object with a 'data' list")
    examples = []
    last_line = 1
    for a, article in enumerate(data["data"]):
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            where = f"data[{a}].paragraphs[{p}]"
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                raise TaskDataError(f"{path}:{last_line}: field '{where}.context': missing or empty")
            for q, qa in enumerate(paragraph.get("qas", [])):
                field = f"{where}.qas[{q}]"
                qid = qa.get("id")
                line = last_line = _qid_line(raw, qid if isinstance(qid, str) else None, last_line)
                loc = f"{path}:{line}"
                if not isinstance(qid, str) or not qid:
                    raise TaskDataError(f"{loc}: field '{field}.id': missing question id")
                examples.append(_squad_example(loc, field, qid, qa, context, v2))
    return examples


def _squad_example(loc: str, field: str, qid: str, qa: dict, context: str, v2: bool) -> QAExample:
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise TaskDataError(f"{loc}: field '{field}.question': missing or empty (id {qid})")
    is_impossible = False
    if v2:
        is_impossible = qa.get("is_impossible")
        if not isinstance(is_impossible, bool):
            raise TaskDataError(f"{loc}: field '{field}.is_impossible': expected true/false (id {qid})")
    raw_answers = qa.get("answers")
    if not isinstance(raw_answers, list):
        raise TaskDataError(f"{loc}: field '{field}.answers': expected a list (id {qid})")
    if not is_impossible and not raw_answers:
        raise TaskDataError(f"{loc}: field '{field}.answers': an answerable question needs an answer (id {qid})")
    answers = []
    for i, answer in enumerate(raw_answers):
        name = f"{field}.answers[{i}]"
        text, start = answer.get("text"), answer.get("answer_start")
        if not isinstance(text, str) or not text or isinstance(start, bool) or not isinstance(start, int):
            raise TaskDataError(f"{loc}: field '{name}': needs a non-empty 'text' and an integer "
                                f"'answer_start' (id {qid})")
        if context[start:start + len(text)] != text:
            found = context[max(start, 0):max(start, 0) + len(text)]
            raise TaskDataError(f"{loc}: field '{name}.answer_start': answer {text!r} does not match the "
                                f"context at {start} ({found!r}) (id {qid})")
        answers.append(QAAnswer(text, start))
    if is_impossible:
        answers = []  # v2.0 train files keep plausible answers elsewhere; gold is empty
    return QAExample(qid, question, context, tuple(answers), is_impossible)


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


def decode(value) -> str:
    """A TFDS string feature (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def tfds_record_to_example(task: Task, eid: int, record: dict):
    """One `tfds.as_numpy` record of a GLUE or SQuAD dataset -> our example (by the family)."""
    from electra_tf.finetune.families import get_family

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
