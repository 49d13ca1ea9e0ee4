"""The server's one error type, and how its gRPC status codes map to HTTP."""

from __future__ import annotations

import os
import re

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


def shown(text: str, limit: int = 40) -> str:
    """`text` from a request, cut to `limit` characters for an error message ("123456... (5000 characters)")."""
    return text if len(text) <= limit else f"{text[:limit // 2]}... ({len(text)} characters)"


# An absolute path of at least two parts, not inside a word (so "tensorflow/serving/predict" and
# node names such as "model/dense/MatMul" stay) nor after a replacement ("<model version 3>/variables").
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~>-])/(?:[^\s/'\"`(){}\[\],;:|]+/)+[^\s/'\"`(){}\[\],;:|]*")


def without_paths(text: str, known: dict[str, str] | None = None) -> str:
    """`text` without the server's filesystem paths, for a message a client will read.

    A client learns from an error what it did wrong or what to tell the operator, never where the
    server keeps its files (that is for the server log, which keeps the full text). `known` maps
    paths (a model's base path, a version folder) to the words that replace them; any other
    absolute path left in `text` (a TensorFlow message about a file, an exception's filename)
    becomes "<path>".
    """
    for path, words in sorted((known or {}).items(), key=lambda item: -len(item[0])):
        for form in {path, os.path.realpath(path)}:
            if form and form != os.sep:
                text = text.replace(form.rstrip(os.sep), words)
    return _ABSOLUTE_PATH.sub("<path>", text)


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def unavailable(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNAVAILABLE, message)


def failed_precondition(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unknown(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.UNKNOWN, message)


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
