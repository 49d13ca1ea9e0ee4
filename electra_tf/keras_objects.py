"""Importing this module registers every Keras class electra_tf defines, so that
`keras.saving.load_model("x.keras")` loads any of them with no `custom_objects` and in safe mode:

    import electra_tf.keras_objects  # noqa: F401
    head = keras.saving.load_model("head.keras")

The classes register where they are defined (`@keras.saving.register_keras_serializable`), so a
module that imports them registers them too: `electra_tf.models` the encoder, generator,
discriminator and pretrainer; `electra_tf.finetune.heads` the fine-tuning heads;
`electra_tf.training.optimizer` the optimizers and schedules of a compiled model. This module sits
above all three and only imports them, so none of them has to import upward to register another.
"""

import electra_tf.finetune.heads  # noqa: F401
import electra_tf.models  # noqa: F401
import electra_tf.training.optimizer  # noqa: F401
