"""Columnar replay storage: a never-evicted offline segment followed by an online ring.

Layout over ``capacity`` slots::

    [0, num_offline)                      offline rows, written once by ``write(OFFLINE, ...)``, never evicted
    [num_offline, ring_base)              room left in the demonstration segment (empty; only with demo_capacity)
    [ring_base, capacity)                 online ring: online row number t lives in slot ring_base + t % C

Without ``demo_capacity`` (the default) ``ring_base == num_offline``: offline rows are a frozen prefix written
before any online row, and the stored slots are the contiguous range ``[0, size)``.

The demonstration segment (``demo_capacity=D``): offline rows may join at any time, also once online rows exist
(HIL-SERL's interventions kept as demonstrations beside the dataset). The ring's base is fixed by the first online
write at ``ring_base = num_offline + D`` (the rows written so far plus ``D`` rows of room), so offline rows written
later land in ``[num_offline, ring_base)`` and no online row ever moves: every slot keeps its row, its generation and
its sampler state (PER priorities, ...), and the episode index only gains offline episodes (their ids come from a
range reserved at the same moment, see :mod:`relive.replay.storage.episodes`). The price is a gap: while the segment is
not full, the slots ``[num_offline, ring_base)`` hold nothing, so the stored slots are two ranges,
``slot_range(OFFLINE)`` and ``slot_range(ONLINE)``, each contiguous; ``size`` is one past the last stored slot
(``num_rows`` counts the rows). A sampler restricted to one source (the parts of a mixture) sees one contiguous range as
before; a sampler over all rows would see the gap, so a buffer with a demonstration segment takes a mixture of uniform /
PER parts (:class:`~relive.replay.buffer.ReplayBuffer` checks). Why not grow the offline prefix into the ring instead:
every online slot is ``num_offline + t % C``, so growing the prefix would move every online row (and its priority) on
each intervention, O(capacity) per write. A full segment refuses further offline rows with a ValueError naming
``demo_capacity``.

Every slot carries bookkeeping next to the data columns (:mod:`relive.replay.storage.bookkeeping`; 9 bytes a slot
stored, the rest computed): ``episode_id``, ``generation`` (a stamp incremented each time the slot is written, which
lets samplers ignore updates meant for a row that has since been overwritten) and ``origin`` (where the row came from: 0
dataset, 1 intervention, 2 agent; :data:`relive.types.ORIGIN_NAMES`) are stored; ``source`` (0 offline / 1 online:
which part of a mixture samples the row), ``step_in_episode`` and ``stream`` (the id of the stream that wrote an
online row, 0 offline) follow from the slot, the episode index and the lanes (``source_of``, ``step_of``,
``stream_of``). ``meta[name]`` reads any of the six over all slots.

Streams: online rows may come from several interleaved streams (vector envs, collectors): ``write(ONLINE,
rows, stream=k)`` appends rows of stream ``k`` in that stream's time order, and a chunk of one stream may arrive
between chunks of another. Episodes, steps and everything computed per episode follow each stream on its own
(see :mod:`relive.replay.storage.episodes`: a stream is a *lane* of logical positions). One stream (the default, 0)
is the fast path: positions are the ring's clock and nothing per lane is kept. From the second stream on the
storage keeps each online row's logical position and a per-lane map position -> slot, as wide as the longest
run of one stream's stored rows (rounded up to a power of two; 8 bytes per entry). Writes are all-or-nothing:
the whole batch is validated before any byte moves.

Observations: flat (one ``obs`` column, and ``next_obs``) or a dict of keys, each its own column ``obs.<key>``
with its own shape and dtype; ``read("obs", slots)`` returns an array or a dict key -> array. With
``dedup_next_obs`` (the default for dict observations) there is no ``next_obs`` column: a row's next_obs is the
obs of the next row of its lane, and only rows without a stored successor keep an explicit copy (see
:mod:`relive.replay.storage.next_obs` for the rule and why it is exact); read it with ``read("next_obs", slots)``.
Samplers and agents read observations through ``read``, never ``columns["obs"]`` (the physical columns).

Backends: ``"ram"`` (NumPy arrays) or ``"memmap"`` (``.npy`` files in a directory, opened with ``np.memmap``): the
same API and the same rows; checkpoints of a memmap storage refer to its files instead of copying them. ``"torch"``
(``device=...``): every data column a tensor on a torch device, with the generation stamps mirrored there, so that
batches are drawn, gathered and fed back without leaving it (:mod:`relive.replay.samplers.device`); its checkpoints are
the RAM backend's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from relive.replay import _check_kernels
from relive.replay.checkpoint import DirectoryRef
from relive.replay.state_checks import state_array, state_field, state_int
from relive.replay.storage import consistency
from relive.replay.storage.bookkeeping import GEN_MAX, ID_MOD, Bookkeeping, BookkeepingQueries
from relive.replay.storage.episodes import LANE_BITS, LANE_MASK, EpisodeIndex
from relive.replay.storage.layout import (
    BOOKKEEPING,
    BOOKKEEPING_NAMES,
    CORE_COLUMNS,
    FINITE_CHECKED,
    ColumnSpec,
    as_numpy,
    column_spec,
    convert,
    obs_layout,
)
from relive.replay.storage.memmap_files import (
    MEMMAP_STATE,
    MemmapBackend,
    directory_of,
    open_column,
    reserve,
    write_json,
)
from relive.replay.storage.next_obs import NextObsDedup, NextObsStore, check_values
from relive.replay.storage.offline_hash import OfflineHashing
from relive.replay.storage.small_writes import SMALL_WRITE, SmallWrites
from relive.replay.storage.streams import MAX_STREAM, StreamLanes, check_stream
from relive.replay.storage.view import StorageView
from relive.types import (
    AGENT,
    DATASET,
    DATASET_ROWS,
    DEMONSTRATION_ROWS,
    OFFLINE,
    ONLINE,
    ORIGIN_NAMES,
    RESERVED_COLUMN_NAMES,
    SOURCE_NAMES,
)


def _check_backend(backend: str, device, directory) -> None:
    if backend not in ("ram", "memmap", "torch"):
        raise ValueError(f"backend must be 'ram', 'memmap' or 'torch', got {backend!r}")
    if device is not None and backend != "torch":
        raise ValueError(f"device={device!r} needs backend='torch' (the NumPy backends live in host memory)")
    if backend == "memmap" and directory is None:
        raise ValueError("backend='memmap' needs a directory (e.g. the run directory's 'replay' folder) to "
                         "create its column files in")


SMALL = 4096  # elements: below this a compiled loop beats NumPy's vectorized calls (their fixed cost dominates)


def all_finite(arr: np.ndarray) -> bool:
    """Whether every element is finite: for a small write one compiled pass, else NumPy (vectorized)."""
    if arr.size <= SMALL and arr.dtype.char in "fd" and _check_kernels.AVAILABLE:  # float32 / float64
        return bool(_check_kernels.all_finite(arr))  # (any shape and layout: it walks arr.flat)
    return bool(np.isfinite(arr).all())


class Storage(StreamLanes, NextObsDedup, MemmapBackend, OfflineHashing, BookkeepingQueries, SmallWrites):
    """The columns and their bookkeeping (this module), with the parts in their own modules: the column layout
    (:mod:`~relive.replay.storage.layout`), streams' lanes (:mod:`~relive.replay.storage.streams`), next-obs dedup
    (:mod:`~relive.replay.storage.next_obs`), the memmap backend's files (:mod:`~relive.replay.storage.memmap_files`),
    the offline segment's hash (:mod:`~relive.replay.storage.offline_hash`), the small one-stream writes
    (:mod:`~relive.replay.storage.small_writes`) and the sampler's read-only view
    (:mod:`~relive.replay.storage.view`)."""

    def __init__(self, capacity: int, obs_shape, action_shape, *, obs_dtype=np.float32,
                 action_dtype=np.float32, extra_columns: Mapping | None = None, dedup_next_obs: bool | None = None,
                 backend: str = "ram", directory: str | os.PathLike | None = None, device=None,
                 demo_capacity: int = 0, _open_existing: bool = False):
        if isinstance(capacity, bool | np.bool_) or not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer number of rows, got {capacity!r}")
        if (isinstance(demo_capacity, bool | np.bool_) or not isinstance(demo_capacity, int | np.integer)
                or not 0 <= demo_capacity < capacity):
            raise ValueError(f"demo_capacity must be an integer number of rows in [0, capacity) = [0, {capacity}), "
                             f"got {demo_capacity!r}")
        self.capacity = int(capacity)
        self.demo_capacity = int(demo_capacity)  # room for offline rows written after the first online row
        action_shape = (action_shape,) if isinstance(action_shape, int) else tuple(action_shape)
        self.obs_keys, self.obs_spec, obs_cols = obs_layout(obs_shape, obs_dtype)
        if backend == "torch":
            if dedup_next_obs:
                raise ValueError("backend='torch' stores next_obs explicitly (dedup_next_obs=False): a device batch "
                                 "gathers it in one read")
            dedup_next_obs = False
        # next_obs read from the next row of the episode (stored only where it is not): default for dict obs
        self.dedup_next_obs = bool(self.obs_keys is not None if dedup_next_obs is None else dedup_next_obs)
        self._obs_names = tuple(obs_cols)  # physical obs columns, in key order
        self._next_names = tuple("next_" + n for n in obs_cols)
        self.specs: dict[str, ColumnSpec] = {**obs_cols, "action": ColumnSpec(action_shape, np.dtype(action_dtype)),
                                             "reward": ColumnSpec((), np.dtype(np.float32))}
        if not self.dedup_next_obs:
            self.specs |= {"next_" + n: spec for n, spec in obs_cols.items()}
        self.specs |= {"terminated": ColumnSpec((), np.dtype(np.bool_)),
                       "truncated": ColumnSpec((), np.dtype(np.bool_))}
        self.extra_names = self._add_extra_columns(extra_columns or {})
        _check_backend(backend, device, directory)
        self._names = (*CORE_COLUMNS, *self.extra_names)  # the logical columns a write holds
        self._name_set = frozenset(self._names)
        obs_spec = self.obs_spec if self.obs_keys is None else None
        # (name, label, spec, finite): finite -- the write's values are checked for NaN / inf (a float column that
        # must hold finite numbers; dict observations, spec None, are checked key by key)
        checked = set(FINITE_CHECKED) | set(self.extra_names)
        specs = [obs_spec if name in ("obs", "next_obs") else self.specs[name] for name in self._names]
        self._plan = tuple((n, f"column {n!r}", spec, n in checked and (spec is None or spec.dtype.kind == "f"))
                           for n, spec in zip(self._names, specs, strict=True))
        self._fast_plan = self._flat_plan()
        self._row_bytes: tuple | None = None  # write_staged: every column as uint8 rows (made at its first call)
        self.backend = backend
        self.device = None
        self._gen_t = None  # backend "torch": the generation stamps on the device too (stale checks there)
        if backend == "torch":
            import torch  # (torch: `import relive.replay` does not load it)

            self.device = torch.device("cpu" if device is None else device)
            self._gen_t = torch.zeros(self.capacity, dtype=torch.int64, device=self.device)
        self.directory = None if directory is None else Path(directory)
        self._open_existing = bool(_open_existing)
        self._memmap_clean = _open_existing  # memmap: files unchanged since the save that wrote MEMMAP_STATE
        self._memmap_token = None  # the token of that save
        self.offline_dataset_ids: list[str | None] = []  # per add_offline call: the dataset id it named
        self._offline_hash = None  # (num_offline, sha256) cached
        self._lock = None  # memmap: a DirectoryLock
        self._created: list[Path] = []
        self.columns = self._allocate_columns()
        self._meta = {n: np.zeros(self.capacity, dtype=dt) for n, dt in BOOKKEEPING}  # stored per slot
        self.meta = Bookkeeping(self)  # those and the computed ones (relive.replay.storage.bookkeeping)
        self._legacy_meta: dict[str, np.ndarray] = {}  # a loaded checkpoint's stored copies of computed fields
        self._legacy_meta_lo = 0  # ... from this slot on (a referenced offline part's are not saved)
        self.num_offline = 0
        self.num_online_written = 0  # online rows ever written (the ring's logical clock)
        self.ring_base = self.demo_capacity  # first slot of the ring: num_offline + demo_capacity, fixed by the first
        # online write
        self.episodes = EpisodeIndex(self.demo_capacity)
        # streams: lane i holds the rows of stream lanes[i]; lane_written[i] = its rows ever written (its clock)
        self.lanes: list[int] = []
        self.lane_written: list[int] = []
        self._lane_of: dict[int, int] = {}
        self._pos = None  # several streams: logical position of every online slot
        self._qmap = None  # several streams: [lane, t % width] -> slot (_rebuild_lane_map)
        if self.dedup_next_obs:
            self._nx = NextObsStore({"next_" + n: s for n, s in obs_cols.items()}, self.capacity)

    def _add_extra_columns(self, extra_columns: Mapping) -> tuple[str, ...]:
        """Declare the optional columns (``mc_return``, behaviour-policy records, ...) after the built-in ones;
        returns their names."""
        for name, value in extra_columns.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extra column name {name!r} must be an identifier (letters, digits, _; e.g. "
                                 "'mc_return'): it names a checkpoint file and a Batch field")
            if name in CORE_COLUMNS or name in self.specs or name in BOOKKEEPING_NAMES:
                raise ValueError(f"extra column {name!r} clashes with a built-in column")
            if name in RESERVED_COLUMN_NAMES:
                raise ValueError(f"extra column {name!r} would be hidden: batch.{name} is a field of every Batch or "
                                 "its SampleInfo (discount, mask, info, extras, indices, is_weight, ...); pick "
                                 "another name")
            self.specs[name] = column_spec(value)
        return tuple(extra_columns)

    def _allocate_columns(self) -> dict[str, np.ndarray]:
        """Every column, allocated by the backend (memmap: in the directory, held by this buffer; a refused buffer
        leaves no column file behind)."""
        if self.backend != "memmap":
            return {n: self._allocate(n, s) for n, s in self.specs.items()}
        self._open_memmap_directory()
        try:
            return {n: self._allocate(n, s) for n, s in self.specs.items()}
        except BaseException:
            for path in self._created:
                path.unlink(missing_ok=True)
            self._give_up_new_directory()  # (the lock file and directories this buffer made go too)
            raise

    def _allocate(self, name: str, spec: ColumnSpec) -> Any:  # np.ndarray, np.memmap or TorchColumn
        if self.backend == "ram":
            return np.zeros((self.capacity, *spec.shape), dtype=spec.dtype)
        if self.backend == "torch":  # a tensor on the device behind a NumPy-style API
            from relive.replay.storage.torch_column import TorchColumn  # (torch: imported only for this backend)

            return TorchColumn((self.capacity, *spec.shape), spec.dtype, self.device)
        path = self.memmap_directory / f"{name}.npy"
        if self._open_existing:  # a checkpoint that refers to its memmap files
            return open_column(path, (self.capacity, *spec.shape), spec.dtype)
        if path.exists() or path.is_symlink():
            raise ValueError(f"{path} exists: a memmap buffer creates its column files in a fresh directory "
                             "(ReplayBuffer.load reopens one from its checkpoint)")
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=spec.dtype, shape=(self.capacity, *spec.shape))
        self._created.append(path)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            reserve(fd, path, arr.offset + arr.nbytes)
        finally:
            os.close(fd)
        return arr





    # -- sizes -----------------------------------------------------------------------------------------
    @property
    def generation_tensor(self):
        """backend "torch": the generation stamps on the device (a device buffer's stale checks); else None."""
        return self._gen_t

    @property
    def online_capacity(self) -> int:
        return self.capacity - self.ring_base

    @property
    def num_online(self) -> int:
        return min(self.num_online_written, self.online_capacity)

    @property
    def size(self) -> int:
        """One past the last stored slot (the rows' count, ``num_rows``, unless a demonstration segment has room
        left: its empty slots lie between the offline and the online rows)."""
        return self.ring_base + self.num_online if self.num_online_written else self.num_offline

    @property
    def num_rows(self) -> int:
        """Rows stored, offline and online."""
        return self.num_offline + self.num_online

    @property
    def num_before_online(self) -> int:
        """Offline rows written before the first online row (the dataset; all of them before it): slots
        ``[0, num_before_online)``. The demonstrations that joined later are ``[num_before_online, num_offline)``,
        each part contiguous (e.g. for a sampler restricted to one of them)."""
        return self.ring_base - self.demo_capacity

    @property
    def has_gap(self) -> bool:
        """Whether empty slots of the demonstration segment lie between the offline and the online rows."""
        return self.num_online_written > 0 and self.num_offline < self.ring_base

    def stored_mask(self) -> np.ndarray:
        """Per slot of ``[0, size)``: whether it holds a row."""
        mask = np.ones(self.size, bool)
        if self.has_gap:
            mask[self.num_offline : self.ring_base] = False
        return mask

    def slot_range(self, source: int | None = None) -> tuple[int, int]:
        """Stored slots of one source (or all) as a half-open range: each source's are contiguous (all of them
        too, unless a demonstration segment has room left: ``has_gap``). ``DATASET_ROWS`` / ``DEMONSTRATION_ROWS``:
        the offline rows written before / after the first online row."""
        if source is None:
            return 0, self.size
        if source == OFFLINE:
            return 0, self.num_offline
        if source == DATASET_ROWS:
            return 0, self.num_before_online
        if source == DEMONSTRATION_ROWS:
            return self.num_before_online, self.num_offline
        if source == ONLINE:
            return (self.ring_base, self.size) if self.num_online_written else (self.size, self.size)
        return 0, self.size

    def online_slot(self, positions: np.ndarray) -> np.ndarray:
        """Slot of online rows given their logical positions (see :mod:`relive.replay.storage.episodes`)."""
        if self._qmap is None:
            return self.ring_base + np.asarray(positions, dtype=np.int64) % max(self.online_capacity, 1)
        positions = np.asarray(positions, dtype=np.int64)
        return self._qmap[positions >> LANE_BITS, (positions & LANE_MASK) % self._qmap.shape[1]]

    def ring_slot(self, clock: np.ndarray) -> np.ndarray:
        """Slot of online rows given the ring's clock (online rows written before them, all streams)."""
        return self.ring_base + np.asarray(clock, dtype=np.int64) % max(self.online_capacity, 1)

    def ring_position_of(self, slots: np.ndarray) -> np.ndarray:
        """The ring's clock of stored online slots."""
        slots = np.asarray(slots, np.int64)
        k, cap = self.ring_base, max(self.online_capacity, 1)
        base = self.num_online_written - cap
        return base + ((slots - k) - base) % cap

    def position_of(self, slots) -> np.ndarray:
        """Logical positions of stored slots (offline: the slot; online: its lane's position)."""
        slots = np.asarray(slots, np.int64)
        k = self.ring_base
        if self._pos is not None:
            return np.where(slots < k, slots, self._pos[slots])
        cap = max(self.online_capacity, 1)
        base = self.num_online_written - cap
        return np.where(slots < k, slots, base + ((slots - k) - base) % cap)

    # -- streams ---------------------------------------------------------------------------------------





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
        """Check a batch of rows against the column specs; return it converted, without writing anything.

        The result is keyed by physical column: ``obs`` / ``next_obs`` for flat observations, ``obs.<key>`` /
        ``next_obs.<key>`` for dict ones (``next_obs`` columns are returned even when the storage does not keep
        them, to decide which rows must keep an explicit copy)."""
        if type(data) is not dict and not isinstance(data, Mapping):  # (a dict first: an ABC isinstance costs ~1 us)
            raise ValueError(f"rows must be a mapping of column name -> array, got {type(data).__name__}")
        names = self._names
        if data.keys() != self._name_set:
            missing = [n for n in names if n not in data]
            if missing:
                raise ValueError(f"missing column(s) {missing}; every write needs {list(names)}")
            unknown = [n for n in data if n not in names]
            raise ValueError(f"unknown column(s) {unknown}; declare extra columns with extra_columns=... "
                             f"(known: {list(names)})")
        fast = self._fast_plan
        if fast is not None and type(data) is dict:  # flat columns: each as stored and finite -> the rows as given
            count = self._rows_as_stored(data, fast)
            if count:
                return data, count
        n: int | None = None
        out = {}
        items: Sequence[tuple[str, str, np.ndarray, ColumnSpec]]
        for name, label, spec, finite in self._plan:  # flat columns (and flat obs) in a precomputed order
            value = data[name]
            if type(value) is np.ndarray and spec is not None:  # the common case first (an ABC isinstance costs more)
                shape = value.shape
                if (shape and shape[1:] == spec.shape and value.dtype == spec.dtype and (n is None or shape[0] == n)
                        and not (finite and not all_finite(value))):
                    n = shape[0]  # the column's own dtype and shape, finite: nothing to convert
                    out[name] = value
                    continue
                items = ((label, name, value, spec),)  # (the checks below name what is wrong)
            elif spec is None:  # dict observations: one array per key
                items = [(lbl, name + col[3:], arr, self.specs[col]) for lbl, col, arr in self._obs_parts(name, value)]
            else:
                if name in ("obs", "next_obs") and isinstance(value, Mapping):
                    self._obs_parts(name, value)  # raises: a dict for flat observations
                items = ((label, name, as_numpy(value), spec),)
            for label, col, arr, spec in items:
                if arr.ndim == 0 or arr.shape[1:] != spec.shape:
                    raise ValueError(f"{label}: expected shape (n, {', '.join(map(str, spec.shape))})"
                                     .replace(", )", ")") + f", got {arr.shape}")
                if n is None:
                    n = arr.shape[0]
                elif arr.shape[0] != n:
                    raise ValueError(f"{label} has {arr.shape[0]} rows but 'obs' has {n}")
                conv = convert(col, arr, spec.dtype, label)
                if finite and conv.dtype.kind == "f" and not all_finite(conv):
                    where = tuple(int(i) for i in np.argwhere(~np.isfinite(conv))[0])
                    elem = f" element {where[1:]}" if len(where) > 1 else ""
                    raise ValueError(f"{label} row {where[0]}{elem}: value {conv[where]} is not finite; "
                                     "obs, action, reward and next_obs must hold finite numbers")
                out[col] = conv
        return out, int(n or 0)  # (n is set: every write holds at least the obs column)

    def _flat_plan(self) -> tuple | None:
        """validate's fast path: (name, dtype, row shape, finite checked) per column, for flat observations with numba
        there (None otherwise, and with a float16 column to check: NumPy's check then)."""
        flat = [(n, spec, finite) for n, _, spec, finite in self._plan if spec is not None]
        if (not _check_kernels.AVAILABLE or self.obs_keys is not None
                or any(spec.dtype.char not in "fd" for _, spec, finite in flat if finite)):
            return None
        return tuple((n, spec.dtype, spec.shape, finite) for n, spec, finite in flat)

    @staticmethod
    def _rows_as_stored(data: dict, plan) -> int:
        """The rows' count when every column of ``data`` is an ndarray of its column's dtype and row shape, the
        same count of rows (at least one), and a checked float column holds finite values; else 0 (then
        :meth:`validate`'s checks convert what they can and name what is wrong)."""
        n = -1
        for name, dtype, tail, finite in plan:
            value = data[name]
            if type(value) is not np.ndarray or value.dtype is not dtype:
                return 0
            shape = value.shape
            if shape[1:] != tail or not shape or (n != -1 and shape[0] != n):
                return 0
            n = shape[0]
            if finite and not all_finite(value):
                return 0
        return max(n, 0)

    def specs_of_obs(self) -> list[ColumnSpec]:
        """Specs of the physical obs columns, in key order."""
        return list(self.obs_spec.values()) if self.obs_keys is not None else [self.obs_spec]

    def _obs_parts(self, name: str, value) -> list[tuple[str, str, np.ndarray]]:
        """(label for errors, physical obs column, array) of one observation column of a write."""
        if self.obs_keys is None:
            if isinstance(value, Mapping):
                raise ValueError(f"column {name!r}: got a dict (keys {list(value)}) but this buffer stores flat "
                                 f"observations of shape {self.obs_spec.shape}; build it with obs_shape={{key: "
                                 "shape, ...}} for dict observations")
            return [(f"column {name!r}", "obs", as_numpy(value))]
        if not isinstance(value, Mapping):
            raise ValueError(f"column {name!r}: this buffer stores dict observations with keys "
                             f"{list(self.obs_keys)}; got {type(value).__name__}, not a mapping of key -> array")
        missing = [k for k in self.obs_keys if k not in value]
        if missing:
            raise ValueError(f"column {name!r} is missing key(s) {missing} (keys: {list(self.obs_keys)})")
        unknown = [k for k in value if k not in self.obs_keys]
        if unknown:
            raise ValueError(f"column {name!r} has unknown key(s) {unknown} (keys: {list(self.obs_keys)})")
        return [(f"column {name!r} key {k!r}", f"obs.{k}", as_numpy(value[k])) for k in self.obs_keys]

    # -- writing ---------------------------------------------------------------------------------------
    def write(self, source: int, data: Mapping, stream: int = 0, origin=None) -> np.ndarray:
        """Append validated rows of one source (online: of one ``stream``, in its time order); returns their slots
        (-1 for rows of an online batch longer than the ring, which are overwritten by later rows of the same
        batch). ``origin`` tags the rows (:data:`relive.types.ORIGIN_NAMES`; one value or one per row; default:
        dataset for offline rows, agent for online ones)."""
        self._check_open()
        rows, n = self.validate(data)
        if source == ONLINE and origin is None and 0 < n <= SMALL_WRITE and self._pos is None:
            slots = self._write_one_lane(rows, n, stream)  # (None: a case for the general path below)
            if slots is not None:
                return slots
        if source not in (OFFLINE, ONLINE):
            raise ValueError(f"source must be 0 (offline) or 1 (online), got {source!r}")
        if source == OFFLINE and stream != 0:
            raise ValueError(f"offline rows have no stream (got stream={stream!r}); streams are for online rows")
        if origin is None:
            origin = DATASET if source == OFFLINE else AGENT
        elif np.ndim(origin):  # one per row
            origin = np.asarray(origin)
            if origin.shape != (n,) or origin.dtype.kind not in "iu" or not np.isin(origin, list(ORIGIN_NAMES)).all():
                raise ValueError(f"origin: expected {n} values in {ORIGIN_NAMES} (relive.types), got shape "
                                 f"{origin.shape} dtype {origin.dtype}")
            origin = origin.astype(np.int8)
        elif isinstance(origin, bool | np.bool_) or origin not in ORIGIN_NAMES:
            raise ValueError(f"origin must be one of {ORIGIN_NAMES} (relive.types), got {origin!r}")
        else:
            origin = int(origin)
        if n == 0:
            if source == ONLINE and stream not in self._lane_of:
                check_stream(stream)
            return np.zeros(0, np.int64)
        start, first, skip, lane, bounds = self._place(source, n, stream)
        kept = n - skip
        # the kept rows land in at most two runs of consecutive slots (two when the ring wraps): slice writes
        split = min(kept, self.capacity - first)

        end = rows["terminated"] | rows["truncated"]
        slots = np.arange(first, first + split, dtype=np.int64)
        if split < kept:
            slots = np.concatenate((slots, np.arange(self.ring_base, self.ring_base + kept - split)))
        if self._memmap_clean:  # (after every check: a refused write changes nothing)
            self._touch()
        if self.dedup_next_obs:
            explicit = self._dedup_before_write(-1 if source == OFFLINE else lane, rows, end, slots, skip)
        if self.episodes.next_id + n - self.episodes.first_live_online_id >= ID_MOD:
            raise ValueError(f"episode {self.episodes.first_live_online_id} is still stored and this write would "
                             f"take episode ids {ID_MOD} past it (ids are stored modulo {ID_MOD}): a stream whose "
                             "episode never ends keeps it stored; end it (a truncated row, or "
                             "ReplayBuffer.close_stream)")
        episode_id = self.episodes.append(source, start, end)
        for dst_lo, lo, hi in ((first, 0, split), (self.ring_base, split, kept)):
            if hi > lo:
                self._copy_rows(rows, slice(dst_lo, dst_lo + hi - lo), slice(skip + lo, skip + hi), episode_id, origin)
        if self.dedup_next_obs:
            self._nx.put(slots[explicit], {nn: rows[nn][skip:][explicit] for nn in self._next_names})
            self._nx.tails[-1 if source == OFFLINE else lane] = (int(slots[-1]),
                                                                 int(self._meta["generation"][slots[-1]]))
        if source == OFFLINE:
            self.num_offline += n
            if not self.num_online_written:  # the ring starts after the rows so far and the demonstrations' room
                self.ring_base = self.num_offline + self.demo_capacity
        else:
            self._advance_online(lane, n, start, skip, slots, bounds)
        if skip:
            full = np.full(n, -1, dtype=np.int64)
            full[skip:] = slots
            return full
        return slots

    def row_specs(self) -> dict[str, ColumnSpec]:
        """The spec of every column a write holds (flat observations: ``obs`` / ``next_obs`` share the obs spec)."""
        if self.obs_keys is not None:
            raise ValueError("row_specs: this storage holds dict observations (a column per key)")
        return {name: spec if spec is not None else self.specs[name] for name, _, spec, _ in self._plan}

    def finite_checked(self) -> tuple[str, ...]:
        """The columns of a write whose values must be finite (checked by every write)."""
        return tuple(name for name, _, _, finite in self._plan if finite)

    def _place(self, source: int, n: int, stream: int) -> tuple[int, int, int, int, dict[int, int] | None]:
        """Where a write of ``n`` rows lands, checked before anything changes: (the rows' first logical position, the
        first slot, rows skipped (an online batch longer than the ring: its earlier rows would be overwritten at
        once), the stream's lane, and with several streams the eviction bounds per lane (else None))."""
        if source == OFFLINE:
            if self.num_online_written and not self.demo_capacity:
                raise ValueError("offline rows must be added before any online row (the offline part is a "
                                 "frozen prefix of the storage); build the buffer with demo_capacity=... for a "
                                 "demonstration segment that grows during online training")
            if self.num_online_written and self.num_offline + n > self.ring_base:
                raise ValueError(f"the demonstration segment is full: demo_capacity={self.demo_capacity} rows of room "
                                 f"after the first online row, {self.ring_base - self.num_offline} left, {n} new "
                                 "rows; build the buffer with a larger demo_capacity")
            if self.num_offline + n > self.capacity:
                raise ValueError(f"capacity {self.capacity} is smaller than the offline data "
                                 f"({self.num_offline} stored + {n} new rows)")
            return self.num_offline, self.num_offline, 0, 0, None
        ring = self.online_capacity
        if ring <= 0:
            room = f" and demo_capacity={self.demo_capacity} reserves the rest" if self.demo_capacity else ""
            raise ValueError(f"no room for online rows: the offline data ({self.num_offline} rows){room} fills all "
                             f"{self.capacity} slots; build the buffer with a larger capacity")
        lane = self._lane(stream)
        clock = self.num_online_written
        start = (lane << LANE_BITS) + self.lane_written[lane]  # the rows' logical positions start here
        skip = max(0, n - ring)  # earlier rows of the batch would be overwritten at once
        first = self.ring_base + (clock + skip) % ring
        bounds = None
        if self._pos is not None:
            bounds = self._evicted_by(clock, n)  # read the old rows' positions before they are overwritten
            if skip:
                bounds[lane] = max(bounds.get(lane, 0), start + skip)
        return start, first, skip, lane, bounds

    def _copy_rows(self, rows: dict, dst: slice, src: slice, episode_id: np.ndarray, origin) -> None:
        """Rows ``src`` of a write into the consecutive slots ``dst``, with their bookkeeping (a new generation)."""
        meta = self._meta
        for name, col in self.columns.items():
            col[dst] = rows[name][src]
        ids = episode_id[src]
        meta["episode_id"][dst] = ids if self.episodes.next_id <= ID_MOD else ids % ID_MOD
        meta["origin"][dst] = origin if isinstance(origin, int) else origin[src]
        gen = meta["generation"][dst]
        if self.num_offline + self.num_online_written + dst.stop - dst.start >= GEN_MAX:  # a stamp may wrap: to 1
            gen[gen >= GEN_MAX] = 0
        gen += 1
        if self._gen_t is not None:
            self._gen_t[dst] += 1

    def _advance_online(self, lane: int, n: int, start: int, skip: int, slots: np.ndarray,
                        bounds: dict[int, int] | None) -> None:
        """After an online write: the clocks, the episodes whose rows were overwritten, and with several streams
        the per-lane position maps."""
        clock = self.num_online_written  # (before this write)
        self.num_online_written += n
        self.lane_written[lane] += n
        if self._pos is None:
            self.episodes.evict_online_before(self.num_online_written - self.online_capacity)
            return
        bounds = bounds or {}  # (several streams: _place gave the eviction bounds)
        positions = start + skip + np.arange(slots.size, dtype=np.int64)
        window = start + n - max(int(self.episodes.lane_evicted[lane]), bounds.get(lane, 0))
        if window > self._qmap.shape[1]:  # this lane's stored run outgrows the map's width
            self._rebuild_lane_map(window, clock)
        self._pos[slots] = positions
        self._qmap[lane, (positions & LANE_MASK) % self._qmap.shape[1]] = slots
        self.episodes.evict_lanes(bounds)


    def next_slot(self, slots: np.ndarray) -> np.ndarray:
        """Slot of the next row of the same lane (offline: the next slot; online: the lane's next position). Only
        meaningful for rows that have a stored successor (without an explicit next_obs)."""
        slots = np.asarray(slots, np.int64)
        if self._pos is None:
            nxt = slots + 1
            nxt[nxt >= self.capacity] = self.ring_base  # the ring wraps to its first slot
            return nxt
        k = self.ring_base
        return np.where(slots < k, slots + 1, self.online_slot(self._pos[slots] + 1))

    def close_stream(self, stream: int, terminated: bool = False) -> int:
        """End ``stream``'s open episode at its last written row (the stream stopped mid-episode: a resumed run's
        vector envs start new episodes). That row, if still stored, becomes the episode's end: ``truncated`` (or
        ``terminated`` with ``terminated=True``); its next_obs is the true next observation, so bootstrapping
        from it stays right. Returns the episode id, or -1 when the stream had no open episode."""
        lane = self._lane_of.get(stream)
        if lane is None:
            return -1
        self._check_open()
        self._touch()
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
        self._check_open()
        slots = self.check_slots(slots)
        self._touch()
        values = convert(name, as_numpy(values), self.specs[name].dtype)
        if values.shape != (slots.size, *self.specs[name].shape):
            raise ValueError(f"column {name!r}: expected shape {(slots.size, *self.specs[name].shape)}, "
                             f"got {values.shape}")
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            row = int(np.argwhere(~np.isfinite(values))[0][0])
            raise ValueError(f"column {name!r} row {row}: value is not finite (NaN/inf)")
        self.columns[name][slots] = values

    def check_slots(self, slots) -> np.ndarray:
        slots = as_numpy(slots)
        if slots.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {slots.dtype}")
        slots = slots.astype(np.int64, copy=False).reshape(-1)
        # one pass over the batch: seen as uint64, a negative slot is larger than any size
        if slots.size and slots.view(np.uint64).max() >= self.size:
            bad = (slots < 0) | (slots >= self.size)
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"index {int(slots[i])} at position {i} does not exist: stored slots are "
                             f"0..{self.size - 1}")
        if self.has_gap:
            bad = (slots >= self.num_offline) & (slots < self.ring_base)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"index {int(slots[i])} at position {i} does not exist: the demonstration "
                                 f"segment's slots {self.num_offline}..{self.ring_base - 1} are empty")
        return slots

    # -- reading ---------------------------------------------------------------------------------------
    def read(self, name: str, slots: np.ndarray, keys=None):
        """One logical column of stored rows: ``obs`` / ``next_obs`` are an array (flat observations) or a dict
        key -> array (dict observations; ``keys``: only those keys); ``next_obs`` is rebuilt from the next row where
        it is not stored."""
        slots = np.asarray(slots, np.int64)
        if name == "obs":
            parts = {on: self.columns[on].take(slots, axis=0) for on in self._obs_names}
        elif name == "next_obs":
            parts = self._read_next(slots, keys)
        else:
            return self.columns[name].take(slots, axis=0)
        if self.obs_keys is None:
            return next(iter(parts.values()))
        return {k: parts[f"{name}.{k}"] for k in (self.obs_keys if keys is None else keys)}


    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Every logical column (``obs``, ``action``, ..., ``next_obs``, extras) of stored rows."""
        return {name: self.read(name, slots) for name in (*CORE_COLUMNS, *self.extra_names)}

    def bytes_per_row(self) -> float:
        """Bytes the data columns take per stored row (bookkeeping and the episode index excluded); with
        ``dedup_next_obs``, the explicit next_obs copies are counted over the rows stored now."""
        fixed = sum(int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize for s in self.specs.values())
        if not self.dedup_next_obs:
            return float(fixed)
        per_copy = sum(int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize for s in self._nx.specs.values())
        return fixed + (self._nx.map_nbytes + per_copy * self._nx.num_used) / max(self.size, 1)

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        obs = self.obs_spec
        cfg = {
            "capacity": self.capacity,
            "action_shape": list(self.specs["action"].shape),
            "action_dtype": self.specs["action"].dtype.str,
            "extra_columns": {n: self.specs[n].to_json() for n in self.extra_names},
            "dedup_next_obs": self.dedup_next_obs,
        } | ({"demo_capacity": self.demo_capacity} if self.demo_capacity else {})
        if self.backend == "memmap":
            cfg |= {"backend": "memmap", "directory": DirectoryRef(self.memmap_directory)}
        elif self.backend == "torch":
            cfg |= {"backend": "torch", "device": str(self.device)}
        if self.obs_keys is None:
            cfg |= {"obs_shape": list(obs.shape), "obs_dtype": obs.dtype.str}
        else:
            cfg |= {"obs_keys": list(self.obs_keys), "obs_spaces": {k: obs[k].to_json() for k in self.obs_keys}}
        return cfg

    @classmethod
    def from_config(cls, cfg: Mapping, **kwargs) -> Storage:
        """``kwargs``: e.g. ``device=`` to load a torch-backend storage onto another device."""
        obs: Any
        if "obs_keys" in cfg:
            obs = {k: ColumnSpec.from_json(cfg["obs_spaces"][k]) for k in cfg["obs_keys"]}
            obs_dtype = np.float32
        else:
            obs, obs_dtype = tuple(cfg["obs_shape"]), np.dtype(cfg["obs_dtype"])
        return cls(cfg["capacity"], obs, tuple(cfg["action_shape"]), obs_dtype=obs_dtype,
                   action_dtype=np.dtype(cfg["action_dtype"]),
                   extra_columns={n: ColumnSpec.from_json(s) for n, s in cfg["extra_columns"].items()},
                   dedup_next_obs=bool(cfg.get("dedup_next_obs", False)), backend=cfg.get("backend", "ram"),
                   demo_capacity=cfg.get("demo_capacity", 0),
                   directory=directory_of(cfg.get("directory")), _open_existing=cfg.get("backend") == "memmap",
                   **({"device": cfg.get("device")} if cfg.get("backend") == "torch" else {}) | kwargs)




    def state_dict(self, offline: str = "copy") -> dict:
        """``offline="reference"``: the offline rows are not copied; the state names their dataset id and SHA-256
        (loading needs the same rows again: ``load_state_dict(state)`` after writing them). A memmap storage
        copies no rows at all: it refers to its column files, which must be unchanged when it is loaded."""
        size, k = self.size, self.num_before_online
        if offline not in ("copy", "reference"):
            raise ValueError(f"offline must be 'copy' or 'reference', got {offline!r}")
        state = {}
        if self.backend == "memmap":
            for arr in self.columns.values():
                arr.flush()
            token = self._memmap_token
            if not (self._memmap_clean and token):  # unchanged since the last save: the same token, so a checkpoint
                token = uuid.uuid4().hex  # kept from that save (a trainer's `.previous`) stays loadable
                write_json(self.memmap_directory / MEMMAP_STATE, {"token": token, "num_offline": k,
                                                            "num_online_written": self.num_online_written,
                                                            "directory": str(self.directory), "checkpoints": []})
            self._memmap_clean, self._memmap_token = True, token
            state["memmap"] = {"directory": DirectoryRef(self.memmap_directory), "token": token}
        elif offline == "reference":
            ids = set(self.offline_dataset_ids)
            if len(ids) != 1 or None in ids:
                raise ValueError("offline='reference' needs offline rows that came from one dataset named by "
                                 f"add_offline(rows, dataset_id=...); got dataset ids {self.offline_dataset_ids}")
            state["columns"] = {n: a[0 if n in self.extra_names else k : size] for n, a in self.columns.items()}
            state["offline_ref"] = {"dataset_id": next(iter(ids)), "sha256": self.offline_sha256(), "num_offline": k,
                                    # the offline rows' bookkeeping is rebuilt when they are written again: a hash
                                    # checks it instead of 29 bytes a row (29 MB at 1M rows)
                                    "meta_sha256": self._meta_sha256(k)}
        else:
            state["columns"] = {n: a[:size] for n, a in self.columns.items()}
        meta_lo = k if "offline_ref" in state else 0  # (a referenced offline part's bookkeeping: its hash only)
        return state | {
            "meta": {n: a[meta_lo:size] for n, a in self._meta.items()},
            "episodes": self.episodes.state_dict(),
            "num_offline": self.num_offline,
            "num_online_written": self.num_online_written,
            "ring_base": self.ring_base,
            "streams": {"lanes": np.asarray(self.lanes, np.int64),
                        "lane_written": np.asarray(self.lane_written, np.int64)}
            | ({"position": self._pos[:size].copy()} if self._pos is not None else {}),
        } | ({"next_obs_store": self._nx.state_dict(size)} if self.dedup_next_obs else {})



    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict`, checked like input: counters in range, per-row arrays of the stored size,
        data rows finite where a write requires it (flags 0 / 1), then every invariant the writers keep, together
        (:func:`relive.replay.storage.consistency.check_loaded`: stamps, lanes, the episode table against the rows, open
        episodes, flags, next_obs copies). A ValueError names the bad field."""
        owner = "storage state"
        if not isinstance(state, Mapping):
            raise ValueError(f"{owner} is not a mapping")
        if "offline_ref" in state:  # the offline rows were written again by the caller (checked against the hash)
            self.check_offline_reference(state["offline_ref"])
        streams = self._load_counters(state, owner)
        size = self.size
        if "memmap" in state:  # the rows are in the column files, if nothing changed them since the save
            self._check_memmap_files(state["memmap"])
        else:
            self._load_columns(state, owner, size)
        self._load_meta(state, owner, size)
        if self._gen_t is not None:
            self._gen_t.copy_(self._gen_t.new_tensor(self._meta["generation"]))
        if self.dedup_next_obs:
            self._nx.load_state_dict(state_field(state, "next_obs_store", owner), size)
        self.episodes.load_state_dict(state_field(state, "episodes", owner))
        self.episodes.ensure_lane(max(len(self.lanes) - 1, 0))
        if self.multi_stream:  # the per-lane maps, rebuilt from the online rows' positions
            self._load_lane_maps(streams or {}, owner, size)
        consistency.check_loaded(self)  # every invariant the writers keep, together (relive.replay.storage.consistency)

    def _load_counters(self, state: Mapping, owner: str) -> Mapping | None:
        """The row counters and the streams' lanes of a state; returns its ``streams`` field (None in a checkpoint
        from before streams)."""
        num_offline = state_int(state, "num_offline", owner, high=self.capacity)
        num_online_written = state_int(state, "num_online_written", owner, high=LANE_MASK)
        ring_base = num_offline + self.demo_capacity  # (before any online row; a checkpoint from before the field)
        if "ring_base" in state and num_online_written:
            ring_base = state_int(state, "ring_base", owner, low=num_offline, high=self.capacity)
            if ring_base - self.demo_capacity < 0:
                raise ValueError(f"{owner}: ring_base {ring_base} leaves less than demo_capacity {self.demo_capacity} "
                                 "rows before it")
        elif num_online_written and self.demo_capacity:
            raise ValueError(f"{owner}: online rows but no 'ring_base' (where the demonstration segment ends)")
        if num_online_written and ring_base >= self.capacity:
            raise ValueError(f"{owner}: {num_online_written} online rows written but the offline rows fill the "
                             "capacity")
        self.num_offline, self.num_online_written, self.ring_base = num_offline, num_online_written, ring_base
        streams = state.get("streams")
        if streams is None:  # a checkpoint from before streams: one stream (0) wrote every online row
            lanes, written = ([0], [self.num_online_written]) if self.num_online_written else ([], [])
        else:
            lanes = state_array(streams, "lanes", f"{owner} streams", dtype=np.int64, low=0, high=MAX_STREAM).tolist()
            written = state_array(streams, "lane_written", f"{owner} streams", length=len(lanes), dtype=np.int64,
                                  low=0, high=LANE_MASK).tolist()
            if len(set(lanes)) != len(lanes) or sum(written) != num_online_written:
                raise ValueError(f"{owner} streams: lanes {lanes[:8]} with rows written {written[:8]} do not add up to "
                                 f"the {num_online_written} online rows written (or a stream appears twice)")
            if len(lanes) > self.capacity:
                raise ValueError(f"{owner} streams: {len(lanes)} streams, more than the capacity {self.capacity}")
        self.lanes, self.lane_written = [int(x) for x in lanes], [int(x) for x in written]
        self._lane_of = {s: i for i, s in enumerate(self.lanes)}
        self._pos = self._qmap = None
        return streams


    def _load_columns(self, state: Mapping, owner: str, size: int) -> None:
        """The saved rows into the columns, checked like a write (shape, dtype, finite); a referenced offline part
        (``offline_ref``) was written again by the caller, so only the rows after it are copied."""
        lo = int(state["offline_ref"]["num_offline"]) if "offline_ref" in state else 0
        for name, arr in self.columns.items():
            first = 0 if name in self.extra_names else lo  # extra columns are always copied whole
            src = np.asarray(state_field(state_field(state, "columns", owner), name, f"{owner} columns"))
            if src.shape != (size - first, *arr.shape[1:]) or src.dtype != arr.dtype:
                raise ValueError(f"checkpoint column {name!r} has shape {src.shape} dtype {src.dtype}, "
                                 f"expected {(size - first, *arr.shape[1:])} {arr.dtype}")
            finite = name in self.extra_names or name.split(".")[0] in FINITE_CHECKED
            if finite or src.dtype.kind == "b":  # (finite where a write requires it; every flag 0 / 1)
                check_values(src, f"checkpoint column {name!r}", first=first)
            arr[first:size] = src

    def _load_meta(self, state: Mapping, owner: str, size: int) -> None:
        """The per-row bookkeeping. A referenced offline part's comes from writing its rows again (checked against
        the saved hash); checkpoints before 2026-11-26 hold it whole."""
        ref = state.get("offline_ref") or {}
        meta_lo = int(ref["num_offline"]) if "meta_sha256" in ref else 0
        if meta_lo > size:
            raise ValueError(f"{owner} field 'offline_ref': {meta_lo} referenced rows, more than the {size} stored")
        if meta_lo and self._meta_sha256(meta_lo) != ref["meta_sha256"]:
            raise ValueError(f"offline dataset {ref['dataset_id']!r}: its rows hash as saved, but the "
                             "episode bookkeeping rebuilt from them differs from the checkpoint's (rows written in "
                             "different add_offline calls?); load the checkpoint with the rows added as they were")
        meta = state_field(state, "meta", owner)
        where = f"{owner} meta"
        # stored fields; a checkpoint from before 2026-11-27 holds int64 ids and stamps: ids modulo 2**31, stamps
        # past 2**31 - 1 wrapped to [1, 2**31 - 1] (as a write would have wrapped them)
        ids = state_array(meta, "episode_id", where, length=size - meta_lo, dtype=np.int64, low=0)
        self._meta["episode_id"][meta_lo:size] = ids % ID_MOD
        gen = state_array(meta, "generation", where, length=size - meta_lo, dtype=np.int64, low=0)
        self._meta["generation"][meta_lo:size] = np.where(gen > GEN_MAX, (gen - 1) % GEN_MAX + 1, gen)
        slots = np.arange(meta_lo, size)
        if "origin" in meta:
            self._meta["origin"][meta_lo:size] = state_array(meta, "origin", where, length=size - meta_lo,
                                                             dtype=np.int8)
        else:  # a checkpoint from before origins: dataset rows offline, agent rows online
            self._meta["origin"][meta_lo:size] = np.where(self.source_of(slots) == OFFLINE, DATASET, AGENT)
        # the computed fields, stored by checkpoints from before 2026-11-27: checked against the rows once the
        # episode index is loaded (relive.replay.storage.consistency)
        self._legacy_meta = {name: state_array(meta, name, where, length=size - meta_lo, dtype=np.int64)
                             for name in ("source", "step_in_episode", "stream") if name in meta}
        self._legacy_meta_lo = meta_lo


__all__ = ["Storage", "StorageView", "ColumnSpec", "CORE_COLUMNS", "OFFLINE", "ONLINE", "SOURCE_NAMES",
           "MAX_STREAM", "as_numpy"]
