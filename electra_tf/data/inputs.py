"""What the encoder reads: three int arrays of one length, laid out `[CLS] A [SEP] (B [SEP])`.

`INPUT_KEYS` names them; the pretraining shards' tf.Example features carry the same names.
`pack_segments` lays out one example from its token ids, in plain Python, for the pretraining
shards (`packing.ExampleBuilder`, in worker processes). Fine-tuning features and the
exported SavedModel pack the same layout in-graph with one object
(`data.preprocessor.TextPreprocessor`); tests/serving/test_export.py holds it to this function.

Imports nothing heavy: the shard builder's worker processes use it.
"""

from __future__ import annotations

from typing import Sequence

INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")  # int32 [batch, seq] each


def pack_segments(first: Sequence[int], second: Sequence[int] | None, max_length: int,
                  cls_id: int, sep_id: int, pad_id: int = 0) -> tuple[list[int], list[int], list[int]]:
    """`[CLS] first [SEP] (second [SEP])`, padded to `max_length`.

    Returns (input_ids, input_mask, segment_ids) as lists of `max_length` ints: segment id 0 up to
    and including the first [SEP] and 1 after it, mask 1 on the packed tokens, and padding of
    `pad_id` in the ids and 0 in the mask and segments. `second=None` packs one segment (an empty
    list packs an empty second one, `[CLS] A [SEP] [SEP]`).

    Raises:
      ValueError: the packed tokens are longer than `max_length` (callers truncate first).

    Example:
      pack_segments([7, 8], [9], 6, cls_id=2, sep_id=3)
      # ([2, 7, 8, 3, 9, 3], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1])
    """
    input_ids = [cls_id, *first, sep_id]
    segment_ids = [0] * len(input_ids)
    if second is not None:
        input_ids += [*second, sep_id]
        segment_ids += [1] * (len(second) + 1)
    length = len(input_ids)
    if length > max_length:
        raise ValueError(f"{length} tokens do not fit max_seq_length={max_length}")
    padding = max_length - length
    return input_ids + [pad_id] * padding, [1] * length + [0] * padding, segment_ids + [0] * padding
