"""The demo's configuration: pretraining refuses a folder left by a different run, and model
overrides are checked before any work (cheap, no training)."""

import json

import pytest

from electra_tf import demo
from electra_tf.training.pretraining import PretrainingConfig


def _leave_run(folder, **changes):
    folder.mkdir(parents=True, exist_ok=True)
    config = PretrainingConfig(**changes)
    record = {"pretraining_config": config.to_dict(), "model_config": {"objective": "electra"}}
    (folder / "pretraining_config.json").write_text(json.dumps(record))
    return config


def test_a_run_with_other_hyperparameters_is_refused_naming_them(tmp_path):
    folder = tmp_path / "pretrain"
    _leave_run(folder, learning_rate=2e-3, adam_beta_2=0.98)
    with pytest.raises(ValueError, match=r"learning_rate: 0.002 there, 0.0002 now"):
        demo._check_same_run(str(folder), PretrainingConfig(learning_rate=2e-4, adam_beta_2=0.98),
                             {})
    with pytest.raises(ValueError, match="objective: 'electra' there, 'mlm' now"):
        demo._check_same_run(str(folder), PretrainingConfig(learning_rate=2e-3, adam_beta_2=0.98),
                             {"objective": "mlm"})
    demo._check_same_run(str(folder), PretrainingConfig(learning_rate=2e-3, adam_beta_2=0.98), {})


def test_a_record_written_before_adam_beta_2_existed_counts_as_0_999(tmp_path):
    folder = tmp_path / "pretrain"
    _leave_run(folder)
    record = json.loads((folder / "pretraining_config.json").read_text())
    del record["pretraining_config"]["adam_beta_2"]
    (folder / "pretraining_config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="adam_beta_2: 0.999 there, 0.98 now"):
        demo._check_same_run(str(folder), PretrainingConfig(adam_beta_2=0.98), {})
    demo._check_same_run(str(folder), PretrainingConfig(), {})


def test_model_overrides_are_checked_when_the_config_is_made():
    with pytest.raises(ValueError, match="unknown field.*num_layerz"):
        demo.DemoConfig(model_overrides=(("num_layerz", 2),))
    with pytest.raises(ValueError, match="num_layers: must be an integer"):
        demo.DemoConfig(model_overrides=(("num_layers", "two"),))
    with pytest.raises(ValueError, match="embedding_sharing"):  # 'all' needs a same-size generator
        demo.DemoConfig(model_overrides=(("embedding_sharing", "all"),))


def test_the_replication_study_trains_the_models_of_its_own_overrides():
    from electra_tf.replication import ReplicationConfig

    assert ReplicationConfig().demo_config().model_overrides == ()
    shaped = ReplicationConfig(model_overrides=(("num_layers", 2),)).demo_config()
    assert shaped.model_overrides == (("num_layers", 2),)
