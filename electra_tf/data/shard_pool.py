"""Running the shard workers: in the builder's process, or in a pool of spawned processes that
a signal, a dead worker or an error stops whole (step 2 and 5 of `shards.py`).

SIGTERM or SIGINT to the builder raises `BuildInterrupted` (`signals_raise_interrupted`); the pool
is then stopped (`stop_workers`: SIGTERM, then SIGKILL after `STOP_GRACE_SECONDS`) and every
shard temporary removed (`remove_temp_files`), so only finished shards stay."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from typing import Callable, Sequence

from absl import logging

from electra_tf.data.manifest import SHARD_PREFIX
from electra_tf.data.shard_config import (
    EMBEDDED_INPUT, STATS_DIR, STOP_GRACE_SECONDS, BuildConfig, BuildInterrupted)
from electra_tf.data.shard_worker import _init_pool_worker, _init_worker, build_shard
from electra_tf.data.text_files import UnitIndex


class Progress:
    """Counts finished shards and logs bytes done, MB/s, tokens/s and ETA at most every `every`
    seconds; `on_shard_done(stats)` hears of each shard as it finishes."""

    def __init__(self, total_bytes: int, shards_done: int, num_shards: int, every: float = 5.0,
                 on_shard_done: Callable | None = None):
        self.total, self.every = max(total_bytes, 1), every
        self.shards_done, self.num_shards = shards_done, num_shards
        self.on_shard_done = on_shard_done
        self.bytes = self.tokens = 0
        self.start = self.last = time.time()

    def shard_finished(self, stats: dict) -> None:
        self.shards_done += 1
        if self.on_shard_done is not None:
            self.on_shard_done(stats)

    def drain(self, queue) -> None:
        """Adds what the workers reported (`_report`: bytes, WordPieces) since the last call."""
        while not queue.empty():
            self.add(*queue.get())

    def add(self, nbytes: int, ntokens: int, force=False):
        shards_done, num_shards = self.shards_done, self.num_shards
        self.bytes += nbytes
        self.tokens += ntokens
        now = time.time()
        if force or now - self.last >= self.every:
            self.last = now
            elapsed = max(now - self.start, 1e-6)
            rate = self.bytes / elapsed
            eta = (self.total - self.bytes) / rate if rate > 0 else float("inf")
            logging.info(
                "%.1f/%.1f MB (%.1f%%), %d/%d shards, %.2f MB/s, %.0f tokens/s, "
                "elapsed %.0fs, ETA %.0fs",
                self.bytes / 1e6, self.total / 1e6, 100.0 * self.bytes / self.total,
                shards_done, num_shards, rate / 1e6, self.tokens / elapsed, elapsed, eta,
            )


def input_description(files: Sequence[str], embedded: bool) -> list:
    if embedded:
        return [{"path": EMBEDDED_INPUT, "bytes": os.path.getsize(files[0])}]
    return [{"path": f, "bytes": os.path.getsize(f)} for f in files]


def remove_temp_files(output_dir: str) -> None:
    """Deletes the temp files of unfinished shards (and their stats) in `output_dir`: ours,
    `.<shard>.<random>.tmp`, and the fixed `.<shard>.tmp` of older versions. A link there is
    removed, not followed; a `.shard_stats` that became a link is not entered."""
    stats_dir = os.path.join(output_dir, STATS_DIR)
    temp = [os.path.join(output_dir, n) for n in os.listdir(output_dir)
            if n.startswith("." + SHARD_PREFIX) and n.endswith(".tmp")]
    if os.path.isdir(stats_dir) and not os.path.islink(stats_dir):
        temp += [os.path.join(stats_dir, n) for n in os.listdir(stats_dir) if n.endswith(".tmp")]
    for path in temp:
        with contextlib.suppress(FileNotFoundError):  # a worker may delete its own meanwhile
            os.remove(path)


@contextlib.contextmanager
def signals_raise_interrupted():
    """While the block runs, SIGTERM and SIGINT raise BuildInterrupted (main thread only).

    The first signal also ignores further ones, so the cleanup it starts is not cut short; the
    cleanup is bounded (STOP_GRACE_SECONDS), and the previous handlers come back afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal.signal works in the main thread only; a caller's thread keeps its handling
        return
    signums = (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.getsignal(s) for s in signums}

    def interrupted(signum, frame):
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        raise BuildInterrupted(f"interrupted by {signal.Signals(signum).name}", signum)

    for s in signums:
        signal.signal(s, interrupted)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_workers(workers: list) -> None:
    """SIGTERM to each pool process (it deletes its temp file and exits), SIGKILL if it lingers."""
    for p in workers:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in workers:
        if p.is_alive():
            p.kill()
            p.join()


def build_in_process(config: BuildConfig, index: UnitIndex, num_shards: int, todo: list,
                      progress: Progress) -> None:
    import queue as queue_lib

    q = queue_lib.SimpleQueue()
    _init_worker(config, index, num_shards, q)
    for s in todo:
        progress.shard_finished(build_shard(s))
        progress.drain(q)


def build_in_pool(config: BuildConfig, index: UnitIndex, num_shards: int, todo: list,
                   num_processes: int, progress: Progress) -> None:
    # Spawned workers (TF is not fork-safe). ProcessPoolExecutor, unlike Pool, fails with
    # BrokenProcessPool instead of hanging when a worker dies (OOM killer, signal).
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    others = set(multiprocessing.active_children())  # the caller's own, never stopped here
    executor = concurrent.futures.ProcessPoolExecutor(
        num_processes, mp_context=ctx, initializer=_init_pool_worker,
        initargs=(os.getpid(), config, index, num_shards, q))
    try:
        pending = {executor.submit(build_shard, s) for s in todo}
        while pending:
            ready, pending = concurrent.futures.wait(
                pending, timeout=0.1, return_when=concurrent.futures.FIRST_COMPLETED)
            progress.drain(q)
            for future in ready:
                progress.shard_finished(future.result())  # re-raises a worker's error here
    except BaseException as e:
        # Renamed shards stay; the workers go, and with them every temp file.
        stop_workers([p for p in multiprocessing.active_children() if p not in others])
        manager = getattr(executor, "_executor_manager_thread", None)
        executor.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            # Its cleanup closes the pipe that the interpreter's exit handler for executors
            # writes to; racing it, that write failed ("OSError: [Errno 9] Bad file descriptor",
            # a traceback after the one-line message, CPython 3.11). With the workers gone it
            # ends at once.
            manager.join(timeout=10)
        remove_temp_files(config.output_dir)
        if isinstance(e, concurrent.futures.BrokenExecutor):
            raise BuildInterrupted(
                "a worker process died (out of memory, or killed by a signal)") from None
        raise
    executor.shutdown(wait=True)
    progress.drain(q)
