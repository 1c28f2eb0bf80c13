"""DDQN's speed paths (issue 45, the Atari-100k wall time): the reused target forward gives the same numbers bit
for bit, and the opt-in speed flags (fused Adam at any epsilon, channels-last convolutions) stay within float
rounding of the default."""

import numpy as np
import pytest
import torch

from relive.agents.ddqn import DDQN, DDQNConfig
from relive.replay import ReplayBuffer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/agents/conftest.py

SHAPE = (4, 36, 36)  # the smallest frame stack the Nature CNN reads


def image_buffer(n=64, seed=0) -> ReplayBuffer:
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(n, SHAPE, (), obs_dtype=np.uint8, action_dtype=np.int64, seed=seed)
    buf.extend({"obs": rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8), "action": rng.integers(0, 3, n),
                "reward": rng.normal(size=n).astype(np.float32),
                "next_obs": rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8),
                "terminated": np.arange(n) % 9 == 8, "truncated": np.zeros(n, bool)})
    return buf


def agent(cfg: DDQNConfig) -> DDQN:
    return DDQN(0, 3, cfg, seed=0, image=(SHAPE, np.uint8))


def weights(a: DDQN) -> list[torch.Tensor]:
    return [t.detach().clone() for t in (*a.q.parameters(), *a.target_q.parameters())]


@pytest.mark.parametrize("period", [1, 3])
def test_the_reused_target_forward_gives_the_same_numbers_bit_for_bit(period):
    """Each update of agent ``a`` reuses the online forward while the target is in sync; ``b`` is forced to run the
    target forward every time (the update as it was): TD errors, losses and weights stay equal exactly."""
    cfg = DDQNConfig(lr=1e-3, optimizer_eps=1.5e-4, target_update_period=period, clip_reward=True)
    a, b = agent(cfg), agent(cfg)
    buf_a, buf_b = image_buffer(), image_buffer()
    reused = 0
    for _ in range(7):
        reused += a.target_synced
        b.target_synced = False
        ra, rb = a.update(buf_a.sample(16)), b.update(buf_b.sample(16))
        np.testing.assert_array_equal(ra.signals["td_error"], rb.signals["td_error"])
        assert float(ra.metrics["train/loss"]) == float(rb.metrics["train/loss"])
    assert reused == (7 if period == 1 else 3)  # updates 1, 4, 7 follow a copy (or the start)
    for x, y in zip(weights(a), weights(b), strict=True):
        assert torch.equal(x, y)


def test_target_synced_follows_the_copies_and_a_loaded_state():
    cfg = DDQNConfig(lr=1e-3, target_update_period=2)
    a, buf = agent(cfg), image_buffer()
    assert a.target_synced  # the target starts as a copy
    a.update(buf.sample(8))
    assert not a.target_synced  # one step since: the target lags
    a.update(buf.sample(8))
    assert a.target_synced and all(torch.equal(t, s) for t, s in zip(a.target_q.parameters(), a.q.parameters(),
                                                                          strict=True))
    a.update(buf.sample(8))
    lagging, synced = agent(cfg), agent(cfg)
    lagging.load_state_dict(a.state_dict())
    assert not lagging.target_synced  # a checkpoint between copies: the target forward runs
    a.update(buf.sample(8))
    synced.load_state_dict(a.state_dict())
    assert synced.target_synced


def test_the_speed_flags_stay_within_float_rounding_of_the_default():
    base = DDQNConfig(lr=1e-3, optimizer_eps=1.5e-4, target_update_period=1)
    default = agent(base)
    fast = agent(DDQNConfig(lr=1e-3, optimizer_eps=1.5e-4, target_update_period=1, fused_adam=True,
                            channels_last=True))
    assert isinstance(fast.opt, torch.optim.Adam) and fast.opt.param_groups[0]["fused"]
    assert fast.q[1].weight.is_contiguous(memory_format=torch.channels_last)
    buf_a, buf_b = image_buffer(), image_buffer()
    for _ in range(5):
        ra, rb = default.update(buf_a.sample(16)), fast.update(buf_b.sample(16))
        np.testing.assert_allclose(rb.signals["td_error"], ra.signals["td_error"], rtol=0, atol=1e-5)
    for x, y in zip(weights(default), weights(fast), strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-6)
    obs = image_buffer(seed=1).sample(8).obs
    np.testing.assert_array_equal(fast.act(obs, explore=False), default.act(obs, explore=False))
    restored = agent(DDQNConfig(lr=1e-3, optimizer_eps=1.5e-4, target_update_period=1, fused_adam=True,
                                channels_last=True))
    restored.load_state_dict(fast.state_dict())  # (a channels-last state saves and loads as any other)
    for x, y in zip(weights(fast), weights(restored), strict=True):
        assert torch.equal(x, y)


def test_fused_adam_needs_adam():
    with pytest.raises(ValueError, match="fused_adam"):
        DDQNConfig(optimizer="rmsprop", fused_adam=True)
