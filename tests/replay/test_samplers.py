import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.testing import chisquare_pvalue, random_transitions

DRAWS = 60_000


def _buffer(sampler, n_offline=0, n_online=0, capacity=200, seed=0):
    buf = ReplayBuffer(capacity, (11,), (3,), sampler=sampler, seed=seed)
    if n_offline:
        buf.add_offline(random_transitions(n_offline, rng=1))
    if n_online:
        buf.extend(random_transitions(n_online, rng=2))
    return buf


def _draw_many(buf):
    batch_size = len(buf)
    out = [buf.sample(batch_size).info.indices for _ in range(DRAWS // batch_size)]
    return np.concatenate(out)


def _set_priorities(buf, priorities):
    """Give rows 0..k-1 known raw priorities through the public update path."""
    b = buf.gather(np.arange(len(priorities)))
    buf.update(b.info, priority=np.asarray(priorities, float))


# -- exact distributions -------------------------------------------------------------------------------
def test_uniform_probabilities_closed_form():
    buf = _buffer(UniformSampler(), n_offline=30, n_online=20, capacity=100)
    p = buf.sampler.probabilities()
    np.testing.assert_allclose(p[:50], 1 / 50)
    assert (p[50:] == 0).all()


def test_per_probabilities_closed_form_and_is_weights():
    alpha, beta = 0.7, 0.5
    buf = _buffer(PrioritizedSampler(priority_exponent=alpha, is_exponent=beta), n_online=6, capacity=10)
    raw = np.array([0.5, 1.0, 2.0, 4.0, 0.0, 3.0])
    _set_priorities(buf, raw)
    expected = raw**alpha / np.sum(raw**alpha)
    np.testing.assert_allclose(buf.sampler.probabilities()[:6], expected, rtol=1e-12)
    batch = buf.sample(6)
    idx = batch.info.indices
    np.testing.assert_allclose(batch.info.probability, expected[idx], rtol=1e-12)
    w = (6 * expected[idx]) ** -beta
    np.testing.assert_allclose(batch.info.is_weight, w / w.max(), rtol=1e-6)
    drawn = np.concatenate([buf.sample(6).info.indices for _ in range(200)])
    assert 4 not in drawn  # zero priority is never drawn


def test_per_td_error_priority_formula():
    alpha, eps = 0.6, 0.01
    buf = _buffer(PrioritizedSampler(priority_exponent=alpha, eps=eps), n_online=4, capacity=8)
    info = buf.gather(np.arange(4)).info
    td = np.array([-2.0, 0.0, 1.0, 0.5])
    buf.update(info, td_error=td)
    pa = (np.abs(td) + eps) ** alpha
    np.testing.assert_allclose(buf.sampler.probabilities()[:4], pa / pa.sum(), rtol=1e-12)


def test_per_new_rows_get_the_max_priority_currently_stored():
    buf = _buffer(PrioritizedSampler(priority_exponent=1.0), n_online=4, capacity=6)
    _set_priorities(buf, [0.1, 5.0, 0.2, 0.3])
    (slot,) = buf.extend(random_transitions(1, rng=3))
    assert buf.sampler.sum_tree[slot] == pytest.approx(5.0)
    # lowering the max row lowers what later rows get: the *current* max, not the historical one
    _set_priorities(buf, [0.1, 0.4, 0.2, 0.3])
    buf.update(buf.gather([slot]).info, priority=[0.6])
    (slot2,) = buf.extend(random_transitions(1, rng=4))
    assert buf.sampler.sum_tree[slot2] == pytest.approx(0.6)
    # overwriting the row holding the max removes it from the max: slot 4 (0.6) is overwritten next
    buf.update(buf.gather([slot2]).info, priority=[0.05])
    buf.extend(random_transitions(1, rng=5))  # ring of 6: overwrites slot 0 (0.1); max is 0.6 at slot 4
    assert buf.sampler.max_tree.max == pytest.approx(0.6)


def test_per_is_exponent_schedule():
    s = PrioritizedSampler(is_exponent=0.4, is_exponent_final=1.0, is_anneal_samples=10)
    buf = _buffer(s, n_online=20)
    assert s.beta == pytest.approx(0.4)
    for _ in range(5):
        buf.sample(4)
    assert s.beta == pytest.approx(0.7)
    for _ in range(20):
        buf.sample(4)
    assert s.beta == pytest.approx(1.0)


def test_mixture_probabilities_and_exact_counts_per_batch():
    mix = MixtureSampler(UniformSampler(), PrioritizedSampler(priority_exponent=1.0), offline_fraction=0.25)
    buf = _buffer(mix, n_offline=40, n_online=10, capacity=100)
    raw = np.arange(1, 11, dtype=float)
    buf.update(buf.gather(np.arange(40, 50)).info, priority=raw)
    p = mix.probabilities()
    np.testing.assert_allclose(p[:40], 0.25 / 40)
    np.testing.assert_allclose(p[40:50], 0.75 * raw / raw.sum())
    assert p.sum() == pytest.approx(1.0)
    for batch_size in (1, 7, 32, 50):
        counts = [int((buf.sample(batch_size).info.source == 1).sum()) for _ in range(20)]
        assert set(counts) == {batch_size - round(batch_size * 0.25)}


def test_mixture_is_offline_only_while_online_is_empty():
    buf = _buffer(MixtureSampler(), n_offline=30, capacity=100)
    assert (buf.sample(30).info.source == 0).all()
    np.testing.assert_allclose(buf.sampler.probabilities()[:30], 1 / 30)
    buf.extend(random_transitions(5, rng=9))
    assert (buf.sample(30).info.source == 1).sum() == 15


def test_mixture_routes_updates_to_the_owning_part():
    mix = MixtureSampler(PrioritizedSampler(), PrioritizedSampler())
    buf = _buffer(mix, n_offline=10, n_online=10, capacity=40)
    before_off = mix.offline.probabilities().copy()
    buf.update(buf.gather([12, 15]).info, td_error=[5.0, 7.0])
    np.testing.assert_array_equal(mix.offline.probabilities(), before_off)
    leaves = mix.online.sum_tree.leaves
    assert np.flatnonzero(leaves[:10]).size == 0  # offline rows are outside the online part
    changed = 10 + np.flatnonzero(leaves[10:20] != leaves[10])
    assert changed.tolist() == [12, 15]


# -- drawn frequencies: chi-square with power companions --------------------------------------------
def _per_buffer():
    buf = _buffer(PrioritizedSampler(priority_exponent=0.8), n_online=30, capacity=60, seed=11)
    _set_priorities(buf, np.linspace(0.05, 3.0, 30))
    return buf


def _mix_buffer():
    mix = MixtureSampler(UniformSampler(), PrioritizedSampler(priority_exponent=1.0), offline_fraction=0.5)
    buf = _buffer(mix, n_offline=20, n_online=20, capacity=60, seed=12)
    buf.update(buf.gather(np.arange(20, 40)).info, priority=np.linspace(0.1, 2.0, 20))
    return buf


@pytest.mark.parametrize("make", [
    lambda: _buffer(UniformSampler(), n_offline=15, n_online=25, capacity=60, seed=10),
    _per_buffer,
    _mix_buffer,
], ids=["uniform", "per", "mixture"])
def test_drawn_frequencies_match_probabilities(make):
    buf = make()
    p = buf.sampler.probabilities()
    assert chisquare_pvalue(_draw_many(buf), p) > 1e-3


@pytest.mark.parametrize("make", [
    lambda: _buffer(UniformSampler(), n_offline=15, n_online=25, capacity=60, seed=10),
    _per_buffer,
    _mix_buffer,
], ids=["uniform", "per", "mixture"])
def test_chisquare_rejects_a_slightly_wrong_distribution(make):
    """Power companion: the same draws tested against a distribution 10% off on a fifth of the rows."""
    buf = make()
    p = buf.sampler.probabilities().copy()
    stored = np.flatnonzero(p)
    wrong = p.copy()
    wrong[stored[: len(stored) // 5]] *= 1.10
    wrong /= wrong.sum()
    assert chisquare_pvalue(_draw_many(buf), wrong) < 1e-3


def test_stats_report_online_fraction_and_ess():
    mix = MixtureSampler(offline_fraction=0.5)
    buf = _buffer(mix, n_offline=30, n_online=10, capacity=100)
    buf.sample(40)
    s = buf.stats()
    assert s["replay/online_fraction"] == 0.5
    assert s["replay/online_mass"] == pytest.approx(0.5)
    p = np.r_[np.full(30, 0.5 / 30), np.full(10, 0.5 / 10)]
    assert s["replay/ess"] == pytest.approx(1 / np.sum(p**2))
    assert s["replay/num_stale"] == 0
