"""How many request bytes the server turns into Python objects at once.

A request body is small next to what parsing makes of it: `json.loads` of 16 MiB of
`["ab","ab",...]` builds 3.4 million string objects (~190 MB), `[[],[],...]` 5.6 million lists
(~400 MB), and converting the inputs to arrays makes as many objects again; a gRPC
PredictRequest of 4 million tiny strings becomes 4 million bytes objects as numpy. Each body is
checked against `max_body_bytes` and each batch against `max_batch_size` before any of that
(`rest_connections.read_body`, `json_api`, `grpc_api`), but a request within both limits still
expands, and four clients sending one at once made the server's RSS grow by 1.8 GB
(`benchmarks/load_test_serving.py --phases=memory`).

`ParseBudget` bounds the sum: a request holds as many bytes of the budget as its body has while
it is parsed and its inputs converted, and waits, in arrival order, until they are free. The
budget is one maximal body (`max_body_bytes`), so the parsing costs at most what one maximal
body costs, however many arrive at once; small requests share it without waiting for each
other. Nothing is lost in speed: parsing runs under the GIL, so two parses never ran at once
anyway. The model call comes after the budget is released (it is bounded by the scheduler,
`serving.batching`).

When a large request releases its bytes, glibc's `malloc_trim` hands the freed heap back to the
system (the per-thread arenas keep freed chunks otherwise). Four 16 MiB bodies parsed at once had
left the RSS 800 MiB above where it started once they were answered; parsed one at a time and
trimmed, it is back within 20 MiB.

While a large request (1 MiB or more) is parsed, Python's cyclic garbage collector is paused.
Parsing makes millions of containers and no cycles, but every 700 of them started a collection,
and the oldest generation's ones walk every object of the process, TensorFlow's included: 4 MiB
of `[[],[],...]` took 1.3 s to parse in a process with TensorFlow loaded, under the GIL, instead
of 0.07 s.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import logging
import threading
import traceback

log = logging.getLogger(__name__)

_LARGE_BYTES = 1 << 20  # a body this large: parsed with the garbage collector paused, then a heap trim


def _malloc_trim():
    """glibc's malloc_trim, or None (another libc: the freed memory stays with the process)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


class ParseBudget:
    """At most `limit` bytes of requests being parsed and converted at once; first come, first served.

    Args:
        limit: bytes; a request larger than `limit` holds all of it.

    Example:

        budget = ParseBudget(16 << 20)
        with budget.hold(len(body)):
            inputs = parse(body)   # the parsed objects must not outlive the block
        run(inputs)
    """

    def __init__(self, limit: int):
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        self.limit = limit
        self._used = 0
        self._queue: collections.deque = collections.deque()
        self._changed = threading.Condition()

    def hold(self, size: int) -> "_Held":
        """A context manager: `size` bytes of the budget (at most all of it) inside the block."""
        return _Held(self, max(0, min(size, self.limit)))

    def _acquire(self, size: int) -> None:
        ticket = object()
        with self._changed:
            self._queue.append(ticket)
            # In arrival order: a large request is never passed by a stream of small ones.
            self._changed.wait_for(lambda: self._queue[0] is ticket and self._used + size <= self.limit)
            self._queue.popleft()
            self._used += size
            self._changed.notify_all()  # the next in line may fit beside this one

    def _release(self, size: int) -> None:
        with self._changed:
            self._used -= size
            self._changed.notify_all()


class _Held:
    def __init__(self, budget: ParseBudget, size: int):
        self._budget, self._size = budget, size

    def __enter__(self) -> None:
        self._budget._acquire(self._size)
        if self._size >= _LARGE_BYTES:
            _pause_gc()

    def __exit__(self, exc_type, exc, tb) -> bool:
        # An error raised in the block (a client's, mostly) carries the frames it was raised
        # from, and their locals are what was parsed: cleared here (the traceback's lines stay
        # for the log), or they would live on beyond the release until the answer is sent,
        # beside the next request's. Found by the memory test: 4 bodies of nested lists took
        # 820 MiB, twice what one costs, until this was done.
        error, seen = exc, set()
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            if error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__)
            error = error.__cause__ or error.__context__
        if self._size >= _LARGE_BYTES:
            _resume_gc()
        self._budget._release(self._size)
        trim_heap(self._size)
        return False


_gc_lock = threading.Lock()
_gc_pauses = 0  # large requests being parsed
_gc_paused_here = False  # whether the collector was on when the first of them began


def _pause_gc() -> None:
    global _gc_pauses, _gc_paused_here
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_paused_here = gc.isenabled()  # a process that keeps it off keeps it off
            gc.disable()
        _gc_pauses += 1


def _resume_gc() -> None:
    global _gc_pauses
    with _gc_lock:
        _gc_pauses -= 1
        if _gc_pauses == 0 and _gc_paused_here:
            gc.enable()


def trim_heap(size: int) -> None:
    """After a request of `size` bytes: hand the freed heap back to the system if it was large."""
    if size >= _LARGE_BYTES:
        release_freed_heap()


def release_freed_heap() -> None:
    """Hand the heap freed so far back to the system (glibc's malloc_trim; elsewhere nothing)."""
    if _TRIM is not None:
        _TRIM(0)
