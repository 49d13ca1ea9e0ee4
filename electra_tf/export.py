"""Export a fine-tuned ELECTRA head as a TensorFlow Serving SavedModel that takes raw text.

`export_finetuned(model_dir_or_best, export_base, model_name)` reads what the fine-tuning trainer
saved (`saving.load_finetuned`: the head, its `FinetunedModelConfig` from `head_config.json`,
`vocab.txt`) and writes, with
`keras.export.ExportArchive`, `export_base/model_name/VERSION/` (the next free integer unless
`version` is given; an existing version is never overwritten). The SavedModel is written to a
hidden folder of `export_base` and renamed into place, so a server watching `BASE/NAME` never
sees half a model (TF Serving's serving_config.md: new version folders are picked up while serving);
a failed write (a full disk) leaves nothing behind and raises a one-line `ExportError`
(`write_version`). `model_name` must be one folder name, so the export stays in `export_base`.

The signatures it writes (`serving_default` on raw text, `classify` / `regress` for TF Serving's
Classify / Regress APIs, `serve_ids` on token ids) are the task family's own, composed in
`signatures.py`, whose docstring lists every input and output. `ids_only=True` writes `serve_ids`
alone, for a server without the TF Text ops.

Weights: a head of at most `FREEZE_LIMIT_BYTES` (Small) is written frozen, its weights
constants of one function that every signature calls (`signatures.FrozenHead`) and no variable:
a one-sentence request runs ~15% faster than on variables on a 2-core AMD EPYC with avx2
fma avx512f avx512_vnni avx512_bf16 (docs/benchmarks.md, "Serving latency"); a larger head
(Base, Large: the frozen export's memory grows faster than its weights), or `freeze=False`,
keeps variables. Stock TF Serving loads either. The report records
which (`frozen`).

The vocabulary travels as the asset `assets/vocab.txt` (initialising an id -> token table) and
inside the WordPiece op's model buffer; label names are graph constants.

Casing follows the fine-tuned model (`lower_case` in `head_config.json`, the vocabulary's casing,
true when absent as in files written before it was recorded): the in-graph normalisation
lower-cases, NFD-decomposes and drops accents only when it is true, and otherwise keeps the text
as it came (after deleting control characters), so a cased vocabulary gets "Apple" and "apple"
apart. The WordPiece op (`FastWordpieceTokenizer` with its pre-tokenizer) splits on whitespace
and punctuation but never changes case; the case folding of TF Text's own normaliser
(`FastBertNormalizer(lower_case_nfd_strip_accents=True)`) is not used (`data/tokenizer.py`).
The export report (`assets.extra/electra_export.json`) records `lower_case`.

Custom ops: the export lists the non-core ops in the SavedModel's graph and its function library
(`saved_model_ops`), looks each one up in `TF_TEXT_OP_INTRODUCED` and reports the oldest TF Serving
release whose bundled TF Text has them all (`custom_op_report`). It prints the report and writes
it to `VERSION/assets.extra/electra_export.json` (TF Serving reads only the warmup file from
`assets.extra`). Warmup: every export writes `assets.extra/tf_serving_warmup_requests`, requests
for each of its signatures at three lengths and batch sizes 1 and 8, and `serving_default` at
batch 1 at every length it pads to (`warmup.py`), which TF Serving and `electra-serve` replay
before the version is AVAILABLE. The
tokenizer is `WordpieceTokenizer`, whose WordPiece step is `FastWordpieceTokenizer` alone:
`FastBertTokenizer` would add `FastBertNormalize` (TF Text 2.9), which only maps control
characters to spaces, and our normalisation has already deleted them (`data/tokenizer.py`).
Pair truncation is plain TF (no `TFText>RoundRobinTrim`, TF Text 2.12). The result loads on TF
Serving 2.11 and later as far as TF Text ops go; core TF ops are listed but not version-checked.

Example:
    path = export_finetuned("ft/rt", "/tmp/export", "electra")     # /tmp/export/electra/1
    # tensorflow_model_server --model_base_path=/tmp/export/electra --model_name=electra ...
"""

from __future__ import annotations

import numbers
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from electra_tf.data.preprocessor import TextPreprocessor
from electra_tf import files, signatures, warmup
from electra_tf.convert.common import locked_folder, output_folder_problem
from electra_tf.files import give_normal_mode
from electra_tf.finetune.saving import FinetunedModelConfig
from electra_tf.finetune.families import get_family
from electra_tf.finetune.tasks import takes_pairs
from electra_tf.models.encoder import export_weights

EXPORT_REPORT = os.path.join("assets.extra", "electra_export.json")


# ---------------------------------------------------------------------------------------
# Which TF Serving can load the export.
# ---------------------------------------------------------------------------------------

# Every op tensorflow-text 2.21 registers -> the first TF Text release whose sources register it.
# Source: the tensorflow/text repository at its release tags (v2.0.0, v2.2.0, v2.3.0, v2.4.1,
# v2.5.0 ... v2.20.0), searching tensorflow_text/core/{ops,kernels} for the op's registered name
# (`REGISTER_OP("...")` in ops/*.cc, `kOpName[] = "..."` in kernels/*_kernel_template.h). "2.0.0"
# means "2.0.0 or earlier" (the oldest tag searched); v2.1.0 and v2.4.0 have no tag, so ops first
# seen at v2.2.0 / v2.4.1 may be one release older. Signatures of the ops this exporter uses are
# unchanged since (FastWordpieceTokenizeWithOffsets: inputs input_values, wp_model at v2.7.0 and
# v2.20.0; NormalizeUTF8: same REGISTER_OP at v2.0.0 and v2.20.0).
TF_TEXT_OP_INTRODUCED = {
    "CaseFoldUTF8": "2.0.0",  # core/ops/normalize_ops.cc
    "ConstrainedSequence": "2.0.0",  # core/kernels/constrained_sequence_kernel.cc
    "NormalizeUTF8": "2.0.0",  # core/ops/normalize_ops.cc
    "RegexSplitWithOffsets": "2.0.0",  # core/kernels/regex_split_kernels.cc
    "RougeL": "2.0.0",  # core/kernels/rouge_l_kernel.cc
    "SentenceFragments": "2.0.0",  # core/kernels/sentence_breaking_kernels.cc
    "SentencepieceDetokenizeOp": "2.0.0",  # core/kernels/sentencepiece_kernels.cc
    "SentencepieceIdToStringOp": "2.0.0",
    "SentencepieceOp": "2.0.0",
    "SentencepieceTokenizeOp": "2.0.0",
    "SentencepieceTokenizeWithOffsetsOp": "2.0.0",
    "SentencepieceVocabSizeOp": "2.0.0",
    "UnicodeScriptTokenizeWithOffsets": "2.0.0",  # core/kernels/unicode_script_tokenize_kernel.cc
    "WhitespaceTokenizeWithOffsets": "2.0.0",  # core/kernels/whitespace_tokenize_kernel.cc
    "WordpieceTokenizeWithOffsets": "2.0.0",  # core/kernels/wordpiece_kernel.cc (BertTokenizer)
    "MaxSpanningTree": "2.2.0",  # core/kernels/mst_op_kernels.cc
    "SplitMergeTokenizeWithOffsets": "2.2.0",  # core/kernels/split_merge_tokenize_kernel.cc
    "FindSourceOffsets": "2.4.1",  # core/kernels/normalize_kernels.cc
    "NormalizeUTF8WithOffsetsMap": "2.4.1",  # core/kernels/normalize_kernels.cc
    "SentenceFragmentsV2": "2.4.1",  # core/kernels/sentence_breaking_kernels_v2.cc
    "SentencepieceStringToIdOp": "2.4.1",  # core/kernels/sentencepiece_kernels.cc
    "TokenizerFromLogits": "2.4.1",  # core/kernels/tokenizer_from_logits_kernel.cc
    "FastWordpieceTokenizeWithOffsets": "2.7.0",  # core/kernels/fast_wordpiece_tokenizer_kernel_template.h
    "TFText>FastWordpieceDetokenize": "2.7.0",  # same file
    "TFText>WhitespaceTokenizeWithOffsetsV2": "2.7.0",  # core/kernels/whitespace_tokenizer_kernel_template.h
    "FastBertNormalize": "2.9.0",  # core/kernels/fast_bert_normalizer_kernel_template.h
    "TFText>NgramsStringJoin": "2.9.0",  # core/kernels/ngrams_kernel_template.h
    "TFText>ByteSplitWithOffsets": "2.10.0",  # core/kernels/byte_splitter_kernel_template.h
    "TFText>FastSentencepieceDetokenize": "2.10.0",  # core/kernels/sentencepiece/py_tflite_registerer.cc
    "TFText>FastSentencepieceTokenize": "2.10.0",
    "TFText>OffsetsToBoiseTags": "2.11.0",  # core/kernels/boise_offset_converter_kernel_template.h
    "TFText>BoiseTagsToOffsets": "2.12.0",  # same file
    "TFText>ByteSplitByOffsets": "2.12.0",  # core/kernels/byte_splitter_kernel_template.h
    "PhraseTokenize": "2.12.0",  # core/kernels/phrase_tokenizer_kernel_template.h
    "TFText>PhraseDetokenize": "2.12.0",
    "TFText>RoundRobinGenerateMasks": "2.12.0",  # core/kernels/round_robin_trimmer_kernel_template.h
    "TFText>RoundRobinTrim": "2.12.0",
    "TFText>Utf8Binarize": "2.13.0",  # core/kernels/utf8_binarize_kernel_template.h
}

# TF Serving release -> the TF Text its Bazel workspace pins and links, oldest first.
TF_SERVING_TF_TEXT = (
    ("2.11", "2.8.2"),
    ("2.12.0", "2.12.1"),  # 2.12.0 to 2.19.1 all bundle 2.12.1
    ("2.20.0", "2.20.0"),
)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _read_saved_model(export_path: str):
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(export_path, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    return saved_model


def saved_model_ops(export_path: str) -> set[str]:
    """Every op type in the SavedModel: its graphs' nodes and their function libraries."""
    ops = set()
    for meta_graph in _read_saved_model(export_path).meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return ops


def custom_op_report(ops) -> dict:
    """Which of `ops` are not core TensorFlow, and the oldest TF Serving that has them all.

    An op is core when `tf.raw_ops` has it. A non-core op missing from `TF_TEXT_OP_INTRODUCED`
    makes the answer unknown (`oldest_tf_serving` None, listed in `unknown_ops`).
    """
    custom = sorted(op for op in ops if not hasattr(tf.raw_ops, op))
    text_ops = {op: TF_TEXT_OP_INTRODUCED[op] for op in custom if op in TF_TEXT_OP_INTRODUCED}
    unknown = [op for op in custom if op not in TF_TEXT_OP_INTRODUCED]
    needed = max((_version_tuple(v) for v in text_ops.values()), default=(0,))
    oldest = None
    if not unknown:
        for serving, text in TF_SERVING_TF_TEXT:
            if _version_tuple(text) >= needed:
                oldest = {"tf_serving": serving, "bundled_tf_text": text}
                break
    return {
        "custom_ops": [{"op": op, "library": "tensorflow_text", "tf_text_introduced": v}
                       for op, v in sorted(text_ops.items())],
        "unknown_ops": unknown,
        "needs_tf_text": ".".join(map(str, needed)) if text_ops else None,
        "oldest_tf_serving": oldest["tf_serving"] if oldest else None,
        "oldest_tf_serving_tf_text": oldest["bundled_tf_text"] if oldest else None,
        "core_ops": sorted(op for op in ops if op not in custom),
    }


# ---------------------------------------------------------------------------------------
# Writing BASE/NAME/VERSION.
# ---------------------------------------------------------------------------------------


# TF Serving reads a version folder's name as an int64 (its model status answered 500 for
# 99999999999999999999): a version is 1 ... 2**63 - 1, in ASCII digits.
MAX_VERSION = 2**63 - 1
_VERSION_FOLDER = re.compile(r"[0-9]+")


def _version_of(folder_name: str) -> int | None:
    """The version TF Serving reads in a folder name (ASCII digits, leading zeros allowed, in
    1 ... int64), or None. serving/manager.py's `version_of` is the server's copy of this rule."""
    digits = folder_name.lstrip("0")
    if not _VERSION_FOLDER.fullmatch(folder_name) or not digits or len(digits) > 19:  # int() of 4300+ digits raises
        return None
    return int(digits) if int(digits) <= MAX_VERSION else None


def next_version(model_base: str) -> int:
    """1 + the highest version folder in `model_base` (1 if none). Names a server does not read
    as a version (not ASCII digits, 0, beyond int64) do not count."""
    versions = [v for v in map(_version_of, os.listdir(model_base) if os.path.isdir(model_base) else ())
                if v is not None]
    latest = max(versions, default=0)
    if latest == MAX_VERSION:
        raise ValueError(f"{model_base} holds version {MAX_VERSION}, the largest TF Serving reads "
                         "(int64): give a free version")
    return latest + 1


# Heads up to this many bytes of weights are exported frozen (`export_head`): ELECTRA-Small's
# ~54 MB is. Freezing costs memory and load time that grow faster than the weights: measured on
# the 2-core AMD EPYC with avx2 fma avx512f avx512_vnni avx512_bf16, Small's export peaked at
# 2.2 GB of resident memory frozen against 1.0 GB on variables (load and first call 3.0 against 4.3 s), Base's at 11.5 GB against 1.4 GB (load and
# first call 25 s against 4 s) for a batch-1 request 0.79x as long. So Base and Large keep
# variables unless asked (`freeze=True`, `electra-export --freeze`).
FREEZE_LIMIT_BYTES = 128 << 20


def weight_bytes(model) -> int:
    """Bytes of `model`'s weights."""
    return sum(int(np.prod(w.shape)) * tf.as_dtype(w.dtype).size for w in model.weights)


def export_head(head, description: FinetunedModelConfig | Mapping[str, Any], vocab_file: str,
                export_base: str, model_name: str, version: int | None = None,
                pair: bool | None = None, ids_only: bool = False, verbose: bool = True,
                freeze: bool | None = None) -> str:
    """Export a fine-tuning head (`heads.py`) described by its `FinetunedModelConfig`.

    Args:
      head: a built head (`SentenceClassifier`, `SentenceRegressor`, `TokenTagger`,
        `SpanQuestionAnswerer`, `MultipleChoiceClassifier`).
      description: its `FinetunedModelConfig` (`saving.load_finetuned`), or a mapping of the fields
        that are not the head's (`max_seq_length`, `label_names`, `task`, `lower_case`, ...;
        `FinetunedModelConfig.for_head`).
      vocab_file: the vocabulary the head was fine-tuned with.
      export_base, model_name: the SavedModel goes to `export_base/model_name/VERSION`.
      version: positive integer; default the next free one. An existing version is an error.
      pair: sentence tasks: take `text_pair` too; default as fine-tuned (`text_pair`, or the
        predefined task for a model saved before it was recorded).
      ids_only: only `serve_ids` (also as `serving_default`): no TF Text op in the graph, for
        servers without TF Text; clients tokenize with the exported `assets/vocab.txt`.
      verbose: print where the model went and the custom-op report.
      freeze: the head's weights as graph constants in saved_model.pb (`signatures.FrozenHead`:
        a one-sentence request ~15% faster on ELECTRA-Small) instead of variables; default
        when they take at most `FREEZE_LIMIT_BYTES` (Small; Base and Large keep variables: the
        frozen export's memory and load time grow faster than the weights). Recorded as `frozen`
        in the report.

    Returns:
      The path of the new version folder.
    """
    import keras

    if not isinstance(description, FinetunedModelConfig):
        description = FinetunedModelConfig.for_head(head, **description)
    if pair is not None:
        description = description.replace(text_pair=bool(pair))
    elif description.text_pair is None:  # saved before `text_pair` was recorded: as its predefined task
        description = description.replace(text_pair=takes_pairs(description.task))
    check_version(export_base, model_name, version)
    pre = TextPreprocessor.from_vocab(vocab_file, description.max_seq_length, description.lower_case)
    report = {"model_name": model_name, "family": description.family, "task": description.task,
              "max_seq_length": pre.max_seq_length, "lower_case": pre.tokenizer.lower_case,
              "text_pair": get_family(description.family).text_pair(description), "ids_only": bool(ids_only),
              "label_names": description.label_names}
    if freeze is None:
        freeze = weight_bytes(head) <= FREEZE_LIMIT_BYTES
    report["frozen"] = bool(freeze)
    with export_weights(head, split_ffn=freeze):  # the signatures are traced and written inside
        archive = keras.export.ExportArchive()
        if not freeze:
            archive.track(head)
        archive.track(pre)  # the tokenizer's model buffer and the vocab table (its asset)
        endpoints = signatures.for_head(head, description, pre, frozen=freeze)
        if ids_only:  # the first endpoint is also written as serving_default
            endpoints = {signatures.SERVE_IDS: endpoints[signatures.SERVE_IDS]}
        for name, (fn, spec) in endpoints.items():
            archive.add_endpoint(name, fn, input_signature=spec)
        target = write_version(archive, report, export_base, model_name, version,
                               method_names={k: v for k, v in signatures.METHOD_NAMES.items() if k in endpoints})
    if verbose:
        print(format_report(target, report))
    return target


# The name a server serves the model under (`BASE/NAME` -> /v1/models/NAME): one folder name,
# and a REST URL segment. serving/model_config.py holds the server's copy of this rule.
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class ExportError(RuntimeError):
    """The export could not be written (a full disk, a file-size limit, a folder it may not
    write); everything it had written is removed. The message is one line naming the folder."""


def check_version(export_base: str, model_name: str, version: int | None) -> None:
    """Raises before any work if `model_name` is not one folder name, `version` is not an integer
    from 1 to `MAX_VERSION`, BASE/NAME/VERSION exists, BASE/NAME is a link or a file, or BASE
    cannot be written (a file there or above it, read-only).

    A name such as "../x", "/abs" or "a/b" would put the SavedModel outside `export_base`."""
    if not isinstance(model_name, str) or not _MODEL_NAME.fullmatch(model_name):
        raise ValueError(f"model_name {model_name!r} is not a folder name of letters, digits, '_', '.' and '-' "
                         "(no '/', not starting with '.'): the export goes to EXPORT_BASE/MODEL_NAME/VERSION")
    if version is not None and (isinstance(version, bool) or not isinstance(version, numbers.Integral)
                                or not 0 < int(version) <= MAX_VERSION):
        raise ValueError(f"version must be an integer from 1 to {MAX_VERSION} (TF Serving reads version "
                         f"folders as int64), got {version!r}")
    problem = output_folder_problem(export_base)
    if problem is not None:
        raise ValueError(f"export_base {export_base}: {problem}")
    model_base = os.path.join(export_base, model_name)
    if os.path.islink(model_base) or (os.path.lexists(model_base) and not os.path.isdir(model_base)):
        raise files.LinkedFolderError(f"{model_base} is a symbolic link or a file; electra_tf does not write "
                                      "through links (remove it or give another --model_name)")
    if version is None:
        return
    # TF Serving reads `00012` as version 12 too: any spelling of the version is taken.
    taken = [n for n in (os.listdir(model_base) if os.path.isdir(model_base) else ())
             if _version_of(n) == int(version)]
    target = os.path.join(model_base, taken[0] if taken else str(version))
    if taken or os.path.lexists(target):
        raise FileExistsError(f"{target} exists; versions are never overwritten")


# What `write_version` names its staging folders: `.NAME-export-` and mkdtemp's 8 random
# characters. A killed export leaves one behind; the next export into the same base removes
# it (`remove_abandoned`: only when no live export holds it), whatever its NAME.
_STAGING_INFIX = "-export-"
_STAGING_FOLDER = re.compile(r"\.[A-Za-z0-9][A-Za-z0-9_.\-]*-export-[a-z0-9_]{8}")


def abandoned_staging_candidates(export_base: str) -> list[str]:
    """The staging folders of exports in `export_base` (live or killed; links and files are not
    among them): nothing a user names so, and a server never reads them (BASE/NAME holds the
    versions, and a hidden name is not a version)."""
    try:
        names = os.listdir(export_base)
    except OSError:
        return []
    return [os.path.join(export_base, n) for n in names if _STAGING_FOLDER.fullmatch(n)
            and os.path.isdir(os.path.join(export_base, n)) and not os.path.islink(os.path.join(export_base, n))]


# A full disk (or file-size limit, or quota) as TensorFlow's file system reports it: an OpError
# (ENOSPC: ResourceExhausted, EFBIG: OutOfRange "File too large") whose message says which. The
# same three as `files.disk_full_message`, whose message does not fit here: it names the file
# being written (in the staging folder, removed) and says what was finished is kept.
_DISK_FULL_TEXT = re.compile(r"No space left on device|File too large|Disk quota exceeded", re.I)


def _write_failure(error: BaseException) -> str | None:
    """Why writing failed, in a few words, if `error` is the file system's (not a bug); else None."""
    if isinstance(error, OSError):
        return os.strerror(error.errno) if error.errno else str(error)
    if isinstance(error, tf.errors.OpError):
        found = _DISK_FULL_TEXT.search(error.message)
        if found:
            return found.group(0)
        if isinstance(error, tf.errors.PermissionDeniedError):
            return "Permission denied"
    return None


def _make_folders(path: str) -> list[str]:
    """os.makedirs(path, exist_ok=True); returns the folders it created, outermost first."""
    missing = []
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    os.makedirs(path, exist_ok=True)
    return missing[::-1]


def _write_out(archive, folder: str) -> None:
    """`archive.write_out(folder)`, tracing each signature once instead of twice.

    Keras lists the variables the endpoints use (`_filter_and_track_resources`, which traces
    each endpoint) before calling `tf.saved_model.save`, which traces them again: a function's
    traces are cached per context, and whether the trace is made inside a save context (the
    save options' variable policy) is part of that context (TensorFlow's
    `function_context.make_function_context`). Listing them inside a save context with the
    options `write_out` saves with (the defaults) makes Keras' trace the one the save finds:
    the same SavedModel in 0.7-0.95x the time, with less peak memory (docs/benchmarks.md, "An
    export traces each signature once"). A Keras without that method, or one calling it inside
    the save, writes as before."""
    from tensorflow.python.saved_model import save_context  # no public API for it

    track = getattr(archive, "_filter_and_track_resources", None)
    if track is not None:
        def track_in_save_context():
            if save_context.in_save_context():
                return track()
            with save_context.save_context(tf.saved_model.SaveOptions()):
                return track()
        archive._filter_and_track_resources = track_in_save_context
    archive.write_out(folder, verbose=False)


def write_version(archive, report: dict, export_base: str, model_name: str,
                  version: int | None, method_names: Mapping[str, str] | None = None) -> str:
    """Writes the archive beside BASE/NAME, completes `report` (signatures, ops, version) into
    its `assets.extra`, then renames it to BASE/NAME/VERSION (the next free version if None): a
    polling server never sees half a model, and two exports never take the same version.
    `method_names` ({signature: method name}) replaces the method name Keras writes for those
    signatures (`_set_method_names`).

    Nothing is half-visible and nothing stays behind. The SavedModel is written to a hidden
    staging folder of BASE; the version appears by a rename once it is complete (an empty
    folder claims the version number first, and a server skips a folder without
    saved_model.pb); an existing version is never touched. If writing fails (a full disk, a
    file-size limit, a folder it may not write), the staging folder is removed, and so are
    BASE/NAME and BASE if this export created them, and the failure is an `ExportError` of one
    line naming BASE/NAME. A killed export cannot clean up: its staging folder stays hidden in
    BASE until the next export into BASE, of any NAME, removes it.
    """
    check_version(export_base, model_name, version)
    model_base = os.path.join(export_base, model_name)
    created: list[str] = []  # folders this export made, to remove if it fails
    staging = held = None
    try:
        created += _make_folders(export_base)
        # What killed exports of any name left (a live export holds its staging folder:
        # `files.hold`). Under a lock on BASE, so that no other export's sweep runs between our
        # mkdtemp and our hold and takes our new folder for a dead one.
        with locked_folder(export_base):
            files.remove_abandoned(abandoned_staging_candidates(export_base))
            staging = tempfile.mkdtemp(prefix=f".{model_name}{_STAGING_INFIX}", dir=export_base)
            held = files.hold(staging)
        give_normal_mode(staging)  # mkdtemp's 0700 would hide the version from other accounts
        _write_out(archive, staging)
        if method_names:
            _set_method_names(staging, method_names)
        report.update({"signatures": _signature_summary(staging), "tensorflow": tf.__version__,
                       "tensorflow_text": tf_text.__version__,
                       **custom_op_report(saved_model_ops(staging))})
        os.makedirs(os.path.join(staging, "assets.extra"), exist_ok=True)
        # After every change to the SignatureDefs: the requests are made from them.
        report["warmup_requests"] = warmup.write(
            staging, _read_saved_model(staging).meta_graphs[0].signature_def, model_name,
            int(report.get("max_seq_length") or 128))
        created += _make_folders(model_base)
        files.own_folder(model_base)  # a link planted at BASE/NAME since check_version: refused
        while True:
            target_version = version if version is not None else next_version(model_base)
            target = os.path.join(model_base, str(target_version))
            report["version"] = target_version
            files.write_json(os.path.join(staging, EXPORT_REPORT), report)
            try:
                os.mkdir(target)  # claims the version; fails if another export got there first
            except FileExistsError:
                if version is not None:
                    raise FileExistsError(f"{target} exists; versions are never overwritten") from None
                continue
            created.append(target)
            os.rename(staging, target)  # replaces the empty folder just made, atomically
            return target
    except BaseException as e:
        if held is not None:
            os.close(held)
            held = None
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        for folder in reversed(created):
            try:
                os.rmdir(folder)  # only if empty: another export may have written into it since
            except OSError:
                pass
        reason = None if isinstance(e, FileExistsError) else _write_failure(e)
        if reason is None:
            raise
        hint = "; free space (or lift the file-size limit) and run it again" if _DISK_FULL_TEXT.search(reason) else ""
        raise ExportError(f"writing the export to {model_base} failed: {reason}; "
                          f"what it had written is removed{hint}") from e
    finally:
        if held is not None:
            os.close(held)


def _set_method_names(export_path: str, method_names: Mapping[str, str]) -> None:
    """Gives signatures of the SavedModel in `export_path` other method names, in place.

    Keras' ExportArchive writes every endpoint as `tensorflow/serving/predict`; TF Serving's
    Classify and Regress refuse a signature whose method name is not theirs. The method name is
    a field of the SignatureDef that loading does not read (a tf.function has none), so changing
    it in saved_model.pb changes nothing else. The file is replaced atomically, and fingerprint.pb,
    whose checksums cover saved_model.pb, is written again."""
    from tensorflow.python.saved_model import fingerprinting_utils

    saved_model = _read_saved_model(export_path)
    signature_defs = saved_model.meta_graphs[0].signature_def
    for name, method_name in method_names.items():
        if name not in signature_defs:
            raise ValueError(f"no signature {name!r} to name {method_name!r}; the export has {sorted(signature_defs)}")
        signature_defs[name].method_name = method_name
    path = os.path.join(export_path, "saved_model.pb")
    with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
        f.write(saved_model.SerializeToString())
    os.replace(path + ".tmp", path)
    if os.path.exists(os.path.join(export_path, "fingerprint.pb")):
        fingerprinting_utils.write_fingerprint(export_path)


def _signature_summary(export_path: str) -> dict:
    """{signature: {"inputs": {name: "dtype[shape]"}, "outputs": {...}}} as written."""
    def describe(info):
        dims = ["?" if d.size < 0 else str(d.size) for d in info.tensor_shape.dim]
        return f"{tf.as_dtype(info.dtype).name}[{', '.join(dims)}]"

    summary = {}
    for name, sig in sorted(_read_saved_model(export_path).meta_graphs[0].signature_def.items()):
        if not name.startswith("__"):
            summary[name] = {"inputs": {k: describe(v) for k, v in sorted(sig.inputs.items())},
                             "outputs": {k: describe(v) for k, v in sorted(sig.outputs.items())}}
    return summary


def format_report(path: str, report: Mapping[str, Any]) -> str:
    ops = ", ".join(f"{o['op']} (TF Text {o['tf_text_introduced']})" for o in report["custom_ops"]) or "none"
    lines = [f"Exported {report['family']} model to {path}",
             "  signatures: " + "; ".join(f"{name}({', '.join(sig['inputs'])}) -> {', '.join(sig['outputs'])}"
                                          for name, sig in report["signatures"].items()),
             f"  custom ops: {ops}"]
    if report.get("warmup_requests"):
        lines.append(f"  warmup: {report['warmup_requests']} requests in {warmup.WARMUP_FILE} "
                     "(replayed by TF Serving and electra-serve before the version is AVAILABLE)")
    if "lower_case" in report:
        lines.append("  text: " + ("lower-cased, accents stripped (uncased vocabulary)" if report["lower_case"]
                                   else "case and accents kept (cased vocabulary)"))
    if "frozen" in report:
        lines.append("  weights: " + ("graph constants (frozen; --nofreeze keeps variables)"
                                      if report["frozen"] else "variables"))
    if report["unknown_ops"]:
        lines.append(f"  ops of unknown origin: {', '.join(report['unknown_ops'])} (TF Serving compatibility unknown)")
    if report["custom_ops"] and report["oldest_tf_serving"]:
        lines.append(f"  oldest TF Serving with these TF Text ops: {report['oldest_tf_serving']} "
                     f"(bundles TF Text {report['oldest_tf_serving_tf_text']}); for a server without "
                     f"them, export with ids_only (--ids_only) and call {signatures.SERVE_IDS!r}")
    elif not report["custom_ops"] and not report["unknown_ops"]:
        lines.append("  no TF Text ops: needs no TF Text in the server")
    return "\n".join(lines)


def check_finetuned_files(path) -> None:
    """Refuses in one line naming the file and the field (a ValueError) the JSON files of a
    fine-tuned model that `saving.find_finetuned` / `load_finetuned` would stop at with a
    traceback: a results.json or head_config.json that is not UTF-8 JSON, not an object, or nested
    past Python's reader; a `best_model` that is not a folder name; a head_config.json missing a
    field that has no default; an encoder config (`head_config.config`) with a wrong field. Reads
    only what the loader reads; a folder without head_config.json is left to the caller."""
    import dataclasses

    from electra_tf.config import ElectraConfig
    from electra_tf.convert.common import read_json
    from electra_tf.finetune.saving import HEAD_CONFIG

    path = Path(path).expanduser()
    folders = [path, path / "best"]
    results = path / "results.json"
    if not any((f / HEAD_CONFIG).exists() for f in folders) and results.is_file():
        best = read_json(results).get("best_model")
        if best is not None and not isinstance(best, str):
            raise ValueError(f"{results}: field 'best_model' must be a folder name, got {best!r}")
        folders.append(path / best if best else path)
    head_config = next((f / HEAD_CONFIG for f in folders if (f / HEAD_CONFIG).is_file()), None)
    if head_config is None:
        return
    values = read_json(head_config)
    present = set(values) | ({"family"} if "kind" in values else set())  # "kind": version 1's name
    missing = [f.name for f in dataclasses.fields(FinetunedModelConfig) if f.name not in present
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{head_config}: field(s) {', '.join(missing)} missing")
    encoder = values.get("head_config", {}).get("config") if isinstance(values.get("head_config"), dict) else None
    if isinstance(encoder, dict):
        ElectraConfig.from_dict(encoder, source=f"{head_config}: field 'head_config.config'")


def export_finetuned(model_dir_or_best: str, export_base: str, model_name: str,
                     version: int | None = None, pair: bool | None = None, ids_only: bool = False,
                     verbose: bool = True, freeze: bool | None = None) -> str:
    """Export what `seeds.finetune` saved (a run's `model_dir`, a `run_seeds` folder or a
    `best/` folder) to `export_base/model_name/VERSION`; see the module docstring."""
    from electra_tf.config import ConfigError
    from electra_tf.convert.common import ConversionError, one_line
    from electra_tf.finetune.saving import HEAD_CONFIG, find_finetuned, load_finetuned

    check_finetuned_files(model_dir_or_best)
    try:
        head, description, vocab_file = load_finetuned(model_dir_or_best)
    except (ValueError, AssertionError) as e:  # a head_config.json whose head the checkpoint does not fit
        if isinstance(e, (ConfigError, ConversionError)):
            raise
        folder = find_finetuned(model_dir_or_best)
        raise ValueError(f"{folder / HEAD_CONFIG} does not describe the checkpoint beside it "
                         f"({one_line(e)})") from None
    return export_head(head, description, vocab_file, export_base, model_name, version=version, pair=pair,
                       ids_only=ids_only, verbose=verbose, freeze=freeze)
