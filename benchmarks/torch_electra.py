"""An independent PyTorch ELECTRA pretraining step: the reference electra_tf's step is held to.

The networks are Hugging Face `transformers`' ELECTRA (`ElectraForMaskedLM` as the generator,
`ElectraForPreTraining` as the discriminator). Everything around them is written here from the
paper (Clark et al., ICLR 2020, Section 2) and the authors' code, not from electra_tf:

  masking     `pretrain/pretrain_helpers.py` `mask`: per row max(1, min(N, round(real * p)))
              slots (real tokens counted with [CLS]/[SEP], `round` half-to-even as TF1's), their
              positions drawn uniformly from the candidates (real, not [CLS]/[SEP]/[MASK]) WITH
              replacement (`tf.random.categorical`); 85% of the slots show [MASK], 15% keep
              their token; unused slots point at position 0 with weight 0. A position drawn
              twice is masked and written once; here it is also counted once in the MLM loss
              (the authors' loss counts it twice, and their `scatter_update` writes the floor of
              the mean of the two samples there; electra_tf documents the same choice in
              `electra_tf/models/masking.py`).
  generator   the body on the masked ids, the head at the slots only (the authors' gather
              before `_get_masked_lm_output`): dense(E, GELU) -> LayerNorm -> tied output
              matrix + bias; cross-entropy, sum(w * ce) / (sum(w) + 1e-6).
  sampling    Gumbel-max on logits / T (`sample_from_softmax`), u ~ U(0, 1),
              g = -log(-log(u + 1e-9) + 1e-9); `disallow_correct` subtracts 1000 at the original.
  labels      the samples written into the ORIGINAL ids; fake = masked and sample != original.
  disc        sigmoid cross-entropy over the real tokens (`electra`) or the masked positions
              (`electra_15`, the paper's Table 5 ablation), sum(w * bce) / (sum(w) + 1e-6);
              loss = gen_weight * MLM + disc_weight * disc.
  optimizer   `model/optimization.py` `AdamWeightDecayOptimizer`: Adam WITHOUT bias correction,
              update = m / (sqrt(v) + eps) + wd * w (no decay where the name holds "LayerNorm",
              "layer_norm" or "bias"), w -= lr * update; gradients clipped to global norm first
              (`tf.clip_by_global_norm`); lr = peak * (1 - min(step, total) / total) *
              min(1, step / warmup) at the step BEFORE it is counted (so the first update has
              lr 0, as the authors' global step).
  init        `model/modeling.py`: every weight truncated normal(0, 0.02) (cut at 2 stddev),
              biases 0, LayerNorm 1 / 0; the generator's output bias 0.
  sharing     "embeddings": the discriminator uses the generator's embedding module (word,
              position, type, LayerNorm); "all": also its `embeddings_project` and encoder (one
              network, two heads); "untied": two of everything, the generator's embeddings as
              wide as its hidden size (no projection), as the authors' untied generator.

The randomness of a step (slot positions and liveness, which slots show [MASK], the Gumbel
uniforms) can be passed in as `Draws`, so that a test can feed this step exactly what electra_tf
drew and compare every number; `draw` makes them the authors' way.

The module imports without torch; `available()` says whether it can run.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

# Our config -> transformers.ElectraConfig: one mapping, the benchmark row's.
from benchmarks.torch_reference import hf_config

INSTALL_HINT = "pip install -e '.[anchors]'"
KEEP_ORIGINAL_PROB = 0.15
# `model/optimization.py`: names holding one of these are not decayed.
NO_DECAY = ("LayerNorm", "layer_norm", "bias")
OBJECTIVES = ("electra", "electra_15")


def available() -> str | None:
    """None when torch and transformers' ELECTRA import, else a one-line reason."""
    try:
        import torch  # noqa: F401
        from transformers import ElectraForMaskedLM, ElectraForPreTraining  # noqa: F401
    except ImportError as e:
        return f"{e}: {INSTALL_HINT}"
    return None


def authors_init(module, stddev: float) -> None:
    """The authors' initialisation of every parameter of `module` (module docstring)."""
    import torch

    with torch.no_grad():
        for name, p in module.named_parameters():
            if "LayerNorm" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                torch.nn.init.trunc_normal_(p, std=stddev, a=-2 * stddev, b=2 * stddev)


class Networks(NamedTuple):
    generator: object  # transformers.ElectraForMaskedLM
    discriminator: object  # transformers.ElectraForPreTraining
    parameters: dict  # unique name -> parameter (shared ones once, under the generator's name)


def build_networks(config, *, attn_implementation: str = "eager") -> Networks:
    """The generator and discriminator of `config` (an electra_tf `ElectraConfig`), shared as its
    `embedding_sharing` says, initialised the authors' way (seeded by torch's global RNG)."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    if config.objective not in OBJECTIVES:
        raise ValueError(f"the PyTorch reference has no objective {config.objective!r} "
                         f"(it has {', '.join(OBJECTIVES)})")
    kwargs = {"attn_implementation": attn_implementation}
    generator = ElectraForMaskedLM._from_config(hf_config(config.generator_config()), **kwargs)
    discriminator = ElectraForPreTraining._from_config(hf_config(config), **kwargs)
    if config.embedding_sharing == "all":
        discriminator.electra = generator.electra
    elif config.embedding_sharing == "embeddings":
        discriminator.electra.embeddings = generator.electra.embeddings
    if generator.generator_lm_head.weight is not generator.electra.embeddings.word_embeddings.weight:
        raise RuntimeError("transformers did not tie the generator's output matrix to its embeddings")
    parameters = {}
    seen = set()
    for prefix, model in (("generator", generator), ("discriminator", discriminator)):
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                parameters[f"{prefix}.{name}"] = p
    for model in (generator, discriminator):
        authors_init(model, config.initializer_range)
    return Networks(generator.train(), discriminator.train(), parameters)


class Draws(NamedTuple):
    """The randomness of one step. [batch, N] but `uniform` [batch, N, vocab]."""

    positions: "torch.Tensor"  # long; unused slots 0
    weights: "torch.Tensor"  # float 1.0 live, 0.0 unused (or a repeat of an earlier slot)
    shows_mask: "torch.Tensor"  # bool: the slot's position shows [MASK] to the generator
    uniform: "torch.Tensor"  # float in [0, 1): the Gumbel noise's uniforms


def num_slots(config, seq_length: int) -> int:
    """N: `max_predictions_per_seq`, else int((mask_prob + 0.005) * seq_length)."""
    if config.max_predictions_per_seq is not None:
        return config.max_predictions_per_seq
    return max(1, int((config.mask_prob + 0.005) * seq_length))


def draw(config, input_ids, input_mask, generator=None) -> Draws:
    """The authors' masking draw for one batch (module docstring), from torch's RNG `generator`."""
    import torch

    batch, seq = input_ids.shape
    n = num_slots(config, seq)
    candidates = input_mask.bool()
    for special in (config.cls_token_id, config.sep_token_id, config.mask_token_id):
        candidates &= input_ids != special
    real = input_mask.sum(1).to(torch.float32)
    # torch.round is half-to-even, as TF1's tf.round.
    to_predict = torch.round(real * config.mask_prob).to(torch.long).clamp(min=1, max=n)
    weights = (torch.arange(n)[None, :] < to_predict[:, None]).to(torch.float32)
    has_candidate = candidates.any(1)
    weights *= has_candidate[:, None].to(torch.float32)
    probs = candidates.to(torch.float32)
    probs[~has_candidate] = 1.0  # any row of multinomial needs mass; its weights are 0 anyway
    positions = torch.multinomial(probs, n, replacement=True, generator=generator)
    # A position drawn again is masked once: the repeat's weight is 0.
    same = positions[:, :, None] == positions[:, None, :]
    earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)
    repeat = torch.zeros(batch, n, dtype=torch.bool)
    for j in range(1, n):  # sequential: a repeat of a repeat is still a repeat of the first
        repeat[:, j] = (same[:, j] & earlier[j] & (weights > 0) & ~repeat).any(1)
    weights = weights * (~repeat).to(torch.float32)
    positions = positions * (weights > 0)
    shows_mask = torch.rand(batch, n, generator=generator) >= KEEP_ORIGINAL_PROB
    uniform = torch.rand(batch, n, config.vocab_size, generator=generator)
    return Draws(positions, weights, shows_mask, uniform)


def _scatter(values, positions, live, seq_length):
    """[batch, N] values written at live `positions` into a [batch, seq] zero tensor (a live
    position is held by one slot only)."""
    import torch

    out = torch.zeros(values.shape[0], seq_length, dtype=values.dtype)
    return out.scatter_add(1, positions, values * live.to(values.dtype))


def objective(networks: Networks, config, input_ids, input_mask, segment_ids, d: Draws) -> dict:
    """The loss of one batch and its terms, with the graph for backward (module docstring)."""
    import torch
    import torch.nn.functional as F

    gen, disc = networks.generator, networks.discriminator
    seq = input_ids.shape[1]
    live = d.weights > 0
    is_masked = _scatter(torch.ones_like(d.positions), d.positions, live, seq) > 0
    shows = _scatter(d.shows_mask.to(torch.long), d.positions, live, seq) > 0
    masked_input = torch.where(shows, config.mask_token_id, input_ids)
    targets = input_ids.gather(1, d.positions) * live

    hidden = gen.electra(input_ids=masked_input, attention_mask=input_mask,
                         token_type_ids=segment_ids).last_hidden_state
    hidden = hidden.gather(1, d.positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
    mlm_logits = gen.generator_lm_head(gen.generator_predictions(hidden))  # [batch, N, V]
    ce = F.cross_entropy(mlm_logits.flatten(0, 1), targets.flatten(), reduction="none")
    slot_total = d.weights.sum()
    mlm_loss = (ce.view_as(d.weights) * d.weights).sum() / (slot_total + 1e-6)

    with torch.no_grad():
        scores = mlm_logits.detach() / config.temperature
        if config.disallow_correct:
            scores = scores - 1000.0 * F.one_hot(targets, scores.shape[-1])
        gumbel = -torch.log(-torch.log(d.uniform + 1e-9) + 1e-9)
        sampled = (scores + gumbel).argmax(-1)
        fake = torch.where(is_masked, _scatter(sampled, d.positions, live, seq), input_ids)
        labels = (is_masked & (fake != input_ids)).to(torch.float32)

    rtd_logits = disc(input_ids=fake, attention_mask=input_mask, token_type_ids=segment_ids).logits
    token_weights = (is_masked if config.objective == "electra_15" else input_mask).to(torch.float32)
    bce = F.binary_cross_entropy_with_logits(rtd_logits, labels, reduction="none")
    disc_loss = (bce * token_weights).sum() / (token_weights.sum() + 1e-6)
    loss = config.gen_weight * mlm_loss + config.disc_weight * disc_loss
    with torch.no_grad():
        mlm_correct = (mlm_logits.argmax(-1) == targets).to(torch.float32)
        disc_correct = ((rtd_logits > 0).to(torch.float32) == labels).to(torch.float32)
        terms = dict(
            mlm_accuracy=(mlm_correct * d.weights).sum() / (slot_total + 1e-6),
            sampled_accuracy=((sampled == targets).to(torch.float32) * d.weights).sum()
            / (slot_total + 1e-6),
            disc_accuracy=(disc_correct * token_weights).sum() / (token_weights.sum() + 1e-6))
    return dict(loss=loss, mlm_loss=mlm_loss, disc_loss=disc_loss, sampled_ids=sampled,
                fake_ids=fake, labels=labels, rtd_logits=rtd_logits, token_weights=token_weights,
                **terms)


def learning_rate(step: int, peak: float, total: int, warmup: float) -> float:
    """`model/optimization.py`: linear decay from step 0 times the linear warmup."""
    decayed = peak * (1.0 - min(step, total) / total)
    return decayed * min(1.0, step / warmup) if warmup else decayed


class AdamWeightDecay:
    """The authors' `AdamWeightDecayOptimizer` with global-norm clipping before it (docstring)."""

    def __init__(self, parameters: dict, *, peak_lr: float, total_steps: int, warmup_steps: float,
                 weight_decay: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-6, clip_norm: float | None = 1.0, step: int = 0):
        import torch

        self.parameters = parameters
        self.peak_lr, self.total_steps, self.warmup_steps = peak_lr, total_steps, warmup_steps
        self.weight_decay, self.beta_1, self.beta_2, self.epsilon = (
            weight_decay, beta_1, beta_2, epsilon)
        self.clip_norm = clip_norm
        self.step = step  # updates applied so far (the authors' global_step)
        self.gradient_norm = None  # of the last step, before clipping
        self.m = {n: torch.zeros_like(p) for n, p in parameters.items()}
        self.v = {n: torch.zeros_like(p) for n, p in parameters.items()}
        self.decayed = {n: not any(re.search(x, n) for x in NO_DECAY) for n in parameters}

    def clip(self) -> float:
        """Clips the gradients to the global norm in place (`tf.clip_by_global_norm`: scale by
        clip / max(norm, clip)); returns the norm before clipping."""
        import torch

        grads = [p.grad for p in self.parameters.values() if p.grad is not None]
        norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
        if self.clip_norm:
            scale = self.clip_norm / max(norm, self.clip_norm)
            for g in grads:
                g.mul_(scale)
        return norm

    def apply(self) -> float:
        """Clip, update every parameter with a gradient, count the step; returns the lr used."""
        import torch

        lr = learning_rate(self.step, self.peak_lr, self.total_steps, self.warmup_steps)
        self.gradient_norm = self.clip()
        with torch.no_grad():
            for name, p in self.parameters.items():
                if p.grad is None:
                    continue
                g = p.grad
                m = self.m[name].mul_(self.beta_1).add_((1.0 - self.beta_1) * g)
                v = self.v[name].mul_(self.beta_2).add_((1.0 - self.beta_2) * g * g)
                update = m / (torch.sqrt(v) + self.epsilon)
                if self.decayed[name] and self.weight_decay:
                    update = update + self.weight_decay * p
                p.sub_(lr * update)
        self.step += 1
        return lr

    def state_dict(self) -> dict:
        return {"step": self.step, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        for name in self.parameters:
            self.m[name].copy_(state["m"][name])
            self.v[name].copy_(state["v"][name])


def zero_grad(networks: Networks) -> None:
    for p in networks.parameters.values():
        p.grad = None


def check_finite(value: float, step: int) -> None:
    if not math.isfinite(value):
        raise FloatingPointError(f"the PyTorch reference's loss is {value} at step {step}")
