"""A local model server that speaks TensorFlow Serving's REST and gRPC APIs.

The official `tensorflow_model_server` is a C++ binary shipped as a Docker image; this
server lets the project run, test and demonstrate serving without it, while clients
see the same wire contract (TF Serving's g3doc/api_rest.md and apis/*.proto):

- Models live in `BASE/NAME/VERSION/` (VERSION a positive integer). The highest
  version is served by default; a background thread polls the base paths, loads new
  versions and unloads removed ones. A version that fails to load is logged and
  skipped, and the versions already loaded keep serving.
- REST: `GET /v1/models/NAME[/versions/V]` (status), `.../metadata`, and
  `POST /v1/models/NAME[/versions/V]:predict` (row `instances` or columnar `inputs`).
- gRPC: `PredictionService.Predict`, `PredictionService.GetModelMetadata`,
  `ModelService.GetModelStatus`.

Around the routes: `rest_connections.py` holds the REST connections (thread per connection,
idle timeout, connection cap, body limit), `batching.py` schedules the model calls (in arrival
order, optionally batched as TF Serving's --enable_batching), `grpc_handlers.py` turns gRPC
bytes that do not parse into INVALID_ARGUMENT, and `errors.py` maps status codes to HTTP.

Any TF2 SavedModel with dense named-tensor signatures works. `tensorflow_text` is
imported before loading so that in-graph tokenizers resolve (reference/serving.md).

Example:

    with ModelServer("/tmp/export/electra") as server:
        print(f"http://127.0.0.1:{server.rest_port}/v1/models/electra")
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import os
import re
import threading
import time
from concurrent import futures
from typing import Any, Mapping, Sequence

import grpc
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the TF Text ops that exported tokenizers use)
from google.protobuf import json_format
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2,
    prediction_service_pb2_grpc,
)

from serving.batching import Batcher, BatchingParameters, Unbatched
from serving.errors import GRPC_BY_NUMBER, HTTP_STATUS, ServingError, invalid, not_found
from serving.grpc_handlers import add_servicer
from serving.model_config import ModelConfig
from serving.rest_connections import ConnectionServer, JsonRequestHandler

log = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_SIZE = 1024
DEFAULT_REST_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_REST_MAX_CONNECTIONS = 256
_MAX_RANK = 32  # of a JSON input; numpy stops at 64 and no model here takes more than 3


# ----------------------------------------------------------------------------- servables


class Signature:
    """One dense named-tensor signature of a loaded SavedModel."""

    def __init__(self, name: str, fn, signature_def: meta_graph_pb2.SignatureDef):
        self.name = name
        self.fn = fn
        self.method_name = signature_def.method_name
        self.inputs = {k: _spec(k, v) for k, v in signature_def.inputs.items()}
        self.outputs = {k: _spec(k, v) for k, v in signature_def.outputs.items()}

    def run(self, inputs: Mapping[str, np.ndarray], max_batch_size: int, scheduler=None) -> dict[str, np.ndarray]:
        """Validate `inputs` against the signature and run it through `scheduler` (see serving.batching)."""
        inputs = self.validate(inputs, max_batch_size)
        return self.call(inputs) if scheduler is None else scheduler.run(self, inputs)

    def validate(self, inputs: Mapping[str, np.ndarray], max_batch_size: int) -> dict[str, np.ndarray]:
        missing = sorted(set(self.inputs) - set(inputs))
        unexpected = sorted(set(inputs) - set(self.inputs))
        if unexpected:
            raise invalid(
                f"input {unexpected[0]!r} is not an input of signature {self.name!r};"
                f" its inputs are {sorted(self.inputs)}"
            )
        if missing:
            raise invalid(f"signature {self.name!r} needs input(s) {missing}; got {sorted(inputs)}")
        for key, value in inputs.items():
            spec = self.inputs[key]
            if value.dtype != spec.dtype.as_numpy_dtype and not (
                spec.dtype == tf.string and value.dtype == object
            ):
                raise invalid(f"input {key!r} must be {spec.dtype.name}, got {value.dtype.name}")
            if not spec.shape.is_compatible_with(value.shape):
                raise invalid(
                    f"input {key!r} has shape {list(value.shape)} but signature {self.name!r}"
                    f" expects {_shape_str(spec.shape)}"
                )
            if value.ndim >= 1 and value.shape[0] == 0:
                raise invalid(f"input {key!r} is an empty batch (dimension 0 is 0)")
            if value.ndim >= 1 and value.shape[0] > max_batch_size:
                raise invalid(
                    f"input {key!r} has a batch of {value.shape[0]}, more than the server's"
                    f" max_batch_size {max_batch_size}"
                )
        return dict(inputs)

    def call(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the signature on validated inputs."""
        try:
            outputs = self.fn(**{k: tf.constant(v, dtype=self.inputs[k].dtype) for k, v in inputs.items()})
        except tf.errors.OpError as e:
            code = GRPC_BY_NUMBER.get(e.error_code, grpc.StatusCode.UNKNOWN)
            raise ServingError(code, f"running signature {self.name!r} failed: {_one_line(e.message)}") from e
        except (TypeError, ValueError) as e:
            raise invalid(f"signature {self.name!r} rejected the inputs: {e}") from e
        return {k: v.numpy() for k, v in outputs.items()}


def _one_line(op_error_message: str) -> str:
    """A TF runtime error as one line: the reason and the node, without the graph-execution preamble.

    "Graph execution error:\n\nDetected at node add defined at ...\n<stack traces unavailable>\n
    Incompatible shapes: [1,2] vs. [1,0]\n\t [[{{node add}}]] [Op:__inference_...]" becomes
    "Incompatible shapes: [1,2] vs. [1,0] (node add)".
    """
    nodes = re.findall(r"\[\[\{\{node ([^}]+)\}\}\]\]", op_error_message)
    text = re.sub(r"\[\[\{\{node [^}]+\}\}\]\]|\[Op:[^\]]*\]", "", op_error_message)
    lines = [line.strip() for line in text.splitlines()]
    skip = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "File ")
    reason = "; ".join(line for line in lines if line and not line.startswith(skip))
    return reason + (f" (node {nodes[0]})" if nodes else "") if reason else " ".join(text.split())


class _Spec:
    def __init__(self, dtype: tf.DType, shape: tf.TensorShape):
        self.dtype, self.shape = dtype, shape


def _spec(name: str, info: meta_graph_pb2.TensorInfo) -> _Spec:
    if info.WhichOneof("encoding") != "name":
        raise ValueError(f"tensor {name!r} is sparse or composite; only dense tensors are served")
    return _Spec(tf.as_dtype(info.dtype), tf.TensorShape(info.tensor_shape))


def _shape_str(shape: tf.TensorShape) -> str:
    if shape.rank is None:
        return "any shape"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


class Servable:
    """One loaded version of a model."""

    def __init__(self, name: str, version: int, path: str):
        self.name, self.version, self.path = name, version, path
        # The SignatureDefs as written in saved_model.pb are what the real server reports
        # as metadata (including `__saved_model_init_op`), so read them from the file.
        self.signature_defs = _read_signature_defs(path)
        self._loaded = tf.saved_model.load(path)  # keeps the functions' resources alive
        self.signatures: dict[str, Signature] = {}
        for key, fn in self._loaded.signatures.items():
            if key not in self.signature_defs:
                continue
            try:
                self.signatures[key] = Signature(key, fn, self.signature_defs[key])
            except ValueError as e:
                log.warning("%s version %d: signature %r is not served: %s", name, version, key, e)

    def signature(self, signature_name: str) -> Signature:
        key = signature_name or DEFAULT_SIGNATURE
        if key not in self.signatures:
            # TF Serving answers FAILED_PRECONDITION (HTTP 400) with this message.
            raise ServingError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f'Serving signature key "{key}" not found. (model {self.name!r} version'
                f" {self.version} has {sorted(self.signatures)})",
            )
        return self.signatures[key]

    def signature_def_map(self) -> get_model_metadata_pb2.SignatureDefMap:
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        for key, sig_def in self.signature_defs.items():
            sig_map.signature_def[key].CopyFrom(sig_def)
        return sig_map


def _read_signature_defs(path: str) -> dict[str, meta_graph_pb2.SignatureDef]:
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    else:
        from google.protobuf import text_format

        with open(os.path.join(path, "saved_model.pbtxt"), encoding="utf-8") as f:
            text_format.Parse(f.read(), saved_model)
    for meta_graph in saved_model.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return dict(meta_graph.signature_def)
    raise ValueError(f"{path}: no MetaGraph tagged 'serve'")


# ----------------------------------------------------------------------------- model manager

_State = get_model_status_pb2.ModelVersionStatus.State


class _VersionRecord:
    def __init__(self):
        self.servable: Servable | None = None
        self.state = _State.START
        self.error_code = 0  # tensorflow.error.Code, 0 = OK
        self.error_message = ""
        self.fingerprint: tuple | None = None  # of the directory when its load failed


def _list_versions(base_path: str) -> dict[int, str]:
    """Numbered version folders that hold a SavedModel, by version."""
    found = {}
    try:
        names = os.listdir(base_path)
    except OSError:
        return found
    for entry in names:
        path = os.path.join(base_path, entry)
        if not entry.isdigit() or int(entry) <= 0 or not os.path.isdir(path):
            continue
        # A folder without saved_model.pb is still being written: look again next poll.
        if os.path.exists(os.path.join(path, "saved_model.pb")) or os.path.exists(
            os.path.join(path, "saved_model.pbtxt")
        ):
            found[int(entry)] = path
    return found


def _fingerprint(path: str) -> tuple:
    items = []
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            items.append((os.path.relpath(os.path.join(root, f), path), st.st_size, st.st_mtime_ns))
    return tuple(sorted(items))


class ModelManager:
    """Loads and unloads model versions following each model's version policy."""

    def __init__(self, configs: Sequence[ModelConfig]):
        self.configs = {c.name: c for c in configs}
        self._records: dict[str, dict[int, _VersionRecord]] = {c.name: {} for c in configs}
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- polling

    def poll(self) -> None:
        """Scan every base path once; load new versions and unload removed ones."""
        with self._poll_lock:
            for config in self.configs.values():
                if self._stop.is_set():
                    return
                try:
                    self._poll_model(config)
                except Exception:  # noqa: BLE001  (a poll must never kill the thread)
                    log.exception("polling model %r failed", config.name)

    def _poll_model(self, config: ModelConfig) -> None:
        available = _list_versions(config.base_path)
        records = self._records[config.name]
        wanted = config.select(available)
        keep: list[int] = []
        for version in wanted:
            if config.version_policy == "latest" and len(keep) >= config.num_versions:
                break
            if self._ensure_loaded(config.name, version, available[version]):
                keep.append(version)
        with self._lock:
            for version, record in records.items():
                if record.servable is not None and version not in keep:
                    log.info("unloading %s version %d", config.name, version)
                    record.servable = None
                    record.state = _State.END

    def _ensure_loaded(self, name: str, version: int, path: str) -> bool:
        record = self._records[name].get(version)
        if record is not None and record.servable is not None:
            return True
        fingerprint = _fingerprint(path)
        if record is not None and record.error_code and record.fingerprint == fingerprint:
            return False  # failed before and unchanged since: don't retry every poll
        record = _VersionRecord()
        record.state = _State.LOADING
        log.info("loading %s version %d from %s", name, version, path)
        start = time.monotonic()
        try:
            servable = Servable(name, version, path)
        except Exception as e:  # noqa: BLE001  (any load failure is logged and skipped)
            log.error("%s version %d failed to load, skipping it: %s", name, version, e)
            record.state = _State.END
            record.error_code = getattr(e, "error_code", 0) or 2  # UNKNOWN
            record.error_message = f"Failed to load version {version} from {path}: {e}"
            record.fingerprint = fingerprint
            with self._lock:
                self._records[name][version] = record
            return False
        record.servable, record.state = servable, _State.AVAILABLE
        with self._lock:
            self._records[name][version] = record
        log.info(
            "%s version %d AVAILABLE (signatures %s, %.1f s)",
            name, version, sorted(servable.signatures), time.monotonic() - start,
        )
        return True

    def start_polling(self, interval_seconds: float) -> None:
        if interval_seconds <= 0:
            return  # as TF Serving: poll once at start-up only
        self._thread = threading.Thread(
            target=self._poll_loop, args=(interval_seconds,), name="model-poller", daemon=True
        )
        self._thread.start()

    def _poll_loop(self, interval_seconds: float) -> None:
        while not self._stop.wait(interval_seconds):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --- lookups

    def servable(self, name: str, version: int | None = None) -> Servable:
        with self._lock:
            records = self._records.get(name)
            if records is not None:
                loaded = {v: r.servable for v, r in records.items() if r.servable is not None}
                if version is None and loaded:
                    return loaded[max(loaded)]
                if version is not None and version in loaded:
                    return loaded[version]
        what = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise not_found(f"Servable not found for request: {what}")

    def status(self, name: str, version: int | None = None) -> get_model_status_pb2.GetModelStatusResponse:
        with self._lock:
            records = dict(self._records.get(name, {}))
        if not records:
            raise not_found(f"Could not find any versions of model {name}")
        if version is not None:
            if version not in records:
                raise not_found(f"Could not find version {version} of model {name}")
            records = {version: records[version]}
        response = get_model_status_pb2.GetModelStatusResponse()
        for v in sorted(records, reverse=True):
            record = records[v]
            status = response.model_version_status.add(version=v, state=record.state)
            status.status.error_code = record.error_code
            status.status.error_message = record.error_message
        return response


# ----------------------------------------------------------------------------- JSON <-> tensors


def _leaf_to_value(leaf: Any, dtype: tf.DType, where: str):
    if dtype == tf.string:
        if isinstance(leaf, str):
            try:
                return leaf.encode("utf-8")
            except UnicodeEncodeError as e:
                raise invalid(f"{where}: string is not valid UTF-8 ({e.reason}); send binary data as {{\"b64\": ...}}") from e
        if isinstance(leaf, dict) and set(leaf) == {"b64"} and isinstance(leaf["b64"], str):
            try:
                return base64.b64decode(leaf["b64"], validate=True)
            except (binascii.Error, ValueError) as e:
                raise invalid(f"{where}: 'b64' value is not valid base64: {e}") from e
        raise invalid(f"{where}: expected a string or {{\"b64\": ...}} for a DT_STRING input, got {_json_type(leaf)}")
    if dtype == tf.bool:
        if isinstance(leaf, bool):
            return leaf
        raise invalid(f"{where}: expected true/false for a DT_BOOL input, got {_json_type(leaf)}")
    if dtype.is_integer:
        if isinstance(leaf, int) and not isinstance(leaf, bool):
            if not dtype.min <= leaf <= dtype.max:
                raise invalid(f"{where}: {leaf} is out of range for {dtype.name}")
            return leaf
        raise invalid(f"{where}: expected an integer for a {dtype.name} input, got {_json_type(leaf)}")
    if dtype.is_floating:
        if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            try:
                in_range = not math.isfinite(leaf) or abs(float(leaf)) <= float(dtype.max)  # Infinity and NaN are sent as such
            except OverflowError:  # an integer beyond float64
                in_range = False
            if not in_range:
                text = str(leaf) if len(str(leaf)) <= 24 else f"{str(leaf)[:8]}... ({len(str(leaf))} characters)"
                raise invalid(f"{where}: {text} is out of range for {dtype.name}")
            return leaf
        raise invalid(f"{where}: expected a number for a {dtype.name} input, got {_json_type(leaf)}")
    raise invalid(f"{where}: inputs of type {dtype.name} are not supported over JSON")


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def json_to_array(value: Any, dtype: tf.DType, where: str) -> np.ndarray:
    """A (nested list of) JSON values as a rectangular numpy array of `dtype`."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    if len(shape) > _MAX_RANK:
        raise invalid(f"{where}: a value nested {len(shape)} lists deep; at most {_MAX_RANK} dimensions are served")
    flat: list = []

    def walk(v, depth, index):
        if depth < len(shape):
            if not isinstance(v, list) or len(v) != shape[depth]:
                raise invalid(
                    f"{where}: ragged or mis-shaped value at index {index or '[]'}: every list at"
                    f" depth {depth} must have {shape[depth]} elements"
                )
            for i, item in enumerate(v):
                walk(item, depth + 1, index + [i])
        else:
            if isinstance(v, list):
                raise invalid(f"{where}: ragged value at index {index}: unexpected nested list")
            flat.append(_leaf_to_value(v, dtype, where))

    walk(value, 0, [])
    np_dtype = object if dtype == tf.string else dtype.as_numpy_dtype
    array = np.empty(len(flat), dtype=np_dtype)
    array[:] = flat
    return array.reshape(shape)


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _array_to_json(array: np.ndarray, name: str) -> Any:
    if array.dtype == object or array.dtype.kind in "SU":
        # TF Serving base64-encodes outputs whose alias ends in `_bytes`; other strings
        # go out as text, and bytes that are not UTF-8 cannot, so they travel as b64 too.
        force_b64 = name.endswith("_bytes")

        def encode(b):
            if isinstance(b, str):
                b = b.encode("utf-8")
            if not force_b64:
                try:
                    return b.decode("utf-8")
                except UnicodeDecodeError:
                    pass
            return {"b64": base64.b64encode(b).decode("ascii")}

        if array.ndim == 0:
            return encode(array.item())
        return np.frompyfunc(encode, 1, 1)(array).tolist()
    if array.dtype in (np.float32, np.float16) or array.dtype == tf.bfloat16.as_numpy_dtype:
        # Shortest decimal that round-trips the float32 (0.1, not 0.10000000149011612).
        return array.astype(np.float32).astype(str).astype(np.float64).tolist()
    if array.dtype.kind in "biuf":
        return array.tolist()
    raise invalid(f"output {name!r} of type {array.dtype} cannot be written as JSON")


def _parse_row_inputs(instances: Any, signature: Signature, max_batch_size: int) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid("'instances' must be a list with one entry per example")
    if not instances:
        raise invalid("'instances' is an empty list: a batch needs at least one example")
    if len(instances) > max_batch_size:
        raise invalid(f"'instances' holds {len(instances)} examples, more than max_batch_size {max_batch_size}")
    names = sorted(signature.inputs)
    bare = len(names) == 1 and not (isinstance(instances[0], dict) and not _is_b64(instances[0]))
    columns: dict[str, list] = {n: [] for n in names}
    for i, instance in enumerate(instances):
        if bare:
            if isinstance(instance, dict) and not _is_b64(instance):
                raise invalid(f"instances[{i}]: mixes a named object with bare values in other instances")
            columns[names[0]].append(instance)
            continue
        if not isinstance(instance, dict) or _is_b64(instance):
            raise invalid(
                f"instances[{i}]: signature {signature.name!r} has inputs {names}, so each instance"
                " must be an object keyed by input name"
            )
        unexpected = sorted(set(instance) - set(names))
        if unexpected:
            raise invalid(f"instances[{i}]: {unexpected[0]!r} is not an input of signature {signature.name!r}; its inputs are {names}")
        missing = sorted(set(names) - set(instance))
        if missing:
            raise invalid(f"instances[{i}]: missing input(s) {missing} of signature {signature.name!r}")
        for n in names:
            columns[n].append(instance[n])
    arrays = {}
    for n in names:
        arrays[n] = json_to_array(columns[n], signature.inputs[n].dtype, f"input {n!r} of 'instances'")
        if arrays[n].ndim == 0 or arrays[n].shape[0] != len(instances):
            raise invalid(f"input {n!r}: every instance must hold a value of the same shape")
    return arrays


def _parse_columnar_inputs(inputs: Any, signature: Signature) -> dict[str, np.ndarray]:
    names = sorted(signature.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) != 1:
            raise invalid(
                f"'inputs' must be an object keyed by input name: signature {signature.name!r}"
                f" has inputs {names}"
            )
        inputs = {names[0]: inputs}
    unexpected = sorted(set(inputs) - set(names))
    if unexpected:
        raise invalid(
            f"input {unexpected[0]!r} is not an input of signature {signature.name!r}; its inputs are {names}"
        )
    return {n: json_to_array(v, signature.inputs[n].dtype, f"input {n!r}") for n, v in inputs.items()}


def predict_json(manager: ModelManager, name: str, version: int | None, body: bytes, max_batch_size: int, scheduler=None) -> dict:
    """Run a REST `:predict` request body through `scheduler`; return the response JSON object."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"request body is not valid UTF-8 (byte {e.start}); send binary data as {{\"b64\": ...}}") from e
    try:
        request = json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid(f"JSON parse error: {e.msg} at line {e.lineno} column {e.colno}") from e
    except RecursionError:
        raise invalid("JSON parse error: the body is nested too deeply") from None
    if not isinstance(request, dict):
        raise invalid("the request body must be a JSON object")
    if ("instances" in request) == ("inputs" in request):
        raise invalid("the request must hold exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    signature_name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str):
        raise invalid("'signature_name' must be a string")
    servable = manager.servable(name, version)
    signature = servable.signature(signature_name)
    if "instances" in request:
        batch = len(request["instances"]) if isinstance(request["instances"], list) else 0
        outputs = signature.run(_parse_row_inputs(request["instances"], signature, max_batch_size), max_batch_size, scheduler)
        columns = {k: _array_to_json(v, k) for k, v in outputs.items()}
        for k, v in outputs.items():
            if v.ndim == 0 or v.shape[0] != batch:
                raise invalid(
                    f"output {k!r} has shape {list(v.shape)}, not a batch of {batch}: it cannot be"
                    " split into instances; use the columnar 'inputs' format"
                )
        keys = sorted(columns)
        if len(keys) == 1:
            return {"predictions": columns[keys[0]]}
        return {"predictions": [{k: columns[k][i] for k in keys} for i in range(batch)]}
    outputs = signature.run(_parse_columnar_inputs(request["inputs"], signature), max_batch_size, scheduler)
    columns = {k: _array_to_json(v, k) for k, v in sorted(outputs.items())}
    if len(columns) == 1:
        return {"outputs": next(iter(columns.values()))}
    return {"outputs": columns}


def status_json(manager: ModelManager, name: str, version: int | None) -> dict:
    return json_format.MessageToDict(
        manager.status(name, version),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def metadata_response(manager: ModelManager, name: str, version: int | None) -> get_model_metadata_pb2.GetModelMetadataResponse:
    servable = manager.servable(name, version)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.metadata["signature_def"].Pack(servable.signature_def_map())
    return response


def metadata_json(manager: ModelManager, name: str, version: int | None) -> dict:
    # The real server prints model_spec and the unpacked SignatureDefMap (no "@type").
    servable = manager.servable(name, version)
    sig_map = json_format.MessageToDict(
        servable.signature_def_map(),
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return {
        "model_spec": {"name": servable.name, "signature_name": "", "version": str(servable.version)},
        "metadata": {"signature_def": _in_server_order(sig_map)},
    }


# Key order of the C++ JSON printer, so the text reads like the real server's.
_KEY_ORDER = {
    "tensor_info": ("dtype", "tensor_shape", "name"),
    "tensor_shape": ("dim", "unknown_rank"),
    "signature": ("inputs", "outputs", "method_name", "defaults"),
}


def _in_server_order(value: Any) -> Any:
    if isinstance(value, list):
        return [_in_server_order(v) for v in value]
    if not isinstance(value, dict):
        return value
    keys = list(value)
    for order in _KEY_ORDER.values():
        if set(order) <= set(keys) or (order[0] == "dtype" and {"dtype", "tensor_shape"} <= set(keys)):
            keys = [k for k in order if k in value] + [k for k in keys if k not in order]
            break
    return {k: _in_server_order(value[k]) for k in keys}


# ----------------------------------------------------------------------------- REST

_PREDICT_PATH = re.compile(
    r"^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(predict|classify|regress)$", re.I
)
_GET_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?$", re.I)


class _RestHandler(JsonRequestHandler):
    """TF Serving's REST routes; connection handling and limits are `JsonRequestHandler`'s."""

    server_version = "electra-serve"

    def _handle(self, fn) -> None:
        try:
            status, payload = fn()
        except ServingError as e:
            return self.send_error(HTTP_STATUS.get(e.code, 500), e.message, close=False)
        except Exception as e:  # noqa: BLE001  (a bad request must never take the server down)
            log.exception("internal error on %s %s", self.command, self.path)
            return self.send_error(500, f"internal server error: {type(e).__name__}: {e}", close=False)
        self.send_json(status, payload)

    def _route(self, method: str):
        path = self.path.split("?", 1)[0]
        predict, get = _PREDICT_PATH.match(path), _GET_PATH.match(path)
        if (predict and method != "POST") or (get and method != "GET"):
            return 405, "POST" if predict else "GET", None
        return (200, None, predict or get) if (predict or get) else (404, None, None)

    def do_GET(self):  # noqa: N802  (http.server's naming)
        self.discard_body()
        status, allow, match = self._route("GET")
        if status != 200:
            return self._reject(status, allow)
        name, version, label, metadata = match.groups()
        app = self.server.app

        def run():
            v = _version(version, label)
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
            v = _version(version, label)
            if method.lower() != "predict":
                sig = app.manager.servable(name, v).signature(_signature_name_of(body))
                raise ServingError(
                    grpc.StatusCode.INVALID_ARGUMENT if sig.method_name == PREDICT_METHOD else grpc.StatusCode.UNIMPLEMENTED,
                    f":{method} is not served here; signature {sig.name!r} has method_name"
                    f" {sig.method_name!r}: use :predict",
                )
            return 200, predict_json(app.manager, name, v, body, app.max_batch_size, app.scheduler)

        self._handle(run)

    def _reject(self, status: int, allow: str | None):
        if status == 405:
            return self.send_json(
                405, {"error": f"method {self.command} not allowed on {self.path}; use {allow}"},
                close=self.close_connection, headers={"Allow": allow},
            )
        self.send_error(
            404,
            f"Malformed request: {self.command} {self.path}; expected /v1/models/NAME[/versions/V]"
            "[/metadata] (GET) or /v1/models/NAME[/versions/V]:predict (POST)",
            close=self.close_connection,
        )


def _signature_name_of(body: bytes) -> str:
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return DEFAULT_SIGNATURE
    name = request.get("signature_name", DEFAULT_SIGNATURE) if isinstance(request, dict) else DEFAULT_SIGNATURE
    if not isinstance(name, str):
        raise invalid("'signature_name' must be a string")
    return name


def _version(version: str | None, label: str | None) -> int | None:
    if label is not None:
        raise not_found(f"Unrecognized servable version label: {label} (no version labels are configured)")
    return int(version) if version is not None else None


class _RestServer(ConnectionServer):
    def __init__(self, address, app: "ModelServer"):
        self.app = app
        super().__init__(
            address, _RestHandler, idle_timeout_seconds=app.rest_idle_timeout_seconds, max_connections=app.rest_max_connections
        )


# ----------------------------------------------------------------------------- gRPC


def array_to_tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """A TensorProto with the typed `*_val` fields, as TF Serving writes outputs."""
    proto = tensor_pb2.TensorProto()
    for d in array.shape:
        proto.tensor_shape.dim.add(size=d)
    flat = array.reshape(-1)
    if array.dtype == object or array.dtype.kind in "SU":
        proto.dtype = types_pb2.DT_STRING
        proto.string_val.extend(b.encode("utf-8") if isinstance(b, str) else bytes(b) for b in flat)
        return proto
    typed = {
        np.float32: (types_pb2.DT_FLOAT, "float_val"),
        np.float64: (types_pb2.DT_DOUBLE, "double_val"),
        np.int32: (types_pb2.DT_INT32, "int_val"),
        np.int16: (types_pb2.DT_INT16, "int_val"),
        np.int8: (types_pb2.DT_INT8, "int_val"),
        np.uint8: (types_pb2.DT_UINT8, "int_val"),
        np.uint16: (types_pb2.DT_UINT16, "int_val"),
        np.int64: (types_pb2.DT_INT64, "int64_val"),
        np.uint32: (types_pb2.DT_UINT32, "uint32_val"),
        np.uint64: (types_pb2.DT_UINT64, "uint64_val"),
        np.bool_: (types_pb2.DT_BOOL, "bool_val"),
    }.get(array.dtype.type)
    if typed is None:
        return tf.make_tensor_proto(array)
    proto.dtype = typed[0]
    getattr(proto, typed[1]).extend(flat.tolist())
    return proto


def _grpc_version(model_spec) -> int | None:
    if model_spec.WhichOneof("version_choice") == "version_label":
        raise not_found(f"Unrecognized servable version label: {model_spec.version_label} (no version labels are configured)")
    if model_spec.HasField("version"):
        return model_spec.version.value
    return None


def predict_proto(
    manager: ModelManager, request: predict_pb2.PredictRequest, max_batch_size: int, scheduler=None, max_elements: int = DEFAULT_MAX_BODY_BYTES
) -> predict_pb2.PredictResponse:
    """Run a gRPC PredictRequest through `scheduler`; tensors of more than `max_elements` are refused."""
    if not request.model_spec.name:
        raise invalid("model_spec.name is required")
    servable = manager.servable(request.model_spec.name, _grpc_version(request.model_spec))
    signature = servable.signature(request.model_spec.signature_name)
    inputs = {}
    for key, proto in request.inputs.items():
        spec = signature.inputs.get(key)
        if spec is not None and proto.dtype != spec.dtype.as_datatype_enum:
            raise invalid(f"input {key!r} must be {spec.dtype.name}, got {_dtype_name(proto.dtype)}")
        inputs[key] = _tensor_proto_to_array(key, proto, max_elements)
    unknown = sorted(set(request.output_filter) - set(signature.outputs))
    if unknown:
        raise invalid(f"output_filter: {unknown} are not outputs of signature {signature.name!r}; its outputs are {sorted(signature.outputs)}")
    outputs = signature.run(inputs, max_batch_size, scheduler)
    response = predict_pb2.PredictResponse()
    response.model_spec.name = servable.name
    response.model_spec.version.value = servable.version
    response.model_spec.signature_name = signature.name
    for key, value in outputs.items():
        if not request.output_filter or key in request.output_filter:
            response.outputs[key].CopyFrom(array_to_tensor_proto(value))
    return response


def _dtype_name(enum: int) -> str:
    try:
        return tf.as_dtype(enum).name if enum else "DT_INVALID"
    except TypeError:
        return f"dtype {enum} (not a DataType)"


def _tensor_proto_to_array(key: str, proto: tensor_pb2.TensorProto, max_elements: int) -> np.ndarray:
    """A request TensorProto as numpy; refuses shapes that tf.make_ndarray would fill to any size."""
    dims = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(d < 0 for d in dims):
        raise invalid(f"input {key!r}: tensor_shape {dims if not proto.tensor_shape.unknown_rank else 'of unknown rank'} is not a known shape")
    # TF repeats the last value to fill the shape, so a few bytes can ask for any size.
    if math.prod(dims) > max_elements:
        raise invalid(f"input {key!r}: tensor_shape {dims} holds more than {max_elements} elements, the server's limit")
    try:
        return tf.make_ndarray(proto)
    except Exception as e:  # noqa: BLE001  (TF's decoder raises many types; the bytes are the client's)
        raise invalid(f"input {key!r} is not a valid {_dtype_name(proto.dtype)} TensorProto: {type(e).__name__}: {e}") from None


def _grpc_call(context, fn):
    try:
        return fn()
    except ServingError as e:
        context.abort(e.code, e.message)
    except Exception as e:  # noqa: BLE001
        log.exception("internal error in gRPC call")
        context.abort(grpc.StatusCode.INTERNAL, f"internal server error: {type(e).__name__}: {e}")


class _PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def Predict(self, request, context):  # noqa: N802  (gRPC method names)
        app = self.app
        return _grpc_call(context, lambda: predict_proto(app.manager, request, app.max_batch_size, app.scheduler, app.max_body_bytes))

    def GetModelMetadata(self, request, context):  # noqa: N802
        def run():
            fields = list(request.metadata_field)
            if not fields:
                raise invalid("GetModelMetadataRequest must specify at least one metadata_field")
            unsupported = [f for f in fields if f != "signature_def"]
            if unsupported:
                raise invalid(f"Metadata field {unsupported[0]} is not supported (only signature_def)")
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return metadata_response(self.app.manager, request.model_spec.name, _grpc_version(request.model_spec))

        return _grpc_call(context, run)


class _ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, app: "ModelServer"):
        self.app = app

    def GetModelStatus(self, request, context):  # noqa: N802
        def run():
            if not request.model_spec.name:
                raise invalid("model_spec.name is required")
            return self.app.manager.status(request.model_spec.name, _grpc_version(request.model_spec))

        return _grpc_call(context, run)


# ----------------------------------------------------------------------------- server


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
        poll_interval_seconds: how often to look for new versions; <= 0 looks once.
        max_body_bytes: larger REST bodies get 413; also the gRPC message limit.
        max_batch_size: larger batches get INVALID_ARGUMENT / 400.
        rest_idle_timeout_seconds: a REST connection is closed after this long without a
            request, and each request must arrive whole within this long (see
            serving.rest_connections).
        rest_max_connections: REST connections served at once; one more gets 503.
        model_threads: model calls run at once without batching (default: one per core);
            the other requests wait their turn in arrival order.
        batching: TF Serving's `--enable_batching` with these parameters (see
            serving.batching); None runs each request on its own.
        grpc_threads: gRPC worker pool size.

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
    ):
        if (model_base_path is None) == (models is None):
            raise ValueError("pass exactly one of model_base_path or models")
        if models is None:
            base = os.path.abspath(model_base_path)
            models = [ModelConfig(model_name or os.path.basename(base.rstrip(os.sep)), base)]
        if max_body_bytes <= 0 or max_batch_size <= 0:
            raise ValueError("max_body_bytes and max_batch_size must be positive")
        if rest_idle_timeout_seconds <= 0 or rest_max_connections <= 0:
            raise ValueError("rest_idle_timeout_seconds and rest_max_connections must be positive")
        self.manager = ModelManager(models)
        self.host = host
        self.max_body_bytes = max_body_bytes
        self.max_batch_size = max_batch_size
        self.rest_idle_timeout_seconds = rest_idle_timeout_seconds
        self.rest_max_connections = rest_max_connections
        self._model_threads = model_threads or os.cpu_count() or 1
        self.batching = batching
        self.scheduler: Batcher | Unbatched | None = None
        self._requested_ports = (rest_port, grpc_port)
        self._poll_interval = poll_interval_seconds
        self._grpc_threads = grpc_threads
        self._rest: _RestServer | None = None
        self._rest_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None
        self.rest_port: int | None = None
        self.grpc_port: int | None = None

    @property
    def model_names(self) -> list[str]:
        return list(self.manager.configs)

    def start(self) -> "ModelServer":
        """Load the current versions, then open the ports. Returns self."""
        self.manager.poll()
        for name in self.manager.configs:
            try:
                self.manager.servable(name)
            except ServingError:
                log.warning("model %r has no loadable version yet; waiting for one to appear", name)
        rest_port, grpc_port = self._requested_ports
        self.scheduler = Batcher(self.batching) if self.batching else Unbatched(self._model_threads)
        try:
            if rest_port is not None:
                self._rest = _RestServer((self.host, rest_port), self)
                self.rest_port = self._rest.server_address[1]
                self._rest_thread = threading.Thread(
                    target=self._rest.serve_forever, kwargs={"poll_interval": 0.2}, name="rest-server", daemon=True
                )
                self._rest_thread.start()
            if grpc_port is not None:
                self._grpc = grpc.server(
                    futures.ThreadPoolExecutor(self._grpc_threads, thread_name_prefix="grpc"),
                    options=[
                        ("grpc.max_receive_message_length", self.max_body_bytes),
                        ("grpc.max_send_message_length", -1),
                        ("grpc.so_reuseport", 0),
                    ],
                )
                add_servicer(self._grpc, _PredictionService(self), prediction_service_pb2.DESCRIPTOR.services_by_name["PredictionService"])
                add_servicer(self._grpc, _ModelService(self), model_service_pb2.DESCRIPTOR.services_by_name["ModelService"])
                target = f"[{self.host}]:{grpc_port}" if ":" in self.host else f"{self.host}:{grpc_port}"
                self.grpc_port = self._grpc.add_insecure_port(target)
                if not self.grpc_port:
                    raise OSError(f"could not bind gRPC to {target}")
                self._grpc.start()
        except BaseException:
            self.stop()
            raise
        self.manager.start_polling(self._poll_interval)
        return self

    def stop(self, grace_seconds: float = 2.0) -> None:
        """Stop polling, finish in-flight requests (up to `grace_seconds` for gRPC), close ports."""
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
