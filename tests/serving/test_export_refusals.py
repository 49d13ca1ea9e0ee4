"""electra-export's refusals: a --version TF Serving cannot read (beyond int64, 0, negative) or one
that exists, and an --export_base that is a file, under one or read-only, each one line naming the
flag before TensorFlow loads; malformed fine-tuned model files named with their field; and the
staging folder of a killed export, removed by the next export into the same base, whatever its
name, while a live export's and a user's folders stay."""

import json
import os
import shutil
import signal
import time

import pytest

from tests.command_lines import one_line_error, start


def electra_export(*args):
    return start("export", *args)


def test_bad_versions_and_export_bases_are_refused_before_tensorflow_loads(tmp_path):
    """--checkpoint does not exist: each refusal comes before anything reads it, in one line
    naming the flag, and nothing under the base changes."""
    base = tmp_path / "export"
    (base / "electra" / "3").mkdir(parents=True)
    (base / "electra" / "3" / "saved_model.pb").write_bytes(b"version 3")
    (tmp_path / "a_file").write_text("not a folder")
    cases = {
        (base, "--version=99999999999999999999"):
            "flag --version=99999999999999999999: 99999999999999999999 is not an integer in the range "
            "[1, 9223372036854775807]",
        (base, "--version=0"): "flag --version=0: 0 is not an integer in the range",
        (base, "--version=-4"): "flag --version=-4: -4 is not an integer in the range",
        (base, "--version=3"): f"--version=3: {base / 'electra' / '3'} exists; versions are never overwritten",
        (tmp_path / "a_file", "--version=1"):
            f"--export_base {tmp_path / 'a_file'}: {tmp_path / 'a_file'} exists and is not a folder",
        (tmp_path / "a_file" / "sub", "--version=1"):
            f"--export_base {tmp_path / 'a_file' / 'sub'}: {tmp_path / 'a_file'} is a file, not a folder",
    }
    if os.geteuid() != 0:  # root writes through a chmod; the file cases hold for root too
        (tmp_path / "read_only").mkdir(mode=0o555)
        cases[(tmp_path / "read_only" / "export", "--version=1")] = (
            f"cannot write in {tmp_path / 'read_only'} (permission denied)")
    runs = {case: electra_export(f"--checkpoint={tmp_path / 'never_read'}", f"--export_base={case[0]}", case[1])
            for case in cases}
    for case, run in runs.items():
        line = one_line_error(run)
        assert line.startswith(f"electra-export: error: {cases[case]}"), (case, line)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "a_file", "export", "export/electra", "export/electra/3", "export/electra/3/saved_model.pb",
        *(["read_only"] if os.geteuid() != 0 else [])]


def test_the_library_refuses_the_same_versions(tmp_path):
    from electra_tf import export as E
    from electra_tf.files import LinkedFolderError

    (tmp_path / "m" / "7").mkdir(parents=True)
    for version in (2**63, 0, -1, True, 1.5):
        with pytest.raises(ValueError, match=r"version must be an integer from 1 to 9223372036854775807"):
            E.check_version(str(tmp_path), "m", version)
    E.check_version(str(tmp_path), "m", 2**63 - 1)
    with pytest.raises(FileExistsError, match="never overwritten"):
        E.check_version(str(tmp_path), "m", 7)
    (tmp_path / "m" / "0012").mkdir()  # TF Serving's version 12
    with pytest.raises(FileExistsError, match="m/0012 exists; versions are never overwritten"):
        E.check_version(str(tmp_path), "m", 12)
    (tmp_path / "linked").symlink_to(tmp_path / "m")
    with pytest.raises(LinkedFolderError, match="symbolic link"):
        E.check_version(str(tmp_path), "linked", 1)
    # Folders a server does not read as versions do not set the next one.
    (tmp_path / "m" / "99999999999999999999").mkdir()
    (tmp_path / "m" / "\u0661\u0662").mkdir()  # Arabic-Indic digits: str.isdigit() says yes
    assert E.next_version(str(tmp_path / "m")) == 13
    (tmp_path / "m" / str(2**63 - 1)).mkdir()
    with pytest.raises(ValueError, match="the largest TF Serving reads"):
        E.next_version(str(tmp_path / "m"))


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """A tiny classification head as electra-finetune saves it (model_dir/best/)."""
    from electra_tf.config import ElectraConfig
    from electra_tf.finetune.config import FinetuningConfig
    from electra_tf.finetune.heads import SentenceClassifier
    from electra_tf.finetune.saving import describe_finetuned, save_finetuned
    from electra_tf.finetune.tasks import Task

    root = tmp_path_factory.mktemp("finetuned")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]) + "\n")
    config = ElectraConfig.from_json("electra_tiny").with_vocab(str(vocab))
    head = SentenceClassifier(config, num_labels=2)
    task = Task("sentiment", "classification", ("neg", "pos"))
    save_finetuned(head, root / "model" / "best", describe_finetuned(head, task, FinetuningConfig(max_seq_length=16)),
                   str(vocab))
    return root / "model"


@pytest.mark.slow  # two exports of the binary, the first killed early (~35 s)
@pytest.mark.real_process  # kill -9 at a chosen moment: the command must die with the process held
def test_a_killed_exports_staging_is_removed_by_the_next_export_of_any_name(finetuned, tmp_path):
    """Killed (kill -9) as soon as its staging folder appears in the base; the next export, of
    another name and version, removes it, keeps what is not an abandoned staging folder (a live
    export's, held; a user's hidden folders; a link named like a staging folder, and its target),
    and its version loads. The server never lists a staging folder as a version."""
    import tensorflow as tf

    from electra_tf import files
    from electra_tf.serving.versions import version_of

    base = tmp_path / "export"
    base.mkdir()
    live = base / ".other-export-abcd1234"  # another export in progress, holding its folder
    live.mkdir()
    held = files.hold(live)
    user = [base / ".mine", base / ".b-export-notours"]  # not the staging pattern
    for folder in user:
        folder.mkdir()
        (folder / "keep.txt").write_text("mine")
    target = tmp_path / "linked_target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    (base / ".c-export-linkname").symlink_to(target)

    def staging():
        return [n for n in os.listdir(base) if n.startswith(".a-export-")]

    try:
        run = electra_export(f"--checkpoint={finetuned}", f"--export_base={base}", "--model_name=a", "--version=5",
                             "--ids_only")
        while run.poll() is None and not staging():
            time.sleep(0.0005)
        assert run.poll() is None, run.communicate()[1][-3000:]
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)
        dead = staging()
        assert dead and not (base / "a" / "5").exists()
        assert [version_of(n) for n in os.listdir(base)] == [None] * len(os.listdir(base))  # a server skips them

        run = electra_export(f"--checkpoint={finetuned}", f"--export_base={base}", "--model_name=b", "--version=2",
                             "--ids_only")
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-3000:]
        assert staging() == []
        assert sorted(os.listdir(base)) == sorted([".b-export-notours", ".c-export-linkname", ".mine", live.name, "b"])
        assert all((folder / "keep.txt").read_text() == "mine" for folder in [*user, target])
        assert [version_of(n) for n in os.listdir(base / "b")] == [2]
        loaded = tf.saved_model.load(str(base / "b" / "2"))
        outputs = loaded.signatures["serving_default"](
            input_ids=tf.constant([[2, 5, 3]]), input_mask=tf.constant([[1, 1, 1]]), segment_ids=tf.constant([[0, 0, 0]]))
        assert outputs["logits"].shape == (1, 2)
    finally:
        os.close(held)


def test_malformed_finetuned_files_are_one_line_naming_the_file_and_the_field(finetuned, tmp_path):
    from electra_tf import export as E

    def copy(name):
        shutil.copytree(finetuned, tmp_path / name)
        return tmp_path / name

    def edit(folder, change):
        path = folder / "best" / "head_config.json"
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))
        return path

    cases = {}
    f = copy("empty")
    (f / "best" / "head_config.json").write_text("{}")
    cases["empty"] = (f, f / "best" / "head_config.json", "field(s) family, head, head_config, max_seq_length missing")
    f = copy("not_object")
    (f / "best" / "head_config.json").write_text('"text"')
    cases["not_object"] = (f, f / "best" / "head_config.json", "expected a JSON object, got str")
    f = copy("nested")
    (f / "best" / "head_config.json").write_text("[" * 100_000)
    cases["nested"] = (f, f / "best" / "head_config.json", "nested deeper")
    f = copy("encoder_type")
    cases["encoder_type"] = (f, edit(f, lambda v: v["head_config"]["config"].update(hidden_size="64")),
                             "field 'head_config.config': ElectraConfig.hidden_size: must be an integer")
    f = copy("encoder_size")
    cases["encoder_size"] = (f, edit(f, lambda v: v["head_config"]["config"].update(hidden_size=128)),
                             "does not describe the checkpoint beside it")
    f = copy("results")
    shutil.move(f / "best", f / "seed_1")
    (f / "results.json").write_text(json.dumps({"best_model": ["seed_1"]}))
    cases["results"] = (f, f / "results.json", "field 'best_model' must be a folder name")
    for case, (folder, path, words) in cases.items():
        with pytest.raises(ValueError) as info:
            E.export_finetuned(str(folder), str(tmp_path / "out"), "m", verbose=False)
        message = str(info.value)
        assert "\n" not in message and str(path) in message and words in message, (case, message)
    assert not (tmp_path / "out").exists()
    run = electra_export(f"--checkpoint={cases['empty'][0]}", f"--export_base={tmp_path / 'out'}")
    assert one_line_error(run) == f"electra-export: {cases['empty'][1]}: {cases['empty'][2]}"
