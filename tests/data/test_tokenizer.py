"""WordpieceTokenizer: BERT uncased normalisation, specials from the file, graph use, bad vocabs."""

import hashlib

import pytest
import tensorflow as tf

from electra_tf.data.tokenizer import (VocabError, WordpieceTokenizer, frequency_vocab, load_vocab,
                                      special_token_ids, write_vocab)


def test_specials_are_read_from_the_file(tokenizer, vocab_file):
    lines = open(vocab_file, encoding="utf-8").read().splitlines()
    assert tokenizer.cls_id == lines.index("[CLS]") == 13  # not BERT's 101
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.sep_id, tokenizer.mask_id) == (
        0, 5, 21, 34)
    assert tokenizer.vocab == lines and tokenizer.vocab_size == len(lines)
    assert tokenizer.vocab_hash() == hashlib.sha256(open(vocab_file, "rb").read()).hexdigest()


def test_special_token_ids_name_the_config_fields():
    vocab = ["[unused0]", "[SEP]", "a", "[MASK]", "[PAD]", "[CLS]", "[UNK]"]
    assert special_token_ids(vocab) == {"pad_token_id": 4, "unk_token_id": 6, "cls_token_id": 5,
                                        "sep_token_id": 1, "mask_token_id": 3}
    with pytest.raises(VocabError, match=r"missing special token\(s\) \[MASK\]"):
        special_token_ids([t for t in vocab if t != "[MASK]"])


def test_frequency_vocab_covers_its_texts(tmp_path):
    texts = ["The café's menu, the menu!", "the end"]
    vocab = frequency_vocab(texts, num_words=2)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert vocab[-2:] == ["the", "menu"]  # the two most frequent words of 2+ characters
    assert {"'", ",", "!", "e", "##e"} <= set(vocab) and "é" not in vocab  # accents dropped
    write_vocab(vocab, str(tmp_path / "vocab.txt"))
    tok = WordpieceTokenizer(str(tmp_path / "vocab.txt"))
    assert tok.unk_id not in tok.tokenize(tf.constant(texts)).flat_values.numpy()
    assert frequency_vocab(texts, max_size=7) == vocab[:7]


def test_lower_casing_accent_stripping_and_punctuation(tokenizer):
    plain = tokenizer.encode("the movie was great, but the end")
    assert tokenizer.encode("ThÉ MÓVÏE wâs GREAT,but   thé ÉND") == plain
    assert tokenizer.decode(plain) == "the movie was great , but the end"
    assert tokenizer.unk_id not in plain


def test_unknown_and_cjk_characters(tokenizer):
    ids = tokenizer.encode("movie 中国 movie")
    # CJK ideographs are split into single characters, each unknown to this vocab.
    assert ids == [ids[0], tokenizer.unk_id, tokenizer.unk_id, ids[0]]


def test_wordpieces_and_decode(tokenizer):
    ids = tokenizer.encode("moviegoers")  # not a vocab word: split into ## pieces
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert len(pieces) > 1 and all(p.startswith("##") for p in pieces[1:])
    assert tokenizer.decode(ids) == "moviegoers"
    framed = [tokenizer.cls_id, *ids, tokenizer.sep_id, tokenizer.pad_id, tokenizer.pad_id]
    assert tokenizer.decode(framed) == "[CLS] moviegoers [SEP]"
    assert tokenizer.decode(framed, skip_special_tokens=True) == "moviegoers"
    assert tokenizer.decode(framed, skip_padding=False).endswith("[PAD] [PAD]")


def test_tokenize_words_and_offsets(tokenizer):
    per_word = tokenizer.tokenize_words(["The", "film's", "", "Café"])
    assert per_word[0] == tokenizer.encode("the")
    assert per_word[1] == tokenizer.encode("film ' s") and len(per_word[1]) >= 3
    assert per_word[2] == []
    texts = ["Héllo, Café movie", "", "ÉMÖ\u00adVIE\x97, the"]
    ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(texts))
    for b, text in enumerate(texts):
        raw = text.encode("utf-8")
        spans = [raw[s:e].decode("utf-8") for s, e in zip(starts[b].numpy(), ends[b].numpy())]
        assert ids[b].numpy().tolist() == tokenizer.encode(text)
        # Offsets point into the original bytes (deleted characters between pieces are in no
        # span, so the spans rebuild the text minus whitespace and those characters).
        assert "".join(spans) == "".join(text.split()).replace("\x97", "").replace("\xad", "")
    assert starts[2][0] == 0 and ends[2][-1] == len(texts[2].encode("utf-8"))


def test_batched_ragged_output(tokenizer):
    out = tokenizer.tokenize(tf.constant(["the movie", "", "great"]))
    assert isinstance(out, tf.RaggedTensor) and out.dtype == tf.int64
    assert out.to_list() == [tokenizer.encode("the movie"), [], tokenizer.encode("great")]


def test_inside_tf_data_and_tf_function(tokenizer):
    texts = ["The movie.", "A great FILM!", "bad"]
    eager = [tokenizer.encode(t) for t in texts]
    ds = tf.data.Dataset.from_tensor_slices(texts).batch(2).map(tokenizer.tokenize)
    from_data = [row for batch in ds for row in batch.to_list()]
    assert from_data == eager

    fn = tf.function(tokenizer.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
    assert fn(tf.constant(texts)).to_list() == eager


def test_survives_keras_export_archive(tokenizer, tmp_path):
    import keras

    archive = keras.export.ExportArchive()
    archive.track(tokenizer)  # a tf.Module: its tf-text model buffers are saved with it
    archive.add_endpoint("tokenize", lambda texts: tokenizer.tokenize(texts).to_tensor(),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    archive.write_out(str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    got = loaded.tokenize(tf.constant(["The Movie"])).numpy().tolist()
    assert got == [tokenizer.encode("the movie")]


def test_cased_mode_keeps_case(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Movie", "movie", "é"]
    path = tmp_path / "cased.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    cased = WordpieceTokenizer(str(path), lower_case=False)
    assert cased.encode("Movie movie é") == [5, 6, 7]


SPECIALS = b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n"


@pytest.mark.parametrize("content, message", [
    (b"", "vocab file is empty"),
    (b"\n\n", "vocab file is empty"),
    (SPECIALS + b"the\nthe\n", ":7: duplicate token 'the' (first on line 6)"),
    (SPECIALS + b"the movie\n", ":6: token 'the movie' contains whitespace"),
    (b"[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n", ":3: empty line"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ":3: NUL byte"),
    (b"[PAD]\n[UNK]\n\xff\xfe\n", ":3: not UTF-8"),
    (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", "missing special token(s) [MASK]"),
    # A byte-order mark made token 0 "\ufeff[PAD]", reported as [PAD] missing.
    (b"\xef\xbb\xbf" + SPECIALS + b"the\n", ":1: starts with a byte-order mark (U+FEFF)"),
])
def test_not_a_vocab_is_rejected_naming_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad_vocab.txt"
    path.write_bytes(content)
    with pytest.raises(VocabError) as err:
        WordpieceTokenizer(str(path))
    assert str(path) in str(err.value) and message in str(err.value)


def test_missing_vocab_file(tmp_path):
    with pytest.raises(VocabError, match="not found"):
        load_vocab(str(tmp_path / "nope.txt"))


@pytest.mark.slow  # tf-text's vocab learner takes ~10 s even on 40 reviews
def test_learned_vocab_has_specials_first_and_covers_the_text(tmp_path, imdb_docs, helpers):
    from electra_tf.data.text_files import iter_text_lines
    from electra_tf.data.tokenizer import learn_vocab, write_vocab

    corpus = helpers.write_corpus(tmp_path / "c.txt", imdb_docs[:40])
    vocab = learn_vocab(iter_text_lines([corpus]), 400, num_unused=2)  # what build_vocab runs
    out = str(tmp_path / "learned.txt")
    write_vocab(vocab, out)
    tok = WordpieceTokenizer(out)
    assert tok.vocab[:7] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]",
                             "[unused1]"]
    assert 50 < tok.vocab_size <= 400
    ids = tok.encode(imdb_docs[0][0])
    assert tok.unk_id not in ids
    assert tok.decode(ids) == " ".join(helpers.bert_words(imdb_docs[0][0]))


def test_normalisation_matches_the_original_not_nfkc(tokenizer):
    def norm(text):
        return tokenizer.normalize(tf.constant([text])).numpy()[0].decode("utf-8")

    # Category C characters are deleted (joining their neighbours), as the original does;
    # tab/newline/CR stay whitespace. U+0097 is a C1 control that IMDB really contains.
    assert norm("the\x97movie\u00ad\uf0b7\ufffd\x00 a\tb\nc\rd") == "themovie a\tb\nc\rd"
    assert tokenizer.encode("the\x97movie") == tokenizer.encode("themovie")
    # U+0085 (NEL; Rotten Tomatoes uses it for "…") is whitespace to Python's str.split but a
    # control character to BERT's _clean_text: deleted, gluing the words (fine-tuning included).
    assert tokenizer.encode("the\x85movie") == tokenizer.encode("themovie")
    # NFD only: no compatibility folding ("…" and "²" survive, unlike tf-text's NFKC path).
    assert norm("Wait… x² CAFÉ Ÿ") == "wait… x² cafe y"


@pytest.mark.parametrize("lower_case", [True, False])
def test_leaving_out_tf_texts_bert_normaliser_changes_no_id_or_offset(vocab_file, imdb_docs, lower_case):
    """The WordPiece op is `FastWordpieceTokenizer`; `FastBertTokenizer` with case folding off
    (its normaliser then maps \\p{Cc}|\\p{Cf} to spaces, after ours deleted them) gives the same
    ids and offsets on real text with every kind of character the normalisers touch mixed in."""
    import random

    import tensorflow_text as tf_text

    from electra_tf.data.tokenizer import WORDPIECE_OPTIONS

    tok = WordpieceTokenizer(vocab_file, lower_case=lower_case)
    bert = tf_text.FastBertTokenizer(vocab=tok.vocab, **WORDPIECE_OPTIONS, lower_case_nfd_strip_accents=False)
    odd = ["\u00a0", "\u2028", "\u200b", "\u200d", "\ufeff", "\u0085", "\x0b", "\x1c", "\u202f", "\u3000",
           "\t", "\r", "\n", "\x00", "\x7f", "\x97", "\ufffd", "\ue000", "\U0001F600", "e\u0301", "ﬁ", "İ",
           "ß", "中文", "\u0300", "\u00ad", "\u061c", "\U000E0001", "…", "x²"]
    rng = random.Random(0)
    texts = [s for doc in imdb_docs for s in doc][:400]
    texts += ["".join(t[j:j + 5] + rng.choice(odd) for j in range(0, len(t), 5)) for t in texts]
    texts = tf.constant(texts)
    normalized = tok.normalize(texts)
    ours = tok.tf_tokenizer.tokenize_with_offsets(normalized)
    theirs = bert.tokenize_with_offsets(normalized)
    assert isinstance(tok.tf_tokenizer, tf_text.FastWordpieceTokenizer)
    for got, want in zip(ours, theirs):
        assert got.to_list() == want.to_list()
