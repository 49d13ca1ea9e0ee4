"""The pretraining loop: `run_pretraining` of a `PretrainingConfig` (`training/config.py`).

One loop a reader can follow:

  strategy.scope(): ElectraPretrainer + create_optimizer (+ LossScaleOptimizer for float16)
  input:  pipeline.distributed_iterator(strategy, pipeline.dataset_fn(..., start_step=step))
  path:   the replica step as a plain graph or XLA-compiled: the faster on this CPU unless
          the config says which (`step_path.choose`: a probe whose steps are undone)
  step:   one tf.function runs n x strategy.run(train_step) (the replica step on that path;
          with gradient_accumulation_steps=N it sums the gradients of N micro-batches into one
          update, `accumulated_step`), and returns the global losses, token counts and float16
          loss-scale skips (`steps.py`); n keeps a call to about a second, within
          `steps_per_loop` (`_LoopCalls`)
  after each call: NaN/Inf check, summaries (`summaries.py`), a log line at each multiple of
          steps_per_loop, checkpoint, SIGTERM / SIGINT check (`preemption.py`).

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
variable (see `model_checkpoint`) and the optimizer; they are written at each multiple of
`save_checkpoints_steps`, at the end, and when SIGTERM or SIGINT arrives: the run then stops
within about a second (the running call's end), saves the step reached and `run_pretraining`
returns normally with `preempted=True` and the signal (the binary exits 0 on SIGTERM, 130 on
SIGINT). A non-finite loss raises `NonFiniteLossError` naming the first bad step; nothing is
saved after it, so the latest checkpoint is the last good state.

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
The stop request (SIGTERM / SIGINT) and the length of the next call are summed over the
workers before every call (`_LoopCalls`), so every worker stops at the same step.

Files in `model_dir`: `pretraining_config.json` (flags, model config, pretraining config, and
from `run_setup`: the shards' manifest, their casing `lower_case`, the vocabulary's sha256 and
the initial checkpoint), `ckpt-*` checkpoints, `train/` TensorBoard events (with
`loss_scale/skipped_steps` and `loss_scale/scale` under float16; a link planted at `train/` is
refused before the shard check, `files.own_folder`), `discriminator/` (our format, loadable by
`from_pretrained` and fine-tuning, built aside and renamed into place).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import keras
import tensorflow as tf
from absl import logging

from electra_tf import files
from electra_tf.config import ConfigError, ElectraConfig
from electra_tf.convert.pretrained import save_electra_checkpoint
from electra_tf.data import pipeline
from electra_tf.models.pretrainer import ElectraPretrainer
from electra_tf.progress import ProgressLogger
from electra_tf.run_folder import (
    CHECKPOINT_PREFIX, DISCRIMINATOR_FOLDER, RECORD_FILE, RunFolderError, checkpoint_prefixes,
    kept_facts, model_checkpoint, read_record, restore_newest_readable, write_record)
from electra_tf.training import optimizer as optimizer_lib
from electra_tf.training import step_path
from electra_tf.training.config import (
    MIXED_PRECISION, RESUME_FREE_FIELDS, RESUME_ON_REQUEST_FIELDS, PretrainingConfig,
    PretrainingConfigError)
from electra_tf.training.preemption import StopRequest, signal_name
from electra_tf.training.steps import make_loop_fn, track_gradient_norm
from electra_tf.training.strategy import is_chief
from electra_tf.training.summaries import PretrainingSummaries


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or Inf; the message names the step."""


# TensorBoard summaries of the run, a folder of model_dir.
TRAIN_FOLDER = "train"

# Errors whose message is the whole story (it names the file or field): the binary prints them as
# one line, without a traceback.
USER_ERRORS = (ConfigError, RunFolderError, pipeline.CorruptShardError, FileNotFoundError,
               NonFiniteLossError)

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


# --- the loop -----------------------------------------------------------------------------------
class PretrainingResult(NamedTuple):
    model: ElectraPretrainer  # the trained pretrainer (its optimizer attached)
    step: int
    preempted: bool  # stopped by a signal before num_train_steps (a checkpoint at `step`)
    metrics: dict
    checkpoint: str | None
    discriminator_dir: str | None
    # SIGTERM / SIGINT when one arrived during the loop: it stopped the run (`preempted`), or
    # the run finished first and the caller should stop too. None otherwise.
    stop_signal: int | None = None


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
    found = pipeline.damaged_shard(error)
    if found is None:
        return None
    saved = _save_after_input_error(manager, opt, strategy, saved)
    path, done, size = found
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
                 skip_corrupt: bool, vocab_size: int) -> int | None:
    """Every record of every shard read once (`pipeline.check_shards`: framing, parsing, token ids
    within the model's `vocab_size`); returns the records a pass over the data skips, when known."""
    if not check_shards:
        if skip_corrupt:
            logging.warning("skip_corrupt without the shard check: damaged shards are read up "
                            "to their first damaged record and named on stderr when reached, "
                            "uncounted")
        return None
    skipped_records = pipeline.check_shards(
        data_pattern, config.max_seq_length, skip_corrupt=skip_corrupt,
        vocab_size=vocab_size).records_skipped
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


def _choose_step_path(model, opt, grad_norm, strategy, config: PretrainingConfig, model_config,
                      data_pattern, skip_corrupt: bool):
    """(the loop function, `step_path.StepPath`): the path `config.jit_compile` asks for, or,
    when it is None, the faster on this CPU (`step_path.choose`: a probe on an input of its
    own, every variable it changes put back, so the run goes on from the same state)."""
    loops = {}

    def loop_for(jit_compile: bool):
        if jit_compile not in loops:
            loops[jit_compile] = make_loop_fn(
                model, strategy, jit_compile=jit_compile,
                accumulation_steps=config.gradient_accumulation_steps)
        return loops[jit_compile]

    probe_input = []

    def runner(jit_compile: bool):
        loop = loop_for(jit_compile)
        if not probe_input:
            probe_input.append(pipeline.distributed_iterator(strategy, pipeline.dataset_fn(
                data_pattern, config.train_batch_size, config.max_seq_length, seed=config.seed,
                shuffle_buffer=config.shuffle_buffer, skip_corrupt=skip_corrupt)))
        no_stop = tf.constant(False)
        return lambda n: float(loop(probe_input[0], tf.constant(n), no_stop)[0])

    def snapshot():
        inner = getattr(opt, "inner_optimizer", opt)
        return step_path.Snapshot([*model.variables, *opt.variables, *inner.variables])

    step = int(opt.iterations.numpy())
    key = repr((model_config.to_dict(), config.train_batch_size, config.max_seq_length,
                config.gradient_accumulation_steps, config.mixed_precision,
                type(strategy).__name__, strategy.num_replicas_in_sync))
    choice = step_path.choose(config.jit_compile, strategy=strategy,
                              remaining_steps=config.num_train_steps - step, runner=runner,
                              snapshot=snapshot, memo_key=key, log=logging.info)
    for metric in (*model.metrics, grad_norm):  # what the probe's steps added
        metric.reset_state()
    logging.info("%s", choice.line())
    return loop_for(choice.jit_compile), choice


# One call of the in-graph loop lasts about this long: Python handles a signal only between two
# calls (preemption.py), so a stop waits at most about this; the host round trip of a call costs
# a few milliseconds.
CALL_SECONDS = 1.0


class _LoopCalls:
    """How many steps the next call of the loop function runs, and whether to stop before it.

    A call never crosses a multiple of steps_per_loop, summary_steps or save_checkpoints_steps
    (summaries and checkpoints land on their steps) and lasts about CALL_SECONDS: the first runs
    one step (its time is mostly the trace), each later one as many steps as the previous call's
    speed fits in CALL_SECONDS. Before, a call ran steps_per_loop steps and a SIGTERM waited for
    its end (with the README's steps_per_loop=1000, minutes on a CPU). What a step computes does not depend on the calls (it is keyed
    by the optimizer step: masks, samples, dropout, input position), so a run stopped at any step
    resumes exactly.

    Under MultiWorkerMirroredStrategy every worker must make the same calls (their collectives
    pair up): each worker's length and stop request are summed over the replicas before every
    call; all take the mean length and stop when any worker was asked to.
    """

    def __init__(self, strategy, config: PretrainingConfig):
        self.config = config
        self.seconds_per_step = None
        self.replicas = strategy.num_replicas_in_sync
        self._sum = None
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            @tf.function
            def sum_over_replicas(values):  # int64 [2]: this worker's length, stop request
                return strategy.reduce("SUM", strategy.run(lambda: tf.identity(values)), axis=None)

            self._sum = sum_over_replicas

    def next(self, step: int, requested: bool) -> tuple[int, bool]:
        """(steps of the next call, whether to stop now instead) at `step`."""
        c = self.config
        boundary = min(c.num_train_steps, *(step // every * every + every for every in
                                            (c.steps_per_loop, c.summary_steps,
                                             c.save_checkpoints_steps)))
        if self.seconds_per_step is None:
            length = 1  # the first call: mostly the trace
        else:
            length = max(1, min(boundary - step, int(CALL_SECONDS / self.seconds_per_step)))
        if self._sum is None:
            return length, requested
        total = self._sum(tf.constant([length, int(requested)], tf.int64)).numpy()
        return max(1, int(total[0]) // self.replicas), bool(total[1])

    def took(self, num_steps: int, seconds: float) -> None:
        self.seconds_per_step = seconds / num_steps


def _train(model, opt, grad_norm, loop, manager, saved: str | None, strategy,
           config: PretrainingConfig, data_pattern, model_dir: str, skip_corrupt: bool,
           skipped_records: int | None):
    """The loop, from the restored step to `num_train_steps` or a SIGTERM / SIGINT: calls of
    `loop` of about a second (`_LoopCalls`); after each, the NaN check, the summaries and a
    checkpoint when due, and a log line at each multiple of steps_per_loop. Returns (step,
    preempted, metrics, latest checkpoint, the signal that stopped it or arrived, or None)."""
    step = int(opt.iterations.numpy())
    iterator = pipeline.distributed_iterator(strategy, pipeline.dataset_fn(
        data_pattern, config.train_batch_size, config.max_seq_length, seed=config.seed,
        start_step=step, shuffle_buffer=config.shuffle_buffer, skip_corrupt=skip_corrupt))
    writer = (tf.summary.create_file_writer(os.path.join(model_dir, TRAIN_FOLDER))
              if is_chief(strategy) else tf.summary.create_noop_writer())
    progress = ProgressLogger(config.num_train_steps, every_n=1, initial_step=step)
    summary = PretrainingSummaries(model, opt, grad_norm, config, writer, step,
                         skipped_records if skip_corrupt else None)
    calls = _LoopCalls(strategy, config)
    no_stop = tf.constant(False)  # the request is looked at between calls (`_LoopCalls.next`)
    metrics, preempted = {}, False
    # Until the first call ends (its trace and compilation can take a minute) there is nothing
    # new to save: a signal then stops at once, in the trace. Not across workers: the others
    # would wait for this one in their collectives.
    at_once = not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    with StopRequest(at_once=at_once) as stop_request, writer.as_default():
        while step < config.num_train_steps:
            num_steps, preempted = calls.next(step, stop_request.requested)
            if preempted:
                break
            started = time.monotonic()
            try:
                loss, bad_step, tokens, skipped, _ = loop(iterator, tf.constant(num_steps), no_stop)
                bad_step = int(bad_step)  # waits for the call's end
            except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
                error = _damaged_shard_error(e, manager, opt, strategy, saved)
                if error is None:
                    raise
                raise error from None
            seconds = time.monotonic() - started
            _check_finite(loss, bad_step, saved)
            previous, step = step, int(opt.iterations.numpy())
            first_call = calls.seconds_per_step is None
            if first_call:
                logging.info("step %d: the train loop is traced (%.1f s) and runs in calls of about "
                             "%g s; SIGTERM or SIGINT now stops at a call's end with a checkpoint",
                             step, seconds, CALL_SECONDS)
            calls.took(num_steps, seconds)
            stop_request.at_once = False  # from now on a stop keeps the steps done
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
            per_loop = config.steps_per_loop
            if step // per_loop > previous // per_loop or step >= config.num_train_steps:
                progress.update(step, force=True, loss=metrics["loss"],
                                **{k: v for k, v in metrics.items()
                                   if k in ("mlm_loss", "disc_loss", "gradient_norm")})
            if first_call:  # the rate and ETA count from the end of the first call (its trace)
                progress.reset_clock(step)
            every = config.save_checkpoints_steps
            if step // every > previous // every or step >= config.num_train_steps:
                saved = _save(manager, step)
                logging.info("Saved checkpoint %s", saved)
        if preempted:
            if not (saved and saved.endswith(f"-{step}")):
                saved = _save(manager, step)
                logging.info("Saved checkpoint %s", saved)
            logging.warning("Stopped at step %d on %s; rerun the same command to resume", step,
                            signal_name(stop_request.signum) if stop_request.signum
                            else "another worker's signal")
    return step, preempted, metrics, saved, stop_request.signum


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
    except BaseException:  # a second signal (preemption.Interrupted) too
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
      data_pattern: glob(s) of pretraining TFRecord shards at `config.max_seq_length`, or
        build folders (`pipeline.list_shards`).
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
    chief = is_chief(strategy)
    train_folder = os.path.join(model_dir, TRAIN_FOLDER)
    if chief and os.path.lexists(train_folder):
        files.own_folder(train_folder)  # a link or a file there: refused before the shard check
    skipped_records = _check_input(data_pattern, config, check_shards, skip_corrupt,
                                   model_config.vocab_size)
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
    if chief:
        # Folders the run writes into: never through a link planted there (LinkedFolderError,
        # one line), refused before any work.
        files.own_folder(os.path.join(model_dir, TRAIN_FOLDER))
        # What a killed run left: checkpoint temporaries, a half-written discriminator.
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
        loop, choice = _choose_step_path(model, opt, grad_norm, strategy, config, model_config,
                                         data_pattern, skip_corrupt)
        if chief:
            write_record(model_dir, {
                **(run_facts or {}), **kept_facts(model_dir, latest),
                "flags": flags or {}, "model_config": model_config.to_dict(),
                "pretraining_config": config.to_dict(), "vocab_file": vocab_file,
                "strategy": type(strategy).__name__, "num_replicas": replicas,
                "step_path": choice.record()})
        step, preempted, metrics, saved, stop_signal = _train(
            model, opt, grad_norm, loop, manager, latest, strategy, config, data_pattern,
            model_dir, skip_corrupt, skipped_records)
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
                                 saved if chief else None, disc_dir, stop_signal)
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)
        if not chief:
            shutil.rmtree(write_dir, ignore_errors=True)
