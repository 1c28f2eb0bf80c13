"""Vectorized float64 segment trees (sum and max) over a fixed number of leaves: 8-ary, one cache line per node.

Layout. Every node has ``FANOUT = 8`` children, and the 8 children of a node lie side by side in one 64-byte
cache line (8 float64). The levels are stored one after the other in one array, root first (level-major), each
level padded to a multiple of 8 and starting on a cache-line boundary::

    level 0: [root, pad x 7] | level 1: [8 nodes] | ... | leaf level: [leaf 0 .. leaf capacity-1, pad]

Node ``i`` of level ``l`` (its index inside the level) has children ``8i .. 8i + 7`` of level ``l + 1``. At 1M
leaves the tree has 7 levels below the root (a binary tree: 20), so a prefix search or an update touches 7
cache lines instead of ~20; the upper levels stay in cache, and a draw costs about one or two misses to memory.

Every operation takes a whole batch of indices or queries and walks the tree one *level* at a time, so the
independent loads of a batch overlap their cache misses. When numba is importable the walks run as compiled
loops (:mod:`relive.replay._tree_kernels`); otherwise as NumPy array operations per level. Both paths build
bit-identical trees and return identical draws (the tests run the same checks on both).

Numerics. A parent is always recomputed from its 8 children, never updated by adding a delta, so the float64
totals do not drift however many updates are applied. The sum of a group is taken in one fixed pairwise order,
``((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))``, in both paths.

Checkpoints hold leaf values only (samplers save ``leaves`` and rebuild with ``set_all``), so they do not
depend on this layout: buffers saved with the binary tree that preceded it load unchanged.
"""

from __future__ import annotations

import numpy as np

from relive.replay import _tree_kernels as kernels

FANOUT = kernels.FANOUT  # children per node: 8 float64 = one 64-byte cache line


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


def _aligned_zeros(n: int) -> np.ndarray:
    """``n`` float64 zeros whose first element starts a 64-byte cache line (so each group of 8 children is one)."""
    buf = np.zeros(n + FANOUT, dtype=np.float64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip : skip + n]


def _group_sums(children: np.ndarray) -> np.ndarray:
    """Sums of the rows of a ``(k, FANOUT)`` array in the kernels' pairwise order (adjacent pairs, halving)."""
    while children.shape[1] > 1:
        children = children[:, 0::2] + children[:, 1::2]
    return children[:, 0]


def _climb(tree: SegmentTree, bottom: np.ndarray, nodes: np.ndarray, leaves: np.ndarray, is_max: bool) -> None:
    """NumPy path: after ``leaves`` changed, recompute each touched parent of ``nodes`` from its 8 children, level by
    level; the level above the leaves reads them from ``bottom`` (``nodes`` itself for a plain tree, the sum tree's
    for a :class:`SumMaxTree`'s maxima). The kernels' ``climb``, vectorized."""
    group = np.arange(FANOUT)
    idx, offsets = leaves, tree.offsets
    for level in range(tree.depth - 1, -1, -1):
        idx = np.unique(idx // FANOUT)
        children = (bottom if level == tree.depth - 1 else nodes)[offsets[level + 1] + FANOUT * idx[:, None] + group]
        nodes[offsets[level] + idx] = children.max(axis=1) if is_max else _group_sums(children)


def _range_max(tree: SegmentTree, bottom: np.ndarray, nodes: np.ndarray, lo: int, hi: int) -> float:
    """Largest of leaves ``lo .. hi - 1`` (leaves in ``bottom``, maxima above them in ``nodes``): the kernels'
    ``range_max`` in NumPy -- the partial groups at both ends of each level, then the whole groups' parents."""
    res, level = 0.0, tree.depth
    while lo < hi:
        first, src = tree.offsets[level], (bottom if level == tree.depth else nodes)
        head = min(hi, -(-lo // FANOUT) * FANOUT)
        tail = max(head, hi // FANOUT * FANOUT)
        for a, b in ((lo, head), (tail, hi)):
            if b > a:
                res = max(res, float(src[first + a : first + b].max()))
        lo, hi, level = head // FANOUT, tail // FANOUT, level - 1
    return res


class SegmentTree:
    """An 8-ary tree over ``capacity`` leaves in one level-major array (see the module docstring)."""

    _identity = 0.0
    _is_max = False

    def __init__(self, capacity: int, use_kernels: bool | None = None):
        """``use_kernels``: run the compiled numba loops (default: when numba is importable) or the
        vectorized NumPy path (``False``)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        counts = [self.capacity]  # nodes per level, leaves first
        while counts[-1] > 1:
            counts.append(-(-counts[-1] // FANOUT))
        counts.reverse()
        padded = [-(-c // FANOUT) * FANOUT for c in counts]
        #: where each level starts in ``nodes`` (root level first); the last entry is the leaf level
        self.offsets = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
        self.depth = len(counts) - 1  # levels below the root
        self.leaf_offset = int(self.offsets[-1])
        self.nodes = _aligned_zeros(int(sum(padded)))
        self._kernels = kernels.AVAILABLE if use_kernels is None else bool(use_kernels and kernels.AVAILABLE)

    # -- batched operations ---------------------------------------------------------------------------
    def __getitem__(self, indices) -> np.ndarray:
        return self.nodes[self.leaf_offset + np.asarray(indices, dtype=np.int64)]

    @property
    def leaves(self) -> np.ndarray:
        """A read-only view of the ``capacity`` leaf values."""
        view = self.nodes[self.leaf_offset : self.leaf_offset + self.capacity]
        view.flags.writeable = False
        return view

    def root(self) -> float:
        return float(self.nodes[0])

    def update(self, indices, values) -> None:
        """Set ``leaf[indices] = values``; duplicate indices: the last one wins."""
        if not (type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1):
            indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
        if not (type(values) is np.ndarray and values.dtype == np.float64 and values.ndim == 1):
            values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        if indices.size != values.size:
            raise ValueError(f"{indices.size} indices but {values.size} values")
        if indices.size:
            self._write(indices, values)

    def _write(self, indices: np.ndarray, values: np.ndarray) -> None:
        """:meth:`update` of checked int64 / float64 arrays (a subclass keeping more per node extends this)."""
        if self._kernels:  # leaves written in order: a later duplicate simply overwrites an earlier one
            kernels.update(self.nodes, self.offsets, indices, values, self._is_max)
            return
        indices, values = _dedupe_last(indices, values)
        self.nodes[self.leaf_offset + indices] = values
        _climb(self, self.nodes, self.nodes, indices, self._is_max)

    def update_range(self, start: int, values) -> None:
        """Set the contiguous leaves ``start .. start + len(values) - 1`` (the fast path for rows appended to the
        storage): each level's touched parents are one slice, recomputed in one pass."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        lo, hi = int(start), int(start) + values.size
        if values.size == 0:
            return
        if lo < 0 or hi > self.capacity:
            raise ValueError(f"leaf range [{lo}, {hi}) outside [0, {self.capacity})")
        if self._kernels:
            kernels.update_range(self.nodes, self.offsets, lo, values, self._is_max)
            return
        nodes, offsets = self.nodes, self.offsets
        nodes[self.leaf_offset + lo : self.leaf_offset + hi] = values
        hi -= 1  # inclusive from here on
        for level in range(self.depth - 1, -1, -1):
            lo, hi = lo // FANOUT, hi // FANOUT
            first = offsets[level + 1]
            children = nodes[first + FANOUT * lo : first + FANOUT * (hi + 1)].reshape(-1, FANOUT)
            nodes[offsets[level] + lo : offsets[level] + hi + 1] = (children.max(axis=1) if self._is_max
                                                                    else _group_sums(children))

    def set_all(self, values) -> None:
        """Replace every leaf at once (O(N), one pass per level)."""
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if values.size != self.capacity:
            raise ValueError(f"expected {self.capacity} values, got {values.size}")
        self.update_range(0, values)


class SumTree(SegmentTree):
    """Sum tree with a batched prefix-sum search (proportional sampling)."""

    @property
    def total(self) -> float:
        return float(self.nodes[0])

    def find_prefix(self, mass: np.ndarray) -> np.ndarray:
        """For each ``m`` in ``mass`` (0 <= m < total) the leaf ``j`` with prefix(j) <= m < prefix(j + 1).

        Never returns a leaf of zero value while the total is positive: a query that float rounding carries
        past the last positive child of a node (m ~ total) takes that last positive child.
        """
        return self.find_prefix_with_values(mass)[0]

    def find_prefix_with_values(self, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`find_prefix` and the value of each leaf found (one pass; what proportional sampling needs)."""
        if not self.nodes[0] > 0.0:
            raise ValueError("cannot sample from a sum tree whose total is zero")
        q = np.array(mass, dtype=np.float64, copy=True).reshape(-1)
        leaf, values = np.empty(q.size, np.int64), np.empty(q.size, np.float64)
        if self._kernels:
            kernels.find_prefix(self.nodes, self.offsets, q, leaf, values)
            return leaf, values
        # the same walk with NumPy, a level at a time: at each node, among its 8 children, take the first
        # child whose running sum exceeds m -- but never one past the last positive child -- and subtract the
        # children before it. A zero child is never taken: its running sum equals its left neighbour's.
        rows = np.arange(q.size)
        idx = np.zeros(q.size, dtype=np.int64)  # node index inside the current level
        for level in range(1, self.depth + 1):
            children = self.nodes[self.offsets[level] + FANOUT * idx[:, None] + np.arange(FANOUT)]
            running = np.cumsum(children, axis=1)
            last_positive = FANOUT - 1 - np.argmax(children[:, ::-1] > 0.0, axis=1)
            j = np.minimum((running <= q[:, None]).sum(axis=1), last_positive)
            q -= np.where(j > 0, running[rows, j - 1], 0.0)
            idx = FANOUT * idx + j
        leaf[:] = idx
        values[:] = self.nodes[self.leaf_offset + idx]
        return leaf, values

    def draw(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Proportional draws: for each ``u`` in ``uniforms`` (0 <= u < 1; a float64 array this call overwrites)
        the leaf at mass ``u * total`` (:meth:`find_prefix`), its probability ``value / total``, and
        ``min_j probability_j / probability`` (PER's importance-sampling ratio before its exponent). One compiled
        call when the kernels are in use; both paths do the same float64 operations in the same order."""
        if not self.nodes[0] > 0.0:
            raise ValueError("cannot sample from a sum tree whose total is zero")
        n = uniforms.size
        leaf, probability, ratio = np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.float64)
        if self._kernels:
            kernels.draw_proportional(self.nodes, self.offsets, uniforms, leaf, probability, ratio)
            return leaf, probability, ratio
        total = float(self.nodes[0])
        uniforms *= total
        leaf, probability = self.find_prefix_with_values(uniforms)
        probability /= total
        np.divide(probability.min(), probability, out=ratio)
        return leaf, probability, ratio


class MaxTree(SegmentTree):
    """Max tree: the largest leaf value in O(1), kept exact under batched updates and overwrites."""

    _is_max = True

    @property
    def max(self) -> float:
        return float(self.nodes[0])

    def range_max(self, lo: int, hi: int) -> float:
        """Largest of the leaves ``lo .. hi - 1`` in O(8 log_8 N); 0.0 (the padding value) for an empty range."""
        lo, hi = max(0, int(lo)), min(self.capacity, int(hi))
        if self._kernels:
            return float(kernels.range_max(self.nodes, self.nodes, self.offsets, lo, hi))
        return _range_max(self, self.nodes, self.nodes, lo, hi)


class SumMaxTree(SumTree):
    """A sum tree that also keeps, for every internal node, the largest leaf below it (PER: new rows get the
    largest priority *currently stored*, exact after overwrites and lowered priorities). The leaves are stored
    once: the maxima live in ``max_nodes`` (the internal levels only, same layout), and the level just above the
    leaves takes its 8 children from the sum tree's leaf cache line, which an update has just written. Versus a
    separate :class:`MaxTree` over the same leaves: the same answers, without a second leaf array (8 bytes a
    row) and its cache miss per updated row."""

    def __init__(self, capacity: int, use_kernels: bool | None = None):
        super().__init__(capacity, use_kernels)
        self.max_nodes = _aligned_zeros(self.leaf_offset)

    @property
    def max(self) -> float:
        """The largest leaf (0.0 when every leaf is 0)."""
        return float(self.max_nodes[0]) if self.depth else float(self.nodes[0])

    def _write(self, indices: np.ndarray, values: np.ndarray) -> None:
        if self._kernels:  # the leaves, the sums and the maxima in one call
            kernels.update_sum_max(self.nodes, self.max_nodes, self.offsets, indices, values)
            return
        super()._write(indices, values)  # the leaves and the sums
        _climb(self, self.nodes, self.max_nodes, indices, True)

    def update_range(self, start: int, values) -> None:
        super().update_range(start, values)  # (checks the range)
        n = np.asarray(values).size
        if n == 0:
            return
        lo, hi = int(start), int(start) + n - 1
        if self._kernels:
            kernels.climb_range(self.nodes, self.max_nodes, self.offsets, lo, hi, True)
        else:
            _climb(self, self.nodes, self.max_nodes, np.arange(lo, hi + 1), True)

    def range_max(self, lo: int, hi: int) -> float:
        """Largest of the leaves ``lo .. hi - 1`` in O(8 log_8 N); 0.0 for an empty range."""
        lo, hi = max(0, int(lo)), min(self.capacity, int(hi))
        if self._kernels:
            return float(kernels.range_max(self.nodes, self.max_nodes, self.offsets, lo, hi))
        return _range_max(self, self.nodes, self.max_nodes, lo, hi)
