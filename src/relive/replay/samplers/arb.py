"""ARB: Adaptive Replay Buffer (Song, Lee, Park; AISTATS 2026, arXiv 2512.10510).

One weighting over the union of offline and online rows, by how likely the *current* policy is to take the
stored action (on-policyness, Sec. 4.1), averaged over the trajectory (geometric mean, Sec. 4.2):

    l_i   = clip(score_i, log p_low, log p_high)            per-row log on-policyness (score_fn), clipped
    l^_i  = l_i - max_j l_j                                 shift by the buffer maximum (numerical safety)
    L_tau = mean_{i in tau} l^_i                            trajectory level: log of the geometric mean
    w_i   = exp(L_tau(i) / lambda)                          temperature lambda (Alg. 1 l.13-16)
    P(i)  = w_i / sum_j w_j                                 no importance-sampling correction by default

``level="transition"`` uses w_i = exp(l^_i / lambda) (the paper's ablation, Fig. 3). The scores come from
``buffer.refresh(score_fn)``, where ``score_fn(obs, action) -> [n]`` is supplied by the agent (see
``relive.agents.scoring``: ``log_prob`` mode, the paper's log pi(a|s) averaged over action dimensions, or
``standardized``, the reference code's and the training default -- see that module for why); this sampler
knows nothing of policies. ``refresh`` feeds the stored rows to ``score_fn`` in chunks of ``chunk_size`` under
``torch.no_grad()``; the function may return a NumPy array or a tensor.

Rows added since the last refresh get the provisional weight exp(0 / lambda) = 1, the largest weight a row can
have after the shift (as in the reference code), so fresh data is sampled at least as often as any scored row
until the next refresh.

Sampling structure. The exact weights live in a float64 sum tree (``SumTree``: ``probabilities()``, the
amortized mode, per-row probabilities). Between two full refreshes the distribution is fixed except for rows
written since (all with the same provisional weight), so a batch is drawn as a two-part mixture: the rows of
the last refresh from a Walker/Vose alias table built at the refresh (O(1) per draw; rows overwritten since
are rejected and redrawn), and the fresh rows uniformly; the number of fresh draws is binomial with their
exact share of the mass. This is exact and costs O(B) per batch and O(N) once per refresh. (A flat CDF +
searchsorted costs more per draw than the tree at 1M rows, and would need an O(N) suffix rebuild whenever the
online ring overwrites a row.) Without numba (no compiled alias build) the tree's O(B log N) search is used.

Amortized mode (beyond the paper, its open question on large buffers): ``amortized_rows_per_refresh=k``
turns each ``buffer.refresh(score_fn)`` into a step of a rotating sweep: it re-scores the next k stored rows
(cursor over the stored rows, wrapping), re-weights the trajectories they belong to (trajectory mean over
their scored rows) and updates those leaves of the sum tree -- O(k + rows of the touched trajectories), not
O(N). The trainer calls ``buffer.refresh(score_fn)`` after *every* gradient step in this mode (schedule
``refresh_every_grad_steps=1`` with ``replay.arb_amortized_rows=k``); k = N / 1000 re-scores every row once
per 1000 steps, the paper's cadence, and a smaller k trades freshness for cost. Draws then come from the sum
tree (O(B log N)): the weights change every step, so there is no alias table to build. Between sweeps the
shift stays fixed; it is moved (one O(N) rescale of the tree) only if the best score drifts more than
100 lambda from it, which keeps every weight inside float64 range. The weights track the full refresh: after
one full sweep with an unchanged policy they equal it (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from relive.hooks import EveryGradSteps
from relive.registry import register_alias, register_replay
from relive.replay import _tree_kernels as kernels
from relive.replay.samplers.base import Draw, Sampler, check_number, state_array, state_float, state_int
from relive.replay.samplers.per import contiguous_runs, tree_probabilities
from relive.replay.sum_tree import MaxTree, SumTree
from relive.types import ONLINE

LEVELS = ("trajectory", "transition")


class AliasTable(NamedTuple):
    """The draw table of the last full refresh over slots [lo, hi)."""

    lo: int
    hi: int
    table: np.ndarray  # [n, 4]: acceptance probability, alias slot, weight, the alias's weight (Vose)
    weights: np.ndarray  # refresh-time weight of each slot in [lo, hi)
    total: float  # their sum
    num_online_written: int  # the ring's clock at the refresh (rows written later are "fresh")
    num_offline: int  # offline rows at the refresh
RESHIFT = 100.0  # amortized mode: move the shift when the best score drifts this many lambdas from it
# smallest weight of a stored row: exp(L / lambda) underflows to 0 for a small temperature, and a buffer whose
# weights are all 0 has no distribution (every weight below it is raised to it: a probability of ~1e-300)
MIN_WEIGHT = 1e-300


@dataclass(frozen=True)
class ARBConfig:
    """ARB (Song et al. 2026): rows weighted by the current policy's likelihood of the stored action."""

    temperature: float = 5.0  # lambda (reference defaults: Cal-QL 5, PEX 0.5, FamO2O 2)
    log_p_low: float = -12.0  # per-row log-likelihoods are clipped to [log_p_low, log_p_high] before weighting
    log_p_high: float = 7.0
    level: str = "trajectory"  # weights per "trajectory" (geometric mean over the episode, ARB) or "transition"
    is_correction: bool = False  # importance weights 1 / (N P(i)) ^ is_exponent on the batch (the paper uses none)
    is_exponent: float = 1.0
    score_mode: str = "standardized"  # per-row score: "standardized" (reference code) or "log_prob" (the paper)
    refresh_every_grad_steps: int = 1000  # re-score every row this often (online gradient steps)
    # > 0: re-score this many rows every gradient step instead of all rows periodically (replay.arb.amortized_rows
    # on the command line is the same setting)
    amortized_rows_per_refresh: int = 0

    def __post_init__(self):
        name = type(self).__name__
        check_number(name, "temperature (lambda)", self.temperature, low=0, low_open=True)
        check_number(name, "log_p_low", self.log_p_low)
        check_number(name, "log_p_high", self.log_p_high)
        check_number(name, "refresh_every_grad_steps", self.refresh_every_grad_steps, low=1, integer=True)
        if self.score_mode not in ("standardized", "log_prob"):
            raise ValueError(f"{name}: score_mode must be 'standardized' or 'log_prob', got {self.score_mode!r}")
        if not self.log_p_low < self.log_p_high:
            raise ValueError(f"need log_p_low < log_p_high, got {self.log_p_low}, {self.log_p_high}")
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {self.level!r}")
        if not isinstance(self.is_correction, bool | np.bool_):
            raise ValueError(f"{name}: is_correction must be true or false, got {self.is_correction!r}")
        check_number(name, "is_exponent", self.is_exponent, low=0)
        check_number(name, "amortized_rows_per_refresh", self.amortized_rows_per_refresh, low=0, integer=True)


@register_replay("arb")
class ARBSampler(Sampler):
    """on-policyness weights over the union, trajectory level (ARB)"""

    Config = ARBConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.temperature, self.log_p_low, self.log_p_high = float(o.temperature), float(o.log_p_low), \
            float(o.log_p_high)
        self.refresh_every_grad_steps = int(o.refresh_every_grad_steps)
        self.level = o.level
        self.is_correction = bool(o.is_correction)
        self.is_exponent = float(o.is_exponent)
        self.amortized_rows_per_refresh = int(o.amortized_rows_per_refresh)
        self.score_mode = str(o.score_mode)
        self.num_refreshes = 0
        self.cursor = 0  # next row of the amortized sweep

    def bind(self, storage, source=None) -> None:
        super().bind(storage, source)
        n = storage.capacity
        self.tree = SumTree(n)
        self.score = np.full(n, np.nan)  # clipped per-row score l_i; nan = not scored since written
        self.max_score = MaxTree(n)  # over l_i - log_p_low (>= 0), for the shift
        self.shift = 0.0  # the max subtracted at the last full refresh
        self._alias: AliasTable | None = None  # built at the last full refresh
        self.stale_mass = 0.0  # refresh-time weight of the rows overwritten since the refresh

    # -- writing ---------------------------------------------------------------------------------------
    def on_insert(self, slots: np.ndarray) -> None:
        if self._alias is not None:
            self._retire(slots)
        self.score[slots] = np.nan
        self.max_score.update(slots, np.zeros(slots.size))
        self.tree.update(slots, np.full(slots.size, self.provisional_weight()))

    def provisional_weight(self) -> float:
        """Weight of rows not scored since they were written: the largest a scored row can have now,
        exp((max_j l_j - shift) / lambda) (= 1 right after a full refresh, as in the reference code)."""
        if not self.num_refreshes:
            return 1.0
        return max(float(np.exp((self.max_score.max + self.log_p_low - self.shift) / self.temperature)), MIN_WEIGHT)

    # -- refresh ---------------------------------------------------------------------------------------
    def loop_hooks(self, ctx) -> list:
        """ARB Alg. 1 step b: re-score every row with the current policy every ``refresh_every_grad_steps``
        online gradient steps, before sampling (the offline phase is the base algorithm's own); the amortized
        mode re-scores its slice on every gradient step."""
        score = getattr(ctx.agent, "score_fn", None)
        if score is None:
            name = getattr(ctx.config, "agent_kind", type(ctx.agent).__name__)
            raise ValueError(f"replay ARB re-scores rows with the agent's policy likelihood (score_fn); agent "
                             f"{name} has none")
        every = 1 if self.amortized_rows_per_refresh else self.refresh_every_grad_steps
        return [EveryGradSteps(every, lambda: ctx.buffer.refresh(score(self.score_mode)), phase="online")]

    def refresh(self, score_fn, chunk_size: int = 65536) -> bool:
        lo, hi = self.domain()
        if hi <= lo:
            return True
        if self.amortized_rows_per_refresh:
            self._refresh_slice(score_fn, self.amortized_rows_per_refresh, chunk_size)
        else:
            self._score_rows(score_fn, np.arange(lo, hi), chunk_size)
            self._rebuild_all()
        self.num_refreshes += 1
        return True

    def _score_rows(self, score_fn, slots: np.ndarray, chunk_size: int) -> None:
        cols = self.storage.columns
        out = np.empty(slots.size)
        try:
            import torch

            grad = torch.no_grad()
        except ImportError:  # pragma: no cover - torch is a dependency
            grad = None
        for a in range(0, slots.size, chunk_size):
            s = slots[a : a + chunk_size]
            obs, act = self.storage.read("obs", s), cols["action"].take(s, axis=0)  # dict obs: a dict
            if grad is not None:
                with grad:
                    res = score_fn(obs, act)
            else:  # pragma: no cover
                res = score_fn(obs, act)
            res = np.asarray(res.detach().cpu() if hasattr(res, "detach") else res, dtype=np.float64).reshape(-1)
            if res.size != s.size:
                raise ValueError(f"score_fn returned {res.size} scores for {s.size} rows")
            out[a : a + s.size] = res
        bad = ~np.isfinite(out)
        if bad.any():
            raise ValueError(f"score_fn returned a non-finite score for slot {int(slots[np.flatnonzero(bad)[0]])}")
        clipped = np.clip(out, self.log_p_low, self.log_p_high)
        self.score[slots] = clipped
        _set(self.max_score, slots, clipped - self.log_p_low)

    def episode_weights(self, view) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows of the episodes in ``view`` (EpisodeView), their weights exp(L_tau / lambda) (trajectory level:
        L_tau = mean of l^ over the episode's scored rows) or exp(l^_i / lambda), and which rows are scored."""
        slots = self.storage.episode_slots(view.start, view.length, view.source)
        lhat = self.score[slots] - self.shift
        scored = np.isfinite(lhat)
        if self.level == "transition":
            return slots, np.maximum(np.exp(lhat / self.temperature), MIN_WEIGHT), scored
        starts = np.cumsum(view.length) - view.length  # every stored episode has at least one row
        sums = np.add.reduceat(np.where(scored, lhat, 0.0), starts)
        counts = np.add.reduceat(scored.astype(np.int64), starts)
        mean = sums / np.maximum(counts, 1)
        return slots, np.repeat(np.maximum(np.exp(mean / self.temperature), MIN_WEIGHT), view.length), scored

    def _rebuild_all(self) -> None:
        lo, hi = self.domain()
        self.shift = self.max_score.max + self.log_p_low  # max_j l_j over the stored rows
        w = np.zeros(self.storage.capacity)
        slots, weights, _ = self.episode_weights(self.storage.episodes.live(self.source))
        w[slots] = weights
        self.tree.set_all(w)
        self._build_alias(lo, hi, w[lo:hi].copy(), self.storage.num_online_written, self.storage.num_offline)

    # -- alias table of the last refresh -----------------------------------------------------------------
    def _build_alias(self, lo, hi, weights, num_online_written, num_offline, stale_mass=0.0,
                     seen_written=None) -> None:
        if not kernels.AVAILABLE or hi <= lo:
            self._alias = None
            return
        # one row per slot (prob, alias slot, own weight, alias's weight): a draw reads one cache line
        table = np.empty((hi - lo, 4))
        alias = np.empty(hi - lo, np.int64)
        kernels.build_alias(weights, table[:, 0], alias)
        table[:, 1] = alias
        table[:, 1] += lo
        table[:, 2] = weights
        np.take(weights, alias, out=table[:, 3])
        self._alias = AliasTable(lo, hi, table, weights, float(weights.sum()), int(num_online_written),
                                 int(num_offline))
        self.stale_mass = float(stale_mass)
        self._seen_written = int(seen_written if seen_written is not None else num_online_written)

    def _retire(self, slots: np.ndarray) -> None:
        """Rows are about to be overwritten (already written): remove refresh-time mass the first time."""
        st = self.storage
        a = self._alias
        if a is None:  # (called only while a table is in use)
            return
        lo, hi, weights, ref_written = a.lo, a.hi, a.weights, a.num_online_written
        if st.num_offline != a.num_offline:
            self._alias = None  # offline rows were added after the refresh: use the tree until the next one
            return
        online = slots >= st.num_offline
        was_present = online & (slots < hi) & (slots >= lo)
        # position of the row each slot held before this write (the ring as of the previous write)
        cap, k = max(st.online_capacity, 1), st.num_offline
        base = self._seen_written - cap
        pos = base + ((slots - k) - base) % cap  # (the ring's clock of the previous write, not today's)
        first_overwrite = was_present & (pos < ref_written)
        if first_overwrite.any():
            self.stale_mass += float(weights[slots[first_overwrite] - lo].sum())
        self._seen_written = st.num_online_written

    def _draw_alias(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Rows and their current weights: fresh rows uniformly (binomial share of the mass), the rest from
        the alias table with rejection of rows overwritten since the refresh (one compiled loop)."""
        st = self.storage
        a = self._alias
        if a is None:
            raise RuntimeError("ARBSampler._draw_alias without an alias table (the caller checks for one)")
        lo, table, total_ref, ref_written = a.lo, a.table, a.total, a.num_online_written
        now, cap = st.num_online_written, st.online_capacity
        first_fresh = max(ref_written, now - cap)
        n_fresh = now - first_fresh if (self.source in (None, ONLINE) and cap > 0) else 0
        k_fresh = 0
        if n_fresh:
            provisional = self.provisional_weight()
            mass_fresh = n_fresh * provisional
            mass_old = max(total_ref - self.stale_mass, 0.0)
            k_fresh = int(rng.binomial(batch_size, mass_fresh / (mass_fresh + mass_old)))
        out = np.empty(batch_size, np.int64)
        w = np.empty(batch_size)
        if k_fresh:
            out[:k_fresh] = st.ring_slot(rng.integers(first_fresh, now, k_fresh))
            w[:k_fresh] = provisional
        filled = k_fresh
        while filled < batch_size:
            need = batch_size - filled
            u = rng.random(2 * need + 16)
            filled += kernels.alias_draw(table, lo, u, st.num_offline, cap, now, ref_written if n_fresh else now,
                                         out[filled:], w[filled:])
        return out, w

    def _refresh_slice(self, score_fn, k: int, chunk_size: int) -> None:
        lo, hi = self.domain()
        n = hi - lo
        k = min(k, n)
        rows = lo + (self.cursor + np.arange(k)) % n
        self.cursor = int((self.cursor + k) % n)
        self._score_rows(score_fn, rows, chunk_size)
        best = self.max_score.max + self.log_p_low  # max_j l_j over the scored rows
        if not self.num_refreshes:  # one shift for the whole sweep, so that every row shares it
            self.shift = best
        elif abs(best - self.shift) > RESHIFT * self.temperature:  # keep exp(.) in range: rescale once
            leaves = np.array(self.tree.leaves)
            w = np.maximum(leaves * np.exp((self.shift - best) / self.temperature), MIN_WEIGHT)
            w[leaves <= 0] = 0.0  # slots not stored stay empty
            self.tree.set_all(w)
            self.shift = best
        if self.level == "transition":
            _set(self.tree, rows, np.maximum(np.exp((self.score[rows] - self.shift) / self.temperature), MIN_WEIGHT))
            return
        # every scored row of the touched trajectories gets the new trajectory mean (the rows of a slice are
        # consecutive, so its episodes are runs of equal ids)
        ep = self.storage.episode_ids(rows)
        heads = np.concatenate(([0], np.flatnonzero(ep[1:] != ep[:-1]) + 1))
        slots, weights, scored = self.episode_weights(self.storage.episodes.get(np.unique(ep[heads])))
        _set(self.tree, slots, np.where(scored, weights, self.tree.leaves.take(slots)))

    # -- sampling --------------------------------------------------------------------------------------
    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        total = self.tree.total
        if self._alias is not None and not self.amortized_rows_per_refresh:
            indices, probability = self._draw_alias(batch_size, rng)
        else:
            indices, probability = self.tree.find_prefix_with_values(np.sort(rng.random(batch_size)) * total)
        probability /= total
        if self.is_correction:
            # (N P)^-beta / batch max = (min P / P)^beta (no overflow for tiny P)
            is_weight = ((probability.min() / probability) ** self.is_exponent).astype(np.float32)
        else:
            is_weight = np.ones(batch_size, np.float32)
        return Draw(indices, probability, is_weight)

    def probabilities(self) -> np.ndarray:
        return tree_probabilities(self.tree)

    def stats(self) -> dict[str, float]:
        lo, hi = self.domain()
        scored = np.isfinite(self.score[lo:hi])
        return super().stats() | {"replay/arb_refreshes": float(self.num_refreshes),
                                  "replay/arb_unscored_fraction": float(1 - scored.mean()) if hi > lo else 0.0,
                                  "replay/arb_mean_score": float(np.nanmean(self.score[lo:hi])) if scored.any()
                                  else float("nan")}

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        size = self.storage.size
        state = super().state_dict() | {"weight": np.array(self.tree.leaves[:size]), "score": self.score[:size].copy(),
                                        "shift": self.shift, "num_refreshes": self.num_refreshes,
                                        "cursor": self.cursor}
        if self._alias is not None:  # the alias table is rebuilt (deterministically) from its weights
            a = self._alias
            state["alias"] = {"lo": a.lo, "hi": a.hi, "weights": a.weights.copy(),
                              "num_online_written": a.num_online_written, "num_offline": a.num_offline,
                              "stale_mass": self.stale_mass,
                              "seen_written": self._seen_written}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        owner, n, size = self._owner(), self.storage.capacity, self.storage.size
        weight = state_array(state, "weight", owner, length=size, low=0.0)
        score = state_array(state, "score", owner, length=size, allow_nan=True)  # NaN: not scored yet
        shift = state_float(state, "shift", owner)
        num_refreshes = state_int(state, "num_refreshes", owner)
        cursor = state_int(state, "cursor", owner, high=n)
        a = state.get("alias")
        if a is not None:
            alias_owner = f"{owner} alias table"
            lo = state_int(a, "lo", alias_owner, high=n)
            hi = state_int(a, "hi", alias_owner, low=lo, high=n)
            alias = (lo, hi, state_array(a, "weights", alias_owner, length=hi - lo, low=0.0),
                     state_int(a, "num_online_written", alias_owner), state_int(a, "num_offline", alias_owner, high=n),
                     state_float(a, "stale_mass", alias_owner, low=0.0), state_int(a, "seen_written", alias_owner))
        w = np.zeros(n)
        w[:size] = weight
        self.tree.set_all(w)
        self.score = np.full(n, np.nan)
        self.score[:size] = score
        finite = np.isfinite(self.score)
        self.max_score.set_all(np.where(finite, self.score - self.log_p_low, 0.0))
        self.shift, self.num_refreshes, self.cursor = shift, num_refreshes, cursor
        self._alias = None
        if a is not None:
            self._build_alias(*alias)


def _set(tree, slots: np.ndarray, values: np.ndarray) -> None:
    """tree[slots] = values, as range updates when the slots are a few runs of consecutive slots."""
    runs = contiguous_runs(slots, max_runs=8)
    if runs is None:
        tree.update(slots, values)
        return
    offset = 0
    for start, n in runs:
        tree.update_range(start, values[offset : offset + n])
        offset += n


register_alias("arb_transition", "arb", sets=("level=transition",),
               doc="on-policyness weights per transition (ARB's Fig. 3 ablation)")
