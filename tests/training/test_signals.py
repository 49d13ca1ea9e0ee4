"""SIGTERM and SIGINT to electra-pretrain and electra-finetune, as real processes with real signals:
the stop comes within seconds, not at the end of a long in-graph loop; what was done is kept and
nothing says the run finished; the same command goes on (electra_tf/training/preemption.py).
Also: a link planted at --model_dir/train is refused, its target untouched."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tests.command_lines import snapshot

STOP_SECONDS = 5.0  # the promise: a signal is acted on within a few seconds


class Watched:
    """A process whose merged output is read as it comes, each line with the time it arrived."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))

    @property
    def output(self) -> str:
        return "".join(line for _, line in self.lines)

    def wait_for(self, pattern: str, timeout: float) -> float:
        """The arrival time of the first line matching `pattern` (a regex)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for arrived, line in list(self.lines):
                if re.search(pattern, line):
                    return arrived
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}:\n{self.output[-8000:]}")

    def finish(self, timeout: float) -> int:
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        return self.process.returncode

    def last_line(self) -> str:
        return self.output.strip().splitlines()[-1]


def weights(checkpoint) -> dict:
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(checkpoint)
            if name.startswith("variables/")}


# --- pretraining ---------------------------------------------------------------------------------
def test_stop_request_records_the_first_signal_raises_on_the_second_and_restores_handlers(capfd):
    from electra_tf.training.preemption import Interrupted, StopRequest

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with pytest.raises(Interrupted) as raised:
        with StopRequest() as stop:  # the pretraining loop's: records, stops at its next check
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            assert stop.requested and stop.signum == signal.SIGTERM
            os.kill(os.getpid(), signal.SIGINT)  # a second one: at once
            time.sleep(1)
    assert raised.value.code == 130 and "second SIGINT" in str(raised.value)
    with pytest.raises(Interrupted) as raised:
        with StopRequest(at_once=True) as stop:  # fine-tuning's and the demo's
            stop.progress = "3 of 8 steps"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert raised.value.code == 143 and str(raised.value) == "stopped on SIGTERM after 3 of 8 steps"

    class Finalized:  # Python drops an exception raised in a __del__: the next check raises it
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)

    with pytest.raises(Interrupted, match="stopped on SIGINT"):
        with StopRequest(at_once=True) as stop:
            Finalized()
            assert stop.requested  # recorded, raised at the block's end
    assert "Exception ignored" not in capfd.readouterr().err
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_signal_outside_the_projects_code_is_raised_at_its_next_line_not_in_the_code_it_hit():
    """A signal that lands in code the project does not own (TensorFlow's Python, which its C++
    calls back and does not expect an exception from) lets that code finish and raises at the
    next line of the project's own frames."""
    from electra_tf.training.preemption import Interrupted, StopRequest

    own = {"__name__": "electra_tf.under_test"}  # a frame of the project's, as its modules'
    exec("def drive(work, seen):\n"
         "    result = work()\n"
         "    seen.append('the line after the call')\n"
         "    return result\n", own)
    seen = []

    def foreign():  # this test module's code stands for TensorFlow's
        os.kill(os.getpid(), signal.SIGTERM)
        total = sum(range(1000))  # the handler ran at the line above: this line still runs
        seen.append("foreign code finished")
        return total

    trace_before = sys.gettrace()
    with pytest.raises(Interrupted, match="stopped on SIGTERM"):
        with StopRequest(at_once=True):
            own["drive"](foreign, seen)
    assert seen == ["foreign code finished"]
    assert sys.gettrace() is trace_before

    seen.clear()
    with pytest.raises(Interrupted, match="second SIGTERM"):  # the pretraining loop's second one
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            assert stop.requested  # the first: recorded
            own["drive"](foreign, seen)
    assert seen == ["foreign code finished"]
    assert sys.gettrace() is trace_before


def test_a_signal_stops_a_wait_of_the_projects_code_at_once():
    """A signal during a wait the project's code is in (a sleep, a subprocess) raises there and
    then: Python would resume the wait if the handler only recorded it."""
    from electra_tf.training.preemption import Interrupted, StopRequest

    own = {"__name__": "electra_tf.under_test"}
    exec("import subprocess, time\n"
         "def nap():\n"
         "    time.sleep(60)\n"
         "def child():\n"
         "    subprocess.run(['sleep', '60'])\n", own)
    for wait in ("nap", "child"):
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        started = time.monotonic()
        with pytest.raises(Interrupted, match="stopped on SIGTERM"):
            with StopRequest(at_once=True):
                timer.start()
                own[wait]()
        assert time.monotonic() - started < STOP_SECONDS, wait
        timer.join()
    # subprocess.run killed its child on the way out: nothing named sleep 60 is left of ours
    leftover = subprocess.run(["pgrep", "-P", str(os.getpid()), "-f", "sleep 60"],
                              capture_output=True, text=True).stdout.split()
    assert not leftover


# Python 3.11 leaves some instructions outside the handlers of the blocks around them: an
# exception raised at a `try:` line or where a `with` block ends skips the exits of the `with`
# blocks around it. A signal may land at any of them.
_EVERY_KIND_OF_BLOCK = """
def gen():
    with Block("in a generator"):
        yield 1
        yield 2

def run(n):
    with Block(1):
        with Block(2):
            x = work()
        try:
            fail()
        except KeyError:
            pass
        except ValueError as e:
            with Block(3):
                x = [work() for _ in range(2)]
        else:
            pass
        finally:
            with Block(4):
                pass
        for i in gen():
            with Block(5):
                if i:
                    x = (lambda: work())()
                else:
                    try:
                        y = work()
                    finally:
                        pass
        while n:
            n -= 1
            try:
                with Block(6):
                    fail()
            except ValueError:
                continue
        try:
            with Block(7):
                try:
                    fail()
                finally:
                    z = work()
        except ValueError:
            w = work()
        with Block(8), Block(9):
            return 0
"""


def test_a_signal_at_any_line_leaves_every_with_block_it_was_in():
    """A signal handled at each line event in turn of code of the project's with every kind of
    block: the run stops, and every `with` block entered was exited."""
    from electra_tf.training.preemption import Interrupted, StopRequest

    events = []

    class Block:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(("enter", self.name))

        def __exit__(self, *error):
            events.append(("exit", self.name))

    def fail():
        raise ValueError("handled by the code under test")

    own = {"__name__": "electra_tf.under_test", "Block": Block, "work": lambda: 5, "fail": fail}
    exec(_EVERY_KIND_OF_BLOCK, own)
    for lines in itertools.count(1):
        events.clear()
        seen, sent = [0], []

        def count(frame, event, arg):  # the signal arrives at the `lines`-th line event
            if event == "line" and frame.f_globals is own:
                seen[0] += 1
                if seen[0] == lines:
                    sent.append(lines)
                    stop._handle(signal.SIGTERM, frame)  # as Python calls a handler
                    return frame.f_trace
            return count

        def counter(frame, event, arg):
            return count

        try:
            with StopRequest(at_once=True) as stop:
                sys.settrace(counter)
                own["run"](2)
        except Interrupted:
            assert sent
        else:
            assert not sent  # past the last line: the run finished before the signal
            break
        finally:
            # Nothing of the stop is left tracing: the trace it replaced is back, or none (Python
            # unsets the trace function of a trace function that raises).
            assert sys.gettrace() in (None, counter)
            sys.settrace(None)
        entered = [name for kind, name in events if kind == "enter"]
        exited = [name for kind, name in events if kind == "exit"]
        assert sorted(entered, key=str) == sorted(exited, key=str), (lines, events)
    assert lines > 50  # it went through the whole function


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigint_in_a_1000_step_loop_stops_within_seconds_and_resumes_exactly(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    # One configured loop of all 600 steps: before, a signal waited for its end (the run's end).
    common = dict(num_train_steps=600, steps_per_loop=1000, save_checkpoints_steps=1000,
                  summary_steps=1000, jit_compile=False)
    straight_dir, stopped_dir = str(tmp_path / "straight"), str(tmp_path / "stopped")
    straight = Watched(th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab,
                                                         straight_dir, **common)))
    flags = th.tiny_flags(pretrain_shards, pretrain_vocab, stopped_dir, **common)
    first = Watched(th.pretrain_process(flags))
    first.wait_for(r"the train loop is traced", 400)
    time.sleep(1.0)
    sent = time.monotonic()
    first.process.send_signal(signal.SIGINT)
    stopped_at = first.wait_for(r"Stopped at step \d+ on SIGINT", 60)
    code = first.finish(120)
    log = first.output
    assert stopped_at - sent < STOP_SECONDS, log[-3000:]
    assert code == 130 and "Traceback" not in log, log[-3000:]  # SIGINT: as a shell reports Ctrl-C
    step = int(re.search(r"Stopped at step (\d+)", log).group(1))
    assert 1 <= step < 600
    checkpoint = os.path.join(stopped_dir, f"ckpt-{step}")
    assert first.last_line() == (f"electra-pretrain: stopped on SIGINT at step {step} of 600 "
                                 f"(checkpoint {checkpoint}); run the same command to resume")
    assert tf.train.latest_checkpoint(stopped_dir) == checkpoint
    assert not os.path.exists(os.path.join(stopped_dir, "discriminator"))  # not finished

    second = Watched(th.pretrain_process(flags))
    assert second.finish(400) == 0, second.output[-3000:]
    assert f"Resumed from {checkpoint} at step {step}" in second.output
    assert straight.finish(400) == 0, straight.output[-3000:]
    # Calls of every length in both runs (the first of one step, then about a second each):
    # bit for bit the weights of the run without a stop.
    a = weights(tf.train.latest_checkpoint(straight_dir))
    b = weights(tf.train.latest_checkpoint(stopped_dir))
    assert tf.train.latest_checkpoint(stopped_dir).endswith("ckpt-600")
    assert set(a) == set(b) and len(a) > 10
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


WORKER = """
import sys

from absl import logging

from electra_tf.config import ElectraConfig
from electra_tf.training.config import PretrainingConfig
from electra_tf.training.loop import run_pretraining
from electra_tf.training.strategy import create_strategy, is_chief

data, vocab, model_dir = sys.argv[1:4]
logging.set_verbosity(logging.INFO)
strategy = create_strategy("multi_worker")
config = PretrainingConfig(
    train_batch_size=8, num_train_steps=100000, learning_rate=1e-3, num_warmup_steps=1,
    max_seq_length=32, steps_per_loop=1000, save_checkpoints_steps=1000, summary_steps=1000,
    seed=3, shuffle_buffer=64, jit_compile=False)
result = run_pretraining(ElectraConfig.from_json("electra_tiny").with_vocab(vocab), config, data,
                         model_dir, strategy, check_shards=False)
print("CHIEF" if is_chief(strategy) else "WORKER", "preempted", result.preempted, "step",
      result.step, "signal", result.stop_signal, flush=True)
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_to_one_worker_stops_every_worker_at_the_same_step(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    cluster = {"worker": [f"127.0.0.1:{th.free_port()}", f"127.0.0.1:{th.free_port()}"]}
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    model_dir = tmp_path / "run"
    workers = []
    try:
        for index in range(2):
            temp = tmp_path / f"tmp{index}"
            temp.mkdir()
            env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {
                "type": "worker", "index": index}}), TMPDIR=str(temp), TF_CPP_MIN_LOG_LEVEL="2",
                CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
            workers.append(Watched(subprocess.Popen(
                [sys.executable, str(script), pretrain_shards, pretrain_vocab, str(model_dir)],
                cwd=th.repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)))
        for worker in workers:
            worker.wait_for(r"the train loop is traced", 400)
        time.sleep(1.0)
        sent = time.monotonic()
        workers[1].process.send_signal(signal.SIGTERM)  # the other worker gets none
        stopped = [worker.wait_for(r"Stopped at step", 60) for worker in workers]
        for worker in workers:
            assert worker.finish(120) == 0, worker.output[-3000:]
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
    assert max(stopped) - sent < STOP_SECONDS
    chief, other = (re.search(r"(CHIEF|WORKER) preempted True step (\d+) signal (\w+)",
                              worker.output).groups() for worker in workers)
    assert chief[0] == "CHIEF" and other[0] == "WORKER"
    assert chief[1] == other[1] and 1 <= int(chief[1]) < 1000  # one step for both
    assert (chief[2], other[2]) == ("None", str(int(signal.SIGTERM)))
    assert "Stopped at step %s on another worker's signal" % chief[1] in workers[0].output
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{chief[1]}")


@pytest.mark.slow  # two refused runs: TensorFlow start-up only
def test_a_link_or_a_file_at_model_dir_train_is_refused_before_the_shard_check(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep\n")
    for planted in ("link", "file"):
        model_dir = tmp_path / planted
        model_dir.mkdir()
        train = model_dir / "train"
        if planted == "link":
            os.symlink(victim, train)
        else:
            train.write_text("not a folder\n")
        process = Watched(th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab,
                                                            str(model_dir))))
        assert process.finish(300) == 1, process.output[-3000:]
        expected = (f"{train} is a symbolic link; electra_tf does not write through links"
                    if planted == "link" else f"{train} exists and is not a folder")
        assert process.last_line().startswith(f"electra-pretrain: error: {expected}"), process.output
        assert "Traceback" not in process.output and "checked 4 shards" not in process.output
        assert sorted(os.listdir(model_dir)) == ["train"]  # nothing else written
    assert sorted(os.listdir(victim)) == ["precious.txt"]
    assert (victim / "precious.txt").read_text() == "keep\n"


# --- fine-tuning ---------------------------------------------------------------------------------
def finetune_process(vocab, model_dir, *extra) -> Watched:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return Watched(subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.finetune", "--task=rotten_tomatoes",
         "--config=electra_tiny", f"--vocab_file={vocab}", f"--model_dir={model_dir}",
         "--max_train_examples=32", "--max_eval_examples=16", "--train_batch_size=16",
         "--max_seq_length=32", "--log_every_steps=1", "--nojit_compile", *extra],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))


tree = snapshot


def stop_finetuning(vocab, model_dir, signum, *extra) -> Watched:
    """Starts electra-finetune, sends `signum` at its 3rd training step; checks the stop came
    within seconds with one line, and returns the process."""
    run = finetune_process(vocab, model_dir, *extra)
    run.wait_for(r"\] step 3/", 400)
    sent = time.monotonic()
    run.process.send_signal(signum)
    stopped_at = run.wait_for(r"stopped on SIG", 60)
    code = run.finish(120)
    assert stopped_at - sent < STOP_SECONDS, run.output[-3000:]
    assert code == 128 + signum and "Traceback" not in run.output, run.output[-3000:]
    name = signal.Signals(signum).name
    assert re.match(rf"electra-finetune: stopped on {name} after \d+ of 8 steps of seed 0 in "
                     rf"{re.escape(str(model_dir))}: nothing of this run is kept",
                     run.last_line()), run.output[-3000:]
    assert run.last_line().endswith("run the same command to fine-tune it again")
    return run


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_signal_stops_finetuning_at_the_next_batch_and_keeps_the_finished_model(
        tmp_path, pretrain_vocab):
    model_dir = tmp_path / "ft"
    epochs = "--num_train_epochs=4"  # 8 steps, an evaluation after every 2
    # Stopped before it finished: nothing says it did, nothing of it is left but its logs.
    stop_finetuning(pretrain_vocab, model_dir, signal.SIGTERM, epochs)
    assert not os.path.lexists(model_dir / "best")
    assert not os.path.lexists(model_dir / "results.json")
    assert not [n for n in os.listdir(model_dir) if "staging" in n or n.endswith(".tmp")]
    # The same command starts it again and finishes.
    done = finetune_process(pretrain_vocab, model_dir, epochs)
    assert done.finish(600) == 0, done.output[-3000:]
    results = json.loads((model_dir / "results.json").read_text())
    assert results["runs"][0]["train_steps"] == 8
    finished = tree(model_dir / "best")
    # A rerun stopped by Ctrl-C keeps the finished model and its results as they were.
    stop_finetuning(pretrain_vocab, model_dir, signal.SIGINT, epochs)
    assert tree(model_dir / "best") == finished
    assert json.loads((model_dir / "results.json").read_text()) == results
    assert not [n for n in os.listdir(model_dir) if "staging" in n or n.endswith(".tmp")]
