"""The fast paths of the replay core against plain reference computations: range-max queries, the leaf values
returned by the prefix search, and PER's "new rows get the largest priority currently stored" through ring
wrap-around, batches longer than the ring and overwritten maxima."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay import PrioritizedSampler, ReplayBuffer
from relive.replay.sum_tree import MaxTree, SumTree
from relive.testing import random_transitions

KERNELS = pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "numpy"])


@KERNELS
@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.just(0.0), st.floats(1e-3, 100)), min_size=1, max_size=40),
       bounds=st.tuples(st.integers(0, 40), st.integers(0, 40)))
def test_range_max_matches_a_slice_max(values, bounds, use_kernels):
    tree = MaxTree(len(values), use_kernels)
    tree.set_all(np.array(values))
    lo, hi = bounds
    ref = max(values[lo:hi], default=0.0)
    assert tree.range_max(lo, hi) == ref


@KERNELS
def test_find_prefix_with_values_returns_the_found_leaves(use_kernels):
    rng = np.random.default_rng(0)
    tree = SumTree(1000, use_kernels)
    tree.set_all(rng.random(1000) * (rng.random(1000) > 0.3))
    mass = rng.random(300) * tree.total
    leaf, value = tree.find_prefix_with_values(mass)
    np.testing.assert_array_equal(leaf, tree.find_prefix(mass))
    np.testing.assert_array_equal(value, tree.leaves[leaf])
    assert (value > 0).all()


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(3, 12), n_offline=st.integers(0, 2),
       ops=st.lists(st.one_of(st.tuples(st.just("extend"), st.integers(1, 15)),
                              st.tuples(st.just("update"), st.integers(0, 10_000))), min_size=1, max_size=12))
def test_per_new_rows_get_the_current_max_of_the_surviving_rows(capacity, n_offline, ops):
    """A plain model: priority per slot; an extend removes the overwritten rows first, then every new row gets
    the max of what is left (initial priority when nothing is left)."""
    s = PrioritizedSampler(priority_exponent=1.0)
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=s, seed=0)
    model = np.zeros(capacity)
    if n_offline:
        buf.add_offline(random_transitions(n_offline, (2,), (1,), rng=1))
        model[:n_offline] = 1.0
    rng = np.random.default_rng(len(ops))
    seed = 10
    for op, arg in ops:
        if op == "extend":
            slots = buf.extend(random_transitions(arg, (2,), (1,), rng=seed))
            seed += 1
            written = slots[slots >= 0]
            survivors = model.copy()
            survivors[written] = 0.0
            expected = survivors.max() if survivors.max() > 0 else 1.0
            model[written] = expected
        elif len(buf):
            k = min(len(buf), 4)
            idx = rng.choice(len(buf), k, replace=False)
            pr = rng.random(k) * 5 * (rng.random(k) > 0.2)
            buf.update(buf.gather(idx).info, priority=pr)
            model[idx] = pr
        np.testing.assert_allclose(s.sum_tree.leaves, model, rtol=1e-12)
        assert s.max_tree.max == pytest.approx(model.max())


@KERNELS
@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 40),
       steps=st.lists(st.lists(st.tuples(st.integers(0, 39), st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])),
                               min_size=1, max_size=10), min_size=1, max_size=10))
def test_every_max_tree_node_equals_a_rebuild_after_updates(capacity, steps, use_kernels):
    """The compiled update stops at the first parent whose value does not change; every internal node must
    still be the max of its children (ties and lowered maxima included: few distinct values)."""
    tree = MaxTree(capacity, use_kernels)
    for batch in steps:
        idx = np.array([i % capacity for i, _ in batch])
        tree.update(idx, np.array([v for _, v in batch]))
        rebuilt = MaxTree(capacity, use_kernels)
        rebuilt.set_all(tree.leaves)
        np.testing.assert_array_equal(tree.nodes, rebuilt.nodes)
