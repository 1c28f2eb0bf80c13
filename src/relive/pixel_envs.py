"""Pixel tasks: an image + state observation for exercising the CNN encoder end to end on a CPU.

``PixelPendulum-v0``: Gymnasium's Pendulum-v1 (same dynamics, reward, 200-step time limit, action box [-2, 2])
observed as ``{"image": uint8 [3, S, S], "state": float32 [1]}``:

- ``image``: the pendulum drawn with NumPy from the true angle (a white background, the rod in Gymnasium's
  colour, the pivot black), S = 24 by default (``gym.make("PixelPendulum-v0", size=48)`` for more; 24 keeps the
  conv work of an update affordable on 2 CPU cores). Drawn, not rendered: Gymnasium's ``render_mode="rgb_array"``
  goes through pygame at 500 x 500 and then needs a resize; drawing the rod is a distance-to-segment test on an
  S x S grid: 0.13 ms per 32 x 32 frame (0.23 ms at 64 x 64) against 6.2 ms per ``render()`` on a loaded
  2-core EPYC, headless, and identical on every machine.
- ``state``: the angular velocity only (rad/s). The angle is only in the image, so the task cannot be solved
  without reading it; the velocity is given because one frame cannot show it (the alternative, stacking
  frames, would triple the image and the conv work for what one number says).

Seeding, ``np_random`` and the time limit are Pendulum-v1's (the wrapper adds no randomness): the same seed
gives the same images. ``relive.envs.make_env`` registers the pixel tasks on demand; for a plain
``gym.make("PixelPendulum-v0")`` call :func:`register_pixel_envs` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from gymnasium.envs.classic_control.pendulum import PendulumEnv

PIXEL_ENVS = {"PixelPendulum-v0": "relive.pixel_envs:make_pixel_pendulum"}
ROD_RGB = np.array([204, 77, 77], np.uint8)  # Gymnasium's Pendulum rod colour
ROD_LENGTH, ROD_WIDTH, PIVOT_RADIUS = 0.42, 0.07, 0.06  # fractions of the image side


def pendulum_image(theta: float, size: int) -> np.ndarray:
    """uint8 [3, size, size]: the rod from the centre at angle ``theta`` (0 = upright, counter-clockwise, as
    Pendulum-v1) on white, the pivot black."""
    c = (size - 1) / 2.0
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    tip = np.array([c - ROD_LENGTH * size * np.cos(theta), c - ROD_LENGTH * size * np.sin(theta)], np.float32)
    d = tip - c  # (dy, dx) of the rod
    t = np.clip(((yy - c) * d[0] + (xx - c) * d[1]) / float(d @ d), 0.0, 1.0)
    dist2 = (yy - c - t * d[0]) ** 2 + (xx - c - t * d[1]) ** 2
    img = np.full((3, size, size), 255, np.uint8)
    img[:, dist2 <= (ROD_WIDTH * size) ** 2] = ROD_RGB[:, None]
    img[:, (yy - c) ** 2 + (xx - c) ** 2 <= (PIVOT_RADIUS * size) ** 2] = 0
    return img


class PixelPendulum(gym.ObservationWrapper):
    """Pendulum-v1 with observations ``{"image": uint8 [3, S, S], "state": [theta_dot]}`` (module docstring)."""

    def __init__(self, env: PendulumEnv, size: int = 32):
        super().__init__(env)
        if size < 16:
            raise ValueError(f"PixelPendulum needs size >= 16 pixels, got {size}")
        self.size = int(size)
        self.pendulum = env  # (the unwrapped Pendulum-v1: its state, speed limit and own observation)
        max_speed = float(env.max_speed)
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (3, self.size, self.size), np.uint8),
            "state": gym.spaces.Box(-max_speed, max_speed, (1,), np.float32)})

    def observation(self, observation) -> dict:
        theta, theta_dot = self.pendulum.state
        return {"image": pendulum_image(float(theta), self.size), "state": np.array([theta_dot], np.float32)}

    def true_state_obs(self) -> np.ndarray:
        """Pendulum-v1's own observation [cos theta, sin theta, theta_dot] of the current state (a state-based
        policy driving the pixel task: the generated dataset's medium level)."""
        return np.asarray(self.pendulum._get_obs(), np.float32)


def make_pixel_pendulum(size: int = 24, render_mode: str | None = None) -> gym.Env:
    from gymnasium.envs.classic_control.pendulum import PendulumEnv  # (only when a pixel task is made)

    return PixelPendulum(PendulumEnv(render_mode=render_mode), size)


def register_pixel_envs() -> None:
    """Register the pixel tasks with Gymnasium (idempotent): 200-step episodes, as Pendulum-v1."""
    for env_id, entry in PIXEL_ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=entry, max_episode_steps=200)
