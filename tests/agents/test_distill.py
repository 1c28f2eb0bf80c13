"""Distillation (PLD stage 3) on a hand-made 1-D goal task, and the success signals it relies on."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from relive.agents.bc import BCConfig, load_bc_policy, new_policy, save_bc_policy
from relive.agents.distill import distill, hybrid_rollouts, successful_rows
from relive.config import override, save_config
from relive.envs import (
    ReturnThresholdSuccess,
    episode_success,
    make_env,
    reports_success,
    with_success,
)
from relive.presets import get_preset

H = 20  # time limit of the toy task
NEED = 5  # full-speed steps from the start to the goal


pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


class LineGoal(gym.Env):
    """x_0 = 0, x_{t+1} = x_t + 0.2 a_t, a in [-1, 1]; success (and termination) when x >= 0.95; obs [x, 1].
    Reaching the goal takes exactly NEED = 5 steps at a = 1."""

    reports_success = True
    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = 0.0
        return np.array([self.x, 1.0], np.float32), {}

    def step(self, action):
        self.x += 0.2 * float(np.clip(action[0], -1, 1))
        success = self.x >= 0.95
        return np.array([self.x, 1.0], np.float32), float(success), success, False, {"success": success}


gym.register("LineGoal-v0", entry_point=LineGoal, max_episode_steps=H)


def idle_base(tmp_path):
    """A BC policy whose action is exactly 0 (last layer zeroed): the base alone never reaches the goal."""
    policy = new_policy(2, 1, [-1.0], [1.0], BCConfig(hidden=(16, 16)), seed=0)
    with torch.no_grad():
        policy.net[-1].weight.zero_()
        policy.net[-1].bias.zero_()
    return save_bc_policy(tmp_path / "base", policy, {})


def full_speed(obs, base_action):
    return np.clip(base_action + 1.0, -1.0, 1.0)


def test_hybrid_rollouts_switch_at_t_base_and_success_follows_the_closed_form(tmp_path):
    from relive.agents.base_policy import load_base_policy
    from relive.envs import env_spec

    env = make_env("LineGoal-v0")
    base = load_base_policy(idle_base(tmp_path), env_spec(env))
    seen = []

    def residual(obs, base_action):
        seen.append((obs.shape, base_action.copy()))
        return full_speed(obs, base_action)

    eps = hybrid_rollouts(env, base, residual, num_episodes=40, seed=3)
    t_base = np.array([e["t_base"] for e in eps])
    assert t_base.min() >= 0 and t_base.max() <= H and len(set(t_base)) > 5  # T_base ~ U{0..H}
    for e in eps:
        r = e["rows"]
        # the residual acts exactly from T_base on: base actions (0) before, full speed after
        k = min(e["t_base"], len(r["action"]))
        np.testing.assert_array_equal(r["action"][:k], 0.0)
        np.testing.assert_array_equal(r["action"][k:], 1.0)
        np.testing.assert_array_equal(r["base_action"], 0.0)
        # success iff the residual had NEED steps before the time limit
        assert e["success"] == (e["t_base"] <= H - NEED)
        assert len(r["obs"]) == (e["t_base"] + NEED if e["success"] else H)
    assert all(shape == (1, 2) for shape, _ in seen) and all((a == 0).all() for _, a in seen)
    ok = successful_rows(eps)
    assert len(ok["obs"]) == sum(len(e["rows"]["obs"]) for e in eps if e["success"])
    assert 0 < sum(e["success"] for e in eps) < len(eps)


def test_distill_keeps_only_successes_and_moves_the_base_toward_the_executed_actions(tmp_path):
    base_dir = idle_base(tmp_path)
    old = load_bc_policy(base_dir)
    stats = distill(base_dir, full_speed, "LineGoal-v0", num_episodes=30, out=tmp_path / "d1", num_steps=150,
                    lr=3e-3, seed=0, eval_episodes=3)
    successes = np.array(stats["episode_successes"])
    assert stats["successful_episodes"] == successes.sum() == (np.array(stats["t_base"]) <= H - NEED).sum()
    lengths = [t + NEED for t, s in zip(stats["t_base"], successes, strict=True) if s]
    assert stats["rows"] == sum(lengths)  # only the successful episodes' rows were used
    new = load_bc_policy(tmp_path / "d1")
    obs = torch.tensor([[0.0, 1.0], [0.4, 1.0], [0.8, 1.0]])
    with torch.no_grad():
        assert (old(obs) == 0).all()
        # the executed actions of successes are 0 (base part) at x = 0 and 1 (residual) beyond: the new base
        # acts positively along the way, and now reaches the goal on its own
        assert (new(obs)[1:] > 0.5).all()
    assert stats["old_base_success_rate"] == 0.0 and stats["new_base_success_rate"] == 1.0
    # the old base directory is untouched, and the new one is itself a base for the next round (flywheel)
    assert torch.equal(load_bc_policy(base_dir).net[0].weight, old.net[0].weight)
    again = distill(tmp_path / "d1", full_speed, "LineGoal-v0", num_episodes=5, out=tmp_path / "d2", num_steps=5)
    assert again["successful_episodes"] >= 1
    assert json.loads((tmp_path / "d2" / "distill.json").read_text())["base"] == str(tmp_path / "d1")


class Idle(torch.nn.Module):
    def forward(self, obs):
        return torch.zeros(obs.shape[0], 1)


def test_distill_of_a_base_that_is_not_a_bc_mlp_fits_a_new_bc_student(tmp_path):
    """A TorchScript base (as a SAC actor or any module) cannot be fine-tuned in place: a new BC MLP is fitted to
    the successful hybrid episodes' executed actions, and it reaches the goal the idle base never reaches."""
    path = tmp_path / "idle.pt"
    torch.jit.save(torch.jit.script(Idle()), str(path))
    with pytest.raises(ValueError, match="idle.pt is a TorchScript file.*--trust-code"):  # code: only when trusted
        distill(path, full_speed, "LineGoal-v0", num_episodes=30, out=tmp_path / "student")
    stats = distill(path, full_speed, "LineGoal-v0", num_episodes=30, out=tmp_path / "student", num_steps=300,
                    lr=3e-3, seed=0, eval_episodes=3, trusted=True)
    assert stats["new_base"].startswith("a new BC MLP")
    assert stats["old_base_success_rate"] == 0.0 and stats["new_base_success_rate"] == 1.0
    new = load_bc_policy(tmp_path / "student")
    with torch.no_grad():
        assert (new(torch.tensor([[0.4, 1.0], [0.8, 1.0]])) > 0.5).all()


def test_distill_without_any_success_or_success_signal_gets_clear_errors(tmp_path):
    base_dir = idle_base(tmp_path)
    with pytest.raises(ValueError, match="none of the 4 hybrid episodes"):
        distill(base_dir, lambda o, a: a, "LineGoal-v0", num_episodes=4, out=tmp_path / "x", num_steps=1)
    with pytest.raises(ValueError, match="Pendulum-v1 has no success signal"):
        distill(base_dir, lambda o, a: a, "Pendulum-v1", num_episodes=1, out=tmp_path / "x", num_steps=1)


def test_success_signals():
    pend = make_env("Pendulum-v1")
    assert not reports_success(pend)
    with pytest.raises(ValueError, match="success_return"):
        with_success(pend)
    with pytest.raises(ValueError, match="reports no info"):
        episode_success({}, pend)
    wrapped = with_success(pend, success_return=-50.0)
    assert isinstance(wrapped, ReturnThresholdSuccess) and reports_success(wrapped)
    wrapped.reset(seed=0)
    total, info = 0.0, {}
    for _ in range(3):
        _, r, *_, info = wrapped.step(np.zeros(1, np.float32))
        total += r
    assert episode_success(info, wrapped) == (total >= -50.0)
    line = with_success(make_env("LineGoal-v0"))
    assert reports_success(line)
    line.reset(seed=0)
    for _ in range(NEED):
        *_, info = line.step(np.ones(1, np.float32))
    assert episode_success(info, line)


def test_pointmaze_reports_success():
    pytest.importorskip("gymnasium_robotics")
    assert reports_success(make_env("PointMaze_UMaze-v3"))


def test_cli_distill(tmp_path, monkeypatch, capsys):
    from relive.cli import main

    base_dir = idle_base(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    args = ["pld", "distill", "--run", str(run), "--episodes", "6", "--out", str(tmp_path / "new"), "--steps", "5",
            "--eval-episodes", "0"]
    # a directory that is not a finished residual run: one line, exit code 2
    assert main(args) == 2 and "not a finished run directory" in capsys.readouterr().err
    monkeypatch.setattr("relive.agents.residual_sac.load_residual", lambda run_dir: full_speed)
    with pytest.raises(ValueError, match="pass --env and --base"):
        main(["--debug", *args])
    save_config(override(get_preset("residual_sac"), ['env.id="LineGoal-v0"', f'agent.base_policy="{base_dir}"']),
                run / "config.json")
    capsys.readouterr()
    assert main(args) == 0
    assert '"successful_episodes"' in capsys.readouterr().out
    assert (tmp_path / "new" / "policy" / "MANIFEST.json").is_file()


def test_collect_keeps_the_base_policys_successful_episodes_as_a_dataset(tmp_path):
    """PLD's D_offline: the base alone, successes only, saved as a relive .npz (and never overwritten)."""
    from relive.cli import main
    from relive.data.npz_io import load_dataset
    from relive.train.pld_cli import collect_successes

    with pytest.raises(ValueError, match="succeeded in none of 4 episodes"):
        collect_successes(idle_base(tmp_path), "LineGoal-v0", 4, tmp_path / "none.npz")
    assert not (tmp_path / "none.npz").exists()
    policy = new_policy(2, 1, [-1.0], [1.0], BCConfig(hidden=(16, 16)), seed=0)
    with torch.no_grad():  # always full speed: every episode reaches the goal in NEED steps
        policy.net[-1].weight.zero_()
        policy.net[-1].bias.fill_(20.0)
    fast = save_bc_policy(tmp_path / "fast", policy, {})
    assert main(["pld", "collect", "--base", str(fast), "--env", "LineGoal-v0", "--episodes", "3",
                 "--out", str(tmp_path / "d_off.npz")]) == 0
    rows, meta = load_dataset(tmp_path / "d_off.npz")
    assert len(rows["obs"]) == 3 * NEED and rows["terminated"].sum() == 3 and meta["success_rate"] == 1.0
    np.testing.assert_allclose(rows["action"], 1.0, atol=1e-6)
    assert main(["pld", "collect", "--base", str(fast), "--env", "LineGoal-v0", "--episodes", "3",
                 "--out", str(tmp_path / "d_off.npz")]) == 2  # exists: refused, one line, exit 2


def test_cli_distill_keeps_the_runs_time_limit_and_base_and_never_replaces_out_silently(tmp_path, monkeypatch,
                                                                                        capsys):
    """Issue 28 item 7: `relive pld distill` rolls out episodes as long as the run's (env.max_episode_steps, also
    T_base's default horizon); a --base whose weights differ from the base the residual was trained on is refused
    unless --allow-other-base; an existing --out is refused unless --overwrite (which replaces it whole)."""
    from relive.agents.base_policy import load_base_policy
    from relive.cli import main
    from relive.envs import env_spec

    base_dir = idle_base(tmp_path)
    digest = load_base_policy(base_dir, env_spec(make_env("LineGoal-v0"))).digest()
    other = save_bc_policy(tmp_path / "other", new_policy(2, 1, [-1.0], [1.0], BCConfig(hidden=(16, 16)), seed=1), {})

    def residual(obs, base_action):
        return full_speed(obs, base_action)

    residual.base_sha256 = digest  # what residual_sac.load_residual attaches: the run's base
    monkeypatch.setattr("relive.agents.residual_sac.load_residual", lambda run_dir: residual)
    run = tmp_path / "run"
    run.mkdir()
    save_config(override(get_preset("residual_sac"), ['env.id="LineGoal-v0"', "env.max_episode_steps=8",
                                                      f'agent.base_policy="{base_dir}"']), run / "config.json")
    out = tmp_path / "new"
    args = ["pld", "distill", "--run", str(run), "--episodes", "30", "--out", str(out), "--steps", "5",
            "--eval-episodes", "0"]
    assert main(args) == 0
    stats = json.loads((out / "distill.json").read_text())
    assert stats["max_episode_steps"] == 8 and max(stats["t_base"]) <= 8  # (registered limit: 20)
    assert stats["base_sha256"] == stats["residual_trained_on_base_sha256"] == digest

    (out / "note.txt").write_text("keep me")
    capsys.readouterr()
    assert main(args) == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "note.txt").read_text() == "keep me"
    assert main([*args, "--overwrite"]) == 0 and not (out / "note.txt").exists()

    args2 = ["pld", "distill", "--run", str(run), "--episodes", "30", "--out", str(tmp_path / "d2"), "--steps", "5",
             "--eval-episodes", "0", "--base", str(other)]
    with pytest.raises(ValueError, match="--allow-other-base"):
        main(["--debug", *args2])
    assert not (tmp_path / "d2").exists()
    assert main([*args2, "--allow-other-base"]) == 0
