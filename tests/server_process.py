"""`electra-serve` in a child process for end-to-end tests: started, awaited, stopped."""

import contextlib
import subprocess
import time
import urllib.request


@contextlib.contextmanager
def serving(command: list[str], model_url: str, **popen):
    """Runs `command` (an electra-serve invocation) until the block ends; first waits up to two
    minutes for `model_url` (http://127.0.0.1:PORT/v1/models/NAME) to report AVAILABLE."""
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              **popen)
    try:
        for _ in range(240):
            try:
                if b"AVAILABLE" in urllib.request.urlopen(model_url, timeout=1).read():
                    break
            except OSError:
                if server.poll() is not None:
                    raise AssertionError(f"electra-serve exited with {server.returncode}")
                time.sleep(0.5)
        else:
            raise AssertionError("electra-serve did not come up")
        yield server
    finally:
        server.terminate()
        server.wait(timeout=30)
