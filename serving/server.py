"""A local model server that speaks TensorFlow Serving's REST and gRPC APIs.

The official `tensorflow_model_server` is a C++ binary shipped as a Docker image; this
server lets the project run, test and demonstrate serving without it, while clients
see the same wire contract (TF Serving's g3doc/api_rest.md and apis/*.proto):

- Models live in `BASE/NAME/VERSION/` (VERSION in ASCII digits, a positive int64). The
  highest version is served by default; a background thread polls the base paths, loads
  new versions and unloads removed ones. A version that fails to load is logged and
  skipped, and the versions already loaded keep serving; so do they while a base path
  cannot be listed (renamed away and back).
- REST: `GET /v1/models/NAME[/versions/V]` (status), `.../metadata`, and
  `POST /v1/models/NAME[/versions/V]:predict` (row `instances` or columnar `inputs`).
- gRPC: `PredictionService.Predict`, `PredictionService.GetModelMetadata`,
  `ModelService.GetModelStatus`.

The modules, from the model outward:
  servables.py         a loaded SavedModel version and its signatures (checks and runs requests);
  manager.py           which versions are loaded, polling, version policies, status;
  versions.py          the version folders of a base path, as TF Serving reads them;
  batching.py          schedules model calls (arrival order, or TF Serving's --enable_batching);
  batching_parameters.py  TF Serving's batching parameters (--batching_parameters_file, per model);
  json_api.py          REST JSON bodies <-> tensors, status and metadata documents;
  rest_connections.py  REST connections (thread per connection, idle timeout, cap, body limit);
  rest.py              the REST routes;
  grpc_api.py          the gRPC services and TensorProto conversion;
  grpc_transport.py    TLS, the UNIX socket, channel arguments and the health check of the gRPC port;
  budget.py            how many request bytes are parsed at once (the memory a request may cost);
  ports.py, defaults.py  the ports and limits, checked before any model loads;
  metrics.py           Prometheus metrics under TF Serving's names (--monitoring_config_file);
  errors.py            status codes and their HTTP equivalents;
  server.py            `ModelServer`, which puts them together.

Any TF2 SavedModel with dense named-tensor signatures works. `tensorflow_text` is imported
before loading so that in-graph tokenizers resolve (TF Serving itself links the TF Text ops in).

Example:

    with ModelServer("/tmp/export/electra_rt") as server:
        print(f"http://127.0.0.1:{server.rest_port}/v1/models/electra_rt")
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent import futures
from typing import Sequence

import grpc
from tensorflow_serving.apis import (
    model_service_pb2,
    prediction_service_pb2,
)

from electra_tf.serving.batching import Batcher, Unbatched
from electra_tf.serving.batching_parameters import BatchingParameters
from electra_tf.serving.budget import ParseBudget
from electra_tf.serving.defaults import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REST_IDLE_TIMEOUT_SECONDS,
    DEFAULT_REST_API_TIMEOUT_MS,
    DEFAULT_REST_MAX_CONNECTIONS,
    limit_error,
)
from electra_tf.serving.errors import ServingError
from electra_tf.serving.grpc_api import ModelService, PredictionService, add_servicer
from electra_tf.serving.grpc_transport import HealthService, SslConfig, check_socket_path
from electra_tf.serving.manager import LoadOptions, ModelManager
from electra_tf.serving.metrics import Metrics
from electra_tf.serving.model_config import ModelConfig
from electra_tf.serving.ports import PortError, check_ports, port_error
from electra_tf.serving.rest import RestServer

__all__ = ["LoadOptions", "ModelServer", "PortError"]

log = logging.getLogger(__name__)


class ModelServer:
    """REST + gRPC model server over `BASE/NAME/VERSION` SavedModels.

    Args:
        model_base_path: the `BASE/NAME` folder holding numbered versions.
        model_name: the served name; defaults to the basename of `model_base_path`.
        rest_port: REST port; 0 picks a free port, None disables REST.
        grpc_port: gRPC port; 0 picks a free port, None disables gRPC.
        host: the address to bind (loopback by default).
        models: instead of `model_base_path`, several `ModelConfig`s (e.g. from a
            `models.config` file); they also carry the version policy.
        poll_interval_seconds: how often to look for new versions; <= 0 looks once. A base path
            that cannot be listed keeps its loaded versions (serving.manager).
        max_body_bytes: larger REST bodies get 413; also the gRPC message limit, and the bytes of
            requests parsed at once (serving.budget).
        max_batch_size: larger batches get INVALID_ARGUMENT / 400.
        rest_idle_timeout_seconds: a REST connection is closed after this long without a
            request, and each request must arrive whole within this long (see
            serving.rest_connections).
        rest_max_connections: REST connections served at once. At the cap a new connection
            closes the longest idle one; only when none is idle does it get 503.
        model_threads: model calls run at once without batching (default or 0: one per core);
            the other requests wait their turn in arrival order.
        batching: TF Serving's `--enable_batching` with these parameters (see
            serving.batching); None runs each request on its own.
        grpc_threads: gRPC worker pool size.
        rest_api_timeout_ms: how long a REST request's model calls may wait for a model thread
            or batch (TF Serving's --rest_api_timeout_in_ms; <= 0: no limit). A gRPC request's
            limit is its client's deadline. A request whose limit passes before its call starts
            is answered at once (serving.batching, "Deadlines").
        rest_api_num_threads: REST requests handled at once, the others waiting their turn in
            arrival order (TF Serving's --rest_api_num_threads); 0: each connection's request
            at once, up to `rest_max_connections`.
        allow_version_labels_for_unavailable_models: TF Serving's flag: True lets a
            `version_labels` entry name a version not loaded yet (this server's default); False
            (TF Serving's default) refuses any label whose version is not AVAILABLE when it is
            set, which at start is every label, as TF Serving checks before it loads (so a
            ServingError FAILED_PRECONDITION from the constructor); see `ModelManager.check_labels`.
        enable_cors: TF Serving's --rest_api_enable_cors_support: every REST answer allows
            any origin (Access-Control-Allow-Origin: *, methods POST and GET, header
            Content-Type), for a web page calling the model from a browser.
        metrics_path: serve Prometheus metrics (serving.metrics) at this path on the REST port,
            as TF Serving's `--monitoring_config_file` asks; None serves none and records nothing.
        tensor_content: gRPC Predict answers carry numbers in `tensor_content` (bytes) instead of
            the typed `*_val` fields (TF Serving's --enable_serialization_as_tensor_content).
        load_options: the MetaGraph tags, load retries and load threads (serving.manager.LoadOptions,
            TF Serving's --saved_model_tags, --max_num_load_retries, --load_retry_interval_micros,
            --num_load_threads); by default "serve", no retry, one load at a time.
        warmup_iterations: runs of each warmup record before a version is AVAILABLE (TF
            Serving's --num_request_iterations_for_warmup); 0: no warmup (--enable_model_warmup=false).
        grpc_socket_path: also serve gRPC on this UNIX socket (TF Serving's --grpc_socket_path;
            `grpc_transport.check_socket_path` vets it first). It works with grpc_port=None too.
        grpc_channel_arguments: (key, value) gRPC server arguments (TF Serving's
            --grpc_channel_arguments, `grpc_transport.parse_channel_arguments`); they override
            this server's own (the message limit from `max_body_bytes`).
        ssl: serve gRPC over TLS with this key and certificate, and require client certificates
            signed by its CA when it says so (TF Serving's --ssl_config_file); REST stays HTTP.
        enable_grpc_healthcheck: offer grpc.health.v1.Health/Check (TF Serving's
            --enable_grpc_healthcheck_service, `grpc_transport.HealthService`).
        model_config_file: the models.config `models` came from, re-read every
            `model_config_poll_seconds` (> 0) and reloaded when it changes, as TF Serving's
            `--model_config_file_poll_wait_seconds` (`ModelManager.start_config_polling`).

    Example:

        with ModelServer("/tmp/export/electra", rest_port=8501, grpc_port=8500) as server:
            ...  # server.rest_port, server.grpc_port
    """

    def __init__(
        self,
        model_base_path: str | None = None,
        model_name: str | None = None,
        rest_port: int | None = 0,
        grpc_port: int | None = 0,
        host: str = "127.0.0.1",
        *,
        models: Sequence[ModelConfig] | None = None,
        poll_interval_seconds: float = 1.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        rest_idle_timeout_seconds: float = DEFAULT_REST_IDLE_TIMEOUT_SECONDS,
        rest_max_connections: int = DEFAULT_REST_MAX_CONNECTIONS,
        model_threads: int | None = None,
        batching: BatchingParameters | None = None,
        grpc_threads: int = 16,
        metrics_path: str | None = None,
        model_config_file: str | None = None,
        model_config_poll_seconds: float = 0.0,
        warmup_iterations: int = 1,
        rest_api_timeout_ms: int = DEFAULT_REST_API_TIMEOUT_MS,
        rest_api_num_threads: int = 0,
        enable_cors: bool = False,
        allow_version_labels_for_unavailable_models: bool = True,
        grpc_socket_path: str | None = None,
        grpc_channel_arguments: Sequence[tuple[str, int | str]] = (),
        ssl: SslConfig | None = None,
        enable_grpc_healthcheck: bool = False,
        load_options: LoadOptions = LoadOptions(),
        tensor_content: bool = False,
    ):
        if (model_base_path is None) == (models is None):
            raise ValueError("pass exactly one of model_base_path or models")
        if load_options.per_model_batching is not None and load_options.per_model_batching != batching:
            raise ValueError("load_options.per_model_batching must be the server's `batching` parameters")
        if models is None:
            base = os.path.abspath(model_base_path)
            models = [ModelConfig(model_name or os.path.basename(base.rstrip(os.sep)), base)]
        limits = {"max_body_bytes": max_body_bytes, "max_batch_size": max_batch_size,
                  "rest_idle_timeout_seconds": rest_idle_timeout_seconds, "rest_max_connections": rest_max_connections,
                  "model_threads": model_threads or 0, "grpc_threads": grpc_threads,
                  "poll_interval_seconds": poll_interval_seconds, "model_config_poll_seconds": model_config_poll_seconds, "rest_port": rest_port or 0, "grpc_port": grpc_port or 0,
                  "rest_api_timeout_ms": rest_api_timeout_ms, "rest_api_num_threads": rest_api_num_threads}
        for name, value in limits.items():
            if (error := limit_error(name, value)) is not None:
                raise ValueError(f"{name} {error}")
        self.metrics = Metrics(metrics_path, model_names=[c.name for c in models])
        self.manager = ModelManager(models, metrics=self.metrics, warmup_iterations=warmup_iterations,
                                    load_options=load_options,
                                    allow_unavailable_labels=allow_version_labels_for_unavailable_models)
        self.manager.check_labels(models)  # raises ServingError (FAILED_PRECONDITION) when refused
        self.host = host
        self.max_body_bytes = max_body_bytes
        self.max_batch_size = max_batch_size
        self.rest_idle_timeout_seconds = rest_idle_timeout_seconds
        self.rest_max_connections = rest_max_connections
        self.rest_timeout_seconds = rest_api_timeout_ms / 1000 if rest_api_timeout_ms > 0 else None
        self.rest_api_num_threads = rest_api_num_threads
        self.enable_cors = enable_cors
        self.tensor_content = tensor_content
        self.parse_budget = ParseBudget(max_body_bytes)  # one maximal request parsed at a time (serving.budget)
        self._model_threads = model_threads or os.cpu_count() or 1
        self.batching = batching
        self.scheduler: Batcher | Unbatched | None = None
        self._requested_ports = (rest_port, grpc_port)
        self._poll_interval = poll_interval_seconds
        self._model_config = (model_config_file, model_config_poll_seconds)
        self._grpc_threads = grpc_threads
        self._grpc_socket_path = grpc_socket_path
        self._grpc_channel_arguments = list(grpc_channel_arguments)
        self._ssl = ssl
        self.health = HealthService(max_watchers=grpc_threads // 4) if enable_grpc_healthcheck else None
        self._rest: RestServer | None = None
        self._rest_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None
        self.rest_port: int | None = None
        self.grpc_port: int | None = None

    @property
    def model_names(self) -> list[str]:
        return list(self.manager.configs)

    @property
    def concurrent_model_calls(self) -> int:
        """Model calls that may run at once: num_batch_threads with batching, else model_threads."""
        return self.batching.num_batch_threads if self.batching else self._model_threads

    def start(self) -> "ModelServer":
        """Load the current versions, then open the ports. Returns self.

        Raises PortError (one line: "REST port 8501 on 127.0.0.1 is already in use") if a port
        cannot be opened; nothing is left running then. The ports are tried before the models
        load, so that a taken port is reported at once rather than after a long load."""
        check_ports(self.host, *self._requested_ports)
        if self._grpc_socket_path:  # gRPC would unlink a live server's socket: TransportError instead
            self._grpc_socket_path = check_socket_path(self._grpc_socket_path)
        self.manager.poll()
        for name in self.manager.configs:
            try:
                self.manager.servable(name)
            except ServingError:
                log.warning("model %r has no loadable version yet; waiting for one to appear", name)
        rest_port, grpc_port = self._requested_ports
        self.scheduler = Batcher(self.batching, metrics=self.metrics) if self.batching else Unbatched(self._model_threads)
        try:
            if rest_port is not None:
                try:
                    self._rest = RestServer((self.host, rest_port), self)
                except OSError as e:
                    raise port_error("REST", self.host, rest_port, e) from None
                self.rest_port = self._rest.server_address[1]
                self._rest_thread = threading.Thread(
                    target=self._rest.serve_forever, kwargs={"poll_interval": 0.2}, name="rest-server", daemon=True
                )
                self._rest_thread.start()
            if grpc_port is not None or self._grpc_socket_path:
                self._start_grpc(grpc_port)
        except BaseException:
            self.stop()
            raise
        self.manager.start_polling(self._poll_interval)
        if self._model_config[0] is not None:
            self.manager.start_config_polling(*self._model_config)
        return self

    def _start_grpc(self, grpc_port: int | None) -> None:
        options = {"grpc.max_receive_message_length": self.max_body_bytes, "grpc.max_send_message_length": -1,
                   "grpc.so_reuseport": 0}
        options.update(self._grpc_channel_arguments)  # the operator's word last, as TF Serving's builder
        self._grpc = grpc.server(futures.ThreadPoolExecutor(self._grpc_threads, thread_name_prefix="grpc"),
                                 options=list(options.items()))
        for service, descriptor in ((PredictionService(self), prediction_service_pb2), (ModelService(self), model_service_pb2)):
            name = type(service).__name__
            add_servicer(self._grpc, service, descriptor.DESCRIPTOR.services_by_name[name], self.metrics)
        if self.health is not None:
            self.health.set_serving(True)
            self.health.add_to(self._grpc)

        def listen(address: str) -> int:
            try:
                if self._ssl is not None:
                    return self._grpc.add_secure_port(address, self._ssl.credentials())
                return self._grpc.add_insecure_port(address)
            except RuntimeError:  # "Failed to bind to address ..."; the reason went to the C core's log
                return 0

        if grpc_port is not None:
            target = f"[{self.host}]:{grpc_port}" if ":" in self.host else f"{self.host}:{grpc_port}"
            self.grpc_port = listen(target)
            if not self.grpc_port:
                raise PortError(errno.EADDRINUSE, f"gRPC port {grpc_port} on {self.host} could not be opened")
        if self._grpc_socket_path:
            if not listen(f"unix:{self._grpc_socket_path}"):
                raise PortError(errno.EADDRINUSE, f"gRPC socket {self._grpc_socket_path} could not be opened")
            log.info("gRPC also on the UNIX socket %s", self._grpc_socket_path)
        self._grpc.start()

    def stop(self, grace_seconds: float = 2.0) -> None:
        """Stop polling, finish in-flight requests (up to `grace_seconds` for gRPC), close ports."""
        if self.health is not None:
            self.health.close()  # checks during the grace period see the drain; watch streams end
        self.manager.stop()
        if self._grpc is not None:
            self._grpc.stop(grace_seconds).wait()
            self._grpc = None
        if self._rest is not None:
            self._rest.shutdown()
            self._rest.server_close()
            self._rest = None
        if self._rest_thread is not None:
            self._rest_thread.join()
            self._rest_thread = None
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None

    def __enter__(self) -> "ModelServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
