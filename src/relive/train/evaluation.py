"""Evaluation: mean return of the deterministic policy over fresh episodes, and D4RL normalized scores."""

from __future__ import annotations

import numpy as np

from relive.data.scores import normalized_score  # noqa: F401  (re-exported for the trainer)
from relive.envs import one_row
from relive.types import unpack_acted


def evaluate(env, agent, episodes: int, seed: int | None) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes, seeded ``seed, seed + 1, ...`` (repeatable); ``seed=None``:
    unseeded resets, continuing the env's random stream (fresh start states, as SB3's ``evaluate_policy``)."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=None if seed is None else int(seed) + i)
        total, done = 0.0, False
        while not done:
            action = unpack_acted(agent.act(one_row(obs), explore=False))[0][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return np.asarray(returns)
