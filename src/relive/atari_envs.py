"""Atari (ALE) with the standard DQN preprocessing, and MinAtar as the fast test bed.

**Atari** (``ALE/<Game>-v5``, ``ale-py``; the ROMs ship with it): :func:`make_atari` builds

    gym.make(id, frameskip=1) -> AtariPreprocessing -> [EpisodicLife] -> FrameStackObservation(4)

- ``AtariPreprocessing`` (Gymnasium's, unchanged): up to 30 no-op actions after each reset (their number drawn
  from the env's ``np_random``), the action repeated for 4 frames with the max of the last two frames, 84 x 84
  greyscale, uint8 (no scaling: frames stay 1 byte; the agent scales them to [0, 1] on its device);
- :class:`EpisodicLife` (training only): a lost life ends the episode for the learner (``terminated=True``) and the
  next ``reset`` continues the same game with one no-op step instead of restarting it, as Mnih et al. (2015) and
  Stable-Baselines3's ``EpisodicLifeEnv`` do. Not Gymnasium's ``terminal_on_life_loss=True``: its ``reset``
  restarts the whole game at every lost life, so an agent would never see the states after its first death
  (Breakout's thinned brick wall). Evaluation envs (``make_env(..., evaluation=True)``) play full games;
- ``FrameStackObservation(4)`` (Gymnasium's, ``padding_type="reset"``): observations uint8 ``(4, 84, 84)``,
  newest frame last, the stack of an episode's first step padded with copies of its first frame. The buffer
  stores each frame once (``ReplayBuffer(frame_stack=FrameStack(4))``: :func:`relive.envs.env_spec` reads the stack
  from the wrapper, the trainer passes it on).

A time limit (``env.max_episode_steps``) counts agent steps of one game, as on every other env: a ``TimeLimit``
above the frame skip and below the life loss. ``env.kwargs`` reaches ALE's own keywords (e.g.
``repeat_action_probability``), never the frame skip.

Reward clipping (sign of the reward) is the learner's (``agent.clip_reward``): stored rewards, training returns and
evaluation returns are the game's unclipped points. A training return (``train/episode_return``) covers one life, as
:class:`EpisodicLife` ends a training episode there (the reward of the no-op step that continues the game is dropped,
as Stable-Baselines3's ``EpisodicLifeEnv`` drops it); an evaluation return covers a whole game, the score papers
report. Sticky actions: v5's default (``repeat_action_probability=0.25``, Machado et al.
2018), not the ``NoFrameskip-v4`` setting (0) of older DQN papers; ``env.kwargs`` turns them off (the
``ddqn_atari100k`` preset does, as the Atari-100k benchmark). No "fire on reset" (Stable-Baselines3's
``FireResetEnv``, which ReaPER's App. D setting, SB3's ``AtariWrapper``, includes): the agent learns to press FIRE
itself, so that training and full-game evaluation ask the same of it (Machado et al. 2018 recommend against it too).

**MinAtar** (Young & Tian 2019, ``minatar`` on PyPI): 10 x 10 analogues of five Atari games (``MinAtar/Asterix-v1``,
``Breakout``, ``Freeway``, ``Seaquest``, ``SpaceInvaders``; ``-v1``: the minimal action set, ``-v0``: all 6 actions),
registered with Gymnasium by ``minatar.gym.register_envs`` on demand. The game's state is a bool array ``(10, 10,
C)``, one channel per object kind; :class:`ChannelsFirst` serves it as ``(C, 10, 10)`` (bool), the layout of every
image relive's encoders read. No frame stacking: MinAtar's channels carry the motion (trail channels) and its
paper's DQN baseline stacks none. Sticky actions (0.1) and difficulty ramping are MinAtar's defaults
(``env.kwargs``: ``sticky_action_prob``, ``difficulty_ramping``). No time limit (none in the paper).
"""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np

ATARI_PREFIX = "ALE/"
MINATAR_PREFIX = "MinAtar/"
ATARI_FRAME_STACK = 4  # frames per observation (Mnih et al. 2015)
ATARI_NOOP_MAX = 30  # no-op starts: at most 30 (Mnih et al. 2015; ReaPER App. D)
ATARI_FRAME_SKIP = 4  # each action repeated for 4 frames, max over the last two (Mnih et al. 2015)
ATARI_SCREEN = 84  # 84 x 84 greyscale


class EpisodicLife(gym.Wrapper):
    """A lost life is a termination for the learner; the game goes on (module docstring). ``info["game_over"]``
    says whether the game itself ended."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        lost = 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated or lost, truncated, dict(info, game_over=self.game_over)

    def reset(self, **kwargs):
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:  # a lost life: continue the game with one no-op step
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # (the no-op ended the game: start a new one)
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def make_atari(env_id: str, *, evaluation: bool = False, max_episode_steps: int | None = None,
               render_mode: str | None = None, env_kwargs: dict | None = None) -> gym.Env:
    """An ``ALE/...`` game with the DQN preprocessing (module docstring); ``evaluation=True``: full games (no life
    loss termination); ``env_kwargs``: ALE's own keywords of ``gym.make`` (e.g. ``repeat_action_probability=0.0``:
    no sticky actions, the Atari-100k benchmark's setting), not the frame skip."""
    if "frameskip" in (env_kwargs or {}):
        raise ValueError(f"env.kwargs: {env_id}: frameskip is set by relive's Atari preprocessing (frame skip "
                         f"{ATARI_FRAME_SKIP} with max-pooling, in AtariPreprocessing): drop it from --env-kwargs")
    try:
        import ale_py
    except ImportError:
        raise ValueError(f"{env_id} needs ale-py: pip install 'relive[envs]'") from None
    gym.register_envs(ale_py)
    kwargs: dict = {**(env_kwargs or {}), "frameskip": 1}  # AtariPreprocessing skips the frames (max of the last two)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env = gym.make(env_id, **kwargs)
    try:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=ATARI_NOOP_MAX, frame_skip=ATARI_FRAME_SKIP,
                                              screen_size=ATARI_SCREEN, terminal_on_life_loss=False,
                                              grayscale_obs=True, scale_obs=False)
    except gym.error.DependencyNotInstalled:
        env.close()
        raise ValueError(f"{env_id}: Gymnasium's AtariPreprocessing needs OpenCV: pip install 'relive[envs]' "
                         "(opencv-python-headless)") from None
    if max_episode_steps:  # agent steps of one game, as every other env counts them: above the frame skip and the
        env = gym.wrappers.TimeLimit(env, max_episode_steps)  # no-op starts, below the life loss (a game's limit)
    if not evaluation:
        env = EpisodicLife(env)
    return gym.wrappers.FrameStackObservation(env, ATARI_FRAME_STACK)


class ChannelsFirst(gym.ObservationWrapper):
    """MinAtar's bool ``(10, 10, C)`` state as ``(C, 10, 10)`` (module docstring)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        shape = env.observation_space.shape
        if shape is None or len(shape) != 3:
            raise ValueError(f"ChannelsFirst reads (H, W, C) observations, got {env.observation_space}")
        h, w, c = shape
        self.observation_space = gym.spaces.Box(0, 1, (c, h, w), np.bool_)

    def observation(self, observation) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(np.asarray(observation, np.bool_), -1, 0))


def register_minatar() -> None:
    """Register MinAtar's games with Gymnasium (idempotent); a ValueError when ``minatar`` is not installed."""
    if "MinAtar/Breakout-v1" in gym.registry:
        return
    logging.disable(logging.WARNING)  # (minatar.gym logs a warning when seaborn, used only to render, is missing)
    try:
        import minatar.gym
    except ImportError:
        raise ValueError("MinAtar games need minatar: pip install 'relive[envs]'") from None
    finally:
        logging.disable(logging.NOTSET)
    minatar.gym.register_envs()


def make_minatar(env_id: str, *, max_episode_steps: int | None = None, render_mode: str | None = None,
                 env_kwargs: dict | None = None) -> gym.Env:
    """A ``MinAtar/...`` game, observations bool ``(C, 10, 10)`` (module docstring); ``env_kwargs``: MinAtar's own
    keywords of ``gym.make`` (e.g. ``sticky_action_prob``, ``difficulty_ramping``)."""
    register_minatar()
    kwargs: dict = dict(env_kwargs or {})
    if max_episode_steps:
        kwargs["max_episode_steps"] = max_episode_steps
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return ChannelsFirst(gym.make(env_id, **kwargs))
