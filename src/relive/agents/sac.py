"""Soft Actor-Critic with a batched critic ensemble; RLPD is a configuration of it.

SAC: Haarnoja et al., "Soft Actor-Critic Algorithms and Applications", arXiv 1812.05905 (equation numbers
below refer to it). RLPD: Ball et al., ICML 2023, arXiv 2302.02948: LayerNorm critics, an ensemble of E = 10
with targets from a random subset of 2 members (REDQ, Chen et al. 2021, arXiv 2101.05982), the actor on the
ensemble mean, UTD 20 with one actor step per env step, target entropy -|A|/2, 50/50 symmetric replay.
``SACConfig.rlpd()`` sets the agent's part; the replay part (``MixtureSampler``, 50/50) and the UTD loop
belong to the run configuration (``replay.name = "symmetric"``, ``schedule.utd_ratio``).

``update(batch)``, in the paper's order (SAC Alg. 1; RLPD Alg. 1 / ``sac_learner.update``):
  1. soft Q step: y = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - alpha log pi(a'|s')),
     or with ``n_step`` > 1 y = R^(n') + gamma^{n'} (1 - terminated) V(s_{t+n'}) (``batch.discount``),
     a' ~ pi(s'), Z a random subset of ``num_min_qs`` target members (Eq. 3, 5; REDQ Eq. 1), every member
     regressed on the same y, per-sample loss times ``batch.info.is_weight``;
  2. Polyak update of the target critics;
  3. policy step, every ``actor_every`` critic steps: E[alpha log pi(a|s) - Q(s, a)], a = f(eps; s), Q the
     min (SAC) or the mean (RLPD) over members (Eq. 8-9);
  4. temperature step: J(alpha) = E[-alpha (log pi(a|s) + target_entropy)] (Eq. 18).
``truncated`` never enters the target: time-limit ends bootstrap from the stored (true) next observation.

Returned signals, each of shape [B]: ``td_error`` = mean over members of Q_e(s, a) - y, and
``log_likelihood`` = log pi(a|s) of the stored action under the current policy, averaged over action
dimensions (tanh-corrected; for on-policyness-aware samplers).

Example::

    agent = SAC(obs_dim=11, action_dim=3, action_low=-np.ones(3), action_high=np.ones(3),
                config=SACConfig.rlpd(), seed=0)
    action = agent.act(obs[None], explore=True)            # [1, 3] float32 inside the box
    batch = buffer.sample(256)
    result = agent.update(batch)                           # UpdateResult(metrics, signals)
    buffer.update(batch.info, **result.signals)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from relive.agents import encoders as enc
from relive.agents import networks as nets
from relive.agents.encoders import flat_obs_batch, flat_obs_dim
from relive.agents.scoring import log_prob_score, standardized_score
from relive.registry import register_agent
from relive.types import Batch, TensorMetrics, UpdateResult

ACTOR_Q_REDUCTIONS = ("min", "mean")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile
ENCODERS = ("auto", "flat", "cnn")
ACTOR_ENCODERS = ("shared", "own")
RLPD_OFFLINE_FRACTION = 0.5  # RLPD's symmetric sampling: half of every minibatch offline (a replay setting:
#                              MixtureSampler(offline_fraction=...); presets read it from here)
SCORE_MODES = ("log_prob", "standardized")


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters. Defaults are SAC's (twin critics, min in target and actor, target entropy -|A|);
    ``SACConfig.rlpd()`` gives RLPD's."""

    hidden: tuple[int, ...] = (256, 256)  # hidden layer widths of the actor and of every critic
    num_qs: int = 2  # critic ensemble size E (all members evaluated in one batched module)
    num_min_qs: int = 2  # target = min over a random subset of this many target members (REDQ's M)
    critic_layer_norm: bool = False  # LayerNorm after every hidden critic layer (RLPD)
    actor_q_reduce: str = "min"  # how the actor reduces the members' Q(s, pi(s)): "min" (SAC) or "mean" (RLPD)
    init: str = "torch"  # parameter init: "torch" (nn.Linear default, as CleanRL/SB3) or "xavier" (RLPD)
    gamma: float = 0.99  # discount
    n_step: int = 1  # TD targets on n-step returns, which the buffer sums at sample time; 1: one-step
    tau: float = 0.005  # Polyak rate of the target critics (per critic step)
    actor_lr: float = 3e-4  # Adam learning rate of the actor
    critic_lr: float = 3e-4  # Adam learning rate of the critic ensemble
    temp_lr: float = 3e-4  # Adam learning rate of log(alpha)
    init_temperature: float = 1.0  # initial alpha
    learn_temperature: bool = True  # False: alpha stays at init_temperature
    target_entropy: float | None = None  # explicit target entropy; None: -target_entropy_scale * |A|
    target_entropy_scale: float = 1.0  # SAC: 1 (-|A|); RLPD: 0.5 (-|A|/2)
    backup_entropy: bool = True  # subtract alpha log pi(a'|s') in the critic target (RLPD: off for antmaze/adroit)
    actor_every: int = 1  # actor + temperature step every this many critic steps (a fixed count)
    # RLPD (ikostrikov/rlpd: each env step's utd_ratio critic minibatches, then one actor step) and HIL-SERL: one
    # actor + temperature step per env step, on the last of the critic steps that env step brings -- whatever the
    # UTD ratio (flag, --set, grid, preset or resume). The loop tells the agent the run's ratio (loop_hooks); in an
    # own loop call agent.follow_utd_ratio(utd). actor_every must then stay 1
    actor_per_env_step: bool = False
    compute_log_likelihood: bool = True  # return log pi(stored action | s) as a signal (on-policyness samplers)
    compile: bool = False  # torch.compile the critic ensembles: fuses LayerNorm / ReLU passes (10 LayerNorm
    #                        critics ~1.4x faster on CPU); slower for plain twin critics; first steps compile
    compile_mode: str = "default"  # torch.compile mode with compile=True: "reduce-overhead" replays CUDA graphs
    #                                on a GPU (launch overhead gone: small batches, large ensembles), "max-autotune"
    encoder: str = "auto"  # dict observations: "flat" (keys concatenated, relive.agents.encoders), "cnn" (a CNN
    #                        per image key, in the actor and in the critic; needs obs_spec at construction) or
    #                        "auto" (cnn when obs_spec has a uint8 [C, H, W] image key, else flat)
    encoder_feature_dim: int = 50  # "cnn": features per image key (DrQ / SAC-AE: 50)
    encoder_channels: int = 32  # "cnn": channels of every conv layer (DrQ: 32)
    encoder_layers: int = 4  # "cnn": 3x3 conv layers, the first of stride 2 (DrQ: 4)
    augment_pad: int = 0  # "cnn": DrQ random shift of the images by up to this many pixels (DrQ: 4); 0 = off
    actor_encoder: str = "shared"  # "cnn": "shared" = the actor reads the critic's conv layers with a stop-gradient
    #                                and has its own projection (DrQ); "own" = a separate CNN trained by the actor loss
    # dict observations: the keys the networks read (then concatenated in sorted order / encoded); (): every key.
    # Goal-conditioned tasks (sac_her): ("observation", "desired_goal"), the input of the HER paper's networks
    obs_keys: tuple[str, ...] = ()

    def __post_init__(self):
        if self.num_qs < 1 or not 1 <= self.num_min_qs <= self.num_qs:
            raise ValueError(f"need num_qs >= 1 and 1 <= num_min_qs <= num_qs, got num_qs={self.num_qs}, "
                             f"num_min_qs={self.num_min_qs}")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError(f"tau must be in (0, 1] and gamma in [0, 1], got tau={self.tau}, gamma={self.gamma}")
        if self.actor_every < 1:
            raise ValueError(f"actor_every must be >= 1, got {self.actor_every}")
        if self.actor_per_env_step and self.actor_every != 1:
            raise ValueError(f"actor_per_env_step (one actor step per env step) and actor_every = {self.actor_every} "
                             "(one per so many critic steps) say two things; set one of them")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.compile_mode!r}")
        if self.actor_q_reduce not in ACTOR_Q_REDUCTIONS:
            raise ValueError(f"actor_q_reduce must be one of {ACTOR_Q_REDUCTIONS}, got {self.actor_q_reduce!r}")
        if self.init not in nets.INIT_SCHEMES:
            raise ValueError(f"init must be one of {nets.INIT_SCHEMES}, got {self.init!r}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if self.init_temperature <= 0:
            raise ValueError(f"init_temperature must be > 0, got {self.init_temperature}")
        nets.check_n_step(self.n_step)
        enc.check_obs_keys(self.obs_keys)
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {self.encoder!r}")
        if self.actor_encoder not in ACTOR_ENCODERS:
            raise ValueError(f"actor_encoder must be one of {ACTOR_ENCODERS}, got {self.actor_encoder!r}")
        if self.encoder_channels < 1 or self.encoder_layers < 1:
            raise ValueError(f"need encoder_channels >= 1 and encoder_layers >= 1, got {self.encoder_channels}, "
                             f"{self.encoder_layers}")
        if self.encoder_feature_dim < 1 or self.augment_pad < 0:
            raise ValueError(f"need encoder_feature_dim >= 1 and augment_pad >= 0, got {self.encoder_feature_dim}, "
                             f"{self.augment_pad}")

    @classmethod
    def rlpd(cls, **overrides) -> SACConfig:
        """RLPD's defaults (Ball et al., ICML 2023, arXiv 2302.02948; ``configs/rlpd_config.py`` of ikostrikov/rlpd):
        E = 10, subset-min of 2, LayerNorm critics, actor on the ensemble mean, Xavier init, target entropy
        -|A|/2, one actor/temperature step per env step (``actor_per_env_step``: on the last of the env step's
        ``schedule.utd_ratio`` critic steps, as rlpd's ``update(batch, utd_ratio)``). For antmaze/adroit the reference
        commands also set ``backup_entropy=False`` (and antmaze ``num_min_qs=1``, hidden (256, 256, 256))."""
        base: dict[str, Any] = dict(num_qs=10, num_min_qs=2, critic_layer_norm=True, actor_q_reduce="mean",
                                    init="xavier", actor_per_env_step=True, target_entropy_scale=0.5)
        return replace(cls(**base), **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


@register_agent("sac", SACConfig)
class SAC:
    """SAC / RLPD agent (see the module docstring for the update and its equations)."""

    acting_modules = ("actor",)  # what a Ray collector's copy needs to act (relive.train.ray_collectors)
    actor: nets.TanhGaussianActor  # (encoder="cnn": an EncodedActor / EncodedCritic, their subclasses)
    critic: nets.EnsembleCritic

    @classmethod
    def from_spec(cls, spec, config, seed, device: str = "cpu"):
        """Build for an environment (``relive.envs.EnvSpec``); ``seed``: int or SeedSequence."""
        if spec.discrete:
            raise ValueError(f"{cls.__name__} needs a continuous action space; {spec.id} is discrete")
        if isinstance(spec.obs_shape, Mapping):  # dict observations (images, goals): concatenated, or a CNN
            obs_spec = enc.pick_keys(spec.obs_shape, config.obs_keys)
            if config.encoder == "flat" and enc.image_keys(obs_spec):
                raise ValueError(f"{spec.id} has image observations ({enc.image_keys(obs_spec)}); train with "
                                 f"agent.encoder = 'cnn' or 'auto' (concatenated pixels are not a useful MLP input)")
            return cls(flat_obs_dim(obs_spec), spec.action_shape[0], spec.action_low, spec.action_high, config,
                       seed=nets.seed_int(seed), device=device, obs_spec=obs_spec)
        if config.obs_keys:
            raise ValueError(f"agent.obs_keys {list(config.obs_keys)} selects keys of dict observations; {spec.id} "
                             f"has flat observations {spec.obs_shape}")
        return cls(int(np.prod(spec.obs_shape)), spec.action_shape[0], spec.action_low, spec.action_high, config,
                   seed=nets.seed_int(seed), device=device)

    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high, config: SACConfig | None = None,
                 seed: int = 0, device: str = "cpu", obs_spec=None):
        """``obs_spec``: with ``encoder="cnn"``, the dict observation's keys -> (shape, dtype) (or a storage's
        ``obs_spec``); ``obs_dim`` is then the encoder's output size (pass anything, e.g. 0)."""
        self.cfg = cfg = config if config is not None else SACConfig()
        self.obs_spec = enc.cnn_obs_spec(cfg.encoder, obs_spec)  # None: flat observations (dict keys concatenated)
        self.action_dim = int(action_dim)
        self.device = torch.device(device)
        self.action_low = np.asarray(action_low, np.float32).reshape(-1)
        self.action_high = np.asarray(action_high, np.float32).reshape(-1)
        init_gen = torch.Generator().manual_seed(int(seed))  # parameters (CPU: identical on every device)
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)  # exploration, targets, ...
        actor, critic = enc.actor_critic(int(obs_dim), action_dim, action_low, action_high, cfg, init_gen,
                                         self.obs_spec)
        # what the actor's and the critic's MLPs read: the observation, or the CNN encoder's features
        self.obs_dim = actor.encoder.out_dim if isinstance(actor, enc.EncodedActor) else int(obs_dim)
        self.actor, self.critic = actor.to(self.device), critic.to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        if cfg.compile:  # in place: parameter names (and checkpoints) stay the same
            self.critic.compile(mode=cfg.compile_mode)
            self.target_critic.compile(mode=cfg.compile_mode)
        self.log_alpha = torch.tensor(np.log(cfg.init_temperature), dtype=torch.float32, device=self.device,
                                      requires_grad=True)
        self.target_entropy = float(-cfg.target_entropy_scale * action_dim if cfg.target_entropy is None
                                    else cfg.target_entropy)
        self.actor_opt = nets.adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = nets.adam(self.critic.parameters(), cfg.critic_lr)
        self.alpha_opt = nets.adam([self.log_alpha], cfg.temp_lr)
        self.num_critic_steps = 0
        self.num_actor_steps = 0
        # critic steps per actor step: actor_every, or (actor_per_env_step) the run's UTD ratio once it is known
        self.critic_steps_per_actor_step = cfg.actor_every

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def follow_utd_ratio(self, utd_ratio: int) -> None:
        """``actor_per_env_step``: one actor step per ``utd_ratio`` critic steps (the critic steps of one env
        step); without the rule, a ValueError (actor_every says the count)."""
        if not self.cfg.actor_per_env_step:
            raise ValueError("follow_utd_ratio needs agent.actor_per_env_step = true (actor_every sets a fixed count)")
        if isinstance(utd_ratio, bool) or not isinstance(utd_ratio, int) or utd_ratio < 1:
            raise ValueError(f"utd_ratio must be an integer >= 1, got {utd_ratio!r}")
        self.critic_steps_per_actor_step = utd_ratio

    def loop_hooks(self, ctx) -> list:
        """With ``actor_per_env_step``: the run's gradient steps per env step (``schedule.utd_ratio``, or
        ``grad_steps_per_chunk / env_steps_per_chunk`` when the chunk's count is set) become the critic steps per
        actor step. Declares no hook."""
        if self.cfg.actor_per_env_step:
            s = ctx.config.schedule
            per_env_step = s.utd_ratio
            if s.grad_steps_per_chunk:
                per_env_step, rest = divmod(s.grad_steps_per_chunk, s.env_steps_per_chunk)
                if rest or not per_env_step:
                    raise ValueError(f"agent.actor_per_env_step needs a whole number of gradient steps per env step; "
                                     f"schedule.grad_steps_per_chunk {s.grad_steps_per_chunk} over env_steps_per_chunk "
                                     f"{s.env_steps_per_chunk} is not")
            self.follow_utd_ratio(per_env_step)
        return []

    # -- acting ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Actions [N, action_dim] float32 inside the box: a ~ pi(.|s) if ``explore``, else tanh(mu(s))."""
        o, single = self._obs_in(obs)
        a, _ = self.actor.sample(o, self.gen, deterministic=not explore)
        a = np.clip(a.cpu().numpy(), self.action_low, self.action_high)
        return a[0] if single else a

    # -- losses (pure given the generator state; unit-tested) ------------------------------------------
    def subset_min(self, target_q: torch.Tensor) -> torch.Tensor:
        """min over a random subset of ``num_min_qs`` members, drawn once per update (REDQ Eq. 1 / RLPD):
        [E, ...] -> [...]. (The reference formulation; the update uses :meth:`target_value`, which draws the
        same subset and evaluates only its members.)"""
        m, e = self.cfg.num_min_qs, self.cfg.num_qs
        if m < e:
            target_q = target_q[torch.randperm(e, generator=self.gen, device=self.device)[:m]]
        return target_q.min(dim=0).values

    def target_value(self, next_obs: torch.Tensor, next_a: torch.Tensor) -> torch.Tensor:
        """min_{j in Z} Q'_j(s', a') over a random subset Z of ``num_min_qs`` target members (REDQ Eq. 1 / RLPD):
        ``subset_min(target_critic(s', a'))`` with the same draw, but only the members of Z are evaluated
        (RLPD: 2 of 10): [B]."""
        m, e = self.cfg.num_min_qs, self.cfg.num_qs
        if m < e:
            members = torch.randperm(e, generator=self.gen, device=self.device)[:m]
            return self.target_critic(next_obs, next_a, members=members).min(dim=0).values
        return self.target_critic(next_obs, next_a).min(dim=0).values

    @torch.no_grad()
    def critic_target(self, reward: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor,
                      next_policy: tuple[torch.Tensor, torch.Tensor] | None = None, discount=None) -> torch.Tensor:
        """y = r + gamma (1 - terminated) (min_{j in Z} Q'_j(s', a') - [backup_entropy] alpha log pi(a'|s')),
        a' ~ pi(s') (SAC Eq. 3 and 5; RLPD Alg. 1). Only ``terminated`` stops the bootstrap: [B].
        ``next_policy``: the actor's (mean, log_std) at s' when the caller already computed them. ``discount``:
        an n-step batch's gamma^{n'} (1 - terminated) in place of gamma (1 - terminated)."""
        mean, log_std = next_policy or self.actor(next_obs)
        next_a, next_logp = self.actor.sample_from(mean, log_std, self.gen)
        v_next = self.target_value(next_obs, next_a)
        if self.cfg.backup_entropy:
            v_next = v_next - self.alpha * next_logp
        if discount is None:
            discount = self.cfg.gamma * (1.0 - terminated)
        return reward + discount * v_next

    @staticmethod
    def td_loss(q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Squared TD error averaged over members (SAC Eq. 5, RLPD: mean over the ensemble): [E, B] -> [B]."""
        return ((q - y) ** 2).mean(dim=0)

    def reduce_q(self, q: torch.Tensor) -> torch.Tensor:
        """The actor's value of its own action: min (SAC) or mean (RLPD) over members: [E, B] -> [B]."""
        return q.min(dim=0).values if self.cfg.actor_q_reduce == "min" else q.mean(dim=0)

    def actor_loss(self, obs: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor):
        """Per-sample alpha log pi(a|s) - Q(s, a), a = f(eps; s) reparameterized (SAC Eq. 8-9): ([B], log pi [B]).
        The critic must be frozen by the caller (its gradient is not wanted here)."""
        a, logp = self.actor.sample_from(mean, log_std, self.gen)
        return self.alpha * logp - self.reduce_q(self.critic(obs, a)), logp

    def temperature_loss(self, logp: torch.Tensor) -> torch.Tensor:
        """Per-sample -alpha (log pi(a|s) + target_entropy) (SAC Eq. 18): [B]."""
        return -self.log_alpha.exp() * (logp.detach() + self.target_entropy)

    # -- the update ------------------------------------------------------------------------------------
    def update(self, batch: Batch, update_actor: bool | None = None) -> UpdateResult:
        """One critic step and, every ``actor_every`` critic steps (or when ``update_actor`` says so), one
        actor and temperature step."""
        b = self._to_torch(batch)
        update_actor = self._actor_due(update_actor)
        next_policy, policy = self._policy_before_step(b, update_actor)

        # 1. soft Q step (Eq. 3, 5): all members regress on the same subset-min target
        y = self.critic_target(b.reward, b.next_obs, b.terminated, next_policy, self._discount(b))
        metrics, q = self.critic_step(b, y, policy, next_policy)
        self.num_critic_steps += 1
        # 2. target critics (Polyak averaging, SAC Alg. 1)
        nets.polyak(self.target_critic, self.critic, self.cfg.tau)
        # 3-4. policy (Eq. 9) and temperature (Eq. 18)
        actor_metrics, log_likelihood = self._actor_steps(b, update_actor, None if update_actor else policy)
        return self._result(metrics | actor_metrics, q, y, log_likelihood, batch)

    def critic_step(self, b: Batch, y: torch.Tensor, policy=None, next_policy=None) -> tuple[dict, torch.Tensor]:
        """The critic's loss on a torch batch with targets ``y`` [B] and its optimizer step: SAC's weighted TD
        regression (Eq. 5). Returns (metrics, Q(s, a) [E, B] before the step). ``policy`` / ``next_policy``: the
        actor's (mean, log_std) at s / s' before any step, where :meth:`_policy_before_step` computed them (a
        variant's penalty may use them: Cal-QL overrides this method with its calibrated conservative gap)."""
        q = self.critic(b.obs, b.action)  # [E, B]
        critic_loss = nets.weighted_mean(self.td_loss(q, y), nets.is_weight_of(b))
        nets.optimize(self.critic_opt, critic_loss)
        return {"train/critic_loss": critic_loss.detach(), "train/q_mean": q.detach().mean(),
                "train/target_mean": y.mean()}, q

    def _discount(self, b: Batch):
        """The batch's n-step discount (None: one-step, gamma (1 - terminated)); see ``nets.td_discount``."""
        return nets.td_discount(b, self.cfg.n_step, type(self).__name__)

    def _actor_due(self, update_actor: bool | None) -> bool:
        """Whether this update (the ``num_critic_steps + 1``-th critic step) also steps the actor."""
        if update_actor is None:
            return (self.num_critic_steps + 1) % self.critic_steps_per_actor_step == 0
        return bool(update_actor)

    @torch.no_grad()
    def _policy_before_step(self, b: Batch, update_actor: bool):
        """The actor's (mean, log_std) at s' for the target and, when the actor does not step in this update but
        the ``log_likelihood`` signal is wanted, at s too: one forward pass over [s'; s] (the actor does not
        change during the critic step, so both are the policy before any step). ((mean, log_std) at s', at s
        or None.)"""
        if update_actor or not self.cfg.compute_log_likelihood:
            return self.actor(b.next_obs), None
        n = b.next_obs.shape[0]
        mean, log_std = self.actor(torch.cat([b.next_obs, b.obs]))
        return (mean[:n], log_std[:n]), (mean[n:], log_std[n:])

    def _actor_steps(self, b: Batch, update_actor: bool | None, policy=None) -> tuple[dict, torch.Tensor | None]:
        """Policy and temperature steps when due. Also returns the ``log_likelihood`` signal, computed from the
        same forward pass when the actor steps (so always under the policy before its step); ``policy``: the
        actor's (mean, log_std) at s when already computed (without gradient; only when the actor does not
        step)."""
        if update_actor is None:  # called after the critic step's count
            update_actor = self.num_critic_steps % self.critic_steps_per_actor_step == 0
        log_likelihood = None
        if not update_actor:
            if self.cfg.compute_log_likelihood:
                with torch.no_grad():
                    mean, log_std = policy if policy is not None else self.actor(b.obs)
                    log_likelihood = self.actor.log_prob_from(mean, log_std, b.action).mean(-1)
            return {}, log_likelihood
        w = nets.is_weight_of(b)
        mean, log_std = self.actor(b.obs)
        if self.cfg.compute_log_likelihood:
            with torch.no_grad():
                log_likelihood = self.actor.log_prob_from(mean, log_std, b.action).mean(-1)
        self.critic.requires_grad_(False)
        per_sample, logp = self.actor_loss(b.obs, mean, log_std)
        actor_loss = nets.weighted_mean(per_sample, w)
        nets.optimize(self.actor_opt, actor_loss)
        self.critic.requires_grad_(True)
        self.num_actor_steps += 1
        logp = logp.detach()
        metrics = {"train/actor_loss": actor_loss.detach(), "train/entropy": -logp.mean()}
        if self.cfg.learn_temperature:
            self._temperature_step(logp, w)
        metrics["train/alpha"] = self.alpha
        return metrics, log_likelihood

    def _temperature_step(self, logp: torch.Tensor, is_weight: torch.Tensor) -> None:
        """One Adam step on J(alpha) = mean_i w_i temperature_loss_i (Eq. 18), with its gradient in log alpha
        written out: d/d log alpha [-alpha (log pi_i + H)] = -alpha (log pi_i + H), so the gradient is
        -alpha mean_i w_i (log pi_i + H) (one scalar: an autograd pass would cost more than the arithmetic)."""
        with torch.no_grad():
            self.log_alpha.grad = -self.log_alpha.exp() * (is_weight * (logp + self.target_entropy)).mean()
        if isinstance(self.alpha_opt, nets.LeanAdam) and self.alpha_opt.fused_step():
            return
        self.alpha_opt.step()

    @staticmethod
    def _result(metrics: dict, q: torch.Tensor, y: torch.Tensor, log_likelihood: torch.Tensor | None,
                batch: Batch) -> UpdateResult:
        """Metrics stay tensors until read (:class:`~relive.types.TensorMetrics`: one conversion for all of them
        when the trainer logs, no ``.item()`` per step); signals are NumPy arrays, or tensors on the device for a
        batch from a device buffer (``nets.signals_out``)."""
        return UpdateResult(TensorMetrics(metrics), nets.signals_out(batch, td_error=q.mean(dim=0) - y,
                                                                     log_likelihood=log_likelihood))

    def _obs_in(self, obs):
        """Observations for the networks: a [N, obs_dim] tensor (flat, or dict keys concatenated), or with
        ``encoder="cnn"`` a DictObs of tensors (a batch: [N, ...] per key); only ``obs_keys`` of a dict."""
        obs = enc.pick_keys(obs, self.cfg.obs_keys)
        if self.obs_spec is None:
            return nets.as_obs_tensor(obs, self.obs_dim, self.device)
        return enc.obs_to_torch(obs, self.device, list(self.obs_spec)), False

    def _to_torch(self, batch: Batch) -> Batch:
        batch = enc.pick_batch_keys(batch, self.cfg.obs_keys)  # the keys the networks read (goal tasks)
        if self.obs_spec is not None:  # encoder="cnn": dict observations as tensors, images shifted (DrQ)
            b = batch.to_torch(self.device, dtype=torch.float32)
            obs, next_obs = (enc.obs_to_torch(o, self.device, list(self.obs_spec)) for o in (b.obs, b.next_obs))
            if self.cfg.augment_pad:
                assert isinstance(self.actor, enc.EncodedActor)  # (obs_spec: the CNN encoder's actor)
                for o in (obs, next_obs):
                    for k in self.actor.encoder.image_keys:
                        o[k] = enc.random_shift(o[k], self.cfg.augment_pad, self.gen)
            return replace(b, obs=obs, next_obs=next_obs)
        batch = flat_obs_batch(batch)  # dict observations: keys concatenated (the encoder seam)
        if batch.obs.ndim != 2 or batch.obs.shape[1] != self.obs_dim:
            raise ValueError(f"batch.obs must have shape [B, {self.obs_dim}], got {tuple(batch.obs.shape)}")
        if batch.action.ndim != 2 or batch.action.shape[1] != self.action_dim:
            raise ValueError(f"batch.action must have shape [B, {self.action_dim}], got "
                             f"{tuple(batch.action.shape)}")
        return batch.to_torch(self.device, dtype=torch.float32)

    # -- ARB scores ------------------------------------------------------------------------------------
    def score_fn(self, mode: str = "standardized"):
        """``score(obs [N, obs_dim], action [N, action_dim]) -> [N]``: per-row on-policyness of stored
        actions under the current policy, for a sampler's refresh (see ``agents/scoring.py``):
        ``"standardized"`` (the default, as in the trainer config) = the ARB reference code's score,
        ``"log_prob"`` = mean over dims of log pi(a|s)."""
        if mode not in SCORE_MODES:
            raise ValueError(f"score mode must be one of {SCORE_MODES}, got {mode!r}")

        @torch.no_grad()
        def score(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
            o, _ = self._obs_in(obs)
            a = torch.as_tensor(np.asarray(action, np.float32), device=self.device).reshape(-1, self.action_dim)
            a = (a - self.actor.center) / self.actor.scale  # the scores take actions in [-1, 1]
            mean, log_std = self.actor(o)
            if mode == "log_prob":
                s = log_prob_score(mean, log_std, a)
            else:
                s = standardized_score(mean, log_std.exp(), a)
            return s.cpu().numpy()

        return score

    # -- state -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Parameters, target parameters, log alpha, optimizer states, RNG and counters (NumPy / JSON)."""
        return nets.soft_actor_critic_state(self) | {
            "counters": {"num_critic_steps": self.num_critic_steps, "num_actor_steps": self.num_actor_steps}}

    def load_state_dict(self, state: dict) -> None:
        nets.load_soft_actor_critic_state(self, state)
        self.num_critic_steps = int(state["counters"]["num_critic_steps"])
        self.num_actor_steps = int(state["counters"]["num_actor_steps"])

