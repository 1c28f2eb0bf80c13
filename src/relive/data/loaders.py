"""Load an offline dataset from any supported source into a replay buffer's frozen offline prefix.

Sources: a relive ``.npz`` of columns, a D4RL-format ``.hdf5``/``.h5`` file, a LeRobot dataset directory
(``meta/info.json`` + parquet, ``relive.data.lerobot_io``), or a local Minari dataset (by id under the Minari
root, or by directory). Rows keep their episode structure (episode ids come from the
storage's episode index) and get Monte-Carlo returns-to-go in ``mc_return`` when the buffer has that column.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from relive.data.d4rl_io import read_d4rl_hdf5
from relive.data.lerobot_io import is_lerobot_dir, read_lerobot
from relive.data.minari_io import read_minari
from relive.data.npz_io import load_dataset
from relive.data.rows import check_columns, check_env_spaces
from relive.replay.returns import returns_to_go


def load_rows(source: str | os.PathLike, env_id: str | None = None,
              root: str | Path | None = None) -> tuple[dict, dict]:
    """Columns + metadata of a dataset; with ``env_id``, shapes and action bounds are checked against it."""
    p = Path(source)
    if p.suffix == ".npz":
        rows, meta = load_dataset(p)
    elif p.suffix in (".hdf5", ".h5"):
        rows, meta = read_d4rl_hdf5(p)
    elif is_lerobot_dir(p):
        rows, meta = read_lerobot(p)
        if env_id and meta.get("env_id") and meta["env_id"] != env_id:
            raise ValueError(f"dataset {source} was recorded on {meta['env_id']}, not {env_id}")
    else:
        rows, meta = read_minari(source, root, flatten=not _keeps_dict_obs(env_id))
        if env_id and meta.get("env_id") and meta["env_id"] != env_id:
            raise ValueError(f"dataset {source} was recorded on {meta['env_id']}, not {env_id}")
    if check_columns(rows, str(source)) == 0:
        raise ValueError(f"{source}: the dataset holds no rows")
    if env_id:
        check_env_spaces(rows, env_id, str(source))
    return rows, meta


def _keeps_dict_obs(env_id: str | None) -> bool:
    """Whether ``env_id``'s observations stay dicts (image tasks: ``relive.envs.has_image_keys``), so a
    Minari dataset of it is read key by key instead of flattened."""
    if not env_id:
        return False
    # (gymnasium, optional: imported only where an env is made)
    from relive.envs import has_image_keys, make_env

    env = make_env(env_id)
    try:
        return has_image_keys(env.observation_space)
    finally:
        env.close()


def fill_offline(buffer, rows: dict, gamma: float = 0.99, dataset_id: str | None = None) -> np.ndarray:
    """``buffer.add_offline`` with Monte-Carlo returns-to-go in ``mc_return`` when the buffer has that column
    (Cal-QL's reference values): G_t = r_t + gamma G_{t+1} within an episode, G = r at a terminal row, and at
    a timeout (``truncated``) the sum simply stops — the return-to-go is truncated, not bootstrapped, as in
    CORL's and the official Cal-QL's ``get_return_to_go``. (Their special case for sparse-reward failures,
    G = r_fail / (1 - gamma) for a whole unsuccessful episode, is not applied; pass your own ``mc_return``
    column in ``rows`` to use it.) Episode ids come from the storage's episode index. ``dataset_id`` as in
    ``ReplayBuffer.add_offline`` (checkpoints then refer to the rows instead of copying them)."""
    rows = dict(rows)
    if "mc_return" in buffer.storage.extra_names and "mc_return" not in rows:
        rows["mc_return"] = returns_to_go(rows["reward"], rows["terminated"] | rows["truncated"],
                                          rows["terminated"], gamma)
    return buffer.add_offline(rows, dataset_id=dataset_id)
