"""`ProgressLogger`: periodic "step/total, rate, ETA, scalars" lines for long loops.

Example:
>>> progress = ProgressLogger(total_steps=1000, every_n=100, unit="step")
>>> for step in range(1, 1001):
...     train_one_step()
...     progress.update(step, loss=0.5)   # logs at steps 100, 200, ..., 1000
"""

from __future__ import annotations

import time
from typing import Callable

from absl import logging


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m05s'; inf -> '?'."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class ProgressLogger:
    """Logs progress every `every_n` units (or `every_seconds`, whichever comes first).

    The rate is measured since the previous line (so a slow first step, e.g. tracing, does not
    distort later lines); the ETA uses the rate since the logger started counting from
    `initial_step` (a resumed run does not count the steps done before it started).

    Args:
      total_steps: units of the whole job.
      every_n: log when at least this many units passed since the last line (0: never by count).
      every_seconds: log when at least this many seconds passed since the last line (0: never).
      unit: what a unit is called in the line ("step", "example", "MB", ...).
      initial_step: where counting starts (a resumed run's first step).
      log_fn: `absl.logging.info` by default; any printf-style callable.
    """

    def __init__(self, total_steps: int, every_n: int = 100, every_seconds: float = 0.0,
                 unit: str = "step", initial_step: int = 0,
                 log_fn: Callable[..., None] | None = None, clock: Callable[[], float] = time.time):
        self.total = int(total_steps)
        self.every_n = int(every_n)
        self.every_seconds = float(every_seconds)
        self.unit = unit
        self._log = log_fn or logging.info
        self._clock = clock
        self.start_step = self.last_step = int(initial_step)
        self.start_time = self.last_time = clock()
        self.last_line: str | None = None

    def reset_clock(self, step: int | None = None) -> None:
        """Restart timing (e.g. after the first step's tracing), optionally at `step`."""
        if step is not None:
            self.start_step = self.last_step = int(step)
        self.start_time = self.last_time = self._clock()

    def due(self, step: int) -> bool:
        if step >= self.total:
            return True
        if self.every_n and step - self.last_step >= self.every_n:
            return True
        return bool(self.every_seconds) and self._clock() - self.last_time >= self.every_seconds

    def update(self, step: int, force: bool = False, **scalars: float) -> str | None:
        """Logs a line if one is due at `step` (or `force`); returns it (None if not logged)."""
        if not (force or self.due(step)):
            return None
        now = self._clock()
        rate = (step - self.last_step) / max(now - self.last_time, 1e-9)
        overall = (step - self.start_step) / max(now - self.start_time, 1e-9)
        eta = (self.total - step) / overall if overall > 0 else float("inf")
        parts = [f"{self.unit} {step}/{self.total} ({100.0 * step / max(self.total, 1):.1f}%)",
                 f"{rate:.3g} {self.unit}s/s", f"ETA {format_duration(eta)}"]
        parts += [f"{name} {_format_scalar(value)}" for name, value in scalars.items()]
        line = ", ".join(parts)
        self._log("%s", line)
        self.last_step, self.last_time, self.last_line = step, now, line
        return line


def _format_scalar(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.4g}"
