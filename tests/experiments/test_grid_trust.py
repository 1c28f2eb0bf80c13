"""Issue 44 item 7: a grid file decides what its runs train and read, never where a run goes, what it trusts or
which code it imports. Its args hold only the `relive train` flags of ``GRID_FLAGS`` (an allow-list, each flag with
its value); ``--run-dir`` (which used to override the runner's own and write a whole run outside --root),
``--resume``, ``--plugin`` (which used to crash every run), ``--trust-code``, ``--set run.run_dir=...`` and the like
are refused at the schema check, naming the grid file and the cell."""

from __future__ import annotations

import argparse

import pytest

from relive.cli import build_parser, main
from relive.experiments.grid import load_grid, parse_grid
from relive.experiments.runner import train_command


def _grid(args, where="variant"):
    raw = {"name": "g", "tasks": ["Pendulum-v1"], "variant": [{"label": "a", "preset": "sac"}]}
    if where == "variant":
        raw["variant"][0]["args"] = args
    elif where == "top":
        raw["args"] = args
    else:
        raw["task_args"] = {"Pendulum-v1": args}
    return raw


@pytest.mark.parametrize("args, message", [
    # where a run goes: the runner's --run-dir came first, so the grid's won
    (["--run-dir", "/abs/elsewhere"], r"\[0\]: --run-dir is not for a grid file to decide \(the runner puts"),
    (["--run-dir=/abs/elsewhere"], r"--run-dir is not for a grid file to decide"),
    (["--run-d", "/abs"], r"\[0\] = '--run-d': not a flag a grid may pass"),  # (argparse takes abbreviations)
    (["--set", "run.run_dir=/abs"], r"\[1\]: --set run.run_dir is not for a grid file to decide"),
    (["--set=run.run_dir=/abs"], r"--set run.run_dir is not for a grid file to decide"),
    (["--set", " run . run_dir =/abs"], r"--set run.run_dir is not for a grid file to decide"),
    (["--set", "run.run_{task}=/abs"], r"a --set key is never substituted"),  # a task named "dir"
    (["--set", "{task}"], r"a --set key is never substituted"),  # a task named "run.run_dir=.."
    (["--resume", "runs/x"], r"--resume is not for a grid file to decide"),
    (["--out", "x"], r"'--out': not a flag a grid may pass"),
    (["--root", "x"], r"'--root': not a flag a grid may pass"),
    # trust and code come from the command line only
    (["--trust-code"], r"--trust-code is not for a grid file to decide \(trust comes from the command line only"),
    (["--set", "agent.trust_code=true"], r"--set agent.trust_code is not for a grid file to decide"),
    (["--plugin", "evil.py"], r"--plugin is not for a grid file to decide \(plug-ins are named on the command line"),
    (["--ray-address", "evil:6379"], r"--ray-address is not for a grid file to decide"),
    (["--set", "collectors.ray_address=evil:6379"], r"--set collectors.ray_address is not for a grid file"),
    (["--debug"], r"--debug is not for a grid file to decide"),
    (["--seed", "3"], r"--seed is not for a grid file to decide"),
    (["--seeds", "0,1"], r"--seeds is not for a grid file to decide"),
    (["-h"], r"'-h': not a flag a grid may pass"),
    # the shape of the list: a flag, then its value
    (["--{task}", "x"], r"a flag is never substituted"),
    (["-{seed}"], r"a flag is never substituted"),
    (["stray"], r"\[0\] = 'stray': a value without a flag before it"),
    (["--utd", "2", "3"], r"\[2\] = '3': a value without a flag before it"),
    (["--replay"], r"\[0\]: --replay needs a value after it"),
    (["--replay", "--utd", "2"], r"\[0\]: --replay needs a value after it"),
    (["--no-progress=1"], r"--no-progress takes no value"),
])
def test_grid_args_that_name_a_place_or_code_are_refused_naming_the_cell(args, message):
    with pytest.raises(ValueError, match=r"grid 'g': variant 'a' args.*" + message):
        parse_grid(_grid(args))


@pytest.mark.parametrize("where, cell", [("top", r"grid 'g': args\[0\]"),
                                         ("task", r"grid 'g': task_args.Pendulum-v1\[0\]")])
def test_every_args_list_is_checked(where, cell):
    with pytest.raises(ValueError, match=cell + r": --run-dir is not for a grid file to decide"):
        parse_grid(_grid(["--run-dir", "/abs"], where))


def test_a_preset_is_a_name_never_a_flag():
    raw = _grid([])
    raw["variant"][0]["preset"] = "--run-dir=/abs"
    with pytest.raises(ValueError, match=r"variant 'a': preset '--run-dir=/abs' must be a plain name"):
        parse_grid(raw)


def test_what_a_grid_may_say_still_parses():
    g = parse_grid(_grid(["--dataset", "runs/prep/{task}.npz", "--base-policy", "runs/prep/base", "--init-from",
                          "runs/pre/{task}/seed_{seed}", "--stop-at-return", "-150", "--stop-at-return=-1.5",
                          "--set", "agent.hidden=[64,64]", "--set=env.success_key=is_success", "--no-progress",
                          "--device", "cpu", "--allow-other-base"]))
    assert g.runs()[0].args[:2] == ("--dataset", "runs/prep/Pendulum-v1.npz")


def test_every_train_flag_is_allowed_or_refused_by_decision_and_takes_the_values_argparse_gives_it():
    """A flag added to `relive train` is refused in grids until it is put in GRID_FLAGS (or NOT_GRID_FLAGS): this
    test makes the choice explicit."""
    from relive.experiments.grid import GRID_FLAGS, NOT_GRID_FLAGS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    flags = {s: a for a in train._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    unclassified = sorted(set(flags) - set(GRID_FLAGS) - set(NOT_GRID_FLAGS))
    assert not unclassified, f"relive train flags neither allowed nor refused in grid files: {unclassified}"
    assert not set(GRID_FLAGS) & set(NOT_GRID_FLAGS)
    for flag, nvalues in GRID_FLAGS.items():
        assert flag in flags, f"{flag} is not a relive train flag"
        assert nvalues == (0 if flags[flag].nargs == 0 else 1), flag


def test_bench_run_refuses_a_run_dir_in_a_grid_file_before_anything_runs(tmp_path, capsys):
    """The regression: `args = [..., "--run-dir", "/abs/path"]` wrote a whole run at /abs/path."""
    outside = tmp_path / "outside"
    grid = tmp_path / "escape.toml"
    grid.write_text('tasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "sac"\n'
                    f'args = ["--online-steps", "0", "--eval-episodes", "1", "--run-dir", "{outside}"]\n')
    assert main(["bench", "run", str(grid), "--root", str(tmp_path / "runs"), "--timeout", "120"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"grid file {grid}: grid 'escape': variant 'a' args[4]: --run-dir is not" in err[0]
    assert not outside.exists() and not (tmp_path / "runs").exists()


def test_bench_run_refuses_a_plugin_in_a_grid_file_naming_file_and_cell(tmp_path, capsys):
    """`--plugin` in a grid's args used to crash every run (`relive train` has no such flag)."""
    grid = tmp_path / "plug.toml"
    grid.write_text('tasks = ["Pendulum-v1"]\nargs = ["--plugin", "evil.py"]\n[[variant]]\nlabel = "a"\n'
                    'preset = "sac"\n')
    assert main(["bench", "run", str(grid), "--root", str(tmp_path / "runs"), "--timeout", "120"]) == 2
    err = capsys.readouterr().err
    assert f"grid file {grid}: grid 'plug': args[0]: --plugin is not for a grid file to decide" in err
    assert "relive --plugin FILE bench run GRID" in err and not (tmp_path / "runs").exists()


def test_trust_code_comes_from_bench_run_for_the_runs_that_name_a_base_policy(tmp_path):
    raw = {"name": "g", "tasks": ["Pendulum-v1"], "variant": [
        {"label": "res", "preset": "residual_sac", "args": ["--base-policy", "p.pt2"]},
        {"label": "res2", "preset": "residual_sac", "args": ["--set", "agent.base_policy=p.pt2"]},
        {"label": "plain", "preset": "sac"}]}
    path = tmp_path / "g.toml"
    path.write_text('name = "g"\ntasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "res"\npreset = "residual_sac"\n'
                    'args = ["--base-policy", "p.pt2"]\n')
    assert all("--trust-code" not in r.args for r in parse_grid(raw).runs())  # the file alone: no trust
    assert all("--trust-code" not in r.args for r in load_grid(path).runs())
    from dataclasses import replace

    trusted = {r.label: r for r in replace(parse_grid(raw), trust_code=True).runs()}
    assert trusted["res"].args[-1] == trusted["res2"].args[-1] == "--trust-code"
    assert "--trust-code" not in trusted["plain"].args  # (`relive train` refuses it for a preset with no base)
    (tmp_path / "config.json").write_text("{}")  # a started run: resumed with the opt-in said again
    assert train_command(trusted["res"], tmp_path)[-3:] == ["--resume", str(tmp_path), "--trust-code"]
    assert train_command(parse_grid(raw).runs()[0], tmp_path)[-2:] == ["--resume", str(tmp_path)]


def test_bench_run_trust_code_reaches_the_grid(tmp_path, monkeypatch):
    from relive.experiments import cli as bench_cli

    seen = []
    monkeypatch.setattr(bench_cli, "run_grid", lambda grid, root, **kw: seen.append(grid) or [])
    path = tmp_path / "g.toml"
    path.write_text('tasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "residual_sac"\n'
                    'args = ["--base-policy", "p.pt2"]\n')
    assert main(["bench", "run", str(path), "--root", str(tmp_path / "runs"), "--trust-code"]) == 0
    assert main(["bench", "run", str(path), "--root", str(tmp_path / "runs")]) == 0
    assert [g.trust_code for g in seen] == [True, False]
    assert seen[0].runs()[0].args[-1] == "--trust-code" and "--trust-code" not in seen[1].runs()[0].args
