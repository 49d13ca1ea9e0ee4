"""TensorBoard scalars without the `tensorboard` package.

`tf.summary.scalar` is implemented by the tensorboard package, which we keep an optional extra
(it is only the viewer). A scalar summary is `tf.summary.write` of a float32 scalar with the
"scalars" plugin's metadata, so that is what `scalar` writes: TensorBoard shows it exactly as one
written by `tf.summary.scalar`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars", content=b""))


def scalar(name: str, value, step) -> bool:
    """Writes `value` as scalar `name` at `step` to the default summary writer."""
    return tf.summary.write(name, tf.cast(value, tf.float32), step=step,
                            metadata=_SCALAR_METADATA.SerializeToString())
