"""BERT WordPiece tokenization on tensorflow-text, usable in Python, tf.data and exported graphs.

The normalisation is BERT uncased's (`model/tokenization.py` of the original code), done with TF
string ops so it runs in graphs: delete U+FFFD and every category-C character (control, format,
private use; tab/newline/CR are whitespace instead); with `lower_case`, lower-case, NFD and drop
combining marks (Mn). Then tf-text's `FastWordpieceTokenizer` (TF Text 2.7) splits on whitespace,
punctuation and around CJK ideographs and applies greedy longest-match-first WordPiece with `##`
pieces and `[UNK]` for words it cannot cover or that are over 100 bytes. No per-token Python.
The same op runs in pretraining data, fine-tuning features and exported SavedModels (which then
load on TF Serving 2.11 and later, `export.custom_op_report`).

tf-text's own BERT normaliser is not used: it applies NFKC case folding, so "…" becomes "...",
"²" becomes "2" and "´" disappears, and it turns control characters into spaces where the
original deletes them; ids would then differ from the released checkpoints' tokenizer. Without
case folding (`FastBertTokenizer(lower_case_nfd_strip_accents=False)`) it only maps \p{Cc}|\p{Cf}
to spaces (tensorflow/text core/kernels/fast_bert_normalizer_model_builder.cc), and `normalize`
has already deleted every category-C character but tab/newline/CR, which the pre-tokenizer
splits on anyway: it would change no id or offset (53,539 IMDB reviews and noised copies with
the BERT uncased vocabulary, cased and uncased: docs/restructuring.md), cost a little time, and add the
`FastBertNormalize` op (TF Text 2.9) that TF Serving 2.11 lacks, so it is left out. Remaining
known differences from Python's `str.lower()`: Greek final sigma is not context-sensitive.

`tokenize_with_offsets` normalises per character (slower, for fine-tuning features) so it can map
offsets back to the original bytes; it gives the same ids as `tokenize`.

The special ids (`cls_id`, `sep_id`, ...) are read from the vocab file, never assumed to sit at
BERT's 0/100/101/102/103.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import unicodedata
from typing import Iterable, Sequence

import tensorflow as tf
import tensorflow_text as tf_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# BERT's basic tokenizer leaves words longer than this as one [UNK].
MAX_BYTES_PER_WORD = 100
# BERT's WordPiece, for every TF Text WordPiece op here (this tokenizer's and the exported one's):
# "##" continuations, [UNK] for a word it cannot cover, split on whitespace and punctuation first.
WORDPIECE_OPTIONS = dict(suffix_indicator="##", max_bytes_per_word=MAX_BYTES_PER_WORD,
                         token_out_type=tf.int64, unknown_token="[UNK]", no_pretokenization=False,
                         support_detokenization=False)
# Characters the original `_clean_text` deletes: U+FFFD and every category C* character
# (control, format, private use, unassigned) except tab, newline and carriage return.
_DELETED_CHARS = r"[^\P{C}\t\n\r]|\x{FFFD}"


# BERT's placeholders for tokens added at fine-tuning time (`special_token_layout`).
_UNUSED_TOKEN = re.compile(r"\[unused\d+\]")


class VocabError(ValueError):
    """The vocab file is missing, empty, or not a one-token-per-line WordPiece vocab."""


def load_vocab(vocab_file: str) -> list[str]:
    """Reads and validates a WordPiece vocab: one token per line, UTF-8, no blanks or duplicates,
    the five special tokens and at least one other token that is not an [unusedN] placeholder.

    Raises:
      VocabError: naming the file (and the line, where there is one) when the file is not a vocab.
    """
    try:
        with tf.io.gfile.GFile(vocab_file, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError as e:
        raise VocabError(f"{vocab_file}: vocab file not found") from e
    if not data.strip():
        raise VocabError(f"{vocab_file}: vocab file is empty")
    if b"\x00" in data:
        line_no = data[: data.index(b"\x00")].count(b"\n") + 1
        raise VocabError(f"{vocab_file}:{line_no}: NUL byte: binary file, not a WordPiece vocab")
    if data.startswith(b"\xef\xbb\xbf"):  # else it is part of token 0, and [PAD] is "missing"
        raise VocabError(f"{vocab_file}:1: starts with a byte-order mark (U+FEFF); save the vocab "
                         "as UTF-8 without one (other WordPiece readers keep it in the first token)")
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the usual trailing newline
        lines.pop()
    vocab: list[str] = []
    seen: dict[str, int] = {}
    for line_no, raw in enumerate(lines, start=1):
        raw = raw.rstrip(b"\r")
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(
                f"{vocab_file}:{line_no}: not UTF-8 ({e.reason} at byte {e.start}); "
                "not a WordPiece vocab"
            ) from None
        if not token:
            raise VocabError(f"{vocab_file}:{line_no}: empty line; a vocab has one token per line")
        if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in token):
            raise VocabError(
                f"{vocab_file}:{line_no}: token {token[:40]!r} contains whitespace or control "
                "characters; a vocab has one token per line"
            )
        if token in seen:
            raise VocabError(
                f"{vocab_file}:{line_no}: duplicate token {token!r} (first on line {seen[token]})"
            )
        seen[token] = line_no
        vocab.append(token)
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise VocabError(f"{vocab_file}: missing special token(s) {', '.join(missing)}")
    # Only reserved tokens: every word would be [UNK], so pretraining would learn nothing and
    # fine-tuning would see one id for all text. Refused here, where every command loads it.
    if all(token in SPECIAL_TOKENS or _UNUSED_TOKEN.fullmatch(token) for token in vocab):
        raise VocabError(f"{vocab_file}: has no word pieces besides the {len(vocab)} special and "
                         "[unusedN] tokens; not a WordPiece vocab (learn one with electra-build-vocab)")
    return vocab


class WordpieceTokenizer(tf.Module):
    """BERT WordPiece tokenizer whose TF resources are tracked, so it can be exported.

    Args:
      vocab_file: one token per line; must contain [PAD], [UNK], [CLS], [SEP] and [MASK].
      lower_case: BERT uncased normalisation (lower-case + NFD + strip accents). False keeps
        case and accents (cased vocabularies).

    Example:
      tok = WordpieceTokenizer("vocab.txt")
      ids = tok.tokenize(tf.constant(["Hello world!"]))  # RaggedTensor [1, (tokens)] int64
      tok.decode(tok.encode("Héllo world!"))             # "hello world!"
    """

    def __init__(self, vocab_file: str | os.PathLike, lower_case: bool = True):
        super().__init__(name="wordpiece_tokenizer")
        self.vocab_file = os.fspath(vocab_file)
        self.lower_case = lower_case
        self.vocab: list[str] = load_vocab(self.vocab_file)
        self.vocab_size = len(self.vocab)
        self._token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id = self._token_to_id["[PAD]"]
        self.unk_id = self._token_to_id["[UNK]"]
        self.cls_id = self._token_to_id["[CLS]"]
        self.sep_id = self._token_to_id["[SEP]"]
        self.mask_id = self._token_to_id["[MASK]"]
        self.special_ids = frozenset(self._token_to_id[t] for t in SPECIAL_TOKENS)
        # Pre-tokenizer + WordPiece in one op (the module docstring says why not FastBertTokenizer);
        # a tf.Module, tracked as a child.
        self.tf_tokenizer = tf_text.FastWordpieceTokenizer(vocab=self.vocab, **WORDPIECE_OPTIONS)

    # ---- graph-friendly API -------------------------------------------------------------------

    def normalize(self, texts):
        """BERT's text cleanup (+ lower-case, NFD, strip accents): elementwise on tf.string."""
        texts = tf.strings.regex_replace(texts, _DELETED_CHARS, "")
        if self.lower_case:
            texts = tf.strings.lower(texts, encoding="utf-8")
            texts = tf_text.normalize_utf8(texts, "NFD")
            texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
        return texts

    def tokenize(self, texts) -> tf.RaggedTensor:
        """tf.string [batch] -> int64 RaggedTensor [batch, (tokens)] of WordPiece ids."""
        return self.tf_tokenizer.tokenize(self.normalize(texts))

    def tokenize_with_offsets(self, texts):
        """Returns (ids, starts, ends), each a RaggedTensor [batch, (tokens)] of int64.

        `starts`/`ends` are byte offsets into the original (un-normalised) UTF-8 strings:
        `texts[b][starts[b, i]:ends[b, i]]` is the source text of token i.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        chars, char_starts = tf.strings.unicode_split_with_offsets(texts, "UTF-8")
        char_starts = tf.cast(char_starts, tf.int64)  # [batch, (chars)]
        char_ends = char_starts + tf.cast(tf.strings.length(chars), tf.int64)
        normalized = tf.ragged.map_flat_values(self.normalize, chars)
        cleaned = tf.strings.reduce_join(normalized, axis=-1)  # [batch]
        ids, starts, ends = self.tf_tokenizer.tokenize_with_offsets(cleaned)
        # Byte offset in `cleaned` -> index of the source character that produced that byte.
        norm_ends = tf.math.cumsum(tf.cast(tf.strings.length(normalized), tf.int64), axis=-1)
        big = tf.constant(2**62, tf.int64)
        norm_ends = norm_ends.to_tensor(default_value=big)  # [batch, max_chars]

        def to_source(byte_offsets, source):  # [batch, (tokens)] -> [batch, (tokens)]
            padded = byte_offsets.to_tensor()
            idx = tf.searchsorted(norm_ends, padded, side="right", out_type=tf.int64)
            idx = tf.minimum(idx, tf.maximum(tf.shape(norm_ends, out_type=tf.int64)[1] - 1, 0))
            got = tf.gather(source.to_tensor(), idx, batch_dims=1)
            return tf.RaggedTensor.from_tensor(got, lengths=byte_offsets.row_lengths())

        src_starts = to_source(starts, char_starts)
        src_ends = to_source(ends - 1, char_ends)
        return ids, src_starts, src_ends

    # ---- Python conveniences ------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """One string -> its WordPiece ids (no [CLS]/[SEP] added)."""
        return self.tokenize(tf.constant([text])).flat_values.numpy().tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Many strings in one op call -> list of id lists (the fast path for data building)."""
        if not texts:
            return []
        return self.tokenize(tf.constant(list(texts), dtype=tf.string)).to_list()

    def tokenize_words(self, words: Sequence[str]) -> list[list[int]]:
        """Per-word WordPiece ids (for tagging): word i -> the pieces of `words[i]`.

        A word the basic tokenizer would split further (e.g. "don't") gets all its pieces; a
        word that normalises to nothing (e.g. a lone accent) gets [].
        """
        return self.encode_batch(list(words))

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} out of range for vocab {self.vocab_file} "
                                 f"(size {self.vocab_size})")
            out.append(self.vocab[i])
        return out

    def decode(self, ids, skip_special_tokens: bool = False, skip_padding: bool = True) -> str:
        """Ids -> text: `##` pieces are glued to the previous piece, words joined by spaces.

        Args:
          ids: iterable of ints (list, numpy array or eager tensor).
          skip_special_tokens: drop [CLS], [SEP], [MASK], [UNK] and [PAD].
          skip_padding: drop [PAD] (on by default: padded examples decode to their text).
        """
        if hasattr(ids, "numpy"):
            ids = ids.numpy()
        words: list[str] = []
        for token in self.convert_ids_to_tokens(ids):
            if skip_padding and token == "[PAD]":
                continue
            if skip_special_tokens and token in SPECIAL_TOKENS:
                continue
            if token.startswith("##") and words:
                words[-1] += token[2:]
            else:
                words.append(token)
        return " ".join(words)

    def vocab_hash(self) -> str:
        """sha256 hex digest of the vocab file's bytes (recorded in data manifests)."""
        return file_sha256(self.vocab_file)


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def special_token_ids(vocab: Sequence[str]) -> dict[str, int]:
    """Where a vocabulary puts the special tokens, by config field name: {"pad_token_id": ...,
    "unk_token_id", "cls_token_id", "sep_token_id", "mask_token_id"} (`ElectraConfig` has all
    but the [UNK] one; the shard manifest records all five).

    Raises:
      VocabError: a special token is missing (`load_vocab` has already checked it for a file).
    """
    index = {token: i for i, token in enumerate(vocab)}
    missing = [t for t in SPECIAL_TOKENS if t not in index]
    if missing:
        raise VocabError(f"vocabulary is missing special token(s) {', '.join(missing)}")
    return {token.strip("[]").lower() + "_token_id": index[token] for token in SPECIAL_TOKENS}


def special_token_layout(num_unused: int = 0) -> list[str]:
    """The reserved head of every vocab this project learns.

    Compact layout: [PAD]=0 (the packer pads with literal 0, as the original does), [UNK]=1,
    [CLS]=2, [SEP]=3, [MASK]=4, then `num_unused` placeholders [unused0].. for tokens added at
    fine-tuning time. (BERT's own file puts 99 [unused] before [UNK]=100, [CLS]=101, ...; nothing
    here depends on either layout because ids are always read from the file.)
    """
    return list(SPECIAL_TOKENS) + [f"[unused{i}]" for i in range(num_unused)]


def frequency_vocab(texts: Iterable[str], num_words: int = 8000, max_size: int | None = None) -> list[str]:
    """A quick vocabulary for benchmarks and tests, counted in one pass (no WordPiece learning):
    `special_token_layout()`, every character and its "##" form, then the `num_words` most
    frequent words of two or more characters, cut to `max_size` tokens.

    Words are found as the uncased tokenizer finds them (lower-cased, accents dropped, split on
    whitespace and around punctuation), so the texts tokenize without [UNK] unless `max_size`
    cuts characters. Use `learn_vocab` for a vocabulary to pretrain with.
    """
    words, chars = collections.Counter(), set()
    for text in texts:
        text = "".join(c for c in unicodedata.normalize("NFD", text.lower())
                       if unicodedata.category(c) != "Mn")
        for word in text.split():
            pieces = "".join(c if c.isalnum() else f" {c} " for c in word).split()
            words.update(pieces)
            chars.update(c for piece in pieces for c in piece)
    chars = sorted(c for c in chars if c.isprintable())
    frequent = [w for w, _ in words.most_common() if len(w) > 1 and w.isprintable()][:num_words]
    vocab = list(dict.fromkeys(special_token_layout() + chars + ["##" + c for c in chars] + frequent))
    return vocab[:max_size]


def learn_vocab(
    texts: "tf.data.Dataset | Iterable[str]",
    vocab_size: int,
    lower_case: bool = True,
    num_unused: int = 0,
    batch_size: int = 1024,
) -> list[str]:
    """Learns a BERT WordPiece vocab: the one tf-text's `bert_vocab_from_dataset` learns, with
    its learning step done by `wordpiece_learner.learn` (the same vocabulary, several times faster:
    docs/benchmarks.md, "Learning a WordPiece vocabulary").

    Args:
      texts: a tf.data.Dataset of scalar strings, or any iterable of str (e.g. corpus lines).
      vocab_size: upper bound on the size including the reserved tokens, more than them (the
        learner keeps every character of the texts and its "##" form even past it).
      lower_case: BERT uncased normalisation before counting words.
      num_unused: [unusedN] placeholders after the five specials (see `special_token_layout`).
    Returns:
      The vocab, specials first, one token per entry (write one per line).
    Raises:
      ValueError: `vocab_size` leaves no room past the reserved tokens, or `texts` holds no word
      to count (tf-text's learner fails with StopIteration).
      An error raised while iterating `texts` is raised as itself once the learner is done with
      the lines before it (`text_files.iter_text_lines` names a file that is not text, or
      inputs without text, this way, before the first line). Let through, it would become a
      tf.data op error whose message, and TensorFlow's log, hold a Python traceback.
    """
    from tensorflow_text.python.ops import bert_tokenizer
    from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib

    from electra_tf.data import wordpiece_learner
    from electra_tf.data.pipeline import untuned

    reserved = special_token_layout(num_unused)
    if num_unused < 0:
        raise ValueError(f"num_unused must be 0 or more, got {num_unused}")
    # tf-text's learner takes any size and returns the reserved tokens and the whole alphabet
    # even for 0; a size with no room past the reserved head is a mistake, not a request.
    if vocab_size <= len(reserved):
        raise ValueError(f"vocab_size {vocab_size} leaves no room for word pieces after the "
                         f"{len(reserved)} reserved tokens; give more than {len(reserved)}")
    raised = []  # what iterating `texts` raised
    if isinstance(texts, tf.data.Dataset):
        batches = texts.batch(batch_size)
    else:
        iterable = texts

        def generate():
            # Lines go to tf.data a batch at a time: one element per line costs ~10x the counting.
            batch = []
            try:
                for line in iterable:
                    batch.append(line)
                    if len(batch) == batch_size:
                        yield batch
                        batch = []
            except Exception as e:  # pylint: disable=broad-except
                raised.append(e)  # the dataset ends after the lines before it; raised below
            if batch:
                yield batch

        batches = tf.data.Dataset.from_generator(
            generate, output_signature=tf.TensorSpec([None], tf.string))
    try:
        # What `bert_vocab_from_dataset` does: count the words BERT's pre-tokenizer finds, learn.
        words = batches.map(bert_tokenizer.BasicTokenizer(lower_case=lower_case).tokenize)
        word_counts = wordpiece_tokenizer_learner_lib.count_words(untuned(words.prefetch(2)))
        vocab = wordpiece_learner.learn(word_counts, vocab_size, reserved)
    except StopIteration:  # the learner found no word to count
        if raised:
            raise raised[0] from None
        raise ValueError("no text to learn a WordPiece vocabulary from") from None
    if raised:
        raise raised[0]
    # The learner may emit a reserved token again or a token with whitespace; keep the file valid.
    seen, out = set(), []
    for token in vocab:
        if token and token not in seen and not any(c.isspace() for c in token):
            seen.add(token)
            out.append(token)
    return out


def write_vocab(vocab: Sequence[str], path: str) -> None:
    """Writes one token per line, replacing `path` in one rename (`files.write_text`: an exclusive
    temporary; a link planted at `path` is replaced, not written through)."""
    from electra_tf import files

    files.write_text(path, "".join(t + "\n" for t in vocab))
