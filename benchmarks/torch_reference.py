"""The Hugging Face PyTorch ELECTRA pretraining step, as a timing reference for our benchmark.

`torch_step(model_config, batches)` builds, from OUR `ElectraConfig`, the equivalent Hugging Face
`transformers` models and returns `(callable, 1)` like the row makers of
`benchmarks/benchmark_pretrain.py`: each call runs one full pretraining step on the next of `batches`
(the very batches our rows use, padding included) and blocks until it is done. The benchmark can
then time it in the same interleaved rounds as our rows and print electra_tf / PyTorch ratios.
`torch_matmul_seconds(specs)` times `torch.matmul` at the `benchmarks.matmul_bound` specs, to compare
PyTorch's CPU kernels with TensorFlow's at the step's own shapes.

The reference step, and how it mirrors `ElectraPretrainer.train_step` (objective "electra"):

  models     generator `ElectraForMaskedLM` with `model_config.generator_config()`'s sizes,
             discriminator `ElectraForPreTraining` with the discriminator's; both from
             `transformers.ElectraConfig` with our vocab size, E, H, layers, heads, FFN width,
             dropouts, exact erf GELU ("gelu"), LayerNorm epsilon, position/type table sizes.
             `embedding_sharing="embeddings"`: the discriminator uses the generator's embedding
             module (word + position + type + LayerNorm); the generator's LM head is tied to
             the word embeddings (its only own output weight is the [V] bias, like ours).
             "untied" keeps two embedding modules. Each model has its E -> H projection when
             E != H, as ours.
  masking    per row, max(1, min(N, round(real_tokens * mask_prob))) slots (our rule; N =
             `num_masked_slots(seq)`, `round` half-to-even as ours), at distinct random positions
             among the real, non-special tokens (input_mask = 1, not [CLS]/[SEP]/[MASK]); 85% of
             them show [MASK] to the generator, 15% keep their token (as ours). The slots are a
             static [batch, N] array; unused slots point at position 0 with weight 0, as ours.
             Difference: positions are drawn WITHOUT replacement, while ours draws with
             replacement and drops duplicates, so ours has slightly fewer live slots on average;
             the compute is the same (both score all N slots).
  generator  its body (`model.electra`) on the masked ids with attention_mask = input_mask and
             token_type_ids = segment_ids; hidden states gathered at the N slots only; then
             `generator_predictions` + `generator_lm_head` there (logits [batch, N, V]); MLM
             cross-entropy averaged over the live slots.
  sampling   Gumbel-max, no gradient: argmax(logits / T + g), g = -log(-log(u + 1e-9) + 1e-9)
             (`disallow_correct` subtracts 1000 at the original id, as ours); the samples are
             written into the ORIGINAL ids at the live slots; label = (new id != original id).
  disc       `ElectraForPreTraining` on those ids with attention_mask = input_mask, binary
             cross-entropy averaged over the real tokens; loss = MLM + disc_weight x RTD.
  update     `torch.optim.AdamW(lr=5e-4, weight_decay=0.01)`: zero_grad(set_to_none=True),
             backward, step. fp32, dropout on (train mode).

Known differences from ours (they change numbers, not the amount of work, except the last two):
  - Initialisation: HF draws normal(0, 0.02) (ours: truncated normal) - irrelevant to speed.
  - The word embedding has no padding row (`pad_token_id=None`, like ours); HF's default would
    zero the [PAD] row's gradient.
  - The generator head's activation is always exact GELU in HF (`ElectraGeneratorPredictions`);
    ours follows `hidden_act`. Same for the default "gelu".
  - Optimizer: ours is `AdamWeightDecay` with a warm-up schedule, epsilon 1e-6, no decay on
    LayerNorm and biases and a global-norm clip at 1.0; the reference is plain torch AdamW
    (epsilon 1e-8, decay on every parameter, no clipping, constant lr). The clip is ~1 pass over
    the gradients, which the reference does not pay.
  - Attention: transformers' default implementation (`attn_implementation`: "sdpa",
    `torch.nn.functional.scaled_dot_product_attention`, in transformers 5) unless one is passed;
    ours is `electra_tf.models.encoder.SelfAttention` (one QKV matmul, batched matmuls, softmax
    and dropout as separate ops). In training
    with attention dropout > 0, torch 2.13's CPU SDPA leaves its fused flash kernel for the math
    path (bmm, softmax, dropout as separate ops), so "sdpa" and "eager" do similar work here.

The module imports without torch; `available()` says whether the reference can run.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import NamedTuple

INSTALL_HINT = "pip install -e '.[anchors]'"
# The fraction of chosen positions that keep their token instead of showing [MASK] (as ours).
KEEP_ORIGINAL_PROB = 0.15
LEARNING_RATE = 5e-4
WEIGHT_DECAY = 0.01
# Our activation names -> transformers' (`electra_tf/convert/hf.py` maps the same way).
_ACT_TO_HF = {"gelu": "gelu", "gelu_approximate": "gelu_new", "relu": "relu"}


def available() -> str | None:
    """None when torch and transformers' ELECTRA import, else a one-line reason."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return f"torch not installed: {INSTALL_HINT}"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return f"transformers not installed: {INSTALL_HINT}"
    try:
        from transformers import ElectraForMaskedLM, ElectraForPreTraining  # noqa: F401
    except ImportError as e:
        return f"transformers' PyTorch ELECTRA models do not import ({e}): {INSTALL_HINT}"
    return None


def hf_config(model_config, **overrides):
    """The `transformers.ElectraConfig` with the sizes of one of our `ElectraConfig`s."""
    import transformers

    c = model_config
    return transformers.ElectraConfig(
        vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_size=c.hidden_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        intermediate_size=c.intermediate_size, hidden_act=_ACT_TO_HF[c.hidden_act],
        hidden_dropout_prob=c.hidden_dropout, attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
        initializer_range=c.initializer_range, layer_norm_eps=c.layer_norm_epsilon,
        pad_token_id=None, **overrides)


def build_models(model_config, attn_implementation: str | None = None):
    """(generator ElectraForMaskedLM, discriminator ElectraForPreTraining), embeddings shared."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    c = model_config
    if c.objective != "electra":
        raise ValueError(f"torch reference: objective {c.objective!r} is not mirrored (only "
                         "'electra')")
    if c.embedding_sharing not in ("embeddings", "untied"):
        raise ValueError(f"torch reference: embedding_sharing {c.embedding_sharing!r} is not "
                         "mirrored (only 'embeddings' and 'untied')")
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    generator = ElectraForMaskedLM._from_config(hf_config(c.generator_config()), **kwargs)
    discriminator = ElectraForPreTraining._from_config(hf_config(c), **kwargs)
    if c.embedding_sharing == "embeddings":
        discriminator.electra.embeddings = generator.electra.embeddings
    if generator.generator_lm_head.weight is not generator.electra.embeddings.word_embeddings.weight:
        raise RuntimeError("transformers did not tie the generator's LM head to its embeddings")
    return generator.train(), discriminator.train()


class Masked(NamedTuple):
    """The chosen slots of a batch (all [batch, N] but the [batch, seq] ones)."""

    masked_ids: "torch.Tensor"  # [batch, seq] the generator's input ([MASK] at 85% of slots)
    positions: "torch.Tensor"  # slot positions; unused slots point at 0
    targets: "torch.Tensor"  # original ids at `positions`
    live: "torch.Tensor"  # bool: the slot is used
    is_masked: "torch.Tensor"  # [batch, seq] bool, True at every live slot's position


def mask_tokens(input_ids, input_mask, model_config, num_slots: int, generator=None) -> Masked:
    """Chooses the masked slots as described in the module docstring (torch tensors)."""
    import torch

    c = model_config
    batch, seq = input_ids.shape
    if num_slots > seq:
        raise ValueError(f"torch reference: {num_slots} masked slots > sequence length {seq}")
    real = input_mask.bool()
    candidates = real.clone()
    for special in (c.cls_token_id, c.sep_token_id, c.mask_token_id):
        candidates &= input_ids != special
    num_real = real.sum(dim=1).to(torch.float32)
    to_predict = torch.round(num_real * c.mask_prob).to(torch.long).clamp(min=1, max=num_slots)
    # Distinct uniform candidates: the top N of random scores, non-candidates scored -1.
    scores = torch.rand(batch, seq, generator=generator).masked_fill(~candidates, -1.0)
    top, positions = scores.topk(num_slots, dim=1)
    live = (torch.arange(num_slots)[None, :] < to_predict[:, None]) & (top >= 0)
    positions = positions * live
    # Live positions are distinct, so a scatter-add writes each once and unused slots add 0.
    zeros = torch.zeros(batch, seq, dtype=torch.long)
    is_masked = zeros.scatter_add(1, positions, live.long()) > 0
    show = live & (torch.rand(batch, num_slots, generator=generator) >= KEEP_ORIGINAL_PROB)
    shows_mask = zeros.scatter_add(1, positions, show.long()) > 0
    masked_ids = torch.where(shows_mask, c.mask_token_id, input_ids)
    return Masked(masked_ids, positions, input_ids.gather(1, positions), live, is_masked)


class TorchReferenceStep:
    """One HF PyTorch ELECTRA pretraining step per call, cycling over fixed batches.

    Attributes: `generator`, `discriminator`, `optimizer`, `model_config`, and `info` (versions,
    threads, attention implementation, parameter count) for the benchmark's header.
    """

    def __init__(self, model_config, batches, threads: int | None = None, seed: int = 0,
                 attn_implementation: str | None = None):
        import numpy as np
        import torch
        import transformers

        if not batches:
            raise ValueError("torch reference: no batches")
        torch.set_num_threads(threads or os.cpu_count() or 1)
        torch.manual_seed(seed)  # initialisation and dropout
        self.model_config = model_config
        self.generator, self.discriminator = build_models(model_config, attn_implementation)
        self.parameters = list(torch.nn.ModuleDict(
            {"generator": self.generator, "discriminator": self.discriminator}).parameters())
        self.optimizer = torch.optim.AdamW(self.parameters, lr=LEARNING_RATE,
                                           weight_decay=WEIGHT_DECAY)
        self._rng = torch.Generator().manual_seed(seed + 1)  # masking and sampling

        def to_torch(value):
            value = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
            return torch.from_numpy(np.ascontiguousarray(value, dtype=np.int64))

        converted = []
        for features in batches:
            ids = to_torch(features["input_ids"])
            segment = features.get("segment_ids")
            converted.append((ids, to_torch(features["input_mask"]),
                              torch.zeros_like(ids) if segment is None else to_torch(segment)))
        seq = converted[0][0].shape[1]
        self.num_slots = model_config.num_masked_slots(seq)
        self._cycle = itertools.cycle(converted)
        self.info = {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "attn_implementation": self.generator.config._attn_implementation,
            "parameters": sum(p.numel() for p in self.parameters),
            "masked_slots": self.num_slots,
        }

    def loss(self, input_ids, input_mask, segment_ids):
        """The pretraining loss of one batch (with the graph for backward)."""
        import torch
        import torch.nn.functional as F

        c = self.model_config
        m = mask_tokens(input_ids, input_mask, c, self.num_slots, self._rng)
        weights = m.live.to(torch.float32)
        # Generator: the body on every position, the LM head at the N slots only.
        hidden = self.generator.electra(
            input_ids=m.masked_ids, attention_mask=input_mask, token_type_ids=segment_ids
        ).last_hidden_state  # [batch, seq, h]
        hidden = hidden.gather(1, m.positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
        logits = self.generator.generator_lm_head(
            self.generator.generator_predictions(hidden))  # [batch, N, V]
        per_slot = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), m.targets.reshape(-1),
                                   reduction="none").view_as(weights)
        mlm_loss = (per_slot * weights).sum() / weights.sum().clamp(min=1.0)

        with torch.no_grad():  # Gumbel-max sampling; writes into the ORIGINAL ids
            scores = logits.detach() / c.temperature
            if c.disallow_correct:
                scores = scores - 1000.0 * F.one_hot(m.targets, scores.shape[-1])
            u = torch.rand(scores.shape, generator=self._rng)
            sampled = (scores - torch.log(-torch.log(u + 1e-9) + 1e-9)).argmax(-1)
            written = torch.zeros_like(input_ids).scatter_add(1, m.positions, sampled * m.live)
            fake_ids = torch.where(m.is_masked, written, input_ids)
            labels = (fake_ids != input_ids).to(torch.float32)

        rtd_logits = self.discriminator(
            input_ids=fake_ids, attention_mask=input_mask, token_type_ids=segment_ids).logits
        token_weights = input_mask.to(torch.float32)
        per_token = F.binary_cross_entropy_with_logits(rtd_logits, labels, reduction="none")
        rtd_loss = (per_token * token_weights).sum() / token_weights.sum().clamp(min=1.0)
        return mlm_loss + c.disc_weight * rtd_loss

    def __call__(self) -> float:
        """One training step on the next batch; returns its loss (blocks until done)."""
        loss = self.loss(*next(self._cycle))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()


def torch_step(model_config, batches, threads: int | None = None, *, seed: int = 0,
               attn_implementation: str | None = None):
    """(one-step callable, steps per call = 1) of the HF PyTorch reference step.

    Args:
      model_config: our discriminator `ElectraConfig` (special ids as the data's vocab).
      batches: dicts of int [batch, seq] `input_ids`, `input_mask`, `segment_ids` (tf tensors or
        numpy arrays); converted to torch once, here, then cycled over.
      threads: torch intra-op threads (process-wide); None: all cores.
      attn_implementation: "eager" / "sdpa" / ...; None: transformers' default.
    """
    reason = available()
    if reason:
        raise RuntimeError(f"torch reference unavailable: {reason}")
    return TorchReferenceStep(model_config, batches, threads, seed, attn_implementation), 1


def torch_matmul_seconds(specs, target_seconds: float = 0.05, repeats: int = 3) -> dict:
    """Seconds per product of torch.matmul for each `benchmarks.matmul_bound` spec (best of
    `repeats` loops of about `target_seconds`): PyTorch's kernels at the step's shapes."""
    import torch

    results = {}
    with torch.no_grad():
        for spec in specs:
            batch, m, k, n, ta, tb = spec
            a = torch.randn(*batch, *((k, m) if ta else (m, k)))
            b = torch.randn(*batch, *((n, k) if tb else (k, n)))
            a, b = (a.transpose(-1, -2) if ta else a), (b.transpose(-1, -2) if tb else b)
            torch.matmul(a, b)
            start = time.perf_counter()
            torch.matmul(a, b)
            calls = max(2, min(2000, int(target_seconds / max(time.perf_counter() - start, 1e-7))))
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    torch.matmul(a, b)
                best = min(best, (time.perf_counter() - start) / calls)
            results[spec] = best
    return results


# --- the worker process ---------------------------------------------------------------------
def _serve(workdir: str) -> None:
    """The reference as an `benchmarks.row_worker` child: reads the inputs the benchmark saved."""
    from benchmarks import row_worker

    model_config, batches, setup = row_worker.load_inputs(workdir)
    step, per_call = torch_step(model_config, batches, setup.get("torch_threads"))
    row_worker.serve(step, per_call, step.info, torch_matmul_seconds)


if __name__ == "__main__":
    import sys

    _serve(sys.argv[1])
