"""Keras-native saving: `model.save("x.keras")` then `keras.saving.load_model` gives the same model.

Loads use Keras' defaults (`safe_mode=True`, no `custom_objects`): the classes are found through
their registration, which importing `electra_tf.models` performs. The fresh-process test checks
that nothing else is needed.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import untuned
from electra_tf.models import (
    Discriminator, ElectraPretrainer, EmbeddingProjection, Embeddings, Encoder, Generator,
    MaskedLMHead, ReplacedTokenDetectionHead, TransformerLayer)
from electra_tf.models.encoder import SelfAttention, activation
from electra_tf.training.optimizer import create_optimizer

VOCAB = 512


def tiny(**changes):
    return ElectraConfig.from_json("electra_tiny").replace(vocab_size=VOCAB, **changes)


def features(batch=3, seq=12, seed=0):
    """Random ids with a padded row and two segments: every input path is exercised."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(200, VOCAB, (batch, seq)).astype(np.int32)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1, seq - 4:] = 0
    segments = np.zeros_like(ids)
    segments[:, seq // 2:] = 1
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "segment_ids": tf.constant(segments)}


def save_and_load(model, folder):
    path = folder / f"{model.name}.keras"
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        config = archive.read("config.json").decode()
    assert "__lambda__" not in config  # a lambda would need safe_mode=False to load
    assert '"registered_name": "electra_tf>' in config
    return keras.saving.load_model(path)


def assert_same_outputs(want, got):
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)


def assert_other_init_differs(model, inputs, key):
    """A fresh model of the same config gives other outputs: equality above is the weights'."""
    fresh = type(model).from_config(model.get_config())
    assert not np.allclose(fresh(inputs)[key], model(inputs)[key])


@pytest.mark.parametrize("make", [
    lambda c: Embeddings(c),
    lambda c: TransformerLayer(c, name="layer_0"),
    lambda c: Encoder(c),
    lambda c: EmbeddingProjection(c),
    lambda c: MaskedLMHead(c),
    lambda c: ReplacedTokenDetectionHead(c),
    lambda c: SelfAttention(num_heads=2, key_dim=32),
], ids=["Embeddings", "TransformerLayer", "Encoder", "EmbeddingProjection", "MaskedLMHead",
        "ReplacedTokenDetectionHead", "SelfAttention"])
def test_every_layer_is_registered_and_round_trips_its_config(make):
    layer = make(tiny())
    assert keras.saving.get_registered_name(type(layer)) == f"electra_tf>{type(layer).__name__}"
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is type(layer) and clone.get_config() == layer.get_config()
    json.dumps(layer.get_config())  # nested configs (ElectraConfig, dtype policy) are plain JSON


def test_activations_are_named_functions():
    for name in ("gelu", "gelu_approximate"):
        assert keras.saving.get_registered_name(activation(name)) == f"electra_tf>{name}"
    dense = TransformerLayer(tiny()).intermediate
    config = keras.saving.serialize_keras_object(dense)
    assert config["config"]["activation"]["config"] == "electra_tf>gelu"
    clone = keras.saving.deserialize_keras_object(config)  # safe_mode: no lambda to refuse
    x = tf.constant([-1.0, 0.5, 2.0])
    assert clone.activation is activation("gelu")
    np.testing.assert_allclose(clone.activation(x), 0.5 * x * (1 + tf.math.erf(x / np.sqrt(2.0))),
                               rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda c: Discriminator(c),
    lambda c: Discriminator(c, rtd_head=False),
    lambda c: Discriminator(c, mlm_head=True),
    lambda c: Generator(c.generator_config()),
    # Saved alone, a generator sharing the discriminator's embeddings comes back with its own
    # copy of them, holding the same values.
    lambda c: Generator(c.generator_config(), embeddings=Discriminator(c).embeddings),
], ids=["discriminator", "encoder_only", "discriminator_mlm", "generator", "generator_shared"])
def test_discriminator_and_generator_load_with_identical_outputs(make, tmp_path):
    model = make(tiny())
    inputs = features()
    loaded = save_and_load(model, tmp_path)
    assert type(loaded) is type(model) and loaded.get_config() == model.get_config()
    # Same variables in the same order (the shared embeddings' paths start with the model that
    # made them, `discriminator/`, in the original: compare what follows).
    assert [v.path.split("/", 1)[1] for v in loaded.weights] == [
        v.path.split("/", 1)[1] for v in model.weights]
    assert_same_outputs(model(inputs), loaded(inputs))
    if isinstance(model, Generator):
        positions = tf.constant([[1, 2], [3, 4], [5, 9]])
        assert_same_outputs(model(inputs, positions=positions), loaded(inputs, positions=positions))
    assert_other_init_differs(model, inputs, "sequence_output")


@pytest.mark.parametrize("changes", [
    {},
    {"embedding_sharing": "untied"},
    {"embedding_sharing": "all", "generator_hidden_size": 1.0},
    {"objective": "all_tokens_mlm"},
], ids=["electra", "untied", "all_tied", "all_tokens_mlm"])
def test_pretrainer_loads_with_identical_objective(changes, tmp_path):
    pretrainer = ElectraPretrainer(tiny(**changes), seed=7)
    loaded = save_and_load(pretrainer, tmp_path)
    assert loaded.get_config() == pretrainer.get_config() and loaded.seed == 7
    # The sharing between generator and discriminator is rebuilt, not two copies.
    shared = pretrainer.generator.embeddings is pretrainer.discriminator.embeddings
    assert (loaded.generator.embeddings is loaded.discriminator.embeddings) == shared
    assert len(loaded.weights) == len(pretrainer.weights)
    inputs, seed = features(4, 16), tf.constant([7, 3], tf.int64)
    want = pretrainer.compute_objective(inputs, seed, training=False)
    got = loaded.compute_objective(inputs, seed, training=False)
    assert_same_outputs(want["masked"]._asdict(), got["masked"]._asdict())
    assert_same_outputs({k: v for k, v in want.items() if k != "masked"},
                        {k: v for k, v in got.items() if k != "masked"})
    fresh = ElectraPretrainer(tiny(**changes), seed=7)
    fresh_loss = fresh.compute_objective(inputs, seed, training=False)["loss"]
    assert float(fresh_loss) != float(want["loss"])


@pytest.mark.slow  # traces fit twice (~12 s alone, ~25 s on a loaded 2-core machine)
def test_compiled_pretrainer_resumes_fit_after_loading(tmp_path):
    """The optimizer (the project's AdamW with its schedule) and its step come back: the next
    step of the loaded model is the next step of the original (dropout off: no random state)."""
    config = tiny(hidden_dropout=0.0, attention_dropout=0.0)
    rng = np.random.default_rng(0)
    ids = rng.integers(200, 260, (16, 24)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    data = tf.data.Dataset.from_tensor_slices(
        {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)})
    data = untuned(data.repeat().batch(8))  # see pipeline.untuned
    pretrainer = ElectraPretrainer(config, seed=2)
    pretrainer.compile(optimizer=create_optimizer("adamw", 1e-3, num_train_steps=10,
                                                  num_warmup_steps=2))
    pretrainer.fit(data, steps_per_epoch=2, verbose=0)
    loaded = save_and_load(pretrainer, tmp_path)
    assert type(loaded.optimizer) is type(pretrainer.optimizer)
    assert int(loaded.optimizer.iterations) == 2
    for a, b in zip(pretrainer.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    got = loaded.fit(data, steps_per_epoch=1, verbose=0).history
    want = pretrainer.fit(data, steps_per_epoch=1, verbose=0).history
    assert set(got) == set(want)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    for a, b in zip(pretrainer.trainable_variables, loaded.trainable_variables):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-7, err_msg=a.path)


def test_a_fresh_process_loads_with_only_the_package_imported(tmp_path):
    """A new Python process that imports `electra_tf.keras_objects` (which registers the models,
    the fine-tuning heads and the optimizers) loads them: no `custom_objects`, no
    `safe_mode=False`. `electra_tf.models` alone imports nothing above it (heads, training)."""
    from electra_tf.finetune.heads import SentenceClassifier

    config = tiny()
    inputs = features()
    models = {"discriminator": Discriminator(config),
              "classifier": SentenceClassifier(config, num_labels=3, task_name="t")}
    want = {}
    for name, model in models.items():
        model.save(tmp_path / f"{name}.keras")
        want.update({f"{name}/{k}": np.asarray(v) for k, v in model(inputs).items()})
    np.savez(tmp_path / "inputs.npz", **{k: np.asarray(v) for k, v in inputs.items()})
    script = textwrap.dedent(f"""
        import sys
        import keras
        import numpy as np
        import electra_tf.models  # noqa: F401
        above = sorted(m for m in sys.modules if m.startswith(("electra_tf.finetune",
                                                               "electra_tf.training")))
        assert not above, above
        import electra_tf.keras_objects  # noqa: F401 (registration)

        folder = {str(tmp_path)!r}
        inputs = dict(np.load(folder + "/inputs.npz"))
        got = {{}}
        for name in {sorted(models)!r}:
            model = keras.saving.load_model(f"{{folder}}/{{name}}.keras")
            print(name, type(model).__name__, file=sys.stderr)
            got.update({{f"{{name}}/{{k}}": np.asarray(v) for k, v in model(inputs).items()}})
        np.savez(folder + "/got.npz", **got)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "discriminator Discriminator" in result.stderr
    assert "classifier SentenceClassifier" in result.stderr
    got = dict(np.load(tmp_path / "got.npz"))
    assert_same_outputs(want, got)
