"""Tiny seeded learning tests: the agents learn what they must on problems small enough to run in seconds."""

import numpy as np
import torch

from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.sac import SAC, SACConfig
from relive.replay import PrioritizedSampler, ReplayBuffer


def test_sac_solves_a_one_dimensional_continuous_bandit():
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = 2000
    a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    rows = dict(obs=np.ones((n, 1), np.float32), action=a, reward=-((a[:, 0] - 0.5) ** 2) * 10,
                next_obs=np.ones((n, 1), np.float32), terminated=np.ones(n, bool), truncated=np.zeros(n, bool))
    buf = ReplayBuffer(n, (1,), (1,), seed=0)
    buf.add_offline(rows)
    cfg = SACConfig(hidden=(32, 32), critic_lr=3e-3, actor_lr=1e-3, init_temperature=0.05, target_entropy=-3.0)
    agent = SAC(1, 1, [-1.0], [1.0], cfg, seed=0)
    for _ in range(600):
        agent.update(buf.sample(64))
    best = float(agent.act(np.ones((1, 1), np.float32), explore=False)[0, 0])
    assert abs(best - 0.5) < 0.15, best


def chain_step(state, action, length):
    nxt = min(state + 1, length - 1) if action == 1 else max(state - 1, 0)
    done = nxt == length - 1
    return nxt, float(done), done


def test_ddqn_learns_to_walk_right_on_a_chain_with_prioritized_replay():
    torch.set_num_threads(1)
    length, horizon = 6, 20
    eye = np.eye(length, dtype=np.float32)
    agent = DDQN(length, 2, DDQNConfig(hidden=(32,), lr=3e-3, gamma=0.9, target_update_period=50,
                                       eps_decay_steps=1500, eps_end=0.1), seed=0)
    buf = ReplayBuffer(5000, (length,), (), action_dtype=np.int64, sampler=PrioritizedSampler(), seed=0)
    state, t = 0, 0
    for step in range(3000):
        action = int(agent.act(eye[state], explore=True))
        nxt, reward, done = chain_step(state, action, length)
        t += 1
        truncated = t >= horizon and not done
        buf.add(obs=eye[state], action=action, reward=reward, next_obs=eye[nxt], terminated=done, truncated=truncated)
        state = 0 if (done or truncated) else nxt
        t = 0 if (done or truncated) else t
        if step >= 100:
            batch = buf.sample(32)
            result = agent.update(batch)
            buf.update(batch.info, td_error=result.signals["td_error"])
    greedy = agent.act(eye[:-1], explore=False)
    assert (greedy == 1).all(), greedy
