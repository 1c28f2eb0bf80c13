"""LeRobot-format dataset directories: read one into relive rows (the offline segment), write rows back out.

The on-disk layout, as checked against the public ``huggingface/lerobot`` source (commit 7427f31, Nov 2026:
``src/lerobot/datasets/utils.py`` path constants and ``DatasetInfo``, ``feature_utils.get_hf_features_from_features``,
``dataset_writer._save_episode_data``, ``dataset_metadata._save_episode_metadata``, ``io_utils`` (tasks, stats),
``compute_stats``, ``utils/constants.DEFAULT_FEATURES``, ``scripts/convert_dataset_v21_to_v30.py``, and the v2.1
``utils.py`` of commit d602e81 before the v3 change)::

    meta/info.json        codebase_version, fps, features {name: {dtype, shape, names}}, data_path template,
                          chunks_size, total_episodes, total_frames, robot_type, ...
    v3.0  data/chunk-000/file-000.parquet          many episodes per file (one row group each)
          meta/episodes/chunk-000/file-000.parquet episode_index, length, tasks, data/chunk_index,
                                                   data/file_index, dataset_from_index/to_index, stats/...
          meta/tasks.parquet, meta/stats.json
    v2.x  data/chunk-000/episode_000000.parquet    one file per episode (chunk = episode_index // chunks_size)
          meta/episodes.jsonl {episode_index, tasks, length}, meta/tasks.jsonl,
          meta/episodes_stats.jsonl (v2.1) or meta/stats.json (v2.0)

Every frame is one parquet row with the features whose dtype is not "video" (videos are mp4 files beside the
data): a ``shape == (1,)`` feature is a scalar column, a vector a (fixed-size) list, 2-D+ nested lists; "image"
features are structs of PNG bytes. Every frame also has ``timestamp``, ``frame_index`` (0.. within the episode),
``episode_index``, ``index`` (global) and ``task_index``. The ``lerobot`` package itself is not used: installing it
here would downgrade gymnasium to 0.29 and pull torchvision, wandb, rerun and more, so files are read and written
with ``pyarrow`` (the ``data`` extra) following the layout above. A directory this module writes was loaded once
(2026-11-23, outside the test suite) with ``datasets`` 3.6's ``Dataset.from_parquet`` and the ``datasets.Features``
that LeRobot derives from ``info.json`` (its v3.0 ``load_nested_dataset`` path), and its ``meta/tasks.parquet``
with pandas (index ``task``), as LeRobot's ``load_tasks`` does.

Reading (``read_lerobot``), the mapping to relive's rows:

- ``obs``: every non-image ``observation.*`` feature, in ``info.json`` order, each flattened per frame and
  concatenated (relive's observations are flat vectors); the keys and shapes are recorded in
  ``meta["observation_keys"]``. Image and video features are not decoded: they are skipped and listed in
  ``meta["skipped_features"]`` (a dataset with only camera observations is refused).
- ``action``: ``action`` (float32; an integer ``action`` of shape (1,) is a discrete action, shape (N,)).
- ``reward``: ``next.reward``; without it zeros, with a warning and ``meta["reward"] = "absent: zeros"``.
- Episode ends. LeRobot has only ``next.done``; relive needs gymnasium's terminated / truncated. The last frame of
  every episode ends it; it is ``terminated`` when its ``next.done`` is true (the task ended: no bootstrap) and
  ``truncated`` otherwise (no ``next.done`` feature, or false: the recording stopped, as teleoperated demos do,
  so targets bootstrap). ``episode_end="terminated"`` or ``"truncated"`` marks every episode end that way
  instead. A ``next.done`` before an episode's last frame is an error.
- ``next_obs``: the observation of the next frame of the same episode. The last frame has no next frame: when the
  dataset has ``next.<key>`` for every observation key (relive's writer adds ``next.observation.state``) those
  are used for every frame, else the last frame's ``next_obs`` is its own observation (exact at a terminal,
  where it is never used; an approximation at a truncation, recorded in ``meta["next_obs"]``).

Writing (``write_lerobot``) produces the v3.0 layout with ``observation.state``, ``action``, ``next.reward``,
``next.done`` (= terminated), ``next.observation.state`` (relive's ``next_obs``, so a truncated episode's final
observation survives) and the default features, per-episode and global stats (min, max, mean, std, count,
q01..q99), ``meta/tasks.parquet`` with one task, and ``meta/relive.json`` (env id, reference returns; LeRobot
ignores the file). An episode with neither flag at its end (a run's unfinished last episode) reads back as
truncated.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from relive.data.columns import check_columns, split_episodes

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNKS_SIZE = 1000  # files per chunk directory (LeRobot's DEFAULT_CHUNK_SIZE)
DATA_FILE_MB = 100  # LeRobot's DEFAULT_DATA_FILE_SIZE_IN_MB: a new data file starts past this
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
RELIVE_META = "meta/relive.json"
STAGING_PREFIX = ".relive-partial-"
EPISODE_ENDS = ("auto", "terminated", "truncated")


def _pyarrow():
    """pyarrow and pyarrow.parquet, or a one-line error naming the extra that installs them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        raise ValueError("LeRobot datasets need pyarrow: pip install 'relive[data]' (or pip install pyarrow)") from None
    return pa, pq


def is_lerobot_dir(path: str | Path) -> bool:
    """A directory that looks like a LeRobot dataset (a ``meta/`` folder, or parquet files under ``data/``)."""
    p = Path(path)
    return p.is_dir() and ((p / "meta").is_dir() or any((p / "data").glob("*/*.parquet")))


# -- reading -------------------------------------------------------------------------------------------------
def read_lerobot(path: str | Path, *, obs_keys: list[str] | None = None,
                 episode_end: str = "auto") -> tuple[dict, dict]:
    """Columns and metadata of a local LeRobot dataset directory (v2.0, v2.1 or v3.0 layout); see the module
    docstring for the mapping. ``obs_keys``: the observation features to concatenate (default: every non-image
    ``observation.*`` feature in ``info.json`` order). Every problem is one ``ValueError`` line naming the file."""
    _, pq = _pyarrow()

    if episode_end not in EPISODE_ENDS:
        raise ValueError(f"episode_end must be one of {EPISODE_ENDS}, got {episode_end!r}")
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"LeRobot dataset directory {root} does not exist")
    info = _read_info(root)
    version, features = info["codebase_version"], info["features"]
    skipped = {k: f"dtype {ft['dtype']!r}: not decoded (relive reads vector features only)"
               for k, ft in features.items() if ft["dtype"] in ("image", "video")}
    vector = [k for k, ft in features.items() if k not in skipped and ft["dtype"] not in ("string", "str")]
    if obs_keys is None:
        obs_keys = [k for k in vector if k.startswith("observation.") or k == "observation"]
    bad = [k for k in obs_keys if k not in vector]
    if bad:
        raise ValueError(f"{root}: observation feature(s) {bad} are not vector features of meta/info.json "
                         f"(vector features: {vector}; image/video: {sorted(skipped)})")
    if not obs_keys:
        raise ValueError(f"{root}: no vector observation feature (observation.*) in meta/info.json; "
                         f"image/video observations {sorted(skipped)} are not decoded by relive")
    if "action" not in vector:
        raise ValueError(f"{root}: meta/info.json has no vector 'action' feature (features: {list(features)})")
    next_keys = [f"next.{k}" for k in obs_keys]
    has_next = all(k in vector for k in next_keys)
    wanted = [*obs_keys, "action", *(next_keys if has_next else []),
              *(k for k in ("next.reward", "next.done") if k in vector), "episode_index", "frame_index"]

    files = sorted((root / "data").glob("*/*.parquet"))
    if not files:
        raise ValueError(f"{root}: no parquet files under data/ (expected data/chunk-XXX/*.parquet)")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in wanted}
    for f in files:
        try:
            names = pq.read_schema(f).names
            table = pq.read_table(f, columns=[k for k in wanted if k in names])
        except Exception as e:  # pyarrow's errors on a truncated or corrupted file do not name it
            raise ValueError(f"{f}: not a readable parquet file ({type(e).__name__}: {e})") from None
        missing = [k for k in wanted if k not in names]
        if missing:
            raise ValueError(f"{f}: column(s) {missing} declared in meta/info.json are missing")
        for k in wanted:
            shape = tuple(features[k]["shape"]) if k in features else (1,)
            parts[k].append(_column(table.column(k), shape, k, f))
    cols = {k: np.concatenate(v) for k, v in parts.items()}
    ep = cols["episode_index"].reshape(-1).astype(np.int64)
    frame = cols["frame_index"].reshape(-1).astype(np.int64)
    order = np.lexsort((frame, ep))  # episodes in index order, frames in time order
    cols = {k: v[order] for k, v in cols.items()}
    ep, frame = ep[order], frame[order]
    n = ep.size
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    lengths = np.diff(np.r_[starts, n])
    expected = np.arange(n) - np.repeat(starts, lengths)
    if not np.array_equal(frame, expected):
        i = int(np.flatnonzero(frame != expected)[0])
        raise ValueError(f"{root}: episode {ep[i]} has frame_index {frame[i]} where {expected[i]} was expected "
                         "(frames missing or duplicated)")
    _check_episode_lengths(root, version, dict(zip(ep[starts].tolist(), lengths.tolist(), strict=True)))
    if info.get("total_frames") not in (None, n):
        raise ValueError(f"{root}: meta/info.json says total_frames = {info['total_frames']} but the parquet files "
                         f"hold {n} frames")

    last = np.zeros(n, bool)
    last[starts + lengths - 1] = True
    obs = np.concatenate([cols[k].reshape(n, -1) for k in obs_keys], axis=1).astype(np.float32)
    if has_next:
        next_obs = np.concatenate([cols[k].reshape(n, -1) for k in next_keys], axis=1).astype(np.float32)
        next_note = f"features {next_keys}"
    else:
        next_obs = np.empty_like(obs)
        next_obs[:-1] = obs[1:]
        next_obs[last] = obs[last]
        next_note = "the next frame of the episode; an episode's last frame: its own observation"
    act_ft = features["action"]
    action = cols["action"]
    if np.dtype(act_ft["dtype"]).kind in "iu" and tuple(act_ft["shape"]) == (1,):
        action = action.reshape(n).astype(np.int64)  # a discrete action
    else:
        action = action.astype(np.float32)
    meta = {"format": "lerobot", "path": str(root.resolve()), "codebase_version": version, "fps": info.get("fps"),
            "robot_type": info.get("robot_type"), "total_episodes": int(starts.size), "total_steps": int(n),
            "observation_keys": [[k, list(features[k]["shape"])] for k in obs_keys],
            "skipped_features": skipped, "next_obs": next_note, "env_id": None,
            "ref_min_return": None, "ref_max_return": None}
    if "next.reward" in cols:
        reward = cols["next.reward"].reshape(n).astype(np.float32)
        meta["reward"] = "next.reward"
    else:
        reward = np.zeros(n, np.float32)
        meta["reward"] = "absent: zeros"
        warnings.warn(f"{root}: no next.reward feature; rewards are zeros", stacklevel=2)
    done = cols["next.done"].reshape(n).astype(bool) if "next.done" in cols else np.zeros(n, bool)
    if (done & ~last).any():
        i = int(np.flatnonzero(done & ~last)[0])
        raise ValueError(f"{root}: next.done is true at frame {frame[i]} of episode {ep[i]}, before its last frame "
                         f"{lengths[np.searchsorted(starts, i, 'right') - 1] - 1}")
    if episode_end == "auto":
        terminated = done & last
        meta["episode_end"] = ("last frame: terminated where next.done, else truncated" if "next.done" in cols
                               else "last frame: truncated (no next.done feature)")
    else:
        terminated = last.copy() if episode_end == "terminated" else np.zeros(n, bool)
        meta["episode_end"] = f"last frame: {episode_end} (episode_end={episode_end!r})"
    truncated = last & ~terminated
    if skipped:
        warnings.warn(f"{root}: image/video features {sorted(skipped)} are skipped (not decoded)", stacklevel=2)
    extra = root / RELIVE_META
    if extra.is_file():
        meta["relive"] = json.loads(extra.read_text())
        for key in ("env_id", "ref_min_return", "ref_max_return"):
            meta[key] = meta["relive"].get(key)
    rows = dict(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated,
                truncated=truncated)
    check_columns(rows, f"LeRobot dataset {root}")
    return rows, meta


def _read_info(root: Path) -> dict:
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise ValueError(f"{root}: missing meta/info.json (a LeRobot dataset directory has meta/info.json and "
                         "data/chunk-XXX/*.parquet)")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise ValueError(f"{path}: no 'features' mapping")
    version = str(info.get("codebase_version", ""))
    if not version.startswith(("v2.", "v3.")):
        raise ValueError(f"{path}: codebase_version {version!r} is not supported (v2.0, v2.1, v3.0)")
    info["codebase_version"] = version
    for k, ft in info["features"].items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise ValueError(f"{path}: feature {k!r} lacks dtype or shape")
    return info


def _column(col, shape: tuple, name: str, file: Path) -> np.ndarray:
    """A parquet column as an array of shape (N, *shape) (scalar columns of a (1,) feature: (N, 1))."""
    pa, _ = _pyarrow()

    if col.null_count:
        raise ValueError(f"{file}: column {name!r} has {col.null_count} null value(s)")
    n = len(col)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten()
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)):
        raise ValueError(f"{file}: column {name!r} holds {col.type}, not numbers")
    values = arr.to_numpy(zero_copy_only=False)
    size = int(np.prod(shape))
    if values.size != n * size:
        raise ValueError(f"{file}: feature {name!r} has shape {list(shape)} in meta/info.json but its parquet "
                         f"rows hold {values.size / max(n, 1):g} values each")
    return values.reshape(n, *shape)


def _check_episode_lengths(root: Path, version: str, found: dict[int, int]) -> None:
    """Episode lengths of the data files against meta/episodes (v3.0 parquet, v2.x jsonl), where present."""
    _, pq = _pyarrow()

    declared: dict[int, int] = {}
    legacy = root / "meta" / "episodes.jsonl"
    if legacy.is_file():
        for line in legacy.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                declared[int(d["episode_index"])] = int(d["length"])
    else:
        for f in sorted((root / "meta" / "episodes").glob("*/*.parquet")):
            t = pq.read_table(f, columns=["episode_index", "length"])
            declared.update(zip(t.column("episode_index").to_pylist(), t.column("length").to_pylist(), strict=True))
    if not declared:
        return
    if set(declared) != set(found):
        missing = sorted(set(declared) - set(found))[:5]
        extra = sorted(set(found) - set(declared))[:5]
        raise ValueError(f"{root}: the data files and meta/episodes disagree on the episodes (missing from data: "
                         f"{missing}, not in meta: {extra})")
    for e, length in found.items():
        if declared[e] != length:
            raise ValueError(f"{root}: episode {e} has {length} frames in data/ but meta/episodes says {declared[e]}")


# -- writing -------------------------------------------------------------------------------------------------
def write_lerobot(path: str | Path, rows: dict, *, fps: int = 30, task: str = "relive",
                  robot_type: str | None = None, env_id: str | None = None, extra_metadata: dict | None = None,
                  overwrite: bool = False) -> Path:
    """Write relive rows as a LeRobot v3.0 dataset directory at ``path`` (see the module docstring).

    Atomic: written to a hidden staging directory beside ``path``, then renamed into place; an existing ``path`` is
    refused unless ``overwrite`` (then swapped out only once the new dataset is complete)."""
    pa, pq = _pyarrow()

    from relive.data.minari_io import _fsync_tree, _swap_into_place

    target = Path(path)
    if target.exists() and not overwrite:
        raise ValueError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
    if not isinstance(fps, int) or fps <= 0:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    n = check_columns(rows, f"rows for {target}")
    if n == 0:
        raise ValueError(f"rows for {target}: no rows to write")
    obs = np.asarray(rows["obs"], np.float32).reshape(n, -1)
    next_obs = np.asarray(rows["next_obs"], np.float32).reshape(n, -1)
    act = np.asarray(rows["action"])
    if act.ndim == 1 and act.dtype.kind in "iu":  # discrete: an int64 (1,) feature
        action, act_ft = act.astype(np.int64), {"dtype": "int64", "shape": [1], "names": None}
    else:
        action = act.astype(np.float32).reshape(n, -1)
        act_ft = {"dtype": "float32", "shape": [action.shape[1]],
                  "names": [f"action_{i}" for i in range(action.shape[1])]}
    slices = split_episodes(rows)
    lengths = np.array([s.stop - s.start for s in slices], np.int64)
    episode_index = np.repeat(np.arange(len(slices), dtype=np.int64), lengths)
    frame_index = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    state_names = [f"state_{i}" for i in range(obs.shape[1])]
    values = {
        "observation.state": obs, "action": action,
        "next.reward": np.asarray(rows["reward"], np.float32),
        "next.done": np.asarray(rows["terminated"], bool),
        "next.observation.state": next_obs,
        "timestamp": (frame_index / fps).astype(np.float32), "frame_index": frame_index,
        "episode_index": episode_index, "index": np.arange(n, dtype=np.int64),
        "task_index": np.zeros(n, np.int64)}
    features = {
        "observation.state": {"dtype": "float32", "shape": [obs.shape[1]], "names": state_names},
        "action": act_ft,
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "next.observation.state": {"dtype": "float32", "shape": [obs.shape[1]], "names": state_names},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in DEFAULT_FEATURES[1:]}}
    for ft in features.values():
        ft["fps"] = fps  # (v3.0 records it per non-video feature)
    table = pa.table({k: _arrow(v) for k, v in values.items()})

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target.parent))
    try:
        # data files: whole episodes, one row group each, a new file past DATA_FILE_MB
        bytes_per_row = table.nbytes / n
        chunk, file, rows_in_file = 0, 0, 0
        file_of_episode, writer = [], None
        bounds = np.r_[0, np.cumsum(lengths)]
        for e, length in enumerate(lengths.tolist()):
            if writer is not None and (rows_in_file + length) * bytes_per_row > DATA_FILE_MB * 2**20:
                writer.close()
                writer, rows_in_file = None, 0
                chunk, file = (chunk + 1, 0) if file == CHUNKS_SIZE - 1 else (chunk, file + 1)
            if writer is None:
                out = staging / DATA_PATH.format(chunk_index=chunk, file_index=file)
                out.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(out, table.schema, compression="snappy")
            writer.write_table(table.slice(int(bounds[e]), length))
            rows_in_file += length
            file_of_episode.append((chunk, file))
        writer.close()
        # episodes metadata, with per-episode stats
        episodes = {"episode_index": np.arange(len(slices), dtype=np.int64),
                    "tasks": pa.array([[task]] * len(slices), pa.list_(pa.string())), "length": lengths,
                    "data/chunk_index": np.array([c for c, _ in file_of_episode], np.int64),
                    "data/file_index": np.array([f for _, f in file_of_episode], np.int64),
                    "dataset_from_index": bounds[:-1].astype(np.int64), "dataset_to_index": bounds[1:].astype(np.int64)}
        per_episode = [{k: _stats(v[bounds[e]:bounds[e + 1]]) for k, v in values.items()} for e in range(len(slices))]
        for k in values:
            for stat in per_episode[0][k]:
                episodes[f"stats/{k}/{stat}"] = pa.array([s[k][stat].tolist() for s in per_episode],
                                                         pa.list_(pa.int64() if stat == "count" else pa.float64()))
        episodes["meta/episodes/chunk_index"] = np.zeros(len(slices), np.int64)
        episodes["meta/episodes/file_index"] = np.zeros(len(slices), np.int64)
        ep_path = staging / EPISODES_PATH.format(chunk_index=0, file_index=0)
        ep_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in episodes.items()}),
                       ep_path)
        _write_tasks(staging / "meta" / "tasks.parquet", [task])
        stats = {k: {s: v.tolist() for s, v in _stats(arr).items()} for k, arr in values.items()}
        (staging / "meta" / "stats.json").write_text(json.dumps(stats, indent=1))
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": len(slices),
                "total_frames": n, "total_tasks": 1, "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": 200, "fps": fps,
                "splits": {"train": f"0:{len(slices)}"}, "data_path": DATA_PATH, "video_path": None,
                "features": features}
        (staging / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        relive = {"writer": "relive", "env_id": env_id, **(extra_metadata or {})}
        (staging / RELIVE_META).write_text(json.dumps(relive, indent=1, allow_nan=True, default=str))
        _fsync_tree(staging)
        if target.exists() and not overwrite:  # made meanwhile by another process
            raise ValueError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
        _swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the old dataset, after a swap
    return target.resolve()


def _arrow(v: np.ndarray):
    """A column as LeRobot types it (``get_hf_features_from_features``): a feature of shape (1,) is a scalar
    column (``datasets.Value``; a fixed-size list of one fails its cast), a vector a fixed-size list."""
    pa, _ = _pyarrow()

    if v.ndim == 1 or v.shape[1:] == (1,):
        return pa.array(v.reshape(len(v)))
    return pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])


def _stats(v: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's per-feature statistics over frames (axis 0): min, max, mean, std, count, q01..q99 (exact
    quantiles here; LeRobot estimates them from histograms)."""
    x = np.asarray(v, np.float64).reshape(len(v), -1)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0),
           "count": np.array([len(v)], np.int64)}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(x, q, axis=0)
    return out


def _write_tasks(path: Path, tasks: list[str]) -> None:
    """meta/tasks.parquet as pandas writes LeRobot's: a task_index column indexed by the task string."""
    pa, pq = _pyarrow()

    pandas_meta = {"index_columns": ["task"], "column_indexes": [
        {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
         "metadata": {"encoding": "UTF-8"}}], "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
         "metadata": None},
        {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None}],
        "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0"}
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())})
    pq.write_table(table.replace_schema_metadata({"pandas": json.dumps(pandas_meta)}), path)


# -- relive experience -> rows -------------------------------------------------------------------------------
def buffer_rows(buffer, source: str = "online") -> dict:
    """The rows of a replay buffer (``source``: "online", "offline" or "all"), episode by episode in time order.
    An online episode whose first rows the ring overwrote starts at its first stored row; the last, unfinished
    episode is included (it reads back as truncated)."""
    from relive.types import OFFLINE, ONLINE

    sources = {"online": ONLINE, "offline": OFFLINE, "all": None}
    if source not in sources:
        raise ValueError(f"source must be one of {sorted(sources)}, got {source!r}")
    st = buffer.storage
    eps = st.episodes.live(sources[source])
    slots = st.episode_slots(eps.start, eps.length, eps.source)
    if not slots.size:
        raise ValueError(f"the buffer holds no {source} rows")
    if st.obs_keys is not None:
        raise ValueError(f"the buffer stores dict observations (keys {list(st.obs_keys)}); exporting them as LeRobot "
                         "features is not supported yet: concatenate them first (relive.agents.encoders.concat_keys)")
    # (read, not columns: with dedup_next_obs there is no next_obs column)
    return {k: st.read(k, slots) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}


def load_experience(source: str | Path, rows: str = "online") -> tuple[dict, dict]:
    """Rows and metadata from a run directory (its ``buffer_final/``, else its last checkpoint's buffer), a saved
    replay buffer directory (``ReplayBuffer.save``), or any dataset ``load_rows`` reads (all its rows)."""
    from relive.replay.buffer import ReplayBuffer

    p = Path(source)
    meta: dict = {"source": str(p)}
    if (p / "config.json").is_file():
        try:
            meta["env_id"] = json.loads((p / "config.json").read_text())["env"]["id"]
        except (ValueError, KeyError, TypeError):
            pass
    if (p / "buffer_final").is_dir():
        return buffer_rows(ReplayBuffer.load(p / "buffer_final"), rows), meta
    from relive.train.checkpoint import has_checkpoint, load_checkpoint

    if has_checkpoint(p):
        return buffer_rows(ReplayBuffer.from_state_dict(load_checkpoint(p)["buffer"]), rows), meta
    if (p / "MANIFEST.json").is_file():
        return buffer_rows(ReplayBuffer.load(p), rows), meta
    from relive.data.loaders import load_rows

    data, dmeta = load_rows(p)
    return data, meta | {k: dmeta.get(k) for k in ("env_id", "ref_min_return", "ref_max_return") if dmeta.get(k)}

