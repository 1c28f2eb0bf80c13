"""Every built-in grid expands to the same runs as before the per-strategy config layout.

``data/grid_runs_v1.json`` was written by the earlier code (flat ``ReplayConfig``, ``agent.utd_ratio``,
``schedule.refresh_every_grad_steps``) for all 271 runs: the agent's settings, the schedule, the run, env and data
sections, and the sampler each run built (its class and constructor arguments). Today's code must give the same
effective settings for every one of those runs (grids added since may add runs; run / env settings added since
must hold their defaults there, and so must agent settings added since)."""

import dataclasses
import json
from pathlib import Path

import pytest

from relive.cli import build_parser
from relive.config import EnvConfig, RunConfig
from relive.experiments.grid import GRID_DIR, load_grid
from relive.replay.samplers import sampler_config
from relive.train.cli import config_from_args
from relive.train.trainer import build_sampler

GOLDEN = json.loads((Path(__file__).parent / "data" / "grid_runs_v1.json").read_text())


def _settings(grid, run) -> dict:
    args = build_parser().parse_args(["train", run.preset, "--env", run.task, "--seed", str(run.seed), *run.args])
    cfg = config_from_args(args)
    cfg.schedule.check_update_rule()  # (what a run checks before it starts)
    sampler = sampler_config(build_sampler(cfg))
    params = sampler["params"]
    is_arb = cfg.replay.name.startswith("arb")
    if is_arb:  # the refresh cadence and score mode moved from the schedule / flat replay into ARB's options
        refresh, score_mode = params.pop("refresh_every_grad_steps"), params.pop("score_mode")
    if sampler["type"] == "BERBSampler":
        params.pop("seed")  # the sampler's seed is now its own SeedSequence stream, not the run seed
    d = cfg.to_dict()
    return {"agent_kind": cfg.agent_kind, "agent": d["agent"], "schedule": d["schedule"], "run": d["run"],
            "env": d["env"], "data": d["data"], "replay_capacity": cfg.replay.capacity, "sampler": sampler,
            "refresh_every_grad_steps": refresh if is_arb else None, "score_mode": score_mode if is_arb else None,
            "agent_defaults": json.loads(json.dumps(dataclasses.asdict(type(cfg.agent)()), allow_nan=True))}


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_every_built_in_grid_expands_to_the_same_runs_as_before():
    seen = {}
    for path in sorted(GRID_DIR.glob("*.toml")):
        grid = load_grid(path)
        for run in grid.runs():
            seen[f"{grid.name}:{run.key}"] = _settings(grid, run)
    assert set(GOLDEN) <= set(seen)  # (grids added since may add runs)
    for key, want in GOLDEN.items():
        want = json.loads(json.dumps(want))
        if want["sampler"]["type"] == "BERBSampler":
            want["sampler"]["params"].pop("seed")
        got = json.loads(json.dumps(seen[key], allow_nan=True))
        agent_defaults = got.pop("agent_defaults")
        if got["agent"].pop("actor_per_env_step", False):  # RLPD's actor once per env step: a rule since issue 46,
            assert got["agent"]["actor_every"] == 1, key  # was actor_every = utd_ratio (the count it trains with)
            got["agent"]["actor_every"] = got["schedule"]["utd_ratio"]
        for name in set(got["agent"]) - set(want["agent"]):  # agent settings added since (n_step, encoder, ...)
            assert got["agent"].pop(name) == agent_defaults[name], f"{key}: agent.{name}"
        for section, cls in (("run", RunConfig), ("env", EnvConfig)):  # settings added since: at their defaults
            defaults = json.loads(json.dumps(dataclasses.asdict(cls())))  # (as the runs are read: tuples are lists)
            for name in set(got[section]) - set(want[section]):
                assert got[section].pop(name) == defaults[name], f"{key}: {section}.{name}"
        assert got == want, key
    assert dataclasses.is_dataclass(load_grid("arb").variants[0]) and len(GOLDEN) == 271
