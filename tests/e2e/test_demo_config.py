"""The demo's configuration: pretraining refuses a folder left by a different run, and model
overrides are checked before any work (cheap, no training)."""

import json

import pytest

from electra_tf.experiments import demo
from electra_tf.training.config import PretrainingConfig


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
    from electra_tf.experiments.replication import ReplicationConfig

    assert ReplicationConfig().demo_config().model_overrides == ()
    shaped = ReplicationConfig(model_overrides=(("num_layers", 2),)).demo_config()
    assert shaped.model_overrides == (("num_layers", 2),)


@pytest.mark.parametrize("num_points", [1, 2, 4])
def test_equal_compute_plans_keep_the_training_loop_at_10_to_50_steps_per_call(tmp_path, num_points):
    """22,487 MLM steps (113 x 199) allowed one step per loop call; plans now keep 10-50."""
    from electra_tf.experiments.replication import ReplicationConfig, steps_for_equal_compute

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(7995)]) + "\n")
    tie_all = (("generator_hidden_size", 1.0), ("embedding_sharing", "all"))
    for overrides in ((), tie_all):
        cfg = ReplicationConfig(electra_steps=12000, num_points=num_points, model_overrides=overrides,
                                variants=("electra", "mlm", "electra_15", "replace_mlm", "all_tokens_mlm"))
        plan = steps_for_equal_compute(cfg, str(vocab), 64)
        budget = plan["electra"][0] * plan["electra"][1]
        assert plan["electra"][0] == 12000
        for variant, (steps, per_step) in plan.items():
            assert abs(steps * per_step - budget) <= 0.005 * budget, (variant, steps)
            points = [steps * k // num_points for k in range(1, num_points + 1)]
            assert steps % num_points == 0  # equal parts
            assert demo.checkpoint_cadence(steps, points)[1] >= 10, (variant, steps)
    # A tiny budget keeps whole-step equality rather than round multiples.
    small = ReplicationConfig(electra_steps=10, num_points=1, variants=("electra", "mlm"))
    plan = steps_for_equal_compute(small, str(vocab), 64)
    assert plan["electra"][0] == 10
    assert abs(plan["mlm"][0] * plan["mlm"][1] - 10 * plan["electra"][1]) <= plan["mlm"][1] / 2


def test_a_signal_recorded_inside_a_finalizer_during_the_last_stage_writes_no_summary(
        tmp_path, monkeypatch):
    """A SIGTERM that lands in a `__del__` (TensorFlow has many) is only recorded; the demo must
    stop before writing summary.json, which says it finished. The stages' work is replaced by
    their results: what is checked is the order of the last stage's end, the check and the write."""
    import os
    import signal

    from electra_tf.training import preemption

    accuracy = {"seeds": [1, 2], "values": [0.7, 0.8], "median": 0.75, "min": 0.7, "max": 0.8}
    runs = {"runs": [{"seed": 1, "best_model_dir": "m1"}, {"seed": 2, "best_model_dir": "m2"}]}

    class SignalledWhenCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)

    def serve_and_query(*_):
        SignalledWhenCollected()  # collected here: the signal's handler runs inside its __del__
        return {"answers": [], "all_match": True}

    for name, result in (("build_corpus", "c"), ("build_vocab", "v"), ("build_shards", "s"),
                         ("export", "e")):
        monkeypatch.setattr(demo, name, lambda *_, _r=result, **__: _r)
    monkeypatch.setattr(demo, "pretrain", lambda *_, **__: {"discriminator": "d/discriminator",
                                                             "steps": 1, "metrics": {}})
    monkeypatch.setattr(demo, "finetune_rotten_tomatoes", lambda *_, **__: runs)
    monkeypatch.setattr(demo, "seed_accuracies", lambda _: dict(accuracy))
    monkeypatch.setattr(demo, "serve_and_query", serve_and_query)
    cfg = demo.DemoConfig(workdir=str(tmp_path))

    with pytest.raises(preemption.Interrupted, match=r"stage 6/6 serve: stopped on SIGTERM") as e:
        demo.run(cfg)
    assert e.value.signum == signal.SIGTERM
    assert not (tmp_path / "summary.json").exists()
