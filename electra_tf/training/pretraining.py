"""The pretraining loop: `run_pretraining` of a `PretrainingConfig` (`training/config.py`).

One loop a reader can follow:

  strategy.scope(): ElectraPretrainer + create_optimizer (+ LossScaleOptimizer for float16)
  input:  strategy.distribute_datasets_from_function(pipeline.dataset_fn(..., start_step=step))
  step:   one tf.function runs `steps_per_loop` x strategy.run(train_step) (the replica step
          optionally XLA-compiled; with gradient_accumulation_steps=N it sums the gradients of N
          micro-batches into one update, `accumulated_step`), and returns the global losses,
          token counts, float16 loss-scale skips and whether any worker asked to stop
  after each loop: NaN/Inf check, summaries, a log line, checkpoint, SIGTERM check.

Every count is of optimizer steps (`optimizer.iterations`): the schedule, checkpoints, summaries,
resume and num_train_steps, whatever the number of micro-batches per step.

Continued pretraining: `init` (a `run_setup.InitialWeights`: a TF1 release, a Hugging Face
pair, an electra_tf folder) is copied into the freshly built model when model_dir has no
checkpoint yet; the optimizer starts at step 0. A model_dir with checkpoints resumes from them and
the log says that `init` is ignored.

Resuming exactly. The step is `optimizer.iterations` (checkpointed). Everything random is a
function of (seed, step) or is checkpointed: masks and generator samples are keyed by
`ElectraPretrainer.step_seed()`, dropout draws from Keras seed-generator states that are model
variables, and the input position is DERIVED from the step: the example stream of every input
pipeline is a deterministic function of (files, seed), and a run that starts at step s starts
that stream at example s * global_batch / num_pipelines (`pipeline.pretraining_dataset`'s
`start_step`: it reads at most one epoch of raw records to get there). Nothing about the input is
stored in the checkpoint, so it stays valid if the input files move.

Checkpoints (`tf.train.CheckpointManager` in `model_dir`, prefix `ckpt`) hold every model
variable (see `model_checkpoint`) and the optimizer; they are written at loop boundaries when a
multiple of `save_checkpoints_steps` was passed, at the end, and when SIGTERM arrives (the run
then stops at the next loop boundary and `run_pretraining` returns normally with
`preempted=True`; the binary exits 0). A non-finite loss raises `NonFiniteLossError` naming the
first bad step; nothing is saved after it, so the latest checkpoint is the last good state.

Before anything is written, in this order (each failure is one `USER_ERRORS` line and leaves
`model_dir` as it was):
  1. the run folder: a `model_dir` with checkpoints resumes only the run recorded in its
     `pretraining_config.json` (`check_run_folder`: the model config and the PretrainingConfig
     must match, except `RESUME_FREE_FIELDS`, and `RESUME_ON_REQUEST_FIELDS` named in
     `allow_changes`);
  2. the shards: every record of every shard is read once (`pipeline.check_shards`: framing,
     both CRCs, each record a pretraining example at max_seq_length). With `skip_corrupt`, a
     damaged shard is read up to its first damaged record and the records skipped are logged and
     summarised (`data/corrupt_records_skipped`);
  3. the checkpoint: the newest one that reads back is restored (`restore_newest_readable`); a
     damaged one (cut, or a checksum mismatch) is named in a warning, left in place, and the one
     before it is used. Only then is the config JSON (re)written.
A shard damaged while the run reads it (or with the check off) stops the run with one line naming
it, after a checkpoint of the steps done so far (`_save_after_input_error`).

Multi-worker: every worker runs the same loop (collectives need all of them); the chief writes
checkpoints, summaries, the config JSON and the exported discriminator; other workers write
checkpoints to a temporary folder that is deleted (the MultiWorkerMirroredStrategy pattern).
The stop request (SIGTERM) is max-reduced across workers inside the step function, so every
worker stops at the same loop boundary.

Files in `model_dir`: `pretraining_config.json` (flags, model config, pretraining config, and
from `run_setup`: the shards' manifest, their casing `lower_case`, the vocabulary's sha256 and
the initial checkpoint), `ckpt-*` checkpoints, `train/` TensorBoard events (with
`loss_scale/skipped_steps` and `loss_scale/scale` under float16), `discriminator/` (our format,
loadable by `from_pretrained` and fine-tuning).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import keras
import tensorflow as tf
from absl import logging

from electra_tf import files
from electra_tf.run_folder import (
    CHECKPOINT_PREFIX, DISCRIMINATOR_FOLDER, RECORD_FILE, RunFolderError, checkpoint_prefixes,
    kept_facts, model_checkpoint, read_record, restore_newest_readable, write_record)
from electra_tf.config import ConfigError, ElectraConfig
from electra_tf.convert.pretrained import save_electra_checkpoint
from electra_tf.data import pipeline
from electra_tf.models.pretrainer import ElectraPretrainer
from electra_tf.training import optimizer as optimizer_lib, summaries
from electra_tf.training.config import (
    MIXED_PRECISION, RESUME_FREE_FIELDS, RESUME_ON_REQUEST_FIELDS, PretrainingConfig,
    PretrainingConfigError)
from electra_tf.progress import ProgressLogger
from electra_tf.training.strategy import is_chief

class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or Inf; the message names the step."""


# Errors whose message is the whole story (it names the file or field): the binary prints them as
# one line, without a traceback.
USER_ERRORS = (ConfigError, RunFolderError, pipeline.CorruptShardError, FileNotFoundError,
               NonFiniteLossError)

# --- the step -----------------------------------------------------------------------------------
def _innermost(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def track_gradient_norm(optimizer, metric: keras.metrics.Metric) -> None:
    """Makes `optimizer` record the global norm of the replica-summed gradient in `metric`.

    The norm of interest is that of the gradient the optimizer applies: after the all-reduce
    (each replica holds a share) and, with loss scaling, after unscaling. Keras computes it in
    `_all_reduce_sum_gradients` (a private hook of Keras 3's TensorFlow optimizer, also used by
    our `AdamWeightDecay` and `Lamb`), so that method is wrapped on this instance: no extra
    all-reduce. Before clipping, as the original's summaries.
    """
    inner = _innermost(optimizer)
    original = inner._all_reduce_sum_gradients

    def all_reduce_and_record(grads_and_vars):
        grads_and_vars = original(grads_and_vars)
        grads = [g for g, _ in grads_and_vars if g is not None]
        metric.update_state(tf.linalg.global_norm(grads))
        return grads_and_vars

    inner._all_reduce_sum_gradients = all_reduce_and_record


def _apply(model: ElectraPretrainer, gradients, variables):
    """optimizer.apply; returns 1 when the float16 loss scale skipped the step (non-finite
    gradients: the scale halves, nothing is updated and the step is not counted), else 0."""
    before = tf.identity(model.optimizer.iterations)
    model.optimizer.apply(gradients, variables)
    if not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.constant(0, tf.int64)
    return tf.cast(tf.equal(model.optimizer.iterations, before), tf.int64)


def pretraining_step(model: ElectraPretrainer, features) -> dict:
    """`ElectraPretrainer.train_step` for our loop: one replica's step, returns its loss share,
    its count of real tokens (for tokens/s) and whether the loss scale skipped the step. Metrics
    are updated as the model does."""
    with tf.GradientTape() as tape:
        out = model.compute_objective(features, model.step_seed(), training=True)
        scaled_loss = model.optimizer.scale_loss(out["loss"])
    variables = model.trainable_variables
    skipped = _apply(model, tape.gradient(scaled_loss, variables), variables)
    model.update_metrics(out)
    return {"loss": out["loss"], "skipped": skipped,
            "tokens": tf.reduce_sum(tf.cast(features["input_mask"], tf.int64))}


def gradient_sums(model: ElectraPretrainer, strategy) -> list[tf.Variable]:
    """One zero variable per trainable variable, for `accumulated_step` to sum gradients in.

    Each replica sums its own (ON_READ: replica-local copies; the optimizer all-reduces the sums
    once). Not part of the checkpoint: they are zeroed at the start of every step. Variables,
    not while-loop tensors: Grappler's arithmetic optimizer rewrites a loop-carried `acc + g`
    into an AccumulateNV2 whose temporary variable collides across the iterations of the outer
    `steps_per_loop` loop (AlreadyExistsError, TF 2.21).
    """
    with strategy.scope():
        return [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                            name=f"gradient_sum_{i}",
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for i, v in enumerate(model.trainable_variables)]


def accumulated_step(model: ElectraPretrainer, features, num_micro_batches: int,
                     sums: list[tf.Variable]) -> dict:
    """`pretraining_step` over `num_micro_batches` slices of the replica's batch, one optimizer
    update: the update of the whole batch, with the memory of one slice.

    The losses are means over the GLOBAL batch's live masked slots (MLM) and real tokens (RTD),
    so the slices cannot be averaged as means (their counts differ). Instead the whole batch's
    counts are computed first (`loss_totals`: masking alone, one all-reduce) and every slice's
    loss is normalised by them (`compute_objective(totals=...)`): the slices' losses, and so
    their gradients, add up to the whole batch's. Masks are keyed per example (models/
    masking.py), so a slice masks its examples exactly as the whole batch would. Generator
    samples fold the slice index into the seed, as replicas fold theirs.

    The summed gradient (in `sums`, from `gradient_sums`) goes to the optimizer once: all-reduced
    once, clipped once to the global norm (as the authors' optimizer clips the whole batch's
    gradient), one step counted. The slices run one after another (`parallel_iterations=1`), so
    only one is in memory.
    """
    n = num_micro_batches
    seed = model.step_seed()
    totals = model.loss_totals(features, seed)  # [2]: the whole batch's global counts
    slices = {k: tf.reshape(v, [n, -1, *v.shape[1:]]) for k, v in features.items()}
    variables = model.trainable_variables
    # A Mean metric updated with each slice's share x n averages to the step's value.
    scalar_terms = ("loss", *model.step_metrics)

    def one_slice(i, loss):
        part = {k: tf.gather(v, i) for k, v in slices.items()}
        with tf.GradientTape() as tape:
            out = model.compute_objective(part, seed, training=True, totals=totals,
                                          micro_batch=i)
            scaled_loss = model.optimizer.scale_loss(out["loss"])
        for total, g in zip(sums, tape.gradient(scaled_loss, variables)):
            if g is not None:
                total.assign_add(tf.convert_to_tensor(g))
        model.update_metrics({**out, **{name: out[name] * n for name in scalar_terms}})
        return i + 1, loss + out["loss"]

    for total in sums:
        total.assign(tf.zeros_like(total))
    _, loss = tf.while_loop(lambda i, _: i < n, one_slice, (tf.constant(0), tf.constant(0.0)),
                            parallel_iterations=1)
    # read_value(): a tensor placed on the replica's device (under MultiWorkerMirroredStrategy a
    # plain conversion has none, and the gradient all-reduce then finds no destination).
    skipped = _apply(model, [total.read_value() for total in sums], variables)
    return {"loss": loss, "skipped": skipped,
            "tokens": tf.reduce_sum(tf.cast(features["input_mask"], tf.int64))}


def make_loop_fn(model, strategy, jit_compile: bool = False, accumulation_steps: int = 1):
    """`loop(iterator, num_steps, stop_flag)`: `num_steps` train steps in one tf.function.

    Each step is `pretraining_step`, or `accumulated_step` over `accumulation_steps` micro-
    batches. Returns (global loss of the last step, first step (1-based optimizer step) whose
    loss was not finite or -1, real tokens processed, steps the float16 loss scale skipped,
    whether any worker set `stop_flag`). The loop breaks at the first non-finite loss so the bad
    update is the last one.
    """
    if accumulation_steps > 1:
        sums = gradient_sums(model, strategy)

        def step(features):
            return accumulated_step(model, features, accumulation_steps, sums)
    else:
        def step(features):
            return pretraining_step(model, features)
    replica_step = tf.function(step, jit_compile=jit_compile, reduce_retracing=True)

    @tf.function
    def loop(iterator, num_steps, stop_flag):
        loss = tf.constant(0.0)
        bad_step = tf.constant(-1, tf.int64)
        tokens = tf.constant(0, tf.int64)
        skipped = tf.constant(0, tf.int64)
        for _ in tf.range(num_steps):
            out = strategy.run(replica_step, args=(next(iterator),))
            loss = strategy.reduce("SUM", out["loss"], axis=None)
            tokens += strategy.reduce("SUM", out["tokens"], axis=None)
            # Every replica sees the same decision: count it once.
            skipped += tf.minimum(strategy.reduce("SUM", out["skipped"], axis=None), 1)
            if not tf.math.is_finite(loss):
                bad_step = tf.cast(model.optimizer.iterations, tf.int64)
                break
        stop = strategy.reduce(
            "SUM", strategy.run(lambda: tf.cast(stop_flag, tf.int32)), axis=None)
        return loss, bad_step, tokens, skipped, stop > 0

    return loop


# --- checkpoints and export ---------------------------------------------------------------------
def _write_dir(model_dir: str, strategy) -> str:
    """Where this worker writes: model_dir for the chief, a temporary folder for the others."""
    if is_chief(strategy):
        return model_dir
    return tempfile.mkdtemp(prefix="electra_worker_")


def export_discriminator(model: ElectraPretrainer, folder, vocab_file=None) -> str:
    """Saves the discriminator alone, in the format `from_pretrained` and fine-tuning load."""
    return save_electra_checkpoint(model.discriminator, model.config, folder,
                                   vocab_file=vocab_file)


# --- the run folder: resuming only the same run, from a checkpoint that reads back ----------------
def check_run_folder(model_dir, model_config: ElectraConfig, config: PretrainingConfig,
                     allow_changes=()) -> dict:
    """Refuses to resume a model_dir that holds another run; reads only.

    A folder with checkpoints resumes only the run recorded in its pretraining_config.json: the
    same model config, and the same PretrainingConfig except `RESUME_FREE_FIELDS` and the
    `RESUME_ON_REQUEST_FIELDS` named in `allow_changes`. Fields missing from an older record take
    their defaults. A folder without checkpoints holds nothing to resume: any run may use it. An
    unreadable record is a warning (the restore still checks that the checkpoint fits the model).

    Returns {field: (recorded, requested)} for the fields that differ and may. Raises
    RunFolderError naming the folder and every refused field, recorded and requested values.
    """
    for name in allow_changes:
        if name not in RESUME_ON_REQUEST_FIELDS:
            raise PretrainingConfigError(
                f"--allow_config_change={name}: only {', '.join(RESUME_ON_REQUEST_FIELDS)} may "
                "change when a run resumes")
    path = os.path.join(str(model_dir), RECORD_FILE)
    if not checkpoint_prefixes(model_dir) or not tf.io.gfile.exists(path):
        return {}
    try:
        saved = read_record(model_dir)
        recorded = {**ElectraConfig().to_dict(), **saved["model_config"]}
        recorded_run = {**PretrainingConfig().to_dict(), **saved["pretraining_config"]}
    except (ValueError, KeyError, TypeError) as e:
        logging.warning("%s is unreadable (%s): resuming without comparing configs", path, e)
        return {}
    refused, allowed = [], {}
    for name, value in model_config.to_dict().items():
        if recorded.get(name) != value:
            refused.append((name, recorded.get(name), value))
    for name, value in config.to_dict().items():
        if recorded_run.get(name) == value:
            continue
        if name in RESUME_FREE_FIELDS or name in allow_changes:
            allowed[name] = (recorded_run.get(name), value)
        else:
            refused.append((name, recorded_run.get(name), value))
    if refused:
        was = ", ".join(f"{name}={old!r}" for name, old, _ in refused)
        now = ", ".join(f"{name}={new!r}" for name, _, new in refused)
        message = (f"model_dir {model_dir} holds a run with {was}, this run asks for {now}; use "
                   "another --model_dir or the same flags")
        if all(name in RESUME_ON_REQUEST_FIELDS for name, _, _ in refused):
            names = [name for name, _, _ in refused]
            message += (f" (or --allow_config_change={','.join(names)} to change "
                        f"{'it' if len(names) == 1 else 'them'} on purpose)")
        raise RunFolderError(message)
    return allowed


# --- SIGTERM ------------------------------------------------------------------------------------
class _StopRequest:
    """Sets a flag on SIGTERM (main thread only); restores the previous handler on exit."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        logging.warning("SIGTERM: saving a checkpoint at the end of the current loop")
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


# --- the loop -----------------------------------------------------------------------------------
class PretrainingResult(NamedTuple):
    model: ElectraPretrainer  # the trained pretrainer (its optimizer attached)
    step: int
    preempted: bool
    metrics: dict
    checkpoint: str | None
    discriminator_dir: str | None


def _build(model_config, config: PretrainingConfig, strategy):
    with strategy.scope():
        model = ElectraPretrainer(model_config, seed=config.seed)
        opt = optimizer_lib.create_optimizer(
            config.optimizer, config.learning_rate, config.num_train_steps,
            config.num_warmup_steps, weight_decay=config.weight_decay,
            clip_norm=config.clip_norm or None, beta_2=config.adam_beta_2)
        if config.mixed_precision == "float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        model.optimizer = opt
        grad_norm = keras.metrics.Mean(name="gradient_norm")
        track_gradient_norm(opt, grad_norm)
        opt.build(model.trainable_variables)
    return model, opt, grad_norm


def collapse_warning(metrics: dict, step: int, config: PretrainingConfig,
                     objective: str = "electra") -> str | None:
    """A message when the discriminator is no better than chance well after the warmup.

    The usual cause is a learning rate too high for the warmup: every token's final hidden
    state collapses to one vector and the head predicts the base rate (AUC 0.5); fine-tuning
    from such an encoder learns nothing. Short runs are prone to it (see `adam_beta_2`).

    Not for Electric: its classifier's logit adds the generator's log q of the token present
    (the authors' run_pretraining.py), so its AUC measures the generator's calibration as much
    as the energy. While the cloze generator is under-confident, real tokens have a higher q
    than its own samples, and a healthy Electric run sits at or below 0.5 for thousands of
    steps (0.42 after 1,200 steps of a run whose scores rank 91.7% of held-out sentences above their shuffles).
    """
    auc = metrics.get("disc_auc")
    if auc is None or objective == "electric" or step < max(2 * config.num_warmup_steps, 100) or abs(auc - 0.5) > 0.01:
        return None
    return (f"step {step}: discriminator AUC {auc:.3f} = chance. Its token representations "
            f"have probably collapsed (learning rate {config.learning_rate:g} too high for "
            f"{config.num_warmup_steps} warmup steps); fine-tuning from it will not learn. "
            "Lower the learning rate, lengthen the warmup, or for a short run set "
            "adam_beta_2=0.98.")


def _learning_rate(opt) -> float:
    inner = _innermost(opt)
    lr = inner._learning_rate
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return float(lr(inner.iterations))
    return float(lr)


# The message of the pipeline's reader (`pipeline._checked_records`) when a shard ends short of
# its size.
_DAMAGED_SHARD = re.compile(r"corrupt or truncated TFRecord shard (.+?): read (\d+) of (\d+) bytes")


def _save_after_input_error(manager, opt, strategy, saved):
    """A checkpoint of the steps done before the input failed; returns the latest checkpoint.

    The input is read at the start of a step, so every step counted in `opt.iterations` is
    complete. The batch of the last one may have been drawn past the damage (tf.data's prefetch
    reads on after an error), so that step can differ from a run on intact shards; the steps
    before it are the stream's. Not under MultiWorkerMirroredStrategy: a save there is collective
    and the other workers are not in it.
    """
    step = int(opt.iterations.numpy())
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or \
            (saved and saved.endswith(f"-{step}")) or step == 0:
        return saved
    saved = manager.save(checkpoint_number=step)
    logging.info("Saved checkpoint %s", saved)
    return saved


def _damaged_shard_error(error, manager, opt, strategy, saved) -> pipeline.CorruptShardError | None:
    """For an input error that names a damaged shard: a checkpoint of the steps done, and the
    one-line error to stop with; None for any other error."""
    found = _DAMAGED_SHARD.search(error.message)
    if not found:
        return None
    saved = _save_after_input_error(manager, opt, strategy, saved)
    path, done, size = found.groups()
    return pipeline.CorruptShardError(
        f"damaged shard {path}: read {done} of {size} bytes, reached at step "
        f"{int(opt.iterations.numpy())} (latest checkpoint {saved}); "
        "--skip_corrupt_records trains without its damaged part")


def _check_batch_split(config: PretrainingConfig, replicas: int) -> None:
    """The global batch splits evenly over the replicas and then into the micro-batches."""
    if config.train_batch_size % replicas:
        raise PretrainingConfigError(
            f"PretrainingConfig.train_batch_size: {config.train_batch_size} is not divisible by "
            f"the {replicas} replicas of the strategy")
    micro = config.gradient_accumulation_steps
    if config.train_batch_size % (replicas * micro):
        raise PretrainingConfigError(
            f"PretrainingConfig.gradient_accumulation_steps: {micro} does not divide the "
            f"per-replica batch of {config.train_batch_size // replicas} "
            f"(train_batch_size {config.train_batch_size} over {replicas} replicas)")


def _check_input(data_pattern, config: PretrainingConfig, check_shards: bool,
                 skip_corrupt: bool) -> int | None:
    """Every record of every shard read once (`pipeline.check_shards`); returns the records a
    pass over the data skips, when known."""
    if not check_shards:
        if skip_corrupt:
            logging.warning("skip_corrupt without the shard check: damaged shards are read up "
                            "to their first damaged record and named on stderr when reached, "
                            "uncounted")
        return None
    skipped_records = pipeline.check_shards(
        data_pattern, config.max_seq_length, skip_corrupt=skip_corrupt).records_skipped
    if skip_corrupt:
        logging.info("skipping %d records per pass over the data (damaged, or after the "
                     "damage in their shard)", skipped_records)
    return skipped_records


def _restore_or_initialise(checkpoint, model, opt, model_dir: str, init,
                           changes: dict) -> str | None:
    """The newest readable checkpoint of model_dir (returned), else `init`'s weights."""
    latest = restore_newest_readable(checkpoint, model_dir)
    if latest and init is not None:
        logging.warning("model_dir %s has checkpoints: resuming from them; --init_checkpoint "
                        "%s is ignored", model_dir, init.path)
    elif init is not None:
        init.copy_into(model)
    if latest:
        logging.info("Resumed from %s at step %d", latest, int(opt.iterations.numpy()))
        for name, (old, new) in changes.items():
            changes_numbers = name == "num_train_steps" or name in RESUME_ON_REQUEST_FIELDS
            log = logging.warning if changes_numbers else logging.info
            log("Resuming with %s=%r (the run so far had %r)", name, new, old)
    return latest


def _check_finite(loss, bad_step: int, saved: str | None) -> None:
    if bad_step >= 0:
        last_good = (f"the last good checkpoint is {saved} (to go on from it with a "
                     "lower learning rate, add --allow_config_change=learning_rate)"
                     if saved else "no checkpoint was saved yet")
        message = f"loss is {float(loss)} at step {bad_step}: stopping; {last_good}"
        logging.error("%s", message)
        raise NonFiniteLossError(message)


class _Summaries:
    """The TensorBoard summaries: metrics at each summary step, with the rates of the period
    since the last one (examples and tokens per second), and the warnings read from them."""

    def __init__(self, model, opt, grad_norm, config: PretrainingConfig, writer, step: int,
                 skipped_records: int | None):
        self.model, self.opt, self.grad_norm, self.config, self.writer = (
            model, opt, grad_norm, config, writer)
        self.skipped_records = skipped_records  # per pass over the data, when known
        self.warned_collapse = False
        self._start_period(step)

    def _start_period(self, step: int) -> None:
        self.period_start, self.period_step, self.tokens, self.loss_scale_skips = (
            time.time(), step, 0, 0)

    def add(self, tokens: int, loss_scale_skips: int) -> None:
        self.tokens += tokens
        self.loss_scale_skips += loss_scale_skips

    def due(self, previous: int, step: int) -> bool:
        every = self.config.summary_steps
        return step // every > previous // every or step >= self.config.num_train_steps

    def write(self, step: int, metrics: dict) -> None:
        """Writes the period's summaries, then resets the metrics for the next one."""
        config, opt = self.config, self.opt
        elapsed = max(time.time() - self.period_start, 1e-9)
        examples = (step - self.period_step) * config.train_batch_size
        rates = {"examples_per_second": examples / elapsed,
                 "tokens_per_second": self.tokens / elapsed, "learning_rate": _learning_rate(opt)}
        for name, value in {**metrics, **rates}.items():
            summaries.scalar(name, value, step=step)
        if self.skipped_records is not None:
            summaries.scalar("data/corrupt_records_skipped", self.skipped_records, step=step)
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            summaries.scalar("loss_scale/skipped_steps", self.loss_scale_skips, step=step)
            summaries.scalar("loss_scale/scale", float(opt.dynamic_scale.numpy()), step=step)
        warning = collapse_warning(metrics, step, config, self.model.config.objective)
        if warning and not self.warned_collapse:
            logging.warning("%s", warning)
            self.warned_collapse = True
        self.writer.flush()
        for m in (*self.model.metrics, self.grad_norm):
            m.reset_state()
        self._start_period(step)


def _train(model, opt, grad_norm, manager, saved: str | None, strategy, config: PretrainingConfig,
           data_pattern, model_dir: str, skip_corrupt: bool, skipped_records: int | None):
    """The loop, from the restored step to `num_train_steps` or a SIGTERM: each call runs
    `steps_per_loop` steps; then the NaN check, summaries, a log line, a checkpoint when due.
    Returns (step, preempted, metrics, latest checkpoint)."""
    step = int(opt.iterations.numpy())
    iterator = iter(strategy.distribute_datasets_from_function(pipeline.dataset_fn(
        data_pattern, config.train_batch_size, config.max_seq_length, seed=config.seed,
        start_step=step, shuffle_buffer=config.shuffle_buffer, skip_corrupt=skip_corrupt)))
    loop = make_loop_fn(model, strategy, jit_compile=config.jit_compile,
                        accumulation_steps=config.gradient_accumulation_steps)
    writer = (tf.summary.create_file_writer(os.path.join(model_dir, "train")) if is_chief(strategy)
              else tf.summary.create_noop_writer())
    progress = ProgressLogger(config.num_train_steps, every_n=1, initial_step=step)
    summary = _Summaries(model, opt, grad_norm, config, writer, step,
                         skipped_records if skip_corrupt else None)
    metrics, preempted = {}, False
    with _StopRequest() as stop_request, writer.as_default():
        while step < config.num_train_steps:
            num_steps = min(config.steps_per_loop, config.num_train_steps - step)
            try:
                loss, bad_step, tokens, skipped, stop = loop(
                    iterator, tf.constant(num_steps), tf.constant(stop_request.requested))
            except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
                error = _damaged_shard_error(e, manager, opt, strategy, saved)
                if error is None:
                    raise
                raise error from None
            _check_finite(loss, int(bad_step), saved)
            previous, step = step, int(opt.iterations.numpy())
            summary.add(int(tokens), int(skipped))
            if int(skipped):
                logging.warning(
                    "%d of the last %d steps skipped by the float16 loss scale (non-finite "
                    "gradients: no update, not counted; the scale is now %g)", int(skipped),
                    num_steps, float(opt.dynamic_scale.numpy()))
            metrics = {m.name: float(m.result()) for m in model.metrics}
            if int(grad_norm.count.numpy()):  # no norm when every step was skipped
                metrics["gradient_norm"] = float(grad_norm.result())
            if summary.due(previous, step):
                summary.write(step, metrics)
            progress.update(step, force=True, loss=metrics["loss"],
                            **{k: v for k, v in metrics.items()
                               if k in ("mlm_loss", "disc_loss", "gradient_norm")})
            if previous == progress.start_step:
                progress.reset_clock(step)  # the ETA should not count the first trace
            every = config.save_checkpoints_steps
            if step // every > previous // every or bool(stop) or step >= config.num_train_steps:
                saved = _save(manager, step)
                logging.info("Saved checkpoint %s", saved)
            if bool(stop):
                preempted = True
                logging.warning("Stopped at step %d on SIGTERM; rerun the same command to "
                                "resume", step)
                break
    return step, preempted, metrics, saved


def _save(manager: tf.train.CheckpointManager, step: int) -> str:
    """A checkpoint at `step`; a failed save (a full disk) removes its partial files before the
    error goes up, so the newest complete checkpoint stays the one a rerun resumes from.

    TensorFlow writes the merged `<prefix>.index` straight to its final name, through a link
    if one is there: links at the names this save writes are removed first (the folder is
    locked by this run, so nothing of ours can be a link there)."""
    if not files.is_remote(manager.directory):
        for path in glob.glob(os.path.join(glob.escape(manager.directory), f"{CHECKPOINT_PREFIX}-{step}.*")):
            if os.path.islink(path):
                os.unlink(path)
    try:
        return manager.save(checkpoint_number=step)
    except Exception:
        files.remove_stale_temporaries(manager.directory)
        for partial in tf.io.gfile.glob(os.path.join(manager.directory, f"{CHECKPOINT_PREFIX}-{step}.*")):
            tf.io.gfile.remove(partial)
        raise


def run_pretraining(model_config: ElectraConfig, config: PretrainingConfig, data_pattern,
                    model_dir, strategy: tf.distribute.Strategy, *, vocab_file=None,
                    flags: dict | None = None, check_shards: bool = True,
                    skip_corrupt: bool = False, allow_changes=(), init=None,
                    run_facts: dict | None = None) -> PretrainingResult:
    """Pretrains (or resumes pretraining) in `model_dir`. See the module docstring.

    Args:
      model_config: the discriminator's ElectraConfig.
      config: the run's PretrainingConfig.
      data_pattern: glob(s) of pretraining TFRecord shards at `config.max_seq_length`.
      model_dir: checkpoints, summaries, config JSON and the exported discriminator.
      strategy: from `create_strategy`.
      vocab_file: copied next to the exported discriminator when given.
      flags: command-line values, recorded in the config JSON.
      check_shards: read every record of every shard before step 1 (`pipeline.check_shards`;
        every worker checks every shard).
      skip_corrupt: read damaged shards up to their first damaged record instead of failing.
      allow_changes: `RESUME_ON_REQUEST_FIELDS` this run may change when it resumes.
      init: `run_setup.InitialWeights` to start from (continued pretraining), or None. Used
        only when model_dir has no checkpoint: a rerun resumes from model_dir and says so.
      run_facts: more entries for the run record (`run_setup.RunSetup.record`: the shards'
        manifest, casing, the vocabulary's hash, the initial checkpoint).

    Raises one of `USER_ERRORS` for input it cannot use (another run's folder, damaged shards or
    checkpoints; nothing in model_dir is changed), and NonFiniteLossError if the loss becomes NaN
    or Inf (the latest checkpoint is kept).
    """
    model_dir = str(model_dir)
    replicas = strategy.num_replicas_in_sync
    _check_batch_split(config, replicas)
    check_run_folder(model_dir, model_config, config, allow_changes)  # before anything is written
    skipped_records = _check_input(data_pattern, config, check_shards, skip_corrupt)
    chief = is_chief(strategy)
    # One writer per run folder: the chief locks it for the whole run (workers write elsewhere).
    lock = files.FolderLock(model_dir, "electra-pretrain").acquire() if chief else None
    try:
        # Again under the lock: a run that ended meanwhile may have left its record.
        changes = check_run_folder(model_dir, model_config, config, allow_changes)
        return _run_pretraining(model_config, config, data_pattern, model_dir, strategy,
                                vocab_file=vocab_file, flags=flags, skip_corrupt=skip_corrupt,
                                init=init, run_facts=run_facts, changes=changes,
                                skipped_records=skipped_records)
    finally:
        if lock is not None:
            lock.release()


def _run_pretraining(model_config, config, data_pattern, model_dir: str, strategy, *, vocab_file,
                     flags, skip_corrupt, init, run_facts, changes, skipped_records):
    replicas = strategy.num_replicas_in_sync
    chief = is_chief(strategy)
    tf.io.gfile.makedirs(model_dir)
    if chief:  # what a killed run left: checkpoint temporaries, a half-written discriminator
        files.recover_folder(os.path.join(model_dir, DISCRIMINATOR_FOLDER))
        for path in files.remove_stale_temporaries(model_dir):
            logging.info("Removed %s, left by an interrupted run", path)

    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(MIXED_PRECISION[config.mixed_precision])
    keras.utils.set_random_seed(config.seed)  # initialisers and dropout seed generators
    write_dir = _write_dir(model_dir, strategy)
    try:
        model, opt, grad_norm = _build(model_config, config, strategy)
        checkpoint = model_checkpoint(model, opt)
        manager = tf.train.CheckpointManager(checkpoint, write_dir, config.keep_checkpoint_max,
                                             checkpoint_name=CHECKPOINT_PREFIX)
        latest = _restore_or_initialise(checkpoint, model, opt, model_dir, init, changes)
        if chief:
            write_record(model_dir, {
                **(run_facts or {}), **kept_facts(model_dir, latest),
                "flags": flags or {}, "model_config": model_config.to_dict(),
                "pretraining_config": config.to_dict(), "vocab_file": vocab_file,
                "strategy": type(strategy).__name__, "num_replicas": replicas})
        step, preempted, metrics, saved = _train(
            model, opt, grad_norm, manager, latest, strategy, config, data_pattern, model_dir,
            skip_corrupt, skipped_records)
        disc_dir = None
        if not preempted:
            # Every worker saves, as with checkpoints; only the chief's lands in model_dir (the
            # others write to their temporary folder, deleted below), so only the chief says so.
            # Built aside and swapped in whole: a kill leaves the previous discriminator/ or this one.
            with files.staged_folder(Path(write_dir) / DISCRIMINATOR_FOLDER) as staging:
                export_discriminator(model, staging, vocab_file=vocab_file)
            disc_dir = str(Path(model_dir) / DISCRIMINATOR_FOLDER)
            if chief:
                logging.info("Saved the discriminator to %s", disc_dir)
        return PretrainingResult(model, step, preempted, metrics,
                                 saved if chief else None, disc_dir)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
        if not chief:
            shutil.rmtree(write_dir, ignore_errors=True)
