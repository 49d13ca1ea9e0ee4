"""`electra-pretrain --override objective=electric` from real shards, and its checkpoint in the
authors' TF1 layout and back (models/electric.py, convert/tf1.py); Electric's train step under XLA
(in the binary's run) and under MirroredStrategy on two replicas (in process).

Two runs in all: XLA under MirroredStrategy cannot be one of them (on the two logical CPUs the XLA
step reads an optimizer variable of the other replica's device, an XLA limit), so the binary's
one-device run is the XLA one and the in-process mirrored run the graph one."""

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.convert import tf1
from electra_tf.models import ElectraPretrainer
from electra_tf.run_folder import RECORD_FILE, model_checkpoint


def run_pretraining_binary(th, shards, vocab, model_dir, **flags):
    process = th.pretrain_process(th.tiny_flags(shards, vocab, model_dir, **flags))
    log, _ = process.communicate(timeout=600)
    assert process.returncode == 0, log[-3000:]
    return log


def load_run(model_dir) -> ElectraPretrainer:
    """The pretrainer of a run's newest checkpoint, built from its recorded config."""
    saved = json.loads((Path(model_dir) / RECORD_FILE).read_text())
    model = ElectraPretrainer(ElectraConfig.from_dict(saved["model_config"]),
                              seed=saved["pretraining_config"]["seed"])
    model_checkpoint(model).read(tf.train.latest_checkpoint(str(model_dir))).expect_partial()
    return model


@pytest.mark.slow
def test_electric_pretrains_under_xla_from_shards_and_converts_to_tf1_and_back(
        tmp_path, pretrain_shards, pretrain_vocab, th):
    """One 4-step run of the binary (one device, `--jit_compile`): Electric trains with its train
    step XLA-compiled to finite losses, and its checkpoint goes to the TF1 layout and back."""
    model_dir = tmp_path / "run"
    log = run_pretraining_binary(th, pretrain_shards, pretrain_vocab, model_dir,
                                 override=["objective=electric"], num_train_steps=4,
                                 jit_compile=True)
    assert "Done at step 4\n" in log  # not "(preempted)"
    record = json.loads((model_dir / RECORD_FILE).read_text())
    assert record["pretraining_config"]["jit_compile"] is True
    assert record["step_path"]["path"] == "xla", record["step_path"]
    for tag in ("loss", "cloze_loss", "mlm_loss", "disc_loss", "disc_auc"):
        values = [v for _, v in th.scalar_values(str(model_dir), tag)]
        assert values and np.isfinite(values).all(), tag
    model = load_run(model_dir)
    assert model.config.objective == "electric"
    recorded = json.loads((model_dir / "discriminator" / "config.json").read_text())
    assert recorded["objective"] == "electric"  # the exported discriminator knows what it is

    _, report = tf1.export_tf1(model, tmp_path / "tf1", global_step=4)
    print(report)  # the mapping report, in the test log
    names = {name for _, name, _ in report.mapped}
    assert {n.split("/")[0] for n in names} == {
        "electra", "discriminator_predictions", "generator_ltr", "generator_rtl",
        "cloze_predictions"}
    assert {"generator_ltr/encoder/layer_0/attention/self/query/kernel",
            "generator_rtl/encoder/layer_1/output/dense/kernel",
            "cloze_predictions/output_bias", "electra/embeddings/word_embeddings",
            "discriminator_predictions/dense_1/kernel"} <= names
    distinct_weights = {id(v) for v in model.trainable_variables}  # shared embeddings once
    assert report.counts() == {"mapped": len(distinct_weights), "ignored": 0, "missing": 0,
                               "unknown": 0}

    loaded, _, back, _ = tf1.load_tf1_model(tmp_path / "tf1", network="pretrainer",
                                            config=model.config)
    print(back)
    assert back.counts() == {"mapped": len(names), "ignored": 1, "missing": 0, "unknown": 0}
    ids = np.array([[2] + list(range(10, 40)) + [3]], np.int32)
    features = {"input_ids": tf.constant(ids), "input_mask": tf.ones_like(tf.constant(ids)),
                "segment_ids": tf.zeros_like(tf.constant(ids))}
    seed = tf.constant([0, 1])
    a = model.compute_objective(features, seed, training=False)
    b = loaded.compute_objective(features, seed, training=False)
    for key in ("loss", "cloze_logits", "energy", "rtd_logits"):
        np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


@pytest.mark.slow
def test_electric_runs_under_mirrored(tmp_path, pretrain_shards, pretrain_vocab):
    """4 steps on the two logical CPUs as the graph step (XLA: the binary's run above)."""
    from electra_tf.training.config import PretrainingConfig
    from electra_tf.training.loop import run_pretraining
    from electra_tf.training.strategy import create_strategy

    config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab).replace(
        objective="electric")
    run = PretrainingConfig(train_batch_size=8, num_train_steps=4, learning_rate=1e-3,
                            num_warmup_steps=1, max_seq_length=32, steps_per_loop=2,
                            save_checkpoints_steps=2, summary_steps=2, seed=3,
                            shuffle_buffer=64, jit_compile=False)
    strategy = create_strategy("mirrored")
    assert strategy.num_replicas_in_sync == 2
    result = run_pretraining(config, run, pretrain_shards, str(tmp_path), strategy)
    assert result.step == 4 and not result.preempted
    for name in ("loss", "cloze_loss", "mlm_loss", "disc_loss", "disc_auc"):
        assert np.isfinite(result.metrics[name]), name
