"""benchmarks/suite_costs.py sums the CPU report per file and per command."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import suite_costs

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


def _report(prefix: Path) -> None:
    rows = [
        dict(test="tests/a.py::t1", file="tests/a.py", wall=3.0, self=1.0, children=5.0, launches=2,
             servers=1, waited=[[f"{PY} -m electra_tf.tools.export --x=1", 3.0], [f"{PY} -c pass", 0.5]]),
        dict(test="tests/a.py::t2", file="tests/a.py", wall=1.0, self=0.5, children=0.0, launches=0,
             waited=[]),
        dict(test="tests/b.py::t", file="tests/b.py", wall=9.0, self=8.0, children=1.5, launches=1,
             waited=[[f"{PY} /tmp/x/loader.py a b", 1.5]]),
    ]
    with open(f"{prefix}.gw0.jsonl", "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in rows[:2])
    with open(f"{prefix}.gw1.jsonl", "w") as out:
        out.write(json.dumps(rows[2]) + "\n")


def test_files_are_summed_and_ranked_by_cpu(tmp_path):
    _report(tmp_path / "run")
    table = suite_costs.per_file(suite_costs.read(str(tmp_path / "run")))
    assert [name for name, _ in table] == ["tests/b.py", "tests/a.py"]
    assert table[1][1]["self"] == 1.5 and table[1][1]["children"] == 5.0 and table[1][1]["tests"] == 2


def test_commands_are_named_by_module_code_or_script(tmp_path):
    assert suite_costs.command_name(f"{PY} -m electra_tf.tools.export --a") == "-m electra_tf.tools.export"
    assert suite_costs.command_name(f"{PY} -c import sys") == "-c"
    assert suite_costs.command_name(f"{PY} /tmp/x/loader.py a") == "loader.py"
    assert suite_costs.command_name("/usr/bin/pgrep -P 1") == "pgrep"
    _report(tmp_path / "run")
    out = subprocess.run([PY, "-m", "benchmarks.suite_costs", str(tmp_path / "run"), "--commands"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[1].split() == ["3", "1", "-m", "electra_tf.tools.export"]
    head = subprocess.run([PY, "-m", "benchmarks.suite_costs", str(tmp_path / "run")], cwd=REPO,
                          capture_output=True, text=True, timeout=60).stdout.splitlines()[0]
    assert head == "3 tests, 16 CPU-s (0.3 CPU-minutes), 3 processes started, 1 preloaded servers"
