"""Trains a small Electric model on the embedded corpus and checks its sentence scores: how often
a held-out IMDB sentence outscores the same words shuffled (electra_tf/experiments/ranking.py).

  python -m electra_tf.tools.electric_ranking --workdir=runs/electric_ranking [--steps=6000] \
      [--num_documents=4000] [--batch_size=64] [--learning_rate=1e-3] [--num_sentences=500]

Prints the result as JSON and writes it to WORKDIR/ranking.json. Each stage (corpus, vocab,
shards, the run) is reused when complete, so a rerun with more --steps needs a new --workdir.
"""

import json

from absl import app, flags

from electra_tf.experiments.ranking import RankingConfig, run

_D = RankingConfig()
_WORKDIR = flags.DEFINE_string("workdir", _D.workdir, "Data and run folder.")
_DOCS = flags.DEFINE_integer("num_documents", _D.num_documents, "IMDB reviews to train on.")
_VOCAB = flags.DEFINE_integer("vocab_size", _D.vocab_size, "Learned WordPiece vocab size.")
_LEN = flags.DEFINE_integer("max_seq_length", _D.max_seq_length, "Pretraining example length.")
_BATCH = flags.DEFINE_integer("batch_size", _D.batch_size, "Pretraining batch size.")
_STEPS = flags.DEFINE_integer("steps", _D.steps, "Pretraining steps.")
_LR = flags.DEFINE_float("learning_rate", _D.learning_rate, "Peak learning rate.")
_WARMUP = flags.DEFINE_float("warmup_fraction", _D.warmup_fraction, "Warmup, a fraction of steps.")
_SENTENCES = flags.DEFINE_integer("num_sentences", _D.num_sentences, "Held-out sentences scored.")
_OVERRIDE = flags.DEFINE_multi_string(
    "override", [], "key=value changes to the demo model config (values parse as JSON), on top "
    f"of the defaults {dict(_D.model_overrides)}, e.g. num_layers=4.")
_SEED = flags.DEFINE_integer("seed", _D.seed, "Data, training and shuffle seed.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    overrides = dict(_D.model_overrides)
    for item in _OVERRIDE.value:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    result = run(RankingConfig(
        workdir=_WORKDIR.value, num_documents=_DOCS.value, vocab_size=_VOCAB.value,
        max_seq_length=_LEN.value, batch_size=_BATCH.value, steps=_STEPS.value,
        learning_rate=_LR.value, warmup_fraction=_WARMUP.value, num_sentences=_SENTENCES.value,
        model_overrides=tuple(overrides.items()), seed=_SEED.value))
    print(json.dumps({k: v for k, v in result.items() if k != "metrics"}, indent=2))


if __name__ == "__main__":
    app.run(main)
