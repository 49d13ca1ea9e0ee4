"""The server's ports: refused in one line before any model loads, importable without TensorFlow.

`check_ports` is what `ModelServer.start` does first and what `electra-serve` does before it
imports TensorFlow: two equal ports, or a port another process holds, are one line
("REST port 8501 on 127.0.0.1 is already in use") within a second of the start, not after a load.
"""

from __future__ import annotations

import errno
import socket


class PortError(OSError):
    """A port the server cannot listen on (in use, privileged, an address not on this machine).

    Its message is one line for the person who started the server, e.g. "REST port 8501 on
    127.0.0.1 is already in use"; `errno` is the system's."""

    def __str__(self) -> str:
        return self.strerror  # without OSError's "[Errno 98] " prefix


def port_error(what: str, host: str, port: int, error: OSError) -> PortError:
    if error.errno == errno.EADDRINUSE:
        return PortError(error.errno, f"{what} port {port} on {host} is already in use")
    return PortError(error.errno, f"{what} port {port} on {host}: {error.strerror or error}")


def check_port_free(what: str, host: str, port: int) -> None:
    """Raises PortError if nothing could listen on host:port now.

    gRPC's own bind failure is a RuntimeError without the reason (the C core logs it to stderr),
    so the port is tried here first, as both servers bind it (SO_REUSEADDR, no SO_REUSEPORT),
    and closed again. Another process may still take it in between: then `ModelServer.start`
    reports the bind failure as a PortError all the same."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise port_error(what, host, port, e) from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                raise port_error(what, host, port, e) from None


def check_ports(host: str, rest_port: int | None, grpc_port: int | None) -> None:
    """Raises PortError if the REST and gRPC ports are one (0 picks two free ones) or either is
    taken. TF Serving logs the equal ports and goes on without REST; refusing says it at once."""
    if rest_port and rest_port == grpc_port:
        raise PortError(errno.EADDRINUSE, f"the REST and gRPC ports are both {rest_port}; give them different ports")
    for what, port in (("REST", rest_port), ("gRPC", grpc_port)):
        if port:
            check_port_free(what, host, port)
