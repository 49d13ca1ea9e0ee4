"""electra_tf/convert/pretrained.py and tools/convert.py: our format, detection, the binary."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from electra_tf.convert import (
    ConversionError, ConversionReport, detect_format, from_pretrained, load_pretrained,
    save_electra_checkpoint)

REPO = Path(__file__).resolve().parents[2]


def assert_same_weights(a, b):
    """Same values in the same order (paths differ for weights a pretrainer shares)."""
    assert [v.path.split("/")[1:] for v in a.weights] == [v.path.split("/")[1:] for v in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def test_our_format_round_trip_for_every_kind(tmp_path, tiny_ckpt):
    source = load_pretrained(tiny_ckpt, "pretrainer")
    save_electra_checkpoint(source.model, source.config, tmp_path / "ours",
                            vocab_file=source.vocab_path)
    marker = json.loads((tmp_path / "ours" / "electra_tf_checkpoint.json").read_text())
    assert marker["kind"] == "pretrainer" and marker["objects"] == ["discriminator", "generator"]
    assert detect_format(tmp_path / "ours") == "electra_tf"

    model, config, vocab = from_pretrained(tmp_path / "ours", "pretrainer")
    assert config == source.config and Path(vocab).read_text() == Path(source.vocab_path).read_text()
    assert_same_weights(source.model, model)

    disc, _, _ = from_pretrained(tmp_path / "ours", "discriminator")
    assert_same_weights(source.model.discriminator, disc)
    loaded = load_pretrained(tmp_path / "ours", "generator")
    assert_same_weights(source.model.generator, loaded.model)
    assert loaded.config.hidden_size == 64
    assert any(name.startswith("discriminator/encoder") for name, _ in loaded.report.ignored)

    # A generator saved alone keeps its own config.
    save_electra_checkpoint(loaded.model, loaded.config, tmp_path / "gen")
    gen, gen_config, vocab = from_pretrained(tmp_path / "gen", "generator")
    assert gen_config == loaded.config and vocab is None
    assert_same_weights(loaded.model, gen)
    with pytest.raises(ConversionError, match="holds a generator, not a discriminator"):
        from_pretrained(tmp_path / "gen", "discriminator")


def test_detection_lists_what_it_looked_for(tmp_path, tiny_ckpt):
    assert detect_format(tiny_ckpt) == "tf1"
    assert detect_format(tiny_ckpt / "model.ckpt-1000") == "tf1"
    with pytest.raises(ConversionError, match="electra_tf_checkpoint.json.*config.json.*'checkpoint'"):
        from_pretrained(tmp_path, "discriminator")


def test_report_is_readable():
    report = ConversionReport(mapped=[("a/kernel", "x/kernel", (2, 3))],
                              ignored=[("a/kernel/adam_m", "optimizer slot")],
                              missing=[("b/bias", (3,))], source="tf1:ckpt", target="discriminator")
    text = str(report)
    assert report.counts() == {"mapped": 1, "ignored": 1, "missing": 1, "unknown": 0}
    assert text.splitlines()[0] == "tf1:ckpt -> discriminator: 1 mapped, 1 ignored, 1 missing, 0 unknown"
    assert "a/kernel -> x/kernel [2, 3]" in text and "1 x optimizer slot" in text and "b/bias [3]" in text


def run_convert(*args):
    result = subprocess.run([sys.executable, "-m", "tools.convert", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_convert_binary_tf1_to_hf_to_electra_tf(tmp_path, tiny_ckpt):
    out = run_convert(f"--input={tiny_ckpt}", f"--output={tmp_path / 'hf'}", "--output_format=hf",
                      "--kind=pretrainer")
    assert "== import ==" in out and "mapped (82)" in out and "optimizer slot" in out
    assert "missing (0)" in out and "== export ==" in out
    assert (tmp_path / "hf" / "generator" / "model.safetensors").exists()
    out = run_convert(f"--input={tmp_path / 'hf' / 'discriminator'}", "--input_format=hf",
                      f"--output={tmp_path / 'ours'}", "--output_format=electra_tf")
    assert "hf:" in out and "ignored (0)" in out
    disc, config, vocab = from_pretrained(tmp_path / "ours", "discriminator")
    assert_same_weights(load_pretrained(tiny_ckpt, "discriminator").model, disc)
    assert vocab is not None and config.vocab_size == 112
