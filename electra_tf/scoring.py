"""Scoring sentences with a trained Electric model: one forward pass per sentence.

Electric's discriminator head outputs an energy E(x)_t per position, with
p(x_t | x_\\t) proportional to exp(-E(x)_t) (Clark et al., EMNLP 2020; `models/electric.py`). A
token's score is -E(x)_t, its unnormalised conditional log-probability, and a sentence's score is
the sum of its tokens' scores: the paper's energy-based stand-in for the pseudo-log-likelihood
sum_t log p(x_t | x_\\t), which a masked LM needs one pass per token for and Electric gets from
one pass over the unmasked sentence. Higher is more plausible. The partition functions are left
out, so compare scores of sentences from the same model (re-ranking hypotheses, filtering),
not as probabilities.

What is scored: the sentence is packed as pretraining packs a segment, `[CLS] pieces [SEP]`, and
every WordPiece of the text is scored ([UNK] included); [CLS], [SEP] and padding are not (they
are never replaced in pretraining, so their energies carry no information about the text).
A sentence of n pieces therefore sums n terms, and an empty one scores 0.

Batches are sorted by length and padded to their longest row only; a padding key gets -10000 on
its attention score, so its weight is exactly 0 and a sentence's score does not depend on which
sentences share its batch (to float32 rounding of the matmuls, ~1e-6).

Exporting an Electric model for TF Serving (its `score` signature) is `electric_export.py`.

Example:
>>> results = score_texts("runs/electric", ["the film was great .", "great was . film the"])
>>> [r.score for r in results]          # the first is higher
>>> results[0].tokens, results[0].token_scores
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import tensorflow as tf
from absl import logging


class ScoringError(ValueError):
    """Bad input for scoring (no such checkpoint, a model without an energy head, a sentence
    longer than the model takes); the message names the file, text or field."""


class SentenceScore(NamedTuple):
    """One sentence's result.

    score: the sum of `token_scores` (the sentence's pseudo-log-likelihood estimate).
    tokens: the WordPiece tokens scored, in order ([CLS]/[SEP] not included).
    token_scores: -E(x)_t of each token, float32 [len(tokens)].
    """

    score: float
    tokens: list
    token_scores: np.ndarray


# --- the model side -------------------------------------------------------------------------------
def scored_positions(input_ids, input_mask, special_ids):
    """bool [batch, seq]: real tokens that are not one of `special_ids` ([CLS], [SEP], ...)."""
    scored = tf.cast(input_mask, tf.bool)
    for special in special_ids:
        scored &= tf.not_equal(input_ids, special)
    return scored


def token_scores(discriminator, input_ids, input_mask, segment_ids=None, special_ids=()):
    """-E(x)_t at every scored position, 0 elsewhere: float32 [batch, seq], one forward pass.

    `discriminator` is an Electric discriminator (with its head); `special_ids` are the ids not
    scored (the config's [CLS], [SEP], [MASK], [PAD]).
    """
    input_ids = tf.cast(input_ids, tf.int32)
    input_mask = tf.cast(input_mask, tf.int32)
    if segment_ids is None:
        segment_ids = tf.zeros_like(input_ids)
    energy = discriminator({"input_ids": input_ids, "input_mask": input_mask,
                            "segment_ids": tf.cast(segment_ids, tf.int32)},
                           training=False)["rtd_logits"]
    scored = scored_positions(input_ids, input_mask, special_ids)
    return tf.where(scored, -energy, tf.zeros_like(energy))


def special_ids(config) -> tuple[int, ...]:
    return (config.cls_token_id, config.sep_token_id, config.mask_token_id, config.pad_token_id)


# --- loading --------------------------------------------------------------------------------------
class Scorer:
    """A discriminator with its tokenizer, ready to score text.

    Args:
      discriminator: an Electric `Discriminator` with its head (or an `ElectraPretrainer`).
      vocab_file: the model's WordPiece vocabulary.
      lower_case: the vocabulary's normalisation (uncased by default, as pretraining).
      trained_length: the pretraining `max_seq_length`, if known: longer sentences are scored
        (up to max_position_embeddings) with a warning, as their last positions never trained.

    Build one from a checkpoint with `Scorer.from_checkpoint`.
    """

    def __init__(self, discriminator, vocab_file, lower_case: bool = True,
                 trained_length: int | None = None):
        from electra_tf.data.tokenizer import WordpieceTokenizer

        discriminator = getattr(discriminator, "discriminator", discriminator)
        if getattr(discriminator, "rtd_head", None) is None:
            raise ScoringError(
                f"{discriminator.name} has no discriminator head (a fine-tuned encoder?): scoring "
                "needs the pretrained Electric discriminator with its energy head")
        if discriminator.config.objective != "electric":
            logging.warning(
                "the model's config says objective=%r, not 'electric': its head is a replaced-token "
                "detector, not an energy, and its scores are not Electric's pseudo-log-likelihoods",
                discriminator.config.objective)
        self.discriminator = discriminator
        self.config = discriminator.config
        self.tokenizer = WordpieceTokenizer(vocab_file, lower_case=lower_case)
        if self.tokenizer.vocab_size != self.config.vocab_size:
            raise ScoringError(f"{vocab_file} has {self.tokenizer.vocab_size} tokens but the model's "
                               f"vocab_size is {self.config.vocab_size}")
        self.max_tokens = self.config.max_position_embeddings - 2  # [CLS] and [SEP]
        self.trained_length = trained_length
        self._special = special_ids(self.config)
        spec = tf.TensorSpec([None, None], tf.int32)
        self._forward = tf.function(
            lambda ids, mask: token_scores(self.discriminator, ids, mask, None, self._special),
            input_signature=[spec, spec])

    @classmethod
    def from_checkpoint(cls, path, *, vocab_file=None, lower_case: bool | None = None) -> "Scorer":
        """A scorer from a pretraining run's `--model_dir` (its exported `discriminator/`), a
        folder `save_electra_checkpoint` wrote, or a TF1 / Hugging Face checkpoint."""
        from electra_tf.convert.common import ConversionError
        from electra_tf.convert.pretrained import load_pretrained
        from electra_tf.data.casing import resolve_lower_case
        from electra_tf.run_folder import DISCRIMINATOR_FOLDER, RECORD_FILE

        folder = Path(path).expanduser()
        if not folder.exists() and not Path(str(folder) + ".index").exists():
            raise ScoringError(f"{path}: no such checkpoint")
        if (folder / RECORD_FILE).exists():  # a run's model_dir
            if not (folder / DISCRIMINATOR_FOLDER).is_dir():
                raise ScoringError(f"{folder} is a pretraining run without an exported "
                                   "discriminator/ yet (it is written when the run ends)")
            folder = folder / DISCRIMINATOR_FOLDER
        run_record = folder.parent / RECORD_FILE
        try:
            trained_length = json.loads(run_record.read_text())["pretraining_config"][
                "max_seq_length"]
        except (OSError, ValueError, KeyError, TypeError):
            trained_length = None
        try:
            loaded = load_pretrained(str(folder), network="discriminator")
        except ConversionError as e:
            raise ScoringError(str(e)) from None
        vocab_file = vocab_file or loaded.vocab_path
        if vocab_file is None:
            raise ScoringError(f"{folder} has no vocab.txt: pass the model's vocabulary "
                               "(--vocab_file)")
        from electra_tf.data.tokenizer import load_vocab

        lower = resolve_lower_case(lower_case, folder, load_vocab(str(vocab_file)),
                                   log=logging.info, warn=logging.warning)
        return cls(loaded.model, vocab_file, lower_case=lower, trained_length=trained_length)

    # --- scoring ---------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], label: str = "text") -> list[list[int]]:
        """WordPiece ids of each text; a text longer than the model takes is a ScoringError
        naming it as f"{label} {i}" (1-based)."""
        pieces = self.tokenizer.encode_batch(list(texts))
        for i, ids in enumerate(pieces):
            if len(ids) > self.max_tokens:
                raise ScoringError(
                    f"{label} {i + 1}: {len(ids)} WordPiece tokens, more than the model takes "
                    f"({self.max_tokens} = max_position_embeddings - 2): split it "
                    f"({texts[i][:40]!r}...)")
        if self.trained_length:
            longer = sum(len(ids) + 2 > self.trained_length for ids in pieces)
            if longer:
                logging.warning("%d text(s) are longer than the pretraining length %d: their last "
                                "positions were never trained and their scores are unreliable",
                                longer, self.trained_length)
        return pieces

    def score_ids(self, pieces: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Token scores [n_i] of each piece list, one forward pass over the batch padded to its
        longest row."""
        longest = max((len(p) for p in pieces), default=0) + 2
        ids = np.full((len(pieces), longest), self.config.pad_token_id, np.int32)
        mask = np.zeros_like(ids)
        for row, p in enumerate(pieces):
            ids[row, :len(p) + 2] = [self.config.cls_token_id, *p, self.config.sep_token_id]
            mask[row, :len(p) + 2] = 1
        scores = self._forward(tf.constant(ids), tf.constant(mask)).numpy()
        return [scores[row, 1:len(p) + 1] for row, p in enumerate(pieces)]

    def score(self, texts: Sequence[str], batch_size: int = 64,
              progress: Callable[[int, int], None] | None = None,
              label: str = "text") -> list[SentenceScore]:
        """Scores `texts` (any number) in batches of `batch_size` sentences of similar length.

        `progress(done, total)` is called after each batch; `label` names a text in errors.
        """
        if batch_size < 1:
            raise ScoringError(f"batch_size must be >= 1, got {batch_size}")
        texts = list(texts)
        pieces = self.encode(texts, label)
        order = sorted(range(len(texts)), key=lambda i: len(pieces[i]))  # less padding
        results: list[SentenceScore | None] = [None] * len(texts)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            for i, scores in zip(rows, self.score_ids([pieces[i] for i in rows])):
                results[i] = SentenceScore(float(np.sum(scores, dtype=np.float64)),
                                           self.tokenizer.convert_ids_to_tokens(pieces[i]), scores)
            if progress is not None:
                progress(min(start + batch_size, len(order)), len(order))
        return results


def score_texts(model_or_checkpoint, texts: Sequence[str], batch_size: int = 64, *,
                vocab_file=None, lower_case: bool | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[SentenceScore]:
    """Each text's Electric score (sum over its WordPieces of -E(x)_t) and per-token scores.

    Args:
      model_or_checkpoint: a `Scorer`, a Discriminator / ElectraPretrainer (then `vocab_file` is
        needed), or a checkpoint path (`Scorer.from_checkpoint`).
      texts: sentences (one hypothesis each); at most max_position_embeddings - 2 pieces.
      batch_size: sentences per forward pass.
      vocab_file, lower_case: the tokenizer, when the checkpoint does not say.
      progress: called as progress(done, total) after each batch.

    Returns a `SentenceScore` per text, in order.
    """
    scorer = model_or_checkpoint
    if not isinstance(scorer, Scorer):
        if isinstance(scorer, (str, Path)):
            scorer = Scorer.from_checkpoint(scorer, vocab_file=vocab_file, lower_case=lower_case)
        else:
            if vocab_file is None:
                raise ScoringError("scoring a model object needs its vocab_file")
            scorer = Scorer(scorer, vocab_file, lower_case=True if lower_case is None else lower_case)
    return scorer.score(texts, batch_size=batch_size, progress=progress)


def progress_logger(every_seconds: float = 10.0, log_fn=None):
    """A `progress(done, total)` callback logging "sentence done/total, rate, ETA" lines at most
    every `every_seconds` (and at the end), for `score_texts`."""
    from electra_tf.progress import ProgressLogger

    state = {}

    def progress(done, total):
        if "logger" not in state:
            state["logger"] = ProgressLogger(total, every_n=0, every_seconds=every_seconds,
                                             unit="sentence", log_fn=log_fn)
        state["logger"].update(done)

    return progress
