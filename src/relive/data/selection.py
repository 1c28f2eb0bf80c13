"""Which episodes of a dataset to learn from: per-episode success and few-demo selection (``relive bc``'s
``--episodes`` / ``--skip-episodes`` / ``--successful-only``). Rows in, rows out: the behaviour cloning that follows
(``relive.agents.bc``) takes the selected rows."""

from __future__ import annotations

import numpy as np

from relive.data.rows import split_episodes


def episode_successes(rows: dict, success_return: float | None = None) -> np.ndarray:
    """Per-episode success of a dataset ([num_episodes] bool, episodes as ``split_episodes`` cuts them):
    with ``success_return``, episode return >= it; without, the episode ended by termination (the goal
    tasks relive makes episodic, e.g. PointMaze, terminate exactly when the goal is reached; for MuJoCo
    locomotion a termination is a fall, so pass ``success_return`` there)."""
    slices = split_episodes(rows)
    if success_return is not None:
        return np.array([float(np.sum(rows["reward"][sl])) >= success_return for sl in slices], bool)
    return np.array([bool(rows["terminated"][sl.stop - 1]) for sl in slices], bool)


def select_episodes(rows: dict, episodes: int | None = None, successful_only: bool = False,
                    success_return: float | None = None, skip: int = 0) -> dict:
    """Rows of whole episodes: only successful ones if asked (see :func:`episode_successes`), then, after
    skipping the first ``skip`` of them, the next ``episodes`` (few demos; ``skip`` picks another demo set).
    Raises a ValueError when fewer episodes than asked are available."""
    slices = split_episodes(rows)
    if successful_only:
        ok = episode_successes(rows, success_return)
        slices = [sl for sl, s in zip(slices, ok, strict=True) if s]
    if not slices:
        raise ValueError("no episodes to train on" + (" (no successful episode)" if successful_only else ""))
    if skip < 0 or skip >= len(slices):
        raise ValueError(f"skip must be in [0, {len(slices)}) (the number of episodes), got {skip}")
    slices = slices[skip:]
    if episodes is not None:
        if episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {episodes}")
        if episodes > len(slices):
            what = "successful episodes" if successful_only else "episodes"
            after = f" after skipping {skip}" if skip else ""
            raise ValueError(f"asked for {episodes} {what}, the dataset has {len(slices)}{after}")
        slices = slices[:episodes]
    idx = np.concatenate([np.arange(sl.start, sl.stop) for sl in slices])
    return {k: np.asarray(v)[idx] for k, v in rows.items()}
