"""Fine-tuning: one training loop, evaluation every epoch, the best model kept, several seeds.

`finetune(task, ...)` reads the task's examples and featurizes them, builds its head in
`strategy.scope()`, loads the encoder from `init_checkpoint` (any format
`convert.from_pretrained` reads: our pretraining output `<pretrain model_dir>/discriminator`, a
TF1 release, a Hugging Face folder) or starts from random weights, and trains with the original
optimizer (`AdamWeightDecay`, warmup 10%, linear decay, layer-wise learning-rate decay). After
every epoch (and at the end of a fractional one) it evaluates with the task's metrics and, when
the main metric improves, writes the model to `model_dir/best/`. `run_seeds` repeats this for
several seeds and reports the median and spread, as the paper does.

What depends on the kind of task (reading files, featurizing, the head, metrics, prediction
files, GLUE submissions) is the task family's (`families/`: one class per family); this module
is the loop around it and never asks which family it runs.

Text is lower-cased and accent-stripped or not as the checkpoint's vocabulary was built
(`data.casing`: an HF `tokenizer_config.json`, our pretraining records, a release's folder name;
uncased when nothing says), unless `lower_case` is given; `head_config.json` records it for the
exporter.

Layout of `model_dir` after `finetune`:

    model_dir/
      best/                     the fine-tuned model with the best main metric (see below),
                                and what describes it, written with it:
        finetuning_config.json  the FinetuningConfig used
        results.json            this run: seed, best epoch, best metrics, every epoch's metrics
        predictions/epoch_<e>.jsonl         (the family's prediction files: JSONL records, or
        predictions/epoch_<e>.json [+ epoch_<e>_null_odds.json]    SQuAD's for QA)
        predictions/epoch_<e>_<set>.jsonl   a second evaluation set (MNLI: dev_mismatched)
      results.json -> best/results.json, predictions -> best/predictions   (links)
      logs/train, logs/eval     TensorBoard: loss, learning_rate, steps_per_sec; eval metrics
                                (every run's: a run adds event files)

The run's config and predictions live in `best/` because they describe its model: written
beside it at the top level, as they were, a killed `--overwrite` rerun left the old `best/` under
the new run's config and predictions. The top-level names are links into `best/`, so they change
with it in its one swap (`_RunFolder`).

With several evaluation sets (MNLI's matched and mismatched dev files) each is evaluated and
reported; the first ("dev", MNLI's matched set) picks the best epoch, the others' metrics carry
their name (`dev_mismatched_accuracy`). GLUE test files found with `data_dir` are predicted once
after training, with the best epoch's weights, into `best/submission/<MRPC.tsv, MNLI-m.tsv, ...>`
in the GLUE submission format (`glue.py`).

`run_seeds(..., num_seeds=N)` writes `model_dir/results.json` with every run and, per metric,
median / mean / min / max / std. One seed runs in `model_dir` itself (the layout above); several
run in `model_dir/seed_<s>/` each, and `model_dir/best/` is a copy of the best seed's `best/`
(`best_seed` in results.json). Either way the fine-tuned model is `model_dir/best/`.

The saved fine-tuned model `best/` is what `saving.py` writes and reads (`load_finetuned`).

SIGTERM or SIGINT stops a run after the running batch (at once in set-up and evaluation):
`preemption.Interrupted` (exit status 128 + the signal, 143 / 130) after one logged line naming
the step and the folder. Nothing of the stopped run is published (a finished `best/` already in
`model_dir` and its results.json stay), so the same command starts it again cleanly. Fine-tuning
keeps no mid-run checkpoint, so unlike pretraining's preemption (exit 0, resumed) a stop here is
not a success.

Inputs of every head: int32 `input_ids`, `input_mask`, `segment_ids` laid out as `features.py`
describes ([batch, max_seq_length]; multiple choice [batch, choices, max_seq_length]). Outputs:
`heads.py`.

Example:
    result = finetune("rotten_tomatoes", finetuning_config=FinetuningConfig(num_train_epochs=1),
                      init_checkpoint="pretrain_out/discriminator", model_dir="ft/rt")
    head, description, vocab = load_finetuned("ft/rt")  # electra_tf.finetune.saving
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from electra_tf import files
from electra_tf.run_folder import RunFolderError
from electra_tf.config import ElectraConfig
from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.finetune.config import FinetuningConfig, check_model_dir
from electra_tf.finetune.families import FAMILIES, Features, TaskFamily, get_family
from electra_tf.finetune.saving import FinetunedModelConfig, describe_finetuned, save_finetuned
from electra_tf.finetune.task_data import data_files, infer_label_names, load_examples
from electra_tf.finetune.tasks import Task, generic_task, get_task
from electra_tf.training import preemption, summaries


def _log(message: str) -> None:
    from absl import logging

    logging.info(message)


def _warn(message: str) -> None:
    from absl import logging

    logging.warning(message)


def _warner(log: Callable[[str], None]) -> Callable[[str], None]:
    """Warnings go to absl's log, or to a caller's `log` prefixed "WARNING: "."""
    return _warn if log is _log else (lambda message: log("WARNING: " + message))


# ---------------------------------------------------------------------------------------
# The fine-tuning loop.
# ---------------------------------------------------------------------------------------


def finetune(task, model_config=None, finetuning_config: FinetuningConfig | None = None, *,
             train_examples=None, eval_examples=None, train_path=None, eval_path=None,
             data_dir=None, tfds_data_dir=None, init_checkpoint=None, vocab_file=None,
             lower_case: bool | None = None, model_dir, strategy=None, seed: int = 0,
             max_train_examples: int | None = None, max_eval_examples: int | None = None,
             model_size: str | None = None, log: Callable[[str], None] = _log,
             overwrite: bool = False, settings: dict | None = None,
             published=None) -> dict:
    """Fine-tunes one model on `task`; returns this run's results (also in model_dir/results.json).

    Args:
      task: a `Task` or a task name ("rte", "squad2.0", "rotten_tomatoes", ...).
      model_config: `ElectraConfig` (or name / path) for random initialisation; ignored in favour
        of the checkpoint's config when `init_checkpoint` is given.
      finetuning_config: a `FinetuningConfig`, or None / a dict of overrides of the original's
        defaults for the model's size (from its hidden size) and the task.
      train_examples / eval_examples: examples; otherwise read from `train_path` / `eval_path`,
        else from `data_dir` (`task_data.data_files`: a GLUE task's folder as the GLUE download
        script writes it, with its test files), else the task's TFDS data (`tfds_data_dir`) or
        packaged data (Rotten Tomatoes).
      init_checkpoint: pretrained discriminator (any `from_pretrained` format or released
        model name, e.g. "google/electra-base-discriminator") or None.
      vocab_file: WordPiece vocabulary; default the checkpoint's vocab.txt.
      lower_case: lower-case and strip accents (uncased vocabulary) or not (cased); None takes
        what the checkpoint records (`data.casing.resolve_lower_case`), else uncased.
      model_dir: output folder (layout in the module docstring).
      strategy: a `tf.distribute.Strategy`, a strategy name, or None (one device).
      seed: seeds weight init of the head (and of a random encoder), dropout and data order.
      max_train_examples / max_eval_examples: keep that many (a fixed shuffle), for quick runs.
      model_size: "small" / "base" / "large" for the defaults (default: from the hidden size).
      log: where progress lines go.
      overwrite: replace a finished model of other settings in model_dir (refused otherwise,
        `check_finished_run`); either way the old `best/` stays until the new one is complete.
      settings: what to record as this run's request (`request_settings`; default: from the
        arguments above).
      published: a function of this run's results giving the results.json to publish with its
        model (run_seeds: the summary over one seed), or None for the results themselves.

    Returns:
      {"seed", "best_epoch", "best" (metrics of the best epoch; a second evaluation set's
       metrics prefixed with its name, e.g. "dev_mismatched_accuracy"), "history", "model_dir",
       "best_model_dir", "num_train_examples", "num_eval_examples", "train_steps",
       "lower_case", "submission" (GLUE test prediction files written, by name)}.
    """
    from electra_tf.convert.names import resolve_checkpoint
    from electra_tf.training.strategy import is_chief

    # A released model's name -> its local folder, where its vocabulary and casing are read.
    init_checkpoint = resolve_checkpoint(init_checkpoint)
    check_model_dir(model_dir, init_checkpoint)  # before the lock file: a refusal changes nothing
    strategy = resolve_strategy(strategy)
    out = _RunFolder(Path(model_dir), is_chief(strategy))  # only the chief writes (multi-worker)
    # SIGTERM / SIGINT: `preemption.Interrupted` after the running batch (or at once in set-up
    # and evaluation). Nothing of this run is published; the rerun starts it again.
    stop = preemption.StopRequest(at_once=True)
    try:
        with stop:
            return _finetune(out, task, model_config, finetuning_config, train_examples=train_examples,
                             eval_examples=eval_examples, train_path=train_path, eval_path=eval_path,
                             data_dir=data_dir, tfds_data_dir=tfds_data_dir, init_checkpoint=init_checkpoint,
                             vocab_file=vocab_file, lower_case=lower_case, strategy=strategy, seed=seed,
                             max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
                             model_size=model_size, log=log, overwrite=overwrite, settings=settings,
                             published=published, stop=stop)
    except preemption.Interrupted as e:
        kept = " (the model already in best/ is)" if (out.path / "best").is_dir() else ""
        message = (f"{e} of seed {seed} in {out.path}: nothing of this run is kept{kept}; run "
                   "the same command to fine-tune it again")
        _warner(log)(message)
        raise preemption.Interrupted(message, e.signum) from None
    finally:
        out.close()


def request_settings(task, model_config=None, finetuning_config=None, **given) -> dict:
    """What a run was asked for, as recorded in results.json ("settings") and compared when a
    later run targets the same model_dir: the task, the starting point, the hyperparameter
    overrides, the data files and limits (`given`: their keyword arguments). Examples given in
    memory (`train_examples`, `eval_examples`) are recorded by their number."""
    def plain(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if hasattr(value, "to_dict"):
            return plain(value.to_dict())
        if dataclasses.is_dataclass(value):
            return plain(dataclasses.asdict(value))
        if isinstance(value, os.PathLike):
            return os.path.abspath(value)
        return repr(value)

    paths = {"init_checkpoint", "train_path", "eval_path", "data_dir", "vocab_file"}
    settings = {"task": plain(task), "model_config": plain(model_config),
                "finetuning_config": plain(finetuning_config)}
    for name, value in given.items():
        if name in ("train_examples", "eval_examples") and value is not None:
            value = len(value)
        if name in paths and isinstance(value, (str, os.PathLike)):
            value = os.path.abspath(os.path.expanduser(value))
        settings[name] = plain(value)
    return settings


def _finetune(out: "_RunFolder", task, model_config, finetuning_config, *, train_examples,
              eval_examples, train_path, eval_path, data_dir, tfds_data_dir, init_checkpoint,
              vocab_file, lower_case, strategy, seed, max_train_examples, max_eval_examples,
              model_size, log, overwrite, settings, published, stop) -> dict:
    import keras

    if settings is None:
        settings = request_settings(
            task, model_config, finetuning_config, init_checkpoint=init_checkpoint,
            train_path=train_path, eval_path=eval_path, data_dir=data_dir, vocab_file=vocab_file,
            lower_case=lower_case, seed=seed, max_train_examples=max_train_examples,
            max_eval_examples=max_eval_examples, model_size=model_size,
            train_examples=train_examples, eval_examples=eval_examples)
    out.check_rerun(settings, overwrite)
    task, files_ = _task_and_files(task, data_dir, train_path, eval_path)
    family = get_family(task.family)
    encoder = _Encoder.of(init_checkpoint, model_config, vocab_file)
    tokenizer, lower_case = encoder.tokenizer(lower_case, log=log, warn=_warner(log))
    fc = _finetuning_config(finetuning_config, encoder.config, task, model_size)
    out.write_config("finetuning_config.json", fc)
    data = _TaskData.load(family, task, files_, tokenizer, fc, train_examples=train_examples,
                          eval_examples=eval_examples, tfds_data_dir=tfds_data_dir,
                          max_train_examples=max_train_examples, max_eval_examples=max_eval_examples)
    _check_batch_sizes(finetuning_config, fc, data)
    steps = _Steps.of(data.num_train, fc.train_batch_size, fc.num_train_epochs)
    _log_plan(task, data, steps, fc.train_batch_size, seed, log)

    keras.utils.set_random_seed(seed)
    head, optimizer = _build_model(family, task, encoder, fc, strategy, steps.total)
    train_step, step_choice = _train_step(head, optimizer, strategy, data.train,
                                          fc.train_batch_size, seed, fc.jit_compile,
                                          total_steps=steps.total, log=log)
    log(step_choice.line())
    logbook = _TrainingLog(out, steps.total, fc.log_every_steps, log, per_epoch=steps.per_epoch,
                           learning_rate=fc.learning_rate)
    best = _BestEpoch(fc.keep_best, keep_weights=bool(data.test_sets))
    for step in range(1, steps.total + 1):
        stop.progress = f"{step - 1} of {steps.total} steps"
        stop.check()  # a signal that arrived in the last batch and was not raised yet
        lr = float(optimizer.learning_rate)  # this step's rate (the schedule at `iterations`)
        logbook.train(step, float(train_step()), lr)
        if step in steps.evaluations:
            epoch = steps.epoch(step)
            results, records = _evaluate_sets(head, task, data.eval_sets, fc, strategy)
            logbook.evaluation(step, epoch, results)
            out.write_predictions(family, records, out.epoch_predictions, f"epoch_{epoch:g}")
            if best.update(head, epoch, step, results):
                description = describe_finetuned(head, task, fc, lower_case=lower_case, epoch=epoch,
                                                 metrics=results, seed=seed)
                out.save_best(head, description, encoder.vocab_file, family, records)
    logbook.close()
    submission = _write_submissions(head, family, task, data.test_sets, best, fc, strategy, out, log)
    return out.write_results(published, dict(
        task=task.name, seed=seed, main_metric=list(task.metrics.main),
        best_epoch=best.epoch, best=best.metrics, history=logbook.history,
        model_dir=str(out.path), best_model_dir=str(out.path / "best"),
        num_train_examples=len(data.train_examples), num_eval_examples=len(data.eval_sets["dev"].examples),
        train_steps=steps.total, init_checkpoint=encoder.init_checkpoint, lower_case=lower_case,
        submission=submission, settings=json.loads(json.dumps(settings, default=str)),
        step_path=step_choice.record()))


# ---------------------------------------------------------------------------------------
# Set-up: strategy, task and files, encoder, hyperparameters, data, model.
# ---------------------------------------------------------------------------------------


def resolve_strategy(strategy=None):
    """A `tf.distribute.Strategy`: given, by name (`training.strategy.create_strategy`), or the
    default (one device) for None."""
    import tensorflow as tf

    if strategy is None:
        return tf.distribute.get_strategy()
    if isinstance(strategy, str):
        from electra_tf.training.strategy import create_strategy

        return create_strategy(strategy)
    return strategy


def _task_and_files(task, data_dir, train_path, eval_path):
    """(the task with its label names, its local files)."""
    task = get_task(task) if isinstance(task, str) else task
    files = data_files(task, data_dir, train_path=train_path, eval_path=eval_path)
    return _resolve_task(task, files.train), files


def _resolve_task(task, train_path) -> Task:
    task = get_task(task) if isinstance(task, str) else task
    if get_family(task.family).has_label_names and task.label_names is None:
        if train_path is None:
            raise ValueError(f"task {task.name!r}: label_names are not set; give them or a train file "
                             "to infer them from")
        task = task.with_label_names(infer_label_names(task, train_path))
    return task


def pretrained_encoder(init_checkpoint):
    """(config, vocab_path or None, {variable path: numpy value}) of a pretrained discriminator."""
    from electra_tf.convert.pretrained import from_pretrained

    model, config, vocab = from_pretrained(init_checkpoint, "discriminator")
    return config, vocab, {v.path: v.numpy() for v in model.weights}


def assign_encoder_weights(head, values: dict, source="checkpoint") -> None:
    """Copies pretrained values into `head.encoder`, matched by variable path.

    Every encoder variable must be found with the same shape; the checkpoint's RTD / MLM heads
    are not used.
    """
    for variable in head.encoder.weights:
        value = values.get(variable.path)
        if value is None:
            raise ValueError(f"{source}: no variable {variable.path!r} for the encoder "
                             f"(it has e.g. {sorted(values)[:3]})")
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{source}: {variable.path!r} has shape {tuple(value.shape)}, "
                             f"the encoder built from its config {tuple(variable.shape)}")
        variable.assign(value)


def load_encoder_weights(head, init_checkpoint) -> ElectraConfig:
    """`assign_encoder_weights` from a checkpoint path; returns the checkpoint's config."""
    config, _, values = pretrained_encoder(init_checkpoint)
    assign_encoder_weights(head, values, init_checkpoint)
    return config


@dataclasses.dataclass
class _Encoder:
    """Where the encoder comes from: its config and vocabulary, and a checkpoint's weights
    (`values`, variable path -> value; None for random initialisation)."""

    config: ElectraConfig
    vocab_file: str
    init_checkpoint: str | None = None
    values: dict | None = None

    @classmethod
    def of(cls, init_checkpoint, model_config, vocab_file) -> "_Encoder":
        if init_checkpoint is not None:
            config, checkpoint_vocab, values = pretrained_encoder(init_checkpoint)
            vocab_file = vocab_file or checkpoint_vocab
        else:
            if model_config is None:
                raise ValueError("give init_checkpoint (a pretrained discriminator) or model_config "
                                 "(random initialisation)")
            config = model_config if isinstance(model_config, ElectraConfig) else ElectraConfig.from_json(model_config)
            config = config if vocab_file is None else config.with_vocab(vocab_file)
            values = None
        if vocab_file is None:
            raise ValueError(f"no vocabulary: {init_checkpoint or 'the model config'} has no vocab.txt; "
                             "pass vocab_file")
        return cls(config, vocab_file, None if init_checkpoint is None else str(init_checkpoint), values)

    def tokenizer(self, lower_case: bool | None, *, log, warn):
        """(WordPiece tokenizer, lower_case): the casing given, else the checkpoint's."""
        from electra_tf.data.casing import resolve_lower_case
        from electra_tf.data.tokenizer import WordpieceTokenizer, load_vocab

        vocab = load_vocab(self.vocab_file)
        lower_case = resolve_lower_case(lower_case, self.init_checkpoint, vocab, log=log, warn=warn)
        tokenizer = WordpieceTokenizer(self.vocab_file, lower_case=lower_case)
        if tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"{self.vocab_file}: {tokenizer.vocab_size} tokens, but the model's "
                             f"vocab_size is {self.config.vocab_size}")
        return tokenizer, lower_case


def _finetuning_config(finetuning_config, config: ElectraConfig, task: Task, model_size) -> FinetuningConfig:
    """The config given, or the original's defaults for the model size and task with a dict of
    overrides; its max_seq_length must fit the encoder's positions."""
    if finetuning_config is None or isinstance(finetuning_config, dict):
        size = model_size or config.model_size
        fc = FinetuningConfig.for_model_size(size, task, **(finetuning_config or {}))
    else:
        fc = finetuning_config
    if fc.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {fc.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings} (its longest "
                         "input); give at most that")
    return fc


def _subsample(examples: list, limit: int | None, seed: int = 0) -> list:
    """The first `limit` examples of a fixed shuffle (files may be sorted by label)."""
    if not limit or len(examples) <= limit:
        return list(examples)
    order = np.random.default_rng(seed).permutation(len(examples))[:limit]
    return [examples[i] for i in sorted(order)]


def _check_labels(task: Task, family: TaskFamily, examples, split: str) -> None:
    missing = family.unlabeled(examples)
    if missing:
        raise ValueError(f"task {task.name!r}: {missing} {split} examples have no label; "
                         "fine-tuning and evaluation need labeled data")


@dataclasses.dataclass
class _TaskData:
    """The run's examples, featurized: training arrays, evaluation sets by name ("dev" first:
    its main metric picks the best epoch), GLUE test sets by submission file name."""

    train_examples: list
    train: dict  # numpy arrays: the head's inputs and labels
    eval_sets: dict  # name -> Features
    test_sets: dict  # submission file name -> Features (unlabeled)

    @property
    def num_train(self) -> int:
        return len(self.train["input_ids"])

    @classmethod
    def load(cls, family: TaskFamily, task: Task, files, tokenizer, fc: FinetuningConfig, *,
             train_examples=None, eval_examples=None, tfds_data_dir=None,
             max_train_examples=None, max_eval_examples=None) -> "_TaskData":
        """Examples given, else from the task's files, else its TFDS / packaged data."""
        if train_examples is None:
            train_examples = load_examples(task, "train", path=files.train, data_dir=tfds_data_dir)
        eval_sets = {"dev": eval_examples} if eval_examples is not None else {
            name: load_examples(task, name, path=path) for name, path in files.dev.items()}
        if not eval_sets:
            eval_sets = {"dev": load_examples(task, "dev", data_dir=tfds_data_dir)}
        train_examples = _subsample(train_examples, max_train_examples)
        _check_labels(task, family, train_examples, "train")
        train = family.featurize(task, train_examples, tokenizer, fc, training=True).arrays
        featurized = {}
        for name, examples in eval_sets.items():
            examples = _subsample(examples, max_eval_examples)
            _check_labels(task, family, examples, name)
            featurized[name] = family.featurize(task, examples, tokenizer, fc, training=False)
        tests = {name: family.featurize(task, load_examples(task, "test", path=path), tokenizer, fc,
                                        training=False) for name, path in files.test.items()}
        return cls(train_examples, train, featurized, tests)


@dataclasses.dataclass(frozen=True)
class _Steps:
    """Training steps: per epoch, in all, and those after which the model is evaluated (every
    epoch's end and the last step)."""

    per_epoch: int
    total: int

    @classmethod
    def of(cls, num_train: int, batch: int, epochs: float) -> "_Steps":
        return cls(max(1, num_train // batch), max(1, int(num_train * epochs / batch)))

    @property
    def evaluations(self) -> list[int]:
        return sorted({*range(self.per_epoch, self.total + 1, self.per_epoch), self.total})

    def epoch(self, step: int) -> float:
        return round(step / self.per_epoch, 3)


def _check_batch_sizes(requested, fc: FinetuningConfig, data: _TaskData) -> None:
    """Refuses a batch size asked for as an override (the command line's --train_batch_size,
    --eval_batch_size) that is larger than the data it batches, naming the flag and the count.

    A training batch larger than the set is filled by repeating examples (a repeated pass): a
    batch of 100,000 over 64 examples ran 100,000 rows a step, grew to 19 GB after a warning and
    was killed for memory. Nobody asks for that on purpose. A default batch larger than a small
    set (or one of a FinetuningConfig given whole) keeps the warning of `_log_plan`: the run is
    then one step that sees every example.
    """
    given = requested if isinstance(requested, dict) else {}
    evaluation = max(data.eval_sets.values(), key=lambda d: len(d.arrays["input_ids"]))
    for name, what, examples, inputs in (
            ("train_batch_size", "training", len(data.train_examples), data.num_train),
            ("eval_batch_size", "largest evaluation", len(evaluation.examples),
             len(evaluation.arrays["input_ids"]))):
        if name in given and getattr(fc, name) > inputs:
            counted = f"{examples} examples" + (f", {inputs} inputs" if inputs != examples else "")
            raise ValueError(f"--{name} {getattr(fc, name)} is larger than the {what} data "
                             f"({counted}); give at most {inputs}")


def _log_plan(task: Task, data: _TaskData, steps: _Steps, batch: int, seed: int, log) -> None:
    if data.num_train < batch:
        _warner(log)(f"{task.name}: the training set ({data.num_train} inputs) is smaller than one "
                     f"batch of {batch}: every batch repeats examples, {steps.total} step(s) in all "
                     "(a smaller train_batch_size gives more steps)")
    log(f"{task.name}: {len(data.train_examples)} train examples ({data.num_train} inputs), "
        + ", ".join(f"{len(d.examples)} {name}" for name, d in data.eval_sets.items())
        + "".join(f", {len(d.examples)} test ({name})" for name, d in data.test_sets.items())
        + f"; {steps.total} steps of {batch} ({steps.per_epoch} per epoch), seed {seed}")


def _build_model(family: TaskFamily, task: Task, encoder: _Encoder, fc: FinetuningConfig,
                 strategy, total_steps: int):
    """(head, optimizer) in the strategy's scope; the head's encoder takes the checkpoint's
    weights (then freed: the head holds them)."""
    with strategy.scope():
        head = family.build_head(encoder.config, task, fc)
        if encoder.values is not None:
            assign_encoder_weights(head, encoder.values, encoder.init_checkpoint)
            encoder.values = None
        optimizer = create_finetuning_optimizer(fc, encoder.config.num_layers, total_steps)
        optimizer.build(head.trainable_variables)
    return head, optimizer


def _train_step(head, optimizer, strategy, arrays: dict, batch: int, seed: int,
                jit_compile: bool | None = None, *, total_steps: int = 0, log=None):
    """(a function that takes one optimizer step on the next global batch and returns its loss,
    the `step_path.StepPath` it runs on).

    Batches of a shuffled, repeated pass over `arrays` (reshuffled every pass, seeded). Each
    replica's loss is its share of the global-batch mean (its per-example losses summed, divided
    by the global batch): Keras sums the replicas' gradients (`training.optimizer`). The replica
    step is a graph or XLA-compiled as `jit_compile` says; None: the faster on this CPU for a
    run of `total_steps` (`training.step_path.choose`: a probe on an input of its own whose
    steps are undone).
    """
    import tensorflow as tf

    from electra_tf.training import step_path

    # No tf.data autotuning: nothing here is tunable (a fixed prefetch), and an autotuned
    # iterator's destructor waits for the autotune thread's next wake-up, which stalled the end of
    # a run for up to ~35 s (seen in `gdb`: ~Iterator joining Model::OptimizeLoop).
    options = tf.data.Options()
    options.autotune.enabled = False

    def distributed_input():
        # A dataset object of its own each time: its shuffle's seed state advances with every
        # iterator made from it, so the probe's input must not come from the run's dataset.
        dataset = (tf.data.Dataset.from_tensor_slices(arrays)
                   .shuffle(len(arrays["input_ids"]), seed=seed, reshuffle_each_iteration=True)
                   .repeat().batch(batch, drop_remainder=True).prefetch(2).with_options(options))
        return iter(strategy.experimental_distribute_dataset(dataset))

    def step_fn(features):
        with tf.GradientTape() as tape:
            outputs = head(features, training=True)
            loss = tf.reduce_sum(head.per_example_loss(features, outputs)) / batch
        grads = tape.gradient(loss, head.trainable_variables)
        optimizer.apply_gradients(zip(grads, head.trainable_variables))
        return loss

    steps = {}

    def step_for(jit: bool):
        if jit not in steps:
            replica_step = tf.function(step_fn, jit_compile=jit, reduce_retracing=True)

            @tf.function
            def train_step(iterator):
                losses = strategy.run(replica_step, args=(next(iterator),))
                return strategy.reduce("SUM", losses, axis=None)

            steps[jit] = train_step
        return steps[jit]

    probe_input = []

    def runner(jit: bool):
        train_step = step_for(jit)
        if not probe_input:
            probe_input.append(distributed_input())

        def run(n):
            for _ in range(n):
                loss = train_step(probe_input[0])
            float(loss)

        return run

    def snapshot():
        return step_path.Snapshot([*head.variables, *optimizer.variables])

    key = repr((type(head).__name__, [(v.path, tuple(v.shape)) for v in head.variables],
                {k: v.shape[1:] for k, v in arrays.items()}, batch,
                type(strategy).__name__, strategy.num_replicas_in_sync))
    choice = step_path.choose(jit_compile, strategy=strategy, remaining_steps=total_steps,
                              runner=runner, snapshot=snapshot, memo_key=key,
                              log=log)
    iterator = distributed_input()
    train_step = step_for(choice.jit_compile)
    return (lambda: train_step(iterator)), choice


def warmup_steps(fc: FinetuningConfig, total_steps: int) -> float:
    """`warmup_proportion` of the steps, or none when that is under one step.

    The warmup multiplies the rate by step / warmup, which is 0 at the first step (step 0): a
    warmup shorter than one step only zeroes that step, and a run of one step (a training set
    smaller than a batch) would learn nothing at all."""
    warmup = fc.warmup_proportion * total_steps
    return warmup if warmup >= 1 else 0.0


def create_finetuning_optimizer(fc: FinetuningConfig, num_layers: int, total_steps: int):
    """The original fine-tuning optimizer: AdamWeightDecay, warmup then linear decay, layer-wise
    learning-rate decay over `num_layers` encoder layers (see `training.optimizer`)."""
    from electra_tf.training.optimizer import create_optimizer

    return create_optimizer(
        "adamw", fc.learning_rate, total_steps, warmup_steps(fc, total_steps),
        weight_decay=fc.weight_decay, clip_norm=fc.clip_norm,
        layerwise_decay=fc.layerwise_decay_or_none, num_layers=num_layers,
        match_original_layerwise=fc.match_original_layerwise)


# ---------------------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------------------


def predict_outputs(head, strategy, inputs: dict, batch_size: int) -> dict:
    """Runs `head` (inference mode) over numpy inputs in batches; returns numpy outputs."""
    import tensorflow as tf

    n = len(inputs["input_ids"])
    # A batch larger than the data would be padded to its size (an eval_batch_size of 100,000
    # on 16 examples: 100,000 rows through the model); one batch of the data gives the same.
    batch_size = min(batch_size, max(n, strategy.num_replicas_in_sync))
    padded = int(math.ceil(n / batch_size)) * batch_size
    arrays = {k: np.concatenate([inputs[k], np.zeros((padded - n,) + inputs[k].shape[1:], inputs[k].dtype)])
              for k in INPUT_KEYS}
    # Padding rows have input_mask 0 everywhere; give them one real token so softmaxes stay finite.
    arrays["input_mask"][n:, 0] = 1
    dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)
    dataset = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(batch):
        outputs = strategy.run(lambda f: head(f, training=False), args=(batch,))
        return {k: strategy.gather(v, axis=0) for k, v in outputs.items()}

    collected: dict[str, list] = {}
    for batch in dataset:
        for key, value in step(batch).items():
            collected.setdefault(key, []).append(value.numpy())
    return {k: np.concatenate(v)[:n] for k, v in collected.items()}


def evaluate(head, task: Task, data: Features, fc: FinetuningConfig, strategy=None):
    """Task metrics (with "main") and the prediction records of one evaluation pass over
    `data` (the task family's `featurize(..., training=False)`)."""
    outputs = predict_outputs(head, resolve_strategy(strategy), data.arrays, fc.eval_batch_size)
    results, records = get_family(task.family).evaluate(task, data, outputs, fc)
    return {k: float(v) for k, v in results.items()}, records


def _evaluate_sets(head, task: Task, eval_sets: dict, fc: FinetuningConfig, strategy):
    """(metrics of every set, "dev"'s under their names and the others' prefixed with the set's
    name, without their "main"; the prediction records by set)."""
    results, records = {}, {}
    for name, data in eval_sets.items():
        scores, records[name] = evaluate(head, task, data, fc, strategy)
        prefix = "" if name == "dev" else f"{name}_"
        results.update({prefix + k: v for k, v in scores.items() if name == "dev" or k != "main"})
    return results, records


class _BestEpoch:
    """The epoch with the best main metric (with `keep_best` false: the last epoch), and its
    weights when `keep_weights` (the test sets are predicted with them after training)."""

    def __init__(self, keep_best: bool, keep_weights: bool):
        self.keep_best, self.keep_weights = keep_best, keep_weights
        self.epoch, self.metrics, self.score, self.weights = None, None, -math.inf, None

    def update(self, head, epoch: float, step: int, results: dict) -> bool:
        """Records this evaluation if it is the new best; returns whether it is."""
        score = results["main"] if math.isfinite(results["main"]) else -math.inf
        if self.metrics is not None and score <= self.score and self.keep_best:
            return False
        self.epoch, self.metrics, self.score = epoch, dict(results), score
        if self.keep_weights:
            self.weights = [v.numpy() for v in head.weights]
        return True


class _TrainingLog:
    """The run's progress: the mean training loss, learning rate and speed every
    `log_every_steps` (log line and TensorBoard `logs/train`), evaluation metrics (log line,
    `logs/eval` and `history`)."""

    def __init__(self, out: "_RunFolder", total_steps: int, every_n: int, log, *, per_epoch: int = 0,
                 learning_rate: float | None = None):
        import tensorflow as tf

        from electra_tf.progress import ProgressLogger

        # logs/ and its folders are made here, each refused when it is a link (`files.own_folder`;
        # logs/ first: making logs/train would follow a link at logs/): TensorFlow's writer would
        # put its events in the link's target.
        logs = files.own_folder(out.path / "logs") if out.chief else None
        self.writers = {name: tf.summary.create_file_writer(str(files.own_folder(logs / name)))
                        if out.chief else tf.summary.create_noop_writer() for name in ("train", "eval")}
        self.progress = ProgressLogger(total_steps, every_n=every_n, log_fn=lambda fmt, *args: log(fmt % args))
        self.log, self.history = log, []
        self.loss_sum, self.loss_count, self.last_time, self.last_step = 0.0, 0, time.time(), 0
        self.model_dir, self.per_epoch, self.learning_rate = out.path, per_epoch, learning_rate

    def train(self, step: int, loss: float, lr: float) -> None:
        if not math.isfinite(loss):
            self.diverged(step, loss)
        self.loss_sum += loss
        self.loss_count += 1
        if not self.progress.due(step):
            return
        mean_loss = self.loss_sum / self.loss_count
        self.progress.update(step, loss=mean_loss, lr=lr)
        now = time.time()
        with self.writers["train"].as_default():
            summaries.scalar("loss", mean_loss, step=step)
            summaries.scalar("learning_rate", lr, step=step)
            summaries.scalar("steps_per_sec", (step - self.last_step) / max(now - self.last_time, 1e-9), step=step)
        self.loss_sum, self.loss_count, self.last_time, self.last_step = 0.0, 0, now, step

    def diverged(self, step: int, loss: float) -> None:
        """Raises `NonFiniteLossError` (the pretraining loop's: one line from the binaries) naming
        the step, the loss and what to try. Every step's loss is checked, not only the logged
        means: weights gone NaN would otherwise be evaluated and saved as the best epoch."""
        from electra_tf.training.loop import NonFiniteLossError

        epoch = f" (epoch {math.ceil(step / self.per_epoch)})" if self.per_epoch else ""
        rate = f" (it is {self.learning_rate:g})" if self.learning_rate is not None else ""
        best = self.model_dir / "best"
        kept = (f"the finished model in {best} is kept" if best.is_dir()
                else "no model of this run is kept")
        raise NonFiniteLossError(
            f"training diverged: the loss is {loss} at step {step}{epoch}; lower --learning_rate"
            f"{rate}, or check the training labels (a label far larger than the others, say); "
            f"{kept}")

    def evaluation(self, step: int, epoch: float, results: dict) -> None:
        self.history.append({"epoch": epoch, "step": step, **results})
        with self.writers["eval"].as_default():
            for name, value in results.items():
                summaries.scalar(name, value, step=step)
        self.log(f"eval epoch {epoch:g}: " + ", ".join(f"{k} {v:.4g}" for k, v in results.items()))

    def close(self) -> None:
        for writer in self.writers.values():
            writer.flush()


# ---------------------------------------------------------------------------------------
# What a run writes.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _RunFolder:
    """`model_dir`: what a run writes there. Only the chief writes (multi-worker: the other
    workers run the same loop and write nothing).

    A finished model is never lost (`electra_tf.files`): the chief locks the folder for the run;
    the run's config, every epoch's predictions and the best epoch are written to a private
    staging folder, and only when the run is complete is it swapped in for `best/` in one step,
    with this run's `results.json` inside it, so that the top-level `results.json` and
    `predictions` (links into `best/`) and `best/` always change together. A kill at any instant
    leaves the previous `best/` and what describes it, or the new ones.
    """

    path: Path
    chief: bool

    def __post_init__(self):
        self.staging = None
        self.lock = None
        if self.chief:
            self.lock = files.FolderLock(self.path, "electra-finetune").acquire()
            files.recover_folder(self.path / "best")
            files.remove_stale_temporaries(self.path)

    def check_rerun(self, settings: dict, overwrite: bool) -> None:
        """Refuses a folder that holds a finished model of other `settings` (unless `overwrite`);
        the old model stays until this run's is complete either way."""
        if self.chief:
            check_finished_run(self.path, settings, overwrite)

    def write_config(self, name: str, config) -> None:
        if self.chief:
            config.to_json(self.best_in_progress / name)

    def write_json(self, name: str, value: dict) -> None:
        if self.chief:
            files.write_json(self.path / name, value)

    def write_predictions(self, family: TaskFamily, records: dict, folder: Path, stem: str) -> None:
        """Each evaluation set's records as the family writes them: `<stem>` for "dev",
        `<stem>_<set>` for another set."""
        if self.chief:
            for name, set_records in records.items():
                family.write_predictions(set_records, folder, stem if name == "dev" else f"{stem}_{name}")

    @property
    def epoch_predictions(self) -> Path:
        """Where every epoch's predictions go: `predictions/` of the staged model."""
        return files.own_folder(self.best_in_progress / PREDICTIONS) if self.chief else self.path

    @property
    def best_in_progress(self) -> Path:
        """Where this run's best model is written until the run is complete."""
        if self.staging is None:
            self.staging = Path(tempfile.mkdtemp(prefix=".best.staging-", dir=self.path))
        return self.staging

    def save_best(self, head, description: FinetunedModelConfig, vocab_file, family: TaskFamily,
                  records: dict) -> None:
        if self.chief:
            folder = save_finetuned(head, self.best_in_progress, description, vocab_file)
            self.write_predictions(family, records, folder, "predictions")

    def write_results(self, published, result: dict) -> dict:
        """Publishes this run's model as `best/` with `result` (or `published(result)`) as its
        results.json; returns `result`."""
        if self.chief:
            publish_best(self.path, self.staging, result if published is None else published(result))
            self.staging = None
        return result

    def close(self) -> None:
        """Drops what an unfinished run staged, and the lock."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None


RESULTS = "results.json"
PREDICTIONS = "predictions"
CONFIG = "finetuning_config.json"


def publish_best(model_dir: Path, staging: Path | None, results: dict) -> None:
    """Puts `staging` (a complete model with its config and predictions) at `model_dir/best/` in
    one step, with `results` as `best/results.json`, and makes `model_dir/results.json` and
    `model_dir/predictions` relative links into it. Without `staging` (no model saved), writes
    results.json alone."""
    model_dir = Path(model_dir)
    top = model_dir / RESULTS
    if staging is None:
        files.write_json(top, results)
        return
    files.write_json(staging / RESULTS, results)
    old = model_dir / "best"
    if os.path.isdir(old) and not os.path.islink(old) and not os.path.lexists(old / RESULTS) \
            and os.path.isfile(top) and not os.path.islink(top):
        # A folder of an earlier version (results.json beside best/, not in it): keep the pair
        # consistent through the switch to the link.
        files.copy_file(top, old / RESULTS)
    _file_away(model_dir / CONFIG, old)
    _file_away(model_dir / PREDICTIONS, old)
    _link(top, f"best/{RESULTS}")
    if (staging / PREDICTIONS).is_dir():
        _link(model_dir / PREDICTIONS, f"best/{PREDICTIONS}")
    files.publish_folder(staging, old)


def _file_away(path: Path, old_best: Path) -> None:
    """The config or predictions an earlier version wrote at the top level of model_dir, beside
    `best/` rather than in it, moved into the `best/` they describe before it is replaced (one
    rename). A file that describes no model (no `best/`, or it has its own) or a link planted
    there is removed; such a folder is left for `_link` to exchange with its link."""
    if not os.path.lexists(path) or (os.path.islink(path) and os.readlink(path) == f"best/{path.name}"):
        return
    if os.path.islink(path) or not (old_best.is_dir() and not old_best.is_symlink()) \
            or os.path.lexists(old_best / path.name):
        if os.path.islink(path) or not path.is_dir():
            os.unlink(path)
        return
    os.rename(path, old_best / path.name)


def _link(path: Path, target: str) -> None:
    """`path` becomes a symlink to `target`, replacing what is there in one step."""
    if os.path.islink(path) and os.readlink(path) == target:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        # A folder cannot be renamed over: the link takes its place in one exchange, and the
        # folder, now under a staging name (removed at the next start if we die), is deleted.
        aside = path.parent / f".{path.name}.staging-{secrets.token_hex(6)}"
        os.symlink(target, aside)
        if not files.exchange(aside, path):
            os.unlink(aside)
            os.rename(path, aside)  # no renameat2: the folder aside, then the link in its place
            os.symlink(target, path)
        shutil.rmtree(aside)
        return
    tmp = files.temporary_name(path)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def finished_settings(model_dir) -> dict | None:
    """The settings recorded with the finished model in `model_dir` ({} for a model of an
    earlier version that recorded none), or None when it holds no finished model."""
    model_dir = Path(model_dir)
    results = model_dir / RESULTS
    if not (model_dir / "best").is_dir() or not results.is_file():
        return None
    try:
        return json.loads(results.read_text()).get("settings") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def _flat(settings: dict) -> dict:
    """Settings with the hyperparameter overrides (a dict) as fields of their own, so that a
    refusal names `learning_rate`, not the whole override dict."""
    out = {}
    for name, value in settings.items():
        if name == "finetuning_config" and isinstance(value, dict):
            out.update(value)
        else:
            out[name] = value
    return out


# Settings of how a run executes, not what it computes: a rerun that changes them reuses the
# finished model (the train step's path changes rounding only).
RUN_FREE_SETTINGS = ("jit_compile",)


def check_finished_run(model_dir, settings: dict, overwrite: bool) -> None:
    """Raises RunFolderError naming every setting that differs when `model_dir` holds a finished
    model fine-tuned otherwise, unless `overwrite`. The same settings rerun (the new model
    replaces the old one only when complete)."""
    recorded = finished_settings(model_dir)
    if recorded is None or overwrite:
        return
    settings = _flat(json.loads(json.dumps(settings, default=str)))
    if not recorded:
        differs = "its settings are not recorded (an earlier version wrote it)"
    else:
        recorded = _flat(recorded)
        names = sorted(k for k in set(recorded) | set(settings)
                       if recorded.get(k) != settings.get(k) and k not in RUN_FREE_SETTINGS)
        if not names:
            return

        def shown(values, name):
            return f"{name}={values[name]!r}" if name in values else f"{name} (default)"

        differs = ("it was fine-tuned with " + ", ".join(shown(recorded, k) for k in names)
                   + ", this run asks for " + ", ".join(shown(settings, k) for k in names))
    raise RunFolderError(
        f"model_dir {model_dir} holds a finished model: {differs}; use another --model_dir, or "
        "--overwrite to replace it (the old model stays until the new one is complete)")


def _write_submissions(head, family: TaskFamily, task: Task, test_sets: dict, best: _BestEpoch,
                       fc: FinetuningConfig, strategy, out: _RunFolder, log) -> dict:
    """Predicts every test set with the best epoch's weights into `best/submission/<name>` (the
    family's submission format); returns {name: path written}."""
    if not test_sets:
        return {}
    for variable, value in zip(head.weights, best.weights):
        variable.assign(value)
    written = {}
    for name, data in test_sets.items():
        outputs = predict_outputs(head, strategy, data.arrays, fc.eval_batch_size)
        if out.chief:
            path = family.write_submission(task, out.best_in_progress / "submission" / name, data, outputs)
            path = out.path / "best" / Path(path).relative_to(out.best_in_progress)  # where it will be
            written[name] = str(path)
            log(f"wrote the {len(data.examples)} test predictions of the best epoch "
                f"({best.epoch:g}) to {path}")
    return written


# ---------------------------------------------------------------------------------------
# Tasks by name, and several seeds.
# ---------------------------------------------------------------------------------------


def task_from_options(name: str, *, text_column=None, text_pair_column=None, label_column=None,
                      labels: Sequence[str] | None = None, has_header: bool = True,
                      version_2: bool = False) -> Task:
    """A predefined task (GLUE names, squad1.1/2.0, rotten_tomatoes) or a family's generic one
    ("classification", "regression", "tagging", "qa", "multiple_choice") for local files, with
    column overrides."""
    key = name.strip().lower()
    task = generic_task(key, version_2) if key in FAMILIES else get_task(name)
    changes = {k: v for k, v in (("text_column", text_column), ("text_pair_column", text_pair_column),
                                 ("label_column", label_column)) if v is not None}
    if not has_header:  # header-less TSV/CSV: columns are 0-based indices
        changes["has_header"] = False
        for k, v in list(changes.items()):
            if k != "has_header":
                try:
                    changes[k] = int(v)
                except ValueError:
                    raise ValueError(f"--{k}: {v!r} must be a column index when the file has no header") from None
    task = dataclasses.replace(task, **changes)
    if labels:
        task = task.with_label_names(labels)
    return task


def summarize(values: Sequence[float]) -> dict:
    """median / mean / min / max / std (sample, 0 for one value) of per-seed scores."""
    x = np.asarray(values, np.float64)
    return {"median": float(np.median(x)), "mean": float(x.mean()), "min": float(x.min()),
            "max": float(x.max()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "values": [float(v) for v in x]}


def _summary_of(runs: list, model_dir: Path) -> dict:
    """The results.json of `run_seeds`: every run, and each best-epoch metric's spread."""
    names = [k for k in runs[0]["best"] if all(k in r["best"] for r in runs)]
    summary = {name: summarize([r["best"][name] for r in runs]) for name in names}
    best_run = max(runs, key=lambda r: r["best"]["main"])
    return {
        "task": runs[0]["task"], "num_seeds": len(runs), "seeds": [r["seed"] for r in runs],
        "main_metric": runs[0]["main_metric"], "summary": summary,
        "median": {name: s["median"] for name, s in summary.items()},
        "best_seed": best_run["seed"], "best_model_dir": str(Path(model_dir) / "best"),
        "best_model": "best", "runs": runs, "settings": runs[0]["settings"],
    }


def run_seeds(task, model_config=None, finetuning_config=None, *, model_dir, num_seeds: int = 1,
              seed: int = 0, overwrite: bool = False, **kwargs) -> dict:
    """Runs `finetune` with seeds seed, seed+1, ...; writes `model_dir/results.json` with every
    run and the median and spread of each best-epoch metric (the paper reports the median over
    seeds). The chosen model is always `model_dir/best/`:

    - one seed: the run's own layout (module docstring) directly in `model_dir`;
    - several: each run in `model_dir/seed_<s>/`, and `model_dir/best/` a copy of the `best/` of
      the seed with the highest main metric (`results.json` "best_seed"), so that export and
      `load_finetuned(model_dir)` take the same folder whatever the number of seeds.

    A model_dir holding a finished model of other settings is refused unless `overwrite`
    (`check_finished_run`); the previous `best/` and results.json stay until the new ones are
    complete and replace them together (`_RunFolder`).
    """
    if num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
    from electra_tf.convert.names import resolve_checkpoint
    from electra_tf.training.strategy import is_chief

    model_dir = Path(model_dir)
    if kwargs.get("init_checkpoint") is not None:  # a released model's name: fetched once
        kwargs["init_checkpoint"] = resolve_checkpoint(kwargs["init_checkpoint"])
    check_model_dir(model_dir, kwargs.get("init_checkpoint"))
    kwargs["strategy"] = resolve_strategy(kwargs.get("strategy"))  # one strategy for every seed
    chief = is_chief(kwargs["strategy"])
    settings = request_settings(
        task, model_config, finetuning_config, seed=seed, num_seeds=num_seeds,
        **{k: v for k, v in kwargs.items() if k not in ("strategy", "log", "tfds_data_dir")})
    lock = files.FolderLock(model_dir, "electra-finetune").acquire() if chief else None
    try:
        if chief:
            check_finished_run(model_dir, settings, overwrite)
        runs = []
        for s in range(seed, seed + num_seeds):
            run_dir = model_dir if num_seeds == 1 else model_dir / f"seed_{s}"
            if chief and run_dir != model_dir:
                files.own_folder(run_dir)  # a link planted at seed_<s> is refused, not followed
            # One seed: its model is best/ itself, published with the summary as results.json.
            published = (lambda run: _summary_of([run], model_dir)) if num_seeds == 1 else None
            runs.append(finetune(task, model_config, finetuning_config, model_dir=run_dir, seed=s,
                                 overwrite=overwrite, settings=settings, published=published,
                                 **kwargs))
        results = _summary_of(runs, model_dir)
        if chief:
            if num_seeds > 1:
                best_run = next(r for r in runs if r["seed"] == results["best_seed"])
                staging = Path(tempfile.mkdtemp(prefix=".best.staging-", dir=model_dir))
                try:
                    shutil.copytree(best_run["best_model_dir"], staging, symlinks=True, dirs_exist_ok=True)
                    files.give_normal_mode(staging)
                    publish_best(model_dir, staging, results)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        return results
    finally:
        if lock is not None:
            lock.release()
