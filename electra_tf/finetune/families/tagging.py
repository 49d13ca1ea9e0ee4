"""Word-level tagging (chunking, NER): a label per word, predicted on its first WordPiece.

The authors' `finetune/tagging/tagging_tasks.py`: labels on first pieces
(`features.featurize_tagging`), a dense layer over every token (`heads.TokenTagger`), chunk F1
when the tags are BIO / BIOES chunks and word accuracy otherwise.
"""

from __future__ import annotations

from electra_tf.finetune import features as F
from electra_tf.finetune import metrics, readers
from electra_tf.finetune.examples import TaggingExample
from electra_tf.finetune.families.base import (
    Features, TaskFamily, label_names, register_family, string_specs)
from electra_tf.finetune.metrics import tagging_accuracy


def is_chunk_tag_set(names) -> bool:
    """Whether every tag is "O" or "<B|I|E|S>-<type>" (scored by chunk F1)."""
    return all(t == "O" or (t[:2] in ("B-", "I-", "E-", "S-") and len(t) > 2) for t in names)


@register_family
class TokenTagging(TaskFamily):
    """JSONL `{"tokens": [...], "labels": [...]}` or CoNLL columns (word ... tag). Served:
    `text` -> `labels` string [B, W] (one per whitespace word, "" past a text's words),
    `num_words` int32 [B] (the words that fit)."""

    name = "tagging"
    finetuning_defaults = {"max_seq_length": 256}  # the authors' chunking setting
    head = "TokenTagger"
    file_extensions = (".jsonl", ".txt", ".conll")
    has_label_names = True
    generic_columns = {"text_column": "tokens", "label_column": "labels"}
    generic_scores = metrics.TAGGING

    def read_file(self, task, path):
        return [TaggingExample(i, tuple(words), readers.tag_ids(task, loc, tags))
                for i, (loc, words, tags) in enumerate(readers.tagged_sentences(task, path))]

    def labels_in_file(self, task, path):
        return {tag for _, _, tags in readers.tagged_sentences(task, path) for tag in tags}

    def unlabeled(self, examples):
        return sum(1 for e in examples if e.labels is None)

    def labels_used(self, examples):
        return {label for e in examples if e.labels is not None for label in e.labels}

    def featurize(self, task, examples, tokenizer, fc, training):
        arrays = F.featurize_tagging(examples, tokenizer, fc.max_seq_length)
        words = (arrays.pop("word_positions"), arrays.pop("num_words"))  # not model inputs
        return Features(list(examples), arrays, words)

    def head_options(self, task, fc):
        return {"num_labels": task.num_labels}

    def evaluate(self, task, data, outputs, fc):
        names = task.label_names
        positions, num_words = data.extra
        words = F.word_predictions(outputs["logits"], positions, num_words)
        predicted = [[names[i] for i in w] for w in words]
        # Words cut off by max_seq_length are scored against the gold words that fit.
        gold = [[names[i] for i in e.labels[: len(w)]] for e, w in zip(data.examples, words)]
        if is_chunk_tag_set(names):
            results = task.metrics.compute(gold, predicted)
        else:  # chunk F1 needs BIOES/BIO tags; any other label set is scored by accuracy
            accuracy = tagging_accuracy(gold, predicted)
            results = {"accuracy": accuracy, "main": accuracy}
        records = [{"id": e.eid, "words": list(e.words[: len(p)]), "prediction": p, "label": g}
                   for e, p, g in zip(data.examples, predicted, gold)]
        return results, records

    def serving_signature(self, head, description, pre):
        import tensorflow as tf

        names = tf.constant(label_names(description, head))

        def serve_text(text):
            inputs, positions, num_words = pre.pack_tagging(text)
            predicted = tf.argmax(head(inputs, training=False)["logits"], axis=-1)  # [B, S]
            labels = tf.gather(names, tf.gather(predicted, positions, batch_dims=1))  # [B, W]
            is_word = tf.range(tf.shape(positions)[1])[None, :] < num_words[:, None]
            return {"labels": tf.where(is_word, labels, ""), "num_words": num_words}
        return serve_text, string_specs("text")

    def truncated(self, pre, inputs, outputs):
        """Whether words past max_seq_length got no label."""
        return pre.words_truncated(inputs["text"], outputs["num_words"])
