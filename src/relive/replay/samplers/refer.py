"""ReF-ER's replay side (Novati & Koumoutsakos, ICML 2019, arXiv 1807.05827, Sec. 3): uniform sampling, plus the
bookkeeping that decides how the agent may use what it samples.

Per stored row the sampler keeps ``rho``, the most recent importance weight pi^w(a|s) / mu(a|s) ("we store for
each step its most recent rho_t"), and whether it is far-policy (rho not in (1/c_max, c_max)). From these:

    n_far / N          the far fraction of the rows this sampler covers (its whole domain)
    beta               <- (1 - eta) beta if n_far / N > D, else (1 - eta) beta + eta        (Eq. 12)
    c_max(t)           = 1 + C / (1 + A t)                                                  (Eq. 13)
    lr_scale(t)        = 1 / (1 + A t)    (the agent multiplies its learning rates by it)   (Eq. 13)

with t the number of gradient steps so far. Each ``update`` (one per gradient step: the trainer hands over the
agent's ``rho`` signal for the sampled rows) refreshes those rows' rho, then takes one beta step and t += 1.
``hints()`` publishes ``c_max``, ``beta``, ``lr_scale`` and ``refer_source`` (the source this sampler covers,
-1 for both) on every batch; the agent applies Rules 1 and 2 with them (``relive.agents.ddpg``, ``sac_refer``).

rho goes stale between samplings and c_max anneals. Two estimators of n_far (``far_estimator``):

- ``"stale"`` (the paper's, Sec. 3: "we store for each step its most recent rho_t", and Sec. 5.1: n_far in Eq. 12
  is approximated "from outdated importance weights"): a row's rho is refreshed only when it is sampled; every
  ``recount_every_grad_steps`` gradient steps the stored rho are re-flagged against the current c_max, as the
  authors' code does every 1000 steps (smarties ``updateCumulative``), without recomputing rho;
- ``"recount"`` (relive's default): every ``recount_every_grad_steps`` gradient steps a loop hook recounts every
  covered row against the current policy and c_max (``recount``: the agent's batched
  ``refer_log_rho(obs, action, mu_mean, mu_std)`` over all rows in chunks, as ARB's refresh), and that exact
  count replaces the stale one. Every 2000 steps by default, which keeps the amortized pass under 5% of a DDPG
  update at 2^18 rows (``bench/refer_overhead.py``; every 1000 steps it is 6-8%).

Under both, the periodic pass computes the exact far fraction, so a run can measure what the stale estimate
misses: ``replay/refer_far_fraction_exact`` (exact, at the last pass) beside
``replay/refer_far_fraction_stale`` (the running estimate just before that pass); under ``"stale"`` the exact
count is only measured, never used. With ``recount_every_grad_steps = 0`` there is no pass (nor the two metrics).
Stale rho tend to be closer to 1 than current ones (a row's rho was computed when it was last sampled, by a policy
closer to its behaviour), so the stale estimate is lower and Eq. 12 settles beta higher than with recounts.

Rows need a behaviour record: the columns ``mu_mean`` and ``mu_std`` ([A] each; for a tanh-squashed Gaussian
the pre-squash parameters) written from ``act``. A row whose ``mu_std`` is not > 0 is refused before anything
is written (``check_insert``), which is what offline rows without a record (filled with 0) get: ReF-ER over a
dataset without behaviour records is refused with a message; put ReF-ER on the online part of a mixture
(replay ``refer_online``: ``MixtureSampler(UniformSampler(), ReFERSampler())``): the agent then exempts rows of
the other source from both rules (``refer_source`` hint) -- they are replayed as plain DDPG/SAC rows. Random warm-up
actions have no record either: the ReF-ER presets warm up with the agent's own (Gaussian) policy, as smarties
fills its buffer with the initial policy.

beta's step size and start (both options, ``beta_schedule`` and ``initial_beta``):

- ``"paper"`` (default): eta is the network learning rate ``beta_eta`` (1e-4 by default, the paper's V-RACER /
  DDPG critic rate; the paper-setting presets set it to their critic's rate), annealed with it (eta / (1 + A t));
- ``"smarties"``: eta = 0.1 B / max(N_max, N) with each step clamped to keep beta in [0, 1]
  (``MemoryProcessing.cpp``); ``ReFERConfig.smarties()``, or ``--set replay.refer.beta_schedule=smarties``.

``initial_beta`` (beta at t = 0) is not in the paper; the default, 1e-4, is the authors' code's (smarties
``MemoryBuffer.h``): almost pure KL penalty at first (pi = mu then, so the penalty is ~0), beta rising toward 1 at
rate eta while the far fraction stays under D -- after k steps beta ~ 1 - exp(-eta k), ~0.18 at k = 2000 with
eta 1e-4. ``--set replay.refer.initial_beta=1.0`` gives plain updates until the far fraction exceeds D (relive's
default before issue 28).

Forgetting is FIFO, as the buffer's ring does. smarties' optional ``farpolfrac`` rule (delete the episode with
the largest far fraction) is left out: the online storage is a ring whose slots are overwritten in order, so
deleting an episode in the middle would leave a hole that no later write fills and that every sampler would
have to skip; the paper's default and smarties' default are FIFO.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relive.hooks import EveryGradSteps
from relive.registry import register_alias, register_replay
from relive.replay.refer_schedule import (
    ALL_SOURCES,
    BEHAVIOUR_COLUMNS,
    BETA_SCHEDULES,
    LOG_RHO_CLIP,
    annealed_lr,
    beta_step,
    c_max_at,
    is_far,
    smarties_eta,
)
from relive.replay.samplers.base import Draw, state_array, state_float, state_int
from relive.replay.samplers.uniform import UniformSampler

FAR_ESTIMATORS = ("stale", "recount")  # n_far from each row's last computed rho (the paper) / periodic exact recount


@dataclass(frozen=True)
class ReFERConfig:
    """ReF-ER (Remember and Forget ER): uniform replay, far-policy bookkeeping, beta and c_max for the agent."""

    C: float = 4.0  # c_max(0) = 1 + C (paper: 4; smarties' default when unset is sqrt(dim A / 2))
    D: float = 0.1  # target far-policy fraction of the buffer (paper / smarties penalTol)
    A: float = 5e-7  # annealing rate of c_max and of the learning rates: 1 / (1 + A t) (paper / smarties)
    # beta's step size eta: "paper": beta_eta / (1 + A t), unclamped; "smarties": 0.1 B / max(N_max, N), clamped
    beta_schedule: str = "paper"
    beta_eta: float = 1e-4  # "paper" schedule: beta's step size (the paper, Eq. 12: the network learning rate)
    # beta at t = 0: not in the paper; 1e-4 is the authors' code (smarties MemoryBuffer.h), almost pure KL penalty
    # at first (1.0: plain updates until the far fraction exceeds D)
    initial_beta: float = 1e-4
    # the periodic pass over every row, every this many gradient steps (0: never): an exact count of n_far under
    # the current policy (logged as replay/refer_far_fraction_exact); see far_estimator for what it replaces
    recount_every_grad_steps: int = 2000
    recount_chunk_size: int = 4096  # rows per call of the agent's log-rho function in a recount (fastest on CPU)
    # n_far of Eq. 12: "stale" (the paper, Sec. 3 / 5.1: each row's last computed rho; the pass only re-flags it
    # against the current c_max, as smarties) or "recount" (the pass's exact count replaces it)
    far_estimator: str = "recount"

    def __post_init__(self):
        if self.C < 0 or not 0 < self.D < 1 or self.A < 0:
            raise ValueError(f"ReF-ER needs C >= 0, 0 < D < 1 and A >= 0, got C={self.C}, D={self.D}, A={self.A}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if not 0 < self.beta_eta <= 1 or not 0 <= self.initial_beta <= 1:
            raise ValueError(f"need 0 < beta_eta <= 1 and 0 <= initial_beta <= 1, got {self.beta_eta}, "
                             f"{self.initial_beta}")
        if self.recount_every_grad_steps < 0 or self.recount_chunk_size < 1:
            raise ValueError("recount_every_grad_steps must be >= 0 and recount_chunk_size >= 1")
        if self.far_estimator not in FAR_ESTIMATORS:
            raise ValueError(f"far_estimator must be one of {FAR_ESTIMATORS}, got {self.far_estimator!r}")

    @classmethod
    def smarties(cls, **overrides) -> ReFERConfig:
        """The reference code's beta: eta = 0.1 B / max(N_max, N), clamped, starting at 1e-4."""
        return replace(cls(beta_schedule="smarties", initial_beta=1e-4), **overrides)



@register_replay("refer", doc="ReF-ER over every row (each needs a behaviour record)")
class ReFERSampler(UniformSampler):
    """Uniform draws (``UniformSampler``) plus ReF-ER's per-row bookkeeping (see the module docstring)."""

    signals = ("rho",)

    Config = ReFERConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.far_estimator = o.far_estimator
        self.C, self.D, self.A = float(o.C), float(o.D), float(o.A)
        self.beta_schedule, self.beta_eta = o.beta_schedule, float(o.beta_eta)
        self.initial_beta = float(o.initial_beta)
        self.recount_every_grad_steps = int(o.recount_every_grad_steps)
        self.recount_chunk_size = int(o.recount_chunk_size)
        self.beta = self.initial_beta
        self.t = 0  # gradient steps (updates) so far
        self.batch_size = 0  # size of the last batch drawn (smarties' eta uses it)
        self.num_recounts = 0  # periodic passes (exact counts) so far
        self.far_fraction_exact = self.far_fraction_stale = 0.0  # at the last pass: exact / the estimate before it

    def bind(self, storage, source=None) -> None:
        missing = [c for c in BEHAVIOUR_COLUMNS if c not in storage.specs]
        if missing:
            raise ValueError(f"ReF-ER needs the behaviour columns {list(BEHAVIOUR_COLUMNS)} in the buffer "
                             f"(declared by the agent's stored_columns()); missing: {missing}")
        super().bind(storage, source)
        self.rho = np.ones(storage.capacity)  # most recent pi / mu per slot (1 when stored: pi = mu then)
        self.far = np.zeros(storage.capacity, bool)
        self.num_far = 0

    # -- schedules -------------------------------------------------------------------------------------
    @property
    def c_max(self) -> float:
        return c_max_at(self.t, self.C, self.A)

    @property
    def lr_scale(self) -> float:
        return annealed_lr(1.0, self.t, self.A)

    def far_fraction(self) -> float:
        n = self.num_rows()
        return self.num_far / n if n else 0.0

    def eta(self) -> float:
        if self.beta_schedule == "smarties":
            return smarties_eta(max(self.batch_size, 1), self.storage.capacity, self.num_rows())
        return annealed_lr(self.beta_eta, self.t, self.A)

    # -- rows in, rows out -----------------------------------------------------------------------------
    def check_insert(self, source: int, rows) -> None:
        """Refuse rows without a usable behaviour record before anything is written."""
        if (self.source is not None and source != self.source) or "mu_std" not in rows:
            return  # not ours; a missing column is refused by the storage, naming it
        std = np.asarray(rows["mu_std"])
        bad = ~(std > 0)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise ValueError(f"ReF-ER: column 'mu_std' row {row} is {std[row]!r}; every row ReF-ER covers needs "
                             "a behaviour record with std > 0 (random warm-up actions have none: use "
                             "schedule.warmup_policy = 'agent'; offline data without one: put ReF-ER on the online "
                             "part only, --replay refer_online)")

    def on_insert(self, slots: np.ndarray) -> None:
        self.num_far -= int(self.far[slots].sum())
        self.far[slots] = False
        self.rho[slots] = 1.0

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        self.batch_size = batch_size  # (smarties' eta uses it)
        return super()._draw(batch_size, rng)

    def hints(self) -> dict:
        return {"c_max": self.c_max, "beta": self.beta, "lr_scale": self.lr_scale,
                "refer_source": ALL_SOURCES if self.source is None else int(self.source)}

    # -- after every gradient step ---------------------------------------------------------------------
    def update(self, slots: np.ndarray, signals: dict) -> None:
        """New rho of the sampled rows (the agent's ``rho`` signal), then one beta step (Eq. 12) and t += 1."""
        if "rho" not in signals:
            raise ValueError(f"ReFERSampler.update needs a 'rho' signal, got {sorted(signals)}")
        rho = np.asarray(signals["rho"], np.float64).reshape(-1)
        if rho.size != slots.size:
            raise ValueError(f"got {rho.size} rho values for {slots.size} rows")
        if not (np.isfinite(rho) & (rho > 0)).all():
            i = int(np.flatnonzero(~(np.isfinite(rho) & (rho > 0)))[0])
            raise ValueError(f"signal 'rho' row {i}: value {rho[i]!r} must be a finite number > 0")
        self._set_rho(slots, rho)
        self.beta = beta_step(self.beta, self.far_fraction(), self.D, self.eta(),
                              clamp=self.beta_schedule == "smarties")
        self.t += 1

    def _set_rho(self, slots: np.ndarray, rho: np.ndarray) -> None:
        self.rho[slots] = rho  # a slot sampled twice keeps its last value
        uniq = np.unique(slots)
        new_far = is_far(self.rho[uniq], self.c_max)
        self.num_far += int(new_far.sum()) - int(self.far[uniq].sum())
        self.far[uniq] = new_far

    # -- the periodic recount --------------------------------------------------------------------------
    def recount(self, log_rho_fn, chunk_size: int | None = None) -> None:
        """The periodic pass: recompute every covered row's rho with ``log_rho_fn(obs, action, mu_mean, mu_std) ->
        [n]`` (the agent's log pi/mu, NumPy or tensor; clipped to [-7, 7] here too) in chunks, and count the far
        rows exactly against the current c_max. ``far_estimator = "recount"``: the new rho and flags replace the
        stored ones; ``"stale"``: the stored rho stay (the paper's estimator) and are only re-flagged against the
        current c_max (smarties). Either way the exact and the previous (stale) far fractions are kept for
        ``stats()``. Nothing changes if the function returns a non-finite value."""
        lo, hi = self.domain()
        chunk = int(chunk_size or self.recount_chunk_size)
        cols = self.storage.columns
        log_rho = np.empty(hi - lo)
        for a in range(lo, hi, chunk):
            b = min(a + chunk, hi)
            res = log_rho_fn(self.storage.read("obs", np.arange(a, b)),
                             *(cols[name][a:b].copy() for name in ("action", *BEHAVIOUR_COLUMNS)))
            res = np.asarray(res.detach().cpu() if hasattr(res, "detach") else res, np.float64).reshape(-1)
            if res.size != b - a:
                raise ValueError(f"log_rho_fn returned {res.size} values for {b - a} rows")
            log_rho[a - lo : b - lo] = res
        if not np.isfinite(log_rho).all():
            slot = lo + int(np.argmax(~np.isfinite(log_rho)))
            raise ValueError(f"log_rho_fn returned a non-finite value for slot {slot}")
        rho = np.exp(np.clip(log_rho, -LOG_RHO_CLIP, LOG_RHO_CLIP))
        far = is_far(rho, self.c_max)
        n = hi - lo
        self.far_fraction_stale = self.far_fraction()
        self.far_fraction_exact = int(far.sum()) / n if n else 0.0
        if self.far_estimator == "recount":
            self.rho[lo:hi], self.far[lo:hi] = rho, far
        else:
            self.far[lo:hi] = is_far(self.rho[lo:hi], self.c_max)
        self.num_far = int(self.far[lo:hi].sum())
        self.num_recounts += 1

    def loop_hooks(self, ctx) -> list:
        """The periodic pass (``recount``) every ``recount_every_grad_steps`` gradient steps of either phase, with
        the agent's ``refer_log_rho``."""
        if not self.recount_every_grad_steps:
            return []
        fn = getattr(ctx.agent, "refer_log_rho", None)
        if fn is None:
            raise ValueError(f"ReF-ER replay needs an agent with refer_log_rho(obs, action, mu_mean, mu_std); "
                             f"{type(ctx.agent).__name__} has none")
        k = self.recount_every_grad_steps
        return [EveryGradSteps(k, lambda: self.recount(fn), phase) for phase in ("offline", "online")]

    # -- diagnostics and checkpoint ----------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        out = super().stats() | {"replay/far_policy_fraction": self.far_fraction(),
                                 "replay/refer_beta": self.beta, "replay/refer_c_max": self.c_max,
                                 "replay/refer_recounts": float(self.num_recounts)}
        if self.num_recounts:  # what the estimator missed, at the last pass (see the module docstring)
            out |= {"replay/refer_far_fraction_exact": self.far_fraction_exact,
                    "replay/refer_far_fraction_stale": self.far_fraction_stale}
        return out

    def state_dict(self) -> dict:
        size = self.storage.size
        return super().state_dict() | {"rho": self.rho[:size].copy(), "far": self.far[:size].copy(),
                                       "num_far": self.num_far, "beta": self.beta, "t": self.t,
                                       "batch_size": self.batch_size, "num_recounts": self.num_recounts,
                                       "far_fraction_exact": self.far_fraction_exact,
                                       "far_fraction_stale": self.far_fraction_stale}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        owner, size = self._owner(), self.storage.size
        rho = state_array(state, "rho", owner, length=size, low=0.0)
        far = state_array(state, "far", owner, length=size, dtype=bool)
        num_far = state_int(state, "num_far", owner, high=size)
        beta, t = state_float(state, "beta", owner, low=0.0), state_int(state, "t", owner)
        batch_size, num_recounts = state_int(state, "batch_size", owner), state_int(state, "num_recounts", owner)
        self.rho = np.ones(self.storage.capacity)
        self.far = np.zeros(self.storage.capacity, bool)
        self.rho[:size], self.far[:size] = rho, far
        lo, hi = self.domain()
        if num_far != int(self.far[lo:hi].sum()):
            raise ValueError(f"{owner} field 'num_far' is {num_far} but {int(self.far[lo:hi].sum())} rows are marked "
                             "far")
        self.num_far = num_far
        self.beta, self.t = beta, t
        self.batch_size, self.num_recounts = batch_size, num_recounts
        # (absent from checkpoints written before issue 28: 0 until the next pass)
        self.far_fraction_exact, self.far_fraction_stale = (
            state_float(state, key, owner, low=0.0, high=1.0) if key in state else 0.0
            for key in ("far_fraction_exact", "far_fraction_stale"))


register_alias("refer_online", "mixture", sets=("online.name=refer",),
               keys={"offline_fraction": "offline_fraction", "*": "online.refer."},
               doc="ReF-ER on the online part of an exact offline/online split, uniform offline rows")
