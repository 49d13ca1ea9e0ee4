"""Registering gRPC servicers so that a request that does not parse gets INVALID_ARGUMENT.

With the `add_*Servicer_to_server` functions of the generated `_pb2_grpc` modules, grpcio
answers bytes that are not a valid request message with INTERNAL ("Exception deserializing
request!") before the servicer sees them: a server fault by its code, though the fault is
the client's. Here the request parser never raises; the handler answers INVALID_ARGUMENT
with protobuf's reason instead.

Example:

    add_servicer(server, _PredictionService(app), prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"])
"""

from __future__ import annotations

import grpc
from google.protobuf import message_factory


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
