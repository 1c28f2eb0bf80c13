"""Streams: online rows from several interleaved writers (vector envs, collectors), each a *lane* of logical
positions (:mod:`relive.replay.storage.episodes`). One stream is the fast path (positions are the ring's clock); from
the second on, the storage keeps each online row's position and a per-lane map position -> slot. This mixin holds that
machinery; the state it reads and writes (``lanes``, ``lane_written``, ``_lane_of``, ``_pos``, ``_qmap``) lives on
the :class:`~relive.replay.storage.Storage` it is part of."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from relive.replay.state_checks import state_array
from relive.replay.storage.episodes import LANE_BITS, LANE_MASK
from relive.replay.storage.layout import StorageFields

MAX_STREAM = 2**31 - 1


def check_stream(stream) -> int:
    if isinstance(stream, bool | np.bool_) or not isinstance(stream, int | np.integer) or not 0 <= stream <= MAX_STREAM:
        raise ValueError(f"stream must be an integer in [0, {MAX_STREAM}], got {stream!r}")
    return int(stream)



class StreamLanes(StorageFields):
    """The lanes of a storage's streams (mixed into :class:`~relive.replay.storage.Storage`)."""

    @property
    def multi_stream(self) -> bool:
        """Online rows of more than one stream have been written (positions are no longer the ring's clock)."""
        return len(self.lanes) > 1

    def _lane(self, stream) -> int:
        lane = self._lane_of.get(stream)
        if lane is not None:
            return lane
        stream = check_stream(stream)
        lane = len(self.lanes)
        self.lanes.append(stream)
        self.lane_written.append(0)
        self._lane_of[stream] = lane
        self.episodes.ensure_lane(lane)
        if lane > 0:
            self._add_lane_map(lane)
        return lane

    def _add_lane_map(self, lane: int) -> None:
        """Room for ``lane`` in the per-lane map: the second stream builds it (lane 0's positions were the ring's
        clock until now); later streams double its rows when they run out (amortized: 200 streams cost 8 row
        copies of the map, not 200)."""
        if self._qmap is None:
            self._pos = np.zeros(self.capacity, np.int64)
            online = np.arange(self.ring_base, self.size, dtype=np.int64)
            self._pos[online] = self.ring_position_of(online)
            self._qmap = np.zeros((max(2, lane + 1), 0), np.int64)
            self._rebuild_lane_map(self.num_online)
        elif self._qmap.shape[0] <= lane:
            grown = np.zeros((max(lane + 1, 2 * self._qmap.shape[0]), self._qmap.shape[1]), np.int64)
            grown[: self._qmap.shape[0]] = self._qmap
            self._qmap = grown

    MIN_LANE_MAP_WIDTH = 1024

    def _rebuild_lane_map(self, window: int, clock: int | None = None) -> None:
        """Size the map's width for a lane holding ``window`` stored rows and refill it from the stored rows'
        positions. An entry is ``[lane, t % width]``: a lane's stored rows are a contiguous run of its positions
        (each stream's rows are overwritten in their own time order), so a width of at least the longest run keeps
        them apart. The width doubles (at most to the ring's size) only when a lane's run outgrows it: with many
        streams sharing the ring each holds a fraction of it, and the map stays near 8 bytes per stored row times
        the slack of one doubling, instead of 8 bytes per slot per stream. ``clock``: the ring's clock whose stored
        rows the map holds (default: now; a write rebuilding it passes its clock before the rows it is adding)."""
        cap = max(self.online_capacity, 1)
        width = min(cap, max(self.MIN_LANE_MAP_WIDTH, 1 << max(int(window) - 1, 0).bit_length()))
        self._qmap = np.zeros((self._qmap.shape[0], width), np.int64)
        clock = self.num_online_written if clock is None else clock
        n = min(clock, cap if self.online_capacity > 0 else 0)
        if n:
            slots = self.ring_slot(np.arange(clock - n, clock))  # oldest first
            pos = self._pos[slots]
            key = (pos >> LANE_BITS) * width + (pos & LANE_MASK) % width
            _, last = np.unique(key[::-1], return_index=True)  # a key met twice: the newer row (still stored) wins
            keep = n - 1 - last
            self._qmap.reshape(-1)[key[keep]] = slots[keep]

    def _evicted_by(self, start: int, n: int) -> dict[int, int]:
        """Several streams: per lane, the position bound of its rows that a write of ``n`` rows at the ring's
        clock ``start`` overwrites."""
        cap = self.online_capacity
        lo, hi = max(0, start - cap), min(start, max(0, start + n - cap))
        if hi <= lo:
            return {}
        old = self._pos[self.ring_slot(np.arange(lo, hi))]  # in ring order: each lane's positions increase
        lanes = old >> LANE_BITS
        ends = np.flatnonzero(lanes[1:] != lanes[:-1]).tolist() + [old.size - 1]  # last row of each run of a lane
        return {int(lanes[i]): int(old[i]) + 1 for i in ends}  # (a lane's later run has the larger positions)

    def _load_lane_maps(self, streams: Mapping, owner: str, size: int) -> None:
        """Several streams: the online rows' logical positions (checked against their streams' clocks) and the
        per-lane maps rebuilt from them."""
        online = np.arange(self.ring_base, size, dtype=np.int64)
        pos = state_array(streams, "position", f"{owner} streams", length=size, dtype=np.int64, low=0)[online]
        lane, t = pos >> LANE_BITS, pos & LANE_MASK
        if pos.size and (lane.max() >= len(self.lanes) or (t >= np.asarray(self.lane_written)[lane]).any()):
            raise ValueError(f"{owner} streams field 'position': positions beyond what their stream has written")
        self._pos = np.zeros(self.capacity, np.int64)
        self._pos[online] = pos
        self._qmap = np.zeros((len(self.lanes), 0), np.int64)
        ends = np.asarray(self.lane_written, np.int64) + (np.arange(len(self.lanes), dtype=np.int64) << LANE_BITS)
        window = ends - self.episodes.lane_evicted[: len(self.lanes)]
        self._rebuild_lane_map(int(window.max(initial=1)))
