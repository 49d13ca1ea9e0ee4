"""create_strategy, TF_CONFIG checks, is_chief and ProgressLogger (fast, in-process)."""

import json
import time

import pytest
import tensorflow as tf

from electra_tf.progress import ProgressLogger, format_duration
from electra_tf.training.strategy import (StrategyError, create_strategy, is_chief,
                                          read_tf_config, task_info)


def test_mirrored_uses_both_logical_cpus_and_one_device_uses_cpu0():
    assert create_strategy("mirrored").num_replicas_in_sync == 2
    assert create_strategy("one_device").extended.worker_devices[0].endswith("CPU:0")
    with pytest.raises(StrategyError, match="num_gpus=1 but no GPU"):
        create_strategy("mirrored", num_gpus=1)
    with pytest.raises(StrategyError, match="'gpu' is not one of"):
        create_strategy("gpu")


@pytest.mark.parametrize("value, message", [
    (None, "TF_CONFIG environment variable is not set"),
    ("{", "TF_CONFIG is not valid JSON"),
    ('{"cluster": {"worker": ["a:1"]}}', 'no "task"'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
     "task.index 3 is out of range"),
    ('{"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}',
     "cluster.worker must be a list"),
])
def test_malformed_tf_config_is_named(value, message):
    env = {} if value is None else {"TF_CONFIG": value}
    with pytest.raises(StrategyError, match=message):
        read_tf_config(env)


def test_task_info_and_chief(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert task_info() == (None, 0, 1) and is_chief()
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": "worker", "index": 1}}))
    assert task_info() == ("worker", 1, 2) and not is_chief()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {**cluster, "chief": ["h:3"]},
                                                "task": {"type": "worker", "index": 0}}))
    assert task_info().num_workers == 3 and not is_chief()  # a chief exists: worker 0 is not it
    assert is_chief(create_strategy("one_device"))  # single-process strategies always are


def test_tpu_fails_fast_without_a_tpu():
    for tpu, message in [(None, "no TPU reachable"), ("grpc://127.0.0.1:1", "cannot reach")]:
        start = time.time()
        with pytest.raises(StrategyError, match=message):
            create_strategy("tpu", tpu=tpu, timeout_seconds=5)
        assert time.time() - start < 10
    # A listener that never answers gRPC (TF alone would hang) is tested through the binary,
    # in a fresh process: tests/training/test_pretraining.py.


def test_progress_logger_lines_rate_and_eta():
    now = [100.0]
    lines = []
    progress = ProgressLogger(100, every_n=10, unit="step", initial_step=20,
                              log_fn=lambda fmt, line: lines.append(line), clock=lambda: now[0])
    now[0] += 5
    assert progress.update(25, loss=1.5) is None  # not due: 5 < 10 steps
    now[0] += 5
    line = progress.update(30, loss=1.25)
    assert line == "step 30/100 (30.0%), 1 steps/s, ETA 1m10s, loss 1.25" and lines == [line]
    now[0] += 1
    assert "ETA 0s" in progress.update(100)  # the last step always logs
    assert format_duration(3725) == "1h02m05s" and format_duration(float("inf")) == "?"
