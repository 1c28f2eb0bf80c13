"""Uniform sampling with replacement over the stored rows (of one source, inside a mixture)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from relive.registry import register_replay
from relive.replay.samplers.base import Draw, Sampler


@dataclass(frozen=True)
class UniformConfig:
    """Uniform over every stored row, offline and online alike (no settings)."""


@register_replay("uniform", doc="uniform over offline + online rows")
class UniformSampler(Sampler):
    """Uniform with replacement over the stored rows of its domain."""

    Config: ClassVar[type] = UniformConfig

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        lo, hi = self.domain()
        n = hi - lo
        indices = rng.integers(lo, hi, size=batch_size, dtype=np.int64)
        probability, weight = np.empty(batch_size), np.empty(batch_size, np.float32)
        probability.fill(1.0 / n)  # (empty + fill: np.full / np.ones are Python functions around the same two calls)
        weight.fill(1.0)
        return Draw(indices, probability, weight)

    def probabilities(self) -> np.ndarray:
        p = np.zeros(self.storage.capacity)
        lo, hi = self.domain()
        if hi > lo:
            p[lo:hi] = 1.0 / (hi - lo)
        return p
