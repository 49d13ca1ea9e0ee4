"""Hugging Face ELECTRA checkpoints (`model.safetensors` / `pytorch_model.bin` + `config.json`)
<-> our Keras models.

Hugging Face stores the released tensors under other names (transformers'
`models/electra/modeling_electra.py`): `electra.encoder.layer.3.attention.self.query.weight` for
`electra/encoder/layer_3/attention/self/query/kernel`, `discriminator_predictions.dense_prediction`
for `discriminator_predictions/dense_1`, `generator_lm_head.bias` for
`generator_predictions/output_bias`, and torch `Linear` weights as [out, in] (transposed).
`ElectraForPreTraining` is a discriminator, `ElectraForMaskedLM` a generator (whose own
`electra.embeddings` are the shared table) and `ElectraModel` a bare encoder (no `electra.`
prefix). A pretrainer is a folder with `discriminator/` and `generator/` sub-folders.

`model.safetensors` is read with `safetensors.numpy` (no torch); `pytorch_model.bin` needs torch.

Example:
>>> disc, config, report, vocab = load_hf_model("electra-small-discriminator")
>>> export_hf(disc, "/tmp/electra-small-again", vocab_file=vocab)
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from electra_tf.config import ElectraConfig
from electra_tf.convert.common import (
    ConversionError, ConversionReport, Slot, assign, check_vocab_size, damaged, network_of,
    model_slots, plan_load, read_json, vocab_overrides)
from electra_tf import files
from electra_tf.files import give_normal_mode

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
ARCHITECTURES = {"discriminator": "ElectraForPreTraining", "generator": "ElectraForMaskedLM",
                 "encoder": "ElectraModel"}
_ACT_FROM_HF = {"gelu": "gelu", "gelu_new": "gelu_approximate",
                "gelu_pytorch_tanh": "gelu_approximate", "relu": "relu"}
_ACT_TO_HF = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}


# --- names ---------------------------------------------------------------------------------------
def hf_name(tf1_name: str, prefix: str = "electra.") -> str:
    """The Hugging Face state-dict key of a TF1 variable name (`prefix` "" for ElectraModel)."""
    parts = tf1_name.split("/")
    head = ""
    if parts[0] in ("electra", "generator"):  # both networks are `electra.` in their HF model
        head, parts = prefix, parts[1:]
    elif parts == ["generator_predictions", "output_bias"]:
        return "generator_lm_head.bias"
    elif parts[0] == "discriminator_predictions" and parts[1] == "dense_1":
        parts[1] = "dense_prediction"
    out = []
    for part in parts:
        m = re.fullmatch(r"layer_(\d+)", part)
        out += ["layer", m.group(1)] if m else [part]
    if out[-1] in ("kernel", "gamma"):
        out[-1] = "weight"
    elif out[-1] == "beta":
        out[-1] = "bias"
    elif out[-1].endswith("_embeddings"):
        out.append("weight")
    return head + ".".join(out)


def _hf_shape(slot: Slot) -> tuple:
    return slot.shape[::-1] if slot.is_kernel else slot.shape


def _from_hf(slot: Slot, array: np.ndarray) -> np.ndarray:
    return array.T if slot.is_kernel else array


# --- config --------------------------------------------------------------------------------------
# config.json fields we read -> their kind; a value of another JSON type is refused naming the
# field (transformers would fail later, deep in the model's constructor).
_HF_INTEGERS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size", "pad_token_id")
_HF_NUMBERS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps")
_HF_STRINGS = ("model_type", "hidden_act", "position_embedding_type")


def read_hf_config(folder) -> dict:
    """config.json of a Hugging Face folder, each field we read checked to be of its JSON type."""
    path = Path(folder) / "config.json"
    if not path.exists():
        raise ConversionError(f"no Hugging Face config.json in {folder}")
    hf = read_json(path)
    for key, value in hf.items():
        if value is None and key == "pad_token_id":
            continue
        if key in _HF_INTEGERS and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConversionError(f"{path}: field {key!r} must be an integer, got {value!r}")
        if key in _HF_NUMBERS and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConversionError(f"{path}: field {key!r} must be a number, got {value!r}")
        if key in _HF_STRINGS and not isinstance(value, str):
            raise ConversionError(f"{path}: field {key!r} must be a string, got {value!r}")
    architectures = hf.get("architectures", [])
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ConversionError(f"{path}: field 'architectures' must be a list of class names, got {architectures!r}")
    if hf.get("model_type", "electra") != "electra":
        raise ConversionError(f"{path}: model_type is {hf.get('model_type')!r}, not 'electra'")
    return hf


def check_sizes(hf: dict, state: dict, source) -> None:
    """Raises a one-line ConversionError naming `source` (the config.json) and the field whose
    size (given, or Hugging Face's default when absent) the weights in `state` contradict:
    without it, a config.json missing its sizes gives ELECTRA-Small's and a list of every tensor."""
    d = ElectraConfig()
    p = _prefix(state)
    layers = {int(m.group(1)) for k in state if (m := re.match(re.escape(p) + r"encoder\.layer\.(\d+)\.", k))}
    checks = (  # field, its default, tensor, dimension (torch Linear weights are [out, in])
        ("vocab_size", 30522, f"{p}embeddings.word_embeddings.weight", 0),
        ("embedding_size", 128, f"{p}embeddings.word_embeddings.weight", 1),
        ("max_position_embeddings", d.max_position_embeddings, f"{p}embeddings.position_embeddings.weight", 0),
        ("type_vocab_size", d.type_vocab_size, f"{p}embeddings.token_type_embeddings.weight", 0),
        ("hidden_size", d.hidden_size, f"{p}encoder.layer.0.attention.self.query.weight", 0),
        ("intermediate_size", d.intermediate_size, f"{p}encoder.layer.0.intermediate.dense.weight", 0),
    )
    found = [(f, default, name, int(np.shape(state[name])[dim])) for f, default, name, dim in checks
             if name in state and len(np.shape(state[name])) > dim]
    if layers:
        found.append(("num_hidden_layers", d.num_layers, f"{p}encoder.layer.N.*", max(layers) + 1))
    for field, default, name, actual in found:
        value = hf.get(field, default)
        if value != actual:
            given = "" if field in hf else " (absent: Hugging Face's default)"
            kind = "vocabulary size mismatch: " if field == "vocab_size" else ""
            raise ConversionError(f"{kind}{source}: {field} is {value}{given} but the weights have {actual} "
                                  f"({name}); fix config.json or give --config")


def is_generator_folder(folder) -> bool:
    """A Hugging Face folder holding a generator alone (`ElectraForMaskedLM`, as the released
    `google/electra-*-generator`), not a discriminator or a discriminator/ + generator/ pair."""
    folder = Path(folder)
    if (folder / "discriminator").is_dir() or not (folder / "config.json").is_file():
        return False
    return "ElectraForMaskedLM" in read_hf_config(folder).get("architectures", [])


def config_from_hf(hf: dict, vocab_file=None, base: ElectraConfig | None = None,
                   source: str = "config.json") -> ElectraConfig:
    """Our `ElectraConfig` for the network a Hugging Face `config.json` (at `source`) describes.

    Missing keys take Hugging Face's `ElectraConfig` defaults (which are ELECTRA-Small's).
    """
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError(f"{source}: position_embedding_type "
                              f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
    act = hf.get("hidden_act", "gelu")
    if act not in _ACT_FROM_HF:
        raise ConversionError(f"{source}: hidden_act {act!r} is not supported "
                              f"(one of {sorted(_ACT_FROM_HF)})")
    d = ElectraConfig()
    values = {
        "vocab_size": hf.get("vocab_size", 30522),
        "embedding_size": hf.get("embedding_size", 128),
        "hidden_size": hf.get("hidden_size", d.hidden_size),
        "num_layers": hf.get("num_hidden_layers", d.num_layers),
        "num_heads": hf.get("num_attention_heads", d.num_heads),
        "intermediate_size": hf.get("intermediate_size", d.intermediate_size),
        "hidden_act": _ACT_FROM_HF[act],
        "hidden_dropout": hf.get("hidden_dropout_prob", d.hidden_dropout),
        "attention_dropout": hf.get("attention_probs_dropout_prob", d.attention_dropout),
        "max_position_embeddings": hf.get("max_position_embeddings", d.max_position_embeddings),
        "type_vocab_size": hf.get("type_vocab_size", d.type_vocab_size),
        "initializer_range": hf.get("initializer_range", d.initializer_range),
        "layer_norm_epsilon": hf.get("layer_norm_eps", d.layer_norm_epsilon),
    }
    if hf.get("pad_token_id") is not None:
        values["pad_token_id"] = hf["pad_token_id"]
    values.update(vocab_overrides(vocab_file, values["vocab_size"], where=f"{source}'s vocab_size"))
    base = base or d
    return ElectraConfig.from_dict({**base.to_dict(), **values}, source=source)


def config_to_hf(config: ElectraConfig, architecture: str) -> dict:
    """A Hugging Face `config.json` for a network built with `config`."""
    return {
        "architectures": [architecture],
        "model_type": "electra",
        "vocab_size": config.vocab_size,
        "embedding_size": config.embedding_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": _ACT_TO_HF[config.hidden_act],
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_epsilon,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "summary_type": "first",
        "summary_use_proj": True,
        "summary_activation": "gelu",
        "summary_last_dropout": 0.1,
    }


# --- weights -------------------------------------------------------------------------------------
def _read_torch(path) -> dict[str, np.ndarray]:
    try:
        import torch
    except ImportError:
        raise ConversionError(
            f"{path} is a PyTorch pickle and reading it needs torch, which is not installed "
            "(pip install 'electra_tf[torch]'), or provide model.safetensors instead") from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # a cut zip or pickle: RuntimeError, EOFError, UnpicklingError, ...
        raise damaged(path, f"torch.load: {type(e).__name__}: {e}") from None
    return {k: (v.detach().float() if v.is_floating_point() else v.detach()).numpy()
            for k, v in state.items()}


def weights_file(folder) -> Path:
    folder = Path(folder)
    for name in WEIGHT_FILES:
        if (folder / name).exists():
            return folder / name
    raise ConversionError(f"no Hugging Face weights in {folder}: looked for {', '.join(WEIGHT_FILES)}")


def load_state_dict(path) -> dict[str, np.ndarray]:
    """Name -> array from a HF folder, a `.safetensors`, a `.bin` or a sharded `*.index.json`."""
    path = Path(path)
    if path.is_dir():
        path = weights_file(path)
    if path.name.endswith(".index.json"):
        weight_map = read_json(path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise damaged(path, "no 'weight_map' object")
        state = {}
        for shard in sorted(set(weight_map.values())):
            if not (path.parent / shard).exists():
                raise ConversionError(f"{path.parent / shard}: missing (listed in {path})")
            state.update(load_state_dict(path.parent / shard))
        return state
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.numpy import load_file
        try:
            return load_file(str(path))
        except SafetensorError as e:
            raise damaged(path, f"safetensors: {e}") from None
    if path.suffix in (".bin", ".pt", ".pth"):
        return _read_torch(path)
    raise ConversionError(f"{path}: not a .safetensors or pytorch .bin file")


def _prefix(state) -> str:
    return "electra." if any(k.startswith("electra.") for k in state) else ""


def load_hf(model, state: dict, *, allow_unknown: bool = False, allow_missing: bool = False,
            source: str = "hf") -> ConversionReport:
    """Copies a HF state dict into a Discriminator or Generator (all checked first)."""
    network = network_of(model)
    if network == "pretrainer":
        raise ConversionError("a Hugging Face file holds one network: load the discriminator and the "
                              "generator separately (load_hf_model(network='pretrainer') does both)")
    prefix = _prefix(state)
    slots = model_slots(model, ("generator", "electra") if network == "generator" else None)
    word = f"{prefix}embeddings.word_embeddings.weight"

    def name_of(slot):
        return hf_name(slot.name, prefix)

    def classify(name):
        if name.endswith("embeddings.position_ids"):
            return "position_ids buffer"
        if name == "generator_lm_head.weight":
            if word in state and not np.array_equal(state[name], state[word]):
                raise ConversionError(f"{source}: generator_lm_head.weight differs from {word}; our "
                                      "generator ties its output layer to the word embeddings")
            return "tied to the word embeddings"
        if (name.startswith("discriminator_predictions.") and network == "discriminator"
                and model.rtd_head is None):
            return "replaced-token-detection head (the model has none)"
        return None

    if not state:
        raise ConversionError(f"{source}: the weights file holds no tensors")
    shapes = {k: tuple(np.shape(v)) for k, v in state.items()}
    report = plan_load(slots, shapes, name_of=name_of, shape_of=_hf_shape, classify=classify,
                       allow_missing=allow_missing, allow_unknown=allow_unknown, source=source,
                       target=f"{network} ({model.name})")
    assign(slots, state, name_of=name_of, to_tf1_layout=_from_hf)
    return report


def _vocab_in(folder):
    vocab = Path(folder) / "vocab.txt"
    return str(vocab) if vocab.exists() else None


def _resolve_config(config):
    if config is None or isinstance(config, ElectraConfig):
        return config
    return ElectraConfig.from_json(config)


def load_hf_model(path, network: str = "discriminator", config=None, **load_kwargs):
    """Builds our model of `network` for a Hugging Face folder and loads it.

    Args:
      path: a folder with config.json and weights (for network="pretrainer": a folder with
        `discriminator/` and `generator/` HF folders).
      network: "discriminator", "generator" or "pretrainer".
      config: optional pretraining `ElectraConfig` (name or path); by default it comes from
        config.json. For network="generator" a given config is the pretraining config and the
        generator is built with `config.generator_config()`.

    Returns (model, model_config, report, vocab_file); `model_config` is the config the model was
    built with (for a generator, its own).
    """
    from electra_tf.models import Discriminator, Generator

    folder = Path(path)
    config = _resolve_config(config)
    if (network in ("discriminator", "generator") and not (folder / "config.json").exists()
            and (folder / network / "config.json").exists()):
        folder = folder / network  # a pretrainer's pair of folders: take the network asked for
    if network == "pretrainer":
        return _load_hf_pretrainer(folder, config, **load_kwargs)
    if network not in ("discriminator", "generator"):
        raise ValueError(f"network must be 'discriminator', 'generator' or 'pretrainer', got {network!r}")
    vocab_file = _vocab_in(folder)
    state = load_state_dict(folder)
    prefix = _prefix(state)
    word = f"{prefix}embeddings.word_embeddings.weight"
    if config is None:
        hf_config = read_hf_config(folder)
        check_sizes(hf_config, state, folder / "config.json")
        config = config_from_hf(hf_config, vocab_file, source=str(folder / "config.json"))
        if network == "generator":
            config = config.replace(generator_hidden_size=1.0, generator_layers=1.0)
    elif network == "generator":
        config = config.generator_config()
    if word in state:
        check_vocab_size(config, state[word].shape[0], f"{folder}: {word}")
    if network == "discriminator":
        model = Discriminator(config, rtd_head="discriminator_predictions.dense.weight" in state)
    else:
        model = Generator(config)
    report = load_hf(model, state, source=f"hf:{folder}", **load_kwargs)
    return model, model.config, report, vocab_file


def _load_hf_pretrainer(folder: Path, config, **load_kwargs):
    from electra_tf.models import ElectraPretrainer

    disc_dir, gen_dir = folder / "discriminator", folder / "generator"
    for sub in (disc_dir, gen_dir):
        if not (sub / "config.json").exists():
            raise ConversionError(f"a Hugging Face pretrainer is a folder with discriminator/ and "
                                  f"generator/ HF folders; {sub / 'config.json'} not found")
    disc_state, gen_state = load_state_dict(disc_dir), load_state_dict(gen_dir)
    vocab_file = _vocab_in(disc_dir) or _vocab_in(folder)
    if config is None:
        disc_hf, gen_hf = read_hf_config(disc_dir), read_hf_config(gen_dir)
        check_sizes(disc_hf, disc_state, disc_dir / "config.json")
        check_sizes(gen_hf, gen_state, gen_dir / "config.json")
        config = config_from_hf(disc_hf, vocab_file, source=str(disc_dir / "config.json"))
        gen_hf = config_from_hf(gen_hf, source=str(gen_dir / "config.json"))
        embeddings = [k for k in disc_state if k.startswith("electra.embeddings.")
                      and not k.endswith("position_ids")]
        shared = all(k in gen_state and np.array_equal(disc_state[k], gen_state[k])
                     for k in embeddings)
        config = config.replace(
            generator_hidden_size=gen_hf.hidden_size / config.hidden_size,
            generator_layers=gen_hf.num_layers / config.num_layers,
            embedding_sharing="embeddings" if shared else "untied")
        derived = config.generator_config()
        for field in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                      "embedding_size"):
            if getattr(derived, field) != getattr(gen_hf, field):
                raise ConversionError(
                    f"{gen_dir}/config.json: generator {field}={getattr(gen_hf, field)} but "
                    f"ElectraPretrainer derives {getattr(derived, field)} from the discriminator's "
                    "config (ElectraConfig.generator_config); load the generator alone instead")
    model = ElectraPretrainer(config)
    disc_report = load_hf(model.discriminator, disc_state, source=f"hf:{disc_dir}", **load_kwargs)
    # Weights the generator shares with the discriminator must agree in both files.
    disc_vars = {id(s.variable) for s in model_slots(model.discriminator)}
    for slot in model_slots(model.generator, ("generator", "electra")):
        name = hf_name(slot.name)
        if id(slot.variable) in disc_vars and name in gen_state:
            mine = np.asarray(slot.variable.numpy()).reshape(slot.shape)
            if not np.array_equal(_from_hf(slot, gen_state[name]).reshape(slot.shape), mine):
                raise ConversionError(f"{gen_dir}: {name} differs from the discriminator's but the "
                                      f"config shares it (embedding_sharing="
                                      f"{config.embedding_sharing!r})")
    gen_report = load_hf(model.generator, gen_state, source=f"hf:{gen_dir}", **load_kwargs)
    report = ConversionReport(
        mapped=disc_report.mapped + gen_report.mapped,
        ignored=disc_report.ignored + gen_report.ignored,
        missing=disc_report.missing + gen_report.missing,
        unknown=disc_report.unknown + gen_report.unknown,
        source=f"hf:{folder}", target=f"pretrainer ({model.name})")
    return model, model.config, report, vocab_file


# --- writing -------------------------------------------------------------------------------------
def hf_tensors(model) -> tuple[dict[str, np.ndarray], str, list]:
    """(state dict, architecture, [(our path, HF name, HF shape)]) of a Discriminator or Generator
    in Hugging Face's layout."""
    network = network_of(model)
    if network == "discriminator":
        architecture = ARCHITECTURES["discriminator" if model.rtd_head is not None else "encoder"]
    elif network == "generator":
        architecture = ARCHITECTURES["generator"]
    else:
        raise ConversionError("hf_tensors takes one network; export_hf splits a pretrainer")
    prefix = "" if architecture == "ElectraModel" else "electra."
    slots = model_slots(model, ("generator", "electra") if network == "generator" else None)
    tensors, mapped = {}, []
    for slot in slots:
        value = slot.value()
        name = hf_name(slot.name, prefix)
        tensors[name] = np.ascontiguousarray(value.T if slot.is_kernel else value).astype(np.float32)
        mapped.append((slot.variable.path, name, _hf_shape(slot)))
    return tensors, architecture, mapped


def tokenizer_config(lower_case: bool, config: ElectraConfig) -> dict:
    """`tokenizer_config.json` for `ElectraTokenizer` / `ElectraTokenizerFast` over vocab.txt.

    `strip_accents` null: transformers then strips accents exactly when it lower-cases, as our
    tokenizer does (`data/tokenizer.py`)."""
    return {"tokenizer_class": "ElectraTokenizer", "do_lower_case": bool(lower_case),
            "strip_accents": None, "tokenize_chinese_chars": True,
            "model_max_length": config.max_position_embeddings,
            "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]"}


def export_hf(model, output_dir, *, vocab_file=None, lower_case: bool | None = None) -> ConversionReport:
    """Writes `model.safetensors` + `config.json` (+ vocab.txt and tokenizer_config.json) for
    Hugging Face.

    A pretrainer is written as `output_dir/discriminator` and `output_dir/generator`.
    `lower_case` goes to tokenizer_config.json's `do_lower_case`; None takes the casing recorded
    beside `vocab_file` (its checkpoint folder, `data.casing.checkpoint_lower_case`), else
    uncased as the released models.
    """
    from safetensors.numpy import save_file

    from electra_tf.data.casing import checkpoint_lower_case

    out = Path(output_dir)
    if lower_case is None and vocab_file is not None:
        lower_case, _ = checkpoint_lower_case(Path(vocab_file).parent)
    lower_case = True if lower_case is None else bool(lower_case)
    network = network_of(model)
    if network == "pretrainer" and model.config.objective == "electric":
        raise ConversionError("Hugging Face has no model for Electric's two-tower generator: "
                              "export network='discriminator' (or write TF1 / electra_tf)")
    report = ConversionReport(source=f"{network} ({model.name})", target=f"hf:{out}")
    parts = ([("discriminator", model.discriminator, out / "discriminator"),
              ("generator", model.generator, out / "generator")] if network == "pretrainer"
             else [(network, model, out)])
    for _, network, folder in parts:
        if network is None:
            continue
        tensors, architecture, mapped = hf_tensors(network)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        give_normal_mode(folder / "model.safetensors")  # save_file leaves 0600
        files.write_json(folder / "config.json", config_to_hf(network.config, architecture))
        if vocab_file is not None and Path(vocab_file).resolve() != (folder / "vocab.txt").resolve():
            files.copy_file(vocab_file, folder / "vocab.txt")
        if vocab_file is not None:
            files.write_json(folder / "tokenizer_config.json", tokenizer_config(lower_case, network.config))
        where = "" if folder == out else f"{folder.name}/"
        report.mapped += [(src, where + dst, shape) for src, dst, shape in mapped]
    return report


__all__ = ["config_from_hf", "config_to_hf", "export_hf", "hf_name", "hf_tensors", "load_hf",
           "load_hf_model", "load_state_dict", "read_hf_config", "tokenizer_config"]
