"""Running an `electra-*` command as a user does (a subprocess of its tool module) and reading the
one line a refused command prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")


def start(tool: str, *args) -> subprocess.Popen:
    """`python -m electra_tf.tools.TOOL ARGS...`, started in the repository, output captured."""
    return subprocess.Popen([sys.executable, "-m", f"electra_tf.tools.{tool}", *map(str, args)], cwd=REPO,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_line_error(process: subprocess.Popen) -> str:
    """The one line a refused command printed (exit 1, no traceback; TensorFlow's C++ log and
    absl's log lines aside, which are not the command's)."""
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1 and "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.strip().splitlines()
             if not re.match(r"WARNING: All log messages before absl|[IWE]\d{4} ", line)]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def snapshot(folder) -> dict:
    """relative path -> bytes (a link: its target, not followed) of everything under `folder`,
    hidden names included: equal snapshots before and after mean nothing there changed."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = (os.readlink(path) if os.path.islink(path)
                                                 else Path(path).read_bytes())
    return out


def tree(folder) -> dict:
    """relative path -> content (a link: its target; a folder: None) of everything under folder,
    folders included."""
    out = {}
    for root, folders, names in os.walk(folder):
        for name in folders + names:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = (
                os.readlink(path) if os.path.islink(path) else None if os.path.isdir(path)
                else Path(path).read_bytes())
    return out
