"""Soft Actor-Critic with a critic ensemble, and the RLPD options as flags.

SAC: Haarnoja et al. 2018 (arXiv 1812.05905). RLPD: Ball et al. 2023 (arXiv 2302.02948): LayerNorm critics,
E = 10 members with targets from a random subset of 2 (REDQ, Chen et al. 2021), UTD 20, target entropy
-|A|/2, 50/50 symmetric replay (a replay setting: ``MixtureSampler``). ``SACConfig.rlpd()`` sets them.

``update(batch)`` in the paper's order: critic target (Eq. 3 / RLPD Alg. 1 l.7-9), critic regression,
Polyak target update, then actor (Eq. 7) and temperature (Eq. 18). Per-sample losses are multiplied by
``batch.info.is_weight``. Returned signals: ``td_error`` (mean over members of Q - y) and
``log_likelihood`` (log pi of the stored action, mean over dims), both of shape [B].
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from relive.agents import networks as nets
from relive.agents.scoring import log_prob_score, standardized_score
from relive.types import Batch, UpdateResult


@dataclass(frozen=True)
class SACConfig:
    hidden: tuple[int, ...] = (256, 256)  # actor and critic hidden layers
    num_qs: int = 2  # critic ensemble size E
    num_min_qs: int = 2  # target = min over a random subset of this many members (REDQ "M")
    critic_layer_norm: bool = False  # LayerNorm after every hidden critic layer (RLPD)
    gamma: float = 0.99
    tau: float = 0.005  # Polyak rate of the target critics
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    temp_lr: float = 3e-4
    init_temperature: float = 1.0
    learn_temperature: bool = True
    target_entropy: float | None = None  # explicit value; default -target_entropy_scale * |A|
    target_entropy_scale: float = 1.0  # SAC: 1 (-|A|); RLPD: 0.5 (-|A|/2)
    backup_entropy: bool = True  # subtract alpha log pi(a'|s') in the critic target
    utd_ratio: int = 1  # gradient steps per env step (read by the trainer)
    actor_every: int = 1  # actor + temperature step every this many critic steps (RLPD: once per env step)
    compute_log_likelihood: bool = True  # return log pi(stored action) as a signal (for ARB-style samplers)

    def __post_init__(self):
        if self.num_qs < 1 or not 1 <= self.num_min_qs <= self.num_qs:
            raise ValueError(f"need num_qs >= 1 and 1 <= num_min_qs <= num_qs, got {self.num_qs}, {self.num_min_qs}")
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError(f"tau must be in (0, 1] and gamma in [0, 1], got {self.tau}, {self.gamma}")
        if self.utd_ratio < 1 or self.actor_every < 1:
            raise ValueError("utd_ratio and actor_every must be >= 1")

    @classmethod
    def rlpd(cls, **overrides) -> SACConfig:
        """RLPD's defaults (Ball et al. 2023, Table/App. of hyperparameters; reference code's configs)."""
        base = dict(num_qs=10, num_min_qs=2, critic_layer_norm=True, utd_ratio=20, actor_every=20,
                    target_entropy_scale=0.5)
        return replace(cls(**base), **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


class SAC:
    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high, config: SACConfig | None = None,
                 seed: int = 0, device: str = "cpu"):
        self.cfg = cfg = config or SACConfig()
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.device = torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed))
        init_gen = torch.Generator().manual_seed(int(seed) + 1)
        with _seeded_init(init_gen):
            self.actor = nets.TanhGaussianActor(obs_dim, action_dim, cfg.hidden, action_low, action_high)
            self.critic = nets.EnsembleCritic(cfg.num_qs, obs_dim, action_dim, cfg.hidden, cfg.critic_layer_norm)
        self.actor.to(self.device)
        self.critic.to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(np.log(cfg.init_temperature), dtype=torch.float32, device=self.device,
                                      requires_grad=True)
        self.target_entropy = float(-cfg.target_entropy_scale * action_dim if cfg.target_entropy is None
                                    else cfg.target_entropy)
        self.actor_opt = nets.adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = nets.adam(self.critic.parameters(), cfg.critic_lr)
        self.alpha_opt = nets.adam([self.log_alpha], cfg.temp_lr)
        self.num_critic_steps = 0
        self.num_actor_steps = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    # -- acting ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        o = torch.as_tensor(np.asarray(obs, np.float32), device=self.device)
        squeeze = o.dim() == 1
        if squeeze:
            o = o.unsqueeze(0)
        a, _ = self.actor.sample(o, self.gen, deterministic=not explore)
        a = a.cpu().numpy()
        return a[0] if squeeze else a

    # -- learning --------------------------------------------------------------------------------------
    def critic_target(self, reward, next_obs, terminated) -> torch.Tensor:
        """y = r + gamma (1 - terminated) (min_{j in subset} Q'_j(s', a') - alpha log pi(a'|s')),
        a' ~ pi(s'); the subset has num_min_qs members drawn at random (REDQ Eq. 1; RLPD Alg. 1 l.8)."""
        with torch.no_grad():
            next_a, next_logp = self.actor.sample(next_obs, self.gen)
            tq = self.target_critic(next_obs, next_a)  # [E, B]
            if self.cfg.num_min_qs < self.cfg.num_qs:
                subset = torch.randperm(self.cfg.num_qs, generator=self.gen, device=self.device)[: self.cfg.num_min_qs]
                tq = tq[subset]
            tq = tq.min(dim=0).values
            if self.cfg.backup_entropy:
                tq = tq - self.alpha * next_logp
            return reward + self.cfg.gamma * (1.0 - terminated) * tq

    def critic_loss(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Importance-weighted squared TD error, mean over members and batch. Returns (loss, q, y)."""
        y = self.critic_target(b.reward, b.next_obs, b.terminated)
        q = self.critic(b.obs, b.action)  # [E, B]
        per_sample = ((q - y) ** 2).mean(dim=0)
        return (b.info.is_weight * per_sample).mean(), q, y

    def actor_loss(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """E[alpha log pi(a|s) - mean_e Q_e(s, a)], a ~ pi(s) (SAC Eq. 7; RLPD uses the ensemble mean)."""
        a, logp = self.actor.sample(b.obs, self.gen)
        q = self.critic(b.obs, a).mean(dim=0)
        return (b.info.is_weight * (self.alpha * logp - q)).mean(), logp

    def update(self, batch: Batch, update_actor: bool | None = None) -> UpdateResult:
        b = batch.to_torch(self.device)
        loss, q, y = self.critic_loss(b)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_opt.step()
        nets.polyak(self.target_critic, self.critic, self.cfg.tau)
        self.num_critic_steps += 1
        metrics = {"train/critic_loss": loss.item(), "train/q_mean": q.mean().item()}

        if update_actor is None:
            update_actor = self.num_critic_steps % self.cfg.actor_every == 0
        if update_actor:
            metrics.update(self._actor_and_temperature_step(b))
        signals = {"td_error": (q.detach().mean(dim=0) - y).cpu().numpy()}
        if self.cfg.compute_log_likelihood:
            with torch.no_grad():
                signals["log_likelihood"] = self.actor.log_prob(b.obs, b.action).mean(-1).cpu().numpy()
        return UpdateResult(metrics, signals)

    def _actor_and_temperature_step(self, b: Batch) -> dict[str, float]:
        for p in self.critic.parameters():
            p.requires_grad_(False)
        actor_loss, logp = self.actor_loss(b)
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        for p in self.critic.parameters():
            p.requires_grad_(True)
        self.num_actor_steps += 1
        out = {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item()}
        if self.cfg.learn_temperature:  # alpha (entropy - target), entropy = -E log pi (SAC Eq. 18)
            temp_loss = (b.info.is_weight * (-self.log_alpha.exp() * (logp.detach() + self.target_entropy))).mean()
            self.alpha_opt.zero_grad(set_to_none=True)
            temp_loss.backward()
            self.alpha_opt.step()
        out["train/alpha"] = self.alpha.item()
        return out

    # -- ARB scores ------------------------------------------------------------------------------------
    def score_fn(self, mode: str = "log_prob"):
        """``score_fn(obs, action) -> [N]`` per-row on-policyness of stored actions (see agents/scoring.py)."""
        if mode not in ("log_prob", "standardized"):
            raise ValueError(f"score mode must be 'log_prob' or 'standardized', got {mode!r}")

        @torch.no_grad()
        def score(obs: np.ndarray, action: np.ndarray) -> np.ndarray:
            o = torch.as_tensor(np.asarray(obs, np.float32), device=self.device)
            a = torch.as_tensor(np.asarray(action, np.float32), device=self.device)
            a = (a - self.actor.center) / self.actor.scale
            mean, log_std = self.actor(o)
            s = log_prob_score(mean, log_std, a) if mode == "log_prob" else standardized_score(mean, log_std.exp(), a)
            return s.cpu().numpy()

        return score

    # -- state -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "actor": nets.module_state(self.actor),
            "critic": nets.module_state(self.critic),
            "target_critic": nets.module_state(self.target_critic),
            "log_alpha": self.log_alpha.detach().cpu().numpy().copy(),
            "actor_opt": nets.optimizer_state(self.actor_opt),
            "critic_opt": nets.optimizer_state(self.critic_opt),
            "alpha_opt": nets.optimizer_state(self.alpha_opt),
            "generator": nets.generator_state(self.gen),
            "counters": {"num_critic_steps": self.num_critic_steps, "num_actor_steps": self.num_actor_steps},
        }

    def load_state_dict(self, state: dict) -> None:
        nets.load_module_state(self.actor, state["actor"])
        nets.load_module_state(self.critic, state["critic"])
        nets.load_module_state(self.target_critic, state["target_critic"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(np.asarray(state["log_alpha"])))
        nets.load_optimizer_state(self.actor_opt, state["actor_opt"])
        nets.load_optimizer_state(self.critic_opt, state["critic_opt"])
        nets.load_optimizer_state(self.alpha_opt, state["alpha_opt"])
        nets.load_generator_state(self.gen, state["generator"])
        self.num_critic_steps = int(state["counters"]["num_critic_steps"])
        self.num_actor_steps = int(state["counters"]["num_actor_steps"])


class _seeded_init:
    """Initialize parameters from a private generator (no global ``torch.manual_seed``)."""

    def __init__(self, gen: torch.Generator):
        self.gen = gen

    def __enter__(self):
        self._fork = torch.random.fork_rng(devices=[])
        self._fork.__enter__()
        torch.random.default_generator.set_state(self.gen.get_state())
        return self

    def __exit__(self, *exc):
        return self._fork.__exit__(*exc)
