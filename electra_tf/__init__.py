"""electra_tf: ELECTRA (Clark et al., ICLR 2020) on TensorFlow 2 / Keras 3.

`import electra_tf` is light; the Keras models (and TensorFlow) load on first use of a model name.
It turns on TensorFlow's oneDNN kernels on AVX2-only CPUs, where TensorFlow leaves them off
(`cpu.enable_onednn`; TF_ENABLE_ONEDNN_OPTS, when set, decides).
"""

from electra_tf import cpu
from electra_tf.config import ConfigError, ElectraConfig

# Before TensorFlow is imported: its fast (oneDNN) kernels on AVX2-only CPUs (see cpu.py).
cpu.enable_onednn()

__version__ = "0.1.0"

_MODELS = ("Discriminator", "ElectraPretrainer", "Generator")
_CONVERT = ("from_pretrained", "save_electra_checkpoint")
__all__ = ["ConfigError", "ElectraConfig", *_MODELS, *_CONVERT]


def __getattr__(name):
    if name in _MODELS:
        from electra_tf import models
        return getattr(models, name)
    if name in _CONVERT:
        from electra_tf import convert
        return getattr(convert, name)
    raise AttributeError(f"module 'electra_tf' has no attribute {name!r}")
