"""The observation encoder seam: how an agent turns a stored observation into the vector its networks read.

Flat observations pass through unchanged. Dict observations (``ReplayBuffer(obs_shape={key: ...})``, batches
with ``batch.obs["image"]``) are, by default, concatenated: every key flattened to [N, -1], cast to float32,
keys in sorted order -- the order gymnasium's ``FlattenObservation`` (and so relive's envs) and Minari's
flattening use, so an agent trained on flattened observations reads a dict buffer the same way. The agent's
MLPs then run over the concatenation (``obs_dim`` = the sum of the keys' sizes). Every agent applies
``flat_obs_batch`` in its update and ``as_obs_tensor`` (``networks.py``) in ``act`` and its scores, so this is the
one place a learned encoder (a CNN over image keys) plugs in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from relive.types import Batch


def concat_keys(obs: Mapping) -> np.ndarray:
    """[N, D] float32: the keys of a dict observation ([N, ...] each), each flattened, concatenated in sorted key
    order."""
    if not obs:
        raise ValueError("a dict observation needs at least one key")
    parts = [np.asarray(obs[k]) for k in sorted(obs)]
    n = parts[0].shape[0] if parts[0].ndim else 1
    for k, p in zip(sorted(obs), parts, strict=True):
        if (p.shape[0] if p.ndim else 1) != n:
            raise ValueError(f"observation key {k!r} has {p.shape[0] if p.ndim else 1} rows, the first key has {n}")
    return np.concatenate([p.reshape(n, -1).astype(np.float32, copy=False) for p in parts], axis=1)


def flat_obs(obs):
    """:func:`concat_keys` of a dict observation; anything else unchanged."""
    return concat_keys(obs) if isinstance(obs, Mapping) else obs


def flat_obs_dim(obs_spec) -> int:
    """Size of the concatenated observation of a storage's ``obs_spec`` (a ColumnSpec or a dict of them), or of
    a shape / a dict key -> shape."""
    if isinstance(obs_spec, Mapping):
        return sum(flat_obs_dim(v) for v in obs_spec.values())
    shape = getattr(obs_spec, "shape", obs_spec)
    if isinstance(shape, tuple) and len(shape) == 2 and not isinstance(shape[1], int):  # (shape, dtype)
        shape = shape[0]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return int(np.prod(shape, dtype=np.int64))


def flat_obs_batch(batch: Batch) -> Batch:
    """The batch with dict ``obs`` / ``next_obs`` concatenated (:func:`concat_keys`); a flat batch as it is."""
    if not isinstance(batch.obs, Mapping):
        return batch
    return replace(batch, obs=concat_keys(batch.obs), next_obs=concat_keys(batch.next_obs))
