r"""electra-client: send texts to a TF Serving-compatible server; one JSON line per example.

    electra-client --server=127.0.0.1:8501 --protocol=rest --model_name=electra \
        --text="a great movie" --text="dull" [--text_pair=... per --text]

With --signature_name naming a Classify or Regress signature (`classify`, `regress` of
electra_tf's classification / regression exports) the texts go as tf.Examples through TF Serving's
Classify / Regress API: one line per example with its `classes` and `scores`, or `outputs`.

A server that cannot be reached (nothing listening, an unknown or unreachable host, a connection
closed without an answer, no answer within --timeout_seconds) or that refuses the request is one
line on stderr naming the server's address and the problem, exit 1.
"""

import json
import math
import re

from absl import app, flags

from electra_tf import cli
from electra_tf.serving.client import (
    GrpcClient, RestClient, ServingRequestError, UnreachableServerError, ssl_channel_credentials)

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "127.0.0.1:8501", "host:port of the REST or gRPC endpoint ([::1]:8501 for IPv6), or with"
                    " --protocol=grpc unix:/path of a server's --grpc_socket_path.")
flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"], "API to use.")
flags.DEFINE_string("model_name", "electra", "Served model name.")
flags.DEFINE_multi_string("text", [], "An input text (repeat for a batch).")
flags.DEFINE_multi_string("text_pair", None, "The second segment, one per --text.")
flags.DEFINE_string("signature_name", "serving_default", "Signature to call.")
flags.DEFINE_integer("model_version", None, "A specific version (default: the latest served).")
flags.DEFINE_string("model_version_label", None,
                    "A version label of the server's models.config (version_labels), e.g. stable;"
                    " instead of --model_version.")
flags.DEFINE_string("ssl_ca_file", None, "gRPC over TLS (a server's --ssl_config_file): the PEM CA that signed its"
                    " certificate.")
flags.DEFINE_string("ssl_cert_file", None, "gRPC over TLS: this client's PEM certificate, for a server with client_verify.")
flags.DEFINE_string("ssl_key_file", None, "gRPC over TLS: this client's PEM private key (with --ssl_cert_file).")
flags.DEFINE_string("ssl_target_name", None, "gRPC over TLS: the name the server's certificate carries, when it is not"
                    " the --server host (e.g. localhost for 127.0.0.1).")
flags.DEFINE_float("timeout_seconds", 60.0, "Seconds to wait for each answer (connecting included).")

_PORT = re.compile(r"[0-9]{1,5}")  # ASCII: str.isdigit() also takes '٣'


def parse_server(server: str) -> tuple[str, int]:
    """(host, port) of --server's host:port; app.UsageError naming the flag if it is not one."""
    host, _, port = server.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not _PORT.fullmatch(port) or not 0 < int(port) <= 65535:
        raise app.UsageError(f"--server must be host:port with a port from 1 to 65535, got {server!r}")
    return host, int(port)


def main(argv):
    del argv
    if not FLAGS.text:
        raise app.UsageError("give at least one --text")
    if FLAGS.text_pair is not None and len(FLAGS.text_pair) != len(FLAGS.text):
        raise app.UsageError(f"give one --text_pair per --text: {len(FLAGS.text)} --text but"
                             f" {len(FLAGS.text_pair)} --text_pair")
    if not (math.isfinite(FLAGS.timeout_seconds) and FLAGS.timeout_seconds > 0):
        raise app.UsageError(f"--timeout_seconds must be a finite number of seconds > 0, got {FLAGS.timeout_seconds}")
    if FLAGS.model_version is not None and FLAGS.model_version_label is not None:
        raise app.UsageError("give --model_version or --model_version_label, not both")
    if FLAGS.model_version_label is not None and not FLAGS.model_version_label.strip():
        raise app.UsageError("--model_version_label must name a label, got an empty one")
    version = FLAGS.model_version_label if FLAGS.model_version_label is not None else FLAGS.model_version
    tls = [f for f in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file", "ssl_target_name") if FLAGS[f].value]
    if tls and FLAGS.protocol != "grpc":
        raise app.UsageError(f"--{tls[0]} is for --protocol=grpc (REST is plain HTTP, as TF Serving's)")
    if bool(FLAGS.ssl_cert_file) != bool(FLAGS.ssl_key_file):
        raise app.UsageError("give --ssl_cert_file and --ssl_key_file together")
    where = f"{ {'rest': 'REST', 'grpc': 'gRPC'}[FLAGS.protocol]} server at {FLAGS.server}"
    if FLAGS.protocol == "grpc":
        if FLAGS.server.startswith("unix:"):
            if len(FLAGS.server) == len("unix:"):
                raise app.UsageError("--server unix: needs the socket's path, e.g. unix:/tmp/electra.sock")
            host, port = FLAGS.server, None
        else:
            host, port = parse_server(FLAGS.server)
        credentials = None
        if tls:
            try:
                credentials = ssl_channel_credentials(FLAGS.ssl_ca_file, FLAGS.ssl_cert_file, FLAGS.ssl_key_file)
            except OSError as e:
                raise SystemExit(f"electra-client: error: {e.filename}: {e.strerror or e}") from None
        client = GrpcClient(host, port, FLAGS.model_name, timeout=FLAGS.timeout_seconds, credentials=credentials,
                            ssl_target_name=FLAGS.ssl_target_name)
    else:
        host, port = parse_server(FLAGS.server)
        client = RestClient(host, port, FLAGS.model_name, timeout=FLAGS.timeout_seconds)
    try:
        results = client.classify_texts(FLAGS.text, FLAGS.text_pair, FLAGS.signature_name, version)
    except UnreachableServerError as e:
        raise SystemExit(f"electra-client: error: {where}: {e.message}") from None
    except ServingRequestError as e:
        status = getattr(e.status, "name", e.status)  # grpc.StatusCode.NOT_FOUND -> NOT_FOUND
        raise SystemExit(f"electra-client: error: {where} answered {status}: {e.message}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:  # an answer not shaped as TF Serving's
        raise SystemExit(f"electra-client: error: {where} answered something that is not TF Serving's"
                         f" API ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    for i, outputs in enumerate(results):
        line = {"text": FLAGS.text[i]}
        if FLAGS.text_pair is not None:
            line["text_pair"] = FLAGS.text_pair[i]
        line.update({k: v if not isinstance(v, bytes) else repr(v) for k, v in outputs.items()})
        print(json.dumps(line, ensure_ascii=False))


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
