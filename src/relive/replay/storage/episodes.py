"""Episode index: which rows form each episode, whether it is finished, and what of it is still stored.

Positions are *logical*: an offline row's position is its slot; an online row's position is its *lane*'s
clock, the number of rows of its stream written before it, with the lane number in the high bits:
``position = lane << LANE_BITS | t``. A lane is one stream of online rows (one environment, one collector's
env): lane 0 is the first stream that writes, and while it is the only one, ``t`` is the ring's clock and the
storage maps position ``t`` to slot ``num_offline + t % online_capacity`` (the single-stream fast path). With
several streams the storage keeps a per-lane map from ``t`` to slot. Online episodes are contiguous in their
lane's positions because each stream's rows arrive in time order, whatever the interleaving of streams; when
the ring overwrites the oldest rows the index moves the live start of each lane's oldest episodes forward
(``evict_online_before`` with one lane, ``evict_lanes`` with several) and forgets episodes with no live row.

Each episode has a record (start, length, finished, source) addressed by its id. Ids increase in creation
order: offline episodes first, then online ones. With a demonstration segment (``demo_capacity`` rows of room for
offline rows written after online ones, see :mod:`relive.replay.storage`) the first online write reserves the ids
``[num_offline_episodes, num_offline_episodes + demo_capacity)`` for later offline episodes (each holds at least one
row, so the room in rows bounds their number): online ids start after them (``id_base``), an offline episode written
later takes the next reserved id, and offline ids stay below online ones. Records of forgotten online episodes are
compacted away now and then so the table stays proportional to what is stored. With several lanes an episode can
die before an older one of another lane (a long episode outlives short ones): ``first_live_online_id`` stays a lower
bound (every id below it is dead), and ``live`` / ``get`` / ``is_live`` check each episode's stored length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relive.replay.state_checks import state_array, state_int
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


LANE_BITS = 40  # an online position is lane << LANE_BITS | (rows of that lane written before it)
LANE_MASK = (1 << LANE_BITS) - 1

_FIELDS = (("start", np.int64), ("length", np.int64), ("finished", np.bool_), ("source", np.int8))


FEW_ROWS = 16  # append: writes of up to this many rows take the plain-Python branch


class EpisodeIndex:
    def __init__(self, demo_capacity: int = 0) -> None:
        self.demo_capacity = int(demo_capacity)
        self._id_base = -1  # first online id, fixed by the first online row (-1 before)
        self._rec: dict[str, np.ndarray] = {name: np.zeros(64, dtype=dt) for name, dt in _FIELDS}
        self._num_records = 0  # records held (offline + online, dead online ones before compaction too)
        self._shift = 0  # online ids removed from the table by compaction
        self.num_offline_episodes = 0
        self.next_id = 0
        self.first_live_online_id = 0  # online ids below this have no stored row
        self.lane_evicted = np.zeros(1, np.int64)  # per lane: its positions below this are overwritten
        self.multi = False  # rows of several lanes (episodes may die out of id order)
        self._open = {OFFLINE: -1, ONLINE: -1}  # id of the episode still receiving rows: offline, lane 0
        self._open_lanes: dict[int, int] = {}  # lanes > 0: id of their open episode (absent: none)

    @property
    def id_base(self) -> int:
        """Ids below this are offline episodes (or reserved for them), ids from it on online ones."""
        return self._id_base if self._id_base >= 0 else self.num_offline_episodes

    @property
    def online_evicted_before(self) -> int:
        """Lane 0's eviction bound: with one stream, the ring's clock minus its capacity."""
        return int(self.lane_evicted[0])

    def ensure_lane(self, lane: int) -> None:
        """Make lanes ``0 .. lane`` known (a new stream started writing)."""
        while self.lane_evicted.size <= lane:
            self.lane_evicted = np.append(self.lane_evicted, np.int64(self.lane_evicted.size) << LANE_BITS)
        self.multi = self.lane_evicted.size > 1

    def _get_open(self, source: int, lane: int) -> int:
        return self._open[source] if source == OFFLINE or lane == 0 else self._open_lanes.get(lane, -1)

    def _set_open(self, source: int, lane: int, episode_id: int) -> None:
        if source == OFFLINE or lane == 0:
            self._open[source] = episode_id
        elif episode_id == -1:
            self._open_lanes.pop(lane, None)
        else:
            self._open_lanes[lane] = episode_id

    def lane0_state(self, rows: int) -> tuple | None:
        """For a compiled write of ``rows`` online rows of lane 0 that keeps the records itself: (the open episode's
        id and record row, -1 / -1 if none; the next id; the records held; the record arrays start, length,
        finished, source, with room for ``rows`` new records), or None when the rows need another step first (an
        offline episode still open, the online ids' base not fixed: :meth:`append` then). Afterwards
        :meth:`lane0_written` records what the write did."""
        if self._open[OFFLINE] != -1 or self._id_base < 0:
            return None
        open_id, rec = self._open[ONLINE], self._rec
        if self._num_records + rows > rec["start"].size:
            self._grow(self._num_records + rows)
            rec = self._rec
        return (open_id, -1 if open_id == -1 else self._row(open_id), self.next_id, self._num_records,
                rec["start"], rec["length"], rec["finished"], rec["source"])

    def lane0_written(self, new_records: int, open_id: int) -> None:
        """A compiled write (:meth:`lane0_state`) created ``new_records`` records and left ``open_id`` open (-1:
        none)."""
        self._num_records += new_records
        self.next_id += new_records
        self._open[ONLINE] = open_id

    # -- id <-> record row -----------------------------------------------------------------------------
    def start_table(self) -> tuple[int, int, np.ndarray]:
        """For a compiled read of episode starts: (id_base, shift, starts) -- episode id i's first position is
        ``starts[i if i < id_base else i - shift]`` (:meth:`start_of`)."""
        return self.id_base, self._shift, self._rec["start"]

    def _rows(self, ids: np.ndarray | int) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return np.where(ids < self.id_base, ids, ids - self._shift)

    def _row(self, episode_id: int) -> int:
        """:meth:`_rows` for one id, in plain Python (the per-write bookkeeping path)."""
        return episode_id if episode_id < self.id_base else episode_id - self._shift

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
    def append(self, source: int, start: int, episode_end: np.ndarray) -> np.ndarray:
        """Register ``n`` new rows of ``source`` at logical positions ``start .. start + n - 1``.

        ``episode_end[i]`` is true when row ``i`` ends its episode (terminated or truncated). Online rows belong
        to the lane in ``start``'s high bits (one stream: lane 0). Returns the episode id of every row (a row's
        step within its episode follows from its position and the episode's start: ``Storage.step_of``).
        """
        if source == OFFLINE and self.next_id > self.num_offline_episodes and not self.demo_capacity:
            raise ValueError("offline rows must all be added before the first online row")
        if source == ONLINE:
            self.close_offline()
        end = np.asarray(episode_end, dtype=bool).reshape(-1)
        n = end.size
        if n == 0:
            return np.zeros(0, np.int64)
        lane = int(start) >> LANE_BITS if source == ONLINE else 0
        open_id = self._get_open(source, lane)
        if not np.count_nonzero(end[:-1]):  # fast path: all rows in one episode (the open one, or a new one)
            if open_id == -1:
                open_id = self._new_record(source, start, n, bool(end[-1]))
            else:
                r = self._row(open_id)
                self._rec["length"][r] += n
                self._rec["finished"][r] = end[-1]
            self._set_open(source, lane, -1 if end[-1] else open_id)
            ids = np.empty(n, np.int64)
            ids.fill(open_id)  # (np.full: a Python function around the same two calls)
            return ids
        if n <= FEW_ROWS:  # a few rows (a vector env's step): plain Python beats the dozen NumPy calls below
            return self._append_segments(source, start, lane, open_id, end.tolist())
        seg_starts = np.concatenate(([0], np.flatnonzero(end[:-1]) + 1))
        seg_lengths = np.diff(seg_starts, append=n)
        seg_of_row = np.repeat(np.arange(seg_starts.size), seg_lengths)

        rec = self._rec
        new_segments = seg_starts
        new_lengths = seg_lengths
        if open_id != -1:  # the first segment continues an episode from an earlier call
            r = self._row(open_id)
            rec["length"][r] += seg_lengths[0]
            rec["finished"][r] = end[seg_lengths[0] - 1]
            new_segments, new_lengths = seg_starts[1:], seg_lengths[1:]
        first_new = self.next_id  # (with several lanes the open episode need not be the newest one)
        if new_segments.size:  # (a demonstration's offline episodes after online ones take reserved ids)
            first_new = self._new_records(source, start, new_segments, new_lengths,
                                          end[new_segments + new_lengths - 1])
        if open_id != -1:
            ids = np.where(seg_of_row == 0, open_id, first_new + seg_of_row - 1)
        else:
            ids = first_new + seg_of_row
        self._set_open(source, lane, -1 if end[-1] else int(ids[-1]))
        return ids.astype(np.int64)

    def append_lane0_row(self, position: int, end: bool) -> int:
        """:meth:`append` of one online row of lane 0 at ``position`` (an online row was written before, so the
        offline part is closed: ``is_open(OFFLINE) == -1``), in plain Python: its episode id."""
        open_id = self._open[ONLINE]
        if open_id == -1:
            open_id = self._new_record(ONLINE, position, 1, end)
        else:
            r = self._row(open_id)
            self._rec["length"][r] += 1
            self._rec["finished"][r] = end
        self._open[ONLINE] = -1 if end else open_id
        return open_id

    def _append_segments(self, source: int, start: int, lane: int, open_id: int, ends: list) -> np.ndarray:
        """:meth:`append`'s several-episodes branch in plain Python, for a few rows: the same records and ids."""
        rec, ids, first, current = self._rec, [], 0, open_id
        for i, e in enumerate(ends):
            if e or i == len(ends) - 1:  # row i closes a segment: rows first .. i
                k = i + 1 - first
                if current == -1:
                    current = self._new_record(source, start + first, k, bool(e))
                else:
                    r = self._row(current)
                    rec["length"][r] += k
                    rec["finished"][r] = e
                ids += [current] * k
                first = i + 1
                if e:
                    current = -1
        self._set_open(source, lane, current)
        return np.array(ids, dtype=np.int64)

    def _late_offline(self, k: int) -> int | None:
        """Offline episodes created after online ones (a demonstration segment): the record row of the first of
        ``k`` new ones (their ids are their rows, from the reserved range), else None."""
        if self._id_base < 0:
            return None
        first = self.num_offline_episodes
        if first + k > self._id_base:
            raise ValueError(f"the demonstration segment's {self.demo_capacity} reserved episode ids are used up")
        self.num_offline_episodes += k
        return first

    def _new_records(self, source: int, start: int, offsets, lengths, finished) -> int:
        """Append records for new episodes starting at ``start + offsets``; returns the first new id."""
        k = offsets.size
        late = self._late_offline(k) if source == OFFLINE else None
        if late is not None:
            sl = slice(late, late + k)
            for name, value in (("start", start + offsets), ("length", lengths), ("finished", finished),
                                ("source", source)):
                self._rec[name][sl] = value
            return late
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
        late = self._late_offline(1) if source == OFFLINE else None
        if late is not None:
            for name, value in (("start", start), ("length", length), ("finished", finished), ("source", source)):
                self._rec[name][late] = value
            return late
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

    def close_lane(self, lane: int) -> int:
        """End the open episode of an online lane where it stands (its stream stopped: a resumed run, a lost
        collector); returns its id, or -1 when the lane had none open."""
        open_id = self._get_open(ONLINE, lane)
        if open_id != -1:
            self._rec["finished"][self._row(open_id)] = True
            self._set_open(ONLINE, lane, -1)
        return open_id

    def close_offline(self) -> None:
        """An online row arrives: the offline episode still receiving rows (the dataset's last, or a demonstration's)
        can never grow, so it counts as finished. The first time, the online ids' base is fixed (after the ids
        reserved for a demonstration segment)."""
        open_id = self._open[OFFLINE]
        if open_id != -1:
            self._rec["finished"][self._rows(open_id)] = True
            self._open[OFFLINE] = -1
        if self._id_base < 0:
            if self.next_id == self.num_offline_episodes:  # no online id yet: reserve the demonstrations' ids
                base = self.num_offline_episodes + self.demo_capacity
                self._grow(base)
                sl = slice(self._num_records, base)
                for name, value in (("start", 0), ("length", 0), ("finished", True), ("source", OFFLINE)):
                    self._rec[name][sl] = value
                self._num_records = self.next_id = base
            self._id_base = self.next_id if self.next_id == self.num_offline_episodes + self.demo_capacity \
                else self.num_offline_episodes  # (a checkpoint from before the base was kept: no reservation)
        if self.first_live_online_id < self.id_base:
            self.first_live_online_id = self.id_base

    def evict_online_before(self, position: int) -> None:
        """Online rows at logical positions < ``position`` were overwritten."""
        if position <= self.lane_evicted[0]:
            return
        self.lane_evicted[0] = position
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

    def evict_lanes(self, bounds: dict[int, int]) -> None:
        """Several lanes: each lane's rows at positions below ``bounds[lane]`` were overwritten."""
        for lane, position in bounds.items():
            if position > self.lane_evicted[lane]:
                self.lane_evicted[lane] = position
        rec, hi = self._rec, self._num_records
        r = self._row(self.first_live_online_id)
        evicted = self.lane_evicted
        open_ids = set(self.open_online_ids().tolist())
        while r < hi:  # every id below first_live_online_id is dead; live ones may follow dead ones
            start = int(rec["start"][r])
            if start + int(rec["length"][r]) > evicted[start >> LANE_BITS] or self.first_live_online_id in open_ids:
                break  # (an open episode whose rows were all overwritten gets rows again: it stays)
            r += 1
            self.first_live_online_id += 1
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        off = self.id_base
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
        off = self.id_base
        lo_online = int(self._rows(self.first_live_online_id)) if self.next_id > off else off
        lo_online = max(lo_online, off)
        parts = []
        if source in (None, OFFLINE):
            parts.append(np.arange(0, self.num_offline_episodes))
        if source in (None, ONLINE):
            parts.append(np.arange(lo_online, self._num_records))
        rows = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        rec = self._rec
        start = rec["start"][rows].copy()
        length = rec["length"][rows].copy()
        src = rec["source"][rows]
        self._cut(start, length, src == ONLINE)
        ids = np.where(rows < off, rows, rows + self._shift).astype(np.int64)
        finished = rec["finished"][rows].copy()
        if self.multi:  # episodes of other lanes may have died after the oldest live one
            keep = length > 0
            if not keep.all():
                return EpisodeView(ids=ids[keep], source=src[keep].copy(), start=start[keep], length=length[keep],
                                   finished=finished[keep])
        return EpisodeView(ids=ids, source=src.copy(), start=start, length=length, finished=finished)

    def _cut(self, start: np.ndarray, length: np.ndarray, online: np.ndarray) -> None:
        """Move the start of online episodes past their lane's overwritten rows (in place)."""
        s = start[online]
        bound = self.lane_evicted[s >> LANE_BITS] if self.multi else self.lane_evicted[0]
        cut = np.maximum(s, bound)
        length[online] -= cut - s
        start[online] = cut

    def is_live(self, ids) -> np.ndarray:
        """Whether each episode id still has a stored row."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        live = (ids >= 0) & (ids < self.next_id) & ((ids < self.num_offline_episodes)
                                                    | (ids >= self.first_live_online_id))
        if live.any():
            rows = self._rows(ids[live])
            start, length = self._rec["start"][rows].copy(), self._rec["length"][rows].copy()
            self._cut(start, length, self._rec["source"][rows] == ONLINE)
            live[live] = length > 0
        return live

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
        self._cut(start, length, src == ONLINE)
        if self.multi and ids.size and (length <= 0).any():
            raise ValueError(f"episode ids {ids[length <= 0].tolist()[:8]} are not live (no stored row)")
        return EpisodeView(ids=ids, source=src, start=start, length=length, finished=rec["finished"][rows].copy())

    def open_online_ids(self) -> np.ndarray:
        """Ids of the online episodes still receiving rows (one per lane at most). With several streams one of
        them may have no stored row for a while (the other streams' rows overwrote all of it)."""
        ids = [self._open[ONLINE], *self._open_lanes.values()]
        return np.array([i for i in ids if i != -1], np.int64)

    def is_open(self, source: int, lane: int = 0) -> int:
        """Id of the episode of ``source`` (online: of ``lane``) still receiving rows, or -1."""
        return self._get_open(source, lane)

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        n = self._num_records
        state = {f"rec_{name}": arr[:n].copy() for name, arr in self._rec.items()}
        state.update(
            num_records=n, shift=self._shift, num_offline_episodes=self.num_offline_episodes, id_base=self._id_base,
            next_id=self.next_id, first_live_online_id=self.first_live_online_id,
            online_evicted_before=self.online_evicted_before,
            open_offline=self._open[OFFLINE], open_online=self._open[ONLINE],
            lane_evicted=self.lane_evicted.copy(),
            open_lanes=np.array(sorted(self._open_lanes.items()), np.int64).reshape(-1, 2),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`, checked: counters in range and consistent with each other, record arrays
        of ``num_records`` entries, open episodes among the known ids (a ValueError names the field). Whether the
        records agree with the stored rows is the storage's check."""
        owner = "storage state episodes"
        n = state_int(state, "num_records", owner)
        recs = {name: state_array(state, f"rec_{name}", owner, length=n, dtype=dt, low=0 if name != "source" else None)
                for name, dt in _FIELDS}
        if n and not np.isin(recs["source"], (OFFLINE, ONLINE)).all():
            raise ValueError(f"{owner} field 'rec_source': sources must be 0 (offline) or 1 (online)")
        shift = state_int(state, "shift", owner)
        next_id = state_int(state, "next_id", owner)
        num_offline_episodes = state_int(state, "num_offline_episodes", owner, high=min(next_id, n))
        id_base = state_int(state, "id_base", owner, low=-1, high=min(next_id, n)) if "id_base" in state else -1
        if id_base >= 0 and not num_offline_episodes <= id_base <= num_offline_episodes + self.demo_capacity:
            raise ValueError(f"{owner} field 'id_base': {id_base} is not within the {num_offline_episodes} offline "
                             f"episodes and the {self.demo_capacity} ids reserved for demonstrations")
        base = id_base if id_base >= 0 else num_offline_episodes
        first_live = state_int(state, "first_live_online_id", owner, high=next_id)
        if next_id - shift != n or shift > max(0, first_live - base):
            raise ValueError(f"{owner}: next_id {next_id}, shift {shift} and num_records {n} disagree")
        if n and ((recs["source"][:base] != OFFLINE).any() or (recs["source"][base:] != ONLINE).any()
                  or (recs["length"][num_offline_episodes:base] != 0).any()):
            raise ValueError(f"{owner} field 'rec_source': offline records must come first")
        if "lane_evicted" in state:
            lane_evicted = state_array(state, "lane_evicted", owner, dtype=np.int64, low=0)
        else:
            lane_evicted = np.array([state_int(state, "online_evicted_before", owner)], np.int64)
        if lane_evicted.size < 1 or ((lane_evicted >> LANE_BITS) != np.arange(lane_evicted.size)).any():
            raise ValueError(f"{owner} field 'lane_evicted': one bound per stream, each in its stream's positions")
        if "online_evicted_before" in state and "lane_evicted" in state:  # (the first stream's bound, twice)
            scalar = state_int(state, "online_evicted_before", owner)
            if scalar != int(lane_evicted[0]):
                raise ValueError(f"{owner} field 'online_evicted_before': {scalar} disagrees with the first stream's "
                                 f"bound in 'lane_evicted' ({int(lane_evicted[0])})")
        open_ids = (state_int(state, "open_offline", owner, low=-1, high=next_id - 1),
                    state_int(state, "open_online", owner, low=-1, high=next_id - 1))
        pairs = (state_array(state, "open_lanes", owner, dtype=np.int64, shape=(2,))
                 if "open_lanes" in state else np.zeros((0, 2), np.int64))
        if pairs.size and ((pairs[:, 0] < 1).any() or (pairs[:, 0] >= lane_evicted.size).any()
                           or (pairs[:, 1] < base).any() or (pairs[:, 1] >= next_id).any()):
            raise ValueError(f"{owner} field 'open_lanes': open episodes of unknown streams or ids")
        self._rec = {}
        for name, dt in _FIELDS:
            arr = np.zeros(max(64, n), dtype=dt)
            arr[:n] = recs[name]
            self._rec[name] = arr
        self._num_records = n
        self._shift = shift
        self.num_offline_episodes = num_offline_episodes
        self._id_base = id_base
        self.next_id = next_id
        self.first_live_online_id = first_live
        self.lane_evicted = lane_evicted.copy()
        self.multi = self.lane_evicted.size > 1
        self._open = {OFFLINE: open_ids[0], ONLINE: open_ids[1]}
        self._open_lanes = {int(a): int(b) for a, b in pairs}

    def start_of(self, ids) -> np.ndarray:
        """The logical position of each episode's first row, even if that row was since overwritten (ids of
        episodes with a stored row; unchecked, as :meth:`end_of`)."""
        return self._rec["start"].take(self._rows(ids))

    def end_of(self, ids) -> np.ndarray:
        """One past the logical position of each episode's last row (its termination or truncation, the dataset's
        end, or the newest row of an open episode) for ids of episodes with a stored row, e.g. the
        ``episode_id`` of stored slots (unchecked: the sampling path; ``get`` checks). Eviction of an episode's
        first rows does not move it."""
        rows = self._rows(ids)
        return self._rec["start"].take(rows) + self._rec["length"].take(rows)
