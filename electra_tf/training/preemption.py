"""Stopping a run on SIGTERM (a preemption) or SIGINT (Ctrl-C): what was done is kept, nothing
says the run finished, and the run ends within about a second, not at the end of a long loop.

Python runs a signal handler only when the main thread executes Python code: while it waits in
one TensorFlow call (an in-graph loop of `steps_per_loop` steps, a batch) the signal waits too.
So each loop keeps its TensorFlow calls short and looks at the request between them:

- Pretraining (`StopRequest()`): the handler records the signal; `loop.py` runs calls of about
  a second each and, between two of them, saves a checkpoint at the step reached and returns
  (`PretrainingResult.preempted`). Under MultiWorkerMirroredStrategy the request is summed over
  the workers before each call, so all of them stop at the same step. Before the first call
  ends (the trace and compilation, up to a minute) nothing new could be saved, so a signal then
  raises `Interrupted` at once. A second signal while the run stops raises it too: the
  checkpoint being written is abandoned and its files removed (a rerun resumes from the one
  before).
- Fine-tuning and the demo (`StopRequest(at_once=True)`): the handler raises `Interrupted` at
  the next Python instruction of the main thread: in fine-tuning after the running batch (one
  batch is one TensorFlow call). Every file is written whole by a rename (`electra_tf.files`),
  so an exception anywhere leaves the previous file or the new one, and the `finally` blocks
  remove staging folders and release the folder lock.

`Interrupted` is a `SystemExit`, not an error: code in between that catches `Exception` to carry
on does not take it for a failure of its own, and an uncaught one ends the process with 128 + the
signal (130 for SIGINT, 143 for SIGTERM: how a shell reports a process the signal killed) after
the line the raiser logged. A caller that can say more catches it: the demo names its stage,
electra-pretrain exits 0 on SIGTERM (its documented preemption convention).

Signal handlers can only be installed from the main thread; elsewhere (a caller's thread) the
request is inert and the caller's own handling applies. The previous handlers come back when
the block ends, so requests nest (the demo's around fine-tuning's).
"""

from __future__ import annotations

import signal
import threading

from absl import logging

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupted(SystemExit):
    """A run stopped on `signum` after keeping what it could; `message` is one line saying where
    it stopped and what a rerun does. Exits 128 + `signum` when nobody catches it."""

    def __init__(self, message: str, signum: int):
        super().__init__(128 + signum)
        self.message, self.signum = message, signum

    def __str__(self) -> str:
        return self.message


class StopRequest:
    """While the block runs (main thread only), SIGTERM and SIGINT set `signum`.

    at_once=False (the pretraining loop): the first signal is only recorded, the loop stops at
    its next check; a second one raises `Interrupted`. at_once=True (fine-tuning, the demo, and
    the pretraining loop until its first call ends, when nothing new could be saved): every
    signal raises `Interrupted` there and then, except inside a `__del__` (Python would print
    the exception and drop it); then the loop's next `check()` raises it, or the block's end.
    `progress` (what the run has done, set by its loop: "12 of 40 steps") goes into the message.
    """

    def __init__(self, at_once: bool = False):
        self.at_once = at_once
        self.signum: int | None = None
        self.progress: str | None = None
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        again = self.signum is not None
        self.signum = signum
        if self.at_once:
            if _in_finalizer(frame):
                return  # Python would print the exception and drop it: raised at the next check
            raise self._interrupted()
        if again:
            raise Interrupted(f"stopped on a second {signal_name(signum)} without finishing the "
                              "checkpoint", signum)
        logging.warning("%s: stopping within about a second, with a checkpoint at that step (a "
                        "second signal stops at once, without it)", signal_name(signum))

    def check(self) -> None:
        """Raises `Interrupted` when a signal was recorded."""
        if self.signum is not None:
            raise self._interrupted()

    def _interrupted(self) -> Interrupted:
        after = f" after {self.progress}" if self.progress else ""
        return Interrupted(f"stopped on {signal_name(self.signum)}{after}", self.signum)

    def __exit__(self, kind, error, traceback):
        for s, previous in self._previous.items():
            # None: a handler not set from Python; the default is what the process had before.
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
        if self.at_once and kind is None:
            self.check()  # a signal that came in a `__del__`: the run stops anyway


def _in_finalizer(frame, depth: int = 64) -> bool:
    """Whether `frame` runs inside a `__del__` (TensorFlow has many: iterators, resources)."""
    while frame is not None and depth:
        if frame.f_code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth - 1
    return False
