"""ELECTRA models: the shared encoder blocks, generator, discriminator and pretrainer."""

from electra_tf.models.discriminator import Discriminator, ReplacedTokenDetectionHead
from electra_tf.models.encoder import (
    ElectraBackbone, EmbeddingProjection, Embeddings, Encoder, TransformerLayer, dummy_inputs)
from electra_tf.models.generator import Generator, MaskedLMHead
from electra_tf.models.pretrainer import ElectraPretrainer

__all__ = [
    "Discriminator", "ElectraBackbone", "ElectraPretrainer", "EmbeddingProjection", "Embeddings",
    "Encoder", "Generator", "MaskedLMHead", "ReplacedTokenDetectionHead", "TransformerLayer",
    "dummy_inputs",
]
