"""Analytic training FLOPs of one sequence, for every pretraining objective.

Counting rule (as the paper's FLOP comparisons: matmuls only): a dense layer costs 2 x its kernel
size per token. Per token and encoder layer 2 (4 H^2 + 2 H I) for Q, K, V, the attention output
and the FFN, plus 4 S H for the scores (Q K^T) and the weighted sum (A V); the embedding
projection 2 E H when E != H. Heads: replaced-token detection 2 (H^2 + H) per token; a masked-LM
head 2 (h E + E V) per position it scores (the generator's at the N masked slots; the
`all_tokens_mlm` main model's at every position). Electric's generator is two towers of the
generator's size and a cloze head of input width 2 h at every position (its causal masks skip no
matmul). Backward is 2 x forward, training 3 x forward.
Embedding lookups, softmax, LayerNorm, GELU, sampling and the optimizer are not counted
(element-wise, a few percent at most).
"""

from __future__ import annotations

from electra_tf.config import ElectraConfig


def _encoder(config: ElectraConfig, seq_length: int) -> int:
    h, i = config.hidden_size, config.intermediate_size
    per_token = config.num_layers * (2 * (4 * h * h + 2 * h * i) + 4 * seq_length * h)
    if config.embedding_size != h:
        per_token += 2 * config.embedding_size * h
    return per_token * seq_length


def _mlm_head(config: ElectraConfig, positions: int) -> int:
    e = config.embedding_size
    return positions * 2 * (config.hidden_size * e + e * config.vocab_size)


def training_flops_per_sequence(config: ElectraConfig, seq_length: int) -> dict:
    """{"generator_forward", "discriminator_forward", "forward", "training"} for one sequence."""
    objective = config.objective
    slots = config.num_masked_slots(seq_length)
    main = _encoder(config, seq_length)
    if objective in ("electra", "electra_15", "all_tokens_mlm", "electric"):
        main += seq_length * 2 * (config.hidden_size ** 2 + config.hidden_size)
    if objective in ("replace_mlm", "mlm"):
        main += _mlm_head(config, slots)
    if objective == "all_tokens_mlm":
        main += _mlm_head(config, seq_length)
    gen = 0
    if objective == "electric":
        g = config.generator_config()
        two_towers = g.replace(hidden_size=2 * g.hidden_size)  # the head's input width
        gen = 2 * _encoder(g, seq_length) + _mlm_head(two_towers, seq_length)
    elif objective != "mlm":
        g = config.generator_config()
        gen = _encoder(g, seq_length) + _mlm_head(g, slots)
    forward = main + gen
    return {"discriminator_forward": main, "generator_forward": gen, "forward": forward,
            "training": 3 * forward}
