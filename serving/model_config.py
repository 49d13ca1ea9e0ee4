"""The `models.config` file of TensorFlow Serving, for one or more models.

TF Serving reads `--model_config_file`, a text protobuf of
`tensorflow.serving.ModelServerConfig`:

    model_config_list {
      config {
        name: "electra"
        base_path: "/models/electra"
        model_platform: "tensorflow"
        model_version_policy { specific { versions: 2 } }
      }
    }

`ModelConfig` is the one description of a served model in this project: the local
server (`serving.server.ModelServer`) takes the same objects and applies the same
version policy, so a config that works here works on the real server.

Example:

    >>> text = models_config_text([ModelConfig("electra", "/models/electra")])
    >>> configs = parse_models_config(text)
    >>> configs[0].version_policy
    'latest'
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Sequence


from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

VERSION_POLICIES = ("latest", "all", "specific")

# A model name is a URL path segment of the REST API (`/v1/models/NAME:predict`),
# so it cannot hold '/', ':' or whitespace.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_URI_RE = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.IGNORECASE)
_INT64_MAX = 2**63 - 1
_UINT32_MAX = 2**32 - 1


class ModelConfigError(ValueError):
    """A model config field is invalid; the message names the field."""


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One served model: its name, its base path and which versions to serve.

    Args:
        name: the model name used in requests (`/v1/models/NAME`).
        base_path: the folder holding numbered version folders (`BASE/NAME`), as the
            server sees it (a container path for Docker, e.g. `/models/electra`).
            Absolute path or URI (`gs://...`, `s3://...`).
        version_policy: "latest" (the `num_versions` highest), "all", or "specific".
        versions: the versions to serve with the "specific" policy.
        num_versions: how many of the highest versions the "latest" policy serves.
        version_labels: TF Serving's `version_labels` as (label, version) pairs: checked,
            written back, and resolved for requests by label (`ModelManager.version_of_label`).
    """

    name: str
    base_path: str
    version_policy: str = "latest"
    versions: tuple[int, ...] = ()
    num_versions: int = 1
    version_labels: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "versions", tuple(self.versions))
        labels = self.version_labels.items() if isinstance(self.version_labels, dict) else self.version_labels
        object.__setattr__(self, "version_labels", tuple(sorted(tuple(pair) for pair in labels)))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ModelConfigError(
                f"name: {self.name!r} is not a valid model name (letters, digits, '_', '.', '-';"
                " no '/', ':' or spaces, it is a REST URL segment)"
            )
        if not isinstance(self.base_path, str) or not self.base_path.strip():
            raise ModelConfigError(f"base_path of model {self.name!r}: must be a non-empty path")
        if '"' in self.base_path or not self.base_path.isprintable():
            # A NUL would end the path early in C (TF Serving) and is refused by every Python file call.
            raise ModelConfigError(
                f"base_path of model {self.name!r}: {self.base_path!r} holds quotes or control characters")
        if not (self.base_path.startswith("/") or _URI_RE.match(self.base_path)):
            raise ModelConfigError(
                f"base_path of model {self.name!r}: {self.base_path!r} must be absolute"
                " (the server resolves relative paths against its own working directory)"
            )
        if self.version_policy not in VERSION_POLICIES:
            raise ModelConfigError(
                f"version_policy of model {self.name!r}: {self.version_policy!r} is not one of {VERSION_POLICIES}"
            )
        if self.version_policy == "specific":
            if not self.versions:
                raise ModelConfigError(f"versions of model {self.name!r}: the 'specific' policy needs at least one")
            bad = [v for v in self.versions if not _is_version(v)]
            if bad:
                raise ModelConfigError(
                    f"versions of model {self.name!r}: {bad} are not versions (integers from 1 to 2^63-1, the"
                    " names of version folders)")
        elif self.versions:
            raise ModelConfigError(
                f"versions of model {self.name!r}: only used with version_policy='specific'"
            )
        if not isinstance(self.num_versions, int) or isinstance(self.num_versions, bool) or not (
                0 < self.num_versions <= _UINT32_MAX):
            raise ModelConfigError(f"num_versions of model {self.name!r}: must be an integer from 1 to {_UINT32_MAX}"
                                   f" (a uint32 in TF Serving's config), got {self.num_versions!r}")
        for label, version in self.version_labels:
            if not isinstance(label, str) or not _NAME_RE.match(label):
                raise ModelConfigError(
                    f"version_labels of model {self.name!r}: {label!r} is not a valid label (letters, digits,"
                    " '_', '.', '-'; it is a REST URL segment, /labels/LABEL)")
            if not _is_version(version):
                raise ModelConfigError(
                    f"version_labels of model {self.name!r}: label {label!r} names {version!r}, not a version"
                    " (an integer from 1 to 2^63-1)")
            if self.version_policy == "specific" and version not in self.versions:
                # TF Serving refuses a label on a version it has not loaded; this one it never will.
                raise ModelConfigError(
                    f"version_labels of model {self.name!r}: label {label!r} names version {version}, which the"
                    f" 'specific' policy {list(self.versions)} never serves")

    def select(self, available: Iterable[int]) -> list[int]:
        """The versions this policy wants out of `available`, highest first.

        For "latest" this is an upper bound: the server walks down the list and
        skips versions that fail to load, so an older version keeps serving.
        """
        ordered = sorted(set(available), reverse=True)
        if self.version_policy == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered

    def to_proto(self) -> model_server_config_pb2.ModelConfig:
        config = model_server_config_pb2.ModelConfig(
            name=self.name, base_path=self.base_path, model_platform="tensorflow"
        )
        policy = config.model_version_policy
        if self.version_policy == "all":
            policy.all.SetInParent()
        elif self.version_policy == "specific":
            policy.specific.versions.extend(self.versions)
        elif self.num_versions != 1:
            policy.latest.num_versions = self.num_versions
        # "latest" with one version is TF Serving's default: leave the policy unset.
        for label, version in self.version_labels:
            config.version_labels[label] = version
        return config

    @classmethod
    def from_proto(cls, config: model_server_config_pb2.ModelConfig) -> "ModelConfig":
        if config.model_platform not in ("", "tensorflow"):
            raise ModelConfigError(
                f"model_platform of model {config.name!r}: {config.model_platform!r} is not supported"
                " (only 'tensorflow')"
            )
        if not config.name:
            raise ModelConfigError("name: a model has no name")
        if not config.base_path:
            raise ModelConfigError(f"base_path of model {config.name!r}: missing")
        policy = config.model_version_policy
        version_policy = policy.WhichOneof("policy_choice")
        labels = tuple(config.version_labels.items())
        if version_policy == "all":
            return cls(config.name, config.base_path, "all", version_labels=labels)
        if version_policy == "specific":
            return cls(config.name, config.base_path, "specific", tuple(policy.specific.versions), version_labels=labels)
        if version_policy not in (None, "latest"):  # latest_once and future policies
            raise ModelConfigError(f"model_version_policy of model {config.name!r}: {version_policy!r} is not supported"
                                   f" (only {', '.join(VERSION_POLICIES)})")
        # TF Serving serves max(num_versions, 1): 0 (unset) is one.
        num = max(policy.latest.num_versions, 1) if version_policy == "latest" else 1
        return cls(config.name, config.base_path, "latest", num_versions=num, version_labels=labels)


def unavailable_label(model_name: str, version: int) -> str:
    """TF Serving's refusal of a label naming a version that is not AVAILABLE (server_core.cc,
    UpdateModelVersionLabelMap)."""
    return (f"Request to assign label to version {version} of model {model_name},"
            " which is not currently available for inference")


def _is_version(value) -> bool:
    """A version number as TF Serving's version folders and int64 fields hold them (0 and the
    negatives are no folder name this server reads as a version)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _INT64_MAX


def models_config_proto(configs: Sequence[ModelConfig]) -> model_server_config_pb2.ModelServerConfig:
    if not configs:
        raise ModelConfigError("model_config_list: at least one model is needed")
    names = [c.name for c in configs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ModelConfigError(f"model_config_list: duplicate model names {duplicates}")
    server_config = model_server_config_pb2.ModelServerConfig()
    server_config.model_config_list.config.extend(c.to_proto() for c in configs)
    return server_config


def models_config_text(configs: Sequence[ModelConfig]) -> str:
    """The text protobuf for `--model_config_file`."""
    # text_format does the quoting and escaping, so the file always parses.
    return text_format.MessageToString(models_config_proto(configs))


def parse_models_config(text: str) -> list[ModelConfig]:
    """Parse a `models.config` text protobuf into validated `ModelConfig`s.

    Raises ModelConfigError with one line naming the field (and line and column for a syntax
    error) for anything TF Serving would refuse or this server cannot serve as asked."""
    server_config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, server_config)
    except text_format.ParseError as e:
        raise ModelConfigError(_parse_error(e)) from None
    return configs_from_proto(server_config)


def configs_from_proto(server_config: model_server_config_pb2.ModelServerConfig,
                       allow_empty: bool = False) -> list[ModelConfig]:
    """The validated `ModelConfig`s of a ModelServerConfig (a parsed models.config, or the
    config of a ReloadConfigRequest, where an empty list is allowed: it unloads every model);
    ModelConfigError naming the field otherwise."""
    if server_config.WhichOneof("config") != "model_config_list":
        what = server_config.WhichOneof("config")
        raise ModelConfigError("no model_config_list (the file holds no model)" if what is None
                               else f"{what}: not supported, only model_config_list")
    configs = []
    for index, config in enumerate(server_config.model_config_list.config):
        try:
            configs.append(ModelConfig.from_proto(config))
        except ModelConfigError as e:
            raise ModelConfigError(f"model_config_list.config[{index}]: {e}") from None
    if configs or not allow_empty:
        models_config_proto(configs)  # the list-level checks (non-empty, unique names)
    return configs


def _parse_error(error: text_format.ParseError) -> str:
    """text_format's message in one line, without the echo of the offending line (which may be
    long or binary), its characters that do not print escaped."""
    reason = re.sub(r"^\d+:\d+ : (?:'.*?': )?", "", str(error), count=1, flags=re.S)
    reason = "".join(c if c.isprintable() else repr(c)[1:-1] for c in reason)
    where = f"line {error.GetLine()} column {error.GetColumn()}" if error.GetLine() else "syntax"
    return f"does not parse as a ModelServerConfig text protobuf at {where}: {reason}"


def read_models_config(path: str) -> list[ModelConfig]:
    """`parse_models_config` of the file at `path`; errors (ModelConfigError, OSError) name it."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelConfigError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start});"
                               " a models.config is a text protobuf") from None
    try:
        return parse_models_config(text)
    except ModelConfigError as e:
        raise ModelConfigError(f"{path}: {e}") from None
