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
)


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item):
        relative = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        return rank.get(relative, len(rank))

    items.sort(key=key)  # stable: the rest, and the tests inside a file, keep their order
