"""Moved to :mod:`relive.pixel_envs` (the ground floor, so that replay, data and agents read it from below ``train``).
This module keeps ``relive.train.pixel_envs`` imports working; relive's own code imports ``relive.pixel_envs``."""

from relive.pixel_envs import *  # noqa: F403
