"""Released models by name (electra_tf/convert/names.py): Hugging Face Hub ids and keras-hub
presets, found in download caches filled by hand as the libraries lay them out
(tests/hub_caches.py), with the network off (HF_HUB_OFFLINE=1, and any request sent to a closed
port on loopback).

Every load runs in a fresh process: the libraries read their environment (cache folders, offline
mode) when imported, as they do for a user. What a name loads must equal what its folder loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from electra_tf.convert import ConversionError, hf
from electra_tf.convert.pretrained import from_pretrained, load_pretrained

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hub_caches  # noqa: E402
import convert_fixtures as fx  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DISC, GEN = "google/electra-tiny-discriminator", "google/electra-tiny-generator"
MAIN, V1 = hub_caches.commit_id("main"), hub_caches.commit_id("v1")

# Runs in a fresh process: argv[1] is a JSON list of [name or folder, network(, revision=)]; prints,
# for each,
# the model's outputs on fixed ids, its config's sizes, its vocab file and the casing recorded
# beside the resolved checkpoint.
LOAD = r"""
import json, sys
import numpy as np
from electra_tf.convert import from_pretrained, resolve_checkpoint
from electra_tf.data.casing import checkpoint_lower_case
ids = np.array([[2, 7, 9, 11, 13, 3, 0, 0], [2, 21, 5, 6, 3, 17, 19, 3]], np.int32)
inputs = {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32),
          "segment_ids": np.zeros_like(ids)}
out = []
for spec, network, *revision in json.loads(sys.argv[1]):
    model, config, vocab = from_pretrained(spec, network, revision=(revision or [None])[0])
    spec = spec + (f" revision={revision[0]}" if revision else "")
    result = model(inputs)
    key = "rtd_logits" if "rtd_logits" in result else ("mlm_logits" if "mlm_logits" in result
                                                        else "sequence_output")
    out.append({"spec": spec, "output": np.asarray(result[key]).tolist(),
                "hidden_size": config.hidden_size, "vocab": vocab,
                "lower_case": checkpoint_lower_case(resolve_checkpoint(spec.split()[0] + (
                    "@" + revision[0] if revision else "")))[0]})
print("RESULT " + json.dumps(out))
"""


def load_in_process(specs, env, cwd=REPO) -> list[dict]:
    result = subprocess.run([sys.executable, "-c", LOAD, json.dumps(specs)], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def releases(tmp_path_factory, tiny_ckpt):
    """Two revisions of a released pair as Hugging Face folders, and a cache holding them: the
    discriminator's `main` is the tiny checkpoint (uncased), its tag `v1` (and commit V1) other
    weights, cased; the generator's `main` goes with `main`."""
    root = tmp_path_factory.mktemp("releases")
    main = load_pretrained(tiny_ckpt, "pretrainer")
    hf.export_hf(main.model, root / "main", vocab_file=main.vocab_path, lower_case=True)
    other = root / "tf1_v1"
    fx.write_tf1(other, fx.random_tensors(fx.released_shapes(**fx.TINY, gen_hidden=64,
                                                             gen_layers=2), seed=1),
                 vocab_size=fx.TINY["vocab"])
    v1 = load_pretrained(other, "pretrainer")
    hf.export_hf(v1.model, root / "v1", vocab_file=v1.vocab_path, lower_case=False)
    cache = root / "hf_cache"
    hub_caches.put_hf_snapshot(cache, DISC, root / "main" / "discriminator", MAIN)
    hub_caches.put_hf_snapshot(cache, DISC, root / "v1" / "discriminator", V1, refs=("v1",))
    hub_caches.put_hf_snapshot(cache, GEN, root / "main" / "generator", MAIN)
    return {"root": root, "cache": cache, "main": root / "main", "v1": root / "v1"}


def test_a_hub_id_loads_from_the_cache_as_its_folder_with_and_without_revision(releases):
    main, v1 = releases["main"], releases["v1"]
    specs = [[DISC, "discriminator"], [str(main / "discriminator"), "discriminator"],
             [f"{DISC}@v1", "discriminator"], [f"{DISC}@{V1}", "discriminator"],
             [f"hf://{DISC}@v1", "discriminator"], [str(v1 / "discriminator"), "discriminator"],
             [DISC, "discriminator", "v1"],
             [GEN, "generator"], [str(main / "generator"), "generator"]]
    got = {r["spec"]: r for r in load_in_process(specs, hub_caches.offline_env(releases["cache"]))}
    by_name = {DISC: str(main / "discriminator"), f"{DISC}@v1": str(v1 / "discriminator"),
               f"{DISC}@{V1}": str(v1 / "discriminator"),
               f"hf://{DISC}@v1": str(v1 / "discriminator"), GEN: str(main / "generator"),
               f"{DISC} revision=v1": str(v1 / "discriminator")}
    for name, folder in by_name.items():
        assert got[name]["output"] == got[folder]["output"], name  # bit for bit
        assert got[name]["lower_case"] == got[folder]["lower_case"], name
        assert got[name]["vocab"].startswith(str(releases["cache"])), name  # the downloaded one
    # The revisions differ, and each brings its own casing (tokenizer_config.json).
    assert not np.allclose(got[DISC]["output"], got[f"{DISC}@v1"]["output"])
    assert (got[DISC]["lower_case"], got[f"{DISC}@v1"]["lower_case"]) == (True, False)
    assert f"snapshots/{V1}" in got[f"{DISC}@v1"]["vocab"]


def test_a_folder_that_exists_wins_over_a_hub_id(releases, tmp_path):
    """A relative folder spelled like a Hub id is loaded; the cache's other weights are not."""
    local = tmp_path / DISC
    local.parent.mkdir(parents=True)
    os.symlink(releases["v1"] / "discriminator", local)
    env = hub_caches.offline_env(releases["cache"])
    here, folder = load_in_process([[DISC, "discriminator"],
                                    [str(releases["v1"] / "discriminator"), "discriminator"]],
                                   env, cwd=tmp_path)
    cached = load_in_process([[DISC, "discriminator"]], env)[0]
    assert here["vocab"] == f"{DISC}/vocab.txt"  # read where it was found, not from the cache
    assert here["output"] == folder["output"]
    assert not np.allclose(here["output"], cached["output"])


def convert_cli(*args, env):
    return subprocess.run([sys.executable, "-m", "electra_tf.tools.convert", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def weights(model) -> dict:
    return {v.path: v.numpy() for v in model.weights}


@pytest.mark.slow  # two conversions in fresh processes
def test_electra_convert_takes_a_hub_id(releases, tmp_path):
    env = hub_caches.offline_env(releases["cache"])
    result = convert_cli(f"--input={DISC}@v1", f"--output={tmp_path / 'ours'}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = from_pretrained(tmp_path / "ours")[0], \
        from_pretrained(releases["v1"] / "discriminator")[0]
    assert weights(got).keys() == weights(expected).keys()
    for name, value in weights(expected).items():
        np.testing.assert_array_equal(weights(got)[name], value, err_msg=name)
    # A released generator alone converts as the generator (--network=auto), and is named as one
    # when asked for a discriminator.
    result = convert_cli(f"--input={GEN}", f"--output={tmp_path / 'gen'}", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = from_pretrained(tmp_path / "gen", "generator")[0], \
        from_pretrained(releases["main"] / "generator", "generator")[0]
    for name, value in weights(expected).items():
        np.testing.assert_array_equal(weights(got)[name], value, err_msg=name)
    with pytest.raises(ConversionError, match=r"holds a generator \(ElectraForMaskedLM\): load "
                                              r"it as network='generator'"):
        from_pretrained(releases["main"] / "generator")
    # Unknown offline: one line saying what was tried and how to pre-fetch; nothing written.
    result = convert_cli("--input=google/electra-unheard-of", f"--output={tmp_path / 'none'}",
                         env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("electra-convert: error: google/electra-unheard-of: not a local path, "
                           "and the machine is offline (HF_HUB_OFFLINE=1)"), last
    assert "hf download google/electra-unheard-of" in last and str(releases["cache"]) in last
    assert not (tmp_path / "none").exists()


ERRORS = r"""
import sys
if sys.argv[1] == "no-hub":
    sys.modules["huggingface_hub"] = None  # as on a plain install
if sys.argv[1] == "no-keras-hub":
    sys.modules["keras_hub"] = None
from electra_tf.convert import NameNotFoundError, from_pretrained
try:
    from_pretrained(sys.argv[2])
except NameNotFoundError as e:
    print("ERROR " + str(e))
"""


@pytest.mark.parametrize("case, name, expected", [
    ("offline", "someone/missing@v2",
     "someone/missing@v2: not a local path, and the machine is offline (HF_HUB_OFFLINE=1) while "
     "the Hugging Face cache ({cache}) does not hold someone/missing at revision v2; pre-fetch it "
     "on a machine with a network: hf download someone/missing --revision v2"),
    ("offline", f"{DISC}@v9",
     f"{DISC}@v9: not a local path, and the machine is offline (HF_HUB_OFFLINE=1) while the "
     f"Hugging Face cache ({{cache}}) does not hold {DISC} at revision v9"),
    ("offline", "runs/demo/pretrain/discriminatr",
     "runs/demo/pretrain/discriminatr: no file or folder runs/demo/pretrain/discriminatr; not a "
     "Hugging Face Hub id (owner/name[@revision])"),
    ("no-hub", DISC,
     f"{DISC}: no file or folder {DISC}; a Hugging Face Hub id needs huggingface_hub "
     "(pip install 'electra_tf[hf]')"),
    ("no-keras-hub", "electra_small_discriminator_uncased_en",
     "electra_small_discriminator_uncased_en: no file or folder "
     "electra_small_discriminator_uncased_en; a keras-hub preset name needs keras-hub "
     "(pip install 'electra_tf[keras_hub]'); not a Hugging Face Hub id"),
    ("offline", "electra_small_discriminator_uncased_en",
     "electra_small_discriminator_uncased_en: keras-hub preset (kaggle://keras/electra/keras/"
     "electra_small_discriminator_uncased_en/2): config.json is not in the kagglehub cache "
     "({kaggle}) and Kaggle cannot be reached (the machine looks offline); pre-fetch it on a "
     "machine with a network: python -c \"import kagglehub; kagglehub.model_download("
     "'keras/electra/keras/electra_small_discriminator_uncased_en/2')\""),
])
def test_a_name_that_resolves_to_nothing_says_what_was_tried(releases, tmp_path, case, name,
                                                             expected):
    if "keras-hub preset (" in expected:
        pytest.importorskip("keras_hub", reason="the keras_hub extra")
    env = hub_caches.offline_env(releases["cache"], tmp_path / "kaggle")
    result = subprocess.run([sys.executable, "-c", ERRORS, case, name], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    message = [x for x in result.stdout.splitlines() if x.startswith("ERROR ")][-1][len("ERROR "):]
    expected = expected.format(cache=releases["cache"], kaggle=tmp_path / "kaggle")
    assert message.startswith(expected), message
    assert "\n" not in message


# --- keras-hub presets --------------------------------------------------------------------------
PRESET = "electra_small_discriminator_uncased_en"
KAGGLE = "keras/electra/keras/electra_small_discriminator_uncased_en/2"


@pytest.mark.slow  # keras-hub writes the preset; a fresh process loads it three ways
def test_a_keras_hub_preset_loads_from_the_kaggle_and_hf_caches(releases, tmp_path):
    pytest.importorskip("keras_hub", reason="the keras_hub extra")
    pytest.importorskip("kagglehub", reason="keras-hub's Kaggle downloader")
    from electra_tf.convert.pretrained import to_keras_hub_preset

    preset = tmp_path / "preset"
    to_keras_hub_preset(str(releases["main"] / "discriminator"), preset)
    kaggle, hf_cache = tmp_path / "kaggle", releases["cache"]
    # The built-in preset's name, its handle, served from the cache with this tiny model in it.
    hub_caches.put_kaggle_model(kaggle, KAGGLE, preset)
    hub_caches.put_hf_snapshot(tmp_path / "hf", "someone/electra-preset", preset,
                               hub_caches.commit_id("preset"))
    specs = [[PRESET, "discriminator"], [f"kaggle://{KAGGLE}", "discriminator"],
             [str(preset), "discriminator"]]
    got = load_in_process(specs, hub_caches.offline_env(hf_cache, kaggle))
    got += load_in_process([["hf://someone/electra-preset", "discriminator"],
                            ["someone/electra-preset", "discriminator"]],
                           hub_caches.offline_env(tmp_path / "hf", kaggle))
    folder = got[2]
    for r in got[:2] + got[3:]:
        assert r["output"] == folder["output"], r["spec"]
        assert r["lower_case"] is True and r["vocab"].endswith("assets/tokenizer/vocabulary.txt")
    assert got[0]["vocab"].startswith(str(kaggle)) and got[3]["vocab"].startswith(str(tmp_path))


def test_paths_of_other_file_systems_are_never_names():
    """gs:// (a TPU run's checkpoints) goes to TensorFlow's file system as before; hf:// and
    kaggle:// are handles to resolve."""
    from electra_tf.convert.names import is_local, resolve_checkpoint

    assert resolve_checkpoint("gs://bucket/electra_small/model.ckpt-1000000") == \
        "gs://bucket/electra_small/model.ckpt-1000000"
    assert not is_local("hf://google/electra-small-discriminator")
    assert not is_local(f"kaggle://{KAGGLE}")


def test_a_revision_keyword_is_for_hub_ids_only(releases):
    from electra_tf.convert.names import with_revision

    assert with_revision(DISC, "v1") == f"{DISC}@v1" and with_revision(DISC, None) == DISC
    with pytest.raises(ValueError, match=r"names a revision already"):
        with_revision(f"{DISC}@v1", "v2")
    with pytest.raises(ValueError, match=r"belongs to a Hugging Face Hub id"):
        from_pretrained(releases["main"] / "discriminator", revision="v1")
