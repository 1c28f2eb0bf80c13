"""One contract over every registered replay strategy (DESIGN.md, "One contract per kind").

The ids come from the registry, not from a list kept by hand: every name ``--replay`` accepts (built-ins, the
optional built-ins such as ReF-ER and the compositions -- the mixture, HER --, and a plug-in registered in this file),
and every sampler class a checkpoint can name but no replay name offers. Each one, with its default options (HER:
over PER, a part with state), after updates and a refresh that give it a non-uniform state:

- ``probabilities()`` is a distribution over the stored rows (zero elsewhere), and the rows it draws follow it: a
  chi-square of 60,000 drawn indices, with a power companion -- the same draws against a distribution 10% off on a
  fifth of the rows must be rejected, so the first test can fail;
- an update for rows overwritten since they were sampled changes nothing and is counted;
- a checkpoint round trip (``ReplayBuffer.save`` / ``load``) gives the same distribution and the same next draws.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from relive.registry import (
    REPLAYS,
    SAMPLER_CLASSES,
    ReplayBuild,
    ReplaySpec,
    load_builtins,
    register_replay,
    replay_entry,
)
from relive.replay import PrioritizedSampler, ReplayBuffer
from relive.replay.refer_schedule import BEHAVIOUR_COLUMNS
from relive.replay.samplers.base import Draw, Sampler
from relive.testing import chisquare_pvalue, random_transitions

DRAWS = 60_000
CAPACITY = 60
OBS = {"observation": (3,), "achieved_goal": (2,), "desired_goal": (2,)}


# -- a plug-in, registered the way a user's file registers one: the contract covers it like a built-in -----------
@dataclasses.dataclass(frozen=True)
class _LinearConfig:
    slope: float = 1.0  # row i is drawn with probability proportional to 1 + slope * i


@register_replay("contract_linear")
class _LinearSampler(Sampler):
    """Draws stored row i with probability proportional to 1 + slope * i (no state beyond the storage)."""

    Config = _LinearConfig

    def _weights(self) -> np.ndarray:
        w = np.zeros(self.storage.capacity)
        n = self.num_rows()
        w[:n] = 1.0 + self.options.slope * np.arange(n)
        return w

    def probabilities(self) -> np.ndarray:
        w = self._weights()
        return w / w.sum()

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        p = self.probabilities()
        idx = rng.choice(p.size, size=batch_size, p=p).astype(np.int64)
        return Draw(idx, p[idx], np.ones(batch_size, np.float32))


def _ids() -> list[str]:
    load_builtins()
    named = {entry.sampler_cls for entry in REPLAYS.values() if entry.sampler_cls is not None}
    offered = {"MixtureSampler", "HindsightSampler"}  # built by a registered builder: "mixture", "her"
    unnamed = [f"class:{name}" for name, cls in SAMPLER_CLASSES.items() if cls not in named and name not in offered]
    return sorted(REPLAYS) + sorted(unnamed)


IDS = _ids()


def test_the_contract_covers_every_registered_sampler():
    """The ids include each built-in, the optional built-ins, the compositions and this file's plug-in."""
    for name in ("uniform", "per", "mixture", "arb", "reaper", "reaper_reference", "berb", "refer", "her",
                 "contract_linear"):
        assert name in IDS, name


def _reward_fn(achieved, desired, info):
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)


def _goal_rows(n: int, rng: np.random.Generator, episode_length: int, start: int = 0) -> dict:
    """Goal-conditioned rows (HER): the achieved goal of step s of episode e is [e, s]."""
    step = (start + np.arange(n)) % episode_length
    episode = (start + np.arange(n)) // episode_length
    achieved = np.stack([episode, step], 1).astype(np.float32)
    end = step == episode_length - 1
    desired = np.full((n, 2), -100.0, np.float32)
    ob = rng.normal(size=(n, 3)).astype(np.float32)
    return {"obs": {"observation": ob, "achieved_goal": achieved, "desired_goal": desired},
            "next_obs": {"observation": rng.normal(size=(n, 3)).astype(np.float32),
                         "achieved_goal": achieved + np.array([0, 1], np.float32), "desired_goal": desired},
            "action": rng.normal(size=(n, 2)).astype(np.float32), "reward": -np.ones(n, np.float32),
            "terminated": np.zeros(n, bool), "truncated": end}


#: options other than the defaults: BERB's ratio network small, for speed (its sampling logic is the same); HER over
#: PER, so that the relabeling wrapper passes on a part's non-uniform state
SMALL = {"berb": {"hidden": (16,), "ratio_batch_size": 16}, "her": {"inner": ReplaySpec("per")}}
GOALS = ("her",)  # the replays that need goal-conditioned rows (a task's reward function)


class _GoalEnv:
    """What ``Sampler.bind_env`` reads of a goal-conditioned env (relive.envs.goal_functions)."""

    def __init__(self):
        import gymnasium as gym

        box = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": gym.spaces.Box(-10.0, 10.0, (3,), np.float32),
                                                  "achieved_goal": box, "desired_goal": box})
        self.spec = None
        self.unwrapped = self

    def compute_reward(self, achieved, desired, info):
        return _reward_fn(achieved, desired, info)


def _build(name: str) -> Sampler:
    if name.startswith("class:"):
        cls = SAMPLER_CLASSES[name.split(":", 1)[1]]
        return cls(PrioritizedSampler())  # a wrapper, around a sampler with state
    entry = replay_entry(name)
    ctx = ReplayBuild(total_grad_steps=1_000, env_steps_per_chunk=10, seed=np.random.SeedSequence(7),
                      online_env_steps=1_000)
    sampler = entry.target(entry.config_cls(**SMALL.get(name, {})), ctx)
    if name in GOALS:
        sampler.bind_env(_GoalEnv())  # as the trainer does: the task's reward function
    return sampler


class _Rig:
    """A buffer of 20 offline and 30 online rows (episodes of 7 and 6 steps) around the sampler under test."""

    def __init__(self, name: str, seed: int = 0):
        self.name = name
        self.goals = name in GOALS
        sampler = _build(name)
        self.behaviour = name == "refer"  # ReF-ER reads the behaviour record the agent stores with each row
        extra = {c: (2,) for c in BEHAVIOUR_COLUMNS} if self.behaviour else None
        obs = OBS if self.goals else (3,)
        self.buf = ReplayBuffer(CAPACITY, obs, (2,), sampler=sampler, seed=seed, extra_columns=extra)
        self.written = 0
        self.buf.add_offline(self.rows(20, episode_length=7, rng=1))
        self.extend(30)

    def rows(self, n: int, episode_length: int = 6, rng: int = 2) -> dict:
        r = np.random.default_rng(rng)
        if self.goals:
            out = _goal_rows(n, r, episode_length, start=self.written)
        else:
            out = random_transitions(n, (3,), (2,), rng=rng, episode_length=episode_length, start_step=self.written)
        if self.behaviour:
            out["mu_mean"] = np.tanh(r.normal(size=(n, 2))).astype(np.float32)
            out["mu_std"] = np.full((n, 2), 0.3, np.float32)
        return out

    def extend(self, n: int) -> None:
        self.buf.extend(self.rows(n, rng=100 + self.written))
        self.written += n

    def signals(self, b: int, rng: np.random.Generator) -> dict:
        wanted = set(self.buf.sampler.signals) or {"td_error"}
        out = {}
        if "td_error" in wanted:
            out["td_error"] = rng.normal(size=b) * np.linspace(0.1, 3.0, b)
        if "priority" in wanted and "td_error" not in out:
            out["priority"] = rng.uniform(0.1, 3.0, size=b)
        if "rho" in wanted:
            out["rho"] = rng.uniform(0.05, 3.0, size=b)
        if "log_likelihood" in wanted:
            out["log_likelihood"] = -rng.uniform(0.0, 3.0, size=b)
        return out

    def shape_state(self) -> None:
        """Updates and refreshes that leave the sampler in a non-uniform state."""
        rng = np.random.default_rng(3)
        for _ in range(6):
            info = self.buf.sample(16).info
            self.buf.update(info, **self.signals(16, rng))
        self.buf.refresh(lambda obs, act: -4.0 * np.square(act).sum(1))  # ARB: log-likelihoods of a policy

    def probabilities(self) -> np.ndarray:
        return _probabilities(self.buf)


def _probabilities(buf: ReplayBuffer) -> np.ndarray:
    try:
        return buf.sampler.probabilities(batch_size=BATCH)
    except TypeError:  # only the mixture's depends on the batch size (exact per-source counts)
        return buf.sampler.probabilities()


BATCH = 50  # = the rows stored (a batch may not exceed them)


def _draw_many(buf: ReplayBuffer) -> np.ndarray:
    return np.concatenate([buf.sample(BATCH).info.indices for _ in range(DRAWS // BATCH)])


@pytest.fixture(scope="module", params=IDS)
def drawn(request):
    """A shaped rig, its distribution and 60,000 draws (shared by the fit test and its power companion)."""
    rig = _Rig(request.param)
    rig.shape_state()
    p = rig.probabilities()
    return request.param, p, _draw_many(rig.buf), len(rig.buf)


def test_probabilities_are_a_distribution_over_the_stored_rows(drawn):
    name, p, _, n = drawn
    assert p.shape == (CAPACITY,), name
    assert np.isfinite(p).all() and (p >= 0).all(), name
    assert p[:n].sum() == pytest.approx(1.0) and not p[n:].any(), name


def test_drawn_frequencies_match_probabilities(drawn):
    name, p, draws, _ = drawn
    assert chisquare_pvalue(draws, p) > 1e-3, name


def test_the_chisquare_rejects_a_slightly_wrong_distribution(drawn):
    """Power companion: the same draws against a distribution 10% off on a fifth of the rows."""
    name, p, draws, _ = drawn
    stored = np.flatnonzero(p)
    wrong = p.copy()
    wrong[stored[: len(stored) // 5]] *= 1.10
    wrong /= wrong.sum()
    assert chisquare_pvalue(draws, wrong) < 1e-3, name


@pytest.mark.parametrize("name", IDS)
def test_updates_for_overwritten_rows_change_nothing_and_are_counted(name):
    rig = _Rig(name)
    rig.shape_state()
    info = rig.buf.sample(16).info
    rig.extend(CAPACITY - 20)  # the whole online ring is rewritten: every sampled online row is stale
    before = rig.probabilities().copy()
    stale_before = rig.buf.stats()["replay/num_stale"]
    online = int((info.source == 1).sum()) if hasattr(info, "source") else None
    offline_rows = info.indices < 20
    signals = rig.signals(16, np.random.default_rng(5))
    if offline_rows.any():  # offline rows are never overwritten: keep the update to the stale rows only
        keep = ~offline_rows
        info = type(info)(**{f.name: (getattr(info, f.name)[keep] if isinstance(getattr(info, f.name), np.ndarray)
                                      and getattr(info, f.name).shape[:1] == (16,) else getattr(info, f.name))
                             for f in dataclasses.fields(info)})
        signals = {k: v[keep] for k, v in signals.items()}
    if not len(info.indices):
        pytest.skip("every sampled row was offline")  # (seeded: does not happen for the samplers above)
    rig.buf.update(info, **signals)
    np.testing.assert_array_equal(rig.probabilities(), before, err_msg=name)
    assert rig.buf.stats()["replay/num_stale"] - stale_before == len(info.indices), (name, online)


@pytest.mark.parametrize("name", IDS)
def test_a_checkpoint_round_trip_keeps_the_distribution_and_the_draws(name, tmp_path):
    rig = _Rig(name, seed=4)
    rig.shape_state()
    rig.buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    if rig.goals:
        loaded.sampler.bind_env(_GoalEnv())  # functions are code: a checkpoint does not hold them
    np.testing.assert_array_equal(_probabilities(loaded), rig.probabilities(), err_msg=name)
    for _ in range(3):
        np.testing.assert_array_equal(loaded.sample(16).info.indices, rig.buf.sample(16).info.indices, err_msg=name)


@pytest.mark.parametrize("name", sorted(SAMPLER_CLASSES))
def test_a_sampler_class_shows_its_options_as_its_signature(name):
    """help() and inspect.signature (what IDEs and notebooks show) list a sampler's options with their defaults,
    not ``*args, **kwargs`` (issue 47, item 4)."""
    import inspect

    cls = SAMPLER_CLASSES[name]
    params = inspect.signature(cls).parameters
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values()), (name, params)
    config = getattr(cls, "Config", None)
    if config is not None and dataclasses.is_dataclass(config):
        for field in dataclasses.fields(config):
            assert field.name in params, (name, field.name)
