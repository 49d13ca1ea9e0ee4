"""benchmarks/loss_trajectory.py: fixed-seed loss trajectories and their comparison."""

import json
import pathlib
import subprocess
import sys

import keras
import pytest

from electra_tf.config import ElectraConfig
from benchmarks import loss_trajectory

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS, BATCH, SEQ = 3, 4, 32


@pytest.fixture(scope="module")
def config():
    return ElectraConfig.from_json("electra_tiny").replace(vocab_size=512)


@pytest.fixture(scope="module")
def seed0(config):
    return loss_trajectory.trajectory(config, STEPS, BATCH, SEQ, "none", seed=0).losses


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks.loss_trajectory", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_same_seed_gives_identical_losses(config, seed0):
    again = loss_trajectory.trajectory(config, STEPS, BATCH, SEQ, "none", seed=0).losses
    assert len(seed0) == STEPS
    assert again == seed0
    # Each step's own loss, not the metrics' running mean: training moves it step to step.
    assert len(set(seed0)) == STEPS


def test_other_seed_gives_other_losses(config, seed0):
    other = loss_trajectory.trajectory(config, STEPS, BATCH, SEQ, "none", seed=1).losses
    assert all(a != b for a, b in zip(seed0, other))


def test_policy_is_restored(config):
    before = keras.mixed_precision.global_policy().name
    with pytest.raises(ValueError, match="mixed_precision"):
        loss_trajectory.trajectory(config, 1, BATCH, SEQ, "float8")
    assert keras.mixed_precision.global_policy().name == before


def test_synthetic_batches_shape_and_special_tokens():
    (batch,) = loss_trajectory.synthetic_batches(8, 16, 512, seed=0, count=1)
    ids, mask = batch["input_ids"], batch["input_mask"]
    lengths = mask.sum(1)
    assert ids.shape == (8, 16) and (lengths >= 8).all() and (lengths <= 16).all()
    assert len(set(lengths)) > 1
    for row, n in enumerate(lengths):
        assert ids[row, 0] == 2 and ids[row, n - 1] == 3
        assert (ids[row, 1:n - 1] >= 5).all() and (ids[row, 1:n - 1] < 512).all()
        assert (ids[row, n:] == 0).all() and (mask[row, n:] == 0).all()


def test_compare_identical_files_gives_zero(tmp_path, seed0):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"config": "electra_tiny", "losses": seed0}))
    stats = loss_trajectory.compare(seed0, seed0)
    assert stats["max_abs"] == 0 and stats["max_rel"] == 0 and stats["last_mean_rel"] == 0
    result = _cli("--compare", str(path), str(path))
    assert result.returncode == 0, result.stderr
    assert "max |A-B|: 0.000e+00" in result.stdout


def test_compare_reports_where_the_difference_is():
    stats = loss_trajectory.compare([10.0, 9.0, 8.0, 7.0], [10.0, 9.0, 8.1, 7.0])
    assert stats["max_abs_step"] == 2 and stats["first_rel_above_1e-5"] == 2
    assert stats["step0_abs"] == 0 and stats["max_abs"] == pytest.approx(0.1)


@pytest.mark.parametrize("content,message", [
    ('{"losses": [1.0,', "not valid JSON"),
    ('{"steps": 3}', "not a trajectory"),
    (None, "cannot read"),
])
def test_bad_file_is_a_one_line_error_naming_it(tmp_path, content, message):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"losses": [1.0, 2.0]}))
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    result = _cli("--compare", str(good), str(bad))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
