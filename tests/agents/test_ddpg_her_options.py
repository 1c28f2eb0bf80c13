"""DDPG's options from the HER code (openai/baselines her/ddpg.py, her/normalizer.py): random actions (random_eps),
inputs normalized by running statistics (obs_norm), and where they act (issue 46 item 3)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from relive.agents.ddpg import DDPG, DDPGConfig, InputNormalizer
from relive.agents.export import deterministic_policy
from relive.hooks import LoopContext, OnEpisodeEnd
from relive.replay import ReplayBuffer
from tests.agents.factory import ACT, HIGH, LOW, OBS, batch, make


def test_the_normalizer_on_hand_made_numbers():
    """Baselines' Normalizer: count starts at 1, mean = sum / count, std = sqrt(max(eps^2, sumsq / count - mean^2)),
    rows clipped to clip_obs before they count and before normalizing, the result clipped to norm_clip."""
    norm = InputNormalizer(2, eps=0.01, clip=5.0, obs_clip=200.0)
    # before any row: mean 0, std 1 -- the input clipped to [-200, 200], then to [-5, 5]
    x = torch.tensor([[0.5, -2.0], [7.0, -900.0]])
    torch.testing.assert_close(norm(x), torch.tensor([[0.5, -2.0], [5.0, -5.0]]), rtol=0, atol=0)
    norm.update(np.array([[1.0, 300.0], [3.0, -1.0]]))  # 300 counts as 200
    # sum [4, 199], sumsq [10, 40001], count 3: mean [4/3, 199/3], var [10/3 - 16/9, 40001/3 - 199^2/9]
    assert norm.count.tolist() == [3.0] and norm.sum.tolist() == [4.0, 199.0] and norm.sumsq.tolist() == [10, 40001]
    std = [math.sqrt(14) / 3, math.sqrt(80402) / 3]
    np.testing.assert_allclose(norm.mean.numpy(), [4 / 3, 199 / 3], rtol=1e-7)
    np.testing.assert_allclose(norm.std.numpy(), std, rtol=1e-7)
    got = norm(torch.tensor([[2.0, 250.0], [100.0, 0.0]])).numpy()
    # (2 - 4/3) / (sqrt(14)/3) = 2 / sqrt(14); (200 - 199/3) / (sqrt(80402)/3) = 401 / sqrt(80402); 100: clipped to 5
    want = [[2 / math.sqrt(14), 401 / math.sqrt(80402)], [5.0, (0 - 199 / 3) / std[1]]]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # eps floors std: a column of zeros has variance 0 -> std 0.01
    zeros = InputNormalizer(1, eps=0.01)
    zeros.update(np.zeros((2, 1)))
    assert zeros.std.tolist() == [pytest.approx(0.01)] and zeros.mean.tolist() == [0.0]
    assert zeros(torch.tensor([[0.03]])).item() == pytest.approx(3.0)


def test_normalized_inputs_at_acting_training_and_evaluation_time():
    """With obs_norm the agent acts and trains on normalized inputs: its update equals, bit for bit, the update of
    the same agent without obs_norm on the batch with obs / next_obs normalized by hand; act(explore=False) is the
    actor on the normalized observation."""
    on = make("ddpg", seed=3, obs_norm=True)
    rows = np.random.default_rng(0).normal(4.0, 2.0, size=(50, OBS))
    on.observe_rows(rows)
    off = make("ddpg", seed=3)
    b = batch("ddpg", seed=1)
    mean = rows.sum(0) / 51  # (the count's phantom first row)
    std = np.sqrt(np.maximum(1e-4, (rows**2).sum(0) / 51 - mean**2))
    by_hand = dataclasses.replace(b, obs=np.clip((b.obs - mean) / std, -5, 5).astype(np.float32),
                                  next_obs=np.clip((b.next_obs - mean) / std, -5, 5).astype(np.float32))
    on.update(b)
    off.update(by_hand)
    for name in ("actor", "critic", "target_actor", "target_critic"):
        for p, q in zip(getattr(on, name).parameters(), getattr(off, name).parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    obs = rows[:4].astype(np.float32)
    with torch.no_grad():
        want = on.actor(torch.as_tensor(np.clip((obs - mean) / std, -5, 5), dtype=torch.float32)).numpy()
    np.testing.assert_allclose(on.act(obs, explore=False).action, want, rtol=1e-5, atol=1e-6)


def test_the_statistics_come_from_each_finished_episodes_stored_rows():
    """The OnEpisodeEnd hook adds the episode's stored observations (the obs_keys of a dict observation) once."""
    shapes = {"observation": (3,), "desired_goal": (2,), "achieved_goal": (2,)}
    agent = DDPG(5, ACT, LOW, HIGH, DDPGConfig(hidden=(8,), obs_norm=True,
                                               obs_keys=("desired_goal", "observation")), seed=0)
    buf = ReplayBuffer(100, shapes, (ACT,))
    rng = np.random.default_rng(0)
    obs = {k: rng.normal(size=(6, *s)).astype(np.float32) for k, s in shapes.items()}
    slots = buf.extend({"obs": obs, "action": np.zeros((6, ACT), np.float32), "reward": np.zeros(6, np.float32),
                        "next_obs": obs, "terminated": np.zeros(6, bool), "truncated": np.r_[np.zeros(5), 1] > 0})
    (hook,) = [h for h in agent.loop_hooks(LoopContext(agent, buf, None, 0.98)) if isinstance(h, OnEpisodeEnd)]
    hook.fn(slots)
    flat = np.concatenate([obs["desired_goal"], obs["observation"]], axis=1)  # sorted keys
    np.testing.assert_allclose(agent.obs_normalizer.sum.numpy(), flat.astype(np.float64).sum(0), rtol=1e-12)
    assert agent.obs_normalizer.count.item() == 7
    assert not [h for h in make("ddpg").loop_hooks(None) if isinstance(h, OnEpisodeEnd)]  # off: no hook


def test_random_eps_replaces_that_share_of_actions_by_uniform_ones():
    """Seeded: with random_eps 0.3 about 30% of exploring actions are uniform over the box (the rest within the
    noise of the actor's mean); at 1 every action is uniform (its mean the box's center); evaluation never."""
    n = 20_000
    agent = make("ddpg", seed=0, random_eps=0.3, sigma=1e-4)
    obs = np.zeros((n, OBS), np.float32)
    mean = agent.act(obs, explore=False).action
    a = agent.act(obs, explore=True).action
    assert a.dtype == np.float32 and (a >= LOW).all() and (a <= HIGH).all()
    replaced = (np.abs(a - mean) > 1e-2).any(1)
    assert abs(replaced.mean() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)  # (the chance of a uniform draw within 1e-2: ~1%)
    uniform = make("ddpg", seed=1, random_eps=1.0).act(obs, explore=True).action
    np.testing.assert_allclose(uniform.mean(0), (LOW + HIGH) / 2, atol=0.03)
    np.testing.assert_allclose(uniform.std(0), (HIGH - LOW) / math.sqrt(12), rtol=0.02)
    np.testing.assert_array_equal(make("ddpg", seed=0, random_eps=1.0).act(obs[:5], explore=False).action,
                                  make("ddpg", seed=0).act(obs[:5], explore=False).action)


def test_the_statistics_are_saved_and_loaded_and_refused_when_missing():
    agent = make("ddpg_her")
    state = agent.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state["obs_normalizer"].values())
    fresh = make("ddpg_her", seed=5)
    fresh.obs_normalizer.update(np.ones((3, OBS)))
    fresh.load_state_dict(state)
    for name in ("count", "sum", "sumsq", "mean", "std"):
        assert torch.equal(getattr(fresh.obs_normalizer, name), getattr(agent.obs_normalizer, name))
    obs = np.random.default_rng(1).normal(size=(4, OBS)).astype(np.float32)
    np.testing.assert_array_equal(fresh.act(obs, explore=False).action, agent.act(obs, explore=False).action)
    with pytest.raises(ValueError, match="no input statistics"):
        fresh.load_state_dict(make("ddpg").state_dict())
    assert "obs_normalizer" not in make("ddpg").state_dict()  # off: the state as before


def test_refer_and_export_refuse_what_they_cannot_follow():
    b = batch("ddpg_refer")
    with pytest.raises(ValueError, match="random_eps"):
        make("ddpg_refer", random_eps=0.3).update(b)
    with pytest.raises(ValueError, match="normalized by running statistics"):
        deterministic_policy(make("ddpg_her"))
    deterministic_policy(make("ddpg", random_eps=0.3))  # (random actions are exploration only)


@pytest.mark.parametrize("bad", [dict(random_eps=1.5), dict(random_eps=-0.1), dict(obs_norm_eps=0.0),
                                 dict(obs_norm_clip=-1.0), dict(obs_clip=0.0), dict(obs_norm=1)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        DDPGConfig(**bad)


def test_off_by_default():
    cfg = DDPGConfig()
    assert (cfg.random_eps, cfg.obs_norm, cfg.obs_norm_eps, cfg.obs_norm_clip, cfg.obs_clip) == (0.0, False, 0.01, 5,
                                                                                              200)
