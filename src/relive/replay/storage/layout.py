"""The column layout of a replay storage: column specs, the observation layout (flat or one column per key of a
dict), the core and bookkeeping columns, and input conversion without silent loss (shared by every backend)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

CORE_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
# the bookkeeping stored per slot (relive.replay.storage.bookkeeping: source, step_in_episode and stream are computed)
BOOKKEEPING = (("episode_id", np.int32), ("generation", np.int32), ("origin", np.int8))
BOOKKEEPING_NAMES = ("episode_id", "step_in_episode", "source", "generation", "stream", "origin")
FINITE_CHECKED = ("obs", "action", "reward", "next_obs")


@dataclass(frozen=True)
class ColumnSpec:
    shape: tuple[int, ...]
    dtype: np.dtype

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": np.dtype(self.dtype).str}

    @staticmethod
    def from_json(d: Mapping) -> ColumnSpec:
        return ColumnSpec(tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]))


def column_spec(value, default_dtype=np.float32) -> ColumnSpec:
    """Accept ``shape`` (``default_dtype``) or ``(shape, dtype)`` or a ColumnSpec for a column."""
    if isinstance(value, ColumnSpec):
        return value
    if isinstance(value, tuple) and len(value) == 2 and not isinstance(value[1], int):
        shape, dtype = value
    else:
        shape, dtype = value, default_dtype
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return ColumnSpec(shape, np.dtype(dtype))


def obs_layout(obs_shape, obs_dtype) -> tuple[tuple[str, ...] | None, ColumnSpec | dict[str, ColumnSpec],
                                                 dict[str, ColumnSpec]]:
    """Observations: one column per key ("obs" for a flat Box; "obs.<key>" for each key of a dict space).
    Returns (the dict keys or None, the observation spec(s), the physical obs columns)."""
    if not isinstance(obs_shape, Mapping):
        obs_spec = column_spec(obs_shape, obs_dtype)
        return None, obs_spec, {"obs": obs_spec}
    if not obs_shape:
        raise ValueError("dict observations need at least one key")
    for key in obs_shape:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"observation key {key!r} must be an identifier (letters, digits, _): it names "
                             "a column, a checkpoint file and a Batch entry")
    per_key = {k: column_spec(v, obs_dtype) for k, v in obs_shape.items()}
    return tuple(obs_shape), per_key, {f"obs.{k}": spec for k, spec in per_key.items()}


def concat_rows(parts: list):
    """Parts one after the other: arrays concatenated along their rows, mappings key by key, the first part's keys
    (rows of columns, and the dict observations inside them)."""
    if isinstance(parts[0], Mapping):
        return {k: concat_rows([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def read_only(arr: np.ndarray) -> np.ndarray:
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


def convert(name: str, arr: np.ndarray, dtype: np.dtype, label: str | None = None) -> np.ndarray:
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
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(f"{label} row {where[0]}: expected a boolean flag (True/False or 0/1), "
                                 f"got {arr[where].item()!r}")
            return arr.astype(np.bool_)
    elif dtype.kind == "f" and arr.dtype.kind in "fiub":
        if arr.dtype.kind == "f" and arr.dtype.itemsize > dtype.itemsize and arr.size:
            limit = np.finfo(dtype).max
            bad = np.isfinite(arr) & (np.abs(arr) > limit)
            if bad.any():
                out_of_range(label, arr, bad, f"{dtype} (largest magnitude {limit:.6g})")
        return arr.astype(dtype)
    elif dtype.kind in "iu" and arr.dtype.kind in "iub":
        if arr.size and not np.can_cast(arr.dtype, dtype, "safe"):
            info = np.iinfo(dtype)
            bad = (arr < info.min) | (arr > info.max)
            if bad.any():
                out_of_range(label, arr, bad, f"{dtype} [{info.min}, {info.max}]")
        return arr.astype(dtype)
    raise ValueError(f"{label}: expected dtype {dtype} (or a same-kind dtype), got {arr.dtype}")


def out_of_range(label: str, arr: np.ndarray, bad: np.ndarray, target: str) -> None:
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    elem = f" element {where[1:]}" if len(where) > 1 else ""
    raise ValueError(f"{label} row {where[0]}{elem}: value {arr[where].item()!r} does not fit the column's "
                     f"dtype {target}; refusing to wrap or overflow it")


class StorageFields:
    """What the parts of a :class:`~relive.replay.storage.Storage` (its streams, next-obs dedup, memmap files and
    offline hash, each a mixin in its own module) read and write of it: annotations only, for readers and the type
    checker; :class:`~relive.replay.storage.Storage` sets every one in its constructor."""

    capacity: int
    num_offline: int
    num_online_written: int
    demo_capacity: int
    ring_base: int
    backend: str
    directory: Path | None
    dedup_next_obs: bool
    obs_keys: tuple[str, ...] | None
    obs_spec: Any  # flat observations: a ColumnSpec; dict observations: key -> ColumnSpec
    specs: dict[str, ColumnSpec]
    extra_names: tuple[str, ...]
    columns: dict[str, Any]  # a column: np.ndarray (ram), np.memmap (memmap) or TorchColumn (torch)
    meta: Mapping[str, np.ndarray]  # relive.replay.storage.bookkeeping.Bookkeeping: stored and computed per-slot fields
    _meta: dict[str, np.ndarray]  # the stored ones (BOOKKEEPING)
    episodes: Any  # relive.replay.storage.episodes.EpisodeIndex
    lanes: list[int]
    lane_written: list[int]
    _lane_of: dict[int, int]
    _pos: Any  # several streams: np.ndarray, each online slot's logical position; None with one stream
    _qmap: Any  # several streams: np.ndarray [lane, t % width] -> slot; None with one stream
    _nx: Any  # relive.replay.storage.next_obs.NextObsStore (with dedup_next_obs)
    _obs_names: tuple[str, ...]
    _next_names: tuple[str, ...]
    _open_existing: bool
    _memmap_clean: bool
    _memmap_token: str | None
    _lock: Any  # relive.files.DirectoryLock (memmap) or None
    _made: list[Path]  # memmap, a new buffer: the directories and lock file it created (removed if it is refused)
    _offline_hash: tuple[int, str] | None
    _gen_t: Any  # backend "torch": the generation stamps on the device (a torch tensor); else None
    _row_bytes: tuple | None  # small_writes.py: every column as uint8 rows (made at the first staged write)

    if TYPE_CHECKING:  # Storage's own methods and sizes that the parts call
        @property
        def size(self) -> int: ...
        @property
        def num_online(self) -> int: ...
        @property
        def num_before_online(self) -> int: ...
        @property
        def online_capacity(self) -> int: ...
        def ring_slot(self, clock) -> np.ndarray: ...
        def ring_position_of(self, slots) -> np.ndarray: ...
        def online_slot(self, positions) -> np.ndarray: ...
        def next_slot(self, slots: np.ndarray) -> np.ndarray: ...
        def position_of(self, slots) -> np.ndarray: ...
        def stored_mask(self) -> np.ndarray: ...
        def source_of(self, slots) -> np.ndarray: ...
        def episode_ids(self, slots) -> np.ndarray: ...
        def step_of(self, slots) -> np.ndarray: ...
        def stream_of(self, slots) -> np.ndarray: ...
        def _check_open(self) -> None: ...
