"""Datasets in the Minari format (HDF5 backend): write relive columns as episodes, read any local dataset.

Datasets live under a root directory (default ``data/minari`` in the working directory, or
``$MINARI_DATASETS_PATH``); nothing is ever downloaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from relive.data.frame_stacks import declared
from relive.data.rows import check_columns, obs_parts, split_episodes
from relive.data.trust import inside, one_line, open_hdf5, read_json_object
from relive.files import fsync_tree, swap_into_place

DEFAULT_ROOT = Path("data") / "minari"


def default_root() -> Path:
    return Path(os.environ.get("MINARI_DATASETS_PATH", DEFAULT_ROOT))


@contextlib.contextmanager
def _root(root: str | Path | None):
    old = os.environ.get("MINARI_DATASETS_PATH")
    # minari joins relative roots twice: always hand it an absolute path
    os.environ["MINARI_DATASETS_PATH"] = str((Path(root) if root is not None else default_root()).resolve())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def write_minari(dataset_id: str, rows: dict, env_id: str, *, root: str | Path | None = None,
                 algorithm_name: str = "relive", description: str = "", ref_min_score: float | None = None,
                 ref_max_score: float | None = None, extra_metadata: dict | None = None,
                 overwrite: bool = False) -> Path:
    """Write rows as a Minari dataset. Within an episode next_obs[t] must equal obs[t + 1] (Minari stores one
    observation sequence per episode); a trailing unfinished episode is stored as is (no flag).

    Atomic: the dataset is written beside, in a hidden staging directory under ``root`` (never listed), then
    moved into place in one rename; an existing dataset of the same id is refused unless ``overwrite``, and
    then swapped out atomically (Linux ``renameat2(RENAME_EXCHANGE)``) only once the new one is complete: a
    process killed at any moment leaves the old dataset or the new one, never a partial one."""
    import minari  # (optional: relive[data])
    from minari.data_collector import EpisodeBuffer

    root = Path(root) if root is not None else default_root()
    target = root / dataset_id
    if target.exists() and not overwrite:
        raise ValueError(f"dataset {dataset_id!r} already exists under {root}; pass overwrite=True "
                         "(`relive data make ... --overwrite`) to replace it")
    check_columns(rows, f"dataset {dataset_id!r}")
    obs_all, nxt_all = obs_parts(rows, "obs"), obs_parts(rows, "next_obs")
    buffers = []
    for i, sl in enumerate(split_episodes(rows)):
        episode_obs = {}
        for key in obs_all:  # dict observations: every key
            obs, nxt = obs_all[key][sl], nxt_all[key][sl]
            if len(obs) > 1 and not np.allclose(obs[1:], nxt[:-1]):
                t = int(np.flatnonzero(~np.isclose(obs[1:], nxt[:-1]).all(axis=tuple(range(1, obs.ndim))))[0])
                what = f" key {key!r}" if key else ""
                raise ValueError(f"dataset {dataset_id!r}: episode {i} breaks at step {t}{what}: next_obs[{t}] != "
                                 f"obs[{t + 1}]")
            episode_obs[key] = np.concatenate([obs, nxt[-1:]])
        buffers.append(EpisodeBuffer(
            id=i, observations=episode_obs if isinstance(rows["obs"], dict) else episode_obs[""],
            actions=np.asarray(rows["action"][sl]),
            rewards=list(np.asarray(rows["reward"][sl], np.float64)),
            terminations=list(np.asarray(rows["terminated"][sl], bool)),
            truncations=list(np.asarray(rows["truncated"][sl], bool))))
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    try:
        with _root(staging), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is set to None.*")  # author / permalink nags
            from relive.envs import make_env  # (gymnasium, optional: imported only where an env is made)

            env = make_env(env_id)  # the spaces as relive sees them (goal-conditioned dicts are flattened)
            obs_space = env.observation_space if not isinstance(rows["obs"], dict) else _dict_space(obs_all)
            minari.create_dataset_from_buffers(
                dataset_id=dataset_id, buffer=buffers, env=env_id, algorithm_name=algorithm_name,
                observation_space=obs_space, action_space=env.action_space,
                description=description or None, ref_min_score=ref_min_score, ref_max_score=ref_max_score,
                data_format="hdf5")
        staged = staging / dataset_id
        if extra_metadata:
            (staged / "relive.json").write_text(json.dumps(extra_metadata, indent=1, allow_nan=True))
        fsync_tree(staged)
        # namespace metadata Minari keeps beside the datasets (relive/namespace_metadata.json, ...)
        for meta in staging.rglob("namespace_metadata.json"):
            dst = root / meta.relative_to(staging)
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(meta, dst)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and not overwrite:  # made meanwhile by another process
            raise ValueError(f"dataset {dataset_id!r} already exists under {root}; pass overwrite=True to replace it")
        swap_into_place(staged, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the old dataset, after a swap
    return target.resolve()


def _dict_space(parts: dict[str, np.ndarray]):
    """A Dict of Boxes for dict observation columns: uint8 keys in [0, 255], others unbounded."""
    import gymnasium as gym  # (gymnasium, optional: relive[envs])

    def box(a):
        if a.dtype.kind in "iu":
            info = np.iinfo(a.dtype)
            return gym.spaces.Box(int(info.min), int(info.max), a.shape[1:], a.dtype)
        return gym.spaces.Box(-np.inf, np.inf, a.shape[1:], a.dtype)

    return gym.spaces.Dict({k: box(v) for k, v in parts.items()})


STAGING_PREFIX = ".relive-partial-"  # hidden: list_local skips it


def read_minari(dataset: str | os.PathLike, root: str | Path | None = None, *,
                flatten: bool = True, frame_stack=None) -> tuple[dict, dict]:
    """Columns and metadata of a local Minari dataset, given its id (under ``root``) or its directory.

    A Dict observation space is flattened into one array per row by default (keys in the space's order, as relive's
    envs flatten it); ``flatten=False`` keeps ``obs`` / ``next_obs`` as dicts key -> array, each key with its own
    shape and dtype (for ``ReplayBuffer(obs_shape={key: (shape, dtype), ...})``). ``frame_stack``: the observation
    (a number of frames or a FrameStack) or camera keys of a Dict one (``{"image": 3}``, with ``flatten=False``)
    declared stacks of frames: the rows keep one frame a step, the declaration is checked and recorded in
    ``meta["frame_stack"]`` for :func:`relive.data.frame_stacks.frame_stack_buffer`, which stores each frame once
    and rebuilds the stacks when sampled."""
    if frame_stack is not None and flatten and isinstance(frame_stack, dict) and "num_frames" not in frame_stack:
        raise ValueError("read_minari: frame_stack names observation keys: read the Dict observations with "
                         "flatten=False (a flattened observation has no keys)")
    import minari  # (optional: relive[data])

    dataset_id, data_dir, root = _locate(dataset, root)
    files = ", ".join(str(p) for p in sorted(data_dir.glob("*")) if p.name != "metadata.json") or str(data_dir)
    _check_dataset_files(data_dir)  # before minari opens anything: see docs/guarantees.md, "Datasets"
    try:
        ds = minari.MinariDataset(data_dir)  # the directory named, never <root>/<the id in its metadata>
    except Exception as e:  # minari raises several types for a missing or broken dataset
        raise ValueError(f"cannot load Minari dataset {dataset_id!r} from {data_dir} ({files}): "
                         f"{one_line(e)}") from None
    try:
        rows, meta = _read_episodes(ds, dataset_id, flatten)
    except ValueError as e:
        if str(data_dir) in str(e):
            raise
        text = " ".join(str(e).split())  # relive's own checks name the dataset id: the file is added
        raise ValueError(f"{files}: {text}" if dataset_id in text else
                         f"cannot read Minari dataset {dataset_id!r}: {files}: {one_line(e)}") from None
    except Exception as e:  # h5py / minari errors on a truncated or corrupted file do not name it
        raise ValueError(f"cannot read Minari dataset {dataset_id!r}: {files} is unreadable or corrupted "
                         f"({one_line(e)}); regenerate it (`relive data make ... --overwrite`)") from None
    meta["path"] = str(data_dir.parent.resolve())
    refs = task_references(root, dataset_id) if root is not None else {}
    for key in ("ref_min_return", "ref_max_return"):  # a random level never records R_expert itself
        if meta[key] is None:
            meta[key] = refs.get(key)
    if frame_stack is not None:  # (the metadata of a dataset read without it stays as it was)
        meta["frame_stack"] = declared(rows, frame_stack, f"Minari dataset {dataset_id!r}")
    return rows, meta


REFERENCES = "references.json"


def task_references(root: str | Path, dataset_id: str) -> dict:
    """The reference returns that the levels knowing R_expert wrote beside a dataset (``<root>/<namespace>/
    references.json``, e.g. ``data/minari/relive/hopper-v5/references.json``); {} when there are none."""
    path = Path(root) / Path(dataset_id).parent / REFERENCES
    if not path.is_file():
        return {}
    return read_json_object(path)


def write_task_references(root: str | Path, dataset_id: str, refs: dict) -> Path:
    """Record ``refs`` (ref_min_return, ref_max_return, ...) for every dataset of ``dataset_id``'s namespace,
    so that a level made before them (the random one) reads them whatever the generation order."""
    path = Path(root) / Path(dataset_id).parent / REFERENCES
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(refs, indent=1, sort_keys=True))
    tmp.replace(path)
    return path


def _read_episodes(ds, dataset_id: str, flatten: bool = True) -> tuple[dict, dict]:
    """Columns and metadata of an opened Minari dataset (read_minari names the file on any error)."""
    flat_keys = _flat_keys(ds.spec.observation_space, dataset_id)
    dict_keys = flat_keys if not flatten else None  # the keys of observations kept as dicts
    keep_dict = dict_keys is not None
    cols: dict[str, list[Any]] = {c: [] for c in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for ep in ds.iterate_episodes():
        if dict_keys is not None:
            _flatten_obs(ep.observations, flat_keys, dataset_id, ep.id)  # the same checks of keys and lengths
            obs = {k: np.asarray(ep.observations[k]) for k in dict_keys}
            cols["obs"].append({k: v[:-1] for k, v in obs.items()})
            cols["next_obs"].append({k: v[1:] for k, v in obs.items()})
        else:
            flat = _flatten_obs(ep.observations, flat_keys, dataset_id, ep.id)
            cols["obs"].append(flat[:-1])
            cols["next_obs"].append(flat[1:])
        cols["action"].append(np.asarray(ep.actions))
        cols["reward"].append(np.asarray(ep.rewards, np.float32))
        cols["terminated"].append(np.asarray(ep.terminations, bool))
        trunc = np.asarray(ep.truncations, bool).copy()
        if not (trunc[-1] or ep.terminations[-1]):
            trunc[-1] = True  # an episode cut without a flag ends there (bootstrap, no terminal)
        cols["truncated"].append(trunc)
    rows = {k: ({key: np.concatenate([d[key] for d in v]) for key in dict_keys} if dict_keys is not None and k in
                ("obs", "next_obs") else np.concatenate(v)) for k, v in cols.items()}
    spec = ds.spec
    stored = ds.storage.metadata
    meta = {"dataset_id": dataset_id, "path": str(Path(spec.data_path).parent),
            "env_id": spec.env_spec.id if spec.env_spec else None,
            "ref_min_return": stored.get("ref_min_score"), "ref_max_return": stored.get("ref_max_score"),
            "total_episodes": spec.total_episodes, "total_steps": spec.total_steps}
    if flat_keys and not keep_dict:
        meta["flattened_observation_keys"] = flat_keys
    elif keep_dict:
        meta["observation_keys"] = flat_keys
    extra = Path(spec.data_path).parent / "relive.json"
    if extra.is_file():  # how relive made it, and its reference returns when Minari kept none
        extra = inside(extra.parent, extra.name, "relive.json")
        meta["relive"] = read_json_object(extra)
        for key in ("ref_min_return", "ref_max_return"):
            if meta[key] is None:
                meta[key] = meta["relive"].get(key)
    check_columns(rows, f"Minari dataset {dataset_id!r}")
    return rows, meta


def _flat_keys(space, dataset_id: str) -> list[str] | None:
    """None for a Box space; for a Dict of Boxes (goal-conditioned tasks such as Minari's D4RL PointMaze and
    AntMaze data) the keys in the space's order, which is the order gymnasium's FlattenObservation (and so
    relive's ``make_env``) concatenates them in: achieved_goal, desired_goal, observation."""
    import gymnasium as gym  # (gymnasium, optional: relive[envs])

    if isinstance(space, gym.spaces.Box):
        return None
    if isinstance(space, gym.spaces.Dict) and all(isinstance(s, gym.spaces.Box) for s in space.spaces.values()):
        return list(space.spaces)
    raise ValueError(f"{dataset_id}: observation space {space} is not supported (a Box, or a Dict of Boxes)")


def _flatten_obs(observations, keys: list[str] | None, dataset_id: str, episode: int) -> np.ndarray:
    if keys is None:
        obs = np.asarray(observations)
        if obs.dtype == object:
            raise ValueError(f"{dataset_id}: episode {episode} holds structured observations in a Box space")
        return obs
    if not isinstance(observations, dict) or set(observations) != set(keys):
        got = sorted(observations) if isinstance(observations, dict) else type(observations).__name__
        raise ValueError(f"{dataset_id}: episode {episode} observations have keys {got}, the space has {keys}")
    parts = [np.asarray(observations[k]) for k in keys]
    n = len(parts[0])
    if any(len(p) != n for p in parts):
        raise ValueError(f"{dataset_id}: episode {episode} observation parts differ in length "
                         f"{ {k: len(p) for k, p in zip(keys, parts, strict=True)} }")
    return np.concatenate([p.reshape(n, -1) for p in parts], axis=1)


def _locate(dataset: str | os.PathLike, root: str | Path | None) -> tuple[str, Path, Path | None]:
    """(dataset id, its ``data`` directory, the Minari root it lies in or None). A directory is read as named: its
    id comes from its metadata (for messages and the task's references.json, which are looked up only when the
    directory sits at ``<root>/<id>``), never to find another directory."""
    p = Path(dataset)
    meta = p / "data" / "metadata.json"
    if meta.is_file():  # a dataset directory
        dataset_id = _read_metadata(p / "data").get("dataset_id")
        if not isinstance(dataset_id, str) or not dataset_id:
            raise ValueError(f"{meta}: no dataset_id string")
        parts = Path(dataset_id).parts
        full = p.resolve()
        at_home = ".." not in parts and len(full.parts) > len(parts) and full.parts[-len(parts):] == parts
        return dataset_id, p / "data", full.parents[len(parts) - 1] if at_home else None
    root = Path(root) if root is not None else default_root()
    if not (root / str(dataset) / "data" / "metadata.json").is_file():
        known = list_local(root)
        raise ValueError(f"no Minari dataset {str(dataset)!r} under {root} (local datasets: {known or 'none'}); "
                         "generate one with `relive data make TASK LEVEL`")
    return str(dataset), root / str(dataset) / "data", root


MAX_SPACE_ELEMENTS = 1 << 26  # the elements of one observation or action (a 4096 x 4096 x 4 image)


def _read_metadata(data_dir: Path) -> dict:
    path = inside(data_dir.parent, Path("data") / "metadata.json", "metadata")
    return read_json_object(path)


def _check_dataset_files(data_dir: Path) -> None:
    """What minari would trust, checked first: the metadata and data file inside the dataset directory (symlinks
    resolved), the HDF5 format, both spaces recorded in the metadata (else minari builds the environment named in
    it, which imports code) with bounded shapes (a Box's bounds are allocated at its shape), the episode count equal
    to the episodes the file holds, and the file itself through ``check_hdf5``."""

    meta_path = data_dir / "metadata.json"
    meta = _read_metadata(data_dir)
    if meta.get("data_format", "hdf5") != "hdf5":
        raise ValueError(f"{meta_path}: data_format {meta.get('data_format')!r}: relive reads Minari datasets in the "
                         "hdf5 format only")
    for key in ("observation_space", "action_space"):
        if not isinstance(meta.get(key), str):
            raise ValueError(f"{meta_path}: no {key} recorded (minari would then build the environment named in "
                             "env_spec, running its code); refused")
        try:
            space = json.loads(meta[key])
        except ValueError as e:
            raise ValueError(f"{meta_path}: {key} is not JSON ({one_line(e)})") from None
        _check_space(space, f"{meta_path}: {key}")
    episodes = meta.get("total_episodes")
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 0:
        raise ValueError(f"{meta_path}: total_episodes must be a non-negative integer, got {episodes!r}")
    if not isinstance(meta.get("total_steps"), int) or meta["total_steps"] < 0:
        raise ValueError(f"{meta_path}: total_steps must be a non-negative integer, got {meta.get('total_steps')!r}")
    path = inside(data_dir.parent, Path("data") / "main_data.hdf5", "data file")
    if not path.is_file():
        raise ValueError(f"{data_dir}: no main_data.hdf5")
    with open_hdf5(path) as f:
        names = set(f.keys())
        if meta.get("jpeg_encoding", True):
            _check_jpeg_sizes(f, path, {"observations": json.loads(meta["observation_space"]),
                                        "actions": json.loads(meta["action_space"])})
    want = {f"episode_{i}" for i in range(min(episodes, len(names) + 1))}
    if episodes != len(names) or names != want:
        raise ValueError(f"{meta_path}: total_episodes = {episodes} but {path} holds {len(names)} entries "
                         f"({sorted(names)[:5]}{'...' if len(names) > 5 else ''}); expected episode_0 .. "
                         f"episode_{episodes - 1}")


def _image_paths(space, prefix: str) -> list[tuple[str, tuple[int, int]]]:
    """(path inside an episode group, (width, height)) of each space minari stores as JPEG
    (``minari...is_image_space``: a uint8 Box of 2 or 3 dimensions [H, W, ...], both at least 32); Dict keys and
    Tuple ``_index_i`` are groups, as minari writes them."""
    if space.get("type") == "Dict":
        return [p for k, sub in space["subspaces"].items() for p in _image_paths(sub, f"{prefix}/{k}")]
    if space.get("type") == "Tuple":
        return [p for i, sub in enumerate(space["subspaces"]) for p in _image_paths(sub, f"{prefix}/_index_{i}")]
    shape = space.get("shape") or []
    if (space.get("type") == "Box" and space.get("dtype") == "uint8" and len(shape) in (2, 3)
            and shape[0] >= 32 and shape[1] >= 32):
        return [(prefix, (shape[1], shape[0]))]
    return []


def _check_jpeg_sizes(f, path: Path, spaces: dict) -> None:
    """Minari decodes JPEG-encoded images into an array shaped by each episode's first image: every encoded image's
    size is read from its header and must be its space's, before minari decodes any."""
    import h5py  # (h5py, Pillow: optional, relive[data])
    from PIL import Image, UnidentifiedImageError

    images = [p for key, space in spaces.items() for p in _image_paths(space, key)]
    for episode in f:
        for rel, size in images:
            name = f"{episode}/{rel}"
            obj = f.get(name)
            if not isinstance(obj, h5py.Dataset):
                continue  # (minari reports the missing data)
            for i, data in enumerate(obj[()]):
                try:
                    with Image.open(io.BytesIO(np.asarray(data, np.uint8).tobytes())) as im:
                        got = im.size
                except (UnidentifiedImageError, OSError, ValueError, TypeError, Image.DecompressionBombError) as e:
                    raise ValueError(f"{path}: {name!r} row {i} is not a readable image ({one_line(e)})") from None
                if got != size:
                    raise ValueError(f"{path}: {name!r} row {i} is a {got[0]}x{got[1]} image (width x height) but its "
                                     f"space says {size[0]}x{size[1]}; not decoded")


def _check_space(space, where: str) -> None:
    """A serialized Minari space: Box (shape of non-negative integers, at most MAX_SPACE_ELEMENTS, bounds given in
    full or as one number), Discrete, MultiDiscrete, MultiBinary (bounded), Text, or a Dict / Tuple of them."""
    if not isinstance(space, dict) or not isinstance(space.get("type"), str):
        raise ValueError(f"{where}: not a serialized space (a JSON object with a 'type')")
    kind = space["type"]
    if kind == "Dict":
        subspaces = space.get("subspaces")
        if not isinstance(subspaces, dict):
            raise ValueError(f"{where}: a Dict space without 'subspaces'")
        for key, sub in subspaces.items():
            _check_space(sub, f"{where}[{key!r}]")
    elif kind == "Tuple":
        subspaces = space.get("subspaces")
        if not isinstance(subspaces, list):
            raise ValueError(f"{where}: a Tuple space without 'subspaces'")
        for i, sub in enumerate(subspaces):
            _check_space(sub, f"{where}[{i}]")
    elif kind in ("Box", "MultiBinary"):
        shape = space.get("shape") if kind == "Box" else space.get("n")
        shape = [shape] if isinstance(shape, int) else shape
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in shape)):
            raise ValueError(f"{where}: {kind} shape must be a list of non-negative integers, got {shape!r}")
        size = int(np.prod(shape, dtype=object)) if shape else 1
        if size > MAX_SPACE_ELEMENTS:
            raise ValueError(f"{where}: {kind} of shape {shape} ({size} elements) is larger than relive reads "
                             f"({MAX_SPACE_ELEMENTS} elements per row)")
        if kind == "Box" and not (isinstance(space.get("low"), list) and isinstance(space.get("high"), list)):
            raise ValueError(f"{where}: Box bounds must be lists (as minari writes them), not one number spread "
                             "over the shape")
    elif kind not in ("Discrete", "MultiDiscrete", "Text"):
        raise ValueError(f"{where}: space type {kind!r} is not supported")


def list_local(root: str | Path | None = None) -> list[str]:
    root = Path(root) if root is not None else default_root()
    if not root.is_dir():
        return []
    out = []
    for meta in sorted(root.glob("**/data/metadata.json")):
        if any(part.startswith(".") for part in meta.relative_to(root).parts):
            continue  # a dataset being written (staging) is never listed
        try:
            out.append(json.loads(meta.read_text())["dataset_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a complete dataset
    return out
