"""Next observations without duplicated frames (``dedup_next_obs``): a row's next_obs is the obs of the next row of
its lane, and only rows without a stored successor keep an explicit copy, kept here."""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np

from relive.replay.state_checks import state_array, state_field
from relive.replay.storage.layout import ColumnSpec, StorageFields


class NextObsStore:
    """The explicit next_obs copies of a storage with ``dedup_next_obs``: which slots hold one (a bitmap, one bit a
    slot), the entry of each of those (a map slot -> entry: they are the few rows without a stored successor --
    episode ends and each stream's newest row), the copies in arrays that grow on demand, a free list of released
    entries, and per lane the last row written (its *tail*: slot and generation; key -1 = offline).

    Why a bitmap and a map rather than an entry per slot: the entry (4 bytes a slot) was the largest part of a
    frame-stack buffer's bookkeeping (13 of 13 bytes beyond the episode id, stamp and origin's 9); the bitmap takes
    1/8 byte a slot and the map ~100 bytes per explicit copy, next to the copy itself (a whole observation). A
    batch's lookup tests its bits (vectorized) and reads the map for the rows that have a copy only. The checkpoint
    format is unchanged (the slots with a copy and the copies, in slot order)."""

    def __init__(self, specs: Mapping[str, ColumnSpec], capacity: int):
        self.specs = dict(specs)
        self.bits = np.zeros((capacity + 7) // 8, np.uint8)  # bit s % 8 of byte s // 8: slot s has a copy
        self._index: dict[int, int] = {}  # slot -> entry, for the slots whose bit is set
        self.values = {n: np.zeros((0, *s.shape), s.dtype) for n, s in self.specs.items()}
        self._free = np.zeros(0, np.int64)
        self._num_free = 0
        self.tails: dict[int, tuple[int, int]] = {}

    @property
    def num_used(self) -> int:
        return self._free.size - self._num_free

    @property
    def map_nbytes(self) -> int:
        """Bytes of the slot -> entry bookkeeping: the bitmap, the map (the dict and its int objects: a conservative
        32 bytes each) and the free list."""
        return self.bits.nbytes + sys.getsizeof(self._index) + 64 * len(self._index) + self._free.nbytes

    # -- lookups -----------------------------------------------------------------------------------------
    def has(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: whether it holds an explicit copy."""
        slots = np.asarray(slots, np.int64)
        return ((self.bits.take(slots >> 3) >> (slots & 7).astype(np.uint8)) & 1).astype(bool)

    def entries_of(self, slots: np.ndarray) -> np.ndarray:
        """Per slot: the entry of its explicit copy, or -1 (none)."""
        slots = np.asarray(slots, np.int64)
        out = np.full(slots.shape, -1, np.int64)
        hit = self.has(slots)
        if hit.any():
            index = self._index
            out[hit] = [index[s] for s in slots[hit].tolist()]
        return out

    def entry_of(self, slot: int) -> int:
        return self._index.get(slot, -1)

    def slots_below(self, size: int) -> np.ndarray:
        """The slots below ``size`` with an explicit copy, in order."""
        return np.array(sorted(s for s in self._index if s < size), np.int64)

    # -- changes -----------------------------------------------------------------------------------------
    def release(self, slots: np.ndarray) -> None:
        slots = np.asarray(slots, np.int64)
        hit = slots[self.has(slots)]
        if hit.size:
            hit = np.unique(hit)
            old = np.array([self._index.pop(s) for s in hit.tolist()], np.int64)
            self._free[self._num_free : self._num_free + old.size] = old
            self._num_free += old.size
            np.bitwise_and.at(self.bits, hit >> 3, ~(np.uint8(1) << (hit & 7).astype(np.uint8)))

    def _reserve(self, k: int) -> None:
        """At least ``k`` free entries (grow: double, at least k more)."""
        if self._num_free < k:
            old = self._free.size
            new = max(2 * old, old + k - self._num_free, 16)
            for n, arr in self.values.items():
                grown = np.zeros((new, *arr.shape[1:]), arr.dtype)
                grown[:old] = arr
                self.values[n] = grown
            free = np.zeros(new, np.int64)
            free[: self._num_free] = self._free[: self._num_free]
            free[self._num_free : self._num_free + new - old] = np.arange(new - 1, old - 1, -1)
            self._free, self._num_free = free, self._num_free + new - old

    def next_entry(self) -> int:
        """The entry the next one-row :meth:`put_one` takes (grown if none is free): its values may be written
        before the put."""
        if self._num_free == 0:
            self._reserve(1)
        return int(self._free[self._num_free - 1])

    def put_one(self, slot: int) -> None:
        """Give ``slot`` the entry :meth:`next_entry` named (its values written there already), releasing the one it
        held."""
        self._num_free -= 1
        new = int(self._free[self._num_free])
        old = self._index.get(slot, -1)
        self._index[slot] = new
        if old >= 0:
            self._free[self._num_free] = old
            self._num_free += 1
        else:
            self.bits[slot >> 3] |= 1 << (slot & 7)

    def release_one(self, slot: int) -> None:
        e = self._index.pop(slot, -1)
        if e >= 0:
            self._free[self._num_free] = e
            self._num_free += 1
            self.bits[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF

    def put(self, slots: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        """Explicit copies for ``slots`` (distinct, holding none)."""
        k = slots.size
        if k == 0:
            return
        self._reserve(k)
        idx = self._free[self._num_free - k : self._num_free].copy()
        self._num_free -= k
        self._index.update(zip(slots.tolist(), idx.tolist(), strict=True))
        slots = np.asarray(slots, np.int64)
        np.bitwise_or.at(self.bits, slots >> 3, np.uint8(1) << (slots & 7).astype(np.uint8))
        for n, v in values.items():
            self.values[n][idx] = v

    def state_dict(self, size: int) -> dict:
        slots = self.slots_below(size)
        e = self.entries_of(slots)
        tails = np.array([[key, slot, gen] for key, (slot, gen) in sorted(self.tails.items())], np.int64)
        return {"slots": slots.astype(np.int64), "tails": tails.reshape(-1, 3),
                "values": {n: arr[e] for n, arr in self.values.items()}}

    def load_state_dict(self, state: Mapping, size: int) -> None:
        owner = "storage state next_obs_store"
        slots = state_array(state, "slots", owner, dtype=np.int64, low=0, high=size - 1)
        if np.unique(slots).size != slots.size:
            raise ValueError(f"{owner} field 'slots' lists a slot twice")
        tails = state_array(state, "tails", owner, dtype=np.int64, shape=(3,))
        if tails.size and ((tails[:, 1] < 0).any() or (tails[:, 1] >= max(size, 1)).any()):
            raise ValueError(f"{owner} field 'tails': a slot beyond the stored rows")
        self.bits[:] = 0
        self._index = {}
        self.values = {n: np.zeros((0, *s.shape), s.dtype) for n, s in self.specs.items()}
        self._free, self._num_free = np.zeros(0, np.int64), 0
        values = {}
        stored = state_field(state, "values", owner)
        for n, spec in self.specs.items():
            v = np.asarray(state_field(stored, n, f"{owner} values"))
            if v.shape != (slots.size, *spec.shape) or v.dtype != spec.dtype:
                raise ValueError(f"checkpoint next_obs copies {n!r} have shape {v.shape} dtype {v.dtype}, expected "
                                 f"{(slots.size, *spec.shape)} {spec.dtype}")
            check_values(v, f"{owner} values {n!r}", slots)  # as a write checks next_obs
            values[n] = v
        self.put(slots, values)
        self.tails = {int(k): (int(s), int(g)) for k, s, g in tails}


def check_values(arr: np.ndarray, label: str, slots: np.ndarray | None = None, first: int = 0) -> None:
    """Loaded rows checked as a write checks them: a float array finite, a bool array's bytes 0 or 1 (a flag
    holding another byte is neither False nor a clean True: ``~flag`` of it is True too). A ValueError names the
    row (``first`` + its index; or the entry and its slot, given ``slots``) and the value."""
    if not arr.size or arr.dtype.kind not in "fb":
        return
    flat = arr.reshape(arr.shape[0], -1)
    bad = ~np.isfinite(flat) if arr.dtype.kind == "f" else flat.view(np.uint8) > 1
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        where = f"row {first + row}" if slots is None else f"entry {row} (slot {int(slots[row])})"
        value = flat[row, col].item() if arr.dtype.kind == "f" else int(flat.view(np.uint8)[row, col])
        what = "is not finite (a write would have refused it)" if arr.dtype.kind == "f" else \
            "is not a boolean flag (bytes 0 / 1; a write would have refused it)"
        raise ValueError(f"{label} {where}: value {value!r} {what}")


def as_bytes(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(a.shape[0] if a.ndim else 1, -1).view(np.uint8)


def differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: whether ``a[i]`` and ``b[i]`` differ in any bit (so -0.0 vs 0.0 differ: reconstruction is exact)."""
    if a.shape[0] == 0:
        return np.zeros(0, bool)
    return (as_bytes(a) != as_bytes(b)).any(axis=1)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((as_bytes(a[None]) == as_bytes(b[None])).all())


class NextObsDedup(StorageFields):
    """The write and read sides of ``dedup_next_obs`` in a :class:`~relive.replay.storage.Storage` (mixed in; the
    copies themselves live in its :class:`NextObsStore`, ``_nx``)."""

    def _dedup_before_write(self, tail_key: int, rows: dict, end: np.ndarray, slots: np.ndarray,
                            skip: int) -> np.ndarray:
        """``next_obs`` without duplicated frames: which of the rows about to be written keep an explicit copy.

        Rule: row i keeps one when it ends its episode (terminated / truncated), is the last row of the write (its
        successor is not stored yet), or its next_obs differs (bitwise) from row i + 1's obs. Every other row's
        next_obs *is* the obs of the next row of its lane, which is written after it and so is overwritten after
        it: while the row is stored, so is its successor. Before the write, the entries of the slots it overwrites
        are released, and the lane's previous last row (the *tail*, still in an open episode) drops its copy if
        this write's first obs equals it: that row now has a stored successor."""
        nx = self._nx
        nx.release(slots)
        tail = nx.tails.get(tail_key)
        if tail is not None and skip == 0:
            t_slot, t_gen = tail
            e = nx.entry_of(t_slot)
            if (e >= 0 and int(self._meta["generation"][t_slot]) == t_gen and not self.columns["terminated"][t_slot]
                    and not self.columns["truncated"][t_slot]
                    and all(same_bits(nx.values[nn][e], rows[on][0]) for on, nn in zip(
                        self._obs_names, self._next_names, strict=True))):
                nx.release(np.array([t_slot]))
        n = end.size
        explicit = end.copy()
        explicit[-1] = True
        if n > 1:
            for on, nn in zip(self._obs_names, self._next_names, strict=True):
                explicit[:-1] |= differs(rows[nn][:-1], rows[on][1:])
        return explicit[skip:]

    def _read_next(self, slots: np.ndarray, keys=None) -> dict[str, np.ndarray]:
        names = [(on, nn) for on, nn in zip(self._obs_names, self._next_names, strict=True)
                 if keys is None or nn[len("next_obs."):] in keys]
        if not self.dedup_next_obs:
            return {nn: self.columns[nn].take(slots, axis=0) for _, nn in names}
        nx = self._nx
        entry = nx.entries_of(slots)
        explicit = entry >= 0
        src = np.where(explicit, slots, self.next_slot(slots))
        out = {}
        any_explicit = bool(explicit.any())
        if any_explicit:
            where, from_entry = np.flatnonzero(explicit), entry[explicit]
        for on, nn in names:
            arr = self.columns[on].take(src, axis=0)
            if any_explicit:
                arr[where] = nx.values[nn][from_entry]
            out[nn] = arr
        return out
