"""Checkpoint conversion: the authors' TF1 checkpoints, Hugging Face ELECTRA and our own format.

    from electra_tf.convert import from_pretrained, save_electra_checkpoint
    disc, config, vocab = from_pretrained("electra_small")   # TF1 archive, HF folder or ours
    disc, config, vocab = from_pretrained("google/electra-base-discriminator")  # a released name

Modules: `tf1` (name-based TF1 checkpoints), `hf` (safetensors / pytorch_model.bin +
config.json), `keras_hub` (keras-hub presets), `names` (released models by name: Hub ids and keras-hub presets
to local folders), `pretrained` (format detection, loading any of them, our format, `convert`), `common` (the weight walk shared by all, `ConversionReport`, `Pretrained`).
"""

from electra_tf.convert.common import ConversionError, ConversionReport
from electra_tf.convert.names import NameNotFoundError, resolve_checkpoint
from electra_tf.convert.pretrained import (
    convert, detect_format, from_pretrained, load_pretrained, save_electra_checkpoint,
    to_keras_hub_preset)

__all__ = ["ConversionError", "ConversionReport", "NameNotFoundError", "convert", "detect_format",
           "from_pretrained", "load_pretrained", "resolve_checkpoint", "save_electra_checkpoint",
           "to_keras_hub_preset"]
