"""TF Serving's gRPC transport flags (serving/grpc_transport.py): TLS with and without client
certificates, the UNIX socket, channel arguments and the health check, on a real server and
through the real binaries; and each bad value refused in one line before TensorFlow loads."""

import os
import re
import shutil
import socket
import subprocess
import sys

import grpc
import numpy as np
import pytest

from electra_tf.serving.client import GrpcClient, ServingRequestError, UnreachableServerError, ssl_channel_credentials
from electra_tf.serving.grpc_transport import (
    NOT_SERVING, SERVICE_UNKNOWN, SERVING, HealthCheckRequest, HealthCheckResponse, TransportError, check_socket_path,
    parse_channel_arguments, read_ssl_config)
from electra_tf.serving.server import ModelServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for localhost and 127.0.0.1 and a client certificate, both
    signed by the CA, and a second, unrelated key."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=test CA", cwd=d)
    with open(d / "san.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                "-subj", f"/CN={'localhost' if who == 'server' else 'a client'}", cwd=d)
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{who}.pem", "-days", "2", *(["-extfile", "san.ext"] if who == "server" else []), cwd=d)
    openssl("genrsa", "-out", "other.key", "2048", cwd=d)
    return d


def ssl_config_text(pki, client_verify=True, key="server.key", extra=""):
    def pem(name):
        return (pki / name).read_text().replace("\n", "\\n")
    return (f'server_key: "{pem(key)}"\nserver_cert: "{pem("server.pem")}"\n'
            f'client_verify: {str(client_verify).lower()}\n{extra}custom_ca: "{pem("ca.pem")}"\n')


def ssl_config(pki, path, **kwargs):
    with open(path, "w") as f:
        f.write(ssl_config_text(pki, **kwargs))
    return str(path)


def health(target, service, credentials=None):
    options = [("grpc.ssl_target_name_override", "localhost")]
    channel = grpc.secure_channel(target, credentials, options) if credentials else grpc.insecure_channel(target)
    with channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=HealthCheckRequest.SerializeToString,
                                    response_deserializer=HealthCheckResponse.FromString)
        return check(HealthCheckRequest(service=service), timeout=10).status


def test_channel_arguments_read_as_tf_serving_passes_them():
    assert parse_channel_arguments("") == []
    assert parse_channel_arguments("grpc.max_connection_age_ms=2000,grpc.primary_user_agent=me") == [
        ("grpc.max_connection_age_ms", 2000), ("grpc.primary_user_agent", "me")]
    # absl's SimpleAtoi into an int32: blanks and a sign are a number, 2^31 and 1_000 are text
    assert parse_channel_arguments("a= -7 ,b=2147483648,c=1_000,d=") == [("a", -7), ("b", "2147483648"),
                                                                         ("c", "1_000"), ("d", "")]
    for bad, entry in (("grpc.keepalive_time_ms", "grpc.keepalive_time_ms"), ("=5", "=5"), ("a=1,,b", "b")):
        with pytest.raises(TransportError, match=f"'{entry}' is not key=value"):
            parse_channel_arguments(bad)


def test_a_socket_path_is_refused_unless_free_or_left_by_a_dead_server(tmp_path):
    assert check_socket_path(str(tmp_path / "new.sock")) == str(tmp_path / "new.sock")
    with pytest.raises(TransportError, match="does not exist"):
        check_socket_path(str(tmp_path / "no" / "x.sock"))
    with pytest.raises(TransportError, match="at most 107 bytes"):
        check_socket_path(str(tmp_path / ("x" * 120)))
    (tmp_path / "file").write_text("kept")
    with pytest.raises(TransportError, match="is a file, not a socket"):
        check_socket_path(str(tmp_path / "file"))
    os.symlink(tmp_path / "elsewhere.sock", tmp_path / "link")
    with pytest.raises(TransportError, match="is a link, not a socket"):
        check_socket_path(str(tmp_path / "link"))
    with pytest.raises(TransportError, match="is a folder"):
        check_socket_path(str(tmp_path))
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(tmp_path / "live.sock"))
    live.listen()
    with pytest.raises(TransportError, match="another server listens on"):
        check_socket_path(str(tmp_path / "live.sock"))
    live.close()  # the file stays, nothing answers: a dead server's socket
    assert os.path.exists(tmp_path / "live.sock")
    assert check_socket_path(str(tmp_path / "live.sock")).endswith("live.sock")
    assert (tmp_path / "file").read_text() == "kept"


def test_ssl_configs_that_cannot_serve_are_refused_naming_the_fault(pki, tmp_path):
    good = read_ssl_config(ssl_config(pki, tmp_path / "good.config"))
    assert good.client_verify and good.server_cert.startswith("-----BEGIN CERTIFICATE-----")
    cases = {
        ssl_config(pki, tmp_path / "mismatch", key="other.key"): "not a PEM private key and the PEM certificate",
        ssl_config(pki, tmp_path / "unknown", extra="ca_file: 1\n"): "is not a text SSLConfig proto",
    }
    (tmp_path / "empty").write_text("")
    cases[str(tmp_path / "empty")] = "has no server_key and no server_cert"
    (tmp_path / "noca").write_text(open(ssl_config(pki, tmp_path / "x"), encoding="utf-8").read().replace(
        "custom_ca", "# custom_ca"))
    cases[str(tmp_path / "noca")] = "client_verify: true but no custom_ca"
    (tmp_path / "badca").write_text(ssl_config_text(pki).split("custom_ca")[0]
                                    + 'custom_ca: "-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----\\n"')
    cases[str(tmp_path / "badca")] = "custom_ca is not a PEM certificate"
    (tmp_path / "latin1").write_bytes(b'server_key: "\xe9"')
    cases[str(tmp_path / "latin1")] = "is not UTF-8"
    for path, words in cases.items():
        with pytest.raises(TransportError, match=words):
            read_ssl_config(path)


def test_tls_with_client_certificates_a_unix_socket_arguments_and_health(pki, tmp_path, model_base):
    sock = str(tmp_path / "g.sock")
    config = read_ssl_config(ssl_config(pki, tmp_path / "ssl.config"))
    server = ModelServer(model_base, rest_port=None, ssl=config, grpc_socket_path=sock, enable_grpc_healthcheck=True,
                         grpc_channel_arguments=[("grpc.max_receive_message_length", 4096)])
    trusted = ssl_channel_credentials(str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key"))
    inputs = {"text": np.array([b"a"]), "text_pair": np.array([b""])}
    with server:
        target = f"127.0.0.1:{server.grpc_port}"
        for host, port in (("localhost", server.grpc_port), (f"unix:{sock}", None)):
            with GrpcClient(host, port, "tiny", timeout=20, credentials=trusted, ssl_target_name="localhost") as c:
                assert c.predict(inputs)["label"].tolist() == [b"positive"]
                # the operator's argument replaced the server's own message limit
                with pytest.raises(ServingRequestError) as refused:
                    c.predict({"text": np.array([b"x" * 5000]), "text_pair": np.array([b""])})
                assert refused.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        # no client certificate, an untrusted CA, or no TLS at all: no answer
        for credentials in (ssl_channel_credentials(str(pki / "ca.pem")), ssl_channel_credentials(str(pki / "server.pem")),
                            None):
            with GrpcClient("localhost", server.grpc_port, "tiny", timeout=5, credentials=credentials) as c:
                with pytest.raises(UnreachableServerError):
                    c.predict(inputs)
        assert {name: health(target, name, trusted) for name in ("", "ModelService", "PredictionService")} == {
            "": SERVING, "ModelService": SERVING, "PredictionService": SERVING}
        with pytest.raises(grpc.RpcError) as unknown:
            health(target, "tensorflow.serving.Nothing", trusted)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert server.health.Check(HealthCheckRequest(service=""), None).status == NOT_SERVING
    assert not os.path.exists(sock)  # gRPC removes its socket when it stops


def test_health_watch_streams_each_change_ends_when_the_server_stops_and_is_capped(model_base):
    """Watch as gRPC's own health service answers it: the status at once and at each change,
    SERVICE_UNKNOWN for another name; at most a quarter of the 8 gRPC threads (2) watch at once,
    a third watcher is refused until one leaves; predictions are answered meanwhile; stopping the
    server sends NOT_SERVING and ends the stream."""
    import time

    server = ModelServer(model_base, rest_port=None, enable_grpc_healthcheck=True, grpc_threads=8)
    with server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                     request_serializer=HealthCheckRequest.SerializeToString,
                                     response_deserializer=HealthCheckResponse.FromString)
        stream = watch(HealthCheckRequest(service="PredictionService"), timeout=60)
        assert next(stream).status == SERVING
        unknown = watch(HealthCheckRequest(service="tensorflow.serving.Nothing"), timeout=60)
        assert next(unknown).status == SERVICE_UNKNOWN
        with pytest.raises(grpc.RpcError) as refused:
            next(watch(HealthCheckRequest(service=""), timeout=60))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 health watcher(s) at most" in refused.value.details()
        with GrpcClient("127.0.0.1", server.grpc_port, "tiny", timeout=20) as c:
            np.testing.assert_array_equal(c.predict({"ids": np.array([3], np.int32)}, "lookup")["value"], [4.0])
        unknown.cancel()  # its place is free again once its handler has returned
        deadline = time.monotonic() + 10
        while True:
            third = watch(HealthCheckRequest(service=""), timeout=60)
            try:
                assert next(third).status == SERVING
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.05)
        server.health.set_serving(False)
        assert next(stream).status == NOT_SERVING and next(third).status == NOT_SERVING
        server.health.set_serving(True)
        assert next(stream).status == SERVING
    assert [r.status for r in stream] == [NOT_SERVING]  # the last message, then the stream ends
    channel.close()
    # A server of fewer than 4 gRPC threads keeps them all for requests: Watch refused, Check answers.
    with ModelServer(model_base, rest_port=None, enable_grpc_healthcheck=True, grpc_threads=3) as small:
        with grpc.insecure_channel(f"127.0.0.1:{small.grpc_port}") as channel:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                         request_serializer=HealthCheckRequest.SerializeToString,
                                         response_deserializer=HealthCheckResponse.FromString)
            with pytest.raises(grpc.RpcError) as refused:
                next(watch(HealthCheckRequest(service=""), timeout=60))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert health(f"127.0.0.1:{small.grpc_port}", "") == SERVING


def test_health_is_off_unless_asked_and_the_socket_serves_plain_grpc(tmp_path, model_base):
    """Also TF Serving's --enable_serialization_as_tensor_content (numbers as bytes) on that server."""
    from tensorflow_serving.apis import predict_pb2

    sock = str(tmp_path / "plain.sock")
    with ModelServer(model_base, rest_port=None, grpc_port=None, grpc_socket_path=sock, tensor_content=True) as server:
        assert server.grpc_port is None
        with GrpcClient(f"unix:{sock}", None, "tiny", timeout=20) as c:
            assert c.status()["model_version_status"][0]["state"] == "AVAILABLE"
            np.testing.assert_array_equal(c.predict({"ids": np.array([3, 0], np.int32)}, "lookup")["value"], [4.0, 1.0])
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.signature_name = "tiny", "lookup"
            ids = request.inputs["ids"]
            ids.dtype = 3  # DT_INT32
            ids.tensor_shape.dim.add(size=2)
            ids.int_val.extend([3, 0])
            call = c.channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                                         request_serializer=predict_pb2.PredictRequest.SerializeToString,
                                         response_deserializer=predict_pb2.PredictResponse.FromString)
            value = call(request, timeout=20).outputs["value"]
            assert not value.float_val and value.tensor_content == np.array([4.0, 1.0], "<f4").tobytes()
        with pytest.raises(grpc.RpcError) as off:
            health(f"unix:{sock}", "")
        assert off.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # a second server on the same socket is refused, and the first keeps its socket
        with pytest.raises(TransportError, match="another server listens on"):
            ModelServer(model_base, rest_port=None, grpc_port=None, grpc_socket_path=sock).start()
        with GrpcClient(f"unix:{sock}", None, "tiny", timeout=20) as c:
            assert c.status()["model_version_status"][0]["state"] == "AVAILABLE"


@pytest.mark.multiprocess
def test_the_binaries_serve_and_call_over_tls_on_a_socket_and_refuse_bad_values_in_one_line(pki, tmp_path, model_base):
    """Also TF Serving's load and session flags on the same server (serving.manager.LoadOptions)."""
    (tmp_path / "file").write_text("kept")
    (tmp_path / "session.config").write_text("allow_soft_placement: true\nintra_op_parallelism_threads: 3\n"
                                             "operation_timeout_in_ms: 100\n")
    (tmp_path / "bad_session.config").write_text("intra_op_parallelism: 3\n")
    bad = {  # flags: the line's words
        ("--grpc_channel_arguments=grpc.keepalive_time_ms",): "--grpc_channel_arguments: 'grpc.keepalive_time_ms' is"
                                                              " not key=value",
        (f"--grpc_socket_path={tmp_path}/no/g.sock",): "--grpc_socket_path",
        (f"--grpc_socket_path={tmp_path}/file",): "is a file, not a socket",
        (f"--ssl_config_file={tmp_path}/none",): "No such file or directory",
        (f"--ssl_config_file={ssl_config(pki, tmp_path / 'mismatch', key='other.key')}",): "not a PEM private key",
        # read once TensorFlow is imported (its ConfigProto), still before any model loads
        (f"--tensorflow_session_config_file={tmp_path}/bad_session.config",): "is not a text ConfigProto: 1:1 :"
                                                                              " Message type",
    }
    commands = [[sys.executable, "-X", "importtime", "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}",
                 *flags] for flags in bad]
    procs = [subprocess.Popen(c, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    sock = str(tmp_path / "s.sock")
    server = subprocess.Popen(
        [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}", "--rest_api_port=0",
         "--port=0", f"--grpc_socket_path={sock}", f"--ssl_config_file={ssl_config(pki, tmp_path / 'ssl.config')}",
         "--enable_grpc_healthcheck_service", f"--tensorflow_session_config_file={tmp_path}/session.config",
         "--tensorflow_session_parallelism=1", "--saved_model_tags=serve", "--num_load_threads=2",
         "--max_num_load_retries=0", "--enable_batching", "--enable_per_model_batching_parameters"], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        for flags, proc in zip(bad, procs):
            _, err = proc.communicate(timeout=120)
            lines = [line for line in err.splitlines() if not line.startswith("import time:")]
            if "session" in flags[0]:  # TensorFlow's own start-up lines come before it
                assert "Traceback" not in err, err[-2000:]
                lines = lines[-1:]
            assert proc.returncode == 1 and len(lines) == 1, (flags, err[-2000:])
            assert lines[0].startswith("electra-serve: error: ") and bad[flags] in lines[0], (flags, lines)
            if "session" not in flags[0]:
                assert not re.search(r"\| +tensorflow$", err, re.M), (flags, "TensorFlow was imported")
        assert (tmp_path / "file").read_text() == "kept"
        log = []
        for line in server.stdout:
            log.append(line)
            if "gRPC also on the UNIX socket" in line:
                break
        log = "".join(log)
        assert "TensorFlow threads: 1 per op, 1 inter-op" in log, log[-3000:]
        assert "intra_op_parallelism_threads is replaced by the parallelism flags" in log, log[-3000:]
        assert "not applied here (no session in TensorFlow 2): operation_timeout_in_ms" in log, log[-3000:]
        assert "applied ['allow_soft_placement']" in log, log[-3000:]
        assert "tiny version 1: not batched (no batching_params.pbtxt in its folder)" in log, log[-3000:]
        client = [sys.executable, "-m", "electra_tf.tools.client", f"--server=unix:{sock}", "--protocol=grpc",
                  "--model_name=tiny", "--signature_name=single_text", "--text=a", "--ssl_target_name=localhost", f"--ssl_ca_file={pki}/ca.pem"]
        answered = subprocess.run(client + [f"--ssl_cert_file={pki}/client.pem", f"--ssl_key_file={pki}/client.key"],
                                  cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
        assert answered.returncode == 0 and '"label": "positive"' in answered.stdout, answered.stderr[-2000:]
        refused = subprocess.run(client, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 1 and len(lines) == 1, refused.stderr[-2000:]
        assert lines[0].startswith(f"electra-client: error: gRPC server at unix:{sock}: "), lines
        assert health(f"unix:{sock}", "PredictionService",
                      ssl_channel_credentials(str(pki / "ca.pem"), str(pki / "client.pem"), str(pki / "client.key"))
                      ) == SERVING
    finally:
        server.terminate()
        server.wait(60)
