"""What a sampler may read of a storage: :class:`StorageView` (read-only columns, sizes, the ring's slot <-> position
arithmetic) and the read-only queries of its episode index."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from relive.replay.storage.episodes import EpisodeIndex
from relive.replay.storage.layout import read_only


class StorageView:
    """What a sampler may read of a :class:`Storage`: read-only column and bookkeeping arrays, sizes, the episode
    index's queries, and the slot <-> logical-position arithmetic of the ring in one place.

    Logical positions (``relive.replay.storage.episodes``): an offline row's position is its slot; an online row's is
    the number of online rows written before it. ``online_slot(t) = ring_base + t % online_capacity``, where
    ``ring_base == num_offline`` unless a demonstration segment keeps room between them (its empty slots are in
    neither ``slot_range(OFFLINE)`` nor ``slot_range(ONLINE)``)."""

    def __init__(self, storage):  # a Storage (not imported: storage.py imports this module)
        self._st = storage
        self.columns = {n: read_only(a) for n, a in storage.columns.items()}
        self.meta = ReadOnlyMeta(storage.meta)  # per-slot bookkeeping (relive.replay.storage.bookkeeping)
        self.specs = dict(storage.specs)
        self.extra_names = storage.extra_names
        self.obs_keys = storage.obs_keys  # None: flat observations; else the keys of dict observations
        self.obs_spec = storage.obs_spec
        self.capacity = storage.capacity
        self.device = storage.device  # backend "torch": the columns' torch device (None for the NumPy backends)
        self.episodes = EpisodeQueries(storage.episodes)

    # sizes (live: they change as rows are written)
    num_offline = property(lambda self: self._st.num_offline)
    num_online = property(lambda self: self._st.num_online)
    num_online_written = property(lambda self: self._st.num_online_written)
    online_capacity = property(lambda self: self._st.online_capacity)
    size = property(lambda self: self._st.size)  # one past the last stored slot
    num_rows = property(lambda self: self._st.num_rows)  # rows stored (== size unless has_gap)
    ring_base = property(lambda self: self._st.ring_base)
    has_gap = property(lambda self: self._st.has_gap)
    num_before_online = property(lambda self: self._st.num_before_online)  # demonstrations: [this, num_offline)

    def slot_range(self, source: int | None = None) -> tuple[int, int]:
        return self._st.slot_range(source)

    def source_of(self, slots) -> np.ndarray:
        """0 (offline) / 1 (online) per stored slot."""
        return self._st.source_of(slots)

    def episode_ids(self, slots) -> np.ndarray:
        """The episode id (int64) of each stored slot."""
        return self._st.episode_ids(slots)

    def step_of(self, slots) -> np.ndarray:
        return self._st.step_of(slots)

    def stream_of(self, slots) -> np.ndarray:
        return self._st.stream_of(slots)

    def read(self, name: str, slots, keys=None):
        """One logical column of stored rows (``obs`` / ``next_obs``: an array, or a dict for dict observations,
        ``keys``: only those); read observations through this, not ``columns``, which holds the physical columns."""
        return self._st.read(name, slots, keys)

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
        """Several streams: the per-lane map [lane, t % width] -> slot, width = ``lane_map.shape[1]`` (read-only);
        None with one."""
        qmap = self._st._qmap
        return None if qmap is None else read_only(qmap)

    def episode_slots(self, start, length, source) -> np.ndarray:
        return self._st.episode_slots(start, length, source)


class ReadOnlyMeta(Mapping):
    """The storage's bookkeeping mapping, every array read-only."""

    def __init__(self, meta: Mapping):
        self._meta = meta

    def __getitem__(self, name: str) -> np.ndarray:
        return read_only(self._meta[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)


class EpisodeQueries:
    """The read-only part of an :class:`~relive.replay.storage.episodes.EpisodeIndex`."""

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
