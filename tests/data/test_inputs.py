"""electra_tf.data.inputs: the `[CLS] A [SEP] (B [SEP])` layout, written out by hand."""

import pytest

from electra_tf.data.inputs import INPUT_KEYS, pack_segments

CLS, SEP, PAD = 2, 3, 9


def test_a_pair_is_cls_a_sep_b_sep_then_padding():
    ids, mask, segments = pack_segments([10, 11], [12], 8, CLS, SEP, PAD)
    assert ids == [CLS, 10, 11, SEP, 12, SEP, PAD, PAD]
    assert mask == [1, 1, 1, 1, 1, 1, 0, 0]
    assert segments == [0, 0, 0, 0, 1, 1, 0, 0]


def test_one_segment_and_an_empty_second_one():
    assert pack_segments([10], None, 4, CLS, SEP) == ([CLS, 10, SEP, 0], [1, 1, 1, 0], [0, 0, 0, 0])
    assert pack_segments([10], [], 4, CLS, SEP) == ([CLS, 10, SEP, SEP], [1, 1, 1, 1], [0, 0, 0, 1])


def test_an_exact_fit_and_one_token_too_many():
    assert pack_segments([10, 11], None, 4, CLS, SEP)[1] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="5 tokens do not fit max_seq_length=4"):
        pack_segments([10, 11], [], 4, CLS, SEP)


def test_the_keys_are_the_encoders_inputs():
    assert INPUT_KEYS == ("input_ids", "input_mask", "segment_ids")
