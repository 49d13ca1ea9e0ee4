r"""electra-client: send texts to a TF Serving-compatible server; one JSON line per example.

    electra-client --server=127.0.0.1:8501 --protocol=rest --model_name=electra \
        --text="a great movie" --text="dull" [--text_pair=... per --text]
"""

import json

from absl import app, flags

from electra_tf import cli
from electra_tf.serving.client import GrpcClient, RestClient, ServingRequestError

FLAGS = flags.FLAGS
flags.DEFINE_string("server", "127.0.0.1:8501", "host:port of the REST or gRPC endpoint.")
flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"], "API to use.")
flags.DEFINE_string("model_name", "electra", "Served model name.")
flags.DEFINE_multi_string("text", [], "An input text (repeat for a batch).")
flags.DEFINE_multi_string("text_pair", None, "The second segment, one per --text.")
flags.DEFINE_string("signature_name", "serving_default", "Signature to call.")
flags.DEFINE_integer("model_version", None, "A specific version (default: the latest served).")


def main(argv):
    del argv
    if not FLAGS.text:
        raise app.UsageError("give at least one --text")
    host, _, port = FLAGS.server.rpartition(":")
    if not host or not port.isdigit():
        raise app.UsageError(f"--server must be host:port, got {FLAGS.server!r}")
    host = host.strip("[]")
    client_type = RestClient if FLAGS.protocol == "rest" else GrpcClient
    client = client_type(host, int(port), FLAGS.model_name)
    try:
        results = client.classify_texts(FLAGS.text, FLAGS.text_pair, FLAGS.signature_name, FLAGS.model_version)
    except ServingRequestError as e:
        raise SystemExit(f"server error {e.status}: {e.message}")
    except ValueError as e:
        raise app.UsageError(str(e))
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
