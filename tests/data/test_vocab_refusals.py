"""What `electra-build-vocab` and the vocabulary loader refuse, in one line and before the work.

`electra-build-vocab` learns for minutes; an --output it cannot write was found only at the end,
with a traceback, and an --output naming the corpus replaced the corpus. A vocabulary of special
tokens only loaded, and every word became [UNK]. A corpus with classic Mac OS line ends ("\\r")
became one line. Real commands in real processes, real files.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest

from electra_tf.data import text_files

COMMAND = "electra-build-vocab"


def start(module: str, *args: str, cwd) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", f"electra_tf.tools.{module}", *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refusals(cwd, cases: dict) -> dict:
    """Runs `electra-build-vocab` once per case, all at once (each is ~0.3 s of CPU: refused
    before TensorFlow loads), and returns {case: stderr} after checking each exited 1 with one
    line on stderr and nothing on stdout: so before the learning, which logs "Learning a vocab"
    to stderr first."""
    running = {name: start("build_vocab", *args, cwd=cwd) for name, args in cases.items()}
    errors = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 1 and out == "", (name, process.returncode, out, err[-2000:])
        assert err.count("\n") == 1 and err.startswith(f"{COMMAND}: error: "), (name, err[-2000:])
        errors[name] = err.strip()
    return errors


def test_build_vocab_refuses_an_output_it_cannot_or_must_not_write_before_learning(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "the cat sat on the mat.\nit was a good mat.\n\nanother document here.\n"
    (corpus / "c.txt").write_text(text)
    os.symlink("corpus/c.txt", tmp_path / "link.txt")
    os.link(corpus / "c.txt", tmp_path / "hard.txt")
    (tmp_path / "a folder").mkdir()
    cases = {
        "same path": ["--input=corpus/c.txt", "--output=corpus/c.txt"],
        # "sub" does not exist: the system cannot resolve it, the writer's abspath can.
        "other spelling": ["--input=corpus/c.txt", "--output=./sub/../corpus/c.txt"],
        "symbolic link": ["--input=corpus", "--output=link.txt"],
        "hard link": ["--input=corpus/*.txt", "--output=hard.txt"],
        "inside an input folder": ["--input=corpus", "--output=corpus/vocab.txt"],
        "folder": ["--input=corpus/c.txt", "--output=a folder"],
        "missing folder": ["--input=corpus/c.txt", "--output=nowhere/vocab.txt"],
        "file as folder": ["--input=corpus/c.txt", "--output=corpus/c.txt/vocab.txt"],
        "empty": ["--input=corpus/c.txt", "--output="],
    }
    # A folder this process cannot create a file in. Root passes permission bits, so chmod 0555
    # stops only other users (as root the write would succeed: nothing to refuse); as root the
    # case uses sysfs, where nobody can create a file, and is left out where there is none.
    if os.geteuid() != 0:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
    else:
        read_only = "/sys"
    if os.geteuid() != 0 or text_files.output_problem(f"{read_only}/vocab.txt", []) is not None:
        cases["read-only folder"] = ["--input=corpus/c.txt", f"--output={read_only}/vocab.txt"]
    errors = refusals(tmp_path, cases)

    same = f"the same file as the input {corpus / 'c.txt'}; write the result to another file"
    assert errors["same path"] == f"{COMMAND}: error: --output=corpus/c.txt: {same}"
    assert errors["other spelling"] == f"{COMMAND}: error: --output=./sub/../corpus/c.txt: {same}"
    assert errors["symbolic link"] == f"{COMMAND}: error: --output=link.txt: {same}"
    assert errors["hard link"] == f"{COMMAND}: error: --output=hard.txt: {same}"
    assert errors["inside an input folder"].startswith(
        f"{COMMAND}: error: --output=corpus/vocab.txt: inside the input folder corpus, ")
    assert errors["folder"].startswith(f"{COMMAND}: error: --output=a folder: a folder; ")
    assert errors["missing folder"] == (f"{COMMAND}: error: --output=nowhere/vocab.txt: its folder "
                                        f"{tmp_path / 'nowhere'} does not exist")
    assert errors["file as folder"].endswith(f"its folder {corpus / 'c.txt'} is not a folder")
    assert errors["empty"].startswith(f"{COMMAND}: error: --output=: empty; ")
    if "read-only folder" in errors:
        assert errors["read-only folder"].startswith(
            f"{COMMAND}: error: --output={read_only}/vocab.txt: cannot create a file in {read_only} (")
    # Nothing written, the corpus and its links as they were; the probe left no file behind.
    assert (corpus / "c.txt").read_text() == text and (tmp_path / "hard.txt").read_text() == text
    assert os.readlink(tmp_path / "link.txt") == "corpus/c.txt"
    assert sorted(os.listdir(corpus)) == ["c.txt"]
    assert sorted(os.listdir(tmp_path / "a folder")) == []
    assert text_files.output_problem(str(tmp_path / "vocab.txt"), [str(corpus / "c.txt")],
                                     [str(corpus)]) is None
    assert sorted(os.listdir(tmp_path)) == ["a folder", "corpus", "hard.txt", "link.txt"] + (
        ["read-only"] if os.geteuid() != 0 else [])
    # A hidden name inside an input folder is fine: the input walk skips it.
    assert text_files.output_problem(str(corpus / ".vocab.txt"), [], [str(corpus)]) is None


def test_build_vocab_refuses_a_size_without_room_and_inputs_that_are_not_text(tmp_path):
    (tmp_path / "c.txt").write_text("the cat sat on the mat.\n")
    (tmp_path / "empty folder").mkdir()
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)) * 40)
    ok = ["--input=c.txt", "--output=vocab.txt"]
    errors = refusals(tmp_path, {
        "zero": [*ok, "--vocab_size=0"],
        "negative": [*ok, "--vocab_size=-3"],
        "only the reserved": [*ok, "--vocab_size=7", "--num_unused=2"],
        "negative unused": [*ok, "--num_unused=-1"],
        "negative max_lines": [*ok, "--max_lines=-1"],
        "missing file": ["--input=nope.txt", "--output=vocab.txt"],
        "empty folder": ["--input=empty folder", "--output=vocab.txt"],
        "glob matching nothing": ["--input=*.md", "--output=vocab.txt"],
        "binary": ["--input=weights.bin", "--output=vocab.txt"],
        "not a boolean": [*ok, "--lower_case=maybe"],
        "misspelt flag": [*ok, "--lowercase"],
    })
    for name in ("zero", "negative"):
        assert "no room for word pieces after the 5 reserved tokens" in errors[name], errors[name]
        assert errors[name].endswith("give --vocab_size more than 5")
    assert errors["only the reserved"].endswith("give --vocab_size more than 7")
    assert "--num_unused=-1" in errors["negative unused"]
    assert "--max_lines=-1" in errors["negative max_lines"]
    prefix = f"{COMMAND}: error: --input: "
    assert errors["missing file"] == f"{prefix}nope.txt: no such file, directory or matching glob"
    assert errors["empty folder"].startswith(f"{prefix}empty folder: folder without files")
    assert errors["glob matching nothing"].startswith(f"{prefix}*.md: no such file")
    assert errors["binary"].startswith(f"{prefix}{tmp_path / 'weights.bin'}: NUL byte on line 1")
    assert "--lower_case=maybe" in errors["not a boolean"]
    assert "lowercase" in errors["misspelt flag"]
    assert not (tmp_path / "vocab.txt").exists()


def test_learn_vocab_refuses_a_size_without_room():
    from electra_tf.data.tokenizer import learn_vocab

    for size, unused in ((0, 0), (-1, 0), (5, 0), (7, 2)):
        with pytest.raises(ValueError, match=f"vocab_size {size} leaves no room for word pieces"):
            learn_vocab(["the cat sat"], size, num_unused=unused)


def test_lone_carriage_returns_end_lines_in_a_file_without_newlines(tmp_path):
    """Classic Mac OS text: read as the same text with "\\n" is, by both readers (the learner's
    `iter_text_lines`, the data builder's `index_units`); a "\\n" file keeps its stray "\\r"."""
    sentences = [["the cat sat on the mat.", "it was a good mat."], ["another document here."]]
    mac = "\r\r".join("\r".join(doc) for doc in sentences) + "\r"
    unix = mac.replace("\r", "\n")
    for name, text in (("mac.txt", mac), ("unix.txt", unix), ("dos.txt", unix.replace("\n", "\r\n"))):
        (tmp_path / name).write_bytes(text.encode())
    with gzip.open(tmp_path / "mac.txt.gz", "wb") as f:
        f.write(mac.encode())
    lines = [line for doc in sentences for line in doc]
    for name in ("mac.txt", "unix.txt", "dos.txt", "mac.txt.gz"):
        path = str(tmp_path / name)
        assert list(text_files.iter_text_lines([path])) == lines, name
        index = text_files.index_units([path])
        data = (gzip.open if name.endswith(".gz") else open)(path, "rb").read()
        units = [[raw.strip().decode() for raw in index.unit_lines(u, data[index.start[u]:index.end[u]])
                  if raw.strip()] for u in range(len(index))]
        assert units == sentences, name
        assert index.first_line.tolist() == [1, 4], name
        assert index.total_bytes == len(data)
    # In a "\n" file a stray "\r" is not a line end (the authors' reader never split there).
    (tmp_path / "stray.txt").write_bytes(b"loading 50%\rloading 100%\ndone\n")
    assert list(text_files.iter_text_lines([str(tmp_path / "stray.txt")])) == [
        "loading 50%\rloading 100%", "done"]


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_a_vocabulary_of_special_tokens_only_is_refused_by_the_loader_and_build_data(tmp_path):
    from electra_tf.data.tokenizer import VocabError, WordpieceTokenizer, load_vocab

    only_specials = tmp_path / "specials.txt"
    only_specials.write_text("\n".join(SPECIALS) + "\n")
    with_unused = tmp_path / "unused.txt"
    with_unused.write_text("\n".join(SPECIALS + [f"[unused{i}]" for i in range(20)]) + "\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    (tmp_path / "c.txt").write_text("the cat sat on the mat.\n")
    build = start("build_pretraining_data", "--input=c.txt", f"--vocab_file={only_specials}",
                  "--output_dir=out", "--num_processes=1", cwd=tmp_path)

    for path, count in ((only_specials, 5), (with_unused, 25)):
        message = (f"{path}: has no word pieces besides the {count} special and [unusedN] tokens; "
                   "not a WordPiece vocab (learn one with electra-build-vocab)")
        with pytest.raises(VocabError) as info:
            load_vocab(str(path))
        assert str(info.value) == message
        with pytest.raises(VocabError, match="has no word pieces"):  # fine-tuning's tokenizer
            WordpieceTokenizer(str(path))
    with pytest.raises(VocabError, match=f"^{empty}: vocab file is empty$"):
        load_vocab(str(empty))
    one_word = tmp_path / "one.txt"
    one_word.write_text("\n".join(SPECIALS + ["[unused0]", "cat"]) + "\n")
    assert load_vocab(str(one_word))[-1] == "cat"

    out, err = build.communicate(timeout=300)
    assert build.returncode == 1, err[-3000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].endswith(
        f"error: {only_specials}: has no word pieces besides the 5 special and [unusedN] tokens; "
        "not a WordPiece vocab (learn one with electra-build-vocab)")
    assert not (tmp_path / "out" / "manifest.json").exists()
