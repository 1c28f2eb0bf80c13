"""Sample-time views over episodes: n-step returns and contiguous slices (sequences), from the episode index; and
Monte-Carlo returns-to-go of whole episodes (:func:`returns_to_go`, :func:`write_returns_to_go`).

Both work on the storage's public surface (``meta["episode_id"]``, ``episodes.end_of``, ``position_of``,
``online_slot``) and are vectorized over the batch: no Python loop per row (n-step returns take one pass over the
batch per step ahead, fine for the usual n of 3 to 10). Nothing is precomputed at write time,
so they stay right as episodes grow (an open episode's newest row), are cut by the ring (evicted rows) and are
interleaved with other streams (each stream is a lane of logical positions; ``online_slot`` maps them).

**n-step** (row t of an episode whose stored rows end at row e; e is the episode's termination or truncation,
its last row, or, for an open episode, its newest stored row)::

    n'       = min(n, e - t + 1)                                  rows used (>= 1)
    R_t      = sum_{k < n'} gamma^k r_{t+k}                       (summed in float64 in k order, stored as float32)
    last     = t + n' - 1                                         bootstrap row: its next_obs is s_{t+n'}
    discount = gamma^{n'} (1 - terminated[last])                  0 after a termination: no bootstrap

so that the TD target is ``y = R_t + discount * V(next_obs[last])``. A truncation bootstraps from the truncated
row's stored (true) next observation; only ``terminated`` stops the bootstrap, as in the one-step targets.

**Slices** of length L from row t: rows t .. t + L' - 1 with L' = min(L, e - t + 1); ``mask[j] = j < L'``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class NStep(NamedTuple):
    reward: np.ndarray  # [B] float32: sum_{k < n'} gamma^k r_{t+k}
    discount: np.ndarray  # [B] float32: gamma^{n'} (1 - terminated[last])
    last: np.ndarray  # [B] int64 slots of the bootstrap rows t + n' - 1 (next_obs, terminated, truncated there)
    n: np.ndarray  # [B] int64: n', the rows summed


#: the largest n of n-step returns: a sample takes one pass over the batch per step ahead (the usual n: 3 to 10)
MAX_N_STEP = 1000


def check_n_step(n_step, capacity=None) -> int:
    """An integer 1 <= n_step <= MAX_N_STEP (and <= ``capacity``, the rows a buffer holds, when given)."""
    if isinstance(n_step, bool | np.bool_) or not isinstance(n_step, int | np.integer) or n_step < 1:
        raise ValueError(f"n_step must be an integer >= 1, got {n_step!r}")
    if n_step > MAX_N_STEP:
        raise ValueError(f"n_step must be at most {MAX_N_STEP} (every sample takes one pass over the batch per step "
                         f"ahead; the usual n is 3 to 10), got {n_step}")
    valid_capacity = (isinstance(capacity, int | np.integer) and not isinstance(capacity, bool | np.bool_)
                      and capacity > 0)
    if valid_capacity and n_step > capacity:  # (an invalid capacity is the storage's to refuse, by its own name)
        raise ValueError(f"n_step = {n_step} is larger than the buffer's capacity of {capacity} rows (no stored "
                         "episode can give that many steps)")
    return int(n_step)


def check_gamma(gamma) -> float:
    ok = not isinstance(gamma, bool | np.bool_) and isinstance(gamma, int | float | np.integer | np.floating)
    if not ok or not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")
    return float(gamma)


def rows_left(storage, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows of each slot's episode stored from it on, itself included (>= 1), its logical position, whether it is
    online) for stored ``slots``."""
    slots = np.asarray(slots, np.int64)
    pos = storage.position_of(slots)
    return storage.episodes.end_of(storage.episode_ids(slots)) - pos, pos, slots >= storage.num_offline


def slot_at(storage, pos: np.ndarray, online: np.ndarray) -> np.ndarray:
    """Slots of logical positions (``online`` broadcast against ``pos``): offline positions are slots. (An offline
    position looked up as an online one gives some valid slot, which ``where`` then discards.)"""
    if not online.any():
        return pos
    return np.where(online, storage.online_slot(pos), pos)


def n_step_returns(storage, slots, n_step: int, gamma: float) -> NStep:
    """n-step returns of the rows in ``slots`` (see the module docstring). ``storage``: a Storage or StorageView."""
    n_step, gamma = check_n_step(n_step), check_gamma(gamma)
    slots = np.asarray(slots, np.int64).reshape(-1)
    left, pos, online = rows_left(storage, slots)
    n = np.minimum(left, n_step)
    last_pos = pos + (n - 1)
    powers = np.array([gamma**k for k in range(n_step + 1)])  # gamma^0 .. gamma^n (Python's pow, as a hand sum)
    rewards = storage.columns["reward"]
    reward = rewards.take(slots).astype(np.float64)
    for k in range(1, int(n.max(initial=1))):  # one pass per step ahead that some row uses, over the whole batch
        row = slot_at(storage, np.minimum(pos + k, last_pos), online)  # held at the last row: weight 0 there
        reward += np.where(k < n, powers[k], 0.0) * rewards.take(row)
    last = slot_at(storage, last_pos, online)
    discount = powers[n]
    discount[storage.columns["terminated"].take(last)] = 0.0
    return NStep(reward.astype(np.float32), discount.astype(np.float32), last, n)


def slices(storage, starts, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots [B, L] of the contiguous slices of ``length`` rows starting at ``starts``, within each start's
    episode, and ``mask`` [B, L] (False past the episode's last stored row; those entries repeat that row's
    slot)."""
    starts = np.asarray(starts, np.int64).reshape(-1)
    left, pos, online = rows_left(storage, starts)
    j = np.arange(length, dtype=np.int64)
    mask = j[None, :] < left[:, None]
    grid = pos[:, None] + np.minimum(j[None, :], left[:, None] - 1)
    return slot_at(storage, grid, online[:, None]), mask


def slice_fits(storage, starts, length: int) -> np.ndarray:
    """Whether a slice of ``length`` rows from each start stays within its episode's stored rows: [B] bool."""
    return rows_left(storage, starts)[0] >= length


def max_rows_left(storage) -> int:
    """The longest stored episode's length (the longest slice any start row can give)."""
    view = storage.episodes.live()
    return int(view.length.max()) if len(view) else 0


# -- Monte-Carlo returns-to-go (Cal-QL's mc_return column) -------------------------------------------
def returns_to_go(reward: np.ndarray, episode_end: np.ndarray, terminated: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted Monte-Carlo return-to-go G_t = r_t + gamma (1 - end_t) G_{t+1}, restarting at every episode
    end. A time-limit truncation ends the sum there (no bootstrap: the data has no value estimate), so
    truncated episodes get a truncated return, as CORL and the official Cal-QL compute it."""
    reward = np.asarray(reward, np.float64)
    end = np.asarray(episode_end, bool) | np.asarray(terminated, bool)
    out = np.zeros_like(reward)
    g = 0.0
    for t in range(reward.size - 1, -1, -1):  # one pass per dataset/episode, not on a hot path
        g = reward[t] + (0.0 if end[t] else gamma * g)
        out[t] = g
    return out.astype(np.float32)


def write_returns_to_go(buffer, slots: np.ndarray, gamma: float, column: str) -> None:
    """Write the discounted Monte-Carlo returns-to-go of one finished episode (its stored rows ``slots``, in time
    order) into ``column`` (a truncated episode's sum stops at its last row; see :func:`returns_to_go`)."""
    reward = buffer.storage.columns["reward"][slots]
    term = buffer.storage.columns["terminated"][slots]
    end = np.zeros(slots.size, bool)
    end[-1] = True
    buffer.set_column(column, slots, returns_to_go(reward, end, term, gamma))


__all__ = ["NStep", "n_step_returns", "slices", "slice_fits", "check_n_step", "check_gamma", "max_rows_left",
           "MAX_N_STEP", "returns_to_go", "write_returns_to_go"]
