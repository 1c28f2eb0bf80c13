"""env.success_key: evaluation's success from the task's own info flag (one option for every task: Meta-World's and
the mazes' "success", Gymnasium-Robotics Fetch's "is_success"), never per-task code."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from relive.config import EnvConfig
from relive.envs import InfoKeySuccess, reports_success, with_success
from relive.train.evaluation import evaluate_episodes


class FlagEnv(gym.Env):
    """A 6-step episode; ``info[key]`` is true at step ``hit`` only (None: never), reward 1 per step."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, hit: int | None, key: str = "is_success"):
        self.hit, self.key, self.t = hit, key, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        info = {self.key: float(self.t == self.hit)}
        return np.zeros(2, np.float32), 1.0, False, self.t >= 6, info


class ZeroAgent:
    def act(self, obs, explore=False):
        return np.zeros((1, 1), np.float32)


@pytest.mark.parametrize("hit, expected", [(None, False), (1, True), (3, True), (6, True)])
def test_an_episode_succeeds_when_the_flag_was_true_at_some_step(hit, expected):
    # Fetch's is_success can be true mid-episode and false at the last step (the object slides off the goal):
    # the episode counts as a success, as Gymnasium-Robotics' own evaluations count it
    returns, successes = evaluate_episodes(FlagEnv(hit), ZeroAgent(), 3, seed=0, success_key="is_success")
    assert returns.tolist() == [6.0, 6.0, 6.0]
    assert successes.tolist() == [expected] * 3


def test_without_a_success_key_there_are_no_successes():
    returns, successes = evaluate_episodes(FlagEnv(2), ZeroAgent(), 2, seed=0)
    assert successes is None and returns.tolist() == [6.0, 6.0]


def test_a_missing_key_names_the_key_and_the_keys_the_env_reports():
    with pytest.raises(ValueError, match=r"'success'.*is_success"):
        evaluate_episodes(FlagEnv(2), ZeroAgent(), 1, seed=0, success_key="success")


def test_the_wrapper_gives_info_success_as_success_so_far():
    env = InfoKeySuccess(FlagEnv(3), "is_success")
    env.reset(seed=0)
    flags = [env.step(np.zeros(1, np.float32))[4]["success"] for _ in range(6)]
    assert flags == [False, False, True, True, True, True]
    env.reset(seed=1)  # a new episode starts unsuccessful
    assert env.step(np.zeros(1, np.float32))[4]["success"] is False
    assert reports_success(with_success(FlagEnv(3), success_key="is_success"))


def test_with_success_refuses_two_definitions():
    with pytest.raises(ValueError, match="not both"):
        with_success(FlagEnv(3), success_return=1.0, success_key="is_success")


@pytest.mark.parametrize("kwargs, match", [({"success_key": ""}, "non-empty"),
                                           ({"success_key": "success", "success_return": 1.0}, "set one")])
def test_config_refuses_bad_success_keys(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnvConfig(**kwargs)


def test_a_run_logs_success_rate_from_the_info_key(tmp_path):
    # PointMaze reports info["success"]; a short run with env.success_key logs eval/success_rate from it
    pytest.importorskip("gymnasium_robotics")
    import csv

    from relive.config import override
    from relive.presets import get_preset
    from relive.train.trainer import train

    cfg = override(get_preset("sac"), [
        'env.id="PointMaze_UMaze-v3"', 'env.success_key="success"', "env.max_episode_steps=20",
        "schedule.num_online_env_steps=40", "schedule.num_warmup_env_steps=40", "run.eval_every_env_steps=40",
        "run.eval_episodes=2", f'run.run_dir="{tmp_path / "run"}"', "run.progress=false", "schedule.batch_size=8"])
    train(cfg)
    with open(tmp_path / "run" / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2  # step 0 and step 40
    assert all(float(r["eval/success_rate"]) in (0.0, 0.5, 1.0) for r in rows)  # 2 episodes each


def test_a_long_evaluation_episode_is_said_once_with_what_to_set(monkeypatch):
    """An episode past LONG_EPISODE_STEPS warns once (an env without a time limit looks like a hang otherwise);
    shorter ones say nothing."""
    import warnings

    import relive.train.evaluation as ev

    monkeypatch.setattr(ev, "LONG_EPISODE_STEPS", 4)
    with pytest.warns(RuntimeWarning, match=r"episode 1 of 2 has run 4 steps.*env.max_episode_steps") as got:
        returns, _ = ev.evaluate_episodes(FlagEnv(None), ZeroAgent(), 2, seed=0)
    assert returns.tolist() == [6.0, 6.0] and len(got) == 2  # (once per episode that long)
    assert "time limit: none in env.spec" in str(got[0].message)  # (no spec limit: said so, not "None")
    monkeypatch.setattr(ev, "LONG_EPISODE_STEPS", 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ev.evaluate_episodes(FlagEnv(None), ZeroAgent(), 2, seed=0)
