"""Checks and conversions between relive's columns and episode-based formats (Minari, D4RL)."""

from __future__ import annotations

import numpy as np

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def num_rows(column) -> int:
    """Rows of a column: an array, or a dict key -> array (dict observations)."""
    if isinstance(column, dict):
        return len(next(iter(column.values()))) if column else 0
    return len(column)


def obs_parts(rows: dict, column: str = "obs") -> dict[str, np.ndarray]:
    """An observation column as key -> array (a flat column: the single key '')."""
    col = rows[column]
    return {k: np.asarray(v) for k, v in col.items()} if isinstance(col, dict) else {"": np.asarray(col)}


def check_columns(rows: dict, where: str) -> int:
    """Every column present, equal lengths, finite numbers; returns the row count. Nothing is cast or cut.
    ``obs`` / ``next_obs`` may be dicts key -> array (dict observations) with the same keys."""
    missing = [c for c in COLUMNS if c not in rows]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}")
    for c in COLUMNS:  # arrays of numbers with a row per transition (a file can hold a scalar, strings, objects)
        for k, arr in (obs_parts(rows, c) if isinstance(rows[c], dict) else {"": np.asarray(rows[c])}).items():
            if arr.ndim == 0 or arr.dtype.kind not in "biuf":
                name = f"{c!r} key {k!r}" if k else repr(c)
                raise ValueError(f"{where}: column {name} must be an array of numbers or booleans with a row per "
                                 f"transition, got {arr.dtype} of shape {arr.shape}")
    check_widths(rows, where)
    if isinstance(rows["obs"], dict) or isinstance(rows["next_obs"], dict):
        keys = [sorted(rows[c]) if isinstance(rows[c], dict) else None for c in ("obs", "next_obs")]
        if keys[0] != keys[1]:
            raise ValueError(f"{where}: 'obs' and 'next_obs' must have the same keys, got {keys[0]} and {keys[1]}")
        n = num_rows(rows["obs"])
        for c in ("obs", "next_obs"):
            for k, v in rows[c].items():
                if len(v) != n:
                    raise ValueError(f"{where}: column {c!r} key {k!r} has {len(v)} rows but 'obs' has {n}")
    n = num_rows(rows["obs"])
    for c in COLUMNS:
        if num_rows(rows[c]) != n:
            raise ValueError(f"{where}: column {c!r} has {num_rows(rows[c])} rows but 'obs' has {n}")
    for c in ("reward", "terminated", "truncated"):  # one number per row: an (N, 1) column would broadcast
        shape = np.shape(rows[c])
        if len(shape) != 1:
            raise ValueError(f"{where}: column {c!r} must have shape ({n},), got {shape}")
    for c in ("obs", "action", "reward", "next_obs"):
        for k, arr in (obs_parts(rows, c) if c in ("obs", "next_obs") else {"": np.asarray(rows[c])}).items():
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                row = int(np.argwhere(~np.isfinite(arr))[0][0])
                name = f"{c!r} key {k!r}" if k else repr(c)
                raise ValueError(f"{where}: column {name} row {row} is not finite (NaN/inf)")
    return n


def check_widths(rows: dict, where: str) -> None:
    """Every per-row column holds at least one number per row: a column of shape (N, 0) (or (N, 3, 0), a dict
    observation key of width 0) is refused, naming it -- an agent built on it has no input or no action (its
    losses are NaN from the first step), so the dataset is refused before anything is created."""
    for c in ("obs", "action", "next_obs"):
        for k, arr in (obs_parts(rows, c) if isinstance(rows[c], dict) else {"": np.asarray(rows[c])}).items():
            if 0 in arr.shape[1:]:
                name = f"{c!r} key {k!r}" if k else repr(c)
                raise ValueError(f"{where}: column {name} has shape {arr.shape}, zero numbers per row (every row "
                                 "must hold at least one)")


def split_episodes(rows: dict) -> list[slice]:
    """Episodes as slices: each ends at terminated | truncated; a trailing unfinished run is its own episode."""
    end = np.asarray(rows["terminated"], bool) | np.asarray(rows["truncated"], bool)
    stops = np.flatnonzero(end) + 1
    if not stops.size or stops[-1] != end.size:
        stops = np.append(stops, end.size)
    starts = np.concatenate(([0], stops[:-1]))
    return [slice(int(a), int(b)) for a, b in zip(starts, stops, strict=True) if b > a]


def check_env_spaces(rows: dict, env_id: str, where: str) -> None:
    """Observation and action shapes (and action bounds) must match the environment's spaces."""
    from relive.envs import env_spec, make_env  # (gymnasium, optional: imported only where an env is made)

    env = make_env(env_id)
    spec = env_spec(env)
    env.close()
    if isinstance(spec.obs_shape, dict) or isinstance(rows["obs"], dict):  # dict observations (image tasks)
        want = {k: tuple(v[0]) for k, v in spec.obs_shape.items()} if isinstance(spec.obs_shape, dict) else None
        got = ({k: tuple(np.asarray(v).shape[1:]) for k, v in rows["obs"].items()}
               if isinstance(rows["obs"], dict) else tuple(np.asarray(rows["obs"]).shape[1:]))
        if got != want:
            raise ValueError(f"{where}: observations have shapes {got}, {env_id} expects {want or spec.obs_shape}")
    else:
        obs_shape = tuple(np.asarray(rows["obs"]).shape[1:])
        if obs_shape != tuple(spec.obs_shape):
            raise ValueError(f"{where}: observations have shape {obs_shape}, {env_id} expects {spec.obs_shape}")
    act = np.asarray(rows["action"])
    if spec.discrete:
        if act.ndim != 1 or act.dtype.kind not in "iu" or act.min() < 0 or act.max() >= spec.num_actions:
            raise ValueError(f"{where}: actions must be integers in [0, {spec.num_actions}) for {env_id}")
        return
    if tuple(act.shape[1:]) != tuple(spec.action_shape):
        raise ValueError(f"{where}: actions have shape {tuple(act.shape[1:])}, {env_id} expects {spec.action_shape}")
    assert spec.action_low is not None and spec.action_high is not None  # a continuous spec has its bounds
    low, high = spec.action_low - 1e-6, spec.action_high + 1e-6
    bad = (act < low) | (act > high)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ValueError(f"{where}: action row {row} {act[row]} is outside {env_id}'s action space "
                         f"[{spec.action_low}, {spec.action_high}]")


def spec_from_rows(rows: dict, where: str):
    """An environment spec read from a dataset alone (an offline-only run without an environment: real-robot data):
    the observation and action shapes of its columns; integer actions are discrete (``max + 1`` actions), float
    actions continuous with the box spanned by the dataset's own actions (per dimension; a dimension that never
    varies gets +-1 around its value), since a dataset records no bounds every format has."""
    from relive.envs import EnvSpec  # (gymnasium: imported where a spec is made)

    obs = rows["obs"]
    if isinstance(obs, dict):
        raise ValueError(f"{where}: dict observations without an environment are not supported (give --env)")
    obs_shape = tuple(np.asarray(obs).shape[1:])
    actions = np.asarray(rows["action"])
    if actions.dtype.kind in "iu":
        if actions.ndim != 1 or actions.min() < 0:
            raise ValueError(f"{where}: integer actions must be one non-negative index per row")
        n = int(actions.max()) + 1
        return EnvSpec("", obs_shape, True, (), max(n, 2), None, None, None)
    actions = actions.reshape(len(actions), -1).astype(np.float32)
    low, high = actions.min(axis=0), actions.max(axis=0)
    flat = high <= low
    low, high = np.where(flat, low - 1, low), np.where(flat, high + 1, high)
    return EnvSpec("", obs_shape, False, tuple(np.asarray(rows["action"]).shape[1:]), 0, low.astype(np.float32),
                   high.astype(np.float32), None)
