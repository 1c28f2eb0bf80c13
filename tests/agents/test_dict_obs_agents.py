"""The encoder seam (issue 17, item 1): agents read dict observations (a uint8 image + a float state) as the
concatenation of their keys in sorted order, so an update on a dict batch is exactly the update on the flat
batch of the concatenated keys, and ``act`` / ARB scores accept dict observations."""

import dataclasses

import numpy as np
import pytest
import torch

from relive.agents.encoders import concat_keys, flat_obs_batch, flat_obs_dim
from relive.replay import ReplayBuffer
from tests.agents.factory import KINDS, batch, make

# OBS = 5 numbers: a 2x2 uint8 "image" (4) + a 1-d "state" (1); sorted keys: image, state
SPEC = {"state": (1,), "image": ((2, 2), np.uint8)}


def as_dict(flat: np.ndarray) -> dict:
    n = flat.shape[0]
    image = np.clip(np.round(np.abs(flat[:, :4]) * 50), 0, 255).astype(np.uint8).reshape(n, 2, 2)
    return {"state": flat[:, 4:5].astype(np.float32), "image": image}


@pytest.mark.parametrize("kind", KINDS)
def test_update_on_a_dict_batch_equals_the_update_on_its_concatenation(kind):
    b = batch(kind, seed=1)
    d = dataclasses.replace(b, obs=as_dict(b.obs), next_obs=as_dict(b.next_obs))
    flat = dataclasses.replace(b, obs=concat_keys(d.obs), next_obs=concat_keys(d.next_obs))
    assert flat.obs.shape == (b.obs.shape[0], 5) and flat_obs_dim(SPEC) == 5
    np.testing.assert_array_equal(flat_obs_batch(d).obs[:, :4], d.obs["image"].reshape(-1, 4).astype(np.float32))
    a1, a2 = make(kind, seed=3), make(kind, seed=3)
    r1, r2 = a1.update(d), a2.update(flat)
    np.testing.assert_array_equal(r1.signals["td_error"], r2.signals["td_error"])
    for p, q in zip(a1.state_dict()["actor" if kind != "ddqn" else "q"].values(),
                    a2.state_dict()["actor" if kind != "ddqn" else "q"].values(), strict=True):
        np.testing.assert_array_equal(p, q)
    act1 = a1.act(as_dict(b.obs[:3]), explore=False)
    act2 = a2.act(concat_keys(as_dict(b.obs[:3])), explore=False)
    np.testing.assert_array_equal(act1, act2)


def test_sac_trains_from_a_dict_buffer_and_scores_its_rows():
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(200, SPEC, (2,), seed=0)
    n = 100
    frames = {"state": rng.normal(size=(n + 1, 1)).astype(np.float32),
              "image": rng.integers(0, 256, size=(n + 1, 2, 2), dtype=np.uint8)}
    buf.extend({"obs": {k: v[:-1] for k, v in frames.items()}, "next_obs": {k: v[1:] for k, v in frames.items()},
                "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32), "reward": rng.normal(size=n),
                "terminated": np.zeros(n, bool), "truncated": np.arange(n) % 25 == 24})
    agent = make("rlpd")
    for _ in range(3):
        b = buf.sample(16)
        res = agent.update(b)
        buf.update(b.info, td_error=res.signals["td_error"])
    scores = agent.score_fn()(buf.storage.read("obs", np.arange(10)), buf.storage.read("action", np.arange(10)))
    assert scores.shape == (10,) and np.isfinite(scores).all()
    assert all(torch.isfinite(torch.as_tensor(v)).all() for v in agent.state_dict()["actor"].values())
