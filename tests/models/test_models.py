"""Architecture: sizes, outputs, weight sharing, serialisation."""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.models import Discriminator, ElectraPretrainer, Generator, dummy_inputs


def released_discriminator_params(c: ElectraConfig) -> int:
    """Parameter count from the released checkpoints' variable shapes."""
    V, E, H, F, L = c.vocab_size, c.embedding_size, c.hidden_size, c.intermediate_size, c.num_layers
    embeddings = V * E + c.max_position_embeddings * E + c.type_vocab_size * E + 2 * E
    project = E * H + H if E != H else 0
    layer = 4 * (H * H + H) + 2 * H + (H * F + F) + (F * H + H) + 2 * H
    head = H * H + H + H + 1
    return embeddings + project + L * layer + head


@pytest.mark.parametrize("name,paper", [
    ("electra_small", 14e6), ("electra_base", 110e6),
    pytest.param("electra_large", 335e6, marks=pytest.mark.slow)])
def test_parameter_counts(name, paper):
    c = ElectraConfig.from_json(name)
    disc = Discriminator(c)
    assert disc.count_params() == released_discriminator_params(c)
    if name == "electra_small":
        # The released Small discriminator has 13.55M weights; the paper's "14M" is that rounded
        # (with the generator's own layers it is 14.2M). Both within 3.5% of 14M.
        gen = Generator(c.generator_config(), embeddings=disc.embeddings)
        own_gen = sum(int(np.prod(w.shape)) for w in gen.weights
                      if not w.path.startswith("discriminator/"))
        assert abs(disc.count_params() - paper) / paper < 0.035
        assert abs(disc.count_params() + own_gen - paper) / paper < 0.03
    else:
        assert abs(disc.count_params() - paper) / paper < 0.03


def test_output_shapes_and_cls_state():
    c = ElectraConfig.from_json("electra_tiny")
    disc = Discriminator(c)
    out = disc(dummy_inputs(3, 10))
    assert out["sequence_output"].shape == (3, 10, c.hidden_size)
    assert out["rtd_logits"].shape == (3, 10)
    np.testing.assert_array_equal(out["cls_output"], out["sequence_output"][:, 0])
    gen = Generator(c.generator_config(), embeddings=disc.embeddings)
    assert gen(dummy_inputs(3, 10))["mlm_logits"].shape == (3, 10, c.vocab_size)
    positions = tf.constant([[1, 2], [3, 4], [0, 9]])
    assert gen(dummy_inputs(3, 10), positions=positions)["mlm_logits"].shape == (3, 2, c.vocab_size)
    encoder_only = Discriminator(c, rtd_head=False)
    assert "rtd_logits" not in encoder_only(dummy_inputs(1, 4))


def test_padding_does_not_change_real_positions():
    disc = Discriminator(ElectraConfig.from_json("electra_tiny"))
    ids = tf.constant([[101, 2000, 2001, 102, 0, 0]])
    short = {"input_ids": ids[:, :4], "input_mask": tf.ones((1, 4), tf.int32)}
    padded = {"input_ids": ids, "input_mask": tf.constant([[1, 1, 1, 1, 0, 0]])}
    np.testing.assert_allclose(disc(short)["sequence_output"],
                               disc(padded)["sequence_output"][:, :4], atol=1e-5)


def test_exact_gelu_and_layer_norm_epsilon():
    disc = Discriminator(ElectraConfig.from_json("electra_tiny"))
    layer = disc.encoder.layers[0]
    assert layer.attention_layer_norm.epsilon == 1e-12
    x = tf.constant([-1.0, 0.5, 2.0])
    erf_gelu = 0.5 * x * (1 + tf.math.erf(x / np.sqrt(2)))
    np.testing.assert_allclose(layer.intermediate.activation(x), erf_gelu, rtol=1e-6)
    init = disc.encoder.layers[0].intermediate.kernel.numpy()
    assert abs(init.std() - 0.02 * 0.88) < 0.002 and np.abs(init).max() <= 0.04  # truncated at 2 sd


@pytest.mark.parametrize("sharing", ["embeddings", "untied", "all"])
def test_embedding_sharing_modes(sharing):
    gen_size = 1.0 if sharing == "all" else 0.5
    c = ElectraConfig.from_json("electra_tiny").replace(embedding_sharing=sharing,
                                                        generator_hidden_size=gen_size)
    p = ElectraPretrainer(c)
    disc_vars = {id(v) for v in p.discriminator.weights}
    shared = [v for v in p.generator.weights if id(v) in disc_vars]
    if sharing == "embeddings":
        assert {v.path.split("/")[-1] for v in shared} == {
            "word_embeddings", "position_embeddings", "token_type_embeddings", "gamma", "beta"}
    elif sharing == "untied":
        assert shared == []
    else:  # every weight but the generator's own MLM head
        head = {id(v) for v in p.generator.lm_head.weights}
        assert all(id(v) in disc_vars or id(v) in head for v in p.generator.weights)
        assert p.generator.encoder is p.discriminator.encoder
    names = [v.path for v in p.weights]
    assert len(names) == len(set(names)), "duplicate variable paths break checkpoints"


def test_config_round_trip_and_checkpoint_restore(tmp_path):
    c = ElectraConfig.from_json("electra_tiny")
    disc = Discriminator(c, name="discriminator")
    clone = Discriminator.from_config(disc.get_config())
    assert clone.config == c and len(clone.weights) == len(disc.weights)
    pretrainer = ElectraPretrainer.from_config(ElectraPretrainer(c, seed=3).get_config())
    assert pretrainer.config == c and pretrainer.seed == 3

    inputs = dummy_inputs(2, 12)
    path = tf.train.Checkpoint(model=disc).save(str(tmp_path / "ckpt"))
    restored = Discriminator(c)
    assert not np.allclose(restored(inputs)["rtd_logits"], disc(inputs)["rtd_logits"])
    tf.train.Checkpoint(model=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored(inputs)["rtd_logits"], disc(inputs)["rtd_logits"])


def test_self_attention_computes_what_keras_multi_head_attention_does():
    """Same weights, same outputs: the fused QKV path is an optimisation, not a new model."""
    import keras

    from electra_tf.models.encoder import SelfAttention

    ours = SelfAttention(num_heads=3, key_dim=20)  # 1/sqrt(20) is not a power of two
    ours.build((None, None, 48), (None, None, 48))
    keras_mha = keras.layers.MultiHeadAttention(num_heads=3, key_dim=20)
    keras_mha.build((None, None, 48), (None, None, 48))
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.3, w.shape).astype(np.float32) for w in ours.get_weights()]
    ours.set_weights(weights)
    keras_mha.set_weights(weights)  # biases included: they are random here, not zero
    x = tf.constant(rng.normal(size=(3, 9, 48)), tf.float32)
    mask = np.ones((3, 9), np.int32)
    mask[1, 5:], mask[2, 2:] = 0, 0
    got = ours(x, tf.constant(mask)).numpy()
    want = keras_mha(x, x, attention_mask=mask[:, None, :].astype(bool)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch, seq", [(1, 9), (3, 30)])  # rows below / above EIGEN_ATTENTION_ROWS
def test_inference_forms_of_self_attention_compute_the_training_form(batch, seq):
    """Inference takes Eigen's kernels for short requests and, inside `export_weights`
    (exports), one fused Q/K/V variable: both are speed-ups of the same function."""
    from electra_tf.models import encoder

    assert (batch * seq <= encoder.EIGEN_ATTENTION_ROWS) == (batch == 1)
    layer = encoder.SelfAttention(num_heads=4, key_dim=16)
    layer.build((None, None, 64), (None, None, 64))
    rng = np.random.default_rng(1)
    layer.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32) for w in layer.get_weights()])
    x = tf.constant(rng.normal(size=(batch, seq, 64)), tf.float32)
    mask = np.ones((batch, seq), np.int32)
    mask[-1, seq // 2:] = 0
    mask = tf.constant(mask)
    infer = tf.function(lambda x: layer(x, mask, training=False))
    training_form = layer(x, mask, training=True).numpy()  # no dropout in this layer
    for got in (infer(x), layer(x, mask, training=False)):
        np.testing.assert_allclose(got.numpy(), training_form, rtol=1e-5, atol=1e-5)
    graph = infer.get_concrete_function(x).graph.as_graph_def()
    ops = {node.op for f in graph.library.function for node in f.node_def}
    assert {"BatchMatMulV3", "BatchMatMulV2", "Bitcast"} <= ops  # both kernel sets, chosen at run time

    with encoder.export_weights(layer):
        fused = tf.function(lambda x: layer(x, mask, training=False))
        fused_graph = fused.get_concrete_function(x).graph
        got = fused(x).numpy()
        np.testing.assert_array_equal(layer(x, mask, training=True).numpy(), training_form)
    np.testing.assert_allclose(got, training_form, rtol=1e-5, atol=1e-5)
    assert "ConcatV2" not in {op.type for op in fused_graph.get_operations()}  # nothing per call
    assert layer not in encoder._EXPORT_WEIGHTS  # gone with the block: later traces read the kernels
    np.testing.assert_array_equal(tf.function(lambda x: layer(x, mask, training=False))(x).numpy(),
                                  infer(x).numpy())
    for policy in ("mixed_float16", "mixed_bfloat16"):  # inference in the mixed precisions runs too
        half = encoder.SelfAttention(num_heads=4, key_dim=16, dtype=policy)
        half.build((None, None, 64), (None, None, 64))
        half.set_weights(layer.get_weights())
        got = tf.function(lambda x: half(x, mask, training=False))(x)
        error = np.abs(tf.cast(got, tf.float32).numpy() - training_form).mean()
        assert error < 0.02 * np.abs(training_form).mean(), (policy, error)  # the format's rounding


@pytest.mark.parametrize("batch, seq", [(1, 9), (3, 30)])  # rows below / above SPLIT_FFN_ROWS
def test_an_exports_feed_forward_in_parts_computes_the_whole_one(batch, seq):
    """Inside `export_weights(split_ffn=True)` (exports with constant weights) a short request
    runs the FFN as `FFN_PARTS` chains over parts of the hidden units, summed: the same function,
    in twice the matmuls; a long one keeps one chain; outside the block nothing changes."""
    from electra_tf.models import encoder

    assert (batch * seq <= encoder.SPLIT_FFN_ROWS) == (batch == 1)
    layer = encoder.TransformerLayer(ElectraConfig.from_json("electra_tiny"))
    layer.build()
    rng = np.random.default_rng(2)
    layer.set_weights([rng.normal(0, 0.3, w.shape).astype(np.float32) for w in layer.get_weights()])
    x = tf.constant(rng.normal(size=(batch, seq, layer.config.hidden_size)), tf.float32)
    mask = tf.ones((batch, seq), tf.int32)
    whole = tf.function(lambda x: layer._feed_forward(x, training=False))
    want = whole(x).numpy()

    def matmuls(fn):
        graph = fn.get_concrete_function(x).graph.as_graph_def()
        nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
        return sum(node.op == "MatMul" for node in nodes)

    with encoder.export_weights(layer, split_ffn=True):
        parts = tf.function(lambda x: layer._feed_forward(x, training=False))
        got = parts(x).numpy()
        # training calls never take the parts
        assert matmuls(tf.function(lambda x: layer._feed_forward(x, training=True))) == 2
        layer_out = layer(x, mask, training=False).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(got, np.zeros_like(got))
    assert matmuls(whole) == 2 and matmuls(parts) == 2 + 2 * encoder.FFN_PARTS  # both forms, chosen at run time
    # chosen by rows <= SPLIT_FFN_ROWS: the parts when true, one chain when false
    graph = parts.get_concrete_function(x).graph.as_graph_def()
    functions = {f.signature.name: f for f in graph.library.function}
    (cond,) = [node for node in graph.node if node.op in ("If", "StatelessIf")]
    branch_matmuls = [sum(n.op == "MatMul" for n in functions[cond.attr[b].func.name].node_def)
                      for b in ("then_branch", "else_branch")]
    assert branch_matmuls == [2 * encoder.FFN_PARTS, 2]
    predicate = {node.name: node for node in graph.node}[cond.input[0].split(":")[0]]
    assert predicate.op == "LessEqual"
    bound = {node.name: node for node in graph.node}[predicate.input[1].split(":")[0]]
    assert tf.make_ndarray(bound.attr["value"].tensor) == encoder.SPLIT_FFN_ROWS
    np.testing.assert_allclose(layer_out, layer(x, mask, training=False).numpy(), rtol=1e-5, atol=1e-5)
    assert layer not in encoder._EXPORT_WEIGHTS
    with encoder.export_weights(layer):  # without split_ffn (exports that keep variables)
        assert matmuls(tf.function(lambda x: layer._feed_forward(x, training=False))) == 2


def test_dropout_rate_expectation_and_fresh_draws():
    from electra_tf.models.encoder import Dropout

    layer = Dropout(0.1, seed=7)
    x = tf.ones((16, 4, 128, 128))  # 1M elements
    first, second = layer(x, training=True).numpy(), layer(x, training=True).numpy()
    dropped = first == 0
    assert abs(dropped.mean() - 0.1) < 0.002
    assert abs(first.mean() - 1.0) < 0.005  # kept elements rescaled: the expectation holds
    assert set(np.unique(first)) == {0.0, np.float32(65536 / (65536 - 6554))}
    assert 0.15 < (dropped != (second == 0)).mean() < 0.21  # independent masks: 2 p (1 - p)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    twin = Dropout(0.1, seed=7)  # the draws are a function of the seed generator's state
    np.testing.assert_array_equal(twin(x, training=True).numpy(), first)
    # Every position can be dropped: no position is tied to its neighbour's draw.
    many = np.stack([layer(tf.ones((2, 64)), training=True).numpy() == 0 for _ in range(300)])
    assert many.any(axis=0).all() and not many.all(axis=0).any()
