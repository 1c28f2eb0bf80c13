"""Issue 44 item 6: a dataset column with zero numbers per row (an ``action`` of shape (N, 0), an ``obs`` of shape
(N, 0), a dict observation key of width 0) is refused when the dataset is read, by every format's reader, naming
the dataset and the column -- before a run directory is created (it used to train and die on a NaN loss that named
no file)."""

from __future__ import annotations

import numpy as np
import pytest

from relive.cli import main
from relive.data.d4rl_io import write_d4rl_hdf5
from relive.data.loaders import load_rows
from relive.data.npz_io import save_dataset
from relive.data.rows import check_columns


def _rows(n=8, obs_width=3, action_width=1):
    rng = np.random.default_rng(0)
    chain = rng.normal(size=(n + 1, obs_width)).astype(np.float32)  # next_obs[t] == obs[t + 1]
    flags = np.zeros(n, bool)
    flags[n // 2 - 1] = flags[-1] = True
    return dict(obs=chain[:-1], action=rng.uniform(-1, 1, (n, action_width)).astype(np.float32),
                reward=rng.normal(size=n).astype(np.float32), next_obs=chain[1:], terminated=flags,
                truncated=np.zeros(n, bool))


def _write_minari(rows, root, monkeypatch):
    """A Minari dataset of ``rows`` as it would sit on disk (its writer refuses such rows now, so the check is
    skipped while writing: the reader is what is tested)."""
    from relive.data import minari_io

    with monkeypatch.context() as m:
        m.setattr(minari_io, "check_columns", lambda rows, where: len(rows["obs"]))
        return minari_io.write_minari("zw/pend/d-v0", rows, "Pendulum-v1", root=root)


ZERO_WIDTH = {"action": dict(action_width=0), "obs": dict(obs_width=0)}


@pytest.mark.parametrize("fmt", ["npz", "d4rl", "minari"])
@pytest.mark.parametrize("column", sorted(ZERO_WIDTH))
def test_every_reader_refuses_a_zero_width_column_naming_dataset_and_column(tmp_path, monkeypatch, fmt, column):
    rows = _rows(**ZERO_WIDTH[column])
    path = {"npz": lambda: save_dataset(tmp_path / "zw.npz", rows),
            "d4rl": lambda: write_d4rl_hdf5(tmp_path / "zw.hdf5", rows),
            "minari": lambda: _write_minari(rows, tmp_path / "minari", monkeypatch)}[fmt]()
    with pytest.raises(ValueError, match=rf"column '{column}' has shape \(8, 0\), zero numbers per row") as e:
        load_rows(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_zero_width_dict_observation_key_is_refused():
    rows = _rows()
    rows["obs"] = {"state": rows["obs"], "empty": np.zeros((8, 4, 0), np.uint8)}
    rows["next_obs"] = {"state": rows["next_obs"], "empty": np.zeros((8, 4, 0), np.uint8)}
    with pytest.raises(ValueError, match=r"here: column 'obs' key 'empty' has shape \(8, 4, 0\)"):
        check_columns(rows, "here")


def test_lerobot_rows_go_through_the_same_check(tmp_path):
    pytest.importorskip("pyarrow")
    from relive.data import lerobot_io

    assert lerobot_io.check_columns is check_columns  # (its reader and writer call the shared check)


def test_offline_only_training_on_a_zero_width_dataset_is_refused_before_the_run_directory(tmp_path, capsys):
    data = save_dataset(tmp_path / "robot.npz", _rows(n=64, action_width=0))
    run = tmp_path / "run"
    code = main(["train", "calql", "--dataset", str(data), "--offline-steps", "4", "--online-steps", "0",
                 "--batch-size", "8", "--set", "agent.hidden=[8,8]", "--no-progress", "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2 and str(data) in err and "column 'action' has shape (64, 0)" in err, err
    assert not run.exists()
