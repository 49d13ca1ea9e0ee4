"""SIGTERM during pretraining (a preemption): finish the current loop, checkpoint, stop.

The loop passes `requested` into its step function, which max-reduces it across workers, so every
worker stops at the same loop boundary (`steps.make_loop_fn`).
"""

from __future__ import annotations

import signal
import threading

from absl import logging


class StopRequest:
    """Sets a flag on SIGTERM (main thread only); restores the previous handler on exit."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):
        logging.warning("SIGTERM: saving a checkpoint at the end of the current loop")
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
