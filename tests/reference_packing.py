"""The fine-tuning input layout written out in plain Python, one example at a time, as BERT's and
ELECTRA's data code builds it (`_truncate_seq_pair` and the [CLS]/[SEP] layout of
`classification_tasks.py`, first-piece tagging of `tagging_tasks.py`, the whitespace words and
word-by-word WordPiece of `qa_tasks.py`): the oracle that `data.preprocessor.TextPreprocessor`
(in-graph, batched, shared by training and serving) is held to.

Only the tokenizer's `tokenize` / `tokenize_with_offsets` of single words or texts are used from
the package; every layout decision is made here again.
"""

from __future__ import annotations

import tensorflow as tf

from electra_tf.data.inputs import pack_segments


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """BERT's `_truncate_seq_pair`: pop from the longer list (the second on ties) until they fit."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def pieces(tokenizer, text: str) -> list[int]:
    return tokenizer.tokenize(tf.constant([text])).to_list()[0]


def sentence(tokenizer, text: str, text_pair: str | None, max_seq_length: int):
    """(input_ids, input_mask, segment_ids) lists of one sentence (pair) example."""
    a = pieces(tokenizer, text)
    if text_pair is None:
        a, b = a[: max_seq_length - 2], None
    else:
        b = pieces(tokenizer, text_pair)
        truncate_seq_pair(a, b, max_seq_length - 3)
    return pack_segments(a, b, max_seq_length, tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)


def tagging(tokenizer, words, max_seq_length: int):
    """((input_ids, input_mask, segment_ids), first-piece position of each kept word)."""
    ids, positions = [], []
    for word in words:
        word_pieces = pieces(tokenizer, word) or [tokenizer.unk_id]
        if 1 + len(ids) + len(word_pieces) + 1 > max_seq_length:
            break
        positions.append(1 + len(ids))
        ids.extend(word_pieces)
    packed = pack_segments(ids, None, max_seq_length, tokenizer.cls_id, tokenizer.sep_id,
                           tokenizer.pad_id)
    return packed, positions


def context_words(context: str) -> tuple[list[str], list[int]]:
    """The SQuAD reader's whitespace words and each one's first character offset."""
    words, starts, previous_is_space = [], [], True
    for i, ch in enumerate(context):
        if ch in " \t\r\n" or ord(ch) == 0x202F:
            previous_is_space = True
            continue
        if previous_is_space:
            words.append(ch)
            starts.append(i)
        else:
            words[-1] += ch
        previous_is_space = False
    return words, starts


def context_pieces(tokenizer, context: str):
    """[(piece id, word index, char start, char end)] of a context, word by word."""
    words, word_starts = context_words(context)
    out = []
    for w, (word, first_char) in enumerate(zip(words, word_starts)):
        ids, starts, ends = (t.to_list()[0] for t in tokenizer.tokenize_with_offsets(tf.constant([word])))
        encoded = word.encode("utf-8")

        def to_char(byte):
            return first_char + len(encoded[:byte].decode("utf-8", "ignore"))

        if not ids:  # a word that normalises to nothing: one [UNK] over the whole word
            out.append((tokenizer.unk_id, w, first_char, first_char + len(word)))
        out += [(i, w, to_char(s), to_char(e)) for i, s, e in zip(ids, starts, ends)]
    return out
