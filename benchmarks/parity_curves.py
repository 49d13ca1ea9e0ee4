r"""Whole pretraining curves of electra_tf and of the PyTorch reference, K seeds each.

  python -m benchmarks.parity_curves run --data='DIR/pretrain_data.tfrecord-*' \
      --vocab_file=DIR/../vocab.txt --output_dir=OUT [--steps=12000] [--seeds=3] [--interval=400]
  python -m benchmarks.parity_curves report --output_dir=OUT [--chart=FILE.png] [--markdown]
  python -m benchmarks.parity_curves evaluate --output_dir=OUT --eval_data='HELD_OUT/*' 

`run` trains, for each seed 0..K-1, electra_tf (the `electra-pretrain` binary itself) and the
PyTorch reference (`benchmarks/torch_electra.py`, this module's `torch` worker) from the same
shards with the same recipe, each in a fresh process. Every run resumes where it stopped: rerun the same command after a kill
or a reboot, and runs already complete are skipped. `--only=electra_tf|torch` and `--seed=S`
restrict it to some runs. `--workers=2 --threads=1` trains two runs at once, one core each: on 2
cores about 15% more steps per second than one run on both. Each run's output goes to its
folder's `log.txt`; the tool prints the steps done, the rate and the ETA every minute.

The recipe defaults to the demo's (`electra_tf/experiments/demo.py`): `configs/electra_demo.json` with every
weight tied (generator as wide as the discriminator), batch 32 x 64 tokens, peak lr 3e-4, warmup
6% of the steps, Adam beta_2 0.98, weight decay 0.01, clip 1.0, dropout 0.1. Seed s sets each
side's initialisation, dropout and masking, and the input order: both sides read the shards in
the same order for the same seed (electra_tf's input pipeline feeds the reference too), so the
paired runs differ only in the implementation and its random draws.

Each side measures, over every interval of `--interval` steps, what electra_tf's binary writes to
TensorBoard: the mean over the interval's steps of the discriminator loss, MLM loss and MLM
accuracy, and the discriminator AUC over all the interval's weighted tokens
(`keras.metrics.AUC(num_thresholds=200)` on both sides). electra_tf's come from its event files;
the reference writes `metrics.jsonl`.

Diagnostics, to find the cause of a gap: `--reference_draws=electra_tf` makes the reference mask
and sample with exactly electra_tf's draws for that seed and step, `--reference_init=electra_tf`
starts it from electra_tf's initial weights; with `--override=hidden_dropout=0
--override=attention_dropout=0` as well, the two runs of a seed differ only by float rounding,
so their curves should coincide for thousands of steps.

`evaluate --eval_data=GLOB` scores every run's latest model on held-out shards with one piece of
code (electra_tf's objective, dropout off; the reference's weights cross through the Hugging Face
converter), on the same batches with the same masks and noise for every model, and prints the
four metrics per run and per side (with the difference paired by seed).

`report` prints, per interval and metric, each side's mean and standard deviation over seeds and
the reference's range (min..max over its seeds), and whether electra_tf's mean lies inside that
range; then, per metric, the difference of the means over the last quarter of the steps with its
standard error over seeds, and the same difference paired by seed (the runs of one seed read the
same batches in the same order). `--chart` draws the four curves (mean and range band per side,
matplotlib: the `plot` extra).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from electra_tf import files, run_folder

SIDES = ("electra_tf", "torch")
METRICS = ("disc_auc", "disc_loss", "mlm_accuracy", "mlm_loss")
RECIPE = dict(config="electra_demo", overrides=("generator_hidden_size=1.0", "embedding_sharing=all"),
              batch=32, seq=64, learning_rate=3e-4, warmup_fraction=0.06, beta_2=0.98,
              weight_decay=0.01, clip_norm=1.0)
REPO = Path(__file__).resolve().parent.parent


class Failure(Exception):
    """A user error: printed as one line."""


def run_dir(output_dir, side: str, seed: int) -> Path:
    return Path(output_dir) / f"{side}-seed{seed}"


def _recipe(args) -> dict:
    r = dict(RECIPE, overrides=tuple(RECIPE["overrides"]) + tuple(args.override or ()))
    r.update(steps=args.steps, warmup=max(1, int(args.steps * r["warmup_fraction"])),
             interval=args.interval, config=args.config or r["config"],
             batch=args.train_batch_size or r["batch"], seq=args.max_seq_length or r["seq"])
    if args.reference_draws != "authors" or args.reference_init != "authors":
        r.update(reference_draws=args.reference_draws, reference_init=args.reference_init)
    return r


def model_config(vocab_file: str, recipe: dict):
    from electra_tf.config import ElectraConfig

    return ElectraConfig.from_json(recipe["config"]).with_vocab(vocab_file).with_overrides(
        list(recipe["overrides"]))


# --- electra_tf: the binary ---------------------------------------------------------------------
def electra_tf_command(args, recipe: dict, seed: int) -> list[str]:
    per_loop = math.gcd(recipe["interval"], 50)
    return [sys.executable, "-m", "electra_tf.tools.pretrain", f"--data={args.data}",
            f"--vocab_file={args.vocab_file}", f"--config={recipe['config']}",
            *[f"--override={o}" for o in recipe["overrides"]],
            f"--model_dir={run_dir(args.output_dir, 'electra_tf', seed)}",
            f"--train_batch_size={recipe['batch']}", f"--max_seq_length={recipe['seq']}",
            f"--num_train_steps={recipe['steps']}", f"--learning_rate={recipe['learning_rate']}",
            f"--num_warmup_steps={recipe['warmup']}", f"--adam_beta_2={recipe['beta_2']}",
            f"--steps_per_loop={per_loop}", f"--summary_steps={recipe['interval']}",
            f"--save_checkpoints_steps={recipe['interval']}", "--keep_checkpoint_max=2",
            f"--seed={seed}"]


def electra_tf_curve(folder: Path) -> dict[int, dict]:
    """step -> {metric: value} from the binary's event files (a resumed run rewrites the steps
    after its checkpoint: the last written value of a step wins)."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    out: dict[int, dict] = {}
    events = []
    for path in glob.glob(str(folder / "train" / "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(record.numpy())
            for v in event.summary.value:
                if v.tag in METRICS:
                    events.append((event.wall_time, event.step, v.tag, float(tf.make_ndarray(v.tensor))))
    for _, step, tag, value in sorted(events):
        out.setdefault(step, {})[tag] = value
    return {s: m for s, m in out.items() if len(m) == len(METRICS)}


# --- the PyTorch reference: a worker process -----------------------------------------------------
def torch_worker(args, recipe: dict, seed: int) -> None:
    """Trains (or resumes) the reference for seed `seed` in run_dir(..., "torch", seed)."""
    import numpy as np
    import tensorflow as tf
    import torch

    import keras
    from benchmarks import torch_electra
    from electra_tf.data import pipeline

    reason = torch_electra.available()
    if reason:
        raise Failure(f"the PyTorch reference cannot run: {reason}")
    tf.config.set_visible_devices([], "GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = run_dir(args.output_dir, "torch", seed)
    folder.mkdir(parents=True, exist_ok=True)
    config = model_config(args.vocab_file, recipe)
    torch.manual_seed(seed)
    nets = torch_electra.build_networks(config)
    if args.reference_init == "electra_tf":
        _copy_electra_tf_init(nets, config, seed)
    opt = torch_electra.AdamWeightDecay(
        nets.parameters, peak_lr=recipe["learning_rate"], total_steps=recipe["steps"],
        warmup_steps=recipe["warmup"], weight_decay=recipe["weight_decay"],
        beta_2=recipe["beta_2"], clip_norm=recipe["clip_norm"])
    rng = torch.Generator().manual_seed(10_000 + seed)
    checkpoint, metrics_file = folder / "checkpoint.pt", folder / "metrics.jsonl"
    state = {}
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        with torch.no_grad():
            for name, p in nets.parameters.items():
                p.copy_(state["parameters"][name])
        opt.load_state_dict(state["optimizer"])
        rng.set_state(state["rng"])
        torch.set_rng_state(state["torch_rng"])
    step = opt.step
    if step:
        print(f"torch seed {seed}: resumed at step {step}", flush=True)
    # Intervals written after the checkpoint are redone.
    lines = metrics_file.read_text().splitlines() if metrics_file.exists() else []
    lines = [line for line in lines if json.loads(line)["step"] <= step]
    files.write_text(metrics_file, "".join(line + "\n" for line in lines))

    data = pipeline.dataset_fn(args.data, recipe["batch"], recipe["seq"], seed=seed,
                               start_step=step)(tf.distribute.InputContext())
    batches = iter(data)
    auc = keras.metrics.AUC(num_thresholds=200)
    sums = {name: 0.0 for name in ("loss", "mlm_loss", "mlm_accuracy", "disc_loss",
                                   "disc_accuracy", "sampled_accuracy", "gradient_norm")}
    count, start, start_step = 0, time.time(), step
    if "interval" in state:  # stopped mid-interval: its partial sums
        sums, count = dict(state["interval"]["sums"]), state["interval"]["count"]
        for variable, value in zip(auc.variables, state["interval"]["auc"]):
            variable.assign(value)

    def save():
        state = {"parameters": {n: p.detach().clone() for n, p in nets.parameters.items()},
                 "optimizer": opt.state_dict(), "rng": rng.get_state(),
                 "torch_rng": torch.get_rng_state(),
                 "interval": {"sums": dict(sums), "count": count,
                              "auc": [v.numpy() for v in auc.variables]}}
        torch.save(state, str(checkpoint) + ".tmp")
        os.replace(str(checkpoint) + ".tmp", checkpoint)
        files.write_text(folder / "checkpoint_step", f"{opt.step}\n")  # for the progress line

    stop = []  # SIGTERM or Ctrl-C: save where it is (mid-interval too) and end
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.append(True))
    while step < recipe["steps"]:
        if stop:
            save()
            print(f"torch seed {seed}: stopped at step {step}; rerun to resume", flush=True)
            return
        features = next(batches)
        ids, mask, segments = (torch.from_numpy(features[k].numpy().astype(np.int64))
                               for k in ("input_ids", "input_mask", "segment_ids"))
        if args.reference_draws == "electra_tf":
            draws = _electra_tf_draws(config, features, seed, step)
        else:
            draws = torch_electra.draw(config, ids, mask, rng)
        out = torch_electra.objective(nets, config, ids, mask, segments, draws)
        torch_electra.zero_grad(nets)
        out["loss"].backward()
        torch_electra.check_finite(out["loss"].item(), step)
        opt.apply()
        step = opt.step
        for name in sums:
            sums[name] += opt.gradient_norm if name == "gradient_norm" else out[name].item()
        count += 1
        auc.update_state(out["labels"].numpy(), torch.sigmoid(out["rtd_logits"]).detach().numpy(),
                         sample_weight=out["token_weights"].numpy())
        if step % recipe["interval"] == 0 or step == recipe["steps"]:
            record = {"step": step, **{k: v / count for k, v in sums.items()},
                      "disc_auc": float(auc.result())}
            with open(metrics_file, "a") as f:
                f.write(json.dumps(record) + "\n")
            sums = dict.fromkeys(sums, 0.0)
            count = 0
            auc.reset_state()
            save()
            rate = (step - start_step) / (time.time() - start)
            eta = (recipe["steps"] - step) / rate if rate else float("inf")
            print(f"torch seed {seed}: step {step}/{recipe['steps']}, {rate:.2f} steps/s, "
                  f"ETA {eta / 60:.0f} min, mlm_loss {record['mlm_loss']:.3f}, disc_loss "
                  f"{record['disc_loss']:.4f}, disc_auc {record['disc_auc']:.3f}", flush=True)
    files.write_text(folder / "done", f"{step}\n")


def _copy_electra_tf_init(nets, config, seed: int) -> None:
    """The reference starts from the weights electra-pretrain --seed=SEED starts from (built as
    `training.loop` builds them), copied by the Hugging Face converter (a diagnostic:
    `--reference_init=electra_tf`)."""
    import keras
    import torch

    from electra_tf.convert.hf import hf_tensors
    from electra_tf.models.pretrainer import ElectraPretrainer

    keras.utils.set_random_seed(seed)
    model = ElectraPretrainer(config, seed=seed)
    for ours, theirs in ((model.generator, nets.generator), (model.discriminator, nets.discriminator)):
        tensors, _, _ = hf_tensors(ours)
        theirs.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)


def _electra_tf_draws(config, features, seed: int, step: int):
    """The masks and Gumbel uniforms electra_tf draws at this step of run SEED (a diagnostic:
    `--reference_draws=electra_tf`; the masking of `ElectraPretrainer._mask` and the noise of
    `masking.sample_replacements` under one device)."""
    import tensorflow as tf
    import torch

    from benchmarks import torch_electra
    from electra_tf.models import masking

    ids = features["input_ids"]
    step_seed = tf.constant([seed, step], tf.int64)
    n = config.num_masked_slots(ids.shape[1])
    batch = masking.mask_tokens(
        ids, features["input_mask"], step_seed, mask_prob=config.mask_prob, num_slots=n,
        mask_token_id=config.mask_token_id,
        special_ids=(config.cls_token_id, config.sep_token_id, config.mask_token_id))
    uniform = tf.random.stateless_uniform([ids.shape[0], n, config.vocab_size], seed=step_seed)
    shown = tf.gather(batch.masked_input_ids, batch.positions, batch_dims=1) == config.mask_token_id
    return torch_electra.Draws(torch.from_numpy(batch.positions.numpy().astype("int64")),
                               torch.from_numpy(batch.weights.numpy()),
                               torch.from_numpy(shown.numpy()), torch.from_numpy(uniform.numpy()))


def torch_curve(folder: Path) -> dict[int, dict]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out[record["step"]] = {m: record[m] for m in METRICS}
    return out


def curve(output_dir, side: str, seed: int) -> dict[int, dict]:
    folder = run_dir(output_dir, side, seed)
    return electra_tf_curve(folder) if side == "electra_tf" else torch_curve(folder)


def finished(output_dir, side: str, seed: int, steps: int) -> bool:
    folder = run_dir(output_dir, side, seed)
    if side == "torch":
        return (folder / "done").exists()
    return (folder / "discriminator").is_dir() and max(curve(output_dir, side, seed), default=0) >= steps


# --- the commands --------------------------------------------------------------------------------
def run(args) -> None:
    recipe = _recipe(args)
    if not glob.glob(args.data):
        raise Failure(f"--data: no file matches {args.data}")
    if not os.path.isfile(args.vocab_file):
        raise Failure(f"--vocab_file: no such file: {args.vocab_file}")
    if recipe["steps"] % recipe["interval"]:
        raise Failure(f"--steps ({recipe['steps']}) must be a multiple of --interval "
                      f"({recipe['interval']})")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipe_file = out / "recipe.json"
    recorded = json.loads(recipe_file.read_text()) if recipe_file.exists() else None
    mine = {**recipe, "overrides": list(recipe["overrides"]), "data": args.data,
            "vocab_file": os.path.abspath(args.vocab_file)}
    if recorded is not None and recorded != mine:
        differ = sorted(k for k in set(recorded) | set(mine) if recorded.get(k) != mine.get(k))
        raise Failure(f"{out} holds runs of another recipe (differs in {', '.join(differ)}): "
                      "use another --output_dir")
    # Atomic: two `run` commands started together (one side each) read it while it is written.
    files.write_text(recipe_file, json.dumps(mine, indent=1) + "\n")
    seeds = [args.seed] if args.seed is not None else range(args.seeds)
    sides = [args.only] if args.only else SIDES
    pending = []
    for seed in seeds:
        for side in sides:
            if finished(out, side, seed, recipe["steps"]):
                print(f"{side} seed {seed}: complete", flush=True)
            else:
                pending.append((side, seed))
    _train_all(args, recipe, pending)


def _command(args, recipe: dict, side: str, seed: int) -> list[str]:
    if side == "electra_tf":
        return electra_tf_command(args, recipe, seed)
    return [sys.executable, "-m", "benchmarks.parity_curves", "torch_worker", f"--data={args.data}",
            f"--vocab_file={args.vocab_file}", f"--output_dir={args.output_dir}",
            f"--steps={args.steps}", f"--seed={seed}", f"--interval={args.interval}",
            f"--threads={args.threads}", f"--config={recipe['config']}",
            f"--train_batch_size={recipe['batch']}", f"--max_seq_length={recipe['seq']}",
            f"--reference_draws={args.reference_draws}", f"--reference_init={args.reference_init}",
            *[f"--override={o}" for o in args.override or ()]]


_STEP_IN_LOG = re.compile(rb"step (\d+)/(\d+)")


def _logged_step(log: Path, since: int = 0, default: int = 0) -> int:
    """The last "step N/M" a run's log shows after byte `since` (both sides print them; a resumed
    run appends to the log of the run it resumes, whose last steps may be past the checkpoint it
    resumes from), `default` before the first."""
    try:
        with open(log, "rb") as f:
            f.seek(max(since, f.seek(0, 2) - 20000))
            found = _STEP_IN_LOG.findall(f.read())
    except OSError:
        return default
    return int(found[-1][0]) if found else default


def _saved_step(side: str, folder: Path) -> int:
    """The step a run resumes from: its newest checkpoint (the reference saves at each interval)."""
    if side == "torch":
        try:
            return int((folder / "checkpoint_step").read_text())
        except (OSError, ValueError):
            return max(torch_curve(folder), default=0)
    prefixes = run_folder.checkpoint_prefixes(folder)  # newest first
    return int(prefixes[0].rsplit("-", 1)[1]) if prefixes else 0


def _train_all(args, recipe: dict, pending: list[tuple[str, int]]) -> None:
    """Runs `pending` (side, seed) runs, `--workers` at a time, each in its own process with its
    output in RUN_DIR/log.txt; prints the steps done, the rate and the ETA every minute."""
    total = recipe["steps"]
    env = dict(os.environ)
    if args.threads:  # TensorFlow's own variables: the binary has no thread flags
        env.update(TF_NUM_INTRAOP_THREADS=str(args.threads), TF_NUM_INTEROP_THREADS="1")
    running: dict = {}  # Popen -> (side, seed, log, step at start, log size at start)
    failed = []
    start, done_before, last_report = time.time(), 0, 0.0
    try:
        while pending or running:
            while pending and len(running) < args.workers and not failed:
                side, seed = pending.pop(0)
                folder = run_dir(args.output_dir, side, seed)
                folder.mkdir(parents=True, exist_ok=True)
                log = folder / "log.txt"
                first = _saved_step(side, folder)
                print(f"{side} seed {seed}: training from step {first} to {total} (log: {log})",
                      flush=True)
                with open(log, "ab") as f:
                    since = f.seek(0, 2)
                    process = subprocess.Popen(_command(args, recipe, side, seed), cwd=REPO,
                                               env=env, stdout=f, stderr=subprocess.STDOUT)
                running[process] = (side, seed, log, first, since)
            time.sleep(1)
            for process in [p for p in running if p.poll() is not None]:
                side, seed, log, first, since = running.pop(process)
                done_before += max(0, _logged_step(log, since, first) - first)
                if process.returncode:
                    failed.append(f"{side} seed {seed} (exit code {process.returncode}, see {log})")
                elif finished(args.output_dir, side, seed, total):
                    print(f"{side} seed {seed}: done", flush=True)
                else:  # stopped by a SIGTERM of its own (each saves where it stopped)
                    failed.append(f"{side} seed {seed} stopped at step "
                                  f"{_logged_step(log, since, first)}")
            if time.time() - last_report >= args.report_seconds and running:
                last_report = time.time()
                steps = done_before + sum(max(0, _logged_step(log, since, first) - first)
                                          for _, _, log, first, since in running.values())
                left = sum(total - _logged_step(log, since, first)
                           for _, _, log, first, since in running.values())
                left += sum(total - _saved_step(side, run_dir(args.output_dir, side, seed))
                            for side, seed in pending)
                rate = steps / (time.time() - start)
                eta = f"about {left / rate / 60:.0f} min left" if rate else "ETA after the first steps"
                now = ", ".join(f"{side} seed {seed} at {_logged_step(log, since, first)}"
                                for side, seed, log, first, since in running.values())
                print(f"{now}; {rate:.2f} steps/s in all, {eta}", flush=True)
    except KeyboardInterrupt:
        for process in running:  # electra-pretrain saves a checkpoint on SIGTERM
            process.terminate()
        for process in running:
            process.wait()
        raise
    if failed:
        raise Failure(f"{'; '.join(failed)}; rerun the same command to resume")


# --- held-out text: both sides' latest models, evaluated by one piece of code -------------------
def _pretrainer_of(output_dir, side: str, seed: int, config):
    """(electra_tf ElectraPretrainer with the run's latest weights, its step), or None. The
    reference's weights cross through the Hugging Face converter (`convert.hf.load_hf`)."""
    import numpy as np

    from electra_tf.models.pretrainer import ElectraPretrainer

    folder = run_dir(output_dir, side, seed)
    step = _saved_step(side, folder)
    if not step:
        return None
    model = ElectraPretrainer(config, seed=seed)
    if side == "electra_tf":
        prefix = run_folder.checkpoint_prefix(folder, step)
        run_folder.model_checkpoint(model).restore(prefix).expect_partial()
        return model, step
    import torch

    from benchmarks import torch_electra
    from electra_tf.convert.hf import load_hf

    state = torch.load(folder / "checkpoint.pt", weights_only=False)
    nets = torch_electra.build_networks(config)
    with torch.no_grad():
        for name, p in nets.parameters.items():
            p.copy_(state["parameters"][name])
    for ours, theirs in ((model.generator, nets.generator), (model.discriminator, nets.discriminator)):
        load_hf(ours, {k: np.asarray(v.detach().numpy()) for k, v in theirs.state_dict().items()},
                source=f"{folder}")
    return model, int(state["optimizer"]["step"])


def evaluate(args) -> str:
    """Every run's latest model on `--eval_data`: the same batches, masks and Gumbel noise for
    every model (seeded by the batch index), dropout off; metrics as the curves'."""
    import keras
    import tensorflow as tf

    from electra_tf.data import pipeline

    recipe_file = Path(args.output_dir) / "recipe.json"
    if not recipe_file.exists():
        raise Failure(f"{args.output_dir}: no recipe.json (not a folder `run` wrote)")
    recipe = json.loads(recipe_file.read_text())
    if not glob.glob(args.eval_data):
        raise Failure(f"--eval_data: no file matches {args.eval_data}")
    config = model_config(recipe["vocab_file"], recipe)
    data = pipeline.pretraining_dataset(args.eval_data, recipe["batch"], recipe["seq"],
                                        is_training=False).take(args.eval_batches)
    batches = list(data)
    results = {side: {} for side in SIDES}
    for folder in sorted(Path(args.output_dir).glob("*-seed*")):
        side, seed = folder.name.rsplit("-seed", 1)
        loaded = _pretrainer_of(args.output_dir, side, int(seed), config) if side in results else None
        if loaded is None:
            continue
        model, step = loaded
        compute = tf.function(lambda f, s: model.compute_objective(f, s, training=False))
        auc = keras.metrics.AUC(num_thresholds=200)
        sums = dict.fromkeys(("mlm_loss", "mlm_accuracy", "disc_loss"), 0.0)
        for i, features in enumerate(batches):
            out = compute(features, tf.constant([20_261_128, i], tf.int64))
            for name in sums:
                sums[name] += float(out[name])
            auc.update_state(out["replaced_token_labels"], tf.sigmoid(out["rtd_logits"]),
                             sample_weight=out["disc_weights"])
        results[side][int(seed)] = dict(step=step, disc_auc=float(auc.result()),
                                        **{k: v / len(batches) for k, v in sums.items()})
    if not results["electra_tf"] or not results["torch"]:
        raise Failure(f"{args.output_dir}: need a saved model of each side")
    lines = [f"held-out: {len(batches)} batches of {args.eval_data}, the latest model of each run", ""]
    for side in SIDES:
        for seed, r in sorted(results[side].items()):
            lines.append(f"  {side} seed {seed} (step {r['step']}): " + ", ".join(
                f"{m} {r[m]:.4f}" for m in METRICS))
    lines.append("")
    for metric in METRICS:
        (m1, s1), (m2, s2) = (_summary([r[metric] for r in results[side].values()]) for side in SIDES)
        paired = [results["electra_tf"][s][metric] - results["torch"][s][metric]
                  for s in results["electra_tf"] if s in results["torch"]]
        line = f"{metric}: electra_tf {m1:.4f} ± {s1:.4f}, torch {m2:.4f} ± {s2:.4f}"
        if len(paired) > 1:
            mean, sd = _summary(paired)
            line += f"; paired by seed {mean:+.4f} ± {sd / math.sqrt(len(paired)):.4f} (se)"
        lines.append(line)
    return "\n".join(lines)


def _summary(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def collect(output_dir) -> tuple[dict, list[int]]:
    """{side: {seed: curve}} of every run found, and the steps every run has."""
    curves = {side: {} for side in SIDES}
    for folder in sorted(Path(output_dir).glob("*-seed*")):
        side, seed = folder.name.rsplit("-seed", 1)
        if side in curves:
            c = curve(output_dir, side, int(seed))
            if c:
                curves[side][int(seed)] = c
    if not curves["electra_tf"] or not curves["torch"]:
        raise Failure(f"{output_dir}: need runs of both sides (found "
                      f"{ {s: sorted(c) for s, c in curves.items()} })")
    common = set.intersection(*(set(c) for side in curves.values() for c in side.values()))
    return curves, sorted(common)


def report(args) -> str:
    curves, steps = collect(args.output_dir)
    if not steps:
        raise Failure(f"{args.output_dir}: the runs have no interval in common yet")
    seeds = {side: sorted(c) for side, c in curves.items()}
    lines = [f"seeds: electra_tf {seeds['electra_tf']}, torch {seeds['torch']}; steps with every "
             f"run: {steps[0]}..{steps[-1]}", ""]
    head = ["step", "metric", "electra_tf mean ± sd", "torch mean ± sd", "torch range", "inside"]
    rows = []
    for step in steps:
        if args.every and step % args.every and step != steps[-1]:
            continue  # a shorter table; the counts and the last quarter below use every interval
        for metric in METRICS:
            ours = [curves["electra_tf"][s][step][metric] for s in seeds["electra_tf"]]
            theirs = [curves["torch"][s][step][metric] for s in seeds["torch"]]
            (m1, s1), (m2, s2) = _summary(ours), _summary(theirs)
            inside = min(theirs) <= m1 <= max(theirs)
            rows.append([str(step), metric, f"{m1:.4f} ± {s1:.4f}", f"{m2:.4f} ± {s2:.4f}",
                         f"{min(theirs):.4f}..{max(theirs):.4f}", "yes" if inside else "no"])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]

    def fmt(r):
        cells = [c.ljust(w) for c, w in zip(r, widths)]
        return (f"| {' | '.join(cells)} |" if args.markdown else "  ".join(cells)).rstrip()

    lines.append(fmt(head))
    if args.markdown:
        lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += [fmt(r) for r in rows]
    inside = {m: sum(min(curves["torch"][s][t][m] for s in seeds["torch"])
                     <= statistics.fmean(curves["electra_tf"][s][t][m] for s in seeds["electra_tf"])
                     <= max(curves["torch"][s][t][m] for s in seeds["torch"]) for t in steps)
              for m in METRICS}
    lines += ["", f"intervals where electra_tf's mean lies in the reference's range (of {len(steps)}): "
              + ", ".join(f"{m} {inside[m]}" for m in METRICS)]
    # The last quarter: each run's mean over those intervals, then the two sides' difference.
    tail = [s for s in steps if s > steps[-1] * 3 / 4] or steps[-1:]
    lines.append(f"last quarter (steps {tail[0]}..{tail[-1]}), per-run means averaged over seeds:")
    for metric in METRICS:
        per_run = {side: [statistics.fmean(curves[side][s][t][metric] for t in tail)
                          for s in seeds[side]] for side in SIDES}
        (m1, s1), (m2, s2) = _summary(per_run["electra_tf"]), _summary(per_run["torch"])
        se = math.sqrt(s1 ** 2 / len(per_run["electra_tf"]) + s2 ** 2 / len(per_run["torch"]))
        line = (f"  {metric}: electra_tf {m1:.4f} ± {s1:.4f}, torch {m2:.4f} ± {s2:.4f}, "
                f"difference {m1 - m2:+.4f} (standard error {se:.4f}"
                + (f", {abs(m1 - m2) / se:.1f} se)" if se else ")"))
        # Same seed, same input order: the paired differences remove the data's share of the noise.
        paired = [statistics.fmean(curves["electra_tf"][s][t][metric] - curves["torch"][s][t][metric]
                                   for t in tail) for s in seeds["electra_tf"] if s in seeds["torch"]]
        if len(paired) > 1:
            mean, sd = _summary(paired)
            line += f"; paired by seed {mean:+.4f} ± {sd / math.sqrt(len(paired)):.4f} (se)"
        lines.append(line)
    if args.chart:
        chart(curves, seeds, args.chart)
        lines.append(f"chart: {args.chart}")
    return "\n".join(lines)


def chart(curves, seeds, path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise Failure("--chart needs matplotlib: pip install -e '.[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    colours = {"electra_tf": "tab:blue", "torch": "tab:orange"}
    labels = {"electra_tf": "electra_tf", "torch": "PyTorch reference"}
    for ax, metric in zip(axes.flat, METRICS):
        for side in SIDES:
            steps = sorted(set.intersection(*(set(curves[side][s]) for s in seeds[side])))
            values = [[curves[side][s][t][metric] for s in seeds[side]] for t in steps]
            ax.plot(steps, [statistics.fmean(v) for v in values], color=colours[side],
                    label=f"{labels[side]} (mean of {len(seeds[side])} seeds)")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values],
                            color=colours[side], alpha=0.2)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Pretraining curves, demo recipe (band: min..max over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.parity_curves", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("run", "torch_worker"):
        s = sub.add_parser(name)
        s.add_argument("--data", required=True, help="glob of the pretraining shards")
        s.add_argument("--vocab_file", required=True)
        s.add_argument("--output_dir", required=True)
        s.add_argument("--steps", type=int, default=12000)
        s.add_argument("--interval", type=int, default=400, help="steps per measured interval")
        s.add_argument("--seeds", type=int, default=3)
        s.add_argument("--seed", type=int, default=None, help="only this seed")
        s.add_argument("--only", choices=SIDES, default=None, help="only this side")
        s.add_argument("--threads", type=int, default=0, help="threads of each run's process "
                       "(0: all cores)")
        s.add_argument("--workers", type=int, default=1, help="runs trained at once")
        s.add_argument("--report_seconds", type=float, default=60.0, help="progress line interval")
        s.add_argument("--override", action="append", help="key=value of the model config, "
                       "after the recipe's")
        s.add_argument("--config", default=None, help="model config (default: the demo's)")
        s.add_argument("--train_batch_size", type=int, default=None, help="default: 32")
        s.add_argument("--max_seq_length", type=int, default=None, help="the shards' (64)")
        s.add_argument("--reference_draws", choices=("authors", "electra_tf"), default="authors",
                       help="diagnostic: the reference masks and samples with electra_tf's draws")
        s.add_argument("--reference_init", choices=("authors", "electra_tf"), default="authors",
                       help="diagnostic: the reference starts from electra_tf's initial weights")
    s = sub.add_parser("evaluate")
    s.add_argument("--output_dir", required=True)
    s.add_argument("--eval_data", required=True, help="glob of held-out shards (the recipe's length)")
    s.add_argument("--eval_batches", type=int, default=50)
    s = sub.add_parser("report")
    s.add_argument("--output_dir", required=True)
    s.add_argument("--chart", default=None, help="PNG file for the chart")
    s.add_argument("--markdown", action="store_true", help="the table as Markdown")
    s.add_argument("--every", type=int, default=0,
                   help="table rows only at steps that are multiples of this (and the last)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "run":
            run(args)
        elif args.command == "torch_worker":
            torch_worker(args, _recipe(args), args.seed)
        elif args.command == "evaluate":
            print(evaluate(args))
        else:
            print(report(args))
    except Failure as e:
        print(f"parity_curves: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("parity_curves: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
