"""`electra-<command> --help` lists the command's own flags with their help, and answers without
importing TensorFlow (the commands import it after the flags are parsed)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = re.findall(r'"(electra-[a-z-]+)=electra_tf\.tools\.(\w+):run"', (ROOT / "setup.py").read_text())

# Runs the console script's `run()` as the installed wrapper does, then reports on stderr.
_PROBE = """
import json, sys
sys.argv = [{script!r}, "--help"]
code = None
try:
    from electra_tf.tools.{module} import run
    run()
except SystemExit as e:
    code = e.code
from absl import flags
own = [f.name for f in flags.FLAGS.get_key_flags_for_module("electra_tf.tools.{module}")]
doc = sys.modules["electra_tf.tools.{module}"].__doc__
print(json.dumps({{"code": code, "tensorflow": "tensorflow" in sys.modules, "flags": own,
                   "first_line": doc.strip().splitlines()[0]}}), file=sys.stderr)
"""


def test_every_command_is_found():
    assert len(SCRIPTS) >= 9 and ("electra-pretrain", "pretrain") in SCRIPTS


@pytest.mark.parametrize("script,module", SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_help_lists_own_flags_without_tensorflow(script, module):
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(script=script, module=module)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), proc.stderr[-2000:]
    assert not report["tensorflow"], f"{script} --help imported TensorFlow"
    help_text = proc.stdout
    assert report["first_line"] in help_text  # the module docstring is the usage text
    assert report["flags"], f"tools/{module}.py defines no flags?"
    for name in report["flags"]:
        assert re.search(rf"--(\[no\])?{name}\b", help_text), f"{script} --help does not list --{name}"
    assert "Try --helpfull" not in help_text.splitlines()[-1] or len(report["flags"]) > 0
