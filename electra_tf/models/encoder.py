"""The BERT-style building blocks shared by ELECTRA's generator and discriminator.

Faithful to the released checkpoints (the authors' `model/modeling.py`; sizes in the paper's
Table 6): post-LayerNorm transformer, LayerNorm epsilon 1e-12, exact erf GELU (not the tanh
approximation some ports use), dropout 0.1, truncated-normal initialisation with stddev 0.02, no
pooler.

Layer and weight names mirror the original TF1 variable names (`embeddings/LayerNorm`,
`layer_3/intermediate`, ...) so that checkpoint conversion and layer-wise learning-rate decay can
find them by path.
"""

from __future__ import annotations

import contextlib
import weakref

import keras
import tensorflow as tf
from keras import ops

from electra_tf.config import ElectraConfig


def electra_kernel_initializer(config: ElectraConfig):
    """Truncated normal with stddev `initializer_range` (0.02), cut at 2 stddev like TF1's."""
    return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


# Every layer, model and activation below is registered under this package name, so that
# `keras.saving.load_model("x.keras")` finds them once `electra_tf.models` is imported.
register = keras.saving.register_keras_serializable(package="electra_tf")


@register
def gelu(x):
    """The exact erf GELU of the original code (`hidden_act: "gelu"`)."""
    return keras.activations.gelu(x, approximate=False)


@register
def gelu_approximate(x):
    """The tanh approximation some ports use (`hidden_act: "gelu_approximate"`)."""
    return keras.activations.gelu(x, approximate=True)


def activation(name: str):
    """The activation function for `ElectraConfig.hidden_act`: named functions, no lambdas, so
    the Dense layers' configs serialise (and load without `safe_mode=False`)."""
    if name == "gelu":
        return gelu
    if name == "gelu_approximate":
        return gelu_approximate
    return keras.activations.get(name)


def dropout(x, rate: float, seed_generator: keras.random.SeedGenerator):
    """Inverted dropout whose keep/drop draws are 16-bit: half the random bits of Keras'.

    Keras (`tf.nn.experimental.stateless_dropout`) draws one float32 uniform per element; on CPU
    that random-number generation was the largest non-matmul cost of the pretraining step
    (profile in docs/benchmarks.md). Here each 32-bit Philox output decides two elements through its two
    16-bit halves: an element is dropped when its half is below round(rate x 65536), so the
    drop rate is that over 65536 (0.1 -> 0.100006) and kept elements are scaled by
    1 / (1 - that rate), keeping the expectation exact. The draw is a pure function of the seed
    generator's state, which advances once per call as in Keras' `Dropout`.
    Falls back to Keras' dropout when the last dimension is odd or unknown.
    """
    last = x.shape[-1]
    if last is None or last % 2:
        return keras.random.dropout(x, rate, seed=seed_generator)
    threshold = round(rate * 65536)
    seed = tf.cast(tf.math.floormod(seed_generator.next(), 2**31 - 1), tf.int32)
    shape = tf.concat([tf.shape(x)[:-1], [last // 2]], axis=0)
    bits = tf.random.stateless_uniform(shape, seed, minval=None, maxval=None, dtype=tf.uint32)
    keep = tf.reshape(tf.bitcast(bits, tf.uint16), tf.shape(x)) >= threshold
    scale = tf.cast(65536 / (65536 - threshold), x.dtype)
    return tf.where(keep, x * scale, tf.zeros([], x.dtype))


@register
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` (same arguments, same seed-generator state) with `dropout` above."""

    def call(self, inputs, training=False):
        if not training or self.rate == 0 or self.noise_shape is not None:
            return super().call(inputs, training=training)
        return dropout(inputs, self.rate, self.seed_generator)


def as_electra_config(config) -> ElectraConfig:
    """`config` itself, or the `ElectraConfig` of its dict: the form `get_config()` stores, so
    every `from_config` (Keras' default `cls(**config)`) rebuilds the config validated."""
    return config if isinstance(config, ElectraConfig) else ElectraConfig.from_dict(config)


@register
class Embeddings(keras.layers.Layer):
    """Word + position + token-type embeddings, then LayerNorm and dropout, all of width E.

    The generator and discriminator share one instance by default (paper Section 3.2).

    Args:
      config: an `ElectraConfig` (or its dict).

    Example:
    >>> emb = Embeddings(ElectraConfig.from_json("electra_tiny"))
    >>> emb(ops.ones((2, 8), "int32"), ops.zeros((2, 8), "int32")).shape
    (2, 8, 32)
    """

    def __init__(self, config, **kwargs):
        kwargs.setdefault("name", "embeddings")
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        c = self.config
        # --- layers ---
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, name="LayerNorm", dtype=self.dtype_policy)
        self.dropout = Dropout(c.hidden_dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        # Weights are created under the caller's name scope (`discriminator/embeddings/...`).
        c = self.config
        init = electra_kernel_initializer(c)
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(c.vocab_size, c.embedding_size), initializer=init)
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(c.max_position_embeddings, c.embedding_size),
            initializer=init)
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=(c.type_vocab_size, c.embedding_size),
            initializer=init)
        self.layer_norm.build((None, None, c.embedding_size))

    def call(self, input_ids, segment_ids, training=None):
        # --- forward graph ---
        seq_length = ops.shape(input_ids)[1]
        x = ops.take(self.word_embeddings, input_ids, axis=0)  # [batch, seq, E]
        x = x + ops.take(self.token_type_embeddings, segment_ids, axis=0)
        x = x + self.position_embeddings[None, :seq_length, :]
        x = self.layer_norm(x)
        return self.dropout(x, training=training)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _batch_matmul(a, b, adjoint_b=False):
    return tf.matmul(a, b, transpose_b=adjoint_b)


def _eigen_transpose(x, perm):
    """`tf.transpose` through a same-width integer view: TensorFlow's oneDNN pass rewrites every
    float transpose into a oneDNN reorder, ~45-75 us however small the tensor; an integer one
    stays Eigen's (~8-10 us for one sentence's heads; AVX-512 EPYC). A bitcast copies nothing."""
    as_int = {2: tf.int16, 4: tf.int32, 8: tf.int64}[x.dtype.size]
    return tf.bitcast(tf.transpose(tf.bitcast(x, as_int), perm), x.dtype)


def _eigen_batch_matmul(a, b, adjoint_b=False):
    """A batched matmul on Eigen's kernel: the oneDNN pass rewrites `BatchMatMulV2` (what
    `tf.matmul` emits), not `BatchMatMulV3`."""
    return tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=a.dtype, adj_y=adjoint_b)


def _elementwise_softmax(scores):
    """Softmax over the last axis as element-wise ops and reductions (what TensorFlow's own CPU
    kernel computes): the oneDNN pass rewrites `Softmax`, ~80 us at one sentence's [1, heads,
    12, 12] against a few us for these (AVX-512 EPYC)."""
    exp = tf.exp(scores - tf.reduce_max(scores, axis=-1, keepdims=True))
    return exp / tf.reduce_sum(exp, axis=-1, keepdims=True)


# (transpose, batched matmul, softmax) for SelfAttention's per-head work. oneDNN's are the faster
# from a few hundred rows on (training batches, large requests); for a short request, Eigen's run
# the same work ~2.5x faster (AVX-512 EPYC; docs/benchmarks.md, "Serving latency"; not measured on
# an AVX2-only CPU).
_ONEDNN = (tf.transpose, _batch_matmul, tf.nn.softmax)
_EIGEN = (_eigen_transpose, _eigen_batch_matmul, _elementwise_softmax)
# float32 inference calls with at most this many rows (batch x seq) take the Eigen kernels.
EIGEN_ATTENTION_ROWS = 64


@register
class SelfAttention(keras.layers.MultiHeadAttention):
    """BERT self-attention with `keras.layers.MultiHeadAttention`'s weights, computed with matmuls.

    The variables (and so checkpoints and conversion) are exactly Keras' `MultiHeadAttention`'s:
    query/key/value kernels [H, heads, head_dim], output kernel [heads, head_dim, H]. Only the
    forward pass differs, for speed (profile in docs/benchmarks.md): Keras projects Q, K and V with three
    einsums, each a batched matmul with its own transposes; here ONE [H, 3H] matmul projects all
    three (the 1/sqrt(head_dim) scale folded into the query kernel), and the scores and the
    weighted sum are batched matmuls over [batch x heads, seq, head_dim]. Padding keys get -10000
    added to their scores, as the original `modeling.py` (`attention_mask` adder). Inference
    calls (float32, `training` false) of at most `EIGEN_ATTENTION_ROWS` rows run the per-head
    transposes, products and softmax on Eigen's kernels, faster than oneDNN's at one sentence's
    size; inside `export_weights` (exports) the projections come from one fused variable.

    Called as `layer(x, attention_mask, training=...)` with x [batch, seq, H] and attention_mask
    [batch, seq] (1 for real tokens), or [batch, seq (query), seq (key)] (1 where the query may
    attend: the original's 3-D mask, used by Electric's one-directional towers). Build it with
    `build(shape, shape)` like the Keras layer.

    Example:
    >>> att = SelfAttention(num_heads=2, key_dim=32)
    >>> att.build((None, None, 64), (None, None, 64))
    >>> att(keras.random.normal((2, 8, 64)), ops.ones((2, 8))).shape
    (2, 8, 64)
    """

    def call(self, x, attention_mask, training=None):
        # --- forward graph ---
        heads, head_dim = self._num_heads, self._key_dim
        width = heads * head_dim
        batch, seq, hidden = tf.shape(x)[0], tf.shape(x)[1], x.shape[-1]
        fused = None if training else _EXPORT_WEIGHTS.get(self)
        if fused is None:
            kernel, bias = self.qkv_weights()
        else:  # an export's variables (`export_weights`)
            kernel, bias = (tf.cast(w, x.dtype) for w in fused)
        qkv = tf.matmul(tf.reshape(x, (-1, hidden)), kernel) + bias  # [batch * seq, 3 width]
        adder = (1.0 - tf.cast(attention_mask, qkv.dtype)) * -10000.0  # [batch, (seq,) seq]
        # A [batch, seq, seq] mask gives each query its own keys (Electric's causal towers).
        adder = adder[:, None, :, :] if adder.shape.rank == 3 else adder[:, None, None, :]
        if training or qkv.dtype != tf.float32:  # Eigen's BatchMatMulV3 has no float16 CPU kernel
            context = self._attend(qkv, adder, batch, seq, _ONEDNN, training)
        else:  # a short request runs the small per-head ops faster on Eigen's kernels
            context = tf.cond(batch * seq <= EIGEN_ATTENTION_ROWS,
                              lambda: self._attend(qkv, adder, batch, seq, _EIGEN, False),
                              lambda: self._attend(qkv, adder, batch, seq, _ONEDNN, False))
        out_dense = self._output_dense
        out = tf.matmul(context, tf.reshape(out_dense.kernel, (width, -1))) + out_dense.bias
        return tf.reshape(out, (batch, seq, -1))  # [batch, seq, H]

    def _attend(self, qkv, adder, batch, seq, kernels, training):
        """The attention of the projected [batch * seq, 3 width] `qkv`: [batch * seq, width].
        `kernels` (`_ONEDNN` or `_EIGEN`) gives the transpose, batched matmul and softmax to use."""
        transpose, batch_matmul, softmax = kernels
        heads, head_dim = self._num_heads, self._key_dim
        qkv = transpose(tf.reshape(qkv, (batch, seq, 3, heads, head_dim)),
                        (2, 0, 3, 1, 4))  # [3, batch, heads, seq, head_dim]
        # Batched matmuls over ONE batch axis (batch x heads): TF's oneDNN kernels ran the 4-D
        # [batch, heads, ...] form at ~55% of the 3-D one's speed (docs/benchmarks.md). Reshapes are free.
        qkv = tf.reshape(qkv, (3, batch * heads, seq, head_dim))
        # unstack, not qkv[i]: the gradient of each slice would be a full-size zero-padded tensor.
        query, key, value = tf.unstack(qkv)
        scores = tf.reshape(batch_matmul(query, key, adjoint_b=True),
                            (batch, heads, seq, seq))  # [batch, heads, seq (query), seq (key)]
        probs = softmax(scores + adder)
        if training and self._dropout > 0:  # the Keras layer's seed generator, our draw
            probs = dropout(probs, self._dropout, self._dropout_layer.seed_generator)
        context = batch_matmul(tf.reshape(probs, (batch * heads, seq, seq)), value)
        context = transpose(tf.reshape(context, (batch, heads, seq, head_dim)), (0, 2, 1, 3))
        return tf.reshape(context, (-1, heads * head_dim))  # [batch * seq, width]

    def qkv_weights(self):
        """(kernel [H, 3 width], bias [3 width]): the query, key and value projections side by
        side, the query's scaled by 1/sqrt(head_dim)."""
        hidden, width = self._query_dense.kernel.shape[0], self._num_heads * self._key_dim
        dense = (self._query_dense, self._key_dense, self._value_dense)
        scales = (self._inverse_sqrt_key_dim, 1.0, 1.0)
        kernel = tf.concat([tf.reshape(d.kernel, (hidden, width)) * s
                            for d, s in zip(dense, scales)], axis=1)
        bias = tf.concat([tf.reshape(d.bias, (width,)) * s for d, s in zip(dense, scales)], axis=0)
        return kernel, bias


# Layer -> what its inference calls use in an export (`export_weights`): a SelfAttention's
# fused (kernel, bias) variables; for a TransformerLayer, True: its feed-forward in parts for
# short requests. Weak: an export's variables live as long as the layer, and the layer's own
# tracking (checkpoints, .keras files) never sees them.
_EXPORT_WEIGHTS: "weakref.WeakKeyDictionary[keras.layers.Layer, object]" = weakref.WeakKeyDictionary()

# A short request's feed-forward in an export with constant weights (`export_weights(...,
# split_ffn=True)`) runs in FFN_PARTS independent parts of the hidden units, summed. At a dozen to
# a few dozen rows TensorFlow's oneDNN matmul makes poor use of a second thread (its hand-off to
# the other thread costs about what the work does: [12, 256] x [256, 1024] took 88-95 us on two
# threads, 80 on one); two chains x W1[:, part] -> GELU -> W2[part, :] that the executor runs side
# by side, each on one thread, took an ELECTRA-Small layer's FFN at 12 rows from 242 to 108 us, at
# 48 from 472 to 336; a batch-1 request 0.82x the time (AVX-512 EPYC, 2 cores; docs/benchmarks.md,
# "Serving latency"). Larger requests keep one chain: split always, a batch of 32 took ~1.1x the
# time (its groups, `families.sentence.by_length`, already run side by side). The parts are
# slices of the constant kernels, which TensorFlow's graph optimiser folds once at load; with
# variables they would be copied in every call, so exports that keep variables keep one chain.
FFN_PARTS = 2
SPLIT_FFN_ROWS = EIGEN_ATTENTION_ROWS  # the rows of a short request


@contextlib.contextmanager
def export_weights(model, split_ffn: bool = False):
    """Inside, the layers of `model` traced with `training=False` take the forms made for
    exports: every `SelfAttention` reads one [H, 3 width] projection kernel and bias made here, as
    variables, instead of concatenating (and scaling) three kernels in every call; with
    `split_ffn` (for weights frozen into the graph), every `TransformerLayer` runs the
    feed-forward of a request of at most `SPLIT_FFN_ROWS` rows in `FFN_PARTS` parts.

    For exports: a signature traced inside reads the fused variables (which the SavedModel then
    holds in place of the three projections: same size) and skips a copy of every layer's Q/K/V
    kernels per request, ~1.9 ms of an ELECTRA-Small batch-1 request's ~15 ms of kernels
    (docs/benchmarks.md, "Serving latency").
    The values are those of `SelfAttention.qkv_weights` when the block is entered: a model that
    trains on afterwards must be exported again. Training calls never use them.
    """
    layers = [layer for layer in model._flatten_layers()
              if isinstance(layer, SelfAttention) or (split_ffn and isinstance(layer, TransformerLayer))]
    try:
        for layer in layers:
            if isinstance(layer, SelfAttention):
                kernel, bias = layer.qkv_weights()
                _EXPORT_WEIGHTS[layer] = (
                    tf.Variable(kernel, trainable=False, name=f"{layer.name}_fused_qkv_kernel"),
                    tf.Variable(bias, trainable=False, name=f"{layer.name}_fused_qkv_bias"))
            else:
                _EXPORT_WEIGHTS[layer] = True
        yield
    finally:
        for layer in layers:
            _EXPORT_WEIGHTS.pop(layer, None)


@register
class TransformerLayer(keras.layers.Layer):
    """One post-LayerNorm BERT layer: self-attention and FFN, each followed by add & LayerNorm.

    Args:
      config: an `ElectraConfig` (or its dict) giving hidden size, heads, FFN size, dropouts.

    Example:
    >>> layer = TransformerLayer(ElectraConfig.from_json("electra_tiny"), name="layer_0")
    >>> layer(keras.random.normal((2, 8, 64)), ops.ones((2, 8))).shape
    (2, 8, 64)
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        c = self.config
        init = electra_kernel_initializer(c)
        policy = self.dtype_policy
        # --- layers ---
        self.attention = SelfAttention(
            num_heads=c.num_heads, key_dim=c.hidden_size // c.num_heads,
            dropout=c.attention_dropout, kernel_initializer=init, name="attention", dtype=policy)
        self.attention_dropout = Dropout(c.hidden_dropout, dtype=policy)
        self.attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, name="attention_output_LayerNorm", dtype=policy)
        self.intermediate = keras.layers.Dense(
            c.intermediate_size, activation=activation(c.hidden_act), kernel_initializer=init,
            name="intermediate", dtype=policy)
        self.output_dense = keras.layers.Dense(
            c.hidden_size, kernel_initializer=init, name="output", dtype=policy)
        self.output_dropout = Dropout(c.hidden_dropout, dtype=policy)
        self.output_layer_norm = keras.layers.LayerNormalization(
            epsilon=c.layer_norm_epsilon, name="output_LayerNorm", dtype=policy)

    def build(self, input_shape=None):
        c = self.config
        shape = (None, None, c.hidden_size)
        self.attention.build(shape, shape)
        self.attention_layer_norm.build(shape)
        self.intermediate.build(shape)
        self.output_dense.build((None, None, c.intermediate_size))
        self.output_layer_norm.build(shape)

    def call(self, x, attention_mask, training=None):
        # --- forward graph ---
        # attention_mask: [batch, seq] of 1 for real tokens.
        attended = self.attention(x, attention_mask, training=training)
        x = self.attention_layer_norm(x + self.attention_dropout(attended, training=training))
        hidden = self._feed_forward(x, training)
        return self.output_layer_norm(x + self.output_dropout(hidden, training=training))

    def _feed_forward(self, x, training=None):
        """The FFN with the Dense layers' weights as 2-D matmuls, each followed by its bias add.

        `keras.layers.Dense` on [batch, seq, H] goes through a tensordot whose reshape sits
        between the matmul and the bias add, so TensorFlow's graph optimiser could not fuse
        them; written flat, each matmul takes its bias (and in an inference graph the
        intermediate one its GELU) in one oneDNN kernel. Same values: the same matmul on the
        same rows (docs/benchmarks.md, "Serving latency"). In an export with constant weights a
        short request runs it in `FFN_PARTS` parts (`export_weights`).
        """
        inner, outer = self.intermediate, self.output_dense
        rows = tf.reshape(x, (-1, x.shape[-1]))

        def chain(kernel, bias, kernel_out):
            hidden = inner.activation(tf.nn.bias_add(tf.matmul(rows, kernel), bias))
            return tf.matmul(hidden, kernel_out)

        def whole():
            return tf.nn.bias_add(chain(inner.kernel, inner.bias, outer.kernel), outer.bias)

        if training or not _EXPORT_WEIGHTS.get(self):
            out = whole()
        else:  # an export's short requests: chains the executor runs side by side
            size = inner.kernel.shape[-1]
            bounds = [size * i // FFN_PARTS for i in range(FFN_PARTS + 1)]
            parts = [(inner.kernel[:, a:b], inner.bias[a:b], outer.kernel[a:b, :])
                     for a, b in zip(bounds, bounds[1:])]
            out = tf.cond(tf.shape(rows)[0] <= SPLIT_FFN_ROWS,
                          lambda: tf.nn.bias_add(tf.add_n([chain(*p) for p in parts]), outer.bias),
                          whole)
        return tf.reshape(out, tf.shape(x))  # the FFN maps H back to H

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


@register
class Encoder(keras.layers.Layer):
    """A stack of `config.num_layers` `TransformerLayer`s named `layer_0`, `layer_1`, ...

    Args:
      config: an `ElectraConfig` (or its dict).
    """

    def __init__(self, config, **kwargs):
        kwargs.setdefault("name", "encoder")
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        self.layers = [
            TransformerLayer(self.config, name=f"layer_{i}", dtype=self.dtype_policy)
            for i in range(self.config.num_layers)
        ]
        # tf.train.Checkpoint does not follow Keras' tracked lists: name each layer as an
        # attribute too, which also gives checkpoint keys like `encoder/layer_3/...`.
        for layer in self.layers:
            setattr(self, layer.name, layer)

    def build(self, input_shape=None):
        for layer in self.layers:
            layer.build()

    def call(self, x, attention_mask, training=None):
        for layer in self.layers:
            x = layer(x, attention_mask, training=training)
        return x

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


@register
class EmbeddingProjection(keras.layers.Layer):
    """Dense E -> H without activation (`embeddings_project`), present only when E != H."""

    def __init__(self, config, **kwargs):
        kwargs.setdefault("name", "embeddings_project")
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        self.dense = keras.layers.Dense(
            self.config.hidden_size, kernel_initializer=electra_kernel_initializer(self.config),
            name="dense", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.dense.build((None, None, self.config.embedding_size))

    def call(self, x):
        return self.dense(x)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


@register
class ElectraBackbone(keras.Model):
    """Embeddings (possibly shared), optional E -> H projection and the transformer encoder.

    The base of `Generator` and `Discriminator`. Takes a dict keyed by the TFRecord feature names
    (`input_ids`, `input_mask`, `segment_ids`; `segment_ids` may be omitted).

    Args:
      config: an `ElectraConfig` (or its dict) with this model's sizes.
      embeddings: an `Embeddings` layer to share; a new one is made when None.
      encoder, embeddings_project: layers to share (used by "all" weight tying).

    `get_config()` holds the config, not the shared layers: a model saved on its own
    (`model.save("x.keras")`) comes back with its own copies holding the saved values. Sharing
    is the pretrainer's to restore, and `ElectraPretrainer` saves and loads as one model.
    """

    def __init__(self, config, embeddings=None, encoder=None, embeddings_project=None, **kwargs):
        super().__init__(**kwargs)
        self.config = as_electra_config(config)
        c = self.config
        # --- layers ---
        self.embeddings = embeddings or Embeddings(c, dtype=self.dtype_policy)
        if embeddings_project is not None:
            self.embeddings_project = embeddings_project
        elif c.embedding_size != c.hidden_size:
            self.embeddings_project = EmbeddingProjection(c, dtype=self.dtype_policy)
        else:
            self.embeddings_project = None
        self.encoder = encoder or Encoder(c, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        """Creates every weight now, under this model's name scope (`discriminator/encoder/...`),
        so checkpoints restore before the first call. Shared layers already built are kept."""
        for layer in (self.embeddings, self.embeddings_project, self.encoder, *self._heads()):
            if layer is not None and not layer.built:
                layer.build()

    def _heads(self):
        return ()

    def encode(self, inputs, training=None):
        """Returns the final hidden states, [batch, seq, H]."""
        input_ids = inputs["input_ids"]
        segment_ids = inputs.get("segment_ids")
        if segment_ids is None:
            segment_ids = ops.zeros_like(input_ids)
        x = self.embeddings(input_ids, segment_ids, training=training)
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        return self.encoder(x, inputs["input_mask"], training=training)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def dummy_inputs(batch_size: int = 1, seq_length: int = 8):
    """A valid input dict, for building and smoke-testing models."""
    ones = ops.ones((batch_size, seq_length), "int32")
    return {"input_ids": ones, "input_mask": ones, "segment_ids": ops.zeros_like(ones)}
