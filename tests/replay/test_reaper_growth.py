"""ReaPER's per-episode arrays grow on demand (issue 17, item 3): with one initial leaf, every growth step is hit,
and the exact tests of test_reaper.py / test_streams.py hold as they are; a buffer of long episodes keeps a few
leaves instead of one per slot."""

import numpy as np
import pytest

from relive.replay import ReaPERSampler, ReplayBuffer
from tests.replay import test_reaper, test_streams


@pytest.fixture
def one_leaf(monkeypatch):
    monkeypatch.setattr(ReaPERSampler, "INITIAL_LEAVES", 1)


@pytest.mark.parametrize("use_kernels", test_reaper.KERNELS)
@pytest.mark.parametrize("seed,capacity,truncation", [(7, 30, "finished"), (8, 17, "ongoing"), (9, 45, "finished")])
def test_long_random_run_matches_the_model_while_growing(one_leaf, use_kernels, seed, capacity, truncation):
    test_reaper.test_a_long_random_run_matches_the_model(use_kernels, seed, capacity, truncation)


@pytest.mark.parametrize("use_kernels", test_reaper.KERNELS)
def test_probabilities_and_checkpoint_while_growing(one_leaf, use_kernels, tmp_path):
    test_reaper.test_probabilities_match_a_from_scratch_evaluation(use_kernels, "finished", 45)
    test_reaper.test_save_load_round_trip(use_kernels, tmp_path)


@pytest.mark.parametrize("use_kernels", test_streams.KERNELS[-1:])  # the compiled path when there is one (~20 s)
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_several_streams_while_growing(one_leaf, use_kernels):
    test_streams.test_ring_wraps_with_open_episodes_in_several_streams(use_kernels)  # hypothesis: many cases


def test_long_episodes_keep_few_leaves():
    buf = ReplayBuffer(100_000, (2,), (1,), sampler=ReaPERSampler(), seed=0)
    n = 20_000
    buf.extend({"obs": np.zeros((n, 2)), "next_obs": np.zeros((n, 2)), "action": np.zeros((n, 1)),
                "reward": np.zeros(n), "terminated": np.zeros(n, bool), "truncated": np.arange(n) % 1000 == 999})
    s = buf.sampler
    assert s.leaf_id.size == 64 and s.finished_tree.capacity == 64  # 20 episodes: no growth from 64 leaves
    assert s.delta.size == 100_000  # per-slot arrays stay per slot
