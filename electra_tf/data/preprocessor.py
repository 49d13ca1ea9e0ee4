"""Text -> the encoder's three int32 arrays, in-graph: one preprocessor for training and serving.

`TextPreprocessor` tokenizes raw text with the project's `WordpieceTokenizer` (TF Text ops) and
lays it out as every fine-tuning head reads it (`data/inputs.py`): `[CLS] A [SEP] (B [SEP])`,
`segment_ids` 0 up to the first [SEP] and 1 after, `input_mask` 1 on real tokens, [PAD] ids
to `max_seq_length`. Fine-tuning features (`finetune/features.py`) call it on the examples'
text and the exported SavedModel's text signatures (`export.py`, the families'
`serving_signature`, Electric's `electric_export.score_endpoint`) call it on the request's text, so the
ids a model is trained on and the ids it is served are the same by construction; nothing else
in the package packs fine-tuning input.

Per family (each method takes a batch and is graph-safe):
- sentences (`pack_sentences`): one text or a pair; a pair is cut longest-first, from the end
  of the longer part (of the second on ties), as BERT/ELECTRA's `_truncate_seq_pair` does.
- tagging (`pack_words` / `pack_tagging`): a word's label sits on its first piece; words after
  the first one that does not fit are dropped; a word that normalises to nothing is [UNK].
- span QA (`query_pieces`, `context_pieces`, `pack`): the question cut to `max_query_length`
  pieces, the context's pieces with their word and character spans (whitespace words as the
  original SQuAD reader splits them); training slides windows over those pieces in Python
  (`features.featurize_qa`) and packs each with `pack`; a served request gets the first window
  (`pack_qa`).

Pretraining shards are packed in Python by `data/inputs.pack_segments` (worker processes, one
example at a time, the authors' format); the layout is the same and tests hold it equal.
"""

from __future__ import annotations

import os

import tensorflow as tf

from electra_tf.data.tokenizer import WordpieceTokenizer

# Python's str.split() whitespace: \s of RE2 is ASCII only, so list Python's set (str.isspace:
# bidi classes WS/B/S and category Zs) explicitly; \p{Z} adds U+2028/2029, which split too.
SPLIT_WHITESPACE = r"[\t\n\x{0b}\x{0c}\r\x{1c}-\x{1f}\x{85}\p{Z}]+"
# The original SQuAD reader's context words (`squad_utils.is_whitespace` in the authors'
# finetune/qa/): ASCII blanks and NARROW NO-BREAK SPACE.
CONTEXT_WHITESPACE = (" ", "\t", "\r", "\n", "\u202f")


def keep_first(ragged: tf.RaggedTensor, counts) -> tf.RaggedTensor:
    """The first `counts[i]` items of row i of a [B, (n)] ragged tensor."""
    lengths = ragged.row_lengths()
    counts = tf.minimum(tf.cast(counts, lengths.dtype), lengths)
    keep = tf.ragged.range(lengths).flat_values < tf.repeat(counts, lengths)
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(ragged.flat_values, keep), counts)


def truncated_pair_lengths(len_a, len_b, budget):
    """BERT's `_truncate_seq_pair` in closed form: pop from the longer (B on ties) until
    len_a + len_b <= budget. Returns the kept lengths."""
    keep_a = tf.minimum(len_a, tf.maximum(budget - len_b, (budget + 1) // 2))
    return keep_a, tf.minimum(len_b, budget - keep_a)


class TextPreprocessor(tf.Module):
    """Raw text -> int32 `input_ids` / `input_mask` / `segment_ids` [B, max_seq_length] in-graph.

    Args:
      tokenizer: the fine-tuning vocabulary's `WordpieceTokenizer` (its casing included); a
        tracked child, so exporting the preprocessor exports the tokenizer's op and vocabulary.
      max_seq_length: the fine-tuning sequence length.

    Example:
      pre = TextPreprocessor.from_vocab("vocab.txt", 128)
      pre.pack_sentences(tf.constant(["a premise"]), tf.constant(["a hypothesis"]))
    """

    def __init__(self, tokenizer: WordpieceTokenizer, max_seq_length: int):
        super().__init__(name="text_preprocessor")
        self.tokenizer = tokenizer
        self.max_seq_length = int(max_seq_length)
        # id -> token, initialised from the vocab file: makes vocab.txt a SavedModel asset.
        self.vocab_table = tf.lookup.StaticHashTable(
            tf.lookup.TextFileInitializer(
                os.fspath(tokenizer.vocab_file), tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER,
                tf.string, tf.lookup.TextFileIndex.WHOLE_LINE),
            default_value="[UNK]")

    @classmethod
    def from_vocab(cls, vocab_file, max_seq_length: int, lower_case: bool = True) -> "TextPreprocessor":
        return cls(WordpieceTokenizer(vocab_file, lower_case), max_seq_length)

    # ---- layout ---------------------------------------------------------------------------

    def pack(self, first: tf.RaggedTensor, second: tf.RaggedTensor | None,
             pad_to_longest: bool = False) -> dict:
        """[CLS] first [SEP] (second [SEP]), padded with [PAD] to max_seq_length, or with
        `pad_to_longest` to the batch's longest row (callers cut rows to max_seq_length first)."""
        batch = first.nrows()
        tok = self.tokenizer

        def column(value):  # [B, (1)]
            return tf.RaggedTensor.from_tensor(tf.fill([batch, 1], tf.constant(value, tf.int64)))

        ids = [column(tok.cls_id), tf.cast(first, tf.int64), column(tok.sep_id)]
        segments = [tf.zeros_like(part) for part in ids]
        if second is not None:
            ids += [tf.cast(second, tf.int64), column(tok.sep_id)]
            segments += [tf.ones_like(ids[-2]), tf.ones_like(ids[-1])]
        ids = tf.concat(ids, axis=1)
        shape = [None, None if pad_to_longest else self.max_seq_length]
        return {
            "input_ids": tf.cast(ids.to_tensor(default_value=tok.pad_id, shape=shape), tf.int32),
            "input_mask": tf.cast(tf.ones_like(ids).to_tensor(shape=shape), tf.int32),
            "segment_ids": tf.cast(tf.concat(segments, axis=1).to_tensor(shape=shape), tf.int32),
        }

    # ---- sentence tasks -------------------------------------------------------------------

    def pack_sentences(self, text, text_pair=None, pad_to_longest: bool = False) -> dict:
        """tf.string [B] (and [B]) -> model inputs [B, max_seq_length], or with
        `pad_to_longest` [B, S] where S is the longest packed row (at most max_seq_length):
        the same arrays without the columns that are padding in every row."""
        a = self.tokenizer.tokenize(text)
        if text_pair is None:
            return self.pack(keep_first(a, self.max_seq_length - 2), None, pad_to_longest)
        b = self.tokenizer.tokenize(text_pair)
        keep_a, keep_b = truncated_pair_lengths(a.row_lengths(), b.row_lengths(),
                                                tf.constant(self.max_seq_length - 3, tf.int64))
        return self.pack(keep_first(a, keep_a), keep_first(b, keep_b), pad_to_longest)

    def sentences_truncated(self, text, text_pair=None) -> tf.Tensor:
        """bool [B]: `pack_sentences` cuts the text (with `text_pair`: the pair) to fit."""
        pieces = self.tokenizer.tokenize(text).row_lengths()
        if text_pair is None:
            return pieces > self.max_seq_length - 2
        return pieces + self.tokenizer.tokenize(text_pair).row_lengths() > self.max_seq_length - 3

    # ---- tagging --------------------------------------------------------------------------

    def _word_pieces(self, words: tf.Tensor, with_offsets: bool = False):
        """Pieces per word [W, (P)], [UNK] for a word that normalises to nothing; with_offsets:
        also [start, end) bytes in the word, the whole word for such an [UNK]."""
        if with_offsets:
            ids, starts, ends = self.tokenizer.tokenize_with_offsets(words)
        else:
            ids = self.tokenizer.tokenize(words)
        lengths = ids.row_lengths()
        counts = tf.where(tf.equal(lengths, 0), tf.ones_like(lengths), lengths)

        def then(ragged, value):  # row + [value], then cut to `counts`
            column = tf.RaggedTensor.from_tensor(tf.expand_dims(tf.cast(value, tf.int64), 1))
            return keep_first(tf.concat([ragged, column], axis=1), counts)

        ids = then(ids, tf.fill([tf.size(words)], self.tokenizer.unk_id))
        if not with_offsets:
            return ids
        return ids, then(starts, tf.zeros([tf.size(words)], tf.int64)), then(ends, tf.strings.length(words))

    def pack_words(self, words: tf.RaggedTensor) -> tuple[dict, tf.Tensor, tf.Tensor]:
        """tf.string [B, (W)] words -> (inputs, word_positions int32 [B, W'] of each kept word's
        first piece, num_words int32 [B]); W' is the batch's largest num_words. The words that
        fit are a prefix: the first word whose pieces would pass [SEP] and all after it are cut."""
        pieces = self._word_pieces(words.flat_values)  # [W_total, (P)]
        lengths = words.with_flat_values(pieces.row_lengths()).to_tensor()  # [B, W]
        is_word = words.with_flat_values(tf.ones_like(words.flat_values, tf.bool)).to_tensor(False)
        ends = tf.math.cumsum(lengths, axis=1)
        fits = is_word & (ends <= self.max_seq_length - 2)  # a prefix: ends only grow
        num_words = tf.reduce_sum(tf.cast(fits, tf.int32), axis=1)
        kept_word = tf.ragged.boolean_mask(is_word & fits, is_word).flat_values  # per word of words
        kept = tf.RaggedTensor.from_row_lengths(tf.ragged.boolean_mask(pieces, kept_word),
                                                tf.cast(num_words, tf.int64))
        inputs = self.pack(kept.merge_dims(1, 2), None)
        positions = tf.where(fits, ends - lengths + 1, 0)[:, : tf.reduce_max(tf.concat([num_words, [0]], 0))]
        return inputs, tf.cast(positions, tf.int32), num_words

    def split_words(self, text) -> tf.RaggedTensor:
        """tf.string [B] -> its whitespace words [B, (W)], as Python's `str.split()` splits."""
        return tf.strings.split(tf.strings.regex_replace(text, SPLIT_WHITESPACE, " "))

    def pack_tagging(self, text) -> tuple[dict, tf.Tensor, tf.Tensor]:
        """`pack_words` on the whitespace words of `text` [B]."""
        return self.pack_words(self.split_words(text))

    def words_truncated(self, text, num_words) -> tf.Tensor:
        """bool [B]: `text` has more whitespace words than the `num_words` `pack_tagging` kept."""
        return self.split_words(text).row_lengths() > tf.cast(num_words, tf.int64)

    # ---- span QA --------------------------------------------------------------------------

    def query_pieces(self, question, max_query_length: int) -> tf.RaggedTensor:
        """tf.string [B] -> the question's first `max_query_length` pieces [B, (Q)]."""
        return keep_first(self.tokenizer.tokenize(question), max_query_length)

    def context_pieces(self, context) -> dict:
        """tf.string [B] contexts -> their pieces and where each comes from, all [B, (P)] int64:
        "ids", "word" (index of its whitespace word in the context), "byte_start" / "byte_end"
        and "char_start" / "char_end" ([start, end) in the context's UTF-8 bytes and characters).
        An [UNK] for a word that normalises to nothing spans the whole word."""
        chars, char_bytes = tf.strings.unicode_split_with_offsets(context, "UTF-8")  # [B, (C)]
        flat = chars.flat_values
        is_space = tf.reduce_any(tf.equal(flat[:, None], tf.constant(CONTEXT_WHITESPACE)), axis=1)
        row = chars.value_rowids()
        index_in_row = tf.range(tf.size(flat, out_type=tf.int64)) - tf.gather(chars.row_starts(), row)
        previous_is_space = tf.concat([[True], is_space], 0)[:-1] | tf.equal(index_in_row, 0)
        starts_word = ~is_space & previous_is_space
        word_of_char = tf.math.cumsum(tf.cast(starts_word, tf.int64)) - 1
        num_words = tf.reduce_sum(tf.cast(starts_word, tf.int64))
        words = tf.strings.unsorted_segment_join(
            tf.boolean_mask(flat, ~is_space), tf.boolean_mask(word_of_char, ~is_space), num_words)
        word_row = tf.boolean_mask(row, starts_word)
        word_byte = tf.boolean_mask(char_bytes.flat_values, starts_word)
        ids, starts, ends = self._word_pieces(words, with_offsets=True)  # [W, (P)], bytes in the word
        pieces_per_word = ids.row_lengths()
        word_byte = tf.repeat(word_byte, pieces_per_word)
        words_per_row = tf.math.bincount(word_row, minlength=chars.nrows(), maxlength=chars.nrows(),
                                         dtype=tf.int64)
        first_word_of_row = tf.math.cumsum(words_per_row, exclusive=True)
        word_in_row = tf.range(num_words) - tf.gather(first_word_of_row, word_row)

        def by_row(per_word):  # [W, (P)] -> [B, (P)]
            return tf.RaggedTensor.from_row_lengths(per_word, words_per_row).merge_dims(1, 2)

        out = {"ids": by_row(ids),
               "word": by_row(ids.with_flat_values(tf.repeat(word_in_row, pieces_per_word))),
               "byte_start": by_row(starts.with_flat_values(starts.flat_values + word_byte)),
               "byte_end": by_row(ends.with_flat_values(ends.flat_values + word_byte))}
        # Byte offset -> number of characters before it.
        char_starts = char_bytes.to_tensor(default_value=tf.int64.max)  # [B, C]

        def to_chars(offsets):
            dense = tf.searchsorted(char_starts, offsets.to_tensor(), side="left", out_type=tf.int64)
            return tf.RaggedTensor.from_tensor(dense, lengths=offsets.row_lengths())

        out["char_start"], out["char_end"] = to_chars(out["byte_start"]), to_chars(out["byte_end"])
        return out

    def pack_qa(self, question, context, max_query_length: int):
        """The first window of `features.featurize_qa`: `[CLS] question [SEP] context [SEP]`, the
        question cut to `max_query_length` pieces and the context to what is left of
        max_seq_length. A longer context is cut (training slides windows with a doc stride).

        Returns (inputs, spans) with spans["byte_start" | "byte_end" | "char_start" |
        "char_end"] int64 [B, max_seq_length] per kept context piece (-1 past them) and
        spans["doc_offset"] [B], the position of the first context piece.
        """
        query = self.query_pieces(question, max_query_length)
        pieces = self.context_pieces(context)
        budget = self.max_seq_length - 3 - query.row_lengths()
        names = ("byte_start", "byte_end", "char_start", "char_end")
        # Fixed width: gathers at a piece index stay valid when the batch has no context at all.
        spans = {name: keep_first(pieces[name], budget).to_tensor(
            default_value=-1, shape=[None, self.max_seq_length]) for name in names}
        spans["doc_offset"] = query.row_lengths() + 2
        return self.pack(query, keep_first(pieces["ids"], budget)), spans
