"""Grid files are checked against a schema before anything is expanded (issue 27 item 14): types, ranges, known
keys (unknown ones refused by name), and every name that becomes a path a plain name, so that no run directory
leaves --root."""

from __future__ import annotations

import pytest

from relive.cli import main
from relive.experiments.grid import RunSpec, parse_grid
from relive.experiments.runner import run_dir_of

VARIANT = {"label": "a", "preset": "sac"}


def _grid(**top):
    return {"tasks": ["Pendulum-v1"], "variant": [dict(VARIANT)]} | top


@pytest.mark.parametrize("raw, message", [
    # seeds = N expanded to a tuple of N ints before --seeds cut it (19 GB for 300,000,000)
    (_grid(seeds=300_000_000), r"seeds = 300000000: a number of seeds from 1 to 1000"),
    (_grid(seeds=0), r"seeds = 0: a number of seeds from 1 to 1000"),
    (_grid(seeds=[0, "1"]), r"seeds\[1\] = '1': a seed is an integer"),
    (_grid(seeds=[0, -1]), r"seeds\[1\] = -1"),
    (_grid(seeds=[1, 1]), r"seeds must be distinct"),
    (_grid(seeds=True), r"seeds must be a number of seeds or a list"),
    # a string of tasks was iterated letter by letter: 11 one-letter runs
    (_grid(tasks="Pendulum-v1"),
     r'tasks must be a list of tasks, got the string .*\(write tasks = \["Pendulum-v1"\]\)'),
    (_grid(tasks=[3]), r"task 3 must be a plain name"),
    # names that become paths
    (_grid(name="../outside"), r"grid name '../outside' must be a plain name"),
    (_grid(name="/abs"), r"grid name '/abs' must be a plain name"),
    (_grid(variant=[{"label": "../../x", "preset": "sac"}]), r"variant label '../../x' must be a plain name"),
    (_grid(tasks=["../x"]), r"task '../x' must be a plain name"),
    (_grid(tasks=["ALE/Pong-v5"]), r"an environment id with a '/' goes in \[task_args\]"),
    (_grid(task_args={"..": ["--env", "X"]}), r"task '..' must be a plain name"),
    (_grid(report={"figure": [{"name": "../../fig"}]}), r"figure name '../../fig' must be a plain name"),
    # unknown keys, by name, at every level
    (_grid(seed=3), r"grid file: unknown key\(s\) \['seed'\]"),
    (_grid(variant=[VARIANT | {"arg": ["--x"]}]), r"variant #0: unknown key\(s\) \['arg'\]"),
    (_grid(report={"treshold": {}}), r"\[report\]: unknown key\(s\) \['treshold'\]"),
    (_grid(report={"figure": [{"name": "f", "colum": "x"}]}), r"figure #0: unknown key\(s\) \['colum'\]"),
    # types (these were KeyError / TypeError / AttributeError tracebacks)
    (_grid(variant=["uniform"]), r"variant #0 must be a table, got str"),
    (_grid(variant={"label": "a"}), r"variant must be \[\[variant\]\] tables"),
    (_grid(variant=[{"label": "a", "preset": 3}]), r"variant 'a' preset must be a string"),
    (_grid(args="--eval-episodes 5"), r"args must be a list"),
    (_grid(args=["--x", 5]), r"args\[1\] must be a string, got int"),
    (_grid(task_args=["x"]), r"\[task_args\] must be a table"),
    (_grid(report={"thresholds": {"Pendulum-v1": "high"}}), r"thresholds.Pendulum-v1 must be a number"),
    (_grid(report={"auc": "yes"}), r"auc must be true or false"),
    (_grid(report={"figure": [{"title": "no name"}]}), r"figure #0 lacks a name"),
    (_grid(description=["x"]), r"description must be a string"),
    # argument templates: only {task} and {seed}, no format spec (a 300-million-character padding) or index
    (_grid(args=["{seed:>300000000}"]), r"only \{task\} and \{seed\} are substituted"),
    (_grid(args=["{0}"]), r"only \{task\} and \{seed\} are substituted"),  # was an IndexError
    (_grid(args=["{env}"]), r"only \{task\} and \{seed\} are substituted"),  # was a KeyError
    (_grid(args=["{seed!r}"]), r"only \{task\} and \{seed\} are substituted"),
    # sizes: every run gets its own copy of the arguments; runs are counted before they are expanded
    (_grid(tasks=[f"T{i}" for i in range(200)], seeds=100),
     r"20000 runs \(variants x tasks x seeds\), more than 10000"),
    (_grid(args=["--x"] * 201), r"args: at most 200 arguments, got 201"),
    (_grid(args=["x" * 5000]), r"args\[0\]: an argument of at most 4096 characters, got 5000"),
    (_grid(args=["a{b"]), r"args\[0\] = 'a{b': expected '}'.*write {{ and }} for a literal brace"),
])
def test_a_grid_that_breaks_the_schema_is_refused_naming_what(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(raw)


def test_what_the_schema_accepts_expands_as_before():
    g = parse_grid(_grid(name="ok.v2", seeds=[5, 7], args=["--dataset", "d/{task}-{seed}", "--set", "a.b={{lit}}"],
                         task_args={"Pendulum-v1": ["--eval-episodes", "2"]},
                         report={"thresholds": {"Pendulum-v1": -200}, "auc": True,
                                 "figure": [{"name": "f1", "labels": ["a"], "log_y": True}]}))
    assert [r.key for r in g.runs()] == ["a/Pendulum-v1/seed_5", "a/Pendulum-v1/seed_7"]
    assert g.runs()[0].args == ("--dataset", "d/Pendulum-v1-5", "--set", "a.b={lit}", "--eval-episodes", "2")


def test_a_run_directory_never_leaves_the_root(tmp_path):
    """A RunSpec made by hand (not through parse_grid) with a path in a name is refused too."""
    for spec in (RunSpec("../up", "a", "sac", "T", 0), RunSpec("g", "a/../..", "sac", "T", 0),
                 RunSpec("g", "a", "sac", "/etc", 0)):
        with pytest.raises(ValueError, match="must be a plain name"):
            run_dir_of(tmp_path, spec)
    assert run_dir_of(tmp_path, RunSpec("g", "a", "sac", "T", 3)) == tmp_path / "g" / "a" / "T" / "seed_3"


def test_bench_run_refuses_a_bad_grid_file_in_one_line_before_any_run(tmp_path, capsys):
    grid = tmp_path / "big.toml"
    grid.write_text('seeds = 300000000\ntasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "sac"\n')
    assert main(["bench", "run", str(grid), "--seeds", "1", "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"relive: error: grid file {grid}: grid 'big': seeds = 300000000")
    grid.write_text('name = "../escape"\ntasks = ["Pendulum-v1"]\n[[variant]]\nlabel = "a"\npreset = "sac"\n')
    assert main(["bench", "run", str(grid), "--root", str(tmp_path / "runs")]) == 2
    assert "grid name '../escape' must be a plain name" in capsys.readouterr().err
    assert not (tmp_path / "escape").exists() and not (tmp_path / "runs").exists()
