"""TF Model Garden's ELECTRA pretraining step, as a timing reference for our benchmark.

Runs in a SIDE venv (TF 2.20 + tf_keras + tf-models-official), never in the project's: it is a
`row_worker` child like `benchmarks/torch_reference.py`. Imports only numpy, tensorflow, tf_keras,
`official.*`, `electra_tf.config` (stdlib only) and its sibling file `row_worker.py`.

  python3.11 -m venv ../mg-venv                    # any path OUTSIDE the repo (3.3 GB)
  ../mg-venv/bin/pip install "tensorflow==2.20.*" "tf-models-official==2.20.*" "tf-keras==2.20.*"
      # resolved: TF 2.20.0, tf-models-official 2.20.0, tf-keras 2.20.1, tensorflow-text 2.20.1
  .venv/bin/python -m benchmarks.benchmark_pretrain --model_garden_python=../mg-venv/bin/python
  # the benchmark starts it by file as  [PY, "benchmarks/model_garden_reference.py", WORKDIR]  with
  # PYTHONPATH=<repo root> (electra_tf is not installed in the side venv); by hand, from the repo root:
  PYTHONPATH=. ../mg-venv/bin/python benchmarks/model_garden_reference.py WORKDIR

WORKDIR is `row_worker.save_inputs`'s: setup.json ({"model_config": ElectraConfig.to_dict(), ...})
and batches.npz ("<i>/input_ids", "<i>/input_mask", "<i>/segment_ids": int32 [batch, seq]).
`info` answers {"model_garden", "tensorflow", "tf_keras", "parameters", "masked_slots"}.

What it builds from OUR `ElectraConfig` (as `official/nlp/tasks/electra_task._build_pretrainer`):
  encoders   `networks.BertEncoder` (dict_outputs) for the discriminator (E, H, layers, heads, FFN,
             dropouts, position/type sizes, truncated-normal init) and for the generator with
             `generator_config()`'s sizes; E -> H projection when E != H. Activation: our "gelu"
             is exact erf GELU (`tf_keras.activations.gelu`); NB Model Garden's own name "gelu"
             is the tanh approximation, used here for our "gelu_approximate".
  sharing    "embeddings": the generator reuses the discriminator's word-embedding layer
             (Model Garden's `tie_embeddings`); "untied": separate. "all" is refused.
  pretrainer `models.ElectraPretrainer`, num_token_predictions = `num_masked_slots(seq)`, mlm
             activation = the generator's, disallow_correct from the config; generator MaskedLM
             head tied to the word embeddings.
  masking    on the host, ONCE per batch (then cycled): per row max(1, min(N, round(real *
             mask_prob))) distinct positions among real tokens that are not [CLS]/[SEP]/[MASK]
             (nor position 0, which Model Garden's scatter_update ignores); 85% show [MASK], 15%
             keep their token; unused slots: position 0, id 0, weight 0.
  step       `ElectraPretrainTask.train_step` in a tf.function (no XLA): its loss (MLM CE over
             the weighted slots + discriminator_loss_weight (= our disc_weight) x RTD sigmoid CE
             over input_mask), gradients over all trainable variables, and its metrics.
  optimizer  Model Garden's optimization factory as its ELECTRA experiment: "adamw" (its legacy
             AdamWeightDecay: decay 0.01 except LayerNorm/layer_norm/bias, global clip 1.0) with
             epsilon 1e-6, polynomial decay from 5e-4 over 1M steps, 10 polynomial warm-up steps
             (our bare rows' schedule). fp32, dropout on.

Differences from our step (numbers differ; the work is about the same except where noted):
  - masking is static per batch and done outside the step (ours, like the authors', is in-graph
    and fresh each step), so the timed step has no masking ops;
  - sampling ignores `temperature` (fixed 1.0) and takes argmax(softmax(logits + g)) through a
    one-hot [B, N, V] (the authors' code does the same on logits / T; ours: argmax(logits / T +
    g), no softmax or one-hot), a little extra work;
  - tied embeddings share only the word table: position and type tables and the embedding
    LayerNorm are per model (ours, like the authors', shares the whole embedding block);
  - computed every step and unused: each encoder's pooler, the generator's 2-class head and the
    task's accuracy metrics; attention is Keras' MultiHeadAttention (separate Q/K/V einsums;
    ours: one fused QKV matmul);
  - legacy tf_keras Adam has bias correction (ours and the authors' AdamWeightDecay have none);
    the tf.function is traced twice on the first call (variable creation), then never again.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import sys

KEEP_ORIGINAL_PROB = 0.15  # of the chosen positions, the share that keep their token (as ours)
PEAK_LEARNING_RATE, DECAY_STEPS, WARMUP_STEPS = 5e-4, 1_000_000, 10  # our bare rows' schedule


def _activation(name: str):
    import tf_keras
    from official.modeling import tf_utils

    return {"gelu": tf_keras.activations.gelu,  # exact erf (approximate=False)
            "gelu_approximate": tf_utils.get_activation("gelu"),  # Model Garden's tanh GELU
            "relu": tf_keras.activations.relu}[name]


def _encoder(c, embedding_layer=None):
    import tf_keras
    from official.nlp.modeling import networks

    return networks.BertEncoder(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_layers,
        num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
        activation=_activation(c.hidden_act), dropout_rate=c.hidden_dropout,
        attention_dropout_rate=c.attention_dropout, max_sequence_length=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size, embedding_width=c.embedding_size,
        initializer=tf_keras.initializers.TruncatedNormal(stddev=c.initializer_range),
        embedding_layer=embedding_layer, dict_outputs=True)


def build_pretrainer(c, num_slots: int):
    """Model Garden's `ElectraPretrainer` with the sizes of our `ElectraConfig` `c`."""
    import tf_keras
    from official.nlp.modeling import models

    if c.objective != "electra" or c.embedding_sharing not in ("embeddings", "untied"):
        raise ValueError(f"model garden reference: objective {c.objective!r} / embedding_sharing"
                         f" {c.embedding_sharing!r} not mirrored (only 'electra', "
                         "'embeddings'/'untied')")
    g = c.generator_config()
    discriminator = _encoder(c)
    shared = discriminator.get_embedding_layer() if c.embedding_sharing == "embeddings" else None
    generator = _encoder(g, embedding_layer=shared)
    return models.ElectraPretrainer(
        generator_network=generator, discriminator_network=discriminator,
        vocab_size=g.vocab_size, num_classes=2, num_token_predictions=num_slots,
        mlm_activation=_activation(g.hidden_act),
        mlm_initializer=tf_keras.initializers.TruncatedNormal(stddev=g.initializer_range),
        disallow_correct=c.disallow_correct)


def mask_batch(features, c, num_slots: int, rng) -> dict:
    """Model Garden's pretraining features of one of our batches (numpy; see the docstring)."""
    import numpy as np

    ids = np.asarray(features["input_ids"], np.int32)
    input_mask = np.asarray(features["input_mask"], np.int32)
    segment = features.get("segment_ids")
    segment = np.zeros_like(ids) if segment is None else np.asarray(segment, np.int32)
    batch, seq = ids.shape
    if num_slots > seq:
        raise ValueError(f"model garden reference: {num_slots} masked slots > sequence {seq}")
    candidates = (input_mask == 1) & ~np.isin(ids, [c.cls_token_id, c.sep_token_id,
                                                    c.mask_token_id])
    candidates[:, 0] = False  # scatter_update ignores position 0
    count = np.clip(np.round(input_mask.sum(1) * c.mask_prob), 1, num_slots).astype(np.int64)
    scores = np.where(candidates, rng.random((batch, seq)), -1.0)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :num_slots]
    live = ((np.arange(num_slots)[None, :] < count[:, None])
            & (np.take_along_axis(scores, order, 1) >= 0))
    positions = np.where(live, order, 0).astype(np.int32)
    show = live & (rng.random((batch, num_slots)) >= KEEP_ORIGINAL_PROB)
    masked_ids = ids.copy()
    rows, slots = np.nonzero(show)
    masked_ids[rows, positions[rows, slots]] = c.mask_token_id
    return {"input_word_ids": masked_ids, "input_mask": input_mask, "input_type_ids": segment,
            "masked_lm_positions": positions,
            "masked_lm_ids": np.where(live, np.take_along_axis(ids, positions, 1), 0)
            .astype(np.int32),
            "masked_lm_weights": live.astype(np.float32)}


def model_garden_step(model_config, batches, seed: int = 0):
    """(one-step callable, 1, info): Model Garden's ELECTRA train step cycling over `batches`."""
    import numpy as np
    import tensorflow as tf
    import tf_keras
    from official.modeling import optimization
    from official.nlp.configs import electra
    from official.nlp.data import pretrain_dataloader
    from official.nlp.tasks import electra_task

    tf_keras.utils.set_random_seed(seed)  # initialisation and dropout
    num_slots = model_config.num_masked_slots(np.asarray(batches[0]["input_ids"]).shape[1])
    rng = np.random.default_rng(seed + 1)
    inputs = [{k: tf.constant(v) for k, v in mask_batch(b, model_config, num_slots, rng).items()}
              for b in batches]
    model = build_pretrainer(model_config, num_slots)
    task = electra_task.ElectraPretrainTask(electra_task.ElectraPretrainConfig(
        model=electra.ElectraPretrainerConfig(
            num_masked_tokens=num_slots, discriminator_loss_weight=model_config.disc_weight,
            disallow_correct=model_config.disallow_correct),
        train_data=pretrain_dataloader.BertPretrainDataConfig(use_next_sentence_label=False)))
    factory = optimization.OptimizerFactory(optimization.OptimizationConfig({
        "optimizer": {"type": "adamw", "adamw": {
            "weight_decay_rate": 0.01, "epsilon": 1e-6,
            "exclude_from_weight_decay": ["LayerNorm", "layer_norm", "bias"]}},
        "learning_rate": {"type": "polynomial", "polynomial": {
            "initial_learning_rate": PEAK_LEARNING_RATE, "decay_steps": DECAY_STEPS,
            "end_learning_rate": 0.0}},
        "warmup": {"type": "polynomial", "polynomial": {"warmup_steps": WARMUP_STEPS}}}))
    optimizer = factory.build_optimizer(factory.build_learning_rate())
    metrics = task.build_metrics(training=True)
    model(inputs[0], training=False)  # builds the variables
    train_step = tf.function(lambda features: task.train_step(features, model, optimizer,
                                                              metrics)[task.loss])
    cycle = itertools.cycle(inputs)
    info = {"model_garden": importlib.metadata.version("tf-models-official"),
            "tensorflow": tf.__version__, "tf_keras": tf_keras.__version__,
            "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            "masked_slots": num_slots}
    return (lambda: float(train_step(next(cycle)))), 1, info


def _serve(workdir: str) -> None:
    """The reference as a `row_worker` child: reads the inputs the benchmark saved."""
    import row_worker  # the sibling file: run by path, this folder is first on sys.path

    model_config, batches, _ = row_worker.load_inputs(workdir)
    step, per_call, info = model_garden_step(model_config, batches)
    row_worker.serve(step, per_call, info)


if __name__ == "__main__":
    _serve(sys.argv[1])
