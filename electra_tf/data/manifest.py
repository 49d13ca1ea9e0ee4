"""A shard folder's `manifest.json`: what a pretraining run needs to read the shards right.

`electra-build-data` (`shards.py`) writes the manifest last, beside the shards
(`SHARD_PREFIX-SSSSS-of-NNNNN`): the build's key, per-shard example and token counts, totals, and
`RUN_FIELDS`, what a pretraining run takes from it and checks its flags and vocabulary against:
`max_seq_length`, `vocab_sha256`, `vocab_size`, the `special_ids` found in the vocab and
`lower_case`. Shards of the authors' tool have no manifest; they are read without one.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple, Sequence

from electra_tf.data.text_files import BadInputError

SHARD_PREFIX = "pretrain_data.tfrecord"
MANIFEST = "manifest.json"


def shard_name(index: int, num_shards: int) -> str:
    return f"{SHARD_PREFIX}-{index:05d}-of-{num_shards:05d}"


# What a pretraining run takes from manifest.json (and checks its flags and vocab against).
RUN_FIELDS = ("max_seq_length", "vocab_sha256", "vocab_size", "special_ids", "lower_case")


class ShardManifest(NamedTuple):
    """The manifest describing a set of shards (`manifest_for_shards`).

    values: the manifest's `RUN_FIELDS`.
    path: the manifest.json read (the first, when several folders agree).
    vocab_file: the vocab file the shards were built with, as the manifest names it (it may
      have moved since: check `vocab_sha256` before using it).
    folders_without: folders of matched shards that have no manifest.json.
    """

    values: dict
    path: str
    vocab_file: str | None
    folders_without: tuple


def read_manifest(folder: str) -> dict | None:
    """`folder`/manifest.json, or None when there is none (the authors' tool writes none).

    Raises BadInputError naming the file when it is not JSON or lacks a `RUN_FIELDS` field.
    """
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"{path}: unreadable shard manifest ({e})") from None
    missing = [k for k in RUN_FIELDS if not isinstance(manifest, dict) or k not in manifest]
    if missing:
        raise BadInputError(f"{path}: shard manifest without {', '.join(missing)} (written by an "
                            "older electra-build-data? rebuild, or move it aside to read the "
                            "shards without it)")
    return manifest


def listed_shards(folder: str) -> list[str] | None:
    """The shards `folder`/manifest.json lists, as paths (None without a manifest).

    Raises BadInputError naming the manifest when it lists none or a listed shard is missing
    (moved, deleted, or the build was copied without it)."""
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    path = os.path.join(folder, MANIFEST)
    entries = manifest.get("shards")
    if not isinstance(entries, list) or not entries or not all(
            isinstance(e, dict) and isinstance(e.get("file"), str) for e in entries):
        raise BadInputError(f"{path}: lists no shards (no \"shards\" with a \"file\" each)")
    files = [os.path.join(folder, e["file"]) for e in entries]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise BadInputError(f"{path} lists {len(files)} shards but {len(missing)} are missing, "
                            f"first {missing[0]}")
    return files


def manifest_for_shards(files: Sequence[str]) -> ShardManifest | None:
    """The manifest.json beside `files` (shard paths), or None when no folder of them has one.

    Shards from several folders are one data set only if their manifests agree on every
    `RUN_FIELDS` field; BadInputError names both manifests and the first field that differs.
    Folders without a manifest (shards of the authors' tool) are listed, not refused.
    """
    found, without = {}, []
    for folder in sorted({os.path.dirname(os.path.abspath(f)) for f in files}):
        manifest = read_manifest(folder)
        if manifest is None:
            without.append(folder)
        else:
            found[os.path.join(folder, MANIFEST)] = manifest
    if not found:
        return None
    (first, manifest), *others = found.items()
    for path, other in others:
        for key in RUN_FIELDS:
            if other[key] != manifest[key]:
                raise BadInputError(f"the shards come from builds that differ: {key} is "
                                    f"{manifest[key]!r} in {first} but {other[key]!r} in {path}; "
                                    "pretrain on one of them")
    return ShardManifest({k: manifest[k] for k in RUN_FIELDS}, first, manifest.get("vocab_file"),
                         tuple(without))
