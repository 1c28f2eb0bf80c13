"""Moved to :mod:`relive.envs` (the ground floor, so that replay, data and agents read it from below ``train``).
This module keeps ``relive.train.envs`` imports working; relive's own code imports ``relive.envs``."""

from relive.envs import *  # noqa: F403
