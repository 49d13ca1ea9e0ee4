"""The fine-tuned model on disk: `best/`, what `trainer.finetune` writes, `load_finetuned` and the
exporter (`export.py`) read.

Layout:

    best/
      head_config.json   `config.FinetunedModelConfig`: the family, the head's class and
                         get_config() (with the encoder's ElectraConfig), task, label names,
                         max_seq_length, lower_case, text_pair, QA options, the epoch, its
                         metrics and the seed
      config.json        the encoder's ElectraConfig (same as head_config["config"])
      model.index, model.data-00000-of-00001
                         tf.train.Checkpoint(model=head): the object graph of the head, i.e.
                         `model/encoder/...` (the Discriminator without RTD head) and
                         `model/<head layer>/...` (`classifier`, `qa_start`, ...). No optimizer.
      vocab.txt          the WordPiece vocabulary the inputs were tokenized with
      predictions.*      the evaluation predictions of that epoch (as in predictions/)
      submission/        GLUE test predictions of this model (GLUE tasks with test files)

Example:
    head, model, vocab_file = load_finetuned("ft/rt")     # a run's model_dir, or its best/
    model.family, model.label_names                       # ("classification", ("negative", "positive"))
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from electra_tf import files
from electra_tf.finetune.config import FinetunedModelConfig, FinetuningConfig
from electra_tf.finetune.families import get_family
from electra_tf.finetune.task_data import Task

HEAD_CONFIG = "head_config.json"


def describe_finetuned(head, task: Task, fc: FinetuningConfig, **fields) -> FinetunedModelConfig:
    """The `FinetunedModelConfig` of `head` fine-tuned on `task` with `fc`; `fields`:
    lower_case, epoch, metrics, seed."""
    family = get_family(task.family)
    return FinetunedModelConfig.for_head(
        head, task=task.name, label_names=task.label_names, max_seq_length=fc.max_seq_length,
        **family.saved_fields(task, fc), **fields)


def save_finetuned(head, folder, model: FinetunedModelConfig, vocab_file) -> Path:
    """Writes `head` in the `best/` layout of the module docstring, described by `model`
    (`describe_finetuned`), into `folder` (replaced: the trainer gives a private staging folder,
    published as `best/` when the run is complete)."""
    import tensorflow as tf

    folder = Path(folder)
    if folder.is_symlink():
        folder.unlink()  # never write through a link we did not make
    elif folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tf.train.Checkpoint(model=head).write(str(folder / model.checkpoint))
    files.copy_file(vocab_file, folder / model.vocab)
    head.config.to_json(folder / "config.json")
    files.write_json(folder / HEAD_CONFIG, model.to_dict())
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
    """(head, `FinetunedModelConfig`, vocab_path) from a folder written by `finetune` /
    `run_seeds`.

    `path` may be the run's `model_dir`, a `run_seeds` `model_dir` (its best seed is loaded) or
    the `best/` folder itself. Every variable of the head is restored (an error otherwise).
    `head_config.json` files of version 1 ("kind" for "family") load too.
    """
    import tensorflow as tf

    from electra_tf.convert.common import open_tf_checkpoint, reading_tf_tensors
    from electra_tf.finetune import heads

    folder = find_finetuned(path)
    model = FinetunedModelConfig.from_json(folder / HEAD_CONFIG)
    head_class = getattr(heads, get_family(model.family).head)
    head = head_class.from_config(model.head_config)
    prefix = str(folder / model.checkpoint)
    open_tf_checkpoint(prefix)  # a damaged file: a ConversionError (a ValueError) naming it
    with reading_tf_tensors(prefix):
        status = tf.train.Checkpoint(model=head).read(prefix)
    status.assert_existing_objects_matched()
    status.expect_partial()
    return head, model, str(folder / model.vocab)
