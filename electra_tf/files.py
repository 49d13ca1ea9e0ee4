"""The mode of what electra_tf writes: what a plain open() or mkdir gives, 0666 / 0777 & ~umask.

Writers that go through a private temporary file or folder do not give it: tempfile.mkstemp
creates 0600, tempfile.mkdtemp 0700, and safetensors' `save_file` leaves 0600. A checkpoint or an
export written that way cannot be read by another account (a TensorFlow Serving container, a
shared cluster user), so each such place calls `give_normal_mode` on what it wrote.
"""

from __future__ import annotations

import os


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
