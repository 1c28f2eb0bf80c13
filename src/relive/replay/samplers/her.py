"""Hindsight Experience Replay (Andrychowicz et al., 2017, "Hindsight Experience Replay", NeurIPS): sample-time goal
relabeling over any sampler.

    sampler = HindsightSampler(PrioritizedSampler(), strategy="future", k=4, reward_fn=env.unwrapped.compute_reward)
    buf = ReplayBuffer(cap, {"observation": (o,), "achieved_goal": (g,), "desired_goal": (g,)}, act, sampler=sampler)
    batch = buf.sample(256)          # batch.info.hints["her/relabeled"]: which rows got a new goal

**What it does** (Alg. 1 of the paper, with its replay of "k additional goals per transition" done at sample time, as
in the authors' baselines and Stable-Baselines3): the ``inner`` sampler draws the rows; each drawn row is relabeled
independently with probability k / (k + 1) (Sec. 4.5: k = 4, "future", is the paper's best). A relabeled row t of
episode e gets the new goal g' = achieved goal of the next observation of a goal row j of the same episode:

    future   j ~ U{t, ..., last stored row of e}     (Sec. 4.5 "future": a state after the transition)
    final    j = last stored row of e                (Sec. 4.5 "final")
    episode  j ~ U{first stored row, ..., last stored row of e}   (Sec. 4.5 "episode")
    random   j ~ U{all stored rows of the buffer}    (Sec. 4.5 "random")

"Stored" is the episode index's view (relive.replay.storage.episodes): per stream, across ring wraps (evicted rows are
never used), the offline prefix (an offline row is relabeled within its dataset episode), and an open episode uses only
the rows stored so far. Then, in the batch, ``obs[desired_key]`` and ``next_obs[desired_key]`` become g' and the reward
is recomputed with the task's vectorized ``reward_fn(achieved_goal, desired_goal, info)`` (Gymnasium-Robotics'
``env.unwrapped.compute_reward``; ``info`` is ``{}``): r_t = reward_fn(next_obs[achieved_key]_t, g'), the paper's
r(s_{t+1}, g') of Alg. 1. With ``terminate_on_success`` (a task whose episode ends at success, e.g. make_env's mazes)
``terminated`` becomes ``success_fn(achieved, g', {})``; otherwise the stored flags are kept.

**n-step** (``ReplayBuffer(n_step=n)``): a relabeled row's return sums the relabeled rewards of its rows t .. t+n'-1
(each recomputed from its own next achieved goal); with ``terminate_on_success`` the sum stops at the first success
under g' (that row is the bootstrap row, discount 0), as the relabeled episode would have ended there.

**Priorities and weights**: a relabeled row is its source row: ``info.indices``, ``probability`` and ``is_weight`` are
the inner sampler's, and ``buffer.update(info, td_error=...)`` sets the priority of the stored row (PER keeps one
priority per stored row, whatever goal it was last replayed with).

**Randomness and checkpoints**: the relabeling draws from the buffer's generator right after the inner draw (the same
generator, saved by ``ReplayBuffer.save``), so a resumed buffer gives the same next batches; with k = 0 nothing is
drawn and batches equal the inner sampler's. ``reward_fn`` / ``success_fn`` are code and are not saved: after
``ReplayBuffer.load`` call ``buf.sampler.set_reward_fn(fn, success_fn)`` or ``buf.sampler.bind_env(env)`` (sampling
without one is a ValueError).

**In a run** HER is a replay composed over another, like the mixture: ``replay.name = "her"`` with its options
:class:`HERConfig` (``replay.her.k``, ``replay.her.strategy``, and the replay it relabels, ``replay.her.inner = {name =
"per", ...}``; ``--replay her --set replay.her.inner.name=per``). What it needs from the run reaches the trainer through
two generic contracts, never its name: ``HERConfig.env_options`` (the envs keep their goal dicts:
``make_env(keep_goal_dict=True)``, read through ``ReplayConfig.env_options``) and ``Sampler.bind_env`` (the task's
reward and success functions, from the run's env, for a new run and again on resume). HER wraps the whole replay: a
part of a mixture cannot be one (the mixture goes inside it, ``replay.her.inner.name=mixture``).

**Not supported** (a ValueError): ``sample_sequences`` (a slice would need one goal for all its steps; not built),
the device backend (relabeling reads goals on the host).

Batch info: ``info.hints["her/relabeled"]`` [B] bool, ``info.hints["her/goal_slot"]`` [B] int64 (the goal row j, -1
where not relabeled); the inner sampler's hints pass through.
"""

from __future__ import annotations

import math
import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from relive.hooks import collect_hooks
from relive.registry import ReplayBuild, ReplaySpec, register_replay, register_sampler_class
from relive.replay import returns
from relive.replay.samplers.base import Draw, Sampler, check_number, sampler_config, sampler_from_config, state_field
from relive.replay.samplers.uniform import UniformSampler

STRATEGIES = ("future", "final", "episode", "random")

NUMBA = False  # the per-row loops compiled (bottom of this file); RELIVE_NO_NUMBA=1: the NumPy path
if os.environ.get("RELIVE_NO_NUMBA", "") in ("", "0"):
    try:
        import numba

        NUMBA = True
    except ImportError:  # pragma: no cover - numba is a dependency, but the NumPy path stands alone
        NUMBA = False


class HindsightSampler(Sampler):
    """HER over ``inner`` (module docstring). ``k``: relabeled share k / (k + 1) of every batch, in expectation."""

    relabels = True  # ReplayBuffer.sample hands the gathered batch to relabel_batch

    def __init__(self, inner: Sampler | None = None, strategy: str = "future", k: float = 4,
                 reward_fn: Callable | None = None, *, terminate_on_success: bool = False,
                 success_fn: Callable | None = None, achieved_key: str = "achieved_goal",
                 desired_key: str = "desired_goal"):
        super().__init__()
        if strategy not in STRATEGIES:
            raise ValueError(f"HindsightSampler: strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.k = check_number("HindsightSampler", "k", k, low=0)
        if not isinstance(terminate_on_success, bool):
            raise ValueError(f"HindsightSampler: terminate_on_success must be a bool, got {terminate_on_success!r}")
        for name, key in (("achieved_key", achieved_key), ("desired_key", desired_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"HindsightSampler: {name} must be a non-empty string, got {key!r}")
        if inner is not None and inner.relabels:
            raise ValueError(f"HindsightSampler: the inner sampler ({type(inner).__name__}) already relabels its "
                             "batches; give it a sampler that does not")
        self.inner = inner if inner is not None else UniformSampler()
        self.strategy = strategy
        self.terminate_on_success = terminate_on_success
        self.achieved_key, self.desired_key = achieved_key, desired_key
        self.reward_fn: Callable | None = None
        self.success_fn: Callable | None = None
        self.set_reward_fn(reward_fn, success_fn)
        self._plan = (np.zeros(0, bool), np.zeros(0, np.int64))
        self.num_relabeled = 0

    @property
    def relabel_probability(self) -> float:
        return self.k / (self.k + 1.0)

    def set_reward_fn(self, reward_fn: Callable | None, success_fn: Callable | None = None) -> None:
        """The task's vectorized ``reward_fn(achieved, desired, info) -> [B]`` (and, with ``terminate_on_success``,
        ``success_fn(achieved, desired, info) -> [B] bool``): not saved in checkpoints, set them again after load."""
        for name, fn in (("reward_fn", reward_fn), ("success_fn", success_fn)):
            if fn is not None and not callable(fn):
                raise ValueError(f"HindsightSampler: {name} must be callable, got {fn!r}")
        self.reward_fn, self.success_fn = reward_fn, success_fn

    # -- wiring ----------------------------------------------------------------------------------------
    @property
    def signals(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.signals

    def bind(self, storage, source=None) -> None:
        if source is not None:  # (a mixture binds its parts to a source, and would never call relabel_batch)
            raise ValueError("HindsightSampler wraps the whole replay, it cannot be a part of a mixture: put the "
                             "mixture inside it (replay.name = her, replay.her.inner.name = mixture)")
        if self.inner.storage is not None:
            raise ValueError("the inner sampler of this HindsightSampler is already bound to a buffer")
        super().bind(storage, source)
        st = self.storage
        if st.device is not None:
            raise ValueError("HindsightSampler needs a host backend ('ram' or 'memmap'): goals are relabeled on the "
                             "host")
        keys = st.obs_keys or ()
        missing = [key for key in (self.achieved_key, self.desired_key) if key not in keys]
        if missing:
            raise ValueError(f"HindsightSampler needs goal-conditioned dict observations with keys "
                             f"{self.achieved_key!r} and {self.desired_key!r} (make_env(..., keep_goal_dict=True)); "
                             f"the buffer's observations have keys {list(keys) or 'none (flat observations)'}")
        shapes = {key: st.columns[f"obs.{key}"].shape[1:] for key in (self.achieved_key, self.desired_key)}
        if shapes[self.achieved_key] != shapes[self.desired_key]:
            raise ValueError(f"HindsightSampler: observation keys {self.achieved_key!r} {shapes[self.achieved_key]} "
                             f"and {self.desired_key!r} {shapes[self.desired_key]} must have the same shape")
        self.inner.bind(storage, source)

    def bind_env(self, env) -> None:
        """The task's functions from the run's goal-conditioned env (``relive.envs.goal_functions``; a non-goal env is
        a ValueError naming it): rewards from its vectorized ``compute_reward``, and ``terminated`` recomputed where
        reaching the goal ends an episode (``terminate_on_success``)."""
        from relive.envs import goal_functions  # (imports gymnasium, ~0.4 s: paid by runs with an env only)

        reward_fn, success_fn = goal_functions(env)
        self.terminate_on_success = success_fn is not None
        self.set_reward_fn(reward_fn, success_fn)
        self.inner.bind_env(env)

    def on_insert(self, slots):
        self.inner.on_insert(slots)

    def on_episodes_closed(self, ids):
        self.inner.on_episodes_closed(ids)

    def check_insert(self, source, rows):
        self.inner.check_insert(source, rows)

    def check_signals(self, slots, signals):
        self.inner.check_signals(slots, signals)

    def update(self, slots, signals):
        self.inner.update(slots, signals)

    def anneal_over_next(self, num_samples: int) -> None:
        self.inner.anneal_over_next(num_samples)

    def refresh(self, score_fn, chunk_size: int = 65536) -> bool:
        return self.inner.refresh(score_fn, chunk_size)

    def loop_hooks(self, ctx) -> list:
        return collect_hooks(ctx, self.inner)

    def probabilities(self, *args, **kwargs) -> np.ndarray:
        """The inner sampler's: relabeling changes goals, not which rows are drawn."""
        return self.inner.probabilities(*args, **kwargs)

    def stats(self) -> dict[str, float]:
        relabeled = self._plan[0]
        return self.inner.stats() | {
            "replay/her_relabeled_fraction": float(relabeled.mean()) if relabeled.size else float("nan")}

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self, batch_size: int, rng: np.random.Generator) -> Draw:
        draw = self.inner.sample(batch_size, rng)
        self._last_indices = draw.indices
        self._plan = self._choose_goals(np.asarray(draw.indices, np.int64), rng)
        return draw

    def _choose_goals(self, idx: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(relabeled [B] bool, goal slot [B] int64, -1 where not relabeled): the strategy's goal row j per row.

        One uniform u per row: u < p relabels, and then v = u / p ~ U[0, 1) places the goal row (:func:`goal_rows`).
        The storage's lookups (episode ends, positions, slots) run over every drawn row, relabeled or not (a few
        NumPy calls whatever the count; the rows not relabeled are dropped at the end), and the per-row arithmetic
        in one pass (numba, else NumPy: the same numbers)."""
        n = idx.size
        if self.k == 0 or n == 0:  # draws nothing: batches equal the inner sampler's
            return np.zeros(n, bool), np.full(n, -1, np.int64)
        p = self.relabel_probability
        u = rng.random(n)
        st = self.storage
        if self.strategy == "random":  # any slot of the buffer: slots [0, size) as one range
            relabeled, goal = goal_rows(u, p, np.zeros(n, np.int64), np.full(n, st.size, np.int64), False)
            return relabeled, np.where(relabeled, goal, -1)
        ep = st.episode_ids(idx)
        end = st.episodes.end_of(ep)  # one past the last stored row (an open episode: its newest row)
        if self.strategy == "future":  # from the row itself on
            start = st.position_of(idx)
        elif self.strategy == "episode":  # any stored row (its first rows may have been evicted by the ring)
            start = st.episodes.get(ep).start
        else:  # final: the last stored row
            start = end
        relabeled, j = goal_rows(u, p, start, end, self.strategy == "final")
        return relabeled, np.where(relabeled, returns.slot_at(st, j, idx >= st.num_offline), -1)

    def hints(self) -> dict:
        relabeled, goal = self._plan
        return self.inner.hints() | {"her/relabeled": relabeled, "her/goal_slot": goal}

    def relabel_batch(self, batch, n_step: int, gamma: float):
        """Write the new goals of the latest draw into ``batch`` (gathered from its indices), in place."""
        relabeled, goal_slot = batch.info.hints["her/relabeled"], batch.info.hints["her/goal_slot"]
        m = relabeled.nonzero()[0]  # (ndarray.nonzero: np.flatnonzero's wrappers cost more than the search)
        if m.size == 0:
            return batch
        self._reward_fn()  # (both refused before the batch is touched)
        if self.terminate_on_success:
            self._success_fn()
        st = self.storage
        ak, dk = self.achieved_key, self.desired_key
        g = st.read("next_obs", goal_slot.take(m), (ak,))[ak]
        put_rows(batch.obs[dk], batch.next_obs[dk], m, g)
        if n_step <= 1:
            achieved = batch.next_obs[ak].take(m, axis=0)
            batch.reward[m] = self._reward(achieved, g)
            if self.terminate_on_success:
                batch.terminated[m] = self._success(achieved, g)
            return batch
        self._relabel_n_step(batch, m, g, n_step, gamma)
        return batch

    def _reward_fn(self) -> Callable:
        if self.reward_fn is None:
            raise ValueError("HindsightSampler has no reward_fn: pass reward_fn=env.unwrapped.compute_reward (after "
                             "ReplayBuffer.load: buf.sampler.set_reward_fn(...), functions are not saved)")
        return self.reward_fn

    def _success_fn(self) -> Callable:
        if self.success_fn is None:
            raise ValueError("HindsightSampler(terminate_on_success=True) has no success_fn: pass success_fn=... "
                             "(after ReplayBuffer.load: buf.sampler.set_reward_fn(reward_fn, success_fn))")
        return self.success_fn

    def _reward(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        r = np.asarray(self._reward_fn()(achieved, desired, {}))
        if r.shape != (achieved.shape[0],) or r.dtype.kind not in "fiub":
            raise ValueError(f"HindsightSampler: reward_fn(achieved, desired, info) must return one number per row, "
                             f"shape ({achieved.shape[0]},), got shape {r.shape} dtype {r.dtype} (is it vectorized?)")
        return r

    def _success(self, achieved: np.ndarray, desired: np.ndarray) -> np.ndarray:
        s = np.asarray(self._success_fn()(achieved, desired, {}))
        if s.shape != (achieved.shape[0],) or s.dtype.kind not in "iub":
            raise ValueError(f"HindsightSampler: success_fn(achieved, desired, info) must return one bool per row, "
                             f"shape ({achieved.shape[0]},), got shape {s.shape} dtype {s.dtype}")
        return s.astype(bool)

    def _relabel_n_step(self, batch, m: np.ndarray, g: np.ndarray, n_step: int, gamma: float) -> None:
        """n-step returns of the relabeled rows ``m`` under their goals ``g`` (:mod:`relive.replay.returns`' formulas
        with the recomputed rewards; with ``terminate_on_success`` the sum ends at the first success)."""
        st = self.storage
        slots = batch.info.indices[m]
        left, pos, online = returns.rows_left(st, slots)
        n = np.minimum(left, n_step)
        powers = np.array([gamma**k for k in range(n_step + 1)])
        total = np.zeros(m.size)
        alive = np.ones(m.size, bool)  # not yet past a success (terminate_on_success)
        used = np.zeros(m.size, np.int64)
        last = slots.copy()
        term = np.zeros(m.size, bool)
        for k in range(int(n.max(initial=1))):
            step = alive & (k < n)
            if not step.any():
                break
            row = returns.slot_at(st, np.minimum(pos + k, pos + n - 1), online)
            achieved = st.read("next_obs", row, (self.achieved_key,))[self.achieved_key]
            total += np.where(step, powers[k], 0.0) * self._reward(achieved, g)
            used += step
            last = np.where(step, row, last)
            if self.terminate_on_success:
                success = self._success(achieved, g) & step
                term |= success
                alive &= ~success
        if not self.terminate_on_success:
            term = st.columns["terminated"].take(last)
        batch.reward[m] = total
        batch.discount[m] = np.where(term, 0.0, powers[used])
        batch.terminated[m] = term
        moved = last != returns.slot_at(st, pos + n - 1, online)
        if moved.any():  # the bootstrap row moved to an earlier success: its next_obs and truncated flag
            where = m[moved]
            nxt = st.read("next_obs", last[moved])
            for key, value in nxt.items():
                batch.next_obs[key][where] = value
            batch.next_obs[self.desired_key][where] = g[moved]
            batch.truncated[where] = st.columns["truncated"].take(last[moved])

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        return {"inner": sampler_config(self.inner), "strategy": self.strategy, "k": self.k,
                "terminate_on_success": self.terminate_on_success, "achieved_key": self.achieved_key,
                "desired_key": self.desired_key}

    @classmethod
    def from_config(cls, cfg: dict) -> HindsightSampler:
        if not isinstance(cfg, dict) or "inner" not in cfg:
            raise ValueError(f"HindsightSampler config must be a mapping with an 'inner' sampler, got {cfg!r}")
        rest = {k: v for k, v in cfg.items() if k != "inner"}
        return cls(sampler_from_config(cfg["inner"]), **rest)

    def state_dict(self) -> dict:
        return super().state_dict() | {"inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.inner.load_state_dict(state_field(state, "inner", self._owner()))


# -- HER in a run: a registered replay composed over another (relive.registry; docs/her.md) -----------------------
def _uniform() -> ReplaySpec:
    return ReplaySpec("uniform")


@dataclass(frozen=True)
class HERConfig:
    """Hindsight Experience Replay over another replay (docs/her.md): a share k / (k + 1) of every batch gets new goals
    (needs a goal-conditioned env: its goal dicts are kept as columns)."""

    #: what the run's envs must give this replay (``make_env`` keyword arguments; ``relive.registry.env_options``):
    #: goal dicts kept, observation / achieved_goal / desired_goal stored as columns for the relabeling
    env_options: ClassVar[Mapping[str, Any]] = types.MappingProxyType({"keep_goal_dict": True})

    inner: ReplaySpec = field(default_factory=_uniform)  # the replay that draws the rows (relabeled after the draw)
    k: float = 4.0  # relabeled goals per real one: a share k / (k + 1) of every batch relabeled (0: none, same input)
    strategy: str = "future"  # where a new goal comes from: future, final, episode (same episode) or random

    def __post_init__(self):
        k = self.k
        if isinstance(k, bool) or not isinstance(k, int | float) or not math.isfinite(k) or k < 0:
            raise ValueError(f"replay.her.k must be a finite number >= 0, got {k!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"replay.her.strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if not isinstance(self.inner, ReplaySpec):
            raise ValueError(f"replay.her.inner must be a ReplaySpec (a replay name and its options), got "
                             f"{self.inner!r}")
        if self.inner.name == "her":
            raise ValueError("replay.her.inner cannot be her again: HER relabels the batches of another replay")

    def label(self) -> str:
        """``her(k=4, future, inner=per)``: every setting, the inner replay as its own label."""
        return f"her(k={self.k:g}, {self.strategy}, inner={self.inner})"


@register_replay("her", HERConfig)
def build_her(options: HERConfig, ctx: ReplayBuild) -> HindsightSampler:
    """goal relabeling (HER) over another replay, replay.her.inner (goal-conditioned tasks: the envs keep goal dicts)"""
    return HindsightSampler(options.inner.build(ctx), options.strategy, options.k)


register_sampler_class(HindsightSampler)


# -- the per-row loops: compiled (numba) when available, else NumPy; both give the same numbers ------------------
def _goal_rows_numpy(u, p, start, end, final):
    relabeled = u < p
    if final:
        return relabeled, end - 1
    v = np.minimum(u / p, 1.0)  # (relabeled rows: u / p <= 1 already; the others' j is dropped, kept finite)
    return relabeled, np.minimum(start + (v * (end - start)).astype(np.int64), end - 1)


def _put_rows_numpy(a, b, m, g):
    a[m] = g
    b[m] = g


goal_rows, put_rows = _goal_rows_numpy, _put_rows_numpy
if NUMBA:

    @numba.njit(cache=True, nogil=True)
    def _goal_rows_kernel(u, p, start, end, final, relabeled, j):  # pragma: no cover - compiled
        for i in range(u.size):
            relabeled[i] = u[i] < p
            if final:
                j[i] = end[i] - 1
            else:  # v = u / p places j in [start, end): truncation toward zero, as NumPy's astype
                v = min(u[i] / p, 1.0)
                j[i] = min(start[i] + np.int64(v * (end[i] - start[i])), end[i] - 1)

    @numba.njit(cache=True, nogil=True)
    def _put_rows_kernel(a, b, m, g):  # pragma: no cover - compiled
        for r in range(m.size):
            for c in range(g.shape[1]):
                a[m[r], c] = g[r, c]
                b[m[r], c] = g[r, c]

    def goal_rows(u, p, start, end, final):
        """(relabeled = u < p, goal position j): j = start + floor(min(u / p, 1) (end - start)), at most end - 1;
        ``final``: j = end - 1."""
        relabeled, j = np.empty(u.size, bool), np.empty(u.size, np.int64)
        _goal_rows_kernel(u, float(p), start, end, bool(final), relabeled, j)
        return relabeled, j

    def put_rows(a, b, m, g):
        """``a[m] = g`` and ``b[m] = g`` (the batch's two desired-goal columns); NumPy for other layouts."""
        if not (a.dtype == b.dtype == g.dtype and a.flags.c_contiguous and b.flags.c_contiguous and a.ndim >= 2
                and a.shape == b.shape and g.shape == (m.size, *a.shape[1:])):
            return _put_rows_numpy(a, b, m, g)
        rows = a.shape[0]
        _put_rows_kernel(a.reshape(rows, -1), b.reshape(rows, -1), m, np.ascontiguousarray(g).reshape(m.size, -1))
        return None
