"""The train step's path (plain graph or XLA) chosen for the CPU: `training/step_path.py`.

The choice is timed, so the unit tests drive `choose` with runners whose steps take what a fake
clock says; the pretraining tests run the real probe on the tiny model and check that its steps
are undone (the run ends where a run forced to the chosen path ends) and that a run resumes
exactly on the other path.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import cpu, run_folder
from electra_tf.config import ElectraConfig
from electra_tf.training import step_path
from electra_tf.training.config import PretrainingConfig
from electra_tf.training.loop import run_pretraining
from electra_tf.training.strategy import create_strategy


class Clock:
    """A clock that only the fake steps move."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Probe:
    """Runners whose steps cost `seconds[jit]` (the first call of each path also `compile`),
    a snapshot that records whether it was restored, and the calls made."""

    def __init__(self, graph: float, xla: float, trace: float = 1.0):
        self.clock, self.seconds, self.trace = Clock(), {False: graph, True: xla}, trace
        self.built, self.steps, self.restored = [], {False: 0, True: 0}, 0

    def runner(self, jit):
        self.built.append(jit)
        first = [True]

        def run(n):
            self.clock.now += n * self.seconds[jit] + (self.trace if first[0] else 0.0)
            first[0] = False
            self.steps[jit] += n

        return run

    def snapshot(self):
        probe = self

        class Restorable:
            def restore(self):
                probe.restored += 1

        return Restorable()

    def choose(self, requested=None, remaining=100_000, **kw):
        return step_path.choose(requested, strategy=create_strategy("one_device"),
                                remaining_steps=remaining, runner=self.runner,
                                snapshot=self.snapshot, clock=self.clock, **kw)


def test_xla_is_chosen_when_it_is_faster_by_the_margin():
    probe = Probe(graph=0.30, xla=0.20)
    chosen = probe.choose()
    assert chosen.jit_compile and chosen.name == "xla"
    assert chosen.seconds_per_step == pytest.approx({"graph": 0.30, "xla": 0.20})
    assert "XLA 1.50x faster" in chosen.reason and "graph 300 ms/step" in chosen.reason
    assert probe.built == [False, True] and probe.restored == 1
    record = chosen.record()
    assert record["path"] == "xla" and record["cpu"] == cpu.vector_extensions()
    assert "train step: xla (" in chosen.line()


@pytest.mark.parametrize("xla", [0.30, 0.29, 0.40])
def test_the_graph_stays_unless_xla_is_clearly_faster(xla):
    probe = Probe(graph=0.30, xla=xla)
    chosen = probe.choose()
    assert not chosen.jit_compile, chosen.reason
    assert f"not {1 + step_path.MARGIN:.2f}x faster" in chosen.reason
    assert probe.restored == 1 and probe.steps[True] > 0


def test_a_short_run_is_not_probed_and_its_two_steps_are_undone():
    # 1,000 steps of 0.3 s = 300 s; the probe would cost 2 x 10 s of compilation (the trace
    # measured, doubled) + 6 samples of 1 s: above 3% of the run.
    probe = Probe(graph=0.30, xla=0.10, trace=10.0)
    chosen = probe.choose(remaining=1000)
    assert not chosen.jit_compile
    assert "too short for a probe" in chosen.reason and "--jit_compile forces XLA" in chosen.reason
    assert "the run (~300 s)" in chosen.reason
    assert probe.built == [False] and probe.steps == {False: 2, True: 0}
    assert probe.restored == 1
    # The same steps with a cheap trace: the probe pays.
    assert Probe(graph=0.30, xla=0.10, trace=1.0).choose(remaining=1000).jit_compile


@pytest.mark.parametrize("remaining", [0, 1, 6, step_path.min_probed_steps()])
def test_a_run_too_short_on_any_machine_is_not_timed(remaining):
    """Six samples of at least one step each are over 3% of a run of at most 200 steps, however
    long a step takes: such a run (a smoke test, a resumed run near its end) takes no step to
    time, and nothing is snapshotted or undone."""
    assert step_path.min_probed_steps() == 2 * step_path.ROUNDS / step_path.PROBE_SHARE == 200
    for seconds in (1e-4, 0.3, 30.0):
        probe = Probe(graph=seconds, xla=seconds / 10, trace=1e-6)
        chosen = probe.choose(remaining=remaining)
        assert not chosen.jit_compile
        assert f"the run ({remaining} steps) is too short for a probe" in chosen.reason
        assert "--jit_compile forces XLA" in chosen.reason
        assert probe.built == [] and probe.restored == 0
    # One step more: the graph step is traced and timed, and the estimate decides.
    probe = Probe(graph=30.0, xla=3.0, trace=1e-6)
    chosen = probe.choose(remaining=step_path.min_probed_steps() + 1)
    assert "the run (~6030 s) is too short" in chosen.reason
    assert probe.built == [False] and probe.steps == {False: 2, True: 0} and probe.restored == 1


def test_a_flag_forces_either_path_without_a_probe():
    for requested, name in ((True, "xla"), (False, "graph")):
        probe = Probe(graph=0.1, xla=0.3)
        chosen = probe.choose(requested, flag="--jit_compile")
        assert chosen.name == name and probe.built == [] and probe.restored == 0
    assert "--nojit_compile given" in Probe(0.1, 0.1).choose(False).reason


def test_a_probe_is_remembered_for_the_same_step_in_the_process(monkeypatch):
    monkeypatch.setattr(step_path, "_MEMO", {})
    first = Probe(graph=0.30, xla=0.20)
    assert first.choose(memo_key="k").jit_compile
    again = Probe(graph=0.10, xla=0.90)
    chosen = again.choose(memo_key="k")
    assert chosen.jit_compile and "probed earlier in this process" in chosen.reason
    assert again.built == [] and again.restored == 0
    assert not Probe(graph=0.10, xla=0.90).choose(memo_key="other").jit_compile


def test_the_snapshot_is_restored_when_a_probe_step_fails():
    probe = Probe(graph=0.30, xla=0.20)

    def failing(jit):
        if jit:
            raise tf.errors.ResourceExhaustedError(None, None, "out of memory")
        return probe.runner(jit)

    with pytest.raises(tf.errors.ResourceExhaustedError):
        step_path.choose(None, strategy=create_strategy("one_device"), remaining_steps=10**6,
                         runner=failing, snapshot=probe.snapshot, clock=probe.clock)
    assert probe.restored == 1


def test_multi_worker_and_tpu_are_not_probed():
    class FakeExtended:
        worker_devices = ("/job:localhost/replica:0/task:0/device:GPU:0",)

    class FakeStrategy:
        extended = FakeExtended()

    assert "not a CPU" in step_path.off_cpu_reason(FakeStrategy())
    assert step_path.off_cpu_reason(create_strategy("one_device")) is None
    assert step_path.off_cpu_reason(create_strategy("mirrored")) is None  # the two test CPUs
    assert step_path.off_cpu_reason(tf.distribute.get_strategy()) is None  # the default one


def test_snapshot_puts_back_keras_and_mirrored_variables():
    import keras

    strategy = create_strategy("mirrored")
    with strategy.scope():
        mirrored = tf.Variable([1.0, 2.0])
        weight = keras.Variable(np.ones((2, 2), np.float32))
        steps = tf.Variable(7, dtype=tf.int64)
    snapshot = step_path.Snapshot([mirrored, weight, steps, mirrored])
    mirrored.assign([5.0, 6.0])
    weight.assign(np.zeros((2, 2), np.float32))
    steps.assign(9)
    snapshot.restore()
    for replica_value in strategy.experimental_local_results(mirrored):
        np.testing.assert_array_equal(replica_value.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(weight.numpy(), np.ones((2, 2)))
    assert int(steps.numpy()) == 7


def test_cpu_description_names_the_vector_extensions_and_onednn():
    model, flags = cpu.cpu_flags()
    text = cpu.cpu_description()
    if flags:  # Linux
        assert model in text and "has " in text and "lacks " in text and "oneDNN o" in text
        for name in cpu.FEATURES:
            assert name in text
        assert ("avx2" in cpu.vector_extensions().split()) == ("avx2" in flags)


def test_onednn_is_turned_on_for_avx2_cpus_that_tensorflow_leaves_off(monkeypatch):
    """TensorFlow's Linux default turns oneDNN on only with VNNI/BF16/AMX (port.cc); an AVX2
    CPU without them gets TF_ENABLE_ONEDNN_OPTS=1, unless the user set it or TensorFlow was
    imported already. Checked on every CPU kind by faking /proc/cpuinfo's flags."""
    def on(flags, environ=None, imported=False):
        monkeypatch.setattr(cpu, "cpu_flags", lambda: ("fake", set(flags)))
        monkeypatch.setattr(cpu, "onednn_set_because", None)
        environ = dict(environ or {})
        reason = cpu.enable_onednn(environ, {"tensorflow": tf} if imported else {})
        return reason, environ.get(cpu.ONEDNN_VARIABLE), cpu.onednn_description(environ)

    reason, value, text = on({"avx", "avx2", "fma"})  # Zen 2/3, or AVX-512 hidden by a VM
    assert value == "1" and "AVX512_VNNI" in reason and text.startswith("oneDNN on (")
    for flags in ({"avx2", "fma", "avx512f", "avx512_vnni"}, {"avx2", "fma", "avx_vnni"},
                  {"avx", "sse4_2"}):  # TensorFlow's own default, or no AVX2 kernels
        assert on(flags)[:2] == (None, None), flags
    assert "TensorFlow's default" in on({"avx2", "fma", "avx512_bf16"})[2]
    assert "turns on its AVX2 kernels" in on({"avx2", "fma"}, imported=True)[2]
    assert on({"avx2", "fma"}, imported=True)[:2] == (None, None)
    reason, value, text = on({"avx2", "fma"}, {cpu.ONEDNN_VARIABLE: "0"})
    assert (reason, value) == (None, "0") and text == "oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)"
    # An emulated AVX2 CPU (oneDNN capped, /proc/cpuinfo unchanged) is named as such.
    text = on({"avx2", "fma", "avx512f", "avx512_vnni"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"})[2]
    assert text == ("oneDNN on (TensorFlow's default for this CPU), its kernels limited to AVX2 "
                    "by ONEDNN_MAX_CPU_ISA")
    assert on({"avx2", "fma"}, {cpu.ONEDNN_VARIABLE: "0", "DNNL_MAX_CPU_ISA": "AVX2"})[2] == \
        "oneDNN off (TF_ENABLE_ONEDNN_OPTS=0)"


def test_importing_electra_tf_first_turns_onednn_on_in_a_fresh_process():
    """The real thing: a process that imports electra_tf and then TensorFlow has oneDNN on
    exactly when TensorFlow's default or our rule says so (on this CPU)."""
    import subprocess

    code = ("import electra_tf, electra_tf.cpu as c\n"
            "from tensorflow.python.util import _pywrap_util_port as p\n"
            "print(p.IsMklEnabled(), c.onednn_set_because is not None)")
    env = {k: v for k, v in os.environ.items() if k != cpu.ONEDNN_VARIABLE}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    enabled, set_by_us = out.stdout.split()
    _, flags = cpu.cpu_flags()
    default_on = any(name in flags for name in cpu.TF_ONEDNN_DEFAULT_ON)
    assert set_by_us == str({"avx2", "fma"} <= flags and not default_on)
    assert enabled == str(default_on or set_by_us == "True")


# --- the pretraining loop -------------------------------------------------------------------------
def _config(**changes):
    values = dict(train_batch_size=8, num_train_steps=4, learning_rate=1e-3, num_warmup_steps=1,
                  max_seq_length=32, steps_per_loop=2, save_checkpoints_steps=2,
                  summary_steps=2, keep_checkpoint_max=10, seed=3, shuffle_buffer=64,
                  adam_beta_2=0.98)
    values.update(changes)
    return PretrainingConfig(**values)


def _weights(checkpoint):
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(checkpoint)
            if name.startswith(("variables/", "optimizer/"))}


@pytest.fixture(scope="module")
def forced_runs(tmp_path_factory, pretrain_shards, pretrain_vocab):
    """Two finished 4-step runs forced to a path, {False: the graph's, True: XLA's}: each
    (model_dir, result, its ckpt-4 weights). The probe test compares a probed run with the one
    of its choice; the resume test continues a copy of the XLA run on the graph and compares it
    with the graph run."""
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    strategy = create_strategy("one_device")
    runs = {}
    for jit in (False, True):
        model_dir = str(tmp_path_factory.mktemp("forced") / ("xla" if jit else "graph"))
        result = run_pretraining(model_config, _config(jit_compile=jit), pretrain_shards,
                                 model_dir, strategy)
        runs[jit] = (model_dir, result, _weights(os.path.join(model_dir, "ckpt-4")))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("margin, jit", [(-1.0, True), (1e9, False)])
def test_the_probe_is_undone_the_run_equals_one_forced_to_its_choice(
        tmp_path, pretrain_shards, pretrain_vocab, monkeypatch, margin, jit, forced_runs):
    """The probe (forced here: any run pays, and `margin` decides) trains for real; its steps
    are undone, so the run's checkpoints equal those of a run given the chosen path (the
    module's run forced to it)."""
    monkeypatch.setattr(step_path, "PROBE_SHARE", 1e9)
    monkeypatch.setattr(step_path, "MARGIN", margin)
    monkeypatch.setattr(step_path, "SAMPLE_SECONDS", 0.0)
    monkeypatch.setattr(step_path, "_MEMO", {})
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    strategy = create_strategy("one_device")
    probed = run_pretraining(model_config, _config(), pretrain_shards, str(tmp_path / "probed"),
                             strategy)
    record = json.loads((tmp_path / "probed" / run_folder.RECORD_FILE).read_text())
    assert record["step_path"]["path"] == ("xla" if jit else "graph")
    assert set(record["step_path"]["seconds_per_step"]) == {"graph", "xla"}
    assert record["pretraining_config"]["jit_compile"] is None  # what was asked: auto
    forced_dir, forced, b = forced_runs[jit]
    assert probed.step == forced.step == 4
    a = _weights(tf.train.latest_checkpoint(str(tmp_path / "probed")))
    assert tf.train.latest_checkpoint(forced_dir).endswith("ckpt-4")
    assert set(a) == set(b) and any("iter" in name for name in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert probed.metrics["loss"] == forced.metrics["loss"]


@pytest.mark.slow
def test_a_run_resumes_exactly_on_the_other_path(tmp_path, pretrain_shards, pretrain_vocab,
                                                 forced_runs):
    """Half the run with XLA, the rest as a graph (another CPU kind's choice) continues the run:
    the path is not in the checkpoint (the same variables either way), the step, the input's
    position and the draws go on, and the two paths differ by rounding only
    (tests/benchmarks/test_step_parity.py holds one step on either path to the PyTorch
    reference). Adam without bias correction turns a gradient element at rounding level into an
    update of up to the learning rate (the parity test's `sensitivity`), so after the switch the
    weights are compared by their norms. The straight graph run and the XLA run are the
    module's forced runs."""
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    strategy = create_strategy("one_device")
    straight, graph_run, _ = forced_runs[False]
    switched = str(tmp_path / "switched")
    shutil.copytree(forced_runs[True][0], switched)
    # The XLA run's checkpoint at step 2 is where the switch happens: its later one is removed
    # (a run killed after step 2), so the rerun resumes from it with the same schedule.
    xla_names = set(forced_runs[True][2])
    for path in glob.glob(os.path.join(switched, "ckpt-4.*")):
        os.remove(path)
    resumed = run_pretraining(model_config, _config(jit_compile=False), pretrain_shards,
                              switched, strategy)
    assert resumed.step == 4
    record = json.loads(open(os.path.join(switched, run_folder.RECORD_FILE)).read())
    assert record["step_path"]["path"] == "graph"
    assert "--nojit_compile given" in record["step_path"]["reason"]
    a = _weights(tf.train.latest_checkpoint(straight))
    b = _weights(tf.train.latest_checkpoint(switched))
    assert set(a) == set(b) == xla_names
    # The same batches, masks, samples and dropout at every step: the losses agree.
    losses_a, losses_b = _losses(straight), _losses(switched)
    assert sorted(losses_a) == sorted(losses_b) == [2, 4]
    for step in losses_a:
        assert losses_b[step] == pytest.approx(losses_a[step], rel=1e-4), step
    for name in ("loss", "mlm_loss", "disc_loss"):
        assert resumed.metrics[name] == pytest.approx(graph_run.metrics[name], rel=1e-4), name
    for name in a:
        if a[name].dtype.kind == "f":
            assert np.linalg.norm(a[name] - b[name]) <= 1e-2 * np.linalg.norm(a[name]) + 1e-6, name
        else:  # steps, seed-generator states
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _losses(model_dir) -> dict[int, float]:
    """step -> the summarised loss, over model_dir/train's event files (the last one written
    for a step: a resumed run summarises again the steps after its checkpoint)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "train", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "loss":
                    out[event.step] = float(tf.make_ndarray(value.tensor))
    return out
