"""The generator: a small masked language model whose samples replace the masked tokens."""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.models.encoder import (
    ElectraBackbone, Embeddings, activation, as_electra_config, electra_kernel_initializer,
    register)


@register
class MaskedLMHead(keras.layers.Layer):
    """dense(E, GELU) -> LayerNorm -> logits = h . word_embeddings^T + output_bias.

    The output layer is tied to the word-embedding table (the authors' `run_pretraining.py`,
    `_get_masked_lm_output`), so the
    head's own weights are the dense layer, its LayerNorm and a [vocab] bias.

    Args:
      config: an `ElectraConfig` (or its dict).
      embeddings: the `Embeddings` layer whose `word_embeddings` table is the output matrix;
        None makes the head its own (what `from_config` rebuilds for a head saved alone).
    """

    def __init__(self, config, embeddings=None, **kwargs):
        kwargs.setdefault("name", "generator_predictions")
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        c = self.config
        self.embeddings = embeddings or Embeddings(c, dtype=self.dtype_policy)
        # --- layers ---
        self.dense = keras.layers.Dense(
            c.embedding_size, activation=activation(c.hidden_act),
            kernel_initializer=electra_kernel_initializer(c), name="dense", dtype=self.dtype_policy)
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, name="LayerNorm", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        c = self.config
        if not self.embeddings.built:
            self.embeddings.build()
        self.dense.build((None, None, c.hidden_size))
        self.layer_norm.build((None, None, c.embedding_size))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(c.vocab_size,), initializer="zeros")

    def call(self, hidden):
        # --- forward graph ---
        h = self.layer_norm(self.dense(hidden))  # [..., E]
        table = ops.cast(self.embeddings.word_embeddings, h.dtype)
        logits = ops.matmul(h, ops.transpose(table)) + ops.cast(self.output_bias, h.dtype)
        return ops.cast(logits, "float32")  # [..., vocab]; losses are computed in float32

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def gather_positions(sequence, positions):
    """sequence [batch, seq, D], positions [batch, n] -> [batch, n, D]."""
    return ops.take_along_axis(sequence, positions[:, :, None], axis=1)


@register
class Generator(ElectraBackbone):
    """Encoder + masked-LM head. Call on a feature dict; returns `{"mlm_logits", "sequence_output"}`.

    Args:
      config: the generator's `ElectraConfig` (`ElectraConfig.generator_config()` of the
        discriminator's config).
      embeddings: an `Embeddings` layer shared with the discriminator (None: its own).
      encoder, embeddings_project: the discriminator's, when every weight is tied.

    Example:
    >>> cfg = ElectraConfig.from_json("electra_tiny").generator_config()
    >>> gen = Generator(cfg)
    >>> gen(dummy_inputs(2, 8))["mlm_logits"].shape
    (2, 8, 30522)
    """

    def __init__(self, config, embeddings=None, encoder=None, embeddings_project=None, **kwargs):
        kwargs.setdefault("name", "generator")
        super().__init__(config, embeddings, encoder, embeddings_project, **kwargs)
        self.lm_head = MaskedLMHead(self.config, self.embeddings, dtype=self.dtype_policy)
        self.build()

    def _heads(self):
        return (self.lm_head,)

    def call(self, inputs, training=None, positions=None):
        """`positions` [batch, n]: score only those positions (the pretraining path)."""
        sequence_output = self.encode(inputs, training=training)  # [batch, seq, H]
        hidden = sequence_output if positions is None else gather_positions(sequence_output, positions)
        return {"sequence_output": sequence_output, "mlm_logits": self.lm_head(hidden)}
