"""Helpers for tests and examples: synthetic transitions, a sampling-distribution check and a local multi-node Ray
cluster."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def random_transitions(n: int, obs_shape=(11,), action_shape=(3,), *, rng=None, episode_length: int = 50,
                       terminal_every: int | None = None, start_step: int = 0, dtype=np.float32) -> dict:
    """``n`` synthetic rows: episodes are truncated every ``episode_length`` steps (counting from
    ``start_step``) and terminated every ``terminal_every`` steps when given."""
    rng = np.random.default_rng(rng)
    obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
    action_shape = (action_shape,) if isinstance(action_shape, int) else tuple(action_shape)
    t = np.arange(start_step, start_step + n)
    terminated = np.zeros(n, bool) if terminal_every is None else (t % terminal_every == terminal_every - 1)
    truncated = (t % episode_length == episode_length - 1) & ~terminated
    return {
        "obs": rng.normal(size=(n, *obs_shape)).astype(dtype),
        "action": rng.uniform(-1, 1, size=(n, *action_shape)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, *obs_shape)).astype(dtype),
        "terminated": terminated,
        "truncated": truncated,
    }


def chisquare_pvalue(indices: np.ndarray, probabilities: np.ndarray, min_expected: float = 5.0) -> float:
    """p-value of a chi-square goodness-of-fit test of drawn ``indices`` against ``probabilities``.

    Cells with an expected count below ``min_expected`` are pooled into one cell so that the test stays
    valid; a draw from a zero-probability cell gives p = 0."""
    from scipy.stats import chisquare  # (slow to import: only for the test statistic)

    probabilities = np.asarray(probabilities, dtype=np.float64)
    counts = np.bincount(np.asarray(indices), minlength=probabilities.size).astype(np.float64)
    if np.any(counts[probabilities == 0] > 0):
        return 0.0
    n = counts.sum()
    expected = probabilities * n / probabilities.sum()
    keep = expected >= min_expected
    obs = counts[keep]
    exp = expected[keep]
    pooled_exp = expected[~keep & (probabilities > 0)].sum()
    if pooled_exp > 0:
        obs = np.append(obs, counts[~keep & (probabilities > 0)].sum())
        exp = np.append(exp, pooled_exp)
    if obs.size < 2:
        return 1.0
    return float(chisquare(obs, exp).pvalue)


@contextmanager
def local_ray_cluster(num_workers: int = 2, worker_cpus: int = 1, paths: Sequence[str | os.PathLike] = ()):
    """A local multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPUs and ``num_workers`` nodes of
    ``worker_cpus`` CPUs each, all processes of this machine), this process connected to it; yields ``(cluster,
    worker_nodes)``. The workers import this checkout's relive (and ``paths``, e.g. a test tree), not another one
    installed: PYTHONPATH is set for the cluster's processes and restored afterwards."""
    import ray  # (optional: relive[ray])
    from ray.cluster_utils import Cluster

    import relive

    src = str(Path(relive.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([src, *map(str, paths), *([old] if old else [])])
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            workers = [c.add_node(num_cpus=worker_cpus) for _ in range(num_workers)]
            c.wait_for_nodes()
            ray.init(address=c.address, log_to_driver=False)
            try:
                yield c, workers
            finally:
                ray.shutdown()
        finally:
            c.shutdown()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
