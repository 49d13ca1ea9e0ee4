"""electra-serve: serve exported SavedModels over TF Serving's REST and gRPC APIs.

    electra-serve --model_base_path=/tmp/export/electra --rest_api_port=8501 --port=8500

Flags carry TF Serving's names, so the same command line reads the same against
`tensorflow_model_server`. One difference: a port of 0 picks a free port here (TF
Serving disables REST with --rest_api_port=0); the bound URLs are logged.
Runs until SIGINT/SIGTERM, then stops cleanly.
"""

import signal
import threading

from absl import app, flags, logging

from serving import model_config
from serving.server import DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_BODY_BYTES, ModelServer

FLAGS = flags.FLAGS
flags.DEFINE_string("model_base_path", None, "The BASE/NAME folder holding numbered version folders.")
flags.DEFINE_string("model_name", None, "Served model name (default: basename of --model_base_path).")
flags.DEFINE_string("model_config_file", None, "A models.config text protobuf, instead of --model_base_path.")
flags.DEFINE_integer("rest_api_port", 8501, "REST port (0: pick a free one).")
flags.DEFINE_integer("port", 8500, "gRPC port (0: pick a free one).")
flags.DEFINE_string("host", "127.0.0.1", "Address to bind; 0.0.0.0 exposes the server to the network.")
flags.DEFINE_float("file_system_poll_wait_seconds", 1.0, "Seconds between polls for new versions (<= 0: once).")
flags.DEFINE_integer("max_body_bytes", DEFAULT_MAX_BODY_BYTES, "Largest REST body (413 above) and gRPC message.")
flags.DEFINE_integer("max_batch_size", DEFAULT_MAX_BATCH_SIZE, "Largest batch per request (400 above).")
flags.DEFINE_integer("rest_threads", 16, "REST worker threads.")
flags.DEFINE_integer("grpc_threads", 16, "gRPC worker threads.")


def main(argv):
    del argv
    if bool(FLAGS.model_base_path) == bool(FLAGS.model_config_file):
        raise app.UsageError("pass exactly one of --model_base_path or --model_config_file")
    models = model_config.read_models_config(FLAGS.model_config_file) if FLAGS.model_config_file else None
    server = ModelServer(
        FLAGS.model_base_path,
        FLAGS.model_name,
        rest_port=FLAGS.rest_api_port,
        grpc_port=FLAGS.port,
        host=FLAGS.host,
        models=models,
        poll_interval_seconds=FLAGS.file_system_poll_wait_seconds,
        max_body_bytes=FLAGS.max_body_bytes,
        max_batch_size=FLAGS.max_batch_size,
        rest_threads=FLAGS.rest_threads,
        grpc_threads=FLAGS.grpc_threads,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    server.start()
    try:
        host = f"[{server.host}]" if ":" in server.host else server.host
        logging.info("REST API at http://%s:%d/v1/models/{%s}", host, server.rest_port, ",".join(server.model_names))
        logging.info("gRPC API at %s:%d", host, server.grpc_port)
        while not stop.wait(0.5):
            pass
        logging.info("stopping")
    finally:
        server.stop()
    logging.info("stopped")


def run():
    app.run(main)


if __name__ == "__main__":
    run()
