"""electra-convert's --output: refused before the checkpoint is read when it holds anything (unless
--overwrite), is a link, a file, under a file, read-only or the input's folder; with --overwrite the
new model is swapped in whole, no link at a name inside the old folder is followed, and a kill -9
leaves the old folder. And malformed inputs (config.json, the marker, safetensors) are one line
naming the file and the field."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from electra_tf.config import ConfigError
from electra_tf.convert import ConversionError, from_pretrained, load_pretrained
from electra_tf.convert.pretrained import convert, save

from tests.command_lines import one_line_error, start


def electra_convert(*args):
    return start("convert", *args)


def tree(root):
    """Every name under `root` (links not followed) with its bytes, or its link target."""
    out = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root)] = (os.readlink(path) if os.path.islink(path) else
                                                None if os.path.isdir(path) else Path(path).read_bytes())
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_ckpt):
    """The tiny discriminator as a Hugging Face folder and in our format."""
    loaded = load_pretrained(tiny_ckpt, "discriminator")
    root = tmp_path_factory.mktemp("models")
    for fmt in ("hf", "electra_tf"):
        save(loaded.model, root / fmt, fmt, vocab_file=loaded.vocab_path, config=loaded.config)
    return root


def test_unusable_outputs_are_refused_before_the_checkpoint_is_read(tmp_path):
    """--input does not exist: each refusal comes before anything reads it, names --output and
    leaves every folder as it was."""
    never_read = tmp_path / "never_read"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "model.safetensors").write_bytes(b"old weights")
    (tmp_path / "hidden_only").mkdir()
    (tmp_path / "hidden_only" / ".keep").write_text("")
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "config.json").write_text("{}")
    cases = {  # --output (and more flags) -> what the line says
        ("full",): f"--output {tmp_path / 'full'} exists and is not empty; pass --overwrite",
        ("hidden_only",): "exists and is not empty; pass --overwrite",
        ("a_file",): f"--output {tmp_path / 'a_file'}: {tmp_path / 'a_file'} exists and is not a folder",
        ("a_file/sub/out",): f"{tmp_path / 'a_file'} is a file, not a folder",
        ("link", "--overwrite"): f"--output {tmp_path / 'link'} is a symbolic link",
        (".", "--overwrite", f"--input={tmp_path / 'input'}"): "holds the input",
        ("input", "--overwrite", f"--input={tmp_path / 'input'}"): "holds the input",
    }
    if os.geteuid() != 0:  # root writes through a chmod; the file cases above hold for root too
        (tmp_path / "read_only").mkdir(mode=0o555)
        cases[("read_only/out",)] = f"cannot write in {tmp_path / 'read_only'} (permission denied)"
    before = tree(tmp_path)
    runs = {case: electra_convert(f"--input={never_read}", f"--output={tmp_path / case[0]}", *case[1:])
            for case in cases}
    for case, run in runs.items():
        line = one_line_error(run)
        assert line.startswith("electra-convert: error: --output "), (case, line)
        assert cases[case] in line, (case, line)
    assert tree(tmp_path) == before


def test_overwrite_swaps_in_the_whole_model_and_follows_no_link(models, tmp_path):
    """--output held an older model in another format, a stray file, and links planted at the
    names the new model takes (a file link and a folder link): after --overwrite it holds exactly
    the new model; the links' targets are untouched and nothing is left beside --output."""
    out = tmp_path / "out"
    shutil.copytree(models / "electra_tf", out)
    (out / "stray.txt").write_text("from the old model")
    victim_file, victim_folder = tmp_path / "victim.bin", tmp_path / "victim_folder"
    victim_file.write_bytes(b"not yours")
    victim_folder.mkdir()
    (victim_folder / "keep.txt").write_text("mine")
    (out / "model.safetensors").symlink_to(victim_file)
    (out / "discriminator").symlink_to(victim_folder, target_is_directory=True)
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(victim_file)

    run = electra_convert(f"--input={models / 'hf'}", f"--output={out}", "--output_format=hf", "--overwrite")
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr[-3000:]
    assert f"-> hf:{out}:" in stdout  # the report names --output, not the staging folder
    assert sorted(os.listdir(out)) == sorted(os.listdir(models / "hf"))
    assert not any(os.path.islink(out / n) for n in os.listdir(out))
    assert victim_file.read_bytes() == b"not yours" and os.listdir(victim_folder) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path)) == ["out", "victim.bin", "victim_folder"]  # no staging left
    disc, _, _ = from_pretrained(out, "discriminator")
    reference = load_pretrained(models / "hf", "discriminator").model
    for a, b in zip(reference.weights, disc.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.mark.real_process  # kill -9 at a chosen moment: the command must die with the process held
def test_a_kill_during_an_overwrite_leaves_the_old_folder_and_the_next_run_clears_its_staging(models, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(models / "electra_tf", out)
    old = tree(out)

    def staging():
        return [n for n in os.listdir(tmp_path) if n.startswith(".out.staging-")]

    run = electra_convert(f"--input={models / 'hf'}", f"--output={out}", "--output_format=hf", "--overwrite")
    while run.poll() is None and not staging():
        time.sleep(0.0005)
    assert run.poll() is None, run.communicate()[1][-3000:]
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert tree(out) == old  # the old model, whole
    dead = staging()
    assert dead  # hidden beside it

    run = electra_convert(f"--input={models / 'hf'}", f"--output={out}", "--output_format=hf", "--overwrite")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr[-3000:]
    assert staging() == [] and sorted(os.listdir(out)) == sorted(os.listdir(models / "hf"))


def _malformed(models, tmp_path):
    """{case: (folder, file named, field or words named)} of damaged copies of the tiny model."""
    cases = {}

    def copy(name, fmt):
        folder = tmp_path / name
        shutil.copytree(models / fmt, folder)
        return folder

    def edit_json(folder, file, change):
        path = folder / file
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))
        return path

    f = copy("hf_not_object", "hf")
    (f / "config.json").write_text("[1, 2]")
    cases["hf_not_object"] = (f, f / "config.json", "expected a JSON object, got list")
    f = copy("hf_no_sizes", "hf")
    cases["hf_no_sizes"] = (f, edit_json(f, "config.json", lambda c: c.pop("vocab_size")),
                            "vocab_size is 30522 (absent: Hugging Face's default)")
    f = copy("hf_no_hidden", "hf")
    cases["hf_no_hidden"] = (f, edit_json(f, "config.json", lambda c: c.pop("hidden_size")), "hidden_size is 256")
    f = copy("hf_wrong_type", "hf")
    cases["hf_wrong_type"] = (f, edit_json(f, "config.json", lambda c: c.update(num_hidden_layers="2")),
                              "field 'num_hidden_layers' must be an integer")
    f = copy("hf_nested", "hf")
    (f / "config.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    cases["hf_nested"] = (f, f / "config.json", "nested deeper")
    f = copy("hf_empty_safetensors", "hf")
    (f / "model.safetensors").write_bytes(b"")
    cases["hf_empty_safetensors"] = (f, f / "model.safetensors", "truncated or corrupt")
    f = copy("hf_no_tensors", "hf")
    from safetensors.numpy import save_file
    save_file({}, str(f / "model.safetensors"))
    cases["hf_no_tensors"] = (f, f, "holds no tensors")
    f = copy("ours_no_config", "electra_tf")
    (f / "config.json").unlink()
    cases["ours_no_config"] = (f, f / "config.json", "missing")
    f = copy("ours_empty_config", "electra_tf")
    (f / "config.json").write_text("{}")
    cases["ours_empty_config"] = (f, f / "config.json", "field(s) missing from it: vocab_size, embedding_size")
    f = copy("ours_wrong_type", "electra_tf")
    cases["ours_wrong_type"] = (f, edit_json(f, "config.json", lambda c: c.update(hidden_size="128")),
                                "ElectraConfig.hidden_size: must be an integer")
    f = copy("ours_nested", "electra_tf")
    (f / "config.json").write_text("[" * 100_000)
    cases["ours_nested"] = (f, f / "config.json", "nested deeper")
    f = copy("ours_marker_field", "electra_tf")
    cases["ours_marker_field"] = (
        f, edit_json(f, "electra_tf_checkpoint.json", lambda m: m.update(config=5)), "field 'config'")
    return cases


def test_malformed_inputs_are_one_line_naming_the_file_and_the_field(models, tmp_path):
    cases = _malformed(models, tmp_path)
    for case, (folder, path, words) in cases.items():
        with pytest.raises((ConversionError, ConfigError)) as info:
            convert(folder, tmp_path / f"{case}_out", output_format="hf")
        message = str(info.value)
        assert "\n" not in message and str(path) in message and words in message, (case, message)
        assert not (tmp_path / f"{case}_out").exists()
    # The binary: the same line, no traceback (two at once: each is mostly TensorFlow's import).
    runs = {case: electra_convert(f"--input={cases[case][0]}", f"--output={tmp_path / 'cli' / case}")
            for case in ("hf_nested", "ours_empty_config")}
    for case, run in runs.items():
        line = one_line_error(run)
        assert line.startswith(f"electra-convert: error: {cases[case][1]}") and cases[case][2] in line, line
    # --config is read the same way.
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100_000)
    with pytest.raises(ConversionError, match=f"^{nested} is truncated or corrupt .*nested deeper"):
        convert(models / "hf", tmp_path / "config_out", config=str(nested))
