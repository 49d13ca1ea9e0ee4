"""What the server serves: a loaded SavedModel version (`Servable`) and its signatures.

A `Signature` checks request tensors against the SavedModel's SignatureDef (names, dtypes, ranks,
batch size) and runs the concrete function, directly or through a scheduler (serving.batching).
Only TF2 SavedModels with dense named-tensor signatures are served, as TF Serving's
`tensorflow/serving/predict` method defines them (TF Serving's apis/predict.proto).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Mapping, Sequence

import grpc
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the TF Text ops that exported tokenizers use)
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
)

from electra_tf.serving.errors import GRPC_BY_NUMBER, ServingError, invalid, without_paths

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"



class Signature:
    """One dense named-tensor signature of a loaded SavedModel."""

    def __init__(self, name: str, fn, signature_def: meta_graph_pb2.SignatureDef):
        self.name = name
        self.fn = fn
        self.method_name = signature_def.method_name
        self.inputs = {k: _spec(k, v) for k, v in signature_def.inputs.items()}
        self.outputs = {k: _spec(k, v) for k, v in signature_def.outputs.items()}
        self.batching = None  # the server's batching; or its version's own (serving.batching, per-model)

    def run(self, inputs: Mapping[str, np.ndarray], max_batch_size: int, scheduler=None) -> dict[str, np.ndarray]:
        """Validate `inputs` against the signature and run it through `scheduler` (see serving.batching)."""
        inputs = self.validate(inputs, max_batch_size)
        return self.call(inputs) if scheduler is None else scheduler.run(self, inputs)

    def validate(self, inputs: Mapping[str, np.ndarray], max_batch_size: int) -> dict[str, np.ndarray]:
        missing = sorted(set(self.inputs) - set(inputs))
        unexpected = sorted(set(inputs) - set(self.inputs))
        if unexpected:
            raise invalid(
                f"input {unexpected[0]!r} is not an input of signature {self.name!r};"
                f" its inputs are {sorted(self.inputs)}"
            )
        if missing:
            raise invalid(f"signature {self.name!r} needs input(s) {missing}; got {sorted(inputs)}")
        for key, value in inputs.items():
            spec = self.inputs[key]
            if value.dtype != spec.dtype.as_numpy_dtype and not (
                spec.dtype == tf.string and value.dtype == object
            ):
                raise invalid(f"input {key!r} must be {spec.dtype.name}, got {value.dtype.name}")
            self.check_shape(key, value.shape, max_batch_size)
        return dict(inputs)

    def check_shape(self, key: str, shape: Sequence[int], max_batch_size: int) -> None:
        """INVALID_ARGUMENT unless input `key` of `shape` fits the signature and `max_batch_size`.

        Also called on the shape a request declares (a JSON value's lists, a TensorProto's
        dims) before its values are converted: a request refused for its shape costs nothing
        to refuse."""
        spec = self.inputs.get(key)
        if spec is None:
            return  # an unknown input: `validate` names it
        if not spec.shape.is_compatible_with(shape):
            raise invalid(
                f"input {key!r} has shape {list(shape)} but signature {self.name!r}"
                f" expects {_shape_str(spec.shape)}"
            )
        if len(shape) >= 1 and shape[0] == 0:
            raise invalid(f"input {key!r} is an empty batch (dimension 0 is 0)")
        if len(shape) >= 1 and shape[0] > max_batch_size:
            raise invalid(
                f"input {key!r} has a batch of {shape[0]}, more than the server's"
                f" max_batch_size {max_batch_size}"
            )

    def call(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature on validated inputs."""
        try:
            outputs = self.fn(**{k: tf.constant(v, dtype=self.inputs[k].dtype) for k, v in inputs.items()})
        except tf.errors.OpError as e:
            code = GRPC_BY_NUMBER.get(e.error_code, grpc.StatusCode.UNKNOWN)
            message = _one_line(e.message)
            if without_paths(message) != message:  # the log keeps what the client is not shown
                log.info("signature %r failed: %s", self.name, message)
            raise ServingError(code, f"running signature {self.name!r} failed: {without_paths(message)}") from e
        except (TypeError, ValueError) as e:
            raise invalid(f"signature {self.name!r} rejected the inputs: {without_paths(str(e))}") from e
        return {k: v.numpy() for k, v in outputs.items()}


def _one_line(op_error_message: str) -> str:
    """A TF runtime error as one line: the reason and the node, without the graph-execution preamble.

    "Graph execution error:\n\nDetected at node add defined at ...\n<stack traces unavailable>\n
    Incompatible shapes: [1,2] vs. [1,0]\n\t [[{{node add}}]] [Op:__inference_...]" becomes
    "Incompatible shapes: [1,2] vs. [1,0] (node add)".
    """
    nodes = re.findall(r"\[\[\{\{node ([^}]+)\}\}\]\]", op_error_message)
    text = re.sub(r"\[\[\{\{node [^}]+\}\}\]\]|\[Op:[^\]]*\]", "", op_error_message)
    lines = [line.strip() for line in text.splitlines()]
    skip = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "File ")
    reason = "; ".join(line for line in lines if line and not line.startswith(skip))
    return reason + (f" (node {nodes[0]})" if nodes else "") if reason else " ".join(text.split())


class _Spec:
    def __init__(self, dtype: tf.DType, shape: tf.TensorShape):
        self.dtype, self.shape = dtype, shape


def _spec(name: str, info: meta_graph_pb2.TensorInfo) -> _Spec:
    if info.WhichOneof("encoding") != "name":
        raise ValueError(f"tensor {name!r} is sparse or composite; only dense tensors are served")
    return _Spec(tf.as_dtype(info.dtype), tf.TensorShape(info.tensor_shape))


def _shape_str(shape: tf.TensorShape) -> str:
    if shape.rank is None:
        return "any shape"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


_PREDICTABLE = ("tensorflow/serving/predict", "tensorflow/serving/classify", "tensorflow/serving/regress")


class Servable:
    """One loaded version of a model."""

    def __init__(self, name: str, version: int, path: str, tags: Sequence[str] = ("serve",), batching=None,
                 check_method_names: bool = False):
        """`batching`: this version's own batching for each of its signatures (TF Serving's
        per-model batching parameters, `serving.batching_parameters.read_model_batching_parameters`); None:
        the server's. `check_method_names`: TF Serving's --enable_signature_method_name_check
        (`predict_signature`, `inference_api.example_signature`)."""
        self.name, self.version, self.path = name, version, path
        self.check_method_names = check_method_names
        # The SignatureDefs as written in saved_model.pb are what the real server reports
        # as metadata (including `__saved_model_init_op`), so read them from the file.
        self.signature_defs = _read_signature_defs(path, tags)
        self._loaded = tf.saved_model.load(path, tags=list(tags))  # keeps the functions' resources alive
        self.signatures: dict[str, Signature] = {}
        for key, fn in self._loaded.signatures.items():
            if key not in self.signature_defs:
                continue
            try:
                self.signatures[key] = Signature(key, fn, self.signature_defs[key])
                self.signatures[key].batching = batching
            except ValueError as e:
                log.warning("%s version %d: signature %r is not served: %s", name, version, key, e)

    def signature(self, signature_name: str) -> Signature:
        key = signature_name or DEFAULT_SIGNATURE
        if key not in self.signatures:
            # TF Serving answers FAILED_PRECONDITION (HTTP 400) with this message.
            raise ServingError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{key}" not found. (model {self.name!r} version'
                f" {self.version} has {sorted(self.signatures)})",
            )
        return self.signatures[key]

    def predict_signature(self, signature_name: str) -> Signature:
        """`signature` for a Predict request; with `check_method_names`, TF Serving's refusal
        (predict_util.cc, an INTERNAL error) of a signature of another method than predict,
        classify or regress."""
        signature = self.signature(signature_name)
        if self.check_method_names and signature.method_name not in _PREDICTABLE:
            raise ServingError(grpc.StatusCode.INTERNAL,
                               f"Expected prediction signature method_name to be one of {{{', '.join(_PREDICTABLE)}}}."
                               f" Was: {signature.method_name[:80]}")
        return signature

    def signature_def_map(self) -> get_model_metadata_pb2.SignatureDefMap:
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for key, sig_def in self.signature_defs.items():
            sig_map.signature_def[key].CopyFrom(sig_def)
        return sig_map


def _read_signature_defs(path: str, tags: Sequence[str]) -> dict[str, meta_graph_pb2.SignatureDef]:
    """The SignatureDefs of the MetaGraph whose tag set is `tags`, as TF Serving's loader finds
    it (loader.cc, FindMetaGraphDef: the sets must be equal), with its error when there is none."""
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    else:
        from google.protobuf import text_format

        with open(os.path.join(path, "saved_model.pbtxt"), encoding="utf-8") as f:
            text_format.Parse(f.read(), saved_model)
    for meta_graph in saved_model.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == set(tags):
            return dict(meta_graph.signature_def)
    found = "; ".join("{ " + " ".join(sorted(m.meta_info_def.tags)) + " }" for m in saved_model.meta_graphs)
    raise ServingError(grpc.StatusCode.NOT_FOUND,
                       f"Could not find meta graph def matching supplied tags: {{ {' '.join(sorted(tags))} }}."
                       f" The SavedModel has {found or 'none'} (saved_model_cli show --dir lists them)")
