"""BERB (Lee et al. 2021; formulas of the official code): the first-chunk mass, priorities and the JS loss
against a NumPy evaluation of the density-ratio network, learning online vs offline, draws and checkpoints."""

import numpy as np
import pytest

from relive.replay import BERBSampler, MixtureSampler, ReplayBuffer
from tests.replay.adaptive_helpers import check_frequencies_with_power, rows

T = 5.0


def berb_buffer(n_off=300, seed=0, capacity=1000, **kw):
    s = BERBSampler(hidden=(32, 32), ratio_batch_size=64, first_chunk_rows=100, seed=seed, **kw)
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=s, seed=seed)
    rng = np.random.default_rng(seed)
    off = rows(np.zeros(n_off), ends=(n_off - 1,))
    off["obs"][:] = rng.normal(0, 1, (n_off, 2))
    off["action"][:] = rng.uniform(-1, 1, (n_off, 1))
    buf.add_offline(off)
    return buf


def online_rows(n, rng):
    r = rows(np.zeros(n), ends=(n - 1,))
    r["obs"][:] = rng.normal(3, 1, (n, 2))
    r["action"][:] = rng.uniform(-1, 1, (n, 1))
    return r


def numpy_ratio(sampler, slots):
    """w(s, a) = relu(MLP([s, a])) evaluated in NumPy (float64) from the network's parameters."""
    st = sampler.storage
    x = np.concatenate([st.columns["obs"][slots], st.columns["action"][slots]], axis=1).astype(np.float64)
    params = {k: v.detach().numpy().astype(np.float64) for k, v in sampler.net.state_dict().items()}
    layers = sorted({int(k.split(".")[0]) for k in params})
    for layer in layers:
        x = x @ params[f"{layer}.weight"].T + params[f"{layer}.bias"]
        x = np.maximum(x, 0.0)  # hidden ReLUs, and the output ReLU that keeps w >= 0
    return x[:, 0]


@pytest.mark.parametrize("f", [0.5, 0.75])
def test_first_online_chunk_receives_fraction_f_of_the_mass(f):
    buf = berb_buffer(init_online_fraction=f)
    p0 = buf.sampler.probabilities()
    np.testing.assert_allclose(p0[:300], 1 / 300)  # offline rows enter with priority 1
    buf.extend(online_rows(100, np.random.default_rng(1)))
    p = buf.sampler.probabilities()
    assert p[300:400].sum() == pytest.approx(f, rel=1e-12)
    np.testing.assert_allclose(p[300:400], p[300])  # all at the initial max priority M f / ((1 - f) N)
    assert buf.sampler.max_priority == pytest.approx(300 * f / ((1 - f) * 100))


def test_an_update_sets_eq6_priorities_from_the_pre_step_network_and_takes_one_js_step():
    buf = berb_buffer()
    buf.extend(online_rows(200, np.random.default_rng(1)))
    s = buf.sampler
    for _ in range(5):  # move the network away from its initialization
        b = buf.sample(32)
        buf.update(b.info, td_error=np.zeros(32))
    before = np.array(s.tree.leaves)
    rng_state = s.rng.bit_generator.state
    b = buf.sample(32)
    # what update() will draw for the ratio batches, and the network before its step
    replay = np.random.default_rng()
    replay.bit_generator.state = rng_state
    off, on = replay.integers(0, 300, 64), replay.integers(300, 500, 64)
    w_rl, w_off, w_on = numpy_ratio(s, b.info.indices), numpy_ratio(s, off), numpy_ratio(s, on)
    # JS objective [L_w]
    loss = np.mean(-np.log(2 / (w_off + 1) + 1e-10)) - np.mean(np.log(2 * w_on / (w_on + 1) + 1e-10))
    normalizer = np.mean(w_off ** (1 / T)) + 1e-10
    expected = np.clip(w_rl ** (1 / T) / normalizer, 1e-3, 1e3)  # priority [p_i]
    old_params = [p.detach().clone() for p in s.net.parameters()]
    buf.update(b.info, td_error=np.zeros(32))
    assert s.last_ratio_loss == pytest.approx(loss, rel=1e-4)
    assert s.normalizer == pytest.approx(normalizer, rel=1e-5)
    assert any((p != q).any() for p, q in zip(s.net.parameters(), old_params, strict=True))  # one Adam step
    leaves = before.copy()
    uniq, last = np.unique(b.info.indices[::-1], return_index=True)
    leaves[uniq] = expected[::-1][last]
    np.testing.assert_allclose(np.array(s.tree.leaves), leaves, rtol=1e-5)
    np.testing.assert_allclose(s.probabilities(), leaves / leaves.sum(), rtol=1e-5)
    # a row inserted now gets the all-time max priority
    top = max(s.max_priority, 1.0)
    (slot,) = buf.extend(online_rows(1, np.random.default_rng(2)))
    assert s.tree[slot] == pytest.approx(top)


def test_the_density_ratio_separates_online_from_offline_rows():
    buf = berb_buffer()
    buf.extend(online_rows(300, np.random.default_rng(1)))
    s = buf.sampler
    for _ in range(200):
        b = buf.sample(64)
        buf.update(b.info, td_error=np.zeros(64))
    w_off, w_on = numpy_ratio(s, np.arange(300)).mean(), numpy_ratio(s, np.arange(300, 600)).mean()
    assert w_on > 2 * w_off, (w_on, w_off)  # JS estimator: w ~ d_online / d_offline
    p = s.probabilities()
    assert p[300:600].sum() > p[:300].sum()


def test_offline_phase_leaves_priorities_alone():
    buf = berb_buffer()
    b = buf.sample(16)
    buf.update(b.info, td_error=np.zeros(16))  # no online rows yet: no step, no refresh
    assert buf.sampler.num_ratio_steps == 0
    np.testing.assert_allclose(buf.sampler.probabilities()[:300], 1 / 300)
    assert np.isnan(buf.sampler.train_ratio())


def test_draws_match_and_the_test_has_power():
    buf = berb_buffer(n_off=40)
    buf.extend(online_rows(20, np.random.default_rng(1)))
    for _ in range(3):
        b = buf.sample(32)
        buf.update(b.info, td_error=np.zeros(32))
    check_frequencies_with_power(buf, buf.sampler.probabilities())


def test_save_load_round_trip(tmp_path):
    buf = berb_buffer(n_off=40)
    buf.extend(online_rows(20, np.random.default_rng(1)))
    for _ in range(3):
        b = buf.sample(32)
        buf.update(b.info, td_error=np.zeros(32))
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    for _ in range(3):  # same draws, same ratio batches, same Adam steps
        a, b = buf.sample(8).info, loaded.sample(8).info
        np.testing.assert_array_equal(a.indices, b.indices)
        buf.update(a, td_error=np.ones(8))
        loaded.update(b, td_error=np.ones(8))
        np.testing.assert_allclose(loaded.sampler.probabilities(), buf.sampler.probabilities(), rtol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="one source"):
        ReplayBuffer(10, (2,), (1,), sampler=MixtureSampler(BERBSampler(), BERBSampler()))
    for kw in ({"temperature": 0}, {"init_online_fraction": 1.0}, {"first_chunk_rows": 0}, {"clip_low": 0}):
        with pytest.raises(ValueError):
            BERBSampler(**kw)
