"""Reading task files: CSV / TSV / JSONL rows and their fields, CoNLL and JSONL tagging files,
SQuAD JSON, TFDS strings. The families (`families/`) read their files with these; `glue.py` reads
the original GLUE TSVs with `open_text`.

A reader takes the task it reads for (`tasks.Task`: its columns, label names and header flag) as
an argument and imports nothing above `examples.py`. Bad input raises `TaskDataError` whose message
starts with `file:line:` and names the field, whatever the file holds: bytes that are not UTF-8,
JSON nested too deeply for Python's reader (it raised RecursionError) or with a 5,000-digit number,
a JSON value of the wrong type anywhere. Every reader opens files with `open_text`, which drops a
UTF-8 byte-order mark (Excel and Notepad write one before a CSV header).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from typing import Any, Iterator, Sequence

from electra_tf.finetune.examples import QAAnswer, QAExample, TaskDataError


def open_text(path: str, newline: str | None = None) -> "_TaskFile":
    """Opens a task file for reading as UTF-8, without the byte-order mark some programs write
    first (Excel's and Notepad's "UTF-8" CSVs; MRPC's Microsoft file in GLUE). Left in, the mark
    sticks to the first header name (`'\\ufefftext'`) or the first JSON line. Every reader here and
    in `glue.py` opens files with it; `newline=""` for the csv module. Bytes that are not UTF-8
    raise `TaskDataError` naming the file and line (Python's error names neither)."""
    return _TaskFile(path, newline)


class _TaskFile:
    """A text file whose undecodable bytes raise TaskDataError at `file:line` (`open_text`)."""

    def __init__(self, path: str, newline: str | None):
        self.path = os.fspath(path)
        self._file = open(path, encoding="utf-8-sig", newline=newline)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return self._decoded(next, self._file)

    def read(self, *args) -> str:
        return self._decoded(self._file.read, *args)

    def readline(self, *args) -> str:
        return self._decoded(self._file.readline, *args)

    def _decoded(self, function, *args):
        try:
            return function(*args)
        except UnicodeDecodeError:
            pass
        # UTF-8 never uses the byte of "\n" inside a character: decoding line by line finds it.
        with open(self.path, "rb") as f:
            for line_no, raw in enumerate(f, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TaskDataError(
                        f"{self.path}:{line_no}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                        f"{e.start + 1}); save the file as UTF-8") from None
        raise TaskDataError(f"{self.path}:1: not UTF-8 text; save the file as UTF-8")

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self) -> "_TaskFile":
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


# Deeper than this a JSON value is called too deep; Python's reader itself gives up near
# 1,000 levels (its recursion limit) with a RecursionError.
_JSON_DEPTH = 500


def parse_json(path: str, text: str, line: int | None = None):
    """`json.loads(text)`, a task file's content or one line of it (`line`), with every way it
    can fail as TaskDataError at `file:line`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where, what = (line, "malformed JSON line") if line else (e.lineno, "malformed JSON")
        raise TaskDataError(f"{path}:{where}: {what}: {e.msg} at column {e.colno}") from None
    except RecursionError:
        where = line or _deep_line(text)
        raise TaskDataError(f"{path}:{where}: JSON nested too deeply (more than {_JSON_DEPTH} levels "
                            "of lists or objects) to be task data") from None
    except ValueError as e:  # an integer of more than 4,300 digits (sys.get_int_max_str_digits)
        what = "an integer of more than 4300 digits" if "digits" in str(e) else str(e)
        raise TaskDataError(f"{path}:{line or 1}: malformed JSON: {what}") from None


def _deep_line(text: str) -> int:
    """The line where the nesting of `text` first goes deeper than _JSON_DEPTH."""
    depth, line, in_string, escaped = 0, 1, False, False
    for char in text:
        if char == "\n":
            line += 1
        elif in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > _JSON_DEPTH:
                return line
        elif char in "]}":
            depth -= 1
    return 1


def extension(path: str) -> str:
    return os.path.splitext(path)[1].lower()


def rows(task, path: str) -> Iterator[tuple[str, Any]]:
    """Yields ("file:line", row) where row is a dict (header / JSONL) or a list (no header)."""
    ext = extension(path)
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
            row = parse_json(path, line, line_no)
            if not isinstance(row, dict):
                raise TaskDataError(f"{loc}: expected a JSON object per line, got {type(row).__name__}")
            yield loc, row


def _delimited_rows(task, path: str, tsv: bool) -> Iterator[tuple[str, Any]]:
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


def _check_header(task, path: str, header: list[str]) -> None:
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


def label_id(task, loc: str, column, label: str) -> int:
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


def class_label(task, loc: str, row) -> int:
    """A classification row's label: its id in `task.label_names`."""
    return label_id(task, loc, task.label_column, raw_label(loc, row, task.label_column))


def regression_label(task, loc: str, row) -> float:
    """A regression row's label: a finite number."""
    value = field_value(loc, row, task.label_column)
    try:
        if isinstance(value, bool):
            raise ValueError
        label = float(value)
    except (TypeError, ValueError):
        raise TaskDataError(
            f"{loc}: field {task.label_column!r}: regression label {value!r} is not a number") from None
    except OverflowError:  # a JSON integer past 1e308
        raise TaskDataError(f"{loc}: field {task.label_column!r}: regression label of "
                            f"{len(str(value))} digits is not finite as a float") from None
    if not math.isfinite(label):
        raise TaskDataError(f"{loc}: field {task.label_column!r}: regression label {value!r} is not finite")
    return label


# ---------------------------------------------------------------------------------------
# Tagging: JSONL {"tokens": [...], "labels": [...]} or CoNLL columns (word ... tag).
# ---------------------------------------------------------------------------------------


def tagged_sentences(task, path: str) -> Iterator[tuple[str, list[str], list[str]]]:
    ext = extension(path)
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


def tag_ids(task, loc: str, tags: Sequence[str]) -> tuple[int, ...]:
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
    data = parse_json(path, raw)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise TaskDataError(f"{path}:1: field 'data': expected a SQuAD object with a 'data' list")
    examples = []
    last_line = 1

    def items(parent, key: str, field: str) -> list:
        """`parent[key]` ([] when missing): a list of JSON objects, else TaskDataError."""
        value = parent.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise TaskDataError(f"{path}:{last_line}: field '{field}': expected a list of objects")
        return value

    for a, article in enumerate(items(data, "data", "data")):
        for p, paragraph in enumerate(items(article, "paragraphs", f"data[{a}].paragraphs")):
            where = f"data[{a}].paragraphs[{p}]"
            context = paragraph.get("context")
            if not isinstance(context, str) or not context.strip():
                raise TaskDataError(f"{path}:{last_line}: field '{where}.context': missing or empty")
            for q, qa in enumerate(items(paragraph, "qas", f"{where}.qas")):
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
        if not isinstance(answer, dict):
            raise TaskDataError(f"{loc}: field '{name}': expected an object (id {qid})")
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


def decode(value) -> str:
    """A TFDS string feature (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
