"""The heads as Keras models: `fit` and `evaluate` on (inputs, labels), `save` / `load_model`.

One head of each task family on a synthetic fixed batch (tiny encoder, 64-token vocabulary, dropout
off), trained, evaluated, saved and loaded in one test (a compile and a trace of each step per head). The fine-tuning loop's loss is `train_step.step_fn`'s: per-example losses summed over the
batch, divided by the batch size; `fit` must report exactly that, weights included.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from electra_tf.config import ElectraConfig
from electra_tf.data.pipeline import untuned
from electra_tf.finetune.heads import (
    MultipleChoiceClassifier, SentenceClassifier, SentenceRegressor, SpanQuestionAnswerer, TokenTagger)

VOCAB, CLS, SEP = 64, 2, 3
BATCH, SEQ = 8, 16
FAMILIES = ("classification", "regression", "tagging", "qa", "multiple_choice")
SAMPLE_WEIGHT = np.array([1.0, 0.0, 2.0, 1.0, 0.5, 1.0, 3.0, 1.0], np.float32)


def config():
    return ElectraConfig.from_json("electra_tiny").replace(
        vocab_size=VOCAB, cls_token_id=CLS, sep_token_id=SEP, mask_token_id=4,
        hidden_dropout=0.0, attention_dropout=0.0)


def make_head(family):
    c = config()
    return {"classification": lambda: SentenceClassifier(c, num_labels=3, dropout=0.0),
            "regression": lambda: SentenceRegressor(c, dropout=0.0),
            "tagging": lambda: TokenTagger(c, num_labels=3),
            "qa": lambda: SpanQuestionAnswerer(c, beam_size=4, hidden_size=32),
            "multiple_choice": lambda: MultipleChoiceClassifier(c, dropout=0.0)}[family]()


def make_features(family, seed=0):
    """A fixed batch with padding and, for QA, a question segment and a context segment; for
    multiple choice three choices an example (the third of example 2 missing: all zeros)."""
    rng = np.random.default_rng(seed)
    if family == "multiple_choice":  # [CLS] context [SEP] choice [SEP] per choice
        rows = [make_features("classification", seed=10 * seed + c) for c in range(3)]
        f = {k: np.stack([r[k] for r in rows], axis=1) for k in ("input_ids", "input_mask", "segment_ids")}
        f["segment_ids"][:, :, 4:] = f["input_mask"][:, :, 4:]
        for key in ("input_ids", "input_mask", "segment_ids"):
            f[key][2, 2] = 0
        labels = rng.integers(0, 3, BATCH)
        labels[2] = labels[2] % 2
        f["label"] = labels.astype(np.int32)
        return f
    ids = rng.integers(5, VOCAB, (BATCH, SEQ)).astype(np.int32)
    lengths = rng.integers(10, SEQ + 1, BATCH)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = CLS
    ids[np.arange(BATCH), lengths - 1] = SEP
    ids[:, 3] = SEP  # [CLS] q q [SEP] context ... [SEP]
    ids *= mask
    segments = np.zeros_like(ids)
    if family == "qa":
        segments[:, 4:] = 1
        segments *= mask
    f = {"input_ids": ids, "input_mask": mask, "segment_ids": segments}
    if family == "classification":
        f["label"] = rng.integers(0, 3, BATCH).astype(np.int32)
    elif family == "regression":
        f["label"] = rng.uniform(0, 5, BATCH).astype(np.float32)
    elif family == "tagging":
        f["label_ids"] = rng.integers(0, 3, (BATCH, SEQ)).astype(np.int32) * mask
        inner = mask * (np.arange(SEQ)[None, :] > 0) * (np.arange(SEQ)[None, :] < lengths[:, None] - 1)
        f["label_weights"] = (rng.random((BATCH, SEQ)) < 0.6).astype(np.int32) * inner
    else:
        starts = np.array([rng.integers(4, n - 1) for n in lengths])
        ends = np.minimum(starts + rng.integers(0, 3, BATCH), lengths - 2)
        impossible = np.zeros(BATCH, np.int32)
        impossible[[1, 5]] = 1  # unanswerable: the span is [CLS]
        f.update(start_positions=(starts * (1 - impossible)).astype(np.int32),
                 end_positions=(ends * (1 - impossible)).astype(np.int32),
                 is_impossible=impossible)
    return f


def loop_loss(head, f, sample_weight=None):
    """`train_step.step_fn`'s loss on the batch (times per-example weights when given)."""
    inputs, _ = head.split_labels(f)
    losses = head.per_example_loss(f, head(inputs, training=True))
    if sample_weight is not None:
        losses = losses * sample_weight
    return float(tf.reduce_sum(losses) / BATCH)


def one_batch(*parts):
    # Untuned: an autotuned iterator left to the collector stalls whoever frees it (pipeline.untuned).
    return untuned(tf.data.Dataset.from_tensors(tuple(parts)))


def expected_metric(family, f, out):
    if family in ("classification", "multiple_choice"):
        return np.mean(np.argmax(out["logits"], -1) == f["label"])
    if family == "regression":
        return np.mean((np.asarray(out["predictions"]) - f["label"]) ** 2)
    if family == "tagging":
        w = f["label_weights"]
        return np.sum((np.argmax(out["logits"], -1) == f["label_ids"]) * w) / np.sum(w)
    return np.mean(np.argmax(out["start_logits"], -1) == f["start_positions"])


@pytest.mark.parametrize("family", FAMILIES)
def test_fit_evaluate_save_and_load(family, tmp_path):
    """One head per family, compiled once with a metric, holds three claims (each step traced
    once, where three tests built and traced a head each):
    - `fit` reports the loop's loss before the update, weights included, and learns (30 steps
      at least halve the loss);
    - `evaluate` reports the loop's loss, with or without weights, and it is the loss of the
      labels given (the trained head does much worse on other examples' labels); the compiled
      metric is scored on the head's targets (given labels and other labels alike);
    - `save` / `load_model` (no custom objects, safe mode) give the same class, config, weight
      paths, optimizer step and outputs; a fresh head from the config differs."""
    keras.utils.set_random_seed(0)
    head = make_head(family)
    f = make_features(family)
    x, y = head.split_labels(f)
    assert not set(y) & {"input_ids", "input_mask", "segment_ids"} and y
    before = loop_loss(head, f)
    weighted = loop_loss(head, f, SAMPLE_WEIGHT)
    assert abs(weighted - before) > 1e-3  # the weights matter on this batch

    metric = (keras.metrics.MeanSquaredError(name="metric") if family == "regression"
              else keras.metrics.SparseCategoricalAccuracy(name="metric"))
    head.compile(optimizer=keras.optimizers.Adam(3e-3), metrics=[metric])
    step0 = head.fit(one_batch(x, y, SAMPLE_WEIGHT), verbose=0).history["loss"][0]
    np.testing.assert_allclose(step0, weighted, rtol=1e-5)  # the loss before the update
    # Weights of one: the same loss as none, and the step traced above serves all 30 steps.
    ones = np.ones(BATCH, np.float32)
    head.fit(one_batch(x, y, ones).repeat(), steps_per_epoch=30, verbose=0)
    after = loop_loss(head, f)
    assert after < 0.5 * before, (family, before, after)

    # `evaluate` reports the loop's loss, with or without weights, and it is the loss of the
    # labels given: the trained head does much worse on other examples' labels.
    results = head.evaluate(one_batch(x, y), verbose=0, return_dict=True)
    np.testing.assert_allclose(results["loss"], after, rtol=1e-5)
    np.testing.assert_allclose(results["metric"], expected_metric(family, f, head(x)), rtol=1e-5)
    weighted_results = head.evaluate(one_batch(x, y, SAMPLE_WEIGHT), verbose=0, return_dict=True)
    np.testing.assert_allclose(weighted_results["loss"], loop_loss(head, f, SAMPLE_WEIGHT), rtol=1e-5)
    other = {k: v[::-1] for k, v in y.items() if k not in x}  # QA: keep the gold start input
    other_results = head.evaluate(one_batch(x, {**y, **other}), verbose=0, return_dict=True)
    np.testing.assert_allclose(other_results["loss"], loop_loss(head, {**f, **other}), rtol=1e-5)
    assert other_results["loss"] > 2 * after
    np.testing.assert_allclose(other_results["metric"], expected_metric(family, {**f, **other}, head(x)),
                               rtol=1e-5)

    head.save(tmp_path / "head.keras")
    loaded = keras.saving.load_model(tmp_path / "head.keras")  # no custom_objects, safe mode
    assert type(loaded) is type(head) and loaded.get_config() == head.get_config()
    assert loaded.name == "task_specific"
    assert int(loaded.optimizer.iterations) == int(head.optimizer.iterations) == 31
    assert [v.path for v in loaded.weights] == [v.path for v in head.weights]
    inputs = {k: x[k] for k in ("input_ids", "input_mask", "segment_ids")}
    calls = [x, inputs] if family == "qa" else [inputs]  # QA: gold-start and top-k paths
    for features in calls:
        want, got = head(features), loaded(features)
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]), err_msg=key)
    assert loop_loss(loaded, f) == loop_loss(head, f)
    fresh = type(head).from_config(head.get_config())
    assert not np.allclose(loop_loss(fresh, f), loop_loss(head, f))


def test_labels_as_one_tensor_or_inside_the_features():
    keras.utils.set_random_seed(2)
    head = make_head("classification")
    f = make_features("classification", seed=2)
    x, _ = head.split_labels(f)
    head.compile(optimizer=keras.optimizers.SGD(0.0))  # no update: every call sees the same model
    want = loop_loss(head, f)
    for data in (one_batch(x, f["label"]), one_batch(f)):  # y a tensor; no y at all
        np.testing.assert_allclose(head.fit(data, verbose=0).history["loss"][0], want, rtol=1e-5)
    tagger = make_head("tagging")
    with pytest.raises(ValueError, match="label_ids"):
        tagger.compute_loss(x, np.zeros((BATCH, SEQ), np.int32), y_pred=tagger(x))
    with pytest.raises(ValueError, match="y_pred"):
        head.compute_loss(f)


def test_fit_under_two_replicas_takes_the_one_device_step():
    """Each replica's loss is its share of the global-batch mean: the summed gradients are the
    one-device gradient (`tests/conftest.py` gives the CPU two logical devices)."""
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(devices) < 2:
        pytest.skip("needs the two logical CPUs of tests/conftest.py")
    f = make_features("classification", seed=4)
    keras.utils.set_random_seed(4)
    one = make_head("classification")
    x, y = one.split_labels(f)
    initial = one.get_weights()
    one.compile(optimizer=keras.optimizers.SGD(0.5))
    one_loss = one.fit(one_batch(x, y, SAMPLE_WEIGHT), verbose=0).history["loss"][0]
    # Reduced by copying to one device, as create_strategy does for CPUs: TF's collective ops
    # pair up tensors of other strategies built earlier in the same process ("Shape mismatch in
    # the collective instance").
    strategy = tf.distribute.MirroredStrategy(
        devices[:2], cross_device_ops=tf.distribute.ReductionToOneDevice())
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        two = make_head("classification")
        two.set_weights(initial)
        two.compile(optimizer=keras.optimizers.SGD(0.5))
    two_loss = two.fit(one_batch(x, y, SAMPLE_WEIGHT), verbose=0).history["loss"][0]
    np.testing.assert_allclose(two_loss, one_loss, rtol=1e-5)
    assert all(not np.array_equal(a.numpy(), w0) for a, w0 in zip(one.weights, initial))
    for a, b in zip(one.weights, two.weights):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
