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
storage keeps each online row's logical position and a per-lane map position -> slot, as wide as the longest
run of one stream's stored rows (rounded up to a power of two; 8 bytes per entry). Writes are all-or-nothing:
the whole batch is validated before any byte moves.

Observations: flat (one ``obs`` column, and ``next_obs``) or a dict of keys, each its own column ``obs.<key>``
with its own shape and dtype; ``read("obs", slots)`` returns an array or a dict key -> array. With
``dedup_next_obs`` (the default for dict observations) there is no ``next_obs`` column: a row's next_obs is the
obs of the next row of its lane, and only rows without a stored successor keep an explicit copy (see
``_dedup_before_write`` for the rule and why it is exact); read it with ``read("next_obs", slots)``. Samplers and
agents read observations through ``read``, never ``columns["obs"]`` (the physical columns).

Backends: ``"ram"`` (NumPy arrays) or ``"memmap"`` (``.npy`` files in a directory, opened with ``np.memmap``): the
same API and the same rows; checkpoints of a memmap storage refer to its files instead of copying them. ``"torch"``
(``device=...``): every data column a tensor on a torch device, with the generation stamps mirrored there, so that
batches are drawn, gathered and fed back without leaving it (:mod:`relive.replay.device`); its checkpoints are the
RAM backend's.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relive.files import DirectoryLock, write_text_atomic
from relive.replay._state import state_array, state_field, state_int
from relive.replay.checkpoint import DirectoryRef
from relive.replay.episodes import LANE_BITS, LANE_MASK, EpisodeIndex
from relive.types import OFFLINE, ONLINE, RESERVED_COLUMN_NAMES, SOURCE_NAMES

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


def _spec(value, default_dtype=np.float32) -> ColumnSpec:
    """Accept ``shape`` (``default_dtype``) or ``(shape, dtype)`` or a ColumnSpec for a column."""
    if isinstance(value, ColumnSpec):
        return value
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[1], int):
        shape, dtype = value
    else:
        shape, dtype = value, default_dtype
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return ColumnSpec(shape, np.dtype(dtype))


def _obs_layout(obs_shape, obs_dtype) -> tuple[tuple[str, ...] | None, ColumnSpec | dict[str, ColumnSpec],
                                                 dict[str, ColumnSpec]]:
    """Observations: one column per key ("obs" for a flat Box; "obs.<key>" for each key of a dict space).
    Returns (the dict keys or None, the observation spec(s), the physical obs columns)."""
    if not isinstance(obs_shape, Mapping):
        obs_spec = _spec(obs_shape, obs_dtype)
        return None, obs_spec, {"obs": obs_spec}
    if not obs_shape:
        raise ValueError("dict observations need at least one key")
    for key in obs_shape:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"observation key {key!r} must be an identifier (letters, digits, _): it names "
                             "a column, a checkpoint file and a Batch entry")
    obs_spec = {k: _spec(v, obs_dtype) for k, v in obs_shape.items()}
    return tuple(obs_shape), obs_spec, {f"obs.{k}": spec for k, spec in obs_spec.items()}


def _check_backend(backend: str, device, directory) -> None:
    if backend not in ("ram", "memmap", "torch"):
        raise ValueError(f"backend must be 'ram', 'memmap' or 'torch', got {backend!r}")
    if device is not None and backend != "torch":
        raise ValueError(f"device={device!r} needs backend='torch' (the NumPy backends live in host memory)")
    if backend == "memmap" and directory is None:
        raise ValueError("backend='memmap' needs a directory (e.g. the run directory's 'replay' folder) to "
                         "create its column files in")


class Storage:
    def __init__(self, capacity: int, obs_shape, action_shape, *, obs_dtype=np.float32,
                 action_dtype=np.float32, extra_columns: Mapping | None = None, dedup_next_obs: bool | None = None,
                 backend: str = "ram", directory: str | os.PathLike | None = None, device=None,
                 _open_existing: bool = False):
        if isinstance(capacity, bool | np.bool_) or not isinstance(capacity, int | np.integer) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer number of rows, got {capacity!r}")
        self.capacity = int(capacity)
        action_shape = (action_shape,) if isinstance(action_shape, int) else tuple(action_shape)
        self.obs_keys, self.obs_spec, obs_cols = _obs_layout(obs_shape, obs_dtype)
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
        obs_spec = self.obs_spec if self.obs_keys is None else None
        self._plan = tuple((name, f"column {name!r}", obs_spec if name in ("obs", "next_obs") else self.specs[name],
                            name in _FINITE_CHECKED or name in self.extra_names) for name in self._names)
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
        self._memmap_token: str | None = None  # the token of that save
        self.offline_dataset_ids: list[str | None] = []  # per add_offline call: the dataset id it named
        self._offline_hash: tuple[int, str] | None = None  # (num_offline, sha256) cached
        self._lock: DirectoryLock | None = None
        self._created: list[Path] = []
        self.columns = self._allocate_columns()
        self.meta = {n: np.zeros(self.capacity, dtype=dt) for n, dt in BOOKKEEPING}
        self.num_offline = 0
        self.num_online_written = 0  # online rows ever written (the ring's logical clock)
        self.episodes = EpisodeIndex()
        # streams: lane i holds the rows of stream lanes[i]; lane_written[i] = its rows ever written (its clock)
        self.lanes: list[int] = []
        self.lane_written: list[int] = []
        self._lane_of: dict[int, int] = {}
        self._pos: np.ndarray | None = None  # several streams: logical position of every online slot
        self._qmap: np.ndarray | None = None  # several streams: [lane, t % width] -> slot (_rebuild_lane_map)
        if self.dedup_next_obs:
            self._nx = _NextObsStore({"next_" + n: s for n, s in obs_cols.items()}, self.capacity)

    def _add_extra_columns(self, extra_columns: Mapping) -> tuple[str, ...]:
        """Declare the optional columns (``mc_return``, behaviour-policy records, ...) after the built-in ones;
        returns their names."""
        for name, value in extra_columns.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"extra column name {name!r} must be an identifier (letters, digits, _; e.g. "
                                 "'mc_return'): it names a checkpoint file and a Batch field")
            if name in CORE_COLUMNS or name in self.specs or name in dict(BOOKKEEPING):
                raise ValueError(f"extra column {name!r} clashes with a built-in column")
            if name in RESERVED_COLUMN_NAMES:
                raise ValueError(f"extra column {name!r} would be hidden: batch.{name} is a field of every Batch or "
                                 "its SampleInfo (discount, mask, info, extras, indices, is_weight, ...); pick "
                                 "another name")
            self.specs[name] = _spec(value)
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
            self._lock.release()
            raise

    def _allocate(self, name: str, spec: ColumnSpec) -> np.ndarray:
        if self.backend == "ram":
            return np.zeros((self.capacity, *spec.shape), dtype=spec.dtype)
        if self.backend == "torch":  # a tensor on the device behind a NumPy-style API
            from relive.replay.torch_column import TorchColumn  # (torch: imported only for this backend)

            return TorchColumn((self.capacity, *spec.shape), spec.dtype, self.device)
        path = self.directory / f"{name}.npy"
        if self._open_existing:  # a checkpoint that refers to its memmap files
            return _open_column(path, (self.capacity, *spec.shape), spec.dtype)
        if path.exists() or path.is_symlink():
            raise ValueError(f"{path} exists: a memmap buffer creates its column files in a fresh directory "
                             "(ReplayBuffer.load reopens one from its checkpoint)")
        arr = np.lib.format.open_memmap(path, mode="w+", dtype=spec.dtype, shape=(self.capacity, *spec.shape))
        self._created.append(path)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            _reserve(fd, path, arr.offset + arr.nbytes)
        finally:
            os.close(fd)
        return arr

    def _open_memmap_directory(self) -> None:
        """Memmap: take the directory (one buffer writes it at a time: a lock the kernel drops when this process
        ends) and, for a new buffer, check that the file system has room for every column file before creating
        them (each file is then allocated for real: writes through the map never meet a full disk)."""
        self.directory = Path(os.path.abspath(self.directory))
        if not self._open_existing:
            self.directory.mkdir(parents=True, exist_ok=True)
        elif not self.directory.is_dir():
            raise ValueError(f"memmap directory {self.directory} does not exist; the checkpoint refers to its column "
                             "files instead of holding its rows (copy it along with the checkpoint)")
        self._lock = DirectoryLock(self.directory, what="memmap directory")
        if self._open_existing:
            return
        need = sum(self.capacity * int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize + 4096
                   for s in self.specs.values())
        fs = os.statvfs(self.directory)
        free = fs.f_bavail * fs.f_frsize
        if need > free:
            self._lock.release()
            raise ValueError(f"memmap buffer of capacity {self.capacity} needs {need / 1e9:.3g} GB of column files in "
                             f"{self.directory}, but its file system has {free / 1e9:.3g} GB free; choose a smaller "
                             "capacity or another directory")

    def close(self) -> None:
        """Memmap: flush the column files and give the directory up (another buffer may then load it); the
        storage refuses writes afterwards. Nothing to do for the other backends."""
        if self._lock is not None and self._lock.held:
            for arr in self.columns.values():
                arr.flush()
            self._lock.release()

    def _check_open(self) -> None:
        if self._lock is not None and not self._lock.held:
            raise ValueError(f"this memmap buffer was closed (its directory {self.directory} was given up); load it "
                             "again from a checkpoint")

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
        return self._qmap[positions >> LANE_BITS, (positions & LANE_MASK) % self._qmap.shape[1]]

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
        """Room for ``lane`` in the per-lane map: the second stream builds it (lane 0's positions were the ring's
        clock until now); later streams double its rows when they run out (amortized: 200 streams cost 8 row
        copies of the map, not 200)."""
        if self._qmap is None:
            self._pos = np.zeros(self.capacity, np.int64)
            online = np.arange(self.num_offline, self.size, dtype=np.int64)
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
        if not isinstance(data, Mapping):
            raise ValueError(f"rows must be a mapping of column name -> array, got {type(data).__name__}")
        names = self._names
        if len(data) != len(names) or any(n not in data for n in names):
            missing = [n for n in names if n not in data]
            if missing:
                raise ValueError(f"missing column(s) {missing}; every write needs {list(names)}")
            unknown = [n for n in data if n not in names]
            raise ValueError(f"unknown column(s) {unknown}; declare extra columns with extra_columns=... "
                             f"(known: {list(names)})")
        n = None
        out = {}
        for name, label, spec, finite in self._plan:  # flat columns (and flat obs) in a precomputed order
            value = data[name]
            if type(value) is np.ndarray and spec is not None:  # the common case first (an ABC isinstance costs more)
                items = ((label, name, value, spec),)
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
                conv = _convert(col, arr, spec.dtype, label)
                if finite and conv.dtype.kind == "f" and not np.isfinite(conv).all():
                    where = tuple(int(i) for i in np.argwhere(~np.isfinite(conv))[0])
                    elem = f" element {where[1:]}" if len(where) > 1 else ""
                    raise ValueError(f"{label} row {where[0]}{elem}: value {conv[where]} is not finite; "
                                     "obs, action, reward and next_obs must hold finite numbers")
                out[col] = conv
        return out, int(n)

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
    def write(self, source: int, data: Mapping, stream: int = 0) -> np.ndarray:
        """Append validated rows of one source (online: of one ``stream``, in its time order); returns their slots
        (-1 for rows of an online batch longer than the ring, which are overwritten by later rows of the same
        batch)."""
        self._check_open()
        rows, n = self.validate(data)
        if source not in (OFFLINE, ONLINE):
            raise ValueError(f"source must be 0 (offline) or 1 (online), got {source!r}")
        if source == OFFLINE and stream != 0:
            raise ValueError(f"offline rows have no stream (got stream={stream!r}); streams are for online rows")
        if n == 0:
            if source == ONLINE and stream not in self._lane_of:
                _check_stream(stream)
            return np.zeros(0, np.int64)
        start, first, skip, lane, bounds = self._place(source, n, stream)
        kept = n - skip
        # the kept rows land in at most two runs of consecutive slots (two when the ring wraps): slice writes
        split = min(kept, self.capacity - first)

        end = rows["terminated"] | rows["truncated"]
        slots = np.arange(first, first + split, dtype=np.int64)
        if split < kept:
            slots = np.concatenate((slots, np.arange(self.num_offline, self.num_offline + kept - split)))
        if self._memmap_clean:  # (after every check: a refused write changes nothing)
            self._touch()
        if self.dedup_next_obs:
            explicit = self._dedup_before_write(-1 if source == OFFLINE else lane, rows, end, slots, skip)
        episode_id, step = self.episodes.append(source, start, end)
        for dst_lo, lo, hi in ((first, 0, split), (self.num_offline, split, kept)):
            if hi > lo:
                self._copy_rows(rows, slice(dst_lo, dst_lo + hi - lo), slice(skip + lo, skip + hi), episode_id, step,
                                source, stream)
        if self.dedup_next_obs:
            self._nx.put(slots[explicit], {nn: rows[nn][skip:][explicit] for nn in self._next_names})
            self._nx.tails[-1 if source == OFFLINE else lane] = (int(slots[-1]),
                                                                 int(self.meta["generation"][slots[-1]]))
        if source == OFFLINE:
            self.num_offline += n
        else:
            self._advance_online(lane, n, start, skip, slots, bounds)
        if skip:
            full = np.full(n, -1, dtype=np.int64)
            full[skip:] = slots
            return full
        return slots

    def _place(self, source: int, n: int, stream: int) -> tuple[int, int, int, int, dict[int, int] | None]:
        """Where a write of ``n`` rows lands, checked before anything changes: (the rows' first logical position, the
        first slot, rows skipped (an online batch longer than the ring: its earlier rows would be overwritten at
        once), the stream's lane, and with several streams the eviction bounds per lane (else None))."""
        if source == OFFLINE:
            if self.num_online_written:
                raise ValueError("offline rows must be added before any online row (the offline part is a "
                                 "frozen prefix of the storage)")
            if self.num_offline + n > self.capacity:
                raise ValueError(f"capacity {self.capacity} is smaller than the offline data "
                                 f"({self.num_offline} stored + {n} new rows)")
            return self.num_offline, self.num_offline, 0, 0, None
        ring = self.online_capacity
        if ring <= 0:
            raise ValueError(f"no room for online rows: the offline data fills all {self.capacity} slots; "
                             "build the buffer with a larger capacity")
        lane = self._lane(stream)
        clock = self.num_online_written
        start = (lane << LANE_BITS) + self.lane_written[lane]  # the rows' logical positions start here
        skip = max(0, n - ring)  # earlier rows of the batch would be overwritten at once
        first = self.num_offline + (clock + skip) % ring
        bounds = None
        if self._pos is not None:
            bounds = self._evicted_by(clock, n)  # read the old rows' positions before they are overwritten
            if skip:
                bounds[lane] = max(bounds.get(lane, 0), start + skip)
        return start, first, skip, lane, bounds

    def _copy_rows(self, rows: dict, dst: slice, src: slice, episode_id: np.ndarray, step: np.ndarray, source: int,
                   stream: int) -> None:
        """Rows ``src`` of a write into the consecutive slots ``dst``, with their bookkeeping (a new generation)."""
        meta = self.meta
        for name, col in self.columns.items():
            col[dst] = rows[name][src]
        meta["episode_id"][dst] = episode_id[src]
        meta["step_in_episode"][dst] = step[src]
        meta["source"][dst] = source
        meta["generation"][dst] += 1
        if self._gen_t is not None:
            self._gen_t[dst] += 1
        if source == ONLINE:
            meta["stream"][dst] = stream

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
        positions = start + skip + np.arange(slots.size, dtype=np.int64)
        window = start + n - max(int(self.episodes.lane_evicted[lane]), bounds.get(lane, 0))
        if window > self._qmap.shape[1]:  # this lane's stored run outgrows the map's width
            self._rebuild_lane_map(window, clock)
        self._pos[slots] = positions
        self._qmap[lane, (positions & LANE_MASK) % self._qmap.shape[1]] = slots
        self.episodes.evict_lanes(bounds)

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
            e = int(nx.entry[t_slot])
            if (e >= 0 and int(self.meta["generation"][t_slot]) == t_gen and not self.columns["terminated"][t_slot]
                    and not self.columns["truncated"][t_slot]
                    and all(_same_bits(nx.values[nn][e], rows[on][0]) for on, nn in zip(
                        self._obs_names, self._next_names, strict=True))):
                nx.release(np.array([t_slot]))
        n = end.size
        explicit = end.copy()
        explicit[-1] = True
        if n > 1:
            for on, nn in zip(self._obs_names, self._next_names, strict=True):
                explicit[:-1] |= _differs(rows[nn][:-1], rows[on][1:])
        return explicit[skip:]

    def next_slot(self, slots: np.ndarray) -> np.ndarray:
        """Slot of the next row of the same lane (offline: the next slot; online: the lane's next position). Only
        meaningful for rows that have a stored successor (without an explicit next_obs)."""
        slots = np.asarray(slots, np.int64)
        if self._pos is None:
            nxt = slots + 1
            nxt[nxt >= self.capacity] = self.num_offline  # the ring wraps to its first slot
            return nxt
        k = self.num_offline
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
        values = _convert(name, as_numpy(values), self.specs[name].dtype)
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

    def _read_next(self, slots: np.ndarray, keys=None) -> dict[str, np.ndarray]:
        names = [(on, nn) for on, nn in zip(self._obs_names, self._next_names, strict=True)
                 if keys is None or nn[len("next_obs."):] in keys]
        if not self.dedup_next_obs:
            return {nn: self.columns[nn].take(slots, axis=0) for _, nn in names}
        nx = self._nx
        entry = nx.entry.take(slots)
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
        return fixed + self._nx.entry.itemsize + per_copy * self._nx.num_used / max(self.size, 1)

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        obs = self.obs_spec
        cfg = {
            "capacity": self.capacity,
            "action_shape": list(self.specs["action"].shape),
            "action_dtype": self.specs["action"].dtype.str,
            "extra_columns": {n: self.specs[n].to_json() for n in self.extra_names},
            "dedup_next_obs": self.dedup_next_obs,
        } | ({"backend": "memmap", "directory": DirectoryRef(self.directory)} if self.backend == "memmap" else {}) | (
            {"backend": "torch", "device": str(self.device)} if self.backend == "torch" else {})
        if self.obs_keys is None:
            cfg |= {"obs_shape": list(obs.shape), "obs_dtype": obs.dtype.str}
        else:
            cfg |= {"obs_keys": list(self.obs_keys), "obs_spaces": {k: obs[k].to_json() for k in self.obs_keys}}
        return cfg

    @classmethod
    def from_config(cls, cfg: Mapping, **kwargs) -> Storage:
        """``kwargs``: e.g. ``device=`` to load a torch-backend storage onto another device."""
        if "obs_keys" in cfg:
            obs = {k: ColumnSpec.from_json(cfg["obs_spaces"][k]) for k in cfg["obs_keys"]}
            obs_dtype = np.float32
        else:
            obs, obs_dtype = tuple(cfg["obs_shape"]), np.dtype(cfg["obs_dtype"])
        return cls(cfg["capacity"], obs, tuple(cfg["action_shape"]), obs_dtype=obs_dtype,
                   action_dtype=np.dtype(cfg["action_dtype"]),
                   extra_columns={n: ColumnSpec.from_json(s) for n, s in cfg["extra_columns"].items()},
                   dedup_next_obs=bool(cfg.get("dedup_next_obs", False)), backend=cfg.get("backend", "ram"),
                   directory=_directory(cfg.get("directory")), _open_existing=cfg.get("backend") == "memmap",
                   **({"device": cfg.get("device")} if cfg.get("backend") == "torch" else {}) | kwargs)

    def claim_checkpoint(self, path: str | os.PathLike, *, loading: bool) -> None:
        """Memmap: record that the checkpoint at ``path`` refers to this directory's files (``loading=False``,
        after a save), or check, when it is loaded, that it is not a copy of another checkpoint that refers to the
        same files: a checkpoint copied without its column directory (which stayed where it was) would make this
        buffer write into the other checkpoint's rows, so it is refused, naming both."""
        if self.backend != "memmap":
            return
        marker_path = self.directory / MEMMAP_STATE
        marker = _read_json(marker_path)
        me = os.path.abspath(path)
        listed = [c for c in marker.get("checkpoints", []) if isinstance(c, str)]
        if loading and me not in listed:
            others = [c for c in listed if Path(c, "MANIFEST.json").is_file()]
            if others:
                raise ValueError(f"checkpoint {me} refers to memmap directory {self.directory}, whose rows belong to "
                                 f"checkpoint {others[0]} (saved there): {me} is a copy made without the column "
                                 f"files, and extending it would change {others[0]}'s rows. Copy the memmap "
                                 "directory along with the checkpoint (at the same place relative to it), or move "
                                 "the checkpoint instead of copying it")
        if me not in listed:
            _write_json(marker_path, marker | {"checkpoints": [*listed, me] if not loading else [me],
                                               "directory": str(self.directory)})

    def _touch(self) -> None:
        """Memmap: the first change after a save marks the files as changed, so the checkpoint that refers to them
        is refused from now on (a small file, written once per checkpoint interval)."""
        if self.backend == "memmap" and self._memmap_clean:
            _write_json(self.directory / MEMMAP_STATE, {"token": None, "changed_after_save": True})
            self._memmap_clean = False

    def offline_sha256(self) -> str:
        """SHA-256 of the offline segment: the offline rows of every column but the extra ones (which
        ``set_column`` may change later, so checkpoints always copy them), their explicit next_obs copies, the
        column names and shapes. Cached: these offline rows are frozen once written."""
        k = self.num_offline
        if self._offline_hash is not None and self._offline_hash[0] == k:
            return self._offline_hash[1]
        h = hashlib.sha256()
        for name in sorted(n for n in self.columns if n not in self.extra_names):
            arr = self.columns[name]
            h.update(json.dumps([name, list(arr.shape[1:]), arr.dtype.str, k]).encode())
            for lo in range(0, k, 65536):
                h.update(memoryview(np.ascontiguousarray(arr[lo : min(k, lo + 65536)])).cast("B"))
        if self.dedup_next_obs:
            slots = np.flatnonzero(self._nx.entry[:k] >= 0)
            h.update(slots.astype(np.int64).tobytes())
            for name in sorted(self._nx.values):
                h.update(np.ascontiguousarray(self._nx.values[name][self._nx.entry[slots]]).tobytes())
        digest = h.hexdigest()
        self._offline_hash = (k, digest)
        return digest

    def state_dict(self, offline: str = "copy") -> dict:
        """``offline="reference"``: the offline rows are not copied; the state names their dataset id and SHA-256
        (loading needs the same rows again: ``load_state_dict(state)`` after writing them). A memmap storage
        copies no rows at all: it refers to its column files, which must be unchanged when it is loaded."""
        size, k = self.size, self.num_offline
        if offline not in ("copy", "reference"):
            raise ValueError(f"offline must be 'copy' or 'reference', got {offline!r}")
        state = {}
        if self.backend == "memmap":
            for arr in self.columns.values():
                arr.flush()
            token = self._memmap_token
            if not (self._memmap_clean and token):  # unchanged since the last save: the same token, so a checkpoint
                token = uuid.uuid4().hex  # kept from that save (a trainer's `.previous`) stays loadable
                _write_json(self.directory / MEMMAP_STATE, {"token": token, "num_offline": k,
                                                            "num_online_written": self.num_online_written,
                                                            "directory": str(self.directory), "checkpoints": []})
            self._memmap_clean, self._memmap_token = True, token
            state["memmap"] = {"directory": DirectoryRef(self.directory), "token": token}
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
            "meta": {n: a[meta_lo:size] for n, a in self.meta.items()},
            "episodes": self.episodes.state_dict(),
            "num_offline": self.num_offline,
            "num_online_written": self.num_online_written,
            "streams": {"lanes": np.asarray(self.lanes, np.int64),
                        "lane_written": np.asarray(self.lane_written, np.int64)}
            | ({"position": self._pos[:size].copy()} if self._pos is not None else {}),
        } | ({"next_obs_store": self._nx.state_dict(size)} if self.dedup_next_obs else {})

    def _meta_sha256(self, k: int) -> str:
        h = hashlib.sha256()
        for name in sorted(self.meta):
            h.update(name.encode())
            h.update(np.ascontiguousarray(self.meta[name][:k]).tobytes())
        return h.hexdigest()

    def check_offline_reference(self, ref: Mapping) -> None:
        """The offline rows written into this storage are the ones a checkpoint refers to (same count, same hash)."""
        dataset = ref["dataset_id"]
        if self.num_offline != int(ref["num_offline"]):
            raise ValueError(f"offline dataset {dataset!r} changed since the checkpoint was saved: it has "
                             f"{self.num_offline} rows, the checkpoint's had {int(ref['num_offline'])}")
        digest = self.offline_sha256()
        if digest != ref["sha256"]:
            raise ValueError(f"offline dataset {dataset!r} changed since the checkpoint was saved: its rows hash to "
                             f"sha256 {digest[:16]}..., the checkpoint's to {str(ref['sha256'])[:16]}...; load the "
                             "same rows (same dataset version, same gamma for mc_return) or a checkpoint that "
                             "copies them")

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict`, checked like input: counters in range, per-row arrays of the stored size,
        data rows finite where a write requires it, and the episode table consistent with the rows (every stored
        row in exactly one live episode, its id and step as recorded). A ValueError names the bad field."""
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
            self._gen_t.copy_(self._gen_t.new_tensor(self.meta["generation"]))
        if self.dedup_next_obs:
            self._nx.load_state_dict(state_field(state, "next_obs_store", owner), size)
        self.episodes.load_state_dict(state_field(state, "episodes", owner))
        self.episodes.ensure_lane(max(len(self.lanes) - 1, 0))
        if self.multi_stream:  # the per-lane maps, rebuilt from the online rows' positions
            self._load_lane_maps(streams, owner, size)
        self._check_rows_and_episodes()

    def _load_counters(self, state: Mapping, owner: str) -> Mapping | None:
        """The row counters and the streams' lanes of a state; returns its ``streams`` field (None in a checkpoint
        from before streams)."""
        num_offline = state_int(state, "num_offline", owner, high=self.capacity)
        num_online_written = state_int(state, "num_online_written", owner, high=LANE_MASK)
        if num_online_written and num_offline >= self.capacity:
            raise ValueError(f"{owner}: {num_online_written} online rows written but the offline rows fill the "
                             "capacity")
        self.num_offline, self.num_online_written = num_offline, num_online_written
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

    def _check_memmap_files(self, saved) -> None:
        """A state that refers to this buffer's memmap column files: they must be unchanged since its save (the token
        in MEMMAP_STATE); a copied or moved directory is adopted as this buffer's own."""
        if self.backend != "memmap":
            raise ValueError("storage state 'memmap': the checkpoint refers to memmap column files but its config "
                             f"says backend {self.backend!r}")
        marker = _read_json(self.directory / MEMMAP_STATE)
        token = saved.get("token") if isinstance(saved, Mapping) else None
        if not isinstance(token, str) or marker.get("token") != token:
            raise ValueError(f"memmap directory {self.directory} was changed after this checkpoint was saved "
                             "(rows written since, or by another run): the rows it refers to are gone. Resume "
                             "from the checkpoint saved last, or save with a RAM buffer to copy rows")
        self._memmap_token = token
        recorded = marker.get("directory")
        if isinstance(recorded, str) and recorded != str(self.directory):
            warnings.warn(f"memmap directory {self.directory} is a copy of {recorded} (or was moved from there): "
                          f"this buffer writes its own column files in {self.directory}, never {recorded}'s",
                          stacklevel=3)  # (the caller of load_state_dict)
            _write_json(self.directory / MEMMAP_STATE, marker | {"directory": str(self.directory),
                                                                  "checkpoints": []})

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
            finite = name in self.extra_names or name.split(".")[0] in _FINITE_CHECKED
            if finite and src.dtype.kind == "f" and not np.isfinite(src).all():
                row = int(np.argwhere(~np.isfinite(src.reshape(src.shape[0], -1)))[0][0])
                raise ValueError(f"checkpoint column {name!r} row {first + row}: value is not finite (a write would "
                                 "have refused it)")
            arr[first:size] = src

    def _load_meta(self, state: Mapping, owner: str, size: int) -> None:
        """The per-row bookkeeping. A referenced offline part's comes from writing its rows again (checked against
        the saved hash); checkpoints before 2026-11-26 hold it whole."""
        ref = state.get("offline_ref")
        meta_lo = int(ref["num_offline"]) if ref is not None and "meta_sha256" in ref else 0
        if meta_lo and self._meta_sha256(meta_lo) != ref["meta_sha256"]:
            raise ValueError(f"offline dataset {ref['dataset_id']!r}: its rows hash as saved, but the "
                             "episode bookkeeping rebuilt from them differs from the checkpoint's (rows written in "
                             "different add_offline calls?); load the checkpoint with the rows added as they were")
        meta = state_field(state, "meta", owner)
        for name, arr in self.meta.items():
            if name in meta:
                arr[meta_lo:size] = state_array(meta, name, f"{owner} meta", length=size - meta_lo, dtype=arr.dtype)
            elif name == "stream":  # a checkpoint from before streams
                arr[meta_lo:size] = 0
            else:
                state_field(meta, name, f"{owner} meta")  # raises, naming it

    def _load_lane_maps(self, streams: Mapping, owner: str, size: int) -> None:
        """Several streams: the online rows' logical positions (checked against their streams' clocks) and the
        per-lane maps rebuilt from them."""
        online = np.arange(self.num_offline, size, dtype=np.int64)
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

    def _check_rows_and_episodes(self) -> None:
        """A loaded state: bookkeeping per row agrees with the episode table (so a sampler never reads an episode
        that does not hold its rows)."""
        size, k = self.size, self.num_offline
        meta = self.meta
        if (meta["generation"][:size] < 1).any():
            raise ValueError("storage state meta field 'generation': a stored row has generation < 1")
        if (meta["source"][:k] != OFFLINE).any() or (meta["source"][k:size] != ONLINE).any():
            raise ValueError("storage state meta field 'source' disagrees with num_offline")
        try:
            view = self.episodes.live()
            if (view.length < 0).any():
                raise IndexError
            slots = self.episode_slots(view.start, view.length, view.source)
            bad = slots.size != size or (slots.size and (slots.min() < 0 or slots.max() >= size))
            if not bad:
                bad = (np.bincount(slots, minlength=size) != 1).any()
        except (IndexError, ValueError, OverflowError):
            bad = True
        if bad:
            raise ValueError(f"storage state field 'episodes': the live episodes do not cover the {size} stored rows "
                             "exactly once (episode table inconsistent with the rows)")
        ids = np.repeat(view.ids, view.length)
        if (meta["episode_id"][slots] != ids).any():
            raise ValueError("storage state meta field 'episode_id' disagrees with the episode table")
        step = meta["step_in_episode"][slots]
        first = np.cumsum(view.length) - view.length
        expect = np.repeat(step[first] if slots.size else step[:0], view.length) + np.arange(slots.size) - np.repeat(
            first, view.length)
        if slots.size and ((step != expect).any() or (step[first] < 0).any()):
            raise ValueError("storage state meta field 'step_in_episode' is not consecutive within its episodes")


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
        self.obs_keys = storage.obs_keys  # None: flat observations; else the keys of dict observations
        self.obs_spec = storage.obs_spec
        self.capacity = storage.capacity
        self.device = storage.device  # backend "torch": the columns' torch device (None for the NumPy backends)
        self.episodes = _EpisodeQueries(storage.episodes)

    # sizes (live: they change as rows are written)
    num_offline = property(lambda self: self._st.num_offline)
    num_online = property(lambda self: self._st.num_online)
    num_online_written = property(lambda self: self._st.num_online_written)
    online_capacity = property(lambda self: self._st.online_capacity)
    size = property(lambda self: self._st.size)

    def slot_range(self, source: int | None = None) -> tuple[int, int]:
        return self._st.slot_range(source)

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


class _NextObsStore:
    """The explicit next_obs copies of a storage with ``dedup_next_obs``: slot -> entry (-1: none; the next row
    supplies it), the copies in arrays that grow on demand, a free list of released entries, and per lane the
    last row written (its *tail*: slot and generation; key -1 = offline)."""

    def __init__(self, specs: Mapping[str, ColumnSpec], capacity: int):
        self.specs = dict(specs)
        self.entry = np.full(capacity, -1, np.int64)
        self.values = {n: np.zeros((0, *s.shape), s.dtype) for n, s in self.specs.items()}
        self._free = np.zeros(0, np.int64)
        self._num_free = 0
        self.tails: dict[int, tuple[int, int]] = {}

    @property
    def num_used(self) -> int:
        return self._free.size - self._num_free

    def release(self, slots: np.ndarray) -> None:
        old = self.entry[slots]
        old = old[old >= 0]
        if old.size:
            self._free[self._num_free : self._num_free + old.size] = old
            self._num_free += old.size
            self.entry[slots] = -1

    def put(self, slots: np.ndarray, values: Mapping[str, np.ndarray]) -> None:
        k = slots.size
        if k == 0:
            return
        if self._num_free < k:  # grow: double, at least k more entries
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
        idx = self._free[self._num_free - k : self._num_free].copy()
        self._num_free -= k
        self.entry[slots] = idx
        for n, v in values.items():
            self.values[n][idx] = v

    def state_dict(self, size: int) -> dict:
        slots = np.flatnonzero(self.entry[:size] >= 0)
        e = self.entry[slots]
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
        self.entry[:] = -1
        self.values = {n: np.zeros((0, *s.shape), s.dtype) for n, s in self.specs.items()}
        self._free, self._num_free = np.zeros(0, np.int64), 0
        values = {}
        stored = state_field(state, "values", owner)
        for n, spec in self.specs.items():
            v = np.asarray(state_field(stored, n, f"{owner} values"))
            if v.shape != (slots.size, *spec.shape) or v.dtype != spec.dtype:
                raise ValueError(f"checkpoint next_obs copies {n!r} have shape {v.shape} dtype {v.dtype}, expected "
                                 f"{(slots.size, *spec.shape)} {spec.dtype}")
            values[n] = v
        self.put(slots, values)
        self.tails = {int(k): (int(s), int(g)) for k, s, g in tails}


def _as_bytes(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(a.shape[0] if a.ndim else 1, -1).view(np.uint8)


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: whether ``a[i]`` and ``b[i]`` differ in any bit (so -0.0 vs 0.0 differ: reconstruction is exact)."""
    if a.shape[0] == 0:
        return np.zeros(0, bool)
    return (_as_bytes(a) != _as_bytes(b)).any(axis=1)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((_as_bytes(a[None]) == _as_bytes(b[None])).all())


MEMMAP_STATE = "relive_memmap.json"  # in a memmap directory: the token of the checkpoint its files match


def _write_json(path: Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(obj))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _directory(value) -> Path | None:
    """A directory from a storage config: a Path (a loaded checkpoint's reference), a DirectoryRef (a state_dict
    in memory) or a string (checkpoints before 2026-11-26: the absolute directory)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f"memmap directory {value!r} is not a path")
    return Path(os.fspath(value))


def _reserve(fd: int, path: Path, size: int) -> None:
    """Allocate the blocks of a column file for real (``posix_fallocate``): a sparse file on a full disk would
    end the process with SIGBUS at the first write through the map; this fails here, with an error."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: the free-space check stands
            return
        raise OSError(e.errno, f"cannot reserve {size / 1e9:.3g} GB for memmap column file {path} ({e.strerror}); "
                      "free space on its file system or choose a smaller capacity") from None


def _open_column(path: Path, shape: tuple, dtype: np.dtype) -> np.memmap:
    """Reopen a column file of a memmap checkpoint: a regular file in the directory (no symbolic link followed),
    of the shape and dtype the checkpoint's config declares, its blocks reserved."""
    def refuse(why: str):
        return ValueError(f"memmap column file {path} {why}; the checkpoint refers to it instead of holding its rows")

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise refuse(f"cannot be opened as a regular file ({e.strerror})") from None
    with os.fdopen(fd, "r+b") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refuse("is not a regular file")
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, fortran, got_dtype = read(f)
        except Exception as e:  # numpy's header parser: any failure means a malformed header
            raise refuse(f"is not a valid .npy file ({e})") from None
        if got_shape != shape or got_dtype != dtype or fortran:
            raise refuse(f"has shape {got_shape} dtype {got_dtype}, expected {shape} {dtype}")
        offset = f.tell()
        size = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if os.fstat(fd).st_size != size:
            raise refuse(f"has {os.fstat(fd).st_size} bytes, expected {size}")
        _reserve(fd, path, size)
        return np.memmap(f, dtype=dtype, mode="r+", offset=offset, shape=shape)


def _check_stream(stream) -> int:
    if isinstance(stream, bool | np.bool_) or not isinstance(stream, int | np.integer) or not 0 <= stream <= MAX_STREAM:
        raise ValueError(f"stream must be an integer in [0, {MAX_STREAM}], got {stream!r}")
    return int(stream)


def _read_only(arr: np.ndarray) -> np.ndarray:
    if not isinstance(arr, np.ndarray):  # a TorchColumn (backend "torch"): its host reads are copies
        return arr
    view = arr.view()
    view.flags.writeable = False
    return view


def as_numpy(x) -> np.ndarray:
    if type(x) is np.ndarray:
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _convert(name: str, arr: np.ndarray, dtype: np.dtype, label: str | None = None) -> np.ndarray:
    """Convert without silent loss: same-kind casts (float64 -> float32, int -> float) are fine; flags
    accept bool or 0/1 numbers; integers must fit the column's integer type and floats its float type (no
    wrap-around, no overflow to inf); anything else (float -> int, strings, objects) is an error."""
    if arr.dtype == dtype:
        return arr
    label = label or f"column {name!r}"
    if dtype.kind == "b":
        if arr.dtype.kind in "iuf":
            bad = (arr != 0) & (arr != 1)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise ValueError(f"{label} row {row}: expected a boolean flag (True/False or 0/1), "
                                 f"got {arr.reshape(arr.shape[0], -1)[row][0]!r}")
            return arr.astype(np.bool_)
    elif dtype.kind == "f" and arr.dtype.kind in "fiub":
        if arr.dtype.kind == "f" and arr.dtype.itemsize > dtype.itemsize and arr.size:
            limit = np.finfo(dtype).max
            bad = np.isfinite(arr) & (np.abs(arr) > limit)
            if bad.any():
                _out_of_range(label, arr, bad, f"{dtype} (largest magnitude {limit:.6g})")
        return arr.astype(dtype)
    elif dtype.kind in "iu" and arr.dtype.kind in "iub":
        if arr.size and not np.can_cast(arr.dtype, dtype, "safe"):
            info = np.iinfo(dtype)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                _out_of_range(label, arr, bad, f"{dtype} [{info.min}, {info.max}]")
        return arr.astype(dtype)
    raise ValueError(f"{label}: expected dtype {dtype} (or a same-kind dtype), got {arr.dtype}")


def _out_of_range(label: str, arr: np.ndarray, bad: np.ndarray, target: str) -> None:
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    elem = f" element {where[1:]}" if len(where) > 1 else ""
    raise ValueError(f"{label} row {where[0]}{elem}: value {arr[where].item()!r} does not fit the column's "
                     f"dtype {target}; refusing to wrap or overflow it")


__all__ = ["Storage", "StorageView", "ColumnSpec", "CORE_COLUMNS", "OFFLINE", "ONLINE", "SOURCE_NAMES"]
