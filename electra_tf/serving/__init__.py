"""Export of fine-tuned ELECTRA heads as TensorFlow Serving SavedModels (`export.py`).

The local server, client and deployment files live in the top-level `serving/` package.
"""

from electra_tf.serving.export import (
    EXPORT_REPORT,
    ServingPreprocessor,
    custom_op_report,
    export_finetuned,
    export_head,
    next_version,
    saved_model_ops,
)

__all__ = [
    "EXPORT_REPORT",
    "ServingPreprocessor",
    "custom_op_report",
    "export_finetuned",
    "export_head",
    "next_version",
    "saved_model_ops",
]
