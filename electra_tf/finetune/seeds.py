"""Fine-tuning runs: `finetune` (one seed) and `run_seeds` (several, and the median and spread
over them that the paper reports), what the library's users and electra-finetune call.

Each resolves what the run asks for once, into a `trainer.FinetuningRun`: a released model's
name becomes its local folder (fetched once, where its vocabulary and casing are read), a
strategy name its `tf.distribute.Strategy`, the request the settings results.json records
(`request_settings`). `model_dir` is checked before anything is written there
(`config.check_model_dir`), then each seed runs the loop (`trainer.finetune_seed`) in a locked
run folder (`publishing.FinetuningFolder`; its module gives the layout of `model_dir`).

`run_seeds(..., num_seeds=N)` writes `model_dir/results.json` with every run and, per metric,
median / mean / min / max / std. One seed runs in `model_dir` itself; several run in
`model_dir/seed_<s>/` each, and `model_dir/best/` is a copy of the best seed's `best/`
(`best_seed` in results.json). Either way the fine-tuned model is `model_dir/best/`.

SIGTERM or SIGINT stops a run after the running batch (at once in set-up and evaluation):
`preemption.Interrupted` (exit status 128 + the signal, 143 / 130) after one logged line naming
the step and the folder. Nothing of the stopped run is published (a finished `best/` already in
`model_dir` and its results.json stay), so the same command starts it again cleanly. Fine-tuning
keeps no mid-run checkpoint, so unlike pretraining's preemption (exit 0, resumed) a stop here is
not a success.

Example:
    result = finetune("rotten_tomatoes", finetuning_config=FinetuningConfig(num_train_epochs=1),
                      init_checkpoint="pretrain_out/discriminator", model_dir="ft/rt")
    head, description, vocab = load_finetuned("ft/rt")  # electra_tf.finetune.saving
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from electra_tf import files
from electra_tf.finetune.config import FinetuningConfig, check_model_dir
from electra_tf.finetune.families import FAMILIES
from electra_tf.finetune.publishing import FinetuningFolder, check_finished_run, publish_best
from electra_tf.finetune.tasks import Task, generic_task, get_task
from electra_tf.finetune.trainer import FinetuningRun, finetune_seed, log_to_absl, resolve_strategy
from electra_tf.training import preemption


def finetune(task, model_config=None, finetuning_config: FinetuningConfig | None = None, *,
             train_examples=None, eval_examples=None, train_path=None, eval_path=None,
             data_dir=None, tfds_data_dir=None, init_checkpoint=None, vocab_file=None,
             lower_case: bool | None = None, model_dir, strategy=None, seed: int = 0,
             max_train_examples: int | None = None, max_eval_examples: int | None = None,
             model_size: str | None = None, log: Callable[[str], None] = log_to_absl,
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
      model_dir: output folder (layout: `publishing.py`).
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
    init_checkpoint, strategy = _resolved(model_dir, init_checkpoint, strategy)
    if settings is None:
        settings = request_settings(
            task, model_config, finetuning_config, init_checkpoint=init_checkpoint,
            train_path=train_path, eval_path=eval_path, data_dir=data_dir, vocab_file=vocab_file,
            lower_case=lower_case, seed=seed, max_train_examples=max_train_examples,
            max_eval_examples=max_eval_examples, model_size=model_size,
            train_examples=train_examples, eval_examples=eval_examples)
    run = FinetuningRun(
        task, model_config, finetuning_config, strategy=strategy, settings=settings,
        train_examples=train_examples, eval_examples=eval_examples, train_path=train_path,
        eval_path=eval_path, data_dir=data_dir, tfds_data_dir=tfds_data_dir,
        max_train_examples=max_train_examples, max_eval_examples=max_eval_examples,
        init_checkpoint=init_checkpoint, vocab_file=vocab_file, lower_case=lower_case,
        model_size=model_size, log=log, overwrite=overwrite)
    return _one_seed(run, seed, Path(model_dir), published)


def _resolved(model_dir, init_checkpoint, strategy):
    """(init_checkpoint, strategy) of a run, resolved once for all its seeds: a released model's
    name -> its local folder, where its vocabulary and casing are read; a strategy name -> the
    strategy (`resolve_strategy`). `model_dir` is checked in between."""
    from electra_tf.convert.names import resolve_checkpoint

    init_checkpoint = resolve_checkpoint(init_checkpoint)
    check_model_dir(model_dir, init_checkpoint)  # before the lock file: a refusal changes nothing
    return init_checkpoint, resolve_strategy(strategy)


def _one_seed(run: FinetuningRun, seed: int, folder: Path, published) -> dict:
    """`trainer.finetune_seed` in `folder`, locked for the run; a stop request raises
    `preemption.Interrupted` naming the seed and the folder, with nothing of the run published."""
    from electra_tf.training.strategy import is_chief

    out = FinetuningFolder(folder, is_chief(run.strategy))  # only the chief writes (multi-worker)
    # SIGTERM / SIGINT: `preemption.Interrupted` after the running batch (or at once in set-up
    # and evaluation). Nothing of this run is published; the rerun starts it again.
    stop = preemption.StopRequest(at_once=True)
    try:
        with stop:
            return finetune_seed(run, seed, out, published, stop)
    except preemption.Interrupted as e:
        kept = " (the model already in best/ is)" if (out.path / "best").is_dir() else ""
        message = (f"{e} of seed {seed} in {out.path}: nothing of this run is kept{kept}; run "
                   "the same command to fine-tune it again")
        run.warn(message)
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

    - one seed: the run's own layout (`publishing.py`) directly in `model_dir`;
    - several: each run in `model_dir/seed_<s>/`, and `model_dir/best/` a copy of the `best/` of
      the seed with the highest main metric (`results.json` "best_seed"), so that export and
      `load_finetuned(model_dir)` take the same folder whatever the number of seeds.

    A model_dir holding a finished model of other settings is refused unless `overwrite`
    (`check_finished_run`); the previous `best/` and results.json stay until the new ones are
    complete and replace them together (`publishing.FinetuningFolder`).
    """
    if num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
    from electra_tf.training.strategy import is_chief

    model_dir = Path(model_dir)
    init_checkpoint, strategy = _resolved(model_dir, kwargs.get("init_checkpoint"), kwargs.get("strategy"))
    if init_checkpoint is not None:  # a released model's name: fetched once, for every seed
        kwargs["init_checkpoint"] = init_checkpoint
    kwargs["strategy"] = strategy  # one strategy for every seed
    chief = is_chief(strategy)
    settings = request_settings(
        task, model_config, finetuning_config, seed=seed, num_seeds=num_seeds,
        **{k: v for k, v in kwargs.items() if k not in ("strategy", "log", "tfds_data_dir")})
    run = FinetuningRun(task, model_config, finetuning_config, overwrite=overwrite, settings=settings,
                        **kwargs)
    lock = files.FolderLock(model_dir, "electra-finetune").acquire() if chief else None
    try:
        if chief:
            check_finished_run(model_dir, settings, overwrite)
        runs = []
        for s in range(seed, seed + num_seeds):
            run_dir = model_dir if num_seeds == 1 else model_dir / f"seed_{s}"
            if run_dir != model_dir:
                if chief:
                    files.own_folder(run_dir)  # a link planted at seed_<s> is refused, not followed
                check_model_dir(run_dir, run.init_checkpoint)  # model_dir itself is checked above
            # One seed: its model is best/ itself, published with the summary as results.json.
            published = (lambda result: _summary_of([result], model_dir)) if num_seeds == 1 else None
            runs.append(_one_seed(run, s, run_dir, published))
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
