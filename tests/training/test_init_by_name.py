"""`electra-pretrain --init_checkpoint` and `electra-finetune --init_checkpoint` given Hugging Face
Hub ids (electra_tf/convert/names.py), offline, from a cache filled as huggingface_hub lays it
out (tests/hub_caches.py): each run equals the same run from the folders the ids name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from electra_tf.config import ElectraConfig
from electra_tf.convert import hf
from electra_tf.models import ElectraPretrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hub_caches  # noqa: E402

DISC, GEN = "someone/electra-tiny-discriminator", "someone/electra-tiny-generator"
MAIN, V1 = hub_caches.commit_id("tiny main"), hub_caches.commit_id("tiny v1")


@pytest.fixture(scope="module")
def released(tmp_path_factory, pretrain_vocab):
    """A tiny pretrained pair on the shards' vocabulary, `main` and a tag `v1` (other weights), as
    Hugging Face folders and in a Hugging Face cache."""
    root = tmp_path_factory.mktemp("released")
    config = ElectraConfig.from_json("electra_tiny").with_vocab(pretrain_vocab)
    for tag, seed in (("main", 1), ("v1", 2)):
        hf.export_hf(ElectraPretrainer(config, seed=seed), root / tag, vocab_file=pretrain_vocab,
                     lower_case=True)
    cache = root / "hf_cache"
    hub_caches.put_hf_snapshot(cache, DISC, root / "main" / "discriminator", MAIN)
    hub_caches.put_hf_snapshot(cache, DISC, root / "v1" / "discriminator", V1, refs=("v1",))
    hub_caches.put_hf_snapshot(cache, GEN, root / "main" / "generator", MAIN)
    return root, cache


def _pretrain(th, flags, env):
    process = th.pretrain_process(flags, env=env)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]


@pytest.mark.slow  # two short pretraining runs, each a fresh process
def test_pretrain_continues_a_hub_pair_as_from_its_folders(released, pretrain_shards, tmp_path, th):
    root, cache = released
    env = hub_caches.offline_env(cache)
    runs = {"ids": [f"--init_checkpoint={DISC}", f"--init_generator={GEN}"],
            "folders": [f"--init_checkpoint={root / 'main' / 'discriminator'}",
                        f"--init_generator={root / 'main' / 'generator'}"]}
    for name, init in runs.items():
        flags = [f for f in th.tiny_flags(pretrain_shards, None, str(tmp_path / name),
                                          num_train_steps=2, save_checkpoints_steps=2)
                 if not f.startswith("--vocab_file")]
        _pretrain(th, flags + init, env)
    ids, folders = (th.checkpoint_weights(str(tmp_path / name / "ckpt-2")) for name in runs)
    assert ids.keys() == folders.keys() and len(ids) > 20
    for name, value in folders.items():
        np.testing.assert_array_equal(ids[name], value, err_msg=name)
    record = json.loads((tmp_path / "ids" / "pretraining_config.json").read_text())
    init = record["init_checkpoint"]
    assert init["format"] == "hf" and init["networks"] == "generator and discriminator"
    assert init["released"] == {"name": DISC, "source": "huggingface", "revision": MAIN,
                                "folder": init["path"]}
    assert init["path"].startswith(str(cache)) and init["path"].endswith(f"snapshots/{MAIN}")


def _finetune(args, env):
    return subprocess.run([sys.executable, "-m", "electra_tf.tools.finetune", *args], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # two short fine-tuning runs, each a fresh process
def test_finetune_starts_from_a_hub_revision_as_from_its_folder(released, tmp_path):
    root, cache = released
    env = hub_caches.offline_env(cache)
    train = tmp_path / "train.csv"
    rows = ["the film is good", "a bad film", "good acting and a good story", "bad bad bad",
            "i liked it", "it was awful"] * 4
    train.write_text("text,label\n" + "".join(f"{t},{'pos' if k % 2 == 0 else 'neg'}\n"
                                              for k, t in enumerate(rows)))
    common = ["--task=classification", f"--train_file={train}", f"--eval_file={train}",
              "--text_column=text", "--label_column=label", "--num_train_epochs=2",
              "--train_batch_size=8", "--max_seq_length=16", "--seed=3"]
    results = {}
    for name, init in (("id", f"{DISC}@v1"), ("folder", str(root / "v1" / "discriminator"))):
        proc = _finetune(common + [f"--init_checkpoint={init}",
                                   f"--model_dir={tmp_path / name}"], env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "results.json").read_text())["runs"][0]
    assert results["id"]["history"] == results["folder"]["history"]
    assert results["id"]["best"] == results["folder"]["best"]
    assert results["id"]["lower_case"] is True
    assert results["id"]["init_checkpoint"].endswith(f"snapshots/{V1}")
    # Unknown offline: one line, nothing of a run left behind.
    proc = _finetune(common + ["--init_checkpoint=someone/not-there",
                               f"--model_dir={tmp_path / 'none'}"], env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("electra-finetune: error: someone/not-there: not a local path, and "
                           "the machine is offline (HF_HUB_OFFLINE=1)"), last
    assert not (tmp_path / "none").exists()


PRESET = "electra_small_discriminator_uncased_en"
KAGGLE = "keras/electra/keras/electra_small_discriminator_uncased_en/2"


@pytest.fixture(scope="module")
def preset(released, tmp_path_factory):
    """`main`'s discriminator as a keras-hub preset folder, and a kagglehub cache serving it
    under the built-in preset's name."""
    pytest.importorskip("keras_hub", reason="the keras_hub extra")
    pytest.importorskip("kagglehub", reason="keras-hub's Kaggle downloader")
    from electra_tf.convert.pretrained import to_keras_hub_preset

    root, _ = released
    folder = tmp_path_factory.mktemp("preset") / "tiny_preset"
    to_keras_hub_preset(str(root / "main" / "discriminator"), folder)
    kaggle = folder.parent / "kaggle_cache"
    hub_caches.put_kaggle_model(kaggle, KAGGLE, folder)
    return folder, kaggle


@pytest.mark.slow  # three commands with the name in fresh processes, and from the folder
def test_every_command_takes_a_keras_hub_preset_name(released, preset, pretrain_shards, tmp_path,
                                                     th):
    folder, kaggle = preset
    env = hub_caches.offline_env(released[1], kaggle)
    # electra-convert; the folder's conversion, the reference, in this process (the same call)
    from electra_tf.convert.pretrained import convert

    proc = subprocess.run([sys.executable, "-m", "electra_tf.tools.convert", f"--input={PRESET}",
                           f"--output={tmp_path / 'convert' / 'name'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    convert(str(folder), str(tmp_path / "convert" / "folder"))
    assert th.folder_hashes(tmp_path / "convert" / "name") == \
        th.folder_hashes(tmp_path / "convert" / "folder")
    # electra-pretrain (the preset has no RTD head and no generator: both start from the seed)
    for name, source in (("name", PRESET), ("folder", folder)):
        flags = [f for f in th.tiny_flags(pretrain_shards, None, str(tmp_path / "pt" / name),
                                          num_train_steps=2, save_checkpoints_steps=2)
                 if not f.startswith("--vocab_file")]
        _pretrain(th, flags + [f"--init_checkpoint={source}"], env)
    ids, folders = (th.checkpoint_weights(str(tmp_path / "pt" / name / "ckpt-2"))
                    for name in ("name", "folder"))
    assert ids.keys() == folders.keys()
    for key, value in folders.items():
        np.testing.assert_array_equal(ids[key], value, err_msg=key)
    record = json.loads((tmp_path / "pt" / "name" / "pretraining_config.json").read_text())
    assert record["init_checkpoint"]["format"] == "keras_hub"
    assert record["init_checkpoint"]["released"] == {
        "name": PRESET, "source": "keras_hub", "revision": "2",
        "folder": record["init_checkpoint"]["path"]}
    assert record["init_checkpoint"]["path"].startswith(str(kaggle))
    # electra-finetune (vocabulary and casing from the preset's tokenizer)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in (
        ("the film is good", "pos"), ("a bad film", "neg"), ("i liked it", "pos"),
        ("it was awful", "neg")) * 4))
    results = {}
    for name, source in (("name", PRESET), ("folder", folder)):
        proc = _finetune(["--task=classification", f"--train_file={train}",
                          f"--eval_file={train}", "--text_column=text", "--label_column=label",
                          "--num_train_epochs=1", "--train_batch_size=8", "--max_seq_length=16",
                          f"--init_checkpoint={source}", f"--model_dir={tmp_path / 'ft' / name}"],
                         env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[name] = json.loads((tmp_path / "ft" / name / "results.json").read_text())["runs"][0]
    assert results["name"]["history"] == results["folder"]["history"]
    assert results["name"]["lower_case"] is True
