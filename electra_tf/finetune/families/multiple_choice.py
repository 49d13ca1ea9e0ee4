"""Multiple choice (SWAG, COPA, RACE-style): a context, several candidate continuations or
answers, one right.

Each choice becomes its own input `[CLS] context [SEP] choice [SEP]` (the sentence-pair layout
of `features.featurize_sentences`, longest-first truncation); `heads.MultipleChoiceClassifier`
scores each one from its [CLS] state and a softmax over the choices picks the answer, the
recipe of the BERT and ELECTRA papers for SWAG. Examples may have different numbers of choices:
a batch holds as many as its longest example, the missing ones all padding (the head gives
them -1000).

Files: JSONL, one example per line, by default
`{"context": "...", "choices": ["...", "..."], "label": 1}` (`label` the index of the right
choice; the keys are the task's `text_column`, `text_pair_column` and `label_column`).
Served: `context` string [B], `choices` string [B, C] ("" for no choice) -> `probabilities`
float32 [B, C], `choice` int32 [B], `answer` string [B] (the chosen choice's text).
"""

from __future__ import annotations

import re

import numpy as np

from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.finetune import features as F
from electra_tf.finetune import metrics, readers
from electra_tf.finetune.examples import ChoiceExample, SentenceExample, TaskDataError
from electra_tf.finetune.families.base import Features, TaskFamily, register_family, softmax


def _choices(loc: str, row, column) -> tuple[str, ...]:
    value = readers.field_value(loc, row, column)
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(c, str) and c.strip() for c in value):
        raise TaskDataError(f"{loc}: field {column!r}: expected a list of at least two non-empty strings")
    return tuple(value)


def _choice_label(loc: str, row, column, num_choices: int) -> int:
    raw = readers.raw_label(loc, row, column)
    if not re.fullmatch(r"\d+", raw) or int(raw) >= num_choices:
        raise TaskDataError(f"{loc}: field {column!r}: label {raw!r} is not the index of one of "
                            f"the {num_choices} choices")
    return int(raw)


@register_family
class MultipleChoice(TaskFamily):
    """A softmax over the choices of each example (see the module docstring)."""

    name = "multiple_choice"
    head = "MultipleChoiceClassifier"
    file_extensions = (".jsonl",)
    generic_columns = {"text_column": "context", "text_pair_column": "choices", "label_column": "label"}
    generic_scores = metrics.ACCURACY

    def read_file(self, task, path):
        examples = []
        for eid, (loc, row) in enumerate(readers.jsonl_rows(path)):
            context = readers.text_field(loc, row, task.text_column)
            choices = _choices(loc, row, task.text_pair_column)
            examples.append(ChoiceExample(eid, context, choices,
                                          _choice_label(loc, row, task.label_column, len(choices))))
        return examples

    def featurize(self, task, examples, tokenizer, fc, training):
        """input_ids / input_mask / segment_ids int32 [N, choices, max_seq_length], label int32
        [N] (-1 when unlabeled); choices an example lacks are all zeros."""
        pairs = [SentenceExample(0, e.context, choice) for e in examples for choice in e.choices]
        flat = F.featurize_sentences(pairs, tokenizer, fc.max_seq_length)  # [sum of choices, L]
        shape = (len(examples), max(len(e.choices) for e in examples), fc.max_seq_length)
        arrays = {key: np.zeros(shape, np.int32) for key in INPUT_KEYS}
        first = 0
        for i, example in enumerate(examples):
            for key in INPUT_KEYS:
                arrays[key][i, : len(example.choices)] = flat[key][first:first + len(example.choices)]
            first += len(example.choices)
        arrays["label"] = np.array([-1 if e.label is None else e.label for e in examples], np.int32)
        return Features(list(examples), arrays)

    def head_options(self, task, fc):
        return {"dropout": fc.dropout}

    def evaluate(self, task, data, outputs, fc):
        probabilities = softmax(outputs["logits"])  # padding choices get exp(-1000): 0
        predictions = probabilities.argmax(-1)
        labels = np.array([e.label for e in data.examples])
        results = task.metrics.compute(labels, predictions)
        records = [{"id": e.eid, "prediction": int(p), "label": e.label,
                    "probabilities": [round(float(x), 6) for x in row[: len(e.choices)]]}
                   for e, p, row in zip(data.examples, predictions, probabilities)]
        return results, records

    def ids_shape(self, description):
        return [None, None, None]  # [batch, choices, seq]

    def serving_signature(self, head, description, pre):
        import tensorflow as tf

        def serve_text(context, choices):
            batch, num_choices = tf.shape(choices)[0], tf.shape(choices)[1]
            # Unchecked, no column failed in the softmax ("Reduction axis -1 is empty").
            with tf.control_dependencies([tf.debugging.Assert(
                    num_choices > 0, ["choices needs at least one column (choice); got",
                                      tf.shape(choices)], name="check_choices")]):
                choices = tf.identity(choices)
            flat = tf.reshape(choices, [-1])  # [B * C]
            # Padded to the longest pair, as the sentence signatures (the head reads [CLS] only).
            packed = pre.pack_sentences(tf.repeat(context, num_choices), flat, pad_to_longest=True)
            present = tf.cast(tf.not_equal(flat, ""), tf.int32)[:, None]  # "" is no choice: zeros
            inputs = {k: tf.reshape(v * present, [batch, num_choices, -1]) for k, v in packed.items()}
            probabilities = tf.nn.softmax(head(inputs, training=False)["logits"], axis=-1)
            choice = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
            return {"probabilities": probabilities, "choice": choice,
                    "answer": tf.gather(choices, choice, batch_dims=1)}
        return serve_text, [tf.TensorSpec([None], tf.string, name="context"),
                            tf.TensorSpec([None, None], tf.string, name="choices")]
