"""SAC + ReF-ER: **our extension**, not in either paper. ReF-ER (Novati & Koumoutsakos, ICML 2019, arXiv 1807.05827)
was shown with DDPG, NAF and V-RACER; this applies its two rules to SAC (Haarnoja et al., arXiv 1812.05905), which
the paper says they allow: ReF-ER "can be applied to any off-policy RL method with parameterized policies" (Sec. 3),
Rules 1 and 2 "can be applied to most off-policy RL methods with parametric policies" (Sec. 4). Equation numbers:
ReF-ER's (Eq. 10-13) and SAC's (Eq. 3-18).

Acting stores the behaviour's *pre-squash* Gaussian (``mu_mean``, ``mu_std``: the actor's mean and std of u,
a = center + scale * tanh(u)). Then rho = pi(a|s) / mu(a|s) is the ratio of the pre-squash Gaussian densities
of u = atanh((a - center) / scale) (the tanh Jacobian cancels), log clipped to [-7, 7], and the KL between the
two squashed policies equals the KL between the pre-squash Gaussians.

``update(batch)`` = SAC's (``relive.agents.sac``) with, under a ReF-ER sampler's hints:
  0. learning rates (critic, actor; not the temperature's) times 1 / (1 + A t) (Eq. 13); rho and near/far per row;
  1. soft Q step: far rows masked (Rule 1): E[is_weight * near * (Q - y)^2];
  2. Polyak update of the target critics;
  3. policy step: E[beta * near * is_weight * (alpha log pi(a|s) - Q(s, a)) + (1 - beta) * KL(mu || pi)]
     (Rule 2, the KL on the pre-squash Gaussians over every covered row; the std is learned, so the KL keeps
     its variance terms);
  4. temperature step untouched (SAC Eq. 18; beta does not scale it, far rows still count).
Signals: SAC's ``td_error`` and ``log_likelihood``, and ``rho``; metric ``train/kl_behaviour`` (mean pre-squash
D_KL(mu_t || pi) of the replayed rows with a record, the ReF-ER paper's Fig. 2 measure).

Caveat (ours, not the paper's): SAC's actor loss re-samples actions, so masking it on far rows only uses rho as a
proxy for "this state came from a stale policy"; a high-entropy policy makes rho weakly discriminative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from relive.agents import networks as nets
from relive.agents import refer
from relive.agents.encoders import flat_obs
from relive.agents.sac import SAC, SACConfig
from relive.registry import register_agent
from relive.types import Acted, Batch, ColumnDecl, UpdateResult


@dataclass(frozen=True)
class SACReFERConfig(SACConfig):
    """SAC with ReF-ER's rules (our extension); SAC's fields and defaults, plus the rule switches."""

    refer_rule1: bool = True  # under ReF-ER: far rows contribute no gradient to the critic and the actor
    refer_rule2: bool = True  # under ReF-ER: actor loss beta * SAC loss + (1 - beta) * KL(mu || pi)
    kl_direction: str = "mu_pi"  # "mu_pi" (the ReF-ER paper) or "pi_mu" (smarties as built)

    def __post_init__(self):
        super().__post_init__()
        if self.kl_direction not in refer.KL_DIRECTIONS:
            raise ValueError(f"kl_direction must be one of {refer.KL_DIRECTIONS}, got {self.kl_direction!r}")


@register_agent("sac_refer", SACReFERConfig)
class SACReFER(SAC):
    """SAC whose update applies ReF-ER's Rules 1 and 2 when the batch carries ReF-ER hints (see the module)."""

    cfg: SACReFERConfig

    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high,
                 config: SACReFERConfig | None = None, seed: int = 0, device: str = "cpu", obs_spec=None):
        """``obs_spec`` (SAC.from_spec passes it for dict observations): taken as the concatenation of the keys;
        the CNN encoder (``agent.encoder``) is refused: acting and the recount read flat observations."""
        super().__init__(obs_dim, action_dim, action_low, action_high,
                         config if config is not None else SACReFERConfig(), seed, device, obs_spec)
        if self.obs_spec is not None:
            raise ValueError(f"sac_refer takes dict observations as the concatenation of their keys (agent.encoder = "
                             f"'flat'), not through the CNN encoder (agent.encoder = {self.cfg.encoder!r}); use sac, "
                             f"rlpd or calql for image observations")

    # -- acting: the pre-squash behaviour is stored with every row ---------------------------------------
    def stored_columns(self) -> tuple[ColumnDecl, ...]:
        a = (self.action_dim,)
        return (ColumnDecl("mu_mean", a, doc="behaviour's pre-squash Gaussian mean at collection; ReF-ER's mu_t"),
                ColumnDecl("mu_std", a, doc="behaviour's pre-squash Gaussian std; 0 = no record (offline rows)"))

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool):
        """SAC's action, plus ``record={"mu_mean", "mu_std"}`` (pre-squash) for a batch of observations."""
        o, single = nets.as_obs_tensor(obs, self.obs_dim, self.device)
        mean, log_std = self.actor(o)
        a, _ = self.actor.sample_from(mean, log_std, self.gen, deterministic=not explore)
        a = np.clip(a.cpu().numpy(), self.action_low, self.action_high)
        if single:
            return a[0]
        return Acted(a, record={"mu_mean": mean.cpu().numpy(), "mu_std": log_std.exp().cpu().numpy()})

    # -- ReF-ER ----------------------------------------------------------------------------------------
    def log_rho(self, mean, log_std, action, mu_mean, mu_std) -> torch.Tensor:
        """Clipped log pi(a|s) / mu(a|s) on the pre-squash Gaussians: [B]."""
        return refer.tanh_gaussian_log_rho(mean, log_std.exp(), mu_mean, mu_std, action, self.actor.center,
                                           self.actor.scale)

    @torch.no_grad()
    def refer_log_rho(self, obs, action, mu_mean, mu_std) -> np.ndarray:
        """The sampler's recount: clipped log rho of stored rows under the current actor: [n] NumPy."""
        o, a, m, s = (torch.as_tensor(np.asarray(x, np.float32), device=self.device)
                      for x in (flat_obs(obs), action, mu_mean, mu_std))
        mean, log_std = self.actor(o)
        return self.log_rho(mean, log_std, a, m, s).cpu().numpy()

    @torch.no_grad()
    def behaviour_kl(self, b: Batch, pre: tuple | None = None) -> dict[str, float]:
        """``{"train/kl_behaviour": mean D_KL(mu_t || pi)}`` (pre-squash) over rows with a behaviour record; ``pre``:
        the actor's (mean, log_std) of the batch if already computed."""
        if "mu_std" not in b.extras or not (has := (b.mu_std > 0).all(-1)).any():
            return {}
        mean, log_std = self.actor(b.obs) if pre is None else pre
        kl = refer.refer_kl(b.mu_mean[has], b.mu_std[has], mean[has], log_std[has].exp())
        return {"train/kl_behaviour": kl.mean().item()}

    # -- the update ------------------------------------------------------------------------------------
    def update(self, batch: Batch, update_actor: bool | None = None) -> UpdateResult:
        b = self._to_torch(batch)
        hints, w = b.info.hints, b.info.is_weight
        # 0. ReF-ER: annealed learning rates (Eq. 13) and the near/far split under the current policy (Sec. 3)
        with torch.no_grad():  # the policy before the step: rho, and the KL metric (Fig. 2), when rows have records
            pre = self.actor(b.obs) if "mu_std" in b.extras else None
        def log_rho(mu_std: torch.Tensor) -> torch.Tensor:
            assert pre is not None  # (batch_rows asks only for a batch with the behaviour columns: pre was computed)
            mean, log_std = pre
            return self.log_rho(mean, log_std, b.action, b.mu_mean, mu_std)

        covered, near, rho, mu_std = refer.batch_rows(b, log_rho, self.cfg.refer_rule1)
        kl_metric = self.behaviour_kl(b, pre)
        refer_on = "c_max" in hints
        beta = float(hints["beta"]) if refer_on and self.cfg.refer_rule2 else 1.0
        if "lr_scale" in hints:
            refer.set_lr(self.critic_opt, self.cfg.critic_lr * float(hints["lr_scale"]))
            refer.set_lr(self.actor_opt, self.cfg.actor_lr * float(hints["lr_scale"]))
        # 1. soft Q step (SAC Eq. 3, 5), far rows masked (Rule 1)
        y = self.critic_target(b.reward, b.next_obs, b.terminated, discount=self._discount(b))
        q = self.critic(b.obs, b.action)
        critic_loss = nets.weighted_mean(self.td_loss(q, y), w * near)
        if (w * near).any():
            nets.optimize(self.critic_opt, critic_loss)
        self.num_critic_steps += 1
        # 2. target critics
        nets.polyak(self.target_critic, self.critic, self.cfg.tau)
        metrics = {"train/critic_loss": critic_loss.item(), "train/q_mean": q.mean().item(),
                   "train/target_mean": y.mean().item()}
        # 3-4. policy: beta * SAC loss on near rows + (1 - beta) KL on all rows (Eq. 10-11); temperature as SAC
        log_likelihood = None
        if self.cfg.compute_log_likelihood:  # under the policy before its step, as SAC's signal
            with torch.no_grad():
                mean, log_std = pre or self.actor(b.obs)
                log_likelihood = self.actor.log_prob_from(mean, log_std, b.action).mean(-1)
        if update_actor if update_actor is not None else self.num_critic_steps % self.critic_steps_per_actor_step == 0:
            metrics |= self._refer_actor_step(b, near, covered, beta, mu_std)
        metrics |= kl_metric
        if refer_on:
            metrics |= {"train/refer_near_fraction": near.mean().item(), "train/refer_beta": beta}
        result = self._result(metrics, q, y, log_likelihood, batch)
        signals = dict(result.signals) | ({"rho": rho.cpu().numpy().astype(np.float64)} if refer_on else {})
        return UpdateResult(result.metrics, signals)

    def _refer_actor_step(self, b: Batch, near, covered, beta: float, mu_std) -> dict[str, float]:
        w = nets.is_weight_of(b)
        mean, log_std = self.actor(b.obs)
        self.critic.requires_grad_(False)
        per_sample, logp = self.actor_loss(b.obs, mean, log_std)
        loss = beta * near * w * per_sample
        metrics = {}
        if beta < 1.0:
            kl = refer.refer_kl(b.mu_mean, mu_std, mean, log_std.exp(), self.cfg.kl_direction) * covered
            loss = loss + (1.0 - beta) * kl
            metrics["train/refer_kl"] = kl.mean().item()
        actor_loss = loss.mean()
        if near.any() or beta < 1.0:
            nets.optimize(self.actor_opt, actor_loss)
        self.critic.requires_grad_(True)
        self.num_actor_steps += 1
        metrics |= {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item()}
        if self.cfg.learn_temperature:
            nets.optimize(self.alpha_opt, nets.weighted_mean(self.temperature_loss(logp), w))
        metrics["train/alpha"] = self.alpha.item()
        return metrics
