"""The floors (docs/extending.md): every import in src/relive points down and no package has an import cycle, as
pyproject.toml's [tool.importlinter] contracts declare them (``make test`` runs ``lint-imports`` too)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]


def test_every_import_points_down_and_no_cycle():
    exe = Path(sys.executable).with_name("lint-imports")
    exe = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert exe, "lint-imports is not installed (pip install -e '.[test]')"
    # this checkout's src/ first, so that the contracts check the code under test, not an installed copy
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([exe, "--no-cache", "--no-logo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    declared = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")  # (tomllib: 3.11+)
    assert declared >= 3  # the floors, inside relive.replay (storage below samplers below buffer), no cycles
    assert f"Contracts: {declared} kept, 0 broken." in run.stdout
