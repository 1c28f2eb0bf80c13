"""Tiny seeded learning tests: each agent learns what it must on a problem small enough to run in seconds."""

import numpy as np
import pytest
import torch

from relive.agents.cal_ql import CalQL, CalQLConfig
from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.sac import SAC, SACConfig
from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/agents/conftest.py


def bandit_rows(n: int, rng: np.random.Generator, low: float = -1.0, high: float = 1.0) -> dict:
    """One-step episodes of a 1-D continuous bandit: r(a) = -10 (a - 0.5)^2, best action 0.5."""
    a = rng.uniform(low, high, (n, 1)).astype(np.float32)
    reward = (-10.0 * (a[:, 0] - 0.5) ** 2).astype(np.float32)
    return dict(obs=np.ones((n, 1), np.float32), action=a, reward=reward, next_obs=np.ones((n, 1), np.float32),
                terminated=np.ones(n, bool), truncated=np.zeros(n, bool), mc_return=reward.copy())


@pytest.mark.parametrize("preset", ["sac", "rlpd"])
def test_sac_solves_a_one_dimensional_continuous_bandit(preset):
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(2000, (1,), (1,), seed=0)
    rows = bandit_rows(2000, rng)
    rows.pop("mc_return")
    buf.add_offline(rows)
    common = dict(hidden=(32, 32), critic_lr=3e-3, actor_lr=1e-3, init_temperature=0.05, target_entropy=-3.0)
    cfg = SACConfig(**common) if preset == "sac" else SACConfig.rlpd(**common, num_qs=5, actor_every=1)
    agent = SAC(1, 1, [-1.0], [1.0], cfg, seed=0)
    for _ in range(500):
        agent.update(buf.sample(64))
    best = float(agent.act(np.ones((1, 1), np.float32), explore=False)[0, 0])
    assert abs(best - 0.5) < 0.15, best


def test_calql_stays_in_the_data_offline_where_sac_extrapolates_then_improves_online():
    """Offline data only covers actions in [-1, 0.2] (best covered action 0.2, true optimum 0.5). SAC trained on
    it extrapolates far beyond the data; Cal-QL's conservative, calibrated critic keeps its policy inside the
    data. Online (50/50 mixing, true returns-to-go for online rows as in the official Cal-QL) it moves right."""
    rng = np.random.default_rng(0)
    rows = bandit_rows(1000, rng, high=0.2)
    common = dict(hidden=(32, 32), critic_lr=3e-3, actor_lr=1e-3, temp_lr=1e-3, init_temperature=0.05,
                  target_entropy=-1.0)
    one = np.ones((1, 1), np.float32)
    results = {}
    for name, agent in (("sac", SAC(1, 1, [-1.0], [1.0], SACConfig(**common), seed=0)),
                        ("calql", CalQL(1, 1, [-1.0], [1.0], CalQLConfig(**common, cql_n_actions=4, cql_alpha=1.0),
                                        seed=0))):
        buf = ReplayBuffer(2000, (1,), (1,), sampler=MixtureSampler(UniformSampler(), UniformSampler(), 0.5),
                           extra_columns={"mc_return": ()}, seed=0)
        buf.add_offline(rows)
        for _ in range(300):
            agent.update(buf.sample(64))
        results[name] = float(agent.act(one, explore=False)[0, 0])
    assert results["sac"] > 0.6 and results["calql"] < 0.25, results
    agent.set_online(True)
    for _ in range(300):
        a = agent.act(np.ones((4, 1), np.float32), explore=True)
        r = (-10.0 * (a[:, 0] - 0.5) ** 2).astype(np.float32)
        buf.extend(dict(obs=np.ones((4, 1), np.float32), action=a, reward=r, next_obs=np.ones((4, 1), np.float32),
                        terminated=np.ones(4, bool), truncated=np.zeros(4, bool), mc_return=r))
        agent.update(buf.sample(64))
    online = float(agent.act(one, explore=False)[0, 0])
    assert online > results["calql"] + 0.03, (results, online)


def chain_step(state: int, action: int, length: int) -> tuple[int, float, bool]:
    nxt = min(state + 1, length - 1) if action == 1 else max(state - 1, 0)
    done = nxt == length - 1
    return nxt, float(done), done


def test_ddqn_learns_to_walk_right_on_a_chain_with_prioritized_replay():
    length, horizon = 6, 20
    eye = np.eye(length, dtype=np.float32)
    agent = DDQN(length, 2, DDQNConfig(hidden=(32,), lr=3e-3, gamma=0.9, target_update_period=50,
                                       eps_decay_steps=1500, eps_end=0.1), seed=0)
    buf = ReplayBuffer(5000, (length,), (), action_dtype=np.int64, sampler=PrioritizedSampler(), seed=0)
    state, t = 0, 0
    for step in range(2500):
        action = int(agent.act(eye[state], explore=True))
        nxt, reward, done = chain_step(state, action, length)
        t += 1
        truncated = t >= horizon and not done
        buf.add(obs=eye[state], action=action, reward=reward, next_obs=eye[nxt], terminated=done, truncated=truncated)
        state, t = (0, 0) if (done or truncated) else (nxt, t)
        if step >= 100:
            batch = buf.sample(32)
            result = agent.update(batch)
            buf.update(batch.info, td_error=result.signals["td_error"])
    greedy = agent.act(eye[:-1], explore=False)
    assert (greedy == 1).all(), greedy
    # the learned values follow the discounted distance to the goal: Q(s, right) = 0.9^(steps left - 1)
    with torch.no_grad():
        q_right = agent.q(torch.as_tensor(eye[:-1]))[:, 1].numpy()
    np.testing.assert_allclose(q_right, 0.9 ** np.arange(length - 2, -1, -1), atol=0.15)
