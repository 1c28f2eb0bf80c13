"""The binary sum / max trees relive used before the 8-ary tree (commit c5cbe73), kept for the benchmark only.

``bench/replay_throughput.py --peers binary`` swaps these into a relive PER buffer, so the old and the new tree
are timed in one process, in interleaved rounds. A verbatim copy of ``relive/replay/sum_tree.py`` and the tree
kernels of ``relive/replay/_tree_kernels.py`` at that commit (the compiled loops and the NumPy path).
"""

from __future__ import annotations

import os
import types

import numpy as np

AVAILABLE = False
if os.environ.get("RELIVE_NO_NUMBA", "") in ("", "0"):
    try:
        import numba

        AVAILABLE = True
    except ImportError:  # pragma: no cover - numba is a dependency, but the NumPy path stands alone
        AVAILABLE = False

if AVAILABLE:

    @numba.njit(cache=False, nogil=True)
    def update_sum(nodes, size, indices, values):  # pragma: no cover - compiled
        for k in range(indices.size):
            i = indices[k] + size
            nodes[i] = values[k]
            i >>= 1
            while i >= 1:
                nodes[i] = nodes[2 * i] + nodes[2 * i + 1]
                i >>= 1

    @numba.njit(cache=False, nogil=True)
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

    @numba.njit(cache=False, nogil=True)
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

    @numba.njit(cache=False, nogil=True)
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

    @numba.njit(cache=False, nogil=True)
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


kernels = types.SimpleNamespace(AVAILABLE=AVAILABLE)
if AVAILABLE:
    kernels.update_sum, kernels.update_max, kernels.update_range = update_sum, update_max, update_range
    kernels.range_max, kernels.find_prefix = range_max, find_prefix


def _dedupe_last(indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep only the last occurrence of each index (last write wins, as in a sequential loop)."""
    if indices.size <= 1:
        return indices, values
    rev = indices[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    if uniq.size == indices.size:
        return indices, values
    keep = indices.size - 1 - first_in_rev
    return indices[keep], values[keep]


class SegmentTree:
    """A complete binary tree over ``capacity`` leaves, padded to a power of two, stored in one array.

    Node 1 is the root, node ``i`` has children ``2i`` and ``2i + 1``, leaf ``j`` is node ``size + j``.
    """

    _identity = 0.0
    _is_max = False
    _compiled_update = None  # compiled sequential update (numba), when available

    def __init__(self, capacity: int, use_kernels: bool | None = None):
        """``use_kernels``: run the compiled numba loops (default: when numba is importable) or the
        vectorized NumPy path (``False``)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.depth = self.size.bit_length() - 1
        self.nodes = np.full(2 * self.size, self._identity, dtype=np.float64)
        use = kernels.AVAILABLE if use_kernels is None else bool(use_kernels and kernels.AVAILABLE)
        self._kernel_update = self._compiled_update if use else None
        self._kernel_find = kernels.find_prefix if use else None

    # -- reduction used by the subclass --------------------------------------------------------------
    @staticmethod
    def _combine(left: np.ndarray, right: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- batched operations ---------------------------------------------------------------------------
    def __getitem__(self, indices) -> np.ndarray:
        return self.nodes[self.size + np.asarray(indices, dtype=np.int64)]

    @property
    def leaves(self) -> np.ndarray:
        """A read-only view of the ``capacity`` leaf values."""
        view = self.nodes[self.size : self.size + self.capacity]
        view.flags.writeable = False
        return view

    def update(self, indices, values) -> None:
        """Set ``leaf[indices] = values``; duplicate indices: the last one wins."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if indices.size != values.size:
            raise ValueError(f"{indices.size} indices but {values.size} values")
        if indices.size == 0:
            return
        if self._kernel_update is not None:
            self._kernel_update(self.nodes, self.size, np.ascontiguousarray(indices), np.ascontiguousarray(values))
            return
        indices, values = _dedupe_last(indices, values)
        nodes = self.nodes
        pos = indices + self.size
        nodes[pos] = values
        for _ in range(self.depth):
            pos >>= 1
            child = pos << 1
            nodes[pos] = self._combine(nodes[child], nodes[child + 1])

    def update_range(self, start: int, values) -> None:
        """Set the contiguous leaves ``start .. start + len(values) - 1`` (slices only: the fast path for
        rows appended to the storage)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        lo, hi = int(start), int(start) + values.size
        if values.size == 0:
            return
        if lo < 0 or hi > self.capacity:
            raise ValueError(f"leaf range [{lo}, {hi}) outside [0, {self.capacity})")
        if self._kernel_update is not None:
            kernels.update_range(self.nodes, self.size, lo, values, self._is_max)
            return
        nodes = self.nodes
        nodes[self.size + lo : self.size + hi] = values
        lo, hi = (self.size + lo) >> 1, (self.size + hi - 1) >> 1  # inclusive parent range
        while lo >= 1:
            nodes[lo : hi + 1] = self._combine(nodes[2 * lo : 2 * hi + 1 : 2], nodes[2 * lo + 1 : 2 * hi + 2 : 2])
            if lo == 1:
                break
            lo, hi = lo >> 1, hi >> 1

    def set_all(self, values) -> None:
        """Replace every leaf at once (O(N), one vectorized pass per level)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if values.size != self.capacity:
            raise ValueError(f"expected {self.capacity} values, got {values.size}")
        nodes = self.nodes
        nodes[self.size : self.size + self.capacity] = values
        nodes[self.size + self.capacity :] = self._identity
        level = self.size
        while level > 1:
            nodes[level // 2 : level] = self._combine(nodes[level : 2 * level : 2], nodes[level + 1 : 2 * level : 2])
            level //= 2

    def root(self) -> float:
        return float(self.nodes[1])


class SumTree(SegmentTree):
    """Sum tree with a batched prefix-sum search (proportional sampling)."""

    _identity = 0.0
    _compiled_update = staticmethod(kernels.update_sum) if kernels.AVAILABLE else None

    @staticmethod
    def _combine(left, right):
        return left + right

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def find_prefix(self, mass: np.ndarray) -> np.ndarray:
        """For each ``m`` in ``mass`` (0 <= m < total) the leaf ``j`` with prefix(j) <= m < prefix(j + 1).

        Never returns a leaf of zero value while the total is positive: float rounding at a boundary is
        pushed back into the nearest positive leaf.
        """
        return self.find_prefix_with_values(mass)[0]

    def find_prefix_with_values(self, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find_prefix` and the value of each leaf found (one pass; what proportional sampling needs)."""
        if not self.nodes[1] > 0.0:
            raise ValueError("cannot sample from a sum tree whose total is zero")
        q = np.array(mass, dtype=np.float64, copy=True).reshape(-1)
        if self._kernel_find is not None:
            leaf, values = np.empty(q.size, np.int64), np.empty(q.size, np.float64)
            self._kernel_find(self.nodes, self.size, q, leaf, values)
            return leaf, values
        nodes = self.nodes
        idx = np.ones(q.size, dtype=np.int64)
        for _ in range(self.depth):
            idx <<= 1
            left = nodes[idx]
            go_right = q >= left
            q -= left * go_right
            idx += go_right
        leaf = idx - self.size
        values = nodes[idx]
        bad = values <= 0.0
        if bad.any():
            leaf[bad] = self._repair(leaf[bad])
            values = nodes[self.size + leaf]
        return leaf, values

    def _repair(self, leaf: np.ndarray) -> np.ndarray:
        # Rounding can walk past the last positive leaf (m ~ total); take the nearest positive one to the left,
        # or to the right when there is none. Happens with probability ~1e-16 per draw.
        positive = np.flatnonzero(self.nodes[self.size : self.size + self.capacity] > 0.0)
        if positive.size == 0:
            raise ValueError("cannot sample from a sum tree whose total is zero")
        k = np.searchsorted(positive, leaf, side="right") - 1
        return positive[np.clip(k, 0, positive.size - 1)]


class MaxTree(SegmentTree):
    """Max tree: the largest leaf value in O(1), kept exact under batched updates and overwrites."""

    _identity = 0.0
    _is_max = True
    _compiled_update = staticmethod(kernels.update_max) if kernels.AVAILABLE else None

    @staticmethod
    def _combine(left, right):
        return np.maximum(left, right)

    @property
    def max(self) -> float:
        return float(self.nodes[1])

    def range_max(self, lo: int, hi: int) -> float:
        """Largest of the leaves ``lo .. hi - 1`` in O(log N); 0.0 (the padding value) for an empty range."""
        lo, hi = max(0, int(lo)), min(self.capacity, int(hi))
        if self._kernel_update is not None:
            return float(kernels.range_max(self.nodes, self.size, lo, hi))
        nodes, res = self.nodes, 0.0
        lo, hi = lo + self.size, hi + self.size
        while lo < hi:
            if lo & 1:
                res = max(res, float(nodes[lo]))
                lo += 1
            if hi & 1:
                hi -= 1
                res = max(res, float(nodes[hi]))
            lo >>= 1
            hi >>= 1
        return res


class SumMaxPair:
    """A binary sum tree and a binary max tree over the same leaves, behind the interface of relive's
    ``SumMaxTree`` (what PER calls), so that PER can run on the binary trees (bench/replay_throughput.py)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.sums, self.maxes = SumTree(capacity), MaxTree(capacity)

    total = property(lambda self: self.sums.total)
    max = property(lambda self: self.maxes.max)
    leaves = property(lambda self: self.sums.leaves)

    def draw(self, uniforms: np.ndarray):
        total = self.sums.total
        uniforms *= total
        leaf, probability = self.sums.find_prefix_with_values(uniforms)
        probability /= total
        return leaf, probability, probability.min() / probability

    def update(self, indices, values) -> None:
        self.sums.update(indices, values)
        self.maxes.update(indices, values)

    def update_range(self, start: int, values) -> None:
        self.sums.update_range(start, values)
        self.maxes.update_range(start, values)

    def set_all(self, values) -> None:
        self.sums.set_all(values)
        self.maxes.set_all(values)

    def range_max(self, lo: int, hi: int) -> float:
        return self.maxes.range_max(lo, hi)
