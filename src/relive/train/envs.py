"""Gymnasium environments: creation, spaces, and the shapes the buffer and agents need."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    id: str
    obs_shape: tuple[int, ...]
    discrete: bool
    action_shape: tuple[int, ...]
    num_actions: int  # discrete only
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    max_episode_steps: int | None


ROBOTICS_PREFIXES = ("PointMaze", "AntMaze")


def make_env(env_id: str, max_episode_steps: int | None = None) -> gym.Env:
    """``gym.make``; Gymnasium-Robotics mazes are registered on demand, and goal-conditioned (Dict)
    observations are flattened into one Box (achieved_goal, desired_goal, observation)."""
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    if env_id.startswith(ROBOTICS_PREFIXES):
        try:
            import gymnasium_robotics
        except ImportError:
            raise ValueError(f"{env_id} needs gymnasium-robotics: pip install 'relive[maze]'") from None
        gym.register_envs(gymnasium_robotics)
        kwargs["continuing_task"] = False  # an episode ends when the goal is reached
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"cannot make environment {env_id!r}: {e}") from None
    if isinstance(env.observation_space, gym.spaces.Dict):
        env = gym.wrappers.FlattenObservation(env)
    return env


def env_spec(env: gym.Env) -> EnvSpec:
    obs, act = env.observation_space, env.action_space
    if not isinstance(obs, gym.spaces.Box):
        raise ValueError(f"{env.spec.id}: only Box observation spaces are supported, got {obs}")
    steps = env.spec.max_episode_steps if env.spec else None
    if isinstance(act, gym.spaces.Discrete):
        return EnvSpec(env.spec.id, obs.shape, True, (), int(act.n), None, None, steps)
    if isinstance(act, gym.spaces.Box):
        return EnvSpec(env.spec.id, obs.shape, False, act.shape, 0, act.low.astype(np.float32),
                       act.high.astype(np.float32), steps)
    raise ValueError(f"{env.spec.id}: unsupported action space {act}")


def random_actions(spec: EnvSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.discrete:
        return rng.integers(0, spec.num_actions, n)
    return rng.uniform(spec.action_low, spec.action_high, (n, *spec.action_shape)).astype(np.float32)
