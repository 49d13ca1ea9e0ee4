"""serving.budget: how many request bytes are parsed at once, alone and in a server on 127.0.0.1."""

import gc
import http.client
import json
import threading
import time
import weakref

import pytest

from electra_tf.serving.budget import ParseBudget
from electra_tf.serving.errors import ServingError, invalid
from electra_tf.serving.server import ModelServer


def test_holds_never_exceed_the_limit_and_keep_arrival_order():
    budget, lock = ParseBudget(10), threading.Lock()
    held, most, order = [0], [0], []

    def request(name, size, seconds):
        with budget.hold(size):
            with lock:
                held[0] += min(size, 10)
                most[0] = max(most[0], held[0])
                order.append(name)
            time.sleep(seconds)
            with lock:
                held[0] -= min(size, 10)

    threads = [threading.Thread(target=request, args=("first", 6, 0.3))]
    threads[0].start()
    time.sleep(0.05)
    for name, size in (("large", 50), ("small", 1)):  # the large one waits for all 10; the small one waits behind it
        threads.append(threading.Thread(target=request, args=(name, size, 0.05)))
        threads[-1].start()
        time.sleep(0.05)
    for t in threads:
        t.join(5)
    assert order == ["first", "large", "small"] and most[0] == 10


def test_small_requests_share_the_budget():
    budget, inside, both = ParseBudget(10), threading.Barrier(2, timeout=5), []

    def request():
        with budget.hold(5):
            inside.wait()  # both inside at once, or the barrier times out
            both.append(True)

    threads = [threading.Thread(target=request) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert both == [True, True]


def test_what_was_parsed_is_freed_when_an_error_leaves_the_block():
    """The error's traceback holds the frames that parsed the request; their locals must not keep
    the parsed objects alive past the release (while the answer is written, beside the next parse)."""

    class Parsed:
        pass

    refs = []

    def parse():
        parsed = Parsed()
        refs.append(weakref.ref(parsed))
        raise invalid("the request is bad")

    budget = ParseBudget(10)
    with pytest.raises(ServingError) as error:
        with budget.hold(5):
            parse()
    gc.collect()
    assert refs[0]() is None and error.value.message == "the request is bad"


# ----------------------------------------------------------------------------- in a server


MAX_BODY = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def server(model_base):
    with ModelServer(model_base, grpc_port=None, max_body_bytes=MAX_BODY) as s:
        yield s


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def test_four_maximal_bodies_at_once_cost_about_one(server):
    """Four clients send a body of nested empty lists at once (the most Python objects per byte of
    JSON: ~90 MB each for 4 MiB): the server's peak memory grows by about one parse, not four.
    Measured in this process (VmHWM reset first): 126-132 MiB where one parse costs 96 (the
    bodies themselves, a decoded copy); 226 without the budget."""
    body = json.dumps({"inputs": {"text": [[]] * ((MAX_BODY - 40) // 3)}}, separators=(",", ":")).encode()
    assert MAX_BODY - 40 < len(body) <= MAX_BODY
    single = _parse_cost_mib(body)
    statuses, barrier = [], threading.Barrier(4)

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=60)
        barrier.wait()
        connection.request("POST", "/v1/models/tiny:predict", body=body)
        response = connection.getresponse()
        statuses.append((response.status, json.loads(response.read())["error"]))
        connection.close()

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
    except OSError:
        pytest.skip("VmHWM cannot be reset here (Linux 4.0+ /proc/PID/clear_refs)")
    before = _peak_rss_mib()
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    grown = _peak_rss_mib() - before
    assert [s for s, _ in statuses] == [400] * 4, statuses
    assert "but signature 'serving_default' expects [?]" in statuses[0][1]
    assert grown < 1.75 * single, f"peak grew {grown:.0f} MiB; one parse costs {single:.0f} MiB"


def _parse_cost_mib(body: bytes) -> float:
    """What json.loads of `body` adds to this process's RSS."""
    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

    start = rss()
    gc.disable()  # as the server parses a large body (and 1 s faster here)
    try:
        parsed = json.loads(body)
    finally:
        gc.enable()
    cost = rss() - start
    del parsed
    return cost
