"""Evaluation: mean return of the deterministic policy over fresh episodes, and D4RL normalized scores."""

from __future__ import annotations

import warnings

import numpy as np

from relive.data.scores import normalized_score  # noqa: F401  (re-exported for the trainer)
from relive.envs import check_success_at, info_success, one_row
from relive.types import unpack_acted

#: an evaluation episode this long is said on stderr once (an env without a time limit and a policy that never ends
#: an episode -- MinAtar Seaquest's sub at the surface -- otherwise looks like a hang)
LONG_EPISODE_STEPS = 100_000


def evaluate(env, agent, episodes: int, seed: int | None) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes, seeded ``seed, seed + 1, ...`` (repeatable); ``seed=None``:
    unseeded resets, continuing the env's random stream (fresh start states, as SB3's ``evaluate_policy``)."""
    return evaluate_episodes(env, agent, episodes, seed)[0]


def evaluate_episodes(env, agent, episodes: int, seed: int | None, success_key: str | None = None,
                      success_at: str = "any") -> tuple[np.ndarray, np.ndarray | None]:
    """(returns, successes) of :func:`evaluate`'s episodes; with ``success_key`` an episode succeeded when
    ``info[success_key]`` was true at some step of it (``success_at="any"``: Meta-World's and the mazes'
    ``"success"``, which end the episode) or at its last step (``"last"``: Fetch's ``"is_success"``, as the HER paper
    and Stable-Baselines3 count it), else successes is None."""
    check_success_at(success_at)
    returns, successes = [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=None if seed is None else int(seed) + i)
        total, done, succeeded, steps = 0.0, False, False, 0
        while not done:
            action = unpack_acted(agent.act(one_row(obs), explore=False))[0][0]
            obs, reward, terminated, truncated, info = env.step(action)
            total += float(reward)
            steps += 1
            if steps == LONG_EPISODE_STEPS:
                limit = getattr(getattr(env, "spec", None), "max_episode_steps", None)
                said = f"{limit:,} steps" if limit else "none in env.spec; an emulator's own cap, as ALE's " \
                    "max_num_frames_per_episode, is not seen there"
                warnings.warn(f"evaluation episode {i + 1} of {episodes} has run {steps:,} steps without ending (the "
                              f"env's time limit: {said}); a greedy policy may never end one: give the run a time "
                              f"limit (--set env.max_episode_steps=N)", RuntimeWarning, stacklevel=2)
            if success_key is not None:
                now = info_success(info, success_key, env)
                succeeded = now if success_at == "last" else now or succeeded
            done = terminated or truncated
        returns.append(total)
        successes.append(succeeded)
    return np.asarray(returns), (np.asarray(successes, bool) if success_key is not None else None)
