"""Issue 27, items 3, 4 and 13: a dataset reads only files under its own directory, a Minari directory is read as
named, and a small file cannot make a reader allocate what it does not hold. Each test builds its files with
relive's own writers (then edits them the way an attacker or a careless copy would)."""

from __future__ import annotations

import io
import json
import shutil
import tracemalloc
import zipfile

import h5py
import numpy as np
import pytest

from relive.data.d4rl_io import read_d4rl_hdf5, write_d4rl_hdf5
from relive.data.minari_io import read_minari, write_minari
from relive.train.collector import collect_dataset, load_dataset, save_dataset


@pytest.fixture(scope="module")
def rows():
    return collect_dataset("Pendulum-v1", 20, seed=0, max_episode_steps=10)  # two 10-step episodes


def _peak_bytes(fn) -> tuple[int, BaseException | None]:
    """Peak of Python-traced memory (numpy arrays included) while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    err = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the caller, who checks it
        err = e
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, err


# -- D4RL ----------------------------------------------------------------------------------------------------
def _d4rl_with(path, rows, **replace):
    """A D4RL file written by relive, then keys replaced by ``replace[key](f, key)``."""
    write_d4rl_hdf5(path, rows)
    with h5py.File(path, "a") as f:
        for key, make in replace.items():
            del f[key]
            make(f, key)
    return path


def test_d4rl_external_storage_is_refused_not_read(tmp_path, rows):
    secret = tmp_path / "elsewhere.bin"
    secret.write_bytes(np.arange(60, dtype=np.float32).tobytes())
    path = _d4rl_with(tmp_path / "d.hdf5", rows, observations=lambda f, k: f.create_dataset(
        k, shape=(20, 3), dtype="f4", external=[(str(secret), 0, 240)]))
    with pytest.raises(ValueError, match=r"d\.hdf5: dataset 'observations' uses HDF5 external storage"):
        read_d4rl_hdf5(path)


def test_d4rl_external_link_and_virtual_dataset_are_refused(tmp_path, rows):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["obs"] = rows["obs"]
    path = _d4rl_with(tmp_path / "link.hdf5", rows,
                      observations=lambda f, k: f.__setitem__(k, h5py.ExternalLink(str(other), "/obs")))
    with pytest.raises(ValueError, match=r"link\.hdf5: 'observations' is an HDF5 external link to .*other\.h5"):
        read_d4rl_hdf5(path)

    def virtual(f, k):
        layout = h5py.VirtualLayout(shape=(20, 3), dtype="f4")
        layout[:] = h5py.VirtualSource(str(other), "obs", shape=(20, 3))
        f.create_virtual_dataset(k, layout)

    path = _d4rl_with(tmp_path / "virtual.hdf5", rows, observations=virtual)
    with pytest.raises(ValueError, match=r"virtual\.hdf5: dataset 'observations' is an HDF5 virtual dataset"):
        read_d4rl_hdf5(path)


def test_d4rl_declared_size_beyond_the_file_is_refused_before_allocating(tmp_path, rows):
    # chunked, never written: a few KB on disk, 24 MB when read (issue 27: 4.6 KB -> 1.2 GB)
    path = _d4rl_with(tmp_path / "big.hdf5", rows, observations=lambda f, k: f.create_dataset(
        k, shape=(2_000_000, 3), dtype="f4", chunks=(4096, 3)))
    assert path.stat().st_size < 64_000
    peak, err = _peak_bytes(lambda: read_d4rl_hdf5(path))
    assert isinstance(err, ValueError)
    assert "big.hdf5: dataset 'observations' declares shape (2000000, 3) (24000000 bytes) but stores only 0" in str(err)
    assert peak < 4_000_000


def test_d4rl_truncated_file_is_named(tmp_path, rows):
    path = write_d4rl_hdf5(tmp_path / "cut.hdf5", rows)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 200])
    with pytest.raises(ValueError, match=r"cut\.hdf5"):
        read_d4rl_hdf5(path)


# -- Minari --------------------------------------------------------------------------------------------------
def _minari(tmp_path, rows, name="t/pend/orig-v0"):
    return write_minari(name, rows, "Pendulum-v1", root=tmp_path / "minari")


def test_a_minari_directory_is_read_as_named_not_by_the_id_in_its_metadata(tmp_path, rows):
    orig = _minari(tmp_path, rows)
    copy = orig.parent / "edited-v0"  # a copy beside it: its metadata still says t/pend/orig-v0
    shutil.copytree(orig, copy)
    with h5py.File(copy / "data" / "main_data.hdf5", "a") as f:
        f["episode_0/rewards"][...] = 7.0
    got, meta = read_minari(copy)
    np.testing.assert_array_equal(got["reward"][:10], 7.0)  # the edited copy, not the original
    np.testing.assert_allclose(got["reward"][10:], rows["reward"][10:], rtol=1e-6)
    assert meta["path"] == str(copy.resolve()) and meta["dataset_id"] == "t/pend/orig-v0"
    original, _ = read_minari(orig)
    np.testing.assert_allclose(original["reward"], rows["reward"], rtol=1e-6)
    # a copy far from any Minari root reads the same
    far = tmp_path / "far" / "x"
    shutil.copytree(copy, far)
    np.testing.assert_array_equal(read_minari(far)[0]["reward"][:10], 7.0)


def test_minari_external_storage_is_refused(tmp_path, rows):
    path = _minari(tmp_path, rows)
    secret = tmp_path / "elsewhere.bin"
    secret.write_bytes(np.ones(10).tobytes())
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:
        del f["episode_0/rewards"]
        f.create_dataset("episode_0/rewards", shape=(10,), dtype="f8", external=[(str(secret), 0, 80)])
    with pytest.raises(ValueError, match=r"main_data\.hdf5: dataset 'episode_0/rewards' uses HDF5 external storage"):
        read_minari(path)


def test_minari_data_file_symlinked_outside_is_refused(tmp_path, rows):
    path = _minari(tmp_path, rows)
    outside = tmp_path / "outside.hdf5"
    (path / "data" / "main_data.hdf5").rename(outside)
    (path / "data" / "main_data.hdf5").symlink_to(outside)
    with pytest.raises(ValueError, match=r"data/main_data\.hdf5 resolves to .*outside\.hdf5, outside the dataset"):
        read_minari(path)


def _edit_metadata(path, **changes):
    meta_path = path / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    meta_path.write_text(json.dumps(meta))


def test_minari_declared_sizes_are_checked_before_minari_allocates(tmp_path, rows):
    path = _minari(tmp_path, rows)
    _edit_metadata(path, total_episodes=10**12)  # minari would allocate np.arange(total_episodes)
    with pytest.raises(ValueError, match=r"metadata\.json: total_episodes = 1000000000000 but .*main_data\.hdf5 "
                                         r"holds 2 entries"):
        read_minari(path)
    _edit_metadata(path, total_episodes=2, observation_space=json.dumps(
        {"type": "Box", "dtype": "float32", "shape": [100000, 100000], "low": -1.0, "high": 1.0}))
    with pytest.raises(ValueError, match=r"metadata\.json: observation_space: Box of shape \[100000, 100000\]"):
        read_minari(path)
    path = _minari(tmp_path, rows, "t/pend/big-v0")
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:  # never written: stored in 0 bytes
        del f["episode_1/rewards"]
        f.create_dataset("episode_1/rewards", shape=(3_000_000,), dtype="f8", chunks=(4096,))
    peak, err = _peak_bytes(lambda: read_minari(path))
    assert isinstance(err, ValueError) and "dataset 'episode_1/rewards' declares shape (3000000,)" in str(err)
    assert peak < 8_000_000


def test_minari_metadata_without_spaces_does_not_build_the_env_it_names(tmp_path, rows, monkeypatch):
    """minari builds the environment of ``env_spec`` when the spaces are missing: gym.make imports the module
    named in the file. Refused before minari runs."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_module.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "class Env:\n    def __init__(self, **kw):\n        raise RuntimeError('built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _minari(tmp_path, rows)
    meta = json.loads((path / "data" / "metadata.json").read_text())
    spec = json.loads(meta["env_spec"])
    spec.update(id="Evil-v0", entry_point="evil_env_module:Env")
    _edit_metadata(path, observation_space=None, env_spec=json.dumps(spec))
    with pytest.raises(ValueError, match=r"metadata\.json: no observation_space recorded"):
        read_minari(path)
    assert not marker.exists()


# -- npz -----------------------------------------------------------------------------------------------------
def test_npz_header_declaring_more_than_the_member_holds_is_refused_before_allocating(tmp_path, rows):
    path = save_dataset(tmp_path / "d.npz", rows)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9,)})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("zz_obs_huge.npy", header.getvalue() + b"\0" * 64)  # 4 GB declared, 64 bytes held
    peak, err = _peak_bytes(lambda: load_dataset(path))
    assert isinstance(err, ValueError)
    assert "d.npz: member 'zz_obs_huge.npy' declares shape (1000000000,)" in str(err)
    assert peak < 50_000_000


def test_npz_object_arrays_and_non_zip_files_are_one_line_errors(tmp_path, rows):
    path = save_dataset(tmp_path / "o.npz", rows)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("meta_x.npy", buf.getvalue())
    with pytest.raises(ValueError, match=r"o\.npz: member 'meta_x.npy' holds Python objects"):
        load_dataset(path)
    plain = tmp_path / "plain.npz"
    np.save(plain.with_suffix(".npy"), np.zeros(3))
    plain.with_suffix(".npy").rename(plain)  # an .npy under an .npz name
    with pytest.raises(ValueError, match=r"plain\.npz: not a readable \.npz"):
        load_dataset(plain)
    meta = save_dataset(tmp_path / "m.npz", rows, env_id=["a", "b"])
    with pytest.raises(ValueError, match=r"m\.npz: metadata 'meta_env_id' has 2 values"):
        load_dataset(meta)
