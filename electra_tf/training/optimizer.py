"""Optimizers and the learning-rate schedule of ELECTRA (Clark et al., 2020).

Facts taken from the authors' `model/optimization.py`:

- `AdamWeightDecay`: Adam WITHOUT bias correction plus decoupled weight decay that is
  added to the Adam direction before the learning rate multiplies it:

      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
      update = m / (sqrt(v) + eps)  [+ weight_decay_rate * w unless excluded]
      w -= lr * update

  with gradients first clipped to global norm 1.0.
- `PolynomialWarmupSchedule`: linear decay from step 0 multiplied by a linear warmup.
- `layerwise_lr_multipliers`: the fine-tuning layer-wise learning-rate decay.

Distribution (Keras 3, TensorFlow backend). Keras sums gradients across replicas
(`ReduceOp.SUM` in `TFOptimizer._backend_update_step`), so a training loop must scale each
replica's loss by 1 / global_batch_size (Keras' built-in losses do this by dividing their
per-replica mean by `num_replicas_in_sync`). Stock Keras applies `global_clipnorm` BEFORE that
sum, i.e. to each replica's partial gradient; the optimizers here clip AFTER it, so the clipped
gradient is the one single-device training on the global batch would clip.

Example:

    optimizer = create_optimizer("adamw", learning_rate=1e-4, num_train_steps=10_000,
                                 num_warmup_steps=1_000, layerwise_decay=0.8, num_layers=12)
"""

import functools
import re
from typing import Callable, Iterable, Mapping, Optional, Sequence, Union

import keras
import tensorflow as tf

# Patterns searched (re.search) in a variable's path. The first three are the original's list,
# which matched TF1 scope names such as `encoder/layer_0/output/LayerNorm/gamma`. Keras'
# `LayerNormalization` (and `BatchNormalization`) name their variables `gamma` and `beta`
# whatever the layer is called, so those names are excluded too: no normalisation parameter
# is decayed, which is the original's intent.
DEFAULT_WEIGHT_DECAY_EXCLUSIONS = (
    "LayerNorm",
    "layer_norm",
    "bias",
    r"(^|/)gamma$",
    r"(^|/)beta$",
)

LrMultipliers = Union[Mapping[str, float], Callable[[str], float]]

_LAYER_COMPONENT = re.compile(r"^layer_(\d+)$")
_EMBEDDING_COMPONENTS = ("embeddings", "embeddings_project")


def variable_path(variable) -> str:
    """The name used for matching: `Variable.path` in Keras 3, else the TF name without `:0`."""
    path = getattr(variable, "path", None) or variable.name
    return re.sub(r":\d+$", "", path)


def uses_weight_decay(path: str, exclusions: Sequence[str] = DEFAULT_WEIGHT_DECAY_EXCLUSIONS) -> bool:
    """Whether the variable at `path` is decayed: no pattern of `exclusions` occurs in it."""
    return not any(re.search(pattern, path) for pattern in exclusions)


class _ClipAfterAllReduce:
    """Mixin for Keras optimizers (TF backend): global-norm clipping after the replica sum.

    Keras clips in `_backend_apply_gradients`, in replica context, before
    `_backend_update_step` all-reduces; this moves the clip behind the all-reduce. It relies on
    the private Keras hooks `_backend_update_step`, `_all_reduce_sum_gradients` and
    `_distributed_tf_update_step` (Keras 3.x, TensorFlow backend).
    """

    def _clip_gradients(self, grads):
        if self.global_clipnorm:
            return grads  # Clipped in `_backend_update_step`, once the replicas are summed.
        return super()._clip_gradients(grads)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        trainable_variables = [
            v.value if isinstance(v, keras.Variable) else v for v in trainable_variables
        ]
        # Embedding gathers give IndexedSlices gradients. All-reducing those across replicas
        # takes TF's sparse collective path, whose packed shapes can differ between replicas
        # ("Shape mismatch in the collective instance"); the update is dense anyway (as the
        # original's), so densify first and all-reduce one dense tensor per variable.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        grads_and_vars = self._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))
        if self.global_clipnorm:
            grads = [g for g, _ in grads_and_vars]
            grads, _ = tf.clip_by_global_norm(grads, self.global_clipnorm)
            grads_and_vars = [(g, v) for g, (_, v) in zip(grads, grads_and_vars)]
        tf.__internal__.distribute.interim.maybe_merge_call(
            self._distributed_tf_update_step,
            self._distribution_strategy,
            grads_and_vars,
            learning_rate,
        )


def _as_learning_rate(learning_rate):
    # Keras refuses Python ints; `1` and `1.0` mean the same learning rate.
    if isinstance(learning_rate, int) and not isinstance(learning_rate, bool):
        return float(learning_rate)
    return learning_rate


@functools.partial(tf.function, jit_compile=True, reduce_retracing=True)
def _adam_weight_decay_update(var, m, v, gradient, lr, decay, *, beta_1, beta_2, epsilon):
    """One variable's update, fused by XLA into a single pass over (var, m, v, gradient).

    The original's formula with its constants (1 - beta taken in double, as TF1 did in Python),
    where the un-fused graph made ~10 element-wise passes per variable. XLA may contract
    multiply-adds, so a weight can differ from the un-fused ops' by an ulp or two.
    `var`, `m`, `v` are resource handles.
    """
    dtype = gradient.dtype
    w = tf.raw_ops.ReadVariableOp(resource=var, dtype=dtype)
    next_m = beta_1 * tf.raw_ops.ReadVariableOp(resource=m, dtype=dtype) + (1.0 - beta_1) * gradient
    next_v = (beta_2 * tf.raw_ops.ReadVariableOp(resource=v, dtype=dtype)
              + (1.0 - beta_2) * tf.square(gradient))
    update = next_m / (tf.sqrt(next_v) + epsilon) + decay * w
    tf.raw_ops.AssignVariableOp(resource=m, value=next_m)
    tf.raw_ops.AssignVariableOp(resource=v, value=next_v)
    tf.raw_ops.AssignVariableOp(resource=var, value=w - lr * update)


@keras.saving.register_keras_serializable(package="electra_tf")
class AdamWeightDecay(_ClipAfterAllReduce, keras.optimizers.Optimizer):
    """The original ELECTRA/BERT Adam: no bias correction, decoupled weight decay.

    Weight decay applies to a variable unless one of `weight_decay_exclusions` (regular
    expressions) is found in its path (`Variable.path`, e.g.
    `discriminator/encoder/layer_0/attention_layer_norm/gamma`). The defaults exclude the
    original's `LayerNorm`, `layer_norm` and `bias`, plus every variable named `gamma` or `beta`
    (the parameters of Keras' normalisation layers).

    The first update happens at `iterations == 0`, so under `PolynomialWarmupSchedule` it uses
    learning rate 0 (only `m` and `v` move), exactly as the original, whose global step was
    incremented after the update.

    Args:
        learning_rate: float or `keras.optimizers.schedules.LearningRateSchedule`.
        weight_decay_rate: decoupled weight decay coefficient (not multiplied into the
            gradient; added to the Adam direction, then scaled by the learning rate).
        beta_1, beta_2, epsilon: Adam constants; epsilon is added to sqrt(v).
        weight_decay_exclusions: regular expressions; a variable whose path matches any is not
            decayed.
        lr_multipliers: optional per-variable learning-rate factors, a dict mapping every
            trainable variable's path to a float (a missing path is an error, as in the
            original) or a callable `path -> float`. See `layerwise_lr_multipliers`.
        global_clipnorm: clip the replica-summed gradients to this global norm (`None`: no
            clipping). Same formula as `tf.clip_by_global_norm`.
        name: optimizer name.
        **kwargs: other `keras.optimizers.Optimizer` arguments (`clipnorm`, `clipvalue`,
            `gradient_accumulation_steps`, ...). Keras' own `weight_decay` is refused: it
            would decay a second time, in a different place.

    Example:

        optimizer = AdamWeightDecay(learning_rate=PolynomialWarmupSchedule(1e-4, 1000, 100))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    """

    def __init__(
        self,
        learning_rate=1e-4,
        weight_decay_rate: float = 0.01,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        weight_decay_exclusions: Sequence[str] = DEFAULT_WEIGHT_DECAY_EXCLUSIONS,
        lr_multipliers: Optional[LrMultipliers] = None,
        global_clipnorm: Optional[float] = 1.0,
        name: str = "adam_weight_decay",
        **kwargs,
    ):
        if kwargs.pop("weight_decay", None) is not None:
            raise ValueError(
                "AdamWeightDecay takes `weight_decay_rate`; Keras' `weight_decay` would apply "
                "a second, differently placed decay."
            )
        super().__init__(
            learning_rate=_as_learning_rate(learning_rate),
            global_clipnorm=global_clipnorm,
            name=name,
            **kwargs,
        )
        self.weight_decay_rate = float(weight_decay_rate)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.weight_decay_exclusions = tuple(weight_decay_exclusions)
        self._lr_multipliers = lr_multipliers

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        # Named after the original's `<var>/adam_m` and `<var>/adam_v` slots.
        self._m, self._v = self.add_optimizer_variables(var_list, ["adam_m", "adam_v"])
        paths = [variable_path(v) for v in var_list]
        # Static per-variable facts, looked up by index in `update_step` (which, under
        # tf.distribute, receives per-device tf.Variables that have no Keras path).
        self._paths = tuple(paths)
        self._decays = tuple(
            self.weight_decay_rate > 0 and uses_weight_decay(p, self.weight_decay_exclusions)
            for p in paths
        )
        self._lr_scales = tuple(self._lr_multiplier(p) for p in paths)

    def _lr_multiplier(self, path: str) -> float:
        if self._lr_multipliers is None:
            return 1.0
        if callable(self._lr_multipliers):
            return float(self._lr_multipliers(path))
        if path not in self._lr_multipliers:
            raise ValueError(f"`lr_multipliers` has no entry for variable {path!r}.")
        return float(self._lr_multipliers[path])

    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        if isinstance(gradient, tf.IndexedSlices):
            # Dense like the original: m and v decay, and the weight decay applies, on every row.
            gradient = tf.convert_to_tensor(gradient)
        lr = tf.cast(learning_rate, dtype) * self._lr_scales[index]
        decay = self.weight_decay_rate if self._decays[index] else 0.0
        # Handles, not variables: under tf.distribute this runs once per device, and `.handle`
        # of a mirrored slot variable is then this device's copy.
        _adam_weight_decay_update(
            variable.handle, self._m[index].handle, self._v[index].handle,
            tf.cast(gradient, dtype), lr, tf.constant(decay, dtype),
            beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)

    def get_config(self):
        config = super().get_config()
        config.pop("weight_decay")
        if self._lr_multipliers is None or not callable(self._lr_multipliers):
            multipliers = self._lr_multipliers
        elif self.built:
            # A callable does not serialise; its values on the built variables do.
            multipliers = dict(zip(self._paths, self._lr_scales))
        else:
            raise ValueError(
                "Callable `lr_multipliers` can only be serialised once the optimizer is built "
                "(its values on the variables are saved), or pass a dict instead."
            )
        config.update(
            {
                "weight_decay_rate": self.weight_decay_rate,
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "weight_decay_exclusions": list(self.weight_decay_exclusions),
                "lr_multipliers": (
                    None if multipliers is None else {str(k): float(v) for k, v in multipliers.items()}
                ),
            }
        )
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class Lamb(_ClipAfterAllReduce, keras.optimizers.Lamb):
    """Keras' `Lamb`, with global-norm clipping after the replica sum and path-based exclusions.

    Weight decay is Keras' decoupled decay (`w -= lr * weight_decay * w` before the LAMB step,
    outside the trust ratio), skipped for variables matching `weight_decay_exclusions` (same
    rule as `AdamWeightDecay`). The trust ratio applies to every variable, biases and
    normalisation parameters included. Not in the ELECTRA paper: an alternative for large
    batches.

    Args:
        weight_decay_exclusions: regular expressions searched in each variable's path.
        *args, **kwargs: `keras.optimizers.Lamb` arguments.
    """

    def __init__(self, *args, weight_decay_exclusions=DEFAULT_WEIGHT_DECAY_EXCLUSIONS, **kwargs):
        if "learning_rate" in kwargs:
            kwargs["learning_rate"] = _as_learning_rate(kwargs["learning_rate"])
        super().__init__(*args, **kwargs)
        self.weight_decay_exclusions = tuple(weight_decay_exclusions)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._decays = tuple(
            uses_weight_decay(variable_path(v), self.weight_decay_exclusions) for v in var_list
        )

    def _use_weight_decay(self, variable):
        return self._decays[self._get_variable_index(variable)]

    def get_config(self):
        config = super().get_config()
        config["weight_decay_exclusions"] = list(self.weight_decay_exclusions)
        return config


@keras.saving.register_keras_serializable(package="electra_tf")
class PolynomialWarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = polynomial_decay(step) * min(1, step / num_warmup_steps).

    polynomial_decay(step) = (peak - end) * (1 - min(step, total) / total) ** power + end, as
    TF1's `tf.train.polynomial_decay(..., cycle=False)`. The decay runs from step 0 and the
    warmup multiplies it (so the peak is never quite reached), exactly as the original, which
    divides the float step by the float warmup length; that length may be fractional, e.g.
    10% of the training steps. `num_warmup_steps=0` means no warmup (the original would
    produce 0/0 at step 0).

    Args:
        peak_learning_rate: the learning rate the schedule decays from.
        num_train_steps: steps over which it decays to `end_learning_rate`.
        num_warmup_steps: length of the linear warmup, in steps (float allowed).
        end_learning_rate: value from `num_train_steps` on.
        power: exponent of the polynomial decay; 1.0 is linear.

    Example:

        schedule = PolynomialWarmupSchedule(2e-4, num_train_steps=1_000_000, num_warmup_steps=10_000)
        schedule(0)  # 0.0
    """

    def __init__(
        self,
        peak_learning_rate: float,
        num_train_steps: int,
        num_warmup_steps: float = 0,
        end_learning_rate: float = 0.0,
        power: float = 1.0,
    ):
        if num_train_steps <= 0:
            raise ValueError(f"num_train_steps must be positive, got {num_train_steps}.")
        if num_warmup_steps < 0:
            raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}.")
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = num_warmup_steps
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        total = float(self.num_train_steps)
        remaining = 1.0 - keras.ops.minimum(step, total) / total
        lr = (self.peak_learning_rate - self.end_learning_rate) * keras.ops.power(
            remaining, self.power
        ) + self.end_learning_rate
        if self.num_warmup_steps > 0:
            lr = lr * keras.ops.minimum(1.0, step / float(self.num_warmup_steps))
        return lr

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
        }


def layer_depth(path: str, num_layers: int) -> int:
    """Depth of a variable in the original's layer-wise decay.

    The layer names in the path (every component but the last, the variable's own name) are
    scanned outermost first: `embeddings` or `embeddings_project` -> depth 0; `layer_{i}` ->
    depth i + 1; no match -> the task head, depth num_layers + 2. A Keras layer left with an
    auto-generated `layer_{i}` name would be taken for an encoder layer: name layers.
    """
    for component in path.split("/")[:-1]:
        if component in _EMBEDDING_COMPONENTS:
            return 0
        match = _LAYER_COMPONENT.match(component)
        if match:
            index = int(match.group(1))
            if index >= num_layers:
                raise ValueError(f"{path!r} names layer {index}, but num_layers={num_layers}.")
            return index + 1
    return num_layers + 2


def layerwise_lr_multiplier(
    path: str, num_layers: int, decay: float, *, match_original: bool = True
) -> float:
    """Learning-rate factor of one variable; see `layerwise_lr_multipliers`."""
    depth = layer_depth(path, num_layers)
    if match_original:
        return decay ** (num_layers + 2 - depth)
    # Head at depth num_layers + 1, one above the top encoder layer.
    return decay ** (num_layers + 1 - min(depth, num_layers + 1))


def layerwise_lr_multipliers(
    variables_or_paths: Iterable, num_layers: int, decay: float, *, match_original: bool = True
) -> dict:
    """Layer-wise learning-rate decay for fine-tuning (`_get_layer_lrs` in the original).

    multiplier = decay ** (num_layers + 2 - depth) with the depths of `layer_depth`:
    embeddings (and embeddings_project) decay ** (n + 2), `layer_{i}` decay ** (n + 1 - i),
    task head 1. The original skips depth n + 1, so its TOP ENCODER LAYER gets decay ** 2,
    not decay; this is the default because it is what the published results used.
    `match_original=False` closes the gap: head 1, top layer decay, layer i decay ** (n - i),
    embeddings decay ** (n + 1).

    Args:
        variables_or_paths: variables (their `.path` is used) or path strings.
        num_layers: number of encoder layers.
        decay: per-layer factor, e.g. 0.8 (Small, Base) or 0.9 (Large).
        match_original: see above.

    Returns:
        dict path -> multiplier, to pass as `AdamWeightDecay(lr_multipliers=...)`.
    """
    paths = [p if isinstance(p, str) else variable_path(p) for p in variables_or_paths]
    return {
        p: layerwise_lr_multiplier(p, num_layers, decay, match_original=match_original)
        for p in paths
    }


def create_optimizer(
    name: str,
    learning_rate: float,
    num_train_steps: int,
    num_warmup_steps: float,
    weight_decay: float = 0.01,
    clip_norm: Optional[float] = 1.0,
    layerwise_decay: Optional[float] = None,
    num_layers: Optional[int] = None,
    *,
    match_original_layerwise: bool = True,
    end_learning_rate: float = 0.0,
    power: float = 1.0,
    beta_1: float = 0.9,
    beta_2: float = 0.999,
    epsilon: float = 1e-6,
    weight_decay_exclusions: Sequence[str] = DEFAULT_WEIGHT_DECAY_EXCLUSIONS,
):
    """The optimizer of a pretraining or fine-tuning run.

    Args:
        name: "adamw" (`AdamWeightDecay`, the paper's) or "lamb" (`Lamb`).
        learning_rate: peak learning rate of `PolynomialWarmupSchedule`.
        num_train_steps, num_warmup_steps: schedule lengths (warmup may be fractional).
        weight_decay: decoupled weight decay rate.
        clip_norm: global gradient norm clip; None or 0 for none.
        layerwise_decay: fine-tuning layer-wise decay (adamw only); needs `num_layers`.
        num_layers: number of encoder layers.
        match_original_layerwise: see `layerwise_lr_multipliers`.
        end_learning_rate, power: schedule shape.
        beta_1, beta_2, epsilon: Adam / LAMB constants.
        weight_decay_exclusions: regular expressions of variable paths not to decay.

    Returns:
        A Keras optimizer.
    """
    schedule = PolynomialWarmupSchedule(
        learning_rate, num_train_steps, num_warmup_steps, end_learning_rate, power
    )
    clip_norm = clip_norm or None
    if name == "adamw":
        multipliers = None
        if layerwise_decay is not None:
            if num_layers is None:
                raise ValueError("layerwise_decay needs num_layers.")
            multipliers = functools.partial(
                layerwise_lr_multiplier,
                num_layers=num_layers,
                decay=layerwise_decay,
                match_original=match_original_layerwise,
            )
        return AdamWeightDecay(
            schedule,
            weight_decay_rate=weight_decay,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            weight_decay_exclusions=weight_decay_exclusions,
            lr_multipliers=multipliers,
            global_clipnorm=clip_norm,
        )
    if name == "lamb":
        if layerwise_decay is not None:
            raise ValueError("layerwise_decay is implemented for 'adamw' only.")
        return Lamb(
            learning_rate=schedule,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            weight_decay=weight_decay or None,
            weight_decay_exclusions=weight_decay_exclusions,
            global_clipnorm=clip_norm,
        )
    raise ValueError(f"Unknown optimizer {name!r}; expected 'adamw' or 'lamb'.")
