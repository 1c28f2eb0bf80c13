"""ReaPER as the reference code reads the paper's open choices (``--replay reaper_reference``).

The sampler of ``reaper.py`` with three switches, each defaulting to the reference implementation
(leonardpleiss/ReaPER, commit ecbd0b8, ``custom_buffers/reaper.py``) and each tested against a hand-worked case;
with all three off it equals ``ReaPERSampler`` (tested). Whatever the switches, a row drawn twice in one batch
keeps its *first* occurrence's TD error, as the reference code does (``ReaPERSampler`` keeps the last). See the
class docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from relive.registry import register_replay
from relive.replay.samplers._reaper_kernels import power
from relive.replay.samplers.base import Draw, state_array, state_field, state_float, state_int
from relive.replay.samplers.reaper import ReaPERConfig, ReaPERSampler, restore_array


@dataclass(frozen=True)
class ReaPERReferenceConfig(ReaPERConfig):
    """ReaPER's settings plus the reference code's three choices (each switchable)."""

    fresh_unweighted: bool = True  # rows never updated are drawn by the reference's rule for fresh rows
    frozen_F: bool = True  # F frozen at insert (the reference's _max_sum_td at that time), not the live F
    is_normalization: str = "buffer"  # IS weights normalized by the buffer's minimum probability or the batch's

    def __post_init__(self):
        super().__post_init__()
        for name in ("fresh_unweighted", "frozen_F"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.is_normalization not in ("buffer", "batch"):
            raise ValueError(f"is_normalization must be 'buffer' or 'batch', got {self.is_normalization!r}")


@register_replay("reaper_reference", doc="ReaPER with the reference code's choices where the paper is open (fresh rows "
                 "unweighted, F frozen at insert, IS by the buffer's minimum)")
class ReaPERReferenceSampler(ReaPERSampler):
    """ReaPER with the reference code's (leonardpleiss/ReaPER) choices where the paper leaves them open, each
    switchable, for comparing the two readings (docs/results.md). Read from that code, not copied:

    - ``fresh_unweighted``: a row of an ongoing episode gets Psi = d^alpha with no reliability factor until
      some row of its episode is updated (or the episode ends); then all of them use C_t / D.
    - ``frozen_F``: an ongoing episode's row divides by the reference code's F at its insert time, not the live
      F, and R may exceed 1 when C_t outgrows it (the reference code does not clip). The reference code's F is
      not Eq. 17's max over the stored episodes' totals: it starts at 1; it is read when a row is stored (before
      that row's episode ends, so rows after an episode end within one chunk see the raised value); when an
      episode finishes it becomes max(F, S_e); after every update it is recomputed as the max, over the stored
      rows, of their denominators (S_e of a finished episode's rows, the frozen F of an ongoing episode's rows).
      So it never counts the ongoing episode's running total, and it falls only when an update lowers the
      largest finished total below every frozen value still stored (a ratchet: the latest ongoing row holds the
      last value). ``reference_F`` holds it.
    - ``is_normalization="buffer"``: IS weights divided by the weight of the buffer's least likely row,
      (P_min / P(t))^beta, instead of the batch's largest (Eq. 18's normalization).

    Duplicate rows in a batch (always, not a switch): the reference code deduplicates a batch's indices keeping
    each row's *first* occurrence, so that occurrence's TD error is stored and enters the running max of d;
    ``ReaPERSampler`` keeps the last (in a DDQN batch the copies of a row have the same TD error, so this matters
    only when an agent's signal differs between copies).

    All the other bookkeeping (d, C_t, S_e, the live F, episode status) is the parent's; the draw and each
    update are O(buffer size) (a cumulative sum and a binary search, and the max for F, as in the reference
    code): fine for classic control, not for 1M rows. With all three switches off it draws with exactly the
    parent's probabilities (a test checks this).
    """

    Config = ReaPERReferenceConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.fresh_unweighted, self.frozen_F = o.fresh_unweighted, o.frozen_F
        self.is_normalization = o.is_normalization
        self._serial = 0
        self.reference_F = 1.0  # the reference code's F (its _max_sum_td): starts at 1

    def bind(self, storage, source=None) -> None:
        super().bind(storage, source)
        n = storage.capacity
        self.f_insert = np.zeros(n)  # F when the row was stored
        self.insert_serial = np.zeros(n, np.int64)  # which insert stored the row
        self.update_serial = np.zeros(n, np.int64)  # per episode leaf: the insert count at its last update

    def on_insert(self, slots: np.ndarray) -> None:
        super().on_insert(slots)
        self._serial += 1
        self.insert_serial[slots] = self._serial
        # the reference code stores F with each row, then raises F when the row ends its episode: walk the
        # inserted rows episode by episode (they arrive in time order)
        leaves = self.slot_leaf[slots]
        cut = np.flatnonzero(leaves[1:] != leaves[:-1]) + 1
        for a, b in zip(np.r_[0, cut].tolist(), np.r_[cut, slots.size].tolist(), strict=True):
            self.f_insert[slots[a:b]] = self.reference_F
            leaf = leaves[a]
            if self.finished[leaf]:
                self.reference_F = max(self.reference_F, float(self.total[leaf]))

    def _sync(self) -> None:
        pending = self._open_offline_id
        super()._sync()
        if pending >= 0 and self._open_offline_id == -1:  # the dataset's last episode just finished
            leaf = int(self._leaf_of(np.array([pending]))[0])
            if self.finished[leaf]:
                self.reference_F = max(self.reference_F, float(self.total[leaf]))

    def on_episodes_closed(self, ids: np.ndarray) -> None:
        super().on_episodes_closed(ids)
        ids = np.asarray(ids, np.int64)
        for leaf in self._leaf_of(ids[self.storage.episodes.is_live(ids)]).tolist():  # it just ended: raise F
            if self.finished[leaf]:
                self.reference_F = max(self.reference_F, float(self.total[leaf]))

    def update(self, slots: np.ndarray, signals: dict) -> None:
        super().update(slots, signals)
        self.update_serial[self.slot_leaf[np.asarray(slots, np.int64)]] = self._serial
        # F := the max over the stored rows of their denominators (finished: S_e; ongoing: frozen F)
        lo, hi = self.domain()
        leaves = self.slot_leaf[lo:hi]
        self.reference_F = float(np.where(self.finished[leaves], self.total[leaves], self.f_insert[lo:hi]).max())

    def _distinct(self, slots: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """The reference code's rule: a row drawn twice keeps its first occurrence's d, and only the kept values
        enter the running max."""
        uniq, first = np.unique(slots, return_index=True)
        kept = d[first]
        return uniq, kept, float(kept.max())

    def reliability(self, slots: np.ndarray, leaves: np.ndarray | None = None) -> np.ndarray:
        slots = np.asarray(slots, np.int64)
        return self._reliability_at(slots, self.slot_leaf[slots] if leaves is None else leaves)

    def _reliability_at(self, rows: np.ndarray | slice, leaves: np.ndarray) -> np.ndarray:
        """R of stored rows given as slots or as a slice of slots (a slice reads the arrays without a gather)."""
        fin = self.finished[leaves]
        ongoing_denom = self.f_insert[rows] if self.frozen_F else self.F
        r = self.prefix[rows] / np.where(fin, self.total[leaves], ongoing_denom)
        if self.fresh_unweighted:
            r[~fin & (self.insert_serial[rows] > self.update_serial[leaves])] = 1.0
        return r

    def _all_psi(self) -> tuple[int, np.ndarray]:
        """Psi of every stored row (the domain is one contiguous slot range)."""
        self._sync()
        lo, hi = self.domain()
        rows = slice(lo, hi)
        r = self._reliability_at(rows, self.slot_leaf[rows])
        return lo, power(r, self.reliability_exponent) * self.delta_pow[rows]

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        lo, psi = self._all_psi()
        cum = np.cumsum(psi)
        z = cum[-1]
        pick = np.minimum(np.searchsorted(cum, rng.random(batch_size) * z, side="right"), psi.size - 1)
        probability = psi[pick] / z
        self.num_samples += 1
        # (N P)^-beta divided by the largest weight (the buffer's least likely row, or the batch's) = (P_min / P)^beta
        smallest = psi.min() / z if self.is_normalization == "buffer" else probability.min()
        is_weight = (smallest / probability) ** self.beta
        return Draw(lo + pick, probability, is_weight.astype(np.float32))

    def probabilities(self) -> np.ndarray:
        lo, psi = self._all_psi()
        p = np.zeros(self.storage.capacity)
        p[lo: lo + psi.size] = psi / psi.sum()
        return p

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/reaper_reference_F": self.reference_F}

    def state_dict(self) -> dict:
        state = super().state_dict()
        size = self.storage.size
        n_leaves = len(state["leaves"]["leaf_id"])
        return state | {"reference": {"f_insert": self.f_insert[:size].copy(),
                                      "insert_serial": self.insert_serial[:size].copy(),
                                      "update_serial": self.update_serial[:n_leaves].copy(),
                                      "serial": self._serial, "F": self.reference_F}}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        owner = f"{self._owner()} reference"
        ref = state_field(state, "reference", self._owner())
        n_leaves = len(state["leaves"]["leaf_id"])
        for name, length in (("f_insert", self.storage.size), ("insert_serial", self.storage.size),
                             ("update_serial", n_leaves)):
            dtype = getattr(self, name).dtype
            restore_array(getattr(self, name), state_array(ref, name, owner, length=length, dtype=dtype,
                                                      low=0 if dtype.kind in "iuf" else None))
        self._serial = state_int(ref, "serial", owner)
        if "F" in ref:
            state_float(ref, "F", owner, low=0.0)
        # (a checkpoint from before reference_F: the largest stored frozen F is its last value or close to it)
        self.reference_F = float(ref["F"]) if "F" in ref else max(1.0, float(self.f_insert.max(initial=0.0)))
