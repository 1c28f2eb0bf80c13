"""The goal distribution of each HER strategy (the paper's Sec. 4.5, the her-sweep grid's strategies): seeded
chi-square tests of the drawn goal rows against each strategy's closed form, with a companion that rejects the
wrong form (issue 46 item 3)."""

import numpy as np
import pytest
from scipy import stats

from relive.replay import UniformSampler
from relive.replay.samplers.her import STRATEGIES, HindsightSampler
from tests.replay.test_her import her_buffer, reward_fn


def expected_goal_rows(st, rows: np.ndarray, strategy: str) -> np.ndarray:
    """Expected counts of goal row j (a slot: no ring wrap, no offline rows here) over the drawn rows ``rows``:
    future U{t, ..., last}, episode U{first, ..., last}, random U{all stored rows}, final the last stored row."""
    expected = np.zeros(st.size)
    ep = st.meta["episode_id"][rows]
    end = st.episodes.end_of(ep)
    first = st.episodes.get(ep).start
    for t, s, e in zip(rows, first, end, strict=True):
        lo = {"future": t, "episode": s, "random": 0, "final": e - 1}[strategy]
        hi = st.size if strategy == "random" else e
        expected[lo:hi] += 1.0 / (hi - lo)
    return expected


def draw(strategy: str, n_batches: int = 60, seed: int = 0):
    """Goal rows of every row of ``n_batches`` batches of 50, all relabeled (k huge), and the drawn rows."""
    buf = her_buffer(HindsightSampler(UniformSampler(), strategy, k=1e9, reward_fn=reward_fn), capacity=1000,
                     seed=seed, ep_len=(4, 9), rows_per_stream=60)
    rows, goals = [], []
    for _ in range(n_batches):
        b = buf.sample(50)
        assert b.info.hints["her/relabeled"].all()
        rows.append(b.info.indices)
        goals.append(b.info.hints["her/goal_slot"])
    return buf.storage, np.concatenate(rows), np.concatenate(goals)


def chi2_p(observed_goals: np.ndarray, expected: np.ndarray) -> float:
    observed = np.bincount(observed_goals, minlength=expected.size).astype(float)
    cells = expected > 0
    if (observed[~cells] > 0).any():
        return 0.0  # a goal row outside the strategy's support
    return float(stats.chisquare(observed[cells], expected[cells]).pvalue)


@pytest.mark.parametrize("strategy", ["future", "episode", "random"])
def test_goal_rows_follow_the_strategys_distribution(strategy):
    st, rows, goals = draw(strategy)
    assert chi2_p(goals, expected_goal_rows(st, rows, strategy)) > 1e-3
    # the companion: the same draws are rejected under another strategy's distribution (random against episode:
    # their marginals over goal rows agree, so by the share of goals in the drawn row's own episode, 1 for episode)
    if strategy == "random":
        ep = st.meta["episode_id"]
        own = float(np.mean(ep[goals] == ep[rows]))
        sizes = np.bincount(ep[:st.size])
        assert abs(own - (sizes.astype(float) ** 2).sum() / st.size**2) < 0.03 and own < 0.5
    else:
        other = {"future": "episode", "episode": "future"}[strategy]
        assert chi2_p(goals, expected_goal_rows(st, rows, other)) < 1e-3


def test_final_is_the_last_stored_row_of_the_episode():
    st, rows, goals = draw("final", n_batches=5)
    end = st.episodes.end_of(st.meta["episode_id"][rows])
    np.testing.assert_array_equal(goals, end - 1)


def test_the_strategies_are_the_papers_four():
    assert STRATEGIES == ("future", "final", "episode", "random")
