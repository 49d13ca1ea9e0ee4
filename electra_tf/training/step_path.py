"""Which compilation the train step runs with on this CPU: a plain `tf.function` graph or XLA.

Neither is faster everywhere. Measured with `benchmarks/benchmark_pretrain.py` (docs/benchmarks.md, "Fast
on every CPU kind"): with TensorFlow's oneDNN kernels on (`electra_tf/cpu.py`), the graph beat
XLA by 1.07-1.16x on an AVX-512 EPYC and was within 5% of it on the same CPU limited to AVX2;
with oneDNN off (TensorFlow's default on AVX2-only CPUs) XLA was 1.47x faster. A rule on the
CPU's flags would encode the machines measured; the time of the step itself decides on every
CPU, so `choose` times both.

`choose(requested, ...)`:
  - `requested` True / False (`--jit_compile` / `--nojit_compile`): that path, no probe.
  - None (the default): on CPU, a probe when the run is long enough for it to pay (its cost,
    mostly XLA's compilation, under ~3% of the run's estimated time, which one traced graph
    step estimates; a run of at most `min_probed_steps()` is too short on any machine and is
    not timed at all): both paths are warmed up,
    then timed in interleaved rounds, and XLA is chosen when its median step is at least
    `MARGIN` faster; otherwise, and off CPU or across workers, the graph (the path whose numbers
    every earlier release produced).
The probe trains for real, so the caller snapshots every variable it touches first and restores
them after (`Snapshot`): the run continues from exactly the state it had, on either path, and
nothing of the choice enters a checkpoint (a run resumed on another CPU probes again).

The result, `StepPath`, gives the choice and why in one line (logged) and a dict for the run's
record. A probe's outcome is remembered for the process (`_MEMO`, keyed by what the step
computes), so the seeds of one fine-tuning command probe once.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

from electra_tf.cpu import onednn_description, vector_extensions

GRAPH, XLA = "graph", "xla"
# XLA is chosen only when its median step is this much faster than the graph's: below it the
# probe cannot tell the paths apart on a machine that drifts 10-20% (and the graph keeps
# every earlier number).
MARGIN = 0.05
# The probe runs when its estimated cost is at most this share of the run's estimated time.
PROBE_SHARE = 0.03
# XLA's compilation of a train step took 1.8-2.2x the graph's first trace (demo and Small,
# pretraining and fine-tuning, docs/benchmarks.md): the probe's cost is estimated from the graph's.
XLA_COMPILE_FACTOR = 2.0
ROUNDS = 3
SAMPLE_SECONDS = 1.0  # the least time one timed sample of one path runs for


def min_probed_steps() -> int:
    """The probe times 2 * ROUNDS samples of at least one step each, besides compiling: a run of
    at most this many steps (200) is too short for it on any machine, so such a run is not even
    timed (its train step is traced by the run itself; no step is taken and undone first)."""
    return round(2 * ROUNDS / PROBE_SHARE)


@dataclasses.dataclass(frozen=True)
class StepPath:
    """The chosen path: `jit_compile` and why (`reason`, one clause), with the probe's median
    seconds per step of each path when it ran."""

    jit_compile: bool
    reason: str
    seconds_per_step: dict | None = None

    @property
    def name(self) -> str:
        return XLA if self.jit_compile else GRAPH

    def line(self) -> str:
        """The log line: the path, why, and the CPU's vector extensions."""
        return (f"train step: {self.name} ({self.reason}; CPU has {vector_extensions()}; "
                f"{onednn_description()})")

    def record(self) -> dict:
        """For the run's record (pretraining_config.json, results.json)."""
        out = {"path": self.name, "reason": self.reason, "cpu": vector_extensions(),
               "onednn": onednn_description()}
        if self.seconds_per_step:
            out["seconds_per_step"] = {k: round(v, 5) for k, v in self.seconds_per_step.items()}
        return out


class Snapshot:
    """The values of some variables, put back by `restore` (the probe's steps undone).

    Variables as Keras or TensorFlow hold them (mirrored ones are assigned on every replica)."""

    def __init__(self, variables):
        seen, self._variables = set(), []
        for v in variables:
            if id(v) not in seen:
                seen.add(id(v))
                self._variables.append(v)
        self._values = [v.numpy() for v in self._variables]

    def restore(self) -> None:
        for variable, value in zip(self._variables, self._values):
            variable.assign(value)


def off_cpu_reason(strategy) -> str | None:
    """Why the probe does not apply under `strategy` (None: it does)."""
    import tensorflow as tf

    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        return "TPU: the TPU strategy compiles every step with XLA itself"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return ("several workers must run one path and each would time its own CPU; "
                "force one with --jit_compile on every worker")
    try:
        devices = list(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError):  # the default strategy: TensorFlow's default device
        devices = [d.name for d in tf.config.list_logical_devices()
                   if d.device_type not in ("CPU",)][:1]
    if any("CPU" not in d.upper() for d in devices):
        return "not a CPU: the probe times CPU paths; force XLA with --jit_compile"
    return None


def _median_seconds(run: Callable[[int], None], steps: int, clock) -> float:
    start = clock()
    run(steps)
    return (clock() - start) / steps


def choose(requested: bool | None, *, strategy, remaining_steps: int,
           runner: Callable[[bool], Callable[[int], None]],
           snapshot: Callable[[], Snapshot], memo_key: str | None = None,
           flag: str = "--jit_compile", clock=time.perf_counter,
           log: Callable[[str], None] | None = None) -> StepPath:
    """The path for a run of `remaining_steps` steps (see the module docstring).

    Args:
      requested: the user's choice (True: XLA, False: graph) or None to choose here.
      strategy: the run's `tf.distribute.Strategy`.
      remaining_steps: the steps the run still has to do.
      runner: `runner(jit_compile)` -> `run(n)`, which takes n train steps on that path (on an
        input of the probe's own, so the run's input is not advanced) and returns when they
        are done. Called at most once per path; the caller keeps what it builds (the chosen
        path's traced function is then the run's).
      snapshot: takes a `Snapshot` of everything a train step changes (model, optimizer);
        called before the first probe step, restored after the last.
      memo_key: what the step computes (model, batch, shapes): a probe's result is reused for
        the same key in this process.
      flag: the flag that forces a path, for the reason's wording.
    """
    if requested is not None:
        return StepPath(bool(requested), f"{flag if requested else '--no' + flag[2:]} given")
    reason = off_cpu_reason(strategy)
    if reason:
        return StepPath(False, reason)
    if memo_key is not None and memo_key in _MEMO:
        known = _MEMO[memo_key]
        return dataclasses.replace(known, reason=known.reason + ", probed earlier in this process")
    if remaining_steps <= min_probed_steps():  # too short whatever a step costs: nothing to time
        return StepPath(False, f"the run ({remaining_steps} steps) is too short for a probe to "
                               f"pay (more than {min_probed_steps()} needed); {flag} forces XLA")
    state = snapshot()
    try:
        graph = runner(False)
        start = clock()
        graph(1)  # the trace
        trace = clock() - start
        estimate = _median_seconds(graph, 1, clock)
        probe_cost = XLA_COMPILE_FACTOR * trace + 2 * ROUNDS * max(SAMPLE_SECONDS, estimate)
        run_seconds = remaining_steps * estimate
        if probe_cost > PROBE_SHARE * run_seconds:
            return StepPath(False, f"the run (~{run_seconds:.0f} s) is too short for a probe "
                                   f"(~{probe_cost:.0f} s) to pay; {flag} forces XLA")
        if log:
            log(f"timing the train step with and without XLA (~{probe_cost:.0f} s, "
                f"{100 * probe_cost / run_seconds:.1f}% of the run)")
        xla = runner(True)
        xla(1)  # the compilation
        xla(1)
        steps = max(1, round(SAMPLE_SECONDS / max(estimate, 1e-6)))
        samples = {GRAPH: [], XLA: []}
        paths = {GRAPH: graph, XLA: xla}
        for r in range(ROUNDS):  # interleaved, alternating which goes first
            for name in ((GRAPH, XLA) if r % 2 == 0 else (XLA, GRAPH)):
                samples[name].append(_median_seconds(paths[name], steps, clock))
    finally:
        state.restore()
    seconds = {name: statistics.median(v) for name, v in samples.items()}
    ratio = seconds[GRAPH] / seconds[XLA]
    measured = (f"timed: graph {1000 * seconds[GRAPH]:.0f} ms/step, XLA "
                f"{1000 * seconds[XLA]:.0f} ms/step")
    if ratio >= 1 + MARGIN:
        chosen = StepPath(True, f"{measured}, XLA {ratio:.2f}x faster", seconds)
    else:
        chosen = StepPath(False, f"{measured}, XLA {ratio:.2f}x: not {1 + MARGIN:.2f}x faster",
                          seconds)
    if memo_key is not None:
        _MEMO[memo_key] = chosen
    return chosen


_MEMO: dict[str, StepPath] = {}
