"""Columnar replay storage: a frozen offline prefix followed by an online ring.

Layout over ``capacity`` slots::

    [0, num_offline)                      offline rows, written once by ``write(OFFLINE, ...)``, never evicted
    [num_offline, capacity)               online ring: online row number t lives in slot num_offline + t % C

Stored slots are always the contiguous range ``[0, size)``. Every slot carries bookkeeping next to the
data columns: ``episode_id``, ``step_in_episode``, ``source`` (0 offline / 1 online) and ``generation``,
a stamp incremented each time the slot is written, which lets samplers ignore updates meant for a row that
has since been overwritten, and ``stream``, the id of the stream that wrote an online row (0 offline).

Streams: online rows may come from several interleaved streams (vector envs, collectors): ``write(ONLINE,
rows, stream=k)`` appends rows of stream ``k`` in that stream's time order, and a chunk of one stream may arrive
between chunks of another. Episodes, steps and everything computed per episode follow each stream on its own
(see :mod:`relive.replay.episodes`: a stream is a *lane* of logical positions). One stream (the default, 0)
is the fast path: positions are the ring's clock and nothing per lane is kept. From the second stream on the
storage keeps each online row's logical position and a per-lane map position -> slot (8 bytes per online slot
per stream). Writes are all-or-nothing: the whole batch is validated before any byte moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from relive.replay.episodes import LANE_BITS, LANE_MASK, EpisodeIndex
from relive.types import OFFLINE, ONLINE, SOURCE_NAMES

CORE_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
BOOKKEEPING = (("episode_id", np.int64), ("step_in_episode", np.int64), ("source", np.int8),
               ("generation", np.int64), ("stream", np.int32))
MAX_STREAM = 2**31 - 1
_FINITE_CHECKED = ("obs", "action", "reward", "next_obs")


@dataclass(frozen=True)
class ColumnSpec:
    shape: tuple[int, ...]
    dtype: np.dtype

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": np.dtype(self.dtype).str}

    @staticmethod
    def from_json(d: Mapping) -> ColumnSpec:
        return ColumnSpec(tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]))


def _spec(value) -> ColumnSpec:
    """Accept ``shape`` (float32) or ``(shape, dtype)`` or a ColumnSpec for an extra column."""
    if isinstance(value, ColumnSpec):
        return value
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[1], int):
        shape, dtype = value
    else:
        shape, dtype = value, np.float32
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return ColumnSpec(shape, np.dtype(dtype))


class Storage:
    def __init__(self, capacity: int, obs_shape, action_shape, *, obs_dtype=np.float32,
                 action_dtype=np.float32, extra_columns: Mapping | None = None):
        if isinstance(capacity, bool | np.bool_) or not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer number of rows, got {capacity!r}")
        self.capacity = int(capacity)
        obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        action_shape = (action_shape,) if isinstance(action_shape, int) else tuple(action_shape)
        self.specs: dict[str, ColumnSpec] = {
            "obs": ColumnSpec(obs_shape, np.dtype(obs_dtype)),
            "action": ColumnSpec(action_shape, np.dtype(action_dtype)),
            "reward": ColumnSpec((), np.dtype(np.float32)),
            "next_obs": ColumnSpec(obs_shape, np.dtype(obs_dtype)),
            "terminated": ColumnSpec((), np.dtype(np.bool_)),
            "truncated": ColumnSpec((), np.dtype(np.bool_)),
        }
        for name, value in (extra_columns or {}).items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extra column name {name!r} must be an identifier (letters, digits, _; e.g. "
                                 "'mc_return'): it names a checkpoint file and a Batch field")
            if name in self.specs or name in dict(BOOKKEEPING):
                raise ValueError(f"extra column {name!r} clashes with a built-in column")
            self.specs[name] = _spec(value)
        self.extra_names = tuple(n for n in self.specs if n not in CORE_COLUMNS)
        self.columns = {n: np.zeros((self.capacity, *s.shape), dtype=s.dtype) for n, s in self.specs.items()}
        self.meta = {n: np.zeros(self.capacity, dtype=dt) for n, dt in BOOKKEEPING}
        self.num_offline = 0
        self.num_online_written = 0  # online rows ever written (the ring's logical clock)
        self.episodes = EpisodeIndex()
        # streams: lane i holds the rows of stream lanes[i]; lane_written[i] = its rows ever written (its clock)
        self.lanes: list[int] = []
        self.lane_written: list[int] = []
        self._lane_of: dict[int, int] = {}
        self._pos: np.ndarray | None = None  # several streams: logical position of every online slot
        self._qmap: np.ndarray | None = None  # several streams: [lane, t % online_capacity] -> slot

    @property
    def multi_stream(self) -> bool:
        """Online rows of more than one stream have been written (positions are no longer the ring's clock)."""
        return len(self.lanes) > 1

    # -- sizes -----------------------------------------------------------------------------------------
    @property
    def online_capacity(self) -> int:
        return self.capacity - self.num_offline

    @property
    def num_online(self) -> int:
        return min(self.num_online_written, self.online_capacity)

    @property
    def size(self) -> int:
        return self.num_offline + self.num_online

    def slot_range(self, source: int | None = None) -> tuple[int, int]:
        """Stored slots of one source (or all) as a half-open range: they are always contiguous."""
        if source == OFFLINE:
            return 0, self.num_offline
        if source == ONLINE:
            return self.num_offline, self.size
        return 0, self.size

    def online_slot(self, positions: np.ndarray) -> np.ndarray:
        """Slot of online rows given their logical positions (see :mod:`relive.replay.episodes`)."""
        if self._qmap is None:
            return self.num_offline + np.asarray(positions, dtype=np.int64) % max(self.online_capacity, 1)
        positions = np.asarray(positions, dtype=np.int64)
        return self._qmap[positions >> LANE_BITS, (positions & LANE_MASK) % max(self.online_capacity, 1)]

    def ring_slot(self, clock: np.ndarray) -> np.ndarray:
        """Slot of online rows given the ring's clock (online rows written before them, all streams)."""
        return self.num_offline + np.asarray(clock, dtype=np.int64) % max(self.online_capacity, 1)

    def ring_position_of(self, slots: np.ndarray) -> np.ndarray:
        """The ring's clock of stored online slots."""
        slots = np.asarray(slots, np.int64)
        k, cap = self.num_offline, max(self.online_capacity, 1)
        base = self.num_online_written - cap
        return base + ((slots - k) - base) % cap

    def position_of(self, slots) -> np.ndarray:
        """Logical positions of stored slots (offline: the slot; online: its lane's position)."""
        slots = np.asarray(slots, np.int64)
        k = self.num_offline
        if self._pos is not None:
            return np.where(slots < k, slots, self._pos[slots])
        cap = max(self.online_capacity, 1)
        base = self.num_online_written - cap
        return np.where(slots < k, slots, base + ((slots - k) - base) % cap)

    # -- streams ---------------------------------------------------------------------------------------
    def _lane(self, stream) -> int:
        lane = self._lane_of.get(stream)
        if lane is not None:
            return lane
        stream = _check_stream(stream)
        lane = len(self.lanes)
        self.lanes.append(stream)
        self.lane_written.append(0)
        self._lane_of[stream] = lane
        self.episodes.ensure_lane(lane)
        if lane > 0:
            self._add_lane_map(lane)
        return lane

    def _add_lane_map(self, lane: int) -> None:
        cap = self.online_capacity
        if self._qmap is None:  # the second stream: lane 0's positions were the ring's clock until now
            self._pos = np.zeros(self.capacity, np.int64)
            online = np.arange(self.num_offline, self.size, dtype=np.int64)
            self._pos[online] = self.ring_position_of(online)
            self._qmap = np.zeros((max(2, lane + 1), cap), np.int64)
            self._qmap[0] = self.num_offline + np.arange(cap)
        elif self._qmap.shape[0] <= lane:
            grown = np.zeros((lane + 1, cap), np.int64)  # (exactly: 8 bytes per slot per stream, as documented)
            grown[: self._qmap.shape[0]] = self._qmap
            self._qmap = grown

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

    def episode_slots(self, start: np.ndarray, length: np.ndarray, source: np.ndarray) -> np.ndarray:
        """Slots of the rows of several episodes, concatenated in episode then time order."""
        start = np.asarray(start, np.int64)
        length = np.asarray(length, np.int64)
        total = int(length.sum())
        offsets = np.repeat(np.cumsum(length) - length, length)
        pos = np.repeat(start, length) + np.arange(total, dtype=np.int64) - offsets
        online = np.repeat(np.asarray(source) == ONLINE, length)
        pos[online] = self.online_slot(pos[online])
        return pos

    # -- validation ------------------------------------------------------------------------------------
    def validate(self, data: Mapping) -> tuple[dict[str, np.ndarray], int]:
        """Check a batch of rows against the column specs; return it converted, without writing anything."""
        if not isinstance(data, Mapping):
            raise ValueError(f"rows must be a mapping of column name -> array, got {type(data).__name__}")
        missing = [n for n in self.specs if n not in data]
        if missing:
            raise ValueError(f"missing column(s) {missing}; every write needs {list(self.specs)}")
        unknown = [n for n in data if n not in self.specs]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; declare extra columns with extra_columns=... "
                             f"(known: {list(self.specs)})")
        n = None
        out = {}
        for name, spec in self.specs.items():
            arr = _as_numpy(data[name])
            if arr.ndim == 0 or arr.shape[1:] != spec.shape:
                raise ValueError(f"column {name!r}: expected shape (n, {', '.join(map(str, spec.shape))})"
                                 .replace(", )", ")") + f", got {arr.shape}")
            if n is None:
                n = arr.shape[0]
            elif arr.shape[0] != n:
                raise ValueError(f"column {name!r} has {arr.shape[0]} rows but 'obs' has {n}")
            out[name] = _convert(name, arr, spec.dtype)
        for name in _FINITE_CHECKED + tuple(e for e in self.extra_names if self.specs[e].dtype.kind == "f"):
            arr = out[name]
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                where = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
                elem = f" element {where[1:]}" if len(where) > 1 else ""
                raise ValueError(f"column {name!r} row {where[0]}{elem}: value {arr[where]} is not finite; "
                                 "obs, action, reward and next_obs must hold finite numbers")
        return out, int(n)

    # -- writing ---------------------------------------------------------------------------------------
    def write(self, source: int, data: Mapping, stream: int = 0) -> np.ndarray:
        """Append validated rows of one source (online: of one ``stream``, in its time order); returns their slots
        (-1 for rows of an online batch longer than the ring, which are overwritten by later rows of the same
        batch)."""
        rows, n = self.validate(data)
        if source not in (OFFLINE, ONLINE):
            raise ValueError(f"source must be 0 (offline) or 1 (online), got {source!r}")
        if source == OFFLINE and stream != 0:
            raise ValueError(f"offline rows have no stream (got stream={stream!r}); streams are for online rows")
        if n == 0:
            if source == ONLINE and stream not in self._lane_of:
                _check_stream(stream)
            return np.zeros(0, np.int64)
        if source == OFFLINE:
            if self.num_online_written:
                raise ValueError("offline rows must be added before any online row (the offline part is a "
                                 "frozen prefix of the storage)")
            if self.num_offline + n > self.capacity:
                raise ValueError(f"capacity {self.capacity} is smaller than the offline data "
                                 f"({self.num_offline} stored + {n} new rows)")
            start = first = self.num_offline
            skip = lane = 0
        else:
            ring = self.online_capacity
            if ring <= 0:
                raise ValueError(f"no room for online rows: the offline data fills all {self.capacity} slots; "
                                 "build the buffer with a larger capacity")
            lane = self._lane(stream)
            clock = self.num_online_written
            start = (lane << LANE_BITS) + self.lane_written[lane]  # the rows' logical positions start here
            skip = max(0, n - ring)  # earlier rows of the batch would be overwritten at once
            first = self.num_offline + (clock + skip) % ring
            if self._pos is not None:
                bounds = self._evicted_by(clock, n)  # read the old rows' positions before they are overwritten
                if skip:
                    bounds[lane] = max(bounds.get(lane, 0), start + skip)
        kept = n - skip
        # the kept rows land in at most two runs of consecutive slots (two when the ring wraps): slice writes
        split = min(kept, self.capacity - first)

        end = rows["terminated"] | rows["truncated"]
        episode_id, step = self.episodes.append(source, start, end)
        columns, meta = self.columns, self.meta
        for dst_lo, lo, hi in ((first, 0, split), (self.num_offline, split, kept)):
            if hi <= lo:
                continue
            dst = slice(dst_lo, dst_lo + hi - lo)
            src = slice(skip + lo, skip + hi)
            for name, arr in rows.items():
                columns[name][dst] = arr[src]
            meta["episode_id"][dst] = episode_id[src]
            meta["step_in_episode"][dst] = step[src]
            meta["source"][dst] = source
            meta["generation"][dst] += 1
            if source == ONLINE:
                meta["stream"][dst] = stream
        slots = np.arange(first, first + split, dtype=np.int64)
        if split < kept:
            slots = np.concatenate((slots, np.arange(self.num_offline, self.num_offline + kept - split)))
        if source == OFFLINE:
            self.num_offline += n
        else:
            self.num_online_written += n
            self.lane_written[lane] += n
            if self._pos is None:
                self.episodes.evict_online_before(self.num_online_written - self.online_capacity)
            else:
                positions = start + skip + np.arange(kept, dtype=np.int64)
                self._pos[slots] = positions
                self._qmap[lane, (positions & LANE_MASK) % ring] = slots
                self.episodes.evict_lanes(bounds)
        if skip:
            full = np.full(n, -1, dtype=np.int64)
            full[skip:] = slots
            return full
        return slots

    def close_stream(self, stream: int, terminated: bool = False) -> int:
        """End ``stream``'s open episode at its last written row (the stream stopped mid-episode: a resumed run's
        vector envs start new episodes). That row, if still stored, becomes the episode's end: ``truncated`` (or
        ``terminated`` with ``terminated=True``); its next_obs is the true next observation, so bootstrapping
        from it stays right. Returns the episode id, or -1 when the stream had no open episode."""
        lane = self._lane_of.get(stream)
        if lane is None:
            return -1
        episode_id = self.episodes.close_lane(lane)
        if episode_id != -1 and self.episodes.is_live([episode_id])[0]:
            view = self.episodes.get([episode_id])
            last = self.online_slot(view.start + view.length - 1)
            self.columns["terminated"][last] = terminated
            self.columns["truncated"][last] = not terminated
        return episode_id

    def set_column(self, name: str, slots, values) -> None:
        """Overwrite an extra column for existing rows (e.g. Monte-Carlo returns once an episode ends).
        The rows stay the same transitions, so generations do not change."""
        if name not in self.extra_names:
            raise ValueError(f"{name!r} is not an extra column (extra columns: {list(self.extra_names)})")
        slots = self.check_slots(slots)
        values = _convert(name, _as_numpy(values), self.specs[name].dtype)
        if values.shape != (slots.size, *self.specs[name].shape):
            raise ValueError(f"column {name!r}: expected shape {(slots.size, *self.specs[name].shape)}, "
                             f"got {values.shape}")
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            row = int(np.argwhere(~np.isfinite(values))[0][0])
            raise ValueError(f"column {name!r} row {row}: value is not finite (NaN/inf)")
        self.columns[name][slots] = values

    def check_slots(self, slots) -> np.ndarray:
        slots = _as_numpy(slots)
        if slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {slots.dtype}")
        slots = slots.astype(np.int64, copy=False).reshape(-1)
        # one pass over the batch: seen as uint64, a negative slot is larger than any size
        if slots.size and slots.view(np.uint64).max() >= self.size:
            bad = (slots < 0) | (slots >= self.size)
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"index {int(slots[i])} at position {i} does not exist: stored slots are "
                             f"0..{self.size - 1}")
        return slots

    # -- reading ---------------------------------------------------------------------------------------
    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        return {name: arr.take(slots, axis=0) for name, arr in self.columns.items()}

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        return {
            "capacity": self.capacity,
            "obs_shape": list(self.specs["obs"].shape),
            "action_shape": list(self.specs["action"].shape),
            "obs_dtype": self.specs["obs"].dtype.str,
            "action_dtype": self.specs["action"].dtype.str,
            "extra_columns": {n: self.specs[n].to_json() for n in self.extra_names},
        }

    @classmethod
    def from_config(cls, cfg: Mapping) -> Storage:
        return cls(cfg["capacity"], tuple(cfg["obs_shape"]), tuple(cfg["action_shape"]),
                   obs_dtype=np.dtype(cfg["obs_dtype"]), action_dtype=np.dtype(cfg["action_dtype"]),
                   extra_columns={n: ColumnSpec.from_json(s) for n, s in cfg["extra_columns"].items()})

    def state_dict(self) -> dict:
        size = self.size
        return {
            "columns": {n: a[:size] for n, a in self.columns.items()},
            "meta": {n: a[:size] for n, a in self.meta.items()},
            "episodes": self.episodes.state_dict(),
            "num_offline": self.num_offline,
            "num_online_written": self.num_online_written,
            "streams": {"lanes": np.asarray(self.lanes, np.int64),
                        "lane_written": np.asarray(self.lane_written, np.int64)}
            | ({"position": self._pos[:size].copy()} if self._pos is not None else {}),
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.num_offline = int(state["num_offline"])
        self.num_online_written = int(state["num_online_written"])
        streams = state.get("streams")
        if streams is None:  # a checkpoint from before streams: one stream (0) wrote every online row
            lanes, written = ([0], [self.num_online_written]) if self.num_online_written else ([], [])
        else:
            lanes = np.asarray(streams["lanes"], np.int64).tolist()
            written = np.asarray(streams["lane_written"], np.int64).tolist()
        self.lanes, self.lane_written = [int(x) for x in lanes], [int(x) for x in written]
        self._lane_of = {s: i for i, s in enumerate(self.lanes)}
        self._pos = self._qmap = None
        size = self.size
        for name, arr in self.columns.items():
            src = np.asarray(state["columns"][name])
            if src.shape != (size, *arr.shape[1:]) or src.dtype != arr.dtype:
                raise ValueError(f"checkpoint column {name!r} has shape {src.shape} dtype {src.dtype}, "
                                 f"expected {(size, *arr.shape[1:])} {arr.dtype}")
            arr[:size] = src
        for name, arr in self.meta.items():
            if name in state["meta"]:
                arr[:size] = np.asarray(state["meta"][name], dtype=arr.dtype)
            else:  # "stream" in a checkpoint from before streams
                arr[:size] = 0
        self.episodes.load_state_dict(state["episodes"])
        if self.multi_stream:  # the per-lane maps, rebuilt from the online rows' positions
            self._add_lane_map(len(self.lanes) - 1)
            online = np.arange(self.num_offline, size, dtype=np.int64)
            pos = np.asarray(streams["position"], np.int64)[online]
            self._pos[online] = pos
            self._qmap[pos >> LANE_BITS, (pos & LANE_MASK) % self.online_capacity] = online


class StorageView:
    """What a sampler may read of a :class:`Storage`: read-only column and bookkeeping arrays, sizes, the episode
    index's queries, and the slot <-> logical-position arithmetic of the ring in one place.

    Logical positions (``relive.replay.episodes``): an offline row's position is its slot; an online row's is the
    number of online rows written before it. ``online_slot(t) = num_offline + t % online_capacity``."""

    def __init__(self, storage: Storage):
        self._st = storage
        self.columns = {n: _read_only(a) for n, a in storage.columns.items()}
        self.meta = {n: _read_only(a) for n, a in storage.meta.items()}
        self.specs = dict(storage.specs)
        self.extra_names = storage.extra_names
        self.capacity = storage.capacity
        self.episodes = _EpisodeQueries(storage.episodes)

    # sizes (live: they change as rows are written)
    num_offline = property(lambda self: self._st.num_offline)
    num_online = property(lambda self: self._st.num_online)
    num_online_written = property(lambda self: self._st.num_online_written)
    online_capacity = property(lambda self: self._st.online_capacity)
    size = property(lambda self: self._st.size)

    def slot_range(self, source: int | None = None) -> tuple[int, int]:
        return self._st.slot_range(source)

    def online_slot(self, positions) -> np.ndarray:
        """Slots of online rows given their logical positions."""
        return self._st.online_slot(positions)

    def slot_of(self, positions, online) -> np.ndarray:
        """Slots of rows given their logical positions and whether each is online."""
        positions = np.asarray(positions, np.int64)
        return np.where(online, self._st.online_slot(positions), positions)

    def position_of(self, slots) -> np.ndarray:
        """Logical positions of stored slots (offline: the slot; online: its lane's position, which with one
        stream is its row number on the ring's clock)."""
        return self._st.position_of(slots)

    def ring_slot(self, clock) -> np.ndarray:
        """Slots of online rows given the ring's clock (rows written before them, all streams)."""
        return self._st.ring_slot(clock)

    def ring_position_of(self, slots) -> np.ndarray:
        return self._st.ring_position_of(slots)

    multi_stream = property(lambda self: self._st.multi_stream)

    @property
    def lane_map(self) -> np.ndarray | None:
        """Several streams: the per-lane map [lane, t % online_capacity] -> slot (read-only); None with one."""
        qmap = self._st._qmap
        return None if qmap is None else _read_only(qmap)

    def episode_slots(self, start, length, source) -> np.ndarray:
        return self._st.episode_slots(start, length, source)


class _EpisodeQueries:
    """The read-only part of an :class:`~relive.replay.episodes.EpisodeIndex`."""

    def __init__(self, index: EpisodeIndex):
        self._index = index

    def live(self, source: int | None = None):
        return self._index.live(source)

    def get(self, ids):
        return self._index.get(ids)

    def is_open(self, source: int, lane: int = 0) -> int:
        return self._index.is_open(source, lane)

    def is_live(self, ids):
        return self._index.is_live(ids)

    def open_online_ids(self):
        return self._index.open_online_ids()

    num_offline_episodes = property(lambda self: self._index.num_offline_episodes)
    first_live_online_id = property(lambda self: self._index.first_live_online_id)
    online_evicted_before = property(lambda self: self._index.online_evicted_before)
    next_id = property(lambda self: self._index.next_id)

    def end_of(self, ids):
        return self._index.end_of(ids)


def _check_stream(stream) -> int:
    if isinstance(stream, bool | np.bool_) or not isinstance(stream, int | np.integer) or not 0 <= stream <= MAX_STREAM:
        raise ValueError(f"stream must be an integer in [0, {MAX_STREAM}], got {stream!r}")
    return int(stream)


def _read_only(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


def _as_numpy(x) -> np.ndarray:
    if type(x) is np.ndarray:
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _convert(name: str, arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Convert without silent loss: same-kind casts (float64 -> float32, int -> float) are fine; flags
    accept bool or 0/1 numbers; integers must fit the column's integer type and floats its float type (no
    wrap-around, no overflow to inf); anything else (float -> int, strings, objects) is an error."""
    if arr.dtype == dtype:
        return arr
    if dtype.kind == "b":
        if arr.dtype.kind in "iuf":
            bad = (arr != 0) & (arr != 1)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise ValueError(f"column {name!r} row {row}: expected a boolean flag (True/False or 0/1), "
                                 f"got {arr.reshape(arr.shape[0], -1)[row][0]!r}")
            return arr.astype(np.bool_)
    elif dtype.kind == "f" and arr.dtype.kind in "fiub":
        if arr.dtype.kind == "f" and arr.dtype.itemsize > dtype.itemsize and arr.size:
            limit = np.finfo(dtype).max
            bad = np.isfinite(arr) & (np.abs(arr) > limit)
            if bad.any():
                _out_of_range(name, arr, bad, f"{dtype} (largest magnitude {limit:.6g})")
        return arr.astype(dtype)
    elif dtype.kind in "iu" and arr.dtype.kind in "iub":
        if arr.size and not np.can_cast(arr.dtype, dtype, "safe"):
            info = np.iinfo(dtype)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                _out_of_range(name, arr, bad, f"{dtype} [{info.min}, {info.max}]")
        return arr.astype(dtype)
    raise ValueError(f"column {name!r}: expected dtype {dtype} (or a same-kind dtype), got {arr.dtype}")


def _out_of_range(name: str, arr: np.ndarray, bad: np.ndarray, target: str) -> None:
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    elem = f" element {where[1:]}" if len(where) > 1 else ""
    raise ValueError(f"column {name!r} row {where[0]}{elem}: value {arr[where].item()!r} does not fit the column's "
                     f"dtype {target}; refusing to wrap or overflow it")


__all__ = ["Storage", "StorageView", "ColumnSpec", "CORE_COLUMNS", "OFFLINE", "ONLINE", "SOURCE_NAMES"]
