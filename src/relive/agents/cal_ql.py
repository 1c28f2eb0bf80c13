"""Cal-QL: calibrated conservative Q-learning for offline pre-training and online fine-tuning
(Nakamoto et al., NeurIPS 2023, arXiv 2303.05479), on top of the SAC agent of this package.

Critic loss per member (Eq. 4 / Alg. 1 of the paper; official code's CQL(H) with importance sampling):
    L = MSE(Q(s,a), y) + alpha * clip(CQL_ood - Q(s,a), clip_diff_min, clip_diff_max)
    CQL_ood = T * logsumexp over 3n values / T of
        [Q(s, a_rand) - log 0.5^|A|,  Q~(s, a'_pi) - log pi(a'_pi|s'),  Q~(s, a_pi) - log pi(a_pi|s)]
    Q~ = max(Q, V_mu(s)): policy actions' values lower-bounded by the Monte-Carlo return-to-go of the
    stored trajectory (``batch.mc_return``) -- the calibration; random actions are not calibrated.
Optional Lagrange alpha (target action gap). Target: SAC's, optionally the max over n sampled next actions
(``max_target_backup``); backup entropy off by default (official Cal-QL).

Online rows: by default calibration stays on online and the trainer fills ``mc_return`` of online rows when
their episode ends (the official Cal-QL). ``calibrate_online=False`` reproduces CORL, which switches the
calibration off at the offline->online switch (and stores mc_return = 0 online).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from relive.agents import networks as nets
from relive.agents.sac import SAC, SACConfig
from relive.types import Batch


@dataclass(frozen=True)
class CalQLConfig(SACConfig):
    backup_entropy: bool = False
    cql_alpha: float = 5.0  # weight of the conservative regularizer
    cql_n_actions: int = 10  # n sampled actions per kind (uniform, pi(s), pi(s'))
    cql_temp: float = 1.0
    clip_diff_min: float = -np.inf
    clip_diff_max: float = np.inf
    lagrange: bool = False  # learn alpha' so that the gap matches target_action_gap
    target_action_gap: float = 0.8
    max_target_backup: bool = False  # target = max over n sampled next actions of the subset-min
    calibrate: bool = True  # the Cal-QL lower bound; False gives plain CQL
    calibrate_online: bool = True  # official Cal-QL; False = CORL's switch-off at the online phase

    def __post_init__(self):
        super().__post_init__()
        if self.cql_n_actions < 1 or self.cql_alpha < 0 or self.cql_temp <= 0:
            raise ValueError("cql_n_actions >= 1, cql_alpha >= 0 and cql_temp > 0 are required")


class CalQL(SAC):
    def __init__(self, obs_dim, action_dim, action_low, action_high, config: CalQLConfig | None = None,
                 seed: int = 0, device: str = "cpu"):
        super().__init__(obs_dim, action_dim, action_low, action_high, config or CalQLConfig(), seed, device)
        self.log_alpha_prime = torch.zeros((), device=self.device, requires_grad=True)
        self.alpha_prime_opt = nets.adam([self.log_alpha_prime], self.cfg.critic_lr)
        self.online = False  # set by the trainer at the offline -> online switch

    def set_online(self, online: bool = True) -> None:
        self.online = online

    @property
    def calibrating(self) -> bool:
        return self.cfg.calibrate and (self.cfg.calibrate_online or not self.online)

    def critic_target(self, reward, next_obs, terminated) -> torch.Tensor:
        if not self.cfg.max_target_backup:
            return super().critic_target(reward, next_obs, terminated)
        with torch.no_grad():  # max over n next actions of the subset-min target (CQL's max backup)
            n, B = self.cfg.cql_n_actions, next_obs.shape[0]
            rep = next_obs.repeat_interleave(n, dim=0)
            a, logp = self.actor.sample(rep, self.gen)
            tq = self.target_critic(rep, a)
            if self.cfg.num_min_qs < self.cfg.num_qs:
                tq = tq[torch.randperm(self.cfg.num_qs, generator=self.gen, device=self.device)[: self.cfg.num_min_qs]]
            tq = tq.min(dim=0).values.view(B, n)
            idx = tq.argmax(dim=1, keepdim=True)
            tq = tq.gather(1, idx).squeeze(1)
            if self.cfg.backup_entropy:
                tq = tq - self.alpha * logp.view(B, n).gather(1, idx).squeeze(1)
            return reward + self.cfg.gamma * (1.0 - terminated) * tq

    def conservative_penalty(self, b: Batch, q_data: torch.Tensor) -> torch.Tensor:
        """Per-member, per-sample clip(CQL_ood - Q(s, a)) of Eq. 4 with the calibrated policy values: [E, B]."""
        cfg = self.cfg
        n, B, A = cfg.cql_n_actions, b.obs.shape[0], self.action_dim
        obs_rep = b.obs.repeat_interleave(n, dim=0)
        next_rep = b.next_obs.repeat_interleave(n, dim=0)
        u = torch.rand((B * n, A), generator=self.gen, device=self.device) * 2 - 1
        rand_a = u * self.actor.scale + self.actor.center
        with torch.no_grad():
            pi_a, pi_logp = self.actor.sample(obs_rep, self.gen)
            next_a, next_logp = self.actor.sample(next_rep, self.gen)
        E = cfg.num_qs
        q_rand = self.critic(obs_rep, rand_a).view(E, B, n)
        q_pi = self.critic(obs_rep, pi_a).view(E, B, n)
        q_next = self.critic(obs_rep, next_a).view(E, B, n)  # next-state actions evaluated at s (CQL ref.)
        if self.calibrating:  # Q~ = max(Q, V_mu(s)), the calibration (Eq. 4)
            v_mu = b.mc_return.view(1, B, 1)
            q_pi = torch.maximum(q_pi, v_mu)
            q_next = torch.maximum(q_next, v_mu)
        log_uniform = A * math.log(0.5) - torch.log(self.actor.scale).sum()  # density of U(box)
        cat = torch.cat([q_rand - log_uniform, q_next - next_logp.view(1, B, n), q_pi - pi_logp.view(1, B, n)], -1)
        ood = torch.logsumexp(cat / cfg.cql_temp, dim=-1) * cfg.cql_temp  # [E, B]
        return (ood - q_data).clamp(cfg.clip_diff_min, cfg.clip_diff_max)

    def critic_loss(self, b: Batch):
        y = self.critic_target(b.reward, b.next_obs, b.terminated)
        q = self.critic(b.obs, b.action)  # [E, B]
        gap = self.conservative_penalty(b, q)
        if self.cfg.lagrange:  # alpha' cql_alpha (gap - target_gap), alpha' = exp(log alpha') in [0, 1e6]
            alpha_prime = self.log_alpha_prime.detach().exp().clamp(0.0, 1e6)
            penalty = alpha_prime * self.cfg.cql_alpha * (gap - self.cfg.target_action_gap)
        else:
            penalty = self.cfg.cql_alpha * gap
        per_sample = ((q - y) ** 2 + penalty).mean(dim=0)
        self._last_gap = (gap.detach().mean(dim=0) * b.info.is_weight).mean()
        return (b.info.is_weight * per_sample).mean(), q, y

    def update(self, batch: Batch, update_actor: bool | None = None):
        if "mc_return" not in batch.extras:
            raise ValueError("Cal-QL needs an 'mc_return' column: build the buffer with "
                             "extra_columns={'mc_return': ()} and load data with returns-to-go")
        result = super().update(batch, update_actor)
        if self.cfg.lagrange:  # alpha' ascends on its term (dual step on the target action gap)
            prime_loss = -(self.log_alpha_prime.exp().clamp(0.0, 1e6) * self.cfg.cql_alpha
                           * (self._last_gap - self.cfg.target_action_gap))
            self.alpha_prime_opt.zero_grad(set_to_none=True)
            prime_loss.backward()
            self.alpha_prime_opt.step()
        metrics = dict(result.metrics) | {"train/cql_gap": self._last_gap.item(),
                                          "train/calibrating": float(self.calibrating)}
        if self.cfg.lagrange:
            metrics["train/alpha_prime"] = self.log_alpha_prime.exp().item()
        return type(result)(metrics, result.signals)

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "log_alpha_prime": self.log_alpha_prime.detach().cpu().numpy().copy(),
            "alpha_prime_opt": nets.optimizer_state(self.alpha_prime_opt),
            "online": self.online,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha_prime.copy_(torch.as_tensor(np.asarray(state["log_alpha_prime"])))
        nets.load_optimizer_state(self.alpha_prime_opt, state["alpha_prime_opt"])
        self.online = bool(state["online"])
