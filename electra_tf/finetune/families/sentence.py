"""Sentence (pair) classification and regression: GLUE, Rotten Tomatoes, custom CSV/TSV/JSONL.

The authors' `finetune/classification/classification_tasks.py` (`ClassificationTask`,
`RegressionTask`): `[CLS] A [SEP] (B [SEP])` with longest-first pair truncation
(`features.featurize_sentences`), the [CLS] state into a dense layer (`heads.SentenceClassifier`,
`heads.SentenceRegressor`). GLUE test sets are written in the submission format (`glue.py`).
"""

from __future__ import annotations

import numpy as np

from electra_tf.finetune import features as F
from electra_tf.finetune import glue, metrics, readers
from electra_tf.finetune.examples import SentenceExample, TaskDataError
from electra_tf.finetune.families.base import (
    Features, TaskFamily, label_names, register_family, softmax, string_specs)


# Rows per encoder pass when a served batch runs in order of length (`by_length`). Measured
# in one process, interleaved, on Rotten Tomatoes batches (2-core EPYC with avx2 fma avx512f
# avx512_vnni avx512_bf16, 2026-11-29): ELECTRA-Small batch 32 in 150-167 ms with 3-6 rows per
# pass against 268-284 ms as one batch padded to its longest row, batch 8 in 36 against 51;
# ELECTRA-Base batch 32 in 1,081 ms with 4 rows, 1,183 with 8, 2,026 as one batch (docs/benchmarks.md,
# "Serving latency").
BY_LENGTH_ROWS = 4


def by_length(head, inputs: dict, rows: int = BY_LENGTH_ROWS) -> dict:
    """The head's inference outputs on packed `inputs` (int [B, S]), computed `rows` rows at a
    time in order of length, each group cut to its own longest row; the outputs (batch first, no
    sequence axis, as the sentence heads give them) come back in the inputs' order.

    One batch padded to its longest row makes every row pay for that length: at batch 32 of
    Rotten Tomatoes sentences about half the positions the encoder ran were padding. The
    outputs are those of the whole batch, as padding to the longest row gives those of
    max_seq_length padding (`serving_signature`): the head reads the [CLS] state, which no
    position past a row's last unmasked one changes; what differs is the order of float sums
    (logits within 1e-6). A row's length is one past its last unmasked position, so a
    `serve_ids` client's mask with gaps keeps every position it leaves unmasked. A batch of at
    most `rows` rows is one pass, cut to its longest row (`serve_ids` ids padded to
    max_seq_length lose their padding columns there too). Plain TensorFlow ops (a while loop
    over the groups): stock TF Serving runs it."""
    import tensorflow as tf

    mask = tf.cast(inputs["input_mask"], tf.int32)
    batch = tf.shape(mask)[0]
    positions = tf.range(1, tf.shape(mask)[1] + 1)[None, :]
    lengths = tf.reduce_max(mask * positions, axis=1)  # one past the last unmasked position

    order = tf.argsort(lengths, stable=True)
    groups = (batch + rows - 1) // rows

    # No `tf.cond` for a batch of at most `rows` rows (one group; the loop below runs no
    # iteration): the head has two call sites, and a SavedModel loaded with
    # `tf.saved_model.load` copies a frozen head's weights into every function that reaches
    # them (docs/benchmarks.md, "The first call of each signature").
    def group(i):
        index = order[i * rows:tf.minimum((i + 1) * rows, batch)]
        width = tf.maximum(tf.reduce_max(tf.gather(lengths, index)), 1)
        return dict(head({k: tf.gather(v, index)[:, :width] for k, v in inputs.items()}, training=False))

    first = group(0)  # of 0 rows too: one empty group
    parts = {k: tf.TensorArray(v.dtype, size=tf.maximum(groups, 1), infer_shape=False,
                               element_shape=tf.TensorShape([None]).concatenate(v.shape[1:])).write(0, v)
             for k, v in first.items()}

    def step(i, parts):
        outputs = group(i)
        return i + 1, {k: part.write(i, outputs[k]) for k, part in parts.items()}

    _, parts = tf.while_loop(lambda i, _: i < groups, step, (tf.constant(1), parts))
    back = tf.math.invert_permutation(order)
    return {k: tf.gather(part.concat(), back) for k, part in parts.items()}


class SentenceFamily(TaskFamily):
    """What classification and regression share: one text or a pair, the [CLS] state, one
    prediction per example."""

    def read_file(self, task, path):
        """Sentence (pair) examples of a CSV/TSV/JSONL file, or of an original GLUE TSV by the
        task's layout (`glue.py`); `row_label` reads a row's label."""
        spec = task.glue
        if spec is not None and readers.extension(path) == ".tsv":
            # The original GLUE files, by the task's layout (glue.py), else the named columns.
            first = glue.first_row(path)
            layout = glue.detect_layout(spec, first)
            if layout is not None:
                return glue.read_glue_tsv(task, path, layout).examples
            columns = [c for c in (task.text_column, task.text_pair_column, task.label_column)
                       if c is not None]
            if not all(c in first for c in columns):
                raise TaskDataError(
                    f"{path}:1: neither the original GLUE {spec.folder} layout "
                    f"({spec.labeled.describe()} for train/dev, {spec.test.describe()} for test) "
                    f"nor the columns {columns}; the first row has {first[:12]}")
        examples = []
        pair_column = task.text_pair_column
        for eid, (loc, row) in enumerate(readers.rows(task, path)):
            text = readers.text_field(loc, row, task.text_column)
            pair = readers.text_field(loc, row, pair_column) if pair_column is not None else None
            examples.append(SentenceExample(eid, text, pair, self.row_label(task, loc, row)))
        return examples

    def row_label(self, task, loc: str, row):
        """The label of a CSV/TSV/JSONL row."""
        raise NotImplementedError

    def tfds_label(self, value):
        raise NotImplementedError

    def example_from_tfds(self, task, eid, record):
        text = readers.decode(record[task.text_column])
        pair = readers.decode(record[task.text_pair_column]) if task.text_pair_column is not None else None
        return SentenceExample(eid, text, pair, self.tfds_label(record["label"]))

    def featurize(self, task, examples, tokenizer, fc, training):
        return Features(list(examples), F.featurize_sentences(examples, tokenizer, fc.max_seq_length))

    def head_options(self, task, fc):
        return {"dropout": fc.dropout}

    def predictions(self, outputs: dict) -> np.ndarray:
        """Class ids [N] or scores [N] from the head's outputs."""
        raise NotImplementedError

    def write_submission(self, task, path, data, outputs):
        return glue.write_submission(path, task.glue, data.examples,
                                     self.predictions(outputs))

    # --- saved model and serving ------------------------------------------------------------

    def saved_fields(self, task, fc):
        return {"text_pair": task.text_pair_column is not None}

    def text_pair(self, description) -> bool:
        """As recorded (`export.export_head` fills it in for a model saved before it was)."""
        return bool(description.text_pair)

    def served_outputs(self, head, description):
        """The head's outputs -> the text signature's outputs."""
        raise NotImplementedError

    def serving_signature(self, head, description, pre):
        """`text` (and `text_pair` for a pair task) -> the family's outputs.

        A batch is padded to its longest row (at most max_seq_length), not to max_seq_length as
        training did. The encoder's cost grows with the sequence length (linearly in the dense
        layers, quadratically in attention), and a Rotten Tomatoes sentence is ~25 pieces:
        padded to 128 every request did ~5x the work it needs. The outputs do not change: the
        head reads the [CLS] state alone, a [PAD] key gets -10000 on its attention score, so its
        softmax weight is exactly 0 in float32 and no real token's state depends on how many
        pads follow; what differs is the order of float sums (logits within 1e-6 on
        ELECTRA-Small and -Base). A server that merges requests into one batch runs the merged
        rows the same way. The encoder takes any length up to max_position_embeddings
        (it slices the position embeddings to the input), and the signature runs as a plain
        tf.function, not XLA, so a new length is no retrace and no compilation. The outputs
        have no sequence axis, so the signature's shapes are those of max_seq_length padding.
        A batch of more than `BY_LENGTH_ROWS` rows then runs in groups of rows of similar
        length, each cut to its own longest row (`infer`, `by_length`): same outputs again.
        """
        answer = self.served_outputs(head, description)
        if self.text_pair(description):
            def serve_text(text, text_pair):
                return answer(self.infer(head, pre.pack_sentences(text, text_pair, pad_to_longest=True)))
            return serve_text, string_specs("text", "text_pair")

        def serve_text(text):
            return answer(self.infer(head, pre.pack_sentences(text, pad_to_longest=True)))
        return serve_text, string_specs("text")

    def infer(self, head, inputs):
        """The head on `inputs` in order of length (`by_length`): the outputs of one padded
        batch, for less work when the rows' lengths differ."""
        return by_length(head, inputs)

    def truncated(self, pre, inputs, outputs):
        """Whether the text, or the pair, had more pieces than fit max_seq_length and was cut,
        as the Electric `score` signature reports it. The pieces are counted by tokenizing the
        text a second time, with the packing's own ops: 8 sentences were packed in 0.4 ms with
        or without the count, and ELECTRA-Small answered them in 52 ms."""
        return pre.sentences_truncated(*(inputs[n] for n in ("text", "text_pair") if n in inputs))


@register_family
class SentenceClassification(SentenceFamily):
    """Single-sentence and pair classification (CoLA, SST-2, MRPC, QQP, MNLI, QNLI, RTE, WNLI,
    Rotten Tomatoes). Served: `text` (+ `text_pair`) -> `probabilities` float32
    [B, num_labels], `label` string [B]."""

    name = "classification"
    generic_scores = metrics.ACCURACY
    head = "SentenceClassifier"
    has_label_names = True

    def row_label(self, task, loc, row):
        return readers.class_label(task, loc, row)

    def tfds_label(self, value):
        label = int(value)
        return None if label < 0 else label  # GLUE test splits carry label -1

    def labels_in_file(self, task, path):
        return {readers.raw_label(loc, row, task.label_column) for loc, row in readers.rows(task, path)}

    def head_options(self, task, fc):
        return {"num_labels": task.num_labels, **super().head_options(task, fc)}

    def predictions(self, outputs):
        return outputs["logits"].argmax(-1)

    def evaluate(self, task, data, outputs, fc):
        names = task.label_names
        probabilities = softmax(outputs["logits"])
        predictions = probabilities.argmax(-1)
        labels = np.array([e.label for e in data.examples])
        results = task.metrics.compute(labels, predictions)
        records = [{"id": e.eid, "prediction": names[p], "label": names[e.label],
                    "probabilities": [round(float(x), 6) for x in row]}
                   for e, p, row in zip(data.examples, predictions, probabilities)]
        return results, records

    def served_outputs(self, head, description):
        import tensorflow as tf

        names = tf.constant(label_names(description, head))

        def answer(outputs):
            probabilities = tf.nn.softmax(outputs["logits"], axis=-1)
            return {"probabilities": probabilities,
                    "label": tf.gather(names, tf.argmax(probabilities, axis=-1))}
        return answer

    def example_signatures(self, head, description):
        """`classify`: TF Serving's Classify outputs (apis/classifier.h): `classes` string [B, C]
        (the label names, the same in every row) and `scores` float32 [B, C] (`probabilities`)."""
        import tensorflow as tf

        names = tf.constant(label_names(description, head))  # [C]

        def classify(outputs):
            scores = outputs["probabilities"]  # [B, C]
            return {"classes": tf.broadcast_to(names, tf.shape(scores)), "scores": scores}
        return {"classify": classify}


@register_family
class SentenceRegression(SentenceFamily):
    """A score per sentence (pair), e.g. STS-B's similarity. Served: `text` (+ `text_pair`) ->
    `score` float32 [B]."""

    name = "regression"
    generic_scores = metrics.CORRELATION
    head = "SentenceRegressor"

    def row_label(self, task, loc, row):
        return readers.regression_label(task, loc, row)

    def tfds_label(self, value):
        return float(value)

    def predictions(self, outputs):
        return outputs["predictions"]

    def evaluate(self, task, data, outputs, fc):
        predictions = outputs["predictions"]
        labels = np.array([e.label for e in data.examples], np.float64)
        results = task.metrics.compute(labels, predictions)
        records = [{"id": e.eid, "prediction": float(p), "label": float(e.label)}
                   for e, p in zip(data.examples, predictions)]
        return results, records

    def served_outputs(self, head, description):
        return lambda outputs: {"score": outputs["predictions"]}

    def example_signatures(self, head, description):
        """`regress`: TF Serving's Regress output (apis/regressor.h), `outputs` float32 [B]."""
        return {"regress": lambda outputs: {"outputs": outputs["score"]}}

