"""Moved to :mod:`relive.hooks` (the ground floor, so that replay, data and agents read it from below ``train``).
This module keeps ``relive.train.hooks`` imports working; relive's own code imports ``relive.hooks``."""

from relive.hooks import *  # noqa: F403
