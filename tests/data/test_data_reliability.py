"""Regression tests of issue 14 for datasets: D4RL shapes and file errors, `relive data make` atomicity."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from relive.data.columns import check_columns
from relive.data.d4rl_io import read_d4rl_hdf5, write_d4rl_hdf5


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
