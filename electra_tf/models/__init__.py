"""ELECTRA models: the shared encoder blocks, generator, discriminator and pretrainer.

Importing this package registers its layers and models with Keras under the package name
"electra_tf"; `import electra_tf.keras_objects` registers these, the fine-tuning heads and the
optimizers, so that `keras.saving.load_model("x.keras")` needs neither `custom_objects` nor
`safe_mode=False`. (`import electra_tf` alone stays light: it does not import Keras, so it
cannot register anything.)
"""

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
