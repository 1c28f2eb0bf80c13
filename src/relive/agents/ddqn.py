"""Double DQN (van Hasselt, Guez, Silver, AAAI 2016, arXiv 1509.06461) in the setting the ReaPER paper uses
(seed 003, App. D: RL Zoo hyperparameters on CartPole / Acrobot / LunarLander).

``update(batch)``:
  1. target (Double DQN Eq. 4): y = r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)):
     the online net *selects* the next action, the target net *evaluates* it (DQN would take
     max_a Q_target(s', a));
  2. per-sample Huber loss of Q_online(s, a) - y, multiplied by ``batch.info.is_weight`` (PER Alg. 1 l.12),
     one Adam step with the gradient norm clipped (RL Zoo: 10);
  3. hard target copy every ``target_update_period`` gradient steps.
Exploration is epsilon-greedy with epsilon decaying linearly from ``eps_start`` to ``eps_end`` over
``eps_decay_steps`` exploring env steps (an ``act`` call for N envs is N of them). Signal: ``td_error`` [B].
Several seeds of one configuration train as one batched agent in :mod:`relive.agents.ddqn_batched`.

Example::

    agent = DDQN(obs_dim=4, num_actions=2, config=DDQNConfig(lr=2.3e-3, target_update_period=10), seed=0)
    a = agent.act(obs[None], explore=True)          # int64 [1]
    result = agent.update(buffer.sample(64))        # metrics, {"td_error": [64]}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from relive.agents import networks as nets
from relive.agents.ddqn_batched import BatchedDDQN
from relive.agents.encoders import flat_obs_batch
from relive.registry import register_agent
from relive.types import Batch, TensorMetrics, UpdateResult


@dataclass(frozen=True)
class DDQNConfig:
    """Double DQN hyperparameters (defaults: RL Zoo's LunarLander-like setting, hidden 256x256)."""

    hidden: tuple[int, ...] = (256, 256)  # hidden layer widths of the Q-network
    lr: float = 1e-3  # Adam learning rate (RL Zoo: CartPole 2.3e-3, Acrobot / LunarLander 6.3e-4)
    gamma: float = 0.99  # discount
    n_step: int = 1  # TD targets on n-step returns, which the buffer sums at sample time; 1: one-step
    target_update_period: int = 500  # gradient steps between hard target copies (Zoo: CartPole 10, others 250)
    huber_delta: float = 1.0  # Huber loss threshold (SB3 DQN: smooth L1 with delta 1)
    eps_start: float = 1.0  # initial exploration rate
    eps_end: float = 0.05  # final exploration rate (Zoo: CartPole 0.04, Acrobot / LunarLander 0.1)
    eps_decay_steps: int = 10_000  # exploring act() calls of the linear epsilon schedule (Zoo: fraction x budget)
    max_grad_norm: float | None = 10.0  # gradient-norm clip (Zoo: 10); None: no clipping
    init: str = "torch"  # parameter init: "torch" (nn.Linear default, as SB3) or "xavier"

    def __post_init__(self):
        if self.target_update_period < 1 or self.eps_decay_steps < 0 or not 0 <= self.eps_end <= self.eps_start <= 1:
            raise ValueError("need target_update_period >= 1, eps_decay_steps >= 0, 0 <= eps_end <= eps_start <= 1, "
                             f"got {self.target_update_period}, {self.eps_decay_steps}, {self.eps_end}, "
                             f"{self.eps_start}")
        if self.huber_delta <= 0 or (self.max_grad_norm is not None and self.max_grad_norm <= 0):
            raise ValueError("need huber_delta > 0 and max_grad_norm > 0 (or None)")
        if self.init not in nets.INIT_SCHEMES:
            raise ValueError(f"init must be one of {nets.INIT_SCHEMES}, got {self.init!r}")
        nets.check_n_step(self.n_step)

    def to_dict(self) -> dict:
        return asdict(self)


@register_agent("ddqn", DDQNConfig)
class DDQN:
    """Double DQN agent for discrete actions (see the module docstring)."""

    seed_batcher = BatchedDDQN  # S seeds' agents updated as one (relive.train.seed_batch: relive train --seeds)
    acting_modules = ("q",)  # what a Ray collector's copy needs to act (relive.train.ray_collectors)
    acting_clock = "num_act_steps"  # the exploring env steps epsilon follows (N per act call with N envs, as SB3's
    # and CleanRL's total-timestep schedules); with Ray collectors the learner keeps it at its env steps received
    # and the copies get it with the weights

    @classmethod
    def from_spec(cls, spec, config, seed, device: str = "cpu"):
        """Build for an environment (``relive.envs.EnvSpec``); ``seed``: int or SeedSequence."""
        if not spec.discrete:
            raise ValueError(f"ddqn needs a discrete action space; {spec.id} has a continuous one")
        return cls(nets.vector_obs_dim(spec, "DDQN"), spec.num_actions, config, seed=nets.seed_int(seed),
                   device=device)

    def __init__(self, obs_dim: int, num_actions: int, config: DDQNConfig | None = None, seed: int = 0,
                 device: str = "cpu"):
        self.cfg = cfg = config if config is not None else DDQNConfig()
        if int(num_actions) < 2:
            raise ValueError(f"num_actions must be >= 2, got {num_actions}")
        self.obs_dim, self.num_actions = int(obs_dim), int(num_actions)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)  # epsilon-greedy draws
        with nets.private_rng():
            q = nets.mlp(obs_dim, cfg.hidden, num_actions)
            target_q = nets.mlp(obs_dim, cfg.hidden, num_actions)
        self.q = nets.init_(q, torch.Generator().manual_seed(int(seed)), cfg.init).to(self.device)
        self.target_q = target_q.to(self.device).requires_grad_(False)
        self.target_q.load_state_dict(self.q.state_dict())
        self.opt = nets.adam(self.q.parameters(), cfg.lr)
        self.num_updates = 0
        self.num_act_steps = 0

    @property
    def epsilon(self) -> float:
        c = self.cfg
        frac = 1.0 if c.eps_decay_steps == 0 else min(1.0, self.num_act_steps / c.eps_decay_steps)
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """int64 actions [N]: greedy in Q_online, or epsilon-greedy (and N schedule steps, one per env) if explore."""
        o, single = nets.as_obs_tensor(obs, self.obs_dim, self.device)
        action = self.q(o).argmax(dim=-1).cpu().numpy().astype(np.int64)
        if explore:
            action = self.explore(action)
        return action[0] if single else action

    def explore(self, greedy: np.ndarray) -> np.ndarray:
        """Epsilon-greedy on the greedy actions [N] (each replaced by a uniform action with probability epsilon),
        and N steps of epsilon's schedule (env steps: with N envs one call is N steps)."""
        eps = self.epsilon
        self.num_act_steps += greedy.shape[0]
        random = self.rng.random(greedy.shape[0]) < eps
        greedy[random] = self.rng.integers(0, self.num_actions, int(random.sum()))
        return greedy

    @torch.no_grad()
    def target(self, reward: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor,
               discount=None) -> torch.Tensor:
        """y = r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)) (Double DQN Eq. 4): [B].
        ``discount``: an n-step batch's gamma^{n'} (1 - terminated) (``reward`` its n-step return)."""
        next_a = self.q(next_obs).argmax(dim=-1, keepdim=True)  # the online net selects ...
        next_q = self.target_q(next_obs).gather(1, next_a).squeeze(1)  # ... the target net evaluates
        if discount is None:
            discount = self.cfg.gamma * (1.0 - terminated)
        return reward + discount * next_q

    def loss(self, b: Batch, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample Huber loss of Q(s, a) - y: ([B], Q(s, a) [B])."""
        q = self.q(b.obs).gather(1, b.action.long().view(-1, 1)).squeeze(1)
        return F.huber_loss(q, y, reduction="none", delta=self.cfg.huber_delta), q

    def update(self, batch: Batch) -> UpdateResult:
        batch = flat_obs_batch(batch)  # dict observations: keys concatenated (the encoder seam)
        if batch.obs.ndim != 2 or batch.obs.shape[1] != self.obs_dim:
            raise ValueError(f"batch.obs must have shape [B, {self.obs_dim}], got {tuple(batch.obs.shape)}")
        if batch.action.ndim != 1:
            raise ValueError(f"batch.action must hold integer actions of shape [B], got {tuple(batch.action.shape)}")
        b = batch.to_torch(self.device, dtype=torch.float32)
        # 1. Double DQN target (Eq. 4)
        y = self.target(b.reward, b.next_obs, b.terminated, nets.td_discount(b, self.cfg.n_step, "DDQN"))
        # 2. importance-weighted Huber loss, one Adam step
        per_sample, q = self.loss(b, y)
        loss = nets.weighted_mean(per_sample, b.info.is_weight)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self.num_updates += 1
        # 3. hard target update
        if self.num_updates % self.cfg.target_update_period == 0:
            self.target_q.load_state_dict(self.q.state_dict())
        return UpdateResult(TensorMetrics({"train/loss": loss.detach(), "train/q_mean": q.detach().mean(),
                                           "train/epsilon": self.epsilon}), nets.signals_out(batch, td_error=q - y))

    def state_dict(self) -> dict:
        return {"q": nets.module_state(self.q), "target_q": nets.module_state(self.target_q),
                "opt": nets.optimizer_state(self.opt), "rng": self.rng.bit_generator.state,
                "counters": {"num_updates": self.num_updates, "num_act_steps": self.num_act_steps}}

    def load_state_dict(self, state: dict) -> None:
        nets.load_module_state(self.q, state["q"])
        nets.load_module_state(self.target_q, state["target_q"])
        nets.load_optimizer_state(self.opt, state["opt"])
        self.rng.bit_generator.state = state["rng"]
        self.num_updates = int(state["counters"]["num_updates"])
        self.num_act_steps = int(state["counters"]["num_act_steps"])
