"""The 8-ary sum tree: its draws follow the prefix-sum distribution at sizes that are and are not powers of the
fanout, edge cases (one positive leaf, tiny priorities, duplicate indices in a batch), and checkpoints written
by the binary tree it replaced still load and sample the same."""

import json
from pathlib import Path

import numpy as np
import pytest

from relive.replay import ReplayBuffer
from relive.replay.sum_tree import FANOUT, MaxTree, SumTree
from relive.testing import chisquare_pvalue

KERNELS = pytest.mark.parametrize("use_kernels", [True, False], ids=["compiled", "numpy"])
DATA = Path(__file__).parent / "data"


def draw(tree: SumTree, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([tree.find_prefix(rng.random(256) * tree.total) for _ in range(-(-n // 256))])[:n]


def hand_made(capacity: int) -> np.ndarray:
    """A saw-tooth of priorities with zero runs (whole groups of 8 and partial ones) and a few large values."""
    p = (np.arange(capacity) % 7 + 1).astype(np.float64)
    p[3 : 3 + min(capacity // 4, 20)] = 0.0
    p[::11] *= 5.0
    p[-1] = 0.0 if capacity > 1 else 1.0
    return p


@KERNELS
@pytest.mark.parametrize("capacity", [1, 7, FANOUT, FANOUT + 1, 63, FANOUT**2, 100, FANOUT**3 + 5])
def test_draws_follow_the_prefix_sum_distribution(capacity, use_kernels):
    p = hand_made(capacity)
    tree = SumTree(capacity, use_kernels)
    tree.set_all(p)
    drawn = draw(tree, 40 * capacity + 2000, seed=capacity)
    assert chisquare_pvalue(drawn, p / p.sum()) > 1e-3
    if capacity > 1:  # the test can fail: the same draws against a distribution with two cells swapped
        wrong = p.copy()
        top = int(np.argmax(p))
        other = int(np.flatnonzero((p > 0) & (p < p[top] / 2))[0])
        wrong[[top, other]] = wrong[[other, top]]
        assert chisquare_pvalue(drawn, wrong / wrong.sum()) < 1e-3


@KERNELS
@pytest.mark.parametrize("capacity", [9, 64, 1000])
def test_a_single_positive_leaf_is_always_drawn(capacity, use_kernels):
    tree = SumTree(capacity, use_kernels)
    for j in (0, capacity // 2, capacity - 1):
        p = np.zeros(capacity)
        p[j] = 0.3
        tree.set_all(p)
        q = np.concatenate([np.linspace(0, tree.total, 50), [np.nextafter(tree.total, 0), tree.total]])
        leaf, value = tree.find_prefix_with_values(q)
        assert (leaf == j).all() and (value == 0.3).all()


@KERNELS
def test_tiny_priorities_keep_their_proportions(use_kernels):
    # subnormal-adjacent values: the running sums are exact multiples, so the draws must follow 1:2:...:8
    p = np.arange(1, 9, dtype=np.float64) * 1e-300
    tree = SumTree(8, use_kernels)
    tree.set_all(p)
    assert tree.total == pytest.approx(p.sum(), rel=1e-12)
    assert chisquare_pvalue(draw(tree, 20_000, seed=1), p / p.sum()) > 1e-3
    tree.update([3], [0.0])  # a zero among tiny positives is never drawn
    assert 3 not in set(draw(tree, 5000, seed=2).tolist())


@KERNELS
def test_duplicate_indices_in_a_batch_last_write_wins_at_every_level(use_kernels):
    capacity = FANOUT**3 + 3
    for cls in (SumTree, MaxTree):
        tree, ref = cls(capacity, use_kernels), cls(capacity, use_kernels)
        rng = np.random.default_rng(3)
        base = rng.random(capacity)
        tree.set_all(base)
        idx = np.array([5, 500, 5, 7, 500, 5, capacity - 1, 7])
        val = np.array([9.0, 8.0, 0.5, 0.0, 0.25, 3.0, 2.0, 1.5])
        tree.update(idx, val)
        expected = base.copy()
        for i, v in zip(idx, val, strict=True):  # sequential: the last write of an index wins
            expected[i] = v
        ref.set_all(expected)
        np.testing.assert_array_equal(tree.nodes, ref.nodes)  # every internal node, not only the leaves


@KERNELS
def test_every_cache_line_of_children_is_aligned(use_kernels):
    tree = SumTree(FANOUT**3 + 5, use_kernels)
    assert tree.nodes.ctypes.data % 64 == 0
    assert (tree.offsets % FANOUT == 0).all()


def test_a_checkpoint_saved_with_the_binary_tree_loads_and_samples_the_same():
    """data/per_checkpoint_binary_tree was written by the binary tree's code (see make_per_checkpoint_*.py)."""
    expected = json.loads((DATA / "per_checkpoint_binary_tree_expected.json").read_text())
    buf = ReplayBuffer.load(DATA / "per_checkpoint_binary_tree")
    np.testing.assert_allclose(buf.sampler.probabilities(), expected["probabilities"], rtol=1e-12)
    assert [buf.sample(16).info.indices.tolist() for _ in range(5)] == expected["next_draws"]
