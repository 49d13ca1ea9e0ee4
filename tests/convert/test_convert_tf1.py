"""electra_tf/convert/tf1.py: the authors' name-based checkpoints <-> our Keras models."""

import math

import numpy as np
import pytest

import convert_fixtures as fx
from electra_tf import ElectraConfig
from electra_tf.convert import ConversionError, tf1
from electra_tf.convert.pretrained import load_pretrained

H, E, V, HEADS = fx.TINY["hidden"], fx.TINY["emb"], fx.TINY["vocab"], 2


def expected_disc_weights(disc, t):
    """(keras variable, expected value) pairs written out by hand from the TF1 tensors."""
    d = H // HEADS
    emb = disc.embeddings
    pairs = [(emb.word_embeddings, t["electra/embeddings/word_embeddings"]),
             (emb.position_embeddings, t["electra/embeddings/position_embeddings"]),
             (emb.token_type_embeddings, t["electra/embeddings/token_type_embeddings"]),
             (emb.layer_norm.gamma, t["electra/embeddings/LayerNorm/gamma"]),
             (emb.layer_norm.beta, t["electra/embeddings/LayerNorm/beta"]),
             (disc.embeddings_project.dense.kernel, t["electra/embeddings_project/kernel"]),
             (disc.embeddings_project.dense.bias, t["electra/embeddings_project/bias"])]
    for i, layer in enumerate(disc.encoder.layers):
        p = f"electra/encoder/layer_{i}"
        att = layer.attention
        for name, dense in (("query", att._query_dense), ("key", att._key_dense),
                            ("value", att._value_dense)):
            pairs.append((dense.kernel, t[f"{p}/attention/self/{name}/kernel"].reshape(H, HEADS, d)))
            pairs.append((dense.bias, t[f"{p}/attention/self/{name}/bias"].reshape(HEADS, d)))
        pairs += [
            (att._output_dense.kernel, t[f"{p}/attention/output/dense/kernel"].reshape(HEADS, d, H)),
            (att._output_dense.bias, t[f"{p}/attention/output/dense/bias"]),
            (layer.attention_layer_norm.gamma, t[f"{p}/attention/output/LayerNorm/gamma"]),
            (layer.attention_layer_norm.beta, t[f"{p}/attention/output/LayerNorm/beta"]),
            (layer.intermediate.kernel, t[f"{p}/intermediate/dense/kernel"]),
            (layer.intermediate.bias, t[f"{p}/intermediate/dense/bias"]),
            (layer.output_dense.kernel, t[f"{p}/output/dense/kernel"]),
            (layer.output_dense.bias, t[f"{p}/output/dense/bias"]),
            (layer.output_layer_norm.gamma, t[f"{p}/output/LayerNorm/gamma"]),
            (layer.output_layer_norm.beta, t[f"{p}/output/LayerNorm/beta"])]
    if disc.rtd_head is not None:
        pairs += [(disc.rtd_head.dense.kernel, t["discriminator_predictions/dense/kernel"]),
                  (disc.rtd_head.dense.bias, t["discriminator_predictions/dense/bias"]),
                  (disc.rtd_head.dense_1.kernel, t["discriminator_predictions/dense_1/kernel"]),
                  (disc.rtd_head.dense_1.bias, t["discriminator_predictions/dense_1/bias"])]
    return pairs


def assert_pairs(pairs):
    for variable, value in pairs:
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)


# --- import ----------------------------------------------------------------------------------------
def test_inferred_config_matches_the_checkpoint_shapes(tiny_ckpt):
    prefix, vocab = tf1.resolve_checkpoint(tiny_ckpt)
    assert prefix.endswith("model.ckpt-1000") and vocab.endswith("vocab.txt")
    c = tf1.infer_config(tf1.read_shapes(prefix), vocab)
    assert (c.vocab_size, c.embedding_size, c.hidden_size, c.num_layers, c.num_heads,
            c.intermediate_size, c.max_position_embeddings) == (V, E, H, 2, HEADS, 512, 64)
    assert (c.generator_hidden_size, c.generator_layers, c.embedding_sharing) == (0.5, 1.0, "embeddings")
    assert c.mask_token_id == 103 and c.generator_config().hidden_size == 64


def test_import_pretrainer_copies_every_tensor_and_ignores_training_state(tiny_ckpt, tiny_tensors):
    loaded = load_pretrained(tiny_ckpt, "pretrainer")
    p, t, report = loaded.model, tiny_tensors, loaded.report
    assert_pairs(expected_disc_weights(p.discriminator, t))
    gen = p.generator
    assert gen.embeddings is p.discriminator.embeddings  # shared `electra/embeddings`
    gen_layer = gen.encoder.layers[1]
    assert_pairs([
        (gen.embeddings_project.dense.kernel, t["generator/embeddings_project/kernel"]),
        (gen_layer.attention._query_dense.kernel,
         t["generator/encoder/layer_1/attention/self/query/kernel"].reshape(64, 1, 64)),
        (gen_layer.output_dense.kernel, t["generator/encoder/layer_1/output/dense/kernel"]),
        (gen.lm_head.dense.kernel, t["generator_predictions/dense/kernel"]),
        (gen.lm_head.layer_norm.gamma, t["generator_predictions/LayerNorm/gamma"]),
        (gen.lm_head.output_bias, t["generator_predictions/output_bias"])])
    assert len(report.mapped) == len(t) and not report.missing and not report.unknown
    ignored = dict(report.ignored)
    assert ignored["global_step"] == "global_step"
    assert ignored["electra/encoder/layer_0/intermediate/dense/kernel/adam_m"].startswith("optimizer")
    assert len(report.ignored) == 2 * len(t) + 1
    text = str(report)
    assert "mapped (82)" in text and "optimizer slot" in text and "missing (0)" in text


def test_import_discriminator_ignores_the_generator(tiny_ckpt, tiny_tensors):
    loaded = load_pretrained(tiny_ckpt, "discriminator")
    assert_pairs(expected_disc_weights(loaded.model, tiny_tensors))
    reasons = dict(loaded.report.ignored)
    assert reasons["generator/encoder/layer_0/output/dense/bias"].startswith("generator weight")
    assert reasons["generator_predictions/output_bias"].startswith("generator weight")


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def layer_norm(x, gamma, beta, eps=1e-12):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def reference_discriminator(t, ids, mask, segments, heads, layers=2):
    """The original BERT/ELECTRA forward pass in NumPy (float64), from the TF1 tensors."""
    t = {k: v.astype(np.float64) for k, v in t.items()}
    seq = ids.shape[1]
    x = (t["electra/embeddings/word_embeddings"][ids]
         + t["electra/embeddings/token_type_embeddings"][segments]
         + t["electra/embeddings/position_embeddings"][:seq])
    x = layer_norm(x, t["electra/embeddings/LayerNorm/gamma"], t["electra/embeddings/LayerNorm/beta"])
    x = x @ t["electra/embeddings_project/kernel"] + t["electra/embeddings_project/bias"]
    batch, _, hidden = x.shape
    d = hidden // heads
    adder = (1.0 - mask[:, None, None, :]) * -10000.0  # [batch, 1, 1, seq] over keys

    def split(y):  # [batch, seq, H] -> [batch, heads, seq, d]
        return y.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    for i in range(layers):
        p = f"electra/encoder/layer_{i}"
        q, k, v = (split(x @ t[f"{p}/attention/self/{n}/kernel"] + t[f"{p}/attention/self/{n}/bias"])
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + adder
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        attended = context @ t[f"{p}/attention/output/dense/kernel"] + t[f"{p}/attention/output/dense/bias"]
        x = layer_norm(x + attended, t[f"{p}/attention/output/LayerNorm/gamma"],
                       t[f"{p}/attention/output/LayerNorm/beta"])
        inner = gelu(x @ t[f"{p}/intermediate/dense/kernel"] + t[f"{p}/intermediate/dense/bias"])
        out = inner @ t[f"{p}/output/dense/kernel"] + t[f"{p}/output/dense/bias"]
        x = layer_norm(x + out, t[f"{p}/output/LayerNorm/gamma"], t[f"{p}/output/LayerNorm/beta"])
    h = gelu(x @ t["discriminator_predictions/dense/kernel"] + t["discriminator_predictions/dense/bias"])
    logits = (h @ t["discriminator_predictions/dense_1/kernel"]
              + t["discriminator_predictions/dense_1/bias"])[..., 0]
    return x, logits


def test_imported_discriminator_matches_numpy_reference(tiny_ckpt, tiny_tensors):
    disc = load_pretrained(tiny_ckpt, "discriminator").model
    rng = np.random.default_rng(1)
    ids = rng.integers(0, V, size=(2, 10)).astype(np.int32)
    mask = np.ones((2, 10), np.int32)
    mask[1, 6:] = 0  # padding in the second sequence
    segments = np.zeros((2, 10), np.int32)
    segments[:, 5:] = 1
    out = disc({"input_ids": ids, "input_mask": mask, "segment_ids": segments}, training=False)
    seq_ref, logits_ref = reference_discriminator(tiny_tensors, ids, mask.astype(np.float64),
                                                  segments, HEADS)
    np.testing.assert_allclose(out["sequence_output"].numpy(), seq_ref, atol=1e-5)
    np.testing.assert_allclose(out["rtd_logits"].numpy(), logits_ref, atol=1e-5)
    np.testing.assert_allclose(out["cls_output"].numpy(), seq_ref[:, 0], atol=1e-5)


# --- export ----------------------------------------------------------------------------------------
def test_export_writes_exactly_the_released_names_and_round_trips(tiny_ckpt, tiny_tensors, tmp_path):
    loaded = load_pretrained(tiny_ckpt, "pretrainer")
    prefix, report = tf1.export_tf1(loaded.model, tmp_path / "out", vocab_file=loaded.vocab_path,
                                    global_step=7)
    import tensorflow as tf
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    assert set(shapes) == set(tiny_tensors) | {"global_step"}
    for name, value in tiny_tensors.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)
    assert reader.get_tensor("global_step") == 7
    assert len(report.mapped) == len(tiny_tensors)
    assert (tmp_path / "out" / "vocab.txt").read_text() == (tiny_ckpt / "vocab.txt").read_text()
    again = load_pretrained(tmp_path / "out", "pretrainer")
    for a, b in zip(loaded.model.weights, again.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


# --- other released layouts -------------------------------------------------------------------------
def test_small_plus_plus_layout_generator_same_size(tmp_path):
    t = fx.random_tensors(fx.released_shapes(**fx.TINY, gen_hidden=H, gen_layers=2), seed=3)
    fx.write_tf1(tmp_path, t)
    loaded = load_pretrained(tmp_path, "pretrainer")
    assert loaded.config.generator_hidden_size == 1.0
    gen = loaded.model.generator
    assert gen.encoder is not loaded.model.discriminator.encoder
    np.testing.assert_array_equal(
        gen.encoder.layers[0].attention._key_dense.kernel.numpy(),
        t["generator/encoder/layer_0/attention/self/key/kernel"].reshape(H, HEADS, H // HEADS))
    np.testing.assert_array_equal(gen.embeddings_project.dense.kernel.numpy(),
                                  t["generator/embeddings_project/kernel"])
    assert len(loaded.report.mapped) == len(t)


def test_untied_generator_embeddings_layout(tmp_path):
    # E = generator hidden (64): the untied generator has no projection, like the original.
    t = fx.random_tensors(fx.released_shapes(**{**fx.TINY, "emb": 64}, gen_hidden=64, gen_layers=2,
                                             sharing="untied"), seed=4)
    fx.write_tf1(tmp_path / "a", t)
    loaded = load_pretrained(tmp_path / "a", "pretrainer")
    assert loaded.config.embedding_sharing == "untied"
    gen, disc = loaded.model.generator, loaded.model.discriminator
    assert gen.embeddings is not disc.embeddings and gen.embeddings_project is None
    np.testing.assert_array_equal(gen.embeddings.word_embeddings.numpy(),
                                  t["generator/embeddings/word_embeddings"])
    np.testing.assert_array_equal(disc.embeddings.word_embeddings.numpy(),
                                  t["electra/embeddings/word_embeddings"])
    prefix, _ = tf1.export_tf1(loaded.model, tmp_path / "out")
    assert set(tf1.read_shapes(prefix)) == set(t) | {"global_step"}


def test_untied_generator_with_narrower_embeddings_loads_alone(tmp_path):
    # E = 32 but the original's untied generator tables are 64 wide (its hidden size).
    t = fx.random_tensors(fx.released_shapes(**fx.TINY, gen_hidden=64, gen_layers=2,
                                             sharing="untied"), seed=5)
    fx.write_tf1(tmp_path, t)
    gen = load_pretrained(tmp_path, "generator").model
    assert gen.config.embedding_size == 64 and gen.embeddings_project is None
    np.testing.assert_array_equal(gen.lm_head.dense.kernel.numpy(), t["generator_predictions/dense/kernel"])
    with pytest.raises(ConversionError, match="untied generator embeddings"):
        load_pretrained(tmp_path, "pretrainer")


def test_all_weights_tied_layout(tmp_path):
    t = fx.random_tensors(fx.released_shapes(**fx.TINY, sharing="all"), seed=6)
    assert not any(n.startswith("generator/") for n in t)
    fx.write_tf1(tmp_path, t)
    loaded = load_pretrained(tmp_path, "pretrainer")
    assert loaded.config.embedding_sharing == "all"
    assert loaded.model.generator.encoder is loaded.model.discriminator.encoder
    np.testing.assert_array_equal(loaded.model.generator.lm_head.dense.kernel.numpy(),
                                  t["generator_predictions/dense/kernel"])
    gen = load_pretrained(tmp_path, "generator").model  # standalone: reads the `electra` network
    np.testing.assert_array_equal(gen.encoder.layers[1].output_dense.bias.numpy(),
                                  t["electra/encoder/layer_1/output/dense/bias"])


# --- errors ----------------------------------------------------------------------------------------
def test_missing_variable_is_named(tmp_path, tiny_tensors):
    t = dict(tiny_tensors)
    del t["electra/encoder/layer_1/output/dense/bias"]
    fx.write_tf1(tmp_path, t)
    with pytest.raises(ConversionError, match=r"missing.*electra/encoder/layer_1/output/dense/bias \[128\]"):
        load_pretrained(tmp_path, "discriminator")


def test_unknown_variable_is_named_unless_allowed(tmp_path, tiny_tensors):
    t = {**tiny_tensors, "electra/encoder/layer_0/mystery": np.zeros((3,), np.float32),
         "task_specific/mnli/kernel": np.zeros((128, 3), np.float32)}
    fx.write_tf1(tmp_path, t)
    with pytest.raises(ConversionError, match="unknown.*electra/encoder/layer_0/mystery") as err:
        load_pretrained(tmp_path, "pretrainer")
    assert "task_specific" not in str(err.value)  # fine-tuning heads are ignored, not unknown
    loaded = load_pretrained(tmp_path, "pretrainer", allow_unknown=True)
    assert [n for n, _ in loaded.report.unknown] == ["electra/encoder/layer_0/mystery"]
    assert ("task_specific/mnli/kernel", "fine-tuning head (task_specific/)") in loaded.report.ignored


def test_wrong_shape_names_variable_and_both_shapes(tmp_path, tiny_tensors):
    t = {**tiny_tensors, "electra/encoder/layer_1/intermediate/dense/kernel":
         np.zeros((128, 500), np.float32)}
    fx.write_tf1(tmp_path, t)
    with pytest.raises(ConversionError,
                       match=r"electra/encoder/layer_1/intermediate/dense/kernel: checkpoint shape "
                             r"\[128, 500\].*needs \[128, 512\]"):
        load_pretrained(tmp_path, "discriminator")


def test_wrong_vocab_size_is_an_error(tiny_ckpt, tmp_path, tiny_tensors):
    config = tf1.infer_config(tf1.read_shapes(tf1.resolve_checkpoint(tiny_ckpt)[0]))
    with pytest.raises(ConversionError, match="vocabulary size mismatch.*120.*112"):
        load_pretrained(tiny_ckpt, "discriminator", config=config.replace(vocab_size=120))
    from electra_tf.models import Discriminator
    with pytest.raises(ConversionError, match="vocabulary size mismatch"):
        tf1.load_tf1(Discriminator(config.replace(vocab_size=120)), tiny_ckpt)
    fx.write_tf1(tmp_path, tiny_tensors)
    fx.write_vocab(tmp_path / "vocab.txt", 120)  # vocab.txt disagrees with the checkpoint
    with pytest.raises(ConversionError, match="vocab.txt has 120 tokens.*112"):
        load_pretrained(tmp_path, "discriminator")


def test_failed_load_leaves_model_untouched(tmp_path, tiny_tensors):
    from electra_tf.models import Discriminator
    t = dict(tiny_tensors)
    del t["electra/encoder/layer_1/output/dense/bias"]
    fx.write_tf1(tmp_path, t)
    disc = Discriminator(ElectraConfig(vocab_size=V, embedding_size=E, hidden_size=H, num_layers=2,
                                       num_heads=HEADS, intermediate_size=512,
                                       max_position_embeddings=64))
    before = disc.embeddings.word_embeddings.numpy().copy()
    with pytest.raises(ConversionError):
        tf1.load_tf1(disc, tmp_path)
    np.testing.assert_array_equal(disc.embeddings.word_embeddings.numpy(), before)


@pytest.mark.slow
def test_full_small_checkpoint_with_training_state(tmp_path):
    shapes = fx.released_shapes(vocab=30522, emb=128, hidden=256, layers=12, ffn=1024, max_pos=512,
                                gen_hidden=64, gen_layers=12)
    t = fx.random_tensors(shapes, seed=7)
    fx.write_tf1(tmp_path / "electra_small", fx.with_training_state(t, step=1_000_000),
                 vocab_size=30522)
    loaded = load_pretrained(tmp_path / "electra_small", "pretrainer")
    small = ElectraConfig.from_json("electra_small")
    for field in ("vocab_size", "embedding_size", "hidden_size", "num_layers", "num_heads",
                  "intermediate_size", "generator_hidden_size", "embedding_sharing"):
        assert getattr(loaded.config, field) == getattr(small, field), field
    assert len(loaded.report.mapped) == len(t) and len(loaded.report.ignored) == 2 * len(t) + 1
    disc = loaded.model.discriminator
    np.testing.assert_array_equal(
        disc.encoder.layers[11].attention._output_dense.kernel.numpy(),
        t["electra/encoder/layer_11/attention/output/dense/kernel"].reshape(4, 64, 256))
    prefix, _ = tf1.export_tf1(loaded.model, tmp_path / "out")
    assert tf1.read_shapes(prefix) == {**shapes, "global_step": ()}
