"""Times fine-tuning featurization (`finetune/features.py`) on real text, one family at a time.

    python -m benchmarks.benchmark_featurize --vocab_file=runs/demo/vocab.txt [--repeats=3]

Rows are Rotten Tomatoes sentences (single texts, and pairs of consecutive sentences), their
whitespace words (tagging) and IMDB reviews as QA contexts with a sentence of the review as the
question (windows of 128 pieces, stride 64). Each family is featurized `--repeats` times; the
best time and rows/s are printed, plus a sha256 of the arrays, so two trees can be compared for
speed and for identical output (run this file from either tree with PYTHONPATH set to it).
"""

from __future__ import annotations

import hashlib
import time

from absl import flags

from electra_tf import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.", required=True)
flags.DEFINE_integer("repeats", 3, "Timed runs per family (the best is printed).")
flags.DEFINE_integer("rows", 8000, "Sentence and tagging rows (QA: a quarter as many reviews).")


def _digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(arrays[key].tobytes())
    return h.hexdigest()[:16]


def main(argv):
    import numpy as np

    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import WordpieceTokenizer
    from electra_tf.finetune import features as F
    from electra_tf.finetune.examples import QAAnswer, QAExample, SentenceExample, TaggingExample

    tokenizer = WordpieceTokenizer(FLAGS.vocab_file)
    sentences = [text for text, _ in corpus.rotten_tomatoes()][: FLAGS.rows]
    reviews = [doc for doc, _ in zip(corpus.imdb_documents(), range(FLAGS.rows // 4))]
    single = [SentenceExample(i, t, None, i % 2) for i, t in enumerate(sentences)]
    pairs = [SentenceExample(i, t, sentences[i - 1], i % 2) for i, t in enumerate(sentences)]
    tagging = [TaggingExample(i, tuple(t.split()), tuple(len(w) % 3 for w in t.split()))
               for i, t in enumerate(sentences)]
    qa = []
    for i, doc in enumerate(reviews):
        context = " ".join(doc)
        answer = doc[len(doc) // 2]
        qa.append(QAExample(str(i), doc[0][:80], context, (QAAnswer(answer, context.find(answer)),)))

    def qa_arrays(examples):
        windows = F.featurize_qa(examples, tokenizer, max_seq_length=128, max_query_length=32,
                                 doc_stride=64, is_training=True)
        arrays = F.qa_windows_to_arrays(windows)
        for key in ("token_to_word", "token_char_start", "token_char_end", "token_is_max_context"):
            arrays[key] = np.stack([getattr(w, key) for w in windows])
        return arrays

    jobs = [("sentences", len(single), lambda: F.featurize_sentences(single, tokenizer, 128)),
            ("pairs", len(pairs), lambda: F.featurize_sentences(pairs, tokenizer, 128)),
            ("tagging", len(tagging), lambda: F.featurize_tagging(tagging, tokenizer, 128)),
            ("qa", len(qa), lambda: qa_arrays(qa))]
    print(f"{'family':<10} {'rows':>6} {'best s':>8} {'rows/s':>9}  sha256 of the arrays")
    for name, rows, job in jobs:
        times = []
        for _ in range(FLAGS.repeats):
            start = time.perf_counter()
            arrays = job()
            times.append(time.perf_counter() - start)
        best = min(times)
        print(f"{name:<10} {rows:>6} {best:>8.3f} {rows / best:>9.0f}  {_digest(arrays)}", flush=True)


if __name__ == "__main__":
    cli.run(main, __name__)
