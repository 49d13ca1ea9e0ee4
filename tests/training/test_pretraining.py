"""The pretraining loop and the electra-pretrain binary, on real shards and real processes.

In-process tests use the two logical CPUs of tests/conftest.py; resume, multi-worker and the
TPU failure run `python -m electra_tf.tools.pretrain` (or a worker script) as real subprocesses, with real
signals, on 127.0.0.1.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import run_folder
from electra_tf.config import ElectraConfig
from electra_tf.progress import ProgressLogger
from electra_tf.training.config import PretrainingConfig, PretrainingConfigError
from electra_tf.training.loop import NonFiniteLossError, _build, run_pretraining
from electra_tf.training.strategy import create_strategy
from electra_tf.training.summaries import collapse_warning

OBJECTIVE_TAGS = {"loss", "mlm_loss", "mlm_accuracy", "sampled_accuracy", "disc_loss",
                  "disc_accuracy", "disc_precision", "disc_recall", "disc_auc"}
RUN_TAGS = {"learning_rate", "gradient_norm", "examples_per_second", "tokens_per_second"}


def tiny_config(vocab):
    return ElectraConfig.from_json("electra_tiny").with_vocab(vocab)


def run_config(**changes):
    values = dict(train_batch_size=8, num_train_steps=4, learning_rate=1e-3, num_warmup_steps=1,
                  max_seq_length=32, steps_per_loop=2, save_checkpoints_steps=2,
                  summary_steps=2, keep_checkpoint_max=10, seed=3, shuffle_buffer=64)
    values.update(changes)
    return PretrainingConfig(**values)


def summaries(model_dir) -> dict[str, list[int]]:
    """tag -> steps, over every event file of model_dir/train (in file order)."""
    tags: dict[str, list[int]] = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "train", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


def model_weights(checkpoint) -> dict[str, np.ndarray]:
    """The model's variables in a checkpoint: weights and dropout seed-generator states."""
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(checkpoint)
            if name.startswith("variables/")}


def wait_for_line(process, pattern: str, timeout: float, seen: list[str]) -> bool:
    """Reads the process's output until a line contains `pattern` (collected into `seen`)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            return False
        seen.append(line)
        if pattern in line:
            return True
    return False


# --- config -------------------------------------------------------------------------------------
def test_paper_defaults_per_size_and_validation_names_the_field():
    small = PretrainingConfig.for_model_size("electra_small")
    base = PretrainingConfig.for_model_size("base")
    large = PretrainingConfig.for_model_size("electra_large", seed=7)
    assert (small.learning_rate, small.train_batch_size, small.num_train_steps,
            small.max_seq_length) == (5e-4, 128, 1_000_000, 128)
    assert (base.learning_rate, base.train_batch_size, base.num_train_steps,
            base.max_seq_length) == (2e-4, 256, 766_000, 512)
    assert (large.learning_rate, large.train_batch_size, large.num_train_steps,
            large.max_seq_length, large.seed) == (2e-4, 2048, 400_000, 512, 7)
    assert small.num_warmup_steps == base.num_warmup_steps == 10_000
    # One rule for "model size" (`ElectraConfig.model_size`, which fine-tuning's defaults use
    # too): the hidden width, whatever the config is called.
    custom = ElectraConfig.from_json("electra_small").replace(hidden_size=768, num_heads=12)
    assert custom.model_size == "base"
    assert PretrainingConfig.for_model_size(custom).learning_rate == base.learning_rate
    assert [ElectraConfig.from_json(n).model_size for n in
            ("electra_tiny", "electra_demo", "electra_small_plus", "electra_base",
             "electra_large")] == ["small", "small", "small", "base", "large"]
    with pytest.raises(PretrainingConfigError, match="PretrainingConfig.mixed_precision"):
        PretrainingConfig(mixed_precision="float8")
    with pytest.raises(PretrainingConfigError, match="PretrainingConfig.steps_per_loop"):
        PretrainingConfig(steps_per_loop=0)


def test_adam_beta_2_is_validated_and_reaches_the_optimizer(pretrain_vocab):
    with pytest.raises(PretrainingConfigError, match="PretrainingConfig.adam_beta_2"):
        PretrainingConfig(adam_beta_2=1.0)
    config = PretrainingConfig(adam_beta_2=0.98, num_train_steps=10, num_warmup_steps=1)
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    _, opt, _ = _build(model_config, config, create_strategy("one_device"))
    assert opt.beta_2 == pytest.approx(0.98)


def test_collapse_warning_only_for_a_chance_level_discriminator_after_the_warmup():
    config = PretrainingConfig(num_warmup_steps=60, learning_rate=2e-3)
    warning = collapse_warning({"disc_auc": 0.501}, 200, config)
    assert warning and "step 200" in warning and "learning rate 0.002" in warning
    assert collapse_warning({"disc_auc": 0.501}, 100, config) is None  # in warmup
    assert collapse_warning({"disc_auc": 0.70}, 200, config) is None
    assert collapse_warning({"mlm_loss": 6.5}, 200, config) is None  # no RTD
    # Electric's NCE logit includes log q: chance-level AUC is no sign of collapse there.
    assert collapse_warning({"disc_auc": 0.501}, 200, config, "electric") is None
    assert collapse_warning({"disc_auc": 0.501}, 200, config, "electra_15")


# --- in-process runs ----------------------------------------------------------------------------
@pytest.mark.slow
def test_mirrored_two_cpus_trains_from_real_shards(tmp_path, pretrain_shards, pretrain_vocab,
                                                  iterated_datasets):
    strategy = create_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    model_dir = str(tmp_path / "run")
    result = run_pretraining(tiny_config(pretrain_vocab), run_config(),
                                         pretrain_shards, model_dir, strategy,
                                         vocab_file=pretrain_vocab, flags={"strategy": "mirrored"})
    assert result.step == 4 and not result.preempted
    # Every dataset the run iterated, each device's buffer under the strategy's iterator included,
    # ran untuned (`pipeline.distributed_iterator`: freeing an autotuned one waits for its tuner).
    assert sum(isinstance(d.element_spec, dict) for d in iterated_datasets) >= 2
    assert all(d.options().autotune.enabled is False for d in iterated_datasets)
    assert np.isfinite(result.metrics["loss"]) and result.metrics["loss"] > 0
    assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-4")
    # Config JSON: flags, resolved model config and pretraining config.
    saved = json.loads((tmp_path / "run" / run_folder.RECORD_FILE).read_text())
    assert saved["flags"] == {"strategy": "mirrored"}
    assert saved["model_config"]["vocab_size"] == tiny_config(pretrain_vocab).vocab_size
    assert saved["pretraining_config"]["train_batch_size"] == 8
    assert saved["num_replicas"] == 2
    # Summaries: every objective metric plus the run's rates, at steps 2 and 4.
    tags = summaries(model_dir)
    assert OBJECTIVE_TAGS | RUN_TAGS <= set(tags), set(tags)
    assert tags["loss"] == [2, 4]
    # The discriminator alone loads with from_pretrained.
    from electra_tf.convert.pretrained import from_pretrained

    disc, config, vocab = from_pretrained(result.discriminator_dir)[:3]
    assert config.vocab_size == saved["model_config"]["vocab_size"]
    assert vocab is not None and os.path.exists(vocab)


JIT_CONFIG = run_config(num_train_steps=5, steps_per_loop=3, jit_compile=True,
                        save_checkpoints_steps=3, summary_steps=3)


@pytest.fixture(scope="module")
def jit_run(tmp_path_factory, pretrain_shards, pretrain_vocab):
    """One XLA-compiled 5-step run (loops of 3): its claims are the jit test's, and its folder
    is the good start the NaN test continues (an XLA compilation is the costliest build here).
    Returns (model_dir, result, the steps at which the progress lines' clock was restarted);
    tests that write copy the folder."""
    model_dir = str(tmp_path_factory.mktemp("jit") / "run")
    resets, reset_clock = [], ProgressLogger.reset_clock
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ProgressLogger, "reset_clock",
                      lambda self, step=None: (resets.append(step), reset_clock(self, step)))
        result = run_pretraining(tiny_config(pretrain_vocab), JIT_CONFIG, pretrain_shards,
                                 model_dir, create_strategy("one_device"))
    return model_dir, result, resets


@pytest.mark.slow
def test_jit_compile_with_several_steps_per_loop(jit_run):
    model_dir, result, resets = jit_run
    assert result.step == 5  # a loop of 3, then the remaining 2
    # The progress lines' rate and ETA count from the end of the first call (its trace and
    # compilation), once; restarted after every call (here 1, 2, 3, 5) they were the last call's
    # alone, and the demo's ETA jumped between 23 and 37 minutes from line to line.
    assert resets == [1]
    assert np.isfinite(result.metrics["loss"])
    assert summaries(model_dir)["loss"] == [3, 5]
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "ckpt-*.index"))) \
        == ["ckpt-3.index", "ckpt-5.index"]


@pytest.mark.slow
def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path, jit_run, pretrain_shards, pretrain_vocab):
    """The good start is the jit run's folder (5 steps); continued as a graph, with an absurd
    learning rate and a checkpoint after every step, until the loss is NaN."""
    model_dir = str(tmp_path / "run")
    shutil.copytree(jit_run[0], model_dir)
    good_weights = model_weights(tf.train.latest_checkpoint(model_dir))
    # Same run, continued with an absurd learning rate: the weights blow up within a few steps.
    bad = JIT_CONFIG.replace(num_train_steps=35, learning_rate=1e30, num_warmup_steps=0,
                             steps_per_loop=1, save_checkpoints_steps=1, jit_compile=None)
    with pytest.raises(NonFiniteLossError, match=r"at step (\d+)") as info:
        run_pretraining(tiny_config(pretrain_vocab), bad, pretrain_shards, model_dir,
                        create_strategy("one_device"),
                        allow_changes=("learning_rate", "num_warmup_steps"))
    bad_step = int(info.value.args[0].split("at step ")[1].split(":")[0])
    assert bad_step >= 6
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest.endswith(f"ckpt-{bad_step - 1}")  # every step before it was good and saved
    weights = model_weights(latest)
    assert all(np.all(np.isfinite(w)) for w in weights.values())
    assert set(weights) == set(good_weights)


@pytest.mark.slow
def test_nan_loss_before_any_checkpoint_says_so(tmp_path, pretrain_shards, pretrain_vocab):
    config = run_config(num_train_steps=30, steps_per_loop=1, save_checkpoints_steps=1000,
                        learning_rate=1e30, num_warmup_steps=0)
    with pytest.raises(NonFiniteLossError) as info:
        run_pretraining(tiny_config(pretrain_vocab), config, pretrain_shards,
                                    str(tmp_path), create_strategy("one_device"),
                                    check_shards=False)
    assert str(info.value).endswith(": stopping; no checkpoint was saved yet"), info.value
    assert "None" not in str(info.value)


@pytest.mark.slow
def test_float16_loss_scale_skips_are_logged_and_summarised(tmp_path, pretrain_shards,
                                                            pretrain_vocab, caplog, th):
    # The loss scale starts at 2**15: the first steps' float16 gradients overflow, and the
    # scale halves until they fit. Those steps update nothing and are not counted.
    config = run_config(num_train_steps=2, steps_per_loop=2, summary_steps=2,
                        mixed_precision="float16")
    with caplog.at_level("INFO"):
        result = run_pretraining(tiny_config(pretrain_vocab), config,
                                             pretrain_shards, str(tmp_path),
                                             create_strategy("one_device"), check_shards=False)
    assert result.step == 2
    skipped = th.scalar_values(str(tmp_path), "loss_scale/skipped_steps")
    assert len(skipped) == 1 and skipped[0][0] == 2 and skipped[0][1] >= 1, skipped
    assert "steps skipped by the float16 loss scale (non-finite gradients: no update, not " \
        "counted; the scale is now" in caplog.text
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert progress and not any("gradient_norm 0," in line or line.endswith("gradient_norm 0")
                                for line in progress), progress
    assert th.scalar_values(str(tmp_path), "loss_scale/scale")[0][1] < 2 ** 15


# --- real processes -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_then_resume_matches_an_uninterrupted_run(tmp_path, pretrain_shards,
                                                          pretrain_vocab, th):
    steps = 10
    common = dict(num_train_steps=steps, steps_per_loop=1, summary_steps=1,
                  save_checkpoints_steps=4, adam_beta_2=0.98)
    straight_dir, resumed_dir = str(tmp_path / "straight"), str(tmp_path / "resumed")
    straight = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, straight_dir,
                                                 **common))
    # The interrupted run: SIGTERM once it logged step 3 (between checkpoints 0 and 4).
    first = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, resumed_dir,
                                              **common))
    seen: list[str] = []
    assert wait_for_line(first, f"step 3/{steps}", 240, seen), "".join(seen[-30:])
    first.send_signal(signal.SIGTERM)
    rest, _ = first.communicate(timeout=120)
    log = "".join(seen) + rest
    assert first.returncode == 0, log[-3000:]
    assert "Stopped at step" in log
    stopped = int(log.split("Stopped at step ")[1].split()[0])
    assert 3 <= stopped < steps
    assert tf.train.latest_checkpoint(resumed_dir).endswith(f"ckpt-{stopped}")
    assert not os.path.exists(os.path.join(resumed_dir, "discriminator"))

    second = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, resumed_dir,
                                               **common))
    log2, _ = second.communicate(timeout=300)
    assert second.returncode == 0, log2[-3000:]
    assert f"Resumed from {resumed_dir}/ckpt-{stopped} at step {stopped}" in log2
    out, _ = straight.communicate(timeout=300)
    assert straight.returncode == 0, out[-3000:]
    recorded = json.loads(open(os.path.join(straight_dir, run_folder.RECORD_FILE)).read())
    assert recorded["pretraining_config"]["adam_beta_2"] == 0.98  # the flag reached the config

    # Every step summarised exactly once across the two runs.
    assert summaries(resumed_dir)["loss"] == list(range(1, steps + 1))
    a = model_weights(tf.train.latest_checkpoint(straight_dir))
    b = model_weights(tf.train.latest_checkpoint(resumed_dir))
    assert set(a) == set(b) and len(a) > 10
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert os.path.exists(os.path.join(resumed_dir, "discriminator", "model.index"))


WORKER = textwrap.dedent("""
    import sys

    import numpy as np
    from absl import logging

    from electra_tf.config import ElectraConfig
    from electra_tf.training.config import PretrainingConfig
    from electra_tf.training.loop import run_pretraining
    from electra_tf.training.strategy import create_strategy, is_chief

    data, vocab, model_dir, out = sys.argv[1:5]
    logging.set_verbosity(logging.INFO)
    strategy = create_strategy("multi_worker")
    model_config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab)
    # Steps 1-2 with whole batches, then the run resumed for steps 3-4 with 2 micro-batches.
    for steps, micro_batches in ((2, 1), (4, 2)):
        config = PretrainingConfig(
            train_batch_size=8, num_train_steps=steps, learning_rate=1e-3, num_warmup_steps=1,
            max_seq_length=32, steps_per_loop=2, save_checkpoints_steps=2, summary_steps=2,
            seed=3, shuffle_buffer=64, gradient_accumulation_steps=micro_batches)
        result = run_pretraining(model_config, config, data, model_dir, strategy)
        np.savez(f"{out}-{steps}.npz",
                 **{v.path: v.numpy() for v in result.model.trainable_variables})
        print("CHIEF" if is_chief(strategy) else "WORKER", "replicas",
              strategy.num_replicas_in_sync, "step", result.step, "micro_batches",
              micro_batches, flush=True)
""")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_multi_worker_two_processes_train_in_sync_and_only_the_chief_writes(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    """Two worker processes run steps 1-2 with whole batches, then resume the run for steps 3-4
    with 2 micro-batches per step (one pair of processes for both step kinds): after each part
    the workers hold the same weights, and only the chief wrote checkpoints, summaries and the
    discriminator."""
    ports = [th.free_port(), th.free_port()]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    model_dir = tmp_path / "run"
    processes, temp_dirs = [], []
    for index in range(2):
        temp = tmp_path / f"tmp{index}"
        temp.mkdir()
        temp_dirs.append(temp)
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
                                                     "task": {"type": "worker", "index": index}}),
                   TMPDIR=str(temp), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                   PYTHONUNBUFFERED="1")
        processes.append(subprocess.Popen(
            [sys.executable, str(script), pretrain_shards, pretrain_vocab, str(model_dir),
             str(tmp_path / f"weights{index}")], cwd=th.repo, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in processes:
            logs.append(p.communicate(timeout=400)[0])
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
    for p, log in zip(processes, logs):
        assert p.returncode == 0, log[-3000:]
    for steps, micro_batches in ((2, 1), (4, 2)):
        assert f"CHIEF replicas 2 step {steps} micro_batches {micro_batches}" in logs[0]
        assert f"WORKER replicas 2 step {steps} micro_batches {micro_batches}" in logs[1]
        w0 = np.load(tmp_path / f"weights0-{steps}.npz")
        w1 = np.load(tmp_path / f"weights1-{steps}.npz")
        assert sorted(w0.files) == sorted(w1.files) and len(w0.files) > 10
        for name in w0.files:
            np.testing.assert_array_equal(w0[name], w1[name], err_msg=f"step {steps}: {name}")
    assert f"Resumed from {model_dir}/ckpt-2 at step 2" in logs[0]
    # Only the chief says it saved the discriminator: the other one wrote to a temporary folder.
    assert logs[0].count(f"Saved the discriminator to {model_dir}/discriminator") == 2
    assert "Saved the discriminator" not in logs[1]
    # The chief wrote checkpoints, summaries and the export; the other worker left nothing.
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-4")
    assert (model_dir / "discriminator" / "model.index").exists()
    assert summaries(str(model_dir))["loss"] == [2, 4]
    for temp in temp_dirs:  # non-chief checkpoints went to a temporary folder, now deleted
        assert not glob.glob(str(temp / "electra_worker_*")), os.listdir(temp)
    checkpoints = glob.glob(str(tmp_path / "**" / "ckpt-*.index"), recursive=True)
    assert checkpoints and all(p.startswith(str(model_dir)) for p in checkpoints), checkpoints


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tpu_without_a_tpu_fails_fast_and_clearly(tmp_path, pretrain_shards, pretrain_vocab, th):
    # Something listens but never speaks gRPC: TF alone would block forever in initialisation.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        address = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
        start = time.time()
        process = th.pretrain_process(th.tiny_flags(
            pretrain_shards, pretrain_vocab, str(tmp_path), strategy="tpu", tpu=address,
            strategy_timeout=5))
        out, _ = process.communicate(timeout=60)
        elapsed = time.time() - start
    assert process.returncode == 1, out[-2000:]
    assert elapsed < 20, elapsed
    assert f"strategy tpu: connecting to TPU '{address}' did not finish within 5s" in out
    assert not glob.glob(str(tmp_path / "ckpt-*"))
