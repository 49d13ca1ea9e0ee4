r"""Write TF Serving's models.config for one or more models.

    python -m electra_tf.tools.generate_models_config --model=electra:/models/electra \
        --model=electra_v1:/models/electra:1 --output=models.config

Each --model is NAME:BASE_PATH[:POLICY], POLICY one of `latest` (default), `latestN`
(the N highest), `all`, or comma-separated versions (`1,2`). BASE_PATH is the path as
the server sees it (e.g. inside the container).
"""

from absl import app, flags

from electra_tf import cli
from electra_tf.serving.model_config import ModelConfig, ModelConfigError, models_config_text

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("model", [], "NAME:BASE_PATH[:POLICY]")
flags.DEFINE_string("output", None, "File to write (default: stdout).")


def parse_model_flag(value: str) -> ModelConfig:
    name, sep, rest = value.partition(":")
    if not sep:
        raise ModelConfigError(f"--model {value!r}: expected NAME:BASE_PATH[:POLICY]")
    base_path, policy = rest, "latest"
    head, _, tail = rest.rpartition(":")
    if head and (tail in ("latest", "all") or tail.startswith("latest") or tail.replace(",", "").isdigit()):
        base_path, policy = head, tail
    if policy == "all":
        return ModelConfig(name, base_path, "all")
    if policy.startswith("latest"):
        return ModelConfig(name, base_path, "latest", num_versions=int(policy[6:] or 1))
    return ModelConfig(name, base_path, "specific", tuple(int(v) for v in policy.split(",")))


def main(argv):
    del argv
    if not FLAGS.model:
        raise app.UsageError("give at least one --model=NAME:BASE_PATH")
    try:
        text = models_config_text([parse_model_flag(m) for m in FLAGS.model])
    except ModelConfigError as e:
        raise app.UsageError(str(e))
    if FLAGS.output:
        with open(FLAGS.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(text, end="")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
