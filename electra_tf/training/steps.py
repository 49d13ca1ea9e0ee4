"""The pretraining step: one replica's update, gradient accumulation, and the loop function.

`make_loop_fn` returns one tf.function that runs `steps_per_loop` x `strategy.run(step)`, where the
step is `pretraining_step` (the pretrainer's objective, `ElectraPretrainer.compute_objective`, its
gradient and one optimizer update) or `accumulated_step` (the same update summed over micro-batches).
`loop.py` calls it between checkpoints and summaries.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from electra_tf.models.pretrainer import ElectraPretrainer


def _innermost(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def track_gradient_norm(optimizer, metric: keras.metrics.Metric) -> None:
    """Makes `optimizer` record the global norm of the replica-summed gradient in `metric`.

    The norm of interest is that of the gradient the optimizer applies: after the all-reduce
    (each replica holds a share) and, with loss scaling, after unscaling. Keras computes it in
    `_all_reduce_sum_gradients` (a private hook of Keras 3's TensorFlow optimizer, also used by
    our `AdamWeightDecay` and `Lamb`), so that method is wrapped on this instance: no extra
    all-reduce. Before clipping, as the original's summaries.
    """
    inner = _innermost(optimizer)
    original = inner._all_reduce_sum_gradients

    def all_reduce_and_record(grads_and_vars):
        grads_and_vars = original(grads_and_vars)
        grads = [g for g, _ in grads_and_vars if g is not None]
        metric.update_state(tf.linalg.global_norm(grads))
        return grads_and_vars

    inner._all_reduce_sum_gradients = all_reduce_and_record


def _apply(model: ElectraPretrainer, gradients, variables):
    """optimizer.apply; returns 1 when the float16 loss scale skipped the step (non-finite
    gradients: the scale halves, nothing is updated and the step is not counted), else 0."""
    before = tf.identity(model.optimizer.iterations)
    model.optimizer.apply(gradients, variables)
    if not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.constant(0, tf.int64)
    return tf.cast(tf.equal(model.optimizer.iterations, before), tf.int64)


def pretraining_step(model: ElectraPretrainer, features) -> dict:
    """`ElectraPretrainer.train_step` for our loop: one replica's step, returns its loss share,
    its count of real tokens (for tokens/s) and whether the loss scale skipped the step. Metrics
    are updated as the model does."""
    with tf.GradientTape() as tape:
        out = model.compute_objective(features, model.step_seed(), training=True)
        scaled_loss = model.optimizer.scale_loss(out["loss"])
    variables = model.trainable_variables
    skipped = _apply(model, tape.gradient(scaled_loss, variables), variables)
    model.update_metrics(out)
    return {"loss": out["loss"], "skipped": skipped,
            "tokens": tf.reduce_sum(tf.cast(features["input_mask"], tf.int64))}


def gradient_sums(model: ElectraPretrainer, strategy) -> list[tf.Variable]:
    """One zero variable per trainable variable, for `accumulated_step` to sum gradients in.

    Each replica sums its own (ON_READ: replica-local copies; the optimizer all-reduces the sums
    once). Not part of the checkpoint: they are zeroed at the start of every step. Variables,
    not while-loop tensors: Grappler's arithmetic optimizer rewrites a loop-carried `acc + g`
    into an AccumulateNV2 whose temporary variable collides across the iterations of the outer
    `steps_per_loop` loop (AlreadyExistsError, TF 2.21).
    """
    with strategy.scope():
        return [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                            name=f"gradient_sum_{i}",
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for i, v in enumerate(model.trainable_variables)]


def accumulated_step(model: ElectraPretrainer, features, num_micro_batches: int,
                     sums: list[tf.Variable]) -> dict:
    """`pretraining_step` over `num_micro_batches` slices of the replica's batch, one optimizer
    update: the update of the whole batch, with the memory of one slice.

    The losses are means over the GLOBAL batch's live masked slots (MLM) and real tokens (RTD),
    so the slices cannot be averaged as means (their counts differ). Instead the whole batch's
    counts are computed first (`loss_totals`: masking alone, one all-reduce) and every slice's
    loss is normalised by them (`compute_objective(totals=...)`): the slices' losses, and so
    their gradients, add up to the whole batch's. Masks are keyed per example (models/
    masking.py), so a slice masks its examples exactly as the whole batch would. Generator
    samples fold the slice index into the seed, as replicas fold theirs.

    The summed gradient (in `sums`, from `gradient_sums`) goes to the optimizer once: all-reduced
    once, clipped once to the global norm (as the authors' optimizer clips the whole batch's
    gradient), one step counted. The slices run one after another (`parallel_iterations=1`), so
    only one is in memory.
    """
    n = num_micro_batches
    seed = model.step_seed()
    totals = model.loss_totals(features, seed)  # [2]: the whole batch's global counts
    slices = {k: tf.reshape(v, [n, -1, *v.shape[1:]]) for k, v in features.items()}
    variables = model.trainable_variables
    # A Mean metric updated with each slice's share x n averages to the step's value.
    scalar_terms = ("loss", *model.step_metrics)

    def one_slice(i, loss):
        part = {k: tf.gather(v, i) for k, v in slices.items()}
        with tf.GradientTape() as tape:
            out = model.compute_objective(part, seed, training=True, totals=totals,
                                          micro_batch=i)
            scaled_loss = model.optimizer.scale_loss(out["loss"])
        for total, g in zip(sums, tape.gradient(scaled_loss, variables)):
            if g is not None:
                total.assign_add(tf.convert_to_tensor(g))
        model.update_metrics({**out, **{name: out[name] * n for name in scalar_terms}})
        return i + 1, loss + out["loss"]

    for total in sums:
        total.assign(tf.zeros_like(total))
    _, loss = tf.while_loop(lambda i, _: i < n, one_slice, (tf.constant(0), tf.constant(0.0)),
                            parallel_iterations=1)
    # read_value(): a tensor placed on the replica's device (under MultiWorkerMirroredStrategy a
    # plain conversion has none, and the gradient all-reduce then finds no destination).
    skipped = _apply(model, [total.read_value() for total in sums], variables)
    return {"loss": loss, "skipped": skipped,
            "tokens": tf.reduce_sum(tf.cast(features["input_mask"], tf.int64))}


def make_loop_fn(model, strategy, jit_compile: bool = False, accumulation_steps: int = 1):
    """`loop(iterator, num_steps, stop_flag)`: `num_steps` train steps in one tf.function.

    Each step is `pretraining_step`, or `accumulated_step` over `accumulation_steps` micro-
    batches. Returns (global loss of the last step, first step (1-based optimizer step) whose
    loss was not finite or -1, real tokens processed, steps the float16 loss scale skipped,
    whether any worker set `stop_flag`). The loop breaks at the first non-finite loss so the bad
    update is the last one.
    """
    if accumulation_steps > 1:
        sums = gradient_sums(model, strategy)

        def step(features):
            return accumulated_step(model, features, accumulation_steps, sums)
    else:
        def step(features):
            return pretraining_step(model, features)
    # autograph=False: the step has no Python control flow over tensors (the accumulation runs
    # `tf.while_loop` itself), and converting every function it calls cost ~1 CPU-s of each
    # trace (docs/benchmarks.md, "A train step's first call"); the loop below keeps autograph
    # for its `tf.range` and `break`.
    replica_step = tf.function(step, jit_compile=jit_compile, reduce_retracing=True,
                               autograph=False)

    @tf.function
    def loop(iterator, num_steps, stop_flag):
        loss = tf.constant(0.0)
        bad_step = tf.constant(-1, tf.int64)
        tokens = tf.constant(0, tf.int64)
        skipped = tf.constant(0, tf.int64)
        for _ in tf.range(num_steps):
            out = strategy.run(replica_step, args=(next(iterator),))
            loss = strategy.reduce("SUM", out["loss"], axis=None)
            tokens += strategy.reduce("SUM", out["tokens"], axis=None)
            # Every replica sees the same decision: count it once.
            skipped += tf.minimum(strategy.reduce("SUM", out["skipped"], axis=None), 1)
            if not tf.math.is_finite(loss):
                bad_step = tf.cast(model.optimizer.iterations, tf.int64)
                break
        stop = strategy.reduce(
            "SUM", strategy.run(lambda: tf.cast(stop_flag, tf.int32)), axis=None)
        return loss, bad_step, tokens, skipped, stop > 0

    return loop


def learning_rate(opt) -> float:
    """The learning rate the optimizer applies at its current step."""
    inner = _innermost(opt)
    lr = inner._learning_rate
    if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
        return float(lr(inner.iterations))
    return float(lr)
