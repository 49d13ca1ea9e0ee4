"""The preloaded command servers (tests/preloaded.py) run a command as a fresh interpreter would:
its argv, working directory, environment, stdio, exit status and signals, and its end with the
process the test holds."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import preloaded

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")

SHOW = """
import json, os, sys
import tensorflow as tf
line = sys.stdin.readline()
print(json.dumps(dict(argv=sys.argv, cwd=os.getcwd(), path0=sys.path[0], stdin=line,
                      var=os.environ.get("PRELOADED_PROBE"), main=__name__, pid=os.getpid(),
                      tf=float(tf.reduce_sum(tf.ones([3]))))))
sys.stderr.write("to stderr\\n")
sys.exit(int(sys.argv[1]))
"""


def _routed(process) -> bool:
    return Path(process.args[2]).name == "preloaded_client.py"


def test_a_command_gets_its_argv_cwd_environment_stdio_and_exit_status(tmp_path):
    import json

    process = subprocess.run([sys.executable, "-c", SHOW, "3", "x y"], cwd=tmp_path, input="hello\n",
                             env=dict(ENV, PRELOADED_PROBE="seen"), capture_output=True, text=True,
                             timeout=120)
    assert _routed(process)
    assert process.returncode == 3, process.stderr
    shown = json.loads(process.stdout)
    assert shown["argv"] == ["-c", "3", "x y"] and shown["cwd"] == str(tmp_path)
    assert shown["path0"] == "" and shown["stdin"] == "hello\n" and shown["var"] == "seen"
    assert shown["main"] == "__main__" and shown["tf"] == 3.0
    assert process.stderr.endswith("to stderr\n")


def test_a_module_runs_as_main_with_its_file_as_argv0_and_the_folder_first_on_the_path(tmp_path):
    (tmp_path / "probe_module.py").write_text(
        "import sys\nprint(__name__, sys.argv, sys.path[0])\nraise SystemExit('refused: bad input')\n")
    process = subprocess.run([sys.executable, "-m", "probe_module", "--flag=1"], cwd=tmp_path,
                             env=ENV, capture_output=True, text=True, timeout=120)
    assert _routed(process)
    assert process.stdout.split() == ["__main__", f"['{tmp_path / 'probe_module.py'}',", "'--flag=1']",
                                      str(tmp_path)]
    assert process.returncode == 1 and process.stderr == "refused: bad input\n"


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(tmp_path):
    process = subprocess.run([sys.executable, "-c", "raise ValueError('boom')"], cwd=tmp_path,
                             env=ENV, capture_output=True, text=True, timeout=120)
    assert _routed(process)
    assert process.returncode == 1
    assert "Traceback" in process.stderr and process.stderr.rstrip().endswith("ValueError: boom")


def _started(process, pid_file: Path) -> int:
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return int(pid_file.read_text())


WAIT = """
import os, signal, sys, time
def stop(number, frame):
    print("got", number, flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "w").write(f"{os.getpid()}\\n")
time.sleep(600)
"""


def test_signals_reach_the_command_and_its_status_comes_back(tmp_path):
    pid_file = tmp_path / "pid"
    process = subprocess.Popen([sys.executable, "-c", WAIT, str(pid_file)], env=ENV,
                               stdout=subprocess.PIPE, text=True)
    assert _routed(process)
    command = _started(process, pid_file)
    assert command != process.pid and os.getpgid(command) == os.getpgid(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 7 and process.stdout.read() == f"got {signal.SIGTERM}\n"

    pid_file.unlink()
    process = subprocess.Popen([sys.executable, "-c", WAIT.replace("SIGTERM, stop", "SIGUSR1, stop"),
                                str(pid_file)], env=ENV, stdout=subprocess.DEVNULL)
    _started(process, pid_file)
    process.send_signal(signal.SIGINT)  # uncaught KeyboardInterrupt: killed by SIGINT, as Python is
    assert process.wait(timeout=60) == -signal.SIGINT


def test_killing_the_held_process_kills_the_command(tmp_path):
    pid_file = tmp_path / "pid"
    process = subprocess.Popen([sys.executable, "-c", WAIT, str(pid_file)], env=ENV,
                               stdout=subprocess.DEVNULL)
    command = _started(process, pid_file)
    process.kill()
    process.wait(timeout=60)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{command}").exists() and "Z" not in _state(command):
        assert time.monotonic() < deadline, "the command outlived the process the test held"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.real_process
def test_a_real_process_test_starts_fresh_interpreters():
    process = subprocess.run([sys.executable, "-c", "import sys; print('tensorflow' in sys.modules)"],
                             env=ENV, capture_output=True, text=True, timeout=120)
    assert process.args[1] == "-c" and process.stdout == "False\n"


def test_what_is_not_routed_starts_as_before():
    for command in ([sys.executable, "-X", "importtime", "-c", "pass"],  # Python options
                    [sys.executable, "-c", "import torch"],  # PyTorch beside TensorFlow
                    ["/bin/echo", "-c", "x"]):  # not Python
        assert preloaded._command(command) is None  # pylint: disable=protected-access
    process = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=ENV,
                             capture_output=True, text=True, timeout=120)
    assert process.args[1] == "-X" and "import time:" in process.stderr
    process = subprocess.run([sys.executable, "-c", "print(1)"], env=ENV, capture_output=True,
                             text=True, timeout=120, start_new_session=True)
    assert process.args[1] == "-c" and process.stdout == "1\n"


def test_the_cpu_report_gets_the_commands_cpu_seconds(monkeypatch):
    monkeypatch.setenv("ELECTRA_TEST_CPU_REPORT", "/nonexistent/only-turns-the-report-on")
    process = subprocess.Popen([sys.executable, "-c", "sum(range(10**7))"], env=ENV)
    assert _routed(process) and process.wait(timeout=120) == 0
    assert 0.05 < preloaded.command_cpu(process) < 30


def test_a_command_started_from_another_thread_starts_as_before():
    import threading

    seen = []
    worker = threading.Thread(target=lambda: seen.append(subprocess.run(
        [sys.executable, "-c", "print(1)"], env=ENV, capture_output=True, text=True, timeout=120)))
    worker.start()
    worker.join()
    assert seen[0].args[1] == "-c" and seen[0].stdout == "1\n"


def test_a_server_that_does_not_start_leaves_the_command_to_start_as_before(monkeypatch, tmp_path):
    broken = tmp_path / "server.py"
    broken.write_text("raise SystemExit(3)\n")
    monkeypatch.setattr(preloaded, "SERVER", broken)
    monkeypatch.setattr(preloaded, "_servers", {})
    process = subprocess.run([sys.executable, "-c", "print(2)"], env=ENV, capture_output=True,
                             text=True, timeout=120)
    assert process.args[1] == "-c" and process.returncode == 0 and process.stdout == "2\n"
