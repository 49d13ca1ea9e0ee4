"""Prometheus metrics under TF Serving's names, served on the REST port (`--monitoring_config_file`).

TF Serving's `--monitoring_config_file` holds a text `MonitoringConfig` proto,

    prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }

and the metrics are then served at that path on the REST port (an empty path means TF Serving's
`/monitoring/prometheus/metrics`). The names are TF Serving's, so a dashboard or alert written
for `tensorflow_model_server` reads this server too:

    :tensorflow:serving:request_count          model_name, status ("OK", "INVALID_ARGUMENT", ...)
    :tensorflow:serving:request_latency        histogram (microseconds); model_name, API, entrypoint
    :tensorflow:serving:model_warmup_latency   histogram (microseconds); model_path, status
    :tensorflow:cc:saved_model:load_latency    microseconds spent loading, per version folder
    :tensorflow:cc:saved_model:load_attempt_count   model_path, status ("success" or "fail")
    :tensorflow:serving:batching_session:processed_batch_size   histogram of rows per batch run
    :tensorflow:serving:batching_session:padding_size   rows added to reach an allowed batch size;
        execution_batch_size
    process_resident_memory_bytes, process_cpu_seconds_total, ...   prometheus_client's process metrics

As in TF Serving: API is the gRPC method name ("Predict", "Classify", ...) or the REST verb
("predict", "classify", "regress"); entrypoint is "REST" or "GRPC"; every request is counted with
its status, and only a successful one is timed (the latency is that of answers, not of
refusals). Where this server differs, on purpose:
- It also counts what TF Serving leaves out: gRPC GetModelMetadata, GetModelStatus and
  MultiInference, and the REST GET routes under API "metadata" and "status" (TF Serving: blank).
- A model name the server does not serve is counted as model_name="" (a client could otherwise
  create a series per random name).
- TF Serving's counters (request_count, load_latency, load_attempt_count) are exposed as
  `untyped`: prometheus_client writes every `counter` as NAME_total, and TF Serving's names have
  no suffix. PromQL (`rate`, `increase`) treats both types alike, so queries read the same.

Prometheus metric names may start with ':' (`[a-zA-Z_:][a-zA-Z0-9_:]*`), which prometheus_client
checks and accepts; TF Serving makes its names by replacing each '/' of TensorFlow's metric paths
(`/tensorflow/serving/request_count`) with ':'.

Each `ModelServer` owns one `Metrics` with its own `CollectorRegistry`; without a path every
method records nothing.

Example:

    metrics = Metrics("/monitoring/prometheus/metrics", model_names=["electra"])
    with metrics.request("electra", "predict", "REST"):
        ...  # a ServingError raised here is counted with its status code
    metrics.observe_batch(8)
    text = metrics.exposition()  # the page, as `metrics.content_type`
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from typing import Callable, Iterable, Iterator

import grpc
import prometheus_client
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from prometheus_client.metrics_core import HistogramMetricFamily, UnknownMetricFamily

from electra_tf.serving.errors import ServingError

DEFAULT_PATH = "/monitoring/prometheus/metrics"  # TF Serving's PrometheusExporter::kPrometheusPath


# ----------------------------------------------------------------------------- the config file


def _monitoring_config_proto():
    """TF Serving's MonitoringConfig (config/monitoring_config.proto), built at run time because
    the `tensorflow-serving-api` package does not ship it."""
    pool = descriptor_pool.DescriptorPool()
    file = descriptor_pb2.FileDescriptorProto(name="monitoring_config.proto", package="tensorflow.serving",
                                              syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    prometheus = file.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=F.TYPE_BOOL, label=F.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    config = file.message_type.add(name="MonitoringConfig")
    config.field.add(name="prometheus_config", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                     type_name=".tensorflow.serving.PrometheusConfig")
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))


def check_metrics_path(path: str) -> None:
    """Raises ValueError unless `path` can be the metrics page on the REST port."""
    if not path.startswith("/") or "?" in path or any(c.isspace() for c in path):
        raise ValueError(f"prometheus_config.path {path!r} must start with '/' and hold no '?' or spaces")
    if path.lower().startswith("/v1/"):  # TF Serving sends every /v1/ path to the model API
        raise ValueError(f"prometheus_config.path {path!r} is under /v1/, the model API's routes")


def parse_monitoring_config(text: str, where: str = "monitoring config") -> str | None:
    """The metrics path a text MonitoringConfig asks for, or None when Prometheus is not enabled.

    Errors are ValueErrors of one line that start with `where` (the file's name)."""
    config = _monitoring_config_proto()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ValueError(f"{where}: {' '.join(str(e).split())}") from None
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    path = prometheus.path or DEFAULT_PATH
    try:
        check_metrics_path(path)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return path


def read_monitoring_config(path: str) -> str | None:
    """`parse_monitoring_config` of the file at `path`; an unreadable file is a ValueError too."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    return parse_monitoring_config(text, path)


# ----------------------------------------------------------------------------- the metrics


def _exponential_buckets(scale: float, growth: float, count: int) -> tuple[float, ...]:
    """TensorFlow's monitoring::Buckets::Exponential upper bounds (+Inf is added when written)."""
    return tuple(scale * growth**i for i in range(count))


_LATENCY_BUCKETS = _exponential_buckets(10, 1.8, 33)  # microseconds, 10 us to ~25 minutes (TF Serving's)
_BATCH_BUCKETS = _exponential_buckets(1, 2, 14)  # rows, 1 to 8192 (TF Serving's)


def _bound(value: float) -> str:
    """A bucket bound as TF Serving writes it (six significant digits: "18", "32.4", "1.47476e+09")."""
    return f"{value:.6g}"


class _Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip([*map(_bound, self.bounds), "+Inf"], self.counts):
            total += count
            out.append((bound, total))
        return out


# name: (help, label names, histogram bounds or None for a counter)
_FAMILIES = {
    ":tensorflow:serving:request_count": ("The total number of requests.", ("model_name", "status"), None),
    ":tensorflow:serving:request_latency": (
        "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
        ("model_name", "API", "entrypoint"), _LATENCY_BUCKETS),
    ":tensorflow:serving:model_warmup_latency": (
        "Distribution of wall time (in microseconds) for warming up the model.", ("model_path", "status"),
        _LATENCY_BUCKETS),
    ":tensorflow:cc:saved_model:load_latency": (
        "Latency in microseconds for SavedModels that were successfully loaded.", ("model_path",), None),
    ":tensorflow:cc:saved_model:load_attempt_count": (
        "The number of times a SavedModel was successfully loaded.", ("model_path", "status"), None),
    ":tensorflow:serving:batching_session:processed_batch_size": (
        "Tracks the batch size distribution on processing.", (), _BATCH_BUCKETS),
    ":tensorflow:serving:batching_session:padding_size": (
        "Tracks the padding size distribution on batches.", ("execution_batch_size",), _BATCH_BUCKETS),
}


class RequestCall:
    """One request being measured by `Metrics.request`; set `status` (a grpc.StatusCode) when the
    outcome is not an exception the context manager sees."""

    status: grpc.StatusCode | None = None


class Metrics:
    """The server's metrics; records nothing when `path` is None.

    Args:
        path: where the REST server answers with the Prometheus page; None: no metrics.
        model_names: the served models; requests for any other name count as model_name="".
    """

    content_type = prometheus_client.CONTENT_TYPE_LATEST

    def __init__(self, path: str | None = None, model_names: Iterable[str] = ()):
        if path is not None:
            check_metrics_path(path)
        self.path = path
        self.enabled = path is not None
        self._model_names = frozenset(model_names)
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], object]] = {name: {} for name in _FAMILIES}
        self.registry: prometheus_client.CollectorRegistry | None = None
        if self.enabled:
            self.registry = prometheus_client.CollectorRegistry()
            self.registry.register(self)
            prometheus_client.ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, ...

    def add_model_names(self, names: Iterable[str]) -> None:
        """Count requests for these models under their names too (models added by a config reload)."""
        self._model_names = self._model_names | frozenset(names)

    # --- recording

    def _add(self, name: str, labels: tuple[str, ...], value: float) -> None:
        bounds = _FAMILIES[name][2]
        with self._lock:
            cells = self._values[name]
            if bounds is None:
                cells[labels] = cells.get(labels, 0) + value
            else:
                cells.setdefault(labels, _Histogram(bounds)).observe(value)

    @contextlib.contextmanager
    def request(self, model_name: str, api: str, entrypoint: str) -> Iterator[RequestCall]:
        """Counts the request run in the block with its status, and times it when it succeeds.

        The status is `call.status` if the block set it, else that of the exception leaving the
        block (a ServingError's code; INTERNAL for anything else), else OK."""
        call = RequestCall()
        if not self.enabled:
            yield call
            return
        start = time.perf_counter()
        failure: BaseException | None = None
        try:
            yield call
        except BaseException as e:
            failure = e
            raise
        finally:
            status = call.status or (
                grpc.StatusCode.OK if failure is None
                else failure.code if isinstance(failure, ServingError) else grpc.StatusCode.INTERNAL)
            model = model_name if model_name in self._model_names else ""
            self._add(":tensorflow:serving:request_count", (model, status.name), 1)
            if status == grpc.StatusCode.OK:
                micros = (time.perf_counter() - start) * 1e6
                self._add(":tensorflow:serving:request_latency", (model, api, entrypoint), micros)

    def grpc_method(self, behaviour: Callable, method_name: str) -> Callable:
        """`behaviour(request_bytes, context)`, a method registered by `grpc_api.add_servicer`,
        counted and timed under API=`method_name`, entrypoint GRPC; the status is the one the
        method left on the context (`context.abort`)."""
        if not self.enabled:
            return behaviour
        depth = 3 if method_name == "MultiInference" else 2  # MultiInferenceRequest: tasks[0].model_spec.name

        def counted(data, context):
            with self.request(_request_model_name(data, depth), method_name, "GRPC") as call:
                try:
                    return behaviour(data, context)
                finally:
                    call.status = context.code()  # None when the method returned without setting one

        return counted

    def observe_load(self, model_path: str, seconds: float, succeeded: bool = True) -> None:
        """A load of the SavedModel version at `model_path` that took `seconds`."""
        if not self.enabled:
            return
        self._add(":tensorflow:cc:saved_model:load_attempt_count", (model_path, "success" if succeeded else "fail"), 1)
        if succeeded:
            self._add(":tensorflow:cc:saved_model:load_latency", (model_path,), round(seconds * 1e6))

    def observe_warmup(self, model_path: str, seconds: float, status: str = "OK") -> None:
        """The warmup of the version at `model_path`: its `seconds` and its status ("OK" or the
        error code's name, e.g. "INVALID_ARGUMENT")."""
        if self.enabled:
            self._add(":tensorflow:serving:model_warmup_latency", (model_path, status), seconds * 1e6)

    def observe_batch(self, rows: int, padding: int = 0) -> None:
        """One model call of the batching scheduler on `rows` rows, `padding` of them added to reach
        an allowed batch size (recorded for every batch, as TF Serving's MergeInputTensors)."""
        if self.enabled:
            self._add(":tensorflow:serving:batching_session:processed_batch_size", (), rows)
            self._add(":tensorflow:serving:batching_session:padding_size", (str(rows),), padding)

    # --- the page

    def exposition(self) -> bytes:
        """The Prometheus text page (prometheus_client's format 0.0.4)."""
        if self.registry is None:
            raise RuntimeError("metrics are not enabled")
        return prometheus_client.generate_latest(self.registry)

    def collect(self):
        """The families, for the registry (prometheus_client's Collector protocol)."""
        with self._lock:
            snapshot = {name: {labels: (value.cumulative(), value.sum) if isinstance(value, _Histogram) else value
                               for labels, value in cells.items()}
                        for name, cells in self._values.items()}
        for name, (documentation, label_names, bounds) in _FAMILIES.items():
            if bounds is None:
                family = UnknownMetricFamily(name, documentation, labels=label_names)
                for labels, value in sorted(snapshot[name].items()):
                    family.add_metric(labels, value)
            else:
                family = HistogramMetricFamily(name, documentation, labels=label_names)
                for labels, (buckets, total) in sorted(snapshot[name].items()):
                    family.add_metric(labels, buckets, sum_value=total)
            yield family


def _length_delimited_field_one(data: bytes, start: int, end: int) -> tuple[int, int] | None:
    """The span of the first field number 1 of wire type 2 (bytes or a message) in the protobuf
    message data[start:end], or None (also when the bytes are not a message)."""

    def varint(pos: int) -> tuple[int, int]:
        value, shift = 0, 0
        while pos < end and shift < 64:
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not byte & 0x80:
                return value, pos
        raise ValueError("truncated varint")

    pos = start
    try:
        while pos < end:
            key, pos = varint(pos)
            wire_type = key & 7
            if wire_type == 0:
                _, pos = varint(pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = varint(pos)
                if pos + length > end:
                    return None
                if key >> 3 == 1:
                    return pos, pos + length
                pos += length
            else:
                return None
    except ValueError:
        return None
    return None


def _request_model_name(data: bytes, depth: int) -> str:
    """model_spec.name of a serialized TF Serving request, read without parsing the request (a
    Predict request may hold megabytes of tensors). Every request message holds its ModelSpec as
    field 1 (MultiInferenceRequest: in its first task, field 1 of field 1), and a ModelSpec its
    name as field 1: the name is `depth` fields 1 deep. "" when it is not there."""
    start, end = 0, len(data)
    for _ in range(depth):
        span = _length_delimited_field_one(data, start, end)
        if span is None:
            return ""
        start, end = span
    return bytes(data[start:end]).decode("utf-8", "replace")
