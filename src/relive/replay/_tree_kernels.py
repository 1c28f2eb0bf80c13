"""Compiled kernels for the 8-ary segment trees (numba), used when numba is importable.

Each kernel is the loop the NumPy path in :mod:`relive.replay.sum_tree` vectorizes level by level; both give
identical trees and draws (the tests run the same checks on both). The layout -- ``nodes`` with the levels
root first, ``offsets[l]`` where level ``l`` starts, children ``8i .. 8i + 7`` of node ``i`` -- is described in
:mod:`relive.replay.sum_tree`. Set ``RELIVE_NO_NUMBA=1`` to use the NumPy path. Sequential processing makes
duplicate indices last-write-wins for free.
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

FANOUT = 8  # children per node of the segment trees: 8 float64 fill one 64-byte cache line
SHIFT = 3  # log2(FANOUT): node i's children start at i << SHIFT, its parent is i >> SHIFT

if AVAILABLE:

    # Indices are unsigned (np.uint64) in the hot loops: numba then skips its negative-index wraparound test,
    # a compare and a conditional move per load.
    @numba.njit(cache=True, nogil=True, inline="always")
    def group_sum(nodes, b):  # pragma: no cover - compiled
        # the 8 children at nodes[b : b + 8] in a fixed pairwise order (the NumPy path adds in the same order)
        u = np.uint64
        return (((nodes[b] + nodes[b + u(1)]) + (nodes[b + u(2)] + nodes[b + u(3)]))
                + ((nodes[b + u(4)] + nodes[b + u(5)]) + (nodes[b + u(6)] + nodes[b + u(7)])))

    @numba.njit(cache=True, nogil=True, inline="always")
    def group_max(nodes, b):  # pragma: no cover - compiled
        m = nodes[b]
        for t in range(1, FANOUT):
            v = nodes[b + np.uint64(t)]
            m = v if v > m else m
        return m

    @numba.njit(cache=True, nogil=True)
    def update(nodes, offsets, indices, values, is_max):  # pragma: no cover - compiled
        # Write every leaf in order (a later duplicate overwrites an earlier one: last write wins), then climb.
        leaf_first = np.uint64(offsets[offsets.size - 1])
        for k in range(indices.size):
            nodes[leaf_first + np.uint64(indices[k])] = values[k]
        climb(nodes, nodes, offsets, indices, is_max)

    @numba.njit(cache=True, nogil=True)
    def update_sum_max(nodes, max_nodes, offsets, indices, values):  # pragma: no cover - compiled
        # a SumMaxTree's update in one call: the leaves and the sums (update), then the maxima above the same leaves
        update(nodes, offsets, indices, values, False)
        climb(nodes, max_nodes, offsets, indices, True)

    @numba.njit(cache=True, nogil=True)
    def climb(bottom, nodes, offsets, indices, is_max):  # pragma: no cover - compiled
        # After leaves ``indices`` changed, go up one level at a time over the whole batch, recomputing each
        # touched parent of ``nodes`` from its 8 children (one cache line): the batch's independent parents
        # overlap their latencies, as in find_prefix. The level just above the leaves reads its children from
        # ``bottom``'s leaf level: ``nodes`` itself for a plain tree, the sum tree's leaves for a SumMaxTree's
        # maxima (which store no leaves). A query stops as soon as its parent keeps its value: the ancestors then
        # need nothing from it (the tree was consistent before the batch; a query that did change a shared node
        # goes on), so the result is the full recompute's, bit for bit. Lowering a leaf that is not its group's
        # maximum -- most PER updates of the maxima -- touches one level instead of 7. Duplicate parents are
        # recomputed to the same value.
        depth = offsets.size - 1
        shift = np.uint64(SHIFT)
        n = indices.size
        node = np.empty(n, np.uint64)  # each query's node on the current level; live[k]: still going up
        live = np.ones(n, np.bool_)
        for k in range(n):
            node[k] = np.uint64(indices[k])
        for level in range(depth - 1, -1, -1):
            child_level = np.uint64(offsets[level + 1])
            parent_level = np.uint64(offsets[level])
            children = bottom if level == depth - 1 else nodes
            for k in range(n):
                if live[k]:
                    i = node[k]
                    value = group_max(children, child_level + ((i >> shift) << shift)) if is_max else \
                        group_sum(children, child_level + ((i >> shift) << shift))
                    i >>= shift
                    node[k] = i
                    live[k] = nodes[parent_level + i] != value
                    nodes[parent_level + i] = value

    @numba.njit(cache=True, nogil=True)
    def update_range(nodes, offsets, start, values, is_max):  # pragma: no cover - compiled
        # leaves start .. start + len - 1, then their parents level by level
        leaf_first = offsets[offsets.size - 1]
        for k in range(values.size):
            nodes[leaf_first + start + k] = values[k]
        climb_range(nodes, nodes, offsets, start, start + values.size - 1, is_max)

    @numba.njit(cache=True, nogil=True)
    def climb_range(bottom, nodes, offsets, lo, hi, is_max):  # pragma: no cover - compiled
        # leaves lo .. hi (inclusive) changed: each level's touched parents (a contiguous run) from their children
        # (the level above the leaves from ``bottom``, as in climb)
        depth = offsets.size - 1
        for level in range(depth - 1, -1, -1):
            lo >>= SHIFT
            hi >>= SHIFT
            children = bottom if level == depth - 1 else nodes
            for i in range(lo, hi + 1):
                b = offsets[level + 1] + (i << SHIFT)
                nodes[offsets[level] + i] = group_max(children, b) if is_max else group_sum(children, b)

    @numba.njit(cache=True, nogil=True)
    def range_max(bottom, nodes, offsets, lo, hi):  # pragma: no cover - compiled
        # max of leaves lo .. hi - 1 (0.0 for an empty range): on each level the partial groups at both ends
        # one by one, then move up to the parents of the whole groups in between. The leaves are ``bottom``'s
        # (a plain max tree: ``nodes`` itself; a SumMaxTree: the sum tree's), the levels above ``nodes``'.
        res = 0.0
        level = offsets.size - 1
        while lo < hi:
            first = offsets[level]
            src = bottom if level == offsets.size - 1 else nodes
            while lo < hi and lo % FANOUT != 0:
                v = src[first + lo]
                res = v if v > res else res
                lo += 1
            while lo < hi and hi % FANOUT != 0:
                hi -= 1
                v = src[first + hi]
                res = v if v > res else res
            lo //= FANOUT
            hi //= FANOUT
            level -= 1
        return res

    @numba.njit(cache=True, nogil=True)
    def find_prefix(nodes, offsets, mass, out, leaf_value):  # pragma: no cover - compiled
        # Level by level over the whole batch, so that the loads of different queries are independent and
        # overlap their cache misses. At a node, with c_t the running sums of its 8 children (one cache line):
        # j = how many c_t are <= m (the first child whose running sum exceeds m), then m -= c_(j-1). A zero
        # child is never taken (its running sum equals its left neighbour's), so no zero leaf is returned while
        # total > 0 -- except when rounding carries m past the whole group (j == 8): then the last positive
        # child is taken (rare, the only branch). The rest is branch-free (the choice is a coin flip a branch
        # predictor cannot learn) and indexes with unsigned integers (no negative-index wraparound test per
        # load). Writes the leaves to ``out`` and their values to ``leaf_value``; ``mass`` is scratch.
        # Allocates and returns nothing: boxing a returned array costs more than a small batch's search.
        n = mass.size
        depth = offsets.size - 1
        run = np.zeros(FANOUT + 1)  # run[t]: running sum of the first t children of the current node
        for k in range(n):
            out[k] = 0
        for level in range(1, depth + 1):
            first = np.uint64(offsets[level])
            for k in range(n):
                b = first + (np.uint64(out[k]) << np.uint64(SHIFT))
                m = mass[k]
                c = 0.0
                j = 0
                for t in range(FANOUT):  # unrolled by the compiler
                    c += nodes[b + np.uint64(t)]
                    run[t + 1] = c
                    j += c <= m
                if j == FANOUT:
                    j = 0
                    for t in range(1, FANOUT):
                        j = t if nodes[b + np.uint64(t)] > 0.0 else j
                mass[k] = m - run[np.uint64(j)]
                out[k] = (out[k] << SHIFT) + j
        leaf_first = offsets[depth]
        for k in range(n):
            leaf_value[k] = nodes[leaf_first + out[k]]

    # error_model="numpy": a probability that underflows to 0 gives an infinite ratio, as NumPy's divide does
    @numba.njit(cache=True, nogil=True, error_model="numpy")
    def draw_proportional(nodes, offsets, uniforms, out, probability, ratio):  # pragma: no cover - compiled
        # A whole proportional draw in one call: mass_k = u_k * total (``uniforms`` is scratch), the descent of
        # find_prefix, probability_k = leaf_k / total, and ratio_k = min_j probability_j / probability_k (PER's IS
        # weight before the exponent). The same float64 operations, in the same order, as the NumPy path, so the
        # draws and probabilities are bit-identical to it.
        total = nodes[0]
        n = uniforms.size
        for k in range(n):
            uniforms[k] *= total
        find_prefix(nodes, offsets, uniforms, out, probability)
        pmin = np.inf
        for k in range(n):
            p = probability[k] / total
            probability[k] = p
            pmin = p if p < pmin else pmin
        for k in range(n):
            ratio[k] = pmin / probability[k]

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
