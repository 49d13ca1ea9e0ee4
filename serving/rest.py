"""TF Serving's REST routes over `rest_connections.ConnectionServer`.

`GET /v1/models/NAME[/versions/V][/metadata]` and `POST /v1/models/NAME[/versions/V]:predict`,
`:classify` and `:regress`; connection handling, deadlines and limits are `rest_connections`'; the
JSON is `json_api`'s (`inference_api`'s for :classify and :regress).
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING

from electra_tf.serving.batching import FifoSlots, request_deadline
from electra_tf.serving.errors import HTTP_STATUS, ServingError, invalid, shown, without_paths
from electra_tf.serving.inference_api import inference_json
from electra_tf.serving.json_api import metadata_json, predict_json, status_json
from electra_tf.serving.rest_connections import ConnectionServer, JsonRequestHandler

if TYPE_CHECKING:
    from electra_tf.serving.server import ModelServer

log = logging.getLogger(__name__)

_PREDICT_PATH = re.compile(
    r"^/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?:(predict|classify|regress)$", re.I
)
_GET_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/([0-9]+)|/labels/([^/:]+))?(/metadata)?$", re.I)
# TF Serving's --rest_api_enable_cors_support (http_rest_api_util.cc, AddCORSHeaders)
_CORS_HEADERS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "POST, GET",
                 "Access-Control-Allow-Headers": "Content-Type"}
_INT64_MAX = 2**63 - 1


class _RestHandler(JsonRequestHandler):
    """TF Serving's REST routes; connection handling and limits are `JsonRequestHandler`'s."""

    server_version = "electra-serve"

    def extra_headers(self) -> dict:
        return _CORS_HEADERS if self.server.app.enable_cors else {}

    def _handle(self, fn) -> None:
        app, slots = self.server.app, self.server.request_slots
        try:
            with app.metrics.request(*_metric_labels(self.command, self.path), "REST"), \
                    request_deadline(app.rest_timeout_seconds), slots or contextlib.nullcontext():
                status, payload = fn()
        except ServingError as e:
            return self.send_error(HTTP_STATUS.get(e.code, 500), e.message, close=False)
        except Exception as e:  # noqa: BLE001  (a bad request must never take the server down)
            log.exception("internal error on %s %s", self.command, self.path)
            return self.send_error(500, f"internal server error: {type(e).__name__}: {without_paths(str(e))}", close=False)
        self.send_json(status, payload)

    def _route(self, method: str):
        path = self.path.split("?", 1)[0]
        predict, get = _PREDICT_PATH.match(path), _GET_PATH.match(path)
        if (predict and method != "POST") or (get and method != "GET"):
            return 405, "POST" if predict else "GET", None
        return (200, None, predict or get) if (predict or get) else (404, None, None)

    def do_GET(self):  # noqa: N802  (http.server's naming)
        self.discard_body()
        if self.path.split("?", 1)[0] == self.server.app.metrics.path:  # None without --monitoring_config_file
            return self._send_metrics()
        status, allow, match = self._route("GET")
        if status != 200:
            return self._reject(status, allow)
        name, version, label, metadata = match.groups()
        app = self.server.app

        def run():
            v = _version(version, label, app.manager, name)
            if metadata:
                return 200, metadata_json(app.manager, name, v)
            return 200, status_json(app.manager, name, v)

        self._handle(run)

    def do_POST(self):  # noqa: N802
        status, allow, match = self._route("POST")
        if status != 200:
            self.discard_body()
            return self._reject(status, allow)
        name, version, label, method = match.groups()
        app = self.server.app
        body = self.read_body(app.max_body_bytes)
        if body is None:
            return  # read_body has answered

        def run():
            v = _version(version, label, app.manager, name)
            if method.lower() != "predict":
                return 200, inference_json(app.manager, name, v, method.lower(), body, app.max_batch_size,
                                           app.scheduler, app.parse_budget)
            return 200, predict_json(app.manager, name, v, body, app.max_batch_size, app.scheduler, app.parse_budget)

        self._handle(run)

    def do_OPTIONS(self):  # noqa: N802
        """A CORS preflight, answered as TF Serving does: 200 for a /v1/ path asked from an
        http(s) origin (with the CORS headers when they are on), else 400 naming the missing
        Origin; other paths 404."""
        self.discard_body()
        if not self.path.lower().startswith("/v1/"):
            return self._reject(404, None)
        if not re.search(r"https?://", self.headers.get("Origin", "")):
            return self.send_error(400, "Origin header is missing in CORS preflight", close=False)
        self._responding = True
        self.connection.settimeout(self.server.idle_timeout_seconds)
        self.send_response(200)
        for key, value in self.extra_headers().items():
            self.send_header(key, value)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.wfile.flush()

    def _reject(self, status: int, allow: str | None):
        if status == 405:
            return self.send_json(
                405, {"error": f"method {self.command} not allowed on {self.path}; use {allow}"},
                close=self.close_connection, headers={"Allow": allow},
            )
        self.send_error(
            404,
            f"Malformed request: {self.command} {self.path}; expected /v1/models/NAME[/versions/V]"
            "[/metadata] (GET) or /v1/models/NAME[/versions/V]:predict|:classify|:regress (POST)",
            close=self.close_connection,
        )

    def _send_metrics(self) -> None:
        """The Prometheus page (serving.metrics), in its own text format rather than JSON."""
        metrics = self.server.app.metrics
        body = metrics.exposition()
        self._responding = True  # as send_json: a timeout while writing it must not add a 408
        self.connection.settimeout(self.server.idle_timeout_seconds)
        self.send_response(200)
        self.send_header("Content-Type", metrics.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()


def _metric_labels(command: str, path: str) -> tuple[str, str]:
    """(model name, API) of a routed request, for serving.metrics: TF Serving's REST API names, the
    verb after ':' ("predict", "classify", "regress"), and "metadata" or "status" for a GET."""
    path = path.split("?", 1)[0]
    name = re.split(r"[/:]", path[len("/v1/models/"):], maxsplit=1)[0]
    if command == "POST":
        return name, path.rpartition(":")[2].lower()
    return name, "metadata" if path.lower().endswith("/metadata") else "status"


def _version(version: str | None, label: str | None, manager, name: str) -> int | None:
    """The version in the path, an int64 as in TF Serving (whose message this is), or the one its
    label names in the model's `version_labels` (`ModelManager.version_of_label`)."""
    if label is not None:
        return manager.version_of_label(name, label)
    if version is None:
        return None
    # Digits only (the route's pattern); a length check first: int() refuses 4300+ digits.
    if len(version.lstrip("0")) > 19 or int(version) > _INT64_MAX:
        raise invalid(f"Failed to convert version: {shown(version)} to numeric.")
    return int(version)


class RestServer(ConnectionServer):
    def __init__(self, address, app: "ModelServer"):
        self.app = app
        # --rest_api_num_threads: requests handled at once, in arrival order (None: no limit)
        self.request_slots = FifoSlots(app.rest_api_num_threads) if app.rest_api_num_threads else None
        super().__init__(
            address, _RestHandler, idle_timeout_seconds=app.rest_idle_timeout_seconds, max_connections=app.rest_max_connections
        )
