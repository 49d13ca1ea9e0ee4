"""Electric checkpoints <-> the authors' TF1 names (`run_pretraining.py` with electric_objective).

Scopes there: the discriminator `electra/` (+ `discriminator_predictions/`), the two towers of
`TwoTowerClozeTransformer` `generator_ltr/` and `generator_rtl/` (each its own
`embeddings_project`; both read `electra/embeddings`, or with untied generator embeddings their
own `<tower>/embeddings`), and the head `cloze_predictions/`.
"""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.convert import tf1
from electra_tf.convert.common import ConversionError
from electra_tf.models import ElectraPretrainer

VOCAB = 128


def electric_config(**changes):
    values = dict(vocab_size=VOCAB, objective="electric", generator_hidden_size=0.25,
                  hidden_dropout=0.0, attention_dropout=0.0)
    return ElectraConfig.from_json("electra_tiny").replace(**{**values, **changes})


def features():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, VOCAB, size=(3, 16)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101 % VOCAB, 102 % VOCAB
    mask = np.ones_like(ids)
    mask[2, 10:] = 0
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask),
            "segment_ids": tf.zeros_like(tf.constant(ids))}


def tower_names(sharing_scope):
    names = {f"{sharing_scope}/embeddings/word_embeddings"}
    for tower in ("generator_ltr", "generator_rtl"):
        names |= {f"{tower}/encoder/layer_{i}/attention/self/query/kernel" for i in range(2)}
        names.add(f"{tower}/encoder/layer_1/output/LayerNorm/gamma")
    return names


@pytest.mark.parametrize("sharing", ["embeddings", "untied"])
def test_round_trip_through_the_authors_names(tmp_path, sharing):
    config = electric_config(embedding_sharing=sharing)
    model = ElectraPretrainer(config, seed=2)
    prefix, report = tf1.export_tf1(model, tmp_path / "tf1")
    names = {name for _, name, _ in report.mapped}
    shapes = tf1.read_shapes(prefix)
    assert set(shapes) == names | {"global_step"}
    scopes = {n.split("/")[0] for n in names}
    assert scopes == {"electra", "discriminator_predictions", "generator_ltr", "generator_rtl",
                      "cloze_predictions"}
    assert {"cloze_predictions/dense/kernel", "cloze_predictions/LayerNorm/gamma",
            "cloze_predictions/output_bias"} <= names
    h = config.generator_config().hidden_size  # 16
    if sharing == "embeddings":
        assert tower_names("electra") <= names
        assert not any(n.startswith(("generator_ltr/embeddings/", "generator_rtl/embeddings/"))
                       for n in names)
        # E = 32 != 16: each tower projects the shared embeddings itself.
        assert shapes["generator_ltr/embeddings_project/kernel"] == (32, h)
        assert shapes["generator_rtl/embeddings_project/kernel"] == (32, h)
        assert shapes["cloze_predictions/dense/kernel"] == (2 * h, 32)
    else:
        for tower in ("generator_ltr", "generator_rtl"):
            assert tower_names(tower) <= names
            assert shapes[f"{tower}/embeddings/word_embeddings"] == (VOCAB, h)
        assert shapes["cloze_predictions/dense/kernel"] == (2 * h, h)

    loaded, loaded_config, back, _ = tf1.load_tf1_model(tmp_path / "tf1", network="pretrainer",
                                                        config=config)
    assert back.counts() == {"mapped": len(names), "ignored": 1, "missing": 0, "unknown": 0}
    assert loaded_config == config
    seed = tf.constant([1, 2])
    a = model.compute_objective(features(), seed, training=False)
    b = loaded.compute_objective(features(), seed, training=False)
    for key in ("loss", "cloze_logits", "energy", "rtd_logits"):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


def test_config_inferred_from_an_electric_checkpoint(tmp_path):
    config = electric_config(embedding_sharing="untied")
    tf1.export_tf1(ElectraPretrainer(config), tmp_path)
    inferred = tf1.infer_config(tf1.read_shapes(tf1.resolve_checkpoint(tmp_path)[0]))
    assert inferred.objective == "electric"
    assert inferred.embedding_sharing == "untied"
    assert inferred.generator_config().hidden_size == 16
    assert inferred.generator_config().num_layers == 2


def test_the_discriminator_alone_loads_and_generator_network_is_refused(tmp_path):
    config = electric_config()
    model = ElectraPretrainer(config)
    tf1.export_tf1(model, tmp_path)
    disc, _, report, _ = tf1.load_tf1_model(tmp_path, network="discriminator", config=config)
    reasons = {reason for _, reason in report.ignored}
    assert reasons == {"generator weight (loading the discriminator)", "global_step"}
    assert {name for name, _ in report.ignored} >= {"cloze_predictions/output_bias",
                                                    "generator_rtl/embeddings_project/kernel"}
    out = disc(features(), training=False)["rtd_logits"].numpy()
    want = model.discriminator(features(), training=False)["rtd_logits"].numpy()
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ConversionError, match="network='pretrainer'"):
        tf1.load_tf1_model(tmp_path, network="generator", config=config)


def test_an_electric_checkpoint_does_not_load_into_an_electra_pretrainer(tmp_path):
    tf1.export_tf1(ElectraPretrainer(electric_config()), tmp_path)
    with pytest.raises(ConversionError, match="missing|unknown"):
        tf1.load_tf1_model(tmp_path, network="pretrainer",
                           config=electric_config(objective="electra"))


def test_electra_tf_format_round_trip_and_hugging_face_refuses_the_generator(tmp_path):
    from electra_tf.convert import hf
    from electra_tf.convert.pretrained import load_pretrained, save_electra_checkpoint

    config = electric_config()
    model = ElectraPretrainer(config, seed=1)
    save_electra_checkpoint(model, config, tmp_path / "ours")
    loaded = load_pretrained(tmp_path / "ours", network="pretrainer").model
    seed = tf.constant([2, 2])
    a = model.compute_objective(features(), seed, training=False)
    b = loaded.compute_objective(features(), seed, training=False)
    np.testing.assert_array_equal(a["cloze_logits"].numpy(), b["cloze_logits"].numpy())
    np.testing.assert_array_equal(a["rtd_logits"].numpy(), b["rtd_logits"].numpy())
    with pytest.raises(ConversionError, match="network='discriminator'"):
        hf.export_hf(model, tmp_path / "hf")
