"""ReF-ER's schedules and far-policy rule as plain floats and arrays (Novati & Koumoutsakos, ICML 2019): what both
the sampler (``relive.replay.samplers.refer``: beta, c_max, the far fraction) and the agents (``relive.agents.refer``,
the torch side of the method: rho, the KL penalty) read. Equation numbers as in ``relive.agents.refer``."""

from __future__ import annotations

import math

BEHAVIOUR_COLUMNS = ("mu_mean", "mu_std")  # the stored behaviour record of every row ReF-ER covers
ALL_SOURCES = -1  # the ``refer_source`` hint of a sampler that covers offline and online rows
LOG_RHO_CLIP = 7.0  # |log rho| is clipped here before exponentiation (smarties Continuous_policy.h)
BETA_SCHEDULES = ("paper", "smarties")


def is_far(rho, c_max: float):
    """The far-policy predicate (Sec. 3): rho outside the open interval (1/c_max, c_max). With c_max <= 1 the
    interval is empty, but ReF-ER is then off and nothing is far (smarties ``isFarPolicy``). Works on NumPy arrays
    and tensors alike; rho at exactly c_max or 1/c_max is far."""
    if c_max <= 1.0:
        return rho < -math.inf  # all False, same type and shape as rho
    return (rho <= 1.0 / c_max) | (rho >= c_max)


def c_max_at(t: int, C: float, A: float) -> float:
    """c_max(t) = 1 + C / (1 + A t) (Eq. 13), t = gradient steps taken."""
    return 1.0 + C / (1.0 + A * t)


def annealed_lr(lr: float, t: int, A: float) -> float:
    """eta(t) = eta / (1 + A t) (Eq. 13): the networks' learning rate anneals with c_max."""
    return lr / (1.0 + A * t)


def beta_step(beta: float, far_fraction: float, D: float, eta: float, clamp: bool = False) -> float:
    """One fixed-point step of Eq. 12: beta <- (1 - eta) beta if n_far / N > D, else (1 - eta) beta + eta.

    ``clamp=True`` is smarties' form: the step is min(eta, beta) down and min(eta, 1 - beta) up, i.e.
    (1 - min(eta, beta)) beta [+ min(eta, 1 - beta)], which keeps beta in [0, 1] for any eta."""
    if clamp:
        shrunk = (1.0 - min(eta, beta)) * beta
        return shrunk if far_fraction > D else shrunk + min(eta, 1.0 - beta)
    return (1.0 - eta) * beta if far_fraction > D else (1.0 - eta) * beta + eta


def smarties_eta(batch_size: int, capacity: int, num_stored: int) -> float:
    """smarties' step size for beta: 0.1 B / max(N_max, N) (~1e-4 for B = 256, N = 2^18, "to match the
    learning rate chosen in the original paper")."""
    return 0.1 * batch_size / max(capacity, num_stored, 1)
