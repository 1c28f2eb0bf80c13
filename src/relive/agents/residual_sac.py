"""Residual SAC on a frozen base policy: stage 1 of PLD ("Probe, Learn, Distill", Xiao et al., arXiv
2511.00091), following a formula-level implementation spec of the paper (not in this repository; formula numbers
(1)-(26) are its Sec. 14 checklist; ``docs/pld.md`` maps each one to a function and a test).

Acting (1)-(5), (22)-(25):
    a_base = pi_theta(x)                        (1)  the frozen base policy, any callable [N, O] -> [N, A]
    delta_a ~ dpi_phi(. | x)                    (2)  tanh-Gaussian residual on the observation alone (spec Sec. 1.2,
                                                     ``residual_input = "obs"``); ``"obs+base_action"``:
                                                     dpi_phi(. | x, a_base), the PLD paper's choice
    a = clip(a_base + beta_t delta_a, low, high)  (3)-(4)
    warm-up: a = a_base, stored                 (5)  the first ``warmup`` env steps (or episodes)
    probing: h ~ U{0..H_probe} at each episode start (22); the first h steps a = a_base (23), executed but
             returned with ``store=False`` (25); then the residual takes over (24).
The residual lives in [-(high - low)/2, (high - low)/2]^A (beta = 1 lets it span the box). Its last layer is
zero-initialized with a small initial log-std, so a ~= a_base at the start.

``update(batch)`` in the spec's order (Sec. 4-7), online phase:
    y = r + gamma (1 - terminated) max_k [min_i Qbar_i(x', a'_k) - alpha log dpi(delta_a'_k | x', .)]  (7)-(12)
        a'_k = clip(pi_theta(x') + beta delta_a'_k), delta_a'_k ~ dpi(. | x', pi_theta(x')), k = 1..K (OTF; K = 8
        by default, spec Sec. 13; K = 1 is SAC's target)
    critic: mean_i (Q_i(x, a) - y)^2 on the executed action, one clipped-norm Adam step, Polyak (13)-(15)
    every ``actor_every`` critic steps (spec Sec. 10.2: every step, the default; PLD Table 5: 2, ``table5()``):
    actor: alpha log dpi(delta_a | x, .) - min_i Q_i(x, clip(pi_theta(x) + beta delta_a))          (16)-(17)
           -- the residual's log-prob only, never a density of the executed action (spec Sec. 12.2)
    temperature: -alpha (log dpi(delta_a | x, .) + H_tgt)                                          (18)-(19)
Offline phase (the trainer's ``OnPhase("offline")``; or call :meth:`pretrain_critic`): critic-only Cal-QL
(20)-(21) on D_off: a TD term plus the calibrated conservative gap of ``relive.agents.cal_ql`` (``cql_gap``), policy
actions from the combined policy clip(a_base + beta delta_a); the actor does not move. The TD term is spec Sec. 8.1's
"standard SAC / CDQ TD" by default (``pretrain_target = "sac"``: one a' = clip(pi_theta(x') + beta delta_a'),
y = r + gamma (1 - terminated) [min_i Qbar_i(x', a') - alpha log dpi(delta_a' | x')]); ``"otf_max"`` uses the online
phase's OTF max over K candidates there too (relive before issue 46).
``truncated`` never enters a target. The base policy is called under ``no_grad`` on NumPy arrays and belongs to
no optimizer: its parameters never change (tested bit-identical).

The update is SAC's where the arithmetic is the same (``relive.agents.sac.SAC``: ``alpha``, ``td_loss`` (13),
``temperature_loss`` (18), the n-step discount; ``networks.optimize`` with the gradient-norm clip (14), (17) and
``networks.polyak`` (15)); what differs is what the actor acts on: the residual, scaled by beta and added to a_base.

Per-step records (spec Sec. 12.1), stored by the trainer from ``Acted.record``: ``base_action``,
``delta_action`` (the unscaled residual), ``beta``. The update never reads them (it recomputes pi_theta(x), which
is deterministic); offline rows get 0 for all three (``offline="fill"``: beta = 0 and delta = 0 say "no
residual", as in a base-only rollout; ``base_action`` = 0 there means "not recorded").

Example::

    agent = ResidualSAC(obs_dim, action_dim, low, high, ResidualSACConfig(), seed=0, base_policy=base)
    agent.on_episode_start()                      # the OnEpisodeStart hook: draws the probing length h
    out = agent.act(obs[None], explore=True)      # Acted(action, record, store)
    result = agent.update(buffer.sample(256))     # UpdateResult(metrics, signals={"td_error"})
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from relive.agents import networks as nets
from relive.agents.base_policy import load_base_policy
from relive.agents.cal_ql import CalQLConfig, cql_gap
from relive.agents.encoders import flat_obs_batch
from relive.agents.run_dir import AGENT_FINAL, CONFIG_FILE, open_run_dir
from relive.agents.sac import SAC
from relive.hooks import OnEpisodeEnd, OnEpisodeStart, OnPhase
from relive.registry import register_agent
from relive.replay.returns import write_returns_to_go
from relive.types import Acted, Batch, ColumnDecl, TensorMetrics, UpdateResult

BETA_SCHEDULES = ("constant", "linear", "stepwise")
WARMUP_UNITS = ("steps", "episodes")
PHASES = ("offline", "online")
RESIDUAL_INPUTS = ("obs", "obs+base_action")  # spec Sec. 1.2's dpi(delta_a | x); PLD's dpi(delta_a | x, a_base)
PRETRAIN_TARGETS = ("sac", "otf_max")  # spec Sec. 8.1's SAC / CDQ target; the online OTF max (Sec. 4.4)
BasePolicy = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class ResidualSACConfig:
    """Residual SAC hyperparameters. Defaults: the spec's Sec. 13 template (K = 8, actor and temperature at every
    gradient step, 1000 base-only warm-up steps, H_probe 50, beta 0.5 constant, alpha 0.1, lrs 3e-4, gamma 0.99,
    tau 0.005), its Sec. 1.2 residual dpi(delta_a | x), its Sec. 8.1 SAC / CDQ pre-training target, and, where the
    spec says nothing, PLD Table 5 (widths 256, LayerNorm, gradient clip 1.0). Batch 256
    and one gradient step per stored env step are the trainer's ``schedule.batch_size`` / ``utd_ratio``; symmetric
    50/50 replay is the replay config (the ``residual_sac`` preset sets all three). :meth:`table5` gives Table 5's
    values where they differ from the template."""

    base_policy: str = ""  # frozen base policy (a path for load_base_policy); "": set_base_policy(fn)
    # also read a base_policy file in a format that can run code (TorchScript, torch.export): the current call's
    # opt-in (--trust-code) only -- never recorded true in a run's config.json, never taken from one (a resume, eval,
    # export say it again; relive.agents.run_dir.open_run_dir); docs/guarantees.md
    trust_code: bool = False
    hidden: tuple[int, ...] = (256, 256)  # widths of the residual actor and both critics (spec: open; Table 5: 256)
    residual_input: str = "obs"  # the residual actor's input: "obs" = dpi_phi(delta_a | x), spec §1.2 (formula (2),
        # §0); "obs+base_action" = dpi_phi(delta_a | x, a_base), the PLD paper's choice (an ablation)
    init_log_std: float = -3.0  # initial log-std of the residual (zero last layer: mean 0, so a ~= a_base)
    beta_schedule: str = "constant"  # beta_t: "constant" | "linear" | "stepwise" (spec §12.3; §13: constant)
    beta: float = 0.5  # constant: beta_t = beta; linear: the final beta_max (spec §13: 0.5; Table 5 xi = 0.5)
    beta_start: float = 0.0  # linear: beta at step 0; beta_t = start + (beta - start) min(1, t / T) (spec: 0)
    beta_ramp_steps: int = 10_000  # linear: T, in stored online env steps
    beta_boundaries: tuple[int, ...] = ()  # stepwise: stored online env steps where beta moves to the next value
    beta_values: tuple[float, ...] = ()  # stepwise: len(beta_boundaries) + 1 values, beta_values[0] before the first
    num_qs: int = 2  # clipped double Q (Table 5: 2)
    critic_layer_norm: bool = True  # LayerNorm after every hidden critic layer (Table 5)
    otf_candidates: int = 8  # OTF: K candidates at x', max of their soft values (spec §13 otf_K: 8); 1: SAC's target
    actor_every: int = 1  # actor + alpha step every this many critic steps (spec §10.2: 1; Table 5: 2, see table5())
    gamma: float = 0.99  # discount (spec §13, Table 5: 0.99)
    n_step: int = 1  # TD targets on n-step returns, which the buffer sums at sample time; 1: one-step
    tau: float = 0.005  # Polyak rate of the target critics, per critic step (spec §13: 0.005)
    actor_lr: float = 3e-4  # Adam learning rate of the residual actor (spec §13 pi_lr, Table 5: 3e-4)
    critic_lr: float = 3e-4  # Adam learning rate of the critics (spec §13 q_lr: 3e-4)
    temp_lr: float = 3e-4  # Adam learning rate of log(alpha) (spec §13 alpha_lr: 3e-4)
    grad_clip_norm: float = 1.0  # clip the critic's and the actor's gradient norm (Table 5: 1.0); 0: off
    init_temperature: float = 0.1  # initial alpha (spec §13 alpha.init: 0.1; Table 5 as transcribed: 1.0)
    learn_temperature: bool = True  # False: alpha stays at init_temperature
    target_entropy: float | None = None  # None: -|A| (spec §13 "-dim(action)"; Table 5)
    warmup: int = 1000  # base-only stored steps (or episodes) first (spec §13: 1000 steps; Table 5: 100 ep.)
    warmup_unit: str = "steps"  # "steps" or "episodes" (episodes are counted by the OnEpisodeStart hook)
    probe_max_steps: int = 50  # H_probe: h ~ U{0..H_probe} unstored base-only steps per episode (spec §13: 50); 0: off
    cql_alpha: float = CalQLConfig.cql_alpha  # offline phase: weight of the calibrated conservative gap
    cql_n_actions: int = CalQLConfig.cql_n_actions  # offline phase: uniform / pi(x) / pi(x') actions per sample
    cql_temp: float = CalQLConfig.cql_temp  # offline phase: temperature of the logsumexp
    clip_diff_min: float = CalQLConfig.clip_diff_min  # offline phase: lower clip of CQL_ood - Q(x, a)
    clip_diff_max: float = CalQLConfig.clip_diff_max  # offline phase: upper clip of CQL_ood - Q(x, a)
    calibrate: bool = True  # offline phase: Cal-QL's max(Q, mc_return) on the policy actions; False: plain CQL
    pretrain_target: str = "sac"  # offline phase's TD target: "sac" = spec §8.1's standard SAC / clipped-double-Q
        # target (one a' ~ pi(.|x'), min of the target critics minus alpha log pi); "otf_max" = the online phase's
        # OTF max over otf_candidates (spec §4.4), relive's target before issue 46 (an ablation)

    @staticmethod
    def from_legacy_dict(data: dict) -> dict:
        """A config.json written before issue 46 (it has ``condition_on_base``, which every such file holds) ->
        today's fields: ``condition_on_base`` true / false -> ``residual_input`` "obs+base_action" / "obs", and the
        pre-training target it ran with, ``pretrain_target = "otf_max"``, unless the file names one."""
        if "condition_on_base" not in data:
            return data
        data = dict(data)
        on_base = data.pop("condition_on_base")
        data.setdefault("residual_input", "obs+base_action" if on_base else "obs")
        data.setdefault("pretrain_target", "otf_max")
        return data

    def __post_init__(self):
        if self.residual_input not in RESIDUAL_INPUTS:
            raise ValueError(f"residual_input must be one of {RESIDUAL_INPUTS}, got {self.residual_input!r}")
        if self.pretrain_target not in PRETRAIN_TARGETS:
            raise ValueError(f"pretrain_target must be one of {PRETRAIN_TARGETS}, got {self.pretrain_target!r}")
        if self.beta_schedule not in BETA_SCHEDULES:
            raise ValueError(f"beta_schedule must be one of {BETA_SCHEDULES}, got {self.beta_schedule!r}")
        if self.beta < 0 or self.beta_start < 0 or any(v < 0 for v in self.beta_values):
            raise ValueError(f"beta values must be >= 0, got beta={self.beta}, beta_start={self.beta_start}, "
                             f"beta_values={self.beta_values}")
        if self.beta_schedule == "linear" and self.beta_ramp_steps < 1:
            raise ValueError(f"beta_ramp_steps must be >= 1, got {self.beta_ramp_steps}")
        if self.beta_schedule == "stepwise":
            if len(self.beta_values) != len(self.beta_boundaries) + 1:
                raise ValueError(f"stepwise beta needs len(beta_values) == len(beta_boundaries) + 1, got "
                                 f"{len(self.beta_values)} values and {len(self.beta_boundaries)} boundaries")
            if list(self.beta_boundaries) != sorted(set(self.beta_boundaries)) or min(self.beta_boundaries,
                                                                                        default=1) < 1:
                raise ValueError(f"beta_boundaries must be strictly increasing and >= 1, got {self.beta_boundaries}")
        if self.num_qs < 2:
            raise ValueError(f"num_qs must be >= 2 (clipped double Q), got {self.num_qs}")
        if self.otf_candidates < 1 or self.actor_every < 1:
            raise ValueError(f"otf_candidates and actor_every must be >= 1, got {self.otf_candidates}, "
                             f"{self.actor_every}")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError(f"tau must be in (0, 1] and gamma in [0, 1], got tau={self.tau}, gamma={self.gamma}")
        if self.warmup_unit not in WARMUP_UNITS:
            raise ValueError(f"warmup_unit must be one of {WARMUP_UNITS}, got {self.warmup_unit!r}")
        nets.check_n_step(self.n_step)
        if self.warmup < 0 or self.probe_max_steps < 0:
            raise ValueError(f"warmup and probe_max_steps must be >= 0, got {self.warmup}, {self.probe_max_steps}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if self.init_temperature <= 0 or self.grad_clip_norm < 0:
            raise ValueError(f"init_temperature must be > 0 and grad_clip_norm >= 0, got {self.init_temperature}, "
                             f"{self.grad_clip_norm}")
        if self.cql_n_actions < 1 or self.cql_alpha < 0 or self.cql_temp <= 0:
            raise ValueError(f"need cql_n_actions >= 1, cql_alpha >= 0 and cql_temp > 0, got "
                             f"{self.cql_n_actions}, {self.cql_alpha}, {self.cql_temp}")

    @classmethod
    def table5(cls, **overrides) -> ResidualSACConfig:
        """PLD's Table 5 (as transcribed by a third party) where it differs from the spec's template: a
        critic-to-actor update ratio of 2 (``actor_every = 2``), 100 warm-up episodes, initial alpha 1.0."""
        table5: dict[str, Any] = {"actor_every": 2, "warmup": 100, "warmup_unit": "episodes", "init_temperature": 1.0}
        return cls(**(table5 | overrides))

    def to_dict(self) -> dict:
        return asdict(self)


def beta_at(cfg: ResidualSACConfig, t: int) -> float:
    """beta_t (spec Sec. 12.3): constant beta; linear min(beta, start + (beta - start) t / T); stepwise the value
    of the interval of ``beta_boundaries`` that holds t. ``t`` counts stored online env steps."""
    if cfg.beta_schedule == "constant":
        return float(cfg.beta)
    if cfg.beta_schedule == "linear":
        return float(cfg.beta_start + (cfg.beta - cfg.beta_start) * min(1.0, t / cfg.beta_ramp_steps))
    return float(cfg.beta_values[int(np.searchsorted(cfg.beta_boundaries, t, side="right"))])


@register_agent("residual_sac", ResidualSACConfig)
class ResidualSAC:
    """Residual SAC on a frozen base policy (see the module docstring for acting, the update and its formulas)."""

    # Ray collectors act on copies: the clock of beta_t and of the warm-up (stored env steps, advanced by act) would
    # run in each copy while the learner's update reads beta_t from its own clock, which never moves
    remote_acting_problem = ("its beta schedule and base-only warm-up count the env steps act() takes, and the "
                             "update reads beta from that clock, which would run in each collector's copy, not in "
                             "the learner")

    # the trainer's random warm-up (schedule.num_warmup_env_steps, warmup_policy "random") acts instead of act() and
    # stores uniform actions; the trainer refuses it at start for an agent that names this problem (issue 28 item 5)
    random_warmup_problem = ("its warm-up is base-only acting (agent.warmup stored steps, with updates: spec Sec. 2), "
                             "and its probing needs every step of an episode from act(): a random warm-up ending "
                             "mid-episode would store random actions before the episode's unstored probing steps. "
                             "Use --set agent.warmup=N for the base-only warm-up (and --warmup 0), or "
                             "--warmup-policy agent to only hold the updates back for N stored steps")

    # load_state_dict refuses a state recorded on a base with another digest unless this is True (the trainer sets
    # it from train(allow_other_base=True), `relive train ... --allow-other-base`)
    allow_other_base = False

    # -- SAC's, shared: the residual differs in what the actor acts on, not in the update's arithmetic --------------
    td_loss = staticmethod(SAC.td_loss)  # (13): (Q_i(x, a) - y)^2 averaged over the members: [E, B] -> [B]
    if TYPE_CHECKING:  # (SAC's functions, typed for a ResidualSAC self: mypy types them as taking a SAC)
        @property
        def alpha(self) -> torch.Tensor: ...
        def temperature_loss(self, logp: torch.Tensor) -> torch.Tensor: ...
        def _discount(self, b: Batch) -> torch.Tensor | None: ...
    else:
        alpha = SAC.alpha  # alpha = exp(log alpha), without gradient
        temperature_loss = SAC.temperature_loss  # (18) per sample: -alpha (log dpi(delta_a | x, .) + H_tgt)
        _discount = SAC._discount  # the batch's n-step discount (None: one-step, gamma (1 - terminated))

    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high,
                 config: ResidualSACConfig | None = None, seed: int = 0, device: str = "cpu",
                 base_policy: BasePolicy | None = None):
        self.cfg = cfg = config if config is not None else ResidualSACConfig()
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.device = torch.device(device)
        self.action_low = np.asarray(action_low, np.float32).reshape(-1)
        self.action_high = np.asarray(action_high, np.float32).reshape(-1)
        half = (self.action_high - self.action_low) / 2  # (checked by the actor: finite, low < high, shape (A,))
        self.low_t = torch.as_tensor(self.action_low, device=self.device)
        self.high_t = torch.as_tensor(self.action_high, device=self.device)
        init_gen = torch.Generator().manual_seed(int(seed))  # parameters (CPU: identical on every device)
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)  # residual samples, CQL actions
        self.rng = np.random.default_rng(int(seed) + 2)  # probing lengths h
        actor_in = obs_dim + (action_dim if cfg.residual_input == "obs+base_action" else 0)
        with nets.private_rng():
            actor = nets.TanhGaussianActor(actor_in, action_dim, cfg.hidden, -half, half)
            critic = nets.EnsembleCritic(cfg.num_qs, obs_dim, action_dim, cfg.hidden, cfg.critic_layer_norm)
        self.actor = nets.init_(actor, init_gen).to(self.device)
        with torch.no_grad():  # zero last layer: mean 0 (delta_a = 0), log-std = init_log_std everywhere
            head = cast(nn.Linear, self.actor.trunk[-1])
            head.weight.zero_()
            head.bias.copy_(torch.tensor([0.0] * action_dim + [cfg.init_log_std] * action_dim))
        self.critic = nets.init_(critic, init_gen).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(np.log(cfg.init_temperature), dtype=torch.float32, device=self.device,
                                      requires_grad=True)
        self.target_entropy = float(-action_dim if cfg.target_entropy is None else cfg.target_entropy)
        self.actor_opt = nets.adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = nets.adam(self.critic.parameters(), cfg.critic_lr)
        self.alpha_opt = nets.adam([self.log_alpha], cfg.temp_lr)
        self.base: BasePolicy | None = None
        self.base_sha256 = ""  # the base's BasePolicy.digest() ("": a plain callable, which cannot say)
        if base_policy is not None:
            self.set_base_policy(base_policy)
        self.phase = "online"  # "offline": critic-only Cal-QL updates (set by the OnPhase hook)
        self.num_critic_steps = self.num_actor_steps = self.num_pretrain_steps = 0
        self.num_env_steps = 0  # stored online env steps (warm-up + takeover): the clock of beta_t and warm-up
        self.num_probe_steps = 0  # executed, unstored probing steps
        self.num_episodes = 0  # online episodes started (over all envs)
        # per env (row i of an act call is env i; one env: length 1), reset by the OnEpisodeStart hook fn(env):
        self.episode_step = np.zeros(1, np.int64)  # exploring act calls in the env's current episode
        self.probe_steps = np.zeros(1, np.int64)  # h of the env's current episode (0 in warm-up episodes)
        self.episode_index = np.zeros(1, np.int64)  # num_episodes when the env's current episode started

    # -- construction from the registry -------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec, config: ResidualSACConfig, seed: np.random.SeedSequence, device: str = "cpu",
                  base_policy: BasePolicy | None = None) -> ResidualSAC:
        """The agent for a continuous ``EnvSpec``; the base policy is ``base_policy`` if given, else loaded from
        ``config.base_policy`` with ``relive.agents.base_policy.load_base_policy(path, spec)``; neither is an
        error (a run without a base would fail only at its first step)."""
        if spec.discrete or len(spec.action_shape) != 1 or isinstance(spec.obs_shape, dict) or len(spec.obs_shape) != 1:
            raise ValueError(f"residual_sac needs flat Box observations and actions, got {spec.id}: obs "
                             f"{spec.obs_shape}, {'discrete' if spec.discrete else spec.action_shape} actions")
        agent = cls(spec.obs_shape[0], spec.action_shape[0], spec.action_low, spec.action_high, config,
                    seed=nets.seed_int(seed), device=device)
        if base_policy is None:
            if not config.base_policy:
                raise ValueError("residual_sac needs a frozen base policy: --base-policy PATH (agent.base_policy), or "
                                 "build ResidualSAC(...) and call set_base_policy(fn)")
            base_policy = load_base_policy(config.base_policy, spec, trusted=config.trust_code)
        agent.set_base_policy(base_policy)
        return agent

    def set_base_policy(self, fn: BasePolicy) -> None:
        """Install the frozen base policy ``fn(obs [N, obs_dim]) -> actions [N, action_dim]`` (deterministic).
        It is checked once on two observations; a wrong output shape is a ValueError."""
        if not callable(fn):
            raise ValueError(f"the base policy must be callable obs [N, {self.obs_dim}] -> [N, {self.action_dim}], "
                             f"got {type(fn).__name__}")
        with torch.no_grad():
            out = np.asarray(fn(np.zeros((2, self.obs_dim), np.float32)))
        if out.shape != (2, self.action_dim):
            raise ValueError(f"the base policy must map obs [N, {self.obs_dim}] to actions [N, {self.action_dim}]; "
                             f"on [2, {self.obs_dim}] it returned shape {out.shape}")
        self.base = fn
        digest = getattr(fn, "digest", None)  # (once: the base is frozen; its weights never change)
        self.base_sha256 = str(digest()) if callable(digest) else ""

    def base_action(self, obs: np.ndarray) -> np.ndarray:
        """a_base = pi_theta(x) (1): [N, A] float32, computed without gradients."""
        if self.base is None:
            raise ValueError("ResidualSAC has no base policy: set agent.base_policy (a path) in the config or "
                             "call agent.set_base_policy(fn)")
        with torch.no_grad():
            out = self.base(obs)
        if torch.is_tensor(out):
            out = out.detach().cpu().numpy()
        out = np.asarray(out, np.float32)
        if out.shape != (obs.shape[0], self.action_dim):
            raise ValueError(f"the base policy returned actions of shape {out.shape} for {obs.shape[0]} "
                             f"observations; expected ({obs.shape[0]}, {self.action_dim})")
        return out

    def _base_t(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.base_action(obs.detach().cpu().numpy()), device=self.device)

    def beta(self) -> float:
        """beta_t at the agent's clock (stored online env steps)."""
        return beta_at(self.cfg, self.num_env_steps)

    # -- the residual policy and the executed action --------------------------------------------------
    def residual(self, obs: torch.Tensor, base: torch.Tensor, deterministic: bool = False):
        """delta_a ~ dpi_phi(. | x) (2) (spec Sec. 1.2; ``residual_input = "obs+base_action"``: dpi_phi(. | x,
        a_base)), reparameterized, and log dpi(delta_a | .) summed over dims."""
        inp = torch.cat([obs, base], dim=-1) if self.cfg.residual_input == "obs+base_action" else obs
        return self.actor.sample(inp, self.gen, deterministic=deterministic)

    def executed(self, base: torch.Tensor, delta: torch.Tensor, beta: float | torch.Tensor) -> torch.Tensor:
        """a = clip(a_base + beta delta_a, low, high) (3)-(4); ``beta`` a number or a per-row [N, 1] tensor."""
        return torch.clamp(base + beta * delta, self.low_t, self.high_t)

    def combined_policy(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``residual(obs [N, O], base_action [N, A]) -> clip(a_base + beta (high - low)/2 tanh(mu)) [N, A]``: the
        deterministic executed action for a given base action, at the current beta (what ``relive pld distill``
        rolls out)."""

        @torch.no_grad()
        def residual(obs: np.ndarray, base_action: np.ndarray) -> np.ndarray:
            o, _ = nets.as_obs_tensor(np.asarray(obs, np.float32).reshape(-1, self.obs_dim), self.obs_dim,
                                      self.device)
            base = torch.as_tensor(np.asarray(base_action, np.float32).reshape(-1, self.action_dim),
                                   device=self.device)
            delta, _ = self.residual(o, base, deterministic=True)
            return self.executed(base, delta, self.beta()).cpu().numpy()

        return residual

    # -- acting -------------------------------------------------------------------------------------
    def in_warmup(self, env: int = 0) -> bool:
        """Spec Sec. 2 / (5): base-only, stored steps while fewer than ``warmup`` steps were stored (or while env
        ``env``'s current episode is one of the first ``warmup`` episodes started)."""
        if self.cfg.warmup_unit == "steps":
            return self.num_env_steps < self.cfg.warmup
        return max(int(self.episode_index[env]) if env < self.episode_index.size else 0, 1) <= self.cfg.warmup

    def _num_envs_at_least(self, n: int) -> None:
        if self.episode_step.size < n:  # (a new env's state starts at zero; its OnEpisodeStart sets it)
            pad = n - self.episode_step.size
            self.episode_step, self.probe_steps, self.episode_index = (
                np.concatenate([a, np.zeros(pad, np.int64)])
                for a in (self.episode_step, self.probe_steps, self.episode_index))

    def on_episode_start(self, env: int = 0) -> None:
        """Before the first step of every online episode of env ``env`` (the ``OnEpisodeStart`` hook, per env):
        resets that env's episode step counter and draws its probing length h ~ U{0..H_probe} (22) from the
        agent's generator (0 for an episode that starts in warm-up: warm-up episodes are stored whole). Envs
        stepped together draw in env order, each its own h."""
        self._num_envs_at_least(env + 1)
        self.num_episodes += 1
        self.episode_step[env] = 0
        self.episode_index[env] = self.num_episodes
        h = int(self.rng.integers(0, self.cfg.probe_max_steps + 1)) if self.cfg.probe_max_steps else 0
        self.probe_steps[env] = 0 if self.in_warmup(env) else h

    def step_kind(self, env: int = 0) -> str:
        """What env ``env``'s next exploring step does: "warmup" (base, stored), "probe" (base, not stored) or
        "residual" (base + beta residual, stored)."""
        if self.in_warmup(env):
            return "warmup"
        self._num_envs_at_least(env + 1)
        return "probe" if self.episode_step[env] < self.probe_steps[env] else "residual"

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool):
        """``explore=False`` (evaluation): clip(a_base + beta (high - low)/2 tanh(mu)) as a bare [N, A] array --
        never warm-up, never probing. ``explore=True``: an :class:`Acted` with the records ``base_action``,
        ``delta_action``, ``beta`` and ``store=False`` on probing steps; it advances the episode step and the
        clocks. The rows of one call share the episode's state (the online collector runs one environment); an
        ``Acted`` always holds [N, ...] arrays, also for a single observation, so that its store flag is per row.
        Row i is env i
        (``--num-envs``): each env has its own episode step and probing length, so in one call some rows may
        probe (unstored) while others are residual steps."""
        o, single = nets.as_obs_tensor(obs, self.obs_dim, self.device)
        base = torch.as_tensor(self.base_action(o.cpu().numpy()), device=self.device)
        if not explore:
            delta, _ = self.residual(o, base, deterministic=True)
            a = self.executed(base, delta, self.beta()).cpu().numpy()
            return a[0] if single else a
        n = o.shape[0]
        self._num_envs_at_least(n)
        for env in np.flatnonzero(self.episode_index[:n] == 0):  # no OnEpisodeStart before an env's first step:
            self.on_episode_start(int(env))  # its first episode starts here
        kinds = np.array([self.step_kind(env) for env in range(n)])
        residual, probe = kinds == "residual", kinds == "probe"
        beta = self.beta()
        scale: float | torch.Tensor
        if residual.all():
            delta, _ = self.residual(o, base)  # (2), (24)
            scale = beta
        elif not residual.any():  # (5) warm-up, (23) probing: the base alone
            delta, scale = torch.zeros_like(base), 0.0
        else:  # envs in different parts of their episodes: the residual only where it took over
            delta, _ = self.residual(o, base)
            mask = torch.as_tensor(residual, device=self.device)[:, None]
            delta = torch.where(mask, delta, torch.zeros_like(delta))
            scale = torch.as_tensor(np.where(residual, beta, 0.0), dtype=base.dtype, device=self.device)[:, None]
        action = self.executed(base, delta, scale).cpu().numpy()
        self.episode_step[:n] += 1
        self.num_probe_steps += int(probe.sum())
        self.num_env_steps += int(n - probe.sum())
        record = {"base_action": base.cpu().numpy(), "delta_action": delta.cpu().numpy(),
                  "beta": np.where(residual, beta, 0.0).astype(np.float32)}
        return Acted(action, record, store=~probe)  # (25): probing steps are never stored

    def stored_columns(self) -> tuple[ColumnDecl, ...]:
        """The behaviour records (spec Sec. 12.1) and, when calibrating, ``mc_return`` (the dataset loader
        computes it for offline rows, which the Cal-QL pre-training reads; online rows get theirs when their
        episode ends, from the takeover step on, since probing steps are not stored, but no online update reads
        them: Cal-QL only initializes the critic, spec Sec. 8)."""
        a = (self.action_dim,)
        cols: tuple[ColumnDecl, ...] = (
            ColumnDecl("base_action", a, doc="pi_theta(x) when the row was collected (offline rows: 0, not recorded)"),
            ColumnDecl("delta_action", a, doc="the unscaled residual sample delta_a (0: base only)"),
            ColumnDecl("beta", (), doc="residual scale beta_t when collected (0: warm-up or offline base rows)"),
        )
        if self.cfg.calibrate:
            cols += (ColumnDecl("mc_return", doc="Monte-Carlo return-to-go (the Cal-QL pre-training's bound)"),)
        return cols

    def loop_hooks(self, ctx) -> list:
        """The phase switch, the probing draw before every online episode and, when calibrating, the returns-to-go
        of every finished online episode's stored rows."""
        hooks = [OnPhase(self.on_phase), OnEpisodeStart(self.on_episode_start, per_env=True)]
        if self.cfg.calibrate:
            hooks.append(OnEpisodeEnd(lambda slots: write_returns_to_go(ctx.buffer, slots, ctx.gamma, "mc_return")))
        return hooks

    def on_phase(self, phase: str) -> None:
        """``"offline"``: updates are critic-only Cal-QL (20)-(21); ``"online"``: residual SAC."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        self.phase = phase

    # -- losses (pure given the generator state; unit-tested) -----------------------------------------
    @torch.no_grad()
    def critic_target(self, reward: torch.Tensor, next_obs: torch.Tensor, next_base: torch.Tensor,
                      terminated: torch.Tensor, beta: float, discount=None,
                      candidates: int | None = None) -> torch.Tensor:
        """OTF TD target (8)-(12): y = r + gamma (1 - terminated) max_k [min_i Qbar_i(x', a'_k) - alpha log
        dpi(delta_a'_k | x', .)], a'_k = clip(pi_theta(x') + beta delta_a'_k), K = ``candidates`` (None:
        ``otf_candidates``): [B]. K = 1 is the standard SAC / clipped-double-Q target (spec Sec. 8.1)."""
        k, batch_size = candidates or self.cfg.otf_candidates, next_obs.shape[0]
        next_rep, base_rep = next_obs.repeat_interleave(k, dim=0), next_base.repeat_interleave(k, dim=0)
        delta, logp = self.residual(next_rep, base_rep)  # (8)  row i*K + k belongs to sample i
        next_a = self.executed(base_rep, delta, beta)  # (9)
        q_min = self.target_critic(next_rep, next_a).min(dim=0).values  # (7)
        soft = (q_min - self.alpha * logp).view(batch_size, k)  # (10)
        v_otf = soft.max(dim=1).values  # (11)
        if discount is None:  # (an n-step batch: gamma^{n'} (1 - terminated), reward its n-step return)
            discount = self.cfg.gamma * (1.0 - terminated)
        return reward + discount * v_otf  # (12)

    def actor_loss(self, obs: torch.Tensor, base: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(16) per sample: alpha log dpi(delta_a | x, .) - min_i Q_i(x, clip(a_base + beta delta_a)), delta_a
        reparameterized; the entropy term is the residual's log-prob. Returns ([B], log dpi [B])."""
        delta, logp = self.residual(obs, base)
        q = self.critic(obs, self.executed(base, delta, beta)).min(dim=0).values
        return self.alpha * logp - q, logp

    def conservative_gap(self, b: Batch, base: torch.Tensor, next_base: torch.Tensor, q_data: torch.Tensor,
                         beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Cal-QL's calibrated gap (``cal_ql.cql_gap``) with the combined policy's actions: n uniform actions in
        the box, n of clip(a_base(x) + beta delta_a) and n of the same at x' (all evaluated at x, as the CQL
        reference code), without importance weights (the combined policy has no density: spec Sec. 12.2)."""
        n, batch_size = self.cfg.cql_n_actions, b.obs.shape[0]
        obs_rep, next_rep = b.obs.repeat_interleave(n, dim=0), b.next_obs.repeat_interleave(n, dim=0)
        with torch.no_grad():
            u = torch.rand((batch_size * n, self.action_dim), generator=self.gen, device=self.device)
            rand_a = self.low_t + u * (self.high_t - self.low_t)
            base_rep = base.repeat_interleave(n, dim=0)
            pi_a = self.executed(base_rep, self.residual(obs_rep, base_rep)[0], beta)
            next_base_rep = next_base.repeat_interleave(n, dim=0)
            next_a = self.executed(next_base_rep, self.residual(next_rep, next_base_rep)[0], beta)
        q = self.critic(obs_rep.repeat(3, 1), torch.cat([rand_a, pi_a, next_a]))
        q_rand, q_pi, q_next = q.view(-1, 3, batch_size, n).unbind(1)  # each [E, B, n]
        cfg = self.cfg
        return cql_gap(q_rand, q_pi, q_next, q_data, b.mc_return, calibrate=cfg.calibrate, temp=cfg.cql_temp,
                       clip_min=cfg.clip_diff_min, clip_max=cfg.clip_diff_max)

    # -- the updates ----------------------------------------------------------------------------------
    def update(self, batch: Batch, update_actor: bool | None = None) -> UpdateResult:
        """Offline phase: :meth:`pretrain_critic`. Online: one residual SAC critic step (7)-(15) and, every
        ``actor_every`` critic steps (or when ``update_actor`` says so), actor and temperature steps (16)-(19)."""
        if self.phase == "offline":
            return self.pretrain_critic(batch)
        b = self._to_torch(batch)
        w, beta = nets.is_weight_of(b), self.beta()
        base, next_base = self._base_t(b.obs), self._base_t(b.next_obs)  # (1); (6.1) theta never changes

        y = self.critic_target(b.reward, b.next_obs, next_base, b.terminated, beta, self._discount(b))  # (8)-(12)
        q = self.critic(b.obs, b.action)  # Q_i(x, a) on the executed, stored action
        critic_loss = nets.weighted_mean(self.td_loss(q, y), w)  # (13)
        nets.optimize(self.critic_opt, critic_loss, self.cfg.grad_clip_norm)  # (14)
        self.num_critic_steps += 1
        nets.polyak(self.target_critic, self.critic, self.cfg.tau)  # (15)
        metrics = {"train/critic_loss": critic_loss.item(), "train/q_mean": q.mean().item(),
                   "train/target_mean": y.mean().item(), "train/beta": beta}
        if update_actor is None:
            update_actor = self.num_critic_steps % self.cfg.actor_every == 0
        if update_actor:
            self.critic.requires_grad_(False)
            per_sample, logp = self.actor_loss(b.obs, base, beta)  # (16)
            actor_loss = nets.weighted_mean(per_sample, w)
            nets.optimize(self.actor_opt, actor_loss, self.cfg.grad_clip_norm)  # (17)
            self.critic.requires_grad_(True)
            self.num_actor_steps += 1
            metrics |= {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item()}
            if self.cfg.learn_temperature:  # (SAC's _temperature_step writes this gradient out by hand; it rounds
                # apart from autograd's in the last bit when the batch size is not a power of two, so not shared)
                nets.optimize(self.alpha_opt, nets.weighted_mean(self.temperature_loss(logp), w))  # (18)-(19)
            metrics["train/alpha"] = self.alpha.item()
        return UpdateResult(metrics, nets.signals_out(batch, td_error=q.mean(dim=0) - y))

    def pretrain_critic(self, batch: Batch) -> UpdateResult:
        """Cal-QL critic initialization on D_off (20)-(21): the TD term plus ``cql_alpha`` times the calibrated
        conservative gap; Polyak; the actor and the temperature do not move. The TD term's target is spec Sec. 8.1's
        standard SAC / CDQ one (one next action, ``pretrain_target = "sac"``) or the OTF max over
        ``otf_candidates`` (``"otf_max"``). Needs ``mc_return`` when ``calibrate``."""
        if self.cfg.calibrate and "mc_return" not in batch.extras:
            raise ValueError("the Cal-QL critic pre-training needs an 'mc_return' column (returns-to-go of the "
                             "base policy's successful episodes); or set agent.calibrate=False")
        b = self._to_torch(batch)
        if "mc_return" not in b.extras:  # plain CQL: no bound
            b = dataclasses.replace(b, extras=dict(b.extras) | {"mc_return": torch.full_like(b.reward,
                                                                                           float("nan"))})
        w, beta = nets.is_weight_of(b), self.beta()
        base, next_base = self._base_t(b.obs), self._base_t(b.next_obs)
        k = 1 if self.cfg.pretrain_target == "sac" else self.cfg.otf_candidates  # Sec. 8.1: SAC / CDQ target
        y = self.critic_target(b.reward, b.next_obs, next_base, b.terminated, beta, self._discount(b),
                               candidates=k)  # TD of (20)
        q = self.critic(b.obs, b.action)
        gap, metrics = self.conservative_gap(b, base, next_base, q, beta)  # R_CalQL of (20)
        td = self.td_loss(q, y)
        loss = nets.weighted_mean(td + self.cfg.cql_alpha * gap.mean(dim=0), w)
        nets.optimize(self.critic_opt, loss, self.cfg.grad_clip_norm)  # (21)
        self.num_pretrain_steps += 1
        nets.polyak(self.target_critic, self.critic, self.cfg.tau)
        out: dict[str, torch.Tensor | float] = {
            **metrics, "train/critic_loss": loss.item(), "train/td_loss": nets.weighted_mean(td, w).item(),
            "train/cql_gap": nets.weighted_mean(gap.detach().mean(dim=0), w).item(),
            "train/q_mean": q.mean().item(), "train/target_mean": y.mean().item()}
        return UpdateResult(TensorMetrics(out), nets.signals_out(batch, td_error=q.mean(dim=0) - y))

    def _to_torch(self, batch: Batch) -> Batch:
        batch = flat_obs_batch(batch)  # dict observations: keys concatenated (the encoder seam)
        if batch.obs.ndim != 2 or batch.obs.shape[1] != self.obs_dim:
            raise ValueError(f"batch.obs must have shape [B, {self.obs_dim}], got {tuple(batch.obs.shape)}")
        if batch.action.ndim != 2 or batch.action.shape[1] != self.action_dim:
            raise ValueError(f"batch.action must have shape [B, {self.action_dim}], got "
                             f"{tuple(batch.action.shape)}")
        return batch.to_torch(self.device, dtype=torch.float32)

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Networks, targets, log alpha, optimizers, both generators, clocks, phase and the probing state
        (NumPy / JSON). The base policy is not part of it (it is frozen and comes from ``config.base_policy``)."""
        return nets.soft_actor_critic_state(self) | {  # actor, critics, log alpha, optimizers, generator: SAC's
            "rng": self.rng.bit_generator.state,
            "phase": self.phase,
            "counters": {name: getattr(self, name) for name in _COUNTERS},
            "per_env": {name: getattr(self, name).copy() for name in _PER_ENV},
            "base_sha256": self.base_sha256,  # the frozen base the residual was trained on (checked on load)
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores everything ``state_dict`` saved. A state recorded on a base policy whose digest differs from
        the installed base's is refused (a residual learned on one base is a correction of that base, not of
        another) unless ``allow_other_base``; either digest unknown ("": a plain callable): not checked."""
        recorded = str(state.get("base_sha256", ""))
        if recorded and self.base_sha256 and recorded != self.base_sha256 and not self.allow_other_base:
            raise ValueError(f"this residual was trained on a base policy with SHA-256 {recorded[:16]}..., the "
                             f"base policy installed now ({self.cfg.base_policy or 'set_base_policy'}) has "
                             f"{self.base_sha256[:16]}...: a residual corrects the base it was trained on. Use "
                             f"that base, or pass --allow-other-base (allow_other_base=True) to go on with this one")
        nets.load_soft_actor_critic_state(self, state)
        self.rng.bit_generator.state = state["rng"]
        self.phase = str(state["phase"])
        for name in _COUNTERS:
            setattr(self, name, int(state["counters"][name]))
        per_env = state.get("per_env")
        if per_env is None:  # a checkpoint from before per-env state: one env, its episode scalars in counters
            c = state["counters"]
            per_env = {"episode_step": [c["episode_step"]], "probe_steps": [c["probe_steps"]],
                       "episode_index": [self.num_episodes]}
        for name in _PER_ENV:
            setattr(self, name, np.atleast_1d(np.asarray(per_env[name], np.int64)).copy())


_COUNTERS = ("num_critic_steps", "num_actor_steps", "num_pretrain_steps", "num_env_steps", "num_probe_steps",
             "num_episodes")
_PER_ENV = ("episode_step", "probe_steps", "episode_index")


@dataclass(frozen=True)
class TrainedResidual:
    """A trained residual as ``residual(obs, base_action) -> executed action`` (:meth:`ResidualSAC.combined_policy`)
    and the SHA-256 of the base it was trained on ("" when unknown)."""

    policy: Callable[[np.ndarray, np.ndarray], np.ndarray]
    base_sha256: str = ""

    def __call__(self, obs: np.ndarray, base_action: np.ndarray) -> np.ndarray:
        return self.policy(obs, base_action)


def load_residual(run_dir) -> TrainedResidual:
    """The trained residual of a finished ``residual_sac`` run directory (``config.json`` + ``agent_final/``) as
    ``residual(obs, base_action) -> executed action`` (:meth:`ResidualSAC.combined_policy`; deterministic, the
    run's final beta). The base policy is not loaded: the caller passes its actions; the callable's ``base_sha256``
    is the digest of the base the run trained on ("" when unknown), which ``relive.agents.distill.distill`` checks
    against the base it is given."""
    from relive.envs import env_spec, make_env  # (gymnasium, optional: imported only where an env is made)

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file() or not (run_dir / AGENT_FINAL / "MANIFEST.json").is_file():
        raise ValueError(f"{run_dir} is not a finished run directory (config.json and agent_final/ expected)")
    run = open_run_dir(run_dir)  # (no base policy is loaded here: nothing to trust)
    cfg = run.config
    if cfg.agent_kind != "residual_sac":
        raise ValueError(f"{run_dir} is a {cfg.agent_kind!r} run, not a residual_sac one")
    if not cfg.env.id:
        raise ValueError(f"{run_dir} trained without an environment (offline only): no env to roll its residual in")
    env = make_env(cfg.env.id, cfg.env.max_episode_steps)
    spec = env_spec(env)
    env.close()
    if isinstance(spec.obs_shape, dict):
        raise ValueError(f"{run_dir}: residual_sac needs flat Box observations, {cfg.env.id} has dict observations")
    agent = ResidualSAC(int(np.prod(spec.obs_shape)), spec.action_shape[0], spec.action_low, spec.action_high,
                        cfg.agent)
    state = run.final_agent_state()
    agent.load_state_dict(state)  # (no base installed: nothing to check here)
    return TrainedResidual(agent.combined_policy(), str(state.get("base_sha256", "")))
