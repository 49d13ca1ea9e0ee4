"""Reading the user's text files: inputs, their checks, and the unit index of a shard build.

Every corpus given as `--input` to `electra-build-vocab` and `electra-build-data` is UTF-8 text, one
sentence per line, a blank line between documents. Inputs are files, folders (walked, hidden entries
skipped), globs and `.gz` files (`expand_inputs`). The checks every reader makes: a file whose
start is not UTF-8 text is refused (`not_text_reason`), a few invalid lines in a text file are
replaced and reported once per file (`InvalidUtf8Lines`), and inputs without a line of text are
refused naming what was read (`no_text_message`); each refusal is a `BadInputError` naming the file.

`iter_text_lines` yields the non-blank lines (the vocabulary learner reads them); `index_units`
records where every *unit* lives, a run of non-blank lines (a document) cut after `MAX_UNIT_LINES`
lines, so that the shard builder (`shards.py`) can hand units to shards and read them back by byte
offset. With no inputs, the embedded IMDB corpus (`corpus.py`) is read.

Line ends. The authors' builder (`build_pretraining_dataset.py`) iterates `tf.io.gfile.GFile`,
whose line reader splits at "\n" only and drops every "\r" (TensorFlow's
`BufferedInputStream::ReadLine`): "\n" and "\r\n" files give the same lines, and so they do here
(a "\r" left at a line's end is whitespace to the tokenizer). A file with carriage returns and no
"\n" in its first `HEAD_BYTES` (classic Mac OS text) would there become a single line, its
sentences glued and the whole file one document cut to one example; here a lone "\r" ends its
lines, as Python's universal newlines read it (`line_end`), so it gives the sentences and the
documents (a blank line, "\r\r") that the same text with "\n" gives. Only such files are split at
"\r": in a "\n" file a stray "\r" (a progress bar, "\r\r\n" of a twice-converted file) stays
inside its line, where splitting would make blank lines, hence documents, the original never saw.

Outputs. `output_problem` tells, before the work, why a file cannot be written where a command
was told to write it (an input itself, a folder, inside an input folder, a missing or unwritable
folder).
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import os
import time
from typing import Iterable, Iterator, Sequence

import numpy as np
from absl import logging

from electra_tf.files import cannot_write_in

MAX_UNIT_LINES = 10_000


class BadInputError(ValueError):
    """An input file cannot be used; the message names the file (and line)."""


# How much of a file's start `not_text_reason` reads: a few hundred lines of prose.
HEAD_BYTES = 1 << 16


def not_text_reason(head: bytes) -> str | None:
    """Why a corpus file that starts with `head` (its first `HEAD_BYTES`) is not UTF-8 text, or
    None when it is.

    Read anyway, such a file turns into examples of noise, with a warning per line. It is
    refused instead when its start shows it is something else:
    - a NUL byte: no text holds one, while binary data (an archive, an image, a model) and
      UTF-16/UTF-32 text (every ASCII character has NUL bytes) do;
    - most of its first non-blank lines invalid UTF-8: binary data without a NUL, or text in
      another encoding (Latin-1, cp1252), where every accented letter would become U+FFFD.
    A few invalid lines in a UTF-8 file are not a reason: they are replaced and counted
    (`InvalidUtf8Lines`).
    """
    end = line_end(head)
    if b"\x00" in head:
        line = head.count(end, 0, head.index(b"\x00")) + 1
        return (f"NUL byte on line {line}: a binary file (or UTF-16/UTF-32 text), not UTF-8 text "
                "with a sentence per line")
    lines = head.split(end)
    cut = len(head) >= HEAD_BYTES  # the last line may end mid-character
    checked = [(line, cut and k == len(lines) - 1) for k, line in enumerate(lines) if line.strip()]
    invalid = sum(1 for line, at_cut in checked if not _is_utf8(line, at_cut))
    if invalid * 2 > len(checked):
        return (f"{invalid} of its first {len(checked)} lines are not valid UTF-8: a binary file, "
                "or text in another encoding (convert it to UTF-8, e.g. with iconv)")
    return None


def line_end(head: bytes) -> bytes:
    """The byte that ends the lines of a file starting with `head` (its first `HEAD_BYTES`):
    b"\r" when it holds carriage returns and no newline (classic Mac OS text), else b"\n"
    (module docstring: why only there)."""
    return b"\r" if b"\r" in head and b"\n" not in head else b"\n"


def _raw_lines(f, end: bytes) -> Iterator[bytes]:
    """The lines of the binary file `f`, each with its line end `end` (the last may lack it), so
    that their lengths add up to byte offsets."""
    if end == b"\n":
        yield from f  # the file's own line reader
        return
    rest = b""
    while chunk := f.read(1 << 20):
        lines = (rest + chunk).split(end)
        rest = lines.pop()
        for line in lines:
            yield line + end
    if rest:
        yield rest


def _is_utf8(raw: bytes, at_cut: bool = False) -> bool:
    """Whether `raw` is UTF-8; with `at_cut`, a character cut off by the end of `raw` is fine."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return at_cut and e.reason == "unexpected end of data" and e.start >= len(raw) - 3
    return True


class InvalidUtf8Lines:
    """Decodes one corpus file's lines, replacing invalid UTF-8 with U+FFFD, and reports the lines
    it replaced in one warning (`report`): a stray byte on many lines of a large file would
    otherwise take a warning per line and bury the rest of the log.

    Example:
      invalid = InvalidUtf8Lines(path)
      for line_no, raw in enumerate(f, start=1):
          text = invalid.decode(raw, line_no)
      invalid.report()  # "path:2: invalid UTF-8 (...); 3 lines of the file in all (2, 7, 9), ..."
    """

    SHOWN = 5  # line numbers named in the warning

    def __init__(self, path: str):
        self.path = path
        self.lines: list[int] = []
        self.first_reason = ""

    def decode(self, raw: bytes, line_no: int) -> str:
        if raw.isascii():  # most lines of most corpora: no decoding to check
            return raw.decode("ascii")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not self.lines:
                self.first_reason = f"{e.reason} at byte {e.start} of the line"
            self.lines.append(line_no)
            return raw.decode("utf-8", errors="replace")

    def report(self) -> None:
        """One warning naming the first invalid line, the count and a few more line numbers."""
        if not self.lines:
            return
        shown = ", ".join(str(n) for n in self.lines[: self.SHOWN])
        more = ", ..." if len(self.lines) > self.SHOWN else ""
        logging.warning("%s:%d: invalid UTF-8 (%s); %d line(s) of the file in all (%s%s), their bad "
                        "bytes replaced with U+FFFD", self.path, self.lines[0], self.first_reason,
                        len(self.lines), shown, more)


def no_text_message(inputs: Sequence[str], files: Sequence[str]) -> str:
    """What to say when `inputs` (as given: files, folders, globs) expand to `files` that hold no
    line of text: the inputs and the files read, so the user sees which folder was empty."""
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (f"no text in the inputs ({', '.join(inputs)}): the {len(files)} file(s) read are empty "
            f"or hold only blank lines: {shown}")


def output_problem(output: str, files: Sequence[str], inputs: Sequence[str] = ()) -> str | None:
    """Why a command reading `files` (the expansion of `inputs`) cannot write its result to the
    file `output`, or None.

    Known before the work starts, where finding it at the end would lose it (building a
    vocabulary takes minutes): `output` is one of `files` (by `os.path.samefile`, so also
    through another spelling, a symbolic or a hard link: the input would be replaced), a folder,
    in a folder that is missing, inside a folder given as input (`expand_inputs` would read it
    at the next run, unless its name is hidden), or in one where this process cannot create a
    file. The last is probed by creating and removing a temporary there the way
    `files.replacing` will write the output, so it holds for root (whom permission bits do not
    stop), read-only mounts and ACLs. Remote paths (`gs://...`) are not checked.
    """
    from electra_tf import files as files_lib

    if not output:
        return "empty; give the name of the file to write"
    if files_lib.is_remote(output):
        return None
    # The path the writer (`files.replacing`) uses: "sub/../c.txt" is c.txt there even when
    # sub/ does not exist, where the system would not resolve it.
    target = os.path.abspath(output)
    if os.path.exists(target):
        for path in files:
            if _same_file(target, path):
                return f"the same file as the input {path}; write the result to another file"
        if os.path.isdir(target):
            return "a folder; give the name of the file to write (a name inside it, say)"
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        return f"its folder {folder} {what}"
    for given in inputs:
        if os.path.isdir(given) and not _hidden_below(target, given):
            inside = os.path.realpath(given)
            if os.path.commonpath([inside, os.path.realpath(folder)]) == inside:
                return (f"inside the input folder {given}, where the next run on the same inputs "
                        "would read it as text; write it elsewhere")
    reason = cannot_write_in(folder)
    return f"cannot create a file in {folder} ({reason})" if reason else None


def _same_file(a: str, b: str) -> bool:
    """`os.path.samefile`, False when one of them cannot be read (gone since it was listed)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _hidden_below(path: str, folder: str) -> bool:
    """Whether `expand_inputs` skips `path` when it walks `folder`: a name on the way from the
    folder to it starts with a dot."""
    below = os.path.relpath(os.path.abspath(path), os.path.abspath(folder))
    return any(part.startswith(".") and part not in (".", "..") for part in below.split(os.sep))


def expand_inputs(inputs: Iterable[str]) -> list[str]:
    """Files, directories (walked recursively, hidden entries skipped) and globs -> sorted files.

    Raises BadInputError naming any input that matches nothing (a folder without files too).
    """
    files: set[str] = set()
    for pattern in inputs:
        if os.path.isdir(pattern):
            found = len(files)
            for root, dirs, names in os.walk(pattern):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                files.update(os.path.join(root, n) for n in names if not n.startswith("."))
            if len(files) == found:
                raise BadInputError(f"{pattern}: folder without files (hidden ones are skipped)")
        elif os.path.isfile(pattern):
            files.add(pattern)
        else:
            matched = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not matched:
                raise BadInputError(f"{pattern}: no such file, directory or matching glob")
            files.update(matched)
    return sorted(os.path.abspath(f) for f in files)


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


@dataclasses.dataclass
class UnitIndex:
    """Where every unit (document chunk) lives: parallel arrays, one entry per unit."""

    files: list[str]
    file_index: np.ndarray  # [units] int32
    start: np.ndarray  # [units] int64 byte offset of the unit's first line
    end: np.ndarray  # [units] int64 byte offset just past its last line
    first_line: np.ndarray  # [units] int64 1-based line number of its first line
    total_bytes: int
    line_ends: list[bytes] = dataclasses.field(default_factory=list)  # per file, `line_end`

    def __len__(self):
        return len(self.start)

    def unit_lines(self, u: int, data: bytes) -> list[bytes]:
        """Unit u's bytes (`data`, read from `start[u]` to `end[u]`) cut into its lines at its
        file's line end, as `index_units` counted them (the last item is b"" after a line end)."""
        i = int(self.file_index[u])
        return data.split(self.line_ends[i] if i < len(self.line_ends) else b"\n")


def index_units(files: Sequence[str], max_unit_lines: int = MAX_UNIT_LINES,
                on_error: str = "warn") -> UnitIndex:
    """Scans the inputs once and records each unit's byte range (see module docstring).

    Raises BadInputError naming a file whose start is not UTF-8 text (`not_text_reason`).
    With `on_error="warn"` a file's invalid UTF-8 lines are reported here, in one warning per
    file; the shards replace their bytes without a word ("fail" stops where a shard reads one).
    """
    fidx, starts, ends, lines_at, line_ends = [], [], [], [], []
    total = 0
    for i, path in enumerate(files):
        try:
            f = _open(path)
        except OSError as e:
            raise BadInputError(f"{path}: cannot open: {e}") from e
        offset, line_no, unit_start, unit_line, unit_len = 0, 0, -1, 0, 0
        invalid = InvalidUtf8Lines(path)
        try:
            with f:
                head = f.read(HEAD_BYTES)
                reason = not_text_reason(head)
                if reason:
                    raise BadInputError(f"{path}: {reason}")
                line_ends.append(line_end(head))
                f.seek(0)
                for raw in _raw_lines(f, line_ends[-1]):
                    line_no += 1
                    invalid.decode(raw, line_no)
                    if raw.strip():
                        if unit_start < 0:
                            unit_start, unit_line, unit_len = offset, line_no, 0
                        unit_len += 1
                    offset += len(raw)
                    if unit_start >= 0 and (not raw.strip() or unit_len >= max_unit_lines):
                        fidx.append(i), starts.append(unit_start), ends.append(offset)
                        lines_at.append(unit_line)
                        unit_start = -1
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise BadInputError(f"{path}:{line_no + 1}: cannot read: {e}") from e
        if on_error == "warn":
            invalid.report()
        if unit_start >= 0:
            fidx.append(i), starts.append(unit_start), ends.append(offset)
            lines_at.append(unit_line)
        if offset == 0:
            logging.warning("%s: input file is empty; skipped", path)
        elif not fidx or fidx[-1] != i:
            logging.warning("%s: input file has only blank lines; skipped", path)
        total += offset
    return UnitIndex(
        files=list(files),
        file_index=np.asarray(fidx, np.int32),
        start=np.asarray(starts, np.int64),
        end=np.asarray(ends, np.int64),
        first_line=np.asarray(lines_at, np.int64),
        total_bytes=total,
        line_ends=line_ends,
    )


def checked_text_files(inputs: Sequence[str]) -> list[str]:
    """`expand_inputs(inputs)`, each file's start checked to be UTF-8 text (`not_text_reason`).

    Raises BadInputError naming an input that matches nothing or a file that cannot be opened or
    is not text. Cheap (a look at each file's start): commands call it before their work.
    """
    files = expand_inputs(inputs)
    for path in files:
        try:
            with _open(path) as f:
                reason = not_text_reason(f.read(HEAD_BYTES))
        except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError without a strerror
            raise BadInputError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from e
        if reason:
            raise BadInputError(f"{path}: {reason}")
    return files


def iter_text_lines(inputs: Sequence[str], max_lines: int = 0, log_every: int = 0,
                    checked: Sequence[str] | None = None) -> Iterator[str]:
    """Non-blank lines of the inputs (or of the embedded IMDB corpus when `inputs` is empty).

    Used to learn vocabularies, with the build's checks: BadInputError names a file that is not
    UTF-8 text (every file is looked at before the first line is yielded), and the inputs when
    they hold no line of text; invalid UTF-8 bytes are replaced, with one warning per file.
    `checked`: the inputs' files as `checked_text_files` returned them, when the caller has
    already checked them (then they are not looked at twice).
    """
    from electra_tf.data import corpus

    def lines():
        if not inputs:
            for doc in corpus.imdb_documents():
                yield from doc
            return
        files = checked_text_files(inputs) if checked is None else checked
        found = False
        for path in files:
            invalid = InvalidUtf8Lines(path)
            with _open(path) as f:
                end = line_end(f.read(HEAD_BYTES))
                f.seek(0)
                for line_no, raw in enumerate(_raw_lines(f, end), start=1):
                    text = invalid.decode(raw, line_no).strip()
                    if text:
                        found = True
                        yield text
            invalid.report()
        if not found:
            raise BadInputError(no_text_message(inputs, files))

    start = time.time()
    for n, line in enumerate(lines(), start=1):
        yield line
        if log_every and n % log_every == 0:
            logging.info("read %d lines (%.0f lines/s)", n, n / (time.time() - start))
        if max_lines and n >= max_lines:
            return
