"""HER's batches are pinned bit for bit (issue 30): the relabeling's random stream, goal rows, goals, rewards, n-step
returns and flags of fixed-seed buffers (several streams, ring wraps, an offline prefix, open episodes, PER, every
strategy) hash to the values the first implementation gave. A faster relabeling path must give the same batches:
checkpoints promise that a resumed buffer continues the same stream."""

import hashlib

import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, UniformSampler
from relive.replay.samplers.her import HindsightSampler
from tests.replay.test_her import her_buffer, reward_fn, success_fn

CASES = {  # name -> (strategy, k, n_step, terminate_on_success, inner, streams, n_offline, capacity)
    "future": ("future", 4, 1, False, "uniform", 1, 0, 80),
    "future-streams-offline": ("future", 4, 1, False, "mixture", 3, 37, 150),
    "final-per": ("final", 4, 1, False, "per", 2, 0, 90),
    "episode-offline": ("episode", 2, 1, False, "mixture", 2, 37, 120),
    "random": ("random", 4, 1, False, "uniform", 3, 0, 100),
    "future-nstep": ("future", 4, 3, False, "uniform", 2, 37, 120),
    "future-nstep-success": ("future", 4, 3, True, "uniform", 2, 0, 90),
    "final-success": ("final", 1, 1, True, "per", 1, 0, 70),
}


def digest(name: str) -> str:
    strategy, k, n_step, terminate, inner, streams, n_offline, capacity = CASES[name]
    make = {"uniform": UniformSampler, "per": PrioritizedSampler,
            "mixture": lambda: MixtureSampler(UniformSampler(), UniformSampler())}[inner]
    sampler = HindsightSampler(make(), strategy, k=k, reward_fn=reward_fn, terminate_on_success=terminate,
                               success_fn=success_fn if terminate else None)
    buf = her_buffer(sampler, capacity=capacity + n_offline, n_offline=n_offline, streams=streams, seed=5,
                     n_step=n_step, rng_seed=3)
    h = hashlib.sha256()
    for _ in range(4):
        b = buf.sample(64)
        for a in (b.info.indices, b.info.hints["her/relabeled"], b.info.hints["her/goal_slot"], b.obs["desired_goal"],
                  b.next_obs["desired_goal"], b.next_obs["achieved_goal"], b.reward, b.terminated, b.truncated,
                  b.discount):
            if a is not None:  # (discount: n-step batches only)
                h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


PINNED = {  # sha256 of the batches before the vectorized relabeling path (commit 5e8ae96), first 16 hex digits
    "episode-offline": "9a55825246838fab", "final-per": "d1a2063313821962", "final-success": "4435894625d9adfd",
    "future": "f43290b490a204db", "future-nstep": "3e60e24caefc71de", "future-nstep-success": "3ac825c394149382",
    "future-streams-offline": "1444332c0295248f", "random": "d8aa0ed4dfef6933"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_batches_are_the_first_implementations_bit_for_bit(name):
    assert digest(name) == PINNED[name]


def test_compiled_and_numpy_paths_give_the_same_goal_rows_and_writes():
    from relive.replay.samplers import her

    rng = np.random.default_rng(0)
    n = 2000
    start = rng.integers(0, 10**6, n)
    end = start + rng.integers(1, 60, n)
    pos = start + (rng.random(n) * (end - start)).astype(np.int64)
    p = 4 / 5
    u = np.concatenate([rng.random(n - 3), [np.nextafter(p, 0), p, 0.0]])  # u / p rounds to 1.0 at the edge
    for first, final in ((pos, False), (start, False), (end, True)):
        r1, j1 = her.goal_rows(u, p, first, end, final)
        r0, j0 = her._goal_rows_numpy(u, p, first, end, final)
        assert np.array_equal(r1, r0) and np.array_equal(j1, j0)
        assert ((j0[r0] >= first[r0]) | final).all() and (j0 < end).all()
    a, b = rng.normal(size=(50, 2, 3)).astype(np.float32), rng.normal(size=(50, 2, 3)).astype(np.float32)
    m, g = np.array([3, 7, 49]), rng.normal(size=(3, 2, 3)).astype(np.float32)
    a0, b0 = a.copy(), b.copy()
    her._put_rows_numpy(a0, b0, m, g)
    her.put_rows(a, b, m, g)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    assert her.NUMBA or her.goal_rows is her._goal_rows_numpy
