"""electra-serve: serve exported SavedModels over TF Serving's REST and gRPC APIs.

    electra-serve --model_base_path=/tmp/export/electra --rest_api_port=8501 --port=8500

Flags carry TF Serving's names, so the same command line reads the same against
`tensorflow_model_server`. One difference: a port of 0 picks a free port here (TF
Serving disables REST with --rest_api_port=0); the bound URLs are logged. Batching takes TF
Serving's --enable_batching, --batching_parameters_file and --enable_per_model_batching_parameters;
--rest_idle_timeout_seconds, --rest_max_connections and --model_threads are this server's own
(serving/rest_connections.py, serving/batching.py). --tensorflow_intra_op_parallelism and
--tensorflow_inter_op_parallelism are TF Serving's; their default differs (see
`serving.defaults.intra_op_threads`). --monitoring_config_file is TF Serving's: Prometheus metrics under its names on the REST port (serving/metrics.py). So are
--rest_api_timeout_in_ms (a REST request's deadline; a gRPC request has its client's: a request
still waiting for the model when it passes is answered unrun, serving/batching.py),
--rest_api_num_threads, --rest_api_enable_cors_support, --grpc_max_threads (= --grpc_threads) and
--allow_version_labels_for_unavailable_models (default false as in TF Serving, which refuses every
models.config label at start without it). The gRPC port takes TF Serving's --ssl_config_file (TLS,
client certificates with client_verify), --grpc_socket_path (also a UNIX socket),
--grpc_channel_arguments and --enable_grpc_healthcheck_service (serving/grpc_transport.py). Loading
takes TF Serving's --saved_model_tags, --max_num_load_retries, --load_retry_interval_micros (their
defaults: 5 retries a minute apart, the version LOADING meanwhile), --num_load_threads,
--tensorflow_session_parallelism and --tensorflow_session_config_file (serving.manager.LoadOptions,
`apply_session_config`), and every other flag of TF Serving's binary: --enable_signature_method_name_check,
--enable_serialization_as_tensor_content and --version do what they do there; the rest, for
accelerators, TensorFlow Lite, ALTS and plug-ins, are accepted or refused in one line (`_not_here`).
Runs until SIGINT/SIGTERM, then stops cleanly.

Refused in one line naming the flag or file, before TensorFlow or any model loads: a flag out of
its range (serving/defaults.py), a models.config that does not parse or names a model badly
(serving/model_config.py), a local base path that does not exist (TF Serving would wait for it),
equal REST and gRPC ports (TF Serving drops REST), a port already in use, an SSL config whose key
does not match its certificate, a socket path another server listens on or that holds a file.
"""

import os
import signal
import threading

from absl import app, flags, logging

from electra_tf import cli
from electra_tf.serving import model_config
from electra_tf.serving.batching_parameters import BatchingParameters, read_batching_parameters
from electra_tf.serving.grpc_transport import TransportError, check_socket_path, parse_channel_arguments, read_ssl_config
from electra_tf.serving.metrics import read_monitoring_config
from electra_tf.serving.defaults import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_REST_IDLE_TIMEOUT_SECONDS,
    DEFAULT_REST_MAX_CONNECTIONS,
    intra_op_threads,
    limit_error,
)
from electra_tf.serving.ports import PortError, check_ports

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base_path", None, "The BASE/NAME folder holding numbered version folders.")
flags.DEFINE_string("model_name", None, "Served model name (default: basename of --model_base_path).")
flags.DEFINE_string("model_config_file", None, "A models.config text protobuf, instead of --model_base_path.")
flags.DEFINE_integer("rest_api_port", 8501, "REST port (0: pick a free one); not the same as --port.")
flags.DEFINE_integer("port", 8500, "gRPC port (0: pick a free one).")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind; 0.0.0.0 exposes the server to the network.")
flags.DEFINE_float("file_system_poll_wait_seconds", 1.0,
                   "Seconds between polls for new versions (<= 0: once). A base path that cannot be listed"
                   " keeps the loaded versions serving until it is back.")
flags.DEFINE_float("model_config_file_poll_wait_seconds", 0.0,
                   "With --model_config_file: seconds between reads of the file; a changed file replaces the"
                   " served models (those left out unloaded, new ones loaded), as TF Serving's flag and its gRPC"
                   " ModelService.HandleReloadConfigRequest. A file that does not parse is logged and changes"
                   " nothing. <= 0: read once, at start.")
flags.DEFINE_bool("enable_model_warmup", True,
                  "Replay each version's assets.extra/tf_serving_warmup_requests before it is AVAILABLE"
                  " (TF Serving's flag and default).")
flags.DEFINE_integer("num_request_iterations_for_warmup", 1,
                     "Times each warmup request runs (TF Serving's flag; values < 1 run it once, as there).")
flags.DEFINE_integer("max_body_bytes", DEFAULT_MAX_BODY_BYTES, "Largest REST body (413 above) and gRPC message.")
flags.DEFINE_integer("max_batch_size", DEFAULT_MAX_BATCH_SIZE, "Largest batch per request (400 above).")
flags.DEFINE_float("rest_idle_timeout_seconds", DEFAULT_REST_IDLE_TIMEOUT_SECONDS,
                   "A REST connection without a request for this long is closed; a request must arrive whole within it.")
flags.DEFINE_integer("rest_max_connections", DEFAULT_REST_MAX_CONNECTIONS,
                     "REST connections served at once; at the cap a new one closes the longest idle one, and gets"
                     " 503 only when none is idle.")
flags.DEFINE_integer("model_threads", None, "Model calls at once without batching (default or 0: one per core).")
flags.DEFINE_bool("enable_batching", False, "Merge concurrent requests into batches (TF Serving's flag).")
flags.DEFINE_string("batching_parameters_file", None,
                    "With --enable_batching: a text BatchingParameters proto (TF Serving's fields: max_batch_size,"
                    " batch_timeout_micros, max_enqueued_batches, num_batch_threads, allowed_batch_sizes, ...)"
                    " instead of TF Serving's defaults.")
flags.DEFINE_bool("enable_per_model_batching_parameters", False,
                  "With --enable_batching: each version's batching_params.pbtxt (a BatchingParameters text proto in"
                  " its folder) sets its batching, batch threads aside; a version without one is not batched (TF"
                  " Serving's flag).")
flags.DEFINE_bool("enable_signature_method_name_check", False,
                  "Also check signatures' method names (TF Serving's flag and default): Classify and Regress then take"
                  " only classify / regress signatures, Predict only predict, classify and regress ones.")
flags.DEFINE_integer("grpc_threads", 16, "gRPC worker threads (also --grpc_max_threads, TF Serving's name).")
flags.DEFINE_alias("grpc_max_threads", "grpc_threads")
flags.DEFINE_integer("rest_api_timeout_in_ms", 30000,
                     "How long a REST request may wait for a model thread or batch before it is answered 504 (or 429"
                     " with batching) unrun (TF Serving's flag; <= 0: no limit). gRPC requests keep their client's deadline.")
flags.DEFINE_integer("rest_api_num_threads", 0,
                     "REST requests handled at once, the others waiting in arrival order (TF Serving's flag; 0: every"
                     " connection's at once, up to --rest_max_connections).")
flags.DEFINE_bool("allow_version_labels_for_unavailable_models", False,
                  "Let a models.config version_labels entry name a version not loaded yet (TF Serving's flag). Without"
                  " it, as in TF Serving, labels are refused at start (they are checked before any version loads)"
                  " and at a reload unless their version is AVAILABLE.")
flags.DEFINE_bool("rest_api_enable_cors_support", False,
                  "Allow any origin in REST answers (TF Serving's flag): Access-Control-Allow-Origin: *.")
flags.DEFINE_string("monitoring_config_file", None,
                    "A text MonitoringConfig proto (TF Serving's), e.g. prometheus_config { enable: true"
                    ' path: "/monitoring/prometheus/metrics" }: Prometheus metrics at that path on the REST port.')
flags.DEFINE_string("grpc_socket_path", None,
                    "Also serve gRPC on this UNIX socket (TF Serving's flag); a client connects to unix:PATH.")
flags.DEFINE_string("grpc_channel_arguments", "",
                    "gRPC server arguments, key=value[,key=value] (TF Serving's flag), e.g."
                    " grpc.max_connection_age_ms=60000; a value read as a 32-bit int is passed as one.")
flags.DEFINE_string("ssl_config_file", None,
                    "A text SSLConfig proto (TF Serving's: server_key, server_cert, custom_ca, client_verify): gRPC"
                    " over TLS. REST stays plain HTTP, as in TF Serving.")
flags.DEFINE_bool("enable_grpc_healthcheck_service", False,
                  "Offer grpc.health.v1.Health/Check (TF Serving's flag): SERVING for \"\", ModelService and"
                  " PredictionService while the server runs.")
flags.DEFINE_string("saved_model_tags", "serve",
                    "Comma-separated tags of the MetaGraph to load (TF Serving's flag); a version without a MetaGraph of"
                    " exactly these tags fails to load.")
flags.DEFINE_integer("max_num_load_retries", 5,
                     "Times a failed load is tried again before the version is given up (TF Serving's flag and default;"
                     " 0: once). The version is LOADING meanwhile.")
flags.DEFINE_integer("load_retry_interval_micros", 60 * 1000 * 1000,
                     "Microseconds between load retries (TF Serving's flag and default, 1 minute; < 0: no wait).")
flags.DEFINE_integer("num_load_threads", 0,
                     "Models loaded at once (TF Serving's flag; 0 or 1: one after another).")
flags.DEFINE_integer("num_unload_threads", 0,
                     "TF Serving's flag, accepted: a version is unloaded here as soon as it is dropped.")
flags.DEFINE_integer("tensorflow_session_parallelism", 0,
                     "Both TensorFlow thread pools' size when neither --tensorflow_intra_op_parallelism nor"
                     " --tensorflow_inter_op_parallelism is given (TF Serving's flag; 0: their defaults).")
flags.DEFINE_string("tensorflow_session_config_file", None,
                    "A text ConfigProto (TF Serving's flag). As in TF Serving its thread counts give way to the"
                    " parallelism flags; of the rest, what TensorFlow 2 applies outside a session is applied"
                    " (log_device_placement, allow_soft_placement), the other fields are named in a warning.")
flags.DEFINE_bool("enable_serialization_as_tensor_content", False,
                  "gRPC Predict answers carry numbers as tensor_content bytes instead of typed *_val fields (TF"
                  " Serving's flag); clients reading them with tf.make_ndarray see no difference.")
flags.DEFINE_bool("version", False, "Print the server's and TensorFlow's versions and exit (TF Serving's flag).")
# TF Serving's flags for what this server does not have (accelerators, TensorFlow Lite, ALTS, plug-in
# configs, its profiler service, file system caches): accepted with TF Serving's defaults, so that its
# command lines run; see `_not_here`.
flags.DEFINE_bool("flush_filesystem_caches", True, "TF Serving's flag, accepted: no file system cache is kept here.")
flags.DEFINE_bool("remove_unused_fields_from_bundle_metagraph", True,
                  "TF Serving's flag, accepted: only the signatures of a MetaGraph are kept here.")
flags.DEFINE_bool("enable_profiler", True,
                  "TF Serving's flag, accepted: this server offers no profiler service on its gRPC port.")
flags.DEFINE_bool("skip_initialize_tpu", False, "TF Serving's flag, accepted: there is no TPU to initialise.")
flags.DEFINE_bool("xla_gpu_compilation_enabled", False, "TF Serving's flag, accepted: no GPU here.")
flags.DEFINE_float("per_process_gpu_memory_fraction", 0.0, "TF Serving's flag, accepted: no GPU here.")
flags.DEFINE_integer("num_tflite_pools", os.cpu_count() or 1, "TF Serving's flag (TensorFlow Lite), accepted.")
flags.DEFINE_integer("num_tflite_interpreters_per_pool", 1, "TF Serving's flag (TensorFlow Lite), accepted.")
flags.DEFINE_bool("xla_cpu_compilation_enabled", False,
                  "TF Serving's flag, accepted: functions saved with jit_compile=True are compiled here either way"
                  " (TF Serving refuses them without it).")
flags.DEFINE_bool("prefer_tflite_model", False, "TF Serving's flag; true is refused: this server loads SavedModels.")
flags.DEFINE_bool("use_alts_credentials", False, "TF Serving's flag; true is refused: ALTS exists on Google Cloud only.")
flags.DEFINE_string("platform_config_file", None, "TF Serving's flag; refused: this server serves TensorFlow SavedModels.")
flags.DEFINE_string("thread_pool_factory_config_file", None,
                    "TF Serving's flag; refused: its thread pool factories are C++ plug-ins.")
flags.DEFINE_string("mixed_precision", None, "TF Serving's flag; refused: models run in the precision they were saved in.")
flags.DEFINE_integer("tensorflow_intra_op_parallelism", 0,
                     "Threads one TensorFlow op may use (TF Serving's flag). 0: the cores divided by the model"
                     " calls that may run at once (--model_threads, or num_batch_threads with batching), at least 1.")
flags.DEFINE_integer("tensorflow_inter_op_parallelism", 0,
                     "Threads that run independent TensorFlow ops (TF Serving's flag). 0: TensorFlow's default.")


# flag -> the ModelServer argument whose valid values (serving.defaults.limit_error) it takes
_LIMIT_FLAGS = {
    "max_body_bytes": "max_body_bytes", "max_batch_size": "max_batch_size",
    "rest_idle_timeout_seconds": "rest_idle_timeout_seconds", "rest_max_connections": "rest_max_connections",
    "model_threads": "model_threads", "grpc_threads": "grpc_threads",
    "file_system_poll_wait_seconds": "poll_interval_seconds", "rest_api_port": "rest_port", "port": "grpc_port",
    "model_config_file_poll_wait_seconds": "model_config_poll_seconds",
    "rest_api_timeout_in_ms": "rest_api_timeout_ms", "rest_api_num_threads": "rest_api_num_threads",
}


def _error(message: str) -> SystemExit:
    return SystemExit(f"electra-serve: error: {message}")


def served_models() -> list[model_config.ModelConfig]:
    """The models the flags ask for, their names, paths and policies checked (`check_base_paths`
    looks at the folders)."""
    if FLAGS.model_config_file:
        try:
            models = model_config.read_models_config(FLAGS.model_config_file)
        except model_config.ModelConfigError as e:
            raise _error(f"--model_config_file {e}") from None
        except OSError as e:
            raise _error(f"--model_config_file {FLAGS.model_config_file}: {e.strerror or e}") from None
    else:
        base = os.path.abspath(FLAGS.model_base_path)
        name = FLAGS.model_name or os.path.basename(base.rstrip(os.sep))
        try:
            models = [model_config.ModelConfig(name, base)]
        except model_config.ModelConfigError as e:
            flag = "--model_name" if FLAGS.model_name or str(e).startswith("name") else "--model_base_path"
            raise _error(f"{flag}: {e}") from None
    return models


def check_base_paths(models: list[model_config.ModelConfig]) -> None:
    """Refuses a local base path that is not a folder, where TF Serving logs it at every poll and
    waits: at start it is a typo or a volume not mounted far more often than a deploy yet to
    come (an empty folder still waits for its first version). Remote ones (gs://...) are not
    looked at."""
    for config in models:
        if "://" in config.base_path or os.path.isdir(config.base_path):
            continue
        where = (f"--model_config_file {FLAGS.model_config_file}: base_path of model {config.name!r}"
                 if FLAGS.model_config_file else "--model_base_path")
        problem = "is not a folder" if os.path.exists(config.base_path) else "does not exist"
        raise _error(f"{where}: {config.base_path} {problem} (the folder of the numbered versions; an empty"
                     " one waits for the first)")


def grpc_transport() -> dict:
    """ModelServer's gRPC transport arguments from the flags, each checked (serving.grpc_transport)."""
    transport = {}
    try:
        transport["grpc_channel_arguments"] = parse_channel_arguments(FLAGS.grpc_channel_arguments)
    except TransportError as e:
        raise _error(f"--grpc_channel_arguments: {e}") from None
    if FLAGS.grpc_socket_path:
        try:
            transport["grpc_socket_path"] = check_socket_path(FLAGS.grpc_socket_path)
        except TransportError as e:
            raise _error(f"--grpc_socket_path {e}") from None
    if FLAGS.ssl_config_file:
        try:
            transport["ssl"] = read_ssl_config(FLAGS.ssl_config_file)
        except TransportError as e:
            raise _error(f"--ssl_config_file {FLAGS.ssl_config_file} {e}") from None
        except OSError as e:
            raise _error(f"--ssl_config_file {FLAGS.ssl_config_file}: {e.strerror or e}") from None
    return transport


def read_session_config(path: str | None, tf):
    """TF Serving's --tensorflow_session_config_file: a text ConfigProto, or None."""
    if not path:
        return None
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as f:
            return text_format.Parse(f.read(), tf.compat.v1.ConfigProto())
    except OSError as e:
        raise _error(f"--tensorflow_session_config_file {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, text_format.ParseError) as e:
        reason = "is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else f"is not a text ConfigProto: {e}"
        raise _error(f"--tensorflow_session_config_file {path} {' '.join(reason.split())}") from None


def apply_session_config(config, tf) -> None:
    """What of a session ConfigProto TensorFlow 2 can apply process-wide; the other fields set
    are named in one warning. Its thread counts give way to the parallelism flags, as in TF
    Serving, which always overwrites them (server.cc)."""
    applied, ignored = [], []
    for field, value in config.ListFields():
        if field.name == "log_device_placement":
            tf.debugging.set_log_device_placement(value)
        elif field.name == "allow_soft_placement":
            tf.config.set_soft_device_placement(value)
        elif field.name in ("intra_op_parallelism_threads", "inter_op_parallelism_threads"):
            logging.warning("--tensorflow_session_config_file: %s is replaced by the parallelism flags, as in TF"
                            " Serving", field.name)
            continue
        else:
            ignored.append(field.name)
            continue
        applied.append(field.name)
    logging.info("--tensorflow_session_config_file: applied %s", applied or "nothing")
    if ignored:
        logging.warning("--tensorflow_session_config_file: not applied here (no session in TensorFlow 2): %s",
                        ", ".join(ignored))


def _not_here() -> None:
    """TF Serving's flags for what this server does not have: a value that asks for it is refused
    in one line; an accepted one that changes nothing here is logged when it is given."""
    refused = {
        "prefer_tflite_model": "this server loads SavedModels only (no TensorFlow Lite)",
        "use_alts_credentials": "ALTS is a Google Cloud transport; use --ssl_config_file",
        "platform_config_file": "this server serves TensorFlow SavedModels only (no other platform or session"
                                " bundle config)",
        "thread_pool_factory_config_file": "TF Serving's thread pool factories are C++ plug-ins this server cannot load",
        "mixed_precision": "models run in the precision they were saved in",
    }
    for name, reason in refused.items():
        if FLAGS[name].value:
            raise _error(f"--{name}: {reason}")
    for name in ("flush_filesystem_caches", "remove_unused_fields_from_bundle_metagraph", "enable_profiler",
                 "skip_initialize_tpu", "xla_gpu_compilation_enabled", "per_process_gpu_memory_fraction",
                 "num_tflite_pools", "num_tflite_interpreters_per_pool", "xla_cpu_compilation_enabled"):
        if FLAGS[name].present:
            logging.info("--%s=%s is TF Serving's; it changes nothing here (%s)", name, FLAGS[name].value,
                         FLAGS[name].help.split(": ", 1)[-1].rstrip("."))


def main(argv):
    del argv
    if FLAGS.version:  # TF Serving's two lines
        from importlib.metadata import version
        print(f"TensorFlow ModelServer: electra-serve {version('electra_tf')}\nTensorFlow Library: {version('tensorflow')}")
        return
    _not_here()
    if bool(FLAGS.model_base_path) == bool(FLAGS.model_config_file):
        raise app.UsageError("pass exactly one of --model_base_path or --model_config_file")
    # Every flag's range before anything else: a bad value costs a second, not a model load.
    for flag, argument in _LIMIT_FLAGS.items():
        value = FLAGS[flag].value
        if value is not None and (error := limit_error(argument, value)) is not None:
            raise _error(f"--{flag} {error}")
    for name in ("tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism", "tensorflow_session_parallelism",
                 "max_num_load_retries", "num_load_threads", "num_unload_threads"):
        if not 0 <= FLAGS[name].value < 2**31:  # TensorFlow's ConfigProto and TF Serving's options hold int32s
            raise _error(f"--{name} must be from 0 to {2**31 - 1}, got {FLAGS[name].value}")
    if not -2**63 <= FLAGS.load_retry_interval_micros < 2**63:
        raise _error(f"--load_retry_interval_micros must fit an int64, got {FLAGS.load_retry_interval_micros}")
    if min(FLAGS.tensorflow_intra_op_parallelism, FLAGS.tensorflow_inter_op_parallelism,
           FLAGS.tensorflow_session_parallelism) > 0:  # TF Serving's refusal (server.cc)
        raise _error("give --tensorflow_session_parallelism or --tensorflow_intra_op_parallelism and"
                     " --tensorflow_inter_op_parallelism, not all three")
    tags = FLAGS.saved_model_tags.split(",")
    if not all(tag.strip() for tag in tags):
        raise _error(f"--saved_model_tags must be tags separated by commas, got {FLAGS.saved_model_tags!r}")
    if not -2**31 <= FLAGS.num_request_iterations_for_warmup < 2**31:  # an int32 in TF Serving
        raise _error("--num_request_iterations_for_warmup must fit TF Serving's int32 (< 2^31), got "
                     f"{FLAGS.num_request_iterations_for_warmup}")
    models = served_models()
    # TF Serving sets labels before any version loads: without the flag, any label is refused.
    labelled = next(((c.name, v) for c in models for _, v in c.version_labels), None)
    if labelled and not FLAGS.allow_version_labels_for_unavailable_models:
        raise _error(f"--model_config_file {FLAGS.model_config_file}: {model_config.unavailable_label(*labelled)}"
                     " (as TF Serving: labels are set before versions load; pass"
                     " --allow_version_labels_for_unavailable_models to set them at start)")
    if FLAGS.model_config_file_poll_wait_seconds > 0 and not FLAGS.model_config_file:
        logging.warning("--model_config_file_poll_wait_seconds is ignored without --model_config_file")
    batching = None
    if FLAGS.enable_batching:
        try:
            batching = (read_batching_parameters(FLAGS.batching_parameters_file) if FLAGS.batching_parameters_file
                        else BatchingParameters())
        except (OSError, ValueError) as e:
            raise app.UsageError(f"--batching_parameters_file: {e}")
    elif FLAGS.batching_parameters_file:  # TF Serving refuses it too (server.cc)
        raise _error("--batching_parameters_file is set without --enable_batching")
    elif FLAGS.enable_per_model_batching_parameters:
        logging.warning("--enable_per_model_batching_parameters is ignored without --enable_batching")
    metrics_path = None
    if FLAGS.monitoring_config_file:
        try:  # before the models load: a typo costs a second, not a load
            metrics_path = read_monitoring_config(FLAGS.monitoring_config_file)
        except ValueError as e:  # one line naming the file and the fault
            raise SystemExit(f"electra-serve: error: --monitoring_config_file: {e}") from None
    transport = grpc_transport()
    check_base_paths(models)
    try:  # before TensorFlow loads; ModelServer.start checks again, just before it binds
        check_ports(FLAGS.host, FLAGS.rest_api_port, FLAGS.port)
    except PortError as e:
        raise _error(str(e)) from None

    import tensorflow as tf

    from electra_tf.serving.server import LoadOptions, ModelServer

    session_config = read_session_config(FLAGS.tensorflow_session_config_file, tf)

    server = ModelServer(
        rest_port=FLAGS.rest_api_port,
        grpc_port=FLAGS.port,
        host=FLAGS.host,
        models=models,
        poll_interval_seconds=FLAGS.file_system_poll_wait_seconds,
        max_body_bytes=FLAGS.max_body_bytes,
        max_batch_size=FLAGS.max_batch_size,
        rest_idle_timeout_seconds=FLAGS.rest_idle_timeout_seconds,
        rest_max_connections=FLAGS.rest_max_connections,
        model_threads=FLAGS.model_threads,
        batching=batching,
        grpc_threads=FLAGS.grpc_threads,
        metrics_path=metrics_path,
        model_config_file=FLAGS.model_config_file,
        model_config_poll_seconds=FLAGS.model_config_file_poll_wait_seconds,
        warmup_iterations=max(FLAGS.num_request_iterations_for_warmup, 1) if FLAGS.enable_model_warmup else 0,
        rest_api_timeout_ms=FLAGS.rest_api_timeout_in_ms,
        rest_api_num_threads=FLAGS.rest_api_num_threads,
        enable_cors=FLAGS.rest_api_enable_cors_support,
        allow_version_labels_for_unavailable_models=FLAGS.allow_version_labels_for_unavailable_models,
        enable_grpc_healthcheck=FLAGS.enable_grpc_healthcheck_service,
        tensor_content=FLAGS.enable_serialization_as_tensor_content,
        load_options=LoadOptions(saved_model_tags=tuple(tag.strip() for tag in tags),
                                 max_num_load_retries=FLAGS.max_num_load_retries,
                                 load_retry_interval_seconds=FLAGS.load_retry_interval_micros / 1e6,
                                 num_load_threads=FLAGS.num_load_threads,
                                 per_model_batching=batching if FLAGS.enable_per_model_batching_parameters else None,
                                 check_method_names=FLAGS.enable_signature_method_name_check),
        **transport,
    )
    # Before the first op runs (ModelServer loads its models in start()).
    cores, calls = os.cpu_count() or 1, server.concurrent_model_calls
    if session_config is not None:
        apply_session_config(session_config, tf)
    # TF Serving's order (server.cc): the two flags if either is given, else session parallelism
    intra, inter = FLAGS.tensorflow_intra_op_parallelism, FLAGS.tensorflow_inter_op_parallelism
    if not (intra or inter):
        intra = inter = FLAGS.tensorflow_session_parallelism
    tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads(intra, calls, cores))
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    logging.info("TensorFlow threads: %d per op, %s inter-op (%d model calls at once on %d cores)",
                 tf.config.threading.get_intra_op_parallelism_threads(),
                 tf.config.threading.get_inter_op_parallelism_threads() or "default", calls, cores)
    stop = threading.Event()
    def on_signal(signum, frame):
        stop.set()
        server.manager.cancel_loads()  # a load at start (its retries) ends early; start() then returns

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        server.start()
    except PortError as e:  # a port taken since the check above: one line, not a traceback
        raise _error(str(e)) from None
    try:
        host = f"[{server.host}]" if ":" in server.host else server.host
        logging.info("REST API at http://%s:%d/v1/models/{%s}", host, server.rest_port, ",".join(server.model_names))
        logging.info("gRPC API at %s:%d", host, server.grpc_port)
        if metrics_path:
            logging.info("Prometheus metrics at http://%s:%d%s", host, server.rest_port, metrics_path)
        while not stop.wait(0.5):
            pass
        logging.info("stopping")
    finally:
        server.stop()
    logging.info("stopped")


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
