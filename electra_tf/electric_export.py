"""Exporting an Electric model for TF Serving: a SavedModel whose `score` signature (also
`serving_default`) takes raw text and answers Electric's sentence scores (`scoring.py`), tokenized
in-graph by the same `TextPreprocessor` as every export, written as `export.py` writes versions.

Example:
>>> export_scorer("runs/electric", "/tmp/export", "electric")   # -> /tmp/export/electric/1
"""

from __future__ import annotations

import tensorflow as tf

from electra_tf.data.preprocessor import TextPreprocessor
from electra_tf.export import check_version, format_report, write_version
from electra_tf.models.encoder import export_weights
from electra_tf.scoring import Scorer, ScoringError, scored_positions, special_ids, token_scores


def score_endpoint(discriminator, preprocessor):
    """(fn, input_signature) of a `score` signature: raw text in, Electric scores out.

    `preprocessor` is a `electra_tf.data.preprocessor.TextPreprocessor` (in-graph WordPiece; its
    max_seq_length bounds the pieces scored). Outputs: `score` float32 [B], `token_scores`
    float32 [B, S] (0 at [CLS], [SEP] and padding; S is the batch's longest packed row),
    `num_tokens` int32 [B] (pieces scored) and `truncated` bool [B] (the text had more pieces
    than max_seq_length - 2; its score covers the first ones only).

    Wire it into an export as `archive.add_endpoint("score", *score_endpoint(disc, pre))` after
    `archive.track(disc)` and `archive.track(pre)`.
    """
    special = special_ids(discriminator.config)
    limit = preprocessor.max_seq_length - 2

    def score(text):
        inputs = preprocessor.pack_sentences(text, pad_to_longest=True)
        per_token = token_scores(discriminator, inputs["input_ids"], inputs["input_mask"],
                                 inputs["segment_ids"], special)
        scored = scored_positions(inputs["input_ids"], inputs["input_mask"], special)
        lengths = preprocessor.tokenizer.tokenize(text).row_lengths()
        return {"score": tf.reduce_sum(per_token, axis=1), "token_scores": per_token,
                "num_tokens": tf.reduce_sum(tf.cast(scored, tf.int32), axis=1),
                "truncated": lengths > limit}

    return score, [tf.TensorSpec([None], tf.string, name="text")]


def export_scorer(checkpoint, export_base, model_name: str = "electric", *,
                  version: int | None = None, max_seq_length: int | None = None,
                  lower_case: bool | None = None, verbose: bool = True) -> str:
    """Exports the Electric model of `checkpoint` for TF Serving, as electra-export does a
    fine-tuned one: BASE/NAME/VERSION (the next free version by default; never overwritten),
    written beside and renamed into place, with the custom-op report in `assets.extra`.

    Its `score` signature (also `serving_default`) scores raw text (`score_endpoint`).
    `max_seq_length` bounds the pieces scored per text ([CLS] and [SEP] included); default the
    pretraining length the run recorded, else 128. Returns the version folder's path.
    """
    import keras

    check_version(export_base, model_name, version)
    scorer = Scorer.from_checkpoint(checkpoint, lower_case=lower_case)
    if scorer.config.objective != "electric":
        raise ScoringError(
            f"{checkpoint}: a model pretrained with objective={scorer.config.objective!r}: only "
            "Electric models (objective=electric) score text; fine-tune it (electra-finetune) to "
            "export a task model")
    limit = scorer.config.max_position_embeddings
    max_seq_length = max_seq_length or min(scorer.trained_length or 128, limit)
    if not 2 < max_seq_length <= limit:
        raise ScoringError(f"max_seq_length must be in (2, {limit}], got {max_seq_length}")
    pre = TextPreprocessor(scorer.tokenizer, max_seq_length)
    report = {"model_name": model_name, "family": "electric", "task": "score",
              "max_seq_length": max_seq_length, "lower_case": scorer.tokenizer.lower_case,
              "text_pair": False, "ids_only": False, "label_names": None}
    with export_weights(scorer.discriminator):  # traced and written inside
        archive = keras.export.ExportArchive()
        archive.track(scorer.discriminator)
        archive.track(pre)  # the tokenizer's model buffer and the vocab table (its asset)
        fn, spec = score_endpoint(scorer.discriminator, pre)
        # Keras writes the first endpoint as `serving_default` too: one traced function for
        # both signatures (a second endpoint of the same `fn` would be traced again).
        archive.add_endpoint("score", fn, input_signature=spec)
        target = write_version(archive, report, str(export_base), model_name, version)
    if verbose:
        print(format_report(target, report))
    return target
