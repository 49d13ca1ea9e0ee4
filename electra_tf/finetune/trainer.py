"""The fine-tuning loop: one model trained on one task with one seed, evaluated every epoch, the
best epoch kept.

`finetune_seed(run, seed, out, published, stop)` takes what the run was asked for, resolved once
(`FinetuningRun`: `seeds.finetune` and `seeds.run_seeds` build it), reads the task's examples and
featurizes them, builds the head in `strategy.scope()` on the encoder `encoder_weights.py`
describes (a checkpoint's weights, or random ones), and trains with the original optimizer
(`train_step.py`: `AdamWeightDecay`, warmup 10%, linear decay, layer-wise learning-rate decay).
After every epoch (and at the end of a fractional one) it evaluates with the task's metrics and,
when the main metric improves, stages the model in the run folder `out`
(`publishing.FinetuningFolder`), which publishes it as `best/` when the run is complete.

What depends on the kind of task (reading files, featurizing, the head, metrics, prediction
files, GLUE submissions) is the task family's (`families/`: one class per family); this module
is the loop around it and never asks which family it runs.

With several evaluation sets (MNLI's matched and mismatched dev files) each is evaluated and
reported; the first ("dev", MNLI's matched set) picks the best epoch, the others' metrics carry
their name (`dev_mismatched_accuracy`). GLUE test files found with `data_dir` are predicted once
after training, with the best epoch's weights, into `best/submission/<MRPC.tsv, MNLI-m.tsv, ...>`
in the GLUE submission format (`glue.py`).

`stop` (`preemption.StopRequest`, made by `seeds.py`, which says what a stop leaves) is checked
before every step: SIGTERM or SIGINT stops the run after the running batch.

Inputs of every head: int32 `input_ids`, `input_mask`, `segment_ids` laid out as `features.py`
describes ([batch, max_seq_length]; multiple choice [batch, choices, max_seq_length]). Outputs:
`heads.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from electra_tf import files
from electra_tf.config import ElectraConfig
from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.encoder_weights import EncoderSource, assign_encoder_weights
from electra_tf.finetune.families import Features, TaskFamily, get_family
from electra_tf.finetune.saving import describe_finetuned
from electra_tf.finetune.task_data import data_files, infer_label_names, load_examples
from electra_tf.finetune.tasks import Task, get_task
from electra_tf.finetune.train_step import create_finetuning_optimizer, make_train_step
from electra_tf.training import preemption, summaries

if TYPE_CHECKING:  # annotations only: the driver (seeds.py) makes the folder
    from electra_tf.finetune.publishing import FinetuningFolder


def log_to_absl(message: str) -> None:
    """The default `log`: absl's INFO log."""
    from absl import logging

    logging.info(message)


def _warn(message: str) -> None:
    from absl import logging

    logging.warning(message)


def _warner(log: Callable[[str], None]) -> Callable[[str], None]:
    """Warnings go to absl's log, or to a caller's `log` prefixed "WARNING: "."""
    return _warn if log is log_to_absl else (lambda message: log("WARNING: " + message))


@dataclasses.dataclass(frozen=True)
class FinetuningRun:
    """What a fine-tuning run is asked for, resolved once: by `seeds.finetune` for its one seed,
    by `seeds.run_seeds` for all of them. The fields are `seeds.finetune`'s arguments (documented
    there) but model_dir, seed and published, with `init_checkpoint` a local path (a released
    model's name resolved), `strategy` a `tf.distribute.Strategy`, and `settings` the request as
    results.json records it (`seeds.request_settings`)."""

    task: Task | str
    model_config: ElectraConfig | str | None = None
    finetuning_config: FinetuningConfig | dict | None = None
    _: dataclasses.KW_ONLY
    strategy: object
    settings: dict
    train_examples: list | None = None
    eval_examples: list | None = None
    train_path: str | None = None
    eval_path: str | None = None
    data_dir: str | None = None
    tfds_data_dir: str | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    init_checkpoint: str | None = None
    vocab_file: str | None = None
    lower_case: bool | None = None
    model_size: str | None = None
    log: Callable[[str], None] = log_to_absl
    overwrite: bool = False

    @property
    def warn(self) -> Callable[[str], None]:
        """Where warnings go: absl's WARNING log, or `log` prefixed "WARNING: "."""
        return _warner(self.log)


def finetune_seed(run: FinetuningRun, seed: int, out: FinetuningFolder, published,
                  stop: preemption.StopRequest) -> dict:
    """Fine-tunes one model on `run.task` with `seed` (weight init of the head and of a random
    encoder, dropout, data order) into the run folder `out`, checking `stop` before every step;
    returns this run's results (`seeds.finetune` lists them), published with its model as
    results.json, or `published(results)` when given."""
    import keras

    out.check_rerun(run.settings, run.overwrite)
    task, files_ = _task_and_files(run.task, run.data_dir, run.train_path, run.eval_path)
    family = get_family(task.family)
    encoder = EncoderSource.of(run.init_checkpoint, run.model_config, run.vocab_file)
    tokenizer, lower_case = encoder.tokenizer(run.lower_case, log=run.log, warn=run.warn)
    fc = _finetuning_config(run.finetuning_config, encoder.config, task, run.model_size)
    out.write_config("finetuning_config.json", fc)
    data = _TaskData.load(run, family, task, files_, tokenizer, fc)
    _check_batch_sizes(run.finetuning_config, fc, data)
    steps = _Steps.of(data.num_train, fc.train_batch_size, fc.num_train_epochs)
    _log_plan(task, data, steps, fc.train_batch_size, seed, run.log)

    keras.utils.set_random_seed(seed)
    head, optimizer = _build_model(family, task, encoder, fc, run.strategy, steps.total)
    train_step, step_choice = make_train_step(head, optimizer, run.strategy, data.train,
                                              fc.train_batch_size, seed, fc.jit_compile,
                                              total_steps=steps.total, log=run.log)
    run.log(step_choice.line())
    logbook = _TrainingLog(out, steps.total, fc.log_every_steps, run.log, per_epoch=steps.per_epoch,
                           learning_rate=fc.learning_rate)
    best = _BestEpoch(fc.keep_best, keep_weights=bool(data.test_sets))
    for step in range(1, steps.total + 1):
        stop.progress = f"{step - 1} of {steps.total} steps"
        stop.check()  # a signal that arrived in the last batch and was not raised yet
        lr = float(optimizer.learning_rate)  # this step's rate (the schedule at `iterations`)
        logbook.train(step, float(train_step()), lr)
        if step in steps.evaluations:
            epoch = steps.epoch(step)
            results, records = _evaluate_sets(head, task, data.eval_sets, fc, run.strategy)
            logbook.evaluation(step, epoch, results)
            out.write_predictions(family, records, out.epoch_predictions, f"epoch_{epoch:g}")
            if best.update(head, epoch, step, results):
                description = describe_finetuned(head, task, fc, lower_case=lower_case, epoch=epoch,
                                                 metrics=results, seed=seed)
                out.save_best(head, description, encoder.vocab_file, family, records)
    logbook.close()
    submission = _write_submissions(head, family, task, data.test_sets, best, fc, run.strategy, out,
                                    run.log)
    return out.write_results(published, dict(
        task=task.name, seed=seed, main_metric=list(task.metrics.main),
        best_epoch=best.epoch, best=best.metrics, history=logbook.history,
        model_dir=str(out.path), best_model_dir=str(out.path / "best"),
        num_train_examples=len(data.train_examples), num_eval_examples=len(data.eval_sets["dev"].examples),
        train_steps=steps.total, init_checkpoint=encoder.init_checkpoint, lower_case=lower_case,
        submission=submission, settings=json.loads(json.dumps(run.settings, default=str)),
        step_path=step_choice.record()))


# ---------------------------------------------------------------------------------------
# Set-up: strategy, task and files, hyperparameters, data, model.
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
    def load(cls, run: FinetuningRun, family: TaskFamily, task: Task, files, tokenizer,
             fc: FinetuningConfig) -> "_TaskData":
        """The run's examples, else from the task's files, else its TFDS / packaged data, kept
        to the run's limits."""
        train_examples = run.train_examples
        if train_examples is None:
            train_examples = load_examples(task, "train", path=files.train, data_dir=run.tfds_data_dir)
        eval_sets = {"dev": run.eval_examples} if run.eval_examples is not None else {
            name: load_examples(task, name, path=path) for name, path in files.dev.items()}
        if not eval_sets:
            eval_sets = {"dev": load_examples(task, "dev", data_dir=run.tfds_data_dir)}
        train_examples = _subsample(train_examples, run.max_train_examples)
        _check_labels(task, family, train_examples, "train")
        train = family.featurize(task, train_examples, tokenizer, fc, training=True).arrays
        featurized = {}
        for name, examples in eval_sets.items():
            examples = _subsample(examples, run.max_eval_examples)
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


def _build_model(family: TaskFamily, task: Task, encoder: EncoderSource, fc: FinetuningConfig,
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


# ---------------------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------------------


def predict_outputs(head, strategy, inputs: dict, batch_size: int) -> dict:
    """Runs `head` (inference mode) over numpy inputs in batches; returns numpy outputs."""
    import tensorflow as tf

    from electra_tf.data.pipeline import distributed_iterator, untuned

    n = len(inputs["input_ids"])
    # A batch larger than the data would be padded to its size (an eval_batch_size of 100,000
    # on 16 examples: 100,000 rows through the model); one batch of the data gives the same.
    batch_size = min(batch_size, max(n, strategy.num_replicas_in_sync))
    padded = int(math.ceil(n / batch_size)) * batch_size
    arrays = {k: np.concatenate([inputs[k], np.zeros((padded - n,) + inputs[k].shape[1:], inputs[k].dtype)])
              for k in INPUT_KEYS}
    # Padding rows have input_mask 0 everywhere; give them one real token so softmaxes stay finite.
    arrays["input_mask"][n:, 0] = 1
    dataset = untuned(tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size))
    step = _predict_step(head, strategy)
    collected: dict[str, list] = {}
    for batch in distributed_iterator(strategy, dataset):
        for key, value in step(batch).items():
            collected.setdefault(key, []).append(value.numpy())
    return {k: np.concatenate(v)[:n] for k, v in collected.items()}


# head -> (strategy, its traced inference step): one trace per head for every evaluation of a
# run (each epoch, every set), not one per call. The step holds the head only weakly, so the
# entry goes with the head.
_PREDICT_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _predict_step(head, strategy):
    import tensorflow as tf

    known = _PREDICT_STEPS.get(head)
    if known is not None and known[0] is strategy:
        return known[1]
    model = weakref.ref(head)

    @tf.function
    def step(batch):
        outputs = strategy.run(lambda f: model()(f, training=False), args=(batch,))
        return {k: strategy.gather(v, axis=0) for k, v in outputs.items()}

    _PREDICT_STEPS[head] = (strategy, step)
    return step


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

    def __init__(self, out: FinetuningFolder, total_steps: int, every_n: int, log, *, per_epoch: int = 0,
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


def _write_submissions(head, family: TaskFamily, task: Task, test_sets: dict, best: _BestEpoch,
                       fc: FinetuningConfig, strategy, out: FinetuningFolder, log) -> dict:
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
