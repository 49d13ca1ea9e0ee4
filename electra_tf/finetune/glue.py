"""The GLUE benchmark's original TSV files, read by each task's layout, and its test-set submission
files.

The files are those the GLUE download script (`download_glue_data.py`) writes, one folder per
task: `glue_data/MRPC/{train,dev,test}.tsv`, `glue_data/MNLI/{train,dev_matched,dev_mismatched,
test_matched,test_mismatched}.tsv`, `glue_data/diagnostic/diagnostic.tsv` (AX). Columns are read
by position (each predefined task's `glue_files` in `tasks.TASKS`), at the authors' positions
(`finetune/classification/classification_tasks.py` of google-research/electra), and the header
is checked so a wrong file is named, not misread:

| task  | folder | train / dev: text, pair, label             | test: text, pair | submission |
|-------|--------|--------------------------------------------|------------------|------------|
| cola  | CoLA   | no header; 3, -, 1                         | 1 (`sentence`)   | CoLA.tsv   |
| sst-2 | SST-2  | 0 `sentence`, -, 1 `label`                 | 1                | SST-2.tsv  |
| mrpc  | MRPC   | 3 `#1 String`, 4 `#2 String`, 0 `Quality`  | 3, 4             | MRPC.tsv   |
| sts-b | STS-B  | -3 `sentence1`, -2 `sentence2`, -1 `score` | -2, -1           | STS-B.tsv  |
| qqp   | QQP    | 3 `question1`, 4 `question2`, 5 `is_duplicate` | 1, 2         | QQP.tsv    |
| mnli  | MNLI   | 8 `sentence1`, 9 `sentence2`, -1 `gold_label` | 8, 9          | MNLI-m.tsv, MNLI-mm.tsv, AX.tsv (1, 2) |
| qnli  | QNLI   | 1 `question`, 2 `sentence`, 3 `label`      | 1, 2             | QNLI.tsv   |
| rte   | RTE    | 1 `sentence1`, 2 `sentence2`, 3 `label`    | 1, 2             | RTE.tsv    |
| wnli  | WNLI   | 1 `sentence1`, 2 `sentence2`, 3 `label`    | 1, 2             | WNLI.tsv   |

Test files carry no label and an `index` (QQP: `id`) in column 0: the submission's `index`.
Quirks kept as the authors' reader keeps them: fields are tab-separated with no quoting (sentences
hold bare `"`); MRPC's train/dev header may start with the byte-order mark of the Microsoft file;
STS-B is addressed from the end of the row (its rows do not all have the header's width); and a
row too short for the layout (the original QQP has lines broken in two) is skipped, as the
authors' `_load_glue` skips any row it cannot read. Skipped rows are counted and logged with
their lines. Unlike the authors (whose label lookup would crash), a label outside the task's set
is skipped and counted the same way. A test row too short is kept with its missing text empty,
so that every `index` gets a prediction (the GLUE server wants them all).

Submission files: `index<TAB>prediction` with a header line; predictions are the label strings of
the GLUE files (`0`/`1` for CoLA, SST-2, MRPC, QQP, WNLI; `entailment`/`neutral`/`contradiction`
for MNLI and AX; `entailment`/`not_entailment` for QNLI and RTE) and floats for STS-B.

Example:
    files = glue_files(tasks.get_task("mrpc"), "glue_data/MRPC")   # train, dev and test paths
    dev = read_glue_tsv(tasks.get_task("mrpc"), files.dev["dev"]).examples
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from pathlib import Path
from typing import Sequence

from electra_tf import files
from electra_tf.finetune.examples import SentenceExample, TaskDataError
from electra_tf.finetune.readers import open_text

_MAX_LOGGED = 5  # skipped rows named in the log (then "and N more")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the fields of one kind of GLUE file sit.

    Each field is (0-based position, negative from the end, or None; the header's name there).
    `header` None: the file has no header row (CoLA's train/dev)."""

    text: tuple[int, str | None]
    pair: tuple[int | None, str | None] = (None, None)
    label: tuple[int | None, str | None] = (None, None)  # None: a test file
    index: tuple[int | None, str | None] = (None, None)  # test files: the submission's index
    header: bool = True

    @property
    def fields(self) -> list[tuple[int, str | None]]:
        return [f for f in (self.text, self.pair, self.label, self.index) if f[0] is not None]

    @property
    def min_fields(self) -> int:
        """Fields a row needs: the authors' reader fails (and skips) below this."""
        return max(i + 1 if i >= 0 else -i for i, _ in self.fields)

    def matches_header(self, row: Sequence[str]) -> bool:
        if not self.header or len(row) < self.min_fields:
            return False
        return all(row[i].strip() == name for i, name in self.fields)

    def describe(self) -> str:
        return ", ".join(f"{name!r} at {i}" for i, name in self.fields)


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task's files: layouts, label strings, file names, submission names (each
    predefined GLUE task's `tasks.Task.glue_files`, at the positions of the table above)."""

    folder: str  # the download script's folder name
    labeled: Layout  # train / dev
    test: Layout
    file_labels: tuple[str, ...] | None  # the files' label strings in our label-id order
    dev: tuple[tuple[str, str], ...] = (("dev", "dev.tsv"),)  # (eval set name, file)
    tests: tuple[tuple[str, str], ...] = ()  # (submission file, test file)
    diagnostic: bool = False  # the model also predicts the diagnostic set (AX): MNLI

    def label_id(self, value: str) -> int:
        return self.file_labels.index(value)


def pair_files(folder, text, pair, label, file_labels, test_text=1, test_pair=2,
               **kwargs) -> GlueTask:
    """The files of a pair task whose test files hold `index`, the text and the pair (the
    submission file named after the folder)."""
    return GlueTask(folder, Layout(text, pair, label),
                    Layout((test_text, text[1]), (test_pair, pair[1]), index=(0, "index")),
                    file_labels, tests=((f"{folder}.tsv", "test.tsv"),), **kwargs)


BINARY = ("0", "1")  # our label ids follow TFDS's names, whose order matches these strings
NLI = ("entailment", "not_entailment")

# The diagnostic set (AX): MNLI's labels, predicted by the MNLI model (the authors' "diagnostic"
# split of their MNLI task).
DIAGNOSTIC = Layout((1, "sentence1"), (2, "sentence2"), index=(0, "index"))
DIAGNOSTIC_FILES = ("diagnostic.tsv", "AX.tsv", "../diagnostic/diagnostic.tsv", "../AX/AX.tsv")


# ---------------------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class GlueFile:
    """What one GLUE file held: examples (label None in test files), and the rows skipped."""

    path: str
    examples: list
    labeled: bool
    skipped: list  # ("file:line", reason) of malformed rows left out (or, in test files, kept incomplete)


def _open_rows(path: str):
    # MRPC's header keeps the byte-order mark of msr_paraphrase_train.txt: open_text drops it.
    f = open_text(path, newline="")
    csv.field_size_limit(1 << 30)
    return f, csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)


def first_row(path: str) -> list[str]:
    """The first row of a TSV file as GLUE's reader splits it ([] for an empty file)."""
    f, reader = _open_rows(path)
    with f:
        return next(reader, [])


def detect_layout(glue: GlueTask, row: Sequence[str]) -> Layout | None:
    """The layout a file's first row announces: labeled, test, the diagnostic set, or None."""
    if glue.labeled.matches_header(row):
        return glue.labeled
    if glue.test.matches_header(row):
        return glue.test
    if glue.diagnostic and DIAGNOSTIC.matches_header(row) and len(row) == 3:
        return DIAGNOSTIC
    if not glue.labeled.header and len(row) >= glue.labeled.min_fields:
        if row[glue.labeled.label[0]].strip() in glue.file_labels:  # CoLA: a data row, no header
            return glue.labeled
    return None


def read_glue_tsv(task, path, layout: Layout | None = None) -> GlueFile:
    """Reads an original GLUE file of `task`, its layout told by its first row.

    Raises TaskDataError naming the file and line 1 when the first row is no layout of the task.
    """
    path = os.fspath(path)
    glue = task.glue
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file (task {task.name!r})")
    if layout is None:
        row = first_row(path)
        layout = detect_layout(glue, row)
        if layout is None:
            raise TaskDataError(
                f"{path}:1: not a GLUE {glue.folder} file: expected {glue.labeled.describe()} "
                f"(train/dev{', no header' if not glue.labeled.header else ''}) or "
                f"{glue.test.describe()} (test); the first row has {row[:12]}")
    labeled = layout.label[0] is not None
    examples, skipped = [], []
    f, reader = _open_rows(path)
    with f:
        if layout.header:
            next(reader, None)
        data_row = -1
        for row in reader:
            loc = f"{path}:{reader.line_num}"
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            data_row += 1
            if len(row) < layout.min_fields and labeled:
                skipped.append((loc, f"{len(row)} fields, the layout needs {layout.min_fields}"))
                continue
            if labeled:
                example, reason = _labeled_example(glue, layout, data_row, row)
            else:
                example, reason = _test_example(layout, row)
            if reason:
                skipped.append((loc, reason))
            if example is not None:
                examples.append(example)
    if skipped:
        _log_skipped(path, skipped, labeled, len(examples))
    return GlueFile(path, examples, labeled, skipped)


def _field(row, position) -> str | None:
    return row[position] if position is not None else None


def _labeled_example(glue: GlueTask, layout: Layout, eid: int, row):
    text, pair = _field(row, layout.text[0]), _field(row, layout.pair[0])
    raw = row[layout.label[0]].strip()
    if glue.file_labels is None:  # regression
        try:
            label = float(raw)
        except ValueError:
            return None, f"score {raw!r} is not a number"
        if not math.isfinite(label):
            return None, f"score {raw!r} is not finite"
    elif raw in glue.file_labels:
        label = glue.label_id(raw)
    else:
        return None, f"label {raw!r} is not one of {list(glue.file_labels)}"
    return SentenceExample(eid, text, pair, label), None


def _test_example(layout: Layout, row):
    try:
        index = int(row[layout.index[0]])
    except (IndexError, ValueError):
        return None, f"no integer index in column {layout.index[0]}: row {row[:3]}"
    fields = [row[i] if i is not None and -len(row) <= i < len(row) else None
              for i in (layout.text[0], layout.pair[0])]
    reason = None
    if len(row) < layout.min_fields:
        reason = f"{len(row)} fields, the layout needs {layout.min_fields}: kept, missing text empty"
    text, pair = ("" if fields[0] is None else fields[0],
                  None if layout.pair[0] is None else (fields[1] or ""))
    return SentenceExample(index, text, pair, None), reason


def _log_skipped(path: str, skipped, labeled: bool, kept: int) -> None:
    from absl import logging

    shown = "; ".join(f"line {loc.rsplit(':', 1)[1]}: {why}" for loc, why in skipped[:_MAX_LOGGED])
    more = f"; and {len(skipped) - _MAX_LOGGED} more" if len(skipped) > _MAX_LOGGED else ""
    what = ("skipped {n} malformed rows ({kept} examples read), as the authors' reader skips "
            "rows it cannot read" if labeled else
            "{n} test rows incomplete (predicted from the fields present) or without an index "
            "(left out); {kept} examples")
    logging.warning("%s: %s: %s%s", path, what.format(n=len(skipped), kept=kept), shown, more)


# ---------------------------------------------------------------------------------------
# A task folder.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class GlueFiles:
    """The files of one task folder: train, the dev sets by name, the test sets by submission name."""

    train: Path | None
    dev: dict  # eval set name -> path ("dev" first; MNLI also "dev_mismatched")
    test: dict  # submission file name -> path (MNLI-m.tsv, MNLI-mm.tsv, AX.tsv, ...)


def task_folder(glue: GlueTask, data_dir) -> Path:
    """`data_dir` itself, or its sub-folder named as GLUE names the task (glue_data -> glue_data/MRPC)."""
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"{data_dir}: no such folder (--data_dir for GLUE's {glue.folder})")
    if not (data_dir / "train.tsv").exists() and (data_dir / glue.folder).is_dir():
        return data_dir / glue.folder
    return data_dir


def glue_files(task, data_dir) -> GlueFiles:
    """The GLUE files of `task` in `data_dir` (a `glue_data/<Task>` folder, or `glue_data`)."""
    glue = task.glue
    folder = task_folder(glue, data_dir)
    train = folder / "train.tsv"
    dev = {name: folder / file for name, file in glue.dev if (folder / file).exists()}
    test = {name: folder / file for name, file in glue.tests if (folder / file).exists()}
    if glue.diagnostic:
        found = [folder / f for f in DIAGNOSTIC_FILES if (folder / f).exists()]
        if found:
            test["AX.tsv"] = found[0].resolve()
    return GlueFiles(train if train.exists() else None, dev, test)


# ---------------------------------------------------------------------------------------
# Submission files.
# ---------------------------------------------------------------------------------------


def submission_lines(glue: GlueTask, examples: Sequence[SentenceExample], predictions) -> list[str]:
    """`index<TAB>prediction` lines with the header: class ids -> the files' label strings,
    regression scores as floats."""
    lines = ["index\tprediction"]
    for example, prediction in zip(examples, predictions):
        if glue.file_labels is None:
            value = f"{float(prediction):.6g}"
        else:
            value = glue.file_labels[int(prediction)]
        lines.append(f"{example.eid}\t{value}")
    return lines


def write_submission(path, glue: GlueTask, examples, predictions) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, "\n".join(submission_lines(glue, examples, predictions)) + "\n")
    return path
