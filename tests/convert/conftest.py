"""Fixtures: tiny checkpoints in the released TF1 layout (see convert_fixtures.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import convert_fixtures as fx  # noqa: E402


@pytest.fixture(scope="session")
def tiny_tensors():
    """A pretraining checkpoint's weights: generator 1/2 of the discriminator, shared embeddings."""
    return fx.random_tensors(fx.released_shapes(**fx.TINY, gen_hidden=64, gen_layers=2))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, tiny_tensors):
    """A released-archive-like folder: checkpoint with Adam slots + global_step, and vocab.txt."""
    folder = tmp_path_factory.mktemp("tf1_tiny")
    fx.write_tf1(folder, fx.with_training_state(tiny_tensors), vocab_size=fx.TINY["vocab"])
    return folder
