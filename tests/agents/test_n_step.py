"""Every TD agent's ``n_step`` (issue 17, item 5): targets from the buffer's n-step returns, checked by hand; an
n-step batch whose rows all have n' = 1 trains exactly as the one-step batch; mismatches and ill-posed settings are
refused; the trainer builds the buffer with the agent's setting."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from relive.agents.cal_ql import CalQL, CalQLConfig
from relive.agents.ddpg import DDPG, DDPGConfig
from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig
from relive.agents.sac import SAC, SACConfig
from relive.agents.sac_refer import SACReFER, SACReFERConfig
from relive.agents.vracer import VRACERConfig
from relive.registry import AGENTS, load_builtins
from relive.replay import ReplayBuffer
from tests.agents.test_residual_sac import LinearBase

OBS, ACT, NUM_ACTIONS = 5, 2, 3
LOW, HIGH = -np.ones(ACT, np.float32), np.ones(ACT, np.float32)
SMALL = dict(hidden=(16, 16))
GAMMA = 0.5


def make(kind: str, n_step: int):
    c = dict(SMALL, n_step=n_step, gamma=GAMMA)
    if kind == "sac":
        return SAC(OBS, ACT, LOW, HIGH, SACConfig(**c), seed=0)
    if kind == "rlpd":
        return SAC(OBS, ACT, LOW, HIGH, SACConfig.rlpd(**c, num_qs=4, actor_every=1), seed=0)
    if kind == "calql":
        return CalQL(OBS, ACT, LOW, HIGH, CalQLConfig(**c, cql_n_actions=2), seed=0)
    if kind == "sac_refer":
        return SACReFER(OBS, ACT, LOW, HIGH, SACReFERConfig(**c), seed=0)
    if kind == "ddpg":
        return DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(**c), seed=0)
    if kind == "ddqn":
        return DDQN(OBS, NUM_ACTIONS, DDQNConfig(**c, target_update_period=2), seed=0)
    if kind in ("residual_offline", "residual_online"):
        agent = ResidualSAC(OBS, ACT, LOW, HIGH, ResidualSACConfig(**c, warmup=0, probe_max_steps=0), seed=0,
                            base_policy=LinearBase())
        agent.on_phase("offline" if kind == "residual_offline" else "online")
        return agent
    raise ValueError(kind)


KINDS = ["sac", "rlpd", "calql", "sac_refer", "ddpg", "ddqn", "residual_offline", "residual_online"]


def filled_buffer(discrete: bool, n_step: int, flags, seed: int = 0) -> ReplayBuffer:
    rng = np.random.default_rng(seed)
    n = len(flags)
    flags = np.asarray(flags)
    buf = ReplayBuffer(64, (OBS,), () if discrete else (ACT,), n_step=n_step, gamma=GAMMA, seed=seed,
                       action_dtype=np.int64 if discrete else np.float32,
                       extra_columns={"mc_return": (), "mu_mean": (ACT,), "mu_std": (ACT,)})
    obs = rng.normal(size=(n + 1, OBS)).astype(np.float32)
    buf.extend(dict(obs=obs[:-1], next_obs=obs[1:], reward=rng.integers(-4, 5, n).astype(np.float32),
                    action=rng.integers(0, NUM_ACTIONS, n) if discrete else rng.uniform(-1, 1, (n, ACT)),
                    terminated=flags == 1, truncated=flags == 2, mc_return=rng.normal(size=n),
                    mu_mean=rng.normal(size=(n, ACT)), mu_std=np.full((n, ACT), 0.5)))
    return buf


def params(agent) -> list[torch.Tensor]:
    state = agent.state_dict()
    return [torch.as_tensor(np.asarray(v)) for k in sorted(state) if isinstance(state[k], dict)
            for name, v in sorted(state[k].items()) if isinstance(v, np.ndarray) and v.dtype.kind == "f"]


@pytest.mark.parametrize("kind", KINDS)
def test_n_step_batches_with_one_row_left_train_exactly_as_one_step_batches(kind):
    """Every row ends its episode (terminated or truncated): n' = 1 everywhere, discount = gamma (1 - terminated),
    so an agent with n_step = 3 on the 3-step batch takes the very step the one-step agent takes."""
    flags = np.random.default_rng(1).choice([1, 2], 24)
    discrete = kind == "ddqn"
    one, three = make(kind, 1), make(kind, 3)
    buf1, buf3 = filled_buffer(discrete, 1, flags), filled_buffer(discrete, 3, flags)
    slots = np.random.default_rng(2).integers(0, 24, (3, 16))
    for s in slots:
        b1, b3 = buf1.gather(s), buf3.gather(s)
        assert b1.discount is None and b3.discount is not None
        r1, r3 = one.update(b1), three.update(b3)
        np.testing.assert_array_equal(r1.signals["td_error"], r3.signals["td_error"])
    for a, b in zip(params(one), params(three), strict=True):
        assert torch.equal(a, b)


EPISODES = [0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 0]  # terminated at row 3, truncated at row 6, rows 7-10 open


def hand_n_step(buf: ReplayBuffer, n: int):
    """(R, discount, bootstrap row) of every stored row of ``EPISODES``, written out one row at a time."""
    rewards = buf.storage.columns["reward"][: len(EPISODES)].astype(np.float64)
    out = []
    for t in range(len(EPISODES)):
        ret, k = 0.0, 0
        while True:
            ret += GAMMA**k * rewards[t + k]
            k += 1
            if k == n or EPISODES[t + k - 1] != 0 or t + k == len(EPISODES):
                break
        last = t + k - 1
        out.append((ret, 0.0 if EPISODES[last] == 1 else GAMMA**k, last))
    return out


def test_ddqn_n_step_target_by_hand():
    agent = make("ddqn", 3)
    buf = filled_buffer(True, 3, EPISODES)
    b = buf.gather(np.arange(len(EPISODES)))
    bt = b.to_torch()
    y = agent.target(bt.reward, bt.next_obs, bt.terminated, bt.discount)
    next_obs = torch.as_tensor(buf.storage.columns["next_obs"])
    for t, (ret, discount, last) in enumerate(hand_n_step(buf, 3)):
        s = next_obs[last : last + 1]
        q_next = agent.target_q(s)[0, agent.q(s)[0].argmax()]
        assert y[t].item() == pytest.approx(ret + discount * q_next.item(), rel=1e-6, abs=1e-6)
    assert [d for _, d, _ in hand_n_step(buf, 3)] == [0.125, 0, 0, 0, 0.125, 0.25, 0.5, 0.125, 0.125, 0.25, 0.5]


def test_ddpg_n_step_target_by_hand():
    agent = make("ddpg", 2)
    buf = filled_buffer(False, 2, EPISODES)
    bt = buf.gather(np.arange(len(EPISODES))).to_torch()
    y = agent.critic_target(bt.reward, bt.next_obs, bt.terminated, bt.discount)
    next_obs = torch.as_tensor(buf.storage.columns["next_obs"])
    for t, (ret, discount, last) in enumerate(hand_n_step(buf, 2)):
        s = next_obs[last : last + 1]
        q_next = agent.target_critic(s, agent.target_actor(s))[0, 0]
        assert y[t].item() == pytest.approx(ret + discount * q_next.item(), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("kind", ["sac", "ddqn", "ddpg", "residual_online"])
def test_a_batch_that_does_not_match_the_agents_n_step_is_refused(kind):
    discrete = kind == "ddqn"
    with pytest.raises(ValueError, match="n_step = 3 but the batch holds one-step rows"):
        make(kind, 3).update(filled_buffer(discrete, 1, EPISODES).gather(np.arange(8)))
    with pytest.raises(ValueError, match="the batch holds n-step returns"):
        make(kind, 1).update(filled_buffer(discrete, 3, EPISODES).gather(np.arange(8)))


def test_every_agent_has_n_step_and_bad_values_are_refused():
    load_builtins()
    for name, entry in AGENTS.items():
        if not entry.target.__module__.startswith("relive."):
            continue  # (toy agents that test files register)
        assert "n_step" in {f.name for f in dataclasses.fields(entry.config_cls)}, name
        assert entry.config_cls().n_step == 1
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match="n_step"):
                entry.config_cls(n_step=bad)
    for cls in (SACConfig, CalQLConfig, SACReFERConfig, DDPGConfig, DDQNConfig, ResidualSACConfig):
        assert cls(n_step=5).n_step == 5
    with pytest.raises(ValueError, match="V-RACER takes n_step = 1 only"):
        VRACERConfig(n_step=3)


def test_the_trainer_builds_the_buffer_with_the_agents_n_step(tmp_path):
    from relive.cli import main
    from relive.replay.checkpoint import load_tree

    run = tmp_path / "run"
    code = main(["train", "ddqn", "--env", "CartPole-v1", "--online-steps", "200", "--warmup", "50",
                 "--eval-every", "200", "--eval-episodes", "1", "--batch-size", "32", "--no-progress",
                 "--set", "agent.hidden=[16,16]", "--set", "agent.n_step=3", "--set", "agent.gamma=0.9",
                 "--set", "run.save_final_buffer=true", "--run-dir", str(run)])
    assert code == 0
    assert json.loads((run / "config.json").read_text())["agent"]["n_step"] == 3
    buf = ReplayBuffer.from_state_dict(load_tree(run / "buffer_final", kind="replay_buffer"))
    assert (buf.n_step, buf.gamma) == (3, 0.9)
    assert buf.sample(8).discount is not None


def test_one_step_targets_are_todays_formula_bit_for_bit():
    """n_step = 1: the targets are bit for bit today's y = r + gamma (1 - terminated) V(s') (same generator draws,
    gamma 0.99: not a power of two, so a discount rounded another way, e.g. through float64, would show)."""
    g = 0.99
    buf = filled_buffer(False, 1, EPISODES)
    b = buf.gather(np.arange(len(EPISODES))).to_torch()
    ddpg = make("ddpg", 1)
    ddpg.cfg = dataclasses.replace(ddpg.cfg, gamma=g)
    q_next = ddpg.target_critic(b.next_obs, ddpg.target_actor(b.next_obs))[0]
    assert torch.equal(ddpg.critic_target(b.reward, b.next_obs, b.terminated),
                       b.reward + g * (1.0 - b.terminated) * q_next)
    sac = make("rlpd", 1)
    sac.cfg = dataclasses.replace(sac.cfg, gamma=g)
    state = sac.gen.get_state()
    y = sac.critic_target(b.reward, b.next_obs, b.terminated)
    sac.gen.set_state(state)
    with torch.no_grad():
        next_a, next_logp = sac.actor.sample_from(*sac.actor(b.next_obs), sac.gen)
        v_next = sac.target_value(b.next_obs, next_a) - sac.alpha * next_logp
    assert torch.equal(y, b.reward + g * (1.0 - b.terminated) * v_next)
    dbuf = filled_buffer(True, 1, EPISODES)
    d = dbuf.gather(np.arange(len(EPISODES))).to_torch()
    ddqn = make("ddqn", 1)
    ddqn.cfg = dataclasses.replace(ddqn.cfg, gamma=g)
    with torch.no_grad():
        next_q = ddqn.target_q(d.next_obs).gather(1, ddqn.q(d.next_obs).argmax(dim=-1, keepdim=True)).squeeze(1)
    assert torch.equal(ddqn.target(d.reward, d.next_obs, d.terminated), d.reward + g * (1.0 - d.terminated) * next_q)


def test_agent_n_step_is_bounded_by_the_buffers_maximum():
    from relive.replay.returns import MAX_N_STEP

    for cls in (SACConfig, DDQNConfig, DDPGConfig):
        cls(n_step=MAX_N_STEP)
        with pytest.raises(ValueError, match=rf"n_step must be an integer in \[1, {MAX_N_STEP}\].*got 1000000"):
            cls(n_step=10**6)
