"""One pretraining step computed two ways (one device or two replicas, a whole batch or its
micro-batches), made comparable for tests/models/test_distributed.py, tests/models/test_electric.py
and tests/training/test_accumulation.py.

Masks are keyed per example, so any split of a batch masks its examples as the whole batch does;
with dropout off and the generator sampling its argmax (temperature -> 0), what is left to differ
is the float32 summation order of one [8, ...] batch against its parts (`TOLERANCE`).
"""

import keras
import numpy as np
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import untuned

TOLERANCE = dict(rtol=2e-4, atol=2e-6)


def deterministic_config(**changes) -> ElectraConfig:
    """The tiny model with dropout off and argmax sampling."""
    values = dict(vocab_size=512, hidden_dropout=0.0, attention_dropout=0.0, temperature=1e-7)
    return ElectraConfig.from_json("electra_tiny").replace(**{**values, **changes})


def sgd_steps(strategy, build_model, initial_weights, features: dict, terms, steps: int = 2):
    """`steps` SGD steps (learning rate 0.5) of `build_model()`, starting from `initial_weights`,
    on `features` under `strategy`. Returns ([the global value of each of `terms`, per step],
    the weights after the last step)."""
    with strategy.scope():
        model = build_model()
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        model.optimizer.build(model.trainable_variables)
    batch = next(iter(strategy.experimental_distribute_dataset(
        untuned(tf.data.Dataset.from_tensors(features)))))  # see pipeline.untuned

    @tf.function
    def step(batch):
        def replica_fn(inputs):
            with tf.GradientTape() as tape:
                out = model.compute_objective(inputs, model.step_seed(), training=True)
            grads = tape.gradient(out["loss"], model.trainable_variables)
            model.optimizer.apply(grads, model.trainable_variables)
            return [out[name] for name in terms]
        per_replica = strategy.run(replica_fn, args=(batch,))
        return [strategy.reduce("SUM", x, axis=None) for x in per_replica]

    values = [np.array([float(x) for x in step(batch)]) for _ in range(steps)]
    return values, [w.numpy() for w in model.weights]


def assert_same_steps(one, two, initial_weights) -> None:
    """`sgd_steps` results that agree to `TOLERANCE`, from steps that changed the weights."""
    (one_values, one_weights), (two_values, two_weights) = one, two
    for a, b in zip(one_values, two_values):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    changed = 0
    for a, b, start in zip(one_weights, two_weights, initial_weights):
        np.testing.assert_allclose(a, b, **TOLERANCE)
        changed += not np.allclose(a, start)
    assert changed > 20  # the step really trained both models
