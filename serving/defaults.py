"""The local server's default limits and the values each may take, importable without TensorFlow
(for `electra-serve --help`, and so that the binary refuses a bad flag before TensorFlow loads).

`limit_error` is the one check of a `ModelServer` limit: the server refuses a bad value with a
ValueError, the binary with one line naming the flag, before any model loads.
"""

from __future__ import annotations

import math

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_SIZE = 1024
DEFAULT_REST_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_REST_MAX_CONNECTIONS = 256
DEFAULT_REST_API_TIMEOUT_MS = 30000  # TF Serving's --rest_api_timeout_in_ms

_GRPC_MAX_MESSAGE = 2**31 - 1  # gRPC's message limits are C ints
_MAX_SECONDS = 1e9  # ~31 years; sockets and thread waits refuse much more (time_t, threading.TIMEOUT_MAX)


def _count(low: int, high: int | None = None):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v and (high is None or v <= high)


def _seconds(positive: bool):
    return lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      and (v > 0 or not positive) and v <= _MAX_SECONDS)


# ModelServer argument: (valid?, what a valid value is)
_LIMITS = {
    "max_body_bytes": (_count(1, _GRPC_MAX_MESSAGE), f"must be from 1 to {_GRPC_MAX_MESSAGE} bytes (the gRPC message"
                       " limit is a 32-bit int)"),
    # TF Serving has no such limit outside batching; no value means "unlimited" here, and
    # --max_body_bytes bounds a request's size anyway.
    "max_batch_size": (_count(1), "must be >= 1 (there is no unlimited value; a large one does that)"),
    "rest_idle_timeout_seconds": (_seconds(positive=True), f"must be a number of seconds > 0 and <= {_MAX_SECONDS:g}"),
    "rest_max_connections": (_count(1), "must be >= 1"),
    "model_threads": (_count(0), "must be >= 0 (0: one per core)"),
    "grpc_threads": (_count(1), "must be >= 1"),
    # TF Serving's int32 flags: a timeout <= 0 is none; 0 REST threads: no limit but the connections'.
    "rest_api_timeout_ms": (_count(-2**31, 2**31 - 1), "must fit TF Serving's int32 (<= 0: no timeout)"),
    "rest_api_num_threads": (_count(0, 2**31 - 1), "must be from 0 (no limit but --rest_max_connections) to 2^31 - 1"),
    # TF Serving: 0 polls once, < 0 never polls (and waits for models forever). Here any value
    # <= 0 polls once; infinity and NaN are refused (they stopped the polling thread).
    "poll_interval_seconds": (_seconds(positive=False), f"must be a finite number of seconds <= {_MAX_SECONDS:g}"
                              " (<= 0: look for versions once, at start)"),
    "model_config_poll_seconds": (_seconds(positive=False), f"must be a finite number of seconds <= {_MAX_SECONDS:g}"
                                  " (<= 0: read the model config once, at start)"),
    "rest_port": (_count(0, 65535), "must be a port from 0 to 65535 (0: pick a free one)"),
    "grpc_port": (_count(0, 65535), "must be a port from 0 to 65535 (0: pick a free one)"),
}


def limit_error(name: str, value) -> str | None:
    """Why `value` is no valid `name` (a ModelServer argument), e.g. "must be >= 1, got 0"; None if valid."""
    valid, requirement = _LIMITS[name]
    return None if valid(value) else f"{requirement}, got {value!r}"


def intra_op_threads(requested: int, concurrent_calls: int, cores: int) -> int:
    """The intra-op pool size: `requested`, or with 0 the cores shared out between the model calls
    that may run at once, so that those calls never ask for more threads than there are cores.

    TF Serving's 0 lets every call use every core. Here the calls run at once are bounded
    (`serving.batching`), and on a loaded server two calls that each spread tiny ops over all
    cores only wait for each other: measured with `benchmarks/load_test_serving.py` on 2 cores (docs/benchmarks.md),
    one thread per call answered a lone client faster (p50 7.8 vs 10.6 ms) and 8 loaded clients
    with a p99 of 52 instead of 80 ms.
    """
    return requested or max(1, cores // max(1, concurrent_calls))
