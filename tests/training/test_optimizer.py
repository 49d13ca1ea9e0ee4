"""Tests for electra_tf/training/optimizer.py against NumPy references of the original rules."""

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.training.optimizer import (
    AdamWeightDecay,
    Lamb,
    PolynomialWarmupSchedule,
    create_optimizer,
    layer_depth,
    layerwise_lr_multipliers,
    uses_weight_decay,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_variable(path, value):
    """A Keras variable whose `.path` is `path` (name scopes cannot contain '/')."""
    *scopes, name = path.split("/")
    with contextlib.ExitStack() as stack:
        for scope in scopes:
            stack.enter_context(keras.name_scope(scope))
        return keras.Variable(np.asarray(value, np.float32), name=name)


def reference_schedule(step, peak, total, warmup, power=1.0):
    decay = peak * (1.0 - min(step, total) / total) ** power
    return decay * (min(1.0, step / warmup) if warmup > 0 else 1.0)


def reference_adamw(params, grads_per_step, lrs, decayed, wd, clip, scales=None,
                    b1=0.9, b2=0.999, eps=1e-6):
    """The original update in float64: clip_by_global_norm, Adam without bias correction."""
    params = [np.array(p, np.float64) for p in params]
    scales = scales or [1.0] * len(params)
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for grads, lr in zip(grads_per_step, lrs):
        grads = [np.asarray(g, np.float64) for g in grads]
        if clip:
            norm = np.sqrt(sum(np.sum(g**2) for g in grads))
            grads = [g * clip / max(norm, clip) for g in grads]
        for i, g in enumerate(grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g**2
            update = m[i] / (np.sqrt(v[i]) + eps)
            if decayed[i]:
                update = update + wd * params[i]
            params[i] = params[i] - lr * scales[i] * update
    return params


PATHS = [
    "discriminator/embeddings/word_embeddings/embeddings",
    "discriminator/encoder/layer_0/dense/kernel",
    "discriminator/encoder/layer_0/dense/bias",
    "discriminator/encoder/layer_0/attention_layer_norm/gamma",
    "discriminator/embeddings/LayerNorm/beta",
]
DECAYED = [True, True, False, False, False]


def test_adamw_matches_numpy_reference_with_clipping_and_exclusions():
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (3, 2), (2,), (2,), (3,)]
    init = [rng.normal(size=s) for s in shapes]
    # Global norms far above and below 1.0, so both branches of the clip are exercised.
    grads = [[rng.normal(size=s) * scale for s in shapes] for scale in (3.0, 0.05, 1.0, 0.1, 5.0, 0.2)]
    variables = [make_variable(p, x) for p, x in zip(PATHS, init)]
    schedule = PolynomialWarmupSchedule(0.1, num_train_steps=10, num_warmup_steps=2)
    optimizer = AdamWeightDecay(schedule, weight_decay_rate=0.3, global_clipnorm=1.0)

    for step_grads in grads:
        optimizer.apply_gradients(
            [(tf.constant(g, tf.float32), var) for g, var in zip(step_grads, variables)]
        )

    lrs = [reference_schedule(s, 0.1, 10, 2) for s in range(len(grads))]
    expected = reference_adamw(init, grads, lrs, DECAYED, wd=0.3, clip=1.0)
    for var, want in zip(variables, expected):
        np.testing.assert_allclose(var.numpy(), want, rtol=1e-6, atol=1e-6, err_msg=var.path)
    # Not vacuous: without decay the kernel ends elsewhere.
    no_decay = reference_adamw(init, grads, lrs, [False] * 5, wd=0.3, clip=1.0)
    assert not np.allclose(variables[1].numpy(), no_decay[1], atol=1e-4)


@pytest.mark.parametrize(
    "path, decayed",
    [
        ("discriminator/encoder/layer_3/attention_layer_norm/gamma", False),
        ("encoder/layer_3/output/LayerNorm/beta", False),
        ("encoder/layer_0/ln/gamma", False),  # any Keras LayerNormalization, however named
        ("generator_predictions/output_bias", False),
        ("encoder/layer_3/intermediate/kernel", True),
        ("embeddings/word_embeddings/embeddings", True),
        ("head/gamma_projection/kernel", True),  # `gamma` only excluded as a variable name
    ],
)
def test_weight_decay_exclusion_rule(path, decayed):
    assert uses_weight_decay(path) is decayed


def test_schedule_matches_reference():
    peak, total, warmup = 1e-3, 100, 10
    schedule = PolynomialWarmupSchedule(peak, total, warmup)
    for step in [0, 1, 5, 9, 10, 11, 50, 99, 100, 150]:
        np.testing.assert_allclose(
            float(schedule(step)), reference_schedule(step, peak, total, warmup), rtol=1e-6, atol=1e-12
        )
    assert float(schedule(0)) == 0.0
    # The decay runs from step 0, so the warmup boundary sits below the peak.
    np.testing.assert_allclose(float(schedule(warmup)), 0.9 * peak, rtol=1e-6)
    assert float(schedule(total)) == 0.0

    fractional = PolynomialWarmupSchedule(2.0, 40, num_warmup_steps=7.5, power=2.0)
    for step in [0, 3, 7, 8, 20, 40]:
        np.testing.assert_allclose(
            float(fractional(step)), reference_schedule(step, 2.0, 40, 7.5, 2.0), rtol=1e-6
        )
    np.testing.assert_allclose(float(PolynomialWarmupSchedule(1.0, 10)(0)), 1.0)  # no warmup


def test_layer_depths_follow_original_mapping():
    n = 4
    assert layer_depth("discriminator/embeddings/word_embeddings/embeddings", n) == 0
    assert layer_depth("electra/embeddings_project/kernel", n) == 0
    assert layer_depth("discriminator/encoder/layer_0/attention/query/kernel", n) == 1
    assert layer_depth("discriminator/encoder/layer_3/output_layer_norm/gamma", n) == 4
    assert layer_depth("classifier/dense/kernel", n) == n + 2
    assert layer_depth("head/embeddings", n) == n + 2  # a variable NAMED embeddings is not the block
    with pytest.raises(ValueError, match="layer 4"):
        layer_depth("encoder/layer_4/dense/kernel", n)

    paths = ["embeddings/x/w", "encoder/layer_0/w", "encoder/layer_3/w", "head/w"]
    assert layerwise_lr_multipliers(paths, n, 0.5) == {
        "embeddings/x/w": 0.5**6, "encoder/layer_0/w": 0.5**5, "encoder/layer_3/w": 0.5**2, "head/w": 1.0,
    }
    assert layerwise_lr_multipliers(paths, n, 0.5, match_original=False) == {
        "embeddings/x/w": 0.5**5, "encoder/layer_0/w": 0.5**4, "encoder/layer_3/w": 0.5, "head/w": 1.0,
    }


@pytest.mark.parametrize("match_original", [True, False])
def test_layerwise_decay_scales_each_layers_update(match_original):
    n, decay = 3, 0.8
    paths = (
        ["discriminator/embeddings/word_embeddings/embeddings", "discriminator/embeddings_project/kernel"]
        + [f"discriminator/encoder/layer_{i}/dense/kernel" for i in range(n)]
        + ["classifier/kernel"]
    )
    depths = [0, 0] + [i + 1 for i in range(n)] + [None]
    variables = [make_variable(p, np.ones(2)) for p in paths]
    optimizer = create_optimizer(
        "adamw", 0.01, num_train_steps=100, num_warmup_steps=0, weight_decay=0.0,
        layerwise_decay=decay, num_layers=n, match_original_layerwise=match_original,
    )
    optimizer.apply_gradients([(tf.constant([0.3, -0.2]), v) for v in variables])

    deltas = [1.0 - v.numpy() for v in variables]
    top = n + 2 if match_original else n + 1
    for path, depth, delta in zip(paths, depths, deltas):
        expected = 1.0 if depth is None else decay ** (top - depth)
        np.testing.assert_allclose(delta / deltas[-1], expected, rtol=1e-5, err_msg=path)
    np.testing.assert_allclose(
        deltas[-2] / deltas[-1], decay**2 if match_original else decay, rtol=1e-5
    )  # the top encoder layer: the original's quirk, or the alternative


DISTRIBUTED_SCRIPT = textwrap.dedent(
    """
    import json, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from electra_tf.training.optimizer import AdamWeightDecay, create_optimizer

    STEP_SCALES = tf.constant([0.1, 0.5, 2.0])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        kernel = keras.Variable(np.array([1.0, -2.0, 3.0], np.float32), name="kernel")
        bias = keras.Variable(np.array([0.5, 0.5], np.float32), name="bias")
        adamw = AdamWeightDecay(0.1, weight_decay_rate=0.1, global_clipnorm=1.0)
        adamw.build([kernel, bias])
        scaled = [keras.Variable(np.array([1.0, -2.0, 3.0], np.float32), name="kernel"),
                  keras.Variable(np.array([0.5, 0.5], np.float32), name="bias")]
        wrapped = keras.optimizers.LossScaleOptimizer(
            AdamWeightDecay(0.1, weight_decay_rate=0.1, global_clipnorm=1.0), initial_scale=64.0)
        wrapped.build(scaled)
        lamb_var = keras.Variable(np.array([1.0, 2.0], np.float32), name="w")
        lamb = create_optimizer("lamb", 0.1, num_train_steps=10, num_warmup_steps=0)
        lamb.build([lamb_var])

    @tf.function
    def step():
        def replica_fn():
            r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
            # Different per replica and per step (Adam without bias correction only sees the
            # gradient's scale relative to earlier steps), so that SUM, MEAN, per-replica
            # clipping and no clipping all give different results.
            s = tf.gather(STEP_SCALES, adamw.iterations)
            grads = [tf.constant([0.6, -0.8, 0.0]) * (1.0 + r) * s, tf.constant([0.3, 0.0]) * (1.0 - r) * s]
            adamw.apply_gradients(zip(grads, [kernel, bias]))
            wrapped.apply_gradients(zip([g * 64.0 for g in grads], scaled))
            lamb.apply_gradients([(2.0 * lamb_var.value, lamb_var)])
        strategy.run(replica_fn)

    for _ in range(3):
        step()
    print(json.dumps({"kernel": kernel.numpy().tolist(), "bias": bias.numpy().tolist(),
                      "scaled": [v.numpy().tolist() for v in scaled],
                      "lamb": lamb_var.numpy().tolist(), "iterations": int(adamw.iterations.numpy())}))
    """
)


def test_mirrored_strategy_sums_replicas_then_clips():
    # Logical devices must be configured before TF runs any op, hence a fresh process.
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", DISTRIBUTED_SCRIPT], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    # Replica gradients are summed (replica 0 + replica 1), then clipped to global norm 1.
    grads = [[np.array([0.6, -0.8, 0.0]) * 3.0 * s, np.array([0.3, 0.0]) * s] for s in (0.1, 0.5, 2.0)]
    expected = reference_adamw([[1.0, -2.0, 3.0], [0.5, 0.5]], grads, [0.1] * 3,
                               decayed=[True, False], wd=0.1, clip=1.0)
    np.testing.assert_allclose(result["kernel"], expected[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result["bias"], expected[1], rtol=1e-6, atol=1e-6)
    for got, want in zip(result["scaled"], expected):  # same, wrapped for mixed precision
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert result["iterations"] == 3
    assert np.all(np.abs(result["lamb"]) < np.array([1.0, 2.0]))  # LAMB moved towards 0


def quadratic_step(optimizer, variable):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(variable.value - tf.constant([1.0, -1.0, 0.5])))
    optimizer.apply_gradients([(tape.gradient(loss, variable.value), variable)])
    return loss


def test_jit_compiled_step_matches_eager():
    results = []
    for jit in (False, True):
        variable = make_variable("encoder/layer_0/dense/kernel", [3.0, 2.0, -4.0])
        optimizer = create_optimizer("adamw", 0.5, num_train_steps=20, num_warmup_steps=3)
        optimizer.build([variable])
        step = tf.function(lambda: quadratic_step(optimizer, variable), jit_compile=True) if jit \
            else (lambda: quadratic_step(optimizer, variable))
        for _ in range(6):
            step()
        results.append(variable.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)
    assert not np.allclose(results[0], [3.0, 2.0, -4.0])


def test_works_inside_loss_scale_optimizer():
    grads = [np.array([0.2, -0.4], np.float32), np.array([1e-3, 0.0], np.float32)]
    plain_vars = [make_variable("dense/kernel", [1.0, 1.0]), make_variable("dense/bias", [1.0, 1.0])]
    scaled_vars = [make_variable("dense/kernel", [1.0, 1.0]), make_variable("dense/bias", [1.0, 1.0])]
    plain = AdamWeightDecay(0.1)
    wrapped = keras.optimizers.LossScaleOptimizer(AdamWeightDecay(0.1), initial_scale=1024.0)
    for _ in range(2):
        plain.apply_gradients([(tf.constant(g), v) for g, v in zip(grads, plain_vars)])
        wrapped.apply_gradients([(tf.constant(g * 1024.0), v) for g, v in zip(grads, scaled_vars)])
    for p, s in zip(plain_vars, scaled_vars):
        np.testing.assert_allclose(s.numpy(), p.numpy(), rtol=1e-6)
    before = [v.numpy() for v in scaled_vars]
    wrapped.apply_gradients([(tf.constant([np.inf, 0.0]), scaled_vars[0]),
                             (tf.constant([0.0, 0.0]), scaled_vars[1])])
    for b, v in zip(before, scaled_vars):
        np.testing.assert_array_equal(v.numpy(), b)  # overflowing step skipped
    assert float(wrapped.dynamic_scale.numpy()) == 512.0


def test_lamb_decreases_quadratic_loss():
    variable = make_variable("dense/kernel", [3.0, 2.0, -4.0])
    optimizer = create_optimizer("lamb", 0.1, num_train_steps=40, num_warmup_steps=2, weight_decay=0.1)
    assert isinstance(optimizer, Lamb)
    losses = [float(quadratic_step(optimizer, variable)) for _ in range(30)]
    assert losses[-1] < 0.2 * losses[0]

    # With zero gradients only weight decay moves a variable: the kernel shrinks, the bias not.
    kernel, bias = make_variable("dense/kernel", [1.0, 1.0]), make_variable("dense/bias", [1.0, 1.0])
    optimizer = create_optimizer("lamb", 0.1, num_train_steps=40, num_warmup_steps=0, weight_decay=0.1)
    optimizer.apply_gradients([(tf.zeros(2), kernel), (tf.zeros(2), bias)])
    np.testing.assert_allclose(kernel.numpy(), [0.99, 0.99], rtol=1e-6)
    np.testing.assert_array_equal(bias.numpy(), [1.0, 1.0])


def test_config_round_trips():
    schedule = PolynomialWarmupSchedule(3e-4, 1000, 62.5, end_learning_rate=1e-6, power=2.0)
    restored = PolynomialWarmupSchedule.from_config(schedule.get_config())
    assert restored.get_config() == schedule.get_config()
    np.testing.assert_allclose(float(restored(300)), float(schedule(300)))

    optimizer = AdamWeightDecay(
        schedule, weight_decay_rate=0.02, epsilon=1e-8, weight_decay_exclusions=["bias"],
        lr_multipliers={"a/kernel": 0.5}, global_clipnorm=2.0,
    )
    config = optimizer.get_config()
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone) is AdamWeightDecay
    assert clone.get_config() == config
    assert config["lr_multipliers"] == {"a/kernel": 0.5} and config["global_clipnorm"] == 2.0
    assert config["learning_rate"]["registered_name"] == "electra_tf>PolynomialWarmupSchedule"

    # A callable multiplier serialises as its values once the variables are known.
    tuned = create_optimizer("adamw", 1e-4, 100, 10, layerwise_decay=0.5, num_layers=2)
    with pytest.raises(ValueError, match="built"):
        tuned.get_config()
    tuned.build([make_variable("encoder/layer_1/kernel", [1.0]), make_variable("head/kernel", [1.0])])
    assert AdamWeightDecay.from_config(tuned.get_config()).get_config()["lr_multipliers"] == {
        "encoder/layer_1/kernel": 0.25, "head/kernel": 1.0,
    }

    lamb = create_optimizer("lamb", 1e-3, 100, 10, weight_decay=0.01)
    lamb_clone = keras.optimizers.deserialize(keras.optimizers.serialize(lamb))
    assert type(lamb_clone) is Lamb and lamb_clone.get_config() == lamb.get_config()


def test_rejects_misconfiguration():
    with pytest.raises(ValueError, match="weight_decay_rate"):
        AdamWeightDecay(1e-3, weight_decay=0.01)
    strict = AdamWeightDecay(1e-3, lr_multipliers={"a/kernel": 1.0})
    with pytest.raises(ValueError, match="b/kernel"):
        strict.build([make_variable("b/kernel", [1.0])])
    with pytest.raises(ValueError, match="num_layers"):
        create_optimizer("adamw", 1e-3, 10, 1, layerwise_decay=0.8)
    with pytest.raises(ValueError, match="adamw"):
        create_optimizer("sgd", 1e-3, 10, 1)
