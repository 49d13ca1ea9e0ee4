"""Download caches filled by hand, as the libraries lay them out, for loading released models by
name without a network (electra_tf/convert/names.py).

- Hugging Face (`huggingface_hub`): `<HF_HUB_CACHE>/models--<owner>--<name>/` with `blobs/<sha256>`
  (the files' bytes), `snapshots/<commit>/<file>` (relative links into blobs/) and
  `refs/<branch or tag>` (the commit).
- Kaggle (`kagglehub`, keras-hub's built-in presets): `<KAGGLEHUB_CACHE>/models/<owner>/<model>/
  <framework>/<variation>/<version>/<file>` with a completion marker per file under `.complete/`,
  written through kagglehub's own `Cache`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path


def put_hf_snapshot(cache, repo: str, folder, commit: str, refs=("main",)) -> Path:
    """Copies every file of `folder` into the cache as revision `commit` of `repo`; the refs
    named point to it. Returns the snapshot folder."""
    owner, name = repo.split("/")
    root = Path(cache) / f"models--{owner}--{name}"
    snapshot = root / "snapshots" / commit
    for file in sorted(Path(folder).rglob("*")):
        if not file.is_file():
            continue
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


def commit_id(seed: str) -> str:
    """A 40-hex commit id."""
    return hashlib.sha1(seed.encode()).hexdigest()


def put_kaggle_model(cache, handle: str, folder) -> None:
    """Puts `folder`'s files into a kagglehub cache as the model `handle`
    (owner/model/framework/variation/version), marked complete by kagglehub itself."""
    script = (
        "import os, shutil, sys\n"
        "from pathlib import Path\n"
        "from kagglehub.cache import Cache\n"
        "from kagglehub.handle import parse_model_handle\n"
        "handle, folder = parse_model_handle(sys.argv[1]), Path(sys.argv[2])\n"
        "cache = Cache()\n"
        "for file in sorted(folder.rglob('*')):\n"
        "    if file.is_file():\n"
        "        rel = str(file.relative_to(folder))\n"
        "        target = cache.get_path(handle, rel)\n"
        "        os.makedirs(os.path.dirname(target), exist_ok=True)\n"
        "        shutil.copyfile(file, target)\n"
        "        cache.mark_as_complete(handle, rel)\n")
    subprocess.run([sys.executable, "-c", script, handle, str(folder)], check=True,
                   env=dict(os.environ, KAGGLEHUB_CACHE=str(cache)), timeout=120)


def offline_env(hf_cache=None, kaggle_cache=None, **more) -> dict:
    """The environment of a command that must find everything in the caches."""
    # Any request that still tries the network goes to a closed port on loopback (the proxy):
    # tests talk to 127.0.0.1 only, and an uncached file fails at once as it would offline.
    closed = "http://127.0.0.1:9"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", HTTPS_PROXY=closed, HTTP_PROXY=closed,
               https_proxy=closed, http_proxy=closed, **more)
    for key in ("HF_HOME", "HF_ENDPOINT", "HF_TOKEN", "NO_PROXY", "no_proxy"):
        env.pop(key, None)
    if hf_cache is not None:
        env["HF_HUB_CACHE"] = str(hf_cache)
    if kaggle_cache is not None:
        env["KAGGLEHUB_CACHE"] = str(kaggle_cache)
    return env
