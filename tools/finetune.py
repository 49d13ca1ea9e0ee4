r"""Fine-tunes ELECTRA on a GLUE / SQuAD / Rotten Tomatoes task or on local files.

  # From our pretraining output (its vocab.txt is used):
  electra-finetune --task=rotten_tomatoes --init_checkpoint=<pretrain model_dir>/discriminator \
      --model_dir=/tmp/ft_rt --num_seeds=5
  # Random initialisation (the baseline), with a vocabulary:
  electra-finetune --task=rotten_tomatoes --config=electra_small --vocab_file=vocab.txt \
      --model_dir=/tmp/ft_rt_random
  # GLUE from the files of the GLUE download script (train, dev and test found by task name;
  # test predictions in the GLUE submission format in --model_dir/best/submission/MRPC.tsv):
  electra-finetune --task=mrpc --data_dir=glue_data/MRPC --init_checkpoint=...
  # GLUE / SQuAD from a prepared TFDS data_dir, or local files:
  electra-finetune --task=mrpc --tfds_data_dir=~/tensorflow_datasets --init_checkpoint=...
  electra-finetune --task=classification --train_file=train.csv --eval_file=dev.csv \
      --text_column=review --label_column=stars --init_checkpoint=...

Hyperparameter flags left unset take the original's defaults for the model size and task
(`electra_tf.finetune.config.FinetuningConfig.for_model_size`). Casing (lower-case and strip
accents, or not) comes from the checkpoint (`electra_tf/data/casing.py`) unless --lower_case or
--nolower_case is given. Writes `--model_dir/results.json` with the median and spread over
seeds and the fine-tuned model to `--model_dir/best/` (with several seeds, each seed's run in
`--model_dir/seed_<s>/` and `best/` a copy of the best seed's); the layout is in
`electra_tf/finetune/publishing.py`. `~` is expanded in every path flag.
"""

import math
import os
import sys

from absl import app, flags, logging

from electra_tf import cli

_TASK = flags.DEFINE_string(
    "task", None, "cola, sst-2, mrpc, sts-b, qqp, mnli, qnli, rte, wnli, squad1.1, squad2.0, "
    "rotten_tomatoes, or a task family's generic task on local files: classification, "
    "regression, tagging, qa, multiple_choice.",
    required=True)
_TRAIN_FILE = flags.DEFINE_string("train_file", None, "Local training file (.csv/.tsv/.jsonl, "
                                  ".txt/.conll for tagging, SQuAD .json for QA, .jsonl for "
                                  "multiple choice).")
_EVAL_FILE = flags.DEFINE_string("eval_file", None, "Local evaluation file (same formats).")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Folder of the task's files: for a GLUE task its folder from the GLUE "
    "download script (glue_data/MRPC: train.tsv, dev.tsv, test.tsv; MNLI: dev_matched and "
    "dev_mismatched, both evaluated), test predictions written in the GLUE submission format; "
    "for other tasks train.<ext> and dev.<ext>. --train_file/--eval_file override its files.")
_TEXT_COLUMN = flags.DEFINE_string("text_column", None, "Column / key of the (first) text.")
_TEXT_PAIR_COLUMN = flags.DEFINE_string("text_pair_column", None, "Column / key of the second "
                                        "text (multiple choice: of the list of choices).")
_LABEL_COLUMN = flags.DEFINE_string("label_column", None, "Column / key of the label.")
_LABELS = flags.DEFINE_list("labels", None, "Label set, in id order (default: the task's, or "
                            "inferred from --train_file).")
_NO_HEADER = flags.DEFINE_bool("no_header", False, "CSV/TSV files have no header row: the "
                               "column flags are 0-based indices.")
_VERSION_2 = flags.DEFINE_bool("version_2", False, "Generic qa task: SQuAD 2.0 (unanswerable "
                               "questions, answerability classifier scored).")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", None, "Prepared TFDS data_dir (no download).")
_INIT_CHECKPOINT = flags.DEFINE_string(
    "init_checkpoint", None, "Pretrained discriminator: <pretrain model_dir>/discriminator, a TF1 "
    "release, a Hugging Face or keras-hub folder, or a released model's name: a Hugging Face Hub "
    "id (google/electra-base-discriminator, owner/name@revision) or a keras-hub preset "
    "(electra_base_discriminator_uncased_en), fetched into its library's cache (an existing path "
    "wins). Without it, --config gives a random initialisation.")
_CONFIG = flags.DEFINE_string("config", None, "Model config name or path (random init only).")
_VOCAB_FILE = flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: the checkpoint's).")
_LOWER_CASE = flags.DEFINE_bool(
    "lower_case", None, "Lower-case and strip accents (uncased vocabulary); --nolower_case keeps "
    "them (cased). Default: as the checkpoint records it (HF tokenizer_config.json, electra_tf "
    "pretraining config, a release's folder name), else uncased.")
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Output folder. One run at a time (locked). A folder holding a finished model "
    "fine-tuned with other settings is refused unless --overwrite; the old best/ and results.json "
    "stay until the new ones are complete.", required=True)
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace a finished model of other settings in --model_dir (it is kept "
    "until the new one is complete).")
_STRATEGY = flags.DEFINE_enum("strategy", "one_device",
                              ["one_device", "mirrored", "multi_worker", "tpu"], "Distribution.")
_TPU = flags.DEFINE_string("tpu", None, "TPU name or address (--strategy=tpu).")
_NUM_GPUS = flags.DEFINE_integer("num_gpus", 0, "GPUs for --strategy=mirrored (0: all).", lower_bound=0)
_MODEL_SIZE = flags.DEFINE_enum("model_size", None, ["small", "base", "large"],
                                "Size whose defaults apply (default: from the hidden size).")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", None, "Peak learning rate.")
_LAYERWISE = flags.DEFINE_float("layerwise_lr_decay", None, "Layer-wise LR decay (0: off).",
                                lower_bound=0.0, upper_bound=1.0)
_EPOCHS = flags.DEFINE_float("num_train_epochs", None, "Training epochs.")
_BATCH = flags.DEFINE_integer("train_batch_size", None, "Global training batch size (at most the "
                              "number of training inputs).", lower_bound=1)
_EVAL_BATCH = flags.DEFINE_integer("eval_batch_size", None, "Global evaluation batch size (at most "
                                   "the number of evaluation inputs).", lower_bound=1)
_MAX_SEQ = flags.DEFINE_integer("max_seq_length", None, "Tokens per input (3 to the model's "
                                "max_position_embeddings).", lower_bound=3)
_WARMUP = flags.DEFINE_float("warmup_proportion", None, "Fraction of steps warming up.",
                             lower_bound=0.0, upper_bound=1.0)
_WEIGHT_DECAY = flags.DEFINE_float("weight_decay", None, "Decoupled weight decay rate.",
                                   lower_bound=0.0)
_LOG_EVERY = flags.DEFINE_integer("log_every_steps", None, "Progress / summary interval.",
                                  lower_bound=1)
_NUM_SEEDS = flags.DEFINE_integer("num_seeds", 1, "Runs with seeds seed, seed+1, ...; the "
                                  "median and spread are reported.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "First seed.")
_MAX_TRAIN = flags.DEFINE_integer("max_train_examples", None, "Use at most this many training "
                                  "examples (quick runs).", lower_bound=1)
_MAX_EVAL = flags.DEFINE_integer("max_eval_examples", None, "Use at most this many eval examples.",
                                 lower_bound=1)
_JIT = flags.DEFINE_bool(
    "jit_compile", None, "XLA-compile the train step (--jit_compile) or not (--nojit_compile). "
    "Unset: the faster of the two on this CPU, timed at start-up when the run is long enough "
    "for the probe to pay (its steps are undone); logged, and recorded in results.json "
    "(step_path).")

# Bounds a FinetuningConfig checks too, checked here as well so that a bad value is refused
# naming its flag before TensorFlow loads (`cli` prints absl's message as one line).
for _name in ("learning_rate", "num_train_epochs"):
    flags.register_validator(_name, lambda value: value is None or 0 < value < math.inf,
                             message=f"--{_name} must be a number > 0")

_HPARAMS = {
    "learning_rate": _LEARNING_RATE, "layerwise_lr_decay": _LAYERWISE, "num_train_epochs": _EPOCHS,
    "train_batch_size": _BATCH, "eval_batch_size": _EVAL_BATCH, "max_seq_length": _MAX_SEQ,
    "warmup_proportion": _WARMUP, "weight_decay": _WEIGHT_DECAY, "log_every_steps": _LOG_EVERY,
    "jit_compile": _JIT,
}


def path(flag):
    """A path flag's value with `~` expanded (the shell leaves `--flag=~/x` alone)."""
    return None if flag.value is None else os.path.expanduser(flag.value)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.INFO)
    from electra_tf.finetune.config import check_model_dir

    if _INIT_CHECKPOINT.value is None and _CONFIG.value is None:
        raise app.UsageError("give --init_checkpoint (pretrained) or --config (random init)")
    try:  # before TensorFlow loads; `run_seeds` checks again (a released model's cache folder)
        check_model_dir(path(_MODEL_DIR), path(_INIT_CHECKPOINT))
    except ValueError as e:
        raise SystemExit(f"electra-finetune: error: {e}") from None
    from electra_tf.config import ConfigError
    from electra_tf.finetune.examples import TaskDataError
    from electra_tf.finetune.seeds import run_seeds, task_from_options
    from electra_tf.training.loop import NonFiniteLossError
    from electra_tf.training.preemption import Interrupted
    from electra_tf.training.strategy import StrategyError, create_strategy

    try:
        task = task_from_options(
            _TASK.value, text_column=_TEXT_COLUMN.value, text_pair_column=_TEXT_PAIR_COLUMN.value,
            label_column=_LABEL_COLUMN.value, labels=_LABELS.value, has_header=not _NO_HEADER.value,
            version_2=_VERSION_2.value)
        strategy = create_strategy(_STRATEGY.value, tpu=_TPU.value, num_gpus=_NUM_GPUS.value)
        results = run_seeds(
            task, path(_CONFIG), {k: f.value for k, f in _HPARAMS.items() if f.value is not None},
            model_dir=path(_MODEL_DIR), num_seeds=_NUM_SEEDS.value, seed=_SEED.value,
            train_path=path(_TRAIN_FILE), eval_path=path(_EVAL_FILE), data_dir=path(_DATA_DIR),
            tfds_data_dir=path(_TFDS_DATA_DIR), init_checkpoint=path(_INIT_CHECKPOINT),
            vocab_file=path(_VOCAB_FILE), lower_case=_LOWER_CASE.value, strategy=strategy,
            model_size=_MODEL_SIZE.value, max_train_examples=_MAX_TRAIN.value,
            max_eval_examples=_MAX_EVAL.value, overwrite=_OVERWRITE.value)
    except (TaskDataError, ConfigError, StrategyError, FileNotFoundError, ValueError,
            NonFiniteLossError) as e:
        raise SystemExit(f"electra-finetune: error: {e}")
    except Interrupted as e:  # SIGTERM / SIGINT: one line, 143 / 130 (finetune/seeds.py)
        print(f"electra-finetune: {e}", file=sys.stderr)
        sys.exit(e.code)
    for name, s in results["summary"].items():
        print(f"{results['task']} {name}: median {s['median']:.2f} (min {s['min']:.2f}, "
              f"max {s['max']:.2f}, std {s['std']:.2f}) over {results['num_seeds']} seed(s)")
    print(f"results: {path(_MODEL_DIR)}/results.json; best model: {results['best_model_dir']}")
    best_run = next(r for r in results["runs"] if r["seed"] == results["best_seed"])
    for name in best_run["submission"]:  # in best/, copied with it from the best seed
        print(f"GLUE test predictions: {os.path.join(results['best_model_dir'], 'submission', name)}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
