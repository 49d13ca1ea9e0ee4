"""A served sentence batch run in order of length (`families.sentence.by_length`): the outputs of
the whole padded batch, each group of rows cut to its own longest row, in the inputs' order."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetune.families.sentence import by_length
from electra_tf.finetune.heads import SentenceClassifier, SentenceRegressor

WIDTH = 24


def _inputs(lengths, vocab_size, gap_row=None):
    """Packed int32 inputs [B, WIDTH]: row i has lengths[i] unmasked positions from the start
    (segment 1 in its second half); `gap_row` also gets a masked position inside its row."""
    rng = np.random.default_rng(7)
    ids = np.zeros((len(lengths), WIDTH), np.int32)
    mask, segments = np.zeros_like(ids), np.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(5, vocab_size, n)
        mask[i, :n] = 1
        segments[i, n // 2:n] = 1
    if gap_row is not None:
        mask[gap_row, 2] = 0  # a client's mask with a gap: the row still ends at its last 1
    return {"input_ids": tf.constant(ids), "input_mask": tf.constant(mask), "segment_ids": tf.constant(segments)}


class _Recording:
    """The head, noting the [rows, width] of every batch it is given (eagerly: the loop runs in
    Python and each call sees its real shape)."""

    def __init__(self, head):
        self.head, self.shapes = head, []

    def __call__(self, inputs, training=False):
        self.shapes.append(tuple(inputs["input_ids"].shape))
        return self.head(inputs, training=training)


@pytest.mark.parametrize("head_class, key", [(SentenceClassifier, "logits"), (SentenceRegressor, "predictions")])
def test_groups_in_length_order_answer_as_the_whole_batch(tiny_config, head_class, key):
    keras.utils.set_random_seed(5)
    head = head_class(tiny_config, **({"num_labels": 3} if head_class is SentenceClassifier else {}))
    lengths = [9, 3, 20, 5, 5, 14, 2, 24, 7, 11, 4]  # not in order; rows of equal length
    inputs = _inputs(lengths, tiny_config.vocab_size, gap_row=3)
    want = head(inputs, training=False)[key].numpy()  # one batch padded to WIDTH

    recording = _Recording(head)
    got = by_length(recording, inputs, rows=4)[key].numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # Three groups of the rows by length (stable), each cut to its own longest row.
    ordered = sorted(lengths)
    assert recording.shapes == [(4, max(ordered[0:4])), (4, max(ordered[4:8])), (3, max(ordered[8:]))]

    graph = tf.function(lambda x: by_length(head, x, rows=4))  # as a signature runs it
    np.testing.assert_allclose(graph(inputs)[key].numpy(), want, atol=1e-5, rtol=1e-5)
    # The signature keeps its static output shape past the batch (num_labels; none for a score).
    assert graph.get_concrete_function(inputs).structured_outputs[key].shape.as_list()[1:] == list(want.shape[1:])


def test_a_batch_of_at_most_the_group_size_is_one_pass_cut_to_its_longest_row(tiny_config):
    keras.utils.set_random_seed(5)
    head = SentenceClassifier(tiny_config, num_labels=2)
    inputs = _inputs([6, 13, 2], tiny_config.vocab_size)
    recording = _Recording(head)
    got = by_length(recording, inputs, rows=4)["logits"].numpy()
    assert recording.shapes == [(3, 13)]  # not WIDTH: the padding columns of every row are cut
    np.testing.assert_allclose(got, head(inputs, training=False)["logits"].numpy(), atol=1e-5, rtol=1e-5)
