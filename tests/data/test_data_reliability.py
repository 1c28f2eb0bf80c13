"""Regression tests of issue 14 for datasets: D4RL shapes and file errors, `relive data make` atomicity."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from relive.data.d4rl_io import read_d4rl_hdf5, write_d4rl_hdf5
from relive.data.rows import check_columns


def _rows(n=6):
    obs = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    return dict(obs=obs, action=np.zeros((n, 1), np.float32), reward=np.arange(n, dtype=np.float32),
                next_obs=obs + 1, terminated=np.array([0, 0, 1, 0, 0, 0], bool)[:n],
                truncated=np.array([0, 0, 0, 0, 0, 1], bool)[:n])


@pytest.mark.parametrize("dtype", [bool, np.float32])
def test_d4rl_terminals_of_shape_n_1_are_squeezed_not_broadcast(tmp_path, dtype):
    rows = _rows()
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", rows)
    with h5py.File(path, "a") as f:
        for key, col in (("terminals", "terminated"), ("rewards", "reward")):
            del f[key]
            f[key] = rows[col].astype(dtype if key == "terminals" else np.float32)[:, None]
    got, _ = read_d4rl_hdf5(path)
    assert got["terminated"].shape == (6,) and got["truncated"].shape == (6,) and got["reward"].shape == (6,)
    assert got["terminated"].tolist() == rows["terminated"].tolist()
    assert got["truncated"].tolist() == rows["truncated"].tolist()


def test_d4rl_flags_of_other_shapes_are_refused(tmp_path):
    path = write_d4rl_hdf5(tmp_path / "d.hdf5", _rows())
    with h5py.File(path, "a") as f:
        del f["timeouts"]
        f["timeouts"] = np.zeros((6, 2), bool)
    with pytest.raises(ValueError, match=r"d.hdf5: 'timeouts' must have shape \(N,\) or \(N, 1\), got \(6, 2\)"):
        read_d4rl_hdf5(path)


def test_check_columns_refuses_2d_per_row_columns():
    rows = _rows() | {"terminated": np.zeros((6, 1), bool)}
    with pytest.raises(ValueError, match=r"where: column 'terminated' must have shape \(6,\), got \(6, 1\)"):
        check_columns(rows, "where")


def test_d4rl_non_hdf5_file_and_group_name_the_path(tmp_path):
    junk = tmp_path / "junk.hdf5"
    junk.write_text("not hdf5 at all")
    with pytest.raises(ValueError, match=r"junk.hdf5: not a readable HDF5 file"):
        read_d4rl_hdf5(junk)
    path = write_d4rl_hdf5(tmp_path / "g.hdf5", _rows())
    with h5py.File(path, "a") as f:
        del f["rewards"]
        f.create_group("rewards")
    with pytest.raises(ValueError, match=r"g.hdf5: 'rewards' is an HDF5 group, expected a dataset"):
        read_d4rl_hdf5(path)


# -- 2. `relive data make` keeps the old dataset until the new one is complete -------------------------------------
@pytest.fixture(scope="module")
def pendulum_rows():
    from relive.train.collector import collect_dataset

    return collect_dataset("Pendulum-v1", 250, seed=0)


DID = "relive/pendulum-v1/random-v0"


def test_make_keeps_an_existing_dataset_unless_overwrite(tmp_path, pendulum_rows):
    from relive.data.minari_io import read_minari, write_minari
    from relive.train.generate import make_dataset

    root = tmp_path / "minari"
    write_minari(DID, pendulum_rows, "Pendulum-v1", root=root)
    kw = dict(steps=60, seed=1, root=root, out=tmp_path, progress=False)
    with pytest.raises(ValueError, match=rf"dataset {DID} already exists under .*--overwrite"):
        make_dataset("pendulum-v1", "random", **kw)
    assert len(read_minari(DID, root=root)[0]["obs"]) == 250
    with pytest.raises(ValueError, match="already exists"):
        write_minari(DID, pendulum_rows, "Pendulum-v1", root=root)
    make_dataset("pendulum-v1", "random", overwrite=True, **kw)
    assert len(read_minari(DID, root=root)[0]["obs"]) == 60
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_a_write_killed_before_the_swap_leaves_the_old_dataset_listed_and_loadable(tmp_path, pendulum_rows,
                                                                                   monkeypatch):
    import relive.data.minari_io as mio
    from relive.data.minari_io import list_local, read_minari, write_minari

    root = tmp_path / "minari"
    write_minari(DID, pendulum_rows, "Pendulum-v1", root=root)
    new = {k: v[:100] for k, v in pendulum_rows.items()}

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(mio, "swap_into_place", killed)
    monkeypatch.setattr(mio.shutil, "rmtree", lambda *a, **k: None)  # a kill runs no clean-up
    with pytest.raises(KeyboardInterrupt):
        write_minari(DID, new, "Pendulum-v1", root=root, overwrite=True)
    monkeypatch.undo()
    assert any(p.name.startswith(mio.STAGING_PREFIX) for p in root.iterdir())  # the complete new one, hidden
    assert list_local(root) == [DID]  # listed once: the old one
    assert len(read_minari(DID, root=root)[0]["obs"]) == 250
    write_minari(DID, new, "Pendulum-v1", root=root, overwrite=True)  # a later run swaps it in
    assert list_local(root) == [DID] and len(read_minari(DID, root=root)[0]["obs"]) == 100


def test_the_swap_exchanges_atomically_or_falls_back(tmp_path, monkeypatch):
    import relive.files as files

    for exchange in (True, False):
        a, b = tmp_path / f"new{exchange}", tmp_path / f"target{exchange}"
        a.mkdir()
        (a / "x").write_text("new")
        b.mkdir()
        (b / "x").write_text("old")
        if not exchange:
            monkeypatch.setattr(files, "_exchange", lambda *_: False)
        files.swap_into_place(a, b)
        assert (b / "x").read_text() == "new" and (a / "x").read_text() == "old"


def test_loading_a_broken_dataset_names_the_file(tmp_path, pendulum_rows):
    from relive.data.minari_io import read_minari, write_minari

    root = tmp_path / "minari"
    path = write_minari(DID, pendulum_rows, "Pendulum-v1", root=root)
    data = path / "data" / "main_data.hdf5"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])
    with pytest.raises(ValueError, match=r"main_data.hdf5"):
        read_minari(DID, root=root)


@pytest.mark.parametrize("steps", [0, -10, 2.5, True])
def test_make_dataset_refuses_non_positive_steps(tmp_path, steps):
    from relive.train.generate import make_dataset

    with pytest.raises(ValueError, match="steps must be a positive integer"):
        make_dataset("pendulum-v1", "random", steps=steps, root=tmp_path / "m", out=tmp_path, progress=False)
    assert not (tmp_path / "m").exists()
