"""The task families (`electra_tf/finetune/families/`): the registry, each family's loss against
a NumPy computation, weight decay on the real heads' variables, and the saved model's typed
description (`FinetunedModelConfig`).

Losses: every head's `per_example_loss` on a small batch, recomputed in NumPy from the head's
own outputs and the labels, the way the authors' code defines it (`finetune/classification/
classification_tasks.py`, `finetune/tagging/tagging_tasks.py`, `finetune/qa/qa_tasks.py`); and
the loop's reduction (sum over the global batch / its size) on a real training step.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ConfigError, ElectraConfig
from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.saving import FinetunedModelConfig
from electra_tf.finetune.families import FAMILIES, TaskFamily, get_family, register_family
from electra_tf.finetune.tasks import Task, takes_pairs
from electra_tf.finetune.examples import TaggingExample

VOCAB = 64


def _config():
    """electra_tiny without dropout over a 64-token vocabulary: outputs are deterministic."""
    return ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=VOCAB, cls_token_id=2, sep_token_id=3, mask_token_id=4, hidden_dropout=0.0,
        attention_dropout=0.0)


def _log_softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _ids(rng, shape):
    """Token ids [.., seq] with [CLS] first, padding after a random length, and the mask."""
    seq = shape[-1]
    lengths = rng.integers(seq // 2, seq + 1, shape[:-1])
    mask = (np.arange(seq) < lengths[..., None]).astype(np.int32)
    ids = rng.integers(5, VOCAB, shape).astype(np.int32) * mask
    ids[..., 0] = 2
    return ids, mask


# ---------------------------------------------------------------------------------------
# The registry.
# ---------------------------------------------------------------------------------------


def test_every_family_is_registered_with_its_head():
    from electra_tf.finetune import heads

    assert list(FAMILIES) == ["classification", "regression", "tagging", "qa", "multiple_choice"]
    for name, cls in FAMILIES.items():
        family = get_family(name)
        assert isinstance(family, cls) and family.name == name
        assert getattr(heads, family.head).family == name  # head <-> family, both ways
    with pytest.raises(ValueError, match="unknown task family 'ranking'"):
        get_family("ranking")
    with pytest.raises(ValueError, match="Task 'x': field 'family' is 'kind', expected one of"):
        Task("x", "kind")


def test_a_new_family_is_one_registered_class():
    """What `register_family` checks, and that a registered family is a Task's family."""

    @register_family
    class Echo(TaskFamily):
        name, head = "echo_for_test", "SentenceClassifier"

    try:
        assert isinstance(get_family("echo_for_test"), Echo)
        assert Task("echo", "echo_for_test").family == "echo_for_test"
        with pytest.raises(ValueError, match="already registered"):
            register_family(type("Other", (TaskFamily,), {"name": "echo_for_test", "head": "X"}))
        with pytest.raises(ValueError, match="needs a `name` and a `head`"):
            register_family(type("Nameless", (TaskFamily,), {}))
    finally:
        del FAMILIES["echo_for_test"]


# ---------------------------------------------------------------------------------------
# Each family's loss, against NumPy.
# ---------------------------------------------------------------------------------------


def _head(name, config=None, **options):
    """The family's head for a task with labels a, b, c (dropout off, `options` for the
    `FinetuningConfig`)."""
    keras.utils.set_random_seed(0)
    fc = FinetuningConfig(dropout=0.0, n_best_size=4, **options)
    task = Task("t", name, ("a", "b", "c") if get_family(name).has_label_names else None)
    return get_family(name).build_head(config or _config(), task, fc)


def _loss(head, features, training=False):
    outputs = head(features, training=training)
    return {k: np.asarray(v, np.float64) for k, v in outputs.items()}, np.asarray(
        head.per_example_loss(features, outputs), np.float64)


def test_classification_loss_is_softmax_cross_entropy():
    rng = np.random.default_rng(1)
    ids, mask = _ids(rng, (6, 12))
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
         "label": rng.integers(0, 3, 6).astype(np.int32)}
    outputs, loss = _loss(_head("classification"), f)
    want = -_log_softmax(outputs["logits"])[np.arange(6), f["label"]]
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_regression_loss_is_squared_error():
    rng = np.random.default_rng(2)
    ids, mask = _ids(rng, (6, 12))
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
         "label": rng.uniform(0, 5, 6).astype(np.float32)}
    outputs, loss = _loss(_head("regression"), f)
    np.testing.assert_allclose(loss, (outputs["predictions"] - f["label"]) ** 2, rtol=1e-5)


def test_tagging_loss_counts_first_pieces_only(tokenizer, rt_sentences, tiny_config):
    """Summed over each word's first piece (`word_positions`, from the featurizer), nothing
    else: continuation pieces, [CLS], [SEP] and padding carry no loss."""
    words = [s.split()[:10] for s in rt_sentences[40:46]]
    examples = [TaggingExample(i, tuple(w), tuple(j % 3 for j in range(len(w)))) for i, w in enumerate(words)]
    arrays = F.featurize_tagging(examples, tokenizer, 24)
    outputs, loss = _loss(_head("tagging", tiny_config), arrays)
    log_probs = _log_softmax(outputs["logits"])  # [N, L, 3]
    want = [sum(-log_probs[i, arrays["word_positions"][i, w], e.labels[w]] for w in range(arrays["num_words"][i]))
            for i, e in enumerate(examples)]
    assert (arrays["input_mask"].sum() > arrays["label_weights"].sum() + 2 * len(examples)), \
        "some words have continuation pieces"
    np.testing.assert_allclose(loss, want, rtol=1e-5)


def test_qa_loss_is_start_end_cross_entropy_and_half_the_answerability_loss():
    """(CE(start) + CE(end)) / 2 + 0.5 * sigmoid CE(is_impossible) per window, the end logits
    conditioned on the gold start; `answerable_logits` > 0 means unanswerable."""
    rng = np.random.default_rng(3)
    ids, mask = _ids(rng, (6, 16))
    segments = (np.arange(16) >= 5).astype(np.int32) * mask
    impossible = np.array([0, 1, 0, 0, 1, 0], np.int32)
    starts = rng.integers(5, 8, 6) * (1 - impossible)
    ends = (starts + rng.integers(0, 2, 6)) * (1 - impossible)
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": segments,
         "start_positions": starts.astype(np.int32), "end_positions": ends.astype(np.int32),
         "is_impossible": impossible}
    head = _head("qa")
    assert head.answerable_weight == 0.5  # the authors' answerable_weight
    outputs, loss = _loss(head, f)
    rows = np.arange(6)
    start_ce = -_log_softmax(outputs["start_logits"])[rows, starts]
    end_ce = -_log_softmax(outputs["end_logits"])[rows, ends]
    x = outputs["answerable_logits"]
    sigmoid_ce = np.maximum(x, 0) - x * impossible + np.log1p(np.exp(-np.abs(x)))
    np.testing.assert_allclose(loss, (start_ce + end_ce) / 2 + 0.5 * sigmoid_ce, rtol=1e-5)
    # Without the classifier, the span loss alone.
    outputs, loss = _loss(_head("qa", answerable_classifier=False), f)
    assert "answerable_logits" not in outputs
    start_ce = -_log_softmax(outputs["start_logits"])[rows, starts]
    end_ce = -_log_softmax(outputs["end_logits"])[rows, ends]
    np.testing.assert_allclose(loss, (start_ce + end_ce) / 2, rtol=1e-5)


def test_multiple_choice_loss_is_cross_entropy_over_the_choices_present():
    rng = np.random.default_rng(4)
    ids, mask = _ids(rng, (5, 3, 12))
    ids[1, 2], mask[1, 2] = 0, 0  # example 1 has two choices
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
         "label": np.array([0, 1, 2, 1, 0], np.int32)}
    outputs, loss = _loss(_head("multiple_choice"), f)
    assert outputs["logits"].shape == (5, 3) and outputs["logits"][1, 2] < -500
    want = -_log_softmax(outputs["logits"])[np.arange(5), f["label"]]
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    two = -_log_softmax(outputs["logits"][1, :2])[1]  # the missing choice weighs nothing
    np.testing.assert_allclose(loss[1], two, rtol=1e-5)


def test_training_step_minimises_the_mean_loss_of_the_global_batch():
    """The loop's loss is the per-example losses summed over the global batch and divided by
    its size: a step over the whole set (any order) reports their NumPy mean."""
    from electra_tf.finetune.train_step import create_finetuning_optimizer, make_train_step

    rng = np.random.default_rng(5)
    ids, mask = _ids(rng, (8, 12))
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
         "label": rng.integers(0, 3, 8).astype(np.int32)}
    head = _head("classification")
    outputs, _ = _loss(head, f, training=True)
    want = np.mean(-_log_softmax(outputs["logits"])[np.arange(8), f["label"]])
    optimizer = create_finetuning_optimizer(FinetuningConfig(), 2, total_steps=10)
    for jit_compile in (False, True):  # the graph and the XLA-compiled step (weights unchanged:
        # the first update's learning rate is 0, the warmup's start)
        step, path = make_train_step(head, optimizer, tf.distribute.get_strategy(), f, batch=8,
                                     seed=0, jit_compile=jit_compile)
        assert path.jit_compile == jit_compile
        np.testing.assert_allclose(float(step()), want, rtol=1e-5)


# ---------------------------------------------------------------------------------------
# Weight decay on the real heads.
# ---------------------------------------------------------------------------------------


def _roles(head) -> dict:
    """Variable path -> "decay" / "no decay", from the Keras object that owns it: dense and
    einsum kernels and the embedding tables decay; LayerNorm scales and offsets and every bias
    do not (the authors' `optimization.py` excludes LayerNorm and bias)."""
    roles = {}
    for layer in head._flatten_layers(include_self=False):
        own = getattr(layer, "_trainable_variables", [])
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            roles.update({layer.kernel.path: "decay"})
            if layer.bias is not None:
                roles[layer.bias.path] = "no decay"
        elif isinstance(layer, keras.layers.LayerNormalization):
            roles.update({layer.gamma.path: "no decay", layer.beta.path: "no decay"})
        elif own:
            assert all(v.path.endswith("_embeddings") for v in own), [v.path for v in own]
            roles.update({v.path: "decay" for v in own})  # the word / position / segment tables
    return roles


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_weight_decay_on_every_kernel_and_embedding_and_no_norm_or_bias(name):
    """One step of the fine-tuning optimizer with zero gradients moves a variable by weight
    decay alone: the kernels and embeddings shrink, LayerNorm, biases and output biases stay."""
    from electra_tf.finetune.train_step import create_finetuning_optimizer

    head = _head(name)
    roles = _roles(head)
    assert set(roles) == {v.path for v in head.trainable_variables}, "every variable has a role"
    assert {"decay", "no decay"} == set(roles.values())
    rng = np.random.default_rng(6)
    for v in head.trainable_variables:  # away from 0 (biases) and 1 (LayerNorm scales)
        v.assign(rng.uniform(0.5, 1.5, v.shape).astype("float32"))
    before = {v.path: v.numpy() for v in head.trainable_variables}
    fc = FinetuningConfig(learning_rate=0.1, warmup_proportion=0.0, weight_decay=0.01)
    optimizer = create_finetuning_optimizer(fc, _config().num_layers, total_steps=100)
    optimizer.apply_gradients([(tf.zeros_like(v), v) for v in head.trainable_variables])
    for v in head.trainable_variables:
        ratio = v.numpy() / before[v.path]
        if roles[v.path] == "decay":  # w - lr * layer multiplier * 0.01 * w, every element alike
            assert ratio.max() < 1.0 and np.ptp(ratio) < 1e-5, v.path
        else:
            np.testing.assert_array_equal(v.numpy(), before[v.path], err_msg=v.path)


# ---------------------------------------------------------------------------------------
# The fine-tuned model's description.
# ---------------------------------------------------------------------------------------


def _saved(tmp_path, vocab_file):
    from electra_tf.finetune.saving import describe_finetuned, save_finetuned

    task = Task("mrpc_like", "classification", ("no", "yes"), "s1", "s2")
    head = get_family("classification").build_head(_config(), task, FinetuningConfig())
    model = describe_finetuned(head, task, FinetuningConfig(max_seq_length=16), lower_case=False,
                               epoch=1.0, metrics={"accuracy": 50.0}, seed=3)
    return head, save_finetuned(head, tmp_path / "best", model, vocab_file)


def test_head_config_round_trips_and_names_a_bad_field(tmp_path, vocab_file):
    head, folder = _saved(tmp_path, vocab_file)
    path = folder / "head_config.json"
    model = FinetunedModelConfig.from_json(path)
    assert (model.family, model.head, model.task, model.label_names, model.text_pair, model.lower_case,
            model.seed, model.qa) == ("classification", "SentenceClassifier", "mrpc_like", ("no", "yes"),
                                      True, False, 3, None)
    assert model.head_config == head.get_config() and model.version == 2
    original = json.loads(path.read_text())
    for field, value, message in [
        ("family", "ranking", "FinetunedModelConfig.family: must be one of"),
        ("max_seq_length", "16", "FinetunedModelConfig.max_seq_length: must be an integer"),
        ("label_names", ["a"], "FinetunedModelConfig.label_names: 1 names for num_labels 2"),
        ("label_names", ["a", "a"], r"FinetunedModelConfig.label_names: must be distinct \(\['a'\] repeated\)"),
        ("max_seq_length", 100_000, "FinetunedModelConfig.max_seq_length: 100000 is more than the model's "
                                    r"max_position_embeddings \(\d+\)"),
        ("qa", {"n_best_size": 0}, "field 'qa': QAOptions.n_best_size: must be >= 1"),
        ("colour", "red", r"unknown field\(s\) \['colour'\]"),
    ]:
        values = dict(original, **{field: value})
        path.write_text(json.dumps(values))
        with pytest.raises(ConfigError, match=message) as info:
            FinetunedModelConfig.from_json(path)
        assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)


def test_a_version_1_head_config_still_loads(tmp_path, vocab_file):
    """Written before the family had its name ("kind") and before lower_case and text_pair were
    recorded: loads, uncased, the pair question left to the exporter (the predefined task)."""
    from electra_tf.finetune.saving import load_finetuned

    head, folder = _saved(tmp_path, vocab_file)
    values = json.loads((folder / "head_config.json").read_text())
    values["kind"] = values.pop("family")
    values["version"] = 1
    for key in ("lower_case", "text_pair"):
        del values[key]
    (folder / "head_config.json").write_text(json.dumps(values))
    loaded, model, vocab = load_finetuned(tmp_path)
    assert (model.family, model.version, model.lower_case, model.text_pair) == ("classification", 1, True, None)
    # The exporter serves what the predefined task of that name reads (`tasks.takes_pairs`).
    assert not takes_pairs(model.task)  # "mrpc_like" is no predefined task
    assert takes_pairs("mrpc") and not takes_pairs("sst-2") and not takes_pairs(None)
    for a, b in zip(loaded.weights, head.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
