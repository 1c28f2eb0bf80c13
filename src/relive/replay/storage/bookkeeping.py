"""Per-slot bookkeeping, compact: what a slot must remember is stored (9 bytes a slot), what its position already
says is computed when asked.

Stored, one entry per slot:

- ``episode_id`` (int32): the row's episode. Ids grow without bound over a run; a slot keeps ``id mod 2**31`` and
  :meth:`Bookkeeping.episode_ids` restores the full id (every live online id lies in a window narrower than 2**31
  above the oldest live one; offline ids are below the capacity).
- ``generation`` (int32): incremented each time the slot is written, so an update meant for a row since
  overwritten is recognised as stale. Past 2**31 - 1 it wraps to 1 (never 0: a stored row's stamp is >= 1); a
  stale update could pass only if its slot were rewritten exactly 2**31 - 1 times between the sample and the update.
- ``origin`` (int8): where the row came from (:data:`relive.types.ORIGIN_NAMES`).

Computed (the same values the storage stored per slot before 2026-11-27, 21 bytes a slot):

- ``source``: online iff the slot is in the ring (``slot >= ring_base``; offline rows are the prefix).
- ``step_in_episode``: the row's logical position minus its episode's first position (the episode index keeps it,
  even after the episode's first rows were overwritten).
- ``stream``: the stream of an online row, from its lane (one stream: the only lane).

``storage.meta[name]`` reads any of the six as an array over all slots (the computed ones built on each call,
O(size): for a few slots use ``source_of`` / ``step_of`` / ``stream_of`` / ``episode_ids``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from relive.replay.storage.episodes import LANE_BITS
from relive.replay.storage.layout import BOOKKEEPING_NAMES, StorageFields
from relive.types import ONLINE

COMPUTED = ("source", "step_in_episode", "stream")
# the layout and dtypes of the per-slot bookkeeping before 2026-11-27 (checkpoints, the offline reference's hash)
LEGACY_DTYPES = {"episode_id": np.int64, "step_in_episode": np.int64, "source": np.int8, "generation": np.int64,
                 "stream": np.int32, "origin": np.int8}
GEN_MAX = int(np.iinfo(np.int32).max)  # generation stamps wrap from here to 1
ID_MOD = 2**31  # episode ids are stored modulo this


class Bookkeeping(Mapping):
    """``storage.meta``: the stored arrays (writable, the storage's own) and the computed ones (fresh arrays over
    all slots, 0 on empty slots)."""

    def __init__(self, storage):
        self._st = storage

    def __getitem__(self, name: str) -> np.ndarray:
        st = self._st
        if name in st._meta:
            return st._meta[name]
        if name not in COMPUTED:
            raise KeyError(name)
        out = np.zeros(st.capacity, dtype=LEGACY_DTYPES[name])
        slots = np.flatnonzero(st.stored_mask()) if st.size else np.zeros(0, np.int64)
        if slots.size:
            out[slots] = {"source": st.source_of, "step_in_episode": st.step_of, "stream": st.stream_of}[name](slots)
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(BOOKKEEPING_NAMES)

    def __len__(self) -> int:
        return len(BOOKKEEPING_NAMES)


class BookkeepingQueries(StorageFields):
    """The storage's per-slot queries (mixed into :class:`~relive.replay.storage.Storage`)."""

    def source_of(self, slots) -> np.ndarray:
        """0 (offline) or 1 (online) per stored slot: the ring holds the online rows."""
        return (np.asarray(slots, np.int64) >= self.ring_base).view(np.int8) if self.num_online_written else (
            np.zeros(np.shape(slots), np.int8))

    def episode_ids(self, slots) -> np.ndarray:
        """The full episode id (int64) of each stored slot."""
        slots = np.asarray(slots, np.int64)
        raw = self._meta["episode_id"].take(slots).astype(np.int64)
        if self.episodes.next_id <= ID_MOD:
            return raw
        base = self.episodes.first_live_online_id  # every live online id is in [base, base + 2**31)
        online = slots >= self.ring_base
        return np.where(online, base + (raw - base) % ID_MOD, raw)

    def step_of(self, slots) -> np.ndarray:
        """Each stored slot's step within its episode (0 at the episode's first row, even if since overwritten)."""
        slots = np.asarray(slots, np.int64)
        return self.position_of(slots) - self.episodes.start_of(self.episode_ids(slots))

    def stream_of(self, slots) -> np.ndarray:
        """The stream that wrote each stored slot (0 for offline rows)."""
        slots = np.asarray(slots, np.int64)
        out = np.zeros(slots.shape, np.int64)
        online = self.source_of(slots) == ONLINE
        if online.any():
            if self._pos is None:
                out[online] = self.lanes[0]
            else:
                out[online] = np.asarray(self.lanes, np.int64)[self._pos[slots[online]] >> LANE_BITS]
        return out


__all__ = ["Bookkeeping", "BookkeepingQueries", "COMPUTED", "LEGACY_DTYPES", "GEN_MAX", "ID_MOD"]
