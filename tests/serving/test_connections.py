"""serving.rest_connections through ModelServer: idle, slow, oversize and surplus clients, real sockets on 127.0.0.1."""

import http.client
import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request

import pytest

from electra_tf.serving.client import RestClient
from electra_tf.serving.server import ModelServer

MAX_BODY = 64 * 1024
STATUS_REQUEST = b"GET /v1/models/tiny HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture(scope="module")
def server(model_base):
    with ModelServer(model_base, grpc_port=None, max_body_bytes=MAX_BODY, rest_idle_timeout_seconds=30) as s:
        yield s


@pytest.fixture(scope="module")
def short_server(model_base):
    """Closes idle connections after 1 s."""
    with ModelServer(model_base, grpc_port=None, max_body_bytes=MAX_BODY, rest_idle_timeout_seconds=1.0) as s:
        yield s


def status_seconds(port: int) -> float:
    """Seconds a new client takes to connect and get GET /v1/models/tiny answered."""
    start = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/v1/models/tiny")
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["model_version_status"]
    finally:
        connection.close()
    return time.perf_counter() - start


def median_status_seconds(port: int, tries: int = 5) -> float:
    # A median of a few tries, so that one descheduling on a loaded machine does not decide.
    return statistics.median(status_seconds(port) for _ in range(tries))


def read_response(sock: socket.socket, head: bool = False) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one HTTP response read from `sock` (no body if `head`)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while not head and len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes `sock` (reading and discarding), or None if it stays open."""
    sock.settimeout(seconds)
    start = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - start


def test_new_client_is_answered_while_64_connections_idle(server):
    connections = []
    try:
        for i in range(64):
            sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
            connections.append(sock)
            if i % 2:  # half send one request and keep the connection alive, half send nothing
                sock.sendall(STATUS_REQUEST)
                status, headers, _ = read_response(sock)
                assert status == 200 and headers.get("connection") != "close"
        assert median_status_seconds(server.rest_port) < 0.1
        # The kept-alive connections still serve.
        connections[1].sendall(STATUS_REQUEST)
        assert read_response(connections[1])[0] == 200
    finally:
        for sock in connections:
            sock.close()


def test_idle_connection_is_closed_after_the_timeout(short_server):
    with socket.create_connection(("127.0.0.1", short_server.rest_port), timeout=10) as silent, \
            socket.create_connection(("127.0.0.1", short_server.rest_port), timeout=10) as kept_alive:
        kept_alive.sendall(STATUS_REQUEST)
        assert read_response(kept_alive)[0] == 200
        for sock in (silent, kept_alive):
            waited = closed_by_server_within(sock, 10)
            assert waited is not None and waited < 5  # 1 s timeout; slack for a loaded machine


def test_the_rest_client_keeps_a_connection_per_thread_and_resends_once_after_the_server_closed_it(
        short_server):
    """RestClient sends a thread's requests over one kept-alive connection (one client port for
    all of them), threads do not share one, and a request on a connection the server closed
    while it was idle (after 1 s here) goes out again on a new connection instead of failing."""
    with RestClient("127.0.0.1", short_server.rest_port, "tiny") as client:

        def ports_of_requests(n: int) -> set:
            ports = set()
            for _ in range(n):
                assert client.status()["model_version_status"][0]["state"] == "AVAILABLE"
                ports.add(client._local.connection.sock.getsockname()[1])
            return ports

        first = ports_of_requests(5)
        assert len(first) == 1
        others = []
        threads = [threading.Thread(target=lambda: others.append(ports_of_requests(5))) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [len(p) for p in others] == [1, 1, 1] and len(set().union(first, *others)) == 4
        time.sleep(3)  # past the server's idle timeout: it has closed this thread's connection
        assert not ports_of_requests(1) & first


def test_slow_loris_clients_do_not_block_others_and_are_cut_off(short_server):
    # 16 clients send their headers a byte every 50 ms: they would need ~2.5 s, the deadline is 1 s.
    request = b"GET /v1/models/tiny HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: " + b"x" * 20 + b"\r\n\r\n"
    slow = [socket.create_connection(("127.0.0.1", short_server.rest_port), timeout=10) for _ in range(16)]
    stop = threading.Event()

    def dribble():
        for byte in request:
            for sock in slow:
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    pass
            if stop.wait(0.05):
                return

    dribbler = threading.Thread(target=dribble)
    dribbler.start()
    try:
        time.sleep(0.2)
        assert median_status_seconds(short_server.rest_port) < 0.1
        for sock in slow:
            status, _, body = read_response(sock)
            assert status == 408 and "did not arrive whole within 1 s" in json.loads(body)["error"]
            assert closed_by_server_within(sock, 5) is not None
    finally:
        stop.set()
        dribbler.join()
        for sock in slow:
            sock.close()


def test_request_cut_off_mid_body_gets_408(short_server):
    with socket.create_connection(("127.0.0.1", short_server.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"inst")
        status, headers, body = read_response(sock)
        assert status == 408 and headers["connection"] == "close" and json.loads(body)["error"]


def test_oversize_body_gets_a_readable_413_with_urllib(server):
    # Larger than the socket buffers: a server that answers without reading resets urllib's upload.
    body = json.dumps({"signature_name": "single_text", "instances": ["x" * (4 * 1024 * 1024)]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{server.rest_port}/v1/models/tiny:predict", data=body)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 413
    error = json.loads(e.value.read())["error"]
    assert f"request body of {len(body)} bytes exceeds the limit of {MAX_BODY} bytes" == error
    assert status_seconds(server.rest_port) < 10


def test_gzip_bodies_are_inflated_within_the_body_limit(server):
    """Content-Encoding: gzip, as TF Serving's REST server takes it: the same answer as the plain
    body; a body that inflates past the limit (a "zip bomb" of a few KB) gets 413, a damaged or
    cut one 400, another encoding 415; the connection keeps serving."""
    import gzip

    url = f"http://127.0.0.1:{server.rest_port}/v1/models/tiny:predict"
    body = json.dumps({"signature_name": "single_text", "instances": ["a b c"]}).encode()

    def post(data, encoding=None):
        headers = {"Content-Encoding": encoding} if encoding else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    plain = post(body)
    assert plain[0] == 200 and post(gzip.compress(body), "gzip") == plain == post(gzip.compress(body), "GZip")
    bomb = gzip.compress(b" " * (MAX_BODY + 1))
    assert len(bomb) < MAX_BODY // 100
    assert post(bomb, "gzip") == (413, {"error": f"request body inflates to more than the limit of {MAX_BODY} "
                                                 f"bytes (gzip, {len(bomb)} bytes sent)"})
    assert post(gzip.compress(body, 9) + b"!", "gzip")[1]["error"].endswith("bytes follow the gzip stream")
    assert post(gzip.compress(body)[:-4], "gzip")[1]["error"].endswith("ends before the gzip stream does")
    assert post(body, "gzip")[0] == 400
    assert post(body, "br") == (415, {"error": "Content-Encoding br is not supported; send the body "
                                               "uncompressed or as gzip"})
    assert post(body) == plain


def test_oversize_body_is_refused_on_its_content_length_before_it_is_read(server):
    """The 413 goes out as soon as the headers are read: a client declaring 10 GB and sending a few
    bytes has it at once, not after the 30 s deadline the server gives a body to arrive."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n{\"inst")
        start = time.monotonic()
        status, headers, body = read_response(sock)
        assert time.monotonic() - start < 2
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"] == f"request body of 10000000000 bytes exceeds the limit of {MAX_BODY} bytes"


def test_oversize_upload_that_does_not_end_is_cut_at_the_deadline(short_server):
    with socket.create_connection(("127.0.0.1", short_server.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /v1/models/tiny:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
        sock.sendall(b"x" * 100_000)  # then nothing more
        start = time.monotonic()
        status, headers, body = read_response(sock)
        assert status == 413 and "exceeds the limit" in json.loads(body)["error"]
        assert headers["connection"] == "close" and time.monotonic() - start < 5


def test_connections_over_the_cap_get_503_when_none_is_idle_and_others_are_served(model_base):
    with ModelServer(model_base, grpc_port=None, rest_max_connections=4) as server:
        held = [socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) for _ in range(4)]
        try:
            for sock in held:  # busy: a request begun and not finished (idle ones would be closed for a newcomer)
                sock.sendall(STATUS_REQUEST[:20])
            time.sleep(0.2)  # the server has read the beginnings
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{server.rest_port}/v1/models/tiny", timeout=10)
            assert e.value.code == 503 and "4 connections, its limit, and none is idle" in json.loads(e.value.read())["error"]
            held[0].sendall(STATUS_REQUEST[20:])  # the busy ones were left alone
            assert read_response(held[0])[0] == 200
            held.pop().close()
            deadline = time.monotonic() + 10
            while True:  # the server notices the close within moments
                try:
                    assert status_seconds(server.rest_port) < 10
                    break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            for sock in held:
                sock.close()


@pytest.mark.parametrize("raw,status,words", [
    (b"BREW /v1/models/tiny HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method BREW not allowed"),
    (b"HEAD /v1/models/tiny HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
    (b"GARBAGE\r\n\r\n", 400, "Bad request syntax"),
    (b"GET /v1/models/tiny HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400, "not one byte count"),
    (b"POST /v1/models/tiny:predict HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n{}", 400, "not one byte count"),
    (b"POST /v1/models/tiny:predict HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "chunked"),
    (b"POST /v1/models/tiny:predict HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n", 400, "not one byte count"),
], ids=["unknown method", "HEAD", "bad request line", "negative length", "two lengths", "chunked", "superscript digit"])
def test_protocol_errors_are_json(server, raw, status, words):
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(raw)
        got, headers, body = read_response(sock, head=raw.startswith(b"HEAD"))
    assert got == status, body
    if words is None:  # HEAD: no body
        assert headers["content-type"] == "application/json"
    else:
        assert words in json.loads(body)["error"]
