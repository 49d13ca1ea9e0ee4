"""`create_strategy`: one name per piece of hardware, and the chief/worker helpers.

  one_device    GPU:0 if there is one, else CPU:0.
  mirrored      `num_gpus` GPUs (0: all of them); on a machine without GPUs, every logical CPU
                device (so tests can mirror over the two logical CPUs of tests/conftest.py).
  multi_worker  `MultiWorkerMirroredStrategy` configured by the `TF_CONFIG` environment variable.
  tpu           `TPUClusterResolver(tpu)` -> connect -> initialise -> `TPUStrategy`.

A TPU that cannot be reached fails with `StrategyError` within `timeout_seconds`. Resolving a TPU
name queries the GCE metadata server and the Cloud TPU API, and initialising a `grpc://` address
that nothing answers blocks forever (both observed with TF 2.21 on a machine without a TPU), so
a `grpc://host:port` address is first probed with a plain TCP connect, and resolution and
initialisation run in a daemon thread that is abandoned when it overruns.

Example:
>>> strategy = create_strategy("mirrored")
>>> with strategy.scope():
...     model = ElectraPretrainer(config)
"""

from __future__ import annotations

import json
import os
import socket
import threading
from typing import Any, Callable, NamedTuple

import tensorflow as tf

from electra_tf.training.config import STRATEGIES


class StrategyError(RuntimeError):
    """The requested strategy cannot be created; the message says why."""


class TaskInfo(NamedTuple):
    """This process's place in a multi-worker cluster (`type` None without TF_CONFIG)."""

    type: str | None
    id: int
    num_workers: int


# --- TF_CONFIG ------------------------------------------------------------------------------------
def read_tf_config(environ=None) -> dict:
    """Parses and checks `TF_CONFIG`; `StrategyError` names what is missing or malformed."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        raise StrategyError("strategy multi_worker: the TF_CONFIG environment variable is not "
                            "set (expected JSON {\"cluster\": {\"worker\": [\"host:port\", ...]}, "
                            "\"task\": {\"type\": \"worker\", \"index\": 0}})")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise StrategyError(f"strategy multi_worker: TF_CONFIG is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise StrategyError("strategy multi_worker: TF_CONFIG must be a JSON object")
    cluster, task = config.get("cluster"), config.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise StrategyError("strategy multi_worker: TF_CONFIG has no \"cluster\" object")
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) and ":" in a
                                                      for a in addresses):
            raise StrategyError(f"strategy multi_worker: TF_CONFIG cluster.{job} must be a list "
                                f"of \"host:port\" strings (got {addresses!r})")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise StrategyError("strategy multi_worker: TF_CONFIG has no \"task\" with \"type\" "
                            "and \"index\"")
    if task["type"] not in cluster:
        raise StrategyError(f"strategy multi_worker: TF_CONFIG task.type {task['type']!r} is "
                            f"not a job of the cluster ({sorted(cluster)})")
    index = task["index"]
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise StrategyError(f"strategy multi_worker: TF_CONFIG task.index {index!r} is out of "
                            f"range for job {task['type']!r} with "
                            f"{len(cluster[task['type']])} tasks")
    return config


def task_info(environ=None) -> TaskInfo:
    """(type, index, number of training tasks) from TF_CONFIG; (None, 0, 1) when it is unset."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    if not raw:
        return TaskInfo(None, 0, 1)
    config = read_tf_config(environ)
    cluster = config["cluster"]
    num_workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    return TaskInfo(config["task"]["type"], int(config["task"]["index"]), max(num_workers, 1))


def is_chief(strategy: tf.distribute.Strategy | None = None) -> bool:
    """Whether this process writes checkpoints and summaries.

    The chief is the task of type "chief", or worker 0 when the cluster has no chief. Strategies
    other than MultiWorkerMirroredStrategy run in one process, which is always the chief.
    """
    if strategy is not None and not isinstance(
            strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is not None and resolver.task_type is not None:
        task_type, task_id = resolver.task_type, resolver.task_id
        has_chief = "chief" in resolver.cluster_spec().as_dict()
    else:
        info = task_info()
        if info.type is None:
            return True
        task_type, task_id = info.type, info.id
        has_chief = "chief" in read_tf_config()["cluster"]
    if task_type == "chief":
        return True
    return task_type == "worker" and task_id == 0 and not has_chief


# --- TPU --------------------------------------------------------------------------------------
def _run_with_timeout(fn: Callable[[], Any], timeout_seconds: float, what: str):
    """Runs `fn` in a daemon thread; StrategyError if it takes longer than `timeout_seconds`."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=target, name=f"strategy:{what}", daemon=True)
    thread.start()
    thread.join(timeout_seconds)
    if thread.is_alive():
        raise StrategyError(f"strategy tpu: {what} did not finish within {timeout_seconds:g}s "
                            "(no TPU reachable?)")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _probe_grpc_address(address: str, timeout_seconds: float) -> None:
    """A TCP connect to grpc://host:port, since TF blocks forever on an address nobody serves."""
    host_port = address[len("grpc://"):]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise StrategyError(f"strategy tpu: --tpu {address!r} is not grpc://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)),
                                 timeout=min(timeout_seconds, 10)).close()
    except OSError as e:
        raise StrategyError(f"strategy tpu: cannot reach the TPU at {address} ({e})") from None


def _tpu_strategy(tpu: str | None, timeout_seconds: float) -> tf.distribute.Strategy:
    if tpu and tpu.startswith("grpc://"):
        _probe_grpc_address(tpu, timeout_seconds)

    def connect():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return resolver

    try:
        resolver = _run_with_timeout(connect, timeout_seconds, f"connecting to TPU {tpu!r}")
    except StrategyError:
        raise
    except Exception as e:  # ValueError (no name), URLError (metadata), NotFoundError (no TPU)
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StrategyError(f"strategy tpu: no TPU reachable for --tpu={tpu!r}: "
                            f"{type(e).__name__}: {message[:300]}") from None
    return tf.distribute.TPUStrategy(resolver)


# --- the factory --------------------------------------------------------------------------------
def create_strategy(name: str, tpu: str | None = None, num_gpus: int = 0,
                    timeout_seconds: float = 30) -> tf.distribute.Strategy:
    """A `tf.distribute.Strategy` by name (see the module docstring).

    Args:
      name: one of STRATEGIES.
      tpu: TPU name, `grpc://host:port`, or "local" (strategy tpu only).
      num_gpus: GPUs for `mirrored` (0: all).
      timeout_seconds: how long reaching a TPU may take before `StrategyError`.
    """
    if name not in STRATEGIES:
        raise StrategyError(f"strategy: {name!r} is not one of {', '.join(STRATEGIES)}")
    if name == "tpu":
        return _tpu_strategy(tpu, timeout_seconds)
    if name == "multi_worker":
        read_tf_config()  # a clear error instead of a silent single-worker run
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if num_gpus < 0:
        raise StrategyError(f"strategy mirrored: num_gpus must be >= 0 (got {num_gpus})")
    if gpus:
        if num_gpus > len(gpus):
            raise StrategyError(f"strategy mirrored: num_gpus={num_gpus} but only "
                                f"{len(gpus)} GPUs are visible")
        devices = [d.name for d in gpus[:num_gpus or len(gpus)]]
    else:
        if num_gpus:
            raise StrategyError(f"strategy mirrored: num_gpus={num_gpus} but no GPU is visible")
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        # Replicas on CPUs of one host: reduce by copying to one device. TF's collective ops
        # here sometimes pair up different tensors of the two replicas inside our multi-step
        # loop ("Shape mismatch in the collective instance"); copying has no instance keys.
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return tf.distribute.MirroredStrategy(devices)
