"""ELECTRA vs the MLM baseline and the paper's other objectives at equal pretraining compute.

  python -m tools.replicate [--workdir=runs/replication] [--electra_steps=1200] [--num_seeds=3]
      [--num_points=2] [--variants=electra,mlm,electra_15,replace_mlm,all_tokens_mlm]

Writes results.json, results.md (the table) and accuracy_vs_compute.png into --workdir.
See electra_tf/replication.py for the protocol. Rerunning reuses finished runs.
"""

from absl import app, flags

from electra_tf import replication

_WORKDIR = flags.DEFINE_string("workdir", "runs/replication", "Output folder.")
_VARIANTS = flags.DEFINE_list("variants", list(replication.VARIANTS), "Objectives to compare.")
_STEPS = flags.DEFINE_integer("electra_steps", 1200, "ELECTRA's pretraining steps (the budget).")
_POINTS = flags.DEFINE_integer("num_points", 2, "Fine-tuned checkpoints along the budget.")
_SEEDS = flags.DEFINE_integer("num_seeds", 3, "Fine-tuning seeds per checkpoint.")
_EXAMPLES = flags.DEFINE_integer("finetune_examples", 2000, "RT training sentences per run.")
_EPOCHS = flags.DEFINE_float("finetune_epochs", 2.0, "Fine-tuning epochs.")
_CORPUS = flags.DEFINE_float("corpus_scale", 1.0, "Fraction of the IMDB reviews to pack.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of pretraining and the first fine-tuning run.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    replication.run(replication.ReplicationConfig(
        workdir=_WORKDIR.value, variants=tuple(_VARIANTS.value), electra_steps=_STEPS.value,
        num_points=_POINTS.value, num_seeds=_SEEDS.value, finetune_examples=_EXAMPLES.value,
        finetune_epochs=_EPOCHS.value, corpus_scale=_CORPUS.value, seed=_SEED.value))


def run():
    app.run(main)


if __name__ == "__main__":
    run()
