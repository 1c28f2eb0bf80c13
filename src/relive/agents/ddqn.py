"""Double DQN (van Hasselt, Guez, Silver, AAAI 2016, arXiv 1509.06461) in the setting the ReaPER paper uses
(seed 003, App. D: RL Zoo hyperparameters on CartPole / Acrobot / LunarLander).

``update(batch)``:
  1. target (Double DQN Eq. 4): y = r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)):
     the online net *selects* the next action, the target net *evaluates* it (DQN would take
     max_a Q_target(s', a));
  2. per-sample Huber loss of Q_online(s, a) - y, multiplied by ``batch.info.is_weight`` (PER Alg. 1 l.12),
     one Adam step with the gradient norm clipped (RL Zoo: 10);
  3. hard target copy every ``target_update_period`` gradient steps.
Right after a copy the target net holds the online weights (``target_update_period = 1``: at every update, as the
Atari-100k preset), so step 1's target forward would repeat the online forward of s' bit for bit: it is reused
(the same numbers, one Nature-CNN forward of the batch fewer; ``DDQN.target_synced``, from the tensors' version
counters, so any write to either net -- an optimizer step, a load, a user's edit in place -- turns it off).
Rewards are clipped to their sign in step 1 with ``clip_reward`` (Mnih et al. 2015: Atari; one-step rows only, as an
n-step return is a sum of rewards that were not clipped). Exploration is epsilon-greedy with epsilon decaying
linearly from ``eps_start`` to ``eps_end`` over ``eps_decay_steps`` exploring env steps (an ``act`` call for N envs
is N of them). Signal: ``td_error`` [B].
Evaluation acts greedily, or epsilon-greedily with ``eval_epsilon`` (Atari: 0.001, ReaPER App. D; from a
generator of its own, so evaluations leave the training draws as they were).
Several seeds of one configuration train as one batched agent in :mod:`relive.agents.ddqn_batched` (MLP, Adam).

Images (``agent.encoder``): a flat observation of shape [C, H, W] and dtype uint8 (Atari frame stacks, scaled to
[0, 1] on the device) or bool (MinAtar's planes) goes through an image Q-network of
:mod:`relive.agents.encoders` -- ``"nature"`` (Mnih et al. 2015) or ``"minatar"`` (Young & Tian 2019); ``"auto"``
picks by size (the Nature CNN from 36 pixels a side); ``"mlp"``: ``hidden`` over the flattened observation.

Example::

    agent = DDQN(obs_dim=4, num_actions=2, config=DDQNConfig(lr=2.3e-3, target_update_period=10), seed=0)
    a = agent.act(obs[None], explore=True)          # int64 [1]
    result = agent.update(buffer.sample(64))        # metrics, {"td_error": [64]}
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from relive.agents import encoders as enc
from relive.agents import networks as nets
from relive.agents.ddqn_batched import BatchedDDQN
from relive.agents.encoders import flat_obs_batch
from relive.agents.optimizers import FloorSqrtAdam, FloorSqrtRMSprop
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
    # images [C, H, W] (uint8 / bool): "auto" (nature from 36 pixels a side, else minatar), "nature" (Mnih et al.
    # 2015), "minatar" (Young & Tian 2019), or "mlp" (hidden over the flattened image); vectors: the MLP
    encoder: str = "auto"
    optimizer: str = "adam"  # "adam" or "rmsprop" (torch's RMSprop: the DQN papers' optimizer)
    optimizer_eps: float | None = None  # the optimizer's epsilon; None: torch's default (1e-8)
    rmsprop_alpha: float = 0.99  # RMSprop's squared-gradient decay (torch's default; DQN: 0.95)
    rmsprop_momentum: float = 0.0  # RMSprop's momentum
    rmsprop_centered: bool = False  # centered RMSprop (Graves 2013: DQN's)
    clip_reward: bool = False  # learn from sign(reward) (Atari, Mnih et al. 2015); needs n_step = 1
    eval_epsilon: float = 0.0  # epsilon of evaluation episodes (act with explore=False); 0: greedy
    # speed options that change the numbers by float rounding only (off: the presets' numbers, bit for bit):
    fused_adam: bool = False  # Adam's fused kernel at any optimizer_eps (the default epsilon has it already): a ~3x
    # faster step on a CPU (1.7M Nature-CNN weights: 8.3 -> 2.7 ms), ~1e-9 from torch's default Adam after 20 steps
    channels_last: bool = False  # image Q-networks in channels-last memory (oneDNN's faster convolutions on a CPU:
    # forward + backward of a Nature-CNN batch of 32 ~1.4x faster; outputs ~1e-8 from the default layout's)

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
        if self.encoder not in (*DDQN_ENCODERS, *enc.IMAGE_Q_NETS):
            raise ValueError(f"encoder must be one of {(*DDQN_ENCODERS, *enc.IMAGE_Q_NETS)}, got {self.encoder!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if (self.optimizer_eps is not None and not self.optimizer_eps > 0) or not 0 <= self.rmsprop_alpha < 1 \
                or self.rmsprop_momentum < 0 or not 0 <= self.eval_epsilon <= 1:
            raise ValueError("need optimizer_eps > 0 (or None), 0 <= rmsprop_alpha < 1, rmsprop_momentum >= 0 and "
                             f"0 <= eval_epsilon <= 1, got {self.optimizer_eps}, {self.rmsprop_alpha}, "
                             f"{self.rmsprop_momentum}, {self.eval_epsilon}")
        if self.fused_adam and self.optimizer != "adam":
            raise ValueError(f"fused_adam is Adam's fused kernel; optimizer = {self.optimizer!r}")
        if self.clip_reward and self.n_step > 1:
            raise ValueError(f"clip_reward clips one-step rewards; with n_step = {self.n_step} the batch holds n-step "
                             "returns (sums of rewards that were not clipped): use n_step = 1 with clip_reward")

    def to_dict(self) -> dict:
        return asdict(self)


DDQN_ENCODERS = ("auto", "mlp")  # and the image Q-networks (encoders.IMAGE_Q_NETS)
OPTIMIZERS = ("adam", "rmsprop")


def build_optimizer(params, cfg: DDQNConfig) -> torch.optim.Optimizer:
    """The Q-network's optimizer: Adam (the fused one at torch's default epsilon) or RMSprop; RMSprop and the unfused
    Adam as torch computes them, with the CPU's square roots of zero moments off its slow path (relive.agents.
    optimizers: bit-identical steps)."""
    params = list(params)
    if cfg.optimizer == "rmsprop":
        return FloorSqrtRMSprop(params, lr=cfg.lr, alpha=cfg.rmsprop_alpha, eps=cfg.optimizer_eps or 1e-8,
                                momentum=cfg.rmsprop_momentum, centered=cfg.rmsprop_centered)
    if cfg.optimizer_eps is None:
        return nets.adam(params, cfg.lr)
    if cfg.fused_adam:  # (the fused kernel at this epsilon: float rounding away from the default Adam's steps)
        return nets.LeanAdam(params, lr=cfg.lr, eps=cfg.optimizer_eps, fused=True)
    return FloorSqrtAdam(params, lr=cfg.lr, eps=cfg.optimizer_eps)


def image_net_name(cfg: DDQNConfig, obs_shape, obs_dtype) -> str | None:
    """The image Q-network an observation of this shape and dtype gets (None: the MLP)."""
    if cfg.encoder == "mlp":
        return None
    if not enc.is_image_shape(obs_shape, obs_dtype):
        if cfg.encoder != "auto":
            raise ValueError(f"agent.encoder = {cfg.encoder!r} reads images [C, H, W] of uint8 or bool; the "
                             f"observations are {np.dtype(obs_dtype)} of shape {tuple(obs_shape)}")
        return None
    return enc.image_q_net_name(tuple(obs_shape)) if cfg.encoder == "auto" else cfg.encoder


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
        obs_dim = nets.vector_obs_dim(spec, "DDQN")
        dtype = getattr(spec, "obs_dtype", np.float32)
        image = (tuple(spec.obs_shape), dtype) if image_net_name(config, spec.obs_shape, dtype) else None
        return cls(obs_dim, spec.num_actions, config, seed=nets.seed_int(seed), device=device, image=image)

    def __init__(self, obs_dim: int, num_actions: int, config: DDQNConfig | None = None, seed: int = 0,
                 device: str = "cpu", image: tuple | None = None):
        """``image``: ``(shape, dtype)`` of image observations [C, H, W] (uint8 or bool) for an image Q-network
        (``config.encoder``); None: the MLP over ``obs_dim`` features."""
        self.cfg = cfg = config if config is not None else DDQNConfig()
        if int(num_actions) < 2:
            raise ValueError(f"num_actions must be >= 2, got {num_actions}")
        self.obs_dim, self.num_actions = int(obs_dim), int(num_actions)
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)  # epsilon-greedy draws
        self.eval_rng = np.random.default_rng([int(seed), 1])  # evaluation's epsilon-greedy draws (eval_epsilon)
        self.image_shape = None
        gen = torch.Generator().manual_seed(int(seed))
        name = image_net_name(cfg, *image) if image is not None else None
        self.image_net = name  # which image Q-network (relive.agents.encoders); None: the MLP
        if image is not None and name is not None:  # an image Q-network (the target a copy of it)
            self.image_shape = tuple(int(d) for d in image[0])
            self.image_dtype = np.dtype(image[1])
            self.q = enc.image_q_net(name, self.image_shape, self.image_dtype, num_actions, gen).to(self.device)
            if cfg.channels_last:  # (the conv weights; oneDNN then runs the convolutions channels-last)
                with torch.no_grad():
                    for w in self.q.parameters():
                        if w.dim() == 4:
                            w.data = w.data.contiguous(memory_format=torch.channels_last)
            self.target_q = copy.deepcopy(self.q).requires_grad_(False)
        else:
            with nets.private_rng():
                q = nets.mlp(obs_dim, cfg.hidden, num_actions)
                target_q = nets.mlp(obs_dim, cfg.hidden, num_actions)
            self.q = nets.init_(q, gen, cfg.init).to(self.device)
            self.target_q = target_q.to(self.device).requires_grad_(False)
        self.target_q.load_state_dict(self.q.state_dict())
        self.opt = build_optimizer(self.q.parameters(), cfg)
        self.num_updates = 0
        self.num_act_steps = 0
        # the weights' version stamps when the target net last held the online weights bit for bit (a copy, or a
        # load that found them equal); while no tensor of either net has been replaced or written in place since
        # (torch bumps a tensor's version on every in-place write: an optimizer step, copy_, load_state_dict, a
        # user's edit), the target forward is the online one (reused). None: not known to be the same.
        self._synced_at: tuple | None = self._weights_version()

    @torch.no_grad()
    def copy_target(self) -> None:
        """The hard target update: the online weights into the target net, in place (``copy_``, no new tensors)."""
        for t, s in zip((*self.target_q.parameters(), *self.target_q.buffers()),
                        (*self.q.parameters(), *self.q.buffers()), strict=True):
            t.copy_(s)
        self._synced_at = self._weights_version()

    def _weights_version(self) -> tuple:
        """Which tensors both nets hold and how often each was written: (id, version) of every parameter and buffer."""
        return tuple((id(t), t._version) for net in (self.q, self.target_q)
                     for t in (*net.parameters(), *net.buffers()))

    @property
    def target_synced(self) -> bool:
        """Whether the target net holds the online weights bit for bit, as far as the version stamps tell: True from
        a target copy until either net's weights are written (an optimizer step, a load, an edit in place)."""
        return self._synced_at is not None and self._synced_at == self._weights_version()

    @target_synced.setter
    def target_synced(self, value: bool) -> None:  # (True: the caller knows the two nets are equal now)
        self._synced_at = self._weights_version() if value else None

    @property
    def epsilon(self) -> float:
        c = self.cfg
        frac = 1.0 if c.eps_decay_steps == 0 else min(1.0, self.num_act_steps / c.eps_decay_steps)
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """int64 actions [N]: greedy in Q_online, or epsilon-greedy (and N schedule steps, one per env) if explore."""
        o, single = self.obs_tensor(obs)
        action = self.q(o).argmax(dim=-1).cpu().numpy().astype(np.int64)
        if explore:
            action = self.explore(action)
        elif self.cfg.eval_epsilon > 0:
            random = self.eval_rng.random(action.shape[0]) < self.cfg.eval_epsilon
            action[random] = self.eval_rng.integers(0, self.num_actions, int(random.sum()))
        return action[0] if single else action

    def obs_tensor(self, obs) -> tuple[torch.Tensor, bool]:
        """Observations as the Q-network's input: [N, obs_dim] float32, or images [N, C, H, W] in their own dtype
        (uint8 / bool: scaled by the network on the device); a single observation flagged (``act`` returns one)."""
        if self.image_shape is None:
            return nets.as_obs_tensor(obs, self.obs_dim, self.device)
        o = torch.as_tensor(np.asarray(obs, dtype=self.image_dtype), device=self.device)
        single = o.dim() == len(self.image_shape)
        if single:
            o = o.unsqueeze(0)
        if tuple(o.shape[1:]) != self.image_shape:
            raise ValueError(f"obs must have shape [N, {', '.join(map(str, self.image_shape))}], got "
                             f"{tuple(np.shape(obs))}")
        return o, single

    def explore(self, greedy: np.ndarray) -> np.ndarray:
        """Epsilon-greedy on the greedy actions [N] (each replaced by a uniform action with probability epsilon),
        and N steps of epsilon's schedule (env steps: with N envs one call is N steps)."""
        eps = self.epsilon
        n = int(greedy.shape[0])
        self.num_act_steps += n
        random = self.rng.random(n) < eps
        greedy[random] = self.rng.integers(0, self.num_actions, int(random.sum()))
        return greedy

    @torch.no_grad()
    def target(self, reward: torch.Tensor, next_obs: torch.Tensor, terminated: torch.Tensor,
               discount=None) -> torch.Tensor:
        """y = r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)) (Double DQN Eq. 4): [B].
        ``discount``: an n-step batch's gamma^{n'} (1 - terminated) (``reward`` its n-step return)."""
        online = self.q(next_obs)
        next_a = online.argmax(dim=-1, keepdim=True)  # the online net selects ...
        # ... the target net evaluates (its forward is the online one while it holds the same weights: reused)
        evaluated = online if self.target_synced else self.target_q(next_obs)
        next_q = evaluated.gather(1, next_a).squeeze(1)
        if discount is None:
            discount = self.cfg.gamma * (1.0 - terminated)
        return reward + discount * next_q

    def loss(self, b: Batch, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample Huber loss of Q(s, a) - y: ([B], Q(s, a) [B])."""
        q = self.q(b.obs).gather(1, b.action.long().view(-1, 1)).squeeze(1)
        return F.huber_loss(q, y, reduction="none", delta=self.cfg.huber_delta), q

    def update(self, batch: Batch) -> UpdateResult:
        batch = flat_obs_batch(batch)  # dict observations: keys concatenated (the encoder seam)
        expected = (self.obs_dim,) if self.image_shape is None else self.image_shape
        if tuple(batch.obs.shape[1:]) != expected:
            raise ValueError(f"batch.obs must have shape [B, {', '.join(map(str, expected))}], got "
                             f"{tuple(batch.obs.shape)}")
        if batch.action.ndim != 1:
            raise ValueError(f"batch.action must hold integer actions of shape [B], got {tuple(batch.action.shape)}")
        b = self.batch_to_torch(batch)
        # 1. Double DQN target (Eq. 4), on sign(r) with clip_reward
        reward = torch.sign(b.reward) if self.cfg.clip_reward else b.reward
        y = self.target(reward, b.next_obs, b.terminated, nets.td_discount(b, self.cfg.n_step, "DDQN"))
        # 2. importance-weighted Huber loss, one Adam step
        per_sample, q = self.loss(b, y)
        loss = nets.weighted_mean(per_sample, nets.is_weight_of(b))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.max_grad_norm)
        self.opt.step()
        self._synced_at = None  # (the online weights moved; said outright: a fused step bumps no version counter)
        self.num_updates += 1
        # 3. hard target update
        if self.num_updates % self.cfg.target_update_period == 0:
            self.copy_target()
        return UpdateResult(TensorMetrics({"train/loss": loss.detach(), "train/q_mean": q.detach().mean(),
                                           "train/epsilon": self.epsilon}), nets.signals_out(batch, td_error=q - y))

    def batch_to_torch(self, batch: Batch) -> Batch:
        """The batch on the device, float columns float32; image observations keep their dtype (uint8 frames travel
        as bytes, the network scales them there); integer or bool vectors (an MLP's input) become float32."""
        b = batch.to_torch(self.device, dtype=torch.float32)
        if self.image_shape is None and not b.obs.is_floating_point():
            b = replace(b, obs=b.obs.float(), next_obs=b.next_obs.float())
        return b

    def state_dict(self) -> dict:
        return {"q": nets.module_state(self.q), "target_q": nets.module_state(self.target_q),
                "opt": nets.optimizer_state(self.opt), "rng": self.rng.bit_generator.state,
                "eval_rng": self.eval_rng.bit_generator.state,
                "counters": {"num_updates": self.num_updates, "num_act_steps": self.num_act_steps}}

    def load_state_dict(self, state: dict) -> None:
        nets.load_module_state(self.q, state["q"])
        nets.load_module_state(self.target_q, state["target_q"])
        nets.load_optimizer_state(self.opt, state["opt"])
        self.rng.bit_generator.state = state["rng"]
        if "eval_rng" in state:  # (agents saved before eval_epsilon have none: theirs starts fresh)
            self.eval_rng.bit_generator.state = state["eval_rng"]
        self.num_updates = int(state["counters"]["num_updates"])
        self.num_act_steps = int(state["counters"]["num_act_steps"])
        same = all(torch.equal(t, s) for t, s in zip(self.target_q.state_dict().values(),
                                                     self.q.state_dict().values(), strict=True))
        self.target_synced = same  # (a load writes every tensor: equal ones are stamped as synced again)
