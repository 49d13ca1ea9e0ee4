"""One fine-tuning step and the optimizer it applies: what the loop (`trainer.py`) calls once
per batch.

`make_train_step` gives a function that takes one optimizer step on the next global batch of a
shuffled, repeated pass over the training arrays and returns its loss: the per-example losses of
the head (`heads.py`) summed over the global batch and divided by its size, on the graph or
XLA-compiled path `training.step_path.choose` picks. `create_finetuning_optimizer` is the
original's: AdamWeightDecay, warmup (`warmup_steps`) then linear decay, layer-wise
learning-rate decay.
"""

from __future__ import annotations

from electra_tf.finetune.config import FinetuningConfig


def make_train_step(head, optimizer, strategy, arrays: dict, batch: int, seed: int,
                    jit_compile: bool | None = None, *, total_steps: int = 0, log=None):
    """(a function that takes one optimizer step on the next global batch and returns its loss,
    the `step_path.StepPath` it runs on).

    Batches of a shuffled, repeated pass over `arrays` (reshuffled every pass, seeded). Each
    replica's loss is its share of the global-batch mean (its per-example losses summed, divided
    by the global batch): Keras sums the replicas' gradients (`training.optimizer`). The replica
    step is a graph or XLA-compiled as `jit_compile` says; None: the faster on this CPU for a
    run of `total_steps` (`training.step_path.choose`: a probe on an input of its own whose
    steps are undone).
    """
    import tensorflow as tf

    # Untuned: an autotuned iterator's end waits for the tuner's wake-up (data.pipeline.untuned).
    from electra_tf.data.pipeline import distributed_iterator, untuned
    from electra_tf.training import step_path

    def distributed_input():
        # A dataset object of its own each time: its shuffle's seed state advances with every
        # iterator made from it, so the probe's input must not come from the run's dataset.
        dataset = (tf.data.Dataset.from_tensor_slices(arrays)
                   .shuffle(len(arrays["input_ids"]), seed=seed, reshuffle_each_iteration=True)
                   .repeat().batch(batch, drop_remainder=True).prefetch(2))
        return distributed_iterator(strategy, untuned(dataset))

    def step_fn(features):
        with tf.GradientTape() as tape:
            outputs = head(features, training=True)
            loss = tf.reduce_sum(head.per_example_loss(features, outputs)) / batch
        grads = tape.gradient(loss, head.trainable_variables)
        optimizer.apply_gradients(zip(grads, head.trainable_variables))
        return loss

    steps = {}

    def step_for(jit: bool):
        if jit not in steps:
            # No Python control flow over tensors in the step: autograph off (as the
            # pretraining step, `training/steps.py`), ~1 CPU-s less per trace.
            replica_step = tf.function(step_fn, jit_compile=jit, reduce_retracing=True,
                                       autograph=False)

            @tf.function
            def train_step(iterator):
                losses = strategy.run(replica_step, args=(next(iterator),))
                return strategy.reduce("SUM", losses, axis=None)

            steps[jit] = train_step
        return steps[jit]

    probe_input = []

    def runner(jit: bool):
        train_step = step_for(jit)
        if not probe_input:
            probe_input.append(distributed_input())

        def run(n):
            for _ in range(n):
                loss = train_step(probe_input[0])
            float(loss)

        return run

    def snapshot():
        return step_path.Snapshot([*head.variables, *optimizer.variables])

    key = repr((type(head).__name__, [(v.path, tuple(v.shape)) for v in head.variables],
                {k: v.shape[1:] for k, v in arrays.items()}, batch,
                type(strategy).__name__, strategy.num_replicas_in_sync))
    choice = step_path.choose(jit_compile, strategy=strategy, remaining_steps=total_steps,
                              runner=runner, snapshot=snapshot, memo_key=key,
                              log=log)
    iterator = distributed_input()
    train_step = step_for(choice.jit_compile)
    return (lambda: train_step(iterator)), choice


def warmup_steps(fc: FinetuningConfig, total_steps: int) -> float:
    """`warmup_proportion` of the steps, or none when that is under one step.

    The warmup multiplies the rate by step / warmup, which is 0 at the first step (step 0): a
    warmup shorter than one step only zeroes that step, and a run of one step (a training set
    smaller than a batch) would learn nothing at all."""
    warmup = fc.warmup_proportion * total_steps
    return warmup if warmup >= 1 else 0.0


def create_finetuning_optimizer(fc: FinetuningConfig, num_layers: int, total_steps: int):
    """The original fine-tuning optimizer: AdamWeightDecay, warmup then linear decay, layer-wise
    learning-rate decay over `num_layers` encoder layers (see `training.optimizer`)."""
    from electra_tf.training.optimizer import create_optimizer

    return create_optimizer(
        "adamw", fc.learning_rate, total_steps, warmup_steps(fc, total_steps),
        weight_decay=fc.weight_decay, clip_norm=fc.clip_norm,
        layerwise_decay=fc.layerwise_decay_or_none, num_layers=num_layers,
        match_original_layerwise=fc.match_original_layerwise)

