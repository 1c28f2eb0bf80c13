"""ARB (Song et al., Sec. 4, Alg. 1): exact weights on hand-made episodes, the trajectory geometric mean, refresh
vs from scratch, the amortized sweep, draws between refreshes, a torch policy's scores, checkpoints."""

import numpy as np
import pytest
import torch

from relive.agents.scoring import standardized_score
from relive.replay import ARBSampler, MixtureSampler, ReplayBuffer, UniformSampler
from relive.replay import _tree_kernels as kernels
from tests.replay.adaptive_helpers import check_frequencies_with_power, rows


def score_fn(obs, action):  # per-row log score = the token (a wide range, to exercise the clipping)
    return obs[:, 0].astype(np.float64)


def arb_buffer(sampler, capacity=30, seed=0):
    """Offline: episodes of 4 and 5 rows and one left unfinished by the dataset's end (3 rows). Online: 25 rows
    into a ring of 18, so it wraps: the first online episode (rows 0..6) loses its head, the last is ongoing."""
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=sampler, seed=seed)
    rng = np.random.default_rng(seed)
    buf.add_offline(rows(rng.uniform(-15, 3, 12), ends=(3, 8)))
    buf.extend(rows(rng.uniform(-6, 9, 25), ends=(6, 13), terms=(20,)))
    return buf


def arb_expected(buf, temperature, low=-12.0, high=7.0, level="trajectory", score=None):
    """P(i) of Sec. 4 evaluated directly: clip, shift by the max, trajectory mean, exp(L / lambda), normalize."""
    n = len(buf)
    raw = buf.storage.columns["obs"][:n, 0].astype(np.float64) if score is None else score
    lhat = np.clip(raw, low, high)
    lhat = lhat - lhat.max()
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
def test_probabilities_match_the_formula(level, temperature):
    buf = arb_buffer(ARBSampler(temperature=temperature, level=level))
    assert buf.refresh(score_fn)
    expected = arb_expected(buf, temperature, level=level)
    np.testing.assert_allclose(buf.sampler.probabilities(), expected, rtol=1e-10)
    batch = buf.sample(16)
    np.testing.assert_allclose(batch.info.probability, expected[batch.info.indices], rtol=1e-10)
    assert (batch.info.is_weight == 1).all()  # no IS correction by default (reference code)


def test_trajectory_weight_is_the_geometric_mean_of_the_likelihoods():
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


def test_refresh_equals_from_scratch_and_new_rows_get_the_provisional_weight():
    a = arb_buffer(ARBSampler(temperature=2.0))
    a.refresh(lambda o, _: -o[:, 0])  # an older policy
    a.refresh(score_fn)
    b = arb_buffer(ARBSampler(temperature=2.0))
    b.refresh(score_fn)
    np.testing.assert_allclose(a.sampler.probabilities(), b.sampler.probabilities(), rtol=1e-12)
    (slot,) = a.extend(rows([0.0]))
    assert a.sampler.tree[slot] == pytest.approx(1.0)  # exp(0 / lambda): the largest weight after the shift
    assert np.isnan(a.sampler.score[slot])
    p = a.sampler.probabilities()
    assert p[slot] == pytest.approx(p.max())


def gaussian_policy(obs_dim=2, act_dim=1, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(obs_dim, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2 * act_dim))


def test_a_torch_policy_is_scored_in_chunks_without_autograd_and_matches_numpy():
    policy = gaussian_policy()
    chunks = []

    def torch_score(obs, action):
        assert not torch.is_grad_enabled()  # the refresh runs under torch.no_grad()
        chunks.append(len(obs))
        mean, log_std = policy(torch.as_tensor(obs)).chunk(2, -1)
        return standardized_score(mean, log_std.clamp(-20, 2).exp(), torch.as_tensor(action))

    buf = arb_buffer(ARBSampler(temperature=2.0))
    rng = np.random.default_rng(3)
    buf.storage.columns["action"][: len(buf)] = rng.uniform(-1, 1, (len(buf), 1))
    buf.refresh(torch_score, chunk_size=7)
    assert chunks == [7, 7, 7, 7, 2]
    # the whole pipeline in NumPy: MLP forward, standardized score (reference code), ARB weights
    n = len(buf)
    params = {k: v.detach().numpy().astype(np.float64) for k, v in policy.state_dict().items()}
    h = np.maximum(buf.storage.columns["obs"][:n] @ params["0.weight"].T + params["0.bias"], 0)
    out = h @ params["2.weight"].T + params["2.bias"]
    mean, std = out[:, :1], np.exp(np.clip(out[:, 1:], -20, 2))
    u = np.arctanh(np.clip(buf.storage.columns["action"][:n].astype(np.float64), -1 + 1e-6, 1 - 1e-6))
    score = (-0.5 * ((u - mean) / std) ** 2 - 0.5 * np.log(2 * np.pi)).mean(1)
    np.testing.assert_allclose(buf.sampler.probabilities(), arb_expected(buf, 2.0, score=score), rtol=1e-5)
    one_chunk = arb_buffer(ARBSampler(temperature=2.0))
    one_chunk.storage.columns["action"][:n] = buf.storage.columns["action"][:n]
    one_chunk.refresh(torch_score)
    np.testing.assert_allclose(one_chunk.sampler.probabilities(), buf.sampler.probabilities(), rtol=1e-6)


def test_optional_importance_sampling_correction():
    buf = arb_buffer(ARBSampler(temperature=1.0, is_correction=True, is_exponent=0.6))
    buf.refresh(score_fn)
    p = buf.sampler.probabilities()
    info = buf.sample(30).info
    w = (len(buf) * p[info.indices]) ** -0.6
    np.testing.assert_allclose(info.is_weight, w / w.max(), rtol=1e-6)


def test_amortized_mode_converges_to_the_full_refresh():
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
    # a new policy: one more sweep tracks the new full refresh too
    full.refresh(lambda o, _: -0.5 * o[:, 0])
    for _ in range(5):
        amortized.refresh(lambda o, _: -0.5 * o[:, 0])
    np.testing.assert_allclose(amortized.sampler.probabilities(), full.sampler.probabilities(), rtol=1e-10)
    check_frequencies_with_power(amortized, amortized.sampler.probabilities())


def test_amortized_mode_rescales_when_scores_drift_far():
    """With a small lambda, scores moving across the clip range would push exp(L / lambda) out of float64."""
    buf = arb_buffer(ARBSampler(temperature=0.02, amortized_rows_per_refresh=30))

    def late(o, _):
        return np.full(len(o), 6.0) + 0.01 * o[:, 0]

    buf.refresh(lambda o, _: np.full(len(o), -11.0) + 0.01 * o[:, 0])
    buf.refresh(late)  # +17 / 0.02: exp(850) relative to the first shift, beyond float64
    p = buf.sampler.probabilities()
    assert np.isfinite(p).all()
    np.testing.assert_allclose(p, arb_expected(buf, 0.02, score=late(buf.storage.columns["obs"][:30], None)),
                               rtol=1e-9)


def test_validates_scores_and_arguments():
    buf = arb_buffer(ARBSampler())
    with pytest.raises(ValueError, match="non-finite"):
        buf.refresh(lambda o, a: np.full(len(o), np.nan))
    with pytest.raises(ValueError, match="scores for"):
        buf.refresh(lambda o, a: np.zeros(3))
    for kw in ({"temperature": 0}, {"level": "episode"}, {"log_p_low": 7.0, "log_p_high": -12.0},
               {"amortized_rows_per_refresh": -1}):
        with pytest.raises(ValueError):
            ARBSampler(**kw)


def prepared(kind):
    if kind == "arb":
        buf = arb_buffer(ARBSampler(temperature=3.0), seed=3)
        buf.refresh(score_fn)
    elif kind == "arb_after_inserts":  # alias table + fresh rows + rows overwritten since the refresh
        buf = arb_buffer(ARBSampler(temperature=3.0), seed=3)
        buf.refresh(score_fn)
        buf.extend(rows(np.linspace(-5, 5, 6)))
    elif kind == "amortized":
        buf = arb_buffer(ARBSampler(temperature=3.0, amortized_rows_per_refresh=11), seed=3)
        buf.refresh(score_fn)
        buf.refresh(score_fn)
    else:  # ARB over the online part of a symmetric mixture
        buf = ReplayBuffer(30, (2,), (1,), sampler=MixtureSampler(UniformSampler(), ARBSampler(1.0)), seed=4)
        buf.add_offline(rows(np.arange(10.0), ends=(9,)))
        buf.extend(rows(np.linspace(-3, 3, 15), ends=(6,)))
        buf.refresh(score_fn)
    return buf


KINDS = ["arb", "arb_after_inserts", "amortized", "mixture_arb"]


@pytest.mark.parametrize("kind", KINDS)
def test_drawn_frequencies_match_and_the_test_has_power(kind):
    buf = prepared(kind)
    s = buf.sampler
    p = s.probabilities(batch_size=len(buf)) if kind == "mixture_arb" else s.probabilities()
    check_frequencies_with_power(buf, p)


@pytest.mark.parametrize("new_rows", [3, 12, 40])
def test_alias_draws_stay_exact_after_inserts_that_overwrite_scored_rows(new_rows):
    """Between refreshes ARB draws from the refresh's alias table plus the fresh rows; rows overwritten by
    the ring since the refresh must drop out (40 new rows overwrite the whole 18-row ring twice)."""
    buf = arb_buffer(ARBSampler(temperature=1.0), seed=5)
    buf.refresh(score_fn)
    buf.extend(rows(np.linspace(-5, 5, new_rows)))
    s = buf.sampler
    p = s.probabilities()
    if kernels.AVAILABLE:  # (without numba there is no alias table: the tree search draws, checked below too)
        total_ref = s._alias.total
        n_fresh = min(new_rows, buf.storage.online_capacity)
        assert total_ref - s.stale_mass + n_fresh * s.provisional_weight() == pytest.approx(s.tree.total,
                                                                                            rel=1e-12)
    else:
        assert s._alias is None
    info = buf.sample(30).info
    np.testing.assert_allclose(info.probability, p[info.indices], rtol=1e-12)
    check_frequencies_with_power(buf, p)


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip(kind, tmp_path):
    buf = prepared(kind)
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    for _ in range(3):
        np.testing.assert_array_equal(buf.sample(8).info.indices, loaded.sample(8).info.indices)
        more = rows(np.linspace(-2, 2, 4), ends=(1,))
        buf.extend(more)
        loaded.extend(more)
    buf.refresh(score_fn)
    loaded.refresh(score_fn)
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    np.testing.assert_array_equal(buf.sample(8).info.indices, loaded.sample(8).info.indices)
