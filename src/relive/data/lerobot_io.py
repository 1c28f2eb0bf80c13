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

- ``obs``: without camera features, every ``observation.*`` feature, in ``info.json`` order, each flattened per
  frame and concatenated into one flat vector; the keys and shapes are recorded in ``meta["observation_keys"]``.
  With "image" / "video" features (``cameras="decode"``, the default): dict observations, one key per
  ``observation.*`` feature (``observation.images.top`` -> ``images_top``; ``meta["obs_key_of_feature"]``), cameras
  as uint8 [C, H, W]. "image": parquet structs ``{bytes, path}`` of PNG / JPEG bytes (``datasets.Image``), decoded
  with Pillow. "video": mp4 files at ``info["video_path"]`` (v2.x: ``videos/chunk-{episode_chunk}/{video_key}/
  episode_{episode_index}.mp4``; v3.0: ``videos/{video_key}/chunk-{chunk_index}/file-{file_index}.mp4`` with the
  episode's file and start in ``meta/episodes`` columns ``videos/{key}/chunk_index``, ``file_index``,
  ``from_timestamp``), decoded with PyAV; a row's frame is the one nearest to ``timestamp + from_timestamp``, within
  half a frame period (LeRobot's ``video_utils.decode_video_frames`` / ``dataset_metadata`` at the commit above).
  ``cameras="skip"``: cameras are left out and listed in ``meta["skipped_features"]``.
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

Writing (``write_lerobot``; dict observations: see its docstring) produces the v3.0 layout with
``observation.state``, ``action``, ``next.reward``,
``next.done`` (= terminated), ``next.observation.state`` (relive's ``next_obs``, so a truncated episode's final
observation survives) and the default features, per-episode and global stats (min, max, mean, std, count,
q01..q99), ``meta/tasks.parquet`` with one task, and ``meta/relive.json`` (env id, reference returns; LeRobot
ignores the file). An episode with neither flag at its end (a run's unfinished last episode) reads back as
truncated.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from relive.data.frame_stacks import declared
from relive.data.rows import check_columns, split_episodes
from relive.data.trust import check_allocation, format_template, inside, one_line, read_json_object
from relive.files import fsync_tree, swap_into_place
from relive.types import OFFLINE, ONLINE

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"  # one mp4 per episode
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
                 episode_end: str = "auto", cameras: str = "decode", frame_stack=None) -> tuple[dict, dict]:
    """Columns and metadata of a local LeRobot dataset directory (v2.0, v2.1 or v3.0 layout); see the module
    docstring for the mapping. ``obs_keys``: the observation features to read (default: every ``observation.*``
    feature in ``info.json`` order). ``cameras``: ``"decode"`` reads image and video features as uint8 [C, H, W]
    keys of dict observations (video needs PyAV: ``pip install av``); ``"skip"`` leaves them out and reads the
    vector features as one flat observation. ``frame_stack``: camera keys declared stacks of frames (``{"images_top":
    3}``, relive's key names): the rows keep one frame a step, the declaration is checked and recorded in
    ``meta["frame_stack"]`` for :func:`relive.data.frame_stacks.frame_stack_buffer`, which stores each frame once
    and rebuilds the stacks when sampled. Every problem is one ``ValueError`` line naming the file."""
    root = Path(path)
    try:
        rows, meta = _read_lerobot(root, obs_keys, episode_end, cameras)
    except (KeyError, TypeError, IndexError, AttributeError, OverflowError) as e:  # a field of a type or range
        # no check above foresaw: still one line naming the dataset, never a traceback
        raise ValueError(f"{root}: malformed LeRobot dataset ({one_line(e)})") from None
    if frame_stack is not None:  # (the metadata of a dataset read without it stays as it was)
        meta["frame_stack"] = declared(rows, frame_stack, f"LeRobot dataset {root}")
    return rows, meta


def _read_lerobot(root: Path, obs_keys, episode_end: str, cameras: str) -> tuple[dict, dict]:
    _, pq = _pyarrow()

    if episode_end not in EPISODE_ENDS:
        raise ValueError(f"episode_end must be one of {EPISODE_ENDS}, got {episode_end!r}")
    if cameras not in ("decode", "skip"):
        raise ValueError(f"cameras must be 'decode' or 'skip', got {cameras!r}")
    if not root.is_dir():
        raise ValueError(f"LeRobot dataset directory {root} does not exist")
    info = _read_info(root)
    version, features = info["codebase_version"], info["features"]
    sel = _select_features(root, features, obs_keys, cameras)
    cols, ep, frame, starts, lengths = _episodes_in_order(root, info, _read_frames(root, pq, info, sel))
    n = ep.size
    last = np.zeros(n, bool)
    last[starts + lengths - 1] = True
    for k in sel.videos:
        cols[k] = _read_video(root, info, k, ep[starts], starts, lengths, cols["timestamp"].reshape(n))
    obs, next_obs, next_note = _observations(root, cols, sel, last)
    act_ft = features["action"]
    action = cols["action"]
    if np.dtype(act_ft["dtype"]).kind in "iu" and tuple(act_ft["shape"]) == (1,):
        action = action.reshape(n).astype(np.int64)  # a discrete action
    else:
        action = action.astype(np.float32)
    meta = {"format": "lerobot", "path": str(root.resolve()), "codebase_version": version, "fps": info.get("fps"),
            "robot_type": info.get("robot_type"), "total_episodes": int(starts.size), "total_steps": int(n),
            "observation_keys": [[k, list(features[k]["shape"])] for k in sel.obs_keys],
            "obs_key_of_feature": (dict(zip(sel.obs_keys, _obs_key_names(root, sel.obs_keys), strict=True))
                                   if sel.decode else None),
            "skipped_features": sel.skipped, "next_obs": next_note, "env_id": None,
            "ref_min_return": None, "ref_max_return": None}
    if "next.reward" in cols:
        reward = cols["next.reward"].reshape(n).astype(np.float32)
        meta["reward"] = "next.reward"
    else:
        reward = np.zeros(n, np.float32)
        meta["reward"] = "absent: zeros"
        warnings.warn(f"{root}: no next.reward feature; rewards are zeros", stacklevel=2)
    terminated, meta["episode_end"] = _terminated(root, cols, episode_end, last, ep, frame, starts, lengths)
    truncated = last & ~terminated
    if sel.skipped:
        warnings.warn(f"{root}: image/video features {sorted(sel.skipped)} are skipped (not decoded)", stacklevel=2)
    extra = root / RELIVE_META
    if extra.is_file():
        extra = inside(root, RELIVE_META, "metadata file")
        meta["relive"] = read_json_object(extra)
        for key in ("env_id", "ref_min_return", "ref_max_return"):
            meta[key] = meta["relive"].get(key)
    rows = dict(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated,
                truncated=truncated)
    check_columns(rows, f"LeRobot dataset {root}")
    return rows, meta


@dataclass(frozen=True)
class _Selection:
    """Which features of ``meta/info.json`` a read takes, and how."""
    obs_keys: list[str]  # the observation features read, in order
    camera: set[str]  # every image and video feature
    decode: bool  # cameras are decoded: dict observations
    skipped: dict[str, str]  # camera feature -> why it is not read
    next_keys: list[str]  # next.<k> for every observation feature k
    has_next: list[str]  # those of next_keys that the dataset has
    images: list[str]  # observation features of dtype "image" (parquet structs)
    videos: list[str]  # observation features of dtype "video" (mp4 files)
    wanted: list[str]  # the parquet columns to read


def _select_features(root: Path, features: dict, obs_keys: list[str] | None, cameras: str) -> _Selection:
    camera = {k for k, ft in features.items() if ft["dtype"] in ("image", "video")}
    observed = [k for k in features if k.startswith("observation.") or k == "observation"]
    decode = cameras == "decode" and any(k in camera for k in (obs_keys if obs_keys is not None else observed))
    skipped = {} if decode else {k: f"dtype {features[k]['dtype']!r}: not decoded (cameras='skip')"
                                 for k in sorted(camera)}
    vector = [k for k, ft in features.items() if k not in camera and ft["dtype"] not in ("string", "str")]
    readable = vector + sorted(camera) if decode else vector
    if obs_keys is None:
        obs_keys = [k for k in observed if k in readable]
    bad = [k for k in obs_keys if k not in readable]
    if bad:
        raise ValueError(f"{root}: observation feature(s) {bad} are not readable features of meta/info.json "
                         f"(vector features: {vector}; image/video: {sorted(camera)}"
                         f"{', not decoded with cameras=skip' if camera and not decode else ''})")
    if not obs_keys:
        raise ValueError(f"{root}: no vector observation feature (observation.*) in meta/info.json; "
                         f"image/video observations {sorted(camera)} are read only with cameras='decode'")
    if "action" not in vector:
        raise ValueError(f"{root}: meta/info.json has no vector 'action' feature (features: {list(features)})")
    next_keys = [f"next.{k}" for k in obs_keys]
    has_next = [k for k in next_keys if k in vector]
    images = [k for k in obs_keys if k in camera and features[k]["dtype"] == "image"]
    videos = [k for k in obs_keys if k in camera and features[k]["dtype"] == "video"]
    wanted = [*(k for k in obs_keys if k not in videos), "action", *has_next,
              *(k for k in ("next.reward", "next.done") if k in vector), "episode_index", "frame_index",
              *(["timestamp"] if videos else [])]
    return _Selection(obs_keys, camera, decode, skipped, next_keys, has_next, images, videos, wanted)


def _read_frames(root: Path, pq, info: dict, sel: _Selection) -> dict[str, np.ndarray]:
    """The wanted columns of every data file, concatenated in file order; sizes checked before reading."""
    features = info["features"]
    files = sorted((root / "data").glob("*/*.parquet"))
    if not files:
        raise ValueError(f"{root}: no parquet files under data/ (expected data/chunk-XXX/*.parquet)")
    files = [inside(root, f.relative_to(root), "data file") for f in files]
    row_bytes = sum(_feature_bytes(features[k]) if k in features else 8 for k in sel.wanted)
    row_bytes += sum(_feature_bytes(features[k]) for k in sel.videos)
    declared = 0
    for f in files:
        declared += _parquet_rows(f)
        check_allocation(declared * row_bytes, f, f"{declared} frames of {row_bytes} bytes (declared in the parquet "
                                                  "metadata)")
    if info.get("total_frames") not in (None, declared):
        raise ValueError(f"{root}: meta/info.json says total_frames = {info['total_frames']} but the parquet files "
                         f"hold {declared} frames")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in sel.wanted}
    for f in files:
        try:
            names = pq.read_schema(f).names
            table = pq.read_table(f, columns=[k for k in sel.wanted if k in names])
        except Exception as e:  # pyarrow's errors on a truncated or corrupted file do not name it
            raise ValueError(f"{f}: not a readable parquet file ({one_line(e)})") from None
        missing = [k for k in sel.wanted if k not in names]
        if missing:
            raise ValueError(f"{f}: column(s) {missing} declared in meta/info.json are missing")
        for k in sel.wanted:
            if k in sel.images:
                parts[k].append(_image_column(table.column(k), features[k], k, f))
                continue
            shape = tuple(features[k]["shape"]) if k in features else (1,)
            parts[k].append(_column(table.column(k), shape, k, f))
    return {k: np.concatenate(v) for k, v in parts.items()}


def _episodes_in_order(root: Path, info: dict, cols: dict[str, np.ndarray]):
    """``cols`` sorted by episode, then frame; with each row's episode and frame index and each episode's start row
    and length. Every episode's frames must be 0, 1, ... and its length the one the metadata declares."""
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
    _check_episode_lengths(root, info["codebase_version"], dict(zip(ep[starts].tolist(), lengths.tolist(),
                                                                    strict=True)))
    if info.get("total_frames") not in (None, n):
        raise ValueError(f"{root}: meta/info.json says total_frames = {info['total_frames']} but the parquet files "
                         f"hold {n} frames")
    return cols, ep, frame, starts, lengths


def _following(x: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The next frame of the episode; at its last frame, itself."""
    out = np.empty_like(x)
    out[:-1] = x[1:]
    out[last] = x[last]
    return out


def _observations(root: Path, cols: dict[str, np.ndarray], sel: _Selection, last: np.ndarray):
    """``(obs, next_obs, how next_obs was made)``: dict observations when cameras are decoded (one key per
    feature, images [C, H, W] uint8, vectors float32 as shaped), else one flat float32 vector per frame."""
    if sel.decode:
        obs, next_obs = {}, {}
        for k, key in zip(sel.obs_keys, _obs_key_names(root, sel.obs_keys), strict=True):
            obs[key] = cols[k] if k in sel.camera else cols[k].astype(np.float32)
            nk = f"next.{k}"
            next_obs[key] = cols[nk].astype(np.float32) if nk in sel.has_next else _following(obs[key], last)
        return obs, next_obs, (f"features {sel.has_next} where present; other keys: the next frame of the episode, "
                               "an episode's last frame its own observation")
    n = last.size
    flat = np.concatenate([cols[k].reshape(n, -1) for k in sel.obs_keys], axis=1).astype(np.float32)
    if len(sel.has_next) == len(sel.next_keys):
        flat_next = np.concatenate([cols[k].reshape(n, -1) for k in sel.next_keys], axis=1).astype(np.float32)
        return flat, flat_next, f"features {sel.next_keys}"
    return flat, _following(flat, last), "the next frame of the episode; an episode's last frame: its own observation"


def _terminated(root: Path, cols: dict[str, np.ndarray], episode_end: str, last: np.ndarray, ep: np.ndarray,
                frame: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, str]:
    """Which episode ends are terminal (the rest of the last frames are truncations), and the rule used."""
    n = last.size
    done = cols["next.done"].reshape(n).astype(bool) if "next.done" in cols else np.zeros(n, bool)
    if (done & ~last).any():
        i = int(np.flatnonzero(done & ~last)[0])
        raise ValueError(f"{root}: next.done is true at frame {frame[i]} of episode {ep[i]}, before its last frame "
                         f"{lengths[np.searchsorted(starts, i, 'right') - 1] - 1}")
    if episode_end == "auto":
        return done & last, ("last frame: terminated where next.done, else truncated" if "next.done" in cols
                             else "last frame: truncated (no next.done feature)")
    terminated = last.copy() if episode_end == "terminated" else np.zeros(n, bool)
    return terminated, f"last frame: {episode_end} (episode_end={episode_end!r})"


def _read_info(root: Path) -> dict:
    path = root / "meta" / "info.json"
    if not path.is_file():
        raise ValueError(f"{root}: missing meta/info.json (a LeRobot dataset directory has meta/info.json and "
                         "data/chunk-XXX/*.parquet)")
    path = inside(root, "meta/info.json", "metadata file")
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({one_line(e)})") from None
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise ValueError(f"{path}: no 'features' mapping")
    version = str(info.get("codebase_version", ""))
    if not version.startswith(("v2.", "v3.")):
        raise ValueError(f"{path}: codebase_version {version!r} is not supported (v2.0, v2.1, v3.0)")
    info["codebase_version"] = version
    for k, ft in info["features"].items():
        if not isinstance(ft, dict) or "dtype" not in ft or "shape" not in ft:
            raise ValueError(f"{path}: feature {k!r} lacks dtype or shape")
        if not isinstance(ft["dtype"], str):
            raise ValueError(f"{path}: feature {k!r} has dtype {ft['dtype']!r}, not a string")
        shape = ft["shape"]
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_DIM for d in shape)):
            raise ValueError(f"{path}: feature {k!r} has shape {shape!r}; expected a list of at most 8 positive "
                             f"integers, each at most {MAX_DIM}")
        check_allocation(_feature_bytes(ft), path, f"one frame of feature {k!r} (shape {shape})")
    fps = info.get("fps")
    if fps is not None and (not isinstance(fps, (int, float)) or isinstance(fps, bool) or not 0 < fps < 1e6):
        raise ValueError(f"{path}: fps must be a positive number, got {fps!r}")
    chunks = info.get("chunks_size")
    if chunks is not None and (not isinstance(chunks, int) or isinstance(chunks, bool) or chunks <= 0):
        raise ValueError(f"{path}: chunks_size must be a positive integer, got {chunks!r}")
    total = info.get("total_frames")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
        raise ValueError(f"{path}: total_frames must be a non-negative integer, got {total!r}")
    return info


MAX_DIM = 2**31 - 1  # one dimension of a feature's shape (their product is checked against memory)


def _feature_bytes(ft: dict) -> int:
    """Bytes of one frame of a feature, at most 8 per value (image / video: one per pixel channel)."""
    per = 1 if ft["dtype"] in ("image", "video") else 8
    return int(np.prod(ft["shape"], dtype=object)) * per


def _parquet_rows(f: Path) -> int:
    """The rows a data file declares in its footer, read before its columns. (Per-column value counts are not
    checked here: pyarrow 26 aborts the process, an uncaught C++ exception, on some damaged column metadata that
    ``read_table`` reports as an error; a cell holding more values than its feature's shape is refused after the
    file is read.)"""
    _, pq = _pyarrow()

    try:
        return int(pq.ParquetFile(f).metadata.num_rows)
    except Exception as e:  # pyarrow's errors on a truncated or corrupted file do not name it
        raise ValueError(f"{f}: not a readable parquet file ({one_line(e)})") from None


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


def _obs_key_names(root: Path, obs_keys: list[str]) -> list[str]:
    """relive's dict-observation key of each feature: the name without ``observation.``, other dots as ``_``
    (``observation.images.top`` -> ``images_top``, ``observation.state`` -> ``state``)."""
    keys = []
    for k in obs_keys:
        key = k.removeprefix("observation.").replace(".", "_").replace("-", "_") if k != "observation" else "obs"
        if not key.isidentifier():
            raise ValueError(f"{root}: feature {k!r} gives observation key {key!r}, not an identifier")
        keys.append(key)
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"{root}: features {obs_keys} give the same observation key(s) {dup}")
    return keys


def _image_layout(ft: dict, name: str, where) -> tuple[int, int, int, bool]:
    """(C, H, W, channels_first) of an image/video feature; LeRobot's shape is [H, W, C] with names
    ``["height", "width", "channels"]`` (``names`` starting with a channel name means [C, H, W])."""
    shape = [int(x) for x in ft["shape"]]
    if len(shape) != 3:
        raise ValueError(f"{where}: image feature {name!r} has shape {shape}; expected [height, width, channels]")
    names = ft.get("names") or []
    first = bool(names) and str(names[0]).lower().startswith("channel")
    c, h, w = (shape[0], shape[1], shape[2]) if first else (shape[2], shape[0], shape[1])
    return c, h, w, first


def _image_column(col, ft: dict, name: str, file: Path) -> np.ndarray:
    """An "image" feature's parquet column (structs of encoded PNG / JPEG bytes, the ``datasets.Image`` storage)
    decoded to uint8 [N, C, H, W]."""
    from PIL import Image, UnidentifiedImageError  # (Pillow, optional: relive[data])

    c, h, w, _ = _image_layout(ft, name, file)
    out = np.empty((len(col), c, h, w), np.uint8)
    for i, cell in enumerate(col.to_pylist()):
        data = cell.get("bytes") if isinstance(cell, dict) else cell
        if not data:
            raise ValueError(f"{file}: image feature {name!r} row {i} holds no bytes (images stored as separate "
                             "files by path are not read)")
        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.size != (w, h):  # from the header: a small file can declare a huge image
                    raise ValueError(f"{file}: image feature {name!r} row {i} is {im.size[0]}x{im.size[1]} pixels "
                                     f"(width x height) but meta/info.json says {w}x{h}; not decoded")
                arr = np.asarray(im)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
            raise ValueError(f"{file}: image feature {name!r} row {i} is not a decodable image "
                             f"({one_line(e)})") from None
        out[i] = _hwc_to_chw(arr, (c, h, w), f"{file}: image feature {name!r} row {i}")
    return out


def _hwc_to_chw(arr: np.ndarray, chw: tuple[int, int, int], where: str) -> np.ndarray:
    if arr.dtype != np.uint8:
        raise ValueError(f"{where}: {arr.dtype} pixels; relive reads 8-bit images")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape != (chw[1], chw[2], chw[0]):
        raise ValueError(f"{where}: decoded to {list(arr.shape)} (height, width, channels) but meta/info.json says "
                         f"{[chw[1], chw[2], chw[0]]}")
    return arr.transpose(2, 0, 1)


def _read_video(root: Path, info: dict, key: str, episodes: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                timestamp: np.ndarray) -> np.ndarray:
    """A "video" feature's frames for every row, uint8 [N, C, H, W]: each episode's mp4 (v2.x: one file per
    episode; v3.0: the file and ``from_timestamp`` in meta/episodes) decoded with PyAV, and each row given the
    frame nearest to its ``timestamp`` (+ the episode's ``from_timestamp``), which must lie within half a frame
    period."""
    try:
        import av
    except ModuleNotFoundError:
        raise ValueError(f"{root}: video feature {key!r} needs PyAV to decode: pip install av (or read with "
                         "cameras='skip')") from None
    c, h, w, _ = _image_layout(info["features"][key], key, root)
    fps = float(info.get("fps") or 0)
    if fps <= 0:
        raise ValueError(f"{root}: meta/info.json has no fps; video frames cannot be matched to rows")
    template = info.get("video_path")
    if not template:
        raise ValueError(f"{root}: feature {key!r} is a video but meta/info.json has no video_path")
    where = _video_locations(root, info, key, episodes)
    out = np.empty((int(lengths.sum()), c, h, w), np.uint8)
    by_file: dict[Path, list[tuple[int, int, int, float]]] = {}  # the episodes each file holds, in order
    for e, start, length in zip(episodes.tolist(), starts.tolist(), lengths.tolist(), strict=True):
        fields, offset = where[e]
        rel = format_template(template, fields, root / "meta" / "info.json", "video_path")
        path = inside(root, rel, f"video file for feature {key!r} (episode {e})")
        if not path.is_file():
            raise ValueError(f"{root}: video file {rel} for feature {key!r} (episode {e}) is missing")
        by_file.setdefault(path, []).append((e, start, length, offset))
    for path, eps in by_file.items():
        rows = np.concatenate([np.arange(start, start + length) for _, start, length, _ in eps])
        want = np.concatenate([timestamp[start:start + length].astype(np.float64) + offset
                               for _, start, length, offset in eps])
        _decode_nearest(av, path, (c, h, w), fps, want, rows, out, eps)
    return out


def _decode_nearest(av, path: Path, chw: tuple[int, int, int], fps: float, want: np.ndarray, rows: np.ndarray,
                    out: np.ndarray, eps: list) -> None:
    """Decode ``path`` frame by frame into ``out[rows]``: each row gets the frame nearest to its time in ``want``
    (the earlier of two equally near), which must lie within half a frame period. The frame size is checked
    against the feature's shape before any frame is converted; no frame is kept beyond the rows that use it."""
    c, h, w = chw
    tol = 0.5 / fps + 1e-6
    order = np.argsort(want, kind="stable")
    sorted_want = want[order]
    best = np.full(want.size, np.inf)
    times: list[float] = []
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path}: no video stream")
            stream = container.streams.video[0]
            size = (stream.codec_context.width, stream.codec_context.height)
            if size != (w, h) and size != (0, 0):
                raise ValueError(f"{path}: frames are {size[0]}x{size[1]} (width x height) but meta/info.json says "
                                 f"{w}x{h}; not decoded")
            for frame in container.decode(stream):
                if (frame.width, frame.height) != (w, h):
                    raise ValueError(f"{path}: frame {len(times)} is {frame.width}x{frame.height} (width x height) "
                                     f"but meta/info.json says {w}x{h}; not decoded")
                if frame.pts is None or frame.time_base is None:
                    raise ValueError(f"{path}: frame {len(times)} has no timestamp")
                t = float(frame.pts * frame.time_base)
                times.append(t)
                lo = np.searchsorted(sorted_want, t - tol, side="left")
                hi = np.searchsorted(sorted_want, t + tol, side="right")
                if lo == hi:
                    continue
                cand = order[lo:hi]
                gap = np.abs(want[cand] - t)
                better = cand[gap < best[cand]]
                if not better.size:
                    continue
                best[better] = np.abs(want[better] - t)
                rgb = frame.to_ndarray(format="rgb24")  # (a gray camera: its first channel)
                img = _hwc_to_chw(rgb[:, :, :1] if c == 1 else rgb, chw, f"{path}: frame {len(times) - 1}")
                out[rows[better]] = img
    except ValueError as err:
        if str(path) in str(err):  # a check above
            raise
        raise ValueError(f"{path}: not a decodable video ({one_line(err)})") from None
    except Exception as err:  # PyAV's errors on a damaged file (FFmpegError, UnicodeDecodeError of its metadata)
        raise ValueError(f"{path}: not a decodable video ({one_line(err)})") from None
    if not times:
        raise ValueError(f"{path}: no video frames")
    missing = np.flatnonzero(~np.isfinite(best))
    if missing.size:
        i = int(missing[0])
        ts = np.asarray(times)
        near = float(ts[np.argmin(np.abs(ts - want[i]))])
        bounds = np.cumsum([length for _, _, length, _ in eps])
        k = int(np.searchsorted(bounds, i, side="right"))
        e, j = eps[k][0], i - (int(bounds[k - 1]) if k else 0)
        raise ValueError(f"{path}: no frame within half a frame period of timestamp {want[i]:.4f} s (row {j} of "
                         f"episode {e}; nearest frame at {near:.4f} s; the video has {ts.size} "
                         f"frames from {ts.min():.4f} to {ts.max():.4f} s)")


def _video_locations(root: Path, info: dict, key: str, episodes: np.ndarray) -> dict[int, tuple[dict, float]]:
    """Episode -> (the ``video_path`` template's fields, the episode's first timestamp in the file)."""
    _, pq = _pyarrow()

    out: dict[int, tuple[dict, float]] = {}
    chunks_size = int(info.get("chunks_size") or CHUNKS_SIZE)
    if info["codebase_version"].startswith("v2."):  # one file per episode
        for e in episodes.tolist():
            out[e] = ({"episode_chunk": e // chunks_size, "video_key": key, "episode_index": e}, 0.0)
        return out
    cols = [f"videos/{key}/chunk_index", f"videos/{key}/file_index", f"videos/{key}/from_timestamp"]
    for f in _episode_files(root):
        names = _read_parquet(f, None).schema.names
        if any(c not in names for c in cols):
            raise ValueError(f"{f}: columns {cols} (where feature {key!r}'s frames are) are missing")
        t = _read_parquet(f, ["episode_index", *cols]).to_pydict()
        for e, ch, fi, ts in zip(*(t[c] for c in ["episode_index", *cols]), strict=True):
            out[int(e)] = ({"video_key": key, "chunk_index": int(ch), "file_index": int(fi)}, float(ts))
    missing = [e for e in episodes.tolist() if e not in out]
    if missing:
        raise ValueError(f"{root}: meta/episodes gives no video file for feature {key!r} of episodes {missing[:5]}")
    return out


def _episode_files(root: Path) -> list[Path]:
    """The v3.0 episode metadata files, each resolved inside the dataset directory."""
    return [inside(root, f.relative_to(root), "metadata file")
            for f in sorted((root / "meta" / "episodes").glob("*/*.parquet"))]


def _read_parquet(f: Path, columns: list[str] | None):
    """A metadata parquet file (the columns named; None: the schema only, as an empty table), its row count
    checked against memory first; errors name the file."""
    _, pq = _pyarrow()

    try:
        pf = pq.ParquetFile(f)
        if columns is None:
            return pf.schema_arrow.empty_table()
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise ValueError(f"{f}: column(s) {missing} are missing")
        check_allocation(int(pf.metadata.num_rows) * 8 * len(columns), f, "its episode records")
        return pf.read(columns=columns)
    except ValueError as e:
        if str(f) in str(e):
            raise
        raise ValueError(f"{f}: not a readable parquet file ({one_line(e)})") from None
    except Exception as e:  # pyarrow's errors on a truncated or corrupted file do not name it
        raise ValueError(f"{f}: not a readable parquet file ({one_line(e)})") from None


def _check_episode_lengths(root: Path, version: str, found: dict[int, int]) -> None:
    """Episode lengths of the data files against meta/episodes (v3.0 parquet, v2.x jsonl), where present."""
    _, pq = _pyarrow()

    declared: dict[int, int] = {}
    legacy = root / "meta" / "episodes.jsonl"
    if legacy.is_file():
        legacy = inside(root, "meta/episodes.jsonl", "metadata file")
        for i, line in enumerate(legacy.read_text().splitlines()):
            if line.strip():
                try:
                    d = json.loads(line)
                    declared[int(d["episode_index"])] = int(d["length"])
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f"{legacy}: line {i + 1} is not an episode record with integer episode_index "
                                     f"and length ({one_line(e)})") from None
    else:
        for f in _episode_files(root):
            t = _read_parquet(f, ["episode_index", "length"])
            declared.update(zip(t.column("episode_index").to_pylist(), t.column("length").to_pylist(), strict=True))
    if not declared:
        return
    if set(declared) != set(found):
        missing = sorted(set(declared) - set(found))[:5]
        extra = sorted(set(found) - set(declared))[:5]
        raise ValueError(f"{root}: the data files and meta/episodes disagree on the episodes (missing from data: "
                         f"{missing}, not in meta: {extra})")
    for ep, length in found.items():
        if declared[ep] != length:
            raise ValueError(f"{root}: episode {ep} has {length} frames in data/ but meta/episodes says {declared[ep]}")


# -- writing -------------------------------------------------------------------------------------------------
def write_lerobot(path: str | Path, rows: dict, *, fps: int = 30, task: str = "relive",
                  robot_type: str | None = None, env_id: str | None = None, extra_metadata: dict | None = None,
                  overwrite: bool = False, images: str = "png") -> Path:
    """Write relive rows as a LeRobot v3.0 dataset directory at ``path`` (see the module docstring).

    Dict observations: each key becomes ``observation.<key>``; uint8 [C, H, W] keys (C = 1 or 3) are cameras, written
    as "image" features (PNG in the parquet, ``images="png"``) or "video" features (``images="video"``: one
    lossless H.264 mp4 per episode, libx264rgb at qp 0, needs PyAV); the other keys are float32
    vectors, with ``next.observation.<key>`` beside them. Atomic: written to a hidden staging directory beside
    ``path``, then renamed into place; an existing ``path`` is refused unless ``overwrite`` (then swapped out only
    once the new dataset is complete)."""
    pa, pq = _pyarrow()

    target = Path(path)
    if target.exists() and not overwrite:
        raise ValueError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
    if not isinstance(fps, int) or fps <= 0:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    if images not in ("png", "video"):
        raise ValueError(f"images must be 'png' or 'video', got {images!r}")
    n = check_columns(rows, f"rows for {target}")
    if n == 0:
        raise ValueError(f"rows for {target}: no rows to write")
    lengths = np.array([s.stop - s.start for s in split_episodes(rows)], np.int64)
    values, features, cameras = _frame_columns(rows, n, lengths, fps, images, target)
    in_parquet = {k: v for k, v in values.items() if features[k]["dtype"] != "video"}
    table = pa.table({k: _image_arrow(v) if features[k]["dtype"] == "image" else _arrow(v)
                      for k, v in in_parquet.items()})

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target.parent))
    try:
        file_of_episode = _write_data_files(pq, staging, table, lengths)
        num_episodes, bounds = lengths.size, np.r_[0, np.cumsum(lengths)]
        episodes = {"episode_index": np.arange(num_episodes, dtype=np.int64),
                    "tasks": pa.array([[task]] * num_episodes, pa.list_(pa.string())), "length": lengths,
                    "data/chunk_index": np.array([c for c, _ in file_of_episode], np.int64),
                    "data/file_index": np.array([f for _, f in file_of_episode], np.int64),
                    "dataset_from_index": bounds[:-1].astype(np.int64), "dataset_to_index": bounds[1:].astype(np.int64)}
        for key in cameras if images == "video" else ():
            episodes |= _write_videos(staging, key, values[key], lengths, fps)
        episodes |= _episode_stats(pa, values, cameras, bounds)
        episodes["meta/episodes/chunk_index"] = np.zeros(num_episodes, np.int64)
        episodes["meta/episodes/file_index"] = np.zeros(num_episodes, np.int64)
        ep_path = staging / EPISODES_PATH.format(chunk_index=0, file_index=0)
        ep_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in episodes.items()}),
                       ep_path)
        _write_tasks(staging / "meta" / "tasks.parquet", [task])
        stats = {k: {s: v.tolist() for s, v in _feature_stats(arr, k in cameras).items()} for k, arr in values.items()}
        (staging / "meta" / "stats.json").write_text(json.dumps(stats, indent=1))
        info = {"codebase_version": CODEBASE_VERSION, "robot_type": robot_type, "total_episodes": num_episodes,
                "total_frames": n, "total_tasks": 1, "chunks_size": CHUNKS_SIZE,
                "data_files_size_in_mb": DATA_FILE_MB, "video_files_size_in_mb": 200, "fps": fps,
                "splits": {"train": f"0:{num_episodes}"}, "data_path": DATA_PATH,
                "video_path": VIDEO_PATH if cameras and images == "video" else None,
                "features": features}
        (staging / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        relive = {"writer": "relive", "env_id": env_id, **(extra_metadata or {})}
        (staging / RELIVE_META).write_text(json.dumps(relive, indent=1, allow_nan=True, default=str))
        fsync_tree(staging)
        if target.exists() and not overwrite:  # made meanwhile by another process
            raise ValueError(f"{target} already exists; pass overwrite=True (--overwrite) to replace it")
        swap_into_place(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the old dataset, after a swap
    return target.resolve()


def _frame_columns(rows: dict, n: int, lengths: np.ndarray, fps: int, images: str,
                   where) -> tuple[dict, dict, list[str]]:
    """Every frame's values by feature name (observations, action, reward, done, next observations, the default
    features), their ``info.json`` features in the same order, and the camera keys."""
    act = np.asarray(rows["action"])
    action: np.ndarray
    act_ft: dict[str, Any]
    if act.ndim == 1 and act.dtype.kind in "iu":  # discrete: an int64 (1,) feature
        action, act_ft = act.astype(np.int64), {"dtype": "int64", "shape": [1], "names": None}
    else:
        action = act.astype(np.float32).reshape(n, -1)
        act_ft = {"dtype": "float32", "shape": [action.shape[1]],
                  "names": [f"action_{i}" for i in range(action.shape[1])]}
    episode_index = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    frame_index = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    obs_values, obs_features, cameras = _obs_columns(rows, n, images, where)
    values = {
        **{k: v for k, v in obs_values.items() if not k.startswith("next.")}, "action": action,
        "next.reward": np.asarray(rows["reward"], np.float32),
        "next.done": np.asarray(rows["terminated"], bool),
        **{k: v for k, v in obs_values.items() if k.startswith("next.")},
        "timestamp": (frame_index / fps).astype(np.float32), "frame_index": frame_index,
        "episode_index": episode_index, "index": np.arange(n, dtype=np.int64),
        "task_index": np.zeros(n, np.int64)}
    features = {
        **{k: v for k, v in obs_features.items() if not k.startswith("next.")}, "action": act_ft,
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        **{k: v for k, v in obs_features.items() if k.startswith("next.")},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in DEFAULT_FEATURES[1:]}}
    for ft in features.values():
        if ft["dtype"] != "video":
            ft["fps"] = fps  # (v3.0 records it per non-video feature)
    return values, features, cameras


def _write_data_files(pq, staging: Path, table, lengths: np.ndarray) -> list[tuple[int, int]]:
    """The data files: whole episodes, one row group each, a new file past DATA_FILE_MB (a new chunk directory
    every CHUNKS_SIZE files); returns each episode's (chunk, file) index."""
    bytes_per_row = table.nbytes / table.num_rows
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
    assert writer is not None  # (at least one episode: write_lerobot refuses empty rows)
    writer.close()
    return file_of_episode


def _write_videos(staging: Path, key: str, frames: np.ndarray, lengths: np.ndarray, fps: int) -> dict:
    """One mp4 per episode of camera ``key`` (file_index = episode within its chunk, from_timestamp 0); returns the
    episodes-metadata columns that locate them."""
    bounds = np.r_[0, np.cumsum(lengths)]
    for e in range(lengths.size):
        out = staging / VIDEO_PATH.format(video_key=key, chunk_index=e // CHUNKS_SIZE, file_index=e % CHUNKS_SIZE)
        write_video(out, frames[bounds[e]:bounds[e + 1]], fps)
    episode = np.arange(lengths.size, dtype=np.int64)
    return {f"videos/{key}/chunk_index": episode // CHUNKS_SIZE, f"videos/{key}/file_index": episode % CHUNKS_SIZE,
            f"videos/{key}/from_timestamp": np.zeros(lengths.size), f"videos/{key}/to_timestamp": lengths / fps}


def _episode_stats(pa, values: dict, cameras: list[str], bounds: np.ndarray) -> dict:
    """The episodes-metadata columns ``stats/<feature>/<stat>``: each feature's stats per episode."""
    per_episode = [{k: _feature_stats(v[bounds[e]:bounds[e + 1]], k in cameras) for k, v in values.items()}
                   for e in range(bounds.size - 1)]
    columns = {}
    for k in values:
        for stat in per_episode[0][k]:
            kind = pa.int64() if stat == "count" else pa.float64()
            if k in cameras and stat != "count":  # [C, 1, 1] per episode
                kind = pa.list_(pa.list_(kind))
            columns[f"stats/{k}/{stat}"] = pa.array([s[k][stat].tolist() for s in per_episode], pa.list_(kind))
    return columns


def _obs_columns(rows: dict, n: int, images: str, where) -> tuple[dict, dict, list[str]]:
    """The observation features of ``write_lerobot``: (values, features, camera feature names). Flat rows give
    ``observation.state`` + ``next.observation.state``; dict rows one feature per key (see ``write_lerobot``)."""
    if not isinstance(rows["obs"], dict):
        obs = np.asarray(rows["obs"], np.float32).reshape(n, -1)
        names = [f"state_{i}" for i in range(obs.shape[1])]
        ft = {"dtype": "float32", "shape": [obs.shape[1]], "names": names}
        return ({"observation.state": obs, "next.observation.state": np.asarray(rows["next_obs"], np.float32)
                 .reshape(n, -1)}, {"observation.state": ft, "next.observation.state": dict(ft)}, [])
    values: dict[str, np.ndarray] = {}
    features: dict[str, dict[str, Any]] = {}
    cameras: list[str] = []
    for key, arr in rows["obs"].items():
        arr, name = np.asarray(arr), f"observation.{key}"
        if arr.dtype == np.uint8 and arr.ndim == 4:  # a camera: [N, C, H, W]
            c, h, w = arr.shape[1:]
            if c not in (1, 3):
                raise ValueError(f"rows for {where}: image key {key!r} has {c} channels; LeRobot cameras are written "
                                 "with 1 (gray) or 3 (RGB)")
            values[name] = arr
            features[name] = {"dtype": "image" if images == "png" else "video", "shape": [h, w, c],
                              "names": ["height", "width", "channels"]}
            cameras.append(name)
        else:
            flat = arr.astype(np.float32).reshape(n, -1)
            nxt = np.asarray(rows["next_obs"][key], np.float32).reshape(n, -1)
            ft = {"dtype": "float32", "shape": [flat.shape[1]], "names": [f"{key}_{i}" for i in range(flat.shape[1])]}
            values[name], values[f"next.{name}"] = flat, nxt
            features[name], features[f"next.{name}"] = ft, dict(ft)
    return values, features, cameras


def _image_arrow(v: np.ndarray):
    """uint8 [N, C, H, W] as LeRobot's "image" column: structs {bytes: PNG, path: null} (``datasets.Image``)."""
    from PIL import Image  # (Pillow, optional: relive[data])

    pa, _ = _pyarrow()

    cells = []
    for img in v:
        buf = io.BytesIO()
        hwc = img.transpose(1, 2, 0)
        Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc).save(buf, format="PNG")
        cells.append({"bytes": buf.getvalue(), "path": None})
    return pa.array(cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def write_video(path: Path, frames: np.ndarray, fps: int) -> None:
    """uint8 [T, C, H, W] frames as a lossless H.264 mp4 (libx264rgb at qp 0; a gray camera as R = G = B)."""
    try:
        import av
    except ModuleNotFoundError:
        raise ValueError("images='video' needs PyAV: pip install av (or write PNG images: images='png')") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264rgb", rate=fps)
        stream.width, stream.height = int(frames.shape[3]), int(frames.shape[2])
        stream.pix_fmt, stream.options = "rgb24", {"qp": "0"}  # lossless
        for img in frames:
            hwc = np.ascontiguousarray(np.broadcast_to(img, (3, *img.shape[1:])).transpose(1, 2, 0))  # gray: R=G=B
            for packet in stream.encode(av.VideoFrame.from_ndarray(hwc, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _feature_stats(v: np.ndarray, camera: bool) -> dict[str, np.ndarray]:
    """``_stats``; for a camera (uint8 [N, C, H, W]) per channel over all pixels, scaled to [0, 1] and shaped
    [C, 1, 1], as LeRobot's ``compute_stats`` keeps image statistics."""
    if not camera:
        return _stats(v)
    c = v.shape[1]
    st = _stats(v.transpose(0, 2, 3, 1).reshape(-1, c) / 255.0)
    st = {k: (a.reshape(c, 1, 1) if k != "count" else np.array([len(v)], np.int64)) for k, a in st.items()}
    return st


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
    sources = {"online": ONLINE, "offline": OFFLINE, "all": None}
    if source not in sources:
        raise ValueError(f"source must be one of {sorted(sources)}, got {source!r}")
    st = buffer.storage
    eps = st.episodes.live(sources[source])
    slots = st.episode_slots(eps.start, eps.length, eps.source)
    if not slots.size:
        raise ValueError(f"the buffer holds no {source} rows")
    # (read, not columns: with dedup_next_obs there is no next_obs column)
    return {k: st.read(k, slots) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
