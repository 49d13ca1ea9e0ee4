"""TF Serving's Classify, Regress and MultiInference APIs: tf.Examples in, classes or values out.

A model offers them through signatures of method name `tensorflow/serving/classify` or
`tensorflow/serving/regress` (TF Serving's apis/classification.proto, regression.proto): one
input, a string [B] of serialized `tf.Example`s (its name, `inputs` in every export we know, is
not checked, as TF Serving does not); a classify signature answers `classes` string [B, C] and/or
`scores` float [B, C], a regress signature `outputs` float [B] (or [B, 1]). The server builds the
examples, runs the signature like any other (validated, through the scheduler of
`serving.batching`), and reads those outputs:

- REST (`rest.py`): `POST /v1/models/NAME[/versions/V]:classify` or `:regress` with
  `{"signature_name": ..., "context": {feature: value}, "examples": [{feature: value}, ...]}`
  (g3doc/api_rest.md); a value is a string, a number, `{"b64": ...}` or a list of them
  (`json_examples`) -> `{"results": [[[label, score], ...], ...]}` / `{"results": [value, ...]}`.
- gRPC (`grpc_api.py`): `PredictionService.Classify`, `Regress` and `MultiInference` on
  `input.example_list` or `input.example_list_with_context` (`proto_examples`).

Context features go into every example and an example's own features win: the context's
serialized bytes come first, then the example's, and a protobuf parser keeps the last value of a
map key (TF Serving joins them the same way). The signature name defaults to `serving_default`, as
in TF Serving; a signature of another method (our exports' `serving_default` is a predict
signature; theirs are named `classify` / `regress`) is refused with INVALID_ARGUMENT naming the
signatures that would do. Predict may call a classify or regress signature, as TF Serving lets it.

Example:

    body = b'{"signature_name": "classify", "examples": [{"text": "a great movie"}]}'
    inference_json(manager, "electra", None, "classify", body, max_batch_size=64)
    # {"results": [[["negative", 0.02], ["positive", 0.98]]]}
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import math
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow_serving.apis import classification_pb2, inference_pb2, regression_pb2

from electra_tf.serving.budget import trim_heap
from electra_tf.serving.errors import invalid, shown
from electra_tf.serving.example_inputs import check_count as _check_count, proto_examples
from electra_tf.serving.json_api import parse_json_body
from electra_tf.serving.manager import ModelManager
from electra_tf.serving.servables import DEFAULT_SIGNATURE, Servable, Signature

CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
METHODS = {"classify": CLASSIFY_METHOD, "regress": REGRESS_METHOD}  # REST verb -> method name
_KIND = {CLASSIFY_METHOD: "classification", REGRESS_METHOD: "regression"}  # TF Serving's words
_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- signatures


def example_signature(servable: Servable, signature_name: str, method_name: str) -> Signature:
    """The signature `signature_name` ("" for serving_default) of `servable`, checked as TF
    Serving checks it for `method_name` (classifier.cc PreProcessClassification, regressor.cc
    PreProcessRegression): one input, `inputs` (serialized tf.Examples); for classify one or two
    outputs among `classes` and `scores`, for regress one, `outputs`. Its method name must also
    be `method_name` only when the servable was loaded with TF Serving's
    --enable_signature_method_name_check (`Servable.check_method_names`; off by default, as
    there, so that TF2 classifiers whose signatures all say predict serve Classify). Else
    INVALID_ARGUMENT with TF Serving's words and the model's signatures of that method."""
    signature = servable.signature(signature_name or DEFAULT_SIGNATURE)
    kind, verb = _KIND[method_name], method_name.rpartition("/")[2]

    def refuse(problem: str):
        fitting = sorted(n for n, s in servable.signatures.items() if s.method_name == method_name)
        own = signature.method_name.rpartition("/")[2]
        hint = f"; call it with :{own} ({own.capitalize()} over gRPC)" if own in ("predict", *METHODS) and own != verb else ""
        return invalid(f"{problem} (signature {signature.name!r} of model {servable.name!r} version {servable.version}"
                       f"{hint}; its {verb} signatures: {', '.join(map(repr, fitting)) or 'none'})")

    if servable.check_method_names and signature.method_name != method_name:
        raise refuse(f"Expected {kind} signature method_name to be {method_name}. Was:"
                     f" {shown(signature.method_name, 80)}")
    if len(signature.inputs) != 1:
        raise refuse(f"Expected one input Tensor. Its inputs: {_specs(signature.inputs)}")
    outputs = signature.outputs
    if method_name == CLASSIFY_METHOD and not 1 <= len(outputs) <= 2:
        raise refuse(f"Expected one or two output Tensors, found {len(outputs)}")
    if method_name == REGRESS_METHOD and len(outputs) != 1:
        raise refuse(f"Expected one output Tensor. Its outputs: {_specs(outputs)}")
    if "inputs" not in signature.inputs:
        raise refuse(f"No {kind} inputs found in SignatureDef: its input is {_specs(signature.inputs)}, not inputs")
    if signature.inputs["inputs"].dtype != tf.string:
        raise refuse(f"Expected the input Tensor inputs to be DT_STRING (serialized tf.Examples); it is"
                     f" {signature.inputs['inputs'].dtype.name}")
    wanted = {"classes": tf.string, "scores": tf.float32} if method_name == CLASSIFY_METHOD else {"outputs": tf.float32}
    found = {k: v for k, v in outputs.items() if k in wanted}
    if not found:
        problem = ('Expected classification signature outputs to contain at least one of "classes" or "scores"'
                   if method_name == CLASSIFY_METHOD else "No regression outputs found in SignatureDef")
        raise refuse(f"{problem}; its outputs: {_specs(outputs)}")
    if any(v.dtype != wanted[k] for k, v in found.items()):
        raise refuse(f"{kind} signature {signature.name!r} must output "
                     f"{' and/or '.join(f'{k} {v.name}' for k, v in wanted.items())}; it has {_specs(outputs)}")
    return signature


def _specs(specs) -> str:
    return ", ".join(f"{k} {v.dtype.name}" for k, v in sorted(specs.items())) or "none"


# ----------------------------------------------------------------------------- examples


def _json_feature(value: Any, where: str) -> feature_pb2.Feature:
    """A JSON feature value as a tf.train.Feature: strings and {"b64": ...} -> bytes_list,
    integers -> int64_list, numbers with a fraction (or integers among them) -> float_list."""
    values = value if isinstance(value, list) else [value]
    kinds = set()
    for v in values:
        if isinstance(v, str) or (isinstance(v, dict) and set(v) == {"b64"} and isinstance(v["b64"], str)):
            kinds.add("bytes")
        elif isinstance(v, int) and not isinstance(v, bool):
            kinds.add("int64")
        elif isinstance(v, float):
            kinds.add("float")
        else:
            raise invalid(f"{where}: a feature value is a string, a number, {{\"b64\": ...}} or a list of them;"
                          f" got {_json_kind(v)}")
    if "bytes" in kinds and len(kinds) > 1:
        raise invalid(f"{where}: a list mixes strings and numbers; a feature holds values of one type")
    feature = feature_pb2.Feature()
    if "bytes" in kinds:
        feature.bytes_list.value.extend(_bytes(v, where) for v in values)
    elif "float" in kinds:
        # Infinity and NaN travel as such; an int is compared exactly (float() of 10**400 fails).
        if any(abs(v) > _FLOAT32_MAX and (isinstance(v, int) or math.isfinite(v)) for v in values):
            raise invalid(f"{where}: a number is out of range for a float feature (float32)")
        feature.float_list.value.extend(values)
    elif kinds:
        if any(not _INT64[0] <= v <= _INT64[1] for v in values):
            raise invalid(f"{where}: an integer is out of range for an int64 feature")
        feature.int64_list.value.extend(values)
    return feature  # [] is a feature with no values, which a signature's parser reports as missing


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "a nested list"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, dict):
        return "an object other than {\"b64\": ...}"
    return "null" if value is None else type(value).__name__


def _bytes(value, where: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise invalid(f"{where}: string is not valid UTF-8 ({e.reason}); send binary data as {{\"b64\": ...}}") from None
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError) as e:
        raise invalid(f"{where}: 'b64' value is not valid base64: {e}") from None


def _json_example(features: Any, where: str) -> bytes:
    if not isinstance(features, dict):
        raise invalid(f"{where}: must be an object of feature name -> value")
    example = example_pb2.Example()
    for name, value in features.items():
        example.features.feature[name].CopyFrom(_json_feature(value, f"{where}: feature {shown(name)!r}"))
    return example.SerializeToString()


def json_examples(request: Mapping[str, Any], max_batch_size: int) -> np.ndarray:
    """The serialized tf.Examples [B] of a REST :classify / :regress body ('examples', each
    with the 'context' features it does not have itself)."""
    examples = request.get("examples")
    if not isinstance(examples, list):
        raise invalid("'examples' must be a list of objects, one per example (feature name -> value)")
    _check_count(len(examples), "'examples'", max_batch_size)
    context = _json_example(request["context"], "'context'") if "context" in request else b""
    return np.array([context + _json_example(e, f"examples[{i}]") for i, e in enumerate(examples)], dtype=object)


# ----------------------------------------------------------------------------- running


def classify(signature: Signature, examples: np.ndarray, max_batch_size: int, scheduler=None):
    """(labels [B][C] as str or None, scores float32 [B, C] or None) of a classify signature."""
    outputs = signature.run({_input_name(signature): examples}, max_batch_size, scheduler)
    classes, scores = outputs.get("classes"), outputs.get("scores")
    batch = len(examples)
    for name, value in (("classes", classes), ("scores", scores)):
        if value is not None and (value.ndim != 2 or value.shape[0] != batch):
            raise invalid(f"signature {signature.name!r}: output {name!r} has shape {list(value.shape)},"
                          f" not [{batch}, number of classes]")
    if classes is not None and scores is not None and classes.shape != scores.shape:
        raise invalid(f"signature {signature.name!r}: outputs 'classes' {list(classes.shape)} and"
                      f" 'scores' {list(scores.shape)} differ in shape")
    labels = None if classes is None else [[_label(c) for c in row] for row in classes]
    return labels, scores


def regress(signature: Signature, examples: np.ndarray, max_batch_size: int, scheduler=None) -> np.ndarray:
    """float32 [B] of a regress signature (whose `outputs` is [B] or [B, 1])."""
    outputs = signature.run({_input_name(signature): examples}, max_batch_size, scheduler)["outputs"]
    batch = len(examples)
    if outputs.shape not in ((batch,), (batch, 1)):
        raise invalid(f"signature {signature.name!r}: output 'outputs' has shape {list(outputs.shape)}, not [{batch}]")
    return outputs.reshape(batch)


def _input_name(signature: Signature) -> str:
    return next(iter(signature.inputs))


def _label(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ----------------------------------------------------------------------------- REST


def inference_json(manager: ModelManager, name: str, version: int | None, verb: str, body: bytes,
                  max_batch_size: int, scheduler=None, budget=None) -> dict:
    """Answer a REST `:classify` or `:regress` (`verb`) body: `{"results": ...}` as TF Serving's
    api_rest.md writes it. The body is parsed and its examples built while it holds its size of
    `budget` (`serving.budget`), and the model runs after."""
    method_name = METHODS[verb]
    with budget.hold(len(body)) if budget is not None else contextlib.nullcontext():
        request = parse_json_body(body)
        if not isinstance(request, dict):
            raise invalid("the request body must be a JSON object")
        signature_name = request.get("signature_name", DEFAULT_SIGNATURE)
        if not isinstance(signature_name, str):
            raise invalid("'signature_name' must be a string")
        unknown = sorted(set(request) - {"signature_name", "context", "examples"})
        if unknown:
            raise invalid(f"{shown(unknown[0])!r} is not a field of a :{verb} request; it takes 'signature_name',"
                          " 'context' and 'examples' ('instances' and 'inputs' go to :predict)")
        signature = example_signature(manager.servable(name, version), signature_name, method_name)
        examples = json_examples(request, max_batch_size)
        del request
    try:
        if method_name == REGRESS_METHOD:
            return {"results": _json_floats(regress(signature, examples, max_batch_size, scheduler))}
        labels, scores = classify(signature, examples, max_batch_size, scheduler)
    finally:
        del examples
        trim_heap(len(body))
    rows, width = (len(labels), len(labels[0])) if labels is not None else scores.shape
    labels = labels if labels is not None else [[""] * width for _ in range(rows)]
    scores = _json_floats(scores) if scores is not None else [[0.0] * width for _ in range(rows)]
    return {"results": [[[label, score] for label, score in zip(*row)] for row in zip(labels, scores)]}


def _json_floats(array: np.ndarray) -> list:
    # The shortest decimal that reads back as the float32 (0.1, not 0.10000000149011612), as
    # :predict writes float outputs (json_api), so both answers show the same numbers.
    return array.astype(np.float32).astype(str).astype(np.float64).tolist()


# ----------------------------------------------------------------------------- gRPC


def proto_call(request, servable_of: Callable, max_batch_size: int) -> Callable:
    """Check a parsed ClassificationRequest, RegressionRequest or MultiInferenceRequest and build
    its examples; returns `run(scheduler) -> its response`. `servable_of(model_spec)` finds the
    servable a ModelSpec names (grpc_api's rules). The request is not needed once this returns:
    the caller holds the parse budget up to here (`serving.budget`)."""
    if isinstance(request, inference_pb2.MultiInferenceRequest):
        return _multi_inference_call(request, servable_of, max_batch_size)
    method_name = CLASSIFY_METHOD if isinstance(request, classification_pb2.ClassificationRequest) else REGRESS_METHOD
    servable = servable_of(request.model_spec)
    signature = example_signature(servable, request.model_spec.signature_name, method_name)
    examples = proto_examples(request.input, max_batch_size)

    def run(scheduler=None):
        if method_name == CLASSIFY_METHOD:
            response = classification_pb2.ClassificationResponse()
        else:
            response = regression_pb2.RegressionResponse()
        _model_spec(response.model_spec, servable, signature)
        _fill_result(response.result, method_name, signature, examples, max_batch_size, scheduler)
        return response
    return run


def _multi_inference_call(request: inference_pb2.MultiInferenceRequest, servable_of: Callable, max_batch_size: int):
    """MultiInference: every task (a classify or regress signature of one model) on the same
    examples, as TF Serving's multi_inference.cc checks them: one model name, no signature twice."""
    tasks = list(request.tasks)
    if not tasks:
        raise invalid("MultiInferenceRequest has no tasks")
    names = {t.model_spec.name for t in tasks}
    if len(names) > 1:
        raise invalid(f"All ModelSpecs in a MultiInferenceRequest must access the same model name; got {sorted(names)}")
    servable = servable_of(tasks[0].model_spec)  # TF Serving serves every task from the first's version
    signatures, seen = [], set()
    for task in tasks:
        if task.method_name not in _KIND:
            raise invalid(f"Unsupported signature method_name: {shown(task.method_name, 80)} (a task is"
                          f" {CLASSIFY_METHOD} or {REGRESS_METHOD})")
        signature = example_signature(servable, task.model_spec.signature_name, task.method_name)
        if signature.name in seen:
            raise invalid(f"Duplicate evaluation of signature: {signature.name}")
        seen.add(signature.name)
        signatures.append((task.method_name, signature))
    examples = proto_examples(request.input, max_batch_size)

    def run(scheduler=None):
        response = inference_pb2.MultiInferenceResponse()
        for method_name, signature in signatures:
            result = response.results.add()
            _model_spec(result.model_spec, servable, signature)
            target = result.classification_result if method_name == CLASSIFY_METHOD else result.regression_result
            _fill_result(target, method_name, signature, examples, max_batch_size, scheduler)
        return response
    return run


def _model_spec(model_spec, servable: Servable, signature: Signature) -> None:
    model_spec.name = servable.name
    model_spec.version.value = servable.version
    model_spec.signature_name = signature.name


def _fill_result(result, method_name: str, signature: Signature, examples: np.ndarray, max_batch_size: int,
                 scheduler) -> None:
    """A ClassificationResult or RegressionResult of `signature` on `examples`."""
    if method_name == REGRESS_METHOD:
        for value in regress(signature, examples, max_batch_size, scheduler):
            result.regressions.add(value=float(value))
        return
    labels, scores = classify(signature, examples, max_batch_size, scheduler)
    rows, width = (len(labels), len(labels[0])) if labels is not None else scores.shape
    for i in range(rows):
        classifications = result.classifications.add()
        for j in range(width):
            one = classifications.classes.add()
            if labels is not None:
                one.label = labels[i][j]
            if scores is not None:
                one.score = float(scores[i, j])
