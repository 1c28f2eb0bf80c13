"""Evaluation: mean return of the deterministic policy over fresh episodes, and D4RL normalized scores."""

from __future__ import annotations

import numpy as np


def normalized_score(ret: float, ref_min: float | None, ref_max: float | None) -> float:
    """D4RL: 100 * (R - R_random) / (R_expert - R_random); nan without reference returns."""
    if ref_min is None or ref_max is None:
        return float("nan")
    if ref_max == ref_min:
        raise ValueError(f"reference returns must differ, got {ref_min} and {ref_max}")
    return 100.0 * (ret - ref_min) / (ref_max - ref_min)


def evaluate(env, agent, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes, seeded ``seed, seed + 1, ...`` (repeatable)."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=int(seed) + i)
        total, done = 0.0, False
        while not done:
            action = agent.act(obs[None], explore=False)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return np.asarray(returns)
