"""electra-export: a fine-tuned model -> a TF Serving SavedModel in BASE/NAME/VERSION.

    electra-export --checkpoint=/tmp/ft_rt --export_base=/tmp/export --model_name=electra
    # -> /tmp/export/electra/1 (the next free version), then serve BASE/NAME:
    electra-serve --model_base_path=/tmp/export/electra

`--checkpoint` is what electra-finetune wrote: its `--model_dir` (its `best/` is used), or a
`best/` folder; `~` is expanded in both paths. The in-graph tokenizer lower-cases (and strips
accents) only if the model was fine-tuned so (`lower_case` in `best/head_config.json`).
Signatures, the custom-op report and the TF Serving versions that can load the result:
`electra_tf/export.py` and `serving/README.md`.
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
_VERSION = flags.DEFINE_integer("version", None, "Version folder (a positive integer); default "
                                "the next free one. An existing version is never overwritten.",
                                lower_bound=1)
_TEXT_PAIR = flags.DEFINE_bool(
    "text_pair", None, "Sentence tasks: take a `text_pair` input too. Default: as the task was "
    "fine-tuned (predefined pair tasks such as mrpc, or a text_pair entry in head_config.json).")
_IDS_ONLY = flags.DEFINE_bool(
    "ids_only", False, "Only the token-id signature (as serving_default and serve_ids): no TF Text "
    "ops, for TF Serving builds without TF Text; clients tokenize with assets/vocab.txt.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        from electra_tf.export import export_finetuned  # TensorFlow: after the flags

        export_finetuned(os.path.expanduser(_CHECKPOINT.value), os.path.expanduser(_EXPORT_BASE.value),
                         _MODEL_NAME.value, version=_VERSION.value, pair=_TEXT_PAIR.value,
                         ids_only=_IDS_ONLY.value)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        sys.exit(f"electra-export: {e}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
