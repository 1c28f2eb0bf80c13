"""Run directories a user can trust (issue 27): a new run never writes into someone else's directory (item 5), one
process runs a run at a time (item 6), a resume refuses a checkpoint made with another configuration (item 10),
and sizes that could never train are refused at the start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from relive.cli import main
from relive.files import DirectoryLock
from relive.replay.checkpoint import load_tree, save_tree
from relive.train.trainer import RUN_LOCK, train
from tests.train.test_trainer import TINY, SimulatedKill, cfg_for, kill_at

ARGS = ["sac", "--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "100", "--eval-every", "200",
        "--log-every", "100", "--checkpoint-every", "100", *TINY]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A tiny run stopped after its checkpoint at env step 200 (copy it before resuming it)."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    with pytest.raises(SimulatedKill):
        train(cfg_for(ARGS, run), on_step=kill_at(env_step=250))
    assert load_tree(run / "checkpoint", kind="run")["loop"]["env_steps"] == 200
    return run


def _copy(run, tmp_path, name="run"):
    out = tmp_path / name
    shutil.copytree(run, out)
    return out


def _edit_config(run, section, key, value):
    cfg = json.loads((run / "config.json").read_text())
    node = cfg
    for part in section.split("."):
        node = node[part]
    node[key] = value
    (run / "config.json").write_text(json.dumps(cfg))


def _one_error_line(argv, capsys):
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- item 5: a new run starts in a new or empty directory only ------------------------------------------------
def test_a_new_run_refuses_a_directory_of_other_files_before_writing_anything(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "eval.csv").write_text("my,own,header\n1,2,3\n")
    (mine / "metrics.jsonl").write_text('{"env_step": 5}\n')
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    line = _one_error_line(["train", *ARGS, "--run-dir", str(mine)], capsys)
    assert f"run directory {mine} exists and is not a relive run (it holds eval.csv, metrics.jsonl)" in line
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before  # nothing written, nothing appended
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert "is not a directory" in _one_error_line(["train", *ARGS, "--run-dir", str(a_file)], capsys)


def test_a_new_run_starts_in_an_empty_directory_or_one_a_launcher_prepared(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "stdout.log").write_text("$ relive train ...\n")  # what `relive bench run` writes first
    args = [a if a != "300" else "150" for a in ARGS]
    for d in (empty, prepared):
        train(cfg_for(args, d))
        assert (d / "summary.json").is_file()
    assert (prepared / "stdout.log").read_text() == "$ relive train ...\n"
    with pytest.raises(ValueError, match="already holds a run; resume it with --resume"):
        train(cfg_for(args, empty))


# -- item 6: one process per run ------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import pathlib, sys, time
    from relive.cli import build_parser
    from relive.train.cli import config_from_args
    from relive.train.trainer import train

    run, args = pathlib.Path(sys.argv[1]), sys.argv[2:]

    def hold(env_step, grad_step):  # once the first checkpoint is written: signal and wait to be killed
        if (run / "checkpoint" / "MANIFEST.json").exists():
            print("checkpointed", flush=True)
            time.sleep(120)

    train(config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(run)])), on_step=hold)
""")


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_run_is_held_by_one_process_and_a_killed_one_does_not_leave_it_stuck(tmp_path, capsys):
    """A fresh `relive train` (a subprocess) holds its run directory from the start: a `relive train --resume` of
    it in another process (this one) is refused by name (it would write every log line twice); a fresh start there
    too. Once the holder is killed (SIGKILL: nothing cleaned up), the run resumes and finishes, each log line
    once."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), *ARGS], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"checkpointed\n", holder.stderr.read().decode()[-2000:]
        line = _one_error_line(["train", "--resume", str(run)], capsys)
        assert f"run {run} is in use by process {holder.pid}" in line
        with pytest.raises(ValueError, match="already holds a run"):
            train(cfg_for(ARGS, run))
    finally:
        holder.kill()
        holder.wait()
    assert (run / RUN_LOCK).exists() and not (run / "summary.json").exists()
    assert main(["train", "--resume", str(run)]) == 0
    steps = [json.loads(ln)["env_step"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [100, 200, 300, 300]  # the lines after the checkpoint once, none twice


def test_a_resume_refuses_a_run_this_process_already_holds(stopped, tmp_path):
    run = _copy(stopped, tmp_path)
    with DirectoryLock(run, RUN_LOCK, what="run"):  # (flock: two opens of the lock exclude each other)
        with pytest.raises(ValueError, match=f"run {run} is in use"):
            train(resume_dir=run)
    assert train(resume_dir=run).num_online_env_steps == 300  # released: it goes on


# -- item 10: the checkpoint records its configuration ----------------------------------------------------------
def test_resume_refuses_a_config_json_edited_since_the_checkpoint(stopped, tmp_path, capsys):
    run = _copy(stopped, tmp_path)
    _edit_config(run, "replay", "name", "per")  # would train with the checkpoint's uniform sampler
    line = _one_error_line(["train", "--resume", str(run)], capsys)
    assert "does not match the configuration its checkpoint was made with: replay.name = \"uniform\" in the " \
           "checkpoint, \"per\" in config.json" in line
    run = _copy(stopped, tmp_path, "hidden")
    _edit_config(run, "agent", "hidden", [32, 32])  # was a torch size-mismatch traceback
    line = _one_error_line(["train", "--resume", str(run)], capsys)
    assert "agent.hidden = [16, 16] in the checkpoint, [32, 32] in config.json" in line
    assert not (run / "summary.json").exists()


def test_resume_refuses_another_runs_checkpoint(stopped, tmp_path):
    other = tmp_path / "other"
    with pytest.raises(SimulatedKill):
        train(cfg_for([*ARGS, "--seed", "7"], other), on_step=kill_at(env_step=250))
    run = _copy(stopped, tmp_path)
    shutil.rmtree(run / "checkpoint")
    shutil.copytree(other / "checkpoint", run / "checkpoint")
    with pytest.raises(ValueError, match=r"run.run_dir = .*other\" in the checkpoint.*; "
                                         r"run.seed = 7 in the checkpoint, 0 in config.json"):
        train(resume_dir=run)


def test_an_older_checkpoint_without_a_recorded_config_still_loads(stopped, tmp_path, capsys):
    """(What a resume may change -- device, replay device, threads -- passes the comparison:
    test_trainer.py::test_a_run_resumes_on_another_device_and_other_options_are_refused.)"""
    old = _copy(stopped, tmp_path, "old")
    tree = load_tree(old / "checkpoint", kind="run")
    assert json.loads(tree.pop("config"))["replay"]["name"] == "uniform"
    shutil.rmtree(old / "checkpoint")
    save_tree(old / "checkpoint", tree, kind="run")  # as an earlier relive version wrote it
    capsys.readouterr()
    assert main(["train", "--resume", str(old)]) == 0
    assert "records no configuration; config.json is taken as the one it was made with" in capsys.readouterr().out


def test_an_old_checkpoint_whose_agent_does_not_fit_is_refused_in_one_line(stopped, tmp_path, capsys):
    old = _copy(stopped, tmp_path)
    tree = load_tree(old / "checkpoint", kind="run")
    del tree["config"]
    shutil.rmtree(old / "checkpoint")
    save_tree(old / "checkpoint", tree, kind="run")
    _edit_config(old, "agent", "hidden", [8, 8])  # nothing recorded to compare: the agent's load says it
    line = _one_error_line(["train", "--resume", str(old)], capsys)
    assert "its checkpoint's agent does not fit the agent its config.json describes" in line


def test_a_config_json_of_the_wrong_shape_is_refused_naming_the_run(stopped, tmp_path, capsys):
    run = _copy(stopped, tmp_path)
    (run / "config.json").write_text('{"run": 5}')
    assert f"cannot resume {run}: its config.json is not a relive configuration" in _one_error_line(
        ["train", "--resume", str(run)], capsys)


# -- sizes that could never train --------------------------------------------------------------------------------
def test_a_capacity_below_the_batch_size_and_more_envs_than_rows_are_refused_at_the_start(tmp_path, capsys):
    line = _one_error_line(["train", *ARGS, "--capacity", "16", "--run-dir", str(tmp_path / "a")], capsys)
    assert "replay.capacity (16 rows, --capacity) is below schedule.batch_size (32, --batch-size)" in line
    line = _one_error_line(["train", *ARGS, "--capacity", "40", "--num-envs", "64", "--run-dir",
                            str(tmp_path / "b")], capsys)
    assert "env.num_envs (64, --num-envs) = 64 replay streams, more than replay.capacity (40 rows" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_saved_state_that_does_not_fit_is_one_line_naming_the_run(stopped, tmp_path, capsys):
    """A loop record with a key this version does not know (was a TypeError from LoopState(**...)), and an
    --init-from agent of another network size (was a torch size-mismatch traceback)."""
    run = _copy(stopped, tmp_path)
    tree = load_tree(run / "checkpoint", kind="run")
    tree["loop"]["from_the_future"] = 1
    shutil.rmtree(run / "checkpoint")
    save_tree(run / "checkpoint", tree, kind="run")
    line = _one_error_line(["train", "--resume", str(run)], capsys)
    assert f"cannot resume {run}: its checkpoint's state does not fit this run (TypeError" in line
    done = _copy(stopped, tmp_path, "done")
    train(resume_dir=done)
    line = _one_error_line(["train", *ARGS, "--set", "agent.hidden=[8,8]", "--init-from", str(done), "--run-dir",
                            str(tmp_path / "fine-tune")], capsys)
    assert f"run.init_from: {done / 'agent_final'}: its agent does not fit this run's agent" in line
