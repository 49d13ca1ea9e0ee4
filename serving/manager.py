"""The model manager: which versions of which models are loaded, and their status.

Models live in `BASE/NAME/VERSION/` (VERSION in ASCII digits, a positive int64: serving/versions.py). A
background thread polls the base paths, loads new versions and unloads removed ones, following each
model's version policy (latest / all / specific, as in TF Serving's models.config). A base path that
cannot be listed (renamed away during a redeploy, a storage hiccup) changes nothing: the loaded
versions keep serving until it is back, as in TF Serving. A version that fails to load is
logged, reported in its status (the error code and message TF Serving's GetModelStatus gives,
without the server's paths: the log has them), and skipped; the versions already loaded keep serving.
How versions load (MetaGraph tags, retries, load threads, per-model batching): `LoadOptions`.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from tensorflow_serving.apis import (
    get_model_status_pb2,
)

from electra_tf.serving.errors import ServingError, failed_precondition, invalid, not_found, shown, unknown, without_paths
from electra_tf.serving.metrics import Metrics
from electra_tf.serving.model_config import ModelConfig, ModelConfigError, read_models_config, unavailable_label
from electra_tf.serving import warmup
from electra_tf.serving.batching_parameters import (
    MODEL_BATCHING_FILE, NOT_BATCHED, BatchingParameters, read_model_batching_parameters)
from electra_tf.serving.budget import release_freed_heap
from electra_tf.serving.servables import Servable
from electra_tf.serving.versions import fingerprint as _fingerprint, list_versions as _list_versions

log = logging.getLogger(__name__)

_State = get_model_status_pb2.ModelVersionStatus.State


class _Failure(Exception):
    """A load failure's text and TensorFlow error code, without its traceback."""

    def __init__(self, message: str, error_code: int):
        super().__init__(message)
        self.error_code = error_code


class _VersionRecord:
    def __init__(self):
        self.servable: Servable | None = None
        self.state = _State.START
        self.error_code = 0  # tensorflow.error.Code, 0 = OK
        self.error_message = ""
        self.fingerprint: tuple | None = None  # of the directory when its load failed


def _release_unloaded() -> None:
    """Free what a dropped version held: a loaded SavedModel's Python objects hold each other in
    cycles that only the cyclic collector frees, and glibc keeps the freed heap unless told. Without
    this an ELECTRA-Small server grew from 2.5 to 4.1-5.6 GB resident over four version changes,
    one version loaded at a time (docs/benchmarks.md, "A version's memory after it is unloaded")."""
    gc.collect()
    release_freed_heap()


@dataclass(frozen=True)
class LoadOptions:
    """How versions are loaded, as TF Serving's flags of the same names.

    Args:
        saved_model_tags: the tag set of the MetaGraph to load (--saved_model_tags); as TF
            Serving, a version whose SavedModel has no MetaGraph with exactly these tags fails
            to load.
        max_num_load_retries: times a failed load (or warmup) is tried again before the
            version is given up (END, with its error); TF Serving's default is 5, this API's 0
            (electra-serve takes TF Serving's). Meanwhile the version is LOADING, as there.
        load_retry_interval_seconds: the wait between tries (--load_retry_interval_micros /
            1e6; <= 0: none). A stopping server, or a version folder that is gone, ends the
            retries early.
        num_load_threads: models loaded at once (--num_load_threads); 0 or 1 load one after
            another. The versions of one model always load in turn.
        per_model_batching: the server's batching parameters when each version's own
            `batching_params.pbtxt` decides its batching (--enable_per_model_batching_parameters,
            `serving.batching_parameters.read_model_batching_parameters`): a file that does not parse fails
            the load; None (the default): every version batches as the server does.
        check_method_names: --enable_signature_method_name_check (default false, as TF
            Serving): Predict, Classify and Regress also check a signature's method name
            (`Servable.predict_signature`, `inference_api.example_signature`).
    """

    saved_model_tags: tuple[str, ...] = ("serve",)
    max_num_load_retries: int = 0
    load_retry_interval_seconds: float = 60.0
    num_load_threads: int = 0
    per_model_batching: BatchingParameters | None = None
    check_method_names: bool = False


class ModelManager:
    """Loads and unloads model versions following each model's version policy."""

    def __init__(self, configs: Sequence[ModelConfig], *, metrics: Metrics | None = None,
                 warmup_iterations: int = 1, allow_unavailable_labels: bool = True,
                 load_options: LoadOptions = LoadOptions()):
        """`warmup_iterations`: how many times each warmup record runs before a version is
        AVAILABLE (TF Serving's --num_request_iterations_for_warmup); 0 replays none (its
        --enable_model_warmup=false). `allow_unavailable_labels`: TF Serving's
        --allow_version_labels_for_unavailable_models (`check_labels`)."""
        self.load_options = load_options
        self.allow_unavailable_labels = allow_unavailable_labels
        self.configs = {c.name: c for c in configs}
        self.metrics = metrics if metrics is not None else Metrics()  # serving.metrics; off by default
        self._records: dict[str, dict[int, _VersionRecord]] = {c.name: {} for c in configs}
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._config_thread: threading.Thread | None = None
        self._warmup_iterations = warmup_iterations
        self._unreadable: dict[str, str] = {}  # model name -> why its base path could not be listed

    # --- polling

    def poll(self) -> None:
        """Scan every base path once; load new versions and unload removed ones."""
        with self._poll_lock:
            self._poll_models(list(self.configs.values()))

    def _poll_models(self, configs: Sequence[ModelConfig]) -> None:
        """`_poll_model` each of `configs`, `num_load_threads` of them at once."""
        def poll_one(config: ModelConfig) -> None:
            if self._stop.is_set():
                return
            try:
                self._poll_model(config)
            except Exception:  # noqa: BLE001  (a poll must never kill the thread)
                log.exception("polling model %r failed", config.name)

        threads = min(self.load_options.num_load_threads, len(configs))
        if threads <= 1:
            for config in configs:
                poll_one(config)
            return
        with ThreadPoolExecutor(threads, thread_name_prefix="model-load") as pool:
            list(pool.map(poll_one, configs))

    def cancel_loads(self) -> None:
        """Give up the loads under way (their retries end, the next models are not polled): for
        a server told to stop while it loads at start."""
        self._stop.set()

    def reload(self, configs: Sequence[ModelConfig]) -> None:
        """TF Serving's ReloadConfig (gRPC `ModelService.HandleReloadConfigRequest`, and the
        models.config re-read every `--model_config_file_poll_wait_seconds`): `configs` becomes
        the list of served models. Models left out are unloaded; new ones are loaded; the others
        follow their new version policy and base path (a version loaded from the old base path
        serves until the new path's copy has loaded; if that copy fails, the version is END with
        its error). Returns once every new model has a version
        AVAILABLE, as TF Serving's does.

        Raises ServingError as TF Serving does: INVALID_ARGUMENT for two models of one name;
        FAILED_PRECONDITION, changing nothing, for a label that may not name its version
        (`check_labels`);
        UNKNOWN naming the new models that did not become available (the rest of the change
        stands)."""
        names = [c.name for c in configs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise invalid(f"model_config_list: duplicate model names {duplicates}")
        with self._poll_lock:
            self.check_labels(configs)
            new = [name for name in names if name not in self.configs]
            unloaded = []
            with self._lock:
                for name in self.configs:
                    if name in names:
                        continue
                    for version, record in self._records[name].items():
                        if record.servable is not None:
                            log.info("unloading %s version %d (the model left the config)", name, version)
                            record.servable, record.state = None, _State.END
                            unloaded.append((name, version))
                for name in names:
                    self._records.setdefault(name, {})
                self.configs = {c.name: c for c in configs}
            self.metrics.add_model_names(names)
            if unloaded:
                _release_unloaded()
            log.info("model config reloaded: serving %s (new: %s, removed: %s)", names, new or "none",
                     sorted({name for name, _ in unloaded}) or "none")
            self._poll_models(configs)  # as a poll: a failure is logged, the other models go on
            with self._lock:
                missing = [name for name in new
                           if not any(r.servable is not None for r in self._records[name].values())]
        if missing:
            raise unknown(f"{len(missing)} model(s) did not become available: {{{', '.join(missing)}}}"
                          " (GetModelStatus gives each version's error)")

    def _poll_model(self, config: ModelConfig) -> None:
        records = self._records[config.name]
        try:
            available, unfinished = _list_versions(config.base_path)
        except OSError as e:
            # TF Serving's FileSystemStoragePathSource: a base path it cannot find fails the
            # poll and changes nothing, so a storage hiccup or a base path renamed away and back
            # during a redeploy never unloads what is serving. Logged once per outage.
            reason = e.strerror or str(e)
            if self._unreadable.get(config.name) != reason:
                serving = sorted(v for v, r in records.items() if r.servable is not None)
                log.warning("cannot list the base path of model %r (%s: %s); keeping the loaded versions %s"
                            " until it is back", config.name, config.base_path, reason, serving)
            self._unreadable[config.name] = reason
            return
        if self._unreadable.pop(config.name, None) is not None:
            log.info("the base path of model %r is back: %s", config.name, config.base_path)
        for version in unfinished:
            # A loaded version whose folder is being rewritten (saved_model.pb away for a
            # moment) keeps serving; TF Serving does not look inside the folders at all.
            record = records.get(version)
            if record is not None and record.servable is not None:
                available[version] = record.servable.path
        wanted = config.select(available)
        keep: list[int] = []
        for version in wanted:
            if config.version_policy == "latest" and len(keep) >= config.num_versions:
                break
            if self._ensure_loaded(config.name, version, available[version]):
                keep.append(version)
        unloaded = []
        with self._lock:
            for version, record in records.items():
                if record.servable is not None and version not in keep:
                    log.info("unloading %s version %d", config.name, version)
                    record.servable = None
                    record.state = _State.END
                    unloaded.append(version)
        if unloaded:
            _release_unloaded()

    def _try_load(self, name: str, version: int, path: str) -> tuple[tuple | None, Exception | None]:
        """One try at loading and warming a version: ((servable, load seconds, warmup result,
        start time), None), or (None, the error without its traceback)."""
        log.info("loading %s version %d from %s", name, version, path)
        start = time.monotonic()
        loaded = servable = None
        try:
            batching = (read_model_batching_parameters(path, self.load_options.per_model_batching)
                        if self.load_options.per_model_batching is not None else None)
            servable = Servable(name, version, path, tags=self.load_options.saved_model_tags, batching=batching,
                                check_method_names=self.load_options.check_method_names)
            if batching is not None:
                log.info("%s version %d: %s", name, version, f"batching {batching}" if batching != NOT_BATCHED
                         else f"not batched (no {MODEL_BATCHING_FILE} in its folder)")
            loaded = time.monotonic() - start
            self.metrics.observe_load(path, loaded)
            warmed = (warmup.replay(servable, self._warmup_iterations)  # before AVAILABLE, as TF Serving
                      if self._warmup_iterations > 0 else None)
            if warmed is not None:
                self.metrics.observe_warmup(path, warmed[1])
            # A signature's first call (its graph copied and optimised) frees ~0.3-0.7 GB per
            # signature of an ELECTRA-Small export that glibc would otherwise keep.
            release_freed_heap()
        except Exception as e:  # noqa: BLE001  (any load failure is logged and skipped)
            if loaded is None:  # the SavedModel did not load
                self.metrics.observe_load(path, time.monotonic() - start, succeeded=False)
            elif isinstance(e, warmup.WarmupError):
                self.metrics.observe_warmup(path, time.monotonic() - start - loaded, status="UNKNOWN")
            # The text and code, not the exception: its traceback would keep the failed version alive.
            code = e.code.value[0] if isinstance(e, ServingError) else getattr(e, "error_code", 0)
            failure = _Failure(str(e), code)
        else:
            return (servable, loaded, warmed, start), None
        servable = None
        _release_unloaded()  # what it loaded goes, now that the exception and its frames are gone
        return None, failure

    def _give_up(self, name: str, version: int, path: str, record: _VersionRecord, error: Exception,
                 fingerprint: tuple) -> None:
        """The version's status after its last failed try: END with the reason clients may read."""
        record.state = _State.END
        record.error_code = getattr(error, "error_code", 0) or 2  # UNKNOWN
        # Clients read the status: the reason, without where the server keeps its files.
        known = {path: f"<{name} version {version}>", self.configs[name].base_path: f"<{name} base path>"}
        reason = " ".join(without_paths(str(error), known).split())  # one line
        record.error_message = f"Failed to load version {version} of model {name}: {reason}"
        record.fingerprint = fingerprint
        with self._lock:  # also over a copy from an old base path (a config reload): END, as documented
            self._records[name][version] = record

    def _ensure_loaded(self, name: str, version: int, path: str) -> bool:
        record = self._records[name].get(version)
        if record is not None and record.servable is not None:
            if record.servable.path == path:
                return True
            # The base path changed (a config reload): the old copy serves until this one loads.
            log.info("%s version %d moves from %s to %s", name, version, record.servable.path, path)
            record = None
        fingerprint = _fingerprint(path)
        if record is not None and record.error_code and record.fingerprint == fingerprint:
            return False  # failed before and unchanged since: don't retry every poll
        record = _VersionRecord()
        record.state = _State.LOADING
        with self._lock:  # GetModelStatus says LOADING meanwhile, unless an older copy serves
            current = self._records[name].get(version)
            if current is None or current.servable is None:
                self._records[name][version] = record
        options = self.load_options
        servable = warmed = None
        for attempt in range(options.max_num_load_retries + 1):
            if attempt:
                if self._stop.wait(min(max(options.load_retry_interval_seconds, 0.0), threading.TIMEOUT_MAX)):
                    log.info("%s version %d: retries cancelled (the server stops)", name, version)
                    break
                if not os.path.isdir(path):
                    log.info("%s version %d: retries cancelled (%s is gone)", name, version, path)
                    break
                log.info("retrying to load %s version %d (retry %d of %d)", name, version, attempt,
                         options.max_num_load_retries)
            result, error = self._try_load(name, version, path)
            if result is not None:
                servable, loaded, warmed, start = result
                break
            if attempt < options.max_num_load_retries:
                log.error("%s version %d failed to load from %s: %s", name, version, path, error)
        else:
            log.error("%s version %d failed to load from %s, skipping it: %s", name, version, path, error)
        if servable is None:
            self._give_up(name, version, path, record, error, fingerprint)
            return False
        record.servable, record.state = servable, _State.AVAILABLE
        with self._lock:
            replaced = self._records[name].get(version)
            self._records[name][version] = record
        if replaced is not None and replaced.servable is not None:
            replaced = None
            _release_unloaded()
        if warmed is not None:
            log.info("%s version %d warmed up: %d requests of %s in %.2f s", name, version,
                     warmed[0], warmup.WARMUP_FILE, warmed[1])
        log.info(
            "%s version %d AVAILABLE (signatures %s, loaded in %.1f s, %.1f s in all)",
            name, version, sorted(servable.signatures), loaded, time.monotonic() - start,
        )
        return True

    def start_polling(self, interval_seconds: float) -> None:
        if interval_seconds <= 0:
            return  # as TF Serving: poll once at start-up only
        self._thread = threading.Thread(
            target=self._poll_loop, args=(interval_seconds,), name="model-poller", daemon=True
        )
        self._thread.start()

    def start_config_polling(self, path: str, interval_seconds: float) -> None:
        """Re-read the models.config at `path` every `interval_seconds` and `reload` it when it
        has changed (TF Serving's --model_config_file_poll_wait_seconds). A file that is missing
        or does not parse is logged once and changes nothing: the served models stay."""
        if interval_seconds <= 0:
            return
        self._config_thread = threading.Thread(
            target=self._config_poll_loop, args=(path, interval_seconds, None), name="config-poller", daemon=True)
        self._config_thread.start()

    def _config_poll_loop(self, path: str, interval_seconds: float, seen: bytes | None) -> None:
        unreadable = False
        while not self._stop.wait(interval_seconds):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as e:
                if not unreadable:  # once per outage
                    log.error("cannot read the model config %s (%s); serving the models as they are", path,
                              e.strerror or e)
                unreadable = True
                continue
            unreadable = False
            if data == seen:
                continue
            seen = data
            try:
                configs = read_models_config(path)
            except (ModelConfigError, OSError) as e:
                log.error("the model config changed but cannot be used; serving the models as they are: %s",
                          e if isinstance(e, ModelConfigError) else f"{path}: {e.strerror or e}")
                continue
            if configs == list(self.configs.values()):
                continue  # the same models (the file rewritten, or what the server started with)
            try:
                self.reload(configs)
            except ServingError as e:
                log.error("reloading the model config %s: %s", path, e.message)

    def _poll_loop(self, interval_seconds: float) -> None:
        while not self._stop.wait(interval_seconds):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._config_thread):
            if thread is not None:
                thread.join()
        self._thread = self._config_thread = None

    # --- lookups

    def check_labels(self, configs: Sequence[ModelConfig]) -> None:
        """Raises FAILED_PRECONDITION, with TF Serving's sentence (server_core.cc,
        UpdateModelVersionLabelMap), for the first label of `configs` that may not name its
        version, as TF Serving checks them before it loads anything: a label must name an
        AVAILABLE version, unless `allow_unavailable_labels` (its
        --allow_version_labels_for_unavailable_models) lets a label name one yet to load, as long
        as the label is new or names the same version as now (load a version, then move the
        label to it)."""
        for config in configs:
            now = dict(self.configs[config.name].version_labels) if config.name in self.configs else {}
            for label, version in config.version_labels:
                record = self._records.get(config.name, {}).get(version)
                if record is not None and record.servable is not None:
                    continue
                if self.allow_unavailable_labels and now.get(label, version) == version:
                    continue
                raise failed_precondition(unavailable_label(shown(config.name, 200), version))

    def version_of_label(self, name: str, label: str) -> int:
        """The version `label` names in the model's `version_labels` (models.config), as TF
        Serving resolves a request by label; INVALID_ARGUMENT naming it when the model has no
        such label. The version is then served as if asked for by number (NOT_FOUND when it is
        not loaded)."""
        config = self.configs.get(name)
        version = dict(config.version_labels).get(label) if config is not None else None
        if version is None:
            raise invalid(f"Unrecognized servable version label: {shown(label, 200)}")
        return version

    def servable(self, name: str, version: int | None = None) -> Servable:
        with self._lock:
            records = self._records.get(name)
            if records is not None:
                loaded = {v: r.servable for v, r in records.items() if r.servable is not None}
                if version is None and loaded:
                    return loaded[max(loaded)]
                if version is not None and version in loaded:
                    return loaded[version]
        what = f"Latest({shown(name, 200)})" if version is None else f"Specific({shown(name, 200)}, {version})"
        raise not_found(f"Servable not found for request: {what}")

    def status(self, name: str, version: int | None = None) -> get_model_status_pb2.GetModelStatusResponse:
        with self._lock:
            records = dict(self._records.get(name, {}))
        if not records:
            raise not_found(f"Could not find any versions of model {shown(name, 200)}")
        if version is not None:
            if version not in records:
                raise not_found(f"Could not find version {version} of model {shown(name, 200)}")
            records = {version: records[version]}
        response = get_model_status_pb2.GetModelStatusResponse()
        for v in sorted(records, reverse=True):
            record = records[v]
            status = response.model_version_status.add(version=v, state=record.state)
            status.status.error_code = record.error_code
            status.status.error_message = record.error_message
        return response
