"""ReF-ER, Remember and Forget Experience Replay (Novati & Koumoutsakos, ICML 2019, arXiv 1807.05827): the math,
as pure functions: here torch for what the agents differentiate; the schedules (beta, c_max, eta) and the far-policy
rule, plain floats read by the sampler too, in :mod:`relive.replay.refer_schedule`.

Equation numbers refer to the ICML paper:

    rho_t   = pi^w(a_t|s_t) / mu_t(a_t|s_t)                      importance weight of a stored step (Sec. 3)
              computed as exp(clip(log pi - log mu, -7, 7))      (the reference code's clip, both builds)
    far     iff rho_t not in (1/c_max, c_max); nothing is far when c_max <= 1        (Sec. 3, Rule 1)
    g^ReF-ER = beta g - (1 - beta) g^D  (near rows),  -(1 - beta) g^D  (far rows)    (Eq. 10)
    g^D     = E_k[grad D_KL(mu_k(.|s_k) || pi^w(.|s_k))]                             (Eq. 11)
    beta    <- (1 - eta) beta  if n_far / N > D,  else (1 - eta) beta + eta          (Eq. 12)
    c_max(t) = 1 + C / (1 + A t),   eta(t) = eta / (1 + A t)                         (Eq. 13)

Where the reference code (``cselab/smarties``) differs, the other choice is an option here:

- KL direction: the paper writes D_KL(mu || pi) (``"mu_pi"``, the default); smarties is built with
  ``SMARTIES_OPPOSITE_KL`` and uses D_KL(pi || mu) (``"pi_mu"``).
- beta's step size: the paper's eta is the network's learning rate; smarties uses
  eta = 0.1 B / max(N_max, N) (~1e-4 at B = 256, N = 2^18) with each step clamped so beta stays in [0, 1]
  (``beta_step(..., clamp=True)``), and starts at beta = 1e-4 (see ``ReFERConfig`` in the sampler).

A tanh-squashed Gaussian (SAC's policy) keeps its behaviour as the *pre-squash* mean and std: the squashing
is the same bijection for pi and mu, so its Jacobian cancels in rho and the KL between the two squashed
distributions equals the KL between the pre-squash Gaussians (KL is invariant under a shared bijection).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from relive.replay.refer_schedule import ALL_SOURCES, BEHAVIOUR_COLUMNS, LOG_RHO_CLIP, is_far

KL_DIRECTIONS = ("mu_pi", "pi_mu")  # paper's D_KL(mu || pi) / smarties' D_KL(pi || mu)


# -- importance weights ---------------------------------------------------------------------------------
def gaussian_log_prob(mean: torch.Tensor, std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, diag(std^2)) summed over the last dimension: [B, A] -> [B]."""
    z = (x - mean) / std
    return (-0.5 * z * z - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)


def clipped_log_rho(log_pi: torch.Tensor, log_mu: torch.Tensor) -> torch.Tensor:
    """log rho = log pi(a|s) - log mu(a|s), clipped to [-7, 7]: [B]."""
    return (log_pi - log_mu).clamp(-LOG_RHO_CLIP, LOG_RHO_CLIP)


def gaussian_log_rho(pi_mean, pi_std, mu_mean, mu_std, action) -> torch.Tensor:
    """Clipped log rho of stored actions for diagonal Gaussians pi and mu: [B].

    DDPG (pi = N(m^w(s), sigma^2 I), mu_t = N(m_t, sigma^2 I)) reduces to
    log rho = -(|a - m^w(s)|^2 - |a - m_t|^2) / (2 sigma^2)."""
    return clipped_log_rho(gaussian_log_prob(pi_mean, pi_std, action), gaussian_log_prob(mu_mean, mu_std, action))


def tanh_gaussian_log_rho(pi_mean, pi_std, mu_mean, mu_std, action, center, scale, eps: float = 1e-6):
    """Clipped log rho of stored actions a = center + scale * tanh(u) for tanh-squashed Gaussians given by their
    pre-squash parameters: the Jacobian of the shared squashing cancels, so this is the Gaussian log-ratio of
    u = atanh((a - center) / scale) (clamped to |y| <= 1 - eps as in ``TanhGaussianActor.log_prob``): [B]."""
    u = torch.atanh(((action - center) / scale).clamp(-1 + eps, 1 - eps))
    return gaussian_log_rho(pi_mean, pi_std, mu_mean, mu_std, u)


def batch_rows(b, log_rho_fn: Callable, rule1: bool = True):
    """The ReF-ER view of a torch batch: ``(covered, near, rho, mu_std)``, the first three [B] float.

    Without a ``c_max`` hint nothing is covered and every row is near (plain updates). With one: ``covered`` = rows
    of the source the sampler covers (``refer_source`` hint; offline rows of a mixture have no behaviour record),
    ``rho`` = exp(``log_rho_fn(mu_std)``) under the current policy on covered rows (1 elsewhere, no gradient),
    ``near`` = not far (Rule 1; all ones with ``rule1=False``), ``mu_std`` the stored std with 1 on uncovered rows
    (so that a KL term there is finite; callers multiply it by ``covered``). Refuses a batch without the behaviour
    columns or with a covered std that is not > 0."""
    hints, n = b.info.hints, b.obs.shape[0]
    ones = torch.ones(n, device=b.obs.device)
    if "c_max" not in hints:
        return torch.zeros_like(ones), ones, ones, None
    for name in BEHAVIOUR_COLUMNS:
        if name not in b.extras:
            raise ValueError(f"ReF-ER needs the behaviour column {name!r} in the batch (declared by the agent's "
                             f"stored_columns()); the batch has {sorted(b.extras)}")
    source = int(hints.get("refer_source", ALL_SOURCES))
    covered = ones if source == ALL_SOURCES else torch.as_tensor(b.info.source == source, device=ones.device).float()
    mu_std = torch.where(covered[:, None] > 0, b.mu_std, torch.ones_like(b.mu_std))
    if not (mu_std > 0).all():
        row = int(torch.nonzero(~(mu_std > 0).all(-1))[0, 0])
        raise ValueError(f"ReF-ER: mu_std of batch row {row} is not > 0 ({b.mu_std[row].tolist()})")
    with torch.no_grad():
        rho = torch.where(covered > 0, log_rho_fn(mu_std).exp(), ones)
    far = is_far(rho, float(hints["c_max"])) & (covered > 0)
    return covered, (ones - far.float()) if rule1 else ones, rho, mu_std


# -- KL divergences -------------------------------------------------------------------------------------
def gaussian_kl(p_mean, p_std, q_mean, q_std) -> torch.Tensor:
    """D_KL(p || q) of diagonal Gaussians, summed over the last dimension: [B, A] -> [B].

    D_KL(p || q) = sum_i 1/2 [(s_p,i / s_q,i)^2 - 1 + ((m_q,i - m_p,i) / s_q,i)^2 - 2 log(s_p,i / s_q,i)]."""
    ratio = p_std / q_std
    z = (q_mean - p_mean) / q_std
    return (0.5 * (ratio * ratio - 1.0 + z * z) - torch.log(ratio)).sum(-1)


def refer_kl(mu_mean, mu_std, pi_mean, pi_std, direction: str = "mu_pi") -> torch.Tensor:
    """The Rule-2 penalty per row (Eq. 11): D_KL(mu || pi) (``"mu_pi"``, the paper) or D_KL(pi || mu)
    (``"pi_mu"``, smarties as built). For a tanh-squashed Gaussian pass the pre-squash parameters: [B]."""
    if direction == "mu_pi":
        return gaussian_kl(mu_mean, mu_std, pi_mean, pi_std)
    if direction == "pi_mu":
        return gaussian_kl(pi_mean, pi_std, mu_mean, mu_std)
    raise ValueError(f"KL direction must be one of {KL_DIRECTIONS}, got {direction!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every parameter group's learning rate (the Eq. 13 annealing is applied before each step)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
