"""Clients for TensorFlow Serving's REST and gRPC APIs (the real server or serving.server).

Both clients return the same Python values for the same request:

- `predict(inputs)`: `inputs` is a dict of named columns (columnar format) or a list of
  examples (row format: bare values for a one-input signature, else dicts). The result
  is always a dict of output name -> numpy array with the batch first; strings are
  `bytes` in object arrays, as `tf.make_ndarray` gives them.
- `metadata()`, `status()`: the REST JSON of GetModelMetadata / GetModelStatus.
- Every call takes `version`: None for the latest served, an int for that version, a str for a
  version label of the server's models.config (`version_labels`, e.g. "stable").
- `classify_texts(texts, text_pairs)`: the exporter's `text` (+ `text_pair`) ->
  `probabilities` / `label` contract, one dict of plain Python values per example.
- `classify(examples, context)`, `regress(examples, context)`: TF Serving's Classify and
  Regress APIs on tf.Examples given as dicts of feature name -> value (a str, bytes, int or
  float, or a list of them): one list of (label, score) per example / one float per example;
  scores and values are the float32 the model answered, in their shortest decimal.

`RestClient` uses only the standard library (and numpy); `GrpcClient` needs the
`tensorflow-serving-api` package.

Example:

    client = RestClient("127.0.0.1", 8501, "electra")
    client.classify_texts(["a great movie"])
    # [{"label": "positive", "probabilities": [0.1, 0.9]}]
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from typing import Any, Mapping, Sequence

import numpy as np

DEFAULT_SIGNATURE = "serving_default"
# A model version as the clients take it: None (the latest served), a number, or a label.
Version = int | str | None
# The classify / regress signatures of electra_tf's classification / regression exports.
CLASSIFY_SIGNATURE, REGRESS_SIGNATURE = "classify", "regress"
# The SignatureDef method names of TF Serving's Classify and Regress APIs.
CLASSIFY_METHOD, REGRESS_METHOD = "tensorflow/serving/classify", "tensorflow/serving/regress"

# DataType enum names (tensorflow/core/framework/types.proto) -> numpy dtypes.
_NUMPY_DTYPES = {
    "DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_HALF": np.float16,
    "DT_INT8": np.int8, "DT_INT16": np.int16, "DT_INT32": np.int32, "DT_INT64": np.int64,
    "DT_UINT8": np.uint8, "DT_UINT16": np.uint16, "DT_UINT32": np.uint32, "DT_UINT64": np.uint64,
    "DT_BOOL": np.bool_, "DT_STRING": object,
}


class ServingRequestError(Exception):
    """The server rejected a request. `status` is the HTTP status (REST) or the
    grpc.StatusCode (gRPC); `message` is the server's message."""

    def __init__(self, status: Any, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class UnreachableServerError(ServingRequestError):
    """No answer came: nothing listens at the address, the host is unknown or unreachable, the
    server closed the connection, or the answer did not come within the timeout. `message` is one
    line naming the problem; `status` is "UNAVAILABLE" (REST) or the grpc.StatusCode."""


class _Client:
    def __init__(self, host: str, port: int, model_name: str, timeout: float = 60.0):
        self.host, self.port, self.model_name, self.timeout = host, port, model_name, timeout
        self._signatures: dict[tuple, dict] = {}

    def signature(self, signature_name: str = DEFAULT_SIGNATURE, version: Version = None) -> dict:
        """The signature's JSON SignatureDef (inputs/outputs with dtype and shape), cached."""
        key = (signature_name, version)
        if key not in self._signatures:
            defs = self.metadata(version)["metadata"]["signature_def"]["signature_def"]
            if signature_name not in defs:
                raise ServingRequestError("NOT_FOUND", f"signature {signature_name!r} not in {sorted(defs)}")
            self._signatures[key] = defs[signature_name]
        return self._signatures[key]

    def _rows_to_columns(self, rows: list, signature_name: str, version: Version) -> dict:
        names = sorted(self.signature(signature_name, version)["inputs"])
        if len(names) == 1 and rows and not (isinstance(rows[0], dict) and set(rows[0]) != {"b64"}):
            return {names[0]: list(rows)}
        return {n: [row[n] for row in rows] for n in names}

    def classify_texts(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        signature_name: str = DEFAULT_SIGNATURE,
        version: Version = None,
    ) -> list[dict]:
        """Run `texts` (and `text_pairs`) through a text signature; one dict per example. A
        Classify or Regress signature (its method name) gets them as tf.Examples with the
        features `text` (and `text_pair`): {"classes": [...], "scores": [...]} or {"outputs": v}."""
        inputs = {"text": list(texts)}
        if text_pairs is not None:
            if len(text_pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
            inputs["text_pair"] = list(text_pairs)
        method = self.signature(signature_name, version).get("method_name", "")
        if method in (CLASSIFY_METHOD, REGRESS_METHOD):
            examples = [dict(zip(inputs, row)) for row in zip(*inputs.values())]
            if method == REGRESS_METHOD:
                return [{"outputs": v} for v in self.regress(examples, None, signature_name, version)]
            return [{"classes": [label for label, _ in row], "scores": [score for _, score in row]}
                    for row in self.classify(examples, None, signature_name, version)]
        outputs = self.predict(inputs, signature_name, version)
        return [{k: _plain(v[i]) for k, v in sorted(outputs.items())} for i in range(len(texts))]

    def predict(self, inputs: dict | list, signature_name: str = DEFAULT_SIGNATURE, version: Version = None) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def classify(self, examples: Sequence[Mapping[str, Any]], context: Mapping[str, Any] | None = None,
                 signature_name: str = CLASSIFY_SIGNATURE, version: Version = None) -> list[list[tuple[str, float]]]:
        """TF Serving's Classify on `examples` (each with the `context` features it lacks): the
        (label, score) of every class, one list per example."""
        raise NotImplementedError

    def regress(self, examples: Sequence[Mapping[str, Any]], context: Mapping[str, Any] | None = None,
                signature_name: str = REGRESS_SIGNATURE, version: Version = None) -> list[float]:
        """TF Serving's Regress on `examples` (each with the `context` features it lacks): one value per example."""
        raise NotImplementedError

    def metadata(self, version: Version = None) -> dict:
        raise NotImplementedError

    def status(self, version: Version = None) -> dict:
        raise NotImplementedError


def _plain(value: Any) -> Any:
    """numpy -> JSON-able Python values; bytes decoded to str when they are UTF-8."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value.item() if isinstance(value, np.generic) else value


def _json_value(value: Any) -> Any:
    """A request value as JSON: bytes go as {"b64": ...}, numpy as lists."""
    if isinstance(value, np.ndarray):
        return _json_value(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()} if set(value) != {"b64"} else value
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    return value.item() if isinstance(value, np.generic) else value


def _float32(value: float) -> float:
    """A score as the shortest decimal of the float32 the model answered (0.1, not
    0.10000000149011612), as REST writes it; gRPC's float field gives the same value."""
    return float(str(np.float32(value)))


def _from_json(value: Any, dtype_name: str) -> np.ndarray:
    dtype = _NUMPY_DTYPES.get(dtype_name, object)
    if dtype is not object:
        return np.asarray(value, dtype=dtype)

    def to_bytes(v):
        if isinstance(v, list):
            return [to_bytes(x) for x in v]
        if isinstance(v, dict):
            return base64.b64decode(v["b64"])
        return v.encode("utf-8")

    converted = to_bytes(value)
    array = np.empty(np.shape(value) if not isinstance(value, dict) else (), dtype=object)
    if array.ndim == 0:
        array[()] = converted
    else:
        array[...] = converted
    return array


class RestClient(_Client):
    """TF Serving REST client (standard library `http.client`).

    Requests go over one kept-alive HTTP/1.1 connection per thread: a new TCP connection per
    request, and the server's thread for it, cost more than a small model's answer (measured in
    docs/benchmarks.md). A request whose kept-alive connection the server had closed in the
    meantime (its idle timeout, or a newer client at its connection cap) is sent once more on a
    new connection; requests are reads, so sending one twice changes nothing."""

    def __init__(self, host: str, port: int, model_name: str, timeout: float = 60.0):
        super().__init__(host, port, model_name, timeout)
        self._local = threading.local()

    def close(self) -> None:
        """Closes this thread's connection (the next request opens another)."""
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def __enter__(self) -> "RestClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _url(self, version: Version, suffix: str = "") -> str:
        """The path of the model's URL (on this client's host and port)."""
        url = f"/v1/models/{self.model_name}"
        if isinstance(version, str):
            url += f"/labels/{urllib.parse.quote(version, safe='')}"
        elif version is not None:
            url += f"/versions/{int(version)}"
        return url + suffix

    def _send(self, path: str, data: bytes | None) -> tuple[int, bytes]:
        """(status, body) of one request on this thread's connection; a kept-alive connection
        that the server had closed is replaced once."""
        reused = getattr(self._local, "connection", None) is not None
        try:
            return self._exchange(path, data)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            if not reused:
                raise UnreachableServerError("UNAVAILABLE", self._transport_problem(e)) from None
        except (OSError, http.client.HTTPException) as e:  # refused, unknown host, timed out
            raise UnreachableServerError("UNAVAILABLE", self._transport_problem(e)) from None
        try:  # once more, on a new connection
            return self._exchange(path, data)
        except (OSError, http.client.HTTPException) as e:
            raise UnreachableServerError("UNAVAILABLE", self._transport_problem(e)) from None

    def _exchange(self, path: str, data: bytes | None) -> tuple[int, bytes]:
        """One request and its answer; the connection is closed when either fails or the server
        says it closes it."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = http.client.HTTPConnection(self.host, self.port,
                                                                             timeout=self.timeout)
        try:
            connection.request("GET" if data is None else "POST", path, body=data,
                               headers={} if data is None else {"Content-Type": "application/json"})
            response = connection.getresponse()
            status, text = response.status, response.read()
        except BaseException:
            self.close()
            raise
        if response.will_close:
            self.close()
        return status, text

    def _call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode("utf-8")
        status, text = self._send(path, data)
        if not 200 <= status < 300:
            text = text.decode("utf-8", "replace")
            try:
                message = json.loads(text).get("error", text)
            except (ValueError, AttributeError):  # not a JSON object: another kind of server answered
                message = text
            raise ServingRequestError(status, " ".join(str(message).split()) or http.client.responses.get(status, ""))
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise ServingRequestError(status, "the answer is not a JSON object; is this a TF Serving REST port?")
        return answer

    def _transport_problem(self, reason) -> str:
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            return f"no answer within {self.timeout:g} s"
        if isinstance(reason, http.client.RemoteDisconnected):
            return "the server closed the connection without answering"
        if isinstance(reason, http.client.BadStatusLine):  # a gRPC (HTTP/2) port sends frames
            return "the answer is not HTTP/1.1: is this a gRPC port? The REST API speaks HTTP/1.1"
        return getattr(reason, "strerror", None) or " ".join(str(reason).split()) or type(reason).__name__

    def status(self, version: Version = None) -> dict:
        return self._call(self._url(version))

    def metadata(self, version: Version = None) -> dict:
        return self._call(self._url(version, "/metadata"))

    def predict_json(self, body: dict, version: Version = None) -> dict:
        """POST a raw `:predict` body; return the raw JSON response."""
        return self._call(self._url(version, ":predict"), body)

    def predict(self, inputs: dict | list, signature_name: str = DEFAULT_SIGNATURE, version: Version = None) -> dict[str, np.ndarray]:
        outputs = self.signature(signature_name, version)["outputs"]
        names = sorted(outputs)
        if isinstance(inputs, dict):
            response = self.predict_json({"signature_name": signature_name, "inputs": _json_value(inputs)}, version)
            columns = response["outputs"]
            if len(names) == 1:
                columns = {names[0]: columns}
        else:
            response = self.predict_json({"signature_name": signature_name, "instances": _json_value(list(inputs))}, version)
            rows = response["predictions"]
            columns = {names[0]: rows} if len(names) == 1 else {n: [row[n] for row in rows] for n in names}
        return {n: _from_json(v, outputs[n]["dtype"]) for n, v in columns.items()}

    def classify(self, examples, context=None, signature_name=CLASSIFY_SIGNATURE, version=None):
        results = self._examples_call("classify", examples, context, signature_name, version)
        return [[(label, _float32(score)) for label, score in row] for row in results]

    def regress(self, examples, context=None, signature_name=REGRESS_SIGNATURE, version=None):
        return [_float32(value) for value in self._examples_call("regress", examples, context, signature_name, version)]

    def _examples_call(self, verb: str, examples, context, signature_name: str, version: Version) -> list:
        body = {"signature_name": signature_name, "examples": _json_value([dict(e) for e in examples])}
        if context is not None:
            body["context"] = _json_value(dict(context))
        return self._call(self._url(version, f":{verb}"), body)["results"]


def ssl_channel_credentials(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None):
    """gRPC TLS credentials from PEM files: the CA that signed the server's certificate (None:
    the system's), and this client's certificate and key for a server with client_verify."""
    import grpc

    def read(path):
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(read(ca_file), read(key_file), read(cert_file))


class GrpcClient(_Client):
    """TF Serving gRPC client (PredictionService + ModelService stubs).

    `host` may be a UNIX socket, `unix:/path` (TF Serving's --grpc_socket_path; `port` is then
    unused). `credentials` (e.g. from `ssl_channel_credentials`) connects over TLS to a server
    started with --ssl_config_file; `ssl_target_name` is the name its certificate must carry
    when that is not `host`."""

    def __init__(self, host: str, port: int | None, model_name: str, timeout: float = 60.0,
                 max_message_bytes: int = 64 << 20, credentials=None, ssl_target_name: str | None = None):
        super().__init__(host, port, model_name, timeout)
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        self._grpc = grpc
        if host.startswith("unix:"):
            target = host
        else:
            target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        options = [("grpc.max_send_message_length", max_message_bytes),
                   ("grpc.max_receive_message_length", max_message_bytes)]
        if ssl_target_name:
            options.append(("grpc.ssl_target_name_override", ssl_target_name))
        self.channel = (grpc.secure_channel(target, credentials, options=options) if credentials is not None
                        else grpc.insecure_channel(target, options=options))
        self.prediction_stub = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.model_stub = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _spec(self, model_spec, version: Version, signature_name: str | None = None) -> None:
        model_spec.name = self.model_name
        if isinstance(version, str):
            model_spec.version_label = version
        elif version is not None:
            model_spec.version.value = int(version)
        if signature_name is not None:
            model_spec.signature_name = signature_name

    def _rpc(self, method, request):
        try:
            return method(request, timeout=self.timeout)
        except self._grpc.RpcError as e:
            code, details = e.code(), " ".join((e.details() or "").split())
            # gRPC reports a refused connection, an unknown host and a dropped connection as
            # UNAVAILABLE ("failed to connect to all addresses; ..."), a server that never
            # answers as DEADLINE_EXCEEDED.
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise UnreachableServerError(code, f"no answer within {self.timeout:g} s") from None
            if code == self._grpc.StatusCode.UNAVAILABLE:
                raise UnreachableServerError(code, details or "unavailable") from None
            raise ServingRequestError(code, details) from None

    def status(self, version: Version = None) -> dict:
        from google.protobuf import json_format
        from tensorflow_serving.apis import get_model_status_pb2

        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request.model_spec, version)
        response = self._rpc(self.model_stub.GetModelStatus, request)
        return json_format.MessageToDict(response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)

    def reload_config(self, configs: Sequence) -> None:
        """TF Serving's ModelService.HandleReloadConfigRequest: `configs` (serving.model_config
        ModelConfigs; [] unloads every model) become the served models; returns once the new ones
        are AVAILABLE. ServingRequestError with the server's code and words otherwise."""
        from tensorflow_serving.apis import model_management_pb2

        request = model_management_pb2.ReloadConfigRequest()
        request.config.model_config_list.SetInParent()
        request.config.model_config_list.config.extend(c.to_proto() for c in configs)
        self._rpc(self.model_stub.HandleReloadConfigRequest, request)

    def metadata_proto(self, version: Version = None):
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._spec(request.model_spec, version)
        return self._rpc(self.prediction_stub.GetModelMetadata, request)

    def metadata(self, version: Version = None) -> dict:
        from google.protobuf import json_format
        from tensorflow_serving.apis import get_model_metadata_pb2

        response = self.metadata_proto(version)
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(sig_map)
        as_dict = lambda m: json_format.MessageToDict(  # noqa: E731
            m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        return {
            "model_spec": {"name": response.model_spec.name, "signature_name": "",
                           "version": str(response.model_spec.version.value)},
            "metadata": {"signature_def": as_dict(sig_map)},
        }

    def predict(self, inputs: dict | list, signature_name: str = DEFAULT_SIGNATURE, version: Version = None) -> dict[str, np.ndarray]:
        import tensorflow as tf
        from tensorflow.core.framework import types_pb2
        from tensorflow_serving.apis import predict_pb2

        if not isinstance(inputs, dict):
            inputs = self._rows_to_columns(list(inputs), signature_name, version)
        input_dtypes = {k: v["dtype"] for k, v in self.signature(signature_name, version)["inputs"].items()}
        request = predict_pb2.PredictRequest()
        self._spec(request.model_spec, version, signature_name)
        for name, value in inputs.items():
            dtype = tf.as_dtype(types_pb2.DataType.Value(input_dtypes[name])) if name in input_dtypes else None
            if dtype == tf.string:
                value = _strings_to_bytes(value)
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
        response = self._rpc(self.prediction_stub.Predict, request)
        return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}

    def classify(self, examples, context=None, signature_name=CLASSIFY_SIGNATURE, version=None):
        from tensorflow_serving.apis import classification_pb2

        request = classification_pb2.ClassificationRequest()
        self._spec(request.model_spec, version, signature_name)
        _fill_input(request.input, examples, context)
        response = self._rpc(self.prediction_stub.Classify, request)
        return [[(c.label, _float32(c.score)) for c in one.classes] for one in response.result.classifications]

    def regress(self, examples, context=None, signature_name=REGRESS_SIGNATURE, version=None):
        from tensorflow_serving.apis import regression_pb2

        request = regression_pb2.RegressionRequest()
        self._spec(request.model_spec, version, signature_name)
        _fill_input(request.input, examples, context)
        response = self._rpc(self.prediction_stub.Regress, request)
        return [_float32(r.value) for r in response.result.regressions]


def _fill_input(model_input, examples: Sequence[Mapping[str, Any]], context: Mapping[str, Any] | None) -> None:
    """A Classify / Regress request's `input`: `example_list`, or `example_list_with_context`."""
    if context is None:
        for features in examples:
            _fill_example(model_input.example_list.examples.add(), features)
        return
    _fill_example(model_input.example_list_with_context.context, context)
    for features in examples:
        _fill_example(model_input.example_list_with_context.examples.add(), features)


def _fill_example(example, features: Mapping[str, Any]) -> None:
    """`features` into a tf.Example, typed as TF Serving's REST API types JSON values: strings,
    bytes and {"b64": ...} -> bytes_list, floats (or ints among floats) -> float_list, ints -> int64_list."""
    for name, value in features.items():
        values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value]
        feature = example.features.feature[name]
        if any(isinstance(v, (str, bytes, dict)) for v in values):
            feature.bytes_list.value.extend(_strings_to_bytes(values))
        elif any(isinstance(v, (float, np.floating)) for v in values):
            feature.float_list.value.extend(float(v) for v in values)
        elif values:
            feature.int64_list.value.extend(int(v) for v in values)


def _strings_to_bytes(value: Any) -> Any:
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_strings_to_bytes(v) for v in value]
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    return value.encode("utf-8") if isinstance(value, str) else value
