"""The built wheel installs one top-level name, `electra_tf`: the repo's `configs/`, `serving/` and
`tools/` travel inside it (setup.py's package_dir), and every console script points into it."""

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_installs_only_electra_tf(tmp_path):
    source = tmp_path / "source"  # a copy, so that the build's own folders stay out of the checkout
    source.mkdir()
    for name in ("setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("electra_tf", "configs", "serving", "tools", "benchmarks"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("electra_tf-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode())
    dist_info = next(n for n in names if ".dist-info/" in n).split("/")[0]
    assert {n.split("/")[0] for n in names} == {"electra_tf", dist_info}
    for package in ("configs", "serving", "tools"):
        assert f"electra_tf/{package}/__init__.py" in names
    assert "electra_tf/configs/electra_small.json" in names
    assert "electra_tf/serving/kubernetes.yaml" in names
    # the instruments (benchmarks, reference implementations) are not the product
    instruments = {p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"}
    assert instruments and not {n.rsplit("/", 1)[-1] for n in names} & instruments
    scripts = dict(entry_points["console_scripts"])
    assert len(scripts) >= 9
    for script, target in scripts.items():
        module = target.split(":")[0]
        assert module.startswith("electra_tf.tools."), (script, target)
        assert module.replace(".", "/") + ".py" in names, (script, target)
