"""What a pretraining run starts from, resolved before it starts: the model config, the
PretrainingConfig, the vocabulary and (continued pretraining) the initial weights.

Each value has one source, and a value given twice must agree (else one `ConfigError` line
names both values and the file):

  model sizes      --config and --override; with --init_checkpoint, the checkpoint's (a --config
                   given explicitly must have the same sizes: `CHECKPOINT_FIELDS`).
  objective, masking, dropout
                   --config (and --override) when given, else the checkpoint's config.
  vocabulary       --vocab_file, else the checkpoint's vocab.txt, else the shards' manifest.json
                   (`electra-build-data` writes it beside the shards): its vocab_size and special
                   ids always, and its vocab file for the export when that is still in place.
  max_seq_length   --max_seq_length, else the manifest's, else the paper's for the model size.

Shards without a manifest (the authors' `build_pretraining_dataset.py` writes none) are read as
before; with no vocabulary either, the special ids are ElectraConfig's, those of the BERT uncased
vocabulary, and the log says so: a learned vocabulary has ordinary words at 101/102/103.

Continued pretraining (`InitialWeights`, `load_initial_weights`): --init_checkpoint is one of
  - a TF1 checkpoint of the authors' `run_pretraining.py` or a released archive (generator and
    discriminator, when it holds both);
  - a Hugging Face pretrainer folder (discriminator/ + generator/), or a discriminator folder,
    with --init_generator naming the generator's folder (the hub's `-discriminator` /
    `-generator` pair);
  - an electra_tf folder: a pretraining run's model_dir (both networks, from its newest
    checkpoint) or a folder `save_electra_checkpoint` wrote;
  - a released model's name, resolved to its folder in the download cache (`convert/names.py`):
    `--init_checkpoint=google/electra-small-discriminator
    --init_generator=google/electra-small-generator` continues the paper's Small pair; the run
    record keeps the name and the exact Hub commit.
Only the weights are taken: the optimizer starts at step 0 with its own warmup (the authors' Adam
slots and global_step are ignored). With only a discriminator, the generator starts from the
run's random initialisation, sharing the loaded embeddings (embedding_sharing="embeddings"),
and the log says so.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

from absl import logging

from electra_tf.config import SPECIAL_ID_FIELDS, ConfigError, ElectraConfig
from electra_tf.convert import hf
from electra_tf.convert.names import resolve, resolve_checkpoint
from electra_tf.convert.pretrained import (
    detect_format, holds_generator, load_pretrained, saved_network)
from electra_tf.data import pipeline
from electra_tf.data.manifest import ShardManifest, manifest_for_shards
from electra_tf.data.tokenizer import file_sha256
from electra_tf.run_folder import is_run_folder
from electra_tf.training.config import PretrainingConfig

# ElectraConfig fields a checkpoint's tensors fix (the authors' heads = hidden // 64 included).
CHECKPOINT_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size")


def _short_hash(digest: str | None) -> str:
    return f"sha256 {digest[:12]}..." if digest else "sha256 unknown"


# --- continued pretraining: the initial weights ---------------------------------------------------
@dataclasses.dataclass
class InitialWeights:
    """Weights to start a run from (see the module docstring).

    Attributes:
      path: --init_checkpoint's local path (a released model's name resolves to its folder in
        the download cache).
      format: "tf1", "hf", "electra_tf" or "keras_hub".
      source: the loaded model: an ElectraPretrainer, or a Discriminator when the checkpoint
        holds no generator.
      config: the checkpoint's (discriminator's) ElectraConfig.
      vocab_file: the checkpoint's vocab.txt, or None.
      released: for a name, what it resolved to (`names.Resolved.describe`: the name, source and
        exact revision), else None.
    """

    path: str
    format: str
    source: object
    config: ElectraConfig
    vocab_file: str | None
    released: dict | None = None

    @property
    def has_generator(self) -> bool:
        return getattr(self.source, "generator", None) is not None

    def describe(self) -> dict:
        """For the run record."""
        described = {"path": self.path, "format": self.format,
                     "networks": "generator and discriminator" if self.has_generator
                     else "discriminator"}
        if self.released:
            described["released"] = self.released
        return described

    def copy_into(self, model) -> None:
        """Assigns the loaded weights to `model` (an ElectraPretrainer built with the run's
        config; under the strategy's scope, assigning from the host is fine) and logs what was
        left at its initialisation. Variables are matched by path ("discriminator/encoder/..."):
        both models are built from configs with the same sizes, so every loaded variable has its
        place; one that has none is an error (nothing is dropped silently, nothing is assigned
        then)."""
        loaded = {v.path: v for v in self.source.trainable_variables}
        pairs, left = [], []
        for variable in model.trainable_variables:
            source = loaded.get(variable.path)
            if source is None:
                left.append(variable.path)
            elif tuple(source.shape) != tuple(variable.shape):
                raise ConfigError(f"--init_checkpoint {self.path}: {variable.path} has shape "
                                  f"{list(source.shape)} in the checkpoint but "
                                  f"{list(variable.shape)} in the run's model")
            else:
                pairs.append((variable, source))
        used = {variable.path for variable, _ in pairs}
        unused = sorted(set(loaded) - used)
        if unused:
            raise ConfigError(
                f"--init_checkpoint {self.path}: {len(unused)} loaded weights have no place in "
                f"the run's model (objective={model.config.objective}?): {', '.join(unused[:3])}")
        for variable, source in pairs:
            variable.assign(source.value)
        logging.info("Initialised %d weights from %s (%s); the optimizer starts at step 0",
                     len(used), self.path, self.format)
        generator_left = [p for p in left if p.startswith("generator/")]
        if generator_left:
            gen = model.config.generator_config()
            shared = "shares the loaded embeddings" if any(
                p.startswith("discriminator/embeddings/")
                for p in (v.path for v in model.generator.trainable_variables)) \
                else "has its own embeddings (embedding_sharing=untied), also random"
            logging.warning(
                "%s holds no generator: the generator (hidden %d, %d layers: "
                "generator_hidden_size=%g) starts from random weights (%d tensors, seed %d) and "
                "%s", self.path, gen.hidden_size, gen.num_layers,
                model.config.generator_hidden_size, len(generator_left), model.seed, shared)
        other = [p for p in left if not p.startswith("generator/")]
        if other:
            logging.warning("%s lacks %d discriminator weights, left at their random "
                            "initialisation: %s", self.path, len(other), ", ".join(other[:4]))
        self.source = None  # the copy is done: free the loaded model's memory


def load_initial_weights(path, generator_path=None) -> InitialWeights:
    """Loads --init_checkpoint (and --init_generator); see the module docstring.

    Raises ConversionError / ConfigError naming the folder or file when it holds nothing to start
    from (a generator alone, a damaged file, weights that do not fit).
    """
    given = resolve(str(path))  # a released model's name -> its local folder (names.py)
    path = given.path
    if generator_path:
        generator_path = resolve_checkpoint(str(generator_path))
    folder = Path(path)
    if generator_path and is_run_folder(folder):
        raise ConfigError(f"--init_generator: {path} is a pretraining run folder, which holds "
                          "its generator already")
    fmt = detect_format(path)
    if generator_path:
        if fmt != "hf" or detect_format(generator_path) != "hf":
            raise ConfigError(f"--init_generator={generator_path}: only for a Hugging Face pair "
                              f"(a discriminator folder as --init_checkpoint, its generator here)")
        with tempfile.TemporaryDirectory(prefix="electra_pair_") as pair:
            # The HF loader reads a pretrainer as <folder>/discriminator + <folder>/generator,
            # checking that the shared embeddings agree: give it the pair in that layout.
            os.symlink(os.path.abspath(path), os.path.join(pair, "discriminator"))
            os.symlink(os.path.abspath(generator_path), os.path.join(pair, "generator"))
            loaded = load_pretrained(pair, "pretrainer")
        logging.info("--init_checkpoint: %s", loaded.report.summary())
        vocab = loaded.vocab_path and os.path.join(path, os.path.basename(loaded.vocab_path))
        return InitialWeights(str(path), "hf", loaded.model, loaded.config, vocab, given.describe())
    if fmt == "hf" and hf.is_generator_folder(folder):
        raise ConfigError(f"--init_checkpoint={path} holds a generator; give the discriminator's "
                          "folder as --init_checkpoint and this one as --init_generator")
    network = "pretrainer" if holds_generator(path, fmt) else "discriminator"
    if is_run_folder(folder):
        network = "pretrainer"  # both networks as the run built them (an mlm run has no generator)
    elif fmt == "electra_tf":
        network = saved_network(folder)
        if network == "generator":
            raise ConfigError(f"--init_checkpoint={path} holds a generator alone; give a "
                              "discriminator or a pretrainer")
    loaded = load_pretrained(path, network)
    logging.info("--init_checkpoint: %s", loaded.report.summary())
    return InitialWeights(str(path), fmt, loaded.model, loaded.config, loaded.vocab_path,
                          given.describe())


# --- resolving the run --------------------------------------------------------------------------
class RunSetup(NamedTuple):
    """What `run_pretraining` needs, resolved from flags, manifest and checkpoint."""

    model_config: ElectraConfig
    config: PretrainingConfig
    vocab_file: str | None  # copied next to the exported discriminator
    init: InitialWeights | None
    record: dict  # data and vocabulary facts for the run record (pretraining_config.json)


def _checkpoint_facts(config: ElectraConfig, with_generator: bool) -> dict:
    """The sizes a checkpoint fixes, by field name (the generator's as derived from them)."""
    facts = {name: getattr(config, name) for name in CHECKPOINT_FIELDS}
    if with_generator:
        gen = config.generator_config()
        facts.update({"embedding_sharing": config.embedding_sharing,
                      "generator_hidden_size": gen.hidden_size,
                      "generator_layers": gen.num_layers})
    return facts


def _check_against_checkpoint(model_config: ElectraConfig, init: InitialWeights) -> None:
    wanted = _checkpoint_facts(model_config, init.has_generator)
    found = _checkpoint_facts(init.config, init.has_generator)
    for name, value in found.items():
        if wanted[name] != value:
            unit = " (the generator's size it gives)" if name.startswith("generator_") else ""
            raise ConfigError(
                f"{name}: the model config asks for {wanted[name]!r}{unit} but --init_checkpoint "
                f"{init.path} has {value!r}; leave --config out (the checkpoint's is used) or "
                "give one that matches it")


def _vocab_ids(vocab_file) -> dict:
    return {name: value for name, value in ElectraConfig().with_vocab(vocab_file).to_dict().items()
            if name in ("vocab_size", *SPECIAL_ID_FIELDS)}


def _manifest_ids(manifest: ShardManifest) -> dict:
    return {"vocab_size": manifest.values["vocab_size"],
            **{n: manifest.values["special_ids"][n] for n in SPECIAL_ID_FIELDS}}


def _base_model_config(config_name, config_given: bool, init) -> ElectraConfig:
    """--config, or the checkpoint's config (its sizes and vocabulary always win)."""
    if init is None:
        return ElectraConfig.from_json(config_name)
    if config_given:
        ids = {n: getattr(init.config, n) for n in ("vocab_size", *SPECIAL_ID_FIELDS)}
        return ElectraConfig.from_json(config_name).replace(**ids)
    if init.format == "tf1":
        # A TF1 checkpoint records sizes only: the rest is ElectraConfig's, the paper's
        # objective settings (Large was trained with mask_prob 0.25: --override it).
        logging.info("model config: the sizes of %s, the paper's objective settings (mask_prob "
                     "%.2f, dropout %.1f); --config or --override to change them", init.path,
                     init.config.mask_prob, init.config.hidden_dropout)
    return init.config


def _with_vocabulary(model_config, vocab_file, init, manifest):
    """(model config with the vocabulary's size and special ids, vocab file for the export or
    None, the vocabulary's sha256 or None); see the module docstring for who wins."""
    source = None
    if vocab_file:
        source = "--vocab_file"
    elif init is not None and init.vocab_file:
        vocab_file, source = init.vocab_file, f"the checkpoint's {init.vocab_file}"
    digest = file_sha256(vocab_file) if vocab_file else None
    if vocab_file:
        ids = _vocab_ids(vocab_file)
        if init is not None and ids["vocab_size"] != init.config.vocab_size:
            raise ConfigError(f"vocab_size: {vocab_file} has {ids['vocab_size']} tokens but "
                              f"--init_checkpoint {init.path} has {init.config.vocab_size} "
                              "word embeddings")
        model_config = model_config.replace(**ids)
    if manifest:
        built_with = manifest.values["vocab_sha256"]
        if digest and digest != built_with:
            raise ConfigError(
                f"vocabulary: {source} ({vocab_file}, {_short_hash(digest)}) is not the one the "
                f"shards were built with ({_short_hash(built_with)}, {manifest.path})")
        if not vocab_file:
            ids = _manifest_ids(manifest)
            if init is not None and init.config.vocab_size != ids["vocab_size"]:
                raise ConfigError(
                    f"vocab_size: the shards were built with {ids['vocab_size']} tokens "
                    f"({manifest.path}) but --init_checkpoint {init.path} has "
                    f"{init.config.vocab_size} word embeddings")
            model_config = model_config.replace(**ids)
            digest, source = built_with, manifest.path
            kept = manifest.vocab_file
            if kept and os.path.exists(kept) and file_sha256(kept) == built_with:
                vocab_file = kept  # still in place: copied next to the exported discriminator
    if source is None:
        logging.warning(
            "no manifest.json beside the shards and no --vocab_file: assuming the BERT uncased "
            "vocabulary's special ids ([PAD]=%d [CLS]=%d [SEP]=%d [MASK]=%d, vocab_size %d). "
            "Shards built with another vocabulary need --vocab_file, or [CLS]/[SEP] get masked "
            "as words", model_config.pad_token_id, model_config.cls_token_id,
            model_config.sep_token_id, model_config.mask_token_id, model_config.vocab_size)
    else:
        logging.info("vocabulary from %s: vocab_size %d, [CLS]=%d [SEP]=%d [MASK]=%d [PAD]=%d",
                     source, model_config.vocab_size, model_config.cls_token_id,
                     model_config.sep_token_id, model_config.mask_token_id,
                     model_config.pad_token_id)
    return model_config, vocab_file, digest


def resolve_run(data_pattern, *, config_name="electra_small", config_given=True,
                overrides=(), run_values=None, vocab_file=None, init_checkpoint=None,
                init_generator=None) -> RunSetup:
    """The run's configs, vocabulary and initial weights from the command line's values.

    Args:
      data_pattern: --data (globs of shards or build folders, `pipeline.list_shards`; a
        manifest.json beside them is read).
      config_name: --config. config_given: whether it was given explicitly (with
        --init_checkpoint, an implicit one yields to the checkpoint's config).
      overrides: --override key=value strings for the model config.
      run_values: PretrainingConfig fields given on the command line (others: paper defaults
        for the model size, and max_seq_length from the manifest).
      vocab_file, init_checkpoint, init_generator: the flags.

    Raises ConfigError (or another ValueError / FileNotFoundError) whose one line names the
    contradicting values and the file.
    """
    run_values = dict(run_values or {})
    manifest = manifest_for_shards(pipeline.list_shards(data_pattern))
    if manifest and manifest.folders_without:
        logging.warning("no manifest.json in %s: trusting %s for those shards too",
                        ", ".join(manifest.folders_without), manifest.path)
    init = load_initial_weights(init_checkpoint, init_generator) if init_checkpoint else None

    model_config = _base_model_config(config_name, config_given, init)
    model_config, vocab_file, vocab_sha256 = _with_vocabulary(model_config, vocab_file, init,
                                                              manifest)
    model_config = model_config.with_overrides(list(overrides))
    if init is not None:
        _check_against_checkpoint(model_config, init)
    if manifest:
        for name, value in _manifest_ids(manifest).items():
            if getattr(model_config, name) != value:
                raise ConfigError(f"{name}: the model config has {getattr(model_config, name)} "
                                  f"but the shards were built with {name}={value} "
                                  f"({manifest.path})")

    # PretrainingConfig: the flags, else the manifest's length, else the paper's for the size.
    if manifest:
        length = manifest.values["max_seq_length"]
        given = run_values.get("max_seq_length")
        if given is not None and given != length:
            raise ConfigError(f"max_seq_length: --max_seq_length={given} but the shards were "
                              f"built with max_seq_length={length} ({manifest.path})")
        run_values["max_seq_length"] = length
    config = PretrainingConfig.for_model_size(model_config, **run_values)

    record = {
        "data_manifest": manifest.path if manifest else None,
        # Casing is the shards' (the builder's --lower_case); None: unknown (no manifest).
        "lower_case": manifest.values["lower_case"] if manifest else None,
        "vocab_sha256": vocab_sha256,
        "init_checkpoint": init.describe() if init else None,
    }
    if init_generator:
        record["init_checkpoint"]["generator"] = str(init_generator)
    return RunSetup(model_config, config, vocab_file, init, record)
