"""Episode index: which rows form each episode, whether it is finished, and what of it is still stored.

Positions are *logical*: an offline row's position is its slot; an online row's position is the number of
online rows written before it (a counter that never wraps). The storage maps an online position ``t`` to
slot ``num_offline + t % online_capacity``. Online episodes are contiguous in ``t`` because rows arrive in
time order from one stream; when the ring overwrites the oldest rows the index moves the live start of the
oldest episodes forward (``evict_online_before``) and forgets episodes with no live row.

Each episode has a record (start, length, finished, source) addressed by its id. Ids increase in creation
order: offline episodes first, then online ones. Records of forgotten online episodes are compacted away
now and then so the table stays proportional to what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relive.types import OFFLINE, ONLINE


@dataclass(frozen=True)
class EpisodeView:
    """Live episodes as parallel arrays. ``start``/``length`` describe the rows still stored."""

    ids: np.ndarray
    source: np.ndarray
    start: np.ndarray
    length: np.ndarray
    finished: np.ndarray

    def __len__(self) -> int:
        return int(self.ids.size)


_FIELDS = (("start", np.int64), ("length", np.int64), ("finished", np.bool_), ("source", np.int8))


class EpisodeIndex:
    def __init__(self) -> None:
        self._rec = {name: np.zeros(64, dtype=dt) for name, dt in _FIELDS}
        self._num_records = 0  # records held (offline + online, dead online ones before compaction too)
        self._shift = 0  # online ids removed from the table by compaction
        self.num_offline_episodes = 0
        self.next_id = 0
        self.first_live_online_id = 0  # online ids below this have no stored row
        self.online_evicted_before = 0  # online positions below this are overwritten
        self._open = {OFFLINE: -1, ONLINE: -1}  # id of the episode still receiving rows, per source

    # -- id <-> record row -----------------------------------------------------------------------------
    def _rows(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return np.where(ids < self.num_offline_episodes, ids, ids - self._shift)

    def _row(self, episode_id: int) -> int:
        """:meth:`_rows` for one id, in plain Python (the per-write bookkeeping path)."""
        return episode_id if episode_id < self.num_offline_episodes else episode_id - self._shift

    def _grow(self, need: int) -> None:
        cap = self._rec["start"].size
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for name, arr in self._rec.items():
            grown = np.zeros(new_cap, dtype=arr.dtype)
            grown[: self._num_records] = arr[: self._num_records]
            self._rec[name] = grown

    # -- writing ---------------------------------------------------------------------------------------
    def append(self, source: int, start: int, episode_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Register ``n`` new rows of ``source`` at logical positions ``start .. start + n - 1``.

        ``episode_end[i]`` is true when row ``i`` ends its episode (terminated or truncated). Returns the
        episode id and the step within the episode of every row.
        """
        if source == OFFLINE and self.next_id > self.num_offline_episodes:
            raise ValueError("offline rows must all be added before the first online row")
        if source == ONLINE:
            self.close_offline()
        end = np.asarray(episode_end, dtype=bool).reshape(-1)
        n = end.size
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        open_id = self._open[source]
        if not end[:-1].any():  # fast path: all rows belong to one episode (the open one, or a new one)
            if open_id == -1:
                open_id = self._new_record(source, start, n, bool(end[-1]))
                base = 0
            else:
                r = self._row(open_id)
                base = int(self._rec["length"][r])
                self._rec["length"][r] += n
                self._rec["finished"][r] = end[-1]
            self._open[source] = -1 if end[-1] else open_id
            return np.full(n, open_id, dtype=np.int64), base + np.arange(n, dtype=np.int64)
        seg_starts = np.concatenate(([0], np.flatnonzero(end[:-1]) + 1))
        seg_lengths = np.diff(seg_starts, append=n)
        seg_of_row = np.repeat(np.arange(seg_starts.size), seg_lengths)
        steps = np.arange(n, dtype=np.int64) - np.repeat(seg_starts, seg_lengths)

        rec = self._rec
        new_segments = seg_starts
        new_lengths = seg_lengths
        if open_id != -1:  # the first segment continues an episode from an earlier call
            r = self._row(open_id)
            steps[seg_of_row == 0] += rec["length"][r]
            rec["length"][r] += seg_lengths[0]
            rec["finished"][r] = end[seg_lengths[0] - 1]
            first_id = open_id
            new_segments, new_lengths = seg_starts[1:], seg_lengths[1:]
        else:
            first_id = self.next_id
        if new_segments.size:
            self._new_records(source, start, new_segments, new_lengths, end[new_segments + new_lengths - 1])
        ids = first_id + seg_of_row
        self._open[source] = -1 if end[-1] else int(ids[-1])
        return ids.astype(np.int64), steps

    def _new_records(self, source: int, start: int, offsets, lengths, finished) -> int:
        """Append records for new episodes starting at ``start + offsets``; returns the first new id."""
        k = offsets.size
        self._grow(self._num_records + k)
        sl = slice(self._num_records, self._num_records + k)
        rec = self._rec
        rec["start"][sl] = start + offsets
        rec["length"][sl] = lengths
        rec["finished"][sl] = finished
        rec["source"][sl] = source
        self._num_records += k
        first = self.next_id
        self.next_id += k
        if source == OFFLINE:
            self.num_offline_episodes += k
        return first

    def _new_record(self, source: int, start: int, length: int, finished: bool) -> int:
        """:meth:`_new_records` for one episode, with plain Python numbers."""
        r = self._num_records
        self._grow(r + 1)
        rec = self._rec
        rec["start"][r] = start
        rec["length"][r] = length
        rec["finished"][r] = finished
        rec["source"][r] = source
        self._num_records = r + 1
        first = self.next_id
        self.next_id += 1
        if source == OFFLINE:
            self.num_offline_episodes += 1
        return first

    def close_offline(self) -> None:
        """The dataset ended: its last episode can never grow, so it counts as finished."""
        open_id = self._open[OFFLINE]
        if open_id != -1:
            self._rec["finished"][self._rows(open_id)] = True
            self._open[OFFLINE] = -1
        if self.first_live_online_id < self.num_offline_episodes:
            self.first_live_online_id = self.num_offline_episodes

    def evict_online_before(self, position: int) -> None:
        """Online rows at logical positions < ``position`` were overwritten."""
        if position <= self.online_evicted_before:
            return
        self.online_evicted_before = int(position)
        lo = self._row(self.first_live_online_id)
        rec, hi = self._rec, self._num_records
        start, length = rec["start"], rec["length"]
        if lo >= hi or int(start[lo]) + int(length[lo]) > position:
            return  # the oldest live episode still has rows: nothing was forgotten
        if lo + 1 >= hi or int(start[lo + 1]) + int(length[lo + 1]) > position:
            dead = 1  # the usual case: one episode died
        else:
            window = min(hi, lo + 64)  # usually few episodes die at once: look at the oldest ones first
            ends = start[lo:window] + length[lo:window]
            if ends[-1] <= position and window < hi:
                ends = start[lo:hi] + length[lo:hi]
            dead = int(np.searchsorted(ends, position, side="right"))  # online ends are increasing
        self.first_live_online_id += dead
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        off = self.num_offline_episodes
        dead = self.first_live_online_id - off - self._shift
        live = self._num_records - off - dead
        if dead < max(1024, live):
            return
        for arr in self._rec.values():
            arr[off : off + live] = arr[off + dead : off + dead + live]
        self._num_records -= dead
        self._shift += dead

    # -- reading ---------------------------------------------------------------------------------------
    def live(self, source: int | None = None) -> EpisodeView:
        """All episodes with at least one stored row (optionally of one source), oldest first."""
        off = self.num_offline_episodes
        lo_online = int(self._rows(self.first_live_online_id)) if self.next_id > off else off
        lo_online = max(lo_online, off)
        parts = []
        if source in (None, OFFLINE):
            parts.append(np.arange(0, off))
        if source in (None, ONLINE):
            parts.append(np.arange(lo_online, self._num_records))
        rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        rec = self._rec
        start = rec["start"][rows].copy()
        length = rec["length"][rows].copy()
        src = rec["source"][rows]
        online = src == ONLINE
        if online.any():
            cut = np.maximum(start[online], self.online_evicted_before)
            length[online] -= cut - start[online]
            start[online] = cut
        ids = np.where(rows < off, rows, rows + self._shift).astype(np.int64)
        return EpisodeView(ids=ids, source=src.copy(), start=start, length=length,
                           finished=rec["finished"][rows].copy())

    def get(self, ids) -> EpisodeView:
        """Records of specific (live) episode ids, with their live start and length."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.next_id or np.any(
                (ids >= self.num_offline_episodes) & (ids < self.first_live_online_id))):
            raise ValueError(f"episode ids {ids.tolist()[:8]} are not all live (next id {self.next_id})")
        rows = self._rows(ids)
        rec = self._rec
        start = rec["start"][rows].copy()
        length = rec["length"][rows].copy()
        src = rec["source"][rows].copy()
        online = src == ONLINE
        cut = np.maximum(start[online], self.online_evicted_before)
        length[online] -= cut - start[online]
        start[online] = cut
        return EpisodeView(ids=ids, source=src, start=start, length=length, finished=rec["finished"][rows].copy())

    def is_open(self, source: int) -> int:
        """Id of the episode of ``source`` still receiving rows, or -1."""
        return self._open[source]

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        n = self._num_records
        state = {f"rec_{name}": arr[:n].copy() for name, arr in self._rec.items()}
        state.update(
            num_records=n, shift=self._shift, num_offline_episodes=self.num_offline_episodes,
            next_id=self.next_id, first_live_online_id=self.first_live_online_id,
            online_evicted_before=self.online_evicted_before,
            open_offline=self._open[OFFLINE], open_online=self._open[ONLINE],
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        n = int(state["num_records"])
        self._rec = {}
        for name, dt in _FIELDS:
            arr = np.zeros(max(64, n), dtype=dt)
            arr[:n] = np.asarray(state[f"rec_{name}"], dtype=dt)
            self._rec[name] = arr
        self._num_records = n
        self._shift = int(state["shift"])
        self.num_offline_episodes = int(state["num_offline_episodes"])
        self.next_id = int(state["next_id"])
        self.first_live_online_id = int(state["first_live_online_id"])
        self.online_evicted_before = int(state["online_evicted_before"])
        self._open = {OFFLINE: int(state["open_offline"]), ONLINE: int(state["open_online"])}
