"""How the REST server holds its connections: a thread per connection, with time limits and a cap.

Why a thread per connection: an idle keep-alive connection then costs one sleeping thread
(a few tens of KB), never a worker that other clients wait for. A bounded worker pool that
lends a worker to a connection for its whole life lets a handful of idle or slow clients
stop everyone else; that was this server's first design. What is bounded instead:

- Time. Each request must arrive whole (request line, headers and body) within
  `idle_timeout_seconds` of the moment the server starts waiting for it; a keep-alive
  connection that sends nothing for that long is closed, and a client that dribbles its
  headers a byte at a time (slow loris) is cut off at the same deadline. A request that
  was begun but not finished gets 408 before the close.
- Connections. At most `max_connections` are served at once. A new connection at the cap
  closes the connection that has been idle longest (waiting for its next request with no byte
  of it received: a kept-alive client between requests, or one that connected and sent nothing
  for a second), as nginx reclaims keep-alive connections when it runs out of them, so idle
  clients never lock a new one out; HTTP/1.1 clients reopen a kept-alive connection the server
  closed. Only when every connection is busy (a request arriving, running or being answered)
  does the new one get 503 with a JSON error and is closed (its thread lives two seconds at
  most: one to read the request, one to close); beyond twice the cap new connections are
  closed without an answer.
- Compute. Model calls are bounded elsewhere (`serving.batching`), so a connection waiting
  for its turn holds no compute slot and idle connections never take one.

Error answers are JSON `{"error": "..."}` like every other answer of the server,
including the ones `http.server` produces itself for malformed request lines.
"""

from __future__ import annotations

import http.server
import io
import json
import logging
import math
import re
import socket
import sys
import threading
import time
import zlib
from typing import Any

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024
_REJECT_SECONDS = 1.0  # how long a connection over the cap may take to send the request its 503 answers
_LINGER_SECONDS = 1.0  # how long a closing connection's input is read and dropped (see shutdown_request)
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
# A connection that has not yet sent its first request is not closed for a newcomer before this
# long: its request may be on the wire (a burst of new clients would otherwise close each other).
_FIRST_REQUEST_GRACE_SECONDS = 1.0


class _Connection:
    """What the cap needs to know of a served connection: whether it is idle (waiting for a
    request, no byte of it received), when its last request began (or when it connected), and
    whether it has been answered once. Least recently used first: the order requests began is
    the order clients sent them, where the moments answers finish race between threads."""

    __slots__ = ("idle", "last_used", "answered")

    def __init__(self):
        self.idle = True
        self.last_used = time.monotonic()
        self.answered = False


class _DeadlineReader(io.RawIOBase):
    """Reads from a socket that fail with TimeoutError once `deadline` (time.monotonic()) has passed."""

    def __init__(self, sock: socket.socket, connection: _Connection | None = None):
        self._sock = sock
        self._connection = connection
        self.deadline = time.monotonic()
        self.received = 0  # bytes since the caller last reset it

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request deadline has passed")
        self._sock.settimeout(remaining)
        n = self._sock.recv_into(buffer)
        if n and self._connection is not None:
            self._connection.idle = False  # a request is arriving: busy, not to be closed for a newcomer
        self.received += n
        return n


class ConnectionServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer with an idle timeout, a per-request deadline and a connection cap.

    Args:
        address: (host, port) to bind.
        handler_class: a `JsonRequestHandler` subclass.
        idle_timeout_seconds: time a request may take to arrive, idle wait included.
        max_connections: connections served at once; one more closes the longest idle one,
            or gets 503 when none is idle.
    """

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # the listen backlog; socketserver's 5 drops bursts of connects

    def __init__(self, address, handler_class, *, idle_timeout_seconds: float, max_connections: int):
        if idle_timeout_seconds <= 0 or max_connections <= 0:
            raise ValueError("idle_timeout_seconds and max_connections must be positive")
        self.idle_timeout_seconds = idle_timeout_seconds
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # every connection with a thread
        self._admitted: dict[socket.socket, _Connection] = {}  # the ones being served (at most max_connections)
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler_class)

    def process_request(self, request, client_address):
        # On the accept thread: the only place that must never block.
        with self._lock:
            refuse = len(self._open) >= 2 * self.max_connections
            if not refuse:
                self._open.add(request)
        if refuse:
            log.warning("closing a connection from %s: %d connections open", client_address[0], 2 * self.max_connections)
            self.close_request(request)
            return
        super().process_request(request, client_address)

    def admit(self, request) -> _Connection | None:
        """The new connection's state if it is served, after closing the longest idle connection
        when at the cap; None when every connection is busy (it gets 503)."""
        with self._lock:
            if len(self._admitted) >= self.max_connections:
                now, oldest, oldest_used = time.monotonic(), None, math.inf
                for sock, connection in self._admitted.items():
                    used = connection.last_used
                    if connection.idle and used < oldest_used and (
                            connection.answered or now - used >= _FIRST_REQUEST_GRACE_SECONDS):
                        oldest, oldest_used = sock, used
                if oldest is None:
                    return None
                del self._admitted[oldest]
                # Under the lock: its thread closes it only after taking the lock (shutdown_request),
                # so this cannot reach a closed (or reused) descriptor. Its blocked read returns
                # at once with end of file and the thread closes the connection.
                try:
                    oldest.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                log.debug("closed the longest idle connection for a new one (%d connections, the cap)",
                          self.max_connections)
            connection = _Connection()
            self._admitted[request] = connection
            return connection

    def shutdown_request(self, request):
        """Close a connection after its last answer; called once per connection, on its thread.

        A lingering close: send FIN, then read and drop what the client still sends for up to
        a second before closing. Closing a socket with unread input makes the kernel send RST
        and drop the answer not yet transmitted, so a client still uploading (a slow or
        oversize body cut at its deadline) would see a reset instead of its 408 or 413.
        """
        try:
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER_SECONDS
            while (remaining := deadline - time.monotonic()) > 0:
                request.settimeout(remaining)
                if not request.recv(_CHUNK):
                    break
        except OSError:
            pass
        with self._lock:
            self._open.discard(request)
            self._admitted.pop(request, None)
        self.close_request(request)

    def handle_error(self, request, client_address):
        # A client that resets or vanishes is routine; anything else is a bug worth a traceback.
        if isinstance(sys.exc_info()[1], OSError):
            log.debug("connection from %s ended: %s", client_address[0], sys.exc_info()[1])
        else:
            log.exception("error on a connection from %s", client_address[0])

    def server_close(self):
        super().server_close()
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            try:  # wakes threads blocked on idle keep-alive connections
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class JsonRequestHandler(http.server.BaseHTTPRequestHandler):
    """A keep-alive HTTP/1.1 handler whose every answer is JSON, under `ConnectionServer`'s limits.

    Subclasses implement `do_GET` / `do_POST` with `send_json`, `send_error` and `read_body`;
    any other method gets 405.
    """

    protocol_version = "HTTP/1.1"
    allowed_methods = "GET, POST"
    disable_nagle_algorithm = True  # an answer goes out at once, not after the client's delayed ACK
    wbufsize = _CHUNK  # buffered: headers and body leave in one write (send_json flushes)

    def setup(self):
        super().setup()
        self._state = self.server.admit(self.request)  # None: over the cap, answered 503
        self.admitted = self._state is not None
        self._reader = _DeadlineReader(self.connection, self._state)
        self.rfile = io.BufferedReader(self._reader, _CHUNK)
        self._responding = False

    def handle(self):
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection and self.admitted:
            self.handle_one_request()

    def handle_one_request(self):
        timeout = self.server.idle_timeout_seconds if self.admitted else min(_REJECT_SECONDS, self.server.idle_timeout_seconds)
        self._reader.deadline = time.monotonic() + timeout
        self._reader.received = 0
        self._responding = False
        self.command, self.request_version, self.requestline = "", "", ""
        if self._state is not None:  # waiting for a request: the cap may close it for a newcomer
            self._state.idle = True
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if self._state is not None:  # busy (a request already buffered never reaches the reader)
                self._state.idle, self._state.last_used = False, time.monotonic()
            if not self.raw_requestline:
                self.close_connection = True
                return
            if len(self.raw_requestline) > 65536:
                return self.send_error(414, "the request line is longer than 65536 bytes")
            if not self.parse_request():
                return  # parse_request has answered
            if "Transfer-Encoding" in self.headers:
                return self.send_error(411, "chunked bodies are not accepted; send a Content-Length header")
            if "Content-Length" in self.headers and self._content_length() is None:
                return self.send_error(400, f"Content-Length {self.headers.get_all('Content-Length')} is not one byte count")
            if not self.admitted:
                self.discard_body()
                return self.send_error(
                    503, f"the server is serving {self.server.max_connections} connections, its limit, and none"
                    " is idle; retry later"
                )
            getattr(self, "do_" + self.command, self.do_not_allowed)()
            self.wfile.flush()
            self._state.answered = True
        except TimeoutError:
            self.close_connection = True
            if self._reader.received and not self._responding:  # else idle: close without a word
                try:
                    self.send_error(408, f"the request did not arrive whole within {timeout:g} s")
                except OSError:
                    pass

    # --- answers

    def log_message(self, format, *args):  # noqa: A002  (BaseHTTPRequestHandler's name)
        log.debug("%s %s", self.address_string(), format % args)

    def send_json(self, status: int, payload: Any, close: bool = False, headers: dict | None = None) -> None:
        # backslashreplace: a lone surrogate echoed from the request becomes the JSON escape \udXXX.
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8", "backslashreplace")
        self._responding = True
        if self.request_version in ("", "HTTP/0.9"):
            # A request line that did not parse reads as HTTP/0.9, whose answers have no status
            # line or headers; answer in HTTP/1.1 so that the client can read the error.
            self.request_version = "HTTP/1.1"
        self.connection.settimeout(self.server.idle_timeout_seconds)  # a client must read its answer in time too
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.extra_headers(), **(headers or {})}.items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def extra_headers(self) -> dict:
        """Headers every answer carries (none here; a subclass may add some)."""
        return {}

    def send_error(self, code: int, message: str | None = None, explain: str | None = None, close: bool = True) -> None:
        """A JSON error; closes the connection unless `close` is False. Also used by http.server itself."""
        del explain
        if message is None:
            message = self.responses.get(code, ("error",))[0]
        self.log_error("code %d, message %s", code, message)
        self.send_json(code, {"error": message}, close=close)

    def do_not_allowed(self):
        self.discard_body()
        self.send_json(
            405, {"error": f"method {self.command} not allowed on {self.path}; use {self.allowed_methods}"},
            close=self.close_connection, headers={"Allow": self.allowed_methods},
        )

    # --- bodies

    def _content_length(self) -> int | None:
        """The Content-Length header's value; None if absent, repeated with different values, or not a byte count."""
        values = self.headers.get_all("Content-Length") or []
        if len(set(v.strip() for v in values)) != 1 or not _CONTENT_LENGTH.fullmatch(values[0].strip()):
            return None
        return int(values[0])

    def read_body(self, max_bytes: int) -> bytes | None:
        """The request body; None after answering 411 or 413 (the connection then closes).

        A body is refused on its Content-Length, before a byte of it is read: the 413 goes out
        at once, and only then is the body read and thrown away, in chunks and within the
        request deadline (nothing of it is kept), so that a client that sends its whole body
        before reading the answer (urllib, requests) finds the 413 waiting rather than a reset
        connection, while one that reads first has it immediately.
        """
        if "Content-Length" not in self.headers:
            self.send_error(411, "a Content-Length header is required")
            return None
        length = self._content_length()  # valid: handle_one_request has checked it
        if length > max_bytes:
            self.send_error(413, f"request body of {length} bytes exceeds the limit of {max_bytes} bytes")
            self.discard_body()
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True  # the client closed mid-body: no one to answer
            return None
        return self._decoded(body, max_bytes)

    def _decoded(self, body: bytes, max_bytes: int) -> bytes | None:
        """The body as sent, or uncompressed when its Content-Encoding is gzip (TF Serving's REST
        server takes gzipped bodies too); None after answering 400, 413 or 415. Uncompressed
        bodies obey the same `max_bytes`: a small gzip body that would inflate past it (a
        "zip bomb") is stopped there, having never held more than `max_bytes`."""
        encodings = [e.strip().lower() for v in self.headers.get_all("Content-Encoding") or []
                     for e in v.split(",") if e.strip()]
        if encodings in ([], ["identity"]):
            return body
        if encodings not in (["gzip"], ["x-gzip"]):
            self.send_error(415, f"Content-Encoding {', '.join(encodings)} is not supported; send "
                                 "the body uncompressed or as gzip")
            return None
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the gzip wrapper
        try:
            out = inflater.decompress(body, max_bytes + 1)
        except zlib.error as e:
            self.send_error(400, f"the body is not valid gzip (Content-Encoding: gzip): {e}")
            return None
        if len(out) > max_bytes:
            self.send_error(413, f"request body inflates to more than the limit of {max_bytes} "
                                 f"bytes (gzip, {len(body)} bytes sent)")
            return None
        if not inflater.eof or inflater.unused_data:
            self.send_error(400, "the body is not valid gzip (Content-Encoding: gzip): "
                                 + ("it ends before the gzip stream does" if not inflater.eof
                                    else "bytes follow the gzip stream"))
            return None
        return out

    def discard_body(self) -> None:
        """Read and drop the declared body within the request deadline; close if it cannot be read whole."""
        length = self._content_length() or 0  # valid or absent: handle_one_request has checked it
        try:
            while length > 0:
                chunk = self.rfile.read1(min(length, _CHUNK))
                if not chunk:
                    break
                length -= len(chunk)
        except (TimeoutError, ConnectionError):
            pass
        if length > 0:
            self.close_connection = True
