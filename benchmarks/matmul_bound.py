"""The matmul bound of a training step: its matmuls alone, each timed at its own shape.

`step_matmuls(concrete_function)` reads every MatMul and BatchMatMul of a traced step (forward
and backward: the gradient tape's ops are in the same graph) with its static shapes and
transpose flags, and counts how often each distinct one occurs. `tf_seconds(specs)` times
each with TensorFlow's kernels (the oneDNN `_MklMatMul` / `_MklBatchMatMulV2` that the step
itself runs on x86), `benchmarks.torch_reference.torch_matmul_seconds(specs)` with PyTorch's.
The bound is sum(count x seconds): what the step would take if everything but its matmuls
vanished and each matmul ran as fast as it does alone.

A spec is a tuple `(batch, m, k, n, transpose_a, transpose_b)`: `batch` the broadcast batch
shape (a tuple, () for a plain matmul); the product is [*batch, m, k] x [*batch, k, n] before
transposes. Its FLOPs are 2 x prod(batch) x m x k x n.
"""

from __future__ import annotations

import collections
import math
import time

MATMUL_TYPES = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def spec_flops(spec) -> float:
    batch, m, k, n, _, _ = spec
    return 2.0 * math.prod(batch) * m * k * n


def describe(spec) -> str:
    batch, m, k, n, ta, tb = spec
    prefix = "x".join(str(b) for b in batch) + " x " if batch else ""
    return f"{prefix}[{m},{k}]{'ᵀ' if ta else ''} @ [{k},{n}]{'ᵀ' if tb else ''}"


def _op_spec(op):
    a, b = op.inputs[0].shape, op.inputs[1].shape
    if a.rank is None or b.rank is None or not (a.is_fully_defined() and b.is_fully_defined()):
        raise ValueError(f"{op.name}: matmul shapes {a} x {b} are not static; trace the step "
                         "with fixed batch and sequence sizes")
    if op.type == "MatMul":
        ta, tb = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        batch = ()
    else:
        ta, tb = op.get_attr("adj_x"), op.get_attr("adj_y")
        batch = tuple(int(d) for d in _broadcast(a[:-2], b[:-2]))
    a, b = [int(d) for d in a[-2:]], [int(d) for d in b[-2:]]
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    return (batch, m, k, n, bool(ta), bool(tb))


def _broadcast(x, y):
    x, y = list(x), list(y)
    width = max(len(x), len(y))
    x, y = [1] * (width - len(x)) + x, [1] * (width - len(y)) + y
    return [max(p, q) for p, q in zip(x, y)]


def step_matmuls(concrete_function) -> collections.Counter:
    """Counter spec -> occurrences of the matmuls in a traced step (nested functions included)."""
    counts = collections.Counter()
    seen = set()

    def walk(graph):
        for op in graph.get_operations():
            if op.type in MATMUL_TYPES:
                counts[_op_spec(op)] += 1
        for name, function in getattr(graph, "_functions", {}).items():
            if name not in seen:
                seen.add(name)
                nested = getattr(function, "graph", None)
                if nested is not None:
                    walk(nested)

    walk(concrete_function.graph)
    return counts


def tf_seconds(specs, target_seconds: float = 0.05, repeats: int = 3) -> dict:
    """Seconds per matmul of each spec with TensorFlow's kernels (best of `repeats`).

    Each measurement runs the matmul in a `tf.range` loop inside one tf.function (so the
    Python call overhead is spread over many products), sized to take about `target_seconds`.
    """
    import tensorflow as tf

    @tf.function
    def loop(a, b, n, transpose_a, transpose_b):
        total = tf.zeros([], a.dtype)
        for _ in tf.range(n):
            product = tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
            total += tf.reduce_sum(product[..., :1, :1])  # keeps the product alive, costs nothing
        return total

    results = {}
    for spec in specs:
        batch, m, k, n, ta, tb = spec
        a = tf.random.normal([*batch, *((k, m) if ta else (m, k))])
        b = tf.random.normal([*batch, *((n, k) if tb else (k, n))])
        run = loop.get_concrete_function(a, b, tf.constant(1), ta, tb)
        run(a, b, tf.constant(2)).numpy()
        start = time.perf_counter()
        run(a, b, tf.constant(2)).numpy()
        calls = max(2, min(2000, int(target_seconds / max((time.perf_counter() - start) / 2,
                                                          1e-7))))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run(a, b, tf.constant(calls)).numpy()
            best = min(best, (time.perf_counter() - start) / calls)
        results[spec] = best
    return results


def bound_seconds(counts, seconds) -> float:
    """sum(count x seconds per matmul): the step's matmul time."""
    return sum(count * seconds[spec] for spec, count in counts.items())
