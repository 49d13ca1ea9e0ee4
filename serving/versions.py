"""A model's version folders, as TF Serving's file system source reads them: `BASE/NAME/VERSION/`
with VERSION in ASCII digits (`version_of`), a folder counted once it holds saved_model.pb
(`list_versions`), and what a folder holds (`fingerprint`)."""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger("electra_tf.serving.manager")  # the manager's log: these are its polls


_VERSION_NAME = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() and int() also take '٣' and '³'
_INT64_MAX = 2**63 - 1
_warned_duplicates: set[tuple[str, str, str]] = set()  # logged once, not at every poll


def version_of(folder_name: str) -> int | None:
    """The version a folder name stands for, or None.

    TF Serving parses names with `strings::safe_strto64`: ASCII digits that fit in an int64,
    leading zeros allowed (`00012` is version 12). Here also only versions >= 1 count (the REST
    paths and version policies of this server are positive), and the blanks and minus sign
    safe_strto64 would also let through (` 12`, `-3`) do not: no deploy tool writes them."""
    if not _VERSION_NAME.fullmatch(folder_name):
        return None
    digits = folder_name.lstrip("0")
    if not digits or len(digits) > 19 or int(digits) > _INT64_MAX:  # len first: int() of 4300+ digits raises
        return None
    return int(digits)


def list_versions(base_path: str) -> tuple[dict[int, str], set[int]]:
    """({version: path} of the numbered version folders that hold a SavedModel, versions whose
    folder holds none yet).

    Raises OSError when the base path cannot be listed (gone, unmounted, not readable); the
    caller then keeps what it has loaded, as TF Serving does when its poll fails."""
    found, unfinished, names = {}, set(), {}
    for entry in sorted(os.listdir(base_path)):  # TF Serving: of two names of one version (12, 00012) the last wins
        version = version_of(entry)
        path = os.path.join(base_path, entry)
        if version is None or not os.path.isdir(path):
            continue
        if version in names and (base_path, names[version], entry) not in _warned_duplicates:
            _warned_duplicates.add((base_path, names[version], entry))
            log.warning("version folders %r and %r of %s are both version %d; serving %r",
                        names[version], entry, base_path, version, entry)
        names[version] = entry
        # A folder without saved_model.pb is still being written: look again next poll.
        if os.path.exists(os.path.join(path, "saved_model.pb")) or os.path.exists(
            os.path.join(path, "saved_model.pbtxt")
        ):
            found[version] = path
            unfinished.discard(version)
        else:
            found.pop(version, None)
            unfinished.add(version)
    return found, unfinished


def fingerprint(path: str) -> tuple:
    """What a version folder holds (names, sizes, modification times): a failed load is tried
    again once it changes."""
    items = []
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            items.append((os.path.relpath(os.path.join(root, f), path), st.st_size, st.st_mtime_ns))
    return (path, *sorted(items))
