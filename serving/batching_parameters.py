"""TF Serving's batching parameters: its `--batching_parameters_file` and a version's own
`batching_params.pbtxt` (--enable_per_model_batching_parameters), read into `BatchingParameters`
with TF Serving's defaults and checks. What the scheduler does with them: serving/batching.py.
Importable without TensorFlow (electra-serve reads the file before TensorFlow loads).
"""

from __future__ import annotations

import dataclasses
import os

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format, wrappers_pb2


_SUPPORTED = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads")


def _batching_parameters_proto():
    """TF Serving's BatchingParameters message (session_bundle_config.proto), built at run time
    because the `tensorflow-serving-api` package does not ship it."""
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    file = descriptor_pb2.FileDescriptorProto(
        name="session_bundle_config.proto", package="tensorflow.serving", syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    message = file.message_type.add(name="BatchingParameters")
    F = descriptor_pb2.FieldDescriptorProto
    fields = [(name, F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL) for name in _SUPPORTED]
    fields += [
        ("thread_pool_name", F.TYPE_MESSAGE, ".google.protobuf.StringValue", F.LABEL_OPTIONAL),
        ("allowed_batch_sizes", F.TYPE_INT64, None, F.LABEL_REPEATED),
        ("pad_variable_length_inputs", F.TYPE_BOOL, None, F.LABEL_OPTIONAL),
        ("enable_large_batch_splitting", F.TYPE_MESSAGE, ".google.protobuf.BoolValue", F.LABEL_OPTIONAL),
        ("max_execution_batch_size", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL),
    ]
    for number, (name, type_, type_name, label) in enumerate(fields, start=1):
        message.field.add(name=name, number=number, type=type_, label=label, **({"type_name": type_name} if type_name else {}))
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TF Serving's batching parameters, with its defaults.

    Args:
        max_batch_size: rows in one batch; a request with more rows is rejected.
        batch_timeout_micros: how long a batch that is not full may wait for more requests.
        max_enqueued_batches: queued (not yet running) batches per queue; above, UNAVAILABLE.
        num_batch_threads: batches run at once.
        allowed_batch_sizes: the row counts a batch may have, increasing, the last
            max_batch_size: a batch is padded up to the next one with copies of its last
            request's first row, and those rows' outputs dropped (for models compiled per batch
            size). Empty: any size.
        pad_variable_length_inputs: requests whose inputs differ in their other dimensions
            batch together, each input padded to the batch's largest with its own first value
            (the outputs keep the padded size, as in TF Serving).
        enable_large_batch_splitting: a request with more rows than max_execution_batch_size
            runs as several batches (max_batch_size then bounds the request, max_execution_batch_size
            the batch; its default is max_batch_size).
    """

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = os.cpu_count() or 1
    allowed_batch_sizes: tuple[int, ...] = ()
    pad_variable_length_inputs: bool = False
    enable_large_batch_splitting: bool = False
    max_execution_batch_size: int | None = None

    def __post_init__(self):
        for name in _SUPPORTED:
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "batch_timeout_micros" else 1):
                raise ValueError(f"batching parameter {name} must be {'>= 0' if name == 'batch_timeout_micros' else '>= 1'}, got {value!r}")
        sizes = self.allowed_batch_sizes
        if sizes and (sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:]))):
            raise ValueError(f"allowed_batch_sizes must be increasing sizes >= 1, got {list(sizes)}")
        if sizes and sizes[-1] != self.max_batch_size:  # TF Serving's words (bundle_factory_util.cc)
            raise ValueError(f"Last entry in allowed_batch_sizes must match max_batch_size; last entry was"
                             f" {sizes[-1]}; expected {self.max_batch_size}")
        if self.max_execution_batch_size is not None and not 1 <= self.max_execution_batch_size <= self.max_batch_size:
            raise ValueError(f"max_execution_batch_size must be from 1 to max_batch_size ({self.max_batch_size}), got"
                             f" {self.max_execution_batch_size}")

    @property
    def execution_batch_size(self) -> int:
        """The most rows one model call takes."""
        if self.enable_large_batch_splitting and self.max_execution_batch_size is not None:
            return self.max_execution_batch_size
        return self.max_batch_size

    def padded_size(self, rows: int) -> int:
        """`rows` rounded up to the next allowed batch size (TF Serving's RoundToLowestAllowedBatchSize)."""
        return next((size for size in self.allowed_batch_sizes if size >= rows), rows)

    @classmethod
    def from_text(cls, text: str, where: str = "batching parameters") -> "BatchingParameters":
        """Parse a text BatchingParameters proto, e.g. `max_batch_size { value: 32 }`."""
        proto = _batching_parameters_proto()()
        try:
            text_format.Parse(text, proto)
        except text_format.ParseError as e:
            raise ValueError(f"{where}: {e}") from None
        values = {name: getattr(proto, name).value for name in _SUPPORTED if proto.HasField(name)}
        values.update(allowed_batch_sizes=tuple(proto.allowed_batch_sizes),
                      pad_variable_length_inputs=proto.pad_variable_length_inputs,
                      enable_large_batch_splitting=proto.enable_large_batch_splitting.value)
        if proto.HasField("max_execution_batch_size"):
            values["max_execution_batch_size"] = proto.max_execution_batch_size.value
        try:
            return cls(**values)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


def read_batching_parameters(path: str) -> BatchingParameters:
    with open(path, encoding="utf-8") as f:
        return BatchingParameters.from_text(f.read(), path)


MODEL_BATCHING_FILE = "batching_params.pbtxt"  # TF Serving's, in the version's folder (bundle_factory_util.cc)
NOT_BATCHED = "not batched"  # a signature's `batching` when its version asks for no batching


def read_model_batching_parameters(version_path: str, server: BatchingParameters):
    """A version's own batching (TF Serving's --enable_per_model_batching_parameters): the
    parameters of its `batching_params.pbtxt`, batch threads aside (the server's), or NOT_BATCHED
    without the file, as TF Serving. Raises ValueError (the file's fault, naming it) or OSError."""
    path = os.path.join(version_path, MODEL_BATCHING_FILE)
    if not os.path.isfile(path):
        return NOT_BATCHED
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parameters = BatchingParameters.from_text(text, MODEL_BATCHING_FILE)
    return dataclasses.replace(parameters, num_batch_threads=server.num_batch_threads)
