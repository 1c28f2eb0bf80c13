"""ReaPER: Reliability-adjusted Prioritized Experience Replay (Pleiss, Sutter, Schiffer; ICLR 2026,
arXiv 2506.18482).

A TD target is only as reliable as the TD errors downstream of it in its episode (Sec. 3, Eq. 16):

    R_t = 1 - (sum_{i > t} d_i) / (sum_{i in episode} d_i) = C_t / S_e      finished episode
    R_t = 1 - (F - C_t) / F = C_t / F                                       ongoing episode
    Psi_t = R_t^omega * d_t^alpha,   P(t) = Psi_t / sum_j Psi_j               (Eq. 17)
    w_t = (N * P(t))^-beta / max over the batch                            beta annealed like PER

with d_i = |td_error_i| + eps, C_t the inclusive prefix sum of d over the episode's stored rows, S_e the
episode total and F the largest episode total in the buffer. New rows get d = the largest d seen so far
(like PER's max priority; the running max starts at 1).

Cost: updating the TD error of one row changes C for every later row of its episode and S_e, so the whole
episode is recomputed -- O(episode length) per touched episode (one cumsum), plus a pass over the live
episodes' totals for F. Nothing is O(buffer size). When F changes, the ongoing episodes (usually one) are
recomputed too.

Truncation: a time-limit truncation *finishes* the episode for reliability (no more rows will come, so
its downstream errors are complete), as in the reference code, which treats timeouts as terminations.
Evicted rows (the ring overwrote the head of an episode) leave the sums: reliability is computed over the
rows still stored.
"""

from __future__ import annotations

import numpy as np

from relive.replay.samplers.base import Draw, Sampler
from relive.replay.samplers.per import (
    check_signal,
    contiguous_runs,
    linear_anneal,
    proportional_draw,
    tree_probabilities,
)
from relive.replay.sum_tree import SumTree


class ReaPERSampler(Sampler):
    signals = ("td_error",)

    def __init__(self, priority_exponent: float = 0.4, reliability_exponent: float = 0.2, is_exponent: float = 0.4,
                 is_exponent_final: float | None = 1.0, is_anneal_samples: int = 0, eps: float = 1e-6):
        super().__init__()
        if priority_exponent < 0 or reliability_exponent < 0 or is_exponent < 0 or eps <= 0:
            raise ValueError("exponents must be >= 0 and eps > 0")
        self.priority_exponent = float(priority_exponent)
        self.reliability_exponent = float(reliability_exponent)
        self.is_exponent = float(is_exponent)
        self.is_exponent_final = float(is_exponent if is_exponent_final is None else is_exponent_final)
        self.is_anneal_samples = int(is_anneal_samples)
        self.eps = float(eps)
        self.num_samples = 0
        self.max_delta = 1.0

    def bind(self, storage, source=None) -> None:
        super().bind(storage, source)
        self.tree = SumTree(storage.capacity)
        self.delta = np.zeros(storage.capacity)  # d_i = |td| + eps per slot
        self.totals = np.zeros(64)  # S_e per episode id (over stored rows)
        self.F = 0.0

    @property
    def beta(self) -> float:
        return linear_anneal(self.is_exponent, self.is_exponent_final, self.is_anneal_samples, self.num_samples)

    # -- bookkeeping -----------------------------------------------------------------------------------
    def _recompute(self, episode_ids: np.ndarray) -> None:
        """Recompute C, S_e and Psi of whole episodes (one vectorized pass over their rows)."""
        if episode_ids.size == 0:
            return
        st = self.storage
        view = st.episodes.get(episode_ids)
        slots = st.episode_slots(view.start, view.length, view.source)
        d = self.delta[slots]
        ep_of_row = np.repeat(np.arange(view.ids.size), view.length)
        csum = np.cumsum(d)
        starts = np.cumsum(view.length) - view.length
        prefix = csum - np.repeat(csum[starts] - d[starts], view.length)  # inclusive prefix per episode
        totals = np.add.reduceat(d, starts) if slots.size else np.zeros(0)
        if view.ids.max() >= self.totals.size:
            grown = np.zeros(max(2 * self.totals.size, int(view.ids.max()) + 1))
            grown[: self.totals.size] = self.totals
            self.totals = grown
        self.totals[view.ids] = totals
        # (a new episode total can raise F: _refresh_F, called after every change, rescales ongoing episodes)
        denom = np.where(view.finished, totals, 0.0)[ep_of_row]
        denom = np.where(denom > 0, denom, self.F)  # ongoing episodes: F
        reliability = np.minimum(prefix / np.maximum(denom, 1e-300), 1.0)
        psi = reliability**self.reliability_exponent * d**self.priority_exponent
        runs = contiguous_runs(slots, max_runs=2 * view.ids.size + 1)  # episodes are contiguous (or wrap once)
        if runs is None:
            self.tree.update(slots, psi)
            return
        offset = 0
        for start, n in runs:
            self.tree.update_range(start, psi[offset : offset + n])
            offset += n

    def _refresh_F(self) -> None:
        """F = the largest episode total among stored episodes; if it moved, ongoing episodes rescale."""
        view = self.storage.episodes.live(self.source)
        new_F = float(self.totals[view.ids].max()) if view.ids.size else 0.0
        if new_F != self.F:
            self.F = new_F
            self._recompute(view.ids[~view.finished])

    def on_insert(self, slots: np.ndarray) -> None:
        self.delta[slots] = self.max_delta
        st = self.storage
        live = st.episodes.live(self.source).ids
        touched = np.unique(st.meta["episode_id"].take(slots))
        if live.size:  # the oldest stored episode may have lost rows to the ring: recompute it as well
            touched = np.union1d(touched, live[:1])
        self._recompute(touched[np.isin(touched, live)])
        self._refresh_F()

    def update(self, slots: np.ndarray, signals: dict) -> None:
        if "td_error" not in signals:
            raise ValueError(f"ReaPERSampler.update needs a 'td_error' signal, got {sorted(signals)}")
        td = check_signal("td_error", signals["td_error"])
        d = np.abs(td) + self.eps
        # duplicates: the last value wins (a sequential update would leave exactly that)
        rev_slots = slots[::-1]
        uniq, first = np.unique(rev_slots, return_index=True)
        self.delta[uniq] = d[::-1][first]
        self.max_delta = max(self.max_delta, float(d.max()))
        episodes = np.unique(self.storage.meta["episode_id"].take(uniq))
        self._recompute(episodes)
        self._refresh_F()

    # -- sampling --------------------------------------------------------------------------------------
    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        draw = proportional_draw(self.tree, batch_size, rng, self.num_rows(), self.beta)
        self.num_samples += 1
        return draw

    def probabilities(self) -> np.ndarray:
        return tree_probabilities(self.tree)

    def reliability(self, slots: np.ndarray) -> np.ndarray:
        """R of stored rows, from the priorities (Psi / d^alpha)^(1/omega) (diagnostics and tests)."""
        psi = self.tree[slots]
        base = psi / self.delta[slots] ** self.priority_exponent
        return base ** (1.0 / self.reliability_exponent) if self.reliability_exponent > 0 else np.ones(slots.size)

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/is_exponent": self.beta, "replay/reaper_F": self.F,
                                  "replay/reaper_max_delta": self.max_delta}

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        return dict(priority_exponent=self.priority_exponent, reliability_exponent=self.reliability_exponent,
                    is_exponent=self.is_exponent, is_exponent_final=self.is_exponent_final,
                    is_anneal_samples=self.is_anneal_samples, eps=self.eps)

    def state_dict(self) -> dict:
        size = self.storage.size
        return super().state_dict() | {"delta": self.delta[:size].copy(), "psi": np.array(self.tree.leaves[:size]),
                                       "totals": self.totals.copy(), "F": self.F, "max_delta": self.max_delta,
                                       "num_samples": self.num_samples}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        n = self.storage.capacity
        self.delta = np.zeros(n)
        self.delta[: len(state["delta"])] = state["delta"]
        psi = np.zeros(n)
        psi[: len(state["psi"])] = state["psi"]
        self.tree.set_all(psi)
        self.totals = np.asarray(state["totals"], dtype=np.float64).copy()
        self.F = float(state["F"])
        self.max_delta = float(state["max_delta"])
        self.num_samples = int(state["num_samples"])
