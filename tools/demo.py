"""The main job on the embedded corpus: `make demo` (see electra_tf/experiments/demo.py for the stages).

  python -m electra_tf.tools.demo [--workdir=runs/demo] [--scale=1.0]

--scale multiplies data and training: 1.0 pretrains 6,000 steps (12-30 minutes on 2 CPU cores,
depending on the CPU) and fine-tunes the pretrained and a randomly initialised encoder with 3 seeds each; 0.02 runs the
whole chain in a couple of minutes. Rerunning reuses the finished stages.

SIGTERM or SIGINT stops the demo after the running stage keeps what it can (pretraining: a
checkpoint at the step reached, within about a second); no next stage starts. One line names
the stage, and the exit status is 128 + the signal (143, 130): a stopped demo is not a finished
one. The same command then resumes the stopped stage to its end (electra_tf/experiments/demo.py).
"""

import sys

from absl import app, flags

from electra_tf import cli
from electra_tf.experiments import demo
from electra_tf.training.preemption import Interrupted

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo", "Where every stage writes.")
_SCALE = flags.DEFINE_float("scale", 1.0, "Amount of data and training (1.0: 6,000 pretraining steps; at most 20).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of every stage.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        demo.run(demo.DemoConfig(workdir=_WORKDIR.value, scale=_SCALE.value, seed=_SEED.value))
    except ValueError as e:  # e.g. a --workdir left by another run (the message names it)
        sys.exit(f"electra_tf.tools.demo: {e}")
    except Interrupted as e:
        print(f"electra_tf.tools.demo: {e}", file=sys.stderr, flush=True)
        sys.exit(e.code)


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
