"""Pretraining throughput on this machine: electra_tf's paths, the PyTorch reference, the matmul bound.

  python -m benchmarks.benchmark_pretrain [--config=electra_small] [--batch_size=16] [--seq_length=128]
      [--rows=function,binary,binary_bf16,torch] [--steps=6] [--rounds=3] [--loss_steps=0]
  python -m benchmarks.benchmark_pretrain --scaling=128,256,512      # the sequence-length table

Rows (dropout on, the full objective):
  eager           `ElectraPretrainer.train_step` called eagerly, cycling over a few distinct
                  in-memory batches of the real shards
  function        the same step in `tf.function` (fp32)
  xla             the same step in `tf.function(jit_compile=True)`
  binary          the electra-pretrain path as it runs by default: the step path it chooses on
                  this CPU (`training/step_path.py`: graph or XLA, printed), OneDeviceStrategy, the resumable input pipeline over
                  real shards (built on the fly from the embedded IMDB corpus), `steps_per_loop`
                  steps per call of the loop function, gradient-norm tracking (checkpoints and
                  summaries are excluded: they run every N steps and are I/O)
  binary_xla      the same with the replica step XLA-compiled (--jit_compile)
  binary_graph    the same as a plain graph (--nojit_compile)
  binary_bf16     the binary path under `--mixed_precision=bfloat16` (Keras mixed_bfloat16)
  model_garden    TF Model Garden's ElectraPretrainer step (`benchmarks/model_garden_reference.py`), run
                  by the Python of a side venv with TF 2.20 given as --model_garden_python
  torch           the Hugging Face PyTorch reference step (`benchmarks/torch_reference.py`: generator
                  ElectraForMaskedLM body + tied head at the masked slots, Gumbel-max sampling,
                  ElectraForPreTraining, MLM + 50 x RTD, AdamW) on the same in-memory batches,
                  in a child process (needs `pip install -e .[anchors]`; skipped with the reason
                  otherwise)

Every row runs in its own process (`benchmarks/row_worker.py`: rows sharing a process slowed each
other down), is built and warmed up first, then timed in `--rounds` interleaved rounds of `--steps`
steps each (median reported), so the machine's drifts hit all rows alike; ratios between rows
are what to quote, never absolute numbers from different runs.

The matmul bound (`benchmarks/matmul_bound.py`): every MatMul/BatchMatMul of the traced fp32 step,
forward and backward, with its shape, each timed alone with TensorFlow's kernels (and with
PyTorch's when torch is installed); the bound is what the step would take if only its matmuls
were left. "% bound" = bound / step time. The graph's matmul FLOPs are printed beside the
analytic count of `electra_tf.models.flops` (they agree exactly for the default objective).

`--loss_steps=50` also runs a fixed-seed trajectory of that many steps in fp32 and in each mixed
precision of the rows (`benchmarks/loss_trajectory.py`) and prints the loss difference.

`--scaling=128,256,512` runs the binary path at each length with the same tokens per batch
(batch = batch_size x seq_length / length) and prints steps/s,
tokens/s and the peak resident memory of its process.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags, logging

from benchmarks import child_env
from benchmarks import row_worker
from benchmarks.emulation import header_lines, row_environment
from electra_tf import cli
from electra_tf.models.flops import training_flops_per_sequence
from electra_tf.cpu import cpu_description

_CONFIG = flags.DEFINE_string("config", "electra_small", "Model config.")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq_length", 128, "Tokens per sequence.")
_STEPS = flags.DEFINE_integer("steps", 6, "Timed steps per row and round (rounded up to whole "
                              "loops).")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved timing rounds; the median is reported.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 3, "Untimed steps first (tracing, compiling).")
_PER_LOOP = flags.DEFINE_integer("steps_per_loop", 2, "Steps per loop call on the binary path.")
_ROWS = flags.DEFINE_list("rows", ["function", "binary", "binary_bf16", "torch"],
                          "Rows to run: eager, function, xla, binary, binary_xla, binary_bf16, "
                          "torch, or all.")
_BOUND = flags.DEFINE_boolean("matmul_bound", True, "Measure the step's matmul bound.")
_BARE_BATCHES = flags.DEFINE_integer("bare_batches", 4, "Distinct in-memory batches the bare "
                                     "rows (and the torch row) cycle over.")
_DOCS = flags.DEFINE_integer("corpus_docs", 300, "IMDB reviews in the on-the-fly shards.")
_LOSS_STEPS = flags.DEFINE_integer("loss_steps", 0, "Fixed-seed steps for the fp32 vs mixed "
                                   "precision loss comparison (0: skip).")
_SCALING = flags.DEFINE_list("scaling", [], "Sequence lengths for the scaling table (each in "
                             "its own process, same tokens per batch); replaces the rows.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the results as JSON here.")
_MODEL_GARDEN = flags.DEFINE_string(
    "model_garden_python", None, "Python of a side venv with TF 2.20 + tf-models-official (see "
    "benchmarks/model_garden_reference.py): adds the model_garden row.")
_EMULATE_AVX2 = flags.DEFINE_bool(
    "emulate_avx2", False, "Run every row as on an AVX2-only CPU (Zen 2/3, or a VM hiding "
    "AVX-512): oneDNN, XLA and PyTorch limited to AVX2 code (AVX2_ENV), electra_tf's rows with "
    "the oneDNN setting its rule gives such a CPU (on) and Model Garden with TensorFlow's "
    "default there (off). Needs a CPU with AVX-512; quote it as emulated.")
_SERVE_ROW = flags.DEFINE_string("serve_row", None, "(internal) serve this row as a child process.")
_WORKDIR = flags.DEFINE_string("workdir", None, "(internal) the inputs of --serve_row.")

ROWS = ("eager", "function", "xla", "binary", "binary_graph", "binary_xla", "binary_bf16", "torch",
        "model_garden")
NAMES = {"eager": "bare step, eager", "function": "bare step, tf.function",
         "xla": "bare step, XLA", "binary": "binary (default)", "binary_graph": "binary graph",
         "binary_xla": "binary XLA",
         "binary_bf16": "binary bf16", "torch": "HF PyTorch reference",
         "model_garden": "Model Garden (TF 2.20)"}


def build_shards(config_vocab_size: int, seq_length: int, num_docs: int, workdir: str):
    """Real shards from the embedded IMDB corpus with a quick vocabulary -> (glob, special ids).

    The vocabulary (`tokenizer.frequency_vocab`, 2,000 words) is cut to the model's vocab size.
    """
    from electra_tf.config import SPECIAL_ID_FIELDS
    from electra_tf.data import corpus
    from electra_tf.data import shards
    from electra_tf.data.tokenizer import frequency_vocab, special_token_ids, write_vocab

    docs = list(itertools.islice(corpus.imdb_documents(), num_docs))
    vocab = frequency_vocab((line for d in docs for line in d), num_words=2000,
                            max_size=config_vocab_size)
    vocab_file = os.path.join(workdir, "vocab.txt")
    write_vocab(vocab, vocab_file)
    text = os.path.join(workdir, "corpus.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
    out = os.path.join(workdir, "shards")
    shards.build_pretraining_data(shards.BuildConfig(
        inputs=[text], vocab_file=vocab_file, output_dir=out, max_seq_length=seq_length,
        num_shards=4, num_processes=1, seed=0), progress_every=60)
    ids = special_token_ids(vocab)
    return os.path.join(out, "pretrain_data.tfrecord-*"), {name: ids[name] for name in SPECIAL_ID_FIELDS}


def in_memory_batches(data, batch: int, seq: int, count: int) -> list:
    """The first `count` batches of the shards, as dicts of int32 tensors."""
    import tensorflow as tf

    from electra_tf.data.inputs import INPUT_KEYS

    spec = {n: tf.io.FixedLenFeature([seq], tf.int64) for n in INPUT_KEYS}
    records = tf.data.TFRecordDataset(sorted(tf.io.gfile.glob(data))).repeat()
    parsed = records.batch(batch, drop_remainder=True).map(
        lambda r: {k: tf.cast(v, tf.int32) for k, v in tf.io.parse_example(r, spec).items()})
    return list(itertools.islice(iter(parsed), count))


def _bare_model(model_config):
    import keras

    from electra_tf.models.pretrainer import ElectraPretrainer
    from electra_tf.training.optimizer import create_optimizer

    keras.utils.set_random_seed(0)
    model = ElectraPretrainer(model_config, seed=0)
    model.compile(optimizer=create_optimizer("adamw", 5e-4, 1_000_000, 10))
    model.optimizer.build(model.trainable_variables)
    return model


def bare_step(model_config, batches, mode: str):
    """(one-step callable, steps per call) of `ElectraPretrainer.train_step` in `mode`."""
    import tensorflow as tf

    step = _bare_model(model_config).train_step
    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "xla")
    cycle = itertools.cycle(batches)
    return (lambda: float(step(next(cycle))["loss"])), 1


def binary_step(model_config, data, batch: int, seq: int, per_loop: int, jit: bool | None = None,
                mixed_precision: str = "none"):
    """(one-loop callable, steps per call, the `step_path.StepPath` it runs) of the
    electra-pretrain path; `jit` None chooses the path as the binary does by default."""
    import keras
    import tensorflow as tf

    from electra_tf.data import pipeline
    from electra_tf.training.config import MIXED_PRECISION, PretrainingConfig
    from electra_tf.training.loop import _build, _choose_step_path
    from electra_tf.training.strategy import create_strategy

    strategy = create_strategy("one_device")
    config = PretrainingConfig(
        train_batch_size=batch, max_seq_length=seq, steps_per_loop=per_loop, jit_compile=jit,
        num_train_steps=1_000_000, mixed_precision=mixed_precision)
    keras.utils.set_random_seed(0)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(MIXED_PRECISION[mixed_precision])
    try:  # layers take the policy when they are built
        model, opt, grad_norm = _build(model_config, config, strategy)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    # As `electra-pretrain`: the path it would choose for a run of 1M steps (a probe), or the
    # one asked for.
    loop, choice = _choose_step_path(model, opt, grad_norm, strategy, config, model_config, data,
                                     skip_corrupt=False)
    iterator = pipeline.distributed_iterator(strategy, pipeline.dataset_fn(data, batch, seq, seed=0))
    n = tf.constant(per_loop)
    stop = tf.constant(False)
    return (lambda: float(loop(iterator, n, stop)[0])), per_loop, choice


def matmul_bound(model_config, features, worker=None) -> dict:
    """The step's matmuls (from the traced fp32 bare step) timed alone with TF (and torch)."""
    import tensorflow as tf

    from benchmarks import matmul_bound as mb

    model = _bare_model(model_config)
    counts = mb.step_matmuls(tf.function(model.train_step).get_concrete_function(features))
    specs = sorted(counts, key=lambda spec: -counts[spec] * mb.spec_flops(spec))
    result = {"counts": counts, "tf": mb.tf_seconds(specs)}
    if worker is not None:
        result["torch"] = worker.matmul_seconds(specs)
    result["flops"] = sum(count * mb.spec_flops(spec) for spec, count in counts.items())
    for kernel in ("tf", "torch"):
        if kernel in result:
            result[f"{kernel}_bound"] = mb.bound_seconds(counts, result[kernel])
    return result


def loss_comparison(config_name: str, steps: int, batch: int, seq: int, precisions,
                    workdir: str) -> dict:
    """Fixed-seed trajectories (`benchmarks/loss_trajectory.py`, each in its own process): fp32 and
    each mixed precision -> the per-step losses."""
    losses = {}
    for precision in ("none", *precisions):
        out = os.path.join(workdir, f"loss_{precision}.json")
        logging.info("loss trajectory, %d steps, mixed precision %s ...", steps, precision)
        subprocess.run([sys.executable, "-m", "benchmarks.loss_trajectory", f"--config={config_name}",
                        f"--steps={steps}", f"--batch_size={batch}", f"--seq_length={seq}",
                        f"--mixed_precision={precision}", f"--out={out}"],
                       check=True, stdout=subprocess.DEVNULL, env=child_env())
        with open(out) as f:
            losses[precision] = json.load(f)["losses"]
    return losses


def print_report(config_name, batch, seq, rows, measured, losses, skipped):
    import tensorflow as tf

    from benchmarks import matmul_bound as mb

    model_config, samples = measured["model_config"], measured["samples"]
    bound, tokens = measured.get("bound"), measured["tokens"]
    torch_info, peaks = measured["torch_info"], measured["peak_rss_mib"]

    flops = training_flops_per_sequence(model_config, seq)
    step_flops = flops["training"] * batch
    median = {row: statistics.median(v) for row, v in samples.items()}
    print()
    print(f"ELECTRA pretraining step: config {config_name}, batch {batch} x length {seq}, "
          f"dropout on, objective {model_config.objective}")
    print("\n".join(header_lines(rows, _EMULATE_AVX2.value)))
    print(f"TensorFlow {tf.__version__}"
          + (f"; torch {torch_info['torch']}, transformers {torch_info['transformers']}, "
             f"{torch_info['threads']} threads, attention {torch_info['attn_implementation']}"
             if torch_info else ""))
    line = f"FLOPs per step: {step_flops / 1e9:.1f} G analytic"
    if bound:
        line += f", {bound['flops'] / 1e9:.1f} G in the traced step's matmuls"
    print(line + f"; real tokens per batch {tokens:.0f} of {batch * seq}")
    print(f"Timing: each row in its own process; median of {len(next(iter(samples.values())))} "
          f"interleaved rounds of {_STEPS.value} steps per row (after {_WARMUP.value} warm-up "
          "steps)")
    print("\n".join(row_worker.row_notes(skipped, measured.get("step_paths", {}))))
    header = (f"{'path':<24}{'s/step':>8}{'range':>15}{'steps/s':>9}{'tokens/s':>10}"
              f"{'GFLOP/s':>9}{'% bound':>9}{'x torch':>9}{'peak MiB':>10}")
    print(header)
    print("-" * len(header))
    for row in rows:
        seconds = median[row]
        spread = f"{min(samples[row]):.3f}-{max(samples[row]):.3f}"
        versus = f"{median['torch'] / seconds:.2f}" if "torch" in median else ""
        bound_share = f"{100 * bound['tf_bound'] / seconds:.0f}%" if bound else ""
        print(f"{NAMES[row]:<24}{seconds:>8.3f}{spread:>15}{1 / seconds:>9.3f}"
              f"{batch * seq / seconds:>10.0f}{step_flops / seconds / 1e9:>9.1f}"
              f"{bound_share:>9}{versus:>9}{peaks.get(row) or 0:>10.0f}")
    print("tokens/s counts every position (padding included); % bound = TensorFlow's fp32 "
          "matmul bound / step time; x torch = torch's step time / the row's; peak MiB = the row "
          "process's peak resident memory.")
    if "model_garden" in median:
        print("x Model Garden (its step time / the row's): " + ", ".join(
            f"{NAMES[row]} {median['model_garden'] / median[row]:.2f}" for row in rows
            if row != "model_garden"))
    if bound:
        print()
        kernels = ["tf"] + (["torch"] if "torch" in bound else [])
        print("Matmul bound (each matmul of the step timed alone at its shape, fwd + bwd): "
              + ", ".join(f"{k} {bound[f'{k}_bound']:.3f} s/step "
                          f"({bound['flops'] / bound[f'{k}_bound'] / 1e9:.0f} GFLOP/s)"
                          for k in kernels))
        counts = bound["counts"]
        print(f"{len(counts)} distinct shapes, {sum(counts.values())} matmuls; the largest:")
        header = f"  {'count':>5}  {'shape':<36}" + "".join(f"{k + ' GFLOP/s':>15}" for k in kernels)
        print(header)
        by_time = sorted(counts, key=lambda spec: -counts[spec] * bound["tf"][spec])
        for spec in by_time[:10]:
            rates = "".join(f"{mb.spec_flops(spec) / bound[k][spec] / 1e9:>15.0f}"
                            for k in kernels)
            print(f"  {counts[spec]:>5}  {mb.describe(spec):<36}{rates}")
    if losses:
        print()
        reference = losses["none"]
        print(f"Loss over a fixed-seed {len(reference)}-step run (fp32 vs mixed precision):")
        for precision, values in losses.items():
            if precision == "none":
                continue
            diffs = [abs(a - b) for a, b in zip(values, reference)]
            last = slice(-min(10, len(values)), None)
            mean_p, mean_r = statistics.mean(values[last]), statistics.mean(reference[last])
            print(f"  {precision}: max |diff| {max(diffs):.4f} (step {diffs.index(max(diffs))}),"
                  f" last-10 mean {mean_p:.4f} vs fp32 {mean_r:.4f} "
                  f"({100 * (mean_p / mean_r - 1):+.2f}%)")


def serve_row(row: str, workdir: str) -> None:
    """The child side of one row (`--serve_row`): builds and serves it (`benchmarks.row_worker`)."""
    import tensorflow as tf

    model_config, batches, setup = row_worker.load_inputs(workdir)
    batches = [{k: tf.constant(v) for k, v in b.items()} for b in batches]
    if row in ("eager", "function", "xla"):
        step, per_call = bare_step(model_config, batches, row)
    else:
        step, per_call, choice = binary_step(
            model_config, setup["data"], setup["batch_size"], setup["seq_length"],
            setup["steps_per_loop"], jit={"binary": None, "binary_xla": True}.get(row, False),
            mixed_precision="bfloat16" if row == "binary_bf16" else "none")
        row_worker.serve(step, per_call, {"row": row, "step_path": choice.name,
                                          "step_path_reason": choice.reason})
        return
    row_worker.serve(step, per_call, {"row": row})


def measure(config_name: str, rows, batch: int, seq: int, bound: bool) -> dict:
    """Builds every row in its own process, warms them up, times them in interleaved rounds."""
    import numpy as np

    from electra_tf.config import ElectraConfig
    base_config = ElectraConfig.from_json(config_name)
    workdir = tempfile.mkdtemp(prefix="electra_bench_")
    data, special_ids = build_shards(base_config.vocab_size, seq, _DOCS.value, workdir)
    model_config = base_config.replace(**special_ids)
    batches = in_memory_batches(data, batch, seq, _BARE_BATCHES.value)
    row_worker.save_inputs(workdir, model_config, batches, {
        "data": data, "batch_size": batch, "seq_length": seq,
        "steps_per_loop": _PER_LOOP.value})
    workers, failed = {}, {}
    try:
        for row in rows:
            logging.info("building and warming up row %s ...", row)
            env = row_environment(row, _EMULATE_AVX2.value)
            if row == "torch":
                command = [sys.executable, "-m", "benchmarks.torch_reference", workdir]
            elif row == "model_garden":
                # By file: the side venv has `electra_tf` on PYTHONPATH but no install of it.
                command = [_MODEL_GARDEN.value, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "model_garden_reference.py"), workdir]
                env = {**env, "PYTHONPATH": os.path.dirname(os.path.dirname(
                    os.path.abspath(cli.__file__)))}
            else:
                command = [sys.executable, "-m", "benchmarks.benchmark_pretrain", f"--serve_row={row}",
                           f"--workdir={workdir}"]
            try:
                workers[row] = row_worker.Worker(command, row, env)
                workers[row].steps(_WARMUP.value)
            except row_worker.WorkerError as e:  # one broken row does not end the benchmark
                logging.error("%s", e)
                failed[row] = str(e)
                workers.pop(row, None)
        rows = [row for row in rows if row in workers]
        samples = row_worker.interleaved_rounds(workers, _STEPS.value, _ROUNDS.value,
                                                logging.info)
        result = {"model_config": model_config, "samples": samples, "workdir": workdir,
                  "rows": rows, "failed": failed,
                  "tokens": float(np.mean([np.sum(b["input_mask"].numpy()) for b in batches])),
                  "torch_info": workers["torch"].info if "torch" in workers else None,
                  "step_paths": {row: w.info for row, w in workers.items()
                                 if "step_path" in w.info}}
        if bound:
            result["bound"] = matmul_bound(model_config, batches[0], workers.get("torch"))
    finally:
        peaks = {row: worker.close() for row, worker in workers.items()}
    result["peak_rss_mib"] = peaks
    return result


def run_scaling(lengths) -> None:
    """The binary path at each length with the same tokens per batch (a process per length)."""
    tokens = _BATCH.value * _SEQ.value
    results = []
    for length in (int(x) for x in lengths):
        if tokens % length:
            raise app.UsageError(f"--scaling: {tokens} tokens per batch are not a multiple of "
                                 f"length {length}")
        logging.info("scaling: length %d ...", length)
        measured = measure(_CONFIG.value, ("binary",), tokens // length, length, bound=False)
        seconds = statistics.median(measured["samples"]["binary"])
        results.append((length, tokens // length, seconds, measured["peak_rss_mib"]["binary"]))
    print()
    print(f"Scaling: config {_CONFIG.value}, binary path, fp32, {tokens} tokens per batch, "
          f"median of {_ROUNDS.value} rounds of {_STEPS.value} steps")
    print(f"CPU: {cpu_description()}")
    print(f"{'length':>7}{'batch':>7}{'steps/s':>9}{'tokens/s':>10}{'rel tokens/s':>14}"
          f"{'peak RSS MiB':>14}")
    for length, batch, seconds, rss in results:
        print(f"{length:>7}{batch:>7}{1 / seconds:>9.3f}{tokens / seconds:>10.0f}"
              f"{results[0][2] / seconds:>14.2f}{rss:>14.0f}")


def main(argv):
    del argv
    if _SERVE_ROW.value:
        serve_row(_SERVE_ROW.value, _WORKDIR.value)
        return
    if _SCALING.value:
        run_scaling(_SCALING.value)
        return
    rows = row_worker.parse_rows(_ROWS.value, ROWS)
    skipped = {}
    if "model_garden" in rows and not _MODEL_GARDEN.value:
        skipped["model_garden"] = "needs --model_garden_python (benchmarks/model_garden_reference.py)"
    elif _MODEL_GARDEN.value and "model_garden" not in rows:
        rows = (*rows, "model_garden")
    rows = tuple(row for row in rows if row not in skipped)
    if "torch" in rows:
        from benchmarks.torch_reference import available

        reason = available()
        if reason:
            skipped["torch"] = reason
            rows = tuple(row for row in rows if row != "torch")
    batch, seq = _BATCH.value, _SEQ.value
    measured = measure(_CONFIG.value, rows, batch, seq, _BOUND.value)
    rows = measured["rows"]
    skipped.update(measured["failed"])
    if not rows:
        raise app.UsageError("every row failed: " + "; ".join(measured["failed"].values()))
    losses = None
    if _LOSS_STEPS.value:
        precisions = ["bfloat16"] if "binary_bf16" in rows else []
        losses = loss_comparison(_CONFIG.value, _LOSS_STEPS.value, batch, seq, precisions,
                                 measured["workdir"])
    print_report(_CONFIG.value, batch, seq, rows, measured, losses, skipped)
    if _JSON_OUT.value:
        medians = {row: statistics.median(v) for row, v in measured["samples"].items()}
        with open(_JSON_OUT.value, "w") as f:
            json.dump({"config": _CONFIG.value, "batch_size": batch, "seq_length": seq,
                       "cpu": cpu_description(), "emulated_avx2": _EMULATE_AVX2.value,
                       "step_paths": {row: info["step_path"]
                                      for row, info in measured["step_paths"].items()},
                       "seconds_per_step": medians, "peak_rss_mib": measured["peak_rss_mib"],
                       "matmul_bound_seconds": {k: v for k, v in measured.get("bound", {}).items()
                                                if k.endswith("_bound")}}, f, indent=1)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
