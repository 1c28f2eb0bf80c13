"""The fast paths of the replay core against plain reference computations: range-max queries, the leaf values
returned by the prefix search, and PER's "new rows get the largest priority currently stored" through ring
wrap-around, batches longer than the ring and overwritten maxima."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler, _check_kernels
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


# -- the compiled checks (relive.replay._check_kernels) against the NumPy path ------------------------------------
def _errors_or_result(fn):
    try:
        return ("ok", fn())
    except ValueError as e:
        return ("error", str(e))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_update_checks_compiled_and_numpy_agree_on_every_input(data):
    """buffer.update's compiled check accepts, refuses and marks stale exactly as the NumPy path: the same
    report on good batches (with rows overwritten since sampling), the same error message on bad ones (a slot
    out of range, an empty demonstration slot, NaN / inf signals)."""
    if not _check_kernels.AVAILABLE:
        pytest.skip("numba is not importable: there is only the NumPy path")

    def build():
        sampler = MixtureSampler(PrioritizedSampler(), PrioritizedSampler())
        buf = ReplayBuffer(64, (3,), (2,), sampler=sampler, seed=0, demo_capacity=8)
        buf.add_offline(random_transitions(10, 3, 2, rng=1, episode_length=5))
        buf.extend(random_transitions(20, 3, 2, rng=2, episode_length=7))
        return buf

    a, b = build(), build()
    info = a.sample(16).info
    overwritten = data.draw(st.integers(0, 60))  # rows written after sampling: some sampled slots become stale
    for buf in (a, b):
        if overwritten:
            buf.extend(random_transitions(overwritten, 3, 2, rng=3, episode_length=9))
    idx = np.array(info.indices)
    td = np.random.default_rng(data.draw(st.integers(0, 99))).normal(size=16)
    bad = data.draw(st.sampled_from(["none", "range", "negative", "gap", "nan", "inf"]))
    k = data.draw(st.integers(0, 15))
    if bad == "range":
        idx[k] = 64 + overwritten
    elif bad == "negative":
        idx[k] = -1
    elif bad == "gap":
        idx[k] = 12  # between the 10 offline rows and the ring (demo_capacity 8): empty
    elif bad == "nan":
        td[k] = np.nan
    elif bad == "inf":
        td[k] = -np.inf
    info = type(info)(indices=idx, generation=info.generation, probability=info.probability,
                      is_weight=info.is_weight, source=info.source)
    fast = _errors_or_result(lambda: a.update(info, td_error=td))
    b._check_update_compiled = lambda info, signals: None  # the NumPy path only
    slow = _errors_or_result(lambda: b.update(info, td_error=td))
    assert fast[0] == slow[0]
    if fast[0] == "error":
        assert fast[1] == slow[1]
    else:
        assert (fast[1].num_updated, fast[1].num_stale) == (slow[1].num_updated, slow[1].num_stale)
        np.testing.assert_array_equal(fast[1].stale, slow[1].stale)
        np.testing.assert_array_equal(a.sampler.probabilities(), b.sampler.probabilities())
    assert (bad == "none") == (fast[0] == "ok")


def test_all_finite_matches_numpy_and_a_write_refuses_nan_with_its_message():
    from relive.replay.storage.storage import SMALL, all_finite

    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for size in (1, 7, SMALL, SMALL + 1):
            x = rng.normal(size=size).astype(dtype)
            assert all_finite(x)
            for bad in (np.nan, np.inf, -np.inf):
                y = x.copy()
                y[rng.integers(size)] = bad
                assert not all_finite(y) and not np.isfinite(y).all()
    assert not all_finite(np.array([[1.0, 2.0], [np.nan, 0.0]])[:, :1])  # not contiguous: the NumPy path
    buf = ReplayBuffer(16, (3,), (2,), seed=0)
    rows = random_transitions(4, 3, 2, rng=0)
    rows["next_obs"][2, 1] = np.nan
    with pytest.raises(ValueError, match=r"column 'next_obs' row 2 element \(1,\): value nan is not finite"):
        buf.extend(rows)
    assert buf.storage.num_rows == 0


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_episode_index_few_rows_branch_matches_the_numpy_branch(data):
    """EpisodeIndex.append's plain-Python branch for writes of a few rows (several episodes in one write) builds the
    same records and ids as its NumPy branch: offline rows, then online writes of 1-20 rows into two streams (a ring
    that wraps), episode ends anywhere, and demonstrations written after online rows."""
    from relive.replay.storage import episodes

    def build():
        sampler = MixtureSampler(UniformSampler(), UniformSampler())
        return ReplayBuffer(48, (2,), (1,), sampler=sampler, seed=0, demo_capacity=12)

    fast, slow = build(), build()
    offline = random_transitions(data.draw(st.integers(1, 10)), 2, 1, rng=0, episode_length=3)
    writes = []
    for _ in range(data.draw(st.integers(1, 14))):
        n = data.draw(st.integers(1, 20))
        rows = random_transitions(n, 2, 1, rng=data.draw(st.integers(0, 99)), episode_length=1000)
        rows["terminated"] = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        rows["truncated"] = np.zeros(n, bool)
        writes.append((data.draw(st.sampled_from(["online0", "online1", "demo"])), rows))
    for buf, threshold in ((fast, episodes.FEW_ROWS), (slow, 0)):
        old = episodes.FEW_ROWS
        episodes.FEW_ROWS = threshold
        try:
            buf.add_offline(offline)
            for kind, rows in writes:
                if kind == "demo" and buf.storage.num_online_written:  # (before any online row: the dataset's)
                    if buf.storage.ring_base - buf.storage.num_offline >= len(rows["reward"]):
                        buf.add_demonstrations(rows)
                else:
                    buf.extend(rows, stream=int(kind[-1]) if kind != "demo" else 0)
        finally:
            episodes.FEW_ROWS = old
    a, b = fast.storage, slow.storage
    for name in a.episodes._rec:
        np.testing.assert_array_equal(a.episodes._rec[name], b.episodes._rec[name])
    assert (a.episodes.next_id, a.episodes._open, a.episodes._open_lanes) == (b.episodes.next_id, b.episodes._open,
                                                                             b.episodes._open_lanes)
    stored = np.flatnonzero(a.stored_mask())
    np.testing.assert_array_equal(a.episode_ids(stored), b.episode_ids(stored))
    np.testing.assert_array_equal(a.step_of(stored), b.step_of(stored))


def test_record_builders_build_what_the_dataclass_constructors_build():
    from dataclasses import FrozenInstanceError, fields

    from relive.types import Batch, SampleInfo, UpdateReport, new_batch, new_sample_info, new_update_report

    a, g, b, t, u = np.arange(3), np.arange(3) + 1, np.ones(3, np.float32), np.arange(3) > 0, np.arange(3) < 0
    cases = [(new_sample_info(a, g, b, b, a, {"k": 1}), SampleInfo(a, g, b, b, a, {"k": 1}))]
    info = cases[0][1]
    cases.append((new_batch(a, b, b, g, t, u, info, {"x": a}, b), Batch(a, b, b, g, t, u, info, {"x": a}, b)))
    cases.append((new_update_report(2, 1, t), UpdateReport(2, 1, t)))
    for built, ref in cases:
        assert type(built) is type(ref)
        assert set(vars(built)) == {f.name for f in fields(ref)}  # a field added to the class must be built too
        for f in fields(ref):
            got, want = getattr(built, f.name), getattr(ref, f.name)
            assert got is want or (isinstance(want, dict) and got == want)
        with pytest.raises(FrozenInstanceError):
            built.__setattr__(fields(ref)[0].name, None)
    assert len(cases[1][0]) == 3 and cases[1][0].x is a  # Batch's extras as attributes


@pytest.mark.skipif(not _check_kernels.AVAILABLE, reason="numba not installed")
def test_per_priority_kernel_gives_numpys_bits():
    sampler = PrioritizedSampler(priority_exponent=0.6)
    rng = np.random.default_rng(3)
    td = np.concatenate([rng.normal(0, 5, 500), [0.0, -0.0, 1e-300, -3e25, 3e25, 1e20, -1e20 + 1e5],
                         rng.normal(0, 1e-7, 100)])
    fast = sampler.priority_from_signals({"td_error": td})  # float64 [B]: the compiled path
    ref = np.abs(td) + sampler.eps
    np.minimum(ref, 1e20, out=ref)
    np.power(ref, 0.6, out=ref)
    np.testing.assert_array_equal(fast, ref)
    np.testing.assert_array_equal(sampler.priority_from_signals({"td_error": td[:, None]}), ref)  # NumPy path


def test_gather_records_stamps_and_sources_as_numpy_does():
    buf = ReplayBuffer(300, (3,), (2,), seed=0)
    rng = np.random.default_rng(1)
    buf.add_offline(random_transitions(40, (3,), (2,), rng=rng))
    for _ in range(5):  # the ring wraps: stamps 1 and 2
        buf.extend(random_transitions(97, (3,), (2,), rng=rng))
    st = buf.storage
    slots = np.random.default_rng(0).integers(0, st.size, 500)
    info = buf.gather(slots).info
    np.testing.assert_array_equal(info.generation, st.meta["generation"][slots])
    np.testing.assert_array_equal(info.source, (slots >= st.num_offline).astype(np.int8))
    assert info.generation.dtype == st.meta["generation"].dtype and info.source.dtype == np.int8
    assert set(np.unique(info.generation)) == {1, 2}
    with pytest.raises(ValueError, match="does not exist"):  # a slot outside the columns: refused, nothing read
        buf.gather(np.array([3, st.capacity]))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.longdouble])
def test_update_takes_td_errors_of_every_float_dtype(dtype):
    # float16 / longdouble signals take the NumPy checks (numba has no float16: the compiled check used to raise
    # NotImplementedError); every dtype gives the priorities of its values as float64
    rng = np.random.default_rng(0)
    bufs = [ReplayBuffer(64, (3,), (2,), sampler=PrioritizedSampler(), seed=1) for _ in range(2)]
    td = rng.random(16).astype(dtype)
    for buf, signal in zip(bufs, (td, td.astype(np.float64)), strict=True):
        buf.extend(random_transitions(40, (3,), (2,), rng=np.random.default_rng(2)))
        report = buf.update(buf.sample(16).info, td_error=signal)
        assert report.num_updated == 16
    np.testing.assert_array_equal(bufs[0].sampler.leaf_values(), bufs[1].sampler.leaf_values())


@settings(max_examples=60, deadline=None)
@given(slots=st.lists(st.integers(-130, 130), min_size=1, max_size=40), online=st.sampled_from([50, 150]))
def test_gather_record_matches_takes_semantics_for_any_slot(slots, online):
    # the compiled pass gives NumPy's take results for stored slots and hands every other batch to the storage's
    # check, which refuses it by index (issue 44: negative slots used to wrap, unwritten ones to read zeros)
    buf = ReplayBuffer(120, (2,), (1,), seed=0)
    rng = np.random.default_rng(0)
    buf.add_offline(random_transitions(30, (2,), (1,), rng=rng))
    buf.extend(random_transitions(online, (2,), (1,), rng=rng))  # 150: the ring wraps, stamps 1 and 2; 50: not full
    st_ = buf.storage
    idx = np.array(slots, dtype=np.int64)
    if ((idx < 0) | (idx >= st_.size)).any():
        bad = int(np.flatnonzero((idx < 0) | (idx >= st_.size))[0])
        with pytest.raises(ValueError, match=f"index {idx[bad]} at position {bad} does not exist"):
            buf.gather(idx)
        return
    want_gen = st_.meta["generation"].take(idx)
    info = buf.gather(idx).info
    np.testing.assert_array_equal(info.generation, want_gen)
    np.testing.assert_array_equal(info.source, (idx >= st_.num_offline).view(np.int8))
