"""The paper-budget plans (grids/plans/*.toml, docs/cluster.md): each loads by the name `relive bench run` takes,
expands into valid `relive train` configurations at the budgets it states, and has its row in docs/cluster.md."""

import re
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.experiments.grid import GRID_DIR, load_grid
from relive.train.cli import config_from_args

PLANS = sorted(p.stem for p in (GRID_DIR / "plans").glob("*.toml"))
CLUSTER_MD = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"


def test_there_is_a_plan_for_each_paper_claim_family():
    assert {"reaper-paper", "reaper-paper-cartpole", "arb-paper-pretrain", "arb-paper", "rlpd-paper", "refer-paper",
            "refer-vracer-paper", "pld-metaworld-paper"} <= set(PLANS)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_plan_expands_into_train_configs_without_running(plan, tmp_path):
    grid = load_grid(f"plans/{plan}")  # the name `relive bench run plans/NAME` takes
    runs = grid.runs()
    assert runs and grid.name == plan
    for spec in runs:
        args = build_parser().parse_args(["train", spec.preset, "--env", spec.task, "--seed", str(spec.seed),
                                          "--run-dir", str(tmp_path / spec.key), *spec.args])
        cfg = config_from_args(args)
        assert cfg.run.seed == spec.seed
        # a paper's budget, not a pilot's: 50k+ env steps, or (a pre-training stage) 1M gradient steps offline
        assert cfg.schedule.num_online_env_steps >= 50_000 or cfg.schedule.num_offline_grad_steps >= 1_000_000


@pytest.mark.parametrize("plan", PLANS)
def test_docs_cluster_md_lists_each_plan_with_its_run_count(plan):
    """docs/cluster.md's table row names the plan's grid, its number of runs and its command."""
    text = CLUSTER_MD.read_text()
    rows = [line for line in text.splitlines() if line.startswith("|") and f"`plans/{plan}`" in line]
    assert rows, f"docs/cluster.md has no table row for plans/{plan}"
    runs = len(load_grid(f"plans/{plan}").runs())
    assert any(re.search(rf"\|\s*{runs:,}\s*\|", row) for row in rows), (rows, runs)
