"""Throughput of the pretraining-data builder and reader, printed as a table.

  python -m benchmarks.benchmark_data [--vocab_file=vocab.txt] [--megabytes=8] [--read_seconds=5]

Builder: the first --megabytes of the embedded IMDB corpus, built with 1 and with 2 worker
processes (wall clock includes process start-up and TF import; "per process" is WordPieces over
the time workers spent inside shards). The original tool's reference rate is ~157k tokens/s per
process; "start-up+index" is wall minus time in shards per process (spawn, TF import, tokenizer
set-up, indexing), which dominates small inputs. Reader: `pretraining_dataset` examples/s at
sequence length 128 and 512, batch 128.
Without --vocab_file a frequency vocab is made from the corpus (benchmark only: 8k most frequent
words plus every character and its ## form; its WordPiece counts are close to BERT's on English).
"""

import json
import os
import tempfile
import time

from absl import flags

from electra_tf import cli

_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: made from IMDB).")
_MB = flags.DEFINE_float("megabytes", 8.0, "MB of IMDB text to build from.")
_READ_SECONDS = flags.DEFINE_float("read_seconds", 5.0, "Seconds to read per sequence length.")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temp dir).")


def _build(text_file, vocab, out, procs, seq):
    from electra_tf.data import shards

    start = time.time()
    manifest = shards.build_pretraining_data(shards.BuildConfig(
        inputs=[text_file], vocab_file=vocab, output_dir=out, max_seq_length=seq,
        num_shards=16, num_processes=procs, seed=0), progress_every=1e9)
    wall = time.time() - start
    busy = sum(json.load(open(os.path.join(out, shards.STATS_DIR, f)))["seconds"]
               for f in os.listdir(os.path.join(out, shards.STATS_DIR)) if f.endswith(".json"))
    return manifest, wall, busy


def _read(pattern, seq, seconds):
    from electra_tf.data.pipeline import pretraining_dataset

    ds = pretraining_dataset(pattern, 128, seq, seed=0)
    it = iter(ds)
    for _ in range(5):  # warm-up
        next(it)
    n, start = 0, time.time()
    while time.time() - start < seconds:
        next(it)
        n += 128
    return n / (time.time() - start)


def main(argv):
    del argv
    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import frequency_vocab, write_vocab

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="electra_bench_")
    text_file = os.path.join(work, "imdb.txt")
    budget, lines = int(_MB.value * 1e6), []
    with open(text_file, "w", encoding="utf-8") as f:
        size = 0
        for doc in corpus.imdb_documents():
            chunk = "\n".join(doc) + "\n\n"
            f.write(chunk)
            lines += doc
            size += len(chunk.encode("utf-8"))
            if size >= budget:
                break
    vocab = _VOCAB.value or os.path.join(work, "vocab.txt")
    if not _VOCAB.value:
        write_vocab(frequency_vocab(lines), vocab)
    mb = size / 1e6

    rows = []
    for procs in (1, 2):
        manifest, wall, busy = _build(text_file, vocab, os.path.join(work, f"p{procs}"), procs,
                                      128)
        wp = manifest["num_wordpieces"]
        rows.append((f"build seq128 x{procs} proc", f"{mb / wall:6.2f} MB/s",
                     f"{wp / wall / 1e3:7.0f}k tok/s wall",
                     f"{wp / busy / 1e3:7.0f}k tok/s per process",
                     f"{wall - busy / procs:5.1f} s"))
    read_dir = os.path.join(work, "p1")
    r128 = _read(os.path.join(read_dir, "pretrain_data.tfrecord-*"), 128, _READ_SECONDS.value)
    _build(text_file, vocab, os.path.join(work, "s512"), 2, 512)
    r512 = _read(os.path.join(work, "s512", "pretrain_data.tfrecord-*"), 512,
                 _READ_SECONDS.value)
    rows.append(("read seq128 batch128", f"{r128:8.0f} ex/s", "", "", ""))
    rows.append(("read seq512 batch128", f"{r512:8.0f} ex/s", "", "", ""))

    print(f"\ninput: {mb:.1f} MB of IMDB, {manifest['num_wordpieces']:,} WordPieces, "
          f"vocab {vocab}, {os.cpu_count()} cores")
    print(f"{'what':<24} {'rate':>14} {'':>24} {'':>28} {'start-up+index':>15}")
    for row in rows:
        print(f"{row[0]:<24} {row[1]:>14} {row[2]:>24} {row[3]:>28} {row[4]:>15}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
