"""TF Serving's gRPC services: PredictionService (Predict, GetModelMetadata), ModelService.

Request TensorProtos become numpy arrays with their shapes checked first (a few bytes must not ask
for any size), outputs are written with the typed `*_val` fields as TF Serving writes them, and a
request that does not even parse gets INVALID_ARGUMENT (see `add_servicer`), never INTERNAL.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import message_factory
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from electra_tf.serving.errors import ServingError, invalid, not_found
from electra_tf.serving.manager import ModelManager

if TYPE_CHECKING:
    from electra_tf.serving.server import ModelServer

log = logging.getLogger(__name__)


# grpcio's generated `add_*Servicer_to_server` answer bytes that are not a valid request message
# with INTERNAL ("Exception deserializing request!") before the servicer sees them: a server
# fault by its code, though the fault is the client's. `add_servicer` registers a parser that
# never raises; the handler answers INVALID_ARGUMENT with protobuf's reason instead.

class _Unparsable:
    def __init__(self, reason: str):
        self.reason = reason


def _parser(request_class):
    def parse(data: bytes):
        try:
            return request_class.FromString(data)
        except Exception as e:  # noqa: BLE001  (whatever protobuf raises, the bytes are the client's)
            return _Unparsable(f"{type(e).__name__}: {e}")

    return parse


def _checked(behaviour, request_name: str):
    def handle(request, context):
        if isinstance(request, _Unparsable):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {request_name}: {request.reason}")
        return behaviour(request, context)

    return handle


def add_servicer(server: grpc.Server, servicer, service) -> None:
    """Register every unary method of `service` (a ServiceDescriptor) to `servicer`'s method of that name."""
    handlers = {}
    for method in service.methods:
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _checked(getattr(servicer, method.name), method.input_type.full_name),
            request_deserializer=_parser(message_factory.GetMessageClass(method.input_type)),
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





def array_to_tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """A TensorProto with the typed `*_val` fields, as TF Serving writes outputs."""
    proto = tensor_pb2.TensorProto()
    for d in array.shape:
        proto.tensor_shape.dim.add(size=d)
    flat = array.reshape(-1)
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = types_pb2.DT_STRING
        proto.string_val.extend(b.encode("utf-8") if isinstance(b, str) else bytes(b) for b in flat)
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


def _grpc_version(model_spec) -> int | None:
    if model_spec.WhichOneof("version_choice") == "version_label":
        raise not_found(f"Unrecognized servable version label: {model_spec.version_label} (no version labels are configured)")
    if model_spec.HasField("version"):
        return model_spec.version.value
    return None


def predict_proto(
    manager: ModelManager, request: predict_pb2.PredictRequest, max_batch_size: int, scheduler=None, *, max_elements: int
) -> predict_pb2.PredictResponse:
    """Run a gRPC PredictRequest through `scheduler`; tensors of more than `max_elements` are refused."""
    if not request.model_spec.name:
        raise invalid("model_spec.name is required")
    servable = manager.servable(request.model_spec.name, _grpc_version(request.model_spec))
    signature = servable.signature(request.model_spec.signature_name)
    inputs = {}
    for key, proto in request.inputs.items():
        spec = signature.inputs.get(key)
        if spec is not None and proto.dtype != spec.dtype.as_datatype_enum:
            raise invalid(f"input {key!r} must be {spec.dtype.name}, got {_dtype_name(proto.dtype)}")
        inputs[key] = _tensor_proto_to_array(key, proto, max_elements)
    unknown = sorted(set(request.output_filter) - set(signature.outputs))
    if unknown:
        raise invalid(f"output_filter: {unknown} are not outputs of signature {signature.name!r}; its outputs are {sorted(signature.outputs)}")
    outputs = signature.run(inputs, max_batch_size, scheduler)
    response = predict_pb2.PredictResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.model_spec.signature_name = signature.name
    for key, value in outputs.items():
        if not request.output_filter or key in request.output_filter:
            response.outputs[key].CopyFrom(array_to_tensor_proto(value))
    return response


def _dtype_name(enum: int) -> str:
    try:
        return tf.as_dtype(enum).name if enum else "DT_INVALID"
    except TypeError:
        return f"dtype {enum} (not a DataType)"


def _tensor_proto_to_array(key: str, proto: tensor_pb2.TensorProto, max_elements: int) -> np.ndarray:
    """A request TensorProto as numpy; refuses shapes that tf.make_ndarray would fill to any size."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(d < 0 for d in dims):
        raise invalid(f"input {key!r}: tensor_shape {dims if not proto.tensor_shape.unknown_rank else 'of unknown rank'} is not a known shape")
    # TF repeats the last value to fill the shape, so a few bytes can ask for any size.
    if math.prod(dims) > max_elements:
        raise invalid(f"input {key!r}: tensor_shape {dims} holds more than {max_elements} elements, the server's limit")
    try:
        return tf.make_ndarray(proto)
    except Exception as e:  # noqa: BLE001  (TF's decoder raises many types; the bytes are the client's)
        raise invalid(f"input {key!r} is not a valid {_dtype_name(proto.dtype)} TensorProto: {type(e).__name__}: {e}") from None


def _grpc_call(context, fn):
    try:
        return fn()
    except ServingError as e:
        context.abort(e.code, e.message)
    except Exception as e:  # noqa: BLE001
        log.exception("internal error in gRPC call")
        context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {type(e).__name__}: {e}")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def Predict(self, request, context):  # noqa: N802  (gRPC method names)
        app = self.app
        return _grpc_call(context, lambda: predict_proto(app.manager, request, app.max_batch_size, app.scheduler, max_elements=app.max_body_bytes))

    def GetModelMetadata(self, request, context):  # noqa: N802
        def run():
            fields = list(request.metadata_field)
            if not fields:
                raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
            unsupported = [f for f in fields if f != "signature_def"]
            if unsupported:
                raise invalid(f"Metadata field {unsupported[0]} is not supported (only signature_def)")
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return metadata_response(self.app.manager, request.model_spec.name, _grpc_version(request.model_spec))

        return _grpc_call(context, run)


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def GetModelStatus(self, request, context):  # noqa: N802
        def run():
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return self.app.manager.status(request.model_spec.name, _grpc_version(request.model_spec))

        return _grpc_call(context, run)
