"""Corpus inputs that are not a corpus: a binary file, a folder without text, stray bad bytes.

Both readers of given corpus files, the shard builder (`build_pretraining_data`) and the vocab
learner's (`iter_text_lines` into `learn_vocab`, what `electra-build-vocab` runs), stop in one
error naming the input, and report invalid UTF-8 in a text file once per file.
"""

import logging
import random

import pytest

from electra_tf.data import shards, text_files


def build(tmp_path, inputs, vocab_file, **kw):
    config = shards.BuildConfig(inputs=[str(i) for i in inputs], vocab_file=vocab_file,
                                output_dir=str(tmp_path / "out"), num_processes=1,
                                max_seq_length=32, num_shards=1, **kw)
    return shards.build_pretraining_data(config, progress_every=0.0)


def not_text_files(tmp_path):
    """(path, what the error says) of three files that are not UTF-8 text."""
    rng = random.Random(0)
    noise = tmp_path / "weights.bin"
    noise.write_bytes(bytes(rng.randrange(256) for _ in range(20_000)))
    no_nul = tmp_path / "noise.txt"  # random bytes without a NUL: invalid UTF-8 on every line
    no_nul.write_bytes(bytes(rng.randrange(1, 256) for _ in range(20_000)))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("".join(f"le café {i} était très bon.\n" for i in range(40)).encode("latin-1"))
    return [(noise, "NUL byte"), (no_nul, "are not valid UTF-8"), (latin1, "40 of its first 40 lines")]


def test_a_file_that_is_not_text_is_refused_naming_it(tmp_path, vocab_file):
    for path, what in not_text_files(tmp_path):
        with pytest.raises(text_files.BadInputError) as info:
            build(tmp_path, [path], vocab_file)
        assert str(info.value).startswith(f"{path}: ") and what in str(info.value)
        with pytest.raises(text_files.BadInputError, match=what):
            next(text_files.iter_text_lines([str(path)]))  # refused before the first line
    assert text_files.not_text_reason("a café\nis fine\n".encode("utf-8")) is None
    # A long line that the look-ahead cuts in the middle of a character is still text.
    head = ("a" + "é" * text_files.HEAD_BYTES).encode("utf-8")[: text_files.HEAD_BYTES]
    assert head.endswith(b"\xc3") and text_files.not_text_reason(head) is None


def test_stray_bad_bytes_in_a_text_file_make_one_warning_per_file(tmp_path, vocab_file, caplog):
    lines = [f"the movie number {i} was fine.".encode() for i in range(120)]
    bad = [3, 10, 17, 40, 41, 90, 119]  # 0-based: file lines 4, 11, ...
    for i in bad:
        lines[i] += b" \xff\xfe"
    path = tmp_path / "reviews.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING):
        manifest = build(tmp_path, [path], vocab_file)
    warnings = [r.getMessage() for r in caplog.records if "invalid UTF-8" in r.getMessage()]
    assert warnings == [f"{path}:4: invalid UTF-8 (invalid start byte at byte 29 of the line); "
                        "7 line(s) of the file in all (4, 11, 18, 41, 42, ...), their bad bytes "
                        "replaced with U+FFFD"]
    assert manifest["num_examples"] > 0
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert len(list(text_files.iter_text_lines([str(path)]))) == 120
    assert [r.getMessage() for r in caplog.records if "invalid UTF-8" in r.getMessage()] == warnings


def test_inputs_without_text_are_named_with_what_was_read(tmp_path, vocab_file):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".hidden").write_text("skipped\n")
    with pytest.raises(text_files.BadInputError, match=f"^{empty}: folder without files"):
        build(tmp_path, [empty], vocab_file)
    with pytest.raises(text_files.BadInputError, match=f"^{empty}: folder without files"):
        list(text_files.iter_text_lines([str(empty)]))
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.txt").write_bytes(b"")
    (blank / "b.txt").write_bytes(b"\n  \n")
    message = (f"no text in the inputs ({blank}): the 2 file(s) read are empty or hold only blank "
               f"lines: {blank / 'a.txt'}, {blank / 'b.txt'}")
    with pytest.raises(text_files.BadInputError) as info:
        build(tmp_path, [blank], vocab_file)
    assert str(info.value) == message
    with pytest.raises(text_files.BadInputError) as info:
        list(text_files.iter_text_lines([str(blank)]))
    assert str(info.value) == message


def test_learn_vocab_raises_what_the_lines_raised_and_refuses_no_text(tmp_path):
    """`electra-build-vocab` on a folder without text ended in tf-text's StopIteration, and an
    error of the line reader came back as a tf.data op error carrying a traceback."""
    from electra_tf.data.tokenizer import learn_vocab

    (tmp_path / "a.txt").write_bytes(b"\n")
    with pytest.raises(text_files.BadInputError, match="no text in the inputs"):
        learn_vocab(text_files.iter_text_lines([str(tmp_path / "a.txt")]), 100)
    with pytest.raises(ValueError, match="no text to learn a WordPiece vocabulary from"):
        learn_vocab(["  ", ""], 100)
