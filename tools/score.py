r"""Scores sentences with a trained Electric model (electra-score): one forward pass each.

  electra-score --checkpoint=runs/electric --input=hypotheses.txt [--output=scores.tsv] \
      [--format=tsv|jsonl] [--batch_size=64] [--vocab_file=vocab.txt] [--[no]lower_case]

--input holds one sentence per line ("-" reads stdin). Each output line answers the input line
of the same number: `score<TAB>sentence` (tsv), or a JSON object with the text, its score, its
WordPiece tokens and their scores (jsonl). A sentence's score is the sum over its WordPieces of
-E(x)_t, the model's estimate of its pseudo-log-likelihood (higher: more plausible); an empty
line scores 0. --checkpoint is a pretraining --model_dir (its discriminator/), a folder written
by electra_tf, or a TF1 / Hugging Face checkpoint of an Electric discriminator. Progress (rate,
ETA) is logged every 10 s; bad input exits 1 with one line naming the file or line.
See electra_tf/scoring.py.
"""

import json
import sys

from absl import app, flags

from electra_tf import cli

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Electric checkpoint (see above).",
                                  required=True)
_INPUT = flags.DEFINE_string("input", None, "UTF-8 text, one sentence per line; - for stdin.",
                             required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the scores (default: stdout).")
_FORMAT = flags.DEFINE_enum("format", "tsv", ["tsv", "jsonl"], "Output format.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Sentences per forward pass.", lower_bound=1)
_VOCAB = flags.DEFINE_string("vocab_file", None, "The model's vocab.txt (default: the "
                             "checkpoint's).")
_LOWER = flags.DEFINE_bool("lower_case", None, "Lower-case the text (default: as the checkpoint "
                           "records, else uncased).")


def read_lines(path: str) -> list[str]:
    """The input's lines (without line ends); a missing or non-UTF-8 file is a ScoringError."""
    from electra_tf.scoring import ScoringError

    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()
    except OSError as e:
        raise ScoringError(f"{path}: cannot read: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ScoringError(f"{path}:{line}: not UTF-8 text ({e.reason})") from None
    return text.splitlines()


def format_line(text: str, result, fmt: str) -> str:
    if fmt == "jsonl":
        return json.dumps({"text": text, "score": round(result.score, 6), "tokens": result.tokens,
                           "token_scores": [round(float(s), 4) for s in result.token_scores]},
                          ensure_ascii=False)
    return f"{result.score:.6f}\t{text}"


def output_problem(output: str, input_path: str, checkpoint: str, vocab_file: str | None) -> str | None:
    """Why the scores cannot be written to `output`, known before the model loads (a large
    input takes long to score): an input of the command by any spelling (the sentences, the
    vocabulary, a file of the checkpoint), a folder, a missing or unwritable folder."""
    import glob
    import os

    from electra_tf.data.text_files import output_problem as problem

    inputs = [p for p in (input_path if input_path != "-" else None, vocab_file) if p]
    if os.path.isdir(checkpoint):
        inputs += [os.path.join(root, name) for root, _, names in os.walk(checkpoint) for name in names]
    else:
        inputs += glob.glob(glob.escape(checkpoint) + "*")
    return problem(output, inputs)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _OUTPUT.value is not None:
        problem = output_problem(_OUTPUT.value, _INPUT.value, _CHECKPOINT.value, _VOCAB.value)
        if problem:
            sys.exit(f"electra-score: error: --output={_OUTPUT.value}: {problem}")
    from electra_tf.data.tokenizer import VocabError
    from electra_tf.scoring import Scorer, ScoringError, progress_logger  # TensorFlow: after the flags

    try:
        lines = read_lines(_INPUT.value)
        scorer = Scorer.from_checkpoint(_CHECKPOINT.value, vocab_file=_VOCAB.value,
                                        lower_case=_LOWER.value)
        results = scorer.score(lines, batch_size=_BATCH.value, progress=progress_logger(10.0),
                               label=f"{_INPUT.value}: line")
        out = "".join(format_line(t, r, _FORMAT.value) + "\n" for t, r in zip(lines, results))
        if _OUTPUT.value:
            from electra_tf import files

            files.write_text(_OUTPUT.value, out)  # replaced, never written through a link
        else:
            sys.stdout.write(out)
    except (ScoringError, VocabError, OSError) as e:
        sys.exit(f"electra-score: error: {e}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
