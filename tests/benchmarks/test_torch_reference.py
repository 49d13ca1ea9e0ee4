"""benchmarks/torch_reference.py: the Hugging Face PyTorch ELECTRA step our benchmark times as a reference.

The step tests need torch and transformers (`pip install -e '.[anchors]'`) and skip without them;
the `available()` tests run everywhere.
"""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from benchmarks import row_worker, torch_reference

CLS, SEP, MASK = 2, 3, 4


@pytest.fixture(scope="module")
def torch():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    reason = torch_reference.available()
    if reason:
        pytest.skip(reason)
    import torch

    return torch


@pytest.fixture(scope="module")
def config():
    return ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=512, pad_token_id=0, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK)


def make_batch(lengths, seq_length=16, seed=0):
    """[CLS] w... [SEP] then padding, as numpy int32; segment 1 on the second half."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), seq_length), np.int32)
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(5, 512, n)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
        segments[row, n // 2:n] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


@pytest.fixture(scope="module")
def step(torch, config):
    # The benchmark's batches are dicts of int32 tf tensors: use the same type here.
    batches = [{k: tf.constant(v) for k, v in make_batch([16, 9], seed=s).items()}
               for s in range(2)]
    fn, per_call = torch_reference.torch_step(config, batches, threads=1)
    assert per_call == 1
    return fn


def test_step_runs_with_finite_loss_and_changes_parameters(torch, step):
    watched = {
        "discriminator query": step.discriminator.electra.encoder.layer[0].attention.self.query.weight,
        "generator FFN": step.generator.electra.encoder.layer[0].intermediate.dense.weight,
        "shared word embeddings": step.generator.electra.embeddings.word_embeddings.weight,
        "rtd head": step.discriminator.discriminator_predictions.dense_prediction.weight,
        "lm head bias": step.generator.generator_lm_head.bias,
    }
    before = {name: w.detach().clone() for name, w in watched.items()}
    losses = [step() for _ in range(2)]
    assert all(isinstance(x, float) and np.isfinite(x) for x in losses), losses
    for name, w in watched.items():
        assert not torch.equal(before[name], w.detach()), f"{name} did not change"


def test_embeddings_shared_and_lm_head_tied(step):
    gen, disc = step.generator, step.discriminator
    assert disc.electra.embeddings is gen.electra.embeddings
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    # The optimizer holds each shared tensor once.
    ids = [id(p) for group in step.optimizer.param_groups for p in group["params"]]
    assert len(ids) == len(set(ids)) == len(step.parameters)


def test_sizes_and_parameter_counts_match_ours(step, config):
    from electra_tf.models import Discriminator, ElectraPretrainer

    gen_config = config.generator_config()
    hf_gen, hf_disc = step.generator.config, step.discriminator.config
    assert (hf_gen.hidden_size, hf_gen.num_attention_heads, hf_gen.intermediate_size,
            hf_gen.num_hidden_layers) == (gen_config.hidden_size, gen_config.num_heads,
                                          gen_config.intermediate_size, gen_config.num_layers)
    assert (hf_disc.hidden_size, hf_disc.embedding_size, hf_disc.vocab_size) == (
        config.hidden_size, config.embedding_size, config.vocab_size)
    assert hf_disc.hidden_act == "gelu" and hf_disc.hidden_dropout_prob == config.hidden_dropout
    # No documented difference in parameters: the counts are equal.
    disc_params = sum(p.numel() for p in step.discriminator.parameters())
    assert disc_params == Discriminator(config).count_params()
    assert step.info["parameters"] == ElectraPretrainer(config).count_params()


def test_masking_follows_our_count_rule(torch, config):
    lengths = [16, 9, 3, 12] * 50
    batch = {k: torch.from_numpy(v.astype(np.int64)) for k, v in make_batch(lengths).items()}
    ids, mask = batch["input_ids"], batch["input_mask"]
    slots = config.num_masked_slots(16)
    m = torch_reference.mask_tokens(ids, mask, config, slots, torch.Generator().manual_seed(0))
    live = m.live.numpy()
    expected = [max(1, min(slots, round(n * config.mask_prob))) for n in lengths]
    np.testing.assert_array_equal(live.sum(1), expected)
    np.testing.assert_array_equal(m.is_masked.numpy().sum(1), expected)  # distinct positions
    special = np.isin(ids.numpy(), (CLS, SEP, MASK)) | (mask.numpy() == 0)
    assert not (m.is_masked.numpy() & special).any()
    np.testing.assert_array_equal(m.positions.numpy()[~live], 0)
    rows = np.arange(len(lengths))[:, None]
    np.testing.assert_array_equal(m.targets.numpy(), ids.numpy()[rows, m.positions.numpy()])
    shown = (m.masked_ids != ids).numpy()
    assert (m.masked_ids.numpy()[shown] == MASK).all() and not (shown & ~m.is_masked.numpy()).any()
    assert 0.7 < shown.sum() / live.sum() < 0.95  # 85% show [MASK]


def test_matmul_seconds_follow_the_flop_count(torch):
    small, large = ((), 64, 64, 64, False, False), ((2,), 256, 256, 256, False, True)
    seconds = torch_reference.torch_matmul_seconds([small, large], target_seconds=0.01)
    assert set(seconds) == {small, large}
    assert 0 < seconds[small] < seconds[large]  # 128x the FLOPs


def test_worker_process_runs_steps_and_matmuls(torch, config, tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, config.vocab_size, (2, 16)).astype(np.int32)
    ids[:, 0], ids[:, -1] = CLS, SEP
    batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids)}
    row_worker.save_inputs(str(tmp_path), config, [batch], {})
    worker = row_worker.Worker([sys.executable, "-m", "benchmarks.torch_reference", str(tmp_path)],
                               "torch")
    try:
        assert worker.info["masked_slots"] == config.num_masked_slots(16)
        losses = [worker.steps(1), worker.steps(2)]
        assert all(np.isfinite(losses)) and losses[0] != losses[1]
        spec = ((), 8, 8, 8, False, True)
        assert worker.matmul_seconds([spec])[spec] > 0
    finally:
        assert worker.close() > 0  # peak resident MiB of the child


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_available_names_what_is_missing(monkeypatch, missing):
    try:
        import torch  # noqa: F401

        torch_installed = True
    except ImportError:
        torch_installed = False
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import <missing>` raise ImportError
    reason = torch_reference.available()
    assert isinstance(reason, str) and "\n" not in reason and "[anchors]" in reason
    # Without torch installed at all, torch is what is reported missing.
    assert reason.startswith(missing if torch_installed else "torch"), reason
    with pytest.raises(RuntimeError, match="unavailable"):
        torch_reference.torch_step(None, [])


def test_module_imports_without_torch():
    code = "import sys, benchmarks.torch_reference; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
