"""The authors' example packing: tokenized lines -> [CLS] A [SEP] B [SEP] pretraining examples.

`ExampleBuilder` packs a stream of tokenized lines exactly like the original
`build_pretraining_dataset.py` (google-research/electra, its `ExampleBuilder`): see its docstring.
`ExampleSerializer` writes an example as the `tf.train.Example` the shards hold (`INPUT_KEYS`, int64
lists) and `parse_example` reads one back. `shards.py` runs the packer over a corpus.
"""

from __future__ import annotations

import random
from typing import Sequence

from electra_tf.data.inputs import INPUT_KEYS, pack_segments


class ExampleBuilder:
    """Packs tokenized lines into pretraining examples by the original tool's rules.

    * Lines accumulate until their token count reaches the target length or a document ends
      (`end_document`, the original's blank line). An empty line also goes in (as an empty
      sentence): it never changes the output, as in the original.
    * With probability 0.1 the example has a single segment (first-segment target 100000);
      otherwise the first segment targets (target - 3) // 2 tokens. A sentence joins the first
      segment if it is empty, if the sentence keeps it under the target, or - while the second
      segment is still empty and the first is under target - with probability 0.5.
    * Truncation: first segment to max_length - 2, then the second to
      max(0, max_length - len(first) - 3). So an over-long first segment leaves room only for
      [CLS] A [SEP], and one over-long line is cut, not carried over.
    * After each example the next target is uniform in [5, max_length] with probability 0.05,
      else max_length. (The target only decides when to cut; truncation always uses max_length.)
    * Layout [CLS] A [SEP] (B [SEP]), segment ids 0 then 1, padding with literal 0 in all three
      features (the original pads with 0, not with the [PAD] id).

    `rng.random()` / `rng.randint()` are called in the same order as the original calls Python's
    global `random`, so with `random.seed(k)` there and `random.Random(k)` here the same ids in
    give the same examples out.
    """

    def __init__(self, max_length: int, cls_id: int, sep_id: int, rng: random.Random):
        if max_length < 5:
            raise ValueError(f"max_seq_length must be >= 5, got {max_length}")
        self.max_length = max_length
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.rng = rng
        self._sentences: list[Sequence[int]] = []
        self._length = 0
        self._target_length = max_length

    def add_sentence(self, token_ids: Sequence[int]):
        """Adds one non-blank line's ids; returns a finished example (3 lists) or None."""
        self._sentences.append(token_ids)
        self._length += len(token_ids)
        if self._length >= self._target_length:
            return self._create_example()
        return None

    def end_document(self):
        """A blank line: flushes the pending example if it has any tokens."""
        if self._length != 0:
            return self._create_example()
        return None

    def _create_example(self):
        rng = self.rng
        if rng.random() < 0.1:
            first_target = 100000
        else:
            first_target = (self._target_length - 3) // 2  # room for [CLS] and two [SEP]
        first: list[int] = []
        second: list[int] = []
        for sentence in self._sentences:
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target and rng.random() < 0.5)
            ):
                first.extend(sentence)
            else:
                second.extend(sentence)
        first = first[: self.max_length - 2]
        second = second[: max(0, self.max_length - len(first) - 3)]

        self._sentences = []
        self._length = 0
        if rng.random() < 0.05:
            self._target_length = rng.randint(5, self.max_length)
        else:
            self._target_length = self.max_length
        return self.make_features(first, second)

    def make_features(self, first: Sequence[int], second: Sequence[int]):
        # No B segment when it is empty; padding is a literal 0 whatever the [PAD] id.
        return pack_segments(first, second or None, self.max_length, self.cls_id, self.sep_id,
                             pad_id=0)


class ExampleSerializer:
    """Serializes (input_ids, input_mask, segment_ids) as a tf.train.Example.

    One proto is reused (3x faster than building a new one per example). `deterministic=True`
    sorts the feature map by key: without it the order follows upb's per-process hash seed, and
    the same shard would differ byte-wise between runs.
    """

    def __init__(self):
        import tensorflow as tf

        self._example = tf.train.Example()
        self._lists = [self._example.features.feature[n].int64_list for n in INPUT_KEYS]

    def __call__(self, input_ids, input_mask, segment_ids) -> bytes:
        for int64_list, values in zip(self._lists, (input_ids, input_mask, segment_ids)):
            int64_list.value[:] = values
        return self._example.SerializeToString(deterministic=True)


def parse_example(record: bytes) -> dict:
    """One serialized record -> {feature name: list of ints} (tests and inspection)."""
    import tensorflow as tf

    example = tf.train.Example.FromString(record)
    return {n: list(example.features.feature[n].int64_list.value) for n in INPUT_KEYS}
