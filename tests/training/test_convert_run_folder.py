"""`electra-convert --input=<an electra-pretrain --model_dir>`: one command converts one's own
pretraining run (generator and discriminator) to Hugging Face or TF1, with nothing dropped."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from electra_tf import run_folder
from electra_tf.convert.common import ConversionError
from electra_tf.convert.pretrained import detect_format, from_pretrained, holds_generator, load_pretrained
from electra_tf.models import ElectraPretrainer


def _run_weights(model_dir) -> ElectraPretrainer:
    """The pretrainer of the run's newest checkpoint, read the way the run itself restores it."""
    import json

    record = json.loads((model_dir / run_folder.RECORD_FILE).read_text())
    from electra_tf.config import ElectraConfig

    model = ElectraPretrainer(ElectraConfig.from_dict(record["model_config"]))
    prefix = run_folder.checkpoint_prefixes(model_dir)[0]
    run_folder.model_checkpoint(model).read(prefix).expect_partial()
    return model


def _convert(*args) -> str:
    proc = subprocess.run([sys.executable, "-m", "electra_tf.tools.convert", *args], cwd=pretraining_repo(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def pretraining_repo() -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[2])


def test_a_pretraining_run_converts_in_one_command(pretrain_shards, pretrain_vocab, tmp_path, th):
    model_dir = tmp_path / "run"
    process = th.pretrain_process(th.tiny_flags(pretrain_shards, pretrain_vocab, str(model_dir),
                                                num_train_steps=2))
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    assert detect_format(model_dir) == "electra_tf" and holds_generator(model_dir)
    run = _run_weights(model_dir)

    out = _convert(f"--input={model_dir}", f"--output={tmp_path / 'hf'}", "--output_format=hf")
    assert "ignored (0)" in out.split("== export ==")[1] and "unknown (0)" in out
    out = _convert(f"--input={model_dir}", f"--output={tmp_path / 'tf1'}", "--output_format=tf1")
    # TF1 checkpoints do not record the number of attention heads (the authors' configs do):
    # that one is read with the run's config.
    for folder, config in ((tmp_path / "hf", None), (tmp_path / "tf1", run.config)):
        back, _, vocab = from_pretrained(folder, "pretrainer", config)
        assert vocab is not None
        for part in ("discriminator", "generator"):
            ours = {v.path: v.numpy() for v in getattr(run, part).weights}
            theirs = {v.path: v.numpy() for v in getattr(back, part).weights}
            assert ours.keys() == theirs.keys()
            for path in ours:
                np.testing.assert_allclose(theirs[path], ours[path], rtol=0, atol=1e-6, err_msg=path)
    # The run's weights moved from their initialisation: the comparison is not of two fresh models.
    fresh = ElectraPretrainer(run.config)
    assert not all(np.allclose(a, b) for a, b in zip(fresh.get_weights(), run.get_weights()))
    # Either network alone, straight from the run folder.
    disc, config, _ = from_pretrained(model_dir, "discriminator")
    assert config.vocab_size == run.config.vocab_size
    np.testing.assert_array_equal(disc.get_weights()[0], run.discriminator.get_weights()[0])
    # A given step's checkpoint (the replication study exports several of one run).
    step = int(run_folder.checkpoint_prefixes(model_dir)[0].rsplit("-", 1)[1])
    at_step = load_pretrained(model_dir, "discriminator", step=step).model
    np.testing.assert_array_equal(at_step.get_weights()[0], run.discriminator.get_weights()[0])
    with pytest.raises(ConversionError, match=f"no checkpoint of step {step + 1} "):
        load_pretrained(model_dir, "discriminator", step=step + 1)
    # A run started with a relative --vocab_file (recorded as typed), converted from another
    # directory: its vocabulary is the copy beside its discriminator, not dropped.
    import json

    record_path = model_dir / run_folder.RECORD_FILE
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(dict(record, vocab_file="vocab.txt")))
    _, _, vocab = from_pretrained(model_dir, "discriminator")
    assert vocab == str(model_dir / run_folder.DISCRIMINATOR_FOLDER / "vocab.txt")
    assert open(vocab, "rb").read() == open(pretrain_vocab, "rb").read()
