"""MirroredStrategy over the two logical CPUs that tests/conftest.py configures."""

import tensorflow as tf


def two_cpu_mirrored() -> tf.distribute.MirroredStrategy:
    """Two replicas on one CPU, reducing by copying to one device as `create_strategy("mirrored")`
    does on CPUs: TF's collective ops pair up tensors of strategies built earlier in the same
    process ("Shape mismatch in the collective instance")."""
    return tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
