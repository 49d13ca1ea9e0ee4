"""How the gRPC API is offered: TF Serving's --ssl_config_file, --grpc_socket_path,
--grpc_channel_arguments and --enable_grpc_healthcheck_service (its model_servers/server.cc).

Importable without TensorFlow: `electra-serve` reads and checks each of them before TensorFlow or
any model loads, so a wrong file costs a second and one line naming it.

- `read_ssl_config`: TF Serving's `SSLConfig` text proto (server_key, server_cert, custom_ca,
  client_verify) -> gRPC server credentials. The PEMs are checked here (a key that does not match
  its certificate, a CA that is not one): gRPC would only log them at the first handshake. As in
  TF Serving, only gRPC is secured; the REST port stays plain HTTP.
- `parse_channel_arguments`: "key=value,key=value", each value an int when it reads as a 32-bit
  int, else a string, as TF Serving passes them to its gRPC server builder.
- `check_socket_path`: the UNIX socket gRPC also listens on. gRPC removes any socket file at that
  path before it binds, so a path another live server listens on is refused here rather than
  taken from it; a path holding anything but a socket (or a link) is refused, never removed.
- `HealthService`: the standard `grpc.health.v1.Health` service (what Kubernetes' gRPC probes,
  grpc_health_probe and load balancers call), with TF Serving's statuses: "" (the server),
  "ModelService" and "PredictionService" SERVING while the server runs, NOT_SERVING once it
  stops. `Check` answers any other name NOT_FOUND; `Watch` streams the status now and at each
  change (SERVICE_UNKNOWN for another name, as gRPC's own service does), and ends after
  NOT_SERVING when the server stops. A watcher holds one of the threads that serve predictions
  for as long as it watches, so at most a quarter of them watch at once (none on a server of
  fewer than 4); one more is refused RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import ssl
import stat
import tempfile
import threading
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

_INT32 = (-2**31, 2**31 - 1)
_DECIMAL = re.compile(r"\s*[+-]?[0-9]+\s*")
_SOCKET_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the closing NUL


class TransportError(ValueError):
    """A gRPC transport setting that cannot be used; its message is one line."""


def _messages(file_name: str, package: str, messages: dict, enums: dict | None = None) -> dict:
    """Message classes built from field lists in a pool of their own: `tensorflow_serving.apis`
    ships neither SSLConfig nor grpc.health.v1, and the text format parser needs the real message."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    for enum_name, values in (enums or {}).items():
        enum = proto.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for name, fields in messages.items():
        message = proto.message_type.add(name=name)
        for number, (field, kind) in enumerate(fields, 1):
            type_name = None
            if kind in (enums or {}):
                type_name, kind = f".{package}.{kind}", F.TYPE_ENUM
            message.field.add(name=field, number=number, type=kind, label=F.LABEL_OPTIONAL,
                              **({"type_name": type_name} if type_name else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
            for name in messages}


_F = descriptor_pb2.FieldDescriptorProto
SSLConfig = _messages("tensorflow_serving/config/ssl_config.proto", "tensorflow.serving", {
    "SSLConfig": [("server_key", _F.TYPE_STRING), ("server_cert", _F.TYPE_STRING),
                  ("custom_ca", _F.TYPE_STRING), ("client_verify", _F.TYPE_BOOL)]})["SSLConfig"]
_health = _messages("grpc/health/v1/health.proto", "grpc.health.v1", {
    "HealthCheckRequest": [("service", _F.TYPE_STRING)],
    "HealthCheckResponse": [("status", "ServingStatus")],
}, enums={"ServingStatus": ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"]})
HealthCheckRequest, HealthCheckResponse = _health["HealthCheckRequest"], _health["HealthCheckResponse"]
SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3


# --- SSL


@dataclass(frozen=True)
class SslConfig:
    """TF Serving's SSLConfig: the server's PEM key and certificate, the CA that signs client
    certificates (`custom_ca`), and whether a client must present one (`client_verify`)."""

    server_key: str
    server_cert: str
    custom_ca: str = ""
    client_verify: bool = False

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.server_key.encode(), self.server_cert.encode())],
            root_certificates=self.custom_ca.encode() or None,
            require_client_auth=self.client_verify)


def _check_pems(config: SslConfig) -> None:
    """Raises TransportError unless the key matches the certificate and the CA parses (Python's
    ssl module reads the same PEMs as gRPC's BoringSSL)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory(prefix="electra-serve-ssl-") as folder:  # 0700, removed at once
        key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
        for path, text in ((key, config.server_key), (cert, config.server_cert)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(text)
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as e:
            raise TransportError("server_key and server_cert are not a PEM private key and the PEM certificate"
                                 f" it belongs to ({e.reason or e})") from None
    if config.custom_ca:
        try:
            context.load_verify_locations(cadata=config.custom_ca)
        except (ssl.SSLError, ValueError) as e:
            raise TransportError(f"custom_ca is not a PEM certificate ({getattr(e, 'reason', None) or e})") from None


def read_ssl_config(path: str) -> SslConfig:
    """The SSLConfig text proto at `path`, checked. Raises TransportError (one line, without the
    path: the caller names the flag and file) or OSError."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        message = text_format.Parse(data.decode("utf-8"), SSLConfig())
    except UnicodeDecodeError:
        raise TransportError("is not UTF-8 text") from None
    except text_format.ParseError as e:
        raise TransportError(f"is not a text SSLConfig proto: {' '.join(str(e).split())}") from None
    config = SslConfig(message.server_key, message.server_cert, message.custom_ca, message.client_verify)
    missing = [name for name in ("server_key", "server_cert") if not getattr(config, name).strip()]
    if missing:
        raise TransportError(f"has no {' and no '.join(missing)} (a PEM text each)")
    if config.client_verify and not config.custom_ca.strip():
        raise TransportError("has client_verify: true but no custom_ca to verify client certificates with")
    _check_pems(config)
    return config


# --- channel arguments


def parse_channel_arguments(text: str) -> list[tuple[str, int | str]]:
    """TF Serving's --grpc_channel_arguments: "grpc.max_connection_age_ms=2000,..." -> [(key, value)],
    a value that reads as a 32-bit int passed as one, any other as a string. Raises TransportError
    for an entry without "=" or without a key (TF Serving crashes on the first)."""
    arguments = []
    for entry in filter(None, text.split(",")):
        key, equals, value = entry.partition("=")
        if not equals or not key.strip():
            raise TransportError(f"{entry!r} is not key=value")
        number = int(value) if _DECIMAL.fullmatch(value) else None  # absl's SimpleAtoi: blanks and a sign
        arguments.append((key.strip(), number if number is not None and _INT32[0] <= number <= _INT32[1] else value))
    return arguments


# --- the UNIX socket


def check_socket_path(path: str) -> str:
    """The absolute path gRPC may listen on; raises TransportError, one line, for a path whose
    folder is missing, that is too long for a socket address, that holds a link or anything but a
    socket, or a socket another server answers on. A socket nothing answers on (a server that
    died) is left for gRPC to replace."""
    full = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(full)):
        raise TransportError(f"{path}: its folder {os.path.dirname(full)} does not exist")
    if not os.access(os.path.dirname(full), os.W_OK | os.X_OK):
        raise TransportError(f"{path}: no socket can be made in {os.path.dirname(full)} (not writable)")
    if len(os.fsencode(full)) > _SOCKET_PATH_MAX:
        raise TransportError(f"{path}: a socket path may have at most {_SOCKET_PATH_MAX} bytes")
    try:
        mode = os.lstat(full).st_mode
    except FileNotFoundError:
        return full
    if not stat.S_ISSOCK(mode):
        what = "a link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode) else "a file"
        raise TransportError(f"{path} is {what}, not a socket: remove it or choose another path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(full)
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                return full  # a socket left by a server that is gone
            raise TransportError(f"{path}: {e.strerror or e}") from None
    raise TransportError(f"{path} is a socket another server listens on")


# --- health


class HealthService:
    """grpc.health.v1.Health (Check and Watch) with TF Serving's statuses (the module's docstring)."""

    NAMES = ("", "ModelService", "PredictionService")

    def __init__(self, max_watchers: int = 1):
        """`max_watchers`: Watch streams open at once (0: Watch is refused, Check still answers)."""
        self._status = SERVING
        self._closed = False
        self._changed = threading.Condition()
        self._watchers = 0
        self.max_watchers = max(0, max_watchers)

    def set_serving(self, serving: bool) -> None:
        with self._changed:
            self._status = SERVING if serving else NOT_SERVING
            self._closed = False
            self._changed.notify_all()

    def close(self) -> None:
        """NOT_SERVING, and every Watch stream ends once it has sent that (the server is stopping)."""
        with self._changed:
            self._status, self._closed = NOT_SERVING, True
            self._changed.notify_all()

    def Check(self, request, context):
        if request.service not in self.NAMES:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service[:200]!r}")
        with self._changed:
            return HealthCheckResponse(status=self._status)

    def Watch(self, request, context):
        known = request.service in self.NAMES
        with self._changed:
            refused = self._watchers >= self.max_watchers
            if not refused:
                self._watchers += 1
        if refused:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_watchers} health watcher(s) at most, each holding one of the server's "
                          "gRPC threads (a quarter of --grpc_max_threads); use Check, or watch from fewer clients")
        context.add_callback(self._wake)  # a cancelled stream stops waiting at once
        try:
            sent = None
            while context.is_active():
                with self._changed:
                    status = self._status if known else SERVICE_UNKNOWN
                    closed = self._closed
                    if status == sent and not closed:
                        self._changed.wait(timeout=5.0)
                        continue
                if status != sent:
                    sent = status
                    yield HealthCheckResponse(status=status)
                if closed:
                    return
        finally:
            with self._changed:
                self._watchers -= 1

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def add_to(self, server: grpc.Server) -> None:
        check = grpc.unary_unary_rpc_method_handler(
            self.Check, request_deserializer=HealthCheckRequest.FromString,
            response_serializer=HealthCheckResponse.SerializeToString)
        watch = grpc.unary_stream_rpc_method_handler(
            self.Watch, request_deserializer=HealthCheckRequest.FromString,
            response_serializer=HealthCheckResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "grpc.health.v1.Health", {"Check": check, "Watch": watch}),))
