"""D4RL-format HDF5 files: observations, actions, rewards, terminals, timeouts, optional next_observations."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from relive.data.rows import check_widths
from relive.data.trust import one_line, open_hdf5

REQUIRED = ("observations", "actions", "rewards", "terminals")


def read_d4rl_hdf5(path: str | Path) -> tuple[dict, dict]:
    """Columns of a D4RL HDF5 file. Episodes end at ``terminals`` (terminated) or ``timeouts`` (truncated).
    Without ``next_observations`` the next observation of row t is observations[t + 1]; the last row of every
    episode then has no known next observation and is dropped, as ``d4rl.qlearning_dataset`` does (the count
    is reported in the metadata and warned about)."""
    import h5py  # (optional: relive[data])

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"D4RL file {path} does not exist")
    with open_hdf5(path) as f:  # no external or virtual data; declared sizes within the file and memory
        missing = [k for k in REQUIRED if k not in f]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing} (a D4RL file has {list(REQUIRED)} + timeouts)")
        data = {}
        for k in (*REQUIRED, "timeouts", "next_observations"):
            if k not in f:
                continue
            try:
                obj = f[k]
            except (KeyError, OSError) as e:  # a dangling soft link, a corrupted header
                raise ValueError(f"{path}: cannot open {k!r} ({one_line(e)})") from None
            if not isinstance(obj, h5py.Dataset):
                raise ValueError(f"{path}: {k!r} is an HDF5 {type(obj).__name__.lower()}, expected a dataset "
                                 "(one array with a row per transition)")
            if obj.dtype.kind not in "biuf":
                raise ValueError(f"{path}: {k!r} holds {obj.dtype}, expected numbers or booleans")
            try:
                data[k] = obj[()]
            except (OSError, ValueError, TypeError) as e:  # a truncated or corrupted file
                raise ValueError(f"{path}: cannot read {k!r} ({one_line(e)})") from None
    for k in ("rewards", "terminals", "timeouts"):  # per-row scalars: (N,) or (N, 1), nothing else
        if k in data:
            data[k] = _per_row(data[k], k, path)
    n = len(data["observations"]) if data["observations"].ndim else 0
    for k, v in data.items():
        if v.ndim == 0:
            raise ValueError(f"{path}: {k!r} is a scalar, expected one entry per row")
        if len(v) != n:
            raise ValueError(f"{path}: {k!r} has {len(v)} rows but 'observations' has {n}")
    for k in ("observations", "actions", "rewards", "next_observations"):
        if k in data and data[k].dtype.kind == "f" and not np.isfinite(data[k]).all():
            row = int(np.argwhere(~np.isfinite(data[k]))[0][0])
            raise ValueError(f"{path}: {k!r} row {row} is not finite (NaN/inf)")
    terminated = _flags(data["terminals"], "terminals", path)
    # a row flagged both terminal and timeout is terminal (the task ended; no bootstrap)
    truncated = _flags(data.get("timeouts", np.zeros(n, bool)), "timeouts", path) & ~terminated
    meta = {"path": str(path), "dropped_rows": 0}
    if "next_observations" in data:
        rows = dict(obs=data["observations"], action=data["actions"], reward=data["rewards"],
                    next_obs=data["next_observations"], terminated=terminated, truncated=truncated)
    else:
        end = terminated | truncated
        keep = np.ones(n, bool)
        keep[np.flatnonzero(truncated)] = False  # no next observation after a timeout
        keep[-1] = bool(terminated[-1])  # nor after the last row, unless terminal (no bootstrap needed)
        nxt = np.concatenate([data["observations"][1:], data["observations"][-1:]])
        # a terminal row's next_obs is never used in a target; keep the observation itself there
        nxt[terminated] = data["observations"][terminated]
        rows = dict(obs=data["observations"][keep], action=data["actions"][keep],
                    reward=data["rewards"][keep], next_obs=nxt[keep],
                    terminated=terminated[keep], truncated=np.zeros(int(keep.sum()), bool))
        # the row before a dropped timeout row now ends its episode by truncation
        before = np.flatnonzero(~keep) - 1
        before = before[(before >= 0) & keep[np.clip(before, 0, n - 1)] & ~end[np.clip(before, 0, n - 1)]]
        new_index = np.cumsum(keep) - 1
        rows["truncated"][new_index[before]] = True
        meta["dropped_rows"] = int((~keep).sum())
        if meta["dropped_rows"]:
            warnings.warn(f"{path}: no next_observations; dropped {meta['dropped_rows']} rows whose next "
                          "observation is unknown (episode ends by timeout or at the end of the file)", stacklevel=2)
    check_widths(rows, str(path))
    return rows, meta


def _per_row(arr: np.ndarray, name: str, path: Path) -> np.ndarray:
    """A per-row column as shape (N,): (N, 1) is squeezed (some D4RL files store it so), anything else refused
    (an (N, 1) flag column against an (N,) one would broadcast to (N, N))."""
    if arr.ndim == 2 and arr.shape[1] == 1:
        return arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{path}: {name!r} must have shape (N,) or (N, 1), got {arr.shape}")
    return arr


def _flags(arr: np.ndarray, name: str, path: Path) -> np.ndarray:
    """Episode-end flags as bool: bool or 0/1 numbers only (a 0.5 is an error, not silently True)."""
    if arr.ndim != 1:
        raise ValueError(f"{path}: {name!r} must be a 1-D array of booleans or 0/1, got {arr.dtype} {arr.shape}")
    if arr.dtype == bool:
        return arr
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{path}: {name!r} must be a 1-D array of booleans or 0/1, got {arr.dtype} {arr.shape}")
    bad = (arr != 0) & (arr != 1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: {name!r} row {row} is {arr[row].item()!r}, expected a flag (0/1 or bool)")
    return arr.astype(bool)


def write_d4rl_hdf5(path: str | Path, rows: dict, with_next_observations: bool = True) -> Path:
    """Write relive columns in the D4RL layout (for interoperability and tests)."""
    import h5py  # (optional: relive[data])

    path = Path(path)
    with h5py.File(path, "w") as f:
        f["observations"] = rows["obs"]
        f["actions"] = rows["action"]
        f["rewards"] = rows["reward"]
        f["terminals"] = rows["terminated"]
        f["timeouts"] = rows["truncated"]
        if with_next_observations:
            f["next_observations"] = rows["next_obs"]
    return path
