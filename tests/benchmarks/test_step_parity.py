"""One pretraining step of electra_tf equals the PyTorch reference's (benchmarks/torch_electra.py).

Both sides start from the same weights (copied across by the project's Hugging Face converter,
`electra_tf.convert.hf.hf_tensors`), see the same batches and exactly the randomness electra_tf
drew (masked positions, kept-original choices, Gumbel noise), with dropout off. Three optimizer
steps are taken, from a step inside the warmup (the first update of a run has learning rate 0):
the first from zero Adam moments, the others from the moments before them. At each step the
generator and discriminator losses, every parameter's gradient, and every weight after the update
(and the update itself) agree to 1e-5 relative; a weight may differ beyond that only by what the
gradients' measured difference explains through Adam's division by sqrt(v) (`Pair.sensitivity`:
a bias element whose gradient is near epsilon moves ~1e5 times its gradient's rounding). The
initial weights come from the pretraining seed, as in the binary. electra_tf's step is the binary's own: the
optimizer and model from `training.loop._build` and the loop from `steps.make_loop_fn`. With
dropout on, the step is compared in distribution (the last test).

Needs torch and transformers (`pip install -e '.[anchors]'`); skipped with that hint without them.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import keras
import tensorflow as tf

from benchmarks import torch_electra
from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import untuned
from electra_tf.convert.common import model_slots
from electra_tf.convert.hf import hf_name, hf_tensors
from electra_tf.models import masking
from electra_tf.models.objective_terms import sampling_seed
from electra_tf.training.config import PretrainingConfig
from electra_tf.training.loop import _build
from electra_tf.training.steps import make_loop_fn

PAD, CLS, SEP, MASK = 0, 2, 3, 4
VOCAB = 20  # small: the generator's samples are sometimes the original (labelled real)
SEQ = 24
START_STEP = 7  # inside the warmup: learning rate > 0 and still rising
TOLERANCE = 1e-5
ZERO_GRADIENT = re.compile(r"attention/self/key/bias$")


@pytest.fixture(scope="module")
def torch():
    reason = torch_electra.available()
    if reason:
        pytest.skip(f"the PyTorch reference cannot run: {reason}")
    import torch

    torch.set_num_threads(1)
    return torch


def batches(seed: int, count: int = 3, size: int = 8) -> list[dict]:
    """[CLS] a [SEP] b [SEP] then padding; varied lengths (one row full); segment 1 on b.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = np.zeros((size, SEQ), np.int32)
        mask, segments = np.zeros_like(ids), np.zeros_like(ids)
        for row in range(size):
            n = SEQ if row == 0 else int(rng.integers(8, SEQ))
            ids[row, :n] = rng.integers(5, VOCAB, n)
            half = n // 2
            ids[row, 0], ids[row, half], ids[row, n - 1] = CLS, SEP, SEP
            mask[row, :n] = 1
            segments[row, half + 1:n] = 1
        out.append({"input_ids": ids, "input_mask": mask, "segment_ids": segments})
    return out


def relative(ours, theirs) -> float:
    """||ours - theirs|| / ||theirs|| (absolute when theirs is 0)."""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    scale = np.linalg.norm(theirs)
    diff = np.linalg.norm(ours - theirs)
    return float(diff / scale) if scale > 0 else float(diff)


class Pair:
    """electra_tf's pretrainer as the binary builds it, and the reference with its weights."""

    def __init__(self, torch, config: ElectraConfig, total_steps=1000, warmup=50, beta_2=0.98,
                 jit_compile: bool = False):
        self.torch, self.config = torch, config
        train = PretrainingConfig(
            train_batch_size=8, num_train_steps=total_steps, learning_rate=3e-3,
            num_warmup_steps=warmup, max_seq_length=SEQ, adam_beta_2=beta_2, seed=11)
        self.strategy = tf.distribute.get_strategy()
        # As the binary does before building: the initial weights are a function of the seed, so
        # a failure reproduces (without it they came from the process's global random state).
        keras.utils.set_random_seed(train.seed)
        self.model, self.opt, _ = _build(config, train, self.strategy)
        self.opt.iterations.assign(START_STEP)
        self.loop = make_loop_fn(self.model, self.strategy, jit_compile=jit_compile)

        torch.manual_seed(0)
        self.ref = torch_electra.build_networks(config)
        # Our weights, through the converter, into both Hugging Face models.
        for ours, theirs in ((self.model.generator, self.ref.generator),
                             (self.model.discriminator, self.ref.discriminator)):
            tensors, _, _ = hf_tensors(ours)
            missing, unexpected = theirs.load_state_dict(
                {k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
            assert not unexpected, unexpected
            # Only the tied output matrix (it is the word embeddings) is not in the state dict.
            assert set(missing) <= {"generator_lm_head.weight"}, missing
        self.torch_opt = torch_electra.AdamWeightDecay(
            self.ref.parameters, peak_lr=train.learning_rate, total_steps=total_steps,
            warmup_steps=warmup, weight_decay=train.weight_decay, beta_2=beta_2,
            clip_norm=train.clip_norm, step=START_STEP)
        # Each variable of ours -> (its TF1 slot, the reference's parameter).
        by_id = {id(p): p for p in self.ref.parameters.values()}
        self.slots = []
        for ours, theirs in ((self.model.discriminator, self.ref.discriminator),
                             (self.model.generator, self.ref.generator)):
            params = dict(theirs.named_parameters(remove_duplicate=False))
            for slot in model_slots(ours):
                param = params[hf_name(slot.name)]
                assert id(param) in by_id
                self.slots.append((slot, param))
        variables = {id(v) for v in self.model.trainable_variables}
        assert {id(s.variable) for s, _ in self.slots} == variables, "a variable has no counterpart"
        assert len({id(p) for _, p in self.slots}) == len(self.ref.parameters)

    def as_theirs(self, slot, value) -> np.ndarray:
        value = np.asarray(tf.convert_to_tensor(value)).reshape(slot.shape)
        return value.T if slot.is_kernel else value

    def weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self.as_theirs(s, s.variable), p.detach().numpy().copy()) for s, p in self.slots]

    def step(self, features) -> dict:
        """One step on both sides; returns what to compare."""
        torch, model, c = self.torch, self.model, self.config
        tensors = {k: tf.constant(v) for k, v in features.items()}
        seed = model.step_seed()
        # electra_tf's draws and gradient (as `pretraining_step` takes it, before the update).
        with tf.GradientTape() as tape:
            out = model.compute_objective(tensors, seed, training=True)
        variables = model.trainable_variables
        grads = dict(zip((id(v) for v in variables), tape.gradient(out["loss"], variables)))
        batch = out["masked"]
        n = batch.positions.shape[1]
        uniform = tf.random.stateless_uniform([len(features["input_ids"]), n, c.vocab_size],
                                              seed=sampling_seed(tf.cast(seed, tf.int64)))
        shown = tf.gather(batch.masked_input_ids, batch.positions, batch_dims=1) == c.mask_token_id
        draws = torch_electra.Draws(
            positions=torch.from_numpy(batch.positions.numpy().astype(np.int64)),
            weights=torch.from_numpy(batch.weights.numpy()),
            shows_mask=torch.from_numpy(shown.numpy()),
            uniform=torch.from_numpy(uniform.numpy()))

        # The reference on the same batch and draws.
        t = {k: torch.from_numpy(v.astype(np.int64)) for k, v in features.items()}
        torch_electra.zero_grad(self.ref)
        ref = torch_electra.objective(self.ref, c, t["input_ids"], t["input_mask"],
                                      t["segment_ids"], draws)
        ref["loss"].backward()
        gradients = [(self.as_theirs(s, grads[id(s.variable)]), p.grad.numpy().copy())
                     for s, p in self.slots]

        # The binary's step on ours, the authors' optimizer on the reference.
        before = self.weights()
        self.loop(iter(untuned(tf.data.Dataset.from_tensors(tensors).repeat())), tf.constant(1),
                  tf.constant(False))
        lr = self.torch_opt.apply()
        after = self.weights()
        return dict(out=out, ref=ref, gradients=gradients, before=before, after=after, lr=lr,
                    sensitivity=[self.sensitivity(p, lr) for _, p in self.slots])

    def sensitivity(self, param, lr) -> np.ndarray:
        """|d w_after / d g| per element of the step just taken (the authors' Adam, no bias
        correction: u = m / (sqrt(v) + eps), m and v including the clipped gradient s * g).

        Where |g| is near eps / sqrt(1 - beta_2), u moves ~(1 - beta_1) / eps = 1e5 times the
        gradient's change: the gradients' own float32 rounding (~1e-7 of their norm) can then
        move such an element of a weight that starts at 0 (a bias) by more than 1e-5 of the
        weight's norm. The weight checks allow what the measured gradient difference explains
        through this derivative, and hold everything else to 1e-5."""
        o = self.torch_opt
        name = next(n for n, p in o.parameters.items() if p is param)
        m, v = o.m[name].numpy().astype(np.float64), o.v[name].numpy().astype(np.float64)
        scale = (o.clip_norm / max(o.gradient_norm, o.clip_norm)) if o.clip_norm else 1.0
        root = np.sqrt(v) + o.epsilon
        return lr * scale * ((1 - o.beta_1) / root + np.abs(m) * np.sqrt(1 - o.beta_2) / root**2)


CASES = {
    "tied embeddings": dict(embedding_sharing="embeddings"),
    "every weight tied": dict(embedding_sharing="all", generator_hidden_size=1.0),
    "untied": dict(embedding_sharing="untied"),
    "ELECTRA 15%": dict(objective="electra_15"),
    "disallow correct, temperature 2": dict(disallow_correct=True, temperature=2.0),
}


# Every case on the graph path; the default objective and ELECTRA 15% also on the XLA-compiled
# step (the path `training/step_path.py` may choose).
@pytest.mark.parametrize("case, jit_compile", [*((case, False) for case in CASES),
                                               ("tied embeddings", True), ("ELECTRA 15%", True)])
def test_one_step_equals_the_pytorch_reference(torch, case, jit_compile):
    config = ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
        hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=SEQ, **CASES[case])
    pair = Pair(torch, config, jit_compile=jit_compile)
    correct_samples = 0
    for i, features in enumerate(batches(seed=len(case))):
        r = pair.step(features)
        out, ref = r["out"], r["ref"]
        where = f"{case}, step {START_STEP + i}"
        # The draws were the same: so are the samples and the replaced-token labels.
        np.testing.assert_array_equal(out["sampled_ids"].numpy(), ref["sampled_ids"].numpy(), where)
        labels = out["replaced_token_labels"].numpy()
        np.testing.assert_array_equal(labels, ref["labels"].numpy(), where)
        assert labels.sum() > 0
        correct_samples += out["masked"].weights.numpy().sum() - labels.sum()
        for name in ("loss", "mlm_loss", "disc_loss", "mlm_accuracy", "disc_accuracy"):
            assert relative(out[name], ref[name].detach()) < TOLERANCE, (where, name)
        total = np.sqrt(sum(np.sum(np.square(b, dtype=np.float64)) for _, b in r["gradients"]))
        assert r["lr"] > 0
        for k, (slot, _) in enumerate(pair.slots):
            (g_ours, g_theirs), (w0_ours, w0_theirs), (w_ours, w_theirs) = (
                r["gradients"][k], r["before"][k], r["after"][k])
            if ZERO_GRADIENT.search(slot.name):
                # Adding b to every key adds q.b to all of a query's scores: softmax ignores it, so
                # this gradient is 0 but for rounding (~1e-12 against a norm of ~20), and so is the
                # update it drives.
                for g in (g_ours, g_theirs):
                    assert np.linalg.norm(g) < 1e-9 * total, (where, slot.name)
                assert np.abs(w_ours - w_theirs).max() < 1e-6 * r["lr"], (where, slot.name)
                continue
            assert relative(g_ours, g_theirs) < TOLERANCE, (where, "gradient", slot.name)
            # What the gradients' difference explains (twice it: the derivative is taken at the
            # reference's moments), see `Pair.sensitivity`.
            explained = 2 * np.linalg.norm(r["sensitivity"][k] * np.abs(g_ours - g_theirs))
            w_ours64, w_theirs64 = np.float64(w_ours), np.float64(w_theirs)
            assert np.linalg.norm(w_ours64 - w_theirs64) <= (
                TOLERANCE * np.linalg.norm(w_theirs64) + explained), (where, "weight", slot.name)
            # The update itself, as the gradients: to 1e-5 of its norm, give or take two float32
            # steps of each weight (it is measured as a difference of float32 weights).
            update_ours, update_theirs = w_ours64 - w0_ours, w_theirs64 - w0_theirs
            assert np.abs(update_theirs).max() > 0, (where, "not updated", slot.name)
            slack = TOLERANCE * np.linalg.norm(update_theirs) + np.linalg.norm(
                2 * np.spacing(np.abs(w_theirs))) + explained
            assert np.linalg.norm(update_ours - update_theirs) <= slack, (where, "update", slot.name)
    # A sample equal to the original is labelled real on both sides (impossible when disallowed).
    assert (correct_samples == 0) == config.disallow_correct, correct_samples


def measure() -> list[str]:
    """Per case, the largest relative differences (the numbers README and BUILD.md quote)."""
    import torch as torch_module

    torch_module.set_num_threads(1)
    lines = [f"{'case':34} {'losses':>9} {'gradients':>10} {'weights':>9}  (relative, worst of "
             f"{len(batches(0))} steps; key biases apart)"]
    for case in CASES:
        config = ElectraConfig.from_json("electra_tiny").replace(
            vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP,
            mask_token_id=MASK, hidden_dropout=0.0, attention_dropout=0.0,
            max_position_embeddings=SEQ, **CASES[case])
        pair = Pair(torch_module, config)
        worst = {"losses": 0.0, "gradients": 0.0, "weights": 0.0}
        for features in batches(seed=len(case)):
            r = pair.step(features)
            for name in ("loss", "mlm_loss", "disc_loss"):
                worst["losses"] = max(worst["losses"], relative(r["out"][name], r["ref"][name].detach()))
            for k, (slot, _) in enumerate(pair.slots):
                if not ZERO_GRADIENT.search(slot.name):
                    worst["gradients"] = max(worst["gradients"], relative(*r["gradients"][k]))
                    worst["weights"] = max(worst["weights"], relative(*r["after"][k]))
        lines.append(f"{case:34} {worst['losses']:9.1e} {worst['gradients']:10.1e} "
                     f"{worst['weights']:9.1e}")
    return lines


if __name__ == "__main__":  # PYTHONPATH=. python tests/benchmarks/test_step_parity.py
    print("\n".join(measure()))


@pytest.mark.slow  # 2 x 200 steps' gradients of the tiny model, ~40 s
def test_with_dropout_on_the_step_agrees_in_distribution(torch):
    """Dropout draws cannot be shared across the two libraries, so with dropout on (0.1, as
    pretraining runs) the step is compared in distribution: the same batch, masks and Gumbel
    noise, 200 dropout draws per side. The mean losses and the mean of every gradient element
    agree within their standard errors (the z-scores of the differences are standard normal),
    and so do the gradients' variances. A dropout missing, added or misplaced on either side
    shifts both."""
    config = ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=VOCAB, pad_token_id=PAD, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=MASK,
        max_position_embeddings=SEQ, embedding_sharing="all", generator_hidden_size=1.0)
    assert config.hidden_dropout == config.attention_dropout == 0.1
    pair = Pair(torch, config)
    features = batches(seed=3)[0]
    tensors = {k: tf.constant(v) for k, v in features.items()}
    seed = tf.constant([11, 7], tf.int64)
    model, variables = pair.model, pair.model.trainable_variables
    batch = model.compute_objective(tensors, seed, training=False)["masked"]
    uniform = tf.random.stateless_uniform(
        [len(features["input_ids"]), batch.positions.shape[1], VOCAB], seed=sampling_seed(seed))
    shown = tf.gather(batch.masked_input_ids, batch.positions, batch_dims=1) == MASK
    draws = torch_electra.Draws(
        torch.from_numpy(batch.positions.numpy().astype(np.int64)),
        torch.from_numpy(batch.weights.numpy()), torch.from_numpy(shown.numpy()),
        torch.from_numpy(uniform.numpy()))
    t = {k: torch.from_numpy(v.astype(np.int64)) for k, v in features.items()}
    index = {id(v): i for i, v in enumerate(variables)}

    @tf.function
    def ours():
        with tf.GradientTape() as tape:
            out = model.compute_objective(tensors, seed, training=True)
        grads = tape.gradient(out["loss"], variables)
        return out["mlm_loss"], out["disc_loss"], [tf.convert_to_tensor(g) for g in grads]

    draws_count = 200
    losses = {"ours": [], "theirs": []}
    grads = {"ours": [], "theirs": []}
    torch.manual_seed(0)
    for _ in range(draws_count):
        mlm, disc, g = ours()
        losses["ours"].append((float(mlm), float(disc)))
        grads["ours"].append(np.concatenate(
            [pair.as_theirs(s, g[index[id(s.variable)]]).ravel() for s, _ in pair.slots]))
        torch_electra.zero_grad(pair.ref)
        ref = torch_electra.objective(pair.ref, config, t["input_ids"], t["input_mask"],
                                      t["segment_ids"], draws)
        ref["loss"].backward()
        losses["theirs"].append((ref["mlm_loss"].item(), ref["disc_loss"].item()))
        grads["theirs"].append(np.concatenate([p.grad.numpy().ravel() for _, p in pair.slots]))
    a, b = np.array(losses["ours"]), np.array(losses["theirs"])
    assert a.std(0).min() > 0 and b.std(0).min() > 0, "dropout is on: the losses vary"
    se = np.sqrt(a.var(0) / draws_count + b.var(0) / draws_count)
    assert np.all(np.abs(a.mean(0) - b.mean(0)) < 4 * se), (a.mean(0), b.mean(0), se)
    ga, gb = np.array(grads["ours"]), np.array(grads["theirs"])
    varying = (ga.var(0) > 0) & (gb.var(0) > 0)
    assert varying.mean() > 0.9
    z = (ga.mean(0) - gb.mean(0))[varying] / np.sqrt(
        ga.var(0)[varying] / draws_count + gb.var(0)[varying] / draws_count)
    assert abs(z.mean()) < 0.05 and 0.9 < z.std() < 1.1, (z.mean(), z.std())
    ratio = np.median(ga.var(0)[varying] / gb.var(0)[varying])
    assert 0.95 < ratio < 1.05, ratio
