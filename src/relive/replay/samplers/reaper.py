"""ReaPER: Reliability-adjusted Prioritized Experience Replay (Pleiss, Sutter, Schiffer; ICLR 2026,
arXiv 2506.18482).

A TD target is only as reliable as the TD errors downstream of it in its episode (Sec. 4):

    R_t = 1 - (sum_{i > t} d_i) / (sum_{i in e} d_i) = C_t / S_e      terminated episode e     (Eq. 16)
    R_t = 1 - (F - C_t) / F                          = C_t / F        ongoing episode          (Eq. 16)
    F = max over the stored episodes of S_e                                                   (Eq. 17)
    Psi_t = R_t^omega * d_t^alpha                                                             (Eq. 15)
    P(t) = Psi_t / sum_j Psi_j,   w_t = (N * P(t))^-beta / max over the batch                  (Eq. 18)

with d_i = |td_error_i| + eps, C_t the inclusive prefix sum of d over the episode, S_e = C at its last row and
F the largest S_e among the stored episodes. New rows get d = the largest d seen so far (the running max
starts at 1, as in the reference code); their reliability is applied at once (C_t / F while the episode is
ongoing; the reference code leaves it out until some row of their episode is updated or the episode ends --
``ReaPERReferenceSampler`` below follows the reference code on this and the other open choices).

Efficient exact updates (the paper's O(n - t) update, Sec. 5, the limitations paragraph: "it can be reduced to
O(n - t) by only re-calculating the episodic cumulative sums for transitions on their update or the update of a
preceding transition within the same episode"). The priority
factorizes as Psi_t = D_e^-omega * u_t with u_t = C_t^omega * d_t^alpha and D_e = S_e or F, so sampling is
two-level: an episode with probability D_e^-omega U_e / Z (U_e = sum of u over its stored rows), then a row of
it with probability u_t / U_e by a binary search over the running sum of u, kept per slot. Finished episodes
live in one sum tree (leaf D_e^-omega U_e), ongoing ones in another (leaf U_e, scaled by F^-omega when
drawing), and a max tree over S_e gives F -- so a change of F or of an episode's total moves one leaf, not
its rows. Changing d_t changes C_j and u_j for j >= t only: an update recomputes, per touched episode, the
suffix from its earliest updated row (one compiled pass, the powers vectorized) and one leaf per tree. Nothing
is O(buffer size); a batch costs O(sum over the touched episodes of their suffix lengths) -- up to
B x episode length when every row of the batch falls in a different long episode, as at 1M rows.

Truncation (``truncation=``): ``"finished"`` (default, the reference code's, which treats timeouts as
terminations: a truncated episode -- and the dataset's last episode once the online phase starts -- uses S_e,
so its last row has R = 1) or ``"ongoing"`` (only terminated episodes use S_e; a truncated one keeps the
denominator F for good: its last target bootstraps from an unseen next state, so its downstream error is not
known to be small). The default reproduces the paper's numbers; "ongoing" is the more conservative reading.

Eviction: when the ring overwrites the head of an episode, the evicted rows' d stay in C and S_e (reference
behaviour): the surviving rows' downstream errors are unchanged, and nothing needs recomputing. A row dropped
before it was ever stored (one ``extend`` longer than the ring) contributes nothing.

IS weights: Eq. 18 is (N P(t))^-beta; like PER we divide by the largest weight in the batch (the reference
code divides by the weight of the buffer's least likely row, which no structure here tracks cheaply; with
Adam the two differ by a per-batch constant factor).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relive.registry import ReplayBuild, register_replay
from relive.replay import _tree_kernels
from relive.replay.samplers._reaper_kernels import NO_LANE_MAP, power, segmented_cumsum
from relive.replay.samplers.base import (
    MAX_EXPONENT,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Draw,
    Sampler,
    check_number,
    state_array,
    state_field,
    state_float,
    state_int,
)
from relive.replay.samplers.per import check_signal, linear_anneal
from relive.replay.sum_tree import MaxTree, SumTree
from relive.types import OFFLINE, ONLINE

TRUNCATION = ("finished", "ongoing")


@dataclass(frozen=True)
class ReaPERConfig:
    """Reliability-adjusted PER (Pleiss et al. 2025): Psi = R^omega * |delta|^alpha."""

    priority_exponent: float = 0.4  # alpha (the reference example.py's 0.4)
    reliability_exponent: float = 0.2  # omega (the reference example.py's 0.2)
    is_exponent: float = 0.4  # beta at the start
    is_exponent_final: float = 1.0  # beta at the end of the annealing
    # sample calls over which beta moves linearly to is_exponent_final; None: the run's gradient steps (a buffer
    # built outside a run: 0, beta stays at is_exponent)
    is_anneal_samples: int | None = None
    eps: float = 1e-6  # d = |delta| + eps (floored at MIN_PRIORITY)
    truncation: str = "finished"  # an episode's last stored row: "finished" (S_e) or "ongoing" (F) -- see above
    use_kernels: bool | None = None  # the compiled (numba) kernels; None: when numba is importable

    def __post_init__(self):
        name = type(self).__name__
        check_number(name, "priority_exponent", self.priority_exponent, low=0, high=MAX_EXPONENT)
        check_number(name, "reliability_exponent", self.reliability_exponent, low=0, high=MAX_EXPONENT)
        check_number(name, "is_exponent", self.is_exponent, low=0)
        check_number(name, "is_exponent_final", self.is_exponent_final, low=0)
        if self.is_anneal_samples is not None:
            check_number(name, "is_anneal_samples", self.is_anneal_samples, low=0, integer=True)
        check_number(name, "eps", self.eps, low=0, low_open=True, high=MAX_PRIORITY)
        if self.truncation not in TRUNCATION:
            raise ValueError(f"truncation must be one of {TRUNCATION}, got {self.truncation!r}")
        if self.use_kernels is not None and not isinstance(self.use_kernels, bool):
            raise ValueError(f"{name}: use_kernels must be true, false or null, got {self.use_kernels!r}")


@register_replay("reaper")
class ReaPERSampler(Sampler):
    """reliability-adjusted PER"""

    signals = ("td_error",)
    Config = ReaPERConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.priority_exponent, self.reliability_exponent = float(o.priority_exponent), float(o.reliability_exponent)
        self.is_exponent, self.is_exponent_final = float(o.is_exponent), float(o.is_exponent_final)
        self.is_anneal_samples = int(o.is_anneal_samples or 0)
        self.eps = float(o.eps)
        self.truncation = o.truncation
        self.use_kernels = o.use_kernels
        self._compiled = _tree_kernels.AVAILABLE if o.use_kernels is None else bool(o.use_kernels
                                                                                   and _tree_kernels.AVAILABLE)
        self.num_samples = 0
        self.max_delta = 1.0
        self.F_override: float | None = None  # a replay service's shard draws with the union's F (relive.replay.remote)

    INITIAL_LEAVES = 64  # per-leaf arrays start this large and double on demand

    def bind(self, storage, source=None) -> None:
        super().bind(storage, source)
        n = storage.capacity
        # per slot: d, d^alpha, C (inclusive prefix of d in its episode), running sum of u, episode leaf
        self.delta = np.zeros(n)
        self.delta_pow = np.zeros(n)
        self.prefix = np.zeros(n)
        self.cum_u = np.zeros(n)
        self.slot_leaf = np.full(n, -1, np.int64)
        # per episode leaf (offline id, or num_offline_episodes + online id mod online capacity: unique among
        # the stored episodes, which are at most as many as the stored rows). The per-leaf arrays and trees grow on
        # demand (doubling, at most to the capacity): a buffer of long episodes needs few leaves
        m = min(n, self.INITIAL_LEAVES)
        self.leaf_id = np.full(m, -1, np.int64)
        self.live_start = np.zeros(m, np.int64)  # logical positions of the stored rows: [live_start, live_end)
        self.live_end = np.zeros(m, np.int64)
        self.finished = np.zeros(m, bool)  # uses S_e (True) or F (False)
        self.total = np.zeros(m)  # S_e, including evicted rows
        self.u_total = np.zeros(m)  # running sum of u at the last stored row (including evicted rows)
        self.evicted_d = np.zeros(m)  # C and running-u just before the first stored row
        self.evicted_u = np.zeros(m)
        self.finished_tree = SumTree(m)  # S_e^-omega (U_e - evicted_u)
        self.ongoing_tree = SumTree(m)  # U_e - evicted_u, times F^-omega when drawing
        self.total_tree = MaxTree(m)  # S_e, for F
        self._seen_next_id = 0
        self._open_offline_id = -1
        # several streams: episodes no longer die in id order, so online leaves are allocated, not id mod capacity
        self._leaf_by_id: dict[int, int] | None = None
        self._free_leaves: list[int] = []
        # several streams: an open episode whose stored rows were all overwritten by other streams gives its leaf
        # back (stored episodes never outnumber the ring's slots, open empty ones could) and parks its evicted
        # sums (C and running u at its last evicted row) here until its stream writes to it again
        self._parked: dict[int, tuple[float, float]] = {}

    @property
    def beta(self) -> float:
        return linear_anneal(self.is_exponent, self.is_exponent_final, self.is_anneal_samples, self.num_samples)

    def anneal_over_next(self, num_samples: int) -> None:
        """beta reaches ``is_exponent_final`` after ``num_samples`` more sample calls, unless ``is_anneal_samples``
        was configured."""
        if self.options.is_anneal_samples is None:
            self.is_anneal_samples = self.num_samples + int(num_samples)

    @property
    def F(self) -> float:
        return self.total_tree.max if self.F_override is None else self.F_override

    # -- positions and leaves --------------------------------------------------------------------------
    def _ensure_leaves(self, need: int) -> None:
        """Room for leaves ``0 .. need - 1``: the per-leaf arrays and the three trees grow (doubling, at most to the
        capacity); the trees are rebuilt from their leaf values."""
        have = self.leaf_id.size
        if need <= have:
            return
        new = min(max(need, 2 * have), self.storage.capacity)
        for name in self._LEAF_ARRAYS:
            old = getattr(self, name)
            grown = np.full(new, -1 if name == "leaf_id" else 0, old.dtype)
            grown[:have] = old
            setattr(self, name, grown)
        for name in ("finished_tree", "ongoing_tree", "total_tree"):
            old = getattr(self, name)
            values = np.zeros(new)
            values[:have] = old.leaves
            tree = type(old)(new)
            tree.set_all(values)
            setattr(self, name, tree)

    def _leaf_of(self, ids: np.ndarray) -> np.ndarray:
        st = self.storage
        k = st.episodes.num_offline_episodes
        if self._leaf_by_id is None:  # one stream: online episodes die in id order, id mod capacity is unique
            return np.where(ids < k, ids, k + (ids - k) % max(st.online_capacity, 1))
        ids = np.asarray(ids, np.int64)
        out = ids.copy()
        online = ids >= k
        if online.any():
            by_id = self._leaf_by_id
            out[online] = [by_id[i] for i in ids[online].tolist()]
        return out

    def _multi_stream(self) -> None:
        """The second stream started writing: from now on online episodes get leaves from a free list."""
        st = self.storage
        k = st.episodes.num_offline_episodes
        leaves = np.arange(k, k + st.online_capacity)
        ids = np.full(leaves.size, -1, np.int64)
        allocated = leaves < self.leaf_id.size  # (leaves past the arrays' size are unused)
        ids[allocated] = self.leaf_id[leaves[allocated]]
        used = ids >= 0  # live, or dead in the write being inserted (its _evict frees them)
        self._leaf_by_id = {int(i): int(leaf) for i, leaf in zip(ids[used], leaves[used], strict=True)}
        self._free_leaves = leaves[~used][::-1].tolist()

    def _allocate_leaves(self, by_id: dict[int, int], ids: np.ndarray) -> None:
        k = self.storage.episodes.num_offline_episodes
        for i in ids.tolist():
            if i >= k:
                by_id[i] = leaf = self._free_leaves.pop()
                self._ensure_leaves(leaf + 1)

    def _unpark(self, ids: np.ndarray) -> None:
        """Parked open episodes among ``ids`` (episode ids of a write) get a leaf and their evicted sums back."""
        by_id = self._leaf_by_id
        if by_id is None:  # (episodes are parked only once several streams write: the leaf map exists then)
            raise RuntimeError("ReaPER: parked episodes but no leaf map (several streams); please report this")
        for i in np.unique(ids).tolist():
            if i in self._parked:
                leaf = self._free_leaves.pop()
                self._ensure_leaves(leaf + 1)
                by_id[i] = leaf
                self.evicted_d[leaf], self.evicted_u[leaf] = self._parked.pop(i)

    def _positions(self, slots: np.ndarray) -> np.ndarray:
        """Logical positions (see relive.replay.storage.episodes) of stored slots."""
        return self.storage.position_of(slots)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _recompute(self, ids: np.ndarray, p_from: np.ndarray) -> None:
        """Recompute C and the running sum of u from logical position ``p_from`` to the end of each episode
        ``ids`` (unique, stored), then its leaves. ``p_from`` past the end: leaves only (status changes)."""
        if ids.size == 0:
            return
        st = self.storage
        view = st.episodes.get(ids)
        leaves = self._leaf_of(ids)
        self._ensure_leaves(int(leaves.max()) + 1)
        start, end = view.start, view.start + view.length
        p_from = np.clip(p_from, start, end)
        online = view.source == ONLINE
        self.leaf_id[leaves] = ids
        self.live_start[leaves], self.live_end[leaves] = start, end
        last_slot = np.where(online, st.online_slot(end - 1), end - 1)
        finished = view.finished
        if self.truncation == "ongoing":  # only a terminal state makes the downstream errors complete
            finished = finished & st.columns["terminated"].take(last_slot)
        self.finished[leaves] = finished
        k, cap = st.num_offline, max(st.online_capacity, 1)
        n_rows = int((end - p_from).sum())
        if n_rows:
            self._suffix(p_from, start, end, online, leaves, k, cap, n_rows)
        self.total[leaves] = self.prefix[last_slot]
        self.u_total[leaves] = self.cum_u[last_slot]
        self._set_leaves(leaves)

    def _suffix(self, p_from, start, end, online, leaves, k, cap, n_rows) -> None:
        omega = self.reliability_exponent
        if self._compiled:
            c = np.empty(n_rows)
            lane_map = self._lane_map()
            suffix_prefix(p_from, start, end, online, leaves, k, cap, lane_map, self.delta, self.prefix,
                          self.evicted_d, c)
            c_pow = power(c, omega)  # C_j^omega, vectorized (the powers dominate a compiled loop)
            suffix_running_u(p_from, start, end, online, leaves, k, cap, lane_map, c_pow, self.delta_pow,
                             self.cum_u, self.evicted_u)
            return
        lengths = end - p_from
        seg = np.repeat(np.arange(lengths.size), lengths)
        first = np.cumsum(lengths) - lengths
        pos = np.repeat(p_from, lengths) + np.arange(n_rows) - first[seg]
        slots = self.storage.slot_of(pos, np.repeat(online, lengths))
        prev = self.storage.slot_of(p_from - 1, online)
        has_prev = p_from > start
        base_c = np.where(has_prev, self.prefix[np.where(has_prev, prev, 0)], self.evicted_d[leaves])
        base_u = np.where(has_prev, self.cum_u[np.where(has_prev, prev, 0)], self.evicted_u[leaves])
        c = segmented_cumsum(self.delta[slots], seg, first, lengths) + base_c[seg]
        self.prefix[slots] = c
        u = power(c, omega) * self.delta_pow[slots]
        self.cum_u[slots] = segmented_cumsum(u, seg, first, lengths) + base_u[seg]

    def _leaf_values(self, leaves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mass = self.u_total[leaves] - self.evicted_u[leaves]  # U_e over the stored rows
        fin = self.finished[leaves]
        # S_e >= MIN_PRIORITY once its rows are in; 0 only transiently (a status change seen before the new rows'
        # sums are computed, recomputed right after): no log(0)
        total = np.maximum(self.total[leaves], MIN_PRIORITY)
        scaled = mass * power(np.where(fin, total, 1.0), -self.reliability_exponent)
        return np.where(fin, scaled, 0.0), np.where(fin, 0.0, mass)

    def _set_leaves(self, leaves: np.ndarray) -> None:
        fin_values, ongoing_values = self._leaf_values(leaves)
        self.finished_tree.update(leaves, fin_values)
        self.ongoing_tree.update(leaves, ongoing_values)
        self.total_tree.update(leaves, self.total[leaves])

    def _sync(self) -> None:
        """The dataset's last episode counts as finished once the online phase starts (the offline part of a
        mixture does not see the online inserts, so this is checked lazily)."""
        if self._open_offline_id >= 0 and self.storage.episodes.is_open(OFFLINE) == -1:
            ids = np.array([self._open_offline_id])
            self._open_offline_id = -1
            self._recompute(ids, np.array([np.iinfo(np.int64).max]))

    def _evict(self, slots: np.ndarray) -> np.ndarray:
        """``slots`` (in write order) are about to be rewritten: their old rows leave the buffer. Returns the
        ids of the episodes that lost rows but still have some."""
        old = self.slot_leaf[slots]
        keep = old >= 0
        # (the write's length, empty slots included: a write as long as the ring may start past the oldest row)
        shorter_than_ring = slots.size < self.storage.online_capacity
        slots, old = slots[keep], old[keep]
        if old.size == 0:
            return np.zeros(0, np.int64)
        # the last evicted row of each episode
        if self._leaf_by_id is None and shorter_than_ring:
            # one stream, a write shorter than the ring: slots are overwritten in the old rows' time order
            rev_leaves, rev_first = np.unique(old[::-1], return_index=True)
            last_slot = slots[::-1][rev_first]
        else:  # the row with the largest C (and running u), which grow along an episode: a write longer than
            # the ring starts past the oldest row's slot, and several streams' rows interleave
            order = np.lexsort((self.cum_u[slots], self.prefix[slots], old))
            old, slots = old[order], slots[order]
            last = np.r_[old[1:] != old[:-1], True]
            rev_leaves, last_slot = old[last], slots[last]
        ids = self.leaf_id[rev_leaves]
        if self._leaf_by_id is None:
            alive = ids >= self.storage.episodes.first_live_online_id
            kept = alive
        else:
            alive = self.storage.episodes.is_live(ids)
            kept = alive
            # several streams: an open episode whose stored rows were all overwritten by other streams frees its
            # leaf and parks its sums for the rows it gets next (see _parked)
            parked = ~alive & np.isin(ids, self.storage.episodes.open_online_ids())
            for i, d, u in zip(ids[parked].tolist(), self.prefix[last_slot[parked]].tolist(),
                               self.cum_u[last_slot[parked]].tolist(), strict=True):
                self._parked[i] = (d, u)
        dead = rev_leaves[~alive]
        if dead.size:
            zeros = np.zeros(dead.size)
            self.finished_tree.update(dead, zeros)
            self.ongoing_tree.update(dead, zeros)
            self.total_tree.update(dead, zeros)
            self.leaf_id[rev_leaves[~kept]] = -1
            if self._leaf_by_id is not None:
                for i in ids[~kept].tolist():
                    del self._leaf_by_id[i]
                self._free_leaves.extend(rev_leaves[~kept].tolist())
        self.evicted_d[rev_leaves[kept]] = self.prefix[last_slot[kept]]
        self.evicted_u[rev_leaves[kept]] = self.cum_u[last_slot[kept]]
        return ids[alive]

    def on_insert(self, slots: np.ndarray) -> None:
        st = self.storage
        self._sync()
        if st.multi_stream and self._leaf_by_id is None:
            self._multi_stream()
        pos = self._positions(slots)
        shortened = np.zeros(0, np.int64)
        if slots[0] >= st.num_offline:
            overwritten = slots if self._leaf_by_id is not None else slots[pos >= st.online_capacity]
            shortened = self._evict(overwritten)  # the ring overwrote these slots (a stored row has a leaf)
        ids = st.episode_ids(slots)
        if self._parked:
            self._unpark(ids)
        fresh = ids >= self._seen_next_id
        if fresh.any():
            if self._leaf_by_id is not None:
                self._allocate_leaves(self._leaf_by_id, np.unique(ids[fresh]))
            new_leaves = self._leaf_of(np.unique(ids[fresh]))
            self._ensure_leaves(int(new_leaves.max()) + 1)
            self.evicted_d[new_leaves] = 0.0
            self.evicted_u[new_leaves] = 0.0
            self._seen_next_id = int(ids.max()) + 1
        self.delta[slots] = self.max_delta
        self.delta_pow[slots] = self.max_delta**self.priority_exponent
        self.slot_leaf[slots] = self._leaf_of(ids)
        touched, first = np.unique(ids, return_index=True)  # rows arrive in time order: first = earliest
        p_from = pos[first]
        other = np.setdiff1d(shortened, touched)  # lost head rows only: leaves change
        if other.size:
            touched = np.concatenate([touched, other])
            p_from = np.concatenate([p_from, np.full(other.size, np.iinfo(np.int64).max)])
        self._recompute(touched, p_from)
        if slots[0] < st.num_offline:
            self._open_offline_id = st.episodes.is_open(OFFLINE)

    def on_episodes_closed(self, ids: np.ndarray) -> None:
        """An open episode ended where it stood: it now uses S_e (finished) instead of F."""
        ids = np.asarray(ids, np.int64)
        live = self.storage.episodes.is_live(ids)
        if live.any():
            self._recompute(ids[live], np.full(int(live.sum()), np.iinfo(np.int64).max))
        if self._leaf_by_id is not None:  # one waiting for rows that will never come: its leaf is free
            for i in ids[~live].tolist():
                self._parked.pop(i, None)
                leaf = self._leaf_by_id.pop(i, None)
                if leaf is not None:
                    self.leaf_id[leaf] = -1
                    self._free_leaves.append(leaf)

    def check_signals(self, slots: np.ndarray, signals: dict) -> None:
        super().check_signals(slots, signals)
        if "td_error" not in signals:
            raise ValueError(f"{type(self).__name__}.update needs a 'td_error' signal, got {sorted(signals)}")

    def update(self, slots: np.ndarray, signals: dict) -> None:
        self.check_signals(slots, signals)
        td = check_signal("td_error", signals["td_error"])
        if td.size != slots.size:
            raise ValueError(f"got {td.size} td_error values for {slots.size} rows")
        self._sync()
        d = np.abs(td) + self.eps
        np.clip(d, MIN_PRIORITY, MAX_PRIORITY, out=d)  # C, S_e, F and every sum of Psi stay finite
        uniq, d_new, d_max = self._distinct(slots, d)
        self.delta[uniq] = d_new
        self.delta_pow[uniq] = d_new**self.priority_exponent
        self.max_delta = max(self.max_delta, d_max)
        ids = self.storage.episode_ids(uniq)
        pos = self._positions(uniq)
        order = np.lexsort((pos, ids))
        touched, first = np.unique(ids[order], return_index=True)
        self._recompute(touched, pos[order][first])

    def _distinct(self, slots: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """One d per distinct row of a batch -- a row drawn twice keeps its last occurrence's value -- and the
        value the running max of d takes in (the whole batch's largest)."""
        uniq, first_in_rev = np.unique(slots[::-1], return_index=True)
        return uniq, d[::-1][first_in_rev], float(d.max())

    # -- sampling --------------------------------------------------------------------------------------
    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        self._sync()
        omega = self.reliability_exponent
        F = self.F
        z_fin, z_ong_raw = self.finished_tree.total, self.ongoing_tree.total
        f_scale = F**-omega if F > 0 else 0.0
        z = z_fin + z_ong_raw * f_scale
        mass = rng.random(batch_size) * z
        from_fin = mass < z_fin
        leaves = np.empty(batch_size, np.int64)
        if from_fin.any():
            leaves[from_fin] = self.finished_tree.find_prefix(mass[from_fin])
        if not from_fin.all():
            leaves[~from_fin] = self.ongoing_tree.find_prefix((mass[~from_fin] - z_fin) / f_scale)
        indices = self._within(leaves, rng.random(batch_size))
        probability = self._draw_probability(indices, leaves)
        self.num_samples += 1
        # (N P)^-beta / max over the batch = (min P / P)^beta: no overflow for tiny P (N cancels)
        is_weight = (probability.min() / probability) ** self.beta
        return Draw(indices, probability, is_weight.astype(np.float32))

    def total_mass(self) -> float:
        """sum over the stored rows of Psi_t (Eq. 15), as :meth:`_draw` normalizes by (a replay service's shard
        reports it with :meth:`finished_mass`, :meth:`ongoing_mass` and F: relive.replay.remote)."""
        F = self.F
        return self.finished_mass() + self.ongoing_mass() * (F**-self.reliability_exponent if F > 0 else 0.0)

    def finished_mass(self) -> float:
        """sum of Psi over the finished episodes' stored rows (S_e^-omega U_e)."""
        self._sync()
        return float(self.finished_tree.total)

    def ongoing_mass(self) -> float:
        """sum of U_e over the ongoing episodes (their Psi without the F^-omega factor)."""
        self._sync()
        return float(self.ongoing_tree.total)

    def _lane_map(self) -> np.ndarray:
        """The storage's per-lane map for the compiled kernels (``NO_LANE_MAP`` with one stream)."""
        lane_map = self.storage.lane_map
        return NO_LANE_MAP if lane_map is None else lane_map

    def _within(self, leaves: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Row of each drawn episode with probability u_t / U_e: binary search over the running sum of u."""
        st = self.storage
        k, cap = st.num_offline, max(st.online_capacity, 1)
        lo, hi = self.live_start[leaves], self.live_end[leaves]
        target = self.evicted_u[leaves] + r * (self.u_total[leaves] - self.evicted_u[leaves])
        online = leaves >= st.episodes.num_offline_episodes
        if self._compiled:
            return search(lo, hi, online, target, k, cap, self._lane_map(), self.cum_u,
                          np.empty(leaves.size, np.int64))
        hi = hi - 1  # find the first position p in [lo, hi] with cum_u[p] > target (hi if none)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            below = self.cum_u[st.slot_of(mid, online)] <= target
            lo = np.where(below & (lo < hi), mid + 1, lo)
            hi = np.where(~below & (lo < hi), mid, hi)
        return st.slot_of(lo, online)

    def _draw_probability(self, slots: np.ndarray, leaves: np.ndarray | None = None) -> np.ndarray:
        """Per-draw probability of stored rows as the two-level draw realizes it: the episode's share of the
        mass times u_t / U_e, with u_t read back from the running sums (= Psi_t / sum Psi up to rounding)."""
        st = self.storage
        leaves = self.slot_leaf[slots] if leaves is None else leaves
        F = self.F
        f_scale = F**-self.reliability_exponent if F > 0 else 0.0
        z = self.finished_tree.total + self.ongoing_tree.total * f_scale
        episode_mass = self.finished_tree[leaves] + self.ongoing_tree[leaves] * f_scale
        pos = self._positions(slots)
        has_prev = pos > self.live_start[leaves]
        prev = np.where(has_prev, st.slot_of(pos - 1, slots >= st.num_offline), 0)
        u = self.cum_u[slots] - np.where(has_prev, self.cum_u[prev], self.evicted_u[leaves])
        return episode_mass / z * (u / (self.u_total[leaves] - self.evicted_u[leaves]))

    def _psi(self, slots: np.ndarray, leaves: np.ndarray | None = None) -> np.ndarray:
        """Psi_t = (C_t / D_e)^omega d_t^alpha of stored rows."""
        leaves = self.slot_leaf[slots] if leaves is None else leaves
        return self.reliability(slots, leaves) ** self.reliability_exponent * self.delta_pow[slots]

    def reliability(self, slots: np.ndarray, leaves: np.ndarray | None = None) -> np.ndarray:
        """R_t = C_t / S_e (finished) or C_t / F (ongoing) of stored rows."""
        slots = np.asarray(slots, np.int64)
        leaves = self.slot_leaf[slots] if leaves is None else leaves
        denom = np.where(self.finished[leaves], self.total[leaves], self.F)
        return self.prefix[slots] / denom

    def probabilities(self) -> np.ndarray:
        self._sync()
        lo, hi = self.domain()
        p = np.zeros(self.storage.capacity)
        if hi > lo:
            p[lo:hi] = self._draw_probability(np.arange(lo, hi))
        return p

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/is_exponent": self.beta, "replay/reaper_F": self.F,
                                  "replay/reaper_max_delta": self.max_delta}

    # -- construction and checkpoint -------------------------------------------------------------------
    @classmethod
    def from_run(cls, options: ReaPERConfig, ctx: ReplayBuild) -> ReaPERSampler:
        """beta anneals over the run's gradient steps unless ``is_anneal_samples`` is set."""
        if options.is_anneal_samples is None:
            options = replace(options, is_anneal_samples=ctx.total_grad_steps)
        return cls(options)

    _SLOT_ARRAYS = ("delta", "delta_pow", "prefix", "cum_u", "slot_leaf")
    _LEAF_ARRAYS = ("leaf_id", "live_start", "live_end", "finished", "total", "u_total", "evicted_d", "evicted_u")

    def state_dict(self) -> dict:
        self._sync()
        size = self.storage.size
        live = np.flatnonzero(self.leaf_id >= 0)
        n_leaves = int(live.max()) + 1 if live.size else 0
        return super().state_dict() | {
            "slots": {name: getattr(self, name)[:size].copy() for name in self._SLOT_ARRAYS},
            "leaves": {name: getattr(self, name)[:n_leaves].copy() for name in self._LEAF_ARRAYS},
            "max_delta": self.max_delta, "num_samples": self.num_samples, "seen_next_id": self._seen_next_id,
            "is_anneal_samples": self.is_anneal_samples,  # (planned by anneal_over_next)
            "open_offline_id": self._open_offline_id,
            "parked": {"ids": np.array(list(self._parked), np.int64),
                       "sums": np.array(list(self._parked.values()), np.float64).reshape(-1, 2)}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        owner, size = self._owner(), self.storage.size
        leaves = state_field(state, "leaves", owner)
        n_leaves = np.asarray(state_field(leaves, "leaf_id", f"{owner} leaves")).shape[0] if isinstance(
            leaves, dict) else 0
        if n_leaves > self.storage.capacity:
            raise ValueError(f"{owner} has {n_leaves} episode leaves, more than the capacity {self.storage.capacity}")
        checked = {}
        for group, names, length in (("slots", self._SLOT_ARRAYS, size), ("leaves", self._LEAF_ARRAYS, n_leaves)):
            part = state_field(state, group, owner)
            for name in names:
                dtype = getattr(self, name).dtype
                low = (-1 if name in ("slot_leaf", "leaf_id") else 0) if dtype.kind in "iu" else (
                    0.0 if name in ("delta", "delta_pow") else None)
                high = n_leaves - 1 if name == "slot_leaf" else None
                checked[group, name] = state_array(part, name, f"{owner} {group}", length=length, dtype=dtype,
                                                   low=low, high=high)
        max_delta = state_float(state, "max_delta", owner, low=0.0)
        counters = (state_int(state, "num_samples", owner), state_int(state, "seen_next_id", owner),
                    state_int(state, "open_offline_id", owner, low=-1))
        horizon = state_int(state, "is_anneal_samples", owner) if "is_anneal_samples" in state else None
        parked = state.get("parked")  # (absent in checkpoints written before parking existed)
        if parked is not None:
            ids = state_array(parked, "ids", f"{owner} parked", dtype=np.int64, low=0)
            sums = state_array(parked, "sums", f"{owner} parked", length=ids.size, shape=(2,))
        self._ensure_leaves(n_leaves)
        for (_group, name), arr in checked.items():
            restore_array(getattr(self, name), arr, fill=-1 if name in ("slot_leaf", "leaf_id") else 0)
        self.max_delta = max_delta
        self.num_samples, self._seen_next_id, self._open_offline_id = counters
        if horizon is not None:  # (checkpoints before anneal_over_next have none: the configured one stays)
            self.is_anneal_samples = horizon
        self._leaf_by_id, self._free_leaves = None, []
        self._parked = {} if parked is None else {
            int(i): (float(d), float(u)) for i, (d, u) in zip(ids.tolist(), sums.tolist(), strict=True)}
        if self.storage.multi_stream:
            self._multi_stream()
        n = self.leaf_id.size
        fin, ongoing, totals = np.zeros(n), np.zeros(n), np.zeros(n)
        live = np.flatnonzero(self.leaf_id >= 0)
        fin[live], ongoing[live] = self._leaf_values(live)
        totals[live] = self.total[live]
        self.finished_tree.set_all(fin)
        self.ongoing_tree.set_all(ongoing)
        self.total_tree.set_all(totals)


def restore_array(arr: np.ndarray, saved, fill: int = 0) -> None:
    """Put a checkpoint's prefix of a per-slot / per-leaf array back in place; the rest gets ``fill``."""
    src = np.asarray(saved, dtype=arr.dtype)
    arr[:] = fill
    arr[: src.size] = src


if _tree_kernels.AVAILABLE:
    from relive.replay.samplers._reaper_kernels import search, suffix_prefix, suffix_running_u
