"""The examples of fine-tuning tasks, one record per task family, and the error bad task data
raises. A leaf: the readers (`readers.py`, `glue.py`), the families and the featurizers build on it.

| family                        | example           | label                                  |
|-------------------------------|-------------------|----------------------------------------|
| classification, regression    | `SentenceExample` | class id into the task's label names / float |
| tagging                       | `TaggingExample`  | a label id per word                    |
| qa                            | `QAExample`       | `QAAnswer`s (character offsets)        |
| multiple_choice               | `ChoiceExample`   | index of the right choice              |
"""

from __future__ import annotations

import dataclasses


class TaskDataError(ValueError):
    """Bad task data; the message names the file, the line and the field."""


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


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    """A context with its choices and the index of the right one (None for unlabeled data)."""

    eid: int
    context: str
    choices: tuple[str, ...]
    label: int | None = None
