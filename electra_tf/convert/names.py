"""Released models by name: a Hugging Face Hub id or a keras-hub preset -> a local folder.

Wherever a checkpoint is accepted (`from_pretrained`, `electra-convert --input`, the
`--init_checkpoint` of `electra-finetune` and `electra-pretrain`), `resolve_checkpoint` runs first:

  1. a path that exists (a folder, a file, or a TF1 prefix with its `.index`), or a path of a
     file system TensorFlow reads (`gs://...`), is used as it is and never looked up as a name,
     whatever it looks like;
  2. a keras-hub preset name (`electra_base_discriminator_uncased_en`) or a `kaggle://` handle:
     keras-hub itself fetches the preset's files (`keras_hub.src.utils.preset_utils.get_file`,
     what `from_preset` calls: Kaggle through `kagglehub` and its cache, `KAGGLEHUB_CACHE`);
  3. a Hugging Face Hub id, `owner/name` or `owner/name@revision` (a branch, tag or commit), or an
     `hf://owner/name` handle as keras-hub writes it: `huggingface_hub.snapshot_download`, so the
     cache (`HF_HUB_CACHE` / `HF_HOME`), `HF_HUB_OFFLINE`, `HF_TOKEN` and mirrors (`HF_ENDPOINT`)
     work as in `transformers`. Only what a loader reads is fetched: configs, vocabulary,
     tokenizer files and one weights format (safetensors; `pytorch_model.bin` when there is none).
     The repository may hold a Hugging Face model, a keras-hub preset or an electra_tf folder:
     the folder's format is then detected as for a local one.

The result is a local folder, so everything downstream (format detection, the vocabulary, the
casing recorded in `tokenizer_config.json`) reads what was downloaded. A name that resolves to
nothing raises `NameNotFoundError`: one line saying what was tried and, offline, how to pre-fetch.
`huggingface_hub` (the `hf` extra) and keras-hub (the `keras_hub` extra) are optional: without
them local paths load as before, and a name says which extra to install.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
from pathlib import Path

from absl import logging

from electra_tf.convert.common import ConversionError

# owner/name with an optional @revision: Hugging Face's repo-id characters, one slash.
_HUB_ID = re.compile(
    r"^(?:hf://)?(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
# A keras-hub preset name: snake_case, no slash (electra_small_discriminator_uncased_en).
_PRESET_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
KAGGLE_PREFIX = "kaggle://"
# What a loader may read from a downloaded repository (Hugging Face, keras-hub, electra_tf).
_METADATA = ["config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
             "tokenizer.json", "metadata.json", "assets/*", "assets/**", "electra_tf_*.json",
             "*casing*.json", "model.index", "model.data-*", "model.weights.h5",
             "discriminator/*", "generator/*"]
_SAFETENSORS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
_TORCH = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
# A keras-hub preset's files: the backbone's two, then the tokenizer's and ours (a preset may
# have no tokenizer; only electra_tf writes electra_tf_preset.json).
_PRESET_REQUIRED = ("config.json", "model.weights.h5")
_PRESET_OPTIONAL = ("metadata.json", "tokenizer.json", "assets/tokenizer/vocabulary.txt",
                    "electra_tf_preset.json")
HF_EXTRA = "pip install 'electra_tf[hf]'"
KERAS_HUB_EXTRA = "pip install 'electra_tf[keras_hub]'"


class NameNotFoundError(ConversionError):
    """A checkpoint name that is no local path and did not resolve; the message says what was
    tried."""


@dataclasses.dataclass(frozen=True)
class Resolved:
    """Where a name was found: `path` (local), `source` ("local", "huggingface" or
    "keras_hub"), and for a download the name as given and the revision (a Hub commit)."""

    path: str
    source: str = "local"
    name: str | None = None
    revision: str | None = None

    def describe(self) -> dict | None:
        """For run records: the name and the exact revision; None for a local path."""
        if self.source == "local":
            return None
        return {"name": self.name, "source": self.source, "revision": self.revision,
                "folder": self.path}


def is_local(path) -> bool:
    """A path that exists here (a file, a folder, or a TF1 checkpoint prefix), or one of a file
    system TensorFlow reads (`gs://...`): never looked up as a name."""
    text = str(path)
    scheme = text.split("://", 1)[0] if "://" in text else None
    if scheme is not None:
        return scheme not in ("hf", "kaggle")
    p = os.path.expanduser(text)
    return os.path.exists(p) or os.path.exists(p + ".index")


def resolve_checkpoint(path):
    """`path` itself when it exists locally (or is not a string), else the local folder the name
    resolves to (see the module docstring). Raises NameNotFoundError."""
    if path is None or not isinstance(path, (str, os.PathLike)) or is_local(path):
        return path
    return resolve(str(path)).path


def with_revision(path, revision: str | None):
    """`owner/name@revision` for `revision=` given as a keyword (as `transformers` takes it);
    `path` unchanged without one. A revision is for a Hub id: with a local path, or a name that
    already has one, it is a ValueError."""
    if revision is None:
        return path
    if path is None or is_local(path) or not _HUB_ID.match(str(path)):
        raise ValueError(f"revision={revision!r}: a revision belongs to a Hugging Face Hub id "
                         f"(owner/name), and {path} is not one")
    if "@" in str(path):
        raise ValueError(f"revision={revision!r}: {path} names a revision already")
    return f"{path}@{revision}"


def resolve(name: str) -> Resolved:
    """`Resolved` for a local path or a released model's name; raises NameNotFoundError."""
    if is_local(name):
        return Resolved(str(name))
    return _resolve_remote(str(name))


@functools.lru_cache(maxsize=None)
def _resolve_remote(name: str) -> Resolved:
    tried = [f"no file or folder {name}"]
    if name.startswith(KAGGLE_PREFIX) or _PRESET_NAME.match(name):
        found = _keras_hub_preset(name, tried)
        if found is not None:
            return found
    hub = _HUB_ID.match(name)
    if hub:
        return _hub_snapshot(name, hub.group("repo"), hub.group("revision"), tried)
    if not name.startswith(KAGGLE_PREFIX):
        tried.append("not a Hugging Face Hub id (owner/name[@revision])")
    raise NameNotFoundError(f"{name}: " + "; ".join(tried))


# --- keras-hub -----------------------------------------------------------------------------------
def _keras_hub_preset(name: str, tried: list) -> Resolved | None:
    """The local folder of a keras-hub preset name or kaggle:// handle, fetched by keras-hub; None
    (with what was tried noted) when it is not one."""
    try:
        importlib.import_module("keras_hub")  # registers the built-in presets
        from keras_hub.src.utils import preset_utils
    except ImportError:
        tried.append(f"a keras-hub preset name needs keras-hub ({KERAS_HUB_EXTRA})")
        if name.startswith(KAGGLE_PREFIX):
            raise NameNotFoundError(f"{name}: " + "; ".join(tried)) from None
        return None
    if not name.startswith(KAGGLE_PREFIX) and name not in preset_utils.BUILTIN_PRESETS:
        electra = sorted(p for p in preset_utils.BUILTIN_PRESETS if p.startswith("electra_"))
        tried.append(f"not a keras-hub preset (ELECTRA's: {', '.join(electra)})")
        return None
    handle = preset_utils.BUILTIN_PRESETS.get(name, {}).get("kaggle_handle", name)
    folder = None
    for file in _PRESET_REQUIRED + _PRESET_OPTIONAL:
        try:
            local = preset_utils.get_file(name, file)
        except Exception as e:  # noqa: BLE001  kagglehub raises its own HTTP and cache errors
            if file in _PRESET_REQUIRED:
                raise NameNotFoundError(f"{name}: keras-hub preset ({handle}): "
                                        f"{_preset_problem(handle, file, e)}") from None
            if not isinstance(e, FileNotFoundError):  # there, perhaps, but not reachable
                logging.warning("keras-hub preset %s: %s not fetched (%s)", name, file,
                                _one_line(e))
            continue
        if folder is None:
            folder = os.path.dirname(local)
    logging.info("keras-hub preset %s (%s) -> %s", name, handle, folder)
    # A Kaggle handle ends in its version when it names one (owner/model/keras/variation[/N]);
    # kagglehub's cache folder is named by the version it fetched.
    version = Path(folder).name
    return Resolved(folder, "keras_hub", name, version if version.isdigit() else None)


def _preset_problem(handle: str, file: str, error: Exception) -> str:
    """What went wrong fetching `file`: offline and not cached (with how to pre-fetch), or the
    library's own message."""
    text = str(error).lower()
    if not any(word in text for word in ("connect", "resolve", "network", "offline", "timed out")):
        return f"{file}: {_one_line(error)}"
    cache = os.environ.get("KAGGLEHUB_CACHE", "~/.cache/kagglehub")
    model = handle.removeprefix(KAGGLE_PREFIX)
    return (f"{file} is not in the kagglehub cache ({cache}) and Kaggle cannot be reached (the "
            "machine looks offline); pre-fetch it on a machine with a network: python -c "
            f"\"import kagglehub; kagglehub.model_download('{model}')\", and copy the cache or "
            "point KAGGLEHUB_CACHE at it")


# --- Hugging Face Hub ----------------------------------------------------------------------------
def _hub_snapshot(name: str, repo: str, revision: str | None, tried: list) -> Resolved:
    try:
        import huggingface_hub
        from huggingface_hub import errors
    except ImportError:
        tried.append(f"a Hugging Face Hub id needs huggingface_hub ({HF_EXTRA})")
        raise NameNotFoundError(f"{name}: " + "; ".join(tried)) from None
    where = f"Hugging Face Hub {repo}" + (f"@{revision}" if revision else "")
    try:
        folder = huggingface_hub.snapshot_download(
            repo, revision=revision, allow_patterns=_METADATA + _SAFETENSORS)
        if not _has_weights(folder):  # no safetensors in the repository: the PyTorch pickle
            folder = huggingface_hub.snapshot_download(
                repo, revision=revision, allow_patterns=_METADATA + _TORCH)
    except errors.RevisionNotFoundError:
        raise NameNotFoundError(f"{name}: {repo} on the Hugging Face Hub has no revision "
                                f"{revision!r}") from None
    except errors.GatedRepoError:
        raise NameNotFoundError(f"{name}: {repo} is gated on the Hugging Face Hub: accept its "
                                "terms there and log in (hf auth login, or HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        tried.append(f"no repository {repo} on the Hugging Face Hub (a private one needs "
                     "hf auth login or HF_TOKEN)")
        raise NameNotFoundError(f"{name}: " + "; ".join(tried)) from None
    except errors.LocalEntryNotFoundError:
        raise NameNotFoundError(f"{name}: {_offline_message(repo, revision)}") from None
    except (errors.HFValidationError, ValueError) as e:
        tried.append(f"not a valid Hugging Face Hub id ({_one_line(e)})")
        raise NameNotFoundError(f"{name}: " + "; ".join(tried)) from None
    except OSError as e:  # a full disk, a cache folder we may not write
        raise NameNotFoundError(f"{name}: {where}: {_one_line(e)}") from None
    commit = Path(folder).name
    logging.info("%s -> %s (commit %s)", where, folder, commit)
    return Resolved(folder, "huggingface", name, commit)


def _has_weights(folder) -> bool:
    names = {p.name for p in Path(folder).rglob("*")}
    return any(n.endswith(".safetensors") or n in ("model.index", "model.weights.h5")
               for n in names)


def _offline_message(repo: str, revision: str | None) -> str:
    from huggingface_hub import constants

    spec = repo + (f" --revision {revision}" if revision else "")
    why = ("the machine is offline (HF_HUB_OFFLINE=1)" if _hf_offline()
           else f"the Hub ({constants.ENDPOINT}) could not be reached")
    return (f"not a local path, and {why} while the Hugging Face cache ({constants.HF_HUB_CACHE}) "
            f"does not hold {repo}" + (f" at revision {revision}" if revision else "") +
            f"; pre-fetch it on a machine with a network: hf download {spec} "
            f"(huggingface-cli download {spec} with huggingface_hub < 1.0), and copy the cache "
            "or point HF_HUB_CACHE at it")


def _hf_offline() -> bool:
    import huggingface_hub

    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "")
