"""benchmarks/parity_curves.py on a tiny model: both sides train, a killed reference run resumes
where its last interval ended, complete runs are skipped, the report compares every interval, and
with the diagnostic settings the two curves and the held-out scores coincide.

Needs torch and transformers (`pip install -e '.[anchors]'`); skipped without them.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import parity_curves, torch_electra

REPO = Path(__file__).resolve().parents[2]
SEQ = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if torch_electra.available():
        pytest.skip(f"the PyTorch reference cannot run: {torch_electra.available()}")
    from electra_tf.data import corpus, shards, tokenizer

    root = tmp_path_factory.mktemp("curves_data")
    docs = list(itertools.islice(corpus.imdb_documents(), 60))
    text = root / "corpus.txt"
    text.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    vocab = root / "vocab.txt"
    tokenizer.write_vocab(tokenizer.learn_vocab([line for d in docs for line in d], 400), str(vocab))
    shards.build_pretraining_data(shards.BuildConfig(
        inputs=[str(text)], vocab_file=str(vocab), output_dir=str(root / "shards"),
        max_seq_length=SEQ, num_shards=2, num_processes=1, seed=0))
    return str(root / "shards" / "pretrain_data.tfrecord-*"), str(vocab)


def command(data, out, *extra) -> list[str]:
    shards, vocab = data
    return [sys.executable, "-m", "benchmarks.parity_curves", "run", f"--data={shards}",
            f"--vocab_file={vocab}", f"--output_dir={out}", "--config=electra_tiny",
            f"--max_seq_length={SEQ}", "--train_batch_size=4", "--steps=12", "--interval=2",
            "--seeds=1", "--threads=1", *extra]


def env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")


# electra_tf's draws and initial weights for the reference, no dropout: the diagnostic settings,
# under which the two sides differ only by float rounding.
DIAGNOSTIC = ("--reference_draws=electra_tf", "--reference_init=electra_tf",
              "--override=hidden_dropout=0", "--override=attention_dropout=0")


@pytest.mark.slow  # one tiny run per side, a kill and its resume, ~60 s
def test_both_sides_train_resume_compare_and_coincide(data, tmp_path):
    """One folder, every run with DIAGNOSTIC (one pair of runs serves all the claims):

    - the reference, killed mid-run, resumes where it saved (the interval's partial sums
      included), no interval twice or missing; complete runs are skipped; another recipe in the
      folder is refused; the report has every interval and metric;
    - the per-interval metrics of the binary and of the reference (the resumed one) agree to
      float rounding over the 12 steps: many steps of the same training, beyond the single steps
      of test_step_parity, and a resume that lost or redid anything would show here;
    - held-out evaluation scores both final models alike (the reference's through the
      converter)."""
    out = tmp_path / "curves"
    # The reference, stopped (SIGTERM to the tool and its worker) once its first interval is
    # written: it saves where it is, mid-interval too, and the rerun (both sides at once) resumes
    # it there, the interval's partial sums included.
    process = subprocess.Popen(command(data, out, "--only=torch", *DIAGNOSTIC), cwd=REPO, env=env(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    log = out / "torch-seed0" / "log.txt"
    deadline = time.time() + 300
    while not (log.exists() and "step 2/12" in log.read_text()):
        assert process.poll() is None and time.time() < deadline, process.stdout.read()[-3000:]
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    deadline = time.time() + 60
    while "stopped at step" not in log.read_text():  # the worker outlives the tool briefly
        assert time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    saved = int(re.search(r"stopped at step (\d+)", log.read_text()).group(1))
    assert 2 <= saved < 12
    proc = subprocess.run(command(data, out, "--workers=2", *DIAGNOSTIC), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"torch seed 0: resumed at step {saved}" in log.read_text()
    assert f"torch seed 0: training from step {saved} to 12" in proc.stdout
    assert "electra_tf seed 0: done" in proc.stdout and "torch seed 0: done" in proc.stdout
    steps = [json.loads(line)["step"]
             for line in (out / "torch-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(2, 13, 2))  # no interval twice, none missing
    for side in parity_curves.SIDES:
        curve = parity_curves.curve(out, side, 0)
        assert sorted(curve) == list(range(2, 13, 2)), side
        for metrics in curve.values():
            assert 0.0 <= metrics["disc_auc"] <= 1.0 and metrics["mlm_loss"] > 0

    # The same training on both sides: the curves coincide, through the reference's resume.
    ours, theirs = (parity_curves.curve(out, side, 0) for side in parity_curves.SIDES)
    assert sorted(ours) == sorted(theirs) == list(range(2, 13, 2))
    for step in ours:
        for metric in ("mlm_loss", "disc_loss"):
            a, b = ours[step][metric], theirs[step][metric]
            assert abs(a - b) <= 1e-5 * abs(b), (step, metric, a, b)
        for metric in ("disc_auc", "mlm_accuracy"):  # counts: equal but for a rare tie
            assert abs(ours[step][metric] - theirs[step][metric]) <= 1e-3, (step, metric)

    # Complete runs are not trained again; another recipe in the same folder is refused.
    again = subprocess.run(command(data, out, *DIAGNOSTIC), cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count(": complete") == 2, again.stdout
    other = subprocess.run(command(data, out, *DIAGNOSTIC, "--override=disc_weight=20"), cwd=REPO,
                           env=env(), capture_output=True, text=True, timeout=300)
    assert other.returncode == 1
    assert other.stderr.strip().splitlines()[-1] == (
        f"parity_curves: error: {out} holds runs of another recipe (differs in overrides): use "
        "another --output_dir")

    # The report: every interval and metric on both sides.
    args = parity_curves.parse(["report", f"--output_dir={out}", "--markdown"])
    text = parity_curves.report(args)
    rows = [line.split("|")[1:3] for line in text.splitlines() if line[:3] in ("| 2", "| 4", "| 6",
                                                                             "| 8", "| 1")]
    assert sorted((int(step), metric.strip()) for step, metric in rows if step.strip().isdigit()) \
        == sorted((step, m) for step in range(2, 13, 2) for m in parity_curves.METRICS), text
    assert "intervals where electra_tf's mean lies in the reference's range (of 6)" in text
    assert "last quarter (steps 10..12)" in text
    # A shorter table (--every=4: steps 4, 8 and the last, 12); the counts still over all six.
    short = parity_curves.report(parity_curves.parse(
        ["report", f"--output_dir={out}", "--markdown", "--every=4"]))
    steps = {int(line.split("|")[1]) for line in short.splitlines()
             if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert steps == {4, 8, 12}, short
    assert short.splitlines()[-6:] == text.splitlines()[-6:]  # the counts and the last quarter

    # Held-out evaluation: the two final models are the same but for rounding, and the
    # reference's reaches the evaluation through the converter: the scores agree.
    args = parity_curves.parse(["evaluate", f"--output_dir={out}", f"--eval_data={data[0]}",
                                "--eval_batches=3"])
    text = parity_curves.evaluate(args)
    scores = {side: dict(re.findall(r"(\w+) (\d\.\d{4})", line.split(":", 1)[1]))
              for side in parity_curves.SIDES for line in text.splitlines()
              if line.startswith(f"  {side} seed 0 (step 12)")}
    assert set(scores) == set(parity_curves.SIDES), text
    for metric in parity_curves.METRICS:
        assert abs(float(scores["electra_tf"][metric]) - float(scores["torch"][metric])) <= 2e-4, text
