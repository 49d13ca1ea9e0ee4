"""The project's instruments, not its product: benchmarks, peer reference implementations
(PyTorch, TF Model Garden) and the training-parity tools. They are not installed with the wheel;
run them from a checkout (`python -m benchmarks.NAME` in the repository's root)."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env(env: dict | None = None) -> dict:
    """`env` (default: this process's environment) with the checkout first on PYTHONPATH, so a
    child started as `python -m benchmarks.NAME` finds this folder from any working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env
