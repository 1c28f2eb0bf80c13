"""ARB, ReaPER and BERB: exact distributions against direct NumPy evaluations of the papers' formulas."""

import numpy as np
import pytest

from relive.replay import ARBSampler, BERBSampler, MixtureSampler, ReaPERSampler, ReplayBuffer, UniformSampler
from relive.testing import chisquare_pvalue


def rows(tokens, ends=(), terms=(), obs_dim=2):
    """Rows whose obs[:, 0] is a token (used by the score functions below); episode ends where listed."""
    tokens = np.asarray(tokens, float)
    n = tokens.size
    obs = np.zeros((n, obs_dim), np.float32)
    obs[:, 0] = tokens
    trunc = np.zeros(n, bool)
    trunc[list(ends)] = True
    term = np.zeros(n, bool)
    term[list(terms)] = True
    trunc &= ~term
    return dict(obs=obs, action=np.zeros((n, 1), np.float32), reward=np.zeros(n, np.float32), next_obs=obs,
                terminated=term, truncated=trunc)


def score_fn(obs, action):  # per-row log score = the token (wide range, to exercise the clipping)
    return obs[:, 0].astype(np.float64)


def arb_buffer(sampler, capacity=30, seed=0):
    """Offline: episodes of 4, 5 (ends at 3, 8) and an unfinished-at-dataset-end one of 3. Online: 25 rows
    into a ring of 18, so it wraps and evicts the head of the first online episode."""
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=sampler, seed=seed)
    rng = np.random.default_rng(seed)
    buf.add_offline(rows(rng.uniform(-15, 3, 12), ends=(3, 8)))
    buf.extend(rows(rng.uniform(-6, 9, 25), ends=(6, 13), terms=(20,)))
    return buf


def arb_expected(buf, temperature, low=-12.0, high=7.0, level="trajectory"):
    n = len(buf)
    score = np.clip(buf.storage.columns["obs"][:n, 0].astype(np.float64), low, high)
    lhat = score - score.max()
    if level == "trajectory":
        ep = buf.storage.meta["episode_id"][:n]
        L = np.array([lhat[ep == e].mean() for e in ep])
    else:
        L = lhat
    w = np.exp(L / temperature)
    p = np.zeros(buf.capacity)
    p[:n] = w / w.sum()
    return p


@pytest.mark.parametrize("level", ["trajectory", "transition"])
@pytest.mark.parametrize("temperature", [0.5, 5.0])
def test_arb_probabilities_match_the_formula(level, temperature):
    buf = arb_buffer(ARBSampler(temperature=temperature, level=level))
    assert buf.refresh(score_fn)
    np.testing.assert_allclose(buf.sampler.probabilities(), arb_expected(buf, temperature, level=level), rtol=1e-10)


def test_arb_trajectory_weight_is_the_geometric_mean_of_the_likelihoods():
    buf = arb_buffer(ARBSampler(temperature=1.0))
    buf.refresh(score_fn)
    n = len(buf)
    ep = buf.storage.meta["episode_id"][:n]
    score = np.clip(buf.storage.columns["obs"][:n, 0].astype(np.float64), -12, 7)
    lik = np.exp(score - score.max())  # per-row likelihood (shifted)
    w = np.array(buf.sampler.tree.leaves[:n])
    for e in np.unique(ep):
        geo = np.prod(lik[ep == e]) ** (1 / np.sum(ep == e))
        np.testing.assert_allclose(w[ep == e], geo, rtol=1e-10)


def test_arb_refresh_equals_from_scratch_and_new_rows_get_the_provisional_weight():
    a = arb_buffer(ARBSampler(temperature=2.0))
    a.refresh(lambda o, _: -o[:, 0])  # an older policy
    a.refresh(score_fn)
    b = arb_buffer(ARBSampler(temperature=2.0))
    b.refresh(score_fn)
    np.testing.assert_allclose(a.sampler.probabilities(), b.sampler.probabilities(), rtol=1e-12)
    (slot,) = a.extend(rows([0.0]))
    assert a.sampler.tree[slot] == pytest.approx(1.0)  # exp(0 / lambda): the largest weight after the shift
    assert np.isnan(a.sampler.score[slot])


def test_arb_amortized_mode_converges_to_the_full_refresh():
    full = arb_buffer(ARBSampler(temperature=2.0))
    full.refresh(score_fn)
    amortized = arb_buffer(ARBSampler(temperature=2.0, amortized_rows_per_refresh=7))
    p0 = amortized.sampler.probabilities().copy()
    errors = []
    for _ in range(5):  # 5 x 7 rows >= 30 stored rows: one full sweep
        amortized.refresh(score_fn)
        errors.append(np.abs(amortized.sampler.probabilities() - full.sampler.probabilities()).sum())
    assert errors[-1] < 1e-12
    assert np.abs(p0 - full.sampler.probabilities()).sum() > 0.1  # it did have to move


def test_arb_validates_scores():
    buf = arb_buffer(ARBSampler())
    with pytest.raises(ValueError, match="non-finite"):
        buf.refresh(lambda o, a: np.full(len(o), np.nan))
    with pytest.raises(ValueError, match="scores for"):
        buf.refresh(lambda o, a: np.zeros(3))
    with pytest.raises(ValueError):
        ARBSampler(temperature=0)
    with pytest.raises(ValueError):
        ARBSampler(level="episode")


# -- ReaPER --------------------------------------------------------------------------------------------
def reaper_buffer(capacity=40, wrap=False, omega=0.5, alpha=0.7):
    s = ReaPERSampler(priority_exponent=alpha, reliability_exponent=omega, is_exponent=0.5)
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=s, seed=1)
    buf.add_offline(rows(np.arange(10), ends=(3, 9)))  # two finished episodes: 4 and 6 rows
    n_online = 45 if wrap else 14
    buf.extend(rows(np.arange(n_online), ends=tuple(range(7, n_online - 1, 8)), terms=()))  # last one ongoing
    return buf


def reaper_expected(buf, alpha, omega, eps=1e-6):
    st = buf.storage
    s = buf.sampler
    view = st.episodes.live()
    psi = np.zeros(buf.capacity)
    totals = {}
    per_ep = {}
    for e, start, length, src in zip(view.ids, view.start, view.length, view.source, strict=True):
        slots = st.episode_slots([start], [length], [src])
        d = s.delta[slots]
        totals[e] = d.sum()
        per_ep[e] = (slots, d)
    F = max(totals.values())
    for (slots, d), fin in zip(per_ep.values(), view.finished, strict=True):
        C = np.cumsum(d)
        R = C / (C[-1] if fin else F)
        psi[slots] = R**omega * d**alpha
    return psi / psi.sum(), psi


@pytest.mark.parametrize("wrap", [False, True])
def test_reaper_probabilities_match_the_formula(wrap):
    buf = reaper_buffer(wrap=wrap)
    rng = np.random.default_rng(0)
    n = len(buf)
    buf.update(buf.gather(np.arange(n)).info, td_error=rng.normal(size=n) * 3)
    p, _ = reaper_expected(buf, 0.7, 0.5)
    np.testing.assert_allclose(buf.sampler.probabilities(), p, rtol=1e-9, atol=1e-15)
    # the terminal-row rule: the last row of a finished episode has reliability 1
    view = buf.storage.episodes.live()
    last = [buf.storage.episode_slots([s], [n_], [src])[-1]
            for s, n_, src, fin in zip(view.start, view.length, view.source, view.finished, strict=True) if fin]
    np.testing.assert_allclose(buf.sampler.reliability(np.array(last)), 1.0, rtol=1e-9)


def test_reaper_update_touches_only_its_episode_and_equals_a_recompute():
    buf = reaper_buffer()
    n = len(buf)
    rng = np.random.default_rng(1)
    buf.update(buf.gather(np.arange(n)).info, td_error=rng.uniform(1, 2, n))
    before = np.array(buf.sampler.tree.leaves)
    F_before = buf.sampler.F
    slot = 1  # row 1 of the first offline episode (rows 0..3, finished, not the largest total)
    buf.update(buf.gather([slot]).info, td_error=[0.3])
    assert buf.sampler.F == F_before
    changed = np.flatnonzero(np.array(buf.sampler.tree.leaves) != before)
    # rows 0..2 move (their C / S_e changed); the terminal row keeps R = 1 and its own d
    assert set(changed.tolist()) == {0, 1, 2}
    _, psi = reaper_expected(buf, 0.7, 0.5)
    np.testing.assert_allclose(np.array(buf.sampler.tree.leaves), psi, rtol=1e-9, atol=1e-15)


def test_reaper_new_rows_get_the_running_max_td():
    buf = reaper_buffer()
    buf.update(buf.gather([0, 5]).info, td_error=[7.0, -2.0])
    (slot,) = buf.extend(rows([99.0]))
    assert buf.sampler.delta[slot] == pytest.approx(7.0 + 1e-6)


# -- BERB ----------------------------------------------------------------------------------------------
def berb_buffer(n_off=300, seed=0, **kw):
    s = BERBSampler(hidden=(32, 32), ratio_batch_size=64, first_chunk_rows=100, seed=seed, **kw)
    buf = ReplayBuffer(1000, (2,), (1,), sampler=s, seed=seed)
    rng = np.random.default_rng(seed)
    off = rows(np.zeros(n_off), ends=(n_off - 1,))
    off["obs"][:] = rng.normal(0, 1, (n_off, 2))
    buf.add_offline(off)
    return buf


def online_rows(n, rng):
    r = rows(np.zeros(n), ends=(n - 1,))
    r["obs"][:] = rng.normal(3, 1, (n, 2))
    return r


@pytest.mark.parametrize("f", [0.5, 0.75])
def test_berb_first_online_chunk_receives_fraction_f_of_the_mass(f):
    buf = berb_buffer(init_online_fraction=f)
    buf.extend(online_rows(100, np.random.default_rng(1)))
    p = buf.sampler.probabilities()
    assert p[300:400].sum() == pytest.approx(f, rel=1e-12)


def test_berb_priorities_follow_the_density_ratio_formula_and_learn_online_vs_offline():
    buf = berb_buffer()
    buf.extend(online_rows(300, np.random.default_rng(1)))
    s = buf.sampler
    for _ in range(200):
        b = buf.sample(64)
        buf.update(b.info, td_error=np.zeros(64))
    b = buf.sample(64)
    buf.update(b.info, td_error=np.zeros(64))
    import torch

    with torch.no_grad():
        w = s.ratio(b.info.indices).numpy().astype(np.float64)
    expected = np.clip(w ** (1 / 5.0) / s.normalizer, 1e-3, 1e3)
    uniq, last = np.unique(b.info.indices[::-1], return_index=True)
    np.testing.assert_allclose(s.tree[uniq], expected[::-1][last], rtol=1e-6)
    with torch.no_grad():
        w_off = s.ratio(np.arange(0, 300)).mean().item()
        w_on = s.ratio(np.arange(300, 600)).mean().item()
    assert w_on > 2 * w_off, (w_on, w_off)  # the JS estimator separates online from offline rows


# -- distributions and checkpoints of all three -----------------------------------------------------------
def _prepared(kind):
    if kind == "arb":
        buf = arb_buffer(ARBSampler(temperature=3.0), seed=3)
        buf.refresh(score_fn)
    elif kind == "reaper":
        buf = reaper_buffer()
        buf.update(buf.gather(np.arange(len(buf))).info, td_error=np.random.default_rng(2).normal(size=len(buf)))
    elif kind == "berb":
        buf = berb_buffer(n_off=40)
        buf.extend(online_rows(20, np.random.default_rng(1)))
        b = buf.sample(32)
        buf.update(b.info, td_error=np.zeros(32))
    else:  # ARB over the online part of a symmetric mixture
        buf = ReplayBuffer(30, (2,), (1,), sampler=MixtureSampler(UniformSampler(), ARBSampler(1.0)), seed=4)
        buf.add_offline(rows(np.arange(10.0), ends=(9,)))
        buf.extend(rows(np.linspace(-3, 3, 15), ends=(6,)))
        buf.refresh(score_fn)
    return buf


KINDS = ["arb", "reaper", "berb", "mixture_arb"]


@pytest.mark.parametrize("kind", KINDS)
def test_drawn_frequencies_match_and_the_test_has_power(kind):
    buf = _prepared(kind)
    p = (buf.sampler.probabilities(batch_size=len(buf)) if kind == "mixture_arb" else buf.sampler.probabilities())
    draws = np.concatenate([buf.sample(len(buf)).info.indices for _ in range(60_000 // len(buf))])
    assert chisquare_pvalue(draws, p) > 1e-3
    heaviest = np.argsort(p)[::-1][: max(2, int((p > 0).sum()) // 5)]
    wrong = p.copy()
    wrong[heaviest] *= 1.10  # 10% too much mass on the fifth of the rows that matter most
    assert chisquare_pvalue(draws, wrong / wrong.sum()) < 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(kind, tmp_path):
    buf = _prepared(kind)
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    np.testing.assert_allclose(loaded.sampler.probabilities(), buf.sampler.probabilities(), rtol=1e-12)
    for _ in range(3):
        np.testing.assert_array_equal(buf.sample(8).info.indices, loaded.sample(8).info.indices)
    if kind in ("reaper", "berb"):
        info = buf.sample(8).info
        info2 = loaded.sample(8).info
        buf.update(info, td_error=np.ones(8))
        loaded.update(info2, td_error=np.ones(8))
        np.testing.assert_allclose(loaded.sampler.probabilities(), buf.sampler.probabilities(), rtol=1e-6)


@pytest.mark.parametrize("new_rows", [3, 12, 40])
def test_arb_alias_draws_stay_exact_after_inserts_that_overwrite_scored_rows(new_rows):
    """Between refreshes ARB draws from the refresh's alias table plus the fresh rows; rows overwritten by
    the ring since the refresh must drop out (40 new rows overwrite the whole 18-row ring twice)."""
    buf = arb_buffer(ARBSampler(temperature=1.0), seed=5)
    buf.refresh(score_fn)
    buf.extend(rows(np.linspace(-5, 5, new_rows)))
    s = buf.sampler
    p = s.probabilities()
    lo, hi, _, _, _, total_ref, _, _ = s._alias
    n_fresh = min(new_rows, buf.storage.online_capacity)
    assert total_ref - s.stale_mass + n_fresh * s.provisional_weight() == pytest.approx(s.tree.total, rel=1e-12)
    draws = np.concatenate([buf.sample(len(buf)).info.indices for _ in range(60_000 // len(buf))])
    assert chisquare_pvalue(draws, p) > 1e-3
    wrong = p.copy()
    wrong[np.argmax(p)] *= 1.10  # 10% too much on the heaviest row
    assert chisquare_pvalue(draws, wrong / wrong.sum()) < 1e-3
