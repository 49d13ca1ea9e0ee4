"""One benchmark row per process, driven over a pipe: `Worker` (the parent's end) and `serve`.

Rows in one process disturb each other: with four pretraining models resident, a step that runs
at 0.46 steps/s alone ran at 0.28, and PyTorch's step beside a warm TensorFlow runtime ran 5x
slower (each framework's thread pool spins for a while after its work and steals the cores of
the other). So every row of `benchmarks/benchmark_pretrain.py` lives in a child process that builds
it, warms it up and then waits; the parent times the rows in interleaved rounds by asking each
child in turn to run n steps, and reads each child's peak resident memory when it exits.

Protocol: one command line in, one JSON line out.
  info         the row's description (dict)
  steps N      runs N steps; answers the last loss
  matmul JSON  times the given `benchmarks.matmul_bound` specs; answers seconds per product
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable

from benchmarks import child_env


class WorkerError(RuntimeError):
    """The child process died or answered with an error."""


class Worker:
    """A child process serving one row. `command` is its argv (run with this Python)."""

    def __init__(self, command: list[str], name: str, env: dict | None = None):
        self.name = name
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, bufsize=1, env=child_env(env))
        self.peak_rss_mib = None
        self.info = self._ask("info")

    def _ask(self, line: str):
        try:
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            raise WorkerError(f"row {self.name}: its process exited with status "
                              f"{self._process.wait()} on {line.split()[0]!r} (see its log above)")
        result = json.loads(answer)
        if isinstance(result, dict) and "error" in result:
            raise WorkerError(f"row {self.name}: {result['error']}")
        return result

    def steps(self, n: int):
        """Runs n steps in the child; returns the last loss once they are done."""
        return self._ask(f"steps {int(n)}")

    def matmul_seconds(self, specs) -> dict:
        answer = self._ask("matmul " + json.dumps([[list(s[0]), *s[1:]] for s in specs]))
        return dict(zip(specs, answer))

    def close(self) -> float | None:
        """Ends the child; returns its peak resident memory in MiB (None if unknown)."""
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                _, _, usage = os.wait4(self._process.pid, 0)
                self.peak_rss_mib = usage.ru_maxrss / 1024  # kilobytes on Linux
            except ChildProcessError:
                pass
            self._process.wait()
        return self.peak_rss_mib


def interleaved_rounds(workers: dict, steps: int, rounds: int, log=None) -> dict:
    """Times `workers` ({row: Worker}, built and warmed up) in `rounds` rounds, each asking every
    row in turn for `steps` steps (whole calls of its `steps_per_call`), so that the machine's
    drifts hit all rows alike. Returns {row: [seconds per step, one per round]}."""
    samples = {row: [] for row in workers}
    for r in range(rounds):
        for row, worker in workers.items():
            start = time.perf_counter()
            worker.steps(steps)
            per_call = worker.info["steps_per_call"]
            samples[row].append((time.perf_counter() - start) / (per_call * -(-steps // per_call)))
        if log is not None:
            log("round %d/%d: %s", r + 1, rounds,
                ", ".join(f"{row} {samples[row][-1]:.3f} s/step" for row in samples))
    return samples


def parse_rows(requested, known: tuple) -> tuple:
    """The rows a --rows flag asks for ("all": every one of `known`); an unknown name is a usage
    error naming it and the choices."""
    from absl import app

    rows = known if "all" in requested else tuple(requested)
    unknown = [row for row in rows if row not in known]
    if unknown:
        raise app.UsageError(f"--rows: unknown row(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(known)} or all")
    return rows


def row_notes(skipped: dict, infos: dict) -> list[str]:
    """A report's lines on the rows: each skipped one with its reason, and the step path each
    of ours runs (the `step_path` / `step_path_reason` its child put in its info)."""
    return ([f"  row {row} skipped: {reason}" for row, reason in skipped.items()]
            + [f"  row {row} runs the {info['step_path']} step ({info['step_path_reason']})"
               for row, info in infos.items() if "step_path" in info])


def serve(step: Callable[[], float], steps_per_call: int, info: dict,
          matmul_seconds: Callable | None = None, lines=None, out=None) -> None:
    """The child's loop: answers `Worker`'s commands until stdin closes.

    `step()` runs `steps_per_call` steps (the binary path runs whole loops) and returns the loss;
    `steps N` calls it ceil(N / steps_per_call) times.
    """
    lines = sys.stdin if lines is None else lines
    out = sys.stdout if out is None else out
    for line in lines:
        command, _, argument = line.strip().partition(" ")
        try:
            if command == "info":
                answer = {**info, "steps_per_call": steps_per_call}
            elif command == "steps":
                for _ in range(max(1, -(-int(argument) // steps_per_call))):
                    answer = float(step())
            elif command == "matmul" and matmul_seconds is not None:
                specs = [(tuple(s[0]), *s[1:]) for s in json.loads(argument)]
                seconds = matmul_seconds(specs)
                answer = [seconds[spec] for spec in specs]
            else:
                answer = {"error": f"unknown command {command!r}"}
        except Exception as e:  # reported to the parent, which names the row
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), file=out, flush=True)


# --- the inputs every row reads -------------------------------------------------------------
def save_inputs(workdir: str, model_config, batches, setup: dict) -> None:
    """Writes the model config, the in-memory batches and the run's settings for the children."""
    import numpy as np

    arrays = {f"{i}/{name}": np.asarray(value) for i, features in enumerate(batches)
              for name, value in features.items()}
    np.savez(os.path.join(workdir, "batches.npz"), **arrays)
    with open(os.path.join(workdir, "setup.json"), "w") as f:
        json.dump({**setup, "model_config": model_config.to_dict()}, f)


def load_inputs(workdir: str):
    """(ElectraConfig, list of dicts of int32 numpy arrays, setup dict) from `save_inputs`."""
    import numpy as np

    from electra_tf.config import ElectraConfig

    with open(os.path.join(workdir, "setup.json")) as f:
        setup = json.load(f)
    arrays = np.load(os.path.join(workdir, "batches.npz"))
    batches = {}
    for key in arrays.files:
        index, name = key.split("/")
        batches.setdefault(int(index), {})[name] = arrays[key]
    return (ElectraConfig.from_dict(setup.pop("model_config")),
            [batches[i] for i in sorted(batches)], setup)
