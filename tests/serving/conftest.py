"""Tiny SavedModels shaped like the ELECTRA export, built once per test session.

Signatures (all with a batch dimension):
- `serving_default`: tf.string `text`, `text_pair` -> float32 `probabilities` [batch, 2],
  tf.string `label` [batch]. Tokenized in-graph with TF Text ops, like the exporter.
- `single_text`: tf.string `text` -> `probabilities`, `label` (one input).
- `serve_ids`: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] -> float32
  `logits` [batch, 2] (one output).
- `echo`: tf.string `data` -> tf.string `echo` = data + b"\\xff" (bytes that are not
  UTF-8, so the REST response must fall back to {"b64": ...}).
- `lookup`: int32 `ids` [batch] -> float32 `value` = [0, 1, 2, 3][ids] + V; an id outside
  0..3 fails inside the graph (InvalidArgument), as a token id beyond the vocabulary does.

Version V adds V to the second logit, so responses tell the versions apart.
"""

import os
import shutil

import pytest
import tensorflow as tf
import tensorflow_text as tf_text


class TinyClassifier(tf.Module):
    def __init__(self, bias: float):
        super().__init__()
        self.bias = tf.Variable(bias, dtype=tf.float32)
        self.tokenizer = tf_text.WhitespaceTokenizer()

    def _classify(self, text, text_pair):
        text = tf_text.normalize_utf8(text, "NFKC")
        text_pair = tf_text.normalize_utf8(text_pair, "NFKC")
        n_words = self.tokenizer.tokenize(text).row_lengths() + self.tokenizer.tokenize(text_pair).row_lengths()
        n_words = tf.cast(n_words, tf.float32)  # [batch]
        logits = tf.stack([n_words * 0.5, tf.fill(tf.shape(n_words), self.bias)], axis=1)  # [batch, 2]
        probabilities = tf.nn.softmax(logits)
        label = tf.where(probabilities[:, 1] > probabilities[:, 0], "positive", "negative")
        return {"probabilities": probabilities, "label": label}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                  tf.TensorSpec([None], tf.string, name="text_pair")])
    def serving_default(self, text, text_pair):
        return self._classify(text, text_pair)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def single_text(self, text):
        return self._classify(text, tf.fill(tf.shape(text), ""))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                                  tf.TensorSpec([None, None], tf.int32, name="input_mask"),
                                  tf.TensorSpec([None, None], tf.int32, name="segment_ids")])
    def serve_ids(self, input_ids, input_mask, segment_ids):
        total = tf.cast(tf.reduce_sum(input_ids * input_mask + segment_ids, axis=1), tf.float32)
        return {"logits": tf.stack([total, tf.fill(tf.shape(total), self.bias)], axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="data")])
    def echo(self, data):
        return {"echo": tf.strings.join([data, tf.fill(tf.shape(data), b"\xff")])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32, name="ids")])
    def lookup(self, ids):
        return {"value": tf.gather(tf.range(4, dtype=tf.float32) + self.bias, ids)}


def save_tiny_model(path: str, version: int) -> None:
    module = TinyClassifier(float(version))
    tf.saved_model.save(module, path, signatures={
        "serving_default": module.serving_default,
        "single_text": module.single_text,
        "serve_ids": module.serve_ids,
        "echo": module.echo,
        "lookup": module.lookup,
    })


@pytest.fixture(scope="session")
def model_templates(tmp_path_factory):
    """{version: path} of saved versions 1 and 2, to copy into a base path."""
    root = tmp_path_factory.mktemp("templates")
    paths = {}
    for version in (1, 2):
        paths[version] = str(root / str(version))
        save_tiny_model(paths[version], version)
    return paths


def _install_version(templates, base_path, version: int, source_version: int | None = None) -> str:
    """Copy a template into BASE/VERSION atomically (copy aside, then rename), as a deploy should."""
    os.makedirs(base_path, exist_ok=True)
    staging = os.path.join(os.path.dirname(os.path.abspath(base_path)), f".staging-{version}")
    shutil.copytree(templates[source_version or version], staging)
    target = os.path.join(base_path, str(version))
    os.rename(staging, target)
    return target


@pytest.fixture(scope="session")
def install_version():
    return _install_version


@pytest.fixture(scope="session")
def model_base(model_templates, tmp_path_factory):
    """tmp/models/tiny with version 1 only."""
    base = tmp_path_factory.mktemp("models") / "tiny"
    _install_version(model_templates, str(base), 1)
    return str(base)
