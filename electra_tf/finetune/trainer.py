"""Fine-tuning: one training loop, evaluation every epoch, the best model kept, several seeds.

`finetune(task, ...)` builds the task's head (`heads.py`) in `strategy.scope()`, loads the
encoder from `init_checkpoint` (any format `convert.from_pretrained` reads: our pretraining
output `<pretrain model_dir>/discriminator`, a TF1 release, a Hugging Face folder) or starts
from random weights, and trains with the original optimizer (`AdamWeightDecay`, warmup 10%,
linear decay, layer-wise learning-rate decay). After every epoch (and at the end of a
fractional one) it evaluates with the task's metrics (`metrics.TaskMetrics`) and, when the main
metric improves, writes the model to `model_dir/best/`. `run_seeds` repeats this for several
seeds and reports the median and spread, as the paper does.

Text is lower-cased and accent-stripped or not as the checkpoint's vocabulary was built
(`data.casing`: an HF `tokenizer_config.json`, our pretraining records, a release's folder name;
uncased when nothing says), unless `lower_case` is given; `head_config.json` records it for the
exporter.

Layout of `model_dir` after `finetune`:

    model_dir/
      finetuning_config.json    the FinetuningConfig used
      results.json              this run: seed, best epoch, best metrics, every epoch's metrics
      predictions/epoch_<e>.jsonl         (classification, regression, tagging) or
      predictions/epoch_<e>.json [+ epoch_<e>_null_odds.json]   (QA; null odds for SQuAD 2.0)
      predictions/epoch_<e>_<set>.jsonl   a second evaluation set (MNLI: dev_mismatched)
      logs/train, logs/eval     TensorBoard: loss, learning_rate, steps_per_sec; eval metrics
      best/                     the fine-tuned model with the best main metric (see below)

With several evaluation sets (MNLI's matched and mismatched dev files) each is evaluated and
reported; the first ("dev", MNLI's matched set) picks the best epoch, the others' metrics carry
their name (`dev_mismatched_accuracy`). GLUE test files found with `data_dir` are predicted once
after training, with the best epoch's weights, into `best/submission/<MRPC.tsv, MNLI-m.tsv, ...>`
in the GLUE submission format (`glue.py`).

`run_seeds(..., num_seeds=N)` writes `model_dir/results.json` with every run and, per metric,
median / mean / min / max / std. One seed runs in `model_dir` itself (the layout above); several
run in `model_dir/seed_<s>/` each, and `model_dir/best/` is a copy of the best seed's `best/`
(`best_seed` in results.json). Either way the fine-tuned model is `model_dir/best/`.

The saved fine-tuned model, `best/` (what `load_finetuned` and the exporter read):

    best/
      head_config.json   {"format": "electra_tf_finetuned", "version": 1,
                          "head": class name ("SentenceClassifier", "SentenceRegressor",
                                  "TokenTagger", "SpanQuestionAnswerer"),
                          "kind": "classification" | "regression" | "tagging" | "qa",
                          "task": task name, "num_labels": int (0 for regression and QA),
                          "label_names": [str] | null (index = class id),
                          "max_seq_length": int,
                          "lower_case": whether inputs were lower-cased and accent-stripped
                                        (the vocabulary's casing; the exporter follows it),
                          "head_config": head.get_config() (includes "config", the encoder's
                                         ElectraConfig dict; rebuild with
                                         HEADS[kind].from_config(head_config)),
                          "qa": {"max_query_length", "doc_stride", "n_best_size",
                                 "max_answer_length", "null_score_diff_threshold",
                                 "version_2"} (QA only, else null),
                          "checkpoint": "model", "vocab": "vocab.txt",
                          "epoch": float, "metrics": {...}, "seed": int}
      config.json        the encoder's ElectraConfig (same as head_config["config"])
      model.index, model.data-00000-of-00001
                         tf.train.Checkpoint(model=head): the object graph of the head, i.e.
                         `model/encoder/...` (the Discriminator without RTD head) and
                         `model/<head layer>/...` (`classifier`, `qa_start`, ...). No optimizer.
      vocab.txt          the WordPiece vocabulary the inputs were tokenized with
      predictions.*      the evaluation predictions of that epoch (as in predictions/)
      submission/        GLUE test predictions of this model (GLUE tasks with test files)

Inputs of every head: int32 `input_ids`, `input_mask`, `segment_ids` [batch, max_seq_length]
laid out as `features.py` describes. Outputs: `heads.py`.

Example:
    result = finetune("rotten_tomatoes", finetuning_config=FinetuningConfig(num_train_epochs=1),
                      init_checkpoint="pretrain_out/discriminator", model_dir="ft/rt")
    head, info, vocab = load_finetuned("ft/rt")
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from electra_tf.config import ElectraConfig
from electra_tf.finetune import features as F
from electra_tf.finetune import glue
from electra_tf.finetune.config import FinetuningConfig, model_size_of
from electra_tf.finetune.heads import HEADS, build_head
from electra_tf.finetune.metrics import TaskMetrics, tagging_accuracy
from electra_tf.finetune.task_data import Task, data_files, get_task, infer_label_names, load_examples
from electra_tf.training import summaries

FORMAT = "electra_tf_finetuned"
HEAD_CONFIG = "head_config.json"
CHECKPOINT_NAME = "model"
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def _log(message: str) -> None:
    from absl import logging

    logging.info(message)


def _warn(message: str) -> None:
    from absl import logging

    logging.warning(message)


# ---------------------------------------------------------------------------------------
# Set-up helpers.
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


def metrics_for(task: Task) -> TaskMetrics:
    """The task's metrics; a custom task name falls back to its kind's generic metrics."""
    try:
        return TaskMetrics.for_task(task.name)
    except ValueError:
        if task.kind == "qa":
            return TaskMetrics.for_task("squad2.0" if task.squad_v2 else "squad1.1")
        return TaskMetrics.for_task(task.kind)


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


def _subsample(examples: list, limit: int | None, seed: int = 0) -> list:
    """The first `limit` examples of a fixed shuffle (files may be sorted by label)."""
    if not limit or len(examples) <= limit:
        return list(examples)
    order = np.random.default_rng(seed).permutation(len(examples))[:limit]
    return [examples[i] for i in sorted(order)]


@dataclasses.dataclass
class _EvalData:
    examples: list
    inputs: dict  # the model inputs, numpy [N, L]
    extra: object = None  # QA windows, or tagging word positions


def _featurize(task: Task, examples, tokenizer, fc: FinetuningConfig, training: bool):
    """(model inputs incl. labels, extra) for `examples`."""
    if task.kind in ("classification", "regression"):
        return F.featurize_sentences(examples, tokenizer, fc.max_seq_length), None
    if task.kind == "tagging":
        arrays = F.featurize_tagging(examples, tokenizer, fc.max_seq_length)
        return arrays, (arrays["word_positions"], arrays["num_words"])
    windows = F.featurize_qa(examples, tokenizer, max_seq_length=fc.max_seq_length,
                             max_query_length=fc.max_query_length, doc_stride=fc.doc_stride,
                             is_training=training)
    if not windows:
        raise ValueError(f"task {task.name!r}: no QA windows (every answer was unlocatable)")
    return F.qa_windows_to_arrays(windows), windows


def _check_labels(task: Task, examples, split: str) -> None:
    missing = sum(1 for e in examples if getattr(e, "label", getattr(e, "labels", 0)) is None)
    if task.kind != "qa" and missing:
        raise ValueError(f"task {task.name!r}: {missing} {split} examples have no label; "
                         "fine-tuning and evaluation need labeled data")


# ---------------------------------------------------------------------------------------
# Evaluation.
# ---------------------------------------------------------------------------------------


def _predict(head, strategy, inputs: dict, batch_size: int) -> dict:
    """Runs `head` (inference mode) over numpy inputs in batches; returns numpy outputs."""
    import tensorflow as tf

    n = len(inputs["input_ids"])
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


def evaluate(head, task: Task, data: _EvalData, fc: FinetuningConfig, strategy=None,
             label_names: Sequence[str] | None = None):
    """Task metrics (with "main") and the prediction records of one evaluation pass."""
    strategy = resolve_strategy(strategy)
    outputs = _predict(head, strategy, data.inputs, fc.eval_batch_size)
    metric = metrics_for(task)
    if task.kind == "classification":
        probs = _softmax(outputs["logits"])
        predictions = probs.argmax(-1)
        labels = np.array([e.label for e in data.examples])
        results = metric.compute(labels, predictions)
        records = [{"id": e.eid, "prediction": label_names[p], "label": label_names[e.label],
                    "probabilities": [round(float(x), 6) for x in row]}
                   for e, p, row in zip(data.examples, predictions, probs)]
    elif task.kind == "regression":
        predictions = outputs["predictions"]
        labels = np.array([e.label for e in data.examples], np.float64)
        results = metric.compute(labels, predictions)
        records = [{"id": e.eid, "prediction": float(p), "label": float(e.label)}
                   for e, p in zip(data.examples, predictions)]
    elif task.kind == "tagging":
        positions, num_words = data.extra
        words = F.word_predictions(outputs["logits"], positions, num_words)
        predicted = [[label_names[i] for i in w] for w in words]
        # Words cut off by max_seq_length are scored against the gold words that fit.
        gold = [[label_names[i] for i in e.labels[: len(w)]] for e, w in zip(data.examples, words)]
        if is_chunk_tag_set(label_names):
            results = metric.compute(gold, predicted)
        else:  # chunk F1 needs BIOES/BIO tags; any other label set is scored by accuracy
            accuracy = tagging_accuracy(gold, predicted)
            results = {"accuracy": accuracy, "main": accuracy}
        records = [{"id": e.eid, "words": list(e.words[: len(p)]), "prediction": p, "label": g}
                   for e, p, g in zip(data.examples, predicted, gold)]
    else:
        qa = F.postprocess_qa(
            data.examples, data.extra, outputs["start_logits"], outputs["end_logits"],
            outputs.get("answerable_logits") if task.squad_v2 else None,
            n_best_size=outputs["end_logits"].shape[1], max_answer_length=fc.max_answer_length,
            version_2=task.squad_v2, null_score_diff_threshold=fc.null_score_diff_threshold)
        gold = {e.qid: [a.text for a in e.answers] for e in data.examples}
        if task.squad_v2:  # thresholds best_non_null with the null odds, as the official script
            results = metric.compute(gold, qa.best_non_null, na_probs=qa.null_score_diff,
                                     na_prob_thresh=fc.null_score_diff_threshold)
        else:
            results = metric.compute(gold, qa.predictions)
        records = qa
    return {k: float(v) for k, v in results.items()}, records


def predict(head, task: Task, inputs: dict, fc: FinetuningConfig, strategy=None) -> np.ndarray:
    """Class ids [N] (classification) or scores [N] (regression) for sentence-task inputs."""
    outputs = _predict(head, resolve_strategy(strategy), inputs, fc.eval_batch_size)
    if task.kind == "classification":
        return outputs["logits"].argmax(-1)
    if task.kind == "regression":
        return outputs["predictions"]
    raise ValueError(f"task {task.name!r}: predict() takes sentence tasks, not {task.kind}")


def is_chunk_tag_set(label_names) -> bool:
    """Whether every tag is "O" or "<B|I|E|S>-<type>" (scored by chunk F1)."""
    return all(t == "O" or (t[:2] in ("B-", "I-", "E-", "S-") and len(t) > 2) for t in label_names)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def write_predictions(records, folder: Path, stem: str, kind: str) -> list[Path]:
    """JSONL (one record per example), or SQuAD `<stem>.json` (+ `<stem>_null_odds.json`)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind != "qa":
        path = folder / f"{stem}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        return [path]
    paths = [folder / f"{stem}.json"]
    paths[0].write_text(json.dumps(records.predictions, indent=1, ensure_ascii=False) + "\n")
    if records.null_score_diff:
        paths.append(folder / f"{stem}_null_odds.json")
        paths[1].write_text(json.dumps(records.null_score_diff, indent=1) + "\n")
    return paths


# ---------------------------------------------------------------------------------------
# Saving and loading the fine-tuned model.
# ---------------------------------------------------------------------------------------


def save_finetuned(head, folder, *, task: Task, vocab_file, fc: FinetuningConfig,
                   label_names=None, epoch=None, metrics=None, seed=None,
                   lower_case: bool = True) -> Path:
    """Writes `head` in the `best/` layout of the module docstring; `lower_case` is how the
    inputs were normalised (the exporter's in-graph tokenizer does the same)."""
    import tensorflow as tf

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tf.train.Checkpoint(model=head).write(str(folder / CHECKPOINT_NAME))
    shutil.copyfile(vocab_file, folder / "vocab.txt")
    head.config.to_json(folder / "config.json")
    info = {
        "format": FORMAT, "version": 1, "head": type(head).__name__, "kind": head.kind,
        "task": task.name, "num_labels": len(label_names or ()),
        "label_names": list(label_names) if label_names else None,
        "max_seq_length": fc.max_seq_length, "lower_case": bool(lower_case),
        "head_config": head.get_config(),
        "qa": {"max_query_length": fc.max_query_length, "doc_stride": fc.doc_stride,
               "n_best_size": fc.n_best_size, "max_answer_length": fc.max_answer_length,
               "null_score_diff_threshold": fc.null_score_diff_threshold,
               "version_2": task.squad_v2} if head.kind == "qa" else None,
        "checkpoint": CHECKPOINT_NAME, "vocab": "vocab.txt",
        "epoch": epoch, "metrics": metrics or {}, "seed": seed,
    }
    (folder / HEAD_CONFIG).write_text(json.dumps(info, indent=2) + "\n")
    return folder


def find_finetuned(path) -> Path:
    """The `best/` folder of a run folder, of a `run_seeds` folder (one seed or several), of a
    folder written before `model_dir/best/` held the best seed (its results.json names the
    seed's folder), or `best/` itself."""
    path = Path(path).expanduser()
    if (path / HEAD_CONFIG).exists():
        return path
    if (path / "best" / HEAD_CONFIG).exists():
        return path / "best"
    results = path / "results.json"
    if results.exists():
        best = json.loads(results.read_text()).get("best_model")  # relative to `path`
        if best and (path / best / HEAD_CONFIG).exists():
            return path / best
    raise FileNotFoundError(f"{path}: no fine-tuned model ({HEAD_CONFIG} in it, in best/, or a "
                            "results.json with best_model_dir)")


def load_finetuned(path):
    """(head_model, head_info, vocab_path) from a folder written by `finetune` / `run_seeds`.

    `path` may be the run's `model_dir`, a `run_seeds` `model_dir` (its best seed is loaded) or
    the `best/` folder itself. Every variable of the head is restored (an error otherwise).
    """
    import tensorflow as tf

    from electra_tf.convert.common import open_tf_checkpoint, reading_tf_tensors

    folder = find_finetuned(path)
    info_path = folder / HEAD_CONFIG
    try:
        info = json.loads(info_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{info_path}:{e.lineno}: not valid JSON: {e.msg}") from None
    if info.get("format") != FORMAT:
        raise ValueError(f"{info_path}:1: field 'format': expected {FORMAT!r}, got {info.get('format')!r}")
    if info.get("kind") not in HEADS:
        raise ValueError(f"{info_path}:1: field 'kind': expected one of {sorted(HEADS)}, got {info.get('kind')!r}")
    head = HEADS[info["kind"]].from_config(info["head_config"])
    prefix = str(folder / info.get("checkpoint", CHECKPOINT_NAME))
    open_tf_checkpoint(prefix)  # a damaged file: a ConversionError (a ValueError) naming it
    with reading_tf_tensors(prefix):
        status = tf.train.Checkpoint(model=head).read(prefix)
    status.assert_existing_objects_matched()
    status.expect_partial()
    return head, info, str(folder / info.get("vocab", "vocab.txt"))


# ---------------------------------------------------------------------------------------
# Training.
# ---------------------------------------------------------------------------------------


GENERIC_TASKS = ("classification", "regression", "tagging", "qa")


def task_from_options(name: str, *, text_column=None, text_pair_column=None, label_column=None,
                      labels: Sequence[str] | None = None, has_header: bool = True,
                      version_2: bool = False) -> Task:
    """A predefined task (GLUE names, squad1.1/2.0, rotten_tomatoes) or a generic one
    ("classification", "regression", "tagging", "qa") for local files, with column overrides."""
    key = name.strip().lower()
    if key in GENERIC_TASKS:
        task = Task(key, key, squad_v2=version_2 and key == "qa")
        if key == "tagging":  # JSONL {"tokens": [...], "labels": [...]} by default
            task = dataclasses.replace(task, text_column="tokens", label_column="labels")
    else:
        task = get_task(name)
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


def _resolve_task(task, train_path) -> Task:
    task = get_task(task) if isinstance(task, str) else task
    if task.kind in ("classification", "tagging") and task.label_names is None:
        if train_path is None:
            raise ValueError(f"task {task.name!r}: label_names are not set; give them or a train file "
                             "to infer them from")
        task = task.with_label_names(infer_label_names(task, train_path))
    return task


def finetune(task, model_config=None, finetuning_config: FinetuningConfig | None = None, *,
             train_examples=None, eval_examples=None, train_path=None, eval_path=None,
             data_dir=None, tfds_data_dir=None, init_checkpoint=None, vocab_file=None,
             lower_case: bool | None = None, model_dir, strategy=None, seed: int = 0,
             max_train_examples: int | None = None, max_eval_examples: int | None = None,
             model_size: str | None = None, log: Callable[[str], None] = _log) -> dict:
    """Fine-tunes one model on `task`; returns this run's results (also in model_dir/results.json).

    Args:
      task: a `Task` or a task name ("rte", "squad2.0", "rotten_tomatoes", ...).
      model_config: `ElectraConfig` (or name / path) for random initialisation; ignored in favour
        of the checkpoint's config when `init_checkpoint` is given.
      finetuning_config: a `FinetuningConfig`, or None / a dict of overrides of the original's
        defaults for the model's size (from its hidden size) and the task.
      train_examples / eval_examples: examples; otherwise read from `train_path` / `eval_path`,
        else from `data_dir`, else the task's TFDS data (`tfds_data_dir`) or packaged data
        (Rotten Tomatoes).
      data_dir: a folder of the task's files (`task_data.data_files`): a GLUE task's folder as
        the GLUE download script writes it (`glue_data/MRPC`): train.tsv, dev.tsv (MNLI: both
        dev sets, each evaluated) and the test files, whose predictions are written in the GLUE
        submission format to `model_dir/best/submission/` (`glue.py`).
      init_checkpoint: pretrained discriminator (any `from_pretrained` format) or None.
      vocab_file: WordPiece vocabulary; default the checkpoint's vocab.txt.
      lower_case: lower-case and strip accents (uncased vocabulary) or not (cased); None takes
        what the checkpoint records (`data.casing.resolve_lower_case`), else uncased.
      model_dir: output folder (layout in the module docstring).
      strategy: a `tf.distribute.Strategy`, a strategy name, or None (one device).
      seed: seeds weight init of the head (and of a random encoder), dropout and data order.
      max_train_examples / max_eval_examples: keep that many (a fixed shuffle), for quick runs.
      model_size: "small" / "base" / "large" for the defaults (default: from the hidden size).
      log: where progress lines go.

    Returns:
      {"seed", "best_epoch", "best" (metrics of the best epoch; a second evaluation set's
       metrics prefixed with its name, e.g. "dev_mismatched_accuracy"), "history", "model_dir",
       "best_model_dir", "num_train_examples", "num_eval_examples", "train_steps",
       "lower_case", "submission" (GLUE test prediction files written, by name)}.
    """
    import keras
    import tensorflow as tf

    from electra_tf.data.casing import resolve_lower_case
    from electra_tf.data.tokenizer import WordpieceTokenizer, load_vocab
    from electra_tf.training.progress import ProgressLogger
    from electra_tf.training.strategy import is_chief

    warn = _warn if log is _log else (lambda message: log("WARNING: " + message))
    model_dir = Path(model_dir)
    task = get_task(task) if isinstance(task, str) else task
    files = data_files(task, data_dir, train_path=train_path, eval_path=eval_path)
    task = _resolve_task(task, files.train)
    strategy = resolve_strategy(strategy)
    chief = is_chief(strategy)  # only the chief writes files (multi-worker)
    if chief:
        model_dir.mkdir(parents=True, exist_ok=True)

    # --- encoder config and vocabulary ---
    if init_checkpoint is not None:
        config, checkpoint_vocab, encoder_values = pretrained_encoder(init_checkpoint)
        vocab_file = vocab_file or checkpoint_vocab
    else:
        if model_config is None:
            raise ValueError("give init_checkpoint (a pretrained discriminator) or model_config "
                             "(random initialisation)")
        config = model_config if isinstance(model_config, ElectraConfig) else ElectraConfig.from_json(model_config)
        if vocab_file is not None:
            config = config.with_vocab(vocab_file)
    if vocab_file is None:
        raise ValueError(f"no vocabulary: {init_checkpoint or 'the model config'} has no vocab.txt; "
                         "pass vocab_file")
    vocab = load_vocab(vocab_file)
    lower_case = resolve_lower_case(lower_case, init_checkpoint, vocab, log=log, warn=warn)
    tokenizer = WordpieceTokenizer(vocab_file, lower_case=lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(f"{vocab_file}: {tokenizer.vocab_size} tokens, but the model's "
                         f"vocab_size is {config.vocab_size}")
    if finetuning_config is None or isinstance(finetuning_config, dict):  # overrides of the defaults
        size = model_size or model_size_of(config)
        fc = FinetuningConfig.for_model_size(size, task.name, **(finetuning_config or {}))
    else:
        fc = finetuning_config
    if fc.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"FinetuningConfig.max_seq_length: {fc.max_seq_length} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings}")
    if chief:
        fc.to_json(model_dir / "finetuning_config.json")

    # --- data ---
    if train_examples is None:
        train_examples = load_examples(task, "train", path=files.train, data_dir=tfds_data_dir)
    eval_sets = {"dev": eval_examples} if eval_examples is not None else {
        name: load_examples(task, name, path=path) for name, path in files.dev.items()}
    if not eval_sets:
        eval_sets = {"dev": load_examples(task, "dev", data_dir=tfds_data_dir)}
    train_examples = _subsample(train_examples, max_train_examples)
    _check_labels(task, train_examples, "train")
    train_arrays, _ = _featurize(task, train_examples, tokenizer, fc, training=True)
    eval_data = {}
    for name, examples in eval_sets.items():  # "dev" first: its main metric picks the best model
        examples = _subsample(examples, max_eval_examples)
        _check_labels(task, examples, name)
        inputs, extra = _featurize(task, examples, tokenizer, fc, training=False)
        eval_data[name] = _EvalData(examples, inputs, extra)
    eval_examples = eval_data["dev"].examples
    test_data = {}  # GLUE submission file -> unlabeled test examples and their inputs
    for name, path in files.test.items():
        examples = load_examples(task, "test", path=path)
        test_data[name] = _EvalData(examples, _featurize(task, examples, tokenizer, fc, training=False)[0])
    train_arrays = {k: v for k, v in train_arrays.items() if k not in ("word_positions", "num_words")}
    num_train = len(train_arrays["input_ids"])
    batch = fc.train_batch_size
    steps_per_epoch = max(1, num_train // batch)
    total_steps = max(1, int(num_train * fc.num_train_epochs / batch))
    if num_train < batch:
        warn(f"{task.name}: the training set ({num_train} inputs) is smaller than one batch of "
             f"{batch}: every batch repeats examples, {total_steps} step(s) in all (a smaller "
             "train_batch_size gives more steps)")
    log(f"{task.name}: {len(train_examples)} train examples ({num_train} inputs), "
        + ", ".join(f"{len(d.examples)} {name}" for name, d in eval_data.items())
        + "".join(f", {len(d.examples)} test ({name})" for name, d in test_data.items())
        + f"; {total_steps} steps of {batch} ({steps_per_epoch} per epoch), seed {seed}")

    # --- model and optimizer ---
    keras.utils.set_random_seed(seed)
    label_names = task.label_names
    head_kwargs = {}
    if task.kind in ("classification", "regression"):
        head_kwargs["dropout"] = fc.dropout
    if task.kind == "qa":
        head_kwargs.update(beam_size=fc.n_best_size, answerable_classifier=fc.answerable_classifier,
                           answerable_weight=fc.answerable_weight)
    with strategy.scope():
        head = build_head(task.kind, config, num_labels=task.num_labels or None,
                          task_name=task.name, **head_kwargs)
        if init_checkpoint is not None:
            assign_encoder_weights(head, encoder_values, init_checkpoint)
            del encoder_values
        optimizer = create_finetuning_optimizer(fc, config.num_layers, total_steps)
        optimizer.build(head.trainable_variables)

    dataset = (tf.data.Dataset.from_tensor_slices(train_arrays)
               .shuffle(num_train, seed=seed, reshuffle_each_iteration=True)
               .repeat().batch(batch, drop_remainder=True).prefetch(2))
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def step_fn(features):
        with tf.GradientTape() as tape:
            outputs = head(features, training=True)
            # Keras sums replica gradients: scale by the global batch (optimizer module docstring).
            loss = tf.reduce_sum(head.per_example_loss(features, outputs)) / batch
        grads = tape.gradient(loss, head.trainable_variables)
        optimizer.apply_gradients(zip(grads, head.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce("SUM", losses, axis=None)

    # --- loop ---
    writers = {name: tf.summary.create_file_writer(str(model_dir / "logs" / name)) if chief
               else tf.summary.create_noop_writer() for name in ("train", "eval")}
    progress = ProgressLogger(total_steps, every_n=fc.log_every_steps,
                              log_fn=lambda fmt, *args: log(fmt % args))
    metric = metrics_for(task)
    history, best, best_score = [], None, -math.inf
    eval_steps = sorted({*range(steps_per_epoch, total_steps + 1, steps_per_epoch), total_steps})
    loss_sum, loss_count, last_time, last_step = 0.0, 0, time.time(), 0
    for step in range(1, total_steps + 1):
        lr = float(optimizer.learning_rate)  # this step's rate (the schedule at `iterations`)
        loss_sum += float(train_step(iterator))
        loss_count += 1
        if progress.due(step):
            mean_loss = loss_sum / loss_count
            if not math.isfinite(mean_loss):
                raise FloatingPointError(f"step {step}: loss is {mean_loss}")
            progress.update(step, loss=mean_loss, lr=lr)
            now = time.time()
            with writers["train"].as_default():
                summaries.scalar("loss", mean_loss, step=step)
                summaries.scalar("learning_rate", lr, step=step)
                summaries.scalar("steps_per_sec", (step - last_step) / max(now - last_time, 1e-9), step=step)
            loss_sum, loss_count, last_time, last_step = 0.0, 0, now, step
        if step in eval_steps:
            epoch = round(step / steps_per_epoch, 3)
            results, all_records = {}, {}
            for name, data in eval_data.items():
                scores, all_records[name] = evaluate(head, task, data, fc, strategy, label_names)
                prefix = "" if name == "dev" else f"{name}_"
                results.update({prefix + k: v for k, v in scores.items()
                                if name == "dev" or k != "main"})
            history.append({"epoch": epoch, "step": step, **results})
            with writers["eval"].as_default():
                for name, value in results.items():
                    summaries.scalar(name, value, step=step)
            log(f"eval epoch {epoch:g}: " + ", ".join(f"{k} {v:.4g}" for k, v in results.items()))
            if chief:
                for name, records in all_records.items():
                    suffix = "" if name == "dev" else f"_{name}"
                    write_predictions(records, model_dir / "predictions", f"epoch_{epoch:g}{suffix}", task.kind)
            score = results["main"] if math.isfinite(results["main"]) else -math.inf
            if best is None or score > best_score or not fc.keep_best:
                best_score, best = score, {"epoch": epoch, "step": step, **results}
                if test_data:  # the test sets are predicted once, with the best weights
                    best_weights = [v.numpy() for v in head.weights]
                if chief:
                    folder = save_finetuned(head, model_dir / "best", task=task, vocab_file=vocab_file,
                                            fc=fc, label_names=label_names, epoch=epoch,
                                            metrics=results, seed=seed, lower_case=lower_case)
                    for name, records in all_records.items():
                        suffix = "" if name == "dev" else f"_{name}"
                        write_predictions(records, folder, f"predictions{suffix}", task.kind)
    for writer in writers.values():
        writer.flush()

    submission = {}
    if test_data:
        for variable, value in zip(head.weights, best_weights):
            variable.assign(value)
        for name, data in test_data.items():
            predictions = predict(head, task, data.inputs, fc, strategy)
            if chief:
                path = glue.write_submission(model_dir / "best" / "submission" / name,
                                             glue.GLUE_TASKS[task.name], data.examples, predictions)
                submission[name] = str(path)
                log(f"wrote the {len(data.examples)} test predictions of the best epoch "
                    f"({best['epoch']:g}) to {path}")

    result = {
        "task": task.name, "seed": seed, "main_metric": list(metric.main),
        "best_epoch": best["epoch"], "best": {k: v for k, v in best.items() if k not in ("epoch", "step")},
        "history": history, "model_dir": str(model_dir), "best_model_dir": str(model_dir / "best"),
        "num_train_examples": len(train_examples), "num_eval_examples": len(eval_examples),
        "train_steps": total_steps, "init_checkpoint": None if init_checkpoint is None else str(init_checkpoint),
        "lower_case": lower_case, "submission": submission,
    }
    if chief:
        (model_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


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


def summarize(values: Sequence[float]) -> dict:
    """median / mean / min / max / std (sample, 0 for one value) of per-seed scores."""
    x = np.asarray(values, np.float64)
    return {"median": float(np.median(x)), "mean": float(x.mean()), "min": float(x.min()),
            "max": float(x.max()), "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "values": [float(v) for v in x]}


def run_seeds(task, model_config=None, finetuning_config=None, *, model_dir, num_seeds: int = 1,
              seed: int = 0, **kwargs) -> dict:
    """Runs `finetune` with seeds seed, seed+1, ...; writes `model_dir/results.json` with every
    run and the median and spread of each best-epoch metric (the paper reports the median over
    seeds). The chosen model is always `model_dir/best/`:

    - one seed: the run's own layout (module docstring) directly in `model_dir`;
    - several: each run in `model_dir/seed_<s>/`, and `model_dir/best/` a copy of the `best/` of
      the seed with the highest main metric (`results.json` "best_seed"), so that export and
      `load_finetuned(model_dir)` take the same folder whatever the number of seeds.
    """
    if num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
    from electra_tf.training.strategy import is_chief

    model_dir = Path(model_dir)
    kwargs["strategy"] = resolve_strategy(kwargs.get("strategy"))  # one strategy for every seed
    runs = []
    for s in range(seed, seed + num_seeds):
        run_dir = model_dir if num_seeds == 1 else model_dir / f"seed_{s}"
        runs.append(finetune(task, model_config, finetuning_config, model_dir=run_dir, seed=s, **kwargs))
    names = [k for k in runs[0]["best"] if all(k in r["best"] for r in runs)]
    summary = {name: summarize([r["best"][name] for r in runs]) for name in names}
    best_run = max(runs, key=lambda r: r["best"]["main"])
    results = {
        "task": runs[0]["task"], "num_seeds": num_seeds, "seeds": [r["seed"] for r in runs],
        "main_metric": runs[0]["main_metric"], "summary": summary,
        "median": {name: s["median"] for name, s in summary.items()},
        "best_seed": best_run["seed"], "best_model_dir": str(model_dir / "best"),
        "best_model": "best", "runs": runs,
    }
    if is_chief(kwargs["strategy"]):
        model_dir.mkdir(parents=True, exist_ok=True)
        if num_seeds > 1:
            best = model_dir / "best"
            if best.exists():
                shutil.rmtree(best)
            shutil.copytree(best_run["best_model_dir"], best)
        (model_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
