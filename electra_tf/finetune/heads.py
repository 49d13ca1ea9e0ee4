"""Fine-tuning heads: Keras models that wrap a `Discriminator` encoder (no RTD head).

Every head takes the feature dict of `electra_tf.finetune.features` (`input_ids`, `input_mask`,
`segment_ids`, plus the task's labels when training) and returns a dict of float32 logits.
`per_example_loss(features, outputs)` gives the original's per-example loss [batch], float32
(the authors' `finetune/{classification,qa,tagging}/*_tasks.py`); our loop (`finetune.trainer`)
minimises its sum over the global batch divided by the global batch size, and Keras'
`compute_loss` hook returns that same number, so a head also trains with `model.fit` (see
`FinetuningHead`):

- `SentenceClassifier`: dropout 0.1 on the final [CLS] state -> dense(num_labels), softmax CE.
- `SentenceRegressor`: dropout 0.1 on [CLS] -> dense(1), squared error (STS-B).
- `TokenTagger`: dense(num_labels) over every token; the loss is summed over the first WordPiece
  of each word (`label_weights`), per sentence, as the original's tagging task.
- `SpanQuestionAnswerer`: the XLNet-style joint span predictor with the answerability classifier.
- `MultipleChoiceClassifier`: each `[CLS] context [SEP] choice [SEP]` scored by dropout 0.1 on
  its [CLS] state -> dense(1); softmax CE over the choices.

Each head belongs to one task family (`families/`; its `family` attribute), which builds it with
the task's options; `head_config.json` records both.

Layer names. The encoder's variables live under `discriminator/{embeddings,encoder/layer_i}/...`
and every head layer under `task_specific/<layer>/...` (`classifier`, `regressor`, `tagger`,
`qa_start`, `qa_hidden`, `qa_logits`, `answer_class_hidden`, `answer_class`, `choice_scorer`),
the TF1 code's `task_specific/<task>/...` minus the task name, which Keras names cannot nest.
Layer-wise learning-rate decay (`training.optimizer.layer_depth`) reads these paths: head layers
must never carry an (auto-generated) `layer_N` name, or they would be decayed as encoder layers.

Example:
>>> config = ElectraConfig.from_json("electra_tiny")
>>> head = SentenceClassifier(config, num_labels=2)
>>> out = head(dummy_inputs(2, 8))
>>> out["logits"].shape
(2, 2)
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.models.discriminator import Discriminator
from electra_tf.models.encoder import (
    activation, as_electra_config, electra_kernel_initializer, register)

HEAD_NAME = "task_specific"
# Masked logits get -1000 added, as the original (a large finite value keeps softmax finite).
_MASK_PENALTY = 1000.0


def _num_replicas():
    """Replicas summing their gradients (1 outside a replica context, as the loop's batch math)."""
    ctx = tf.distribute.get_replica_context()
    return 1 if ctx is None else ctx.num_replicas_in_sync


class FinetuningHead(keras.Model):
    """Base class: owns the encoder, the loss and metric hooks of `model.fit`, the config.

    Args:
      config: the encoder's `ElectraConfig` (or its dict).
      task_name: the task this head was built for (recorded in the config).
      name: model name; keep the default so variable paths stay `task_specific/...`.

    Keras-native use. A `tf.data` dataset for `fit` / `evaluate` yields `(inputs, labels)`, two
    dicts (`split_labels` makes them from the arrays of `electra_tf.finetune.features`), or whole
    feature dicts, whose label keys are then read as the labels. `compute_loss` is the loop's
    loss; compiled metrics see `metric_inputs` (targets, the output they score, a token mask):

        x, y = head.split_labels(arrays)
        head.compile(optimizer=keras.optimizers.Adam(1e-4),
                     metrics=[keras.metrics.SparseCategoricalAccuracy()])
        head.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=3)
        head.save("head.keras")  # keras.saving.load_model after `import electra_tf.keras_objects`
    """

    family = None  # the task family (`families/`) whose head this is: "classification", ...
    input_keys = INPUT_KEYS  # the features `call` reads
    label_keys = ()  # the features `per_example_loss` reads besides the outputs

    def __init__(self, config, task_name: str | None = None, name: str = HEAD_NAME, **kwargs):
        super().__init__(name=name, **kwargs)
        self.config = as_electra_config(config)
        self.task_name = task_name
        # --- encoder ---
        self.encoder = Discriminator(self.config, rtd_head=False, dtype=self.dtype_policy)
        self.initializer = electra_kernel_initializer(self.config)

    def _dense(self, units, name, act=None):
        return keras.layers.Dense(units, activation=act, kernel_initializer=self.initializer,
                                  name=name, dtype=self.dtype_policy)

    def encode(self, features, training=None):
        inputs = {k: features[k] for k in INPUT_KEYS if k in features}
        return self.encoder(inputs, training=training)

    def per_example_loss(self, features, outputs):
        """The original's loss of each example, float32 [batch]; labels are read from `features`."""
        raise NotImplementedError

    def metric_inputs(self, features, outputs):
        """(targets, the output they score, token mask or None) for compiled metrics."""
        raise NotImplementedError

    # --- Keras' hooks (`fit`, `evaluate`) -------------------------------------------------------
    def split_labels(self, features):
        """features -> (inputs, labels): the model's inputs and the label features, two dicts."""
        inputs = {k: features[k] for k in self.input_keys if k in features}
        return inputs, {k: features[k] for k in self.label_keys if k in features}

    def _with_labels(self, x, y):
        """The feature dict `per_example_loss` reads: `x`, with `y`'s labels when given."""
        if y is None:
            return x
        if not isinstance(y, dict):
            if len(self.label_keys) != 1:
                raise ValueError(f"{type(self).__name__}: labels must be a dict with keys "
                                 f"{self.label_keys}, got {type(y).__name__}")
            y = {self.label_keys[0]: y}
        return {**x, **y}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' loss hook: the fine-tuning loop's loss (float32 scalar) for this batch.

        `per_example_loss` summed and divided by the global batch (this batch times the
        replicas), as `train_step.step_fn`: the replicas' gradients add up to the gradient of the
        global-batch mean. `sample_weight` [batch] scales each example's loss; the sum is still
        divided by the batch size (Keras' "sum_over_batch_size"), not by the weights' sum.
        """
        del training  # dropout acts in the forward pass; the loss formula is the same
        if y_pred is None:
            raise ValueError(f"{type(self).__name__}.compute_loss needs the outputs: "
                             "compute_loss(features, y_pred=head(features))")
        losses = self.per_example_loss(self._with_labels(x, y), y_pred)  # [batch]
        if sample_weight is not None:
            losses = losses * ops.reshape(ops.cast(sample_weight, losses.dtype), ops.shape(losses))
        global_batch = ops.cast(ops.shape(losses)[0] * _num_replicas(), losses.dtype)
        return ops.sum(losses) / global_batch

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """Keras' metric hook: compiled metrics score `metric_inputs`, only the tokens of its
        mask when there is one (the tagger's labelled first pieces, flattened); `sample_weight`
        reaches the `weighted_metrics`, as in Keras."""
        target, prediction, mask = self.metric_inputs(self._with_labels(x, y), y_pred)
        if sample_weight is not None:
            sample_weight = tf.reshape(tf.cast(sample_weight, tf.float32), [-1])  # [batch]
        if mask is not None:  # [batch, seq] -> [labelled tokens]
            keep = tf.cast(mask, tf.bool)
            target, prediction = tf.boolean_mask(target, keep), tf.boolean_mask(prediction, keep)
            if sample_weight is not None:
                per_token = tf.broadcast_to(sample_weight[:, None], tf.shape(keep))
                sample_weight = tf.boolean_mask(per_token, keep)
        return super().compute_metrics(x, target, prediction, sample_weight=sample_weight)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "task_name": self.task_name}


@register
class SentenceClassifier(FinetuningHead):
    """Dropout on the [CLS] state, then dense(num_labels); softmax cross-entropy.

    Args:
      config: encoder config.
      num_labels: number of classes.
      dropout: dropout rate on the [CLS] state (0.1, the original's keep_prob 0.9).
      task_name: recorded in the config.

    Returns {"logits": [batch, num_labels]}; labels are `features["label"]` (int class ids).
    Compiled metrics score `logits` against `label` (e.g. `SparseCategoricalAccuracy`).
    """

    family = "classification"
    label_keys = ("label",)

    def __init__(self, config, num_labels: int, dropout: float = 0.1, task_name=None, **kwargs):
        super().__init__(config, task_name, **kwargs)
        if num_labels < 1:
            raise ValueError(f"SentenceClassifier: num_labels must be >= 1, got {num_labels}")
        self.num_labels = int(num_labels)
        self.dropout_rate = float(dropout)
        # --- layers ---
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.classifier = self._dense(self.num_labels, "classifier")
        self.build()

    def build(self, input_shape=None):
        self.classifier.build((None, self.config.hidden_size))
        self.built = True

    def call(self, features, training=None):
        # --- forward graph ---
        cls = self.encode(features, training)["cls_output"]  # [batch, H]
        logits = self.classifier(self.dropout(cls, training=training))
        return {"logits": ops.cast(logits, "float32")}

    def per_example_loss(self, features, outputs):
        labels = ops.cast(features["label"], "int32")
        log_probs = ops.log_softmax(outputs["logits"], axis=-1)
        return -ops.sum(ops.one_hot(labels, self.num_labels) * log_probs, axis=-1)

    def metric_inputs(self, features, outputs):
        return features["label"], outputs["logits"], None

    @staticmethod
    def predictions(outputs):
        return ops.argmax(outputs["logits"], axis=-1)

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels, "dropout": self.dropout_rate}


@register
class SentenceRegressor(FinetuningHead):
    """Dropout on the [CLS] state, then dense(1); squared error (STS-B).

    Returns {"predictions": [batch]}; targets are `features["label"]` (float). Compiled
    metrics score `predictions` against `label` (e.g. `MeanSquaredError`).
    """

    family = "regression"
    label_keys = ("label",)

    def __init__(self, config, dropout: float = 0.1, task_name=None, **kwargs):
        super().__init__(config, task_name, **kwargs)
        self.dropout_rate = float(dropout)
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.regressor = self._dense(1, "regressor")
        self.build()

    def build(self, input_shape=None):
        self.regressor.build((None, self.config.hidden_size))
        self.built = True

    def call(self, features, training=None):
        cls = self.encode(features, training)["cls_output"]
        value = ops.squeeze(self.regressor(self.dropout(cls, training=training)), -1)
        return {"predictions": ops.cast(value, "float32")}

    def per_example_loss(self, features, outputs):
        return ops.square(outputs["predictions"] - ops.cast(features["label"], "float32"))

    def metric_inputs(self, features, outputs):
        return ops.cast(features["label"], "float32"), outputs["predictions"], None

    @staticmethod
    def predictions(outputs):
        return outputs["predictions"]

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout_rate}


@register
class TokenTagger(FinetuningHead):
    """dense(num_labels) over every token's final state (no dropout, as the original).

    Labels sit on the first WordPiece of each word (`featurize_tagging`): `label_ids` [batch, seq]
    with `label_weights` 1 there and 0 elsewhere. A sentence's loss is the sum of its words'
    cross-entropies (the original's `reduce_sum` over the sequence).

    Returns {"logits": [batch, seq, num_labels]}. Compiled metrics score `logits` against
    `label_ids` on the first pieces only (where `label_weights` is 1).
    """

    family = "tagging"
    label_keys = ("label_ids", "label_weights")

    def __init__(self, config, num_labels: int, task_name=None, **kwargs):
        super().__init__(config, task_name, **kwargs)
        if num_labels < 1:
            raise ValueError(f"TokenTagger: num_labels must be >= 1, got {num_labels}")
        self.num_labels = int(num_labels)
        self.tagger = self._dense(self.num_labels, "tagger")
        self.build()

    def build(self, input_shape=None):
        self.tagger.build((None, None, self.config.hidden_size))
        self.built = True

    def call(self, features, training=None):
        sequence = self.encode(features, training)["sequence_output"]  # [batch, seq, H]
        return {"logits": ops.cast(self.tagger(sequence), "float32")}

    def per_example_loss(self, features, outputs):
        labels = ops.cast(features["label_ids"], "int32")
        log_probs = ops.log_softmax(outputs["logits"], axis=-1)
        token_loss = -ops.sum(ops.one_hot(labels, self.num_labels) * log_probs, axis=-1)
        return ops.sum(token_loss * ops.cast(features["label_weights"], "float32"), axis=-1)

    def metric_inputs(self, features, outputs):
        return features["label_ids"], outputs["logits"], features["label_weights"]

    @staticmethod
    def predictions(outputs):
        return ops.argmax(outputs["logits"], axis=-1)  # [batch, seq]

    def get_config(self):
        return {**super().get_config(), "num_labels": self.num_labels}


def answer_mask(input_mask, segment_ids):
    """1.0 where a span may start or end: the context (segment 1) and [CLS]. [batch, seq].

    The original also admits the final [SEP]; we exclude it so the model's top-k starts are
    exactly `features.postprocess_qa`'s (which ranks only context positions and [CLS]): the
    end-logit rows of joint prediction are matched to starts by rank.
    """
    input_mask = ops.cast(input_mask, "float32")
    seq_length = ops.shape(input_mask)[1]
    last = ops.one_hot(ops.cast(ops.sum(input_mask, axis=1), "int32") - 1, seq_length)  # final [SEP]
    context = input_mask * ops.cast(segment_ids, "float32") * (1.0 - last)
    return ops.minimum(context + ops.one_hot(ops.zeros_like(context[:, 0], "int32"), seq_length), 1.0)


@register
class SpanQuestionAnswerer(FinetuningHead):
    """ELECTRA's (XLNet-style) SQuAD head: start logits, start-conditioned end logits and an
    answerability classifier.

    - start: dense(1) over tokens, positions outside the context and [CLS] get -1000.
    - end: concat(state at the start, state at each token) -> dense 512 GELU (`qa_hidden`) ->
      dense 1 (`qa_logits`), masked like the start. With `start_positions` in the features
      (training) it is conditioned on the gold start: `end_logits` [batch, seq]. Without them
      (evaluation, serving) on each of the top-`beam_size` starts by masked start logit:
      `start_top_index` [batch, K] and `end_logits` [batch, K, seq], row k for the k-th start,
      the layout `features.postprocess_qa` takes.
    - answerability: concat([CLS] state, start-probability-weighted state) -> dense 512 GELU
      (`answer_class_hidden`) -> dense 1 (`answer_class`): `answerable_logits` [batch], > 0
      meaning *unanswerable* (the original's naming); sigmoid loss times `answerable_weight`.

    Loss per window: (CE(start) + CE(end)) / 2 + answerable_weight * sigmoid CE(is_impossible).

    Under `fit`, `start_positions` is an input as well as a label (`split_labels` puts it in
    both): the end logits are conditioned on the gold start. Compiled metrics score
    `start_logits` against `start_positions`, a training signal only; SQuAD's exact match and F1
    need the span search over the text (`trainer.evaluate`).

    Args:
      config: encoder config.
      beam_size: K, the number of starts (and, in `postprocess_qa`, ends) searched (20).
      answerable_classifier: build the answerability classifier (the original always does).
      answerable_weight: its loss weight (0.5).
      hidden_size: width of the two hidden layers (512).
    """

    family = "qa"
    input_keys = (*INPUT_KEYS, "start_positions")
    label_keys = ("start_positions", "end_positions", "is_impossible")

    def __init__(self, config, beam_size: int = 20, answerable_classifier: bool = True,
                 answerable_weight: float = 0.5, hidden_size: int = 512, task_name=None, **kwargs):
        super().__init__(config, task_name, **kwargs)
        self.beam_size = int(beam_size)
        self.answerable_classifier = bool(answerable_classifier)
        self.answerable_weight = float(answerable_weight)
        self.hidden_size = int(hidden_size)
        gelu = activation("gelu")
        # --- layers ---
        self.qa_start = self._dense(1, "qa_start")
        self.qa_hidden = self._dense(self.hidden_size, "qa_hidden", gelu)
        self.qa_logits = self._dense(1, "qa_logits")
        if self.answerable_classifier:
            self.answer_class_hidden = self._dense(self.hidden_size, "answer_class_hidden", gelu)
            self.answer_class = self._dense(1, "answer_class")
        self.build()

    def build(self, input_shape=None):
        h = self.config.hidden_size
        self.qa_start.build((None, None, h))
        self.qa_hidden.build((None, None, 2 * h))
        self.qa_logits.build((None, None, self.hidden_size))
        if self.answerable_classifier:
            self.answer_class_hidden.build((None, 2 * h))
            self.answer_class.build((None, self.hidden_size))
        self.built = True

    def call(self, features, training=None):
        # --- forward graph ---
        hidden = self.encode(features, training)["sequence_output"]  # [batch, seq, H]
        penalty = _MASK_PENALTY * (answer_mask(features["input_mask"], features["segment_ids"]) - 1.0)
        start_logits = ops.cast(ops.squeeze(self.qa_start(hidden), -1), "float32") + penalty
        outputs = {"start_logits": start_logits}
        seq_length = ops.shape(hidden)[1]

        if "start_positions" in features:  # condition on the gold start
            start_index = ops.one_hot(ops.cast(features["start_positions"], "int32"), seq_length,
                                      dtype=hidden.dtype)  # [batch, seq]
            start_state = ops.einsum("bs,bsh->bh", start_index, hidden)
            start_states = ops.broadcast_to(start_state[:, None, :], ops.shape(hidden))
            end_logits = self._end_logits(start_states, hidden) + penalty  # [batch, seq]
        else:  # condition on each of the top-k starts
            k = min(self.beam_size, hidden.shape[1] or self.beam_size)
            _, top_index = ops.top_k(start_logits, k=k)  # [batch, K]
            start_state = ops.einsum("bks,bsh->bkh", ops.one_hot(top_index, seq_length, dtype=hidden.dtype),
                                     hidden)  # [batch, K, H]
            shape = (ops.shape(hidden)[0], k, seq_length, ops.shape(hidden)[2])
            start_states = ops.broadcast_to(start_state[:, :, None, :], shape)
            tokens = ops.broadcast_to(hidden[:, None, :, :], shape)
            end_logits = self._end_logits(start_states, tokens) + penalty[:, None, :]  # [batch, K, seq]
            outputs["start_top_index"] = top_index
        outputs["end_logits"] = end_logits

        if self.answerable_classifier:
            start_p = ops.cast(ops.softmax(start_logits, axis=-1), hidden.dtype)
            start_feature = ops.einsum("bs,bsh->bh", start_p, hidden)
            reprs = ops.concatenate([hidden[:, 0, :], start_feature], axis=-1)
            logit = self.answer_class(self.answer_class_hidden(reprs))
            outputs["answerable_logits"] = ops.cast(ops.squeeze(logit, -1), "float32")
        return outputs

    def _end_logits(self, start_states, token_states):
        reprs = ops.concatenate([start_states, token_states], axis=-1)
        return ops.cast(ops.squeeze(self.qa_logits(self.qa_hidden(reprs)), -1), "float32")

    def per_example_loss(self, features, outputs):
        seq_length = ops.shape(outputs["start_logits"])[-1]

        def cross_entropy(logits, positions):
            one_hot = ops.one_hot(ops.cast(positions, "int32"), seq_length)
            return -ops.sum(one_hot * ops.log_softmax(logits, axis=-1), axis=-1)

        if len(outputs["end_logits"].shape) != 2:
            raise ValueError("SpanQuestionAnswerer loss needs end logits conditioned on the gold "
                             "start: call the model with `start_positions` in the features")
        loss = (cross_entropy(outputs["start_logits"], features["start_positions"])
                + cross_entropy(outputs["end_logits"], features["end_positions"])) / 2.0
        if self.answerable_classifier:
            labels = ops.cast(features["is_impossible"], "float32")
            loss += self.answerable_weight * ops.binary_crossentropy(
                labels, outputs["answerable_logits"], from_logits=True)
        return loss

    def metric_inputs(self, features, outputs):
        return features["start_positions"], outputs["start_logits"], None

    def get_config(self):
        return {**super().get_config(), "beam_size": self.beam_size,
                "answerable_classifier": self.answerable_classifier,
                "answerable_weight": self.answerable_weight, "hidden_size": self.hidden_size}



@register
class MultipleChoiceClassifier(FinetuningHead):
    """Scores every choice of an example and picks one: SWAG / COPA-style multiple choice.

    Each choice is its own input `[CLS] context [SEP] choice [SEP]`
    (`families.multiple_choice`): features are [batch, choices, seq]. The encoder reads the
    choices as one batch; dropout on each [CLS] state, then dense(1) (`choice_scorer`) gives the
    choice's logit; a choice with no token (`input_mask` all 0: a padding choice of an example
    with fewer choices) gets -1000. Loss: softmax cross-entropy over the choices, labels
    `features["label"]` (the index of the right choice).

    Args:
      config: encoder config.
      dropout: dropout rate on the [CLS] states (0.1).
      task_name: recorded in the config.

    Returns {"logits": [batch, choices]}. Compiled metrics score `logits` against `label`
    (e.g. `SparseCategoricalAccuracy`).
    """

    family = "multiple_choice"
    label_keys = ("label",)

    def __init__(self, config, dropout: float = 0.1, task_name=None, **kwargs):
        super().__init__(config, task_name, **kwargs)
        self.dropout_rate = float(dropout)
        # --- layers ---
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.choice_scorer = self._dense(1, "choice_scorer")
        self.build()

    def build(self, input_shape=None):
        self.choice_scorer.build((None, self.config.hidden_size))
        self.built = True

    def call(self, features, training=None):
        # --- forward graph ---
        shape = ops.shape(features["input_ids"])  # [batch, choices, seq]
        flat = {k: ops.reshape(features[k], (-1, shape[2])) for k in INPUT_KEYS}
        cls = self.encode(flat, training)["cls_output"]  # [batch * choices, H]
        scores = ops.squeeze(self.choice_scorer(self.dropout(cls, training=training)), -1)
        logits = ops.reshape(ops.cast(scores, "float32"), (shape[0], shape[1]))
        present = ops.cast(ops.max(features["input_mask"], axis=-1) > 0, "float32")  # [batch, choices]
        return {"logits": logits + _MASK_PENALTY * (present - 1.0)}

    def per_example_loss(self, features, outputs):
        labels = ops.cast(features["label"], "int32")
        log_probs = ops.log_softmax(outputs["logits"], axis=-1)
        return -ops.sum(ops.one_hot(labels, ops.shape(log_probs)[-1]) * log_probs, axis=-1)

    def metric_inputs(self, features, outputs):
        return features["label"], outputs["logits"], None

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout_rate}
