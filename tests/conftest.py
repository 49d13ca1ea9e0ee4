"""Session-wide test set-up.

Two logical CPU devices are configured before TensorFlow initialises its runtime, so that
MirroredStrategy tests can run two replicas on one CPU. Other tests simply use CPU:0.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
except RuntimeError:  # the runtime was already initialised by an earlier import
    pass
