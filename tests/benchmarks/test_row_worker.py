"""benchmarks/row_worker.py: the pipe protocol between the benchmark and its row processes."""

import io
import json
import sys

import numpy as np
import pytest

from electra_tf.config import ElectraConfig
from benchmarks import row_worker


def answers(commands, step=lambda: 1.5, per_call=2, matmul=None):
    out = io.StringIO()
    row_worker.serve(step, per_call, {"row": "test"}, matmul, lines=commands, out=out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_steps_run_whole_calls_and_answer_the_loss():
    calls = []
    got = answers(["info\n", "steps 5\n"], step=lambda: calls.append(1) or 0.25, per_call=2)
    assert got[0] == {"row": "test", "steps_per_call": 2}
    assert got[1] == 0.25 and len(calls) == 3  # ceil(5 / 2) calls of 2 steps


def test_errors_are_answered_not_raised():
    def broken():
        raise ValueError("bad batch")

    got = answers(["steps 1\n", "frobnicate\n", "matmul []\n"], step=broken)
    assert got[0] == {"error": "ValueError: bad batch"}
    assert "unknown command" in got[1]["error"] and "unknown command" in got[2]["error"]


def test_inputs_round_trip(tmp_path):
    config = ElectraConfig.from_json("electra_tiny").replace(vocab_size=512)
    batches = [{"input_ids": np.arange(6, dtype=np.int32).reshape(2, 3),
                "input_mask": np.ones((2, 3), np.int32)}]
    row_worker.save_inputs(str(tmp_path), config, batches, {"batch_size": 2})
    loaded, got, setup = row_worker.load_inputs(str(tmp_path))
    assert loaded == config and setup == {"batch_size": 2}
    np.testing.assert_array_equal(got[0]["input_ids"], batches[0]["input_ids"])


def test_a_dead_child_names_its_row():
    with pytest.raises(row_worker.WorkerError, match="row doomed: its process exited"):
        row_worker.Worker([sys.executable, "-c", "import sys; sys.exit(3)"], "doomed")
