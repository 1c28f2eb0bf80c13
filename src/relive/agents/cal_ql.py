"""Cal-QL: calibrated conservative Q-learning for offline pre-training then online fine-tuning (Nakamoto et
al., NeurIPS 2023, arXiv 2303.05479), as SAC (``relive.agents.sac``) plus the calibrated CQL penalty.

Critic objective (Cal-QL Sec. 4, Alg. 1 l.3; CQL(H) with importance sampling, Kumar et al. 2020 Eq. 4 and
App. F), per member e and per sample:
    L_e = (Q_e(s, a) - y)^2 + alpha_cql * clip(CQL_ood_e - Q_e(s, a), clip_diff_min, clip_diff_max)
    CQL_ood_e = T logsumexp over 3n values / T of
        [Q_e(s, a_rand) - log U(a_rand),  Q~_e(s, a'_pi) - log pi(a'_pi|s'),  Q~_e(s, a_pi) - log pi(a_pi|s)]
    a_rand ~ U(action box), a_pi ~ pi(.|s), a'_pi ~ pi(.|s') (evaluated at s, as in the CQL reference code),
    Q~ = max(Q, V_mu(s)): the **calibration**. Only the policy actions' values are lower-bounded by the
    Monte-Carlo return-to-go of the stored trajectory (``batch.mc_return``); random and data actions are not.
With ``lagrange``, alpha' (learned, clipped to [0, 1e6]) scales alpha_cql (CQL_ood - Q - target_action_gap)
and ascends on it (CQL Eq. 5). Target: SAC's (subset-min), by default the max over n sampled next actions
(``max_target_backup``), no entropy in the backup (official Cal-QL defaults). The actor minimizes
alpha log pi - min_e Q_e as in SAC. ``update`` runs in Alg. 1's order: critic step, Lagrange step, Polyak,
actor step, temperature step.

**Online rows (documented default).** ``calibrate_online=True`` (official Cal-QL): calibration stays on
during fine-tuning and online rows are calibrated with their true discounted returns-to-go, which the trainer
writes into ``mc_return`` when their episode ends (``buffer.set_column``). Until then a row's bound should
say "unknown": a very low value such as ``np.finfo(np.float32).min`` (max(Q, bound) = Q; the storage refuses
NaN) -- a placeholder 0 would be a real, often wrong, lower bound. NaN is also read as "unknown" (never
max(Q, NaN)) for batches built outside the buffer. ``calibrate_online=False``
reproduces CORL (and the ARB code built on it): the calibration is switched off for every row once
``set_online(True)`` has been called at the offline -> online switch.

Example::

    buffer = ReplayBuffer(..., extra_columns={"mc_return": ()})   # returns-to-go of the offline data
    agent = CalQL(obs_dim, action_dim, low, high, CalQLConfig(cql_alpha=5.0), seed=0)
    for _ in range(num_offline_grad_steps):
        agent.update(buffer.sample(256))
    agent.set_online(True)                                         # then fine-tune online
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relive.agents import networks as nets
from relive.agents.sac import SAC, SACConfig
from relive.hooks import OnEpisodeEnd, OnPhase
from relive.registry import register_agent
from relive.replay.returns import write_returns_to_go
from relive.types import Batch, ColumnDecl, UpdateResult


@dataclass(frozen=True)
class CalQLConfig(SACConfig):
    """Cal-QL hyperparameters: SAC's plus the conservative penalty. Defaults follow the official Cal-QL code
    (``conservative_sac.py``: policy lr 1e-4, qf lr 3e-4, n = 10, importance sampling, max target backup,
    no backup entropy) with alpha_cql = 5 (its antmaze setting; CORL: 10 on locomotion, 1 on adroit)."""

    actor_lr: float = 1e-4  # official Cal-QL policy_lr (CORL locomotion: 3e-5)
    temp_lr: float = 1e-4  # official Cal-QL: the temperature uses policy_lr
    backup_entropy: bool = False  # official Cal-QL / CORL: no entropy term in the critic target
    cql_alpha: float = 5.0  # weight alpha_cql of the conservative penalty
    cql_n_actions: int = 10  # n sampled actions per kind (uniform, pi(s), pi(s')); also the max-backup samples
    cql_temp: float = 1.0  # temperature T of the logsumexp
    cql_importance_sample: bool = True  # subtract log densities (CQL(H) with IS); False: plain logsumexp incl. Q(s,a)
    clip_diff_min: float = -np.inf  # clip of CQL_ood - Q(s, a) (antmaze: -200)
    clip_diff_max: float = np.inf
    lagrange: bool = False  # learn alpha' so that the penalty's gap matches target_action_gap (antmaze)
    target_action_gap: float = 0.8  # Lagrange threshold (official antmaze scripts: 0.8)
    init_log_alpha_prime: float = 1.0  # initial log alpha' (official / CORL: Scalar(1.0))
    max_target_backup: bool = True  # target = max over cql_n_actions next actions of the subset-min
    calibrate: bool = True  # the Cal-QL lower bound max(Q, V_mu); False gives plain CQL
    calibrate_online: bool = True  # official Cal-QL; False = CORL: calibration off after set_online(True)

    def __post_init__(self):
        super().__post_init__()
        if self.cql_n_actions < 1 or self.cql_alpha < 0 or self.cql_temp <= 0:
            raise ValueError(f"need cql_n_actions >= 1, cql_alpha >= 0 and cql_temp > 0, got "
                             f"{self.cql_n_actions}, {self.cql_alpha}, {self.cql_temp}")
        if not self.clip_diff_min < self.clip_diff_max:
            raise ValueError(f"clip_diff_min must be below clip_diff_max, got {self.clip_diff_min}, "
                             f"{self.clip_diff_max}")


def cql_gap(q_rand: torch.Tensor, q_pi: torch.Tensor, q_next: torch.Tensor, q_data: torch.Tensor,
            mc_return: torch.Tensor, *, calibrate: bool, temp: float, clip_min: float, clip_max: float,
            importance_sample: bool = False, log_uniform=None, pi_logp=None,
            next_logp=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """clip(CQL_ood - Q(s, a), clip_min, clip_max) per member and sample, from the critic's values of the
    sampled actions, all evaluated at s: q_rand, q_pi, q_next [E, B, n] (uniform, pi(s), pi(s') actions),
    q_data [E, B] -> [E, B]. The policy values are calibrated by ``mc_return`` [B] when ``calibrate``. With
    ``importance_sample`` the log-densities ``log_uniform`` (scalar), ``pi_logp`` and ``next_logp`` [1, B, n]
    are subtracted (CQL(H) with IS); without, the logsumexp runs over the plain values and Q(s, a). The metrics
    are 0-d tensors (``relive.types.TensorMetrics`` converts them when read). Shared by :class:`CalQL` and the
    residual agent's critic pre-training (``relive.agents.residual_sac``)."""
    bound_rate = (q_pi < mc_return.view(1, -1, 1)).float().mean()  # NaN compares False
    if calibrate:  # Cal-QL: lower-bound the policy actions' values by V_mu(s)
        q_pi, q_next = CalQL.calibrated(q_pi, mc_return), CalQL.calibrated(q_next, mc_return)
    if importance_sample:
        cat = torch.cat([q_rand - log_uniform, q_next - next_logp, q_pi - pi_logp], dim=-1)
    else:
        cat = torch.cat([q_rand, q_data.unsqueeze(-1), q_next, q_pi], dim=-1)
    ood = torch.logsumexp(cat / temp, dim=-1) * temp  # [E, B]
    gap = (ood - q_data).clamp(clip_min, clip_max)
    return gap, {"train/cql_ood_mean": ood.detach().mean(), "train/cql_bound_rate": bound_rate}


@register_agent("calql", CalQLConfig)
class CalQL(SAC):
    """Cal-QL agent (see the module docstring). ``set_online(True)`` marks the offline -> online switch."""

    cfg: CalQLConfig

    # -- what it needs from the loop ---------------------------------------------------------------------
    def stored_columns(self) -> tuple[ColumnDecl, ...]:
        """``mc_return``: Monte-Carlo returns-to-go, the calibration bound V_mu(s). Dataset loaders compute it
        for offline rows; online rows hold ``fill`` until their episode ends (``loop_hooks``)."""
        return (ColumnDecl("mc_return", doc="Monte-Carlo return-to-go (Cal-QL's calibration bound)"),)

    def loop_hooks(self, ctx) -> list:
        """The offline -> online switch (``set_online``), and true returns-to-go of every finished online
        episode written into ``mc_return`` (official Cal-QL)."""
        return super().loop_hooks(ctx) + [
            OnPhase(lambda phase: self.set_online(phase == "online")),
            OnEpisodeEnd(lambda slots: write_returns_to_go(ctx.buffer, slots, ctx.gamma, "mc_return"))]

    def __init__(self, obs_dim, action_dim, action_low, action_high, config: CalQLConfig | None = None,
                 seed: int = 0, device: str = "cpu", obs_spec=None):
        config = config if config is not None else CalQLConfig()
        if not isinstance(config, CalQLConfig):
            raise ValueError(f"CalQL needs a CalQLConfig, got {type(config).__name__}")
        super().__init__(obs_dim, action_dim, action_low, action_high, config, seed, device, obs_spec)
        self.log_alpha_prime = torch.tensor(float(config.init_log_alpha_prime), device=self.device,
                                            requires_grad=True)
        self.alpha_prime_opt = nets.adam([self.log_alpha_prime], config.critic_lr)  # official: qf_lr
        self.online = False

    def set_online(self, online: bool = True) -> None:
        """Called by the trainer at the offline -> online switch (matters with ``calibrate_online=False``)."""
        self.online = bool(online)

    @property
    def calibrating(self) -> bool:
        return self.cfg.calibrate and (self.cfg.calibrate_online or not self.online)

    @property
    def alpha_prime(self) -> torch.Tensor:
        return self.log_alpha_prime.detach().exp().clamp(0.0, 1e6)

    # -- losses ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def critic_target(self, reward, next_obs, terminated, next_policy=None, discount=None) -> torch.Tensor:
        """SAC's target, or with ``max_target_backup`` the max over n next actions a'_k ~ pi(s') of the
        subset-min target value (CQL reference code's max backup). ``next_policy``: the actor's (mean, log_std)
        at s' ([B, A] each) when the caller already computed them."""
        if not self.cfg.max_target_backup:
            return super().critic_target(reward, next_obs, terminated, next_policy, discount)
        n, batch_size = self.cfg.cql_n_actions, next_obs.shape[0]
        next_rep = next_obs.repeat_interleave(n, dim=0)  # [B n, O]
        # pi(.|s') once per state, then repeated: the n rows of a state share it (n x fewer actor rows)
        mean, log_std = next_policy if next_policy is not None else self.actor(next_obs)
        next_a, next_logp = self.actor.sample_from(mean.repeat_interleave(n, dim=0),
                                                   log_std.repeat_interleave(n, dim=0), self.gen)
        v_next = self.target_value(next_rep, next_a).view(batch_size, n)
        best = v_next.argmax(dim=1, keepdim=True)
        v_next = v_next.gather(1, best).squeeze(1)
        if self.cfg.backup_entropy:
            v_next = v_next - self.alpha * next_logp.view(batch_size, n).gather(1, best).squeeze(1)
        if discount is None:
            discount = self.cfg.gamma * (1.0 - terminated)
        return reward + discount * v_next

    @staticmethod
    def calibrated(q_pi: torch.Tensor, mc_return: torch.Tensor) -> torch.Tensor:
        """Q~ = max(Q(s, a_pi), V_mu(s)), the Cal-QL lower bound; NaN returns-to-go (unknown) leave Q as is.
        q_pi [E, B, n], mc_return [B]."""
        bound = torch.nan_to_num(mc_return, nan=-torch.inf).view(1, -1, 1)
        return torch.maximum(q_pi, bound)

    @torch.no_grad()
    def ood_actions(self, b: Batch, policy=None, next_policy=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The penalty's 3n actions per sample, all to be evaluated at s, in the rows of ``obs_rep.repeat(3, 1)``
        (row i*n + k of each block belongs to sample i): n uniform actions in the box, n from pi(.|s), n from
        pi(.|s'); with the log-densities of the policy actions [B, n] each. No gradient (CQL reference code).
        ``policy`` / ``next_policy``: the actor's (mean, log_std) at s / s' ([B, A]) when already computed;
        every state's n actions share its forward pass. ([3 B n, A], pi_logp [B, n], next_logp [B, n])."""
        n, batch_size = self.cfg.cql_n_actions, b.obs.shape[0]
        u = torch.rand((batch_size * n, self.action_dim), generator=self.gen, device=self.device)
        rand_a = (2.0 * u - 1.0) * self.actor.scale + self.actor.center
        pi_a, pi_logp = self.actor.sample_from(*_repeat_rows(policy or self.actor(b.obs), n), self.gen)
        next_a, next_logp = self.actor.sample_from(*_repeat_rows(next_policy or self.actor(b.next_obs), n), self.gen)
        return torch.cat([rand_a, pi_a, next_a]), pi_logp.view(batch_size, n), next_logp.view(batch_size, n)

    def conservative_gap(self, b: Batch, q_data: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """clip(CQL_ood - Q(s, a)) per member and sample, with the calibrated policy values: [E, B]. (The update
        evaluates Q(s, a) and the sampled actions' values in one critic pass and calls :meth:`gap_from_values`.)"""
        ood_a, pi_logp, next_logp = self.ood_actions(b)
        obs_rep = b.obs.repeat_interleave(self.cfg.cql_n_actions, dim=0)  # [B n, O]
        q_ood = self.critic(obs_rep.repeat(3, 1), ood_a)  # one ensemble forward for the 3n actions of every sample
        return self.gap_from_values(b, q_data, q_ood, pi_logp, next_logp)

    def gap_from_values(self, b: Batch, q_data, q_ood, pi_logp, next_logp) -> tuple[torch.Tensor, dict]:
        """:func:`cql_gap` from Q(s, a) [E, B] and the values of :meth:`ood_actions` [E, 3 B n]."""
        cfg = self.cfg
        n, batch_size = cfg.cql_n_actions, b.obs.shape[0]
        q_rand, q_pi, q_next = q_ood.view(-1, 3, batch_size, n).unbind(1)  # each [E, B, n]
        log_uniform = -torch.log(2.0 * self.actor.scale).sum()  # log density of U(box) = log 0.5^|A| on [-1, 1]
        return cql_gap(q_rand, q_pi, q_next, q_data, b.mc_return, calibrate=self.calibrating, temp=cfg.cql_temp,
                       clip_min=cfg.clip_diff_min, clip_max=cfg.clip_diff_max,
                       importance_sample=cfg.cql_importance_sample, log_uniform=log_uniform,
                       pi_logp=pi_logp.view(1, batch_size, n), next_logp=next_logp.view(1, batch_size, n))

    # -- the update: SAC's (relive.agents.sac.SAC.update) with this critic step ------------------------------
    def update(self, batch: Batch, update_actor: bool | None = None) -> UpdateResult:
        """SAC's update (target, critic step, Polyak, policy and temperature: Cal-QL Alg. 1 l.3-4) whose critic
        step is :meth:`critic_step`: the TD loss plus the calibrated conservative penalty."""
        if "mc_return" not in batch.extras:
            raise ValueError("Cal-QL needs an 'mc_return' column (returns-to-go): build the buffer with "
                             "extra_columns={'mc_return': ()} and load the data with its returns-to-go")
        return super().update(batch, update_actor)

    @torch.no_grad()
    def _policy_before_step(self, b: Batch, update_actor: bool):
        """The policy before any step at s' and s, one forward pass over [s'; s] (the penalty's actions need both;
        the actor does not change before its own step)."""
        n = b.next_obs.shape[0]
        mean, log_std = self.actor(torch.cat([b.next_obs, b.obs]))
        return (mean[:n], log_std[:n]), (mean[n:], log_std[n:])

    def critic_step(self, b: Batch, y: torch.Tensor, policy=None, next_policy=None) -> tuple[dict, torch.Tensor]:
        """TD loss + alpha_cql (alpha') calibrated conservative gap, one critic step (Cal-QL Alg. 1 l.3), then with
        ``lagrange`` the dual step on alpha'. (metrics, Q(s, a) [E, B] before the step)."""
        cfg, w = self.cfg, nets.is_weight_of(b)
        n, batch_size = cfg.cql_n_actions, b.obs.shape[0]
        ood_a, pi_logp, next_logp = self.ood_actions(b, policy, next_policy)
        obs_rep = b.obs.repeat_interleave(n, dim=0)  # [B n, O]
        # Q(s, a) and the 3n sampled actions' values at s: one pass of the same critic ([E, B + 3 B n])
        q_all = self.critic(torch.cat([b.obs, obs_rep.repeat(3, 1)]), torch.cat([b.action, ood_a]))
        q, q_ood = q_all[:, :batch_size], q_all[:, batch_size:]  # [E, B], [E, 3 B n]
        gap, metrics = self.gap_from_values(b, q, q_ood, pi_logp, next_logp)
        if cfg.lagrange:  # alpha' alpha_cql (gap - target gap) (CQL Eq. 5)
            penalty = self.alpha_prime * cfg.cql_alpha * (gap - cfg.target_action_gap)
        else:
            penalty = cfg.cql_alpha * gap
        td = self.td_loss(q, y)
        critic_loss = nets.weighted_mean(td + penalty.mean(dim=0), w)
        nets.optimize(self.critic_opt, critic_loss)
        weighted_gap = nets.weighted_mean(gap.detach().mean(dim=0), w)
        if cfg.lagrange:  # Lagrange dual step: alpha' ascends on alpha_cql (gap - target gap)
            prime = self.log_alpha_prime.exp().clamp(0.0, 1e6)
            nets.optimize(self.alpha_prime_opt, -prime * cfg.cql_alpha * (weighted_gap - cfg.target_action_gap))
            metrics["train/alpha_prime"] = self.alpha_prime
        metrics |= {"train/critic_loss": critic_loss.detach(), "train/td_loss": nets.weighted_mean(td.detach(), w),
                    "train/cql_gap": weighted_gap, "train/q_mean": q.detach().mean(),
                    "train/target_mean": y.mean(), "train/calibrating": float(self.calibrating)}
        return metrics, q

    # -- state -----------------------------------------------------------------------------------------
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



def _repeat_rows(policy: tuple[torch.Tensor, torch.Tensor], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, log_std) [B, A] -> [B n, A]: row i*n + k is state i's (``repeat_interleave``)."""
    mean, log_std = policy
    return mean.repeat_interleave(n, dim=0), log_std.repeat_interleave(n, dim=0)
