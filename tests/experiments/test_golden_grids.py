"""The golden grid expansion (issue 29, step 3's safety net): every built-in grid (and every paper-budget plan under
``grids/plans/``) expands to the same runs, each run to the same settings and the same replay sampler, as recorded in
``golden_grid_configs.json`` -- a change to how options are declared, registered or composed (replay names as aliases
of compositions, one registry) must leave every run as it was.

Per run two digests: ``settings`` -- the configuration ``relive train`` builds, less the replay strategy's name and
options (so ``symmetric`` spelled as a ``mixture`` of two uniform parts is the same run), and ``sampler`` -- the
checkpoint config (class and every constructor setting, ``sampler_config``) of the sampler the run builds, which is
what the replay name and options decide. A deliberate change regenerates the file:
``RELIVE_REGENERATE_GOLDEN=1 pytest tests/experiments/test_golden_grids.py`` (and says why in its commit)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.experiments.grid import GRID_DIR, load_grid
from relive.replay.samplers import sampler_config
from relive.train.cli import config_from_args
from relive.train.trainer import build_sampler

GOLDEN = Path(__file__).with_name("golden_grid_configs.json")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_configs(grid_path: Path) -> dict[str, dict[str, str]]:
    """Run key -> {settings, sampler} digests of what `relive train` builds for it (the runner's own command line)."""
    parser = build_parser()
    out = {}
    for spec in load_grid(grid_path).runs():
        argv = ["train", spec.preset, "--env", spec.task, "--seed", str(spec.seed), "--run-dir", "RUN",
                "--no-progress", *spec.args]
        cfg = config_from_args(parser.parse_args(argv))
        settings = cfg.to_dict()
        settings["replay"] = {k: v for k, v in settings["replay"].items() if k in ("capacity", "device")}
        out[spec.key] = {"settings": _digest(settings), "sampler": _digest(sampler_config(build_sampler(cfg)))}
    return out


def current() -> dict[str, dict[str, dict[str, str]]]:
    grids = sorted(GRID_DIR.glob("*.toml")) + sorted(GRID_DIR.glob("plans/*.toml"))
    return {("plans/" if p.parent.name == "plans" else "") + p.stem: run_configs(p) for p in grids}


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_every_built_in_grid_expands_to_the_recorded_runs():
    now = current()
    if os.environ.get("RELIVE_REGENERATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"regenerated {GOLDEN.name}")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(now) == sorted(golden), "a built-in grid was added or removed: regenerate the golden file"
    for grid, runs in golden.items():
        assert sorted(now[grid]) == sorted(runs), f"grid {grid!r} expands to other runs"
        for part in ("settings", "sampler"):
            changed = [key for key, d in runs.items() if now[grid][key][part] != d[part]]
            assert not changed, f"grid {grid!r}: {len(changed)} runs now build another {part}, e.g. {changed[:3]}"


@pytest.mark.parametrize("extra", [["--utd", "2"], ["--set", "replay.per.priority_exponent=0.5"]])
def test_the_golden_check_can_fail(tmp_path, extra):
    """A changed setting changes the recorded digests (the check is not vacuous): a schedule setting changes the
    settings digest, a replay option the sampler digest."""
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nseeds = 1\ntasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "sac"\n'
                    'args = ["--replay", "per"]\n')
    before = run_configs(grid)
    grid.write_text(grid.read_text().replace('"per"]', '"per", ' + ", ".join(f'"{a}"' for a in extra) + "]"))
    after = run_configs(grid)
    part = "settings" if extra[0] == "--utd" else "sampler"
    assert after.keys() == before.keys()
    assert [after[k][part] != before[k][part] for k in before] == [True] * len(before)
