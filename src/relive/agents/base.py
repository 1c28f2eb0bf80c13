"""The agent contract the trainer relies on. Agents never touch the buffer: they turn a Batch into an
update and hand per-sample signals back (``UpdateResult.signals``), which the trainer passes to
``buffer.update(batch.info, **signals)``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from relive.types import Batch, UpdateResult


@runtime_checkable
class Agent(Protocol):
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Actions for a batch of observations [N, *obs_shape] -> [N, *action_shape] (NumPy)."""

    def update(self, batch: Batch) -> UpdateResult:
        """One gradient step; ``metrics`` are scalars under ``train/``, ``signals`` arrays of shape [B]."""

    def state_dict(self) -> dict:
        """Everything needed to resume: parameters, optimizer states, counters, RNG (tensors / arrays)."""

    def load_state_dict(self, state: dict) -> None: ...
