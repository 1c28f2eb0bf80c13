"""Replay strategies: one file per method. ``SAMPLERS`` (the registry's table) maps class names to classes for
checkpoints."""

from __future__ import annotations

from relive.replay.samplers.arb import ARBSampler
from relive.replay.samplers.base import SAMPLERS, Draw, Sampler, register_sampler, sampler_config, sampler_from_config
from relive.replay.samplers.berb import BERBSampler
from relive.replay.samplers.her import HERConfig, HindsightSampler
from relive.replay.samplers.mixture import MixtureSampler
from relive.replay.samplers.per import PrioritizedSampler
from relive.replay.samplers.reaper import ReaPERSampler
from relive.replay.samplers.reaper_reference import ReaPERReferenceSampler
from relive.replay.samplers.uniform import UniformSampler

__all__ = ["Draw", "Sampler", "UniformSampler", "PrioritizedSampler", "MixtureSampler", "ARBSampler",
           "ReaPERSampler", "ReaPERReferenceSampler", "BERBSampler", "HindsightSampler", "HERConfig", "SAMPLERS",
           "register_sampler", "sampler_config", "sampler_from_config"]
