import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay.sum_tree import MaxTree, SumMaxTree, SumTree


@st.composite
def update_sequences(draw):
    capacity = draw(st.integers(1, 40))
    steps = draw(st.lists(
        st.lists(st.tuples(st.integers(0, capacity - 1), st.one_of(st.just(0.0), st.floats(1e-3, 100))),
                 min_size=1, max_size=12),
        min_size=1, max_size=8))
    return capacity, steps


KERNELS = pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "numpy"])


@KERNELS
@settings(max_examples=150, deadline=None)
@given(case=update_sequences())
def test_trees_match_naive_reference_under_random_batched_updates(case, use_kernels):
    capacity, steps = case
    sums, maxes = SumTree(capacity, use_kernels), MaxTree(capacity, use_kernels)
    naive = np.zeros(capacity)
    for batch in steps:
        idx = np.array([i for i, _ in batch])
        val = np.array([v for _, v in batch])
        sums.update(idx, val)
        maxes.update(idx, val)
        for i, v in batch:  # sequential reference: the last write of an index wins
            naive[i] = v
        np.testing.assert_array_equal(sums.leaves, naive)
        assert sums.total == pytest.approx(naive.sum(), rel=1e-12, abs=1e-12)
        assert maxes.max == naive.max()
        if naive.sum() > 0:
            cum = np.cumsum(naive)
            q = np.linspace(0, naive.sum(), 7, endpoint=False)
            expected = np.searchsorted(cum, q, side="right")
            got = sums.find_prefix(q)
            # ties at a cumulative boundary may resolve to either side only when a leaf is zero
            assert np.all(naive[got] > 0)
            np.testing.assert_array_equal(got, expected)


@KERNELS
def test_duplicate_indices_last_write_wins(use_kernels):
    t = SumTree(8, use_kernels)
    t.update([3, 5, 3, 3], [1.0, 2.0, 7.0, 4.0])
    assert t[3] == 4.0 and t[5] == 2.0 and t.total == 6.0
    m = MaxTree(8, use_kernels)
    m.update([2, 2], [9.0, 1.0])
    assert m.max == 1.0


@KERNELS
def test_capacity_not_a_multiple_of_the_fanout_pads_with_zeros(use_kernels):
    t = SumTree(5, use_kernels)
    assert t.depth == 1 and t.nodes.size == 16  # the root's line and one line of 8 leaves (3 of them padding)
    t.set_all(np.arange(1, 6, dtype=float))
    assert t.total == 15.0
    assert not t.nodes[t.leaf_offset + 5 :].any()
    assert set(t.find_prefix(np.linspace(0, 14.999, 50)).tolist()) <= set(range(5))


@KERNELS
def test_find_prefix_never_returns_a_zero_leaf_at_the_top_boundary(use_kernels):
    t = SumTree(4, use_kernels)
    t.update([0, 1, 2, 3], [0.1, 0.2, 0.7, 0.0])
    # a query at (or rounded up to) the total must not land on the trailing zero leaf
    got = t.find_prefix(np.array([t.total, np.nextafter(t.total, 0), 0.0]))
    assert np.all(t[got] > 0)
    assert got[0] == 2


def test_total_does_not_drift_over_many_updates():
    rng = np.random.default_rng(0)
    t = SumTree(1000)
    for _ in range(2000):
        t.update(rng.integers(0, 1000, 64), rng.random(64) * 1e3)
    assert t.total == pytest.approx(t.leaves.sum(), rel=1e-13)


@KERNELS
def test_set_all_update_and_update_range_agree(use_kernels):
    rng = np.random.default_rng(1)
    values = rng.random(37)
    for cls in (SumTree, MaxTree):
        a, b, c = cls(37, use_kernels), cls(37, use_kernels), cls(37, use_kernels)
        a.set_all(values)
        b.update(np.arange(37), values)
        c.update_range(0, values[:20])
        c.update_range(20, values[20:])
        np.testing.assert_array_equal(a.nodes, b.nodes)
        np.testing.assert_allclose(a.nodes, c.nodes, rtol=1e-15)
        c.update_range(5, np.zeros(3))
        b.update([5, 6, 7], np.zeros(3))
        np.testing.assert_allclose(b.nodes, c.nodes, rtol=1e-15)


def test_compiled_and_numpy_paths_build_identical_trees_and_draws():
    rng = np.random.default_rng(2)
    fast, slow = SumTree(1000, True), SumTree(1000, False)
    for _ in range(20):
        idx, val = rng.integers(0, 1000, 64), rng.random(64)
        fast.update(idx, val)
        slow.update(idx, val)
    np.testing.assert_array_equal(fast.nodes, slow.nodes)
    q = rng.random(500) * fast.total
    np.testing.assert_array_equal(fast.find_prefix(q), slow.find_prefix(q))


def test_bad_arguments():
    with pytest.raises(ValueError):
        SumTree(0)
    with pytest.raises(ValueError):
        SumTree(4).update([0, 1], [1.0])
    with pytest.raises(ValueError):
        SumTree(4).find_prefix(np.array([0.0]))  # total is zero


@KERNELS
@settings(max_examples=150, deadline=None)
@given(case=update_sequences(), data=st.data())
def test_sum_max_tree_matches_a_sum_tree_and_the_naive_maxima(case, data, use_kernels):
    """SumMaxTree keeps the maxima without leaves of their own: its sums are a SumTree's, bit for bit, and its
    max / range_max those of the leaves, after batched updates and contiguous writes in any order."""
    capacity, steps = case
    tree, sums = SumMaxTree(capacity, use_kernels), SumTree(capacity, use_kernels)
    naive = np.zeros(capacity)
    for batch in steps:
        if data.draw(st.booleans()):
            idx = np.array([i for i, _ in batch])
            val = np.array([v for _, v in batch])
            tree.update(idx, val)
            sums.update(idx, val)
            for i, v in batch:
                naive[i] = v
        else:  # a contiguous write (what appending rows does)
            start = data.draw(st.integers(0, capacity - 1))
            val = np.array([v for _, v in batch])[: capacity - start]
            tree.update_range(start, val)
            sums.update_range(start, val)
            naive[start : start + val.size] = val
        np.testing.assert_array_equal(tree.nodes, sums.nodes)
        assert tree.max == naive.max()
        lo = data.draw(st.integers(0, capacity))
        hi = data.draw(st.integers(lo, capacity))
        assert tree.range_max(lo, hi) == (naive[lo:hi].max() if hi > lo else 0.0)


def test_sum_max_tree_compiled_and_numpy_paths_agree_and_answer_like_a_max_tree():
    rng = np.random.default_rng(3)
    fast, slow, maxes = SumMaxTree(1000, True), SumMaxTree(1000, False), MaxTree(1000)
    for _ in range(30):
        idx, val = rng.integers(0, 1000, 64), rng.random(64) * (rng.random(64) < 0.8)
        for t in (fast, slow, maxes):
            t.update(idx, val)
        start = int(rng.integers(0, 990))
        for t in (fast, slow, maxes):
            t.update_range(start, np.full(10, 0.5))
    np.testing.assert_array_equal(fast.nodes, slow.nodes)
    np.testing.assert_array_equal(fast.max_nodes, slow.max_nodes)
    # the maxima are a MaxTree's internal levels: nothing lost by not storing their leaves
    np.testing.assert_array_equal(fast.max_nodes, maxes.nodes[: maxes.leaf_offset])
    for lo, hi in rng.integers(0, 1001, (50, 2)):
        lo, hi = min(lo, hi), max(lo, hi)
        assert fast.range_max(lo, hi) == slow.range_max(lo, hi) == maxes.range_max(lo, hi)


@KERNELS
def test_draw_is_find_prefix_with_its_probability_and_importance_ratio(use_kernels):
    """draw(u): the leaves at masses u * total, probability = value / total and min(probability) / probability,
    the same float64 operations as doing it by hand (bit for bit), on both paths."""
    rng = np.random.default_rng(4)
    t = SumTree(5000, use_kernels)
    t.set_all(rng.random(5000) ** 3)
    u = rng.random(256)
    leaf, probability, ratio = t.draw(u.copy())
    mass = u * t.total
    want_leaf, values = t.find_prefix_with_values(mass)
    want_p = values / t.total
    np.testing.assert_array_equal(leaf, want_leaf)
    np.testing.assert_array_equal(probability, want_p)
    np.testing.assert_array_equal(ratio, want_p.min() / want_p)
    with pytest.raises(ValueError, match="total is zero"):
        SumTree(4, use_kernels).draw(np.array([0.5]))
