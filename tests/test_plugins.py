"""The plug-in contract, proven from outside ``src/``: a toy sampler and a toy agent defined and registered only
in this file run through ``relive train`` (and a killed run resumes exactly), with

- a sampler hint reaching the agent's update unchanged (``batch.info.hints``),
- a behaviour record declared by the agent, written by the collector from ``act``, read back from batches and
  from the checkpoint,
- probing steps (``store=False``) that are executed but never stored,
- every kind of loop hook served by the trainer (which names neither method).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pytest

from relive import hooks as H
from relive.agents import networks as nets
from relive.cli import main
from relive.registry import register_agent, register_replay
from relive.replay import MixtureSampler, ReplayBuffer, Sampler, UniformSampler, register_sampler
from relive.replay.checkpoint import load_tree
from relive.replay.samplers.base import Draw
from relive.types import Acted, ColumnDecl, UpdateResult

# -- a toy sampler: uniform over even slots, publishing a hint ---------------------------------------------


@dataclass(frozen=True)
class EvenSlotsConfig:
    hint_value: float = 0.25  # published to the agent as batch.info.hints["toy_hint"]


@register_sampler
class EvenSlotsSampler(Sampler):
    """Uniform over the stored rows in even slots (odd slots are never drawn)."""

    def __init__(self, hint_value: float = 0.25):
        super().__init__()
        self.hint_value = float(hint_value)
        self.num_batches = 0

    def _even(self) -> np.ndarray:
        lo, hi = self.domain()
        start = lo + (lo % 2)
        return np.arange(start, hi, 2)

    def _draw(self, batch_size, rng):
        even = self._even()
        idx = even[rng.integers(0, even.size, batch_size)]
        self.num_batches += 1
        return Draw(idx, np.full(batch_size, 1.0 / even.size), np.ones(batch_size, np.float32))

    def hints(self) -> dict:
        return {"toy_hint": self.hint_value, "toy_batches": self.num_batches}

    def probabilities(self) -> np.ndarray:
        p = np.zeros(self.storage.capacity)
        even = self._even()
        p[even] = 1.0 / even.size
        return p

    def config(self) -> dict:
        return {"hint_value": self.hint_value}

    def state_dict(self) -> dict:
        return super().state_dict() | {"num_batches": self.num_batches}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.num_batches = int(state["num_batches"])


@register_replay("toy_even", EvenSlotsConfig)
def build_even(options: EvenSlotsConfig, ctx) -> EvenSlotsSampler:
    """toy: uniform over even slots"""
    return EvenSlotsSampler(options.hint_value)


# -- a toy agent: a linear policy with a behaviour record, probing and every hook ---------------------------


@dataclass(frozen=True)
class ToyConfig:
    lr: float = 0.01  # step size of the toy regression
    probe_steps: int = 3  # the first steps of each online episode are executed with zero action, not stored
    noise: float = 0.1  # exploration noise around the linear mean
    rescore_every: int = 5  # an EveryGradSteps hook on this cadence (online)


@register_agent("toy_linear", ToyConfig)
class ToyAgent:
    """a = clip(W obs + noise); stores W obs as its behaviour record."""

    def __init__(self, obs_dim, action_dim, low, high, cfg: ToyConfig, seed: int):
        self.cfg, self.low, self.high = cfg, low, high
        self.w = np.zeros((action_dim, obs_dim))
        self.rng = np.random.default_rng(seed)
        self.step_in_episode = 0
        self.counts = {"episodes": 0, "every": 0, "after": 0, "ended": 0, "probed": 0}
        self.phases: list[str] = []
        self.hints_seen: list[dict] = []
        self.records_seen: list[np.ndarray] = []

    @classmethod
    def from_spec(cls, spec, config, seed, device="cpu"):
        return cls(int(np.prod(spec.obs_shape)), spec.action_shape[0], spec.action_low, spec.action_high, config,
                   nets.seed_int(seed))

    def stored_columns(self):
        return (ColumnDecl("toy_mean", (self.w.shape[0],), doc="the linear mean at acting time"),
                ColumnDecl("toy_step", (), "int64", fill=-1, doc="step in the episode (-1: not from act)"))

    def loop_hooks(self, ctx):
        def start():
            self.step_in_episode = 0
            self.counts["episodes"] += 1

        def count(key):
            self.counts[key] += 1

        return [H.OnEpisodeStart(start), H.OnPhase(self.phases.append),
                H.EveryGradSteps(self.cfg.rescore_every, lambda: count("every")),
                H.AfterUpdate(lambda b, r: count("after")), H.OnEpisodeEnd(lambda slots: count("ended"))]

    def act(self, obs, explore):
        mean = obs @ self.w.T
        if not explore:
            return np.clip(mean, self.low, self.high).astype(np.float32)
        probing = self.step_in_episode < self.cfg.probe_steps
        action = np.zeros_like(mean) if probing else mean + self.cfg.noise * self.rng.normal(size=mean.shape)
        record = {"toy_mean": mean.astype(np.float32), "toy_step": np.array([self.step_in_episode])}
        self.counts["probed"] += int(probing)
        self.step_in_episode += 1
        return Acted(np.clip(action, self.low, self.high).astype(np.float32), record, store=not probing)

    def update(self, batch):
        self.hints_seen.append(dict(batch.info.hints))
        self.records_seen.append(np.asarray(batch.toy_mean))
        err = batch.obs @ self.w.T - batch.action  # regress the mean on the stored actions
        self.w -= self.cfg.lr * err.T @ batch.obs / len(batch)
        return UpdateResult({"train/toy_loss": float(np.mean(err**2))}, {})

    def state_dict(self):
        return {"w": self.w.copy(), "rng": self.rng.bit_generator.state, "step": self.step_in_episode}

    def load_state_dict(self, state):
        self.w = np.asarray(state["w"], np.float64).copy()
        self.rng.bit_generator.state = state["rng"]
        self.step_in_episode = int(state["step"])


# -- tests ----------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True, scope="module")
def _unregister_after_this_module():
    """The toy methods exist for this file's tests only."""
    yield
    from relive.registry import AGENTS, REPLAYS
    from relive.replay.samplers import SAMPLERS

    REPLAYS.pop("toy_even", None)
    AGENTS.pop("toy_linear", None)
    SAMPLERS.pop("EvenSlotsSampler", None)


TOY = ["train", "sac", "--env", "Pendulum-v1", "--set", "agent_kind=toy_linear", "--replay", "toy_even",
       "--online-steps", "260", "--warmup", "0", "--batch-size", "16", "--eval-every", "130", "--eval-episodes", "1",
       "--no-progress", "--set", "env.max_episode_steps=50", "--set", "run.save_final_buffer=true"]


def test_a_sampler_and_an_agent_defined_in_a_test_run_through_relive_train(tmp_path, monkeypatch):
    agents = []
    original = ToyAgent.from_spec.__func__

    def capture(cls, *a, **k):
        agents.append(original(cls, *a, **k))
        return agents[-1]

    monkeypatch.setattr(ToyAgent, "from_spec", classmethod(capture))
    assert main([*TOY, "--run-dir", str(tmp_path / "run"), "--set", "agent.rescore_every=7"]) == 0
    agent = agents[0]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["agent_kind"] == "toy_linear" and config["agent"]["rescore_every"] == 7
    assert config["replay"] == {"name": "toy_even", "capacity": 1_000_000, "toy_even": {"hint_value": 0.25}}

    # 260 env steps in episodes of 50: 6 episodes started, 3 probing steps each executed but never stored
    assert agent.counts["episodes"] == 6 and agent.counts["probed"] == 18 and agent.counts["ended"] == 5
    buf = ReplayBuffer.load(tmp_path / "run" / "buffer_final")
    assert len(buf) == 260 - 18
    steps = buf.storage.columns["toy_step"][: len(buf)]
    assert steps.min() == 3  # no stored row comes from a probing step ...
    ends = np.flatnonzero(buf.storage.columns["truncated"][: len(buf)])
    np.testing.assert_array_equal(ends, [46, 93, 140, 187, 234])  # ... yet episodes end where the env ended them
    assert buf.storage.meta["step_in_episode"][0] == 0 and steps[0] == 3  # the stored part starts at takeover
    # the behaviour record is the policy's mean at acting time: W obs with the W of that moment (W = 0 at first)
    np.testing.assert_array_equal(buf.storage.columns["toy_mean"][:16], 0.0)

    # hints reach the agent unchanged, every update; the sampler's draws stayed on even slots
    # one update per stored row (probing steps are executed, not data: they earn no update), from the 16th stored
    # row on (the first full batch of 16): 242 stored rows -> 227 updates
    assert len(agent.hints_seen) == 260 - 18 - 15 and all(h["toy_hint"] == 0.25 for h in agent.hints_seen)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["num_online_env_steps"], summary["num_stored_online_env_steps"],
            summary["num_probing_env_steps"], summary["num_grad_steps"]) == (260, 242, 18, 227)
    assert [h["toy_batches"] for h in agent.hints_seen[:3]] == [1, 2, 3]
    assert agent.counts["after"] == len(agent.hints_seen)
    assert agent.counts["every"] == -(-len(agent.hints_seen) // 7)  # gradient steps 0, 7, 14, ... of the phase
    assert agent.phases == ["online"]  # no offline phase in this run
    assert all(r.shape == (16, 1) for r in agent.records_seen)


def test_a_killed_toy_run_resumes_exactly(tmp_path):
    from relive.cli import build_parser
    from relive.train.cli import config_from_args
    from relive.train.trainer import train

    def cfg(run_dir):
        args = build_parser().parse_args([*TOY, "--run-dir", str(run_dir), "--checkpoint-every", "60"])
        return config_from_args(args)

    train(cfg(tmp_path / "full"))

    class Kill(Exception):
        pass

    def kill(env_steps, grad_steps):
        if grad_steps == 150:
            raise Kill

    with pytest.raises(Kill):
        train(cfg(tmp_path / "cut"), on_step=kill)
    state = load_tree(tmp_path / "cut" / "checkpoint", kind="run")
    assert state["buffer"]["sampler"]["num_batches"] > 0 and "toy_mean" in state["buffer"]["storage"]["columns"]
    train(resume_dir=tmp_path / "cut")
    full, cut = (load_tree(tmp_path / d / "agent_final", kind="agent") for d in ("full", "cut"))
    np.testing.assert_array_equal(full["w"], cut["w"])
    a, b = (ReplayBuffer.load(tmp_path / d / "buffer_final") for d in ("full", "cut"))
    for name in ("obs", "action", "toy_mean", "toy_step"):
        np.testing.assert_array_equal(a.storage.columns[name][: len(a)], b.storage.columns[name][: len(b)])


def test_hints_pass_through_a_plain_buffer_a_mixture_and_to_torch():
    def fill(buf):
        n = 40
        rows = dict(obs=np.random.default_rng(0).normal(size=(n, 3)), action=np.zeros((n, 1)), reward=np.zeros(n),
                    next_obs=np.zeros((n, 3)), terminated=np.zeros(n, bool), truncated=np.arange(n) % 10 == 9)
        buf.add_offline({k: v[:20] for k, v in rows.items()})
        buf.extend({k: v[20:] for k, v in rows.items()})

    plain = ReplayBuffer(100, (3,), (1,), sampler=EvenSlotsSampler(0.5), seed=0)
    fill(plain)
    batch = plain.sample(8)
    assert batch.info.hints == {"toy_hint": 0.5, "toy_batches": 1} and (batch.info.indices % 2 == 0).all()
    t = batch.to_torch()
    assert t.info.hints == {"toy_hint": 0.5, "toy_batches": 1}

    mixed = ReplayBuffer(100, (3,), (1,), sampler=MixtureSampler(UniformSampler(), EvenSlotsSampler(0.75)), seed=0)
    fill(mixed)
    assert mixed.sample(8).to_torch().info.hints == {"toy_hint": 0.75, "toy_batches": 1}
    both = ReplayBuffer(100, (3,), (1,), sampler=MixtureSampler(EvenSlotsSampler(0.1), EvenSlotsSampler(0.2)))
    fill(both)
    hints = both.sample(8).info.hints  # a name both parts publish is kept per part
    assert hints["offline/toy_hint"] == 0.1 and hints["online/toy_hint"] == 0.2

    class ArrayHint(EvenSlotsSampler):
        def hints(self):
            return {"per_row": np.arange(8.0)}

    arr = ReplayBuffer(100, (3,), (1,), sampler=ArrayHint())
    fill(arr)
    import torch

    t = arr.sample(8).to_torch()
    assert isinstance(t.info.hints["per_row"], torch.Tensor) and t.info.hints["per_row"].tolist() == list(range(8))


def test_declared_columns_must_match_what_act_returns():
    from relive.envs import env_spec, make_env
    from relive.train.collector import Collector

    env = make_env("Pendulum-v1", max_episode_steps=5)
    decl = (ColumnDecl("mu", (1,)),)
    collector = Collector(env, env_spec(env), seed=0, record_columns=decl)
    rows = collector.step(lambda o: Acted(np.zeros((1, 1), np.float32), {"mu": np.ones((1, 1))}), 3)
    np.testing.assert_array_equal(rows["mu"], np.ones((3, 1)))
    rows = collector.step(lambda o: np.zeros((1, 1), np.float32), 2)  # no record (e.g. random warm-up): the fill
    np.testing.assert_array_equal(rows["mu"], np.zeros((2, 1)))
    with pytest.raises(ValueError, match="does not declare"):
        collector.step(lambda o: Acted(np.zeros((1, 1), np.float32), {"other": np.ones((1, 1))}), 1)
    flip = iter([True, False])
    with pytest.raises(ValueError, match="must come first"):
        Collector(env, env_spec(env), seed=1).step(
            lambda o: Acted(np.zeros((1, 1), np.float32), store=next(flip)), 2)


def test_a_dataset_lacking_a_required_column_is_refused_naming_it(tmp_path, monkeypatch):
    from relive.data.npz_io import save_dataset
    from relive.train.collector import collect_dataset

    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 100, seed=0))
    monkeypatch.setattr(ToyAgent, "stored_columns", lambda self: (ColumnDecl("toy_mean", (1,), offline="required"),))
    with pytest.raises(ValueError, match="lacks column 'toy_mean'"):
        main(["--debug", *TOY, "--dataset", str(data), "--run-dir", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()  # a run that could not start leaves nothing behind


def test_toy_config_is_a_frozen_dataclass_with_defaults():
    assert dataclasses.is_dataclass(ToyConfig) and ToyConfig().probe_steps == 3
