"""README.md's commands against the code: every flag a README command passes exists on that
command (static, fast), and the README's own command blocks run at tiny sizes (slow)."""

import re
import subprocess
import sys

import pytest

from tests.e2e.readme_commands import ROOT, program_and_flags, sh_commands

SCRIPTS = dict(re.findall(r'"(electra-[a-z-]+)=tools\.(\w+):run"', (ROOT / "setup.py").read_text()))

_FLAGS_OF = """
import json, sys
import tools.{module}
from absl import flags
print(json.dumps([f.name for f in flags.FLAGS.get_key_flags_for_module("tools.{module}")]))
"""


def _module_flags(module: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _FLAGS_OF.format(module=module)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_readme_has_the_commands_it_documents():
    programs = {program_and_flags(c)[0] for c in sh_commands()}
    for expected in ("make", "electra-build-vocab", "electra-build-data", "electra-pretrain",
                     "electra-finetune", "electra-convert", "electra-export", "electra-serve",
                     "electra-client", "tools.replicate"):
        assert expected in programs


@pytest.mark.parametrize("doc", ["README.md", "BUILD.md", "serving/README.md"])
def test_every_flag_in_the_docs_exists(doc):
    wanted: dict[str, set[str]] = {}
    for command in sh_commands(ROOT / doc):
        program, names = program_and_flags(command)
        module = SCRIPTS.get(program) or (program.split(".", 1)[1] if program.startswith("tools.") else None)
        if module is not None:
            wanted.setdefault(module, set()).update(names)
    for module, names in sorted(wanted.items()):
        defined = _module_flags(module)
        for name in names:
            bare = name[2:] if name.startswith("no") and name[2:] in defined else name
            assert bare in defined, f"{doc} passes --{name} to tools/{module}.py, which has no such flag"


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
