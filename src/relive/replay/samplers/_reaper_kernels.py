"""ReaPER's per-episode running sums, compiled (numba) when available, with the NumPy helpers the sampler's
vectorized path uses. Positions are logical (``relive.replay.storage.episodes``); an online position p lives in slot
``k + p % cap`` (``StorageView.online_slot``), written out inline here because these loops are compiled. That is
the one-stream arithmetic (``lane_map`` = ``NO_LANE_MAP``); with several streams the same kernels read each online
row's slot from the storage's per-lane map ``lane_map[p >> LANE_BITS, (p & LANE_MASK) % lane_map.shape[1]]``."""

from __future__ import annotations

import numpy as np

from relive.replay import _tree_kernels
from relive.replay.storage import LANE_BITS, LANE_MASK

AVAILABLE = _tree_kernels.AVAILABLE


def power(x: np.ndarray, exponent: float) -> np.ndarray:
    """x^exponent for x > 0 as exp(exponent log x) (NumPy's SIMD exp/log: ~5x faster than np.power)."""
    if exponent == 0.0:
        return np.ones_like(x)
    if exponent == 1.0:
        return x.copy()
    out = np.log(x)
    out *= exponent
    return np.exp(out, out=out)


def segmented_cumsum(values: np.ndarray, seg: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Inclusive running sums restarting at each segment (``first`` = segment offsets, ``seg`` = segment of
    each value). One cumsum per segment (at most one per touched episode): a single cumsum minus the segment
    offsets would cancel catastrophically when a segment of small values follows one of large values."""
    out = np.empty_like(values)
    for a, n in zip(first.tolist(), lengths.tolist(), strict=True):
        if n:
            np.cumsum(values[a : a + n], out=out[a : a + n])
    return out


NO_LANE_MAP = np.zeros((0, 1), np.int64)  # one stream: slots follow from positions (no per-lane map)

if _tree_kernels.AVAILABLE:
    import numba

    @numba.njit(cache=True, nogil=True, inline="always")
    def _slot(p, online, k, cap, lane_map):  # pragma: no cover - compiled
        # an offline position is its slot; an online one is k + p % cap with one stream, else read from the map
        if not online:
            return p
        if lane_map.shape[0] == 0:
            return k + p % cap
        return lane_map[p >> LANE_BITS, (p & LANE_MASK) % lane_map.shape[1]]

    @numba.njit(cache=True, nogil=True)
    def suffix_prefix(p_from, start, end, online, leaves, k, cap, lane_map, delta, prefix, evicted_d,
                      c_out):  # pragma: no cover - compiled
        # C_j = C_{j-1} + d_j from p_from to the end of each episode (stored per slot and gathered in c_out).
        # Rows read from a lane map look each slot up; otherwise slots advance by one and wrap at the ring's end.
        mapped = lane_map.shape[0] > 0
        j = 0
        for e in range(p_from.size):
            p = p_from[e]
            if p >= end[e]:
                continue
            per_row = mapped and online[e]
            c = prefix[_slot(p - 1, online[e], k, cap, lane_map)] if p > start[e] else evicted_d[leaves[e]]
            s = _slot(p, online[e], k, cap, lane_map)
            for q in range(p, end[e]):
                if per_row:
                    s = _slot(q, True, k, cap, lane_map)
                c += delta[s]
                prefix[s] = c
                c_out[j] = c
                j += 1
                if not per_row:
                    s += 1
                    if online[e] and s == k + cap:
                        s = k

    @numba.njit(cache=True, nogil=True)
    def suffix_running_u(p_from, start, end, online, leaves, k, cap, lane_map, c_pow, delta_pow, cum_u,
                         evicted_u):  # pragma: no cover - compiled
        # running sum of u_j = C_j^omega d_j^alpha over the same rows
        mapped = lane_map.shape[0] > 0
        j = 0
        for e in range(p_from.size):
            p = p_from[e]
            if p >= end[e]:
                continue
            per_row = mapped and online[e]
            run = cum_u[_slot(p - 1, online[e], k, cap, lane_map)] if p > start[e] else evicted_u[leaves[e]]
            s = _slot(p, online[e], k, cap, lane_map)
            for q in range(p, end[e]):
                if per_row:
                    s = _slot(q, True, k, cap, lane_map)
                run += c_pow[j] * delta_pow[s]
                cum_u[s] = run
                j += 1
                if not per_row:
                    s += 1
                    if online[e] and s == k + cap:
                        s = k

    @numba.njit(cache=True, nogil=True)
    def search(lo, hi, online, target, k, cap, lane_map, cum_u, out):  # pragma: no cover - compiled
        # first logical position p in [lo, hi) with cum_u[slot(p)] > target (the last one if none)
        for i in range(lo.size):
            a = lo[i]
            b = hi[i] - 1
            t = target[i]
            while a < b:
                m = (a + b) >> 1
                if cum_u[_slot(m, online[i], k, cap, lane_map)] <= t:
                    a = m + 1
                else:
                    b = m
            out[i] = _slot(a, online[i], k, cap, lane_map)
        return out
