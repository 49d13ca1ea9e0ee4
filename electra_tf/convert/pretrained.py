"""`from_pretrained`: one entry point for the three checkpoint formats, and our own format.

Formats, detected automatically:
  tf1         the authors' name-based checkpoints: a prefix (`model.ckpt-1000000`), its `.index`
              file, or a released archive folder (`checkpoint` / `*.index` + `vocab.txt`).
  hf          a Hugging Face folder: `config.json` + `model.safetensors` (or `pytorch_model.bin`);
              for a pretrainer, a folder with `discriminator/` and `generator/` HF folders.
  electra_tf  ours: `electra_tf_checkpoint.json` (marker), `config.json` (`ElectraConfig.to_json`),
              a `tf.train.Checkpoint` with the objects `discriminator` and/or `generator`, and
              optionally `vocab.txt`. Written by `save_electra_checkpoint`.
  keras_hub   a keras-hub `ElectraBackbone` preset folder (`config.json` naming the class,
              `model.weights.h5`, tokenizer): one encoder, no heads; needs the keras_hub extra.
              See `keras_hub.py` for what differs (GELU, pooler).

Released models load by name too (`names.py`): a Hugging Face Hub id or a keras-hub preset is
fetched into its library's cache and read from there; a path that exists always wins.

Example:
>>> disc, config, vocab = from_pretrained("google/electra-small-discriminator")  # Hub id
>>> disc, config, vocab = from_pretrained("electra_small")          # a released TF1 archive folder
>>> save_electra_checkpoint(disc, config, "/tmp/small", vocab_file=vocab)
>>> disc, config, vocab = from_pretrained("/tmp/small")             # ours, same weights
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from electra_tf import files, run_folder
from electra_tf.config import ElectraConfig
from electra_tf.convert import hf, keras_hub, tf1
from electra_tf.convert.names import resolve_checkpoint, with_revision
from electra_tf.convert.common import (
    ConversionError, ConversionReport, Pretrained, check_vocab_size, damaged, network_of,
    one_line, open_tf_checkpoint, output_folder_problem, part_of, read_json, reading_tf_tensors, staged_output)

FORMATS = ("tf1", "hf", "electra_tf", "keras_hub")
# What to load, convert or save: one network, or "pretrainer", both with their heads.
NETWORKS = ("discriminator", "generator", "pretrainer")
MARKER = "electra_tf_checkpoint.json"  # version 2 names the network in "network", version 1 in "kind"
CHECKPOINT_NAME = "model"  # <folder>/model.index, model.data-*


# --- our own format ------------------------------------------------------------------------------
def save_electra_checkpoint(model, config: ElectraConfig, folder, vocab_file=None) -> str:
    """Writes `model` (Discriminator, Generator or ElectraPretrainer) in our format.

    `config` is the config the model was built with (`model.config`). The checkpoint holds the
    object `discriminator` for a Discriminator, `generator` for a Generator, both for a
    pretrainer. Returns the checkpoint prefix.
    """
    import tensorflow as tf

    network = network_of(model)
    if network == "pretrainer":
        objects = {"discriminator": model.discriminator}
        if model.generator is not None:
            objects["generator"] = model.generator
    else:
        objects = {network: model}
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    prefix = tf.train.Checkpoint(**objects).write(str(out / CHECKPOINT_NAME))
    config.to_json(out / "config.json")
    vocab = None
    if vocab_file is not None:
        vocab = "vocab.txt"
        if Path(vocab_file).resolve() != (out / vocab).resolve():
            files.copy_file(vocab_file, out / vocab)
    disc = model.discriminator if network == "pretrainer" else model
    marker = {
        "format": "electra_tf", "version": 2, "network": network, "objects": sorted(objects),
        "checkpoint": CHECKPOINT_NAME, "config": "config.json", "vocab": vocab,
        "rtd_head": getattr(disc, "rtd_head", None) is not None if network != "generator" else None,
    }
    files.write_json(out / MARKER, marker)
    return prefix


def saved_network(folder) -> str | None:
    """The network a folder written by `save_electra_checkpoint` holds (its marker's "network", or
    "kind" in the marker of version 1)."""
    marker = read_json(Path(folder) / MARKER)
    return marker.get("network", marker.get("kind"))


def read_config(config) -> ElectraConfig | None:
    """`config` (an `ElectraConfig`, a path to its JSON, a name in configs/, or None) as an
    `ElectraConfig`. A file is read with `read_json`, so damage (not JSON, not an object, nested
    past Python's reader) is one line naming it; a wrong field is named by `ElectraConfig`."""
    if config is None or isinstance(config, ElectraConfig):
        return config
    if Path(config).is_file():
        return ElectraConfig.from_dict(read_json(config), source=str(config))
    return ElectraConfig.from_json(config)


def _config_mismatch(config_path: Path, error: Exception) -> str:
    """One line for a checkpoint whose tensors have other shapes than `config_path` gives: the
    tensor, and the size fields config.json lacks (their defaults, ELECTRA-Small's, were used)."""
    message = f"{config_path} does not describe the checkpoint beside it ({one_line(error)})"
    try:
        present = set(read_json(config_path))
    except (ConversionError, OSError):
        return message
    sizes = ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "generator_hidden_size", "generator_layers")
    missing = [f for f in sizes if f not in present]
    return message + (f"; field(s) missing from it: {', '.join(missing)}" if missing else "")


def _load_electra_tf(folder: Path, network: str, config=None) -> Pretrained:
    import tensorflow as tf

    from electra_tf.models import Discriminator, ElectraPretrainer, Generator

    marker = read_json(folder / MARKER)
    saved = saved_network(folder)
    if saved not in NETWORKS:
        raise damaged(folder / MARKER, f"field 'network': expected one of {NETWORKS}, got {saved!r}")
    for field, default in (("config", "config.json"), ("checkpoint", CHECKPOINT_NAME)):
        name = marker.get(field, default)  # a file of the folder, by its name
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
            raise damaged(folder / MARKER, f"field {field!r}: expected a file name in the folder, got {name!r}")
    config_path = folder / marker.get("config", "config.json")
    if not config_path.is_file():
        raise ConversionError(f"{config_path}: missing (the model's config, named in {MARKER})")
    saved_config = read_config(config_path)
    given_config = config is not None
    if given_config:
        config = read_config(config)
        check_vocab_size(config, saved_config.vocab_size, str(config_path))
    else:
        config = saved_config
    if saved != "pretrainer" and network != saved:
        raise ConversionError(f"{folder} holds a {saved}, not a {network}")
    if network == "pretrainer":
        model = ElectraPretrainer(config)
        objects = {"discriminator": model.discriminator}
        if model.generator is not None:
            objects["generator"] = model.generator
    elif network == "discriminator":
        model = Discriminator(config, rtd_head=marker.get("rtd_head", True) is not False)
        objects = {"discriminator": model}
    else:
        # Shared layers (embeddings, or every weight) are reachable through the saved
        # generator's own edges in the object graph, so a standalone Generator restores them.
        model = Generator(config if saved == "generator" else config.generator_config())
        objects = {"generator": model}
    prefix = str(folder / marker.get("checkpoint", CHECKPOINT_NAME))
    variables = open_tf_checkpoint(prefix).get_variable_to_shape_map()
    try:
        with reading_tf_tensors(prefix):
            status = tf.train.Checkpoint(**objects).read(prefix)
    except ValueError as e:  # a tensor of another shape: the sizes in config.json are not the checkpoint's
        if isinstance(e, ConversionError):
            raise
        if given_config:
            raise ConversionError(f"{prefix} does not fit the config given ({one_line(e)})") from None
        raise ConversionError(_config_mismatch(config_path, e)) from None
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise ConversionError(f"{prefix} does not match the {network} built from its config: {e}") from None
    status.expect_partial()
    report = ConversionReport(source=f"electra_tf:{folder}", target=f"{network} ({model.name})")
    report.mapped = [(v.path, v.path, tuple(v.shape)) for v in model.weights]
    restored = tuple(f"{k}/" for k in objects)
    for name in sorted(variables):
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith(restored):
            report.ignored.append((name, f"not part of the {network}"))
    vocab = folder / "vocab.txt"
    return Pretrained(model, model.config, str(vocab) if vocab.exists() else None, report,
                      "electra_tf")


def _load_run_folder(folder: Path, network: str, config=None, step: int | None = None) -> Pretrained:
    """Both networks of a pretraining run, from its newest readable checkpoint or from the one
    of `step` (the optimizer's slots stay behind), as `network`."""
    from electra_tf.models import ElectraPretrainer

    record_path = folder / run_folder.RECORD_FILE
    record = read_json(record_path)
    try:
        saved_config = ElectraConfig.from_dict(record["model_config"], source=str(record_path))
    except KeyError:
        raise damaged(record_path, "no 'model_config'") from None
    if config is not None:
        config = read_config(config)
        check_vocab_size(config, saved_config.vocab_size, str(record_path))
    model = ElectraPretrainer(config or saved_config)
    if step is not None:
        prefix = run_folder.checkpoint_prefix(folder, step)
        if not Path(prefix + ".index").exists():
            raise ConversionError(f"{folder}: no checkpoint of step {step} ({Path(prefix).name}.index)")
    else:
        prefix = next((p for p in run_folder.checkpoint_prefixes(folder)
                       if run_folder.checkpoint_problem(p) is None), None)  # a damaged one is skipped
        if prefix is None:
            raise ConversionError(f"{folder}: no readable checkpoint (ckpt-*.index)")
    status = run_folder.model_checkpoint(model).read(prefix)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise ConversionError(f"{prefix} does not fit the model of {record_path}: {str(e)[:200]}") from None
    status.expect_partial()
    if network == "generator" and model.generator is None:
        raise ConversionError(f"{folder}: objective {model.config.objective!r} has no generator")
    chosen = {"pretrainer": model, "discriminator": model.discriminator,
              "generator": model.generator}[network]
    report = ConversionReport(source=f"electra_tf run:{prefix}", target=f"{network} ({chosen.name})")
    report.mapped = [(v.path, v.path, tuple(v.shape)) for v in chosen.weights]
    if network != "pretrainer":
        other = model.generator if network == "discriminator" else model.discriminator
        ours = {id(v) for v in chosen.weights}
        report.ignored = [(v.path, f"not part of the {network}") for v in (other.weights if other else [])
                          if id(v) not in ours]
    return Pretrained(chosen, chosen.config, _run_vocab(folder, record), report, "electra_tf")


def _run_vocab(folder: Path, record: dict) -> str | None:
    """The run's vocabulary: the copy beside its exported discriminator (the file it trained
    with, wherever the command runs), else the recorded --vocab_file if it is there (an absolute
    path, or one relative to this directory as the run was started from it)."""
    own = folder / run_folder.DISCRIMINATOR_FOLDER / "vocab.txt"
    if own.exists():
        return str(own)
    recorded = record.get("vocab_file")
    return recorded if recorded and Path(recorded).exists() else None


# --- detection and loading -----------------------------------------------------------------------
def detect_format(path) -> str:
    """'tf1', 'hf', 'electra_tf' or 'keras_hub'; a ConversionError lists what was looked for.

    `path` may be a released model's name (`names.resolve_checkpoint`)."""
    path = resolve_checkpoint(path)
    p = Path(path)
    if p.is_dir():
        if (p / MARKER).exists() or run_folder.is_run_folder(p):
            return "electra_tf"
        if keras_hub.is_keras_hub_preset(p):
            return "keras_hub"
        if (p / "config.json").exists() and any((p / f).exists() for f in hf.WEIGHT_FILES):
            return "hf"
        if all((p / sub / "config.json").exists() for sub in ("discriminator", "generator")):
            return "hf"
        if (p / "checkpoint").exists() or any(p.glob("*.index")):
            return "tf1"
    elif Path(str(p) + ".index").exists() or p.name.endswith(".index") or ".data-" in p.name:
        return "tf1"
    raise ConversionError(
        f"no checkpoint found at {path}. Looked for: {MARKER} (electra_tf); config.json with "
        f"{' / '.join(hf.WEIGHT_FILES)}, or discriminator/ + generator/ HF folders (hf); a "
        "'checkpoint' file, '*.index' files or '<path>.index' (tf1); config.json of a keras-hub "
        "ElectraBackbone (keras_hub)")


def _deprecated_kind(network: str, kind: str | None) -> str:
    """`kind=`, the old name of `network=`, still works (with a DeprecationWarning)."""
    if kind is None:
        return network
    warnings.warn("kind= is deprecated: use network=", DeprecationWarning, stacklevel=3)
    return kind


def load_pretrained(path, network: str = "discriminator", config=None, *, input_format: str = "auto",
                    step: int | None = None, kind: str | None = None, revision: str | None = None,
                    **load_kwargs) -> Pretrained:
    """Like `from_pretrained`, also returning the conversion report and the detected format.

    `load_kwargs` (allow_unknown, allow_missing; tf1 also ignore_task_specific) go to the loader.
    `step` picks a pretraining run folder's checkpoint (default: its newest readable one).
    """
    network = _deprecated_kind(network, kind)
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {NETWORKS}, got {network!r}")
    config = read_config(config)  # before a name is fetched or a tensor read
    path = resolve_checkpoint(with_revision(path, revision))  # a name -> its local folder
    fmt = detect_format(path) if input_format == "auto" else input_format
    if fmt == "tf1":
        model, cfg, report, vocab = tf1.load_tf1_model(path, network, config, **load_kwargs)
    elif fmt == "hf":
        if network != "generator" and hf.is_generator_folder(path):
            raise ConversionError(f"{path} holds a generator (ElectraForMaskedLM): load it as "
                                  "network='generator' (electra-convert: --network=auto)")
        model, cfg, report, vocab = hf.load_hf_model(path, network, config, **load_kwargs)
    elif fmt == "electra_tf":
        if run_folder.is_run_folder(path) and not (Path(path) / MARKER).exists():
            return _load_run_folder(Path(path), network, config, step)
        if not (Path(path) / MARKER).exists():
            raise ConversionError(f"{path}: no {MARKER} and no {run_folder.RECORD_FILE} with "
                                  "checkpoints; not an electra_tf checkpoint folder or pretraining run")
        return _load_electra_tf(Path(path), network, config)
    elif fmt == "keras_hub":
        if network != "discriminator":
            raise ConversionError(f"{path}: a keras-hub preset holds one encoder and no heads; "
                                  f"load it as network='discriminator', not {network!r}")
        return keras_hub.load_keras_hub_preset(path, config)
    else:
        raise ValueError(f"input_format must be 'auto' or one of {FORMATS}, got {fmt!r}")
    return Pretrained(model, cfg, vocab, report, fmt)


def from_pretrained(path, network: str = "discriminator", config=None, *, kind: str | None = None,
                    revision: str | None = None):
    """Loads a Discriminator, Generator or ElectraPretrainer from any supported checkpoint.

    Args:
      path: a TF1 checkpoint prefix or archive folder, a Hugging Face folder, a keras-hub preset
        folder, a pretraining run folder, or a folder written by `save_electra_checkpoint`; or a
        released model's name: a Hugging Face Hub id (`google/electra-small-discriminator`,
        `owner/name@revision`) or a keras-hub preset (`electra_small_discriminator_uncased_en`,
        `kaggle://...`, `hf://...`), downloaded to (or found in) the library's cache
        (`names.py`). A path that exists always wins.
      network: "discriminator", "generator" or "pretrainer" (both networks). `kind=` is its
        deprecated old name.
      config: optional `ElectraConfig`, config name or path: the pretraining (discriminator)
        config; inferred from the checkpoint when None.
      revision: for a Hub id, the branch, tag or commit (as `transformers`' `revision=`; the
        same as `owner/name@revision`).

    Returns (model, config, vocab_path): `config` is the one the model was built with (for
    network="generator", the generator's own); `vocab_path` is the checkpoint's vocab.txt or None.
    """
    loaded = load_pretrained(path, _deprecated_kind(network, kind), config, revision=revision)
    return loaded.model, loaded.config, loaded.vocab_path


# --- writing and converting ----------------------------------------------------------------------
def save(model, output, output_format: str, *, vocab_file=None,
         config: ElectraConfig | None = None) -> ConversionReport:
    """Writes `model` in `output_format` ('tf1', 'hf', 'electra_tf' or 'keras_hub') to `output`."""
    if output_format == "tf1":
        return tf1.export_tf1(model, output, vocab_file=vocab_file)[1]
    if output_format == "hf":
        return hf.export_hf(model, output, vocab_file=vocab_file)
    if output_format == "electra_tf":
        save_electra_checkpoint(model, config or model.config, output, vocab_file=vocab_file)
        report = ConversionReport(source=f"{network_of(model)} ({model.name})",
                                  target=f"electra_tf:{output}")
        report.mapped = [(v.path, v.path, tuple(v.shape)) for v in model.weights]
        return report
    if output_format == "keras_hub":  # the discriminator's encoder: heads and generator dropped
        return keras_hub.write_keras_hub_preset(model, output, vocab_file=vocab_file)
    raise ValueError(f"output_format must be one of {FORMATS}, got {output_format!r}")


def to_keras_hub_preset(source, preset_dir, *, vocab_file=None, lower_case: bool | None = None,
                        config=None) -> ConversionReport:
    """Writes a keras-hub ELECTRA preset (backbone + tokenizer) from a discriminator.

    Args:
      source: a Discriminator, Generator or ElectraPretrainer, or any checkpoint `load_pretrained`
        reads (its discriminator is written).
      preset_dir: the folder to write.
      vocab_file: the WordPiece vocabulary; by default the checkpoint's. Without one, the preset
        has no tokenizer.
      lower_case: the tokenizer's casing; by default what the checkpoint (or the folder of
        `vocab_file`) records (`electra_tf.data.casing`), else True (uncased, as the released
        ELECTRA models).
      config: for a checkpoint path, the config to read it with (as `from_pretrained`).

    Returns the conversion report (weights mapped, heads ignored, pooler written as identity).
    """
    model = source
    if isinstance(source, (str, Path)):
        source = resolve_checkpoint(source)
        loaded = load_pretrained(source, "discriminator", config)
        model, vocab_file = loaded.model, vocab_file or loaded.vocab_path
        if lower_case is None:
            lower_case = keras_hub.recorded_lower_case(source)
    return keras_hub.write_keras_hub_preset(model, preset_dir, vocab_file=vocab_file,
                                            lower_case=lower_case)


def holds_generator(path, input_format: str = "auto") -> bool:
    """Whether the checkpoint at `path` has a generator besides the discriminator."""
    path = resolve_checkpoint(path)
    fmt = detect_format(path) if input_format == "auto" else input_format
    p = Path(path)
    if fmt == "electra_tf" and run_folder.is_run_folder(p) and not (p / MARKER).exists():
        record = read_json(p / run_folder.RECORD_FILE)
        return record.get("model_config", {}).get("objective", "electra") != "mlm"
    if fmt == "electra_tf":
        return "generator" in read_json(p / MARKER).get("objects", [])
    if fmt == "hf":
        return all((p / sub / "config.json").exists() for sub in ("discriminator", "generator"))
    if fmt == "tf1":
        prefix, _ = tf1.resolve_checkpoint(path)
        return any(part_of(name) == "generator" for name in tf1.read_shapes(prefix))
    return False


def check_output(output, *, overwrite: bool = False, input_path=None, flag: str = "--output") -> None:
    """Raises a one-line ConversionError naming `flag` if `output` cannot take a conversion: it is
    a symbolic link (never written through), a file, under a file, in a folder that cannot be
    written (the output is built beside it and renamed in), a folder that is not empty (unless
    `overwrite`), or the folder `input_path` is in. Cheap: call it before loading anything."""
    if files.is_remote(output):
        return
    overwrite_flag = "--overwrite" if flag.startswith("--") else "overwrite=True"
    if os.path.islink(output):
        raise ConversionError(f"{flag} {output} is a symbolic link; electra_tf does not write through links "
                              "(give the folder itself or another one)")
    problem = output_folder_problem(output, built_beside=True)
    if problem is not None:
        raise ConversionError(f"{flag} {output}: {problem}")
    if input_path is not None and not files.is_remote(input_path):
        read = Path(input_path)
        if not read.exists() and Path(f"{input_path}.index").exists():
            read = read.parent  # a TF1 prefix: its files are in its folder
        if read.exists():
            read, written = os.path.realpath(read), os.path.realpath(output)
            if read == written or read.startswith(written.rstrip(os.sep) + os.sep):
                raise ConversionError(f"{flag} {output} holds the input {input_path}; write the conversion "
                                      "to another folder")
    if os.path.isdir(output) and os.listdir(output) and not overwrite:
        raise ConversionError(f"{flag} {output} exists and is not empty; pass {overwrite_flag} to replace "
                              "it (the new model is built beside it and swapped in whole)")


def convert(input_path, output_path, *, input_format: str = "auto",
            output_format: str = "electra_tf", network: str = "auto", config=None,
            overwrite: bool = False, **load_kwargs) -> tuple[ConversionReport, ConversionReport]:
    """Reads a checkpoint in one format and writes it in another. Returns (import, export) reports.

    network "auto" converts everything the input holds: the pretrainer (generator and
    discriminator) when it has a generator, the generator of a Hugging Face generator folder,
    else the discriminator.

    `output_path` is checked first (`check_output`): a folder that is not empty is refused
    unless `overwrite`. The model is written to a private folder beside it and renamed into place
    when complete (`common.staged_output`), swapping out the old folder whole with `overwrite`:
    no file of the old model stays beside the new ones, and a kill leaves the old folder or the
    new one (plus a hidden staging folder, removed by the next conversion to that place).
    """
    check_output(output_path, overwrite=overwrite, input_path=input_path, flag="output")
    config = read_config(config)
    if network == "auto":
        input_path = resolve_checkpoint(input_path)
        fmt = detect_format(input_path) if input_format == "auto" else input_format
        if fmt == "hf" and hf.is_generator_folder(input_path):
            network = "generator"  # a released generator alone (google/electra-*-generator)
        else:
            network = "pretrainer" if holds_generator(input_path, fmt) else "discriminator"
    loaded = load_pretrained(input_path, network, config, input_format=input_format, **load_kwargs)
    with staged_output(output_path) as staging:
        export_report = save(loaded.model, staging, output_format, vocab_file=loaded.vocab_path,
                             config=loaded.config)
        if not overwrite and os.path.isdir(output_path) and os.listdir(output_path):
            # Filled by someone else while this conversion ran: theirs is kept.
            raise ConversionError(f"output {output_path} was filled while converting; nothing was replaced "
                                  "(pass overwrite to replace it)")
    if not files.is_remote(output_path):
        export_report.target = export_report.target.replace(str(staging), str(output_path))
    return loaded.report, export_report
