"""Checkpoints in the released layouts, from known random values, written independently of the
converter: names and shapes follow the released archives' variables, the authors'
`model/modeling.py` / `run_pretraining.py` scopes; HF names follow `modeling_electra.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tensorflow as tf

# Tiny sizes: H=128 gives 2 heads by the original's hidden // 64 rule, so the head reshape matters.
TINY = dict(vocab=112, emb=32, hidden=128, layers=2, ffn=512, max_pos=64)


def _encoder_shapes(scope, width_in, hidden, layers, ffn):
    shapes = {}
    if width_in != hidden:
        shapes[f"{scope}/embeddings_project/kernel"] = (width_in, hidden)
        shapes[f"{scope}/embeddings_project/bias"] = (hidden,)
    for i in range(layers):
        p = f"{scope}/encoder/layer_{i}"
        for name in ("query", "key", "value"):
            shapes[f"{p}/attention/self/{name}/kernel"] = (hidden, hidden)
            shapes[f"{p}/attention/self/{name}/bias"] = (hidden,)
        shapes[f"{p}/attention/output/dense/kernel"] = (hidden, hidden)
        shapes[f"{p}/attention/output/dense/bias"] = (hidden,)
        shapes[f"{p}/attention/output/LayerNorm/gamma"] = (hidden,)
        shapes[f"{p}/attention/output/LayerNorm/beta"] = (hidden,)
        shapes[f"{p}/intermediate/dense/kernel"] = (hidden, ffn)
        shapes[f"{p}/intermediate/dense/bias"] = (ffn,)
        shapes[f"{p}/output/dense/kernel"] = (ffn, hidden)
        shapes[f"{p}/output/dense/bias"] = (hidden,)
        shapes[f"{p}/output/LayerNorm/gamma"] = (hidden,)
        shapes[f"{p}/output/LayerNorm/beta"] = (hidden,)
    return shapes


def _embedding_shapes(scope, vocab, width, max_pos):
    e = f"{scope}/embeddings"
    return {f"{e}/word_embeddings": (vocab, width), f"{e}/token_type_embeddings": (2, width),
            f"{e}/position_embeddings": (max_pos, width), f"{e}/LayerNorm/gamma": (width,),
            f"{e}/LayerNorm/beta": (width,)}


def released_shapes(vocab, emb, hidden, layers, ffn, max_pos, gen_hidden=None, gen_layers=None,
                    sharing="embeddings", disc_head=True):
    """name -> shape of a checkpoint written by the original `run_pretraining.py`."""
    shapes = {**_embedding_shapes("electra", vocab, emb, max_pos),
              **_encoder_shapes("electra", emb, hidden, layers, ffn)}
    if disc_head:
        shapes.update({"discriminator_predictions/dense/kernel": (hidden, hidden),
                       "discriminator_predictions/dense/bias": (hidden,),
                       "discriminator_predictions/dense_1/kernel": (hidden, 1),
                       "discriminator_predictions/dense_1/bias": (1,)})
    if gen_hidden is None and sharing != "all":
        return shapes
    if sharing == "all":  # untied_generator=False: the generator is the `electra` network
        gen_hidden, table = hidden, emb
    elif sharing == "untied":  # untied_generator_embeddings: embedding_size=None -> gen hidden
        table = gen_hidden
        shapes.update(_embedding_shapes("generator", vocab, gen_hidden, max_pos))
        shapes.update(_encoder_shapes("generator", gen_hidden, gen_hidden, gen_layers,
                                      4 * gen_hidden))
    else:
        table = emb
        shapes.update(_encoder_shapes("generator", emb, gen_hidden, gen_layers, 4 * gen_hidden))
    shapes.update({"generator_predictions/dense/kernel": (gen_hidden, table),
                   "generator_predictions/dense/bias": (table,),
                   "generator_predictions/LayerNorm/gamma": (table,),
                   "generator_predictions/LayerNorm/beta": (table,),
                   "generator_predictions/output_bias": (vocab,)})
    return shapes


def random_tensors(shapes, seed=0):
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        value = rng.standard_normal(shape).astype(np.float32) * 0.1
        if name.endswith("gamma"):
            value += 1.0
        tensors[name] = value
    return tensors


def with_training_state(tensors, step=1000):
    """Adds the Adam slots and global_step a training checkpoint also holds."""
    out = dict(tensors)
    for name, value in tensors.items():
        out[f"{name}/adam_m"] = np.full_like(value, 0.5)
        out[f"{name}/adam_v"] = np.full_like(value, 0.25)
    out["global_step"] = np.int64(step)
    return out


def write_tf1(folder, tensors, name="model.ckpt-1000", vocab_size=None):
    """A name-based checkpoint like the released archives: prefix, `checkpoint` file, vocab.txt."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prefix = str(folder / name)
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    (folder / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\n')
    if vocab_size is not None:
        write_vocab(folder / "vocab.txt", vocab_size)
    return prefix


def write_vocab(path, size):
    special = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens = (special + [f"tok{i}" for i in range(size)])[:size]
    Path(path).write_text("\n".join(tokens) + "\n")


def hf_state(tensors, network="discriminator", prefix="electra."):
    """A Hugging Face state dict (torch [out, in] Linear weights) for one network of `tensors`."""
    out = {}
    for name, value in tensors.items():
        parts = name.split("/")
        if parts[0] == "generator" and network == "discriminator":
            continue
        if parts[0] in ("generator_predictions",) and network == "discriminator":
            continue
        if parts[0] == "discriminator_predictions" and network == "generator":
            continue
        if parts[0] == "electra" and network == "generator" and parts[1] != "embeddings":
            continue
        if parts[0] in ("electra", "generator"):
            key = prefix + ".".join(parts[1:])
        elif name == "generator_predictions/output_bias":
            out["generator_lm_head.bias"] = value
            continue
        else:
            key = name.replace("/", ".").replace("dense_1", "dense_prediction")
        key = re.sub(r"layer_(\d+)", r"layer.\1", key)
        if key.endswith(".kernel"):
            key, value = key[:-len("kernel")] + "weight", value.T
        elif key.endswith(".gamma"):
            key = key[:-len("gamma")] + "weight"
        elif key.endswith(".beta"):
            key = key[:-len("beta")] + "bias"
        elif key.endswith("_embeddings"):
            key += ".weight"
        out[key] = np.ascontiguousarray(value)
    return out
