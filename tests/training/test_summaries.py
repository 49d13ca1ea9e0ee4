import tensorflow as tf

from electra_tf.training import summaries


def test_scalars_are_written_as_tensorboard_scalars_without_tensorboard(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        summaries.scalar("loss", 2.5, step=3)
        summaries.scalar("lr", tf.constant(1e-4, tf.float64), step=4)
    writer.flush()
    seen = {}
    for path in tmp_path.iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                seen[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)),
                                   value.metadata.plugin_data.plugin_name)
    assert seen == {"loss": (3, 2.5, "scalars"), "lr": (4, tf.constant(1e-4).numpy().item(),
                                                         "scalars")}
