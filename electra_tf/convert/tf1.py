"""The authors' name-based TF1 checkpoints (google-research/electra) <-> our Keras models.

Released archives (electra_small, electra_base, electra_large, and checkpoints written by
`run_pretraining.py`) hold one name-based checkpoint with the discriminator under `electra/`, the
generator under `generator/` (its embeddings shared as `electra/embeddings`, or its own
`generator/embeddings` when untied), the heads `discriminator_predictions/` and
`generator_predictions/`, Adam slots `<var>/adam_m`, `<var>/adam_v` and `global_step`, next to
the BERT uncased `vocab.txt`. With every weight tied (`untied_generator=False`) there is no
`generator/` scope: the generator is the `electra/` network. An Electric checkpoint
(`electric_objective`) has the two-tower generator instead: `generator_ltr/` and `generator_rtl/`
(each with its `embeddings_project`, both reading `electra/embeddings` unless untied, then
`generator_ltr/embeddings`, ...) and the head `cloze_predictions/`; it loads as network="pretrainer"
(objective "electric", inferred) or network="discriminator".

Example:
>>> disc, config, report = load_tf1_model("electra_small", network="discriminator")[:3]
>>> print(report.summary())
>>> export_tf1(disc, "/tmp/electra_small_again")
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from electra_tf import files
from electra_tf.config import ElectraConfig
from electra_tf.convert.common import (
    KNOWN_TF1_NAME, ConversionError, ConversionReport, assign, check_vocab_size, network_of,
    model_slots, open_tf_checkpoint, part_of, plan_load, reading_tf_tensors, vocab_overrides)

WORD_EMBEDDINGS = "electra/embeddings/word_embeddings"
GEN_WORD_EMBEDDINGS = "generator/embeddings/word_embeddings"
_LAYER = re.compile(r"^(electra|generator|generator_ltr|generator_rtl)/encoder/layer_(\d+)/")
ELECTRIC_SCOPE = "generator_ltr"  # a checkpoint with this scope is Electric's


# --- reading -------------------------------------------------------------------------------------
def resolve_checkpoint(path) -> tuple[str, str | None]:
    """(checkpoint prefix, vocab.txt or None) for a prefix, an `.index` file or a folder.

    A folder is what the released archives unpack to: a `checkpoint` state file and/or
    `<name>.index` + `<name>.data-*` files, and `vocab.txt`.
    """
    import tensorflow as tf

    p = Path(path)
    if p.is_dir():
        prefix = None
        if (p / "checkpoint").exists():
            latest = tf.train.latest_checkpoint(str(p))
            if latest and Path(latest + ".index").exists():
                prefix = latest
        if prefix is None:
            indexes = sorted(p.glob("*.index"))
            if not indexes:
                raise ConversionError(f"no TF1 checkpoint in folder {p}: looked for a 'checkpoint' "
                                      f"state file and '*.index' files")

            def step(index):
                m = re.search(r"-(\d+)$", index.name[:-len(".index")])
                return int(m.group(1)) if m else -1

            prefix = str(max(indexes, key=step))[:-len(".index")]
        vocab = p / "vocab.txt"
        return prefix, str(vocab) if vocab.exists() else None
    text = str(p)
    if text.endswith(".index"):
        text = text[:-len(".index")]
    text = re.sub(r"\.data-\d+-of-\d+$", "", text)
    if not Path(text + ".index").exists():
        raise ConversionError(f"no TF1 checkpoint at {path}: looked for {text}.index and for a folder "
                              "holding 'checkpoint' / '*.index'")
    vocab = Path(text).parent / "vocab.txt"
    return text, str(vocab) if vocab.exists() else None


def read_shapes(prefix: str) -> dict[str, tuple]:
    shapes = open_tf_checkpoint(prefix).get_variable_to_shape_map()
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in shapes:
        raise ConversionError(
            f"{prefix} is an object-based TF2 checkpoint (a pretraining run's ckpt-N?), not a "
            "name-based TF1 one: give the folder save_electra_checkpoint wrote (a pretraining run "
            "exports <model_dir>/discriminator)")
    return {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}


def _need(shapes, name):
    if name not in shapes:
        raise ConversionError(f"cannot infer the model config: {name} is not in the checkpoint")
    return shapes[name]


def _num_layers(shapes, scope):
    layers = {int(m.group(2)) for n in shapes if (m := _LAYER.match(n)) and m.group(1) == scope}
    return max(layers) + 1 if layers else 0


def layout(shapes) -> dict:
    """Which generator the checkpoint holds: {"generator": bool, "sharing": ..., "gen_scope",
    "gen_embeddings_scope", "electric": bool}. For Electric, the scopes are the left tower's."""
    if _num_layers(shapes, ELECTRIC_SCOPE) > 0:
        untied = f"{ELECTRIC_SCOPE}/embeddings/word_embeddings" in shapes
        return {"generator": True, "sharing": "untied" if untied else "embeddings",
                "gen_scope": ELECTRIC_SCOPE,
                "gen_embeddings_scope": ELECTRIC_SCOPE if untied else "electra", "electric": True}
    has_gen_encoder = _num_layers(shapes, "generator") > 0
    has_gen_head = "generator_predictions/output_bias" in shapes
    untied = GEN_WORD_EMBEDDINGS in shapes
    if has_gen_encoder:
        sharing = "untied" if untied else "embeddings"
        scopes = ("generator", "generator" if untied else "electra")
    else:
        sharing, scopes = "all", ("electra", "electra")
    return {"generator": has_gen_encoder or has_gen_head, "sharing": sharing,
            "gen_scope": scopes[0], "gen_embeddings_scope": scopes[1], "electric": False}


def infer_config(shapes: dict, vocab_file=None, base: ElectraConfig | None = None) -> ElectraConfig:
    """The discriminator's `ElectraConfig` from a checkpoint's tensor shapes.

    Sizes come from the shapes; heads = max(1, hidden // 64) as in the original
    (`util/training_utils.get_bert_config`); everything the shapes do not say (dropout,
    activation, objective) comes from `base` (default: ElectraConfig()), except that an Electric
    checkpoint sets objective "electric".
    """
    vocab, emb = _need(shapes, WORD_EMBEDDINGS)
    hidden = _need(shapes, "electra/encoder/layer_0/attention/self/query/kernel")[1]
    layers = _num_layers(shapes, "electra")
    values = {
        "vocab_size": vocab, "embedding_size": emb, "hidden_size": hidden, "num_layers": layers,
        "num_heads": max(1, hidden // 64),
        "intermediate_size": _need(shapes, "electra/encoder/layer_0/intermediate/dense/kernel")[1],
        "max_position_embeddings": _need(shapes, "electra/embeddings/position_embeddings")[0],
        "type_vocab_size": _need(shapes, "electra/embeddings/token_type_embeddings")[0],
    }
    found = layout(shapes)
    if found["generator"]:
        values["embedding_sharing"] = found["sharing"]
        if found["sharing"] == "all":
            values.update(generator_hidden_size=1.0, generator_layers=1.0)
        else:
            scope = found["gen_scope"]
            gen_hidden = _need(shapes, f"{scope}/encoder/layer_0/attention/self/query/kernel")[1]
            values.update(generator_hidden_size=gen_hidden / hidden,
                          generator_layers=_num_layers(shapes, scope) / layers)
        if found["electric"]:
            values["objective"] = "electric"
    values.update(vocab_overrides(vocab_file, vocab))
    base = base or ElectraConfig()
    return ElectraConfig.from_dict({**base.to_dict(), **values}, source="config inferred from checkpoint")


# --- loading -------------------------------------------------------------------------------------
def _classifier(network: str, model, ignore_task_specific: bool):
    disc = getattr(model, "discriminator", model)

    def classify(name):
        if name.endswith(("/adam_m", "/adam_v")):
            return "optimizer slot (adam_m/adam_v)"
        if name == "global_step":
            return "global_step"
        if ignore_task_specific and name.startswith("task_specific/"):
            return "fine-tuning head (task_specific/)"
        if KNOWN_TF1_NAME.fullmatch(name):
            part = part_of(name)
            if network == "discriminator" and part == "generator":
                return "generator weight (loading the discriminator)"
            if network == "generator" and part == "discriminator":
                return "discriminator weight (loading the generator)"
            if (name.startswith("discriminator_predictions/") and network != "generator"
                    and getattr(disc, "rtd_head", None) is None):
                return "replaced-token-detection head (the model has none)"
        return None

    return classify


def load_tf1(model, path, *, allow_unknown: bool = False, allow_missing: bool = False,
             ignore_task_specific: bool = True) -> ConversionReport:
    """Copies a TF1 checkpoint into `model` (Discriminator, Generator or ElectraPretrainer).

    Every checkpoint tensor is mapped or explicitly ignored (Adam slots, global_step,
    `task_specific/` heads, and the other network's weights when loading only one of them).
    Raises ConversionError naming the variable(s) and shapes on anything else; nothing is
    assigned then, nor when a checkpoint file is damaged (every tensor is read first).
    """
    prefix, _ = resolve_checkpoint(path)
    shapes = read_shapes(prefix)
    network = network_of(model)
    scopes = None
    if network == "generator":
        found = layout(shapes)
        scopes = (found["gen_scope"], found["gen_embeddings_scope"])
    slots = model_slots(model, scopes)
    report = plan_load(slots, shapes, classify=_classifier(network, model, ignore_task_specific),
                       allow_missing=allow_missing, allow_unknown=allow_unknown,
                       source=f"tf1:{prefix}", target=f"{network} ({model.name})")
    reader = open_tf_checkpoint(prefix)
    with reading_tf_tensors(prefix):
        arrays = {s.name: reader.get_tensor(s.name) for s in slots if s.name in shapes}
    assign(slots, arrays)
    return report


def build_model(network: str, config: ElectraConfig, shapes: dict | None = None):
    """Our model of `network` for a TF1 checkpoint with `shapes`.

    `config` is the pretraining (discriminator) config. A generator is built with
    `config.generator_config()`, except that untied generator embeddings get the width the
    original gives them (its hidden size; `model/modeling.py` passes embedding_size=None).
    """
    from electra_tf.models import Discriminator, ElectraPretrainer, Generator

    shapes = shapes or {}
    if config.objective == "electric" and network != "discriminator":
        if network != "pretrainer":
            raise ConversionError("Electric's two-tower generator converts only with its "
                                  "discriminator: use network='pretrainer' (or 'discriminator')")
        return ElectraPretrainer(config)
    if network == "discriminator":
        # A fine-tuned checkpoint has no RTD head: build the bare encoder then.
        return Discriminator(config, rtd_head=not shapes
                             or "discriminator_predictions/dense/kernel" in shapes)
    gen_config = config.generator_config()
    gen_emb = shapes.get(GEN_WORD_EMBEDDINGS, (None, gen_config.embedding_size))[1]
    if network == "generator":
        return Generator(gen_config.replace(embedding_size=gen_emb))
    if network == "pretrainer":
        if gen_emb != config.embedding_size:
            raise ConversionError(
                f"the checkpoint's untied generator embeddings {GEN_WORD_EMBEDDINGS} are "
                f"{list(shapes[GEN_WORD_EMBEDDINGS])} (width = generator hidden size, as the "
                f"original builds them) but ElectraPretrainer gives an untied generator embeddings of "
                f"width embedding_size={config.embedding_size}; load network='discriminator' and "
                f"network='generator' separately")
        return ElectraPretrainer(config)
    raise ValueError(f"network must be 'discriminator', 'generator' or 'pretrainer', got {network!r}")


def load_tf1_model(path, network: str = "discriminator", config=None, **load_kwargs):
    """Builds our model of `network` for a TF1 checkpoint and loads it.

    Args:
      path: checkpoint prefix, `.index` file or archive folder.
      network: "discriminator", "generator" or "pretrainer".
      config: the pretraining `ElectraConfig` (or a config name / path); inferred from the
        checkpoint's shapes when None.
      **load_kwargs: allow_unknown, allow_missing, ignore_task_specific (see `load_tf1`).

    Returns (model, model_config, report, vocab_file): `model_config` is the config the model was
    built with (the generator's own config for network="generator").
    """
    prefix, vocab_file = resolve_checkpoint(path)
    shapes = read_shapes(prefix)
    if config is None:
        config = infer_config(shapes, vocab_file)
    else:
        if not isinstance(config, ElectraConfig):
            config = ElectraConfig.from_json(config)
        if WORD_EMBEDDINGS in shapes:
            check_vocab_size(config, shapes[WORD_EMBEDDINGS][0], f"{prefix}:{WORD_EMBEDDINGS}")
        vocab_overrides(vocab_file, config.vocab_size)  # checks the vocab file's size
    model = build_model(network, config, shapes)
    report = load_tf1(model, prefix, **load_kwargs)
    return model, model.config, report, vocab_file


# --- writing -------------------------------------------------------------------------------------
def tf1_tensors(model) -> tuple[dict[str, np.ndarray], ConversionReport]:
    """Our model's weights under the released TF1 names and shapes."""
    slots = model_slots(model)
    report = ConversionReport(source=f"{network_of(model)} ({model.name})", target="tf1")
    tensors = {}
    for slot in slots:
        tensors[slot.name] = slot.value()
        report.mapped.append((slot.variable.path, slot.name, slot.shape))
    return tensors, report


def export_tf1(model, output_dir, *, vocab_file=None, global_step: int = 0):
    """Writes `model` as a name-based TF1 checkpoint `output_dir/model.ckpt-<global_step>`.

    The names and shapes are those of the released checkpoints (plus `global_step`), so the
    authors' `run_finetuning.py` and `tf.train.load_checkpoint` read it. Returns (prefix, report).
    """

    import tensorflow as tf

    tensors, report = tf1_tensors(model)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"model.ckpt-{int(global_step)}"
    prefix = str(out / name)
    names = sorted(tensors)
    values = [tf.constant(tensors[n].astype(np.float32)) for n in names]
    names.append("global_step")
    values.append(tf.constant(int(global_step), tf.int64))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=values)
    files.write_text(out / "checkpoint",
                     f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
    if vocab_file is not None and Path(vocab_file).resolve() != (out / "vocab.txt").resolve():
        files.copy_file(vocab_file, out / "vocab.txt")
    report.target = f"tf1:{prefix}"
    return prefix, report
