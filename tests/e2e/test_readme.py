"""README.md's commands against the code: every flag a README command passes exists on that
command (static, fast), and the README's own command blocks run at tiny sizes (slow)."""

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.readme_commands import ROOT, program_and_flags, sh_commands
from tests.server_process import serving

SCRIPTS = dict(re.findall(r'"(electra-[a-z-]+)=electra_tf\.tools\.(\w+):run"', (ROOT / "setup.py").read_text()))

_FLAGS_OF = """
import json, sys
import {module}
from absl import flags
print(json.dumps([f.name for f in flags.FLAGS.get_key_flags_for_module("{module}")]))
"""


@functools.cache  # a module named by several docs is asked once (each ask imports it afresh)
def _module_flags(module: str) -> frozenset[str]:
    proc = subprocess.run([sys.executable, "-c", _FLAGS_OF.format(module=module)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return frozenset(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_readme_has_the_commands_it_documents():
    programs = {program_and_flags(c)[0] for c in sh_commands()}
    for expected in ("make", "electra-build-vocab", "electra-build-data", "electra-pretrain",
                     "electra-finetune", "electra-convert", "electra-export", "electra-serve",
                     "electra-client", "electra_tf.tools.replicate"):
        assert expected in programs


@pytest.mark.parametrize("doc", ["README.md", "BUILD.md", "serving/README.md"]
                         + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
def test_every_flag_in_the_docs_exists(doc):
    wanted: dict[str, set[str]] = {}
    for command in sh_commands(ROOT / doc):
        program, names = program_and_flags(command)
        # an electra-* command, or `python -m` of a tool or (from a checkout) of benchmarks/
        module = (f"electra_tf.tools.{SCRIPTS[program]}" if program in SCRIPTS else
                  program if program.startswith(("electra_tf.tools.", "benchmarks.")) else None)
        if module and module.startswith("benchmarks.") and "from absl import" not in (
                ROOT / (module.replace(".", "/") + ".py")).read_text():
            continue  # argparse (parity_curves): argparse itself refuses an unknown flag
        if module is not None:
            wanted.setdefault(module, set()).update(names)
    for module, names in sorted(wanted.items()):
        defined = _module_flags(module)
        for name in names:
            bare = name[2:] if name.startswith("no") and name[2:] in defined else name
            assert bare in defined, f"{doc} passes --{name} to {module}, which has no such flag"


def test_makefile_targets_in_the_readme_exist():
    makefile = (ROOT / "Makefile").read_text()
    for command in sh_commands():
        if command.startswith("make "):
            target = command.split()[1]
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}"


def test_deployment_files_serve_the_name_the_readme_exports():
    exports = [c for c in sh_commands() if c.startswith("electra-export ")]
    assert exports
    name = re.search(r"--model_name=(\S+)", exports[0]).group(1)
    compose = (ROOT / "serving/docker-compose.yml").read_text()
    kubernetes = (ROOT / "serving/kubernetes.yaml").read_text()
    assert re.search(rf"MODEL_NAME: {name}\b", compose)
    assert f"--model_name={name}\n" in kubernetes and f"--model_base_path=/models/{name}\n" in kubernetes
    assert f"/v1/models/{name}," in kubernetes and f"/v1/models/{name} HTTP" in compose


# --- the README's command blocks, run as written at tiny sizes -----------------------------------
# Flags appended to a README command (absl: the last value wins) to make it tiny; every flag and
# path the README writes is still passed as written. The pretraining run is the tiny model (2
# layers, 64 wide): every later command starts from it (fine-tuning, conversion, export and the
# released models it stands in for), so each traces a small graph, not ELECTRA-Small's.
TINY = {
    "electra-pretrain": ["--config=electra_tiny", "--train_batch_size=8", "--num_train_steps=2", "--num_warmup_steps=1",
                         "--steps_per_loop=1", "--save_checkpoints_steps=2", "--nocheck_shards"],
    "electra-finetune": ["--num_seeds=1", "--max_train_examples=32", "--max_eval_examples=32",
                         "--num_train_epochs=1", "--train_batch_size=16", "--max_seq_length=32"],
}
SECTIONS = ("## Pretrain on your own text", "## Fine-tune", "## Start from the released checkpoints",
            "## Export and serve with TF Serving")


def _section_commands(title: str) -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        section = Path(folder) / "section.md"
        section.write_text(text[start:end if end > 0 else None], encoding="utf-8")
        return sh_commands(section)


def _program(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.exists() else [sys.executable, "-m", f"electra_tf.tools.{SCRIPTS[name]}"]


def _run(command: str, work: Path, env: dict, timeout=600) -> str:
    import shlex

    words = shlex.split(command)
    words = _program(words[0]) + words[1:] + TINY.get(words[0], [])
    proc = subprocess.run(words, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _corpus(work: Path) -> None:
    import itertools

    from electra_tf.data import corpus

    (work / "corpus").mkdir()
    # 100 reviews: shards for the 2 pretraining steps; WordPiece learning time grows with the text
    docs = list(itertools.islice(corpus.imdb_documents(), 100))
    (work / "corpus" / "imdb.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
    rows = ["review,stars"] + [f"\"{s.replace(chr(34), '')}\",{i % 3 + 1}"
                               for i, s in enumerate(d[0] for d in docs[:80])]
    (work / "train.csv").write_text("\n".join(rows[:61]) + "\n")
    (work / "dev.csv").write_text("\n".join(rows[:1] + rows[61:]) + "\n")
    from tests.finetune.test_glue import GLUE_DATA

    (work / "glue_data" / "MRPC").mkdir(parents=True)
    for name, text in GLUE_DATA["MRPC"].items():
        if name == "train.tsv":  # at least one batch of the tiny run's 16 (a bigger one is refused)
            header, *rows = text.splitlines(keepends=True)
            text = header + "".join(rows * 8)
        (work / "glue_data" / "MRPC" / name).write_text(text, encoding="utf-8")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_readme_command_blocks_run_as_written(tmp_path):
    import os
    import socket
    import time
    import urllib.request

    work = tmp_path / "work"
    work.mkdir()
    _corpus(work)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ran = []
    # Pretrain on your own text: vocabulary, shards, ELECTRA-Small (2 steps).
    for command in _section_commands(SECTIONS[0]):
        _run(command, work, env)
        ran.append(command.split()[0])
    assert ran == ["electra-build-vocab", "electra-build-data", "electra-pretrain"]
    assert (work / "runs/small/discriminator").is_dir()
    # Fine-tune: every command whose data is here (TFDS folders are not).
    for command in _section_commands(SECTIONS[1]):
        if "--tfds_data_dir" in command:
            continue
        _run(command.replace("--init_checkpoint=...", "--init_checkpoint=runs/small/discriminator"),
             work, env)
        ran.append(command.split("--task=")[1].split()[0])
    assert ran[3:] == ["rotten_tomatoes", "mrpc", "classification"]
    assert (work / "runs/ft_rt/best").is_dir() and (work / "runs/mrpc/best/submission/MRPC.tsv").exists()
    # Start from the released checkpoints: our run written as the authors' TF1 layout stands in,
    # and, in a Hugging Face cache read offline, for the released pairs named by their Hub ids
    # (written in this process: these two conversions are the test's setup, not README commands).
    import contextlib

    from electra_tf.convert import pretrained

    with contextlib.chdir(work):  # the run records its --vocab_file as the README wrote it
        for output, output_format in (("models/electra_small", "tf1"), ("hub/small", "hf")):
            pretrained.convert("runs/small", output, output_format=output_format)
    from tests.hub_caches import commit_id, offline_env, put_hf_snapshot

    for repo, folder in (("google/electra-small-discriminator", "discriminator"),
                         ("google/electra-small-generator", "generator"),
                         ("google/electra-base-discriminator", "discriminator")):
        put_hf_snapshot(work / "hf_cache", repo, work / "hub/small" / folder, commit_id(repo))
    hub_env = offline_env(work / "hf_cache", PYTHONPATH=env["PYTHONPATH"])
    for command in _section_commands(SECTIONS[2]):
        out = _run(command, work, hub_env)
        if command.startswith("electra-convert"):
            assert "missing (0)" in out
        ran.append(command.split()[0])
    assert ran[-4:] == ["electra-finetune", "electra-pretrain", "electra-convert", "electra-convert"]
    assert (work / "small_hf/discriminator/model.safetensors").exists()
    assert (work / "runs/ft_small/best").is_dir() and (work / "base_tf1").is_dir()
    record = json.loads((work / "runs/small_more/pretraining_config.json").read_text())
    assert record["init_checkpoint"]["released"]["name"] == "google/electra-small-discriminator"
    # Export and serve: /tmp/ inside this test's folder, free ports for 8501/8500.
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0)), b.bind(("127.0.0.1", 0))
        rest, grpc = str(a.getsockname()[1]), str(b.getsockname()[1])
    commands = [c.replace("/tmp/", f"{work}/tmp/").replace("8501", rest).replace("8500", grpc)
                for c in _section_commands(SECTIONS[3])]
    export, serve, curl, client = commands
    _run(export, work, env)
    import shlex

    words = shlex.split(serve)
    url = f"http://127.0.0.1:{rest}/v1/models/electra_rt"
    with serving(_program(words[0]) + words[1:], url, cwd=work, env=env):
        body, target = re.search(r"-d '(.*)' (\S+)", curl).groups()
        answer = json.loads(urllib.request.urlopen(
            urllib.request.Request(target, data=body.encode()), timeout=30).read())
        assert answer["predictions"][0]["label"] in ("negative", "positive")
        out = _run(client, work, env)
        assert '"label"' in out
