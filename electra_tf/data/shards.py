"""Pretraining shards: text files -> `[CLS] A [SEP] B [SEP]` examples in TFRecord shards.

`build_pretraining_data` (the `electra-build-data` command) packs text with the authors' packer
(`packing.ExampleBuilder`) in parallel, deterministically and resumably:

  1. Index (main process). Every input is scanned once (`text_files.index_units`); a *unit* is a
     run of non-blank lines (a document), cut after `MAX_UNIT_LINES` lines so one huge blank-free
     file still spreads over shards. Unit u goes to shard `u % num_shards`, so the assignment
     depends only on the inputs.
  2. Build (pool of `num_processes` processes, spawned; the builder's own process when it is 1,
     or by default for less than `POOL_MIN_BYTES` of text). Shard s reads its units back by byte
     offset, tokenizes lines in batches through the fused tf-text op, packs them with an
     `ExampleBuilder` whose RNG is seeded from sha256(f"{seed}:{s}"), and writes a temporary
     `.pretrain_data.tfrecord-SSSSS-of-NNNNN.<random>.tmp` (created exclusively, written through
     the worker's own descriptor: `_own_temporary`), then its stats to `.shard_stats/SSSSS.json`,
     then renames the shard to `pretrain_data.tfrecord-SSSSS-of-NNNNN`. A final name therefore
     always means a complete shard; the bytes of shard s do not depend on the process count.
     Nothing is written through a link planted in the output folder, at any name, at any time.
  3. Resume. `.build_config.json` pins what determines the bytes (inputs and their sizes, vocab
     hash, max_seq_length, seed, num_shards, lower_case, max_line_bytes). A rerun with the same
     config skips shards that have their final name and deletes stale temp files; a rerun with a
     different config into the same directory is refused.
  4. `manifest.json` is written last (`manifest.py`): config, per-shard example/token counts,
     totals, and what a pretraining run needs to read the shards right (`manifest.RUN_FIELDS`;
     `electra-pretrain` takes them from it, see `manifest.manifest_for_shards`).
  5. Stopping. SIGTERM or SIGINT makes the builder stop its workers (each deletes the temp file
     of the shard it was writing), delete any temp file left, and raise `BuildInterrupted`:
     finished shards stay and a rerun resumes. Workers ignore SIGINT (a terminal's Ctrl-C reaches
     the whole process group; the builder stops them in order) and exit by themselves, deleting
     their temp file, within `ORPHAN_POLL_SECONDS` of the builder dying without cleaning up
     (SIGKILL, OOM killer). A worker that dies alone ends the build the same way.

Bad input: a file that is not UTF-8 text (a NUL byte, or mostly invalid lines, at its start:
`text_files.not_text_reason`) stops the build naming it, as do a folder without files and inputs
without a line of text; in a text file, non-UTF-8 bytes are replaced by U+FFFD and reported in one
warning per file, with the first file:line and the count (`on_error="warn"`), or stop the build
at the first (`on_error="fail"`); empty input files are skipped with a warning; blank-only
documents produce nothing; documents that tokenize to nothing are counted and reported; a line over
`max_line_bytes` is truncated with a warning (exact whenever the kept prefix still has at least
`max_seq_length` WordPieces, because the packer never keeps more than that from one line).

The parts: `shard_config.py` (the config, limits and errors), `shard_worker.py` (one shard, in a
worker: step 2), `shard_pool.py` (running the workers and stopping them: steps 2 and 5), this
module (indexing, resuming, the manifest: steps 1, 3, 4).

`.gz` inputs are decompressed on the fly; a shard that needs units of a .gz file decompresses it
from the start, so prefer plain files or many small .gz files for big corpora.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Callable, Sequence

import numpy as np
from absl import logging

from electra_tf import files
from electra_tf.files import FolderLock
from electra_tf.data.manifest import MANIFEST, SHARD_PREFIX, shard_name
# The build's config, limits and errors are re-exported: `shards.BuildConfig` is the API.
from electra_tf.data.shard_config import (  # noqa: F401
    AUTO_SHARD_BYTES, BUILD_CONFIG, DEFAULT_MAX_LINE_BYTES, EMBEDDED_INPUT, MAX_SEQ_LENGTH,
    MAX_SHARDS, POOL_MIN_BYTES, STATS_DIR, BuildConfig, BuildInterrupted, InputFilesError,
    _write_json_atomic)
from electra_tf.data.shard_pool import (
    Progress, build_in_pool, build_in_process, input_description, remove_temp_files,
    signals_raise_interrupted)
from electra_tf.data.text_files import (
    MAX_UNIT_LINES, BadInputError, expand_inputs, index_units, no_text_message)


def build_pretraining_data(
    config: BuildConfig, progress_every: float = 5.0, on_shard_done: Callable | None = None
) -> dict:
    """Builds (or resumes) the shards described by `config`; returns the manifest dict.

    What can be known before any work is checked first, and nothing is written when it fails:
    the fields' ranges, the inputs (`expand_inputs`), the output folder (`check_output_dir`),
    then the vocabulary.

    Raises BuildInterrupted on SIGTERM / SIGINT (when called from the main thread) or when a
    worker process dies; no process and no temp file is left then (module docstring, 5).
    """
    config.validate()
    try:
        inputs = expand_inputs(config.inputs) if config.inputs else None
    except BadInputError as e:
        raise InputFilesError(str(e)) from None
    check_output_dir(config.output_dir, config.inputs, inputs or [])
    from electra_tf.data.tokenizer import load_vocab  # loads TensorFlow: after the cheap checks

    vocab = load_vocab(config.vocab_file)  # names the file
    try:
        # One builder per output folder (a second one exits at once naming the first's pid).
        with FolderLock(config.output_dir, "electra-build-data"), signals_raise_interrupted():
            return _build(config, vocab, inputs, progress_every, on_shard_done)
    except BuildInterrupted as e:
        out = config.output_dir
        kept = [n for n in os.listdir(out) if n.startswith(SHARD_PREFIX + "-")] \
            if os.path.isdir(out) else []
        raise BuildInterrupted(f"{e}; {len(kept)} finished shard(s) kept in {out}, no partial "
                               "ones: rerun the same command to resume", e.signum) from None


def worker_count(requested: int, todo_bytes: int, todo_shards: int) -> int:
    """Processes to build `todo_shards` shards holding `todo_bytes` of text with: `requested`
    (`BuildConfig.num_processes`), or for 0 one per core, or 1 under `POOL_MIN_BYTES` (a spawned
    worker's start-up would cost more than it saves); never more than the shards."""
    if requested == 0:
        requested = 1 if todo_bytes < POOL_MIN_BYTES else (os.cpu_count() or 1)
    return min(requested, max(todo_shards, 1))


def check_output_dir(output_dir: str, inputs: Sequence[str], input_files: Sequence[str]) -> None:
    """Raises BadInputError, in one line naming --output_dir, when the shards cannot go there:
    it is a file (an input file, say), an input folder or inside one (a rerun would read the
    shards back as text), or it cannot be written (read-only disk, no permission); and
    `files.LinkedFolderError` when its `.shard_stats` is a link or a file. Writes
    nothing that stays: a folder that exists is probed with a temporary file (which holds for
    root, whom permission bits do not stop), one that does not is checked on its nearest
    existing parent.

    Before, a file there failed with a traceback from the lock, and an unwritable folder only
    once the first worker wrote its shard."""
    if not output_dir:
        raise BadInputError("--output_dir is empty; give the folder the shards go to")
    out = os.path.abspath(output_dir)
    existing = out
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        same = next((p for p in input_files if _same_file(existing, p)), None)
        what = f"the --input file {same}" if same else "a file"
        where = f": it is {what}" if existing == out else f" ({existing} is {what})"
        raise BadInputError(f"--output_dir {output_dir} is not a folder{where}")
    for given in inputs:
        if not os.path.isdir(given):
            continue
        # Read back by `expand_inputs`' walk unless a part of the way is hidden (or "..": outside).
        way = os.path.relpath(os.path.realpath(out), os.path.realpath(given)).split(os.sep)
        if way == ["."] or not any(part.startswith(".") for part in way):
            where = "" if way == ["."] else "inside "
            raise BadInputError(f"--output_dir {output_dir} is {where}the --input folder {given}: "
                                "a rerun would read the shards as text; put them elsewhere")
    for path in input_files:
        name = os.path.basename(path)
        if os.path.dirname(path) == out and (name.startswith(SHARD_PREFIX) or name == MANIFEST):
            raise BadInputError(f"--input {path} is an output of a build in --output_dir "
                                f"{output_dir}; give the text files only")
    if existing == out:
        stats = os.path.join(out, STATS_DIR)
        if os.path.lexists(stats):
            files.own_folder(stats)  # a link or a file there: LinkedFolderError, nothing made
        reason = files.cannot_write_in(out)
        if reason:
            raise BadInputError(f"--output_dir {output_dir} is not writable ({reason})")
    elif not os.access(existing, os.W_OK | os.X_OK) or \
            os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise BadInputError(f"--output_dir {output_dir} cannot be created: {existing} is not "
                            "writable")


def _same_file(a: str, b: str) -> bool:
    """`os.path.samefile`, False for a path that cannot be read (a dangling link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _input_files(config: BuildConfig, inputs: list[str] | None) -> tuple[list[str], bool]:
    """The text files to build from, and whether they are the embedded corpus (no inputs given)."""
    if inputs is not None:
        return inputs, False
    from electra_tf.data import corpus

    path = os.path.join(config.output_dir, ".imdb_corpus.txt")
    if os.path.islink(path) or not os.path.isfile(path):  # a link is replaced, never read
        logging.info("No --input: writing the embedded IMDB corpus to %s", path)
        corpus.write_imdb_corpus(path)
    return [path], True


def _finished_shard(path: str) -> bool:
    """A shard a build of ours finished: a file at its final name (renamed there only when
    complete). A link there is not one of ours: the shard is built again, replacing it."""
    return os.path.isfile(path) and not os.path.islink(path)


def _check_same_build(output_dir: str, build_key: dict) -> None:
    """Records what the shards of `output_dir` are built from, or checks it is what they were."""
    key_path = os.path.join(output_dir, BUILD_CONFIG)
    if os.path.islink(key_path) or not os.path.exists(key_path):  # a link is never ours: replaced
        _write_json_atomic(key_path, build_key)
        return
    with open(key_path, encoding="utf-8") as f:
        previous = json.load(f)
    if previous != build_key:
        changed = sorted(k for k in build_key if previous.get(k) != build_key[k])
        raise BadInputError(
            f"{output_dir} holds shards of a different build (changed: "
            f"{', '.join(changed)}); use an empty output_dir"
        )


def _write_manifest(config: BuildConfig, build_key: dict, vocab: list[str],
                    num_shards: int) -> dict:
    """manifest.json: the build key, the vocabulary's facts and every shard's stats, summed."""
    from electra_tf.data.tokenizer import special_token_ids

    shards = []
    for s in range(num_shards):
        with open(os.path.join(config.output_dir, STATS_DIR, f"{s:05d}.json"),
                  encoding="utf-8") as f:
            stats = json.load(f)
        stats.pop("seconds", None)
        shards.append(stats)
    manifest = dict(
        build_key,
        vocab_file=os.path.abspath(config.vocab_file),
        # For ElectraConfig: ids come from the file, not BERT's defaults.
        vocab_size=len(vocab),
        special_ids=special_token_ids(vocab),
        shard_pattern=os.path.join(os.path.abspath(config.output_dir), SHARD_PREFIX + "-*"),
        num_examples=sum(s["examples"] for s in shards),
        num_tokens=sum(s["tokens"] for s in shards),
        num_wordpieces=sum(s["wordpieces"] for s in shards),
        shards=shards,
    )
    _write_json_atomic(os.path.join(config.output_dir, MANIFEST), manifest)
    return manifest


def _build(config: BuildConfig, vocab: list[str], inputs: list[str] | None,
           progress_every: float, on_shard_done: Callable | None) -> dict:
    from electra_tf.data.tokenizer import file_sha256

    # Every folder made inside output_dir goes through own_folder: a link is refused, not followed.
    stats_dir = files.own_folder(os.path.join(config.output_dir, STATS_DIR))
    paths, embedded = _input_files(config, inputs)
    t0 = time.time()
    try:
        index = index_units(paths, on_error=config.on_error)
    except BadInputError as e:
        raise InputFilesError(str(e)) from None
    logging.info("Indexed %d files, %.1f MB, %d documents in %.1fs",
                 len(paths), index.total_bytes / 1e6, len(index), time.time() - t0)
    if len(index) == 0:
        raise InputFilesError(no_text_message(config.inputs, paths))

    num_shards = config.num_shards or min(
        1000, max(8, math.ceil(index.total_bytes / AUTO_SHARD_BYTES)))
    build_key = dict(
        inputs=input_description(paths, embedded),
        vocab_sha256=file_sha256(config.vocab_file),
        max_seq_length=config.max_seq_length,
        seed=config.seed,
        num_shards=num_shards,
        lower_case=config.lower_case,
        max_line_bytes=config.max_line_bytes,
        max_unit_lines=MAX_UNIT_LINES,
        format_version=1,
    )
    _check_same_build(config.output_dir, build_key)

    # Leftovers of a killed run: shard temporaries, and those of `files.write_json`.
    remove_temp_files(config.output_dir)
    for folder in (config.output_dir, stats_dir):
        files.remove_stale_temporaries(folder)
    todo = [s for s in range(num_shards)
            if not _finished_shard(os.path.join(config.output_dir, shard_name(s, num_shards)))]
    if len(todo) < num_shards:
        logging.info("Resuming: %d of %d shards already finished", num_shards - len(todo),
                     num_shards)
    todo_bytes = sum(int(np.sum(index.end[s::num_shards] - index.start[s::num_shards]))
                     for s in todo)
    num_processes = worker_count(config.num_processes, todo_bytes, len(todo))
    if todo:
        logging.info("Building %d shard(s) %s", len(todo),
                     "in this process" if num_processes == 1 else
                     f"with {num_processes} worker processes")
    progress = Progress(todo_bytes, num_shards - len(todo), num_shards, every=progress_every,
                         on_shard_done=on_shard_done)
    if todo and num_processes == 1:
        build_in_process(config, index, num_shards, todo, progress)
    elif todo:
        build_in_pool(config, index, num_shards, todo, num_processes, progress)
    progress.add(0, 0, force=True)

    manifest = _write_manifest(config, build_key, vocab, num_shards)
    logging.info("Wrote %d examples (%d tokens) in %d shards to %s",
                 manifest["num_examples"], manifest["num_tokens"], num_shards,
                 config.output_dir)
    return manifest
