"""Double DQN (van Hasselt et al., AAAI 2016, arXiv 1509.06461) in the setting ReaPER uses (seed 003).

Target (Eq. 4 of the paper): y = r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)):
the online net selects the next action, the target net evaluates it. Huber loss per sample, weighted by
``batch.info.is_weight``; hard target update every ``target_update_period`` gradient steps; epsilon-greedy
exploration with a linear schedule over acting calls.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from relive.agents import networks as nets
from relive.agents.sac import _seeded_init
from relive.types import Batch, UpdateResult


@dataclass(frozen=True)
class DDQNConfig:
    hidden: tuple[int, ...] = (256, 256)
    lr: float = 1e-3
    gamma: float = 0.99
    target_update_period: int = 500  # gradient steps between hard target copies
    huber_delta: float = 1.0
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int = 10_000  # acting steps of the linear epsilon schedule
    max_grad_norm: float | None = 10.0
    utd_ratio: int = 1

    def __post_init__(self):
        if self.target_update_period < 1 or self.eps_decay_steps < 0 or not 0 <= self.eps_end <= self.eps_start <= 1:
            raise ValueError("need target_update_period >= 1, eps_decay_steps >= 0, 0 <= eps_end <= eps_start <= 1")

    def to_dict(self) -> dict:
        return asdict(self)


class DDQN:
    def __init__(self, obs_dim: int, num_actions: int, config: DDQNConfig | None = None, seed: int = 0,
                 device: str = "cpu"):
        self.cfg = cfg = config or DDQNConfig()
        self.num_actions = int(num_actions)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        with _seeded_init(torch.Generator().manual_seed(int(seed) + 1)):
            self.q = nets.mlp(obs_dim, cfg.hidden, num_actions).to(self.device)
        self.target_q = nets.mlp(obs_dim, cfg.hidden, num_actions).to(self.device).requires_grad_(False)
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
        o = torch.as_tensor(np.asarray(obs, np.float32), device=self.device)
        squeeze = o.dim() == 1
        o = o.unsqueeze(0) if squeeze else o
        greedy = self.q(o).argmax(dim=-1).cpu().numpy().astype(np.int64)
        if explore:
            eps = self.epsilon
            self.num_act_steps += 1
            random = self.rng.random(greedy.shape[0]) < eps
            greedy[random] = self.rng.integers(0, self.num_actions, int(random.sum()))
        return greedy[0] if squeeze else greedy

    def target(self, reward, next_obs, terminated) -> torch.Tensor:
        with torch.no_grad():
            next_a = self.q(next_obs).argmax(dim=-1, keepdim=True)  # online net selects
            next_q = self.target_q(next_obs).gather(1, next_a).squeeze(1)  # target net evaluates
            return reward + self.cfg.gamma * (1.0 - terminated) * next_q

    def update(self, batch: Batch) -> UpdateResult:
        b = batch.to_torch(self.device)
        y = self.target(b.reward, b.next_obs, b.terminated)
        q = self.q(b.obs).gather(1, b.action.long().view(-1, 1)).squeeze(1)
        per_sample = F.huber_loss(q, y, reduction="none", delta=self.cfg.huber_delta)
        loss = (b.info.is_weight * per_sample).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self.num_updates += 1
        if self.num_updates % self.cfg.target_update_period == 0:
            self.target_q.load_state_dict(self.q.state_dict())
        td = (q.detach() - y).cpu().numpy()
        return UpdateResult({"train/loss": loss.item(), "train/q_mean": q.mean().item(),
                             "train/epsilon": self.epsilon}, {"td_error": td})

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
