"""Checks for the state a checkpoint hands to ``load_state_dict``: the same rules as the values it came from.

A checkpoint whose hashes match can still hold wrong contents (edited, or written by a bug): a NaN priority, an
array shorter than the stored rows, a negative counter. Every ``load_state_dict`` reads its fields through these
helpers, so a bad field is one ValueError naming it (the buffer adds the checkpoint's path) instead of a sampler
that misbehaves later.
"""

from __future__ import annotations

import math

import numpy as np

#: largest counter a checkpoint may hold (sample counts, clocks, serials): far beyond any run, far from int64 overflow
MAX_COUNTER = 2**53


def state_field(state, name: str, owner: str):
    """``state[name]`` of a loaded checkpoint, or a ValueError naming the missing field."""
    if not isinstance(state, dict) or name not in state:
        raise ValueError(f"{owner} has no field {name!r} (incomplete, or from another relive version)")
    return state[name]


def state_int(state, name: str, owner: str, low: int = 0, high: int = MAX_COUNTER) -> int:
    """An integer field of a loaded checkpoint within [low, high], else a ValueError naming it."""
    value = state_field(state, name, owner)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or not low <= value <= high:
        raise ValueError(f"{owner} field {name!r} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def state_float(state, name: str, owner: str, low: float | None = None, high: float | None = None,
                allow_nan: bool = False) -> float:
    """A finite number field of a loaded checkpoint within the bounds (NaN only with ``allow_nan``)."""
    value = state_field(state, name, owner)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    ok = not isinstance(value, bool | np.bool_) and isinstance(value, int | float | np.integer | np.floating)
    v = float(value) if ok else math.nan
    if ok and math.isnan(v):
        ok = allow_nan
    elif ok:
        ok = math.isfinite(v) and (low is None or v >= low) and (high is None or v <= high)
    if not ok:
        raise ValueError(f"{owner} field {name!r} must be a finite number in [{'-inf' if low is None else low}, "
                         f"{'inf' if high is None else high}], got {value!r}")
    return v


def state_array(state, name: str, owner: str, *, length: int | None = None, dtype=np.float64,
                shape: tuple = (), allow_nan: bool = False, low: float | None = None,
                high: float | None = None) -> np.ndarray:
    """A per-row (or per-leaf) array field of a loaded checkpoint, checked with the rules its values obey on
    input: ``length`` entries (e.g. one per stored row) of ``shape``, numbers that convert to ``dtype`` without
    loss, finite (NaN allowed with ``allow_nan``: "not scored yet"), within [low, high]. A ValueError names the
    field and the first bad entry."""
    arr = np.asarray(state_field(state, name, owner))
    dtype = np.dtype(dtype)
    if arr.size and (arr.dtype.kind not in "biuf" or (dtype.kind in "biu" and arr.dtype.kind == "f")):
        raise ValueError(f"{owner} field {name!r}: expected {dtype} numbers, got dtype {arr.dtype}")
    if arr.ndim != 1 + len(shape) or arr.shape[1:] != tuple(shape):
        raise ValueError(f"{owner} field {name!r}: expected shape (n{''.join(f', {d}' for d in shape)}), "
                         f"got {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{owner} field {name!r} has {arr.shape[0]} entries, expected {length}")
    if dtype.kind in "iu" and arr.size and arr.dtype.kind in "iu":
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise ValueError(f"{owner} field {name!r}: values beyond {dtype}")
    if arr.dtype.kind == "b" and arr.size and (arr.view(np.uint8) > 1).any():  # (a cast would keep the byte)
        i = int(np.argwhere(arr.reshape(arr.shape[0], -1).view(np.uint8) > 1)[0][0])
        raise ValueError(f"{owner} field {name!r} entry {i}: a boolean holding a byte other than 0 / 1")
    out = arr.astype(dtype)
    flat = out.reshape(out.shape[0], math.prod(out.shape[1:]))
    bad = np.zeros(flat.shape, bool)
    if dtype.kind == "f":
        bad |= np.isinf(flat) if allow_nan else ~np.isfinite(flat)
    with np.errstate(invalid="ignore"):
        if low is not None:
            bad |= flat < low
        if high is not None:
            bad |= flat > high
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        allowed = ("finite" + (" or NaN" if allow_nan else "") if dtype.kind == "f" else str(dtype)) + (
            f", in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            if low is not None or high is not None else "")
        raise ValueError(f"{owner} field {name!r} entry {i}: value {flat[i, j].item()!r} is not allowed ({allowed})")
    return out
