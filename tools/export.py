"""electra-export: a fine-tuned model -> a TF Serving SavedModel in BASE/NAME/VERSION.

    electra-export --checkpoint=/tmp/ft_rt --export_base=/tmp/export --model_name=electra
    # -> /tmp/export/electra/1 (the next free version), then serve BASE/NAME:
    electra-serve --model_base_path=/tmp/export/electra

`--checkpoint` is what electra-finetune wrote: its `--model_dir` (its `best/` is used), or a
`best/` folder; `~` is expanded in both paths. An Electric model (an `--override
objective=electric` pretraining run's `--model_dir`, or its `discriminator/`) is exported with a
`score` signature instead: raw sentences in, their scores out (`electra_tf/electric_export.py`):

    electra-export --checkpoint=runs/electric --export_base=/tmp/export --model_name=electric

The in-graph tokenizer lower-cases (and strips accents) only if the model was fine-tuned so
(`lower_case` in `best/head_config.json`). `--model_name` is one folder name (no '/'), so the
export stays inside `--export_base`. If writing fails (a full disk, a file-size limit), the error
is one line and nothing of the export is left behind: no staging folder, and no NAME/ folder
unless it existed before. An export killed (kill -9) leaves a hidden staging folder
(`.NAME-export-XXXXXXXX`) in --export_base, which no server reads; the next export into the same
--export_base removes every such folder no live export holds, whatever its NAME.

Refused in one line before any model is loaded: a --version outside 1 ... 2**63-1 (TF Serving
reads version folders as int64) or one that exists in EXPORT_BASE/MODEL_NAME (versions are never
overwritten or replaced: export to another version, or to the next free one without --version),
and an --export_base that is a file, under a file, or not writable.

Signatures: `electra_tf/signatures.py`; the custom-op report and the TF Serving versions that can
load the result: `electra_tf/export.py` and `serving/README.md`.
"""

import os
import sys

from absl import app, flags

from electra_tf import cli

_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A fine-tuning --model_dir or its best/ folder.", required=True)
_EXPORT_BASE = flags.DEFINE_string(
    "export_base", None, "Folder holding one sub-folder per model name.", required=True)
_MODEL_NAME = flags.DEFINE_string("model_name", "electra", "Model name: the SavedModel goes to "
                                  "EXPORT_BASE/MODEL_NAME/VERSION.")
_VERSION = flags.DEFINE_integer("version", None, "Version folder, 1 ... 2**63-1 (TF Serving reads it "
                                "as int64); default the next free one. An existing version is never "
                                "overwritten.", lower_bound=1, upper_bound=2**63 - 1)
_TEXT_PAIR = flags.DEFINE_bool(
    "text_pair", None, "Sentence tasks: take a `text_pair` input too. Default: as the task was "
    "fine-tuned (predefined pair tasks such as mrpc, or a text_pair entry in head_config.json).")
_MAX_SEQ_LENGTH = flags.DEFINE_integer(
    "max_seq_length", None, "Electric models only: WordPieces scored per text, [CLS] and [SEP] "
    "included (longer texts are cut and flagged `truncated`). Default: the pretraining length.",
    lower_bound=3)
_IDS_ONLY = flags.DEFINE_bool(
    "ids_only", False, "Only the token-id signature (as serving_default and serve_ids): no TF Text "
    "ops, for TF Serving builds without TF Text; clients tokenize with assets/vocab.txt.")

_FREEZE = flags.DEFINE_bool(
    "freeze", None, "Fine-tuned models: the weights as graph constants in saved_model.pb (--freeze; "
    "a one-sentence request ~15% faster) or as variables (--nofreeze). Default: frozen when "
    "they take at most 128 MiB (Small); Base and Large keep variables (freezing Base took 11.5 GB "
    "of memory to export and 25 s to load).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    checkpoint = os.path.expanduser(_CHECKPOINT.value)
    export_base = os.path.expanduser(_EXPORT_BASE.value)
    _refuse_unusable_output(export_base)  # before TensorFlow loads
    from electra_tf.export import ExportError, check_finetuned_files, check_version  # TensorFlow

    try:
        from electra_tf.finetune.saving import find_finetuned

        check_version(export_base, _MODEL_NAME.value, _VERSION.value)  # before a model is loaded
        check_finetuned_files(checkpoint)

        try:
            find_finetuned(checkpoint)
        except FileNotFoundError as not_finetuned:
            _export_electric(checkpoint, export_base, not_finetuned)
            return
        from electra_tf.export import export_finetuned

        if _MAX_SEQ_LENGTH.value is not None:
            raise ValueError("--max_seq_length is for Electric models; a fine-tuned model is "
                             "exported at the length it was fine-tuned with")
        export_finetuned(checkpoint, export_base, _MODEL_NAME.value, version=_VERSION.value,
                         pair=_TEXT_PAIR.value, ids_only=_IDS_ONLY.value, freeze=_FREEZE.value)
    except (ExportError, FileExistsError, FileNotFoundError, ValueError) as e:
        sys.exit(f"electra-export: {e}")


def _refuse_unusable_output(export_base: str) -> None:
    """Exits with one line naming the flag when --export_base cannot be written or --version
    exists; `export.check_version` checks the same again (and --model_name) for library callers."""
    from electra_tf.convert.common import output_folder_problem  # no TensorFlow

    problem = output_folder_problem(export_base)
    if problem is not None:
        sys.exit(f"electra-export: error: --export_base {export_base}: {problem}")
    if _VERSION.value is not None:
        target = os.path.join(export_base, _MODEL_NAME.value, str(_VERSION.value))
        if os.path.lexists(target):
            sys.exit(f"electra-export: error: --version={_VERSION.value}: {target} exists; versions are never "
                     "overwritten (give another --version, or none for the next free one)")


def _export_electric(checkpoint: str, export_base: str, not_finetuned: Exception) -> None:
    """A `score` SavedModel from an Electric checkpoint; `not_finetuned` says why the checkpoint
    was not read as a fine-tuned model (part of the error when it is not Electric either)."""
    from electra_tf.electric_export import export_scorer
    from electra_tf.scoring import ScoringError

    if _IDS_ONLY.value or _TEXT_PAIR.value:
        raise ValueError("--ids_only and --text_pair are for fine-tuned models; an Electric model "
                         "exports one `score` signature over raw text")
    if not os.path.exists(checkpoint) and not os.path.exists(checkpoint + ".index"):
        raise FileNotFoundError(f"{checkpoint}: no such file or folder")
    try:
        export_scorer(checkpoint, export_base, _MODEL_NAME.value, version=_VERSION.value,
                      max_seq_length=_MAX_SEQ_LENGTH.value)
    except ScoringError as e:
        raise ValueError(f"{not_finetuned}; read as an Electric model: {e}") from None


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
