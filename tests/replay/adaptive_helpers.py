"""Hand-made rows and a draw-frequency check shared by the ARB, ReaPER and BERB tests."""

import numpy as np

from relive.testing import chisquare_pvalue

DRAWS = 60_000


def rows(tokens, ends=(), terms=(), obs_dim=2, act_dim=1):
    """Rows whose obs[:, 0] is a token (read by the tests' score functions); the episode ends (truncated) at
    the rows listed in ``ends`` and terminates at those in ``terms``."""
    tokens = np.asarray(tokens, float)
    n = tokens.size
    obs = np.zeros((n, obs_dim), np.float32)
    obs[:, 0] = tokens
    term = np.zeros(n, bool)
    term[list(terms)] = True
    trunc = np.zeros(n, bool)
    trunc[list(ends)] = True
    trunc &= ~term
    return dict(obs=obs, action=np.zeros((n, act_dim), np.float32), reward=np.zeros(n, np.float32), next_obs=obs,
                terminated=term, truncated=trunc)


def draw_many(buf, draws=DRAWS):
    n = len(buf)
    return np.concatenate([buf.sample(n).info.indices for _ in range(max(1, draws // n))])


def check_frequencies_with_power(buf, p, draws=DRAWS, bump=1.10):
    """Drawn frequencies pass a chi-square test against ``p`` and fail it against a slightly wrong ``p``: the
    heaviest rows holding half the mass get ``bump`` times their probability (then renormalized)."""
    drawn = draw_many(buf, draws)
    assert chisquare_pvalue(drawn, p) > 1e-3
    order = np.argsort(p)[::-1]
    heaviest = order[: int(np.searchsorted(np.cumsum(p[order]), 0.5 * p.sum())) + 1]
    wrong = p.copy()
    wrong[heaviest] *= bump
    assert chisquare_pvalue(drawn, wrong / wrong.sum()) < 1e-3
