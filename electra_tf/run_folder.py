"""A pretraining run folder (`electra-pretrain --model_dir`): its file names, its record, its
checkpoints, how a damaged one is diagnosed and how the newest readable one is restored.

One module for the on-disk format, which the training loop writes and resumes, and conversion,
scoring and fine-tuning read (`electra_tf.convert.pretrained`):

  pretraining_config.json   the run record (`write_record`): model and pretraining configs, data
                            and vocabulary facts, how the weights were initialised.
  ckpt-<step>.index/.data-*  `model_checkpoint`: every model variable and the optimizer.
  checkpoint                TensorFlow's state file (not trusted: `checkpoint_prefixes`).
  discriminator/            the discriminator alone, in the format `from_pretrained` loads,
                            published when the run finishes.

TensorFlow is imported inside the functions that need it, so that reading this module (as every
`electra-*` command's --help does through `electra_tf.convert`) stays light.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from absl import logging

from electra_tf import files

if TYPE_CHECKING:
    import tensorflow as tf

RECORD_FILE = "pretraining_config.json"
CHECKPOINT_PREFIX = "ckpt"
DISCRIMINATOR_FOLDER = "discriminator"


class RunFolderError(ValueError):
    """A run's model_dir cannot be used by this run: pretraining's holds another run, or no
    checkpoint of it reads back; fine-tuning's holds a finished model of other settings (refused
    unless `--overwrite`). The message names the folder or file. Nothing in it has been changed."""


def is_run_folder(path) -> bool:
    """Whether `path` is an `electra-pretrain --model_dir` with at least one checkpoint."""
    p = Path(path)
    return p.is_dir() and (p / RECORD_FILE).exists() and bool(checkpoint_prefixes(p))


def checkpoint_prefix(model_dir, step: int) -> str:
    """The prefix of the checkpoint of `step` in model_dir (whether or not it exists)."""
    return os.path.join(str(model_dir), f"{CHECKPOINT_PREFIX}-{step}")


def model_checkpoint(model, optimizer=None) -> tf.train.Checkpoint:
    """The checkpoint of a run's `ElectraPretrainer`: every model variable, listed, and the
    optimizer.

    With Keras 3, `tf.train.Checkpoint(model=pretrainer)` reaches the trainable weights only
    through the optimizer and misses the non-trainable ones, among them the dropout seed
    generators' states that an exact resume needs. So `model.variables` (weights and seed-
    generator states, in the model's deterministic order) are listed explicitly under
    `variables/<i>`.
    """
    import tensorflow as tf

    objects = {"model": model, "variables": [v.value for v in model.variables]}
    if optimizer is not None:
        objects["optimizer"] = optimizer
    return tf.train.Checkpoint(**objects)


def checkpoint_prefixes(model_dir) -> list[str]:
    """The checkpoints of model_dir, newest (highest step) first, found by their index files.

    The index file is the last file a save writes, so each is a complete save, whether or not the
    `checkpoint` state file (which a crash can leave stale, and TensorFlow ignores when it does
    not parse) lists it.
    """
    import tensorflow as tf

    found = []
    for index in tf.io.gfile.glob(os.path.join(str(model_dir), f"{CHECKPOINT_PREFIX}-*.index")):
        if not files.is_remote(index) and os.path.islink(index):
            continue  # not a save of ours: a run never writes a link (`_save` replaces one)
        prefix = index[:-len(".index")]
        number = prefix.rsplit("-", 1)[-1]
        if number.isdigit():
            found.append((int(number), prefix))
    return [prefix for _, prefix in sorted(found, reverse=True)]


def _short(error: BaseException) -> str:
    """The first line of a TensorFlow error, without its function-node prefix."""
    message = getattr(error, "message", None) or str(error)
    message = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)


def checkpoint_problem(prefix: str) -> str | None:
    """What makes checkpoint `prefix` unreadable, naming the file; None when every tensor reads
    back (reading checks each tensor's CRC32C)."""
    import tensorflow as tf

    data = sorted(tf.io.gfile.glob(prefix + ".data-*"))
    data_name = data[0] if len(data) == 1 else prefix + ".data-*"
    if not data:
        data_name = prefix + ".data-00000-of-00001"
    try:
        reader = tf.train.load_checkpoint(prefix)
        names = sorted(reader.get_variable_to_shape_map())
    except (tf.errors.OpError, ValueError, IndexError) as e:
        message = _short(e)
        if "No such file" in message:
            return f"{data_name}: missing"
        if "sstable" in message or "block checksum" in message or "Unable to read" in message:
            return f"{prefix}.index: unreadable index (cut or damaged: {message})"
        return f"{prefix}.index: {message}"
    for name in names:
        try:
            reader.get_tensor(name)
        except IndexError:  # "Read less bytes than requested"
            size = sum(tf.io.gfile.stat(f).length for f in data)
            return f"{data_name}: cut short ({size:,} bytes; tensor {name} lies beyond the end)"
        except (tf.errors.OpError, ValueError) as e:
            message = _short(e)
            if "No such file" in message:
                return f"{data_name}: missing"
            if "Checksum does not match" in message:
                return f"{data_name}: checksum mismatch in tensor {name} (damaged bytes)"
            return f"{data_name}: {message} (tensor {name})"
    return None


def restore_newest_readable(checkpoint: tf.train.Checkpoint, model_dir) -> str | None:
    """Restores the newest checkpoint of model_dir that reads back; returns it (None: none yet).

    A run of weeks should not stop because its last save was cut (a full disk, a kill during the
    write): a damaged checkpoint is named in a warning, left in place (a later save at its step
    replaces it) and the one before it is tried. A checkpoint that reads back but does not fit the
    model raises RunFolderError (an older one would not fit either), as does a folder whose
    checkpoints are all damaged: starting over there would overwrite them.
    """
    import tensorflow as tf

    prefixes = checkpoint_prefixes(model_dir)
    state = tf.train.get_checkpoint_state(str(model_dir))
    named = state and state.model_checkpoint_path
    if named and os.path.basename(named) not in {os.path.basename(p) for p in prefixes}:
        logging.warning("%s: the checkpoint state names %s, but %s.index is missing", model_dir,
                        os.path.basename(named), os.path.basename(named))
    damaged = []
    for prefix in prefixes:
        try:
            checkpoint.restore(prefix).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, IndexError, AssertionError) as e:
            problem = checkpoint_problem(prefix)
            if problem is None:
                raise RunFolderError(f"{prefix} does not fit this run's model and optimizer "
                                     f"({_short(e)}); use another --model_dir") from None
            logging.warning("damaged checkpoint %s; trying the one before it", problem)
            damaged.append(problem)
            continue
        if damaged:
            logging.warning("Resuming from %s, the newest checkpoint that reads back; the damaged "
                            "files are left in place", prefix)
        return prefix
    if damaged:
        raise RunFolderError(f"model_dir {model_dir} has no checkpoint that reads back "
                             f"({'; '.join(damaged)}); move them aside to start over")
    return None


def read_record(model_dir) -> dict:
    """The run record of model_dir; raises tf.errors.OpError (missing) or ValueError (not JSON)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(os.path.join(str(model_dir), RECORD_FILE)) as f:
        return json.loads(f.read())


def kept_facts(model_dir: str, latest) -> dict:
    """The facts a resumed run keeps from its record (how its weights were initialised)."""
    import tensorflow as tf

    if not latest:
        return {}
    try:
        saved = read_record(model_dir)
    except (tf.errors.OpError, ValueError):
        return {}
    return {"init_checkpoint": saved["init_checkpoint"]} if saved.get("init_checkpoint") else {}


def write_record(model_dir: str, record: dict) -> None:
    """pretraining_config.json, replaced in one rename (a full disk leaves the old one; a link
    planted at the name is replaced, not written through: `files.write_json`)."""
    files.write_json(os.path.join(model_dir, RECORD_FILE), record, sort_keys=True)
