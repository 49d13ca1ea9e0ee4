"""electra_tf: ELECTRA (Clark et al., ICLR 2020) on TensorFlow 2 / Keras 3."""

from electra_tf.config import ConfigError, ElectraConfig

__version__ = "0.1.0"
__all__ = ["ConfigError", "ElectraConfig"]
