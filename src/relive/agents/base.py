"""The agent contract the trainer relies on. Agents never touch the buffer: they turn a Batch into an
update and hand per-sample signals back (``UpdateResult.signals``), which the trainer passes to
``buffer.update(batch.info, **signals)``.

Required: ``from_spec`` (a classmethod, used by the registry: ``@register_agent("name", ConfigDataclass)``),
``act``, ``update``, ``state_dict``, ``load_state_dict``. Optional, each used only when an agent defines it:

- ``stored_columns() -> tuple[ColumnDecl, ...]``: per-row columns to store beside the core ones (a behaviour
  record written from ``act``'s :class:`~relive.types.Acted`, or a column a hook fills, like ``mc_return``);
- ``loop_hooks(ctx) -> list``: what the agent needs from the training loop (``relive.hooks``);
- ``score_fn(mode) -> score(obs, action)``: per-row on-policyness of stored actions, for samplers that re-score
  rows with the policy (ARB);
- ``sequence_spec() -> dict | None``: train on contiguous slices instead of rows (a recurrent or chunked-action
  policy): the trainer calls ``buffer.sample_sequences(batch_size, **spec)``, e.g. ``{"length": 8,
  "at_episode_end": "pad"}``; the batch's columns are then [B, L, ...] with ``batch.mask`` [B, L], and signals
  stay [B] (one per slice: the sampler drew its start row).

Unstored steps: ``act`` may return an ``Acted`` whose ``store`` is False for some rows (PLD's probing), each before
any stored step of its episode. Such a step is executed -- it counts for the env-step budget
(``schedule.num_online_env_steps``, ``--online-steps``) and the evaluation / checkpoint cadences -- but it is not
data: the trainer's update clock (``utd_ratio`` gradient steps per stored row, ``grad_steps_per_chunk`` in
proportion, the no-update warm-up ``schedule.num_warmup_env_steps``) counts stored rows only, and a run's
summary.json reports executed, stored and unstored (probing) steps. An agent that stores every step sees no
difference.

A TD agent's config may carry ``n_step`` (and ``gamma``): the trainer builds the buffer with both, and batches then
hold n-step returns and ``batch.discount`` (``relive.agents.networks.td_discount``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from relive.types import Acted, Batch, UpdateResult


@runtime_checkable
class Agent(Protocol):
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray | Acted:
        """Actions for a batch of observations [N, *obs_shape] -> [N, *action_shape] (NumPy), or an ``Acted``
        with a behaviour record to store and which steps to store."""

    def update(self, batch: Batch) -> UpdateResult:
        """One gradient step; ``metrics`` are scalars under ``train/``, ``signals`` arrays of shape [B]; the
        sampler's per-batch hints are on ``batch.info.hints``."""

    def state_dict(self) -> dict:
        """Everything needed to resume: parameters, optimizer states, counters, RNG (tensors / arrays)."""

    def load_state_dict(self, state: dict) -> None: ...
