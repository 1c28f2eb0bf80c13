"""An agent that trains on slices (``sequence_spec``), defined in this file, runs through ``relive train``: every
batch it gets is [B, L, ...] with a mask, and no slice crosses an episode boundary (the steps it recorded at acting
time count up by one along every slice)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from relive.agents import networks as nets
from relive.cli import main
from relive.registry import register_agent
from relive.types import Acted, ColumnDecl, UpdateResult


@dataclass(frozen=True)
class SeqToyConfig:
    length: int = 5  # slice length L
    at_episode_end: str = "pad"  # "pad" or "reject"


SEEN: list = []


@register_agent("toy_sequences", SeqToyConfig)
class SeqToyAgent:
    """Random actions; records its step in the episode with every row; checks the slices it is given."""

    def __init__(self, action_dim, low, high, cfg: SeqToyConfig, seed: int):
        self.cfg, self.low, self.high, self.action_dim = cfg, low, high, action_dim
        self.rng = np.random.default_rng(seed)
        self.step = 0

    @classmethod
    def from_spec(cls, spec, config, seed, device="cpu"):
        return cls(spec.action_shape[0], spec.action_low, spec.action_high, config, nets.seed_int(seed))

    def stored_columns(self):
        return (ColumnDecl("toy_step", (), "int64", fill=-1, doc="step in the episode at acting time"),)

    def sequence_spec(self):
        return {"length": self.cfg.length, "at_episode_end": self.cfg.at_episode_end}

    def loop_hooks(self, ctx):
        from relive.hooks import OnEpisodeStart

        return [OnEpisodeStart(self._reset)]

    def _reset(self):
        self.step = 0

    def act(self, obs, explore):
        a = self.rng.uniform(self.low, self.high, (np.asarray(obs).reshape(-1, 3).shape[0], self.action_dim))
        if not explore:
            return a.astype(np.float32)
        record = {"toy_step": np.array([self.step])}
        self.step += 1
        return Acted(a.astype(np.float32), record)

    def update(self, batch):
        SEEN.append((np.asarray(batch.obs).shape, np.array(batch.mask), np.array(batch.toy_step),
                     np.array(batch.terminated | batch.truncated)))
        return UpdateResult({"train/toy": 0.0}, {})

    def state_dict(self):
        return {"rng": self.rng.bit_generator.state, "step": self.step}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["rng"]
        self.step = int(state["step"])


@pytest.fixture(autouse=True, scope="module")
def _unregister_after_this_module():
    yield
    from relive.registry import AGENTS

    AGENTS.pop("toy_sequences", None)


@pytest.mark.parametrize("at_episode_end", ["pad", "reject"])
def test_an_agent_with_a_sequence_spec_trains_on_slices_within_episodes(tmp_path, at_episode_end):
    SEEN.clear()
    assert main(["train", "sac", "--env", "Pendulum-v1", "--set", "agent_kind=toy_sequences", "--online-steps", "90",
                 "--warmup", "0", "--batch-size", "8", "--eval-every", "90", "--eval-episodes", "1", "--no-progress",
                 "--set", "env.max_episode_steps=12", "--set", f"agent.at_episode_end={at_episode_end}",
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert len(SEEN) > 50
    padded = 0
    for shape, mask, step, ends in SEEN:
        assert shape == (8, 5, 3) and mask.shape == (8, 5)
        for row in range(8):
            k = int(mask[row].sum())
            assert mask[row, :k].all() and not mask[row, k:].any()  # padding only at the tail
            np.testing.assert_array_equal(np.diff(step[row, :k]), 1)  # consecutive steps of one episode
            assert not ends[row, : k - 1].any()  # an episode end can only be a slice's last real step
            padded += 5 - k
    assert (padded > 0) == (at_episode_end == "pad")
