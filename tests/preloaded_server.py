"""A Python process with TensorFlow already imported, forking one copy per command a test runs.

Most of the suite's child processes are `python -m electra_tf.tools.X ...` (or `-c CODE`, or a
script), and each spent ~3.5 CPU-s importing TensorFlow and Keras before doing its work. This
server imports them once (after deciding TF_ENABLE_ONEDNN_OPTS as `import electra_tf` does
before TensorFlow loads; electra_tf itself is left for the command to import) and then, for
each command, forks:

  server --fork--> monitor --fork--> command

The command process takes over the client's stdin/stdout/stderr (passed over the socket), its
working directory, environment, argv and process group, re-creates `sys.stdin/stdout/stderr` as
a new interpreter would, and then runs the module, code or script as `__main__` in this
interpreter's top level, so that exiting, atexit handlers, an uncaught exception's traceback
and its exit status happen as in `python -m`. The monitor sends the command's pid and then its
exit status to the client (`tests/preloaded_client.py`, the process the test holds), and kills
the command with SIGKILL if the client dies first (a test's `proc.kill()` or a timeout).

Run by `tests/preloaded.py`: `python tests/preloaded_server.py SOCKET REPO`.
"""

import json
import os
import resource
import select
import signal
import socket
import sys

SOCKET_PATH, REPO = sys.argv[1], sys.argv[2]
sys.path[0] = REPO  # as `python -m` from the repository would have it, not this file's folder


def _enable_onednn_as_electra_tf_does() -> None:
    """What `import electra_tf` does before TensorFlow loads (TF_ENABLE_ONEDNN_OPTS=1 on an
    AVX2-only CPU), without leaving electra_tf imported: tests check what a command imports."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_electra_cpu", f"{REPO}/electra_tf/cpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.enable_onednn()


_enable_onednn_as_electra_tf_does()
import numpy  # noqa: E402
import tensorflow  # noqa: E402,F401
import keras  # noqa: E402,F401
import tensorflow_text  # noqa: E402,F401
from absl import app, flags, logging  # noqa: E402,F401

# TensorFlow's import asks absl to count the GPUs once `app.run` has started (at once when it
# already has, as when a command imports TensorFlow in its `main`). Left queued here, every
# command's `app.run` would do it, and one refusing before it loads TensorFlow would print the
# CUDA platform's error line it never prints on its own.
app._init_callbacks.clear()  # pylint: disable=protected-access

# The imports' ~320k objects moved out of the collector's reach: a fresh interpreter's full
# collections rescan them all while a command traces its functions (~10% of a short pretraining
# run's CPU, docs/test_suite.md "The collector frozen after the imports"), and each fork would
# copy the pages those scans touch. ELECTRA_TEST_GC_FREEZE=0 leaves them (to compare).
if os.environ.get("ELECTRA_TEST_GC_FREEZE", "1") != "0":
    import gc

    gc.collect()
    gc.freeze()

_LIBC_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGTERM when the pytest worker that started this server goes, however it goes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_LIBC_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:
        os._exit(0)


def _receive(connection: socket.socket):
    """(request dict, [stdin, stdout, stderr] fds) from the client."""
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    data = message
    while not data.endswith(b"\n"):
        more = connection.recv(1 << 20)
        if not more:
            raise EOFError("client left before its request was complete")
        data += more
    return json.loads(data), fds


def _monitor(connection: socket.socket, pid: int) -> None:
    """In the monitor: tell the client the command's pid, then its exit status; SIGKILL the
    command if the client goes first."""
    try:
        connection.sendall(f"{pid}\n".encode())
    except OSError:
        os.kill(pid, signal.SIGKILL)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(connection.fileno(), select.POLLIN | select.POLLHUP)
    while True:
        ready = dict(poller.poll())
        if pidfd in ready:
            break
        if connection.fileno() in ready:
            if not connection.recv(1):  # the client is gone: so goes its command
                os.kill(pid, signal.SIGKILL)
                break
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    try:
        connection.sendall(f"{os.waitstatus_to_exitcode(status)} {cpu:.3f}\n".encode())
    except OSError:
        pass


def _serve() -> dict:
    """Accepts clients until a fork returns in a command process; returns its request there."""
    _die_with_parent()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(SOCKET_PATH)
    listener.listen(64)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"ready {usage.ru_utime + usage.ru_stime:.3f}", flush=True)  # its CPU, for the report
    while True:
        connection, _ = listener.accept()
        try:
            request, fds = _receive(connection)
        except (OSError, EOFError, ValueError):
            connection.close()
            continue
        monitor = os.fork()
        if monitor == 0:
            listener.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            command = os.fork()
            if command == 0:
                connection.close()
                _become(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            _monitor(connection, command)
            os._exit(0)
        connection.close()
        for fd in fds:
            os.close(fd)
        while True:  # reap finished monitors
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def _become(request: dict, fds: list) -> None:
    """Turns this fork into the client's command, as far as a new interpreter would differ."""
    try:
        os.setpgid(0, request["pgid"])
    except OSError:
        pass
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.closerange(3, 1024)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    import io

    def text(fd, mode, **kwargs):
        raw = io.FileIO(fd, mode, closefd=False)
        binary = raw if unbuffered and mode == "w" else (
            io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw))
        return io.TextIOWrapper(binary, encoding=sys.stdout.encoding, **kwargs)

    sys.stdin = sys.__stdin__ = text(0, "r", errors=sys.stdin.errors)
    sys.stdout = sys.__stdout__ = text(1, "w", errors=sys.stdout.errors,
                                       line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr = sys.__stderr__ = text(2, "w", errors="backslashreplace", line_buffering=True)
    for number in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    numpy.random.seed()  # a new process's own draw, not the server's (`random` reseeds itself)
    import tempfile

    tempfile.tempdir = None  # found again from the command's TMPDIR


def _run(request: dict) -> None:
    """Runs `python [-m MODULE | -c CODE | SCRIPT] ARGS...` as a new interpreter would: in a
    fresh `__main__` module, with its argv and `sys.path[0]`."""
    import runpy
    import types

    kind, target, args = request["kind"], request["target"], request["args"]
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if kind == "-m":
        sys.argv = [target, *args]  # argv[0] becomes the module's file, as under `python -m`
        sys.path[0] = request["cwd"]
        runpy._run_module_as_main(target, alter_argv=True)  # pylint: disable=protected-access
    elif kind == "-c":
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        exec(compile(target, "<string>", "exec"), vars(main))  # pylint: disable=exec-used
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        with open(target, "rb") as source:
            code = compile(source.read(), target, "exec")
        main.__file__ = target
        exec(code, vars(main))  # pylint: disable=exec-used


def _exit_code(error: SystemExit) -> int:
    """The status `python` exits with for an uncaught SystemExit (its message printed)."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _finish(code: int, killed_by: int | None = None) -> None:
    """Ends the command as the interpreter would (non-daemon threads joined, atexit handlers,
    output flushed; killed by `killed_by` after an uncaught KeyboardInterrupt), without the second
    or so a process that imported TensorFlow spends tearing its modules and libraries down."""
    import atexit
    import threading

    try:
        threading._shutdown()  # pylint: disable=protected-access
    except BaseException:  # pylint: disable=broad-except
        # As the interpreter's own shutdown: reported as unraisable, the exit status kept.
        import traceback

        print(f"Exception ignored in: {threading!r}", file=sys.stderr)
        traceback.print_exc()
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as Python exits when it cannot flush stdout
    if killed_by is not None:
        signal.signal(killed_by, signal.SIG_DFL)
        os.kill(os.getpid(), killed_by)
    os._exit(code)


if __name__ == "__main__":
    _request = _serve()
    _killed_by = None
    try:
        _run(_request)
        _code = 0
    except SystemExit as _error:
        _code = _exit_code(_error)
    except KeyboardInterrupt:  # as Python does: traceback, exit handlers, then killed by SIGINT
        sys.excepthook(*sys.exc_info())
        _code, _killed_by = 130, signal.SIGINT
    except BaseException:  # pylint: disable=broad-except
        sys.excepthook(*sys.exc_info())
        _code = 1
    _finish(_code, _killed_by)
