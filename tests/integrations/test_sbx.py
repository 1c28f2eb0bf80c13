"""relive's buffer under sbx (SB3's API in JAX, ``sbx-rl``) through relive.integrations.sb3's ``ReliveReplayBuffer``
(issue 49 item 2): sbx's DQN learns CartPole-v1 and sbx's SAC learns Pendulum-v1, seeded, with every batch drawn from
relive's buffer. Skipped without the extra "jax" (sbx, jax, flax, optax)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sbx", reason="sbx-rl is not installed (the extra \"jax\": pip install -c constraints.txt "
                                  "-e \".[jax]\")")
gym = pytest.importorskip("gymnasium")

from sbx import DQN, SAC  # noqa: E402

from relive.integrations.sb3 import ReliveReplayBuffer  # noqa: E402


class CountingBuffer(ReliveReplayBuffer):
    """relive's buffer, counting the batches sbx draws from it (and the rows)."""

    calls = 0
    rows = 0

    def sample(self, batch_size, env=None):
        self.calls += 1
        self.rows += int(batch_size)
        return super().sample(batch_size, env)


def mean_return(model, env_id: str, episodes: int = 5) -> float:
    """Deterministic episodes on a fresh env reset with seeds 100, 101, ..."""
    env = gym.make(env_id)
    total = 0.0
    for e in range(episodes):
        obs, _ = env.reset(seed=100 + e)
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    return total / episodes


def assert_sampled_from_relive(model, batch_size: int, grad_steps_per_call: int) -> None:
    buf = model.replay_buffer
    assert isinstance(buf, CountingBuffer) and buf.calls > 0
    assert buf.rows == buf.calls * batch_size * grad_steps_per_call  # sbx samples all gradient steps' rows at once
    assert buf.last_info is not None and len(buf.last_info.indices) == batch_size * grad_steps_per_call
    assert len(buf.relive) == model.num_timesteps  # every env step is in relive's storage (ring not yet full)


@pytest.mark.slow  # ~20 s of CPU (jit compiles included)
def test_sbx_dqn_learns_cartpole_from_relives_buffer():
    # rl-zoo's CartPole-v1 settings for DQN (as sbx's README), a shorter budget
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                seed=0, replay_buffer_class=CountingBuffer, replay_buffer_kwargs=dict(seed=0))
    model.learn(20_000)
    assert_sampled_from_relive(model, 64, 128)
    # a random policy scores ~22; this seed reaches ~100 (deterministic on CPU)
    assert mean_return(model, "CartPole-v1") >= 80


@pytest.mark.slow  # ~30 s of CPU
def test_sbx_sac_learns_pendulum_from_relives_buffer():
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=500, seed=0, replay_buffer_class=CountingBuffer,
                replay_buffer_kwargs=dict(seed=0))
    model.learn(5_000)
    assert_sampled_from_relive(model, 256, 1)
    # a random policy scores ~-1200
    assert mean_return(model, "Pendulum-v1") >= -400  # this seed: -122 (5 episodes, seeds of another evaluation)


def test_relive_buffer_hands_sbx_what_it_reads():
    """sbx's train() reads ``sample(B)``'s torch tensors with ``.numpy()`` and its ``discounts`` field (n-step):
    relive's rows, unchanged (a fast check without learning)."""
    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, learning_starts=10, seed=1, replay_buffer_class=CountingBuffer,
                replay_buffer_kwargs=dict(seed=3))
    model.learn(40)
    buf = model.replay_buffer
    data = buf.sample(8)
    rows = buf.relive.gather(buf.last_info.indices)
    np.testing.assert_array_equal(data.observations.numpy(), rows.obs)
    np.testing.assert_array_equal(data.next_observations.numpy(), rows.next_obs)
    np.testing.assert_array_equal(data.rewards.numpy().ravel(), rows.reward)
    np.testing.assert_array_equal(data.dones.numpy().ravel(), rows.terminated.astype(np.float32))
    assert data.discounts is None and buf.calls >= 30  # (one sample per env step after learning_starts)
