"""keras-hub ELECTRA backbone presets <-> our models (needs the `keras_hub` extra).

    from electra_tf.convert.pretrained import to_keras_hub_preset
    to_keras_hub_preset("runs/demo/pretrain/discriminator", "/tmp/electra_preset")  # or a model
    backbone = keras_hub.models.Backbone.from_preset("/tmp/electra_preset")     # in keras-hub
    tokenizer = keras_hub.models.ElectraTokenizer.from_preset("/tmp/electra_preset")
    disc, config, vocab = from_keras_hub_preset("/tmp/electra_preset")           # and back

A preset is a folder: `config.json` (the `ElectraBackbone` constructor arguments),
`model.weights.h5`, `metadata.json`, `tokenizer.json` + `assets/tokenizer/vocabulary.txt` (our
vocab.txt, one token a line, with our casing), and `electra_tf_preset.json`, ours, which keras-hub
ignores: the full `ElectraConfig` (special ids, objective, both dropouts) and what the writer did.

Every weight of the encoder maps one to one (the attention kernels have Keras' MultiHeadAttention
layout on both sides). What does not match, and how it is handled:

1. GELU. keras-hub's `ElectraBackbone` hard-codes the tanh approximation
   (`keras_hub.src.utils.keras_utils.gelu_approximate`); ELECTRA, as released and as trained here,
   uses the exact erf GELU (the authors' `model/modeling.py`). The same weights therefore give
   slightly different hidden states, and the difference comes from the activation alone: with
   either side switched to the other's GELU the outputs agree to float32 round-off (at most
   3.4e-6, here and in tests/convert/test_convert_keras_hub.py). Measured max |difference| of
   the final hidden states (LayerNorm outputs, |h| up to ~4.5) on real token ids (8 IMDB
   reviews, 114-128 tokens, the demo's vocabulary):
     - tiny random-init encoder (configs/electra_tiny.json): 1.9e-6, round-off: a 0.02-stddev
       init keeps the FFN's inputs near 0, where the two GELUs agree;
     - ELECTRA-Small shape, random init (configs/electra_small.json): 1.1e-4 (mean 2.0e-5);
     - a discriminator pretrained by the demo (configs/electra_demo.json sizes, 8,000 steps):
       4.7e-4 (mean 3.2e-5).
   On that trained discriminator, its RTD head read on keras-hub's hidden states moves the logits
   by at most 4.8e-4 and flips none of the 1,010 token decisions: small, but not zero, and not
   the numbers ELECTRA's results were obtained with. Reading a preset back, our model uses the
   exact GELU by default (what the released weights and ours were trained with);
   `hidden_act="gelu_approximate"` reproduces keras-hub's outputs to round-off instead (for
   weights trained further in keras-hub).
2. Pooler. keras-hub adds `pooled_dense`, a dense + tanh on the [CLS] state. ELECTRA has no pooler
   and trains none (its fine-tuning heads read the [CLS] state directly), so there are no weights
   to write. The writer sets its kernel to the identity and its bias to zero, so
   `pooled_output = tanh(h_[CLS])`: deterministic and carrying the [CLS] state, where keras-hub's
   own ELECTRA presets leave a random initialisation. Reading back, the pooler is dropped
   (reported as ignored).
3. Heads. A keras-hub backbone is an encoder: the replaced-token-detection head
   (`discriminator_predictions/*`) is not written (reported as ignored), and a preset reads back as
   a `Discriminator` without it (`rtd_head=False`), as fine-tuning uses it.
4. What keras-hub's config cannot say. One `dropout` for embeddings, attention probabilities and
   both residual branches (ours: `hidden_dropout` and `attention_dropout`; `hidden_dropout` is
   written); LayerNorm epsilon fixed at 1e-12 (another epsilon, or `hidden_act="relu"`, cannot be
   written and is an error). Dropout draws differ (Keras' vs our 16-bit ones, `models/encoder.py`):
   training-time randomness only. Padding is masked with -10000 added to the scores here and by
   Keras' masked softmax there: the same probabilities in float32.
5. Tokenizer. `ElectraTokenizer` with our vocabulary, `lowercase` and `strip_accents` both set to
   our `lower_case`. It gives our ids on ordinary text, accents and CJK included, but its
   pre-tokenizer is not BERT's in two places: it splits words at control and format characters
   (U+0097 left over from cp1252 text, a zero-width space U+200B) where BERT deletes them, and,
   when lower-casing, it applies NFKC case folding ("…" -> "...", "ﬁ" -> "fi", "½" -> "1⁄2",
   "ß" -> "ss") where BERT lower-cases. On the first 2,000 IMDB reviews (24,666 sentences, the
   demo's vocabulary) 23 sentences tokenize differently uncased, 21 cased.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from electra_tf import files
from electra_tf.config import ElectraConfig
from electra_tf.convert.common import (
    ConversionError, ConversionReport, Pretrained, network_of, read_json, vocab_overrides)

MARKER = "electra_tf_preset.json"
BACKBONE_CLASS = "ElectraBackbone"
VOCAB_ASSET = "assets/tokenizer/vocabulary.txt"
# keras-hub's ElectraBackbone: LayerNorm epsilon and activation are fixed in its constructor.
KERAS_HUB_EPSILON = 1e-12
KERAS_HUB_ACT = "gelu_approximate"


def _keras_hub():
    try:
        import keras_hub
    except ImportError as e:
        raise ConversionError(f"keras-hub presets need the keras-hub package ({e}); "
                              "pip install 'electra_tf[keras_hub]'") from None
    return keras_hub


# --- config --------------------------------------------------------------------------------------
def backbone_kwargs(config: ElectraConfig) -> dict:
    """The `keras_hub.models.ElectraBackbone` arguments for an encoder built with `config`."""
    if config.hidden_act not in ("gelu", "gelu_approximate"):
        raise ConversionError(f"hidden_act={config.hidden_act!r}: keras-hub's ElectraBackbone has "
                              "only the (tanh-approximate) GELU")
    if config.layer_norm_epsilon != KERAS_HUB_EPSILON:
        raise ConversionError(f"layer_norm_epsilon={config.layer_norm_epsilon}: keras-hub's "
                              f"ElectraBackbone fixes it at {KERAS_HUB_EPSILON}")
    return {"vocab_size": config.vocab_size, "num_layers": config.num_layers,
            "num_heads": config.num_heads, "hidden_dim": config.hidden_size,
            "embedding_dim": config.embedding_size, "intermediate_dim": config.intermediate_size,
            "dropout": config.hidden_dropout, "max_sequence_length": config.max_position_embeddings,
            "num_segments": config.type_vocab_size}


def config_from_keras_hub(kwargs: dict, vocab_file=None, base: ElectraConfig | None = None,
                          hidden_act: str = "gelu", source: str = "keras-hub config.json") -> ElectraConfig:
    """Our `ElectraConfig` for `ElectraBackbone(**kwargs)` (the "config" of the preset's
    config.json at `source`); other fields from `base` (default ELECTRA-Small's), special ids
    from `vocab_file`."""
    if not isinstance(kwargs, dict):
        raise ConversionError(f"{source}: field 'config' must be a JSON object, got {type(kwargs).__name__}")
    for key in ("vocab_size", "num_layers", "num_heads", "hidden_dim", "embedding_dim", "intermediate_dim"):
        if key not in kwargs:
            raise ConversionError(f"{source}: field 'config.{key}' is missing")
        if isinstance(kwargs[key], bool) or not isinstance(kwargs[key], int):
            raise ConversionError(f"{source}: field 'config.{key}' must be an integer, got {kwargs[key]!r}")
    values = {"vocab_size": kwargs["vocab_size"], "num_layers": kwargs["num_layers"],
              "num_heads": kwargs["num_heads"], "hidden_size": kwargs["hidden_dim"],
              "embedding_size": kwargs["embedding_dim"],
              "intermediate_size": kwargs["intermediate_dim"],
              "hidden_dropout": kwargs.get("dropout", 0.1),
              "attention_dropout": kwargs.get("dropout", 0.1),
              "max_position_embeddings": kwargs.get("max_sequence_length", 512),
              "type_vocab_size": kwargs.get("num_segments", 2),
              "layer_norm_epsilon": KERAS_HUB_EPSILON, "hidden_act": hidden_act}
    values.update(vocab_overrides(vocab_file, values["vocab_size"]))
    return ElectraConfig.from_dict({**(base or ElectraConfig()).to_dict(), **values}, source=source)


def is_keras_hub_preset(path) -> bool:
    """True for a local folder with a keras-hub `ElectraBackbone` preset (keras-hub not needed)."""
    p = Path(path)
    if not (p.is_dir() and (p / "config.json").is_file()):
        return False
    try:
        saved = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # not a preset (read_json names what is wrong)
        return False
    return isinstance(saved, dict) and saved.get("class_name") == BACKBONE_CLASS and (
        str(saved.get("registered_name", "")).startswith("keras_hub>"))


# --- weights -------------------------------------------------------------------------------------
def _weight_pairs(ours, backbone) -> list[tuple[object, object]]:
    """(our variable, keras-hub variable) for every encoder weight, pooler excluded."""
    def dense(a, b):
        return [(a.kernel, b.kernel), (a.bias, b.bias)]

    def norm(a, b):
        return [(a.gamma, b.gamma), (a.beta, b.beta)]

    emb = ours.embeddings
    pairs = [(emb.word_embeddings, backbone.token_embedding.embeddings),
             (emb.position_embeddings, backbone.position_embedding.position_embeddings),
             (emb.token_type_embeddings, backbone.segment_embedding.embeddings),
             *norm(emb.layer_norm, backbone.embeddings_layer_norm)]
    if ours.embeddings_project is not None:
        pairs += dense(ours.embeddings_project.dense, backbone.embeddings_projection)
    for mine, theirs in zip(ours.encoder.layers, backbone.transformer_layers, strict=True):
        att, their_att = mine.attention, theirs._self_attention_layer
        for name in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
            pairs += dense(getattr(att, name), getattr(their_att, name))
        pairs += norm(mine.attention_layer_norm, theirs._self_attention_layer_norm)
        pairs += dense(mine.intermediate, theirs._feedforward_intermediate_dense)
        pairs += dense(mine.output_dense, theirs._feedforward_output_dense)
        pairs += norm(mine.output_layer_norm, theirs._feedforward_layer_norm)
    paired = {id(theirs) for _, theirs in pairs}
    pooler = {id(backbone.pooled_dense.kernel), id(backbone.pooled_dense.bias)}
    # A keras-hub release that adds a weight must fail here, not load half a model.
    unpaired = [v.path for v in backbone.weights if id(v) not in paired | pooler]
    if unpaired:
        raise ConversionError(f"keras-hub's ElectraBackbone has weights this converter does not "
                              f"know (another keras-hub version?): {unpaired}")
    bad = [f"{a.path} {list(a.shape)} vs {b.path} {list(b.shape)}" for a, b in pairs
           if tuple(a.shape) != tuple(b.shape)]
    if bad:
        raise ConversionError("shape mismatch between our encoder and keras-hub's: "
                              + "; ".join(bad))
    return pairs


def _encoder_of(model):
    """The Discriminator (or Generator) whose encoder goes into a backbone."""
    return model.discriminator if network_of(model) == "pretrainer" else model


def _dropped(model, encoder, pairs) -> list[tuple[str, str]]:
    """(path, reason) of `model`'s weights a backbone has no place for: heads, a generator."""
    kept = {id(ours) for ours, _ in pairs}
    in_encoder = {id(v) for v in encoder.weights}
    dropped = []
    for v in model.weights:
        if id(v) in kept:
            continue
        if id(v) not in in_encoder:
            dropped.append((v.path, "generator (a keras-hub backbone holds one encoder)"))
        else:  # discriminator/discriminator_predictions/dense/kernel -> discriminator_predictions
            parts = v.path.split("/")
            head = parts[1] if len(parts) > 2 else parts[0]
            dropped.append((v.path, f"{head} head (a keras-hub backbone has none)"))
    return dropped


def to_keras_hub_backbone(model):
    """A `keras_hub.models.ElectraBackbone` holding `model`'s encoder weights.

    `model`: a Discriminator, a Generator or an ElectraPretrainer (its discriminator). Returns
    (backbone, report): the report lists the heads (and a pretrainer's generator) as ignored and
    the pooler, which has no source, as missing.
    """
    keras_hub = _keras_hub()
    encoder = _encoder_of(model)
    backbone = keras_hub.models.ElectraBackbone(**backbone_kwargs(encoder.config))
    pairs = _weight_pairs(encoder, backbone)
    for ours, theirs in pairs:
        theirs.assign(ours.numpy())
    pooler = backbone.pooled_dense
    pooler.kernel.assign(np.eye(*pooler.kernel.shape, dtype="float32"))
    pooler.bias.assign(np.zeros(pooler.bias.shape, "float32"))
    report = ConversionReport(source=f"{network_of(model)} ({model.name})",
                              target=f"keras_hub ElectraBackbone ({backbone.name})")
    report.mapped = [(a.path, b.path, tuple(a.shape)) for a, b in pairs]
    report.ignored = _dropped(model, encoder, pairs)
    report.missing = [(f"{v.path} (written as {what}: ELECTRA trains no pooler)", tuple(v.shape))
                      for v, what in ((pooler.kernel, "the identity"), (pooler.bias, "zeros"))]
    return backbone, report


def from_keras_hub_backbone(backbone, config: ElectraConfig | None = None,
                            hidden_act: str = "gelu"):
    """Our `Discriminator` (no RTD head) with the weights of a keras-hub `ElectraBackbone`.

    `config`: the full config when known (sizes must match the backbone's); else derived from the
    backbone's with `hidden_act`. Returns (discriminator, report).
    """
    from electra_tf.models import Discriminator

    derived = config_from_keras_hub(backbone.get_config(), hidden_act=hidden_act)
    if config is None:
        config = derived
    else:
        _check_same_architecture(config, derived, "the backbone")
    disc = Discriminator(config, rtd_head=False)
    pairs = _weight_pairs(disc, backbone)
    for ours, theirs in pairs:
        ours.assign(np.asarray(theirs.numpy()))
    report = ConversionReport(source=f"keras_hub ElectraBackbone ({backbone.name})",
                              target=f"discriminator ({disc.name})")
    report.mapped = [(b.path, a.path, tuple(a.shape)) for a, b in pairs]
    report.ignored = [(v.path, "keras-hub pooler (ELECTRA has none)")
                      for v in backbone.pooled_dense.weights]
    return disc, report


_ARCHITECTURE = ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size")


def _check_same_architecture(config, derived, where):
    for field in _ARCHITECTURE:
        if getattr(config, field) != getattr(derived, field):
            raise ConversionError(f"{field}: the config says {getattr(config, field)} but "
                                  f"{where} has {getattr(derived, field)}")


# --- presets -------------------------------------------------------------------------------------
def recorded_lower_case(path) -> bool | None:
    """The casing a checkpoint folder (or a keras-hub preset) records, or None."""
    from electra_tf.data.casing import checkpoint_lower_case

    path = Path(path)
    # A preset's vocabulary is <preset>/assets/tokenizer/vocabulary.txt.
    for preset in (path, path.parent.parent):
        if is_keras_hub_preset(preset):
            return read_preset_config(preset)[2]
    return checkpoint_lower_case(path)[0]


def write_keras_hub_preset(model, preset_dir, *, vocab_file=None,
                           lower_case: bool | None = None) -> ConversionReport:
    """Writes a keras-hub ELECTRA preset (backbone + tokenizer) from `model`'s discriminator
    encoder (`electra_tf.convert.pretrained.to_keras_hub_preset` also takes a checkpoint path).

    Args:
      model: a Discriminator, Generator or ElectraPretrainer.
      preset_dir: the folder to write.
      vocab_file: the WordPiece vocabulary; without one, the preset has no tokenizer.
      lower_case: the tokenizer's casing; by default what the folder of `vocab_file` records
        (`electra_tf.data.casing`), else True (uncased, as the released ELECTRA models).

    Returns the conversion report (weights mapped, heads ignored, pooler written as identity).
    """
    keras_hub = _keras_hub()
    if lower_case is None and vocab_file is not None:  # the casing beside the vocabulary
        lower_case = recorded_lower_case(Path(vocab_file).parent)
    lower_case = True if lower_case is None else bool(lower_case)
    encoder = _encoder_of(model)
    tokenizer = None
    if vocab_file is not None:  # checked before anything is written
        from electra_tf.data.tokenizer import load_vocab

        vocab = load_vocab(str(vocab_file))
        if len(vocab) != encoder.config.vocab_size:
            raise ConversionError(f"vocabulary size mismatch: {vocab_file} has {len(vocab)} tokens "
                                  f"but the model's vocab_size is {encoder.config.vocab_size}")
        tokenizer = keras_hub.models.ElectraTokenizer(
            vocabulary=vocab, lowercase=lower_case, strip_accents=lower_case)
    backbone, report = to_keras_hub_backbone(model)
    out = Path(preset_dir)
    backbone.save_to_preset(str(out))
    if tokenizer is not None:
        tokenizer.save_to_preset(str(out))
    marker = {
        "format": "electra_tf keras_hub preset", "version": 1,
        "config": encoder.config.to_dict(), "lower_case": lower_case,
        "vocab": VOCAB_ASSET if tokenizer is not None else None,
        "pooler": "identity kernel, zero bias: pooled_output = tanh(h_[CLS])",
        "keras_hub_activation": KERAS_HUB_ACT, "dropped": sorted({r for _, r in report.ignored}),
    }
    files.write_json(out / MARKER, marker)
    report.target = f"keras_hub:{out}"
    return report


def read_preset_config(preset, hidden_act: str | None = None):
    """(ElectraConfig, vocab_path, lower_case) of a local preset folder, without keras-hub.

    The config is the one `to_keras_hub_preset` recorded, else derived from keras-hub's
    config.json (with the exact GELU unless `hidden_act` says otherwise).
    """
    folder = Path(preset)
    saved = read_json(folder / "config.json")
    if saved.get("class_name") != BACKBONE_CLASS:
        raise ConversionError(f"{folder / 'config.json'}: a keras-hub {saved.get('class_name')}, "
                              f"not an {BACKBONE_CLASS}")
    vocab = folder / VOCAB_ASSET
    vocab_path = str(vocab) if vocab.is_file() else None
    lower_case = None
    if (folder / "tokenizer.json").is_file():
        tokenizer = read_json(folder / "tokenizer.json").get("config", {})
        lower_case = bool(tokenizer.get("lowercase")) if isinstance(tokenizer, dict) else None
    derived = config_from_keras_hub(saved.get("config", {}), vocab_path,
                                    hidden_act=hidden_act or "gelu", source=str(folder / "config.json"))
    if (folder / MARKER).is_file():
        recorded = ElectraConfig.from_dict(read_json(folder / MARKER).get("config", {}),
                                           source=str(folder / MARKER))
        _check_same_architecture(recorded, derived, f"{folder / 'config.json'}")
        config = recorded.replace(hidden_act=hidden_act) if hidden_act else recorded
    else:
        config = derived
    return config, vocab_path, lower_case


def load_keras_hub_preset(preset, config=None, *, hidden_act: str | None = None):
    """Our Discriminator (no RTD head) from a keras-hub ELECTRA preset, as a `Pretrained`.

    Args:
      preset: a local preset folder (or any handle keras-hub's `from_preset` resolves).
      config: optional `ElectraConfig`, name or path, checked against the preset's sizes; by
        default the config `to_keras_hub_preset` recorded, else one derived from config.json.
      hidden_act: None keeps the recorded activation, or the exact GELU for a preset we did not
        write; "gelu_approximate" reproduces keras-hub's outputs (to round-off).
    """
    keras_hub = _keras_hub()
    recorded, vocab_path = None, None
    if Path(str(preset)).is_dir():
        recorded, vocab_path, _ = read_preset_config(preset, hidden_act)
    if config is not None:
        config = config if isinstance(config, ElectraConfig) else ElectraConfig.from_json(config)
        if recorded is not None:
            _check_same_architecture(config, recorded, str(preset))
        if hidden_act:
            config = config.replace(hidden_act=hidden_act)
    backbone = keras_hub.models.ElectraBackbone.from_preset(str(preset))
    disc, report = from_keras_hub_backbone(backbone, config or recorded, hidden_act or "gelu")
    report.source = f"keras_hub:{preset}"
    return Pretrained(disc, disc.config, vocab_path, report, "keras_hub")


def from_keras_hub_preset(preset, config=None, *, hidden_act: str | None = None):
    """Returns (discriminator, config, vocab_path) from a keras-hub ELECTRA preset folder."""
    loaded = load_keras_hub_preset(preset, config, hidden_act=hidden_act)
    return loaded.model, loaded.config, loaded.vocab_path


__all__ = ["backbone_kwargs", "config_from_keras_hub", "from_keras_hub_backbone",
           "from_keras_hub_preset", "is_keras_hub_preset", "load_keras_hub_preset",
           "read_preset_config", "recorded_lower_case", "to_keras_hub_backbone",
           "write_keras_hub_preset"]
