"""Fuzzing grid files' args (issue 44): hypothesis builds grids whose args lists (top level, a variant's, a task's)
mix `relive train` flags allowed and refused, abbreviations, ``--flag=value`` forms, ``--set`` of keys that name a
place or trust (whitespace, substitutions), values that are paths, braces or negative numbers, and task names made
to complete a substitution (``dir``, ``run.run_dir=..``). Either the schema check refuses the grid with one
``ValueError`` line, or every run's command, read by relive's own parser exactly as the runner starts it, trains
in the runner's run directory, with the grid's seed, no resume, no trust, no plug-in, no cluster and no ``--set`` of
such a setting. ``FUZZ_N=2000`` (or ``-m slow``) explores further."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relive.cli import _plugin_args, build_parser
from relive.experiments.grid import parse_grid
from relive.experiments.runner import run_dir_of, train_command

FUZZ_N = int(os.environ.get("FUZZ_N", "0"))
SHORT = settings(max_examples=FUZZ_N or 150, deadline=None, derandomize=not FUZZ_N, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
LONG = settings(SHORT, max_examples=FUZZ_N or 3000)

FLAGS = ["--env", "--dataset", "--replay", "--base-policy", "--init-from", "--set", "--utd", "--no-progress",
         "--stop-at-return", "--device", "--allow-other-base", "--eval-episodes",
         # what a grid may not say, whole, abbreviated (argparse takes a unique prefix) or by another spelling
         "--run-dir", "--run-d", "--run", "--resume", "--res", "--trust-code", "--trust", "--plugin", "--seed",
         "--seeds", "--ray-address", "--ray", "--debug", "--out", "--root", "--", "-h", "--help", "--{task}",
         "-{seed}"]
VALUES = ["/abs/elsewhere", "../up", "runs/x", "{task}", "{seed}", "-1", "-1.5", "3", "cpu", "uniform", "x=y",
          "@args.txt", "--run-dir", "{{x}}"]
KEYS = ["run.run_dir", " run.run_dir", "run . run_dir", "run.run_{task}", "{task}", "agent.trust_code",
        "collectors.ray_address", "run.eval_episodes", "agent.hidden", "agent.base_policy", "run.init_from",
        "data.dataset", "run.save_final_buffer"]
REFUSED_SETTINGS = {"run.run_dir", "agent.trust_code", "collectors.ray_address"}

token = st.one_of(
    st.sampled_from(FLAGS),
    st.sampled_from(VALUES),
    st.builds(lambda f, v: f"{f}={v}", st.sampled_from(FLAGS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS), st.sampled_from(VALUES)),
    st.builds(lambda k, v: f"--set={k}={v}", st.sampled_from(KEYS), st.sampled_from(VALUES)),
)
# "--set" followed by a setting often enough that whole settings get through to the check of their keys
setting = st.builds(lambda k, v: ["--set", f"{k}={v}"], st.sampled_from(KEYS), st.sampled_from(VALUES))
flag_value = st.builds(lambda f, v: [f, v], st.sampled_from(FLAGS), st.sampled_from(VALUES))
args_list = st.lists(st.one_of(token.map(lambda t: [t]), setting, flag_value),
                     max_size=4).map(lambda ts: [t for x in ts for t in x])
# the other two lists: what a grid may say (values with substitutions and paths included)
benign = st.lists(st.one_of(
    st.builds(lambda f, v: [f, v], st.sampled_from(["--env", "--dataset", "--init-from", "--base-policy"]),
              st.sampled_from(["{task}", "runs/{task}/seed_{seed}", "/data/d.npz", "../prep/base"])),
    st.builds(lambda k, v: ["--set", f"{k}={v}"], st.sampled_from(["agent.hidden", "run.eval_episodes", "x.y"]),
              st.sampled_from(["{seed}", "[8,8]", "-1"])),
    st.just(["--no-progress"])), max_size=3).map(lambda ts: [t for x in ts for t in x])
TASKS = ["Pendulum-v1", "dir", "run.run_dir=..", "T"]


@cache
def _parser():
    return build_parser()


def _check(top, variant, per_task, task, tmp: Path) -> None:
    raw = {"name": "fz", "tasks": [task], "args": top, "variant": [{"label": "a", "preset": "sac", "args": variant}],
           "task_args": {task: per_task}}
    try:
        grid = parse_grid(raw)
    except ValueError as e:
        assert "\n" not in str(e) and str(e).startswith("grid 'fz'"), str(e)
        return
    for spec in grid.runs():
        run_dir = run_dir_of(tmp, spec)
        argv = train_command(spec, run_dir)[3:]  # (after python -m relive.cli: what the run's process parses)
        assert _plugin_args(argv) == []
        try:
            ns = _parser().parse_args(argv)
        except SystemExit:  # a value of the wrong type (--utd cpu): the run is refused by relive train itself
            continue
        assert ns.run_dir == str(run_dir), argv
        assert ns.resume is None and ns.trust_code is None and ns.seeds is None and ns.ray_address is None, argv
        assert ns.seed == spec.seed and ns.preset == "sac" and ns.plugin is None, argv
        for item in ns.set:
            assert "".join(item.partition("=")[0].split()) not in REFUSED_SETTINGS, argv


def _lists(hostile, others, place):
    lists = {"top": others[0], "variant": others[1], "task": others[2]}
    lists[place] = hostile
    return lists["top"], lists["variant"], lists["task"]


@SHORT
@given(hostile=args_list, others=st.tuples(benign, benign, benign), place=st.sampled_from(["top", "variant", "task"]),
       task=st.sampled_from(TASKS))
def test_a_grid_either_is_refused_or_its_runs_stay_in_the_root_untrusted(hostile, others, place, task):
    _check(*_lists(hostile, others, place), task, Path("/root-of-runs"))


@pytest.mark.slow
@LONG
@given(hostile=args_list, others=st.tuples(args_list, args_list, args_list),
       place=st.sampled_from(["top", "variant", "task"]), task=st.sampled_from(TASKS))
def test_a_grid_either_is_refused_or_its_runs_stay_in_the_root_untrusted_long(hostile, others, place, task):
    _check(*_lists(hostile, others, place), task, Path("/root-of-runs"))
