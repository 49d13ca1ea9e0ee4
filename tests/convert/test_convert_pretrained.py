"""electra_tf/convert/pretrained.py and tools/convert.py: our format, detection, the binary, damaged
files (every format, both binaries) and the mode of written files."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from electra_tf.convert import (
    ConversionError, ConversionReport, detect_format, from_pretrained, load_pretrained,
    save_electra_checkpoint)
from electra_tf.convert.pretrained import save

REPO = Path(__file__).resolve().parents[2]


def assert_same_weights(a, b):
    """Same values in the same order (paths differ for weights a pretrainer shares)."""
    assert [v.path.split("/")[1:] for v in a.weights] == [v.path.split("/")[1:] for v in b.weights]
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


def test_our_format_round_trip_for_every_network(tmp_path, tiny_ckpt):
    source = load_pretrained(tiny_ckpt, "pretrainer")
    save_electra_checkpoint(source.model, source.config, tmp_path / "ours",
                            vocab_file=source.vocab_path)
    marker = json.loads((tmp_path / "ours" / "electra_tf_checkpoint.json").read_text())
    assert marker["network"] == "pretrainer" and marker["objects"] == ["discriminator", "generator"]
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

    # Folders written before the field was renamed say "kind"; `kind=` still loads, with a warning.
    marker = json.loads((tmp_path / "gen" / "electra_tf_checkpoint.json").read_text())
    marker["kind"] = marker.pop("network")
    (tmp_path / "gen" / "electra_tf_checkpoint.json").write_text(json.dumps({**marker, "version": 1}))
    with pytest.warns(DeprecationWarning, match="kind= is deprecated: use network="):
        old, _, _ = from_pretrained(tmp_path / "gen", kind="generator")
    assert_same_weights(gen, old)


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


def run_convert(*args, stderr=None):
    result = subprocess.run([sys.executable, "-m", "electra_tf.tools.convert", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if stderr is not None:
        stderr.append(result.stderr)
    return result.stdout


def test_convert_binary_tf1_to_hf_to_electra_tf(tmp_path, tiny_ckpt):
    out = run_convert(f"--input={tiny_ckpt}", f"--output={tmp_path / 'hf'}", "--output_format=hf",
                      "--network=pretrainer")
    assert "== import ==" in out and "mapped (82)" in out and "optimizer slot" in out
    assert "missing (0)" in out and "== export ==" in out
    assert (tmp_path / "hf" / "generator" / "model.safetensors").exists()
    out = run_convert(f"--input={tmp_path / 'hf' / 'discriminator'}", "--input_format=hf",
                      f"--output={tmp_path / 'ours'}", "--output_format=electra_tf")
    assert "hf:" in out and "ignored (0)" in out
    disc, config, vocab = from_pretrained(tmp_path / "ours", "discriminator")
    assert_same_weights(load_pretrained(tiny_ckpt, "discriminator").model, disc)
    assert vocab is not None and config.vocab_size == 112


def test_convert_takes_every_network_the_input_has(tmp_path, tiny_ckpt):
    # No --network: the release holds a generator, so nothing of it is dropped (README, issue #15).
    out = run_convert(f"--input={tiny_ckpt}", f"--output={tmp_path / 'hf'}", "--output_format=hf")
    assert "mapped (82)" in out.split("== export ==")[0]
    export = out.split("== export ==")[1]
    assert "generator/" in export and "discriminator/" in export
    assert (tmp_path / "hf" / "generator" / "model.safetensors").exists()
    # The pair of HF folders reads back as either network from the parent folder.
    disc, _, _ = from_pretrained(tmp_path / "hf", "discriminator")
    gen, _, _ = from_pretrained(tmp_path / "hf", "generator")
    assert_same_weights(load_pretrained(tiny_ckpt, "discriminator").model, disc)
    assert_same_weights(load_pretrained(tiny_ckpt, "generator").model, gen)
    # A discriminator alone converts to a discriminator alone.
    out = run_convert(f"--input={tmp_path / 'hf' / 'discriminator'}", f"--output={tmp_path / 'd'}",
                      "--output_format=hf")
    assert (tmp_path / "d" / "model.safetensors").exists() and not (tmp_path / "d" / "generator").exists()
    # --kind, the old name of --network, still works and says so.
    logs = []
    run_convert(f"--input={tiny_ckpt}", f"--output={tmp_path / 'k'}", "--output_format=hf",
                "--kind=discriminator", stderr=logs)
    assert (tmp_path / "k" / "model.safetensors").exists() and not (tmp_path / "k" / "generator").exists()
    assert "--kind is deprecated: use --network" in logs[0]


# --- damaged files and file modes -----------------------------------------------------------------
@pytest.fixture(scope="module")
def written(tmp_path_factory, tiny_ckpt):
    """The tiny discriminator written by our own writers, in each format: {format: folder}."""
    loaded = load_pretrained(tiny_ckpt, "discriminator")
    root = tmp_path_factory.mktemp("written")
    for fmt in ("tf1", "hf", "electra_tf"):
        save(loaded.model, root / fmt, fmt, vocab_file=loaded.vocab_path, config=loaded.config)
    return root


# (format, file cut, bytes kept: None = half, what the message says besides the file)
TRUNCATIONS = {
    "hf-safetensors-body": ("hf", "model.safetensors", None, "incomplete metadata"),
    "hf-safetensors-header": ("hf", "model.safetensors", 20, "safetensors"),
    "hf-config": ("hf", "config.json", 40, "not valid JSON"),
    "tf1-data": ("tf1", "model.ckpt-0.data-00000-of-00001", None, "shorter than its .index says"),
    "tf1-index": ("tf1", "model.ckpt-0.index", None, "sstable"),
    "electra_tf-data": ("electra_tf", "model.data-00000-of-00001", None,
                        "shorter than its .index says"),
    "electra_tf-index": ("electra_tf", "model.index", None, "sstable"),
    "electra_tf-marker": ("electra_tf", "electra_tf_checkpoint.json", 30, "not valid JSON"),
}


def truncated_copy(written, tmp_path, case):
    """A copy of `written`'s folder for the case with one file cut short: (folder, that file)."""
    fmt, name, keep, _ = TRUNCATIONS[case]
    folder = tmp_path / case
    shutil.copytree(written / fmt, folder)
    path = folder / name
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2 if keep is None else keep)
    return folder, path


@pytest.mark.parametrize("case", sorted(TRUNCATIONS))
def test_truncated_file_is_one_error_naming_it(written, tmp_path, case):
    folder, path = truncated_copy(written, tmp_path, case)
    with pytest.raises(ConversionError) as info:
        load_pretrained(folder, "discriminator")
    message = str(info.value)
    assert message.startswith(f"{path} is truncated or corrupt (") and "\n" not in message
    assert TRUNCATIONS[case][3] in message


def test_missing_data_file_is_named(written, tmp_path):
    shutil.copytree(written / "electra_tf", tmp_path / "ours")
    (tmp_path / "ours" / "model.data-00000-of-00001").unlink()
    with pytest.raises(ConversionError, match="ours/model: a data file of the checkpoint is miss"):
        load_pretrained(tmp_path / "ours", "discriminator")


def test_truncated_pytorch_bin_is_named(written, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_bytes((written / "hf" / "config.json").read_bytes())
    state = load_file(str(written / "hf" / "model.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, folder / "pytorch_model.bin")
    path = folder / "pytorch_model.bin"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(ConversionError, match=f"^{path} is truncated or corrupt \\(torch.load: "):
        load_pretrained(folder, "discriminator")


@pytest.mark.slow  # three processes, each importing TensorFlow (~25 s)
def test_binaries_report_a_truncated_checkpoint_in_one_line(written, tmp_path):
    """electra-convert and electra-finetune --init_checkpoint: one line naming the file, exit 1.

    Every format reaches a binary once (each binary at least once): which format was cut is
    decided inside `load_pretrained` (every truncation, in process, above), what the binaries add
    is turning its ConversionError into one line, the same for any format."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    train = tmp_path / "train.csv"
    train.write_text("text,label\ntok1 tok2,a\ntok3,b\n")
    for case, tool in (("hf-safetensors-body", "electra-convert"), ("tf1-data", "electra-finetune"),
                       ("electra_tf-data", "electra-convert")):
        folder, path = truncated_copy(written, tmp_path, case)
        args = {
            "electra-convert": ["electra_tf.tools.convert", f"--input={folder}",
                                f"--output={tmp_path / (case + '-out')}", "--output_format=hf"],
            "electra-finetune": ["electra_tf.tools.finetune", "--task=classification", f"--train_file={train}",
                                 f"--eval_file={train}", "--text_column=text",
                                 "--label_column=label", f"--init_checkpoint={folder}",
                                 f"--model_dir={tmp_path / (case + '-ft')}"],
        }[tool]
        result = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 1, (tool, case, result.stderr[-3000:])
        assert "Traceback" not in result.stderr, (tool, case, result.stderr[-3000:])
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{tool}: error: {path} is truncated or corrupt ("), (case, last)
    assert not (tmp_path / "hf-safetensors-body-out").exists()  # nothing written on failure


def test_written_files_get_the_normal_mode(tiny_ckpt, tmp_path):
    """Every file a conversion writes is 0666 & ~umask, as open() gives: safetensors' save_file
    alone would leave model.safetensors 0600; TF's checkpoints go through a temp file too."""
    loaded = load_pretrained(tiny_ckpt, "discriminator")
    previous = os.umask(0o027)  # not the usual 022: the umask is honoured, not a fixed 0644
    try:
        for fmt in ("hf", "tf1", "electra_tf"):
            save(loaded.model, tmp_path / fmt, fmt, vocab_file=loaded.vocab_path,
                 config=loaded.config)
    finally:
        os.umask(previous)
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in tmp_path.rglob("*") if p.is_file()}
    assert "hf/model.safetensors" in modes and "electra_tf/model.index" in modes
    assert modes == {name: oct(0o640) for name in modes}
