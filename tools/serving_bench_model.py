"""The model the serving benchmarks time: the ELECTRA-Small classifier, exported with random weights.

Used by `tools/benchmark_serving.py` and `tools/load_test_serving.py` (a module without flags,
so both binaries can import it). Serving speed does not depend on the weights; tokenization does
real WordPiece work on a vocabulary made from the Rotten Tomatoes sentences unless one is given.
"""

from __future__ import annotations

import collections
import os
import time
import unicodedata
from typing import Any, NamedTuple


def frequency_vocab(sentences, path, num_words=8000):
    """[PAD] [UNK] [CLS] [SEP] [MASK], the characters and their ## forms, the frequent words."""
    from electra_tf.data.tokenizer import special_token_layout, write_vocab

    words, chars = collections.Counter(), set()
    for sentence in sentences:
        text = "".join(c for c in unicodedata.normalize("NFD", sentence.lower()) if unicodedata.category(c) != "Mn")
        for word in text.split():
            pieces = "".join(c if c.isalnum() else f" {c} " for c in word).split()
            words.update(pieces)
            chars.update(c for piece in pieces for c in piece)
    chars = sorted(chars)
    vocab = special_token_layout() + chars + ["##" + c for c in chars]
    vocab += [w for w, _ in words.most_common(num_words)]
    valid = [t for t in dict.fromkeys(vocab) if all(c.isprintable() and not c.isspace() for c in t)]
    write_vocab(valid, path)
    return path


class ClassifierExport(NamedTuple):
    path: str  # the version folder, BASE/electra_small/1
    head: Any  # the SentenceClassifier
    tokenizer: Any  # its WordpieceTokenizer
    sentences: list  # the Rotten Tomatoes sentences
    seconds: float  # the export's wall time


def export_small_classifier(work: str, vocab_file: str | None, max_seq_length: int) -> ClassifierExport:
    """The ELECTRA-Small classifier (random weights) exported to `work/export/electra_small/1`."""
    from electra_tf.config import ElectraConfig
    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import WordpieceTokenizer
    from electra_tf.finetune.heads import SentenceClassifier
    from electra_tf.export import export_head

    os.makedirs(work, exist_ok=True)
    sentences = [text for text, _ in corpus.rotten_tomatoes()]
    vocab_file = vocab_file or frequency_vocab(sentences, os.path.join(work, "vocab.txt"))
    config = ElectraConfig.from_json("electra_small").with_vocab(vocab_file)
    head = SentenceClassifier(config, num_labels=2)
    info = {"kind": "classification", "task": "rotten_tomatoes", "label_names": ["negative", "positive"],
            "max_seq_length": max_seq_length, "lower_case": True}
    start = time.perf_counter()
    path = export_head(head, info, vocab_file, os.path.join(work, "export"), "electra_small", verbose=False)
    return ClassifierExport(path, head, WordpieceTokenizer(vocab_file), sentences, time.perf_counter() - start)
