"""Meta-World robot-arm manipulation tasks (Sawyer arm, MuJoCo) as single-task, sparse-success environments.

``MetaWorld/<task>`` (e.g. ``MetaWorld/reach-v3``, ``MetaWorld/pick-place-v3``): the Meta-World v3 task of that
name (``metaworld`` 3.x: ``pip install 'relive[metaworld]'`` in its own venv, ``make .venv-metaworld``: Meta-World
pins mujoco 3.3.0 while relive's main venv has mujoco 4) with

- the **goal observable** (observation = 39 floats: hand, gripper, object poses, previous frame, goal position),
- **one of the task's 50 object / goal placements per episode, chosen by the reset's seed** (MT1's training
  placements, generated once with seed 0): ``reset(seed=s)`` gives the same start on every machine, an unseeded
  reset draws the next placement from the env's own stream (Meta-World's own wrapper draws the placement before
  reseeding, so its seeded resets are not repeatable),
- a **sparse reward**: 1 at the step the task succeeds (``info["success"]``, Meta-World's own success test),
  which **ends the episode** (terminated), else 0 -- so an episode's return is its success, the regime of PLD's
  robot tasks (seed 004, §4: binary success reward, episodes end on success). Meta-World's shaped reward stays
  in ``info["dense_reward"]``;
- a 200-step time limit (Meta-World's own is 500; the scripted experts succeed in 50-90 steps).

``info["success"]`` is on every step, so evaluations, ``relive pld collect`` and ``relive bc`` read success from it
(:func:`relive.envs.reports_success`). :func:`scripted_policy` gives Meta-World's hand-written expert for a
task (for the ``scripted`` and ``noisy-scripted`` dataset levels, ``relive data make metaworld-<task> ...``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

PREFIX = "MetaWorld/"
MAX_EPISODE_STEPS = 200
PLACEMENT_SEED = 0  # MT1's placements are generated once with this seed: the same 50 on every machine


def _metaworld():
    try:  # optional: only this module needs it (and it pins mujoco 3.3.0)
        import metaworld
    except ImportError:
        raise ValueError("Meta-World tasks need the metaworld package (which pins mujoco 3.3.0): make .venv-metaworld, "
                         "or pip install 'relive[metaworld]' into a venv of its own") from None
    return metaworld


def task_names() -> list[str]:
    """The Meta-World v3 task names with a scripted expert (``reach-v3``, ``pick-place-v3``, ...)."""
    _metaworld()
    from metaworld.policies import ENV_POLICY_MAP

    return sorted(ENV_POLICY_MAP)


def task_of(env_id: str) -> str:
    """``"MetaWorld/pick-place-v3"`` -> ``"pick-place-v3"``; a ValueError for a name Meta-World lacks."""
    name = env_id[len(PREFIX):] if env_id.startswith(PREFIX) else env_id
    known = task_names()
    if name not in known:
        raise ValueError(f"unknown Meta-World task {name!r}; known: {', '.join(known)}")
    return name


class SeededPlacement(gym.Wrapper):
    """Sets one of ``tasks`` (Meta-World's object / goal placements) before each reset: the one the reset's seed
    picks, or for an unseeded reset the next draw of a stream seeded by the last seeded reset."""

    def __init__(self, env: gym.Env, tasks: list):
        super().__init__(env)
        if not tasks:
            raise ValueError("no Meta-World placements to choose from")
        self.tasks = list(tasks)
        self._rng = np.random.default_rng(PLACEMENT_SEED)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.placement = int(self._rng.integers(len(self.tasks)))
        task_env: Any = self.env.unwrapped  # a Meta-World env (set_task; the package has no types)
        task_env.set_task(self.tasks[self.placement])
        return self.env.reset(seed=seed, options=options)


class SparseSuccess(gym.Wrapper):
    """Reward = 1.0 at the step ``info["success"]`` turns true, which terminates the episode; else 0. The shaped
    reward is kept as ``info["dense_reward"]``."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        success = bool(info.get("success", 0.0))
        info = dict(info, success=success, dense_reward=float(reward))
        return obs, float(success), bool(terminated or success), bool(truncated), info


def make_metaworld(task: str, render_mode: str | None = None) -> gym.Env:
    """The env behind ``gym.make("MetaWorld/<task>")`` (the time limit is added by the registration)."""
    metaworld = _metaworld()
    task = task_of(task)
    mt1 = metaworld.MT1(task, seed=PLACEMENT_SEED)
    env = mt1.train_classes[task](render_mode=render_mode)
    env.max_path_length = 10**9  # the registration's TimeLimit ends episodes (Meta-World's own 500 would raise)
    env = SeededPlacement(env, mt1.train_tasks)
    return SparseSuccess(env)


def register_metaworld_envs() -> None:
    """Register ``MetaWorld/<task>`` for every Meta-World v3 task with a scripted expert (idempotent)."""
    for name in task_names():
        env_id = PREFIX + name
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="relive.metaworld_envs:make_metaworld", kwargs={"task": name},
                         max_episode_steps=MAX_EPISODE_STEPS)


def scripted_policy(env_id: str, noise: float = 0.0, rng: np.random.Generator | None = None):
    """Meta-World's hand-written expert for the task, as relive's ``policy(obs [1, 39]) -> action [1, 4]``, with
    Gaussian action noise of std ``noise`` (clipped to [-1, 1]) when ``noise > 0``."""
    task = task_of(env_id)
    from metaworld.policies import ENV_POLICY_MAP

    if not (np.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    expert = ENV_POLICY_MAP[task]()
    rng = rng if rng is not None else np.random.default_rng(0)

    def act(obs: np.ndarray) -> np.ndarray:
        a = np.asarray(expert.get_action(np.asarray(obs, np.float64)[0]), np.float32)
        if noise > 0:
            a = a + noise * rng.standard_normal(a.shape).astype(np.float32)
        return np.clip(a, -1.0, 1.0).astype(np.float32)[None]

    return act
