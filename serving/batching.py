"""How model calls are scheduled: a bounded number at a time, in arrival order, batched or not.

A request thread (REST connection or gRPC worker) validates its inputs, then hands the model
call to a scheduler and waits. Two schedulers share one method, `run(signature, inputs)`:

- `Unbatched(threads)`: at most `threads` calls at once (default: one per core); the
  others wait first come, first served. `threading.Semaphore` would let a newcomer take a
  freed slot ahead of a thread that has waited longer, which shows in the tail latency.
- `Batcher(parameters)`: TF Serving's `--enable_batching`. Concurrent requests for the same
  signature of the same loaded version whose inputs have the same names, dtypes and
  non-batch dimensions are queued together and run as one call on their rows
  concatenated; the outputs are split back by rows. `num_batch_threads` threads run
  batches (they are the compute bound); with `batch_timeout_micros` 0 a batch is whatever
  is queued when a thread comes free, so batches grow with the load and cost nothing
  without it. An input without a batch dimension runs alone.

A batch must not let one request's error reach the others: if the merged call fails, or
its outputs cannot be split by rows, each request of the batch is run again on its own
and gets its own answer or error.

Deadlines. A request handler states how long its model calls may wait (`request_deadline`:
the gRPC client's deadline, or the REST server's `--rest_api_timeout_in_ms`). A request still
waiting when its deadline passes (without batching: when it could no longer end in time, see
`Unbatched`) is answered then and never runs: without batching,
DEADLINE_EXCEEDED (TF Serving's status for a session run past its timeout); with batching,
RESOURCE_EXHAUSTED "Run() timeout exceeded while waiting in batching queue" (TF Serving's
words, batching_session.cc), whether the deadline passes in the queue or as its batch is
formed. So an overloaded server spends its model calls on requests whose clients still wait.
Two differences from TF Serving: a request of a batch whose deadline has passed is dropped
from the batch (TF Serving runs it if another request of the batch is still in time), and a
call that started in time runs to its end and is answered (TF Serving cancels the session
run; a TensorFlow function called from Python cannot be cancelled).

`BatchingParameters` (serving/batching_parameters.py) reads TF Serving's `--batching_parameters_file` (a text
`BatchingParameters` proto); its defaults are TF Serving's (`BasicBatchScheduler::Options`), and
its `allowed_batch_sizes`, `enable_large_batch_splitting` / `max_execution_batch_size` and
`pad_variable_length_inputs` do what batching_session.cc does with them (`_merged`; a large
request is split into execution-sized parts up front, where TF Serving also splits one to fill a
batch's remaining room: the answers are the same).

Per-model parameters (TF Serving's --enable_per_model_batching_parameters): a signature whose
`batching` attribute holds its version's own `BatchingParameters` (read from the version's
`batching_params.pbtxt`, `batching_parameters.read_model_batching_parameters`) is queued with that max_batch_size,
batch_timeout_micros and max_enqueued_batches; `NOT_BATCHED` (a version without the file) runs
each request alone, at most num_batch_threads at once. The batch threads stay the server's, as
TF Serving's shared batch thread pool.

Example:

    params = batching_parameters.read_batching_parameters("batching.config")  # max_batch_size { value: 32 } ...
    batcher = Batcher(params)
    outputs = batcher.run(signature, {"text": np.array([b"a movie"], dtype=object)})
    batcher.stop()
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import logging
import math
import os
import threading
import time
import weakref
from typing import Mapping, Protocol

import grpc
import numpy as np

from electra_tf.serving.batching_parameters import NOT_BATCHED, BatchingParameters
from electra_tf.serving.errors import ServingError, invalid, unavailable, without_paths
from electra_tf.serving.metrics import Metrics

log = logging.getLogger(__name__)


class ModelCall(Protocol):
    """What a scheduler runs: `servables.Signature`."""

    name: str

    def call(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


# ----------------------------------------------------------------------------- deadlines

# time.monotonic() by which the current request's model calls must have started; None: no limit.
# A context variable: each request thread (REST connection, gRPC worker) sees its own.
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("request_deadline", default=None)

BATCH_QUEUE_TIMEOUT = "Run() timeout exceeded while waiting in batching queue"  # TF Serving's words


@contextlib.contextmanager
def request_deadline(seconds: float | None):
    """Model calls this thread makes in the block must start within `seconds` from now (None or
    infinite: no limit); see the module docstring."""
    deadline = None if seconds is None or math.isinf(seconds) else time.monotonic() + max(0.0, seconds)
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _deadline_exceeded(waited: float, what: str) -> ServingError:
    return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"Deadline exceeded: the request waited {waited * 1000:.0f} ms for {what} and was not run")


# ----------------------------------------------------------------------------- unbatched


class FifoSlots:
    """At most `n` holders at once; waiters are served in arrival order."""

    def __init__(self, n: int):
        self.n = n
        self._free = n
        self._waiters: collections.deque[threading.Lock] = collections.deque()
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        """Takes a slot if one is free and nobody waits for it."""
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return True
            return False

    def acquire(self, deadline: float | None = None) -> bool:
        """Takes a slot; False (and no slot) if `deadline` (time.monotonic()) passes first."""
        with self._lock:
            if self._free and not self._waiters:
                self._free -= 1
                return True
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        # released by the holder that hands its slot over
        if turn.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
            return True
        with self._lock:
            try:
                self._waiters.remove(turn)
                return False
            except ValueError:  # handed over as the wait ended: the slot is ours, pass it on
                pass
        turn.acquire()
        self.release()
        return False

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
            else:
                self._free += 1

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class Unbatched:
    """Runs each request's model call on its own, at most `threads` at once, first come first served.

    A request with a deadline (`request_deadline`) that has to wait for a thread waits only
    while it could still end in time: until its deadline less what such a call took lately (the
    lower median of the last 5 calls of its signature on as many rows), and is refused unrun
    after. Starting it anyway would spend a model thread on an answer that arrives too late,
    while the requests behind it wait: under overload, first-come-first-served then serves each
    request just before its deadline, and nearly every answer misses it (docs/benchmarks.md,
    "Deadlines under overload"). A request that finds a thread free runs if its deadline has not
    passed, whatever the estimate: one slow call (a version's first) must not refuse the
    requests of an idle server, whose calls then bring the estimate back."""

    _RECENT = 5  # calls the estimate looks at

    def __init__(self, threads: int = os.cpu_count() or 1):
        if threads < 1:
            raise ValueError(f"model threads must be >= 1, got {threads}")
        self._slots = FifoSlots(threads)
        # signature -> {rows: seconds of its last calls}; weak: an unloaded version's goes with it
        self._seconds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def expected_seconds(self, signature: ModelCall, rows: int | None) -> float:
        """The lower median of the last calls of `signature` on `rows` rows; 0 before the first."""
        recent = sorted(self._seconds.get(signature, {}).get(rows, ()))
        return recent[(len(recent) - 1) // 2] if recent else 0.0

    def run(self, signature: ModelCall, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        deadline, rows = _DEADLINE.get(), _batch_rows(inputs)
        if deadline is None:
            with self._slots:
                return self._timed(signature, inputs, rows)
        start = time.monotonic()
        if start >= deadline:
            raise _deadline_exceeded(0.0, f"one of {self._slots.n} model threads")
        if not self._slots.try_acquire():  # none free: wait while the call could still end in time
            needed = self.expected_seconds(signature, rows)
            if not self._slots.acquire(deadline - needed):
                waited = time.monotonic() - start
                if needed and waited < deadline - start:
                    raise ServingError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                       f"Deadline exceeded: the request waited {waited * 1000:.0f} ms for one of"
                                       f" {self._slots.n} model threads and was not run, as it could no longer"
                                       f" end in time (such a call took ~{needed * 1000:.0f} ms lately)")
                raise _deadline_exceeded(waited, f"one of {self._slots.n} model threads")
        try:
            return self._timed(signature, inputs, rows)
        finally:
            self._slots.release()

    def _timed(self, signature: ModelCall, inputs: Mapping[str, np.ndarray], rows: int | None):
        start = time.monotonic()
        outputs = signature.call(inputs)
        seconds = time.monotonic() - start
        try:
            by_rows = self._seconds.setdefault(signature, {})
        except TypeError:  # not weakly referable: no estimate
            return outputs
        by_rows.setdefault(rows, collections.deque(maxlen=self._RECENT)).append(seconds)
        return outputs

    def stop(self) -> None:
        pass


# ----------------------------------------------------------------------------- batched


class _Task:
    def __init__(self, signature: ModelCall, inputs: Mapping[str, np.ndarray], rows: int, key: object):
        self.signature, self.inputs, self.rows, self.key = signature, inputs, rows, key
        self.enqueued = time.monotonic()
        self.deadline = _DEADLINE.get()
        self.outputs: dict[str, np.ndarray] | None = None
        self.parameters: BatchingParameters | None = None  # its queue's (set by Batcher._enqueue)
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run_alone(self) -> None:
        try:
            self.outputs = self.signature.call(self.inputs)
        except BaseException as e:  # noqa: BLE001  (handed to the request thread, which reports it)
            self.error = e
        self.done.set()


class _Queue:
    def __init__(self, parameters: BatchingParameters):
        self.tasks: collections.deque[_Task] = collections.deque()
        self.rows = 0
        self.parameters = parameters  # the server's, or the signature's version's own


def _batch_rows(inputs: Mapping[str, np.ndarray]) -> int | None:
    """The common size of dimension 0 of the inputs, or None if they have none."""
    sizes = {v.shape[0] if v.ndim else None for v in inputs.values()}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


class Batcher:
    """Merges concurrent requests into batches; see the module docstring."""

    def __init__(self, parameters: BatchingParameters = BatchingParameters(), *, metrics: Metrics | None = None):
        self.parameters = parameters
        self._metrics = metrics if metrics is not None else Metrics()  # serving.metrics; off by default
        self._queues: dict[object, _Queue] = {}
        self._cond = threading.Condition()
        self._stopping = False
        # batches: model calls made; merged: requests answered from a merged call; alone:
        # requests of a batch that failed whole, run again on their own.
        self.stats = collections.Counter(batches=0, merged=0, alone=0)
        self._not_batched = Unbatched(parameters.num_batch_threads)  # versions that ask for no batching
        self._threads = [
            threading.Thread(target=self._loop, name=f"batch-{i}", daemon=True)
            for i in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def run(self, signature: ModelCall, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        p = getattr(signature, "batching", None) or self.parameters
        if p is NOT_BATCHED:
            return self._not_batched.run(signature, inputs)
        rows = _batch_rows(inputs)
        if rows is None:
            key, rows = object(), 1  # a queue of its own: it runs alone
        else:  # with pad_variable_length_inputs only the rank must agree, the sizes are padded
            key = (signature, tuple(sorted((k, v.dtype.str, v.ndim if p.pad_variable_length_inputs else v.shape[1:])
                                           for k, v in inputs.items())))
        if rows > p.max_batch_size:
            raise invalid(f"Task size {rows} is larger than maximum batch size {p.max_batch_size}")
        limit = p.execution_batch_size
        if rows <= limit:
            return self._wait(self._enqueue(signature, inputs, rows, key, p))
        # enable_large_batch_splitting: the request's rows run as several batches
        tasks = [self._enqueue(signature, {k: v[start:start + limit] for k, v in inputs.items()},
                               min(limit, rows - start), key, p) for start in range(0, rows, limit)]
        parts = [self._wait(task) for task in tasks]
        return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    def _enqueue(self, signature: ModelCall, inputs: Mapping[str, np.ndarray], rows: int, key,
                 p: BatchingParameters) -> _Task:
        task = _Task(signature, inputs, rows, key)
        task.parameters = p
        if task.deadline is not None and task.enqueued >= task.deadline:
            raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, BATCH_QUEUE_TIMEOUT)
        limit = p.execution_batch_size
        with self._cond:
            if self._stopping:
                raise unavailable("the server is stopping")
            queue = self._queues.setdefault(key, _Queue(p))
            if math.ceil((queue.rows + rows) / limit) > p.max_enqueued_batches:
                if not queue.tasks:
                    del self._queues[key]
                raise unavailable(
                    f"The batch scheduling queue to which this task was submitted is full"
                    f" ({p.max_enqueued_batches} batches of {limit} rows wait)"
                )
            queue.tasks.append(task)
            queue.rows += rows
            self._cond.notify()
        return task

    def _wait(self, task: _Task) -> dict[str, np.ndarray]:
        """The outputs of `task`; RESOURCE_EXHAUSTED if its deadline passes before a batch takes it."""
        if task.deadline is not None and not task.done.wait(max(0.0, task.deadline - time.monotonic())):
            with self._cond:
                queue = self._queues.get(task.key)
                if queue is not None and task in queue.tasks:  # not taken into a batch yet
                    queue.tasks.remove(task)
                    queue.rows -= task.rows
                    if not queue.tasks:
                        del self._queues[task.key]
                    raise ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, BATCH_QUEUE_TIMEOUT)
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.outputs

    def stop(self) -> None:
        """Run what is queued, then stop the batch threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        self._not_batched.stop()
        log.info(
            "batching: %d model calls; %d requests answered from merged calls, %d run again alone",
            self.stats["batches"], self.stats["merged"], self.stats["alone"],
        )

    def _loop(self) -> None:
        while True:
            with self._cond:
                batch = self._next_batch()
            if batch is None:
                return
            if not batch:  # every request taken had passed its deadline
                continue
            try:
                self._process(batch)
            except BaseException as e:  # noqa: BLE001  (a batch thread must outlive any batch)
                log.exception("batch of %d requests failed", len(batch))
                for task in batch:
                    if not task.done.is_set():
                        task.error = ServingError(grpc.StatusCode.INTERNAL,
                                                  f"batch failed: {type(e).__name__}: {without_paths(str(e))}")
                        task.done.set()

    def _next_batch(self) -> list[_Task] | None:
        """Under the lock: wait for a batch that is full or due, oldest first, and take it."""
        while True:
            now, due, wake = time.monotonic(), None, None
            for key, queue in self._queues.items():
                oldest, timeout = queue.tasks[0].enqueued, queue.parameters.batch_timeout_micros / 1e6
                if queue.rows >= queue.parameters.execution_batch_size or now - oldest >= timeout or self._stopping:
                    if due is None or oldest < self._queues[due].tasks[0].enqueued:
                        due = key
                else:
                    wake = oldest + timeout if wake is None else min(wake, oldest + timeout)
            if due is not None:
                return self._take(due)
            if self._stopping:
                return None
            self._cond.wait(None if wake is None else wake - now)

    def _take(self, key) -> list[_Task]:
        """Under the lock: the oldest requests of `key`'s queue that fit a batch; those whose
        deadline has passed are answered RESOURCE_EXHAUSTED instead (module docstring)."""
        queue, batch, rows, now = self._queues[key], [], 0, time.monotonic()
        while queue.tasks and rows + queue.tasks[0].rows <= queue.parameters.execution_batch_size:
            task = queue.tasks.popleft()
            queue.rows -= task.rows
            if task.deadline is not None and now >= task.deadline:
                task.error = ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, BATCH_QUEUE_TIMEOUT)
                task.done.set()
                continue
            batch.append(task)
            rows += task.rows
        if not queue.tasks:
            del self._queues[key]
        return batch

    def _count(self, **counts: int) -> None:
        with self._cond:
            self.stats.update(counts)

    def _process(self, batch: list[_Task]) -> None:
        p, total = batch[0].parameters, sum(task.rows for task in batch)
        padded = p.padded_size(total)  # allowed_batch_sizes
        self._metrics.observe_batch(padded, padded - total)  # TF Serving's processed_batch_size counts the padding
        if len(batch) == 1 and padded == total:
            self._count(batches=1)
            return batch[0].run_alone()
        signature = batch[0].signature
        try:
            outputs = signature.call(_merged(batch, padded - total, p.pad_variable_length_inputs))
            if any(v.ndim == 0 or v.shape[0] != padded for v in outputs.values()):
                raise ValueError("an output is not batch-major")
        except Exception as e:  # noqa: BLE001  (each request then gets its own answer)
            log.debug("batch of %d for %r ran request by request: %s", len(batch), signature.name, e)
            self._count(batches=1 + len(batch), alone=len(batch))
            for task in batch:
                task.run_alone()
            return
        self._count(batches=1, merged=len(batch))
        start = 0
        for task in batch:  # the padding rows' outputs, past the last task's, are dropped
            task.outputs = {k: v[start:start + task.rows] for k, v in outputs.items()}
            start += task.rows
            task.done.set()


def _merged(batch: list[_Task], padding_rows: int, pad_lengths: bool) -> dict[str, np.ndarray]:
    """The batch's inputs, row after row; with `pad_lengths` each padded in its other dimensions
    to the batch's largest with its own first value, and `padding_rows` copies of the last
    task's first row after them (TF Serving's batching_session.cc pads both ways so)."""
    merged = {}
    for key in batch[0].inputs:
        arrays = [task.inputs[key] for task in batch]
        if pad_lengths:
            widest = np.max([a.shape for a in arrays], axis=0)
            arrays = [a if a.shape[1:] == tuple(widest[1:]) else
                      np.pad(a, [(0, 0)] + [(0, int(w - d)) for w, d in zip(widest[1:], a.shape[1:])],
                             constant_values=a.flat[0]) for a in arrays]
        if padding_rows:
            arrays.append(np.repeat(arrays[-1][:1], padding_rows, axis=0))
        merged[key] = np.concatenate(arrays)
    return merged
