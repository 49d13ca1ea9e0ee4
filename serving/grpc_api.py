"""TF Serving's gRPC services: PredictionService (Predict, Classify, Regress, MultiInference,
GetModelMetadata), ModelService. Classify, Regress and MultiInference are `inference_api`'s.

Request TensorProtos become numpy arrays with their shapes checked first (a few bytes must not ask
for any size), outputs are written with the typed `*_val` fields as TF Serving writes them, and a
request that does not even parse gets INVALID_ARGUMENT (see `add_servicer`), never INTERNAL.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import message_factory
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from electra_tf.serving.batching import request_deadline
from electra_tf.serving.budget import trim_heap
from electra_tf.serving.errors import ServingError, invalid, without_paths
from electra_tf.serving.inference_api import proto_call
from electra_tf.serving.manager import ModelManager
from electra_tf.serving.model_config import ModelConfigError, configs_from_proto

if TYPE_CHECKING:
    from electra_tf.serving.server import ModelServer

log = logging.getLogger(__name__)


# grpcio's generated `add_*Servicer_to_server` answer bytes that are not a valid request message
# with INTERNAL ("Exception deserializing request!") before the servicer sees them: a server
# fault by its code, though the fault is the client's. `add_servicer` registers the methods
# without a deserializer: each gets the request's bytes and parses them itself (`_parse`), so
# that bytes which are not a request get INVALID_ARGUMENT with protobuf's reason, and a
# PredictRequest is parsed under the server's parse budget (`serving.budget`).


def _parse(message_class, data: bytes):
    try:
        return message_class.FromString(data)
    except Exception as e:  # noqa: BLE001  (whatever protobuf raises, the bytes are the client's)
        name = message_class.DESCRIPTOR.full_name
        raise invalid(f"the request is not a valid {name}: {type(e).__name__}: {e}") from None


def add_servicer(server: grpc.Server, servicer, service, metrics=None) -> None:
    """Register every unary method of `service` (a ServiceDescriptor) to `servicer`'s method of
    that name, which receives the serialized request (see `_parse`); with `metrics` (a
    serving.metrics.Metrics) each call is counted and timed under its method's name."""
    handlers = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            metrics.grpc_method(behaviour, method.name) if metrics is not None else behaviour,
            response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))

def metadata_response(manager: ModelManager, name: str, version: int | None) -> get_model_metadata_pb2.GetModelMetadataResponse:
    servable = manager.servable(name, version)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.metadata["signature_def"].Pack(servable.signature_def_map())
    return response





def array_to_tensor_proto(array: np.ndarray, as_content: bool = False) -> tensor_pb2.TensorProto:
    """A TensorProto with the typed `*_val` fields, as TF Serving writes outputs; with
    `as_content` (its --enable_serialization_as_tensor_content) numbers go in `tensor_content`,
    their little-endian bytes (strings stay in `string_val`, as there)."""
    proto = tensor_pb2.TensorProto()
    for d in array.shape:
        proto.tensor_shape.dim.add(size=d)
    flat = array.reshape(-1)
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = types_pb2.DT_STRING
        proto.string_val.extend(b.encode("utf-8") if isinstance(b, str) else bytes(b) for b in flat)
        return proto
    if as_content:
        proto.dtype = tf.as_dtype(array.dtype).as_datatype_enum
        proto.tensor_content = flat.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return proto
    typed = {
        np.float32: (types_pb2.DT_FLOAT, "float_val"),
        np.float64: (types_pb2.DT_DOUBLE, "double_val"),
        np.int32: (types_pb2.DT_INT32, "int_val"),
        np.int16: (types_pb2.DT_INT16, "int_val"),
        np.int8: (types_pb2.DT_INT8, "int_val"),
        np.uint8: (types_pb2.DT_UINT8, "int_val"),
        np.uint16: (types_pb2.DT_UINT16, "int_val"),
        np.int64: (types_pb2.DT_INT64, "int64_val"),
        np.uint32: (types_pb2.DT_UINT32, "uint32_val"),
        np.uint64: (types_pb2.DT_UINT64, "uint64_val"),
        np.bool_: (types_pb2.DT_BOOL, "bool_val"),
    }.get(array.dtype.type)
    if typed is None:
        return tf.make_tensor_proto(array)
    proto.dtype = typed[0]
    getattr(proto, typed[1]).extend(flat.tolist())
    return proto


def _grpc_version(model_spec, manager: ModelManager) -> int | None:
    """The version a ModelSpec asks for: its number, the one its label names in the model's
    `version_labels`, or None (the latest)."""
    if model_spec.WhichOneof("version_choice") == "version_label":
        return manager.version_of_label(model_spec.name, model_spec.version_label)
    if model_spec.HasField("version"):
        return model_spec.version.value
    return None


def predict_proto(
    manager: ModelManager, data: bytes, max_batch_size: int, scheduler=None, *, max_elements: int, budget=None,
    tensor_content: bool = False,
) -> predict_pb2.PredictResponse:
    """Run a serialized gRPC PredictRequest through `scheduler`; tensors of more than `max_elements`
    are refused. The request is parsed and its inputs converted while it holds its size of
    `budget` (a `serving.budget.ParseBudget`), and the model runs after. `tensor_content`: the
    outputs' numbers as bytes (`array_to_tensor_proto`)."""
    with budget.hold(len(data)) if budget is not None else contextlib.nullcontext():
        servable, signature, inputs, output_filter = _request_inputs(manager, data, max_batch_size, max_elements)
    try:
        outputs = signature.run(inputs, max_batch_size, scheduler)
    finally:
        del inputs
        trim_heap(len(data))  # what the model call of a large request freed
    response = predict_pb2.PredictResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.model_spec.signature_name = signature.name
    for key, value in outputs.items():
        if not output_filter or key in output_filter:
            response.outputs[key].CopyFrom(array_to_tensor_proto(value, tensor_content))
    return response


def _request_inputs(manager: ModelManager, data: bytes, max_batch_size: int, max_elements: int):
    """(servable, signature, input arrays, output_filter) of a serialized PredictRequest; the
    parsed message is dropped on return (the caller holds the parse budget that long)."""
    request = _parse(predict_pb2.PredictRequest, data)
    if not request.model_spec.name:
        raise invalid("model_spec.name is required")
    servable = manager.servable(request.model_spec.name, _grpc_version(request.model_spec, manager))
    signature = servable.predict_signature(request.model_spec.signature_name)
    for key, proto in request.inputs.items():  # dtypes and shapes first: nothing converted to be refused
        spec = signature.inputs.get(key)
        if spec is not None and proto.dtype != spec.dtype.as_datatype_enum:
            raise invalid(f"input {key!r} must be {spec.dtype.name}, got {_dtype_name(proto.dtype)}")
        signature.check_shape(key, _declared_shape(key, proto, max_elements), max_batch_size)
    inputs = {key: _tensor_proto_to_array(key, proto) for key, proto in request.inputs.items()}
    output_filter = set(request.output_filter)
    unknown = sorted(output_filter - set(signature.outputs))
    if unknown:
        raise invalid(f"output_filter: {unknown} are not outputs of signature {signature.name!r}; its outputs are {sorted(signature.outputs)}")
    return servable, signature, inputs, output_filter


def _dtype_name(enum: int) -> str:
    try:
        return tf.as_dtype(enum).name if enum else "DT_INVALID"
    except TypeError:
        return f"dtype {enum} (not a DataType)"


def _declared_shape(key: str, proto: tensor_pb2.TensorProto, max_elements: int) -> list[int]:
    """The shape a request TensorProto declares; refuses shapes that tf.make_ndarray would fill to any size."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(d < 0 for d in dims):
        raise invalid(f"input {key!r}: tensor_shape {dims if not proto.tensor_shape.unknown_rank else 'of unknown rank'} is not a known shape")
    # TF repeats the last value to fill the shape, so a few bytes can ask for any size.
    if math.prod(dims) > max_elements:
        raise invalid(f"input {key!r}: tensor_shape {dims} holds more than {max_elements} elements, the server's limit")
    return dims


def _tensor_proto_to_array(key: str, proto: tensor_pb2.TensorProto) -> np.ndarray:
    """A request TensorProto, its shape checked (`_declared_shape`), as numpy."""
    try:
        return tf.make_ndarray(proto)
    except Exception as e:  # noqa: BLE001  (TF's decoder raises many types; the bytes are the client's)
        raise invalid(f"input {key!r} is not a valid {_dtype_name(proto.dtype)} TensorProto: {type(e).__name__}: {e}") from None


_NO_DEADLINE = 1e9  # seconds: gRPC reports a call without a deadline as one this far off or more


def _grpc_call(context, fn):
    """`fn()`'s answer, its model calls under the client's deadline (serving.batching,
    "Deadlines"); a ServingError or any other exception becomes the call's status."""
    remaining = context.time_remaining()  # a very large number without a deadline
    try:
        with request_deadline(remaining if remaining is not None and remaining < _NO_DEADLINE else None):
            return fn()
    except ServingError as e:
        context.abort(e.code, e.message)
    except Exception as e:  # noqa: BLE001
        log.exception("internal error in gRPC call")
        context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {type(e).__name__}: {without_paths(str(e))}")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def Predict(self, data, context):  # noqa: N802  (gRPC method names)
        app = self.app
        return _grpc_call(context, lambda: predict_proto(app.manager, data, app.max_batch_size, app.scheduler,
                                                         max_elements=app.max_body_bytes, budget=app.parse_budget,
                                                         tensor_content=app.tensor_content))

    def Classify(self, data, context):  # noqa: N802
        return _grpc_call(context, lambda: self._examples_api(classification_pb2.ClassificationRequest, data))

    def Regress(self, data, context):  # noqa: N802
        return _grpc_call(context, lambda: self._examples_api(regression_pb2.RegressionRequest, data))

    def MultiInference(self, data, context):  # noqa: N802
        return _grpc_call(context, lambda: self._examples_api(inference_pb2.MultiInferenceRequest, data))

    def _examples_api(self, request_class, data: bytes):
        """Classify, Regress or MultiInference (serving.inference_api): the request is parsed and
        its examples built while it holds its size of the parse budget, as Predict's; the model
        runs after."""
        app = self.app

        def servable_of(model_spec):
            if not model_spec.name:
                raise invalid("model_spec.name is required")
            return app.manager.servable(model_spec.name, _grpc_version(model_spec, app.manager))

        with app.parse_budget.hold(len(data)):
            run = proto_call(_parse(request_class, data), servable_of, app.max_batch_size)
        try:
            return run(app.scheduler)
        finally:
            trim_heap(len(data))

    def GetModelMetadata(self, data, context):  # noqa: N802
        def run():
            request = _parse(get_model_metadata_pb2.GetModelMetadataRequest, data)
            fields = list(request.metadata_field)
            if not fields:
                raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
            unsupported = [f for f in fields if f != "signature_def"]
            if unsupported:
                raise invalid(f"Metadata field {unsupported[0]} is not supported (only signature_def)")
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return metadata_response(self.app.manager, request.model_spec.name, _grpc_version(request.model_spec, self.app.manager))

        return _grpc_call(context, run)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def GetModelStatus(self, data, context):  # noqa: N802
        def run():
            request = _parse(get_model_status_pb2.GetModelStatusRequest, data)
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return self.app.manager.status(request.model_spec.name, _grpc_version(request.model_spec, self.app.manager))

        return _grpc_call(context, run)

    def HandleReloadConfigRequest(self, data, context):  # noqa: N802
        """TF Serving's: a ModelConfigList replaces the served models (`ModelManager.reload`;
        an empty list unloads them all); any other kind of config, none included, is
        INVALID_ARGUMENT with TF Serving's words. The answer, once the new models are AVAILABLE,
        carries an OK status; a failure is the call's status, as TF Serving returns it."""
        def run():
            request = _parse(model_management_pb2.ReloadConfigRequest, data)
            if request.config.WhichOneof("config") != "model_config_list":
                raise invalid("ServerModelConfig type not supported by HandleReloadConfigRequest."
                              " Only ModelConfigList is currently supported")
            try:
                configs = configs_from_proto(request.config, allow_empty=True)
            except ModelConfigError as e:
                raise invalid(str(e)) from None
            self.app.manager.reload(configs)
            return model_management_pb2.ReloadConfigResponse()

        return _grpc_call(context, run)
