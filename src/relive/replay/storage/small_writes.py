"""Small writes: a few online rows of the only stream, into consecutive slots -- the write an env loop makes every
step or every few steps. :meth:`SmallWrites._write_one_lane` is ``Storage.write``'s short path for it (the same state
in about half the steps) and :meth:`SmallWrites.write_staged` a :class:`~relive.replay.stage.Stage`'s commit of it in
one compiled call (:mod:`relive.replay.storage._write_kernels`). Every other write takes ``Storage.write``'s general
path; tests/replay/test_stage.py holds the three equal. This mixin reads and writes the state of the
:class:`~relive.replay.storage.Storage` it is part of."""

from __future__ import annotations

import numpy as np

from relive.replay.storage import _write_kernels
from relive.replay.storage.bookkeeping import GEN_MAX, ID_MOD
from relive.replay.storage.layout import StorageFields
from relive.types import AGENT, ONLINE

SMALL_WRITE = 64  # rows: writes of up to this many take SmallWrites._write_one_lane when they can


class SmallWrites(StorageFields):
    """The small one-stream writes of a storage (mixed into :class:`~relive.replay.storage.Storage`)."""

    def _one_lane_slot(self, n: int, stream: int) -> int:
        """The first slot of a write of ``n`` online rows of ``stream`` in the common small case -- the only stream so
        far, consecutive slots (no wrap), RAM / memmap columns, no next-obs dedup, no stamp or episode-id wrap near --
        or -1 for every other case (the general path's)."""
        if (self._pos is not None or self._lane_of.get(stream) != 0 or self.dedup_next_obs or self._gen_t is not None
                or self._memmap_clean):
            return -1
        clock = self.num_online_written
        first = self.ring_base + clock % (self.capacity - self.ring_base)
        episodes = self.episodes
        if (first + n > self.capacity or self.num_offline + clock + n >= GEN_MAX
                or episodes.next_id + n - episodes.first_live_online_id >= ID_MOD):
            return -1
        return first

    def _one_lane_ids(self, end: np.ndarray) -> np.ndarray:
        """The rows' episode ids (as stored: modulo ID_MOD) in the common small case, the episode index updated."""
        ids = self.episodes.append(ONLINE, self.lane_written[0], end)
        return ids if self.episodes.next_id <= ID_MOD else ids % ID_MOD

    def _one_lane_advance(self, n: int) -> None:
        clock = self.num_online_written + n
        self.num_online_written = clock
        self.lane_written[0] += n
        self.episodes.evict_online_before(clock - (self.capacity - self.ring_base))

    def _write_one_lane(self, rows: dict, n: int, stream: int) -> np.ndarray | None:
        """:meth:`write`'s common small case (:meth:`_one_lane_slot`) in fewer steps: the same rows, records and
        clocks as the general path (tests/replay/test_stage.py holds the two equal); None, before anything changes,
        for every other case."""
        first = self._one_lane_slot(n, stream)
        if first < 0:
            return None
        ids = self._one_lane_ids(rows["terminated"] | rows["truncated"])
        dst = slice(first, first + n)
        for name, col in self.columns.items():
            col[dst] = rows[name]
        meta = self._meta
        meta["episode_id"][dst] = ids
        meta["origin"][dst] = AGENT
        meta["generation"][dst] += 1
        self._one_lane_advance(n)
        return np.arange(first, first + n, dtype=np.int64)

    def write_staged(self, views: tuple, k: int, stream: int) -> np.ndarray | None:
        """Rows ``[0, k)`` of a :class:`~relive.replay.stage.Stage`'s stream written as ``write(ONLINE, rows, stream)``
        writes them, in one compiled call: ``views`` = (every column's byte rows in this storage's column order,
        float32 and float64 row views of the finite-checked columns, the terminated and truncated columns). None,
        before anything changes, for a case the general path takes (:meth:`_one_lane_slot`, an offline episode still
        open) and for rows with a value that is not finite (the general path then names it)."""
        if self._lock is not None:  # (memmap)
            self._check_open()
        first = self._one_lane_slot(k, stream)
        if first < 0:
            return None
        episodes = self.episodes
        state = episodes.lane0_state(k)
        if state is None:
            return None
        if self._row_bytes is None:  # (the columns never move: their byte views are made once)
            self._row_bytes = tuple(_write_kernels.row_bytes(col) for col in self.columns.values())
        meta = self._meta
        src, f32, f64, terminated, truncated = views
        open_id, open_row, next_id, num_records, rec_start, rec_length, rec_finished, rec_source = state
        new, open_id = _write_kernels.commit_rows(
            self._row_bytes, src, f32, f64, terminated, truncated, k, first, self.lane_written[0], meta["episode_id"],
            meta["origin"], AGENT, meta["generation"], rec_start, rec_length, rec_finished, rec_source, ONLINE, open_id,
            open_row, next_id, num_records, ID_MOD)
        if new < 0:
            return None
        episodes.lane0_written(new, open_id)
        self._one_lane_advance(k)
        return np.arange(first, first + k, dtype=np.int64)
