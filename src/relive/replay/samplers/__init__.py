"""Replay strategies: one file per method. ``SAMPLERS`` maps names to classes for checkpoints."""

from __future__ import annotations

from relive.replay.samplers.arb import ARBSampler
from relive.replay.samplers.base import Draw, Sampler
from relive.replay.samplers.berb import BERBSampler
from relive.replay.samplers.mixture import MixtureSampler
from relive.replay.samplers.per import PrioritizedSampler
from relive.replay.samplers.reaper import ReaPERSampler
from relive.replay.samplers.reaper_reference import ReaPERReferenceSampler
from relive.replay.samplers.uniform import UniformSampler

SAMPLERS: dict[str, type[Sampler]] = {
    "UniformSampler": UniformSampler,
    "PrioritizedSampler": PrioritizedSampler,
    "MixtureSampler": MixtureSampler,
    "ARBSampler": ARBSampler,
    "ReaPERSampler": ReaPERSampler,
    "ReaPERReferenceSampler": ReaPERReferenceSampler,
    "BERBSampler": BERBSampler,
}


def register_sampler(cls: type[Sampler]) -> type[Sampler]:
    """Make a sampler class loadable from checkpoints by its class name."""
    SAMPLERS[cls.__name__] = cls
    return cls


def sampler_config(sampler: Sampler) -> dict:
    """``checkpoint_name``: the class a sampler is saved as (a device sampler saves as its host twin, so its
    checkpoints load on either backend)."""
    return {"type": getattr(sampler, "checkpoint_name", type(sampler).__name__), "params": sampler.config()}


def sampler_from_config(cfg: dict) -> Sampler:
    try:
        cls = SAMPLERS[cfg["type"]]
    except KeyError:
        raise ValueError(f"unknown sampler type {cfg.get('type')!r}; known: {sorted(SAMPLERS)}") from None
    return cls.from_config(cfg["params"])


__all__ = ["Draw", "Sampler", "UniformSampler", "PrioritizedSampler", "MixtureSampler", "ARBSampler",
           "ReaPERSampler", "ReaPERReferenceSampler", "BERBSampler", "SAMPLERS",
           "register_sampler", "sampler_config", "sampler_from_config"]
