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
    """

    name: str
    base_path: str
    version_policy: str = "latest"
    versions: tuple[int, ...] = ()
    num_versions: int = 1

    def __post_init__(self):
        object.__setattr__(self, "versions", tuple(self.versions))
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ModelConfigError(
                f"name: {self.name!r} is not a valid model name (letters, digits, '_', '.', '-';"
                " no '/', ':' or spaces, it is a REST URL segment)"
            )
        if not isinstance(self.base_path, str) or not self.base_path.strip():
            raise ModelConfigError(f"base_path of model {self.name!r}: must be a non-empty path")
        if '"' in self.base_path or "\n" in self.base_path:
            raise ModelConfigError(f"base_path of model {self.name!r}: quotes and newlines are not allowed")
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
            bad = [v for v in self.versions if not isinstance(v, int) or isinstance(v, bool) or v <= 0]
            if bad:
                raise ModelConfigError(f"versions of model {self.name!r}: {bad} are not positive integers")
        elif self.versions:
            raise ModelConfigError(
                f"versions of model {self.name!r}: only used with version_policy='specific'"
            )
        if not isinstance(self.num_versions, int) or self.num_versions <= 0:
            raise ModelConfigError(f"num_versions of model {self.name!r}: must be a positive integer")

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
        return config

    @classmethod
    def from_proto(cls, config: model_server_config_pb2.ModelConfig) -> "ModelConfig":
        if config.model_platform not in ("", "tensorflow"):
            raise ModelConfigError(
                f"model_platform of model {config.name!r}: {config.model_platform!r} is not supported"
                " (only 'tensorflow')"
            )
        policy = config.model_version_policy
        version_policy = policy.WhichOneof("policy_choice")
        if version_policy == "all":
            return cls(config.name, config.base_path, "all")
        if version_policy == "specific":
            return cls(config.name, config.base_path, "specific", tuple(policy.specific.versions))
        latest = version_policy == "latest" and policy.latest.num_versions
        num = policy.latest.num_versions if latest else 1
        return cls(config.name, config.base_path, "latest", num_versions=num)


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
    """Parse a `models.config` text protobuf into validated `ModelConfig`s."""
    server_config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, server_config)
    except text_format.ParseError as e:
        raise ModelConfigError(f"models.config does not parse as ModelServerConfig: {e}") from e
    if server_config.WhichOneof("config") != "model_config_list":
        raise ModelConfigError("models.config: only model_config_list is supported")
    configs = [ModelConfig.from_proto(c) for c in server_config.model_config_list.config]
    models_config_proto(configs)  # the list-level checks (non-empty, unique names)
    return configs


def read_models_config(path: str) -> list[ModelConfig]:
    with open(path, encoding="utf-8") as f:
        return parse_models_config(f.read())


def write_models_config(path: str, configs: Sequence[ModelConfig]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(models_config_text(configs))
