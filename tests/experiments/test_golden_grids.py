"""The golden grid expansion (issue 29, step 3's safety net): every built-in grid expands to the same runs, each
run to the same configuration, as recorded in ``golden_grid_configs.json`` -- a change to how options are declared,
registered or composed (replay names as aliases of compositions, one registry) must leave every run as it was.
A deliberate change regenerates the file: ``RELIVE_REGENERATE_GOLDEN=1 pytest tests/experiments/test_golden_grids.py``
(and says why in its commit)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.experiments.grid import GRID_DIR, load_grid
from relive.train.cli import config_from_args

GOLDEN = Path(__file__).with_name("golden_grid_configs.json")


def run_configs(grid_path: Path) -> dict[str, str]:
    """Run key -> SHA-256 of the configuration `relive train` builds for it (the runner's own command line)."""
    parser = build_parser()
    out = {}
    for spec in load_grid(grid_path).runs():
        argv = ["train", spec.preset, "--env", spec.task, "--seed", str(spec.seed), "--run-dir", "RUN",
                "--no-progress", *spec.args]
        cfg = config_from_args(parser.parse_args(argv)).to_dict()
        out[spec.key] = hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return out


def current() -> dict[str, dict[str, str]]:
    return {p.stem: run_configs(p) for p in sorted(GRID_DIR.glob("*.toml"))}


def test_every_built_in_grid_expands_to_the_recorded_runs():
    now = current()
    if os.environ.get("RELIVE_REGENERATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"regenerated {GOLDEN.name}")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(now) == sorted(golden), "a built-in grid was added or removed: regenerate the golden file"
    for grid, runs in golden.items():
        assert sorted(now[grid]) == sorted(runs), f"grid {grid!r} expands to other runs"
        changed = [key for key, digest in runs.items() if now[grid][key] != digest]
        assert not changed, f"grid {grid!r}: {len(changed)} runs now build another configuration, e.g. {changed[:3]}"


def test_the_golden_check_can_fail(tmp_path):
    """A changed argument changes the recorded digest (the check is not vacuous)."""
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nseeds = 1\ntasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "sac"\n')
    before = run_configs(grid)
    grid.write_text(grid.read_text() + 'args = ["--utd", "2"]\n')
    assert run_configs(grid).keys() == before.keys() and run_configs(grid) != before
