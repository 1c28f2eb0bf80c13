"""Fuzzing the dataset readers (issue 27): small files made by relive's own writers (npz, D4RL HDF5, Minari,
LeRobot parquet / JSON / mp4), mutated by hypothesis (bytes flipped, files cut short, JSON values replaced or
removed), then read the way ``--dataset`` reads them (``load_rows``). A reader either loads the file or raises a
``ValueError`` / ``OSError`` whose message names the dataset; never a KeyError, IndexError, TypeError, MemoryError
or any other exception. Few examples, small files: the suite stays a few seconds."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relive.data.d4rl_io import write_d4rl_hdf5
from relive.data.loaders import load_rows
from relive.data.minari_io import write_minari
from relive.data.npz_io import save_dataset
from relive.train.collector import collect_dataset

# FUZZ_N=500 explores further (random, not derandomized); the suite runs 25 fixed examples per case
FUZZ_N = int(os.environ.get("FUZZ_N", "0"))
FUZZ = settings(max_examples=FUZZ_N or 25, deadline=None, derandomize=not FUZZ_N, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """One small dataset of every format, written by relive (two 4-step episodes)."""
    base = tmp_path_factory.mktemp("originals")
    rows = collect_dataset("Pendulum-v1", 8, seed=0, max_episode_steps=4)
    out = {"npz": save_dataset(base / "d.npz", rows, env_id="Pendulum-v1"),
           "d4rl": write_d4rl_hdf5(base / "d.hdf5", rows),
           "minari": write_minari("fuzz/pend/d-v0", rows, "Pendulum-v1", root=base / "minari")}
    try:
        import pyarrow  # noqa: F401

        from relive.data.lerobot_io import write_lerobot

        out["lerobot"] = write_lerobot(base / "lerobot", rows, fps=10)
        cam = np.random.default_rng(0).integers(0, 256, (8, 3, 4, 4), dtype=np.uint8)
        img = {**rows, "obs": {"cam": cam, "state": rows["obs"]},
               "next_obs": {"cam": np.r_[cam[1:], cam[-1:]], "state": rows["next_obs"]}}
        out["lerobot-png"] = write_lerobot(base / "lerobot-png", img, fps=10)
        try:
            import av  # noqa: F401

            out["lerobot-video"] = write_lerobot(base / "lerobot-video", img, fps=10, images="video")
        except ModuleNotFoundError:
            pass
    except ModuleNotFoundError:
        pass
    return out


def _files(dataset: Path) -> list[Path]:
    return [dataset] if dataset.is_file() else sorted(p for p in dataset.rglob("*") if p.is_file())


def _read(dataset: Path, named: str) -> None:
    """Read as ``--dataset`` does; anything but a load or a ValueError / OSError naming ``named`` fails. What loads
    has a number per row in every column (no zero-width ``obs`` / ``action`` / ``next_obs``: issue 44)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rows, _ = load_rows(dataset)
        except (ValueError, OSError) as e:
            assert named in str(e), f"the error does not name {named}: {type(e).__name__}: {e}"
            assert "\n" not in str(e).strip(), f"not one line: {e}"
            return
    for c in ("obs", "action", "next_obs"):
        for k, arr in (rows[c].items() if isinstance(rows[c], dict) else [("", rows[c])]):
            assert 0 not in np.shape(arr)[1:], f"{c} {k}: zero-width column {np.shape(arr)} loaded"


def _copy(original: Path, into: Path) -> Path:
    target = into / original.name
    (shutil.copytree if original.is_dir() else shutil.copyfile)(original, target)
    return target


# one mutation of a file's bytes: flip some, cut it short, or repeat a piece of it
BYTE_EDITS = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                                        min_size=1, max_size=6)),
    st.tuples(st.just("cut"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("repeat"), st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 64))),
)


def _edit_bytes(path: Path, edit) -> None:
    data = bytearray(path.read_bytes())
    if not data:
        return
    kind, arg = edit
    if kind == "flip":
        for where, value in arg:
            data[int(where * len(data))] = value
    elif kind == "cut":
        data = data[: int(arg * len(data))]
    else:
        at, size = int(arg[0] * len(data)), arg[1]
        data[at:at] = data[at:at + size]
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", ["npz", "d4rl", "minari", "lerobot", "lerobot-png", "lerobot-video"])
@FUZZ
@given(pick=st.floats(0, 1, exclude_max=True), edit=BYTE_EDITS)
def test_mutated_bytes_load_or_give_one_named_error(originals, fmt, pick, edit):
    if fmt not in originals:
        pytest.skip(f"{fmt}: its optional dependency is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = _copy(originals[fmt], Path(tmp))
        files = _files(dataset)
        _edit_bytes(files[int(pick * len(files))], edit)
        _read(dataset, str(dataset) if dataset.is_dir() else dataset.name)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8)


def _json_paths(value, prefix=()):
    """Every path (tuple of keys / indices) into a JSON value, the value itself included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):
            yield from _json_paths(v, (*prefix, i))


def _replace(value, path, new):
    if not path:
        return new
    value[path[0]] = _replace(value[path[0]], path[1:], new) if new is not _DELETE or len(path) > 1 else None
    if new is _DELETE and len(path) == 1:
        del value[path[0]]
    return value


_DELETE = object()


@pytest.mark.parametrize("fmt, name, nested", [
    ("minari", "data/metadata.json", ("observation_space", "action_space")),
    ("lerobot", "meta/info.json", ()),
    ("lerobot-png", "meta/info.json", ()),
    ("lerobot-video", "meta/info.json", ()),
    ("lerobot", "meta/relive.json", ()),
])
@FUZZ
@given(pick=st.floats(0, 1, exclude_max=True), new=st.one_of(st.just(_DELETE), JSON_VALUES))
def test_mutated_json_loads_or_gives_one_named_error(originals, fmt, name, nested, pick, new):
    """A value anywhere in a dataset's JSON metadata replaced (or removed); spaces that Minari keeps as JSON
    strings inside its JSON are edited as JSON too."""
    if fmt not in originals:
        pytest.skip(f"{fmt}: its optional dependency is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = _copy(originals[fmt], Path(tmp))
        path = dataset / name
        doc = json.loads(path.read_text())
        for key in nested:  # strings holding JSON: decoded, so that their insides are mutated too
            doc[key] = json.loads(doc[key])
        paths = [p for p in _json_paths(doc) if p]  # (not the document itself)
        doc = _replace(doc, paths[int(pick * len(paths))], new)
        for key in nested:
            if isinstance(doc, dict) and key in doc and not isinstance(doc[key], str):
                doc[key] = json.dumps(doc[key])
        path.write_text(json.dumps(doc))
        _read(dataset, str(dataset))


def _hdf5_file(dataset: Path) -> Path:
    return dataset if dataset.is_file() else dataset / "data" / "main_data.hdf5"


HDF5_EDITS = st.one_of(
    st.just(("delete",)),
    st.just(("group",)),
    st.tuples(st.just("array"), st.lists(st.integers(0, 12), max_size=3),
              st.sampled_from(["f4", "f8", "i8", "u1", "?", "S3", "c8"])),
    st.tuples(st.just("soft link"), st.floats(0, 1, exclude_max=True)),
)


@pytest.mark.parametrize("fmt", ["d4rl", "minari"])
@FUZZ
@given(pick=st.floats(0, 1, exclude_max=True), edit=HDF5_EDITS)
def test_mutated_hdf5_structure_loads_or_gives_one_named_error(originals, fmt, pick, edit):
    """One dataset of the HDF5 file deleted, or replaced by a group, by an array of another shape and type, or by a
    soft link to another object of the file."""
    import h5py

    with tempfile.TemporaryDirectory() as tmp:
        dataset = _copy(originals[fmt], Path(tmp))
        with h5py.File(_hdf5_file(dataset), "a") as f:
            names: list[str] = []
            f.visit(names.append)
            name = names[int(pick * len(names))]
            del f[name]
            if edit[0] == "group":
                f.create_group(name)
            elif edit[0] == "array":
                f[name] = np.zeros(edit[1], edit[2])
            elif edit[0] == "soft link":
                others = [n for n in names if n != name and not n.startswith(name + "/")]
                f[name] = h5py.SoftLink("/" + others[int(edit[1] * len(others))])
        _read(dataset, str(dataset) if dataset.is_dir() else dataset.name)


@FUZZ
@given(pick=st.floats(0, 1, exclude_max=True), shape=st.lists(st.integers(0, 12), max_size=3),
       dtype=st.sampled_from(["f4", "f8", "i8", "u1", "?", "U3", "S3", "c8"]), drop=st.booleans())
def test_mutated_npz_columns_load_or_give_one_named_error(originals, pick, shape, dtype, drop):
    """One array of a relive .npz removed, or replaced by an array of another shape (0-d included) and type."""
    with np.load(originals["npz"], allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    name = sorted(arrays)[int(pick * len(arrays))]
    if drop:
        del arrays[name]
    else:
        arrays[name] = np.zeros(shape, dtype)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.npz"
        np.savez(path, **arrays)
        _read(path, path.name)


# the per-row columns of each format's file: relive .npz members, D4RL keys, Minari episode datasets
_WIDE = {"npz": ("obs", "action", "next_obs"), "d4rl": ("observations", "actions", "next_observations"),
         "minari": ("observations", "actions")}


@pytest.mark.parametrize("fmt", sorted(_WIDE))
@FUZZ
@given(pick=st.floats(0, 1, exclude_max=True), trailing=st.lists(st.integers(0, 3), min_size=1, max_size=2),
       dtype=st.sampled_from(["f4", "f8", "i8", "u1"]))
def test_zero_width_columns_give_one_named_error(originals, fmt, pick, trailing, dtype):
    """Issue 44: a per-row column (observations, actions) replaced by one with a zero among its trailing dimensions
    ((N, 0), (N, 2, 0), ...) in every format: refused naming the dataset (never loaded and left to train on NaN)."""
    import h5py

    trailing = [*trailing[:-1], 0] if 0 not in trailing else trailing
    with tempfile.TemporaryDirectory() as tmp:
        dataset = _copy(originals[fmt], Path(tmp))
        if fmt == "npz":
            with np.load(dataset, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            name = _WIDE[fmt][int(pick * 3)]
            arrays[name] = np.zeros((len(arrays[name]), *trailing), dtype)
            np.savez(dataset, **arrays)
        else:
            with h5py.File(_hdf5_file(dataset), "a") as f:
                names: list[str] = []
                f.visit(names.append)
                names = [n for n in names if n.rsplit("/", 1)[-1] in _WIDE[fmt] and isinstance(f[n], h5py.Dataset)]
                name = names[int(pick * len(names))]
                rows = len(f[name])
                del f[name]
                f[name] = np.zeros((rows, *trailing), dtype)
        _read(dataset, str(dataset) if dataset.is_dir() else dataset.name)
