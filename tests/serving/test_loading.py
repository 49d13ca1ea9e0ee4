"""TF Serving's load flags (serving.manager.LoadOptions): retries of a failed load with the version
LOADING meanwhile, retries cancelled by a stop or a removed folder, the MetaGraph's tag set, and
several models loaded at once."""

import logging
import os
import shutil
import threading
import time

from electra_tf.serving.manager import LoadOptions, ModelManager
from electra_tf.serving.model_config import ModelConfig
from electra_tf.serving.server import ModelServer


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
        self.logger = logging.getLogger("electra_tf.serving.manager")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)

    def emit(self, record):
        self.records.append((record.threadName, record.getMessage()))

    def close(self):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)
        super().close()

    def wait_for(self, words, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(words in message for _, message in self.records):
                return
            time.sleep(0.05)
        raise AssertionError(f"no log line with {words!r}: {self.records}")


def state(manager, name, version):
    status = manager.status(name).model_version_status
    return {s.version: (get_state_name(s.state), s.status.error_code, s.status.error_message) for s in status}[version]


def get_state_name(number):
    from tensorflow_serving.apis import get_model_status_pb2
    return get_model_status_pb2.ModelVersionStatus.State.Name(number)


def broken_version(model_templates, base, version=1):
    """BASE/VERSION holding the template with its saved_model.pb cut short (a copy still under way)."""
    target = os.path.join(base, str(version))
    shutil.copytree(model_templates[1], target)
    with open(os.path.join(target, "saved_model.pb"), "r+b") as f:
        f.truncate(100)
    return target


def test_a_failed_load_is_retried_while_loading_and_a_repaired_version_comes_up(model_templates, tmp_path):
    base = str(tmp_path / "m")
    target = broken_version(model_templates, base)
    manager = ModelManager([ModelConfig("m", base)], warmup_iterations=0,
                           load_options=LoadOptions(max_num_load_retries=3, load_retry_interval_seconds=1.0))
    lines = Lines()
    try:
        polling = threading.Thread(target=manager.poll)
        polling.start()
        lines.wait_for("failed to load")
        assert state(manager, "m", 1)[:2] == ("LOADING", 0)  # as TF Serving: LOADING until the last try
        shutil.copyfile(os.path.join(model_templates[1], "saved_model.pb"), os.path.join(target, "saved_model.pb"))
        polling.join(120)
        assert state(manager, "m", 1)[:2] == ("AVAILABLE", 0)
        messages = [m for _, m in lines.records]
        assert sum("failed to load" in m for m in messages) == 1
        assert any("retrying to load m version 1 (retry 1 of 3)" in m for m in messages)
    finally:
        lines.close()
        manager.stop()


def test_retries_end_with_the_error_and_a_stop_or_a_removed_folder_cancels_them(model_templates, tmp_path):
    base = str(tmp_path / "m")
    broken_version(model_templates, base)
    manager = ModelManager([ModelConfig("m", base)], warmup_iterations=0,
                           load_options=LoadOptions(max_num_load_retries=2, load_retry_interval_seconds=-1))
    lines = Lines()
    try:
        manager.poll()  # a negative interval: the retries follow at once
        name, code, message = state(manager, "m", 1)
        assert name == "END" and code != 0 and message.startswith("Failed to load version 1 of model m: ")
        assert sum("failed to load" in m for _, m in lines.records) == 3  # the first try and two retries
        assert base not in message  # the server's paths stay in its log

        # a stop during the wait ends the retries at once, not after the interval
        base2 = str(tmp_path / "m2")
        broken_version(model_templates, base2)
        slow = ModelManager([ModelConfig("m2", base2)], warmup_iterations=0,
                            load_options=LoadOptions(max_num_load_retries=5,  # the flag's largest interval
                                                     load_retry_interval_seconds=(2**63 - 1) / 1e6))
        polling = threading.Thread(target=slow.poll)
        started = time.monotonic()
        polling.start()
        lines.wait_for("m2 version 1 failed to load")
        slow.cancel_loads()
        polling.join(30)
        assert not polling.is_alive() and time.monotonic() - started < 30
        assert state(slow, "m2", 1)[0] == "END"
        lines.wait_for("retries cancelled (the server stops)")

        # a version folder removed during the wait is not tried again
        base3 = str(tmp_path / "m3")
        target = broken_version(model_templates, base3)
        gone = ModelManager([ModelConfig("m3", base3)], warmup_iterations=0,
                            load_options=LoadOptions(max_num_load_retries=5, load_retry_interval_seconds=1.0))
        polling = threading.Thread(target=gone.poll)
        polling.start()
        lines.wait_for("m3 version 1 failed to load")
        shutil.rmtree(target)
        polling.join(30)
        assert not polling.is_alive()
        lines.wait_for("retries cancelled")
        assert sum("m3 version 1 failed to load" in m for _, m in lines.records) == 1
    finally:
        lines.close()


def test_the_metagraph_is_chosen_by_its_exact_tag_set(model_base):
    with ModelServer(model_base, rest_port=None, grpc_port=None,
                     load_options=LoadOptions(saved_model_tags=("serve", "gpu"))) as server:
        name, code, message = state(server.manager, "tiny", 1)
    assert (name, code) == ("END", 5)  # NOT_FOUND, as TF Serving's loader
    assert "Could not find meta graph def matching supplied tags: { gpu serve }" in message
    assert "The SavedModel has { serve }" in message
    with ModelServer(model_base, rest_port=None, grpc_port=None,
                     load_options=LoadOptions(saved_model_tags=("serve",))) as server:
        assert state(server.manager, "tiny", 1)[0] == "AVAILABLE"


def test_load_threads_load_several_models_at_once(model_templates, install_version, tmp_path):
    configs = []
    for name in ("a", "b"):
        install_version(model_templates, str(tmp_path / name), 1)
        configs.append(ModelConfig(name, str(tmp_path / name)))
    lines = Lines()
    try:
        manager = ModelManager(configs, warmup_iterations=0, load_options=LoadOptions(num_load_threads=2))
        manager.poll()
        assert [state(manager, n, 1)[0] for n in ("a", "b")] == ["AVAILABLE", "AVAILABLE"]
        loaders = {thread for thread, m in lines.records if m.startswith("loading ")}
        assert len(loaders) == 2 and all(t.startswith("model-load") for t in loaders), lines.records
        # the loads overlapped: each began before the other one's version was AVAILABLE
        messages = [m for _, m in lines.records]
        first_available = min(i for i, m in enumerate(messages) if "AVAILABLE" in m)
        assert sum(m.startswith("loading ") for m in messages[:first_available]) == 2, messages
    finally:
        lines.close()


def test_per_model_batching_parameters_come_from_each_versions_file(model_templates, install_version, tmp_path):
    import numpy as np
    import pytest

    from electra_tf.serving.batching_parameters import BatchingParameters
    from electra_tf.serving.errors import ServingError

    for name in ("own", "none", "broken"):
        install_version(model_templates, str(tmp_path / name), 1)
    (tmp_path / "own" / "1" / "batching_params.pbtxt").write_text("max_batch_size { value: 2 }\n"
                                                                   "num_batch_threads { value: 7 }\n")
    (tmp_path / "broken" / "1" / "batching_params.pbtxt").write_text("max_batch_size: 2\n")
    server_batching = BatchingParameters(max_batch_size=8, num_batch_threads=1)
    configs = [ModelConfig(name, str(tmp_path / name)) for name in ("own", "none", "broken")]

    def rows(n):
        return {"ids": np.zeros(n, np.int32)}

    with ModelServer(models=configs, rest_port=None, grpc_port=None, batching=server_batching,
                     load_options=LoadOptions(per_model_batching=server_batching)) as server:
        def run(name, n):
            return server.manager.servable(name).signature("lookup").run(rows(n), 1024, server.scheduler)

        own = server.manager.servable("own").signature("lookup").batching
        assert (own.max_batch_size, own.num_batch_threads) == (2, 1)  # batch threads stay the server's
        assert run("own", 2)["value"].shape == (2,)
        with pytest.raises(ServingError, match="Task size 3 is larger than maximum batch size 2"):
            run("own", 3)
        batches = server.scheduler.stats["batches"]
        assert run("none", 10)["value"].shape == (10,)  # not batched: the server's max of 8 does not apply
        assert server.scheduler.stats["batches"] == batches
        name, code, message = state(server.manager, "broken", 1)
        assert name == "END" and "batching_params.pbtxt" in message, message
    # without the option the server's parameters hold for every version
    with ModelServer(models=configs[:2], rest_port=None, grpc_port=None, batching=server_batching) as server:
        with pytest.raises(ServingError, match="Task size 10 is larger than maximum batch size 8"):
            server.manager.servable("none").signature("lookup").run(rows(10), 1024, server.scheduler)
        assert server.manager.servable("own").signature("lookup").run(rows(3), 1024, server.scheduler)[
            "value"].shape == (3,)
