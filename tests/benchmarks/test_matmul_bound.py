"""benchmarks/matmul_bound.py: the matmuls of a traced step, and their timing."""

import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.models import ElectraPretrainer
from electra_tf.models.flops import training_flops_per_sequence
from electra_tf.training.optimizer import create_optimizer
from benchmarks import matmul_bound as mb


def test_a_dense_layer_has_its_forward_and_both_backward_matmuls():
    kernel = tf.Variable(tf.random.normal([8, 5]))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(tf.matmul(x, kernel) ** 2)
        return tape.gradient(y, [x, kernel])

    counts = mb.step_matmuls(step.get_concrete_function(tf.TensorSpec([4, 8])))
    # forward [4,8]@[8,5]; d/dx = dy [4,5] @ kernel^T; d/dkernel = x^T [8,4] @ dy [4,5]
    assert counts == {((), 4, 8, 5, False, False): 1, ((), 4, 5, 8, False, True): 1,
                      ((), 8, 4, 5, True, False): 1}
    assert mb.spec_flops(((2, 3), 4, 8, 5, False, False)) == 2 * 6 * 4 * 8 * 5


def test_the_pretraining_step_matmuls_are_the_analytic_flop_count():
    config = ElectraConfig.from_json("electra_tiny").replace(vocab_size=512)
    model = ElectraPretrainer(config)
    model.compile(optimizer=create_optimizer("adamw", 1e-4, 100, 10))
    model.optimizer.build(model.trainable_variables)
    features = {"input_ids": tf.fill([2, 32], 7), "input_mask": tf.ones([2, 32], tf.int32),
                "segment_ids": tf.zeros([2, 32], tf.int32)}
    counts = mb.step_matmuls(tf.function(model.train_step).get_concrete_function(features))
    traced = sum(count * mb.spec_flops(spec) for spec, count in counts.items())
    assert traced == 2 * training_flops_per_sequence(config, 32)["training"]


def test_timing_grows_with_the_flops():
    small, large = ((), 32, 32, 32, False, False), ((4,), 128, 128, 128, True, True)
    seconds = mb.tf_seconds([small, large], target_seconds=0.01, repeats=2)
    assert 0 < seconds[small] < seconds[large]  # 256x the FLOPs
    counts = {small: 3, large: 1}
    assert mb.bound_seconds(counts, seconds) == 3 * seconds[small] + seconds[large]
