"""What every checkpoint format shares: the walk over our weights, the checks and the report.

Every weight of our Keras models is described once, by a `Slot` named with its variable name in
the authors' TF1 checkpoints (the scopes of google-research/electra's `model/modeling.py` and
`run_pretraining.py`, as the released archives list them). The TF1 format uses
these names directly; the Hugging Face format translates them (`hf.hf_name`). A slot also knows the
tensor's shape in those checkpoints, where attention kernels are flat [H, H] matrices rather than
the [H, heads, head_dim] of Keras' MultiHeadAttention.

Loading is all-or-nothing: every name is checked (missing, mis-shaped, unknown) before the first
variable is assigned, so a failed conversion leaves the model untouched.

A file cut short or damaged (an interrupted download or copy) is a ConversionError naming the file,
whatever the format: the readers underneath do not name it (TensorFlow raises
`IndexError("Read less bytes than requested")` for a cut `.data-*` file, safetensors
"incomplete metadata").
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import re
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from electra_tf import files
from electra_tf.config import SPECIAL_ID_FIELDS


class ConversionError(ValueError):
    """A checkpoint does not fit the model; the message names the variable(s) and shapes."""


@dataclasses.dataclass
class ConversionReport:
    """What a conversion did with each tensor.

    Attributes:
      mapped: (source name, target name, shape) of every tensor copied.
      ignored: (name, reason) of source tensors deliberately skipped (optimizer slots, ...).
      missing: (name, expected shape) of tensors the target needed but the source lacks.
      unknown: (name, shape) of source tensors nothing accounts for.
    """

    mapped: list = dataclasses.field(default_factory=list)
    ignored: list = dataclasses.field(default_factory=list)
    missing: list = dataclasses.field(default_factory=list)
    unknown: list = dataclasses.field(default_factory=list)
    source: str = ""
    target: str = ""

    def counts(self) -> dict:
        return {"mapped": len(self.mapped), "ignored": len(self.ignored),
                "missing": len(self.missing), "unknown": len(self.unknown)}

    def summary(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items())
        return f"{self.source or '?'} -> {self.target or '?'}: {counts}"

    def __str__(self) -> str:
        lines = [self.summary(), f"mapped ({len(self.mapped)}):"]
        lines += [f"  {src} -> {dst} {list(shape)}" for src, dst, shape in self.mapped]
        lines.append(f"ignored ({len(self.ignored)}):")
        by_reason = {}
        for name, reason in self.ignored:
            by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            lines.append(f"  {len(names)} x {reason}: {shown}")
        lines.append(f"missing ({len(self.missing)}):")
        lines += [f"  {name} {list(shape)}" for name, shape in self.missing]
        lines.append(f"unknown ({len(self.unknown)}):")
        lines += [f"  {name} {list(shape)}" for name, shape in self.unknown]
        return "\n".join(lines)


class Pretrained(NamedTuple):
    """What a loader returns: the model, the config it was built with (a generator's own for
    network="generator"), the checkpoint's vocabulary (or None), the report and the format."""

    model: object
    config: object  # ElectraConfig
    vocab_path: str | None
    report: ConversionReport
    format: str


@dataclasses.dataclass(frozen=True)
class Slot:
    """One of our variables, under its TF1 checkpoint name and with its TF1 shape."""

    name: str  # e.g. "electra/encoder/layer_0/attention/self/query/kernel"
    variable: object  # a keras.Variable
    shape: tuple  # the shape in the TF1 checkpoint, e.g. (H, H)

    @property
    def is_kernel(self) -> bool:
        return self.name.endswith("/kernel")

    def value(self) -> np.ndarray:
        """The variable as the TF1 checkpoint stores it."""
        return np.asarray(self.variable.numpy()).reshape(self.shape)


# --- the walk over our models ------------------------------------------------------------------
def _slot(name, variable, shape=None):
    return Slot(name, variable, tuple(int(d) for d in (shape or variable.shape)))


def _dense(prefix, layer):
    return [_slot(f"{prefix}/kernel", layer.kernel), _slot(f"{prefix}/bias", layer.bias)]


def _layer_norm(prefix, layer):
    return [_slot(f"{prefix}/gamma", layer.gamma), _slot(f"{prefix}/beta", layer.beta)]


def backbone_slots(model, scope: str, embeddings_scope: str) -> list[Slot]:
    """Embeddings, `embeddings_project` and the encoder of a Generator or Discriminator.

    `scope` is "electra" for the discriminator (and for a generator tying every weight),
    "generator" otherwise; `embeddings_scope` is "electra" unless the generator's embeddings are
    untied (`model/modeling.py` puts them under `generator/embeddings` then).
    """
    emb = model.embeddings
    e = f"{embeddings_scope}/embeddings"
    slots = [_slot(f"{e}/word_embeddings", emb.word_embeddings),
             _slot(f"{e}/token_type_embeddings", emb.token_type_embeddings),
             _slot(f"{e}/position_embeddings", emb.position_embeddings),
             *_layer_norm(f"{e}/LayerNorm", emb.layer_norm)]
    if model.embeddings_project is not None:
        slots += _dense(f"{scope}/embeddings_project", model.embeddings_project.dense)
    for i, layer in enumerate(model.encoder.layers):
        p = f"{scope}/encoder/layer_{i}"
        att = layer.attention
        for name, dense in (("query", att._query_dense), ("key", att._key_dense),
                            ("value", att._value_dense)):
            hidden, heads, head_dim = dense.kernel.shape  # Keras: [H, heads, head_dim]
            slots.append(_slot(f"{p}/attention/self/{name}/kernel", dense.kernel,
                               (hidden, heads * head_dim)))
            slots.append(_slot(f"{p}/attention/self/{name}/bias", dense.bias, (heads * head_dim,)))
        heads, head_dim, hidden = att._output_dense.kernel.shape  # Keras: [heads, head_dim, H]
        slots.append(_slot(f"{p}/attention/output/dense/kernel", att._output_dense.kernel,
                           (heads * head_dim, hidden)))
        slots.append(_slot(f"{p}/attention/output/dense/bias", att._output_dense.bias))
        slots += _layer_norm(f"{p}/attention/output/LayerNorm", layer.attention_layer_norm)
        slots += _dense(f"{p}/intermediate/dense", layer.intermediate)
        slots += _dense(f"{p}/output/dense", layer.output_dense)
        slots += _layer_norm(f"{p}/output/LayerNorm", layer.output_layer_norm)
    return slots


def discriminator_slots(disc) -> list[Slot]:
    if disc.mlm_head is not None:
        raise ConversionError(
            "a Discriminator with an MLM head (objectives replace_mlm / all_tokens_mlm / mlm) has no "
            "layout in the released checkpoints; convert a model with the 'electra' objective")
    slots = backbone_slots(disc, "electra", "electra")
    if disc.rtd_head is not None:
        slots += _dense("discriminator_predictions/dense", disc.rtd_head.dense)
        slots += _dense("discriminator_predictions/dense_1", disc.rtd_head.dense_1)
    return slots


def generator_slots(gen, scope: str = "generator", embeddings_scope: str | None = None):
    """The generator's slots; by default its embeddings are the shared `electra/embeddings`
    unless its config says "untied"."""
    if embeddings_scope is None:
        embeddings_scope = "generator" if gen.config.embedding_sharing == "untied" else "electra"
    head = gen.lm_head
    return [*backbone_slots(gen, scope, embeddings_scope),
            *_dense("generator_predictions/dense", head.dense),
            *_layer_norm("generator_predictions/LayerNorm", head.layer_norm),
            _slot("generator_predictions/output_bias", head.output_bias)]


def cloze_generator_slots(gen, embeddings_scope: str = "electra") -> list[Slot]:
    """Electric's two-tower generator: `generator_ltr/`, `generator_rtl/` and the head
    `cloze_predictions/` (the authors' `TwoTowerClozeTransformer` scopes). The towers' embeddings
    are the shared `electra/embeddings`, or each tower's own (`generator_ltr/embeddings`, ...)
    with `embeddings_scope=None` (untied)."""
    head = gen.cloze_head
    slots = []
    for scope, tower in (("generator_ltr", gen.ltr), ("generator_rtl", gen.rtl)):
        slots += backbone_slots(tower, scope, embeddings_scope or scope)
    return [*slots, *_dense("cloze_predictions/dense", head.dense),
            *_layer_norm("cloze_predictions/LayerNorm", head.layer_norm),
            _slot("cloze_predictions/output_bias", head.output_bias)]


def generator_scopes(gen, disc=None) -> tuple[str, str]:
    """(scope, embeddings_scope) of a generator next to discriminator `disc` (None: standalone)."""
    if disc is not None and gen.encoder is disc.encoder:
        return "electra", "electra"  # every weight tied: the generator IS the discriminator
    if disc is not None:
        return "generator", "electra" if gen.embeddings is disc.embeddings else "generator"
    return "generator", "generator" if gen.config.embedding_sharing == "untied" else "electra"


def model_slots(model, scopes: tuple[str, str] | None = None) -> list[Slot]:
    """Slots of a Discriminator, Generator or ElectraPretrainer; shared weights appear once.

    `scopes` overrides the generator's (scope, embeddings_scope) for a standalone Generator.
    """
    from electra_tf.models import Discriminator, ElectraPretrainer, Generator

    if isinstance(model, ElectraPretrainer):
        slots = discriminator_slots(model.discriminator)
        if model.config.objective == "electric":
            shared = model.generator.embeddings is model.discriminator.embeddings
            slots += cloze_generator_slots(model.generator, "electra" if shared else None)
        elif model.generator is not None:
            slots += generator_slots(model.generator,
                                     *generator_scopes(model.generator, model.discriminator))
    elif isinstance(model, Discriminator):
        slots = discriminator_slots(model)
    elif isinstance(model, Generator):
        slots = generator_slots(model, *(scopes or generator_scopes(model)))
    else:
        raise TypeError(f"expected a Discriminator, Generator or ElectraPretrainer, got "
                        f"{type(model).__name__}")
    unique = {}
    for slot in slots:
        seen = unique.setdefault(slot.name, slot)
        if seen.variable is not slot.variable:
            raise ConversionError(f"two different variables map to {slot.name}: "
                                  f"{seen.variable.path} and {slot.variable.path}")
    return list(unique.values())


def network_of(model) -> str:
    from electra_tf.models import Discriminator, ElectraPretrainer, Generator

    for cls, network in ((ElectraPretrainer, "pretrainer"), (Discriminator, "discriminator"),
                      (Generator, "generator")):
        if isinstance(model, cls):
            return network
    raise TypeError(f"not an ELECTRA model: {type(model).__name__}")


# --- names the released checkpoints can hold -----------------------------------------------------
_BACKBONE = (
    r"(electra|generator|generator_ltr|generator_rtl)/("
    r"embeddings/(word_embeddings|token_type_embeddings|position_embeddings|LayerNorm/(gamma|beta))"
    r"|embeddings_project/(kernel|bias)"
    r"|encoder/layer_\d+/(attention/self/(query|key|value)/(kernel|bias)"
    r"|attention/output/dense/(kernel|bias)|attention/output/LayerNorm/(gamma|beta)"
    r"|intermediate/dense/(kernel|bias)|output/dense/(kernel|bias)|output/LayerNorm/(gamma|beta)))")
_HEADS = (r"discriminator_predictions/dense(_1)?/(kernel|bias)"
          r"|(generator|cloze)_predictions/(dense/(kernel|bias)|LayerNorm/(gamma|beta)|output_bias)")
KNOWN_TF1_NAME = re.compile(f"({_BACKBONE}|{_HEADS})")


def part_of(name: str) -> str:
    """'generator' or 'discriminator': which network a (valid TF1) name belongs to."""
    generator = ("generator/", "generator_predictions/", "generator_ltr/", "generator_rtl/",
                 "cloze_predictions/")  # the last three: Electric's two-tower generator
    return "generator" if name.startswith(generator) else "discriminator"


# --- checking and assigning ----------------------------------------------------------------------
def plan_load(slots: list[Slot], available: dict[str, tuple], *,
              name_of: Callable[[Slot], str] = lambda s: s.name,
              shape_of: Callable[[Slot], tuple] = lambda s: s.shape,
              classify: Callable[[str], str | None] = lambda name: None,
              allow_missing: bool = False, allow_unknown: bool = False,
              source: str = "", target: str = "") -> ConversionReport:
    """Checks `available` (source name -> shape) against `slots` and returns the report.

    `classify(name)` gives the reason a source name not used by any slot is ignored, or None
    (then the name is unknown). Raises ConversionError on a mis-shaped tensor, on missing tensors
    (unless allow_missing) and on unknown tensors (unless allow_unknown).
    """
    report = ConversionReport(source=source, target=target)
    used, bad_shapes = set(), []
    for slot in slots:
        name, expected = name_of(slot), tuple(shape_of(slot))
        if name not in available:
            report.missing.append((name, expected))
            continue
        used.add(name)
        got = tuple(int(d) for d in available[name])
        if got != expected:
            if name.endswith(("word_embeddings", "word_embeddings.weight")) and got[1:] == expected[1:]:
                bad_shapes.append(
                    f"vocabulary size mismatch: {name} has {got[0]} rows {list(got)} in the "
                    f"checkpoint but the model ({slot.variable.path}) has vocab_size {expected[0]} "
                    f"{list(expected)}")
            else:
                bad_shapes.append(f"{name}: checkpoint shape {list(got)} but the model's "
                                  f"{slot.variable.path} needs {list(expected)}")
        report.mapped.append((name, slot.variable.path, expected))
    for name in sorted(set(available) - used):
        reason = classify(name)
        if reason is None:
            report.unknown.append((name, tuple(available[name])))
        else:
            report.ignored.append((name, reason))
    problems = list(bad_shapes)
    if report.missing and not allow_missing:
        problems.append(f"{len(report.missing)} variable(s) missing from the checkpoint: " + "; ".join(
            f"{n} {list(s)}" for n, s in report.missing))
    if report.unknown and not allow_unknown:
        problems.append(f"{len(report.unknown)} unknown variable(s) in the checkpoint (pass "
                        "allow_unknown=True to skip them): " + "; ".join(
                            f"{n} {list(s)}" for n, s in report.unknown))
    if problems:
        raise ConversionError(f"cannot load {source or 'checkpoint'} into {target or 'model'}:\n  "
                              + "\n  ".join(problems))
    return report


def assign(slots: list[Slot], arrays: dict[str, np.ndarray], *,
           name_of: Callable[[Slot], str] = lambda s: s.name,
           to_tf1_layout: Callable[[Slot, np.ndarray], np.ndarray] = lambda s, a: a) -> None:
    """Copies the (already checked) source arrays into the slots' variables."""
    for slot in slots:
        name = name_of(slot)
        if name not in arrays:
            continue  # allowed missing
        value = to_tf1_layout(slot, np.asarray(arrays[name]))
        variable = slot.variable
        variable.assign(value.reshape(tuple(variable.shape)).astype(variable.dtype))


# --- vocabulary --------------------------------------------------------------------------------
def vocab_overrides(vocab_file, vocab_size: int, where: str = "the checkpoint's word_embeddings") -> dict:
    """The config's special-token ids from `vocab_file`; raises ConversionError if it is not a
    vocabulary (`tokenizer.load_vocab`) or its size differs from `vocab_size`, the size `where`
    gives."""
    if vocab_file is None:
        return {}
    from electra_tf.data.tokenizer import VocabError, load_vocab, special_token_ids  # TensorFlow

    try:
        tokens = load_vocab(str(vocab_file))
    except VocabError as e:
        raise ConversionError(str(e)) from None
    if len(tokens) != vocab_size:
        raise ConversionError(f"vocabulary size mismatch: {vocab_file} has {len(tokens)} tokens but "
                              f"{where} is {vocab_size}")
    ids = special_token_ids(tokens)
    return {name: ids[name] for name in SPECIAL_ID_FIELDS}


def check_vocab_size(config, vocab_size: int, where: str) -> None:
    if config.vocab_size != vocab_size:
        raise ConversionError(f"vocabulary size mismatch: config.vocab_size={config.vocab_size} but "
                              f"{where} has {vocab_size} rows")


# --- damaged files -------------------------------------------------------------------------------
def one_line(reason) -> str:
    """The first line of a reader's message (or exception), at most 200 characters."""
    if isinstance(reason, BaseException):
        reason = getattr(reason, "message", None) or str(reason) or type(reason).__name__
    reason = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", str(reason))  # TF op-wrapper noise
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    line = lines[0] if lines else "unreadable"
    return line if len(line) <= 200 else line[:200] + "..."


def damaged(path, reason) -> ConversionError:
    """The error for a checkpoint file that cannot be read as what it claims to be.

    `reason`: text, or the reader's exception; only its first line is kept (one-line errors).
    """
    return ConversionError(f"{path} is truncated or corrupt ({one_line(reason)}); "
                           "re-download or re-write it")


def read_json(path) -> dict:
    """The JSON object in a file of a checkpoint folder (config.json, markers, shard indexes)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise damaged(path, f"line {e.lineno}: not valid JSON: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise damaged(path, f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    except RecursionError:  # Python's reader recurses per level: '[' * 100000 overflows it
        raise damaged(path, "JSON nested deeper than a config or checkpoint file is") from None
    if not isinstance(value, dict):
        raise damaged(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def open_tf_checkpoint(prefix: str):
    """`tf.train.load_checkpoint(prefix)`; a damaged or missing `.index` is a ConversionError.

    Opening reads only the index; the tensors are read later, inside `reading_tf_tensors`.
    """
    import tensorflow as tf

    try:
        return tf.train.load_checkpoint(prefix)
    except tf.errors.NotFoundError:
        raise ConversionError(f"{prefix}.index: missing") from None
    except (IndexError, tf.errors.OpError) as e:
        raise damaged(f"{prefix}.index", e) from None


@contextlib.contextmanager
def reading_tf_tensors(prefix: str):
    """Around reads of tensors of checkpoint `prefix` (after `open_tf_checkpoint` succeeded).

    Errors then come from the `.data-*` files: a ConversionError names them.
    """
    import tensorflow as tf

    try:
        yield
    except (IndexError, tf.errors.OpError) as e:
        shards = sorted(glob.glob(glob.escape(prefix) + ".data-*-of-*"))
        if not shards or getattr(e, "error_code", None) == tf.errors.NOT_FOUND:
            raise ConversionError(f"{prefix}: a data file of the checkpoint is missing "
                                  f"({one_line(e)})") from None
        where = shards[0] if len(shards) == 1 else f"{prefix}.data-* ({len(shards)} files)"
        # TensorFlow's IndexError ("Read less bytes than requested") is a cut file.
        reason = "shorter than its .index says" if isinstance(e, IndexError) else e
        raise damaged(where, reason) from None


# --- output folders ------------------------------------------------------------------------------
def output_folder_problem(path, *, built_beside: bool = False) -> str | None:
    """Why a command could not write its output folder `path`, or None: a file is at `path` or
    where one of its parent folders belongs, or the folder the writing happens in is read-only or
    not writable. That folder is `path` (or, when missing, its nearest existing parent, under
    which the command makes it), or `path`'s parent when the output is `built_beside` it and
    renamed into place (`files.staged_folder`). Cheap (one probe file made and removed), so a
    command asks before it loads anything. Remote paths: None (no local check means anything there)."""
    if files.is_remote(path):
        return None
    path = os.path.abspath(str(path))
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path} exists and is not a folder"
    probe = os.path.dirname(path) if built_beside else path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is a file, not a folder"
    reason = files.cannot_write_in(probe)  # a real write, right for root and read-only mounts
    if reason is not None:
        return f"cannot write in {probe} ({reason[:1].lower() + reason[1:]})"
    return None


@contextlib.contextmanager
def locked_folder(folder):
    """An exclusive advisory lock on the folder itself (flock on its descriptor; nothing is
    written into it), for a few steps that must not interleave with another process's: the
    sweep of abandoned staging folders and the making and holding (`files.hold`) of a new one."""
    import fcntl

    fd = os.open(str(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


# `files.staged_folder`'s private names: `.NAME.staging-` and mkdtemp's 8 random characters.
def _staging_names(final) -> re.Pattern:
    return re.compile(re.escape(f".{os.path.basename(final)}.staging-") + r"[a-z0-9_]{8}")


@contextlib.contextmanager
def staged_output(final):
    """`files.staged_folder(final)`: yields an empty private folder beside `final`, published at
    `final` whole when the block ends (an existing folder swapped out in one step), deleted on an
    error. Besides: the staging folders of killed runs beside `final` are removed first, and this
    one is held (`files.hold`) until it is published, so that another run's sweep leaves it be."""
    if files.is_remote(final):
        with files.staged_folder(final) as staging:
            yield staging
        return
    final = os.path.abspath(str(final))
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    pattern = _staging_names(final)
    with contextlib.ExitStack() as stack:
        held = []
        stack.callback(lambda: [os.close(fd) for fd in held])  # runs last: after the publish
        with locked_folder(parent):
            files.remove_abandoned([os.path.join(parent, n) for n in os.listdir(parent) if pattern.fullmatch(n)])
            staging = stack.enter_context(files.staged_folder(final))
            held.append(files.hold(staging))
        yield staging
