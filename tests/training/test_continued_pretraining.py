"""Continued pretraining (--init_checkpoint): from a TF1 release, a Hugging Face pair or folder,
or an electra_tf folder, with the shards of tests/training/conftest.py.

The checkpoints are written by tests/convert/convert_fixtures.py in the released layouts (names
and shapes of the authors' `run_pretraining.py`, HF names of `modeling_electra.py`), from known
random values, at a tiny size whose vocabulary is the shards' learned one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf import run_folder
from electra_tf.config import ConfigError
from electra_tf.convert import hf
from electra_tf.convert.pretrained import from_pretrained, save_electra_checkpoint
from electra_tf.data import pipeline
from electra_tf.models import ElectraPretrainer
from electra_tf.training import run_setup
from electra_tf.training.loop import run_pretraining
from electra_tf.training.strategy import create_strategy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "convert"))
import convert_fixtures as fx  # noqa: E402

SIZES = dict(emb=32, hidden=128, layers=2, ffn=512, max_pos=64)


def vocab_size(vocab_file) -> int:
    return len(open(vocab_file, encoding="utf-8").read().split("\n")) - 1


@pytest.fixture(scope="module")
def release_tensors(pretrain_vocab):
    """A pretraining checkpoint's weights: generator 1/2 wide, embeddings shared."""
    return fx.random_tensors(fx.released_shapes(vocab=vocab_size(pretrain_vocab), **SIZES,
                                                gen_hidden=64, gen_layers=2))


@pytest.fixture(scope="module")
def release(tmp_path_factory, release_tensors, pretrain_vocab) -> str:
    """A released-archive-like folder: checkpoint with Adam slots and global_step, vocab.txt."""
    folder = tmp_path_factory.mktemp("release")
    fx.write_tf1(folder, fx.with_training_state(release_tensors, step=1_000_000))
    shutil.copy(pretrain_vocab, folder / "vocab.txt")
    return str(folder)


@pytest.fixture(scope="module")
def release_discriminator(tmp_path_factory, release_tensors, pretrain_vocab) -> str:
    """The same weights without the generator (e.g. a discriminator-only release)."""
    folder = tmp_path_factory.mktemp("release_disc")
    fx.write_tf1(folder, {name: value for name, value in release_tensors.items()
                          if not name.startswith("generator")})
    shutil.copy(pretrain_vocab, folder / "vocab.txt")
    return str(folder)


def run_values(**changes):
    values = dict(train_batch_size=8, num_train_steps=1, learning_rate=1e-3, num_warmup_steps=1,
                  steps_per_loop=1, save_checkpoints_steps=1, summary_steps=1, seed=5,
                  shuffle_buffer=64)
    values.update(changes)
    return values


def weights_by_path(model) -> dict[str, np.ndarray]:
    return {v.path: v.numpy() for v in model.trainable_variables}


@pytest.mark.slow
def test_step_0_of_a_continued_run_has_the_checkpoints_loss_and_a_rerun_resumes(
        release, pretrain_shards, tmp_path, caplog):
    setup = run_setup.resolve_run(pretrain_shards, config_given=False, init_checkpoint=release,
                                  run_values=run_values())
    model_dir = str(tmp_path / "run")
    result = run_pretraining(setup.model_config, setup.config, pretrain_shards,
                                         model_dir, create_strategy("one_device"),
                                         vocab_file=setup.vocab_file, init=setup.init,
                                         run_facts=setup.record)
    assert result.step == 1  # the optimizer started at 0, not at the release's global_step
    assert setup.model_config.hidden_size == 128 and setup.model_config.cls_token_id == 2

    # The same loss, computed from the checkpoint directly. The run's step 1 evaluates the loss
    # at the loaded weights, on the stream's first batch, with the step seed (seed, 0) and with
    # dropout on (the config's 0.1): the reference reproduces that dropout by building its
    # pretrainer as the run does, right after keras.utils.set_random_seed(seed), so its dropout
    # seed-generator states are the run's.
    loaded, loaded_config, _ = from_pretrained(release, "pretrainer")
    assert loaded_config == setup.model_config
    keras.utils.set_random_seed(5)
    reference = ElectraPretrainer(setup.model_config, seed=5)
    source = weights_by_path(loaded)
    for variable in reference.trainable_variables:
        variable.assign(source[variable.path])
    batch = next(iter(pipeline.dataset_fn(
        pretrain_shards, 8, 32, seed=5, shuffle_buffer=64)(tf.distribute.InputContext())))
    out = reference.compute_objective(batch, tf.constant([5, 0], tf.int64), training=True)
    np.testing.assert_allclose(result.metrics["loss"], float(out["loss"]), rtol=1e-5)
    record = json.loads(open(os.path.join(model_dir, run_folder.RECORD_FILE)).read())
    assert record["init_checkpoint"] == {"path": release, "format": "tf1",
                                         "networks": "generator and discriminator"}

    # The same command again, with more steps: it resumes from model_dir, not from the release.
    again = run_setup.resolve_run(pretrain_shards, config_given=False, init_checkpoint=release,
                                  run_values=run_values(num_train_steps=2))
    caplog.clear()
    with caplog.at_level("INFO"):
        result = run_pretraining(again.model_config, again.config, pretrain_shards,
                                             model_dir, create_strategy("one_device"),
                                             init=again.init, run_facts=again.record)
    assert f"model_dir {model_dir} has checkpoints: resuming from them; --init_checkpoint " \
        f"{release} is ignored" in caplog.text
    assert f"Resumed from {model_dir}/ckpt-1 at step 1" in caplog.text
    assert "Initialised" not in caplog.text
    assert result.step == 2

    # The run folder itself can start another run: both networks, from its newest checkpoint.
    from_run = run_setup.load_initial_weights(model_dir)
    assert from_run.has_generator and from_run.format == "electra_tf"
    trained = weights_by_path(result.model)
    for path, value in weights_by_path(from_run.source).items():
        np.testing.assert_array_equal(value, trained[path], err_msg=path)


def test_hugging_face_and_electra_tf_folders_give_the_releases_weights(release, tmp_path):
    expected = weights_by_path(run_setup.load_initial_weights(release).source)
    loaded, config, vocab = from_pretrained(release, "pretrainer")
    hf.export_hf(loaded, tmp_path / "hf", vocab_file=vocab)
    save_electra_checkpoint(loaded, config, tmp_path / "ours", vocab_file=vocab)
    for init in (run_setup.load_initial_weights(tmp_path / "hf"),  # pretrainer folder
                 run_setup.load_initial_weights(tmp_path / "hf" / "discriminator",
                                                tmp_path / "hf" / "generator"),  # the pair
                 run_setup.load_initial_weights(tmp_path / "ours")):
        assert init.has_generator and init.vocab_file is not None, init.path
        assert init.config == config, init.path
        got = weights_by_path(init.source)
        assert set(got) == set(expected), init.path
        for path, value in expected.items():
            np.testing.assert_allclose(got[path], value, rtol=0, atol=0, err_msg=path)
    with pytest.raises(ConfigError, match=r"holds a generator; give the discriminator's folder "
                                          r"as --init_checkpoint and this one as --init_generator"):
        run_setup.load_initial_weights(tmp_path / "hf" / "generator")


def test_a_discriminator_alone_gets_a_random_generator_sharing_its_embeddings(
        release_discriminator, release_tensors, pretrain_shards, caplog):
    setup = run_setup.resolve_run(pretrain_shards, config_given=False,
                                  init_checkpoint=release_discriminator, run_values=run_values())
    assert not setup.init.has_generator
    keras.utils.set_random_seed(5)
    with create_strategy("mirrored").scope():  # the copy assigns mirrored variables
        model = ElectraPretrainer(setup.model_config, seed=5)
    initial = weights_by_path(model)
    with caplog.at_level("INFO"):
        setup.init.copy_into(model)
    assert (f"{release_discriminator} holds no generator: the generator (hidden 32, 2 layers: "
            "generator_hidden_size=0.25) starts from random weights (37 tensors, seed 5) and "
            "shares the loaded embeddings") in caplog.text
    after = weights_by_path(model)
    np.testing.assert_array_equal(after["discriminator/embeddings/word_embeddings"],
                                  release_tensors["electra/embeddings/word_embeddings"])
    np.testing.assert_array_equal(
        after["discriminator/encoder/layer_1/output/kernel"],
        release_tensors["electra/encoder/layer_1/output/dense/kernel"])
    # The generator embeds with the loaded table (one variable, shared)...
    gen_paths = [v.path for v in model.generator.trainable_variables]
    assert "discriminator/embeddings/word_embeddings" in gen_paths
    # ...and the rest of it is the run's own random initialisation.
    generator_own = [p for p in gen_paths if p.startswith("generator/")]
    assert len(generator_own) == 37
    for path in generator_own:
        np.testing.assert_array_equal(after[path], initial[path], err_msg=path)


def test_a_config_or_vocab_that_contradicts_the_checkpoint_is_named(
        release, pretrain_shards, pretrain_vocab, tmp_path):
    with pytest.raises(ConfigError) as info:
        run_setup.resolve_run(pretrain_shards, config_name="electra_tiny", config_given=True,
                              init_checkpoint=release)
    assert str(info.value) == (
        f"hidden_size: the model config asks for 64 but --init_checkpoint {release} has 128; "
        "leave --config out (the checkpoint's is used) or give one that matches it")
    with pytest.raises(ConfigError, match=r"^num_layers: the model config asks for 3 but "):
        run_setup.resolve_run(pretrain_shards, config_given=False, init_checkpoint=release,
                              overrides=["num_layers=3"])
    # A --config with the checkpoint's sizes is fine; its objective settings are used.
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"vocab_size": 30522, "embedding_size": 32, "hidden_size": 128,
                                  "num_layers": 2, "num_heads": 2, "intermediate_size": 512,
                                  "max_position_embeddings": 64, "generator_hidden_size": 0.5,
                                  "mask_prob": 0.25}))
    setup = run_setup.resolve_run(pretrain_shards, config_name=str(config), config_given=True,
                                  init_checkpoint=release)
    assert setup.model_config.mask_prob == 0.25 and setup.model_config.cls_token_id == 2
    # A vocabulary the checkpoint or the shards were not built with.
    bigger = tmp_path / "vocab.txt"
    bigger.write_text(open(pretrain_vocab).read() + "zzzz\n")
    with pytest.raises(ConfigError, match=rf"^vocab_size: {bigger} has \d+ tokens but "
                                          rf"--init_checkpoint {release} has \d+ word embeddings"):
        run_setup.resolve_run(pretrain_shards, config_given=False, init_checkpoint=release,
                              vocab_file=str(bigger))
    swapped = tmp_path / "swapped"
    shutil.copytree(release, swapped)
    tokens = open(pretrain_vocab).read().split("\n")
    tokens[10], tokens[11] = tokens[11], tokens[10]
    (swapped / "vocab.txt").write_text("\n".join(tokens))
    with pytest.raises(ConfigError, match=r"^vocabulary: the checkpoint's .*swapped/vocab.txt "
                                          r".* is not the one the shards were built with"):
        run_setup.resolve_run(pretrain_shards, config_given=False, init_checkpoint=str(swapped))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_binary_names_the_field_a_config_contradicts(release, pretrain_shards, tmp_path, th):
    flags = [f for f in th.tiny_flags(pretrain_shards, None, str(tmp_path / "run"))
             if not f.startswith("--vocab_file")]
    process = th.pretrain_process(flags + [f"--init_checkpoint={release}"])
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("electra-pretrain: error: ")]
    assert errors == [(f"electra-pretrain: error: hidden_size: the model config asks for 64 but --init_checkpoint "
                       f"{release} has 128; leave --config out (the checkpoint's is used) or "
                       "give one that matches it")]
    assert not os.path.exists(tmp_path / "run")
