"""The server's one error type, and how its gRPC status codes map to HTTP."""

from __future__ import annotations

import grpc


class ServingError(Exception):
    """A request failed; `code` is the gRPC status, mapped to HTTP for REST."""

    def __init__(self, code: grpc.StatusCode, message: str):
        # One line, whatever the client sent: names echoed from a request may hold newlines,
        # control characters or lone surrogates; they are shown escaped (\n, \x00, \ud800).
        message = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


# TF Serving's mapping of status codes to HTTP (util/net_http/.../status_code_util).
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
# TF error codes and gRPC status codes share their numbers.
GRPC_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
