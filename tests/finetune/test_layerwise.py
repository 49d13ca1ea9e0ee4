"""Layer-wise learning-rate decay inside real heads (tiny model, Rotten Tomatoes batch).

The original Adam has no bias correction, so the first step of a variable is exactly
lr * multiplier * (1 - b1) g / (sqrt((1 - b2) g^2) + eps): with the gradients known, every
element's update predicts its multiplier, and the ratios between layers are the decay powers.
"""

import numpy as np
import pytest
import tensorflow as tf

from electra_tf.finetune import features as F
from electra_tf.finetune.config import FinetuningConfig
from electra_tf.finetune.heads import SentenceClassifier, SpanQuestionAnswerer
from electra_tf.finetune.train_step import create_finetuning_optimizer
from electra_tf.training.optimizer import layer_depth

DECAY, LR = 0.8, 1e-3


def expected_multiplier(path, n):
    """decay^(n+2-depth): embeddings n+2, layer_i n+1-i, head 0 (the original's numbering)."""
    if path.startswith("discriminator/embeddings"):
        return DECAY ** (n + 2)
    if "/layer_" in path:
        i = int(path.split("/layer_")[1].split("/")[0])
        return DECAY ** (n + 1 - i)
    assert path.startswith("task_specific/"), path
    return 1.0


@pytest.mark.parametrize("head_cls", [SentenceClassifier, SpanQuestionAnswerer])
def test_every_variable_gets_its_depth(tiny_config, head_cls):
    kwargs = {"num_labels": 2} if head_cls is SentenceClassifier else {}
    head = head_cls(tiny_config, **kwargs)
    n = tiny_config.num_layers
    depths = {v.path: layer_depth(v.path, n) for v in head.trainable_variables}
    assert {d for d in depths.values()} == {0, *range(1, n + 1), n + 2}
    head_vars = [p for p in depths if p.startswith("task_specific/")]
    assert head_vars and all(depths[p] == n + 2 for p in head_vars)
    assert all(depths[p] == 0 for p in depths if "/embeddings" in p)


def test_first_adam_step_scales_by_layer(tiny_config, tokenizer, rt_balanced):
    head = SentenceClassifier(tiny_config, num_labels=2, dropout=0.0)
    n = tiny_config.num_layers
    fc = FinetuningConfig(learning_rate=LR, layerwise_lr_decay=DECAY, warmup_proportion=0.0,
                          weight_decay=0.0, clip_norm=0.0)
    optimizer = create_finetuning_optimizer(fc, n, total_steps=100)  # lr(step 0) = LR, no warmup
    features = F.featurize_sentences(rt_balanced[:16], tokenizer, 24)
    with tf.GradientTape() as tape:
        loss = head.compute_loss(features, y_pred=head(features, training=True))
    variables = head.trainable_variables
    grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
    before = [v.numpy().copy() for v in variables]
    optimizer.apply_gradients(zip(grads, variables))

    by_depth = {}
    for v, g, old in zip(variables, grads, before):
        g = g.numpy().astype(np.float64)
        step = old - v.numpy()
        unit = LR * 0.1 * g / (np.sqrt(0.001 * g * g) + 1e-6)  # multiplier 1
        mult = expected_multiplier(v.path, n)
        # atol: float32 spacing of weights ~0.02-1 (the step is read back as old - new).
        atol = 4 * np.spacing(np.abs(old).astype(np.float32)).max()
        np.testing.assert_allclose(step, mult * unit, rtol=1e-4, atol=atol, err_msg=v.path)
        # The realised multiplier, measured where the gradient is far above eps.
        big = np.abs(g) > 1e-4
        if big.any():
            by_depth.setdefault(layer_depth(v.path, n), []).extend((step[big] / unit[big]).tolist())
    realised = {d: float(np.median(r)) for d, r in by_depth.items()}
    assert realised[n + 2] == pytest.approx(1.0, rel=1e-4)  # the head
    assert realised[n] == pytest.approx(DECAY ** 2, rel=1e-4)  # top layer: decay² (original's quirk)
    for d in range(n):
        assert realised[d] / realised[d + 1] == pytest.approx(DECAY, rel=1e-4)  # one layer = × decay


def test_layerwise_decay_can_be_disabled(tiny_config):
    head = SentenceClassifier(tiny_config, num_labels=2)
    fc = FinetuningConfig(layerwise_lr_decay=1.0)
    optimizer = create_finetuning_optimizer(fc, tiny_config.num_layers, total_steps=10)
    optimizer.build(head.trainable_variables)
    assert set(optimizer._lr_scales) == {1.0}
    optimizer = create_finetuning_optimizer(FinetuningConfig(), tiny_config.num_layers, 10)
    optimizer.build(head.trainable_variables)
    assert min(optimizer._lr_scales) == pytest.approx(0.8 ** (tiny_config.num_layers + 2))
