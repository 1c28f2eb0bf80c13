"""ARB's per-row scores (relive.agents.scoring) against torch.distributions and a NumPy evaluation."""

import numpy as np
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from relive.agents.scoring import log_prob_score, standardized_score


def _case(seed=0, n=64, d=3):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, d, generator=g, dtype=torch.float64)
    log_std = torch.randn(n, d, generator=g, dtype=torch.float64).clamp(-2, 1)
    action = torch.rand(n, d, generator=g, dtype=torch.float64) * 1.98 - 0.99
    return mean, log_std, action


def test_log_prob_score_is_the_tanh_gaussian_log_density_averaged_over_dims():
    mean, log_std, action = _case()
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
    expected = dist.log_prob(action).mean(-1)  # log pi(a|s) with the tanh Jacobian, per dimension, averaged
    torch.testing.assert_close(log_prob_score(mean, log_std, action), expected, rtol=1e-9, atol=1e-9)


def test_standardized_score_matches_the_reference_formula():
    mean, log_std, action = _case(1)
    std = log_std.exp()
    u = np.arctanh(np.clip(action.numpy(), -1 + 1e-6, 1 - 1e-6))
    z = (u - mean.numpy()) / std.numpy()
    expected = (-0.5 * z**2 - 0.5 * np.log(2 * np.pi)).mean(-1)  # = mean of log N(u; mu, sigma) + log sigma
    np.testing.assert_allclose(standardized_score(mean, std, action).numpy(), expected, rtol=1e-12)
    assert (standardized_score(mean, std, action) <= -0.5 * np.log(2 * np.pi) + 1e-12).all()


def test_actions_at_the_bounds_give_finite_scores():
    mean, log_std, _ = _case(2, n=4)
    action = torch.tensor([[1.0, -1.0, 0.0]] * 4, dtype=torch.float64)
    assert torch.isfinite(log_prob_score(mean, log_std, action)).all()
    assert torch.isfinite(standardized_score(mean, log_std.exp(), action)).all()
