r"""A fixed-seed pretraining loss trajectory, to compare two versions of the library or precisions.

  python -m benchmarks.loss_trajectory [--config=electra_small] [--steps=50] [--batch_size=16] \
      [--seq_length=128] [--mixed_precision=none|bfloat16|float16] [--seed=0] [--vocab_size=0] \
      [--threads=0] [--out=FILE.json]
  python -m benchmarks.loss_trajectory --compare A.json B.json

The run: `keras.utils.set_random_seed(seed)`, the Keras mixed-precision policy of
`--mixed_precision` (the previous policy is restored afterwards), `ElectraPretrainer(config,
seed=seed)` with special ids [PAD] 0, [CLS] 2, [SEP] 3, [MASK] 4, and the optimizer as
`benchmarks/benchmark_pretrain.py`'s bare step builds it, but with a schedule that moves the weights
within the run: `create_optimizer("adamw", 5e-4, steps, steps // 10)` (float16 adds
`LossScaleOptimizer`, as `electra_tf/training/loop.py` does). Then `steps` calls of
`tf.function(model.train_step)`, dropout on, over a fixed cycle of 4 synthetic batches from
`numpy.random.default_rng(seed)`: ids in [5, vocab), [CLS] first, [SEP] last, real lengths drawn
in [seq / 2, seq], padding 0 with input_mask 0, segment 1 on the second half of each row's real
tokens.

Each step's own loss is recorded: `train_step` returns the Keras metrics' results, which are running
means since the last reset, so the metrics are reset before every step and the loss tracker's
result is then that step's loss alone.

Run to run, TensorFlow on CPU is not always bitwise reproducible, and which runs are depends on
the model and the CPU. Measured on a 2-core AVX-512 EPYC (2026-11-29): the demo model
(`--config=electra_demo --batch_size=32 --seq_length=64`, TensorFlow's default threads) gave the
same 40 losses bit for bit in two runs, and so did two versions of the library; ELECTRA-Small at
`--threads=1` did not (two runs of one library first differed at step 5-9, by at most ~6e-7
relative over 30 steps, with oneDNN on or off); an earlier day's machine was reproducible
single-threaded only, its default thread pools differing within a few steps (~1e-5 relative later).
`tf.config.experimental.enable_op_determinism()` does not change that. So before calling a
difference between two libraries their own, run one library twice with the same flags: the demo
model's trajectory is the bitwise check; a larger model's is a ~1e-6 one.

The JSON written: config, steps, batch_size, seq_length, vocab_size, mixed_precision, seed,
threads, tensorflow, keras, electra_tf_file (which library ran: the file of the
`electra_tf` imported), losses (one per step) and seconds_per_step (median over the steps, the
first one's tracing included).

`--compare` prints per-step statistics of |A - B| (relative differences are relative to |A|): the
step-0 losses (no update has happened yet, so they differ only if the forward pass does), the max
absolute and relative differences and their steps, the first steps where the relative difference
exceeds 1e-5 and 1e-3, and the mean of the last 10 steps of each. It is a measurement: it exits 0
whatever the differences. A missing or malformed file is a one-line error naming it (exit 1).

This module imports nothing from `tools` and imports TensorFlow only to run a trajectory, so it
can run as a file against another checkout of the library
(`PYTHONPATH=/other/checkout python /this/repo/benchmarks/loss_trajectory.py ...`), and `--compare` is
quick.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from typing import Callable

from absl import app, flags

from electra_tf import cli

SPECIAL_IDS = dict(pad_token_id=0, cls_token_id=2, sep_token_id=3, mask_token_id=4)
FIRST_WORD_ID = 5  # ids below are [PAD], [UNK], [CLS], [SEP], [MASK]
NUM_BATCHES = 4
LEARNING_RATE = 5e-4
POLICIES = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
LAST = 10  # steps averaged at the end of a trajectory by --compare

_CONFIG = flags.DEFINE_string("config", "electra_small", "Model config (name or JSON file).")
_STEPS = flags.DEFINE_integer("steps", 50, "Training steps.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 16, "Sequences per step.", lower_bound=1)
_SEQ = flags.DEFINE_integer("seq_length", 128, "Tokens per sequence.", lower_bound=4)
_MIXED = flags.DEFINE_enum("mixed_precision", "none", list(POLICIES), "Keras mixed precision.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights, dropout, masking and the batches.")
_VOCAB = flags.DEFINE_integer("vocab_size", 0, "Vocabulary size override (0: the config's).")
_OUT = flags.DEFINE_string("out", None, "JSON file to write the trajectory to.")
_THREADS = flags.DEFINE_integer(
    "threads", 0, "TensorFlow intra- and inter-op threads (0: TensorFlow's default). With the "
    "default, two runs of the same library on CPU differ in the last bits after a few steps.",
    lower_bound=0)
_COMPARE = flags.DEFINE_bool("compare", False, "Compare the two trajectory files given as "
                             "arguments instead of running one.")


class TrajectoryFileError(ValueError):
    """A trajectory JSON file that is missing or malformed (the message names the file)."""


@dataclasses.dataclass
class Trajectory:
    losses: list[float]  # one per step, that step's own loss
    seconds_per_step: float  # median


def synthetic_batches(batch_size: int, seq_length: int, vocab_size: int, seed: int,
                      count: int = NUM_BATCHES) -> list[dict]:
    """`count` batches of numpy int32 input_ids / input_mask / segment_ids [batch, seq]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        lengths = rng.integers(seq_length // 2, seq_length + 1, size=batch_size)
        ids = rng.integers(FIRST_WORD_ID, vocab_size, size=(batch_size, seq_length))
        ids = ids.astype(np.int32)
        mask = np.zeros_like(ids)
        segments = np.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, n:] = SPECIAL_IDS["pad_token_id"]
            ids[row, 0], ids[row, n - 1] = SPECIAL_IDS["cls_token_id"], SPECIAL_IDS["sep_token_id"]
            mask[row, :n] = 1
            segments[row, n // 2:n] = 1
        batches.append({"input_ids": ids, "input_mask": mask, "segment_ids": segments})
    return batches


def trajectory(model_config, steps: int, batch_size: int, seq_length: int,
               mixed_precision: str = "none", seed: int = 0,
               on_step: Callable[[int, float, float], None] | None = None) -> Trajectory:
    """Runs `steps` pretraining steps from a fixed seed; see the module docstring.

    Args:
      model_config: an `ElectraConfig`; its special ids are set to `SPECIAL_IDS`.
      mixed_precision: "none", "bfloat16" or "float16".
      on_step: called after every step with (step, loss, seconds).
    """
    import keras
    import tensorflow as tf

    from electra_tf.models.pretrainer import ElectraPretrainer
    from electra_tf.training.optimizer import create_optimizer

    if mixed_precision not in POLICIES:
        raise ValueError(f"mixed_precision {mixed_precision!r}: expected one of {list(POLICIES)}")
    model_config = model_config.replace(**SPECIAL_IDS)
    batches = [{k: tf.constant(v) for k, v in b.items()}
               for b in synthetic_batches(batch_size, seq_length, model_config.vocab_size, seed)]
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(POLICIES[mixed_precision])
    try:
        keras.utils.set_random_seed(seed)
        model = ElectraPretrainer(model_config, seed=seed)
        optimizer = create_optimizer("adamw", LEARNING_RATE, steps, steps // 10)
        if mixed_precision == "float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer)
        model.optimizer.build(model.trainable_variables)
        train_step = tf.function(model.train_step)
        losses, seconds = [], []
        for step in range(steps):
            # train_step returns running means since the last reset: reset, so "loss" is this
            # step's own.
            model.reset_metrics()
            start = time.perf_counter()
            loss = float(train_step(batches[step % len(batches)])["loss"])
            seconds.append(time.perf_counter() - start)
            losses.append(loss)
            if on_step is not None:
                on_step(step, loss, seconds[-1])
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
    return Trajectory(losses, statistics.median(seconds))


def load(path: str) -> dict:
    """A trajectory file's contents; raises `TrajectoryFileError` naming `path`."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except OSError as e:
        raise TrajectoryFileError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrajectoryFileError(f"{path}: not valid JSON: {e}") from None
    losses = record.get("losses") if isinstance(record, dict) else None
    if (not isinstance(losses, list) or not losses
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses)):
        raise TrajectoryFileError(f"{path}: not a trajectory: expected an object whose \"losses\" "
                                  "is a non-empty list of numbers")
    return record


def compare(a: list[float], b: list[float]) -> dict:
    """Statistics of |a - b| over the steps both have (relative: to |a|)."""
    n = min(len(a), len(b))
    diffs = [abs(x - y) for x, y in zip(a[:n], b[:n])]
    rels = [d / abs(x) if x else (0.0 if d == 0 else math.inf) for d, x in zip(diffs, a)]

    def first_above(threshold):
        return next((i for i, r in enumerate(rels) if r > threshold), None)

    last = min(LAST, n)
    mean_a, mean_b = statistics.fmean(a[n - last:n]), statistics.fmean(b[n - last:n])
    return {
        "steps": n, "step0_a": a[0], "step0_b": b[0], "step0_abs": diffs[0], "step0_rel": rels[0],
        "max_abs": max(diffs), "max_abs_step": diffs.index(max(diffs)),
        "max_rel": max(rels), "max_rel_step": rels.index(max(rels)),
        "first_rel_above_1e-5": first_above(1e-5), "first_rel_above_1e-3": first_above(1e-3),
        "last": last, "last_mean_a": mean_a, "last_mean_b": mean_b,
        "last_mean_rel": abs(mean_a - mean_b) / abs(mean_a) if mean_a else math.inf,
    }


def format_comparison(path_a: str, a: dict, path_b: str, b: dict) -> str:
    s = compare(a["losses"], b["losses"])
    lines = []
    for name, path, r in (("A", path_a, a), ("B", path_b, b)):
        lines.append(f"{name}: {path}: config {r.get('config')}, mixed_precision "
                     f"{r.get('mixed_precision')}, seed {r.get('seed')}, threads "
                     f"{r.get('threads', 0)}, {len(r['losses'])} steps, "
                     f"{r.get('seconds_per_step', math.nan):.3f} s/step, "
                     f"electra_tf {r.get('electra_tf_file')}")
    if len(a["losses"]) != len(b["losses"]):
        lines.append(f"note: different lengths, comparing the first {s['steps']} steps")
    for key in ("config", "batch_size", "seq_length", "vocab_size", "seed", "threads"):
        if a.get(key) != b.get(key):
            lines.append(f"note: {key} differs: {a.get(key)} vs {b.get(key)}")
    never = "never"
    lines += [
        f"step 0 loss: A {s['step0_a']:.7f}  B {s['step0_b']:.7f}  |A-B| {s['step0_abs']:.3e}  "
        f"relative {s['step0_rel']:.3e}",
        f"max |A-B|: {s['max_abs']:.3e} at step {s['max_abs_step']}",
        f"max relative |A-B|/|A|: {s['max_rel']:.3e} at step {s['max_rel_step']}",
        f"first step with relative difference > 1e-5: "
        f"{never if s['first_rel_above_1e-5'] is None else s['first_rel_above_1e-5']}; > 1e-3: "
        f"{never if s['first_rel_above_1e-3'] is None else s['first_rel_above_1e-3']}",
        f"mean of the last {s['last']} steps: A {s['last_mean_a']:.6f}  B {s['last_mean_b']:.6f}  "
        f"relative difference {s['last_mean_rel']:.3e}",
    ]
    return "\n".join(lines)


def main(argv):
    if _COMPARE.value:
        if len(argv) != 3:
            raise app.UsageError(f"--compare takes two trajectory files, got {argv[1:]}")
        try:
            records = [load(path) for path in argv[1:]]
        except TrajectoryFileError as e:
            sys.exit(f"error: {e}")
        print(format_comparison(argv[1], records[0], argv[2], records[1]))
        return
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")

    import keras
    import tensorflow as tf

    import electra_tf
    from electra_tf.config import ElectraConfig

    try:
        model_config = ElectraConfig.from_json(_CONFIG.value)
        if _VOCAB.value:
            model_config = model_config.replace(vocab_size=_VOCAB.value)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if _THREADS.value:
        tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
        tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)
    steps = _STEPS.value

    def progress(step, loss, seconds):
        if (step + 1) % 10 == 0 or step + 1 == steps:
            print(f"step {step + 1}/{steps}: loss {loss:.6f} ({seconds:.3f} s)", flush=True)

    result = trajectory(model_config, steps, _BATCH.value, _SEQ.value, _MIXED.value, _SEED.value,
                        on_step=progress)
    record = {
        "config": _CONFIG.value, "steps": steps, "batch_size": _BATCH.value,
        "seq_length": _SEQ.value, "vocab_size": model_config.vocab_size,
        "mixed_precision": _MIXED.value, "seed": _SEED.value,
        "threads": _THREADS.value, "tensorflow": tf.__version__,
        "keras": keras.__version__, "electra_tf_file": electra_tf.__file__,
        "losses": result.losses, "seconds_per_step": result.seconds_per_step,
    }
    print(f"electra_tf {electra_tf.__file__}: median {result.seconds_per_step:.3f} s/step, "
          f"loss {result.losses[0]:.6f} -> {result.losses[-1]:.6f}")
    if _OUT.value:
        with open(_OUT.value, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
        print(f"wrote {_OUT.value}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
