"""The process a test holds when its command runs in the preloaded server's fork.

`python -S tests/preloaded_client.py SOCKET CPU_FILE KIND TARGET ARGS...` sends its stdin, stdout and
stderr, working directory, environment and process group to `tests/preloaded_server.py`,
forwards the signals a test sends (SIGINT, SIGTERM, ...) to the command, and exits as the
command did: with its code, or killed by its signal. Killing this process with SIGKILL (which
cannot be forwarded) makes the server's monitor kill the command. Only the standard library,
started without `site`: it costs ~20 ms, not the ~3.5 s of importing TensorFlow. CPU_FILE,
when not empty, receives the command's CPU seconds (for the suite's CPU report).
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM, signal.SIGCONT, signal.SIGTSTP, signal.SIGWINCH)


def main() -> None:
    socket_path, cpu_file, kind, target, *args = sys.argv[1:]
    pid = [None]
    pending = []

    def forward(number, _frame):
        if pid[0] is None:
            pending.append(number)
        else:
            try:
                os.kill(pid[0], number)
            except ProcessLookupError:
                pass

    for number in FORWARDED:
        signal.signal(number, forward)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    request = dict(kind=kind, target=target, args=args, cwd=os.getcwd(), env=dict(os.environ),
                   pgid=os.getpgid(0))
    socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    reader = connection.makefile("rb")
    line = reader.readline()
    if not line:
        sys.exit("preloaded_client: the server closed the connection before starting the command")
    pid[0] = int(line)
    for number in pending:
        forward(number, None)
    line = reader.readline()
    if not line:
        sys.exit("preloaded_client: the server's monitor left without the command's status")
    code, cpu = line.split()
    code = int(code)
    if cpu_file:
        with open(cpu_file, "wb") as out:
            out.write(cpu)
    if code < 0:  # killed by a signal: so is this process, for the test to see the same
        number = -code
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        code = 128 + number
    os._exit(code)


if __name__ == "__main__":
    main()
