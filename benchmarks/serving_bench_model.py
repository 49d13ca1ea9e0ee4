"""The model the serving benchmarks time: the ELECTRA-Small classifier, exported with random weights.

Used by `benchmarks/benchmark_serving.py` and `benchmarks/load_test_serving.py` (a module without flags,
so both binaries can import it). Serving speed does not depend on the weights; tokenization does
real WordPiece work on a vocabulary made from the Rotten Tomatoes sentences unless one is given.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple


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
    from electra_tf.data.tokenizer import WordpieceTokenizer, frequency_vocab, write_vocab
    from electra_tf.finetune.heads import SentenceClassifier
    from electra_tf.export import export_head

    os.makedirs(work, exist_ok=True)
    sentences = [text for text, _ in corpus.rotten_tomatoes()]
    if vocab_file is None:
        vocab_file = os.path.join(work, "vocab.txt")
        write_vocab(frequency_vocab(sentences), vocab_file)
    config = ElectraConfig.from_json("electra_small").with_vocab(vocab_file)
    head = SentenceClassifier(config, num_labels=2)
    info = {"task": "rotten_tomatoes", "label_names": ["negative", "positive"],
            "max_seq_length": max_seq_length, "lower_case": True}
    start = time.perf_counter()
    path = export_head(head, info, vocab_file, os.path.join(work, "export"), "electra_small", verbose=False)
    return ClassifierExport(path, head, WordpieceTokenizer(vocab_file), sentences, time.perf_counter() - start)
