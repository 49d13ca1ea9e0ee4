"""The fine-tuning run folder, `model_dir`: what a run writes there, and how its model is
published as `best/` in one step. (A pretraining run folder is another format:
`electra_tf/run_folder.py`.)

Layout of `model_dir` after `seeds.finetune`:

    model_dir/
      best/                     the fine-tuned model with the best main metric (the first
                                evaluation set's: `trainer.py`), and what describes it,
                                written with it:
        finetuning_config.json  the FinetuningConfig used
        results.json            this run: seed, best epoch, best metrics, every epoch's metrics
        predictions/epoch_<e>.jsonl         (the family's prediction files: JSONL records, or
        predictions/epoch_<e>.json [+ epoch_<e>_null_odds.json]    SQuAD's for QA)
        predictions/epoch_<e>_<set>.jsonl   a second evaluation set (MNLI: dev_mismatched)
        submission/<MRPC.tsv, MNLI-m.tsv, ...>   GLUE test predictions (GLUE test files found)
      results.json -> best/results.json, predictions -> best/predictions   (links)
      logs/train, logs/eval     TensorBoard: loss, learning_rate, steps_per_sec; eval metrics
                                (every run's: a run adds event files)

The run's config and predictions live in `best/` because they describe its model: written
beside it at the top level, as they were, a killed `--overwrite` rerun left the old `best/` under
the new run's config and predictions. The top-level names are links into `best/`, so they change
with it in its one swap (`FinetuningFolder`, `publish_best`). Several seeds (`seeds.run_seeds`)
keep this layout per seed in `model_dir/seed_<s>/` and publish the best seed's `best/` at the
top.

A folder holding a finished model of other settings is refused unless `overwrite`
(`check_finished_run`). The saved fine-tuned model `best/` is what `saving.py` writes and reads
(`load_finetuned`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from electra_tf import files
from electra_tf.finetune.families import TaskFamily
from electra_tf.finetune.saving import FinetunedModelConfig, save_finetuned
from electra_tf.run_folder import RunFolderError

RESULTS = "results.json"
PREDICTIONS = "predictions"
CONFIG = "finetuning_config.json"


@dataclasses.dataclass
class FinetuningFolder:
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
            files.give_normal_mode(self.staging)  # mkdtemp's 0700 would become best/'s mode
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

