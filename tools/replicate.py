"""ELECTRA vs the MLM baseline and the paper's other objectives at equal pretraining compute.

  python -m electra_tf.tools.replicate [--workdir=runs/replication] [--electra_steps=4000] [--num_seeds=3]
      [--num_points=2] [--variants=electra,mlm,electra_15,replace_mlm,all_tokens_mlm[,electric]]
      [--eval_split=dev|tune|cv] [--target_gain=3]

Writes results.json, results.md (the table) and accuracy_vs_compute.png into --workdir.
See electra_tf/experiments/replication.py for the protocol. Rerunning reuses finished runs.
"""

import json
import sys

from absl import app, flags

from electra_tf import cli
from electra_tf.experiments import replication

_WORKDIR = flags.DEFINE_string("workdir", "runs/replication", "Output folder.")
_VARIANTS = flags.DEFINE_list(
    "variants", list(replication.VARIANTS), "Objectives to compare: the paper's Table 5 by "
    f"default; any of {','.join(replication.ALL_VARIANTS)} (electric: Electric, EMNLP 2020).")
_STEPS = flags.DEFINE_integer("electra_steps", replication.ReplicationConfig.electra_steps,
                              "ELECTRA's pretraining steps (the budget; default the demo's).")
_POINTS = flags.DEFINE_integer("num_points", 2, "Fine-tuned checkpoints along the budget.")
_SEEDS = flags.DEFINE_integer("num_seeds", 3, "Fine-tuning seeds per checkpoint.")
_EXAMPLES = flags.DEFINE_integer("finetune_examples", None,
                                 "RT training sentences per run (default: all of the split).")
_EPOCHS = flags.DEFINE_float("finetune_epochs", replication.demo.DemoConfig.finetune_epochs,
                             "Fine-tuning epochs.")
_SPLIT = flags.DEFINE_enum("eval_split", "dev", ["dev", "tune", "cv"],
                           "Score on the dev split, or ('tune') train on ~85% of the training "
                           "split and score on the other ~15%: choose recipes with 'tune'; or "
                           "('cv') 5-fold cross-validation over the training split, one run per "
                           "fold (--num_seeds unused), every training sentence scored once.")
_CORPUS = flags.DEFINE_float("corpus_scale", 1.0, "Fraction of the IMDB reviews to pack.")
_RECIPE = flags.DEFINE_list(
    "recipe", [], "Pretraining recipe changes, e.g. pretrain_learning_rate=2e-4 (fields of "
    "electra_tf.experiments.demo.DemoConfig: pretrain_learning_rate, pretrain_adam_beta_2, "
    "pretrain_warmup_fraction, pretrain_batch_size, vocab_size, vocab_documents_at_scale_1).")
_OVERRIDE = flags.DEFINE_list(
    "override", [], "Demo model config changes, e.g. mask_prob=0.25,generator_hidden_size=0.125.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of pretraining and the first fine-tuning run.")
_TARGET = flags.DEFINE_float("target_gain", None, "Draw a line this many accuracy points above no "
                             "pretraining's median on the chart, to read the crossover off.")


def _pairs(items, flag):
    """["k=v", ...] -> ((k, v), ...) with v read as JSON when it parses (numbers), else text."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise app.UsageError(f"--{flag}: expected key=value, got {item!r}")
        try:
            value = json.loads(value)
        except ValueError:
            pass
        pairs.append((key.strip(), value))
    return tuple(pairs)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        config = replication.ReplicationConfig(
            workdir=_WORKDIR.value, variants=tuple(_VARIANTS.value), electra_steps=_STEPS.value,
            num_points=_POINTS.value, num_seeds=_SEEDS.value, finetune_examples=_EXAMPLES.value,
            finetune_epochs=_EPOCHS.value, corpus_scale=_CORPUS.value, eval_split=_SPLIT.value,
            recipe=_pairs(_RECIPE.value, "recipe"),
            model_overrides=_pairs(_OVERRIDE.value, "override"), seed=_SEED.value,
            target_gain=_TARGET.value)
    except (TypeError, ValueError) as e:
        raise app.UsageError(str(e)) from None
    try:
        replication.run(config)
    except ValueError as e:  # bad or mismatched data in --workdir (each names the file)
        sys.exit(f"electra_tf.tools.replicate: {e}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
