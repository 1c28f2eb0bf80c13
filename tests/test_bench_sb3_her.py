"""SB3's SAC + HerReplayBuffer beside relive's sac_her (issue 30): bench/sb3_her.py writes relive's run layout (a
tiny budget here), skips finished runs, takes the run lock, and its report combines the grid's runs."""

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from relive.experiments.grid import load_grid
from relive.files import DirectoryLock, LockedError
from relive.presets import get_preset

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "sb3_her.py"


def _load():
    """bench/sb3_her.py as a module (bench/ is scripts, not a package); in sys.modules for its dataclasses."""
    spec = importlib.util.spec_from_file_location("bench_sb3_her", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sb3_her = _load()


def fetch_or_skip():
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("gymnasium_robotics")
    from relive.envs import make_env

    try:
        make_env("FetchReach-v4", keep_goal_dict=True).close()
    except ValueError as e:  # mujoco 4: the Fetch tasks fail at gym.make
        pytest.skip(f"FetchReach-v4 cannot be made here ({e})")


TINY = {"learning_starts": 60, "buffer_size": 500, "batch_size": 32, "policy_kwargs":
        {"net_arch": [16], "obs_keys": ["desired_goal", "observation"]}}


def test_settings_follow_the_sac_her_preset():
    cfg = get_preset("sac_her")
    kw = sb3_her.sb3_kwargs("sac_her")
    assert (kw["learning_rate"], kw["batch_size"], kw["gamma"], kw["tau"]) == (
        cfg.agent.actor_lr, cfg.schedule.batch_size, cfg.agent.gamma, cfg.agent.tau)
    assert kw["learning_starts"] == cfg.schedule.num_warmup_env_steps and kw["buffer_size"] == cfg.replay.capacity
    assert kw["policy_kwargs"]["net_arch"] == list(cfg.agent.hidden)
    assert kw["policy_kwargs"]["obs_keys"] == sorted(cfg.agent.obs_keys)
    assert kw["her"] == {"n_sampled_goal": 4, "goal_selection_strategy": "future"}
    assert (kw["train_freq"], kw["gradient_steps"], kw["ent_coef"]) == (1, 1, "auto_1.0")
    with pytest.raises(ValueError, match="not a SAC \\+ HER preset"):
        sb3_her.sb3_kwargs("ddpg_her")


def test_a_run_writes_relive_run_layout_and_is_skipped_once_finished(tmp_path):
    fetch_or_skip()
    d = sb3_her.run_dir(tmp_path, 3)
    assert d == tmp_path / "her-fetch" / "sb3_sac_her" / "FetchReach-v4" / "seed_3"
    assert sb3_her.run_one(d, 3, env_steps=100, eval_every=50, eval_episodes=1, overrides=TINY) == "finished"
    with open(d / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(float(r["env_step"])) for r in rows] == [0, 50, 100]  # step 0, then every eval_every
    assert {"eval/success_rate", "eval/return_mean", "time/seconds", "grad_step"} <= set(rows[0])
    times = [float(r["time/seconds"]) for r in rows]
    assert times == sorted(times) and times[0] >= 0
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert [x["env_step"] for x in lines] == [0, 50, 100] and all(x["phase"] == "online" for x in lines)
    summary = json.loads((d / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["num_online_env_steps"] == 100
    assert summary["num_grad_steps"] == 100 - 60  # one gradient step per env step after the warm-up
    config = json.loads((d / "config.json").read_text())
    assert config["eval_seed"] == sb3_her.eval_seed(3) and config["sb3"]["batch_size"] == 32
    before = (d / "eval.csv").read_text()
    assert sb3_her.run_one(d, 3, env_steps=100, eval_every=50, eval_episodes=1, overrides=TINY) == "skipped"
    assert (d / "eval.csv").read_text() == before


def test_one_process_per_run_directory(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    with DirectoryLock(d, sb3_her.RUN_LOCK, what="run"):
        with pytest.raises(LockedError, match="in use"):
            sb3_her.run_one(d, 0, env_steps=10)
    assert not (d / "eval.csv").exists()


def test_eval_seed_is_the_relive_trainers():
    from relive.train.trainer import _int, seed_streams

    assert [sb3_her.eval_seed(s) for s in (0, 7)] == [_int(seed_streams(s)["eval"]) for s in (0, 7)]


def _fake_run(d, successes):
    d.mkdir(parents=True)
    with open(d / "eval.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(sb3_her.EVAL_COLUMNS)
        for i, s in enumerate(successes):
            w.writerow([i * 1000, i * 900, -50 * (1 - s), 0.0, s, 10.0 * (i + 1)])
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


def test_report_combines_the_grid_root_and_the_sb3_root_without_writing_the_grid_root(tmp_path):
    pytest.importorskip("matplotlib")
    grid_root, root, out = tmp_path / "grid", tmp_path / "sb3", tmp_path / "out"
    _fake_run(grid_root / "her-fetch" / "sac_her" / "FetchReach-v4" / "seed_0", [0.0, 0.5, 1.0])
    _fake_run(grid_root / "her-fetch" / "sac_no_her" / "FetchReach-v4" / "seed_0", [0.0, 0.0, 0.0])
    _fake_run(root / "her-fetch" / "sb3_sac_her" / "FetchReach-v4" / "seed_0", [0.0, 0.9, 1.0])
    _fake_run(root / "her-fetch" / "sb3_sac_her" / "FetchReach-v4" / "seed_1", [0.0, 0.2, 1.0])
    before = sorted(p.relative_to(grid_root) for p in grid_root.rglob("*"))
    md = sb3_her.report(grid_root, root, out)
    text = md.read_text()
    assert "sb3_sac_her" in text and "sac_no_her" in text
    assert "| sb3_sac_her | 2 | 30 | 20, 30 | 1000, 2000 |" in text  # seconds, env steps to success >= 0.9 per run
    assert "| sac_no_her | 1 | 30 | - | - |" in text
    assert text.index("## Success vs wall-clock") < text.index("<!-- notes below")
    md.write_text(md.read_text() + "a note\n")
    again = sb3_her.report(grid_root, root, out, overwrite=True).read_text()  # replaced, notes kept
    assert again.count("## Success vs wall-clock") == 1 and again.endswith("a note\n")
    assert (out / "her-fetch_wallclock.png").is_file() and (out / "her-fetch_curves.png").is_file()
    assert sorted(p.relative_to(grid_root) for p in grid_root.rglob("*")) == before
    assert len(load_grid("her-fetch").variants) == 4  # the shipped grid is unchanged
