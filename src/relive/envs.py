"""Gymnasium environments: creation, spaces, and the shapes the buffer and agents need."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from relive.atari_envs import ATARI_PREFIX, MINATAR_PREFIX, make_atari, make_minatar
from relive.pixel_envs import register_pixel_envs


@dataclass(frozen=True)
class EnvSpec:
    id: str
    obs_shape: tuple[int, ...] | dict  # a dict key -> (shape, dtype) for dict observations (image tasks)
    discrete: bool
    action_shape: tuple[int, ...]
    num_actions: int  # discrete only
    action_low: np.ndarray | None
    action_high: np.ndarray | None
    max_episode_steps: int | None
    obs_dtype: np.dtype = np.dtype(np.float32)  # a Box observation's dtype (uint8 Atari frames, bool MinAtar planes)
    # a Box observation that is a stack of frames (Gymnasium's FrameStackObservation: (k, *frame), newest last):
    # (k, padding) -- the buffer stores each frame once (ReplayBuffer(frame_stack=...)); None: not a stack
    frame_stack: tuple[int, str] | None = None


ROBOTICS_PREFIXES = ("PointMaze", "AntMaze")  # Gymnasium-Robotics mazes (made episodic by make_env)
FETCH_PREFIX = "Fetch"  # Gymnasium-Robotics Fetch arm tasks (goal dicts; success in info["is_success"])
METAWORLD_PREFIX = "MetaWorld/"  # relive.metaworld_envs


def make_env(env_id: str, max_episode_steps: int | None = None, *, keep_goal_dict: bool = False,
             render_mode: str | None = None, evaluation: bool = False,
             env_kwargs: Mapping[str, Any] | None = None) -> gym.Env:
    """``gym.make``; Gymnasium-Robotics mazes and relive's pixel tasks (``relive.pixel_envs``) are
    registered on demand. Atari (``ALE/...``) comes with the DQN preprocessing and MinAtar (``MinAtar/...``) channels
    first (:mod:`relive.atari_envs`); ``evaluation=True``: the env that evaluates (Atari: full games, a lost life
    does not end the episode as it does for training). Dict observations are flattened into one Box
    (goal-conditioned tasks: achieved_goal, desired_goal, observation) unless they hold an image key
    (:func:`has_image_keys`), which keeps them dicts.
    ``keep_goal_dict=True``: a goal-conditioned Dict (:func:`has_goal_keys`) stays a dict too, so that a buffer
    stores it key by key and :class:`~relive.replay.samplers.her.HindsightSampler` can relabel its
    ``desired_goal`` (docs/her.md); a non-goal env with it is a ValueError. ``env_kwargs`` (``env.kwargs``, ``relive
    train --env-kwargs``): more keyword arguments of ``gym.make`` (not the ones relive sets from its own settings:
    ``max_episode_steps``, ``render_mode``)."""
    check_env_id(env_id)
    env_kwargs = dict(env_kwargs or {})
    taken = sorted(set(env_kwargs) & {"max_episode_steps", "render_mode"})
    if taken:
        raise ValueError(f"env.kwargs: {', '.join(taken)} has a setting of its own (env.max_episode_steps; render_mode "
                         "is chosen by the command that renders), not a keyword argument of env.kwargs")
    if env_id.startswith(ATARI_PREFIX):
        return make_atari(env_id, evaluation=evaluation, max_episode_steps=max_episode_steps, render_mode=render_mode,
                          env_kwargs=env_kwargs)
    if env_id.startswith(MINATAR_PREFIX):
        return make_minatar(env_id, max_episode_steps=max_episode_steps, render_mode=render_mode,
                            env_kwargs=env_kwargs)
    kwargs: dict = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    if render_mode is not None:  # (``"rgb_array"``: frames for a video of the episodes, relive eval --video)
        kwargs["render_mode"] = render_mode
    if env_id.startswith((*ROBOTICS_PREFIXES, FETCH_PREFIX)):
        try:
            import gymnasium_robotics
        except ImportError:
            raise ValueError(f"{env_id} needs gymnasium-robotics: pip install 'relive[maze]'") from None
        gym.register_envs(gymnasium_robotics)
    if env_id.startswith(ROBOTICS_PREFIXES):
        kwargs["continuing_task"] = False  # an episode ends when the goal is reached
    if env_id.startswith("Pixel"):
        register_pixel_envs()
    if env_id.startswith(METAWORLD_PREFIX):  # registered on demand: metaworld is an optional dependency
        from relive.metaworld_envs import register_metaworld_envs, task_of

        task_of(env_id)  # an unknown task: a ValueError listing the known ones
        register_metaworld_envs()
    kwargs |= env_kwargs  # (the user's: they may set a maze's continuing_task too)
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"cannot make environment {env_id!r}: {e}") from None
    except TypeError as e:  # (an env constructor refusing a keyword argument it does not take)
        if not env_kwargs:
            raise
        raise ValueError(f"env.kwargs: cannot make environment {env_id!r} with {env_kwargs}: {e}") from None
    except AssertionError:  # Gymnasium-Robotics' Fetch under mujoco 4: an assertion on its joint types, no message
        if not env_id.startswith(FETCH_PREFIX):
            raise
        import mujoco  # (installed: the Fetch tasks import it)

        raise ValueError(f"cannot make environment {env_id!r}: Gymnasium-Robotics' Fetch tasks need mujoco 3.3.0 "
                         f"(constraints.txt), this environment has mujoco {mujoco.__version__}") from None
    if keep_goal_dict and not has_goal_keys(env.observation_space):
        env.close()
        raise ValueError(f"{env_id} is not a goal-conditioned task: keep_goal_dict=True (HER: --replay her, the "
                         f"sac_her / ddpg_her presets) needs dict observations with keys {GOAL_KEYS} (Gymnasium-"
                         f"Robotics' FetchReach-v4, PointMaze_UMaze-v3, ...); its observations are "
                         f"{env.observation_space}")
    if (isinstance(env.observation_space, gym.spaces.Dict) and not has_image_keys(env.observation_space)
            and not keep_goal_dict):
        env = gym.wrappers.FlattenObservation(env)
    return env


#: the keys of Gymnasium's goal-conditioned observations (``gymnasium_robotics.GoalEnv``)
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def has_goal_keys(space) -> bool:
    """A Dict space of Boxes with the goal keys (:data:`GOAL_KEYS`), achieved and desired goals of one shape."""
    return (isinstance(space, gym.spaces.Dict) and all(k in space.spaces for k in GOAL_KEYS)
            and all(isinstance(s, gym.spaces.Box) for s in space.spaces.values())
            and space["achieved_goal"].shape == space["desired_goal"].shape)


def check_env_id(env_id) -> None:
    """Refuse an environment id that would make ``gym.make`` import a module: Gymnasium reads ``module:Env-v0`` as
    "import ``module``, then make ``Env-v0``", and importing runs the module's code. Environment ids reach relive
    from files as well as from flags (a run's config.json on ``--resume`` or ``pld distill``, a dataset's
    ``env_id``), so such an id is never followed (docs/guarantees.md, "Files that can carry code"). An environment
    of your own: register it in your code (``gymnasium.register``) and pass its plain id to relive's Python API."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"environment id must be a non-empty string, got {env_id!r}")
    if ":" in env_id:
        module = env_id.split(":", 1)[0]
        raise ValueError(f"environment id {env_id!r} names a module to import ({module!r}): relive never imports code "
                         "named by an environment id (it can come from a run's config.json or a dataset); register "
                         "the environment in your own code (gymnasium.register) and pass its plain id")


def has_image_keys(space) -> bool:
    """A Dict space with an image key (a uint8 Box of shape [C, H, W]): such observations stay dicts (stored key
    by key, the images as uint8, read by ``agent.encoder = "cnn"``); other Dict spaces (goal-conditioned
    mazes) are flattened into one Box."""
    return isinstance(space, gym.spaces.Dict) and any(
        isinstance(s, gym.spaces.Box) and s.dtype == np.uint8 and len(s.shape) == 3 for s in space.spaces.values())


VECTOR_MODES = ("sync", "async")


def make_vector_env(env_id: str, num_envs: int, mode: str = "sync", max_episode_steps: int | None = None, *,
                    keep_goal_dict: bool = False, env_kwargs: Mapping[str, Any] | None = None):
    """``num_envs`` copies of :func:`make_env` in a Gymnasium vector env: ``"sync"`` (SyncVectorEnv, one process)
    or ``"async"`` (AsyncVectorEnv, one subprocess per env). Autoreset is SAME_STEP: the step that ends an
    episode returns the next episode's first observation, and the true final observation in
    ``info["final_obs"]`` -- so every step is a transition and a truncation's bootstrap target is never the reset
    observation (:class:`relive.train.collector.VectorCollector`)."""
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv  # (only for vector envs)

    if mode not in VECTOR_MODES:
        raise ValueError(f"vector mode must be one of {VECTOR_MODES}, got {mode!r}")
    env_kwargs = dict(env_kwargs or {})
    # a bad id or keyword argument fails here, not in a worker
    make_env(env_id, max_episode_steps, keep_goal_dict=keep_goal_dict, env_kwargs=env_kwargs).close()
    fns = [partial(make_env, env_id, max_episode_steps, keep_goal_dict=keep_goal_dict, env_kwargs=env_kwargs)
           for _ in range(num_envs)]
    cls = SyncVectorEnv if mode == "sync" else AsyncVectorEnv
    return cls(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def env_spec(env: gym.Env) -> EnvSpec:
    """Shapes of an env made by :func:`make_env`. ``obs_shape``: a tuple for a Box, or for a Dict kept by
    ``make_env`` (image tasks, goal tasks with ``keep_goal_dict``) a dict key -> (shape, dtype), as
    ``ReplayBuffer(obs_shape=...)`` takes it."""
    obs, act = env.observation_space, env.action_space
    env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    unsupported = (f"{env_id}: only Box observation spaces (or Dicts of Boxes with an image key) are supported, "
                   f"got {obs}")
    obs_shape: tuple[int, ...] | dict
    if isinstance(obs, gym.spaces.Dict) and (has_image_keys(obs) or has_goal_keys(obs)):
        boxes = {k: s for k, s in obs.spaces.items() if isinstance(s, gym.spaces.Box)}
        if len(boxes) < len(obs.spaces):
            raise ValueError(unsupported)
        obs_shape = {k: (tuple(s.shape), np.dtype(s.dtype)) for k, s in boxes.items()}
    elif isinstance(obs, gym.spaces.Box):
        obs_shape = obs.shape
    else:
        raise ValueError(unsupported)
    steps = env.spec.max_episode_steps if env.spec else None
    # a Box's dtype (uint8 frames are stored as bytes) and its frame stack; a dict's: EnvSpec's defaults
    obs_dtype, frame_stack = np.dtype(np.float32), None
    if isinstance(obs, gym.spaces.Box):
        obs_dtype = np.dtype(obs.dtype) if obs.dtype in (np.uint8, np.bool_) else np.dtype(np.float32)
        frame_stack = frame_stack_of(env)
    if isinstance(act, gym.spaces.Discrete):
        return EnvSpec(env_id, obs_shape, True, (), int(act.n), None, None, steps, obs_dtype, frame_stack)
    if isinstance(act, gym.spaces.Box):
        return EnvSpec(env_id, obs_shape, False, act.shape, 0, act.low.astype(np.float32),
                       act.high.astype(np.float32), steps, obs_dtype, frame_stack)
    raise ValueError(f"{env_id}: unsupported action space {act}")


def frame_stack_of(env: gym.Env) -> tuple[int, str] | None:
    """``(k, padding)`` when ``env``'s observation is the output of Gymnasium's ``FrameStackObservation`` (the
    outermost observation wrapper: a stack of k frames along axis 0, padded with the episode's first frame
    ("reset") or zeros ("zero")), else None. A custom padding value is not a frame the buffer can rebuild: None."""
    e = env
    while isinstance(e, gym.Wrapper):
        if isinstance(e, gym.wrappers.FrameStackObservation):
            padding = e.padding_type if isinstance(e.padding_type, str) else None
            return (int(e.stack_size), padding) if padding in ("reset", "zero") and e.stack_size > 1 else None
        if isinstance(e, gym.ObservationWrapper) or e.observation_space is not e.env.observation_space:
            return None  # (an observation wrapper above the stack: its output is not the stack)
        e = e.env
    return None


def one_row(obs):
    """A single observation as a batch of one: [1, ...], or key -> [1, ...] for a dict observation."""
    if isinstance(obs, dict):
        return {k: np.asarray(v)[None] for k, v in obs.items()}
    return obs[None]


def stack_obs(obs_list: list, m: int, obs_shape):
    """Observations of ``m`` steps as one column: [m, *shape], or key -> [m, *shape] (dict observations, their
    dtypes kept: uint8 images stay uint8)."""
    if isinstance(obs_shape, dict):
        return {k: np.asarray([o[k] for o in obs_list], dtype=dt).reshape(m, *shape)
                for k, (shape, dt) in obs_shape.items()}
    return np.asarray(obs_list).reshape(m, *tuple(obs_shape))


def num_obs(obs) -> int:
    """Rows of a batch of observations (an array, or a dict key -> array)."""
    return len(next(iter(obs.values()))) if isinstance(obs, dict) else obs.shape[0]


def random_actions(spec: EnvSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.discrete:
        return rng.integers(0, spec.num_actions, n)
    assert spec.action_low is not None and spec.action_high is not None  # (a continuous spec has its box)
    return rng.uniform(spec.action_low, spec.action_high, (n, *spec.action_shape)).astype(np.float32)


# -- success signals (goal-reaching tasks; PLD's success-filtered data) ----------------------------------
SUCCESS_INFO_PREFIXES = (*ROBOTICS_PREFIXES, METAWORLD_PREFIX)  # tasks whose step info carries a "success" flag


def reports_success(env: gym.Env) -> bool:
    """True when ``env`` puts its own ``info["success"]`` on every step: the Gymnasium-Robotics mazes (made
    episodic by :func:`make_env`, so an episode terminates exactly when it succeeds), an env wrapped by
    :func:`with_success`, or any env whose unwrapped class sets ``reports_success = True``."""
    if getattr(env.unwrapped, "reports_success", False):
        return True
    e = env
    while isinstance(e, gym.Wrapper):  # a success wrapper, possibly below other wrappers
        if isinstance(e, (ReturnThresholdSuccess, InfoKeySuccess)):
            return True
        e = e.env
    return env.spec is not None and env.spec.id.startswith(SUCCESS_INFO_PREFIXES)


class ReturnThresholdSuccess(gym.Wrapper):
    """Success for tasks without a goal (MuJoCo locomotion): ``info["success"]`` = the episode's return so far
    >= ``success_return``. At the last step of an episode that is "episode return >= threshold"."""

    def __init__(self, env: gym.Env, success_return: float):
        super().__init__(env)
        if not np.isfinite(success_return):
            raise ValueError(f"success_return must be a finite number, got {success_return}")
        self.success_return = float(success_return)
        self.episode_return = 0.0

    def reset(self, **kwargs):
        self.episode_return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.episode_return += float(reward)
        info = dict(info, success=self.episode_return >= self.success_return)
        return obs, reward, terminated, truncated, info


SUCCESS_AT = ("any", "last")  # at which step of an episode info[success_key] counts (relive.config.EnvConfig)


class InfoKeySuccess(gym.Wrapper):
    """Success read from the task's own step info under another key (Gymnasium-Robotics Fetch:
    ``"is_success"``): ``info["success"]`` = whether ``info[key]`` was true at some step of the episode so far
    (``at="any"``), or at this step (``at="last"``: at an episode's last step, "the episode ended at the goal", as
    the HER paper and Stable-Baselines3 judge Fetch). A step whose info lacks ``key`` raises a ValueError naming the
    key and the env."""

    def __init__(self, env: gym.Env, key: str, at: str = "any"):
        super().__init__(env)
        if not isinstance(key, str) or not key:
            raise ValueError(f"success_key must be a non-empty string, got {key!r}")
        check_success_at(at)
        self.key, self.at, self.succeeded = key, at, False

    def reset(self, **kwargs):
        self.succeeded = False
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        now = bool(info_success(info, self.key, self.env))
        self.succeeded = now if self.at == "last" else self.succeeded or now
        return obs, reward, terminated, truncated, dict(info, success=self.succeeded)


def check_success_at(at) -> None:
    if at not in SUCCESS_AT:
        raise ValueError(f"success_at must be one of {SUCCESS_AT}, got {at!r}")


def info_success(info: dict, key: str, env: gym.Env | None = None) -> bool:
    """``info[key]`` as a bool; a ValueError naming the key, the env and the keys it does report when absent."""
    if key not in info:
        name = env.spec.id if env is not None and env.spec is not None else "the environment"
        raise ValueError(f"success_key {key!r}: {name} reports no info[{key!r}] (its step info has "
                         f"{sorted(info) or 'no keys'}); set env.success_key to one of those, or leave it unset")
    return bool(np.asarray(info[key]).any())


def with_success(env: gym.Env, success_return: float | None = None, success_key: str | None = None,
                 success_at: str = "any") -> gym.Env:
    """``env`` with a success signal in ``info["success"]``: the task's own (PointMaze, AntMaze, Meta-World) when
    both arguments are None; "``info[success_key]`` was true at some step" with ``success_key`` (``success_at=
    "last"``: at the episode's last step, :class:`InfoKeySuccess`); else "episode return >= success_return" (which
    then replaces the task's own). Raises a ValueError when the task has no success signal and neither is given,
    or when both are."""
    if success_return is not None and success_key is not None:
        raise ValueError("give success_return or success_key, not both (one definition of success)")
    if success_key is not None:
        return InfoKeySuccess(env, success_key, success_at)
    if success_return is not None:
        return ReturnThresholdSuccess(env, success_return)
    if not reports_success(env):
        name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        raise ValueError(f"{name} has no success signal (only {', '.join(SUCCESS_INFO_PREFIXES)} tasks report "
                         "info['success']); pass a return threshold (success_return / --success-return) so that "
                         "success = episode return >= threshold")
    return env


def episode_success(info: dict, env: gym.Env | None = None) -> bool:
    """Whether the episode that just ended succeeded, from its last step's ``info`` (an env made by
    :func:`with_success`). A ValueError names the env when the info carries no success flag."""
    if "success" not in info:
        name = env.spec.id if env is not None and env.spec is not None else "this environment"
        raise ValueError(f"{name} reports no info['success']; wrap it with relive.envs.with_success(env, "
                         "success_return=...) to define success as episode return >= a threshold")
    return bool(info["success"])


# -- goal-conditioned tasks (HER: relive.replay.samplers.her) ---------------------------------------------
def goal_functions(env: gym.Env):
    """``(reward_fn, success_fn)`` of a goal-conditioned env made with ``keep_goal_dict=True``, for
    :class:`~relive.replay.samplers.her.HindsightSampler`: ``reward_fn`` = the task's vectorized
    ``compute_reward(achieved, desired, info)`` (Gymnasium-Robotics' ``GoalEnv``); ``success_fn`` = its
    ``compute_terminated`` row by row when reaching the goal ends an episode (make_env's mazes,
    ``continuing_task=False``), else None (Fetch: episodes end only at the time limit). A ValueError names the env
    when it is not goal-conditioned or has no ``compute_reward``."""
    name = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
    space = env.observation_space
    if not has_goal_keys(space):
        raise ValueError(f"{name} is not a goal-conditioned task: HER (--replay her, the sac_her / ddpg_her presets) "
                         f"needs dict observations with keys {GOAL_KEYS} and a compute_reward (Gymnasium-Robotics' "
                         f"FetchReach-v4, FetchPush-v4, PointMaze_UMaze-v3, ...); its observations are {space}")
    u = env.unwrapped
    reward_fn = getattr(u, "compute_reward", None)
    if not callable(reward_fn):
        raise ValueError(f"{name} has goal dict observations but no compute_reward(achieved_goal, desired_goal, "
                         "info): HER cannot recompute rewards for new goals")
    if getattr(u, "continuing_task", True) is not False:
        return reward_fn, None
    terminated = getattr(u, "compute_terminated", None)
    if not callable(terminated):
        raise ValueError(f"{name} ends its episodes at the goal (continuing_task=False) but has no "
                         "compute_terminated(achieved_goal, desired_goal, info): HER cannot tell success for new goals")

    def success_fn(achieved, desired, info):  # (compute_terminated takes one row)
        return np.array([bool(terminated(a, d, info)) for a, d in zip(achieved, desired, strict=True)], bool)

    return reward_fn, success_fn
