"""ELECTRA models: the shared encoder blocks, generator, discriminator and pretrainer.

Importing this package registers every layer and model with Keras under the package name
"electra_tf", the fine-tuning heads of `electra_tf.finetune.heads` and the optimizers of
`electra_tf.training.optimizer` included, so that `keras.saving.load_model("x.keras")` needs
neither `custom_objects` nor `safe_mode=False`. (`import electra_tf` alone stays light: it does
not import Keras, so it cannot register anything.)
"""

from electra_tf.models.discriminator import Discriminator, ReplacedTokenDetectionHead
from electra_tf.models.encoder import (
    ElectraBackbone, EmbeddingProjection, Embeddings, Encoder, TransformerLayer, dummy_inputs)
from electra_tf.models.generator import Generator, MaskedLMHead
from electra_tf.models.pretrainer import ElectraPretrainer

# Registration of what else a saved model holds: the fine-tuning heads, which build on the classes
# above (when the heads module is the one being imported first, this finds it half-loaded in
# sys.modules and returns: it finishes on its own), and the optimizers of a compiled model.
import electra_tf.finetune.heads  # noqa: F401
import electra_tf.training.optimizer  # noqa: F401

__all__ = [
    "Discriminator", "ElectraBackbone", "ElectraPretrainer", "EmbeddingProjection", "Embeddings",
    "Encoder", "Generator", "MaskedLMHead", "ReplacedTokenDetectionHead", "TransformerLayer",
    "dummy_inputs",
]
