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

Every optional capability, with what reads it, is listed in :data:`OPTIONAL_CAPABILITIES` below (the loop, the
collectors and the samplers read them by name; ``tests/agents/test_structure.py`` fails on a name read from an agent
that is not listed there, and ``tests/agents/test_contract.py`` checks them on every registered agent).
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


REQUIRED = ("from_spec", "act", "update", "state_dict", "load_state_dict")

#: Optional capabilities: an agent defines any subset; whoever reads one does so by name (``getattr``) and falls back
#: to the default said here. Name -> what it is, who reads it, and the default.
OPTIONAL_CAPABILITIES: dict[str, str] = {
    "stored_columns": "stored_columns() -> tuple[ColumnDecl, ...]: per-row columns stored beside the core ones (act's "
                      "Acted.record, or a column a hook fills, like mc_return); read by the trainer and each Ray "
                      "collector to build the buffer / record the columns. Default: none.",
    "loop_hooks": "loop_hooks(ctx: LoopContext) -> list[Hook]: what the agent needs from the loop (phase switch, "
                  "episode start / end, every k gradient steps); read by relive.hooks.collect_hooks. "
                  "Default: none.",
    "score_fn": "score_fn(mode) -> score(obs, action) -> [n]: per-row on-policyness of stored actions; read by the ARB "
                "sampler's hooks (relive.replay.samplers.arb), which refuse an agent without it.",
    "refer_log_rho": "refer_log_rho(obs, action, mu_mean, mu_std) -> [n]: clipped log pi/mu of stored rows under the "
                     "current policy; read by the ReF-ER sampler's recount (relive.replay.samplers.refer), which "
                     "refuses an agent without it.",
    "sequence_spec": "sequence_spec() -> dict | None: train on contiguous slices (buffer.sample_sequences(**spec)) "
                     "instead of rows; read by loop.gradient_step. Default: rows.",
    "acting_modules": "acting_modules: tuple[str, ...] (class attribute): the attributes (torch modules) a copy of "
                      "the agent needs to act; read by relive.train.ray_collectors.acting_state, which ships them to "
                      "the collectors. Default: every torch.nn.Module attribute.",
    "acting_clock": "acting_clock: str (class attribute): the name of an int counter act() follows (e.g. DDQN's "
                    "epsilon schedule, num_act_steps); ray_collectors ships it with the weights and sets the "
                    "learner's to the run's env steps. Default: none.",
    "remote_acting_problem": "remote_acting_problem: str (class attribute): why the agent cannot act on a copy in a "
                             "Ray collector (state act() advances that the update reads); "
                             "ray_collectors.check_agent refuses --collectors with it. Default: it can.",
    "random_warmup_problem": "random_warmup_problem: str (class attribute): why the trainer's uniform random warm-up "
                             "cannot stand in for act(); the trainer refuses that warm-up at start with it. "
                             "Default: it can.",
    "allow_other_base": "allow_other_base: bool (class attribute, False): the agent checks a frozen base policy's "
                        "digest on load_state_dict; the trainer sets it True for --allow-other-base and refuses that "
                        "flag for an agent without the attribute.",
    "seed_batcher": "seed_batcher: type (class attribute): a class built from S agents of one configuration "
                    "(seed_batcher(agents)) whose update(batches) updates them as one (DDQN's BatchedDDQN); read by "
                    "relive.train.seed_batch (relive bench run --seed-batch S). Default: no seed batching.",
}
