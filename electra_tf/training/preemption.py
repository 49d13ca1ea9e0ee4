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
- Fine-tuning and the demo (`StopRequest(at_once=True)`): `Interrupted` is raised at once, or
  where that is not safe (below) at the next line of this project's own code the main thread
  runs: in fine-tuning after the running batch (one batch is one TensorFlow call). Every file
  is written whole by a rename (`electra_tf.files`), so an exception anywhere leaves the
  previous file or the new one, and the `finally` blocks remove staging folders and release
  the folder lock.

Where the exception is raised matters. A handler runs at whatever Python instruction the main
thread is on, often inside TensorFlow's own Python called back from its C++ (tracing a function,
a tensor's consumers, a finalizer), where C++ does not expect a Python exception: raised there,
it came out as `SystemError: ... bad argument to internal function` or aborted the process (a
signal sent while fine-tuning traced its evaluation step). And not every instruction of Python
3.11 is covered by the handlers of the blocks around it: raised at a `try:` line or at the end
of a `with` block (its `__exit__` call is run as that `with` line), the exception skips the
enclosing `with` blocks' exits (TensorFlow's tracing then asserts on its next function). So the
handler raises at once only where that is safe: at neither kind of instruction, in the
project's own frames (a module of `electra_tf`, its binaries, or the `__main__` script: code
only Python calls) or the standard library's called from them (a `time.sleep`, a subprocess's
wait: Python would otherwise resume the wait). Elsewhere it records the signal and sets a trace
function (`sys.settrace`, this thread, until it fires) that raises at the next line event of the
project's own frames that is at neither.
The trace costs a little on each Python call while it waits: until the running TensorFlow call
returns to the project's code. A trace function set before (a debugger, coverage) comes back
when the block ends without the raise; after it, Python has unset tracing (as it does for any
trace function that raises).

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

import dis
import functools
import os
import signal
import sys
import sysconfig
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
    signal raises `Interrupted`. Either is raised at once where that is safe, else at the next
    safe line of this project's code (module docstring), never inside a `__del__` (Python would
    print the exception and drop it); one still waiting when the block ends is raised there.
    `progress` (what the run has done, set by its loop: "12 of 40 steps") goes into the message.
    """

    def __init__(self, at_once: bool = False):
        self.at_once = at_once
        self.signum: int | None = None
        self.progress: str | None = None
        self._previous: dict = {}
        self._pending: _RaiseInOwnCode | None = None

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
            self._raise_when_safe(frame, self._interrupted)
            return
        if again:
            self._raise_when_safe(frame, lambda: Interrupted(
                f"stopped on a second {signal_name(signum)} without finishing the checkpoint",
                signum))
            return
        logging.warning("%s: stopping within about a second, with a checkpoint at that step (a "
                        "second signal stops at once, without it)", signal_name(signum))

    def _raise_when_safe(self, frame, interrupted) -> None:
        """Raises `interrupted()` now if that is safe, else at the next safe line of this
        project's code (module docstring)."""
        if self._pending is not None:
            self._pending.error = interrupted  # a second signal while the first waits
        elif _safe_now(frame):
            raise interrupted()
        else:
            self._pending = _RaiseInOwnCode(interrupted, frame, self._stop_waiting)

    def _stop_waiting(self) -> None:
        if self._pending is not None:
            self._pending.remove()
            self._pending = None

    def check(self) -> None:
        """Raises `Interrupted` when a signal was recorded."""
        if self.signum is not None:
            raise self._interrupted()

    def _interrupted(self) -> Interrupted:
        after = f" after {self.progress}" if self.progress else ""
        return Interrupted(f"stopped on {signal_name(self.signum)}{after}", self.signum)

    def __exit__(self, kind, error, traceback):
        waiting = self._pending
        self._stop_waiting()
        for s, previous in self._previous.items():
            # None: a handler not set from Python; the default is what the process had before.
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
        if kind is None and waiting is not None:
            raise waiting.error()  # a signal still waiting for a line of our code
        if self.at_once and kind is None:
            self.check()


def _in_finalizer(frame, depth: int = 64) -> bool:
    """Whether `frame` runs inside a `__del__` (TensorFlow has many: iterators, resources)."""
    while frame is not None and depth:
        if frame.f_code.co_name == "__del__":
            return True
        frame, depth = frame.f_back, depth - 1
    return False


# Modules whose lines only Python calls: an exception raised there unwinds through Python alone.
_OWN_MODULES = ("electra_tf", "tools")


def _own(frame) -> bool:
    name = frame.f_globals.get("__name__") or ""
    if name == __name__:
        return False  # this module's own lines (`__exit__` restores the handlers, then raises)
    return name == "__main__" or name.split(".")[0] in _OWN_MODULES


class _RaiseInOwnCode:
    """Raises `error()` at the next line event of this project's frames on this thread (the
    frames on the stack now: their `f_trace`; those called from here on: a `sys.settrace`
    function tracing only them) where raising is safe. Then puts back the trace it replaced."""

    def __init__(self, error, frame, done):
        self.error, self._done = error, done
        self._previous = sys.gettrace()
        self._frames = []
        while frame is not None:
            if _own(frame):
                frame.f_trace = self._line
                self._frames.append(frame)
            frame = frame.f_back
        sys.settrace(self._call)

    def _call(self, frame, event, arg):
        if not _own(frame):
            return None
        self._frames.append(frame)  # its f_trace becomes `_line`: cleared in `remove`
        return self._line

    def _line(self, frame, event, arg):
        if event != "line" or not _can_raise_at(frame) or _in_finalizer(frame):
            return self._line
        error = self.error
        self._done()
        raise error()

    def remove(self) -> None:
        sys.settrace(self._previous)
        for frame in self._frames:
            frame.f_trace = None
        self._frames = []


_NOP = dis.opmap["NOP"]
_WITH_OPS = ("BEFORE_WITH", "BEFORE_ASYNC_WITH", "LOAD_SPECIAL")  # LOAD_SPECIAL: Python 3.14


def _safe_now(frame) -> bool:
    """Whether the handler may raise in `frame` at once: at a safe instruction, and the frames
    from there to the nearest of the project's are the standard library's (Python code the
    project called, as `time.sleep` or `subprocess.run`), none a library's that C++ may have
    called. A signal during such a wait stops it: raised later, it would wait to its end (Python
    resumes an interrupted wait whose handler did not raise)."""
    if not _can_raise_at(frame) or _in_finalizer(frame):
        return False
    while frame is not None and not _own(frame):
        if not _stdlib(frame):
            return False
        frame = frame.f_back
    return frame is not None


_STDLIB = os.path.join(sysconfig.get_paths()["stdlib"], "")


def _stdlib(frame) -> bool:
    name = frame.f_code.co_filename
    return name.startswith("<frozen ") or (name.startswith(_STDLIB) and "site-packages" not in name)


def _can_raise_at(frame) -> bool:
    """Whether an exception raised at this line event runs the exits of the `with` blocks around
    it: not at a NOP (a `try:` line, `pass`), nor at a `with` line (its exit runs as that line)."""
    return (frame.f_code.co_code[frame.f_lasti] != _NOP
            and frame.f_lineno not in _with_lines(frame.f_code))


@functools.lru_cache(maxsize=4096)
def _with_lines(code) -> frozenset:
    return frozenset(i.positions.lineno for i in dis.get_instructions(code)
                     if i.opname in _WITH_OPS)
