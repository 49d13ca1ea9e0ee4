"""The fine-tuning step on this machine: electra-finetune's paths against Hugging Face PyTorch.

  python -m benchmarks.benchmark_finetune_step [--config=electra_small] [--batch_size=32]
      [--seq_length=128] [--rows=binary,binary_graph,binary_xla,torch] [--steps=10] [--rounds=3]
      [--emulate_avx2]

Rows (a sentence classifier, 2 labels, dropout on, fp32):
  binary        the step `electra-finetune` runs (`finetune/train_step.make_train_step`: the
                task family's head, the original's AdamWeightDecay with layer-wise decay and the
                global-norm clip, a shuffled tf.data pass over the arrays, one call per batch from
                Python as the loop makes it) on the path it chooses for a long run on this CPU
                (`training/step_path.py`: graph or XLA, printed)
  binary_graph  the same, forced to the plain graph (--nojit_compile)
  binary_xla    the same, XLA-compiled (--jit_compile)
  torch         `transformers` `ElectraForSequenceClassification` of the same sizes, torch AdamW,
                on the same batches (`benchmarks/torch_finetune_reference.py`; needs
                `pip install -e .[anchors]`, skipped with the reason otherwise)

The batches are random ids of the model's vocabulary with real-looking lengths (the mask covers 8
to seq_length tokens; every position is computed, as in fine-tuning, which pads to the
sequence length): a step's work does not depend on which ids they are. Every row runs in its own
process (`benchmarks/row_worker.py`), is built and warmed up, then timed in `--rounds`
interleaved rounds of `--steps` steps; medians and ratios to PyTorch are printed with the CPU's
vector extensions. Quote ratios from one run, never absolute numbers across runs.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile

from absl import app, flags, logging

from benchmarks import row_worker
from benchmarks.emulation import header_lines, row_environment
from electra_tf import cli
from electra_tf.cpu import cpu_description

_CONFIG = flags.DEFINE_string("config", "electra_small", "Model config of the encoder.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Examples per step (the paper's 32).")
_SEQ = flags.DEFINE_integer("seq_length", 128, "Tokens per example (the paper's 128).")
_ROWS = flags.DEFINE_list("rows", ["binary", "torch"], "Rows: binary, binary_graph, binary_xla, "
                          "torch, or all.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per row and round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved timing rounds; the median is reported.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 3, "Untimed steps first (tracing, compiling).")
_BATCHES = flags.DEFINE_integer("distinct_batches", 8, "Distinct batches the rows cycle over.")
_EMULATE_AVX2 = flags.DEFINE_bool(
    "emulate_avx2", False, "Run every row as on an AVX2-only CPU (see benchmark_pretrain's flag "
    "of the same name); quote it as emulated.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the results as JSON here.")
_SERVE_ROW = flags.DEFINE_string("serve_row", None, "(internal) serve this row as a child process.")
_WORKDIR = flags.DEFINE_string("workdir", None, "(internal) the inputs of --serve_row.")

ROWS = ("binary", "binary_graph", "binary_xla", "torch")
NAMES = {"binary": "binary (default)", "binary_graph": "binary graph", "binary_xla": "binary XLA",
         "torch": "HF PyTorch"}
NUM_LABELS = 2
# Far more than the probe's cost: the binary row chooses as a real fine-tuning run would.
LONG_RUN_STEPS = 1_000_000


def make_batches(model_config, batch: int, seq: int, count: int, seed: int = 0) -> list[dict]:
    """`count` batches of int32 [batch, seq] input_ids / input_mask / segment_ids and [batch]
    labels: [CLS] ids [SEP] over a random length from 8 to seq, padding after."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        lengths = rng.integers(min(8, seq), seq + 1, size=batch)
        ids = rng.integers(1000 if model_config.vocab_size > 2000 else 5, model_config.vocab_size,
                           size=(batch, seq))
        mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
        ids[:, 0] = model_config.cls_token_id
        ids[np.arange(batch), lengths - 1] = model_config.sep_token_id
        ids = ids * mask
        batches.append({"input_ids": ids.astype(np.int32), "input_mask": mask,
                        "segment_ids": np.zeros((batch, seq), np.int32),
                        "label": rng.integers(0, NUM_LABELS, size=batch).astype(np.int32)})
    return batches


def binary_step(model_config, batches, jit: bool | None):
    """(one-step callable, the `step_path.StepPath` it runs) of electra-finetune's step."""
    import keras
    import numpy as np

    from electra_tf.finetune.config import FinetuningConfig
    from electra_tf.finetune.families import get_family
    from electra_tf.finetune.tasks import get_task
    from electra_tf.finetune.train_step import create_finetuning_optimizer, make_train_step
    from electra_tf.training.strategy import create_strategy

    arrays = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    batch = len(batches[0]["input_ids"])
    fc = FinetuningConfig(train_batch_size=batch, max_seq_length=arrays["input_ids"].shape[1])
    task = get_task("rotten_tomatoes")  # a two-label sentence task
    strategy = create_strategy("one_device")
    keras.utils.set_random_seed(0)
    with strategy.scope():
        head = get_family(task.family).build_head(model_config, task, fc)
        optimizer = create_finetuning_optimizer(fc, model_config.num_layers, LONG_RUN_STEPS)
        optimizer.build(head.trainable_variables)
    step, choice = make_train_step(head, optimizer, strategy, arrays, batch, seed=0,
                                   jit_compile=jit, total_steps=LONG_RUN_STEPS,
                                   log=lambda fmt, *args: logging.info(fmt, *args))
    return (lambda: float(step())), choice


def serve_row(row: str, workdir: str) -> None:
    """The child side of one of our rows (`--serve_row`)."""
    model_config, batches, _ = row_worker.load_inputs(workdir)
    step, choice = binary_step(model_config, batches,
                               {"binary": None, "binary_xla": True}.get(row, False))
    row_worker.serve(step, 1, {"row": row, "step_path": choice.name,
                               "step_path_reason": choice.reason})


def measure(rows, model_config, batch: int, seq: int) -> dict:
    """Every row in its own process, warmed up, then timed in interleaved rounds."""
    workdir = tempfile.mkdtemp(prefix="electra_ft_bench_")
    batches = make_batches(model_config, batch, seq, _BATCHES.value)
    row_worker.save_inputs(workdir, model_config, batches, {"batch_size": batch,
                                                            "seq_length": seq})
    workers, failed = {}, {}
    try:
        for row in rows:
            logging.info("building and warming up row %s ...", row)
            module = ("benchmarks.torch_finetune_reference" if row == "torch" else
                      "benchmarks.benchmark_finetune_step")
            command = [sys.executable, "-m", module] + (
                [workdir] if row == "torch" else [f"--serve_row={row}", f"--workdir={workdir}"])
            try:
                workers[row] = row_worker.Worker(command, row, row_environment(
                    row, _EMULATE_AVX2.value))
                workers[row].steps(_WARMUP.value)
            except row_worker.WorkerError as e:  # one broken row does not end the benchmark
                logging.error("%s", e)
                failed[row] = str(e)
                workers.pop(row, None)
        samples = row_worker.interleaved_rounds(workers, _STEPS.value, _ROUNDS.value,
                                                logging.info)
        infos = {row: worker.info for row, worker in workers.items()}
    finally:
        peaks = {row: worker.close() for row, worker in workers.items()}
    return {"samples": samples, "infos": infos, "failed": failed, "peak_rss_mib": peaks}


def print_report(config_name: str, batch: int, seq: int, measured: dict, skipped: dict) -> dict:
    samples, infos, peaks = measured["samples"], measured["infos"], measured["peak_rss_mib"]
    median = {row: statistics.median(v) for row, v in samples.items()}
    print()
    print(f"ELECTRA fine-tuning step: config {config_name}, sentence classifier ({NUM_LABELS} "
          f"labels), batch {batch} x length {seq}, dropout on, fp32")
    print("\n".join(header_lines(samples, _EMULATE_AVX2.value)))
    if "torch" in infos:
        t = infos["torch"]
        print(f"torch {t['torch']}, transformers {t['transformers']}, {t['threads']} threads, "
              f"attention {t['attn_implementation']}")
    print(f"Timing: each row in its own process; median of {_ROUNDS.value} interleaved rounds of "
          f"{_STEPS.value} steps (after {_WARMUP.value} warm-up steps)")
    print("\n".join(row_worker.row_notes(skipped, infos)))
    header = (f"{'row':<20}{'s/step':>8}{'range':>15}{'steps/s':>9}{'examples/s':>12}"
              f"{'x torch':>9}{'peak MiB':>10}")
    print(header)
    print("-" * len(header))
    for row, seconds in median.items():
        spread = f"{min(samples[row]):.3f}-{max(samples[row]):.3f}"
        versus = f"{median['torch'] / seconds:.2f}" if "torch" in median else ""
        print(f"{NAMES[row]:<20}{seconds:>8.3f}{spread:>15}{1 / seconds:>9.2f}"
              f"{batch / seconds:>12.1f}{versus:>9}{peaks.get(row) or 0:>10.0f}")
    print("x torch = torch's step time / the row's; peak MiB = the row process's peak resident "
          "memory.")
    return median


def main(argv):
    del argv
    if _SERVE_ROW.value:
        serve_row(_SERVE_ROW.value, _WORKDIR.value)
        return
    rows = row_worker.parse_rows(_ROWS.value, ROWS)
    skipped = {}
    if "torch" in rows:
        from benchmarks.torch_reference import available

        reason = available()
        if reason:
            skipped["torch"] = reason
            rows = tuple(row for row in rows if row != "torch")
    from electra_tf.config import ElectraConfig

    model_config = ElectraConfig.from_json(_CONFIG.value)
    batch, seq = _BATCH.value, _SEQ.value
    measured = measure(rows, model_config, batch, seq)
    skipped.update(measured["failed"])
    if not measured["samples"]:
        raise app.UsageError("every row failed: " + "; ".join(measured["failed"].values()))
    median = print_report(_CONFIG.value, batch, seq, measured, skipped)
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump({"config": _CONFIG.value, "batch_size": batch, "seq_length": seq,
                       "cpu": cpu_description(), "emulated_avx2": _EMULATE_AVX2.value,
                       "step_paths": {row: info["step_path"]
                                      for row, info in measured["infos"].items()
                                      if "step_path" in info},
                       "seconds_per_step": median, "peak_rss_mib": measured["peak_rss_mib"],
                       "skipped": skipped}, f, indent=1)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
