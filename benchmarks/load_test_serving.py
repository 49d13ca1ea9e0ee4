"""The REST server under load: a lone client's latency against N clients sending good and bad requests.

  python -m benchmarks.load_test_serving [--clients=8] [--seconds=60] [--bad_fraction=0.25] [--modes=unbatched,batched]
  python -m benchmarks.load_test_serving --server=127.0.0.1:8501 --model_name=electra --max_body_bytes=16777216
  python -m benchmarks.load_test_serving --phases=memory --memory_clients=4 --max_body_bytes=16777216 --modes=unbatched

Without --server, the model is benchmarks.benchmark_serving's ELECTRA-Small classifier
(benchmarks/serving_bench_model.py: random weights, raw-text `serving_default` tokenized in-graph,
max_seq_length 128), or --model_base_path;
for each of --modes an `electra-serve` child process is started on it (so that the clients here
do not share the server's interpreter): `unbatched` (one model call per request, --model_threads
at once) and `batched` (--enable_batching, with --batching_parameters_file if given, else TF
Serving's defaults: batches of up to 1000 formed from whatever is queued when one of the
num_batch_threads = cores threads is free). With --server, that server is measured once as it is.

Per mode, two phases of POST :predict requests on keep-alive connections:

1. lone: one client sends good requests (one Rotten Tomatoes sentence each) for --lone_seconds.
2. loaded: --clients clients for --seconds, each request bad with probability --bad_fraction,
   the bad ones spread evenly over malformed JSON, a wrong type, an unknown input and a body
   over --max_body_bytes (413).

It prints p50/p99 of the good requests in both phases, good requests per second, the count of
each HTTP status (with the bad kinds apart), and loaded p99 over lone p99 (and over lone p50,
which a busy machine disturbs less). The goal the server is held to: no 5xx, and a loaded good
p99 within 5x the lone p99. Clients are closed-loop (each sends its next request when its last
is answered), so by Little's law a loaded request takes about clients / throughput: the ratio
stays small only if the server answers many more requests per second under load than one at a
time, which on a machine that one request already keeps busy is what batching is for.

`--phases=memory` (with or instead of `latency`) measures what maximal requests cost the server's
memory: for each kind of body in `MemoryBodies` (a body of exactly --max_body_bytes made of many
tiny inputs, of nested empty lists, or of one long text; gRPC messages of many tiny inputs or one
long text, just under that size), --memory_clients clients send one at once, and the server's RSS
is printed before, at its peak while they are answered (VmHWM, reset before each kind), and
after (once the answers are in and --memory_settle_seconds have passed). The server's pid is
the child's, or --server_pid with --server.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from absl import app, flags

from electra_tf import cli

_SERVER = flags.DEFINE_string("server", None, "host:port of a running REST server (default: start one per mode).")
_MODEL_NAME = flags.DEFINE_string("model_name", "electra_small", "Served model name.")
_MODEL_BASE_PATH = flags.DEFINE_string("model_base_path", None, "BASE/NAME of an export with string inputs "
                                       "(default: export the ELECTRA-Small classifier).")
_CLIENTS = flags.DEFINE_integer("clients", 8, "Concurrent clients in the loaded phase.")
_SECONDS = flags.DEFINE_float("seconds", 60.0, "Length of the loaded phase.")
_LONE_SECONDS = flags.DEFINE_float("lone_seconds", 30.0, "Length of the lone-client phase.")
_BAD_FRACTION = flags.DEFINE_float("bad_fraction", 0.25, "Share of bad requests in the loaded phase.")
_MAX_BODY = flags.DEFINE_integer("max_body_bytes", 1 << 20, "The server's body limit: oversize bodies are 1 byte over "
                                 "(passed to the servers started here).")
_MODES = flags.DEFINE_list("modes", ["unbatched", "batched"], "Servers to start: unbatched, batched.")
_MODEL_THREADS = flags.DEFINE_integer("model_threads", None, "--model_threads of the unbatched server.")
_BATCHING_FILE = flags.DEFINE_string("batching_parameters_file", None, "For the batched server (default: TF Serving's defaults).")
_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab for the export (default: made from Rotten Tomatoes).")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Scratch directory (default: a temp dir).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the request mix.")
_PHASES = flags.DEFINE_list("phases", ["latency"], "What to measure: latency (lone and loaded clients), memory "
                            "(maximal bodies at once, the server's RSS).")
_MEMORY_CLIENTS = flags.DEFINE_integer("memory_clients", 4, "Clients sending a maximal body at once in the memory phase.")
_MEMORY_ROUNDS = flags.DEFINE_integer("memory_rounds", 1, "Times the memory phase sends every kind (a second round tells a "
                                     "one-time cost, such as the model's first call at a new shape, from a leak).")
_MEMORY_SETTLE = flags.DEFINE_float("memory_settle_seconds", 2.0, "Wait after the answers before reading the RSS 'after'.")
_MAX_BATCH = flags.DEFINE_integer("max_batch_size", 1024, "The server's --max_batch_size (passed to the servers started here).")
_SERVER_PID = flags.DEFINE_integer("server_pid", None, "With --server and --phases=memory: the server's process id.")
_GRPC_SERVER = flags.DEFINE_string("grpc_server", None, "With --server and --phases=memory: host:port of its gRPC API.")

BAD_KINDS = ("malformed JSON", "wrong type", "unknown input", "oversize")


class Requests:
    """Good and bad :predict bodies for a signature whose inputs are all strings."""

    def __init__(self, input_names: list[str], sentences: list[str], max_body_bytes: int):
        self.names, self.sentences, self.max_body_bytes = input_names, sentences, max_body_bytes

    def good(self, rng: random.Random) -> bytes:
        return json.dumps({"inputs": {n: [rng.choice(self.sentences)] for n in self.names}}).encode()

    def bad(self, kind: str, rng: random.Random) -> bytes:
        if kind == "malformed JSON":
            return self.good(rng)[:-7]
        if kind == "wrong type":
            return json.dumps({"inputs": {n: [rng.randrange(100)] for n in self.names}}).encode()
        if kind == "unknown input":
            return json.dumps({"inputs": {n + "_typo": [rng.choice(self.sentences)] for n in self.names}}).encode()
        return b'{"inputs": "' + b"x" * self.max_body_bytes + b'"}'  # oversize


class Phase:
    """What the clients of one phase saw."""

    def __init__(self):
        self.good_seconds: list[float] = []
        self.statuses: collections.Counter = collections.Counter()  # (kind, status) -> count
        self.wall = 0.0
        self.lock = threading.Lock()

    def record(self, kind: str, status, seconds: float) -> None:
        with self.lock:
            self.statuses[(kind, status)] += 1
            if kind == "good" and status == 200:
                self.good_seconds.append(seconds)

    def percentile_ms(self, q: float) -> float:
        return 1e3 * float(np.percentile(self.good_seconds, q)) if self.good_seconds else float("nan")

    def server_errors(self) -> int:
        return sum(n for (_, status), n in self.statuses.items() if not isinstance(status, int) or status >= 500)


def run_phase(host: str, port: int, path: str, requests: Requests, clients: int, seconds: float,
              bad_fraction: float, seed: int) -> Phase:
    phase, stop = Phase(), threading.Event()

    def client(index: int):
        rng = random.Random(seed * 1000 + index)
        connection = http.client.HTTPConnection(host, port, timeout=120)
        while not stop.is_set():
            kind = rng.choice(BAD_KINDS) if rng.random() < bad_fraction else "good"
            body = requests.good(rng) if kind == "good" else requests.bad(kind, rng)
            start = time.perf_counter()
            try:
                connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as e:
                connection.close()
                status = type(e).__name__
            phase.record(kind, status, time.perf_counter() - start)
        connection.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    phase.wall = time.perf_counter() - start
    return phase


# ----------------------------------------------------------------------------- memory


class MemoryBodies:
    """Requests of exactly `max_body_bytes` for a signature whose inputs are all strings, by kind:
    what a client can send within the limits and what each costs the server to refuse or answer.

    REST bodies are JSON; gRPC ones serialized PredictRequests (`max_body_bytes` is also the
    server's gRPC message limit, so they are cut a few hundred bytes short of it for the framing).
    """

    def __init__(self, input_names: list[str], model_name: str, max_body_bytes: int, max_batch_size: int):
        self.names, self.model_name = input_names, model_name
        self.max_body_bytes, self.max_batch_size = max_body_bytes, max_batch_size

    def _json(self, value_of_input) -> bytes:
        return json.dumps({"inputs": {n: value_of_input for n in self.names}}, separators=(",", ":")).encode()

    def _largest(self, make) -> bytes:
        """make(n) for the largest n whose body fits the limit, padded to it with spaces (JSON
        allows whitespace after the value)."""
        low, high = 0, self.max_body_bytes
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if len(make(middle)) <= self.max_body_bytes else (low, middle - 1)
        body = make(low)
        return body + b" " * (self.max_body_bytes - len(body))

    def rest(self) -> dict[str, bytes]:
        def text(length: int) -> str:
            return ("the film was great . " * (length // 21 + 1))[:length]

        return {
            "REST many tiny inputs": self._largest(lambda n: self._json(["ab"] * n)),
            "REST nested empty lists": self._largest(lambda n: self._json([[]] * n)),
            "REST one long text": self._largest(lambda n: self._json([text(n)])),
        }

    def grpc(self) -> dict[str, bytes]:
        from tensorflow.core.framework import types_pb2
        from tensorflow_serving.apis import predict_pb2

        limit = self.max_body_bytes - 256

        def request(strings: list[bytes]) -> bytes:
            message = predict_pb2.PredictRequest(model_spec={"name": self.model_name})
            for name in self.names:
                message.inputs[name].dtype = types_pb2.DT_STRING
                message.inputs[name].tensor_shape.dim.add(size=len(strings))
                message.inputs[name].string_val.extend(strings)
            return message.SerializeToString()

        per_input = limit // len(self.names)
        return {
            "gRPC many tiny inputs": request([b"ab"] * (per_input // 4)),  # 4 bytes each: tag, length, "ab"
            "gRPC one long text": request([(b"the film was great . " * (per_input // 21 + 1))[: per_input - 16]]),
        }


def _rss_mib(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def _reset_peak(pid: int) -> None:
    """VmHWM := the current RSS (Linux 4.0+: writing 5 to clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def run_memory(pid: int, rest: tuple[str, int], grpc_target: str | None, path: str, bodies: MemoryBodies,
               clients: int, settle_seconds: float, rounds: int = 1) -> None:
    """Sends each kind of maximal request from `clients` clients at once, `rounds` times over;
    prints the server's RSS."""
    kinds: list[tuple[str, bytes, str]] = [(k, b, "rest") for k, b in bodies.rest().items()]
    if grpc_target:
        kinds += [(k, b, "grpc") for k, b in bodies.grpc().items()]
    kinds *= rounds
    print(f"memory: {clients} clients at once, each request {bodies.max_body_bytes} bytes"
          f" (max_batch_size {bodies.max_batch_size}); server RSS in MiB, peak = VmHWM while they are answered")
    print(f"{'kind':<28} {'bytes':>9} {'before':>7} {'peak':>7} {'after':>7} {'seconds':>8}   answers")
    start_rss = _rss_mib(pid)
    for kind, body, protocol in kinds:
        statuses: collections.Counter = collections.Counter()
        lock, barrier = threading.Lock(), threading.Barrier(clients)

        def client():
            if protocol == "rest":
                connection = http.client.HTTPConnection(*rest, timeout=300)
                barrier.wait()
                try:
                    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                    response = connection.getresponse()
                    answer = json.loads(response.read() or b"{}")
                    status = f"{response.status}" + (f" ({answer['error'][:60]})" if "error" in answer else "")
                except (OSError, http.client.HTTPException, ValueError) as e:
                    status = type(e).__name__
                finally:
                    connection.close()
            else:
                import grpc

                with grpc.insecure_channel(grpc_target, options=[("grpc.max_send_message_length", -1),
                                                                 ("grpc.max_receive_message_length", -1)]) as channel:
                    call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
                    barrier.wait()
                    try:
                        call(body, timeout=300)
                        status = "OK"
                    except grpc.RpcError as e:
                        status = f"{e.code().name} ({(e.details() or '')[:60]})"
            with lock:
                statuses[status] += 1

        time.sleep(settle_seconds)
        before = _rss_mib(pid)
        _reset_peak(pid)
        threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - start  # until the last client had its answer
        peak = _rss_mib(pid, "VmHWM")
        time.sleep(settle_seconds)
        after = _rss_mib(pid)
        answers = "; ".join(f"{n} x {s}" for s, n in sorted(statuses.items()))
        print(f"{kind:<28} {len(body):>9} {before:>7.0f} {peak:>7.0f} {after:>7.0f} {seconds:>8.1f}   {answers}")
    print(f"memory: RSS {start_rss:.0f} MiB before the first kind, {_rss_mib(pid):.0f} MiB after the last")


class ChildServer:
    """`python -m electra_tf.tools.serve` on a free port, its log kept for the report."""

    def __init__(self, model_base: str, model_name: str, extra_flags: list[str]):
        command = [sys.executable, "-m", "electra_tf.tools.serve", f"--model_base_path={model_base}", f"--model_name={model_name}",
                   "--rest_api_port=0", "--port=0", "--file_system_poll_wait_seconds=0", *extra_flags]
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="2")
        self.proc = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: collections.deque[str] = collections.deque(maxlen=50)
        self.port: int | None = None
        self.grpc_target: str | None = None
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.log.append(line.rstrip())
                if m := re.search(r"REST API at http://\S+?:(\d+)/", line):
                    self.port = int(m.group(1))
                if m := re.search(r"gRPC API at (\S+:\d+)", line):
                    self.grpc_target = m.group(1)
                    ready.set()  # logged after the REST line
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or self.port is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "\n".join(self.log))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def report(mode: str, lone: Phase, loaded: Phase, clients: int) -> None:
    for name, phase, n in (("lone", lone, 1), ("loaded", loaded, clients)):
        good = len(phase.good_seconds)
        print(f"{mode:<10} {name:<7} {n:>7} {good:>6} {phase.percentile_ms(50):>8.1f} {phase.percentile_ms(99):>8.1f}"
              f" {good / phase.wall:>7.1f}   {_statuses(phase)}")
    ratio = loaded.percentile_ms(99) / lone.percentile_ms(99)
    errors = lone.server_errors() + loaded.server_errors()
    verdict = "meets" if ratio <= 5 and not errors else "misses"
    print(f"{mode:<10} loaded p99 / lone p99 = {ratio:.2f}x (/ lone p50 = {loaded.percentile_ms(99) / lone.percentile_ms(50):.1f}x),"
          f" 5xx or no answer: {errors} -> {verdict} the goal (<= 5x, none)")


def _statuses(phase: Phase) -> str:
    by_kind = collections.defaultdict(list)
    for (kind, status), n in sorted(phase.statuses.items(), key=lambda item: str(item[0])):
        by_kind[kind].append(f"{status}: {n}")
    return "; ".join(f"{kind} {', '.join(counts)}" for kind, counts in by_kind.items())


def main(argv):
    del argv
    import tensorflow as tf

    from benchmarks.serving_bench_model import export_small_classifier

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="electra_load_test_")
    from electra_tf.data import corpus

    sentences = [text for text, _ in corpus.rotten_tomatoes()]
    model_name, model_base = _MODEL_NAME.value, _MODEL_BASE_PATH.value
    if _SERVER.value is None and model_base is None:
        export = export_small_classifier(work, _VOCAB.value, 128)
        model_base, model_name = os.path.dirname(export.path), "electra_small"
        print(f"exported the ELECTRA-Small classifier in {export.seconds:.0f} s -> {export.path}")

    unknown = set(_PHASES.value) - {"latency", "memory"}
    if unknown:
        raise app.UsageError(f"--phases: {sorted(unknown)} are not latency or memory")
    if "memory" in _PHASES.value and _SERVER.value is not None and _SERVER_PID.value is None:
        raise app.UsageError("--phases=memory with --server needs --server_pid (the server's RSS is read from /proc)")
    servers: list[tuple[str, list[str]]] = []
    if _SERVER.value is None:
        for mode in _MODES.value:
            if mode == "unbatched":
                servers.append((mode, [f"--model_threads={_MODEL_THREADS.value}"] if _MODEL_THREADS.value else []))
            elif mode == "batched":
                parameters = [f"--batching_parameters_file={_BATCHING_FILE.value}"] if _BATCHING_FILE.value else []
                servers.append((mode, ["--enable_batching", *parameters]))
            else:
                raise app.UsageError(f"--modes: {mode!r} is not unbatched or batched")

    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s)")
    if "latency" in _PHASES.value:
        print(f"latency: {_CLIENTS.value} clients for {_SECONDS.value:g} s, {_BAD_FRACTION.value:.0%} bad"
              f" ({', '.join(BAD_KINDS)}); lone client for {_LONE_SECONDS.value:g} s\n")
        print(f"{'mode':<10} {'phase':<7} {'clients':>7} {'good':>6} {'p50 ms':>8} {'p99 ms':>8} {'good/s':>7}   statuses")
    for mode, extra in servers or [("running", [])]:
        child = None
        if _SERVER.value is None:
            child = ChildServer(model_base, model_name, [f"--max_body_bytes={_MAX_BODY.value}",
                                                         f"--max_batch_size={_MAX_BATCH.value}", *extra])
            host, port = "127.0.0.1", child.port
        else:
            host, port = _SERVER.value.rsplit(":", 1)
            port = int(port)
        try:
            metadata = http.client.HTTPConnection(host, port, timeout=60)
            metadata.request("GET", f"/v1/models/{model_name}/metadata")
            signature = json.loads(metadata.getresponse().read())["metadata"]["signature_def"]["signature_def"]["serving_default"]
            metadata.close()
            names = sorted(signature["inputs"])
            if any(v["dtype"] != "DT_STRING" for v in signature["inputs"].values()):
                raise app.UsageError(f"serving_default of {model_name} has inputs that are not strings: {names}")
            requests = Requests(names, sentences, _MAX_BODY.value)
            path = f"/v1/models/{model_name}:predict"
            run_phase(host, port, path, requests, 1, 3.0, 0.0, _SEED.value)  # warm-up
            if "latency" in _PHASES.value:
                lone = run_phase(host, port, path, requests, 1, _LONE_SECONDS.value, 0.0, _SEED.value)
                loaded = run_phase(host, port, path, requests, _CLIENTS.value, _SECONDS.value, _BAD_FRACTION.value,
                                   _SEED.value)
                report(mode, lone, loaded, _CLIENTS.value)
            if "memory" in _PHASES.value:
                pid = child.proc.pid if child is not None else _SERVER_PID.value
                grpc_target = child.grpc_target if child is not None else _GRPC_SERVER.value
                print(f"\n{mode}:")
                run_memory(pid, (host, port), grpc_target, path,
                           MemoryBodies(names, model_name, _MAX_BODY.value, _MAX_BATCH.value),
                           _MEMORY_CLIENTS.value, _MEMORY_SETTLE.value, _MEMORY_ROUNDS.value)
        finally:
            if child is not None:
                child.stop()
                for line in child.log:
                    if "batching:" in line:
                        print(f"{mode:<10} server: {line.split('] ', 1)[-1]}")
        print()


def run():
    cli.run(main, __name__)


if __name__ == "__main__":
    run()
