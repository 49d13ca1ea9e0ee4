"""How electra_tf writes files: nothing finished is lost, no write follows a planted link, one
writer per folder, a full disk is one line.

- **Replace, never write through.** `write_text`, `write_json` and `copy_file` write a temporary
  file created exclusively (`tempfile.mkstemp`: O_CREAT | O_EXCL, a random name) in the
  destination's folder, flush it to disk, and `os.replace` it onto the final name. A reader sees
  the old file or the new one, never a part; a symlink planted at the final name is replaced by
  the file, its target untouched (these commands often run as root in containers).
- **Folders appear whole.** `staged_folder` builds a folder under a private temporary name beside
  its final place and publishes it with one rename; a folder already there is swapped out in one
  `renameat2(RENAME_EXCHANGE)` (Linux 3.15+), so at every instant the final name holds the old
  complete folder or the new complete one. Where the kernel lacks it, two renames leave a window
  of a few microseconds, and `recover_folder` puts the old folder back at the next start.
- **One writer per folder.** `FolderLock` takes an advisory `flock` on `<folder>/.electra_tf.lock`
  (released by the kernel when the process dies, so a crash never leaves a stale lock); a second
  command on a folder in use gets `FolderInUseError` naming the folder and the holder's pid.
- **A full disk is one line.** `disk_full_message` recognises ENOSPC / EFBIG / EDQUOT from Python
  and TensorFlow's `ResourceExhaustedError` / "File too large"; `cli.run` turns it into one line
  naming the path and the free space. Writers remove their partial files; `remove_stale_temporaries`
  clears what a killed process left.
- **The mode of what is written** is what a plain open() or mkdir gives, 0666 / 0777 & ~umask:
  tempfile.mkstemp creates 0600 and mkdtemp 0700, and a checkpoint or an export written that way
  could not be read by another account (a TensorFlow Serving container, a shared cluster user).

Remote paths (`gs://...`, any `scheme://`) have no links, renames there are copies, and locks do
not exist: they are written through `tf.io.gfile` to a random temporary name and renamed, and are
not locked (one chief writes, as TensorFlow's own checkpointing assumes).

Example:
    with FolderLock(model_dir, "electra-finetune"):
        with staged_folder(Path(model_dir) / "best") as staging:
            ...write the model into staging...
        write_json(Path(model_dir) / "results.json", results)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path

LOCK_NAME = ".electra_tf.lock"
_TEMP_SUFFIX = ".tmp"
_STAGING_MARK = ".staging-"
_PREVIOUS_MARK = ".previous-"


# --- mode ---------------------------------------------------------------------------------------
def umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux 4.7+)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    # Elsewhere the only way is to set it and set it back; a file another thread creates in
    # between would get umask 0o022.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_normal_mode(path) -> None:
    """chmod `path` to 0666 & ~umask (a file) or 0777 & ~umask (a folder)."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~umask())


def is_remote(path) -> bool:
    """A `scheme://` path (gs://, s3://, hdfs://) that `tf.io.gfile` reaches."""
    return "://" in str(path)


# --- files: written beside, renamed onto ----------------------------------------------------------
def temporary_name(path) -> str:
    """The pattern of `path`'s temporaries: `.<name>.<random>.tmp` in its folder."""
    folder, name = os.path.split(str(path))
    return os.path.join(folder, f".{name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}")


def write_bytes(path, data: bytes) -> None:
    """Replaces `path` with `data` (module docstring: exclusive temporary, fsync, rename)."""
    path = str(path)
    if is_remote(path):
        import tensorflow as tf

        tmp = temporary_name(path)
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(data)
        tf.io.gfile.rename(tmp, path, overwrite=True)
        return
    with replacing(path, "wb") as f:
        f.write(data)


def write_text(path, text: str, encoding: str = "utf-8") -> None:
    """Replaces `path` with `text`."""
    write_bytes(path, text.encode(encoding))


def write_json(path, value, **dumps_options) -> None:
    """Replaces `path` with `value` as JSON (indent 2 unless told) and a final newline."""
    dumps_options.setdefault("indent", 2)
    write_text(path, json.dumps(value, **dumps_options) + "\n")


def copy_file(source, path) -> None:
    """Replaces `path` with a copy of `source` (a link at `path` is replaced, not followed)."""
    if is_remote(source) or is_remote(path):
        import tensorflow as tf

        with tf.io.gfile.GFile(str(source), "rb") as f:
            write_bytes(path, f.read())
        return
    with open(source, "rb") as f:
        write_bytes(path, f.read())


@contextlib.contextmanager
def replacing(path, mode: str = "w", encoding: str | None = "utf-8"):
    """Yields a file object for a new version of `path`, streamed to an exclusive temporary and
    renamed onto `path` when the block ends without an exception (removed otherwise)."""
    path = os.path.abspath(str(path))
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=_TEMP_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        give_normal_mode(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- folders a command makes or reuses -----------------------------------------------------------
class LinkedFolderError(ValueError):
    """A folder a command writes into is a symbolic link (or not a folder): refused, not followed."""


def own_folder(path) -> Path:
    """`path` as a real folder this process may write into: made when missing (parents too), and
    refused with `LinkedFolderError` when it is a symbolic link or a file, so files are never
    written into a link's target. `mkdir` does not follow a link at the name (it fails with
    EEXIST), so a link planted before or while the folder is made is seen here. Remote paths are
    returned as they are (no links there)."""
    if is_remote(path):
        return path
    path = Path(path)
    try:
        path.mkdir(parents=True)
        give_normal_mode(path)
    except FileExistsError:
        pass
    if path.is_symlink():
        raise LinkedFolderError(f"{path} is a symbolic link; electra_tf does not write through links "
                                "(remove it or give another folder)")
    if not path.is_dir():
        raise LinkedFolderError(f"{path} exists and is not a folder")
    return path


def cannot_write_in(folder) -> str | None:
    """Why a file cannot be created in the existing `folder` (its strerror), None when one can:
    tried by creating and removing an exclusive temporary, so it holds for root, read-only
    mounts and ACLs alike, where permission bits alone would say otherwise."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".electra_tf.write_check.", suffix=_TEMP_SUFFIX, dir=str(folder))
    except OSError as e:
        return e.strerror
    os.close(fd)
    os.unlink(probe)
    return None


# --- folders: built aside, swapped in ----------------------------------------------------------
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def exchange(a, b) -> bool:
    """Swaps the paths `a` and `b` in one step; False where the system cannot (then nothing moved)."""
    function = _renameat2()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a))


def publish_folder(staging, final) -> None:
    """Puts the complete folder `staging` at `final`: a rename, or an exchange with the folder
    already there (then the old one is deleted). A symlink at `final` is replaced, not followed."""
    staging, final = str(staging), str(final)
    if os.path.islink(final) or (os.path.lexists(final) and not os.path.isdir(final)):
        os.unlink(final)  # a planted link or a stray file: we never write through it
    if not os.path.lexists(final):
        os.rename(staging, final)
        return
    if exchange(staging, final):
        shutil.rmtree(staging, ignore_errors=True)  # it now holds the previous folder
        return
    previous = _hidden(final, _PREVIOUS_MARK)
    os.rename(final, previous)  # recover_folder puts it back if we die before the next line
    os.rename(staging, final)
    shutil.rmtree(previous, ignore_errors=True)


def _hidden(final, mark: str) -> str:
    folder, name = os.path.split(os.path.abspath(str(final)))
    return os.path.join(folder, f".{name}{mark}{secrets.token_hex(6)}")


def recover_folder(final) -> None:
    """After a crash between the two renames of `publish_folder`'s fallback: the previous folder
    back at `final`. Then removes staging and previous folders left by killed processes. Call
    with the folder's lock held."""
    folder, name = os.path.split(os.path.abspath(str(final)))
    if not os.path.isdir(folder):
        return
    previous = sorted(n for n in os.listdir(folder) if n.startswith(f".{name}{_PREVIOUS_MARK}"))
    if previous and not os.path.lexists(final):
        os.rename(os.path.join(folder, previous.pop()), final)
    for n in os.listdir(folder):
        if n.startswith(f".{name}{_STAGING_MARK}") or n in previous:
            shutil.rmtree(os.path.join(folder, n), ignore_errors=True)


@contextlib.contextmanager
def staged_folder(final):
    """Yields a new empty folder beside `final` (a private name); when the block ends without an
    exception it is published at `final` whole (`publish_folder`), otherwise deleted. The
    folder gets the normal mode (module docstring)."""
    if is_remote(final):  # no renames of folders there: written in place, by one chief
        yield final
        return
    final = os.path.abspath(str(final))
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}{_STAGING_MARK}", dir=parent)
    try:
        give_normal_mode(staging)
        yield Path(staging)
        publish_folder(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# `.<name>.<random>.tmp` as mkstemp (8 characters) and `temporary_name` (12) make them, and
# TensorFlow's `<prefix>-<number>_temp` folder of a checkpoint save: nothing a user names so.
_OUR_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8,12}\.tmp$")
_TF_CHECKPOINT_TEMP = re.compile(r"^.+-\d+_temp$")


def remove_stale_temporaries(folder) -> list[str]:
    """Deletes the temporaries that killed writers left in `folder`: `.<name>.<random>.tmp` files
    of `write_*`, staging folders, and TensorFlow's `<prefix>_temp` checkpoint folders. Call with
    the folder's lock held. Returns what was removed."""
    folder = str(folder)
    if is_remote(folder) or not os.path.isdir(folder):
        return []
    removed = []
    for n in os.listdir(folder):
        path = os.path.join(folder, n)
        temporary = _OUR_TEMPORARY.match(n) is not None and not os.path.isdir(path)
        staging = n.startswith(".") and _STAGING_MARK in n and os.path.isdir(path)
        tf_temp = _TF_CHECKPOINT_TEMP.match(n) is not None and os.path.isdir(path) and not os.path.islink(path)
        if temporary or staging or tf_temp:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            removed.append(path)
    return removed


# --- one writer per folder -----------------------------------------------------------------------
def _lock_holder(fd: int) -> int | None:
    """The pid holding a flock on the file open as `fd`, from /proc/locks (Linux), or None."""
    inode = os.fstat(fd).st_ino
    try:
        with open("/proc/locks", encoding="ascii") as f:
            for line in f:
                fields = line.split()  # 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
                if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
                    return int(fields[4])
    except (OSError, ValueError):
        pass
    return None


class FolderInUseError(RuntimeError):
    """Another live process holds the folder's lock."""


class FolderLock:
    """An advisory lock on `folder` for the life of this object (or of the process).

    `flock` on `<folder>/.electra_tf.lock` (an empty file, created once and never written: a
    refused command changes nothing in the folder), opened without following a link. The holder's
    pid for the refusal comes from the kernel's lock table (/proc/locks). The kernel releases the
    lock when the process exits or is killed. Remote folders are not locked.
    """

    def __init__(self, folder, command: str):
        self.folder = str(folder)
        self.command = command
        self._fd = None

    # Locks this process holds, by real path: [fd, count]. A flock conflicts between two open
    # files of one process too, so a nested FolderLock on the same folder (run_seeds around
    # finetune) shares the first one's.
    _held: dict = {}

    def acquire(self) -> "FolderLock":
        import fcntl

        if is_remote(self.folder) or self._fd is not None:
            return self
        os.makedirs(self.folder, exist_ok=True)
        key = os.path.realpath(self.folder)
        if key in FolderLock._held:
            FolderLock._held[key][1] += 1
            self._fd = FolderLock._held[key][0]
            return self
        path = os.path.join(self.folder, LOCK_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise FolderInUseError(f"{path} is a symbolic link; remove it (electra_tf never "
                                       "writes through a link it did not create)") from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _lock_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise FolderInUseError(
                    f"{self.folder} is in use by another run (pid {holder or 'unknown'}); wait "
                    "for it to end or use another folder") from None
            raise
        FolderLock._held[key] = [fd, 1]
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        key = next((k for k, (fd, _) in FolderLock._held.items() if fd == self._fd), None)
        self._fd = None
        if key is None:
            return
        FolderLock._held[key][1] -= 1
        if FolderLock._held[key][1] == 0:
            fd, _ = FolderLock._held.pop(key)
            os.close(fd)  # closing drops the flock; the file stays (removing it would race)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# --- folders in progress, several writers ------------------------------------------------------
def hold(folder) -> int:
    """Marks `folder` (a private staging folder) as in progress: an flock on the folder itself,
    held until `os.close` of the returned fd (or the process's death). Where several processes
    may stage beside each other (exports to one base), `remove_abandoned` then tells a dead
    writer's folder from a live one's."""
    import fcntl

    fd = os.open(str(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def remove_abandoned(folders) -> list[str]:
    """Deletes each of `folders` that no live process holds (`hold`): a killed writer's."""
    import fcntl

    removed = []
    for folder in folders:
        try:
            fd = os.open(str(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live writer's
        finally:
            os.close(fd)
        shutil.rmtree(str(folder), ignore_errors=True)
        removed.append(str(folder))
    return removed


# --- a full disk ---------------------------------------------------------------------------------
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_DISK_FULL_TEXT = re.compile(r"No space left on device|File too large|Disk quota exceeded", re.I)


def disk_full_message(error: BaseException, where=None) -> str | None:
    """One line for an error that means the disk (or the file-size limit, or the quota) is full,
    or None for any other error. `where` is the folder being written, when the caller knows it."""
    path = None
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        path = error.filename
        reason = os.strerror(error.errno)
    else:
        text = str(getattr(error, "message", None) or error)
        match = _DISK_FULL_TEXT.search(text)
        if match is None:
            return None
        reason = match.group(0)
        # A path in TensorFlow's text, not a device name (`/job:localhost/replica:0/...`).
        found = [p for p in re.findall(r"(/[^\s;:,'\"]+)", text)
                 if not re.match(r"/(job|replica|task|device)\b", p)]
        path = found[0] if found else None
    target = str(path or where or "")
    free = _free_space(target or ".")
    place = f" writing {target}" if target else ""
    return f"{reason}{place}{free}; free space and rerun the same command (what was finished is kept)"


def _free_space(path: str) -> str:
    """The free space of the disk that holds `path` (its nearest existing folder)."""
    probe = os.path.abspath(path)
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return ""
    return f" ({free / 2**20:,.1f} MiB free on that disk)"
