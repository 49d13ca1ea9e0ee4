r"""Converts ELECTRA checkpoints between the authors' TF1 format, Hugging Face and electra_tf.

  electra-convert --input=electra_small --output=/tmp/small_hf --output_format=hf \
      [--input_format=auto] [--network=auto] [--config=electra_small] [--allow_unknown]

--input is a TF1 checkpoint prefix or released archive folder, a Hugging Face folder
(config.json + model.safetensors / pytorch_model.bin), a folder written by electra_tf, or a
keras-hub ElectraBackbone preset folder; or a released model's name, fetched into its library's
cache: a Hugging Face Hub id (google/electra-small-discriminator, owner/name@revision) or a
keras-hub preset (electra_small_discriminator_uncased_en, kaggle://..., hf://...). A path that
exists always wins. --output_format=keras_hub writes the discriminator's
encoder as a keras-hub preset (backbone + tokenizer; the keras_hub extra; what differs from
ELECTRA, the tanh GELU and the pooler, is in electra_tf/convert/keras_hub.py).
Prints the mapping report (mapped, ignored, missing) of the import and of the export.
See electra_tf/convert/ for the formats.

--output must be a new or empty folder; one that holds anything is refused (nothing in it is
touched) unless --overwrite is given. Either way the model is written to a hidden folder beside
--output and renamed into place when complete, swapping out the old folder whole: no file of the
old model stays beside the new ones, and a kill leaves the old folder or the new one (its hidden
staging folder is removed by the next conversion to that place). --output is checked before the
checkpoint is read: a symbolic link, a file, a path under a file or a read-only place is refused
in one line, and so is the folder --input is in.
"""

from absl import app, flags, logging

from electra_tf import cli
from electra_tf.config import ConfigError
from electra_tf.convert import pretrained
from electra_tf.convert.common import ConversionError

_INPUT = flags.DEFINE_string("input", None, "Checkpoint to read: a prefix or folder, or a Hub id "
                             "or keras-hub preset name.", required=True)
_INPUT_FORMAT = flags.DEFINE_enum("input_format", "auto", ["auto", *pretrained.FORMATS],
                                  "Format of --input; auto detects it.")
_OUTPUT = flags.DEFINE_string("output", None, "Folder to write.", required=True)
_OUTPUT_FORMAT = flags.DEFINE_enum("output_format", "electra_tf", list(pretrained.FORMATS),
                                   "Format to write.")
_CONFIG = flags.DEFINE_string("config", None, "Pretraining config name or path (default: from "
                              "the checkpoint).")
_NETWORK = flags.DEFINE_enum(
    "network", "auto", ["auto", *pretrained.NETWORKS], "What to convert: auto takes both "
    "networks (the pretrainer) when the input has a generator, else the discriminator; the HF "
    "export of a pretrainer is a discriminator/ and a generator/ folder.")
flags.DEFINE_alias("kind", "network")  # its old name, deprecated
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an --output folder that is not empty "
                                "(the new model is swapped in whole when complete).")
_ALLOW_UNKNOWN = flags.DEFINE_bool("allow_unknown", False,
                                   "Skip checkpoint tensors nothing accounts for instead of failing.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if flags.FLAGS["kind"].present:
        logging.warning("--kind is deprecated: use --network (same values)")
    try:
        # Before anything is read or fetched, naming the flag (convert checks again).
        pretrained.check_output(_OUTPUT.value, overwrite=_OVERWRITE.value, input_path=_INPUT.value)
        imported, exported = pretrained.convert(
            _INPUT.value, _OUTPUT.value, input_format=_INPUT_FORMAT.value,
            output_format=_OUTPUT_FORMAT.value, network=_NETWORK.value, config=_CONFIG.value,
            overwrite=_OVERWRITE.value, allow_unknown=_ALLOW_UNKNOWN.value)
    except (ConversionError, ConfigError) as e:  # a damaged file too: one line naming it
        # A load that does not fit lists each problem on a line of its own: one line here.
        first, *rest = [line.strip() for line in str(e).splitlines() if line.strip()] or [repr(e)]
        raise SystemExit(f"electra-convert: error: {first}" + (f" {'; '.join(rest)}" if rest else ""))
    print(f"== import ==\n{imported}\n\n== export ==\n{exported}")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
