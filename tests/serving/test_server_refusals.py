"""What electra-serve, electra-client and generate_models_config refuse, and what the server rides out.

Refusals run the real binaries: one line on stderr naming the flag or file, exit 1, no traceback,
and (for the server) before TensorFlow or any model loads, so each costs well under a second. The
server's own behaviour is tested against real sockets and folders: version folder names, a base
path renamed away and back under a running `electra-serve`, and the connection cap with idle
keep-alive connections.
"""

import http.client
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from electra_tf.serving import model_config
from electra_tf.serving.client import GrpcClient, RestClient, UnreachableServerError
from electra_tf.serving.versions import list_versions as _list_versions, version_of
from electra_tf.serving.server import ModelServer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
STATUS_REQUEST = b"GET /v1/models/tiny HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def run_all(commands: list[list[str]], timeout: float = 120) -> list[subprocess.CompletedProcess]:
    """Run the commands at once (each is a fresh interpreter, mostly idle) and wait for all."""
    procs = [subprocess.Popen(c, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    results = []
    for command, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    return results


def assert_one_line(result: subprocess.CompletedProcess, prefix: str, *words: str) -> str:
    """The run failed with exit 1 and one line on stderr that starts with `prefix` and holds `words`."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, (result.args, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(prefix), (result.args, result.stderr[-2000:])
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def serve(*flags: str) -> list[str]:
    return [sys.executable, "-m", "electra_tf.tools.serve", *flags]


# ----------------------------------------------------------------------------- electra-serve refusals


def test_malformed_models_config_files_are_one_line_naming_the_file_and_the_fault(tmp_path, model_base):
    def config(body: str) -> str:
        return "model_config_list { " + body + " }"

    good = f'name: "tiny" base_path: "{model_base}"'
    cases = {  # file name: (content, words the line must hold)
        "empty": (b"", ["no model_config_list"]),
        "garbage": (bytes(range(256)) * 4, ["not UTF-8 text", "byte 0x80 at offset 128"]),
        "nul_bytes": (b"\x00\x01\x02model", ["line 1 column 1", "Expected identifier"]),
        "syntax": (config("config { " + good).encode(), ["does not parse", 'Expected "}"']),
        "unknown_field": (config("config { " + good + " colour: 3 }").encode(), ['no field named "colour"']),
        "no_name": (config(f'config {{ base_path: "{model_base}" }}').encode(), ["config[0]", "no name"]),
        "no_base_path": (config('config { name: "tiny" }').encode(), ["config[0]", "base_path of model 'tiny': missing"]),
        "same_name": (config(f"config {{ {good} }} config {{ {good} }}").encode(), ["duplicate model names ['tiny']"]),
        "relative": (config('config { name: "tiny" base_path: "models/tiny" }').encode(), ["must be absolute"]),
        "not_int64": (config("config { " + good + " model_version_policy { specific { versions: 9223372036854775808 } } }").encode(),
                      ["line 1", "Value out of range"]),
        "negative": (config("config { " + good + " model_version_policy { specific { versions: -2 } } }").encode(),
                     ["versions of model 'tiny': [-2] are not versions"]),
        "label": (config("config { " + good + " model_version_policy { specific { versions: 1 } }"
                         ' version_labels { key: "stable" value: 2 } }').encode(),
                  ["label 'stable' names version 2", "'specific' policy [1] never serves"]),
        "latin1": (config('config { name: "caf\xe9" base_path: "/m" }').encode("latin-1"), ["not UTF-8 text", "byte 0xe9"]),
        "missing_base": (config(f'config {{ name: "tiny" base_path: "{tmp_path}/nowhere" }}').encode(),
                         [f"base_path of model 'tiny': {tmp_path}/nowhere does not exist"]),
    }
    for name, (content, _) in cases.items():
        (tmp_path / f"{name}.config").write_bytes(content)
    commands = [serve(f"--model_config_file={tmp_path / name}.config") for name in cases]
    commands.append(serve(f"--model_config_file={tmp_path}/absent.config"))
    results = run_all(commands)
    for (name, (_, words)), result in zip(cases.items(), results):
        assert_one_line(result, f"electra-serve: error: --model_config_file {tmp_path / name}.config: ", *words)
    assert_one_line(results[-1], f"electra-serve: error: --model_config_file {tmp_path}/absent.config: No such file")
    # Labels on versions the policy serves are kept, and round-trip through the text TF Serving reads.
    labelled = [model_config.ModelConfig("tiny", "/m", "specific", (1, 2), version_labels={"stable": 1, "canary": 2})]
    text = model_config.models_config_text(labelled)
    assert 'key: "canary"' in text and model_config.parse_models_config(text) == labelled


def test_out_of_range_flags_equal_ports_and_a_taken_port_are_refused_before_tensorflow_loads(model_base, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = {  # flags: words the line must hold
            ("--max_body_bytes=0",): "--max_body_bytes must be from 1 to 2147483647",
            ("--max_batch_size=0",): "--max_batch_size must be >= 1",
            ("--rest_idle_timeout_seconds=0",): "--rest_idle_timeout_seconds must be a number of seconds > 0",
            ("--rest_idle_timeout_seconds=inf",): "--rest_idle_timeout_seconds must be",
            ("--rest_max_connections=0",): "--rest_max_connections must be >= 1",
            ("--grpc_threads=0",): "--grpc_threads must be >= 1",
            ("--grpc_max_threads=0",): "--grpc_threads must be >= 1",  # TF Serving's name, an alias
            ("--rest_api_num_threads=-1",): "--rest_api_num_threads must be from 0",
            ("--rest_api_timeout_in_ms=3000000000",): "--rest_api_timeout_in_ms must fit TF Serving's int32",
            ("--model_threads=-1",): "--model_threads must be >= 0 (0: one per core)",
            ("--rest_api_port=99999",): "--rest_api_port must be a port from 0 to 65535",
            ("--port=-1",): "--port must be a port from 0 to 65535",
            ("--file_system_poll_wait_seconds=inf",): "--file_system_poll_wait_seconds must be a finite number",
            ("--rest_api_port=8555", "--port=8555"): "the REST and gRPC ports are both 8555",
            (f"--rest_api_port={port}", "--port=0"): f"REST port {port} on 127.0.0.1 is already in use",
            ("--rest_api_port=0", f"--port={port}"): f"gRPC port {port} on 127.0.0.1 is already in use",
            ("--model_name=a/b",): "--model_name: name: 'a/b' is not a valid model name",
            ("--max_num_load_retries=-1",): "--max_num_load_retries must be from 0 to 2147483647",
            ("--num_load_threads=2147483648",): "--num_load_threads must be from 0 to 2147483647",
            ("--load_retry_interval_micros=-1", "--saved_model_tags=serve,"): "--saved_model_tags must be tags"
                                                                              " separated by commas",
            ("--batching_parameters_file=b.config",): "--batching_parameters_file is set without --enable_batching",
            ("--prefer_tflite_model",): "--prefer_tflite_model: this server loads SavedModels only",
            ("--use_alts_credentials",): "--use_alts_credentials: ALTS is a Google Cloud transport",
            ("--platform_config_file=p.config",): "--platform_config_file: this server serves TensorFlow SavedModels",
            ("--mixed_precision=bfloat16",): "--mixed_precision: models run in the precision they were saved in",
            ("--tensorflow_intra_op_parallelism=1", "--tensorflow_inter_op_parallelism=1",
             "--tensorflow_session_parallelism=1"): "not all three",
        }
        # -X importtime lists every module imported: TensorFlow must not be among them.
        commands = [[sys.executable, "-X", "importtime", "-m", "electra_tf.tools.serve",
                     f"--model_base_path={model_base}", *flags] for flags in cases]
        commands.append(serve(f"--model_base_path={tmp_path}/nowhere"))
        commands.append(serve("--version", "--enable_profiler=false", "--flush_filesystem_caches=false"))
        results = run_all(commands)
    version = results.pop()
    assert version.returncode == 0 and version.stdout.startswith("TensorFlow ModelServer: electra-serve "), version
    assert version.stdout.splitlines()[1].startswith("TensorFlow Library: 2."), version.stdout
    for (flags, words), result in zip(cases.items(), results):
        lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
        assert result.returncode == 1 and len(lines) == 1, (flags, result.stderr[-2000:])
        assert lines[0].startswith("electra-serve: error: ") and words in lines[0], (flags, lines)
        assert not re.search(r"\| +tensorflow$", result.stderr, re.M), (flags, "TensorFlow was imported")
    assert_one_line(results[-1], "electra-serve: error: --model_base_path: ", f"{tmp_path}/nowhere does not exist")


# ----------------------------------------------------------------------------- version folders


def test_only_ascii_digit_names_that_fit_an_int64_are_versions(model_templates, tmp_path):
    assert version_of("12") == 12 and version_of("00012") == 12  # TF Serving's safe_strto64 reads 00012 as 12
    assert version_of(str(2**63 - 1)) == 2**63 - 1
    for name in ("\u0663", "\u00b3", "\uff11", "1\u0663", str(2**63), "9" * 5000, "0", "000", " 12", "-3", "+3", "1.0", ""):
        assert version_of(name) is None, repr(name)

    base = tmp_path / "tiny"
    base.mkdir()
    for name, template in (("1", 1), ("\u0663", 2), ("0002", 2)):  # '٣' is Arabic-Indic 3, not a version
        shutil.copytree(model_templates[template], base / name)
    (base / "9").mkdir()  # being written: no saved_model.pb yet
    (base / "12").write_text("a file, not a folder")
    assert _list_versions(str(base)) == ({1: str(base / "1"), 2: str(base / "0002")}, {9})
    with ModelServer(str(base), grpc_port=None, poll_interval_seconds=0) as server:
        status = RestClient("127.0.0.1", server.rest_port, "tiny").status()
    assert [s["version"] for s in status["model_version_status"]] == ["2"]  # from 0002; nothing for '٣'


# ----------------------------------------------------------------------------- base path renamed away


def _status(port: int) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/v1/models/tiny:predict", body=b'{"instances": [{"text": "a b", "text_pair": ""}]}')
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.slow
def test_a_base_path_renamed_away_and_back_keeps_serving_without_a_reload(model_templates, install_version, tmp_path):
    base = tmp_path / "models" / "tiny"
    install_version(model_templates, str(base), 1)
    poll = 0.5
    proc = subprocess.Popen(
        serve(f"--model_base_path={base}", "--rest_api_port=0", "--port=0", f"--file_system_poll_wait_seconds={poll}"),
        cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not (m := re.search(r"REST API at http://127\.0\.0\.1:(\d+)", "".join(lines))):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        port = int(m.group(1))
        assert _status(port) == 200
        away = tmp_path / "models" / "tiny.away"
        os.rename(base, away)  # a redeploy or a storage hiccup: the base path is gone
        gone_until = time.monotonic() + 3 * poll + 0.5
        while time.monotonic() < gone_until:
            assert _status(port) == 200
            time.sleep(0.1)
        os.rename(away, base)
        time.sleep(2 * poll)
        assert _status(port) == 200
        status = RestClient("127.0.0.1", port, "tiny").status()["model_version_status"]
        assert [(s["version"], s["state"]) for s in status] == [("1", "AVAILABLE")]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)
    log = "".join(lines)
    assert log.count("loading tiny version 1") == 1, log  # loaded once: never unloaded or reloaded
    assert "unloading" not in log, log
    assert log.count("cannot list the base path of model 'tiny'") == 1, log  # once per outage, not per poll
    assert "keeping the loaded versions [1]" in log and "the base path of model 'tiny' is back" in log, log


# ----------------------------------------------------------------------------- connection cap


def _kept_alive(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(STATUS_REQUEST)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        data += sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 200") and b"connection: close" not in data.lower()
    return sock


def _closed_by_server(sock: socket.socket, seconds: float = 5.0) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_at_the_cap_make_room_for_a_new_client_oldest_first(model_base):
    with ModelServer(model_base, grpc_port=None, rest_max_connections=8) as server:
        port = server.rest_port
        idle = [_kept_alive(port) for _ in range(8)]  # the cap, every one idle after its answer
        try:
            time.sleep(0.3)  # idle for a moment, as kept-alive clients are
            start = time.monotonic()
            newcomer = _kept_alive(port)
            assert time.monotonic() - start < 2  # not the 30 s idle timeout
            assert _closed_by_server(idle[0])  # the longest idle made room
            for sock in idle[1:]:
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):  # still open, nothing to read
                    sock.recv(1)
                sock.setblocking(True)
            idle[1].sendall(STATUS_REQUEST)  # an idle survivor still serves; the newcomer is now the oldest idle
            assert idle[1].recv(65536).startswith(b"HTTP/1.1 200")
            _kept_alive(port).close()
            assert _closed_by_server(idle[2])
            newcomer.close()
            # Connections that connected and sent nothing are idle too, after a grace for their
            # first request to arrive.
            for sock in idle:
                sock.close()
            silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
            time.sleep(1.5)
            _kept_alive(port).close()
            readable, _, _ = select.select(silent, [], [], 5)  # a closed one reads as end of file
            assert len(readable) == 1 and readable[0].recv(1) == b""
            for sock in silent:
                sock.close()
        finally:
            for sock in idle:
                sock.close()


# ----------------------------------------------------------------------------- electra-client


def _closing_server() -> socket.socket:
    """A listening socket whose connections are closed as soon as they are accepted."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def accept_and_close():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.close()

    threading.Thread(target=accept_and_close, daemon=True).start()
    return listener


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_client_against_no_server_a_silent_one_and_a_closing_one_is_one_line(tmp_path):
    closed = _free_port()
    with _closing_server() as closing, socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog and are never answered
        cases = {  # (server, protocol, extra flags): words
            (f"127.0.0.1:{closed}", "rest", ()): "Connection refused",
            (f"127.0.0.1:{closing.getsockname()[1]}", "rest", ()): "(Connection reset|closed the connection)",
            (f"127.0.0.1:{silent.getsockname()[1]}", "rest", ("--timeout_seconds=1",)): "no answer within 1 s",
            ("no-such-host.invalid:8501", "rest", ()): "",
        }
        commands = [[sys.executable, "-m", "electra_tf.tools.client", f"--server={server}", f"--protocol={protocol}",
                     "--model_name=tiny", "--text=a b", *extra] for server, protocol, extra in cases]
        commands.append([sys.executable, "-m", "electra_tf.tools.client", "--server=127.0.0.1:\u0663", "--text=x"])
        commands.append([sys.executable, "-m", "electra_tf.tools.client", "--text=x", "--model_version=1",
                         "--model_version_label=stable"])
        results = run_all(commands)
        for ((server, protocol, _), words), result in zip(cases.items(), results):
            what = "REST" if protocol == "rest" else "gRPC"
            lines = [l for l in result.stderr.splitlines() if not re.match(r"[IWE]0000|WARNING: All log", l)]
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
            assert lines[-1].startswith(f"electra-client: error: {what} server at {server}: "), lines
            assert re.search(words, lines[-1]) and len(lines[-1]) < 400, lines
        assert_one_line(results[-2], "electra-client: error: --server must be host:port with a port from 1 to 65535")
        assert_one_line(results[-1], "electra-client: error: give --model_version or --model_version_label, not both")

        # gRPC (in process: its binary run costs a TensorFlow import, and its except clause is
        # the one the REST runs above pass through): nothing listening, a server that drops the
        # connection, one that never answers.
        for port, words in ((closed, "Connection refused"), (closing.getsockname()[1], "(Connection reset|Socket closed)"),
                            (silent.getsockname()[1], "no answer within 1 s")):
            with GrpcClient("127.0.0.1", port, "tiny", timeout=1) as client:
                with pytest.raises(UnreachableServerError) as e:
                    client.status()
            assert re.search(words, e.value.message) and "\n" not in e.value.message, e.value.message

    # The REST client pointed at a gRPC port (HTTP/2 frames come back): said so, not the frames'
    # bytes as text.
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(UnreachableServerError) as e:
            RestClient("127.0.0.1", port, "tiny", timeout=5).status()
    finally:
        server.stop(None)
    assert e.value.message == "the answer is not HTTP/1.1: is this a gRPC port? The REST API speaks HTTP/1.1"


# ----------------------------------------------------------------------------- generate_models_config


def test_generate_models_config_refuses_bad_model_values_in_one_line(tmp_path):
    bad = {
        "a:/m:latestx": "POLICY 'latestx' is not latest",
        "a:/m:1,,2": "POLICY '1,,2' is not latest",
        "a:/m:\u0663": "POLICY '\u0663' is not latest",
        "a:/m:99999999999999999999": "is not latest, latestN, all or comma-separated versions",
        "a:/m:latest0": "num_versions of model 'a': must be an integer from 1",
        "a:/m:0": "[0] are not versions",
        "a/b:/m": "name: 'a/b' is not a valid model name",
        "a:models/a": "must be absolute",
        "a": "expected NAME:BASE_PATH[:POLICY]",
    }
    module = [sys.executable, "-m", "electra_tf.tools.generate_models_config"]
    output = tmp_path / "models.config"
    target = tmp_path / "elsewhere.txt"
    target.write_text("not to be written through")
    output.symlink_to(target)
    results = run_all([module + [f"--model={value}"] for value in bad]
                      + [module + ["--model=a:/m:1,2", "--model=b:/n:latest2", f"--output={output}"]])
    for (value, words), result in zip(bad.items(), results):
        assert_one_line(result, "electra-generate-models-config: error: ", words)
    assert results[-1].returncode == 0, results[-1].stderr
    assert target.read_text() == "not to be written through" and not output.is_symlink()
    assert "versions: 2" in output.read_text() and "num_versions: 2" in output.read_text()
