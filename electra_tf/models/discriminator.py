"""The discriminator: the encoder ELECTRA pre-trains, with its replaced-token-detection head."""

from __future__ import annotations

import keras
from keras import ops

from electra_tf.models.encoder import (
    ElectraBackbone, activation, as_electra_config, electra_kernel_initializer, register)
from electra_tf.models.generator import MaskedLMHead, gather_positions


@register
class ReplacedTokenDetectionHead(keras.layers.Layer):
    """dense(H, GELU) -> dense(1): one logit per token, > 0 meaning "replaced".

    Weight names follow `discriminator_predictions/{dense, dense_1}` of the released checkpoints.

    Args:
      config: an `ElectraConfig` (or its dict).
    """

    def __init__(self, config, **kwargs):
        kwargs.setdefault("name", "discriminator_predictions")
        super().__init__(**kwargs)
        self.config = c = as_electra_config(config)
        init = electra_kernel_initializer(c)
        self.dense = keras.layers.Dense(
            c.hidden_size, activation=activation(c.hidden_act), kernel_initializer=init,
            name="dense", dtype=self.dtype_policy)
        self.dense_1 = keras.layers.Dense(1, kernel_initializer=init, name="dense_1",
                                          dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.dense.build((None, None, self.config.hidden_size))
        self.dense_1.build((None, None, self.config.hidden_size))

    def call(self, sequence_output):
        logits = self.dense_1(self.dense(sequence_output))
        return ops.cast(ops.squeeze(logits, -1), "float32")  # [batch, seq]

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


@register
class Discriminator(ElectraBackbone):
    """The ELECTRA encoder with its replaced-token-detection head.

    Returns a dict: `sequence_output` [batch, seq, H], `cls_output` [batch, H] (the final hidden
    state at [CLS]; ELECTRA has no pooler) and, with the head, `rtd_logits` [batch, seq]. With
    `rtd_head=False` it is a plain encoder, as the fine-tuning heads use it. `mlm_head=True` adds a
    tied masked-LM head, used by the paper's MLM-style objective variants and the BERT baseline.

    Args:
      config: the discriminator's `ElectraConfig`.
      embeddings: an `Embeddings` layer to share (None: its own).
      rtd_head: build the replaced-token-detection head.
      mlm_head: build a masked-LM head tied to the word embeddings (outputs `mlm_logits`).

    Example:
    >>> disc = Discriminator(ElectraConfig.from_json("electra_tiny"))
    >>> out = disc(dummy_inputs(2, 8))
    >>> out["rtd_logits"].shape, out["cls_output"].shape
    ((2, 8), (2, 64))
    >>> disc.save("disc.keras")  # keras.saving.load_model("disc.keras"): the same outputs
    """

    def __init__(self, config, embeddings=None, rtd_head=True, mlm_head=False, **kwargs):
        kwargs.setdefault("name", "discriminator")
        super().__init__(config, embeddings, **kwargs)
        self.rtd_head = ReplacedTokenDetectionHead(self.config, dtype=self.dtype_policy) if rtd_head else None
        self.mlm_head = (MaskedLMHead(self.config, self.embeddings, name="mlm_predictions",
                                      dtype=self.dtype_policy) if mlm_head else None)
        self.build()

    def _heads(self):
        return (self.rtd_head, self.mlm_head)

    def call(self, inputs, training=None, positions=None):
        """`positions` [batch, n]: the masked-LM head scores only those positions (`mlm_logits`
        [batch, n, V]), as the MLM objectives need (at every position, the vocabulary projection
        took more of the BERT baseline's step than all the rest of it)."""
        sequence_output = self.encode(inputs, training=training)
        outputs = {"sequence_output": sequence_output, "cls_output": sequence_output[:, 0, :]}
        if self.rtd_head is not None:
            outputs["rtd_logits"] = self.rtd_head(sequence_output)
        if self.mlm_head is not None:
            hidden = sequence_output if positions is None else gather_positions(sequence_output, positions)
            outputs["mlm_logits"] = self.mlm_head(hidden)
        return outputs

    def get_config(self):
        return {**super().get_config(), "rtd_head": self.rtd_head is not None,
                "mlm_head": self.mlm_head is not None}
