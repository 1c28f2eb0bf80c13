"""Compiled kernels for the segment trees (numba), used when numba is importable.

Each kernel is the sequential loop the NumPy path in :mod:`relive.replay.sum_tree` vectorizes level by
level; both give identical trees (the tests run the same checks on both). Set ``RELIVE_NO_NUMBA=1`` to use
the NumPy path. Sequential processing makes duplicate indices last-write-wins for free.
"""

from __future__ import annotations

import os

AVAILABLE = False
if os.environ.get("RELIVE_NO_NUMBA", "") in ("", "0"):
    try:
        import numba
        import numpy as np

        AVAILABLE = True
    except ImportError:  # pragma: no cover - numba is a dependency, but the NumPy path stands alone
        AVAILABLE = False

if AVAILABLE:

    @numba.njit(cache=True, nogil=True)
    def update_sum(nodes, size, indices, values):  # pragma: no cover - compiled
        for k in range(indices.size):
            i = indices[k] + size
            nodes[i] = values[k]
            i >>= 1
            while i >= 1:
                nodes[i] = nodes[2 * i] + nodes[2 * i + 1]
                i >>= 1

    @numba.njit(cache=True, nogil=True)
    def update_max(nodes, size, indices, values):  # pragma: no cover - compiled
        # stops as soon as a parent keeps its value: its ancestors are then already right (the tree is
        # consistent before each write), so the result is the full recompute's, bit for bit. Lowering a leaf
        # that is not the maximum of its subtree -- most PER updates -- touches two levels instead of 20.
        for k in range(indices.size):
            i = indices[k] + size
            nodes[i] = values[k]
            i >>= 1
            while i >= 1:
                a = nodes[2 * i]
                b = nodes[2 * i + 1]
                m = a if a >= b else b
                if nodes[i] == m:
                    break
                nodes[i] = m
                i >>= 1

    @numba.njit(cache=True, nogil=True)
    def update_range(nodes, size, start, values, is_max):  # pragma: no cover - compiled
        lo = start + size
        hi = lo + values.size - 1
        for k in range(values.size):
            nodes[lo + k] = values[k]
        while lo > 1:
            lo >>= 1
            hi >>= 1
            for i in range(lo, hi + 1):
                a = nodes[2 * i]
                b = nodes[2 * i + 1]
                if is_max:
                    nodes[i] = a if a >= b else b
                else:
                    nodes[i] = a + b

    @numba.njit(cache=True, nogil=True)
    def range_max(nodes, size, lo, hi):  # pragma: no cover - compiled
        # max of leaves lo .. hi - 1 (0.0 for an empty range), O(log N): the usual bottom-up query
        res = 0.0
        lo += size
        hi += size
        while lo < hi:
            if lo & 1:
                res = nodes[lo] if nodes[lo] > res else res
                lo += 1
            if hi & 1:
                hi -= 1
                res = nodes[hi] if nodes[hi] > res else res
            lo >>= 1
            hi >>= 1
        return res

    @numba.njit(cache=True, nogil=True)
    def find_prefix(nodes, size, mass, out, leaf_value):  # pragma: no cover - compiled
        # level by level over the whole batch (independent loads overlap the cache misses of a large tree)
        # and branch-free (the left/right choice is a coin flip a branch predictor cannot learn: a branch
        # costs a misprediction per draw and level, more than the memory walk itself). Never steps into a
        # subtree whose sum is zero, so a zero leaf is never returned while total > 0. Writes the leaves to
        # ``out`` and their values to ``leaf_value``; ``mass`` is used as scratch (overwritten). Allocates and
        # returns nothing: boxing a returned array costs more than a small batch's search.
        n = mass.size
        for k in range(n):
            out[k] = 1
        width = size
        while width > 1:
            for k in range(n):
                i = out[k]
                left = nodes[2 * i]
                right = nodes[2 * i + 1]
                go_right = ((mass[k] >= left) & (right > 0.0)) | (left <= 0.0)
                mass[k] -= left * go_right
                out[k] = 2 * i + go_right
            width >>= 1
        for k in range(n):
            leaf_value[k] = nodes[out[k]]
            out[k] -= size

    @numba.njit(cache=True, nogil=True)
    def build_alias(weights, prob, alias):  # pragma: no cover - compiled
        # Vose's alias method: O(n) build, O(1) draws (two array reads per draw)
        n = weights.size
        total = 0.0
        for i in range(n):
            total += weights[i]
        scaled = np.empty(n)
        small = np.empty(n, np.int64)
        large = np.empty(n, np.int64)
        ns = 0
        nl = 0
        for i in range(n):
            scaled[i] = weights[i] * n / total
            if scaled[i] < 1.0:
                small[ns] = i
                ns += 1
            else:
                large[nl] = i
                nl += 1
        while ns > 0 and nl > 0:
            ns -= 1
            s = small[ns]
            g = large[nl - 1]
            prob[s] = scaled[s]
            alias[s] = g
            scaled[g] = (scaled[g] + scaled[s]) - 1.0
            if scaled[g] < 1.0:
                nl -= 1
                small[ns] = g
                ns += 1
        for k in range(nl):
            prob[large[k]] = 1.0
            alias[large[k]] = large[k]
        for k in range(ns):
            prob[small[k]] = 1.0
            alias[small[k]] = small[k]

    @numba.njit(cache=True, nogil=True)
    def alias_draw(table, lo, uniforms, num_offline, capacity, now, ref_written, out, weight_out):
        # draw len(out) rows from an alias table whose row i is (prob_i, alias_i, weight_i, weight_alias_i)
        # -- one cache line per draw -- rejecting rows written after the refresh (ref_written); returns how
        # many were drawn (fewer only if the uniforms ran out)
        n = table.shape[0]
        filled = 0
        j = 0
        base = now - capacity
        while filled < out.size and j + 1 < uniforms.size:
            i = int(uniforms[j] * n)
            if i >= n:
                i = n - 1
            if uniforms[j + 1] < table[i, 0]:
                pick = i + lo
                w = table[i, 2]
            else:
                pick = int(table[i, 1])
                w = table[i, 3]
            j += 2
            if pick >= num_offline and capacity > 0:
                pos = base + ((pick - num_offline) - base) % capacity
                if pos >= ref_written:
                    continue  # overwritten since the refresh: its old weight is gone
            out[filled] = pick
            weight_out[filled] = w
            filled += 1
        return filled
