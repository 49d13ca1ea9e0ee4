"""The SavedModel's signatures, composed from the task family's own (`finetune/families/`), plus
`serve_ids`, the head on token ids with its in-graph id checks.

`for_head(head, description, pre)` gives every signature of a fine-tuned head as {name: (function,
input specs)}, which `export.export_head` adds to the archive it writes. Each task family owns its
signatures (`TaskFamily.serving_signature` the text one, `truncated` its `truncated` output,
`example_signatures` its Classify / Regress ones); this module never asks which family it
composes. Every input and output has the batch first:

- `serving_default`: raw UTF-8 text in, tokenized and packed in-graph by the same
  `data.preprocessor.TextPreprocessor` that made the fine-tuning features (`[CLS] A [SEP] (B [SEP])`, longest-first pair truncation, zero padding to the
  fine-tuning `max_seq_length`; classification, regression and multiple choice pad only to the
  batch's longest row, which gives the same outputs for a fraction of the compute on short
  texts, see `SentenceFamily.serving_signature`, and classification and regression run a
  batch of more than four rows in groups of similar length, `families.sentence.by_length`):
  - classification: `text` (+ `text_pair` for pair tasks) -> `probabilities` float32
    [B, num_labels], `label` string [B], `truncated` bool [B] (the text, or the pair, had more
    pieces than max_seq_length holds and was cut as fine-tuning cut it: the answer is about the
    first pieces only);
  - regression: `text` (+ `text_pair`) -> `score` float32 [B], `truncated` bool [B];
  - tagging: `text` -> `labels` string [B, W] (one label per whitespace word, "" past a text's
    words; W is the batch's largest `num_words`), `num_words` int32 [B] (words that fit),
    `truncated` bool [B] (the text has words past them, which get no label);
  - QA: `question`, `context` -> `answer` string [B], `start` / `end` int32 [B] (character
    offsets of the best span in `context`, -1 if none), `score` float32 [B] (its start + end
    log-probability) and, for SQuAD 2.0, `no_answer_score` float32 [B] (the answerability
    logit; `answer` is "" when it exceeds the fine-tuning `null_score_diff_threshold`, while
    `start` / `end` / `score` still describe the best span so a client can apply its own
    threshold). One window of `max_seq_length` tokens: a context longer than that is cut, and
    `features.featurize_qa`'s sliding windows are not used (see `TextPreprocessor.pack_qa`);
  - multiple choice: `context` [B], `choices` [B, C] ("" for no choice) -> `probabilities`
    float32 [B, C], `choice` int32 [B], `answer` string [B].
  QA and multiple choice have no `truncated` output (yet): a QA context is cut as said above.
  Two inputs must have the same number of rows (`_with_row_check`, InvalidArgument otherwise).
- `classify` (classification) / `regress` (regression): TF Serving's Classify / Regress API
  (method names `tensorflow/serving/classify` / `.../regress`, `METHOD_NAMES`, set in
  saved_model.pb after Keras writes every endpoint as a predict signature). `inputs` string [B]: serialized `tf.Example`s
  whose bytes features `text` (+ `text_pair`) are the text signature's inputs, parsed in-graph
  (a missing or non-bytes feature is an InvalidArgument naming it) and run through the same
  function -> classify `classes` string [B, num_labels] (the label names) and `scores` float32
  [B, num_labels] (= `probabilities`); regress `outputs` float32 [B] (= `score`).
- `serve_ids`: int32 `input_ids`, `input_mask`, `segment_ids` [B, S] ([B, C, S] for multiple
  choice) -> the head's raw outputs (`logits`; regression `predictions`; QA `start_logits`,
  `start_top_index`, `end_logits`, `answerable_logits`), run as the family runs its head
  (`TaskFamily.infer`: classification and regression cut the columns past every row's last
  unmasked position and group rows by length); tokenize with `assets/vocab.txt` on
  the client. QA needs S = `max_seq_length`. The ids are checked in the graph (`_id_checks`):
  inputs of different shapes, a token id outside [0, vocab_size), a segment id outside
  [0, type_vocab_size), a mask value other than 0 and 1, or no position or more than
  max_position_embeddings fails with
  InvalidArgument (400 from a server) instead of answering. A server without the TF Text ops
  cannot load the text export at all (every op of the graph must be registered): export with
  `ids_only=True` (`export.export_head`) for it, which writes `serve_ids` alone (also as
  `serving_default`) and no TF Text op (and no `classify` / `regress`).
"""

from __future__ import annotations

import tensorflow as tf

from electra_tf.data.inputs import INPUT_KEYS
from electra_tf.data.preprocessor import TextPreprocessor
from electra_tf.finetune.families import get_family
from electra_tf.finetune.families.base import TaskFamily
from electra_tf.finetune.saving import FinetunedModelConfig

SERVE_IDS = "serve_ids"
CLASSIFY, REGRESS = "classify", "regress"
# The method names TF Serving's Classify and Regress APIs require of a signature; Keras writes
# every endpoint as a predict signature (`export.write_version` sets these).
METHOD_NAMES = {CLASSIFY: "tensorflow/serving/classify", REGRESS: "tensorflow/serving/regress"}


def for_head(head, description: FinetunedModelConfig, pre: TextPreprocessor,
             frozen: bool = False) -> dict:
    """{name: (function, input specs)}: `serving_default`, the task family's text signature
    (`TaskFamily.serving_signature`) with `truncated` added where the family has it
    (`_with_truncated`); `classify` / `regress` for sentence classification / regression
    (`_example_signature`; their method names, `METHOD_NAMES`, are set by `export.write_version`); and `serve_ids`, the
    head on token ids checked to be in range. `frozen`: every signature runs the head through
    one `FrozenHead` (its weights as graph constants) instead of reading its variables."""
    family = get_family(description.family)
    ids_shape = family.ids_shape(description)
    if frozen:
        head = FrozenHead(head, ids_shape)
    ids_spec = [tf.TensorSpec(ids_shape, tf.int32, name=k) for k in INPUT_KEYS]
    config = head.config

    def serve_ids(input_ids, input_mask, segment_ids):
        with tf.control_dependencies(_id_checks(config, input_ids, input_mask, segment_ids)):
            inputs = {"input_ids": tf.identity(input_ids), "input_mask": tf.identity(input_mask),
                      "segment_ids": tf.identity(segment_ids)}
        return family.infer(head, inputs)

    text_fn, text_spec = family.serving_signature(head, description, pre)
    signatures = {"serving_default": _with_row_check(
        *_with_truncated(family, text_fn, text_spec, pre))}
    signatures.update(_example_signature(family, head, description, text_fn, text_spec))
    signatures[SERVE_IDS] = (serve_ids, ids_spec)
    return signatures


class FrozenHead:
    """A head's inference pass with its weights as graph constants, called as the head is
    (`head(inputs, training=False)` -> its outputs dict); other attributes are the head's.

    One function (`convert_variables_to_constants_v2` of the head on int32 `INPUT_KEYS` of
    `shape`, the family's `ids_shape`: any batch, any length where the family allows one) that
    every signature calls, so the SavedModel holds the weights once, in its function library,
    and no variables. Constant weights are what TensorFlow's oneDNN matmuls cache in their own
    layout (a variable's are reordered on every call) and what Grappler folds: on a 2-core EPYC
    with avx2 fma avx512f avx512_vnni avx512_bf16, a one-sentence ELECTRA-Small request took
    0.83-0.91x the time of the same export on variables, batch 32 0.92-1.02x (docs/benchmarks.md,
    "Serving latency"). Outputs equal the head's to float rounding (~1e-7).
    """

    def __init__(self, head, shape):
        from tensorflow.python.framework.convert_to_constants import (
            convert_variables_to_constants_v2)

        self._head = head

        def forward(input_ids, input_mask, segment_ids):
            return dict(head({"input_ids": input_ids, "input_mask": input_mask,
                              "segment_ids": segment_ids}, training=False))

        spec = [tf.TensorSpec(shape, tf.int32, name=k) for k in INPUT_KEYS]
        traced = tf.function(forward, autograph=False).get_concrete_function(*spec)
        self._outputs = traced.structured_outputs
        frozen = convert_variables_to_constants_v2(traced)

        def frozen_head(*ids):
            return frozen(*ids)

        # Called, not inlined: a signature reaches the head from more than one place (the
        # first group and the loop of `by_length`; a short batch was a third), and TensorFlow
        # inlines a called function at each, copying and optimising the weights' constants
        # once per place when a signature is first called. Not inlined, a signature's call
        # sites share one instance. On a 2.0 GHz Xeon (avx2 fma avx512f avx512_vnni
        # avx512_bf16 avx512_fp16 avx_vnni amx_tile amx_bf16), ELECTRA-Small classifier,
        # `tf.saved_model.load` (as electra-serve): each signature's first call 7.6 s instead
        # of 15-18, its warmup 27 s instead of 55, the process 3.9 GB after it instead of 5.1;
        # requests 0.98x the time (docs/benchmarks.md, "The first call of each signature").
        # TF Serving's Session path takes as long either way (~15 s per signature).
        self._fn = tf.function(frozen_head, autograph=False,
                               experimental_attributes={"_noinline": True}).get_concrete_function(*spec)

    def __call__(self, inputs, training=False):
        if training:
            raise ValueError("a frozen head only infers")
        flat = self._fn(*(tf.cast(inputs[k], tf.int32) for k in INPUT_KEYS))
        for tensor, traced in zip(flat, tf.nest.flatten(self._outputs)):
            tensor.set_shape(traced.shape)  # the frozen graph's own inference drops some dims
        return tf.nest.pack_sequence_as(self._outputs, flat)

    def __getattr__(self, name):
        return getattr(self._head, name)


def _example_signature(family, head, description: FinetunedModelConfig, text_fn, text_spec) -> dict:
    """TF Serving's Classify / Regress signatures of the family (`TaskFamily.example_signatures`:
    classification and regression), {name: (function, input specs)}; {} for the other families.

    One input, `inputs`: a string [B] of serialized `tf.Example`s holding the text signature's
    inputs (`text`, and `text_pair` for a pair task) as bytes features, parsed in the graph and
    run through `text_fn`, the text signature's own function; the family maps its outputs to the
    API's. A feature that is missing or not one bytes value fails the parse with InvalidArgument
    naming it ("Feature: text ... is required but could not be found", "Key: text ... Data types
    don't match")."""
    features = {spec.name: tf.io.FixedLenFeature([], tf.string) for spec in text_spec}
    example_spec = [tf.TensorSpec([None], tf.string, name="inputs")]

    def signature(api_outputs):
        def from_examples(inputs):
            parsed = tf.io.parse_example(inputs, features)
            return api_outputs(text_fn(*(parsed[spec.name] for spec in text_spec)))
        return from_examples

    return {name: (signature(api_outputs), example_spec)
            for name, api_outputs in family.example_signatures(head, description).items()}


def _id_checks(config, input_ids, input_mask, segment_ids) -> list:
    """In-graph checks of `serve_ids`' inputs: the three of one shape, token ids in
    [0, vocab_size), segment ids in [0, type_vocab_size), a mask of 0 and 1, 1 to
    max_position_embeddings positions.

    Without them a negative token id reads the embedding row counted from the end (Keras' `take`
    wraps negative indices as numpy does) and answers as if it were a real token, and an id past
    the vocabulary fails deep in the graph with the gather's message. A failed check is an
    InvalidArgument error whose message says which input and what range: a TF Serving client
    gets 400 / INVALID_ARGUMENT with it."""

    def in_range(name, values, high):
        return tf.debugging.Assert(
            tf.reduce_all((values >= 0) & (values < high)),
            [f"{name} must be in [0, {high}); got values from", tf.reduce_min(values), "to", tf.reduce_max(values)],
            name=f"check_{name}")

    def same_shape(name, values):
        # Unchecked, a narrower mask cut the ids to its width, a one-row mask or segment ids
        # broadcast over every row of the ids, and a wider one failed deep in the encoder.
        return tf.debugging.Assert(
            tf.reduce_all(tf.equal(tf.shape(values), tf.shape(input_ids))),
            [f"{name} must have the shape of input_ids; got", tf.shape(values), "and",
             tf.shape(input_ids)],
            name=f"check_{name}_shape")

    positions = tf.shape(input_ids)[-1]
    return [
        same_shape("input_mask", input_mask),
        same_shape("segment_ids", segment_ids),
        in_range("input_ids", input_ids, config.vocab_size),
        in_range("segment_ids", segment_ids, config.type_vocab_size),
        in_range("input_mask", input_mask, 2),
        tf.debugging.Assert(
            (positions >= 1) & (positions <= config.max_position_embeddings),
            [f"input_ids must have 1 to {config.max_position_embeddings} positions ([CLS] first);"
             " got", positions],
            name="check_positions"),
    ]


def _with_row_check(fn, spec):
    """(fn, spec) of a text signature with two inputs (a pair, a question and its context, a
    context and its choices), checking in the graph that both have the same number of rows:
    unchecked, a mismatch failed deep in the packing with "Incompatible shapes: [6] vs. [5]".
    As it is for one input."""
    if len(spec) == 1:
        return fn, spec
    first, second = (s.name for s in spec)

    def check(a, b):
        rows_a, rows_b = tf.shape(a)[0], tf.shape(b)[0]
        return tf.debugging.Assert(
            tf.equal(rows_a, rows_b),
            [f"{first} and {second} must have the same number of rows; got", rows_a, "and", rows_b],
            name="check_rows")

    # Named as the families name theirs (tests find the packing in the SavedModel by it); the
    # signature's inputs are named by `spec`.
    def serve_text(a, b):
        with tf.control_dependencies([check(a, b)]):
            return fn(tf.identity(a), tf.identity(b))
    return serve_text, spec


def _with_truncated(family, fn, spec, pre: TextPreprocessor):
    """(fn, spec) of a text signature, with the family's `truncated` bool [B] output added where it
    has one (`TaskFamily.truncated`: classification, regression, tagging); as it is otherwise."""
    names = [s.name for s in spec]
    probe = family.truncated  # overridden or the base's (no output)
    if type(family).truncated is TaskFamily.truncated:
        return fn, spec

    # The name is the family's: tests find the packing in the SavedModel by it.
    if len(names) == 1:
        def serve_text(text):
            outputs = dict(fn(text))
            return {**outputs, "truncated": probe(pre, {names[0]: text}, outputs)}
    else:
        def serve_text(text, text_pair):
            outputs = dict(fn(text, text_pair))
            return {**outputs, "truncated": probe(pre, dict(zip(names, (text, text_pair))), outputs)}
    return serve_text, spec
