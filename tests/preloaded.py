"""Commands the tests run start from a preloaded TensorFlow instead of importing it each time.

About 160 of the suite's child processes were `python -m electra_tf.tools.X ...` (or `-c CODE`,
a script, an installed `electra-*` command) spending ~3.5 CPU-s each importing TensorFlow and
Keras, and ~1 s more tearing them down at exit: a fifth of the suite's CPU. `install()` (from
tests/conftest.py) makes `subprocess.Popen` start such a command as `python -S
tests/preloaded_client.py ...` instead, which has `tests/preloaded_server.py` (one per pytest
worker and set of import-time environment variables, at most three alive) fork a process that
already imported TensorFlow, Keras and TF Text and run the command there: same argv, working
directory, environment, stdio, process group, exit status and signals (see the two files). What
the test holds is still a real process, whose death takes the command with it.

Not routed, so started as before: anything but `sys.executable` followed by `-m MODULE`, `-c CODE`
or a script path (Python options such as `-X importtime` included); commands importing PyTorch (two
big runtimes in one process differ from either alone) or looking at `sys.modules` (what a command
imports shows only in a fresh interpreter); `preexec_fn`, a new session or process group,
`pass_fds`, other users; a thread other than the main one; a working directory holding another
`electra_tf`; tests marked `real_process` (a command killed with SIGKILL at a chosen moment must be
dead when the test looks, a pid must be the command's); and everything when ELECTRA_TEST_PRELOAD=0.
What a fork does not reproduce: Python's hash seed (one per server, not one per command), the
output of TensorFlow's own import (printed once, by the server), and the module teardown at exit
(the command ends after atexit handlers and flushing its output, as `os._exit`).
"""

from __future__ import annotations

import atexit
import inspect
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("preloaded_server.py")
CLIENT = Path(__file__).with_name("preloaded_client.py")

# Variables read while Python, TensorFlow or Keras start (or possibly then): a command whose
# values differ from a server's gets its own server. The rest are the command's own environment.
_IMPORT_TIME_PREFIXES = ("TF_", "XLA_", "ONEDNN_", "DNNL_", "KERAS_", "CUDA_", "NVIDIA_", "OMP_",
                         "KMP_", "MKL_", "OPENBLAS_", "GOTO", "PYTHON", "LD_", "MALLOC", "LANG",
                         "LC_", "HOME", "TZ", "GRPC_", "PROTOCOL_BUFFERS")
_RUNTIME_ONLY = {"TF_CONFIG", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
                 "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"}  # (TMPDIR: found again in a fork)
_MAX_SERVERS = 3  # per pytest worker: a fourth set of variables replaces the least recently used
_NOT_PRELOADED = ("torch", "transformers")

_servers: dict = {}
_state = {"test_allows": True, "folder": None, "commands": 0, "servers": 0, "started_cpu": 0.0,
          "reaped_cpu": 0.0}
_popen_init = subprocess.Popen.__init__
_POPEN_SIGNATURE = inspect.signature(_popen_init)


def _import_key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(_IMPORT_TIME_PREFIXES) and k not in _RUNTIME_ONLY))


def _command(args) -> tuple | None:
    """(kind, target, rest) of `[sys.executable, -m MODULE | -c CODE | SCRIPT, ...]`, or of an
    installed console script (`electra-pretrain ...`: a script whose `#!` is sys.executable)."""
    if not isinstance(args, (list, tuple)) or not args:
        return None
    args = [os.fspath(a) if isinstance(a, os.PathLike) else a for a in args]
    if not all(isinstance(a, str) for a in args):
        return None
    if args[0] != sys.executable:
        if not _console_script(args[0]):
            return None
        args = [sys.executable, *args]
    if len(args) < 2:
        return None
    first = args[1]
    if first in ("-m", "-c"):
        if len(args) < 3:
            return None
        kind, target, rest = first, args[2], args[3:]
    elif first.startswith("-"):
        return None
    else:
        kind, target, rest = "script", first, args[2:]
    text = target
    if kind == "script":
        try:
            text = Path(target).read_text(errors="replace")
        except OSError:
            return None
    if any(name in text for name in _NOT_PRELOADED) or "sys.modules" in text:
        return None  # PyTorch beside TensorFlow; code that checks what a command imported
    return kind, target, rest


def _console_script(path: str) -> bool:
    """Whether `path` is a script of this environment's bin folder run by sys.executable."""
    real = os.path.realpath
    if real(os.path.dirname(path)) != real(os.path.dirname(sys.executable)):
        return False
    try:
        with open(path, "rb") as script:
            line = script.readline().strip()
    except OSError:
        return False
    return line.startswith(b"#!/") and real(os.fsdecode(line[2:])) == real(sys.executable)


def _routable(bound: dict) -> bool:
    if not (_state["test_allows"] and os.environ.get("ELECTRA_TEST_PRELOAD", "1") != "0"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False  # a server dies with the thread that started it (PR_SET_PDEATHSIG)
    if bound.get("shell") or bound.get("executable") or bound.get("preexec_fn"):
        return False
    if bound.get("start_new_session") or bound.get("process_group") is not None:
        return False
    if bound.get("pass_fds") or bound.get("user") is not None or bound.get("group") is not None:
        return False
    if bound.get("extra_groups") is not None or bound.get("umask", -1) != -1:
        return False
    if bound.get("restore_signals") is False:
        return False
    cwd = Path(bound.get("cwd") or os.getcwd()).resolve()
    return cwd == REPO or not (cwd / "electra_tf").exists()


def _folder() -> str:
    if _state["folder"] is None:
        _state["folder"] = tempfile.mkdtemp(prefix="electra-preloaded-")
    return _state["folder"]


def _server(env: dict) -> str | None:
    """The socket of the server for `env`'s import-time variables, started when first needed;
    None when it would not start (the command then starts as before; see the server's log)."""
    key = _import_key(env)
    if key in _servers:
        process, path = _servers.pop(key)
        if process.poll() is None:
            _servers[key] = (process, path)  # now the most recently used
            return path
    while len(_servers) >= _MAX_SERVERS:  # its running commands are not its: they go on
        _end(_servers.pop(next(iter(_servers)))[0])
    _state["servers"] += 1
    path = os.path.join(_folder(), f"s{_state['servers']}.sock")
    server_env = {k: v for k, v in os.environ.items()
                  if not k.startswith(_IMPORT_TIME_PREFIXES) or k in _RUNTIME_ONLY}
    server_env.update(key)
    process = subprocess.Popen.__new__(subprocess.Popen)
    with open(os.path.join(_folder(), f"s{_state['servers']}.log"), "w") as log:
        _popen_init(process, [sys.executable, str(SERVER), path, str(REPO)], cwd=REPO,
                    env=server_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                    text=True)
    line = process.stdout.readline().split()
    if not line or line[0] != "ready":
        process.kill()
        process.wait()
        return None
    _state["started_cpu"] += float(line[1])
    process.preloaded_server = True
    _servers[key] = (process, path)
    return path


def _routed_init(self, *args, **kwargs):
    try:
        bound = _POPEN_SIGNATURE.bind(self, *args, **kwargs).arguments
    except TypeError:
        return _popen_init(self, *args, **kwargs)
    command = _command(bound.get("args"))
    if command is None or not _routable(bound):
        return _popen_init(self, *args, **kwargs)
    env = bound.get("env")
    server = _server(dict(os.environ if env is None else env))
    if server is None:
        return _popen_init(self, *args, **kwargs)
    kind, target, rest = command
    bound = dict(bound)
    del bound["self"]
    cpu_file = ""
    if os.environ.get("ELECTRA_TEST_CPU_REPORT"):
        _state["commands"] += 1
        cpu_file = os.path.join(_folder(), f"cpu-{_state['commands']}")
    bound["args"] = [sys.executable, "-S", str(CLIENT), server, cpu_file, kind, target, *rest]
    _popen_init(self, **bound)
    self.preloaded_cpu_file = cpu_file
    self.preloaded_command = [sys.executable, *([target] if kind == "script" else [kind, target]),
                              *rest]  # what the test asked for, for the CPU report


def command_cpu(process: subprocess.Popen) -> float | None:
    """The CPU seconds of a routed command that ended (None for one started as before)."""
    path = getattr(process, "preloaded_cpu_file", "")
    try:
        return float(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None


def install() -> None:
    """Routes the suite's commands through preloaded servers (stopped when the worker exits)."""
    subprocess.Popen.__init__ = _routed_init
    atexit.register(_stop)


def allow(yes: bool) -> None:
    """Whether the current test's commands may be routed (False for `real_process` tests)."""
    _state["test_allows"] = yes


def _end(process: subprocess.Popen) -> None:
    """Stops a server. Reaping it adds the CPU of every command it ran to this process's
    RUSAGE_CHILDREN, already counted command by command: kept apart for the CPU report."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process.kill()
    process.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    _state["reaped_cpu"] += (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def accounting() -> dict:
    """For the CPU report: servers started, their start-up CPU seconds, and the CPU seconds
    that reaping stopped servers added to RUSAGE_CHILDREN (their commands', counted already)."""
    return {k: _state[k] for k in ("servers", "started_cpu", "reaped_cpu")}


def _stop() -> None:
    for process, _ in _servers.values():
        _end(process)
    if _state["folder"]:
        import shutil

        shutil.rmtree(_state["folder"], ignore_errors=True)
