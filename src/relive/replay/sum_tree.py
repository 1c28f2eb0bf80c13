"""Vectorized float64 segment trees (sum and max) over a fixed number of leaves.

Every operation takes a whole batch of indices or queries and walks the tree one *level* at a time with
NumPy array operations, so the cost is O(batch * log N) with log N Python-level steps, never a Python loop
per row. When numba is importable the same walks run as compiled loops (:mod:`relive.replay._tree_kernels`:
updates about 2x faster at 1M leaves, the prefix search about 4x as it is also branch-free); both paths build
identical trees. Parents are always recomputed from their two children (never updated by adding a delta), so
the float64 totals do not drift however many updates are applied.
"""

from __future__ import annotations

import numpy as np

from relive.replay import _tree_kernels as kernels


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
