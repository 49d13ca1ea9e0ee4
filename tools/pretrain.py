r"""Pretrains ELECTRA from TFRecord shards (electra-pretrain).

  electra-pretrain --config=electra_small --data='data/pretrain/pretrain_data.tfrecord-*' \
      --model_dir=runs/small [--vocab_file=vocab.txt] [--strategy=mirrored] [--override k=v]
  electra-pretrain --init_checkpoint=electra_small_release/ --data=... --model_dir=runs/more

Unset hyperparameter flags take the paper's values for the config's size (Small: lr 5e-4,
batch 128, 1M steps, length 128; Base: 2e-4 / 256 / 766K / 512; Large: 2e-4 / 2048 / 400K / 512;
warmup 10,000). The manifest.json electra-build-data writes beside the shards gives the sequence
length, vocab_size and special token ids (a flag or --vocab_file that contradicts it is refused);
shards without one (the authors' tool's) need --vocab_file unless built with the BERT uncased
vocabulary. --init_checkpoint continues pretraining from released or earlier weights (TF1,
Hugging Face or electra_tf; the model config and vocabulary come from it) with a fresh optimizer
at step 0. --gradient_accumulation_steps=N splits each step's --train_batch_size examples into N
micro-batches (the same update, the memory of one micro-batch). Rerunning the same command
resumes from the newest checkpoint in --model_dir that reads back (a damaged one is named and
skipped; --init_checkpoint is then ignored). A resumed run may change only the steps, the
intervals and the micro-batches (see --model_dir and --allow_config_change); another config is
refused before anything is written. Every shard is checked before step 1 (--check_shards).

Stopping: SIGTERM (a preemption) or SIGINT (Ctrl-C) stops the run within about a second (the
running in-graph call is kept to a second), saves a checkpoint at the step reached and prints
one line saying where it stopped; the same command resumes exactly. A second signal stops at
once, without that checkpoint (the run resumes from the one before). Exit status: 0 on SIGTERM,
so that a scheduler's preemption counts as a clean stop (the documented convention since the
first release); 130 on SIGINT, as a shell reports Ctrl-C, so that `electra-pretrain ... &&
next-step` does not go on with a half-trained model. The same codes when the signal arrives
before the first step or while the discriminator is exported (then the line says so).
Bad input (a damaged shard, another run's folder, a link at --model_dir/train, a flag that
contradicts the manifest or the checkpoint) and a NaN/Inf loss exit 1 with one line naming the
file, field or step. See electra_tf/training/loop.py, electra_tf/training/preemption.py and
electra_tf/training/run_setup.py.
"""

import signal
import sys

from absl import app, flags, logging

from electra_tf import cli
from electra_tf.training.config import (  # no TensorFlow: --help stays fast
    MIXED_PRECISION, OPTIMIZERS, RESUME_ON_REQUEST_FIELDS, STRATEGIES)

_CONFIG = flags.DEFINE_string(
    "config", "electra_small", "Model config: a configs/*.json name or a path. With "
    "--init_checkpoint the checkpoint's config is used; a --config given too must have its sizes.")
_OVERRIDE = flags.DEFINE_multi_string("override", [], "key=value overrides of the model config.")
_DATA = flags.DEFINE_string("data", None, "Glob(s) of pretraining TFRecord shards, comma-separated, "
                            "or the folder electra-build-data wrote (the shards its manifest.json "
                            "lists).", required=True)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Checkpoints, summaries, exports. A folder with checkpoints resumes only "
    "the run recorded in its pretraining_config.json: the same model config and flags, except "
    "--num_train_steps (extends the run; the learning rate then decays to 0 at the new end), "
    "--steps_per_loop, --save_checkpoints_steps, --keep_checkpoint_max, --summary_steps, "
    "--jit_compile, --gradient_accumulation_steps, --data, --vocab_file (same vocab), "
    "--init_checkpoint (ignored then), --strategy, the shard flags and the "
    "settings named in --allow_config_change.",
    required=True)
_VOCAB = flags.DEFINE_string(
    "vocab_file", None, "WordPiece vocab: sets the special token ids and vocab_size, and is copied "
    "next to the exported discriminator. Default: the --init_checkpoint's vocab.txt, else the one "
    "the shards' manifest.json names (its ids are used even when the file has moved). Must be the "
    "vocab the shards were built with (the manifest's sha256).")
_INIT = flags.DEFINE_string(
    "init_checkpoint", None, "Continue pretraining from these weights: a TF1 checkpoint or "
    "released archive folder, a Hugging Face folder (a pretrainer with discriminator/ and "
    "generator/, or a discriminator: see --init_generator), an electra_tf pretraining "
    "model_dir, or a released model's name (a Hugging Face Hub id such as "
    "google/electra-small-discriminator, owner/name@revision; a keras-hub preset), fetched "
    "into its library's cache (an existing path wins). The optimizer starts at step 0 with "
    "its own warmup. Without a generator in it, the generator starts from random weights, "
    "sharing the loaded embeddings. Ignored (with a warning) when --model_dir already has "
    "checkpoints: the run resumes from those.")
_INIT_GEN = flags.DEFINE_string(
    "init_generator", None, "The Hugging Face generator folder (or Hub id) that goes with a "
    "discriminator given as --init_checkpoint (e.g. google/electra-small-generator with "
    "google/electra-small-discriminator).")
_STRATEGY = flags.DEFINE_enum("strategy", "one_device", list(STRATEGIES),
                              "tf.distribute strategy.")
_TPU = flags.DEFINE_string("tpu", None, "TPU name or grpc:// address (--strategy=tpu).")
_NUM_GPUS = flags.DEFINE_integer("num_gpus", 0, "GPUs for --strategy=mirrored (0: all).")
_BATCH = flags.DEFINE_integer("train_batch_size", None, "Global batch size of one optimizer "
                              "step (over all replicas and micro-batches).")
_ACCUMULATE = flags.DEFINE_integer(
    "gradient_accumulation_steps", None, "Micro-batches per optimizer step (default 1): each "
    "replica computes its share of --train_batch_size in this many slices and applies their "
    "summed gradient once; the update is the whole batch's. Must divide the per-replica batch.")
_STEPS = flags.DEFINE_integer("num_train_steps", None, "Total optimizer steps.")
_LR = flags.DEFINE_float("learning_rate", None, "Peak learning rate.")
_WARMUP = flags.DEFINE_integer("num_warmup_steps", None, "Linear warmup steps.")
_MAX_LEN = flags.DEFINE_integer("max_seq_length", None, "The shards' sequence length. Default: "
                                "the shards' manifest.json, else the paper's for the size.")
_PER_LOOP = flags.DEFINE_integer("steps_per_loop", None, "Steps per tf.function call.")
_SAVE = flags.DEFINE_integer("save_checkpoints_steps", None, "Checkpoint interval in steps.")
_KEEP = flags.DEFINE_integer("keep_checkpoint_max", None, "Checkpoints to keep.")
_SUMMARY = flags.DEFINE_integer("summary_steps", None, "TensorBoard summary interval in steps.")
_OPTIMIZER = flags.DEFINE_enum("optimizer", None, list(OPTIMIZERS), "Optimizer.")
_BETA_2 = flags.DEFINE_float("adam_beta_2", None, "Adam's beta_2 (0.999); 0.98 for runs of a "
                             "few hundred steps (see the README's short-run section).")
_JIT = flags.DEFINE_bool(
    "jit_compile", None, "XLA-compile the train step (--jit_compile) or not (--nojit_compile). "
    "Unset: the faster of the two on this CPU, timed at start-up when the run is long enough "
    "for the probe to pay (its steps are undone); the choice and why are logged and recorded "
    "in pretraining_config.json (step_path).")
_MIXED = flags.DEFINE_enum("mixed_precision", None, list(MIXED_PRECISION),
                           "Mixed precision policy.")
_SEED = flags.DEFINE_integer("seed", None, "Initialisation, masking, dropout and input seed.",
                             lower_bound=0, upper_bound=2**32 - 1)  # what TensorFlow's seeds take
_TIMEOUT = flags.DEFINE_float("strategy_timeout", 30.0, "Seconds to reach a TPU.")
_CHECK_SHARDS = flags.DEFINE_bool(
    "check_shards", True, "Before step 1, read every record of every shard (framing, both CRCs, "
    "each a tf.Example at --max_seq_length); ~4 s per GB on 2 CPU cores (docs/benchmarks.md).")
_SKIP_CORRUPT = flags.DEFINE_bool(
    "skip_corrupt_records", False, "Read a damaged shard up to its first damaged record instead "
    "of failing; the records skipped are logged and summarised (data/corrupt_records_skipped).")
_ALLOW_CHANGE = flags.DEFINE_list(
    "allow_config_change", [], "When resuming, let these optimizer settings differ from the run "
    f"so far: any of {', '.join(RESUME_ON_REQUEST_FIELDS)} (e.g. a lower "
    "--learning_rate after a NaN).")

# Flag -> PretrainingConfig field; a flag left unset keeps the paper default.
_CONFIG_FLAGS = {
    "train_batch_size": _BATCH, "num_train_steps": _STEPS, "learning_rate": _LR,
    "num_warmup_steps": _WARMUP, "max_seq_length": _MAX_LEN, "steps_per_loop": _PER_LOOP,
    "save_checkpoints_steps": _SAVE, "keep_checkpoint_max": _KEEP, "summary_steps": _SUMMARY,
    "optimizer": _OPTIMIZER, "jit_compile": _JIT, "mixed_precision": _MIXED, "seed": _SEED,
    "adam_beta_2": _BETA_2, "gradient_accumulation_steps": _ACCUMULATE,
}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from electra_tf.training import run_setup, strategy as strategy_lib
    from electra_tf.training.loop import USER_ERRORS, run_pretraining
    from electra_tf.training.preemption import Interrupted, StopRequest, signal_name

    try:
        setup = run_setup.resolve_run(
            _DATA.value, config_name=_CONFIG.value, config_given=flags.FLAGS["config"].present,
            overrides=_OVERRIDE.value, vocab_file=_VOCAB.value,
            run_values={k: f.value for k, f in _CONFIG_FLAGS.items() if f.value is not None},
            init_checkpoint=_INIT.value, init_generator=_INIT_GEN.value)
        strategy = strategy_lib.create_strategy(_STRATEGY.value, tpu=_TPU.value,
                                                num_gpus=_NUM_GPUS.value,
                                                timeout_seconds=_TIMEOUT.value)
    except (ValueError, OSError, strategy_lib.StrategyError) as e:
        sys.exit(f"electra-pretrain: error: {e}")
    flag_values = {f.name: f.value for f in flags.FLAGS.get_key_flags_for_module(sys.modules[__name__])}
    try:
        # Outside the training loop (shard check, start-up, export) a signal stops at once; in
        # the loop, within about a second with a checkpoint (loop.py).
        with StopRequest(at_once=True):
            result = run_pretraining(
                setup.model_config, setup.config, _DATA.value, _MODEL_DIR.value, strategy,
                vocab_file=setup.vocab_file, flags=flag_values, check_shards=_CHECK_SHARDS.value,
                skip_corrupt=_SKIP_CORRUPT.value, allow_changes=_ALLOW_CHANGE.value,
                init=setup.init, run_facts=setup.record)
    except USER_ERRORS as e:
        sys.exit(f"electra-pretrain: error: {e}")
    except Interrupted as e:
        _stop(f"{e} (the checkpoints in {_MODEL_DIR.value} are kept)", e.signum)
    logging.info("Done at step %d%s", result.step, " (preempted)" if result.preempted else "")
    if result.preempted:  # stop_signal None: another worker's signal stopped every worker
        cause = signal_name(result.stop_signal) if result.stop_signal else "another worker's signal"
        _stop(f"stopped on {cause} at step {result.step} of {setup.config.num_train_steps} "
              f"(checkpoint {result.checkpoint})", result.stop_signal)
    if result.stop_signal:  # it arrived as the last steps ran: the run is complete
        _stop(f"{signal_name(result.stop_signal)} arrived as the run finished at step "
              f"{result.step}: it is complete", result.stop_signal, resume=False)


def _stop(message: str, signum: int | None, resume: bool = True):
    """One line on stderr, then exit 0 for SIGTERM (a preemption), 130 for SIGINT."""
    print(f"electra-pretrain: {message}" + ("; run the same command to resume" if resume else ""),
          file=sys.stderr, flush=True)
    sys.exit(128 + signum if signum == signal.SIGINT else 0)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
