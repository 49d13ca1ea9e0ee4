"""electra_tf/training/run_setup.py: the shards' manifest.json fills what a run needs.

The shards of tests/training/conftest.py are a real `build_pretraining_data` build with a vocab
learned from IMDB text, whose [CLS]/[SEP]/[MASK] sit at 2/3/4: there, BERT's 101/102/103 are
ordinary word pieces, and a run that assumed them would mask [CLS] and [SEP] as words.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf import run_folder
from electra_tf.config import ConfigError, ElectraConfig
from electra_tf.data import pipeline
from electra_tf.data.text_files import BadInputError
from electra_tf.data.tokenizer import file_sha256
from electra_tf.models import ElectraPretrainer
from electra_tf.training import run_setup
from electra_tf.training.loop import run_pretraining
from electra_tf.training.strategy import create_strategy

SPECIAL_TOKENS = {"pad_token_id": "[PAD]", "cls_token_id": "[CLS]", "sep_token_id": "[SEP]",
                  "mask_token_id": "[MASK]"}


def learned_ids(vocab_file) -> dict:
    tokens = open(vocab_file, encoding="utf-8").read().split("\n")
    return {name: tokens.index(token) for name, token in SPECIAL_TOKENS.items()}


def first_batch(pattern, seq_length, size=64):
    dataset = pipeline.dataset_fn(pattern, size, seq_length)(
        tf.distribute.InputContext())
    return next(iter(dataset))


def masked_special_positions(model_config, batch, cls_id, sep_id) -> int:
    """How many [CLS]/[SEP] positions the pretrainer built with `model_config` masks."""
    model = ElectraPretrainer(model_config.replace(hidden_dropout=0.0, attention_dropout=0.0))
    masked = model.compute_objective(batch, tf.constant([0, 0], tf.int64))["masked"].is_masked
    ids = batch["input_ids"].numpy()
    return int(np.sum(masked.numpy() & ((ids == cls_id) | (ids == sep_id))))


def test_the_manifest_gives_length_vocab_size_and_the_learned_special_ids(
        pretrain_shards, pretrain_vocab, caplog):
    with caplog.at_level("INFO"):
        setup = run_setup.resolve_run(pretrain_shards, config_name="electra_tiny")
    manifest_path = os.path.join(os.path.dirname(pretrain_shards), "manifest.json")
    ids = learned_ids(pretrain_vocab)
    assert ids == {"pad_token_id": 0, "cls_token_id": 2, "sep_token_id": 3, "mask_token_id": 4}
    config = setup.model_config
    assert {n: getattr(config, n) for n in ids} == ids
    assert config.vocab_size == len(open(pretrain_vocab).read().split())
    assert setup.config.max_seq_length == 32  # not the paper's 128 for the size
    assert setup.record == {"data_manifest": manifest_path, "lower_case": True,
                            "vocab_sha256": file_sha256(pretrain_vocab), "init_checkpoint": None}
    assert setup.vocab_file == os.path.abspath(pretrain_vocab)  # the manifest's, still in place
    assert f"vocabulary from {manifest_path}: vocab_size {config.vocab_size}, [CLS]=2 [SEP]=3 " \
        "[MASK]=4 [PAD]=0" in caplog.text

    # The pretrainer masks with those ids: never [CLS] or [SEP]. BERT's ids (what a run without
    # the manifest and without --vocab_file assumed) let it mask them as words.
    batch = first_batch(pretrain_shards, 32)
    assert masked_special_positions(config, batch, 2, 3) == 0
    bert_ids = ElectraConfig.from_json("electra_tiny").replace(vocab_size=config.vocab_size + 200)
    assert masked_special_positions(bert_ids, batch, 2, 3) > 0


def test_flags_that_contradict_the_manifest_are_one_line_errors_naming_both(
        pretrain_shards, pretrain_vocab, tmp_path):
    manifest_path = os.path.join(os.path.dirname(pretrain_shards), "manifest.json")
    with pytest.raises(ConfigError) as info:
        run_setup.resolve_run(pretrain_shards, config_name="electra_tiny",
                              run_values={"max_seq_length": 128})
    assert str(info.value) == ("max_seq_length: --max_seq_length=128 but the shards were built "
                               f"with max_seq_length=32 ({manifest_path})")
    other = tmp_path / "vocab.txt"
    other.write_text(open(pretrain_vocab).read() + "zzzz\n")
    with pytest.raises(ConfigError) as info:
        run_setup.resolve_run(pretrain_shards, config_name="electra_tiny",
                              vocab_file=str(other))
    assert str(info.value) == (
        f"vocabulary: --vocab_file ({other}, sha256 {file_sha256(str(other))[:12]}...) is not the "
        f"one the shards were built with (sha256 {file_sha256(pretrain_vocab)[:12]}..., "
        f"{manifest_path})")
    with pytest.raises(ConfigError, match=r"^cls_token_id: the model config has 7 but the shards "
                                          r"were built with cls_token_id=2 \("):
        run_setup.resolve_run(pretrain_shards, config_name="electra_tiny",
                              overrides=["cls_token_id=7"])
    # Agreeing values are fine: the same length, the same vocab file.
    setup = run_setup.resolve_run(pretrain_shards, config_name="electra_tiny",
                                  run_values={"max_seq_length": 32}, vocab_file=pretrain_vocab)
    assert setup.model_config.cls_token_id == 2 and setup.vocab_file == pretrain_vocab


def test_shards_from_two_builds_must_agree(pretrain_shards, tmp_path):
    for name in ("a", "b"):
        shutil.copytree(os.path.dirname(pretrain_shards), tmp_path / name)
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    pattern = f"{tmp_path}/a/pretrain_data.tfrecord-*,{tmp_path}/b/pretrain_data.tfrecord-*"
    assert run_setup.resolve_run(pattern, config_name="electra_tiny").config.max_seq_length == 32
    manifest["lower_case"] = False
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadInputError) as info:
        run_setup.resolve_run(pattern, config_name="electra_tiny")
    assert str(info.value) == (
        f"the shards come from builds that differ: lower_case is True in {tmp_path}/a/"
        f"manifest.json but False in {tmp_path}/b/manifest.json; pretrain on one of them")
    (tmp_path / "b" / "manifest.json").write_text("{not json")
    with pytest.raises(BadInputError, match=r"b/manifest.json: unreadable"):
        run_setup.resolve_run(pattern, config_name="electra_tiny")


@pytest.mark.slow
def test_shards_without_a_manifest_still_run_and_the_assumed_ids_are_logged(
        pretrain_shards, tmp_path, caplog):
    folder = tmp_path / "authors_tool"
    folder.mkdir()
    for path in glob.glob(pretrain_shards):
        shutil.copy(path, folder)
    pattern = str(folder / "pretrain_data.tfrecord-*")
    with caplog.at_level("INFO"):
        setup = run_setup.resolve_run(
            pattern, config_name="electra_tiny",
            run_values=dict(max_seq_length=32, train_batch_size=8, num_train_steps=1,
                            num_warmup_steps=0, steps_per_loop=1))
    assert "no manifest.json beside the shards and no --vocab_file: assuming the BERT uncased " \
        "vocabulary's special ids ([PAD]=0 [CLS]=101 [SEP]=102 [MASK]=103, vocab_size 30522)" \
        in caplog.text
    assert setup.record["data_manifest"] is None and setup.record["lower_case"] is None
    result = run_pretraining(setup.model_config, setup.config, pattern,
                                         str(tmp_path / "run"), create_strategy("one_device"),
                                         run_facts=setup.record)
    assert result.step == 1 and np.isfinite(result.metrics["loss"])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_binary_needs_neither_vocab_nor_length_with_a_manifest(pretrain_shards,
                                                                   pretrain_vocab, tmp_path, th):
    model_dir = str(tmp_path / "run")
    flags = [f for f in th.tiny_flags(pretrain_shards, pretrain_vocab, model_dir,
                                      num_train_steps=2)
             if not f.startswith(("--vocab_file", "--max_seq_length"))]
    process = th.pretrain_process(flags)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    record = json.loads(open(os.path.join(model_dir, run_folder.RECORD_FILE)).read())
    assert record["model_config"]["cls_token_id"] == 2
    assert record["pretraining_config"]["max_seq_length"] == 32
    assert record["lower_case"] is True
    assert record["vocab_sha256"] == file_sha256(pretrain_vocab)
    exported = os.path.join(model_dir, "discriminator", "vocab.txt")
    assert open(exported).read() == open(pretrain_vocab).read()

    process = th.pretrain_process(flags + ["--max_seq_length=64", f"--model_dir={tmp_path}/x"])
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    errors = [line for line in out.splitlines() if line.startswith("electra-pretrain: error: ")]
    assert errors == [(f"electra-pretrain: error: max_seq_length: --max_seq_length=64 but the shards were built "
                       f"with max_seq_length=32 "
                       f"({os.path.dirname(pretrain_shards)}/manifest.json)")]
    assert "Traceback" not in out
    assert not os.path.exists(tmp_path / "x")


def test_the_binarys_choices_come_from_a_module_without_tensorflow(th):
    """tools/pretrain.py takes its choices from training/config.py, so --help stays fast."""
    check = ("import sys, electra_tf.tools.pretrain as t, electra_tf.training.config as c; "
             "assert t.STRATEGIES is c.STRATEGIES and t.OPTIMIZERS is c.OPTIMIZERS; "
             "assert 'tensorflow' not in sys.modules, 'training/config.py imported TensorFlow'")
    done = subprocess.run([sys.executable, "-c", check], cwd=th.repo, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
