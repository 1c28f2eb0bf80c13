"""relive's buffer under real Stable-Baselines3 with a Dict observation space (MultiInputPolicy): the rows are stored
key by key, batches are dicts of tensors, and DQN learns a task that needs both keys."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from relive.integrations.sb3 import DQN, SAC, ReliveReplayBuffer  # noqa: E402
from relive.replay import PrioritizedSampler  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


class GoalCorridor(gym.Env):
    """A corridor of 5 cells, start in the middle; the target end (0 or 4) is drawn per episode and shown only in
    ``obs["target"]`` (``obs["position"]``: one-hot cell). Reward 1 on reaching the target (the episode ends), -0.1 per
    other step; 10 steps at most. Optimal return 0.9 (two steps); a policy that ignores ``target`` walks to the
    wrong end in half the episodes and returns -1 there."""

    def __init__(self):
        self.observation_space = gym.spaces.Dict({"position": gym.spaces.Box(0.0, 1.0, (5,), np.float32),
                                                  "target": gym.spaces.Box(0.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def _obs(self):
        return {"position": np.eye(5, dtype=np.float32)[self.pos], "target": np.eye(2, dtype=np.float32)[self.side]}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.side, self.t = 2, int(self.np_random.integers(2)), 0
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if action == 1 else -1), 0, 4))
        self.t += 1
        reached = self.pos == 4 * self.side
        return self._obs(), 1.0 if reached else -0.1, reached, self.t >= 10 and not reached, {}


@pytest.mark.slow  # (2,000 steps of DQN: ~10 s on an idle 2-core machine)
def test_dqn_with_per_learns_a_dict_observation_task():
    env = GoalCorridor()
    model = DQN("MultiInputPolicy", env, seed=0, replay_buffer_class=ReliveReplayBuffer,
                replay_buffer_kwargs=dict(sampler=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4)),
                learning_starts=200, train_freq=1, gradient_steps=1, target_update_interval=100,
                exploration_fraction=0.5, exploration_final_eps=0.05, learning_rate=1e-3, batch_size=32,
                buffer_size=5_000, policy_kwargs=dict(net_arch=[32]))
    model.learn(2_000)
    buf = model.replay_buffer.relive
    assert buf.storage.obs_keys == ("position", "target") and len(buf) == 2_000
    batch = model.replay_buffer.sample(8)
    assert set(batch.observations) == {"position", "target"} and batch.observations["position"].shape == (8, 5)
    assert isinstance(batch.next_observations["target"], torch.Tensor)
    # every stored row is a step of the task: one move, the target fixed in an episode, reward as the env gives it
    rows = buf.gather(np.arange(len(buf)))
    moved = np.argmax(rows.next_obs["position"], 1) - np.argmax(rows.obs["position"], 1)
    assert np.all(np.abs(moved) <= 1) and np.array_equal(rows.obs["target"], rows.next_obs["target"])
    assert np.array_equal(rows.reward == 1.0, rows.terminated)
    assert buf.num_updated >= 32 * 1_000  # TD errors reached the sampler
    mean_return, _ = evaluate_policy(model, GoalCorridor(), n_eval_episodes=20, deterministic=True, warn=False)
    assert mean_return >= 0.85, mean_return  # the target key is used: the shortest way in (nearly) every episode


def test_sac_takes_dict_observations_and_vector_envs():
    from stable_baselines3.common.env_util import make_vec_env

    class Reach(gym.Env):  # (a continuous dict task: SAC's actor and critics read both keys)
        observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                             "goal": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
        action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.x, self.goal, self.t = np.zeros(2, np.float32), self.np_random.uniform(-1, 1, 2).astype(np.float32), 0
            return {"x": self.x.copy(), "goal": self.goal.copy()}, {}

        def step(self, action):
            self.x = np.clip(self.x + 0.2 * np.asarray(action, np.float32), -1, 1).astype(np.float32)
            self.t += 1
            return ({"x": self.x.copy(), "goal": self.goal.copy()}, -float(np.linalg.norm(self.x - self.goal)), False,
                    self.t >= 8, {})

    vec = make_vec_env(Reach, n_envs=2, seed=0)
    model = SAC("MultiInputPolicy", vec, seed=0, learning_starts=40, batch_size=16, buffer_size=1_000,
                policy_kwargs=dict(net_arch=[16]), replay_buffer_kwargs=dict(sampler=PrioritizedSampler()))
    model.learn(160)
    buf = model.replay_buffer.relive
    assert len(buf) == 160 and buf.num_updated > 0
    rows = buf.gather(np.arange(len(buf)))
    ends = rows.truncated  # 8-step episodes in each of the 2 streams: 160 rows = 20 episodes
    assert ends.sum() == 20 and not rows.terminated.any()
    # next_obs of a truncated row is the true final observation (SB3's terminal_observation), not the reset one
    step = np.linalg.norm(rows.next_obs["x"][ends] - rows.obs["x"][ends], axis=1)
    assert np.all(step <= 0.2 * np.sqrt(2) + 1e-6) and not np.allclose(rows.next_obs["x"][ends], 0)


def test_dict_observations_refuse_offline_rows():
    env = GoalCorridor()
    with pytest.raises(ValueError, match="offline rows with a Dict observation space"):
        ReliveReplayBuffer(100, env.observation_space, env.action_space, offline={
            c: np.zeros(3) for c in ("obs", "action", "reward", "next_obs", "terminated", "truncated")})
