"""Session-wide test set-up.

Two logical CPU devices are configured before TensorFlow initialises its runtime, so that
MirroredStrategy tests can run two replicas on one CPU. Other tests simply use CPU:0.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # the runtime was already initialised by an earlier import
    pass


# The files that take longest, started first. `make test` runs files whole on two workers
# (`--dist loadfile`), handed out in collection order (`--no-loadscope-reorder`: xdist's default
# hands out the files with the most tests first), so a long file collected late runs alone at
# the end: the demo's file (two tests, one ~260 s run shared by both) did, for its whole length.
# Longest first leaves only short files for the end. A scheduling hint from `make test`'s
# `--durations` (BUILD.md): a file missing here still runs, only later.
LONGEST_FIRST = (
    "tests/e2e/test_demo.py", "tests/scoring/test_ranking.py", "tests/e2e/test_readme.py",
    "tests/e2e/test_replicate.py", "tests/training/test_pretraining.py",
    "tests/training/test_init_by_name.py", "tests/serving/test_export.py",
    "tests/training/test_signals.py", "tests/finetune/test_trainer.py",
    "tests/training/test_step_path.py", "tests/e2e/test_flag_fuzz.py",
    "tests/benchmarks/test_benchmark_pretrain.py", "tests/training/test_run_folder_safety.py",
    "tests/finetune/test_rerun_safety.py", "tests/training/test_pretraining_bad_input.py",
)


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        relative = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return rank.get(relative, len(rank))

    items.sort(key=key)  # stable: the rest, and the tests inside a file, keep their order


# The commands tests start run in forks of a process that imported TensorFlow once
# (tests/preloaded.py; ELECTRA_TEST_PRELOAD=0 turns it off). A test marked `real_process` starts
# its commands as fresh interpreters.
from tests import preloaded  # noqa: E402

preloaded.install()


def pytest_collection_finish(session):
    """The objects of the imports and of collection frozen out of the garbage collector (as in
    the fork server, tests/preloaded_server.py): the in-process tests' tracing no longer pays
    full collections that rescan them. ELECTRA_TEST_GC_FREEZE=0 leaves them."""
    if os.environ.get("ELECTRA_TEST_GC_FREEZE", "1") != "0":
        import gc

        gc.collect()
        gc.freeze()


def pytest_runtest_setup(item):
    preloaded.allow(item.get_closest_marker("real_process") is None)


import pytest  # noqa: E402


@pytest.fixture
def iterated_datasets(monkeypatch):
    """Every tf.data dataset iterated while the test runs (each `iter()` of one, `for` loops and
    `as_numpy_iterator` included, a distribution strategy's too), for checking their options."""
    from tensorflow.python.data.ops import dataset_ops

    seen = []
    iterate = dataset_ops.DatasetV2.__iter__

    def recording(dataset):
        seen.append(dataset)
        return iterate(dataset)

    monkeypatch.setattr(dataset_ops.DatasetV2, "__iter__", recording)
    return seen


# What each test costs, for choosing what to cut: with ELECTRA_TEST_CPU_REPORT=PREFIX each worker
# writes PREFIX.<worker>.jsonl, one line per test: its file, wall seconds, CPU seconds of the
# worker and of the child processes it waited for, and how many processes it started.
# `python -m benchmarks.suite_costs PREFIX` sums them per file (BUILD.md, "Tests").
_CPU_REPORT = os.environ.get("ELECTRA_TEST_CPU_REPORT")
if _CPU_REPORT:
    import json
    import resource
    import subprocess
    import time

    import pytest

    _launches = [0]
    _waited = []  # (command, CPU seconds) of each child waited for, with its own children's
    _forked = [0.0]  # CPU seconds of the preloaded forks that ran the test's commands
    _popen_init = subprocess.Popen.__init__

    def _counting_init(self, *args, **kwargs):
        _launches[0] += 1
        _popen_init(self, *args, **kwargs)

    # A child's CPU: what RUSAGE_CHILDREN gained since the last exit seen (the reaps in between,
    # usually this one). Not by replacing `Popen._try_wait`: a wait must stay the standard
    # library's own frames, or a signal during it is not raised at once (training/preemption.py).
    _handle_exitstatus = subprocess.Popen._handle_exitstatus
    _reaped = [0.0]

    def _counting_exitstatus(self, *args, **kwargs):
        _handle_exitstatus(self, *args, **kwargs)
        now = _cpu(resource.RUSAGE_CHILDREN)
        forked = preloaded.command_cpu(self) or 0.0  # a preloaded fork's, not this child's
        _forked[0] += forked
        command = getattr(self, "preloaded_command", self.args)
        command = command if isinstance(command, (list, tuple)) else [command]
        if not getattr(self, "preloaded_server", False):
            _waited.append((" ".join(map(str, command))[:160], now - _reaped[0] + forked))
        _reaped[0] = now

    subprocess.Popen.__init__ = _counting_init
    subprocess.Popen._handle_exitstatus = _counting_exitstatus

    def _cpu(who):
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        del _waited[:]
        _forked[0] = 0.0
        _reaped[0] = _cpu(resource.RUSAGE_CHILDREN)
        start = (time.monotonic(), _cpu(resource.RUSAGE_SELF),
                 _cpu(resource.RUSAGE_CHILDREN), _launches[0])
        servers = preloaded.accounting()
        yield
        now = preloaded.accounting()
        # Preloaded servers: their start-up CPU counts where they started; reaping one adds its
        # commands' CPU again (each was counted when its test waited for it): taken off.
        forked = _forked[0] + now["started_cpu"] - servers["started_cpu"] - (
            now["reaped_cpu"] - servers["reaped_cpu"])
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{_CPU_REPORT}.{worker}.jsonl", "a") as out:
            out.write(json.dumps({
                "test": item.nodeid, "file": item.nodeid.split("::")[0],
                "wall": time.monotonic() - start[0],
                "self": _cpu(resource.RUSAGE_SELF) - start[1],
                "children": _cpu(resource.RUSAGE_CHILDREN) - start[2] + forked,
                "launches": _launches[0] - start[3], "waited": list(_waited),
                "servers": now["servers"] - servers["servers"]}) + "\n")
