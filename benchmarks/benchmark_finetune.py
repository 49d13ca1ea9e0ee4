"""Wall time of back-to-back fine-tuning runs (the demo's six, the replication tool's dozens),
split into where it goes, printed as a table.

  python -m benchmarks.benchmark_finetune [--init_checkpoint=DIR] [--vocab_file=vocab.txt]
      [--seeds=3] [--epochs=1] [--train_examples=7684]

Each seed fine-tunes the demo's encoder (`electra_tf.experiments.demo`: 4 layers, 128 wide, with the demo's
model overrides; or the discriminator at --init_checkpoint) on Rotten Tomatoes "train" and scores
"dev", as the demo does, one seed after another in this process. Columns, per seed:
"set-up" (encoder, tokenization, model and optimizer built), "train+eval" (the steps and the
per-epoch evaluations), "steps/s" over that span, and "end" (from the last evaluation until
`finetune` has returned: saving, summaries, and freeing the run's model and input pipeline).
Without --vocab_file a frequency vocab is made from IMDB reviews (benchmark only).
"""

import os
import tempfile
import time

from absl import flags

from electra_tf import cli

_INIT = flags.DEFINE_string("init_checkpoint", None, "Pretrained discriminator (default: random init).")
_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab (default: made from IMDB).")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Fine-tuning runs, one after another.")
_EPOCHS = flags.DEFINE_integer("epochs", 1, "Epochs per run.")
_TRAIN = flags.DEFINE_integer("train_examples", None, "Keep this many training sentences (default all).")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temp dir).")
_JIT = flags.DEFINE_bool("jit_compile", None, "Force the train step's path (XLA or graph); unset: "
                         "chosen as electra-finetune does (training/step_path.py).")


def _frequency_vocab(path: str) -> str:
    from electra_tf.data import corpus
    from electra_tf.data.tokenizer import frequency_vocab, write_vocab

    lines = [line for _, doc in zip(range(2000), corpus.imdb_documents()) for line in doc]
    write_vocab(frequency_vocab(lines), path)
    return path


def main(argv):
    del argv
    from electra_tf.experiments import demo
    from electra_tf.finetune.task_data import rotten_tomatoes_examples
    from electra_tf.finetune.seeds import finetune
    from electra_tf.finetune.trainer import resolve_strategy

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="electra_bench_ft_")
    vocab = _VOCAB.value or _frequency_vocab(os.path.join(work, "vocab.txt"))
    cfg = demo.DemoConfig()
    random_init = None if _INIT.value else demo.model_config(vocab, **dict(cfg.model_overrides))
    overrides = {"learning_rate": cfg.finetune_learning_rate, "keep_best": False,
                 "num_train_epochs": _EPOCHS.value, "max_seq_length": cfg.max_seq_length,
                 "jit_compile": _JIT.value}
    train, dev = rotten_tomatoes_examples("train"), rotten_tomatoes_examples("dev")
    strategy = resolve_strategy(None)
    rows = []
    for seed in range(_SEEDS.value):
        marks = {}

        def log(message, marks=marks):
            now = time.time()
            if "train examples" in message:
                marks["planned"] = now
            if message.startswith("eval epoch"):
                marks["last_eval"] = now
            if message.startswith("train step: "):
                marks["path"] = message

        start = time.time()
        result = finetune("rotten_tomatoes", random_init, overrides, model_dir=os.path.join(work, f"seed_{seed}"),
                          seed=seed, init_checkpoint=_INIT.value, vocab_file=vocab, strategy=strategy,
                          train_examples=train, eval_examples=dev, max_train_examples=_TRAIN.value, log=log)
        end = time.time()
        span = marks["last_eval"] - marks["planned"]
        rows.append((seed, marks["planned"] - start, span, result["train_steps"] / span,
                     end - marks["last_eval"], end - start, result["best"]["accuracy"]))

    print(f"\nRotten Tomatoes, {'random init' if random_init else _INIT.value}, {len(train) if not _TRAIN.value else _TRAIN.value}"
          f" sentences x {_EPOCHS.value} epoch(s), {os.cpu_count()} cores")
    from electra_tf.cpu import cpu_description

    print(f"CPU: {cpu_description()}; {marks.get('path', 'train step: ?')}")
    print(f"{'seed':>4} {'set-up s':>9} {'train+eval s':>13} {'steps/s':>8} {'end s':>7} {'wall s':>7} {'accuracy':>9}")
    for seed, setup, span, rate, tail, wall, accuracy in rows:
        print(f"{seed:>4} {setup:9.1f} {span:13.1f} {rate:8.1f} {tail:7.1f} {wall:7.1f} {accuracy:9.2f}")
    print(f"{'all':>4} {sum(r[1] for r in rows):9.1f} {sum(r[2] for r in rows):13.1f} {'':>8} "
          f"{sum(r[4] for r in rows):7.1f} {sum(r[5] for r in rows):7.1f}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
