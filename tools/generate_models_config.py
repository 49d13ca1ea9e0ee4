r"""Write TF Serving's models.config for one or more models.

    python -m electra_tf.tools.generate_models_config --model=electra:/models/electra \
        --model=electra_v1:/models/electra:1 --output=models.config

Each --model is NAME:BASE_PATH[:POLICY], POLICY one of `latest` (default), `latestN`
(the N highest), `all`, or comma-separated versions (`1,2`). BASE_PATH is the path as
the server sees it (e.g. inside the container).
"""

import re

from absl import app, flags

from electra_tf import cli, files
from electra_tf.serving.model_config import ModelConfig, ModelConfigError, models_config_text

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("model", [], "NAME:BASE_PATH[:POLICY]")
flags.DEFINE_string("output", None, "File to write (default: stdout).")

# What a POLICY is. A last part that only looks like one (latest5x, 1,,2, Arabic-Indic digits) is
# refused rather than taken as part of the base path or read by int(), which accepts any script's digits.
_LOOKS_LIKE_POLICY = re.compile(r"latest.*|all|[\d,\s]+", re.S)
_LATEST = re.compile(r"latest([0-9]{1,10})?")
_VERSIONS = re.compile(r"[0-9]{1,19}(?:,[0-9]{1,19})*")


def parse_model_flag(value: str) -> ModelConfig:
    """A ModelConfig from NAME:BASE_PATH[:POLICY]; ModelConfigError naming the value if it is none."""
    name, sep, rest = value.partition(":")
    if not sep:
        raise ModelConfigError(f"--model {value!r}: expected NAME:BASE_PATH[:POLICY]")
    base_path, policy = rest, "latest"
    head, _, tail = rest.rpartition(":")
    if head and _LOOKS_LIKE_POLICY.fullmatch(tail):
        base_path, policy = head, tail
    try:
        if policy == "all":
            return ModelConfig(name, base_path, "all")
        if latest := _LATEST.fullmatch(policy):
            return ModelConfig(name, base_path, "latest", num_versions=int(latest.group(1) or 1))
        if _VERSIONS.fullmatch(policy):
            return ModelConfig(name, base_path, "specific", tuple(int(v) for v in policy.split(",")))
    except ModelConfigError as e:
        raise ModelConfigError(f"--model {value!r}: {e}") from None
    raise ModelConfigError(f"--model {value!r}: POLICY {policy!r} is not latest, latestN, all or comma-separated"
                           " versions (ASCII digits, 1 to 2^63-1: 1,2)")


def main(argv):
    del argv
    if not FLAGS.model:
        raise app.UsageError("give at least one --model=NAME:BASE_PATH")
    try:
        text = models_config_text([parse_model_flag(m) for m in FLAGS.model])
    except ModelConfigError as e:
        raise app.UsageError(str(e))
    if FLAGS.output:
        files.write_text(FLAGS.output, text)  # a link at --output is replaced, never written through
    else:
        print(text, end="")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
