"""The local server's default limits, importable without TensorFlow (for `electra-serve --help`)."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH_SIZE = 1024
DEFAULT_REST_IDLE_TIMEOUT_SECONDS = 30.0
DEFAULT_REST_MAX_CONNECTIONS = 256
