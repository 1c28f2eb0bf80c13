"""Seeds as a batch dimension (issue 15, item 4): BatchedDDQN equals S single DDQN agents, update by update."""

import numpy as np
import pytest
import torch

from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.ddqn_batched import BatchedDDQN
from relive.replay import PrioritizedSampler, ReplayBuffer

OBS, ACTIONS, SEEDS = 4, 3, (0, 1, 2)


def buffers(n=300):
    """One PER buffer per seed, its own random rows (episodes of 25 with terminations)."""
    out = []
    for s in SEEDS:
        rng = np.random.default_rng(100 + s)
        buf = ReplayBuffer(1000, OBS, (), sampler=PrioritizedSampler(), seed=s, action_dtype=np.int64)
        buf.extend({"obs": rng.normal(size=(n, OBS)).astype(np.float32),
                    "action": rng.integers(0, ACTIONS, n), "reward": rng.normal(size=n).astype(np.float32),
                    "next_obs": rng.normal(size=(n, OBS)).astype(np.float32),
                    "terminated": np.arange(n) % 25 == 24, "truncated": np.zeros(n, bool)})
        out.append(buf)
    return out


def agents(cfg):
    return [DDQN(OBS, ACTIONS, cfg, seed=s) for s in SEEDS]


def params(agent):
    return {k: v.detach().clone() for k, v in agent.q.state_dict().items()} | {
        "target." + k: v.detach().clone() for k, v in agent.target_q.state_dict().items()}


@pytest.mark.parametrize("max_grad_norm", [10.0, 0.05, None])
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_batched_updates_equal_single_agents_seed_by_seed(max_grad_norm):
    """20 updates (a target copy every 7) on the same batches: losses, TD errors, weights, targets and Adam states
    of every seed equal its single agent's; the clip at 0.05 binds on every step, so the per-seed norm is tested."""
    cfg = DDQNConfig(hidden=(16, 16), lr=3e-3, target_update_period=7, max_grad_norm=max_grad_norm)
    single, batched = agents(cfg), BatchedDDQN(agents(cfg))
    for a, b in zip(single, batched.agents, strict=True):
        for k, v in params(a).items():
            torch.testing.assert_close(params(b)[k], v, rtol=0, atol=0, msg=k)  # the same initial networks
    bufs_a, bufs_b = buffers(), buffers()
    for _ in range(20):
        ba, bb = [b.sample(32) for b in bufs_a], [b.sample(32) for b in bufs_b]
        ra = [a.update(x) for a, x in zip(single, ba, strict=True)]
        rb = batched.update(bb)
        for i in range(len(SEEDS)):
            np.testing.assert_array_equal(ba[i].info.indices, bb[i].info.indices)  # same samples: same priorities
            np.testing.assert_allclose(rb[i].signals["td_error"], ra[i].signals["td_error"], atol=2e-5)
            assert rb[i].metrics["train/loss"] == pytest.approx(ra[i].metrics["train/loss"], abs=2e-5)
            bufs_a[i].update(ba[i].info, td_error=ra[i].signals["td_error"])
            bufs_b[i].update(bb[i].info, td_error=rb[i].signals["td_error"])
    batched.sync()
    for a, b in zip(single, batched.agents, strict=True):
        pa, pb = params(a), params(b)
        for k in pa:
            torch.testing.assert_close(pb[k], pa[k], atol=2e-5, rtol=1e-4, msg=k)
        sa, sb = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
        for k in sa:
            torch.testing.assert_close(sb[k]["exp_avg_sq"], sa[k]["exp_avg_sq"], atol=1e-7, rtol=1e-3)
            assert float(sb[k]["step"]) == float(sa[k]["step"]) == 20
        assert b.num_updates == a.num_updates == 20


def test_a_dropped_seed_leaves_the_others_unchanged_and_keeps_its_state():
    cfg = DDQNConfig(hidden=(16, 16), target_update_period=5)
    single, batched = agents(cfg), BatchedDDQN(agents(cfg))
    bufs = buffers()
    batches = [[b.sample(32) for b in bufs] for _ in range(12)]
    for k in range(12):
        for a, x in zip(single, batches[k], strict=True):
            if not (k >= 4 and a is single[1]):  # seed 1 stops after 4 updates
                a.update(x)
        if k == 4:
            left = batched.drop(1)
            for key, v in params(single[1]).items():
                torch.testing.assert_close(params(left)[key], v, atol=2e-5, rtol=1e-4, msg=key)
        batched.update([x for i, x in enumerate(batches[k]) if not (k >= 4 and i == 1)])
    batched.sync()
    assert [a.num_updates for a in batched.agents] == [12, 12] and batched.num_seeds == 2
    for a, b in zip([single[0], single[2]], batched.agents, strict=True):
        for key, v in params(a).items():
            torch.testing.assert_close(params(b)[key], v, atol=2e-5, rtol=1e-4, msg=key)


def test_act_is_each_seeds_epsilon_greedy_with_its_own_rng_and_schedule():
    cfg = DDQNConfig(hidden=(16, 16), eps_decay_steps=50)
    single, batched = agents(cfg), BatchedDDQN(agents(cfg))
    rng = np.random.default_rng(0)
    for _ in range(30):
        obs = [rng.normal(size=(2, OBS)).astype(np.float32) for _ in SEEDS]
        for explore in (True, False):
            want = [a.act(o, explore) for a, o in zip(single, obs, strict=True)]
            got = batched.act(obs, explore)
            for w, g in zip(want, got, strict=True):
                np.testing.assert_array_equal(g, w)
    assert [a.num_act_steps for a in batched.agents] == [60] * 3  # 30 calls x 2 envs, exploring calls only


def test_clear_errors():
    cfg = DDQNConfig(hidden=(16, 16))
    with pytest.raises(ValueError, match="one configuration"):
        BatchedDDQN([DDQN(OBS, ACTIONS, cfg, seed=0), DDQN(OBS, ACTIONS, DDQNConfig(hidden=(8, 8)), seed=1)])
    with pytest.raises(ValueError, match="at least one"):
        BatchedDDQN([])
    b = BatchedDDQN(agents(cfg))
    with pytest.raises(ValueError, match="2 batches for 3 seeds"):
        b.update([buf.sample(8) for buf in buffers()[:2]])
