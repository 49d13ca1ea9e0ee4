"""Pretraining throughput of ELECTRA-Small on this machine: bare step vs the binary's path.

  python -m tools.benchmark_pretrain [--steps=4] [--rounds=3] [--warmup_steps=2] [--steps_per_loop=4] \
      [--batch_size=16] [--seq_length=128] [--config=electra_small] [--rows=all]

Rows (dropout on, the full objective, fp32):
  bare eager      `ElectraPretrainer.train_step` called eagerly, cycling over a few distinct
                  in-memory batches (real data varies from step to step; one repeated batch
                  would flatter the bare step by a few percent)
  bare function   the same step in `tf.function`
  bare XLA        the same step in `tf.function(jit_compile=True)`
  binary          the electra-pretrain path: OneDeviceStrategy, the resumable input pipeline over
                  real shards (built on the fly from the embedded IMDB corpus), `steps_per_loop`
                  steps per call of the loop function, gradient-norm tracking (checkpoints and
                  summaries are excluded: they run every N steps and are I/O)
  binary XLA      the same with the replica step XLA-compiled

Every row is built and warmed up first, then timed in `--rounds` interleaved rounds of `--steps`
steps each (median reported), so the machine's drifts hit all rows alike.

Also measured: the fp32 matmul rate (tf.linalg.matmul 2048x2048x2048, best of a few reps), the
fraction of it each row achieves, and the binary's overhead over the matching bare step.

FLOPs per training step, counted analytically (`electra_tf.models.flops`): a matmul of an
[m, k] input with a [k, n] kernel costs 2mkn, so a dense layer costs 2 x its kernel size per
token. Per token and encoder layer: 2 (4 H^2 + 2 H I) for Q, K, V, output and the FFN, plus
4 S H for the attention scores (Q K^T) and the weighted sum (A V); the embedding projection
2 E H when E != H. Discriminator head: 2 (H^2 + H) per token. Generator: the same encoder
terms at its own width, and its MLM head only at the N masked slots per sequence:
2 (h_g E + E V) (dense to E, then the tied output embedding over the vocabulary). Backward is
2 x forward, so training = 3 x forward. Embedding lookups, softmax, LayerNorm, GELU and the
optimizer update are not counted (element-wise, < 2% here). The count is cross-checked with
TensorFlow's graph profiler (`tf.compat.v1.profiler`, float_operation) on the traced step, which
counts the op types with registered FLOP statistics: matmuls, but also element-wise ops and the
optimizer update (and not Einsum), so it is a rough check only (ELECTRA-Small: 109% of the count).
"""

from __future__ import annotations

import functools
import itertools
import os
import tempfile
import time

from absl import app, flags, logging

from electra_tf.models.flops import training_flops_per_sequence

_CONFIG = flags.DEFINE_string("config", "electra_small", "Model config.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq_length", 128, "Tokens per sequence.")
_STEPS = flags.DEFINE_integer("steps", 4, "Timed steps per row and round (rounded up to whole "
                              "loops).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved timing rounds; the median is reported.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 2, "Untimed steps first (tracing, compiling).")
_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 4, "Steps per loop call on the binary path.")
_ROWS = flags.DEFINE_list("rows", ["all"], "Rows to run: eager, function, xla, binary, "
                          "binary_xla, or all.")
_MATMUL_N = flags.DEFINE_integer("matmul_size", 2048, "Size of the reference matmul.")
_BARE_BATCHES = flags.DEFINE_integer("bare_batches", 4, "Distinct in-memory batches the bare "
                                     "rows cycle over.")
_DOCS = flags.DEFINE_integer("corpus_docs", 300, "IMDB reviews in the on-the-fly shards.")

ROWS = ("eager", "function", "xla", "binary", "binary_xla")


def matmul_rate(n: int, reps: int = 5) -> float:
    """Best fp32 FLOP/s of tf.linalg.matmul on [n, n] x [n, n]."""
    import tensorflow as tf

    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    tf.linalg.matmul(a, b).numpy()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        tf.linalg.matmul(a, b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def profiler_flops(step_fn, features) -> float | None:
    """FLOPs of the traced step by tf.compat.v1.profiler (registered op types only)."""
    import tensorflow as tf

    try:
        graph = tf.function(step_fn).get_concrete_function(features).graph
        options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
        options["output"] = "none"
        return float(tf.compat.v1.profiler.profile(graph, options=options).total_float_ops)
    except Exception as e:  # the profiler is best effort
        logging.warning("profiler FLOP count failed: %s", e)
        return None


def build_shards(config_vocab_size: int, seq_length: int, num_docs: int, workdir: str):
    """Real shards from the embedded IMDB corpus with a quick hand-made vocab -> (glob, ids).

    Returns the special-token ids of that vocab (its ids all lie below the model's vocab size).
    """
    import collections
    import re

    from electra_tf.data import corpus
    from electra_tf.data import pretraining_data as pd

    docs = list(itertools.islice(corpus.imdb_documents(), num_docs))
    words = collections.Counter(w for d in docs for line in d
                                for w in re.findall(r"[a-z]+|[^a-z\s]", line.lower()))
    chars = sorted({c for w in words for c in w if c.isprintable() and not c.isspace()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    vocab += [w for w, _ in words.most_common(2000) if len(w) > 1 and w not in vocab]
    vocab = vocab[:config_vocab_size]
    vocab_file = os.path.join(workdir, "vocab.txt")
    with open(vocab_file, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab))
    text = os.path.join(workdir, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    out = os.path.join(workdir, "shards")
    pd.build_pretraining_data(pd.BuildConfig(
        inputs=[text], vocab_file=vocab_file, output_dir=out, max_seq_length=seq_length,
        num_shards=4, num_processes=1, seed=0), progress_every=60)
    return os.path.join(out, "pretrain_data.tfrecord-*"), dict(
        pad_token_id=0, cls_token_id=2, sep_token_id=3, mask_token_id=4)


def in_memory_batches(data, batch: int, seq: int, count: int) -> list:
    """The first `count` batches of the shards, as dicts of int32 tensors."""
    import tensorflow as tf

    spec = {n: tf.io.FixedLenFeature([seq], tf.int64)
            for n in ("input_ids", "input_mask", "segment_ids")}
    records = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(data))).batch(batch, drop_remainder=True)
    parsed = records.map(lambda r: {k: tf.cast(v, tf.int32)
                                    for k, v in tf.io.parse_example(r, spec).items()})
    return list(itertools.islice(iter(parsed), count))


def _seconds_per_call(fn, calls: int) -> float:
    """Seconds per call of `fn` (which must block until done)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def bare_step(model_config, batches, mode: str):
    """(one-step callable, steps per call) of `ElectraPretrainer.train_step` in `mode`."""
    import keras
    import tensorflow as tf

    from electra_tf.models.pretrainer import ElectraPretrainer
    from electra_tf.training.optimizer import create_optimizer

    keras.utils.set_random_seed(0)
    model = ElectraPretrainer(model_config, seed=0)
    model.compile(optimizer=create_optimizer("adamw", 5e-4, 1_000_000, 10))
    model.optimizer.build(model.trainable_variables)
    step = model.train_step
    if mode != "eager":
        step = tf.function(model.train_step, jit_compile=mode == "xla")
    cycle = itertools.cycle(batches)
    return (lambda: float(step(next(cycle))["loss"])), 1


def binary_step(model_config, data, batch: int, seq: int, jit: bool, per_loop: int):
    """(one-loop callable, steps per call) of the electra-pretrain path."""
    import keras
    import tensorflow as tf

    from electra_tf.training import pretraining
    from electra_tf.training.strategy import create_strategy

    strategy = create_strategy("one_device")
    config = pretraining.PretrainingConfig(
        train_batch_size=batch, max_seq_length=seq, steps_per_loop=per_loop, jit_compile=jit,
        num_train_steps=1_000_000)
    keras.utils.set_random_seed(0)
    model, _, _ = pretraining._build(model_config, config, strategy)
    iterator = iter(strategy.distribute_datasets_from_function(pretraining.resumable_dataset_fn(
        data, batch, seq, seed=0)))
    loop = pretraining.make_loop_fn(model, strategy, jit_compile=jit)
    n = tf.constant(per_loop)
    stop = tf.constant(False)
    return (lambda: float(loop(iterator, n, stop)[0])), per_loop


def time_rows(makers: dict, warmup: int, steps: int, rounds: int) -> dict:
    """Median seconds per step of each row, timed in `rounds` interleaved rounds.

    Every row is built and warmed up first; then each round times every row in turn, so slow
    drifts of the machine (other load, clock changes) hit all rows alike instead of whichever
    row happened to run during them.
    """
    import statistics

    calls = {}
    for row, make in makers.items():
        logging.info("building and warming up row %s ...", row)
        fn, per_call = make()
        for _ in range(max(1, -(-warmup // per_call))):
            fn()
        calls[row] = (fn, per_call)
    samples = {row: [] for row in makers}
    for r in range(rounds):
        for row, (fn, per_call) in calls.items():
            n = max(1, -(-steps // per_call))
            samples[row].append(_seconds_per_call(fn, n) / per_call)
        logging.info("round %d/%d: %s", r + 1, rounds,
                     ", ".join(f"{row} {samples[row][-1]:.3f} s/step" for row in makers))
    return {row: statistics.median(v) for row, v in samples.items()}


def main(argv):
    del argv
    import numpy as np
    import tensorflow as tf

    from electra_tf.config import ElectraConfig

    rows = ROWS if "all" in _ROWS.value else tuple(_ROWS.value)
    batch, seq = _BATCH.value, _SEQ.value
    base_config = ElectraConfig.from_json(_CONFIG.value)
    workdir = tempfile.mkdtemp(prefix="electra_bench_")
    data, special_ids = build_shards(base_config.vocab_size, seq, _DOCS.value, workdir)
    model_config = base_config.replace(**special_ids)
    batches = in_memory_batches(data, batch, seq, _BARE_BATCHES.value)
    features = batches[0]
    tokens = float(np.sum(features["input_mask"].numpy()))
    flops = training_flops_per_sequence(model_config, seq)
    step_flops = flops["training"] * batch

    peak = matmul_rate(_MATMUL_N.value)
    makers = {}
    for row in rows:
        if row in ("eager", "function", "xla"):
            makers[row] = functools.partial(bare_step, model_config, batches, row)
        else:
            makers[row] = functools.partial(binary_step, model_config, data, batch, seq,
                                            row == "binary_xla", _PER_LOOP.value)
    results = time_rows(makers, _WARMUP.value, _STEPS.value, _ROUNDS.value)

    profiled = None
    if "function" in rows:
        from electra_tf.models.pretrainer import ElectraPretrainer
        from electra_tf.training.optimizer import create_optimizer

        model = ElectraPretrainer(model_config, seed=0)
        model.compile(optimizer=create_optimizer("adamw", 5e-4, 1_000_000, 10))
        model.optimizer.build(model.trainable_variables)
        profiled = profiler_flops(model.train_step, features)

    print()
    print(f"ELECTRA pretraining throughput: config {_CONFIG.value}, batch {batch}, length {seq}, "
          f"dropout on, objective {model_config.objective}, fp32, {os.cpu_count()} CPU cores")
    print(f"FLOPs per step (analytic): {step_flops / 1e9:.1f} G "
          f"(discriminator fwd {flops['discriminator_forward'] * batch / 1e9:.1f} G, generator "
          f"fwd {flops['generator_forward'] * batch / 1e9:.1f} G, x3 for backward)")
    if profiled:
        print(f"FLOPs per step (tf.compat.v1.profiler, registered ops only): "
              f"{profiled / 1e9:.1f} G = {100 * profiled / step_flops:.0f}% of analytic")
    print(f"Timing: median of {_ROUNDS.value} interleaved rounds of {_STEPS.value} steps per row "
          f"(after {_WARMUP.value} warm-up steps)")
    print(f"Reference fp32 matmul {_MATMUL_N.value}^3: {peak / 1e9:.1f} GFLOP/s")
    print(f"Real tokens per batch: {tokens:.0f} of {batch * seq}")
    header = (f"{'path':<22}{'steps/s':>9}{'seq/s':>9}{'tokens/s':>10}{'GFLOP/s':>9}"
              f"{'% matmul':>10}{'overhead':>10}")
    print(header)
    print("-" * len(header))
    names = {"eager": "bare step, eager", "function": "bare step, tf.function",
             "xla": "bare step, XLA", "binary": f"binary, loop {_PER_LOOP.value}",
             "binary_xla": f"binary XLA, loop {_PER_LOOP.value}"}
    bare_for = {"binary": "function", "binary_xla": "xla"}
    for row in rows:
        seconds = results[row]
        rate = step_flops / seconds
        overhead = ""
        if row in bare_for and bare_for[row] in results:
            overhead = f"{100 * (seconds / results[bare_for[row]] - 1):+.1f}%"
        print(f"{names[row]:<22}{1 / seconds:>9.3f}{batch / seconds:>9.2f}"
              f"{batch * seq / seconds:>10.0f}{rate / 1e9:>9.1f}{100 * rate / peak:>9.1f}%"
              f"{overhead:>10}")
    print("tokens/s counts all positions (padding included); overhead = binary step time over "
          "the matching bare step's, minus 1.")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
