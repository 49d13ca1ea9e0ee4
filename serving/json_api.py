"""TF Serving's REST JSON: request bodies to tensors, tensors to response JSON.

Row (`instances`) and columnar (`inputs`) formats, `{"b64": ...}` for binary strings, and the
status and metadata documents, as TF Serving's g3doc/api_rest.md defines them; key order follows
the real server's JSON printer so the text reads like its answers.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import math
import sys
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf import json_format

from electra_tf.serving.budget import trim_heap
from electra_tf.serving.errors import invalid, shown
from electra_tf.serving.manager import ModelManager
from electra_tf.serving.servables import DEFAULT_SIGNATURE, Signature

_MAX_RANK = 32  # of a JSON input; numpy stops at 64 and no model here takes more than 3
# CPython refuses to read an integer of more digits than this (a guard against quadratic time).
_MAX_INT_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)()

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
                raise invalid(f"{where}: {shown(str(leaf), 24)} is out of range for {dtype.name}")
            return leaf
        raise invalid(f"{where}: expected an integer for a {dtype.name} input, got {_json_type(leaf)}")
    if dtype.is_floating:
        if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            try:
                in_range = not math.isfinite(leaf) or abs(float(leaf)) <= float(dtype.max)  # Infinity and NaN are sent as such
            except OverflowError:  # an integer beyond float64
                in_range = False
            if not in_range:
                raise invalid(f"{where}: {shown(str(leaf), 24)} is out of range for {dtype.name}")
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


def json_shape(value: Any) -> list[int]:
    """The shape a (nested list of) JSON values claims by its first element at each depth;
    `json_to_array` checks that every other element agrees."""
    shape = []
    probe = value
    while isinstance(probe, list):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    return shape


def _declared_shape(value: Any, where: str) -> list[int]:
    shape = json_shape(value)
    if len(shape) > _MAX_RANK:
        raise invalid(f"{where}: a value nested {len(shape)} lists deep; at most {_MAX_RANK} dimensions are served")
    return shape


def json_to_array(value: Any, dtype: tf.DType, where: str) -> np.ndarray:
    """A (nested list of) JSON values as a rectangular numpy array of `dtype`."""
    shape = _declared_shape(value, where)
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
    for n in names:  # shapes first: a batch of a million values must not be converted to be refused
        signature.check_shape(n, _declared_shape(columns[n], f"input {n!r} of 'instances'"), max_batch_size)
    arrays = {}
    for n in names:
        arrays[n] = json_to_array(columns[n], signature.inputs[n].dtype, f"input {n!r} of 'instances'")
        if arrays[n].ndim == 0 or arrays[n].shape[0] != len(instances):
            raise invalid(f"input {n!r}: every instance must hold a value of the same shape")
    return arrays


def _parse_columnar_inputs(inputs: Any, signature: Signature, max_batch_size: int) -> dict[str, np.ndarray]:
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
    for n, v in inputs.items():  # shapes first, as for 'instances'
        signature.check_shape(n, _declared_shape(v, f"input {n!r}"), max_batch_size)
    return {n: json_to_array(v, signature.inputs[n].dtype, f"input {n!r}") for n, v in inputs.items()}


def parse_json_body(body: bytes) -> Any:
    """A request body as JSON; INVALID_ARGUMENT for any body that is not JSON, never a 500."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"request body is not valid UTF-8 (byte {e.start}); send binary data as {{\"b64\": ...}}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise invalid(f"JSON parse error: {e.msg} at line {e.lineno} column {e.colno}") from e
    except RecursionError:
        raise invalid("JSON parse error: the body is nested too deeply") from None
    except ValueError:  # CPython's limit on the digits of an integer
        raise invalid(f"JSON parse error: a number has more than {_MAX_INT_DIGITS} digits") from None


def _request_inputs(manager: ModelManager, name: str, version: int | None, body: bytes, max_batch_size: int):
    """(servable signature, input arrays, the batch of 'instances' or None) of a :predict body.

    Everything parsed from `body` is dropped on return: the caller holds the parse budget for
    exactly that long (`serving.budget`)."""
    request = parse_json_body(body)
    if not isinstance(request, dict):
        raise invalid("the request body must be a JSON object")
    if ("instances" in request) == ("inputs" in request):
        raise invalid("the request must hold exactly one of 'instances' (row format) or 'inputs' (columnar format)")
    signature_name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str):
        raise invalid("'signature_name' must be a string")
    signature = manager.servable(name, version).predict_signature(signature_name)
    if "instances" in request:
        return signature, _parse_row_inputs(request["instances"], signature, max_batch_size), len(request["instances"])
    return signature, _parse_columnar_inputs(request["inputs"], signature, max_batch_size), None


def predict_json(manager: ModelManager, name: str, version: int | None, body: bytes, max_batch_size: int,
                 scheduler=None, budget=None) -> dict:
    """Run a REST `:predict` request body through `scheduler`; return the response JSON object.

    The body is parsed and its inputs converted while it holds its size of `budget` (a
    `serving.budget.ParseBudget`), and the model runs after."""
    with budget.hold(len(body)) if budget is not None else contextlib.nullcontext():
        signature, inputs, batch = _request_inputs(manager, name, version, body, max_batch_size)
    try:
        outputs = signature.run(inputs, max_batch_size, scheduler)
    finally:
        del inputs
        trim_heap(len(body))  # what the model call of a large request freed
    if batch is not None:
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
