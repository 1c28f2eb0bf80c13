"""Per-row on-policyness scores of stored actions under the current policy, for ARB's weights
(Song et al., arXiv 2512.10510). Pure functions of the policy's Gaussian parameters and the stored action;
the agents wrap them into ``score_fn(obs, action)`` and the ARB sampler only sees the scores.

- ``log_prob_score``: the policy's log-density of the stored action with the tanh-squash correction,
  averaged over action dimensions (the quantity the paper writes, log pi(a|s)).
- ``standardized_score``: the reference code's: atanh of the clipped stored action, per-dimension Gaussian
  log-density of its standardized distance to the policy mean, averaged over dimensions (no Jacobian term).

``standardized`` is the default of the training configuration (``replay.score_mode``): it is what the official
ARB code computes (so the paper's temperatures 0.5 / 2 / 5 mean what they meant there), and it is scale-free --
without the log-sigma and tanh-Jacobian terms a narrow policy cannot push scores past the upper clip (log 7),
and actions near the bounds are not dominated by the Jacobian. It never exceeds -log(2 pi) / 2, so only the
lower clip (-12) binds. ``log_prob`` is the density the paper writes; use it to study that choice.
Stored actions are scaled to [-1, 1] by the caller and clipped to +-(1 - 1e-6) before atanh (D4RL actions can
sit exactly on the bounds).
"""

from __future__ import annotations

import math

import torch

from relive.agents.networks import tanh_gaussian_log_prob

CLIP = 1 - 1e-6


def log_prob_score(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """mean over dims of log pi(a|s) for actions already scaled to [-1, 1]: [B]."""
    u = torch.atanh(action.clamp(-CLIP, CLIP))
    return tanh_gaussian_log_prob(mean, log_std, u).mean(-1)


def standardized_score(mean: torch.Tensor, std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """mean over dims of log N(z; 0, 1) with z = (atanh(clip(a)) - mean) / std: [B]."""
    z = (torch.atanh(action.clamp(-CLIP, CLIP)) - mean) / std
    return (-0.5 * z**2 - 0.5 * math.log(2 * math.pi)).mean(-1)
