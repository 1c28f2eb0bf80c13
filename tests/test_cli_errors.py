"""Every bad argument of `relive data ...`, `relive bench ...` and `relive train ...` (its argparse-level flags)
exits with code 2 and a message naming the argument: one line ``relive: error: ...`` for refused values, argparse's
usage + error line for its own checks. ``--debug`` raises the exception instead (issue 14)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from relive.cli import main

GRID = "reaper"  # a built-in grid


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    out = capsys.readouterr()
    return code, out.err


def _write_bad_toml(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("name = [unclosed\n")
    return str(p)


# (argv (with {tmp} for a scratch directory), regex the message must match, whether argparse reports it)
CASES = [
    # relive data
    (["data", "make", "pendulum-v1", "random", "--steps", "0"], r"argument --steps: expected a positive integer, got 0",
     True),
    (["data", "make", "pendulum-v1", "random", "--steps", "-10"], r"argument --steps: .*got -10", True),
    (["data", "make", "pendulum-v1", "random", "--steps", "many"], r"argument --steps: .*'many'", True),
    (["data", "make", "pendulum-v1", "random", "--expert-train-steps", "0"], r"argument --expert-train-steps", True),
    (["data", "make", "pendulum-v1", "random", "--seed", "x"], r"argument --seed: invalid int value: 'x'", True),
    (["data", "make", "pendulum-v1", "ultra"], r"argument level: invalid choice: 'ultra'", True),
    (["data", "make", "pong-v9", "random", "--root", "{tmp}/m", "--out", "{tmp}"], r"unknown task 'pong-v9'", False),
    (["data", "make", "pointmaze-umaze-v3", "expert", "--root", "{tmp}/m", "--out", "{tmp}"],
     r"level 'expert' is not made for pointmaze-umaze-v3", False),
    (["data", "make", "pendulum-v1", "random", "--root", "{tmp}/existing", "--out", "{tmp}"],
     r"dataset relive/pendulum-v1/random-v0 already exists .*--overwrite", False),
    (["data", "info", "nope/none-v0", "--root", "{tmp}/m"], r"no Minari dataset 'nope/none-v0'", False),
    (["data", "info", "{tmp}/junk.hdf5"], r"junk.hdf5: not a readable HDF5 file", False),  # (read as D4RL-style HDF5)
    (["data", "fly"], r"argument ACTION: invalid choice: 'fly'", True),
    (["data", "report", "--root", "{tmp}/m", "--out", "{tmp}/junk.hdf5"], r"junk.hdf5 exists; pass --overwrite",
     False),
    # relive bench
    (["bench", "run", "no-such-grid"], r"no grid 'no-such-grid'", False),
    (["bench", "run", "{tmp}/bad.toml"], r"bad.toml: not valid TOML", False),
    (["bench", "run", GRID, "--workers", "0"], r"argument --workers: expected a positive integer, got 0", True),
    (["bench", "run", GRID, "--threads-per-run", "-1"], r"argument --threads-per-run", True),
    (["bench", "run", GRID, "--timeout", "0"], r"argument --timeout: expected a positive number", True),
    (["bench", "run", GRID, "--timeout", "nan"], r"argument --timeout: expected a positive number", True),
    (["bench", "run", GRID, "--seeds", "0"], r"argument --seeds", True),
    (["bench", "run", GRID, "--tasks", "NoSuchTask-v0"], r"--tasks: grid .* has no task\(s\) \['NoSuchTask-v0'\]",
     False),
    (["bench", "report", GRID, "--reps", "0"], r"argument --reps", True),
    (["bench", "report", "no-such-grid"], r"no grid 'no-such-grid'", False),
    (["bench", "report", GRID, "--root", "{tmp}", "--out", "{tmp}"], r"reaper.md exists; pass --overwrite", False),
    (["bench", "run", GRID, "--root", "{tmp}/r", "--report", "--out", "{tmp}"], r"reaper.md exists; pass --overwrite",
     False),
    # relive train (argparse-level flags; --set is type-checked by the config)
    (["train"], r"give a PRESET", False),
    (["train", "nope", "--env", "Pendulum-v1"], r"unknown preset 'nope'", False),
    (["train", "sac", "--replay", "bogus"], r"argument --replay: invalid choice: 'bogus'", True),
    (["train", "sac", "--seed", "one"], r"argument --seed: invalid int value: 'one'", True),
    (["train", "sac", "--batch-size", "2.5"], r"argument --batch-size: expected a positive integer, got '2.5'", True),
    (["train", "sac", "--offline-fraction", "half"], r"argument --offline-fraction: invalid float value", True),
    (["train", "sac", "--warmup-policy", "expert"], r"argument --warmup-policy: invalid choice", True),
    (["train", "sac", "--env", "Pendulum-v1", "--batch-size", "0"], r"argument --batch-size: .*positive.*got 0", True),
    (["train", "sac", "--utd", "0"], r"argument --utd: expected a positive integer, got 0", True),
    (["train", "sac", "--capacity", "0"], r"argument --capacity: expected a positive integer", True),
    (["train", "sac", "--online-steps", "-5"], r"argument --online-steps: expected a non-negative integer, got -5",
     True),
    (["train", "sac", "--eval-episodes", "0"], r"argument --eval-episodes: expected a positive integer", True),
    (["train", "sac", "--threads", "0"], r"argument --threads", True),
    (["train", "sac", "--num-envs", "0"], r"argument --num-envs: expected a positive integer, got 0", True),
    (["train", "sac", "--set", "schedule.batch_size=0", "--env", "Pendulum-v1", "--run-dir", "{tmp}/r"],
     r"batch_size", False),
    (["train", "rlpd", "--env", "Pendulum-v1", "--grad-steps-per-chunk", "2", "--run-dir", "{tmp}/r"],
     r"grad_steps_per_chunk .* replaces utd_ratio", False),
    (["train", "--resume", "{tmp}", "--online-steps", "9"], r"--online-steps cannot change it", False),
    (["train", "rlpd", "--env", "Pendulum-v1", "--offline-fraction", "1.5", "--run-dir", "{tmp}/r"],
     r"offline_fraction", False),
    (["train", "--resume", "{tmp}/nothing"], r"no config.json", False),
    # issue 27: run directories, sizes and grid files
    (["train", "sac", "--env", "Pendulum-v1", "--run-dir", "{tmp}"], r"run directory .* exists and is not a relive "
     r"run \(it holds bad.toml, existing, junk.hdf5", False),
    (["train", "sac", "--num-envs", "5000"], r"argument --num-envs: expected at most 1024 environments, got 5000",
     True),
    (["train", "sac", "--env", "Pendulum-v1", "--capacity", "8", "--batch-size", "16", "--run-dir", "{tmp}/r"],
     r"replay.capacity \(8 rows, --capacity\) is below schedule.batch_size \(16, --batch-size\)", False),
    (["bench", "run", "{tmp}/letters.toml", "--root", "{tmp}/r"], r"letters.toml: grid 'letters': tasks must be a list "
     r"of tasks, got the string 'Pendulum-v1'", False),
    (["bench", "report", "{tmp}/letters.toml", "--root", "{tmp}/r"], r"tasks must be a list of tasks", False),
]


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "junk.hdf5").write_text("not a dataset")
    _write_bad_toml(tmp_path)
    (tmp_path / "letters.toml").write_text('tasks = "Pendulum-v1"\n[[variant]]\nlabel = "a"\npreset = "sac"\n')
    (tmp_path / f"{GRID}.md").write_text("a report\n")
    from relive.data.minari_io import write_minari

    n = 4
    obs = np.zeros((n + 1, 3), np.float32)
    rows = {"obs": obs[:-1], "next_obs": obs[1:], "action": np.zeros((n, 1), np.float32),
            "reward": np.zeros(n, np.float32), "terminated": np.zeros(n, bool),
            "truncated": np.array([0, 0, 0, 1], bool)}
    write_minari("relive/pendulum-v1/random-v0", rows, "Pendulum-v1", root=tmp_path / "existing")
    return tmp_path


@pytest.mark.parametrize("argv, message, by_argparse", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_arguments_exit_2_with_one_line_naming_them(argv, message, by_argparse, scratch, capsys):
    argv = [a.replace("{tmp}", str(scratch)) for a in argv]
    code, err = _run(argv, capsys)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    if by_argparse:
        assert lines[-1].startswith("relive") and ": error: " in lines[-1], err
    else:
        assert len(lines) == 1 and lines[0].startswith("relive: error: "), err
    assert re.search(message, lines[-1]), err


def test_debug_raises_the_exception_instead(scratch):
    with pytest.raises(ValueError, match="unknown task 'pong-v9'"):
        main(["--debug", "data", "make", "pong-v9", "random", "--root", str(scratch / "m"), "--out", str(scratch)])
