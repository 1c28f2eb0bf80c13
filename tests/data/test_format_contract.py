"""One contract over every dataset format (DESIGN.md, "One contract per kind"): each writer's output, read back
through ``load_rows`` (the one reader ``--dataset`` uses), holds the rows it was given -- same columns, same values,
same episode boundaries -- with no format-specific reader called by hand.

Rows: a Pendulum-v1 dataset of one terminated episode, one truncated one and an unfinished one (a terminated
episode ends where ``next_obs`` does not continue: every format must keep the flag, not infer it)."""

from __future__ import annotations

import numpy as np
import pytest

from relive.data.d4rl_io import write_d4rl_hdf5
from relive.data.lerobot_io import write_lerobot
from relive.data.loaders import load_rows
from relive.data.minari_io import write_minari
from relive.data.npz_io import save_dataset
from relive.data.rows import split_episodes
from relive.testing import random_transitions

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _rows() -> dict:
    """Pendulum-shaped rows (obs 3, action 1 in [-2, 2]) whose next_obs[t] is obs[t + 1] inside an episode, as an
    env's are (Minari and LeRobot store one observation sequence per episode)."""
    rng = np.random.default_rng(0)
    lengths, ends = [7, 5, 4], ["terminated", "truncated", None]
    parts = []
    for length, end in zip(lengths, ends, strict=True):
        seq = rng.uniform(-1, 1, size=(length + 1, 3)).astype(np.float32)
        r = random_transitions(length, (3,), (1,), rng=rng.integers(1 << 30), episode_length=10**6)
        r["obs"], r["next_obs"] = seq[:-1], seq[1:]
        r["action"] = (2 * r["action"]).astype(np.float32)
        r["terminated"] = np.zeros(length, bool)
        r["truncated"] = np.zeros(length, bool)
        if end:
            r[end][-1] = True
        parts.append(r)
    return {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}


def _npz(tmp_path, rows):
    return save_dataset(tmp_path / "d.npz", rows, env_id="Pendulum-v1"), None


def _d4rl(tmp_path, rows):
    return write_d4rl_hdf5(tmp_path / "d.hdf5", rows), None


def _minari(tmp_path, rows):
    write_minari("test/pendulum/contract-v0", rows, "Pendulum-v1", root=tmp_path)
    return "test/pendulum/contract-v0", tmp_path


def _lerobot(tmp_path, rows):
    return write_lerobot(tmp_path / "lerobot", rows, env_id="Pendulum-v1"), None


#: every writer relive ships, by the name its docs use (docs/datasets.md)
WRITERS = {"npz": _npz, "d4rl-hdf5": _d4rl, "minari": _minari, "lerobot": _lerobot}


#: formats that store whole episodes: a run's unfinished last episode reads back truncated (documented in
#: minari_io.write_minari and lerobot_io; the row columns stay the same)
EPISODIC = {"minari", "lerobot"}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_every_format_reads_back_what_its_writer_wrote(fmt, tmp_path):
    rows = _rows()
    source, root = WRITERS[fmt](tmp_path, rows)
    back, _ = load_rows(source, root=root)
    if fmt in EPISODIC:
        rows["truncated"][-1] = True
    for col in COLUMNS:
        assert col in back, (fmt, col)
        np.testing.assert_array_equal(np.asarray(back[col]).reshape(rows[col].shape), rows[col],
                                      err_msg=f"{fmt}: {col}")
    assert [(s.start, s.stop) for s in split_episodes(back)] == [(0, 7), (7, 12), (12, 16)], fmt


def test_the_contract_covers_every_format_the_dataset_option_accepts():
    """A format added to ``load_rows`` must be added to ``WRITERS`` too: its suffixes and readers are named there."""
    import inspect

    from relive.data import loaders

    src = inspect.getsource(loaders.load_rows)
    readers = {"load_dataset": "npz", "read_d4rl_hdf5": "d4rl-hdf5", "read_lerobot": "lerobot",
               "read_minari": "minari"}
    called = {name for name in readers if f"{name}(" in src}
    assert called == set(readers), f"load_rows calls readers the contract does not know: {called - set(readers)}"
    assert {readers[r] for r in called} == set(WRITERS)
