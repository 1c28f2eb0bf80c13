"""Several seeds of one Double DQN configuration as one agent: the seed is the leading dimension of every weight.

Small Q-networks (the ReaPER setting: 64x64, batch 128) spend most of an update in per-operator overhead, not in
arithmetic, so S seeds updated one after the other cost ~S times one update. Here seed i's layer l is
``W[l][i]`` in a stacked [S, out, in] tensor and one batched matmul (``torch.baddbmm``) runs all seeds' layers:
S updates for about the operator count of one. Each seed keeps everything else of its own: its batch (from its
own buffer and sampler), its epsilon-greedy RNG and schedule, its TD errors for its sampler.

Equivalence with S single :class:`~relive.agents.ddqn.DDQN` agents (tested to float tolerance):

- the stacked weights start as the single agents' (``BatchedDDQN(agents)`` stacks them), so seed i starts
  exactly where ``DDQN(seed=i)`` does;
- the loss is the sum over seeds of each seed's importance-weighted mean Huber loss (Double DQN Eq. 4 target),
  so each seed's gradient is its own loss's gradient;
- one Adam over the stacked tensors equals S Adams (Adam is elementwise, and every seed steps together);
- the gradient-norm clip (RL Zoo: 10) is per seed: each seed's gradient is scaled by
  min(1, max_norm / (its own norm + 1e-6)), as ``torch.nn.utils.clip_grad_norm_`` does for one network;
- the hard target copy happens at the same update count for every seed.

A seed that stops (its run reached the score threshold) leaves with :meth:`drop`: its slices are removed from the
weights and the optimizer state, and the others continue unchanged. :meth:`sync` writes the stacked state back into
the single agents (weights, target, Adam state, counters), so their ``state_dict`` / ``agent_final`` are the
ordinary single-seed format.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from relive.agents import networks as nets
from relive.agents.encoders import flat_obs_batch
from relive.types import Batch, UpdateResult


def _linears(module: nn.Sequential) -> list[nn.Linear]:
    layers = [m for m in module if isinstance(m, nn.Linear)]
    if len(layers) != sum(1 for m in module if not isinstance(m, nn.ReLU)):
        raise ValueError("BatchedDDQN stacks Linear -> ReLU networks (relive.agents.networks.mlp) only")
    return layers


class BatchedDDQN:
    """S Double DQN agents of one configuration trained as one (see the module docstring)."""

    def __init__(self, agents: list):  # DDQN agents (ddqn.py imports this module: DDQN.seed_batcher)
        if not agents:
            raise ValueError("BatchedDDQN needs at least one DDQN agent")
        first = agents[0]
        for a in agents:
            if getattr(type(a), "seed_batcher", None) is not BatchedDDQN:  # a DDQN (or a subclass)
                raise ValueError(f"BatchedDDQN stacks DDQN agents, got {type(a).__name__}")
            if (a.cfg, a.obs_dim, a.num_actions, a.device) != (first.cfg, first.obs_dim, first.num_actions,
                                                                 first.device):
                raise ValueError("BatchedDDQN needs agents of one configuration (same config, observation size, "
                                 "actions and device); they differ")
            if a.num_updates != first.num_updates:
                raise ValueError("BatchedDDQN needs agents at the same update count (the target copy is shared)")
        c = first.cfg
        if getattr(first, "image_shape", None) is not None or c.optimizer != "adam" or c.optimizer_eps is not None \
                or c.clip_reward or c.eval_epsilon:
            raise ValueError("BatchedDDQN stacks MLP Q-networks trained with Adam at its default epsilon, rewards "
                             "unclipped, greedy evaluation; train image agents (agent.encoder), agent.optimizer = "
                             "'rmsprop', agent.optimizer_eps, agent.clip_reward or agent.eval_epsilon one seed a run")
        self.agents = list(agents)
        self.cfg, self.device = first.cfg, first.device
        self.num_updates = first.num_updates
        with torch.no_grad():
            self.params = [nn.Parameter(torch.stack([getattr(_linears(a.q)[i], name).detach() for a in agents]).clone())
                           for i in range(len(_linears(first.q))) for name in ("weight", "bias")]
            self.target = [torch.stack([getattr(_linears(a.target_q)[i], name) for a in agents]).clone()
                           for i in range(len(_linears(first.q))) for name in ("weight", "bias")]
        self.opt = nets.adam(self.params, self.cfg.lr)
        self._load_optimizer_states()

    @property
    def num_seeds(self) -> int:
        return len(self.agents)

    # -- networks --------------------------------------------------------------------------------------
    @staticmethod
    def forward(params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Q-values [S, B, A] of observations [S, B, obs_dim]: Linear -> ReLU per hidden layer, linear head."""
        n = len(params) // 2
        for i in range(n):
            w, b = params[2 * i], params[2 * i + 1]
            x = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
            if i < n - 1:
                x = torch.relu(x)
        return x

    @torch.no_grad()
    def act(self, obs: list[np.ndarray], explore: bool) -> list[np.ndarray]:
        """Each seed's actions for its observations (a list of [N, obs_dim], the same N for all): greedy in its
        Q-network, epsilon-greedy with its own RNG and schedule if ``explore`` (``DDQN.explore``)."""
        o = torch.as_tensor(np.stack([np.asarray(x, np.float32).reshape(-1, self.agents[0].obs_dim) for x in obs]),
                            device=self.device)
        greedy = self.forward(self.params, o).argmax(dim=-1).cpu().numpy().astype(np.int64)
        return [a.explore(g) if explore else g for a, g in zip(self.agents, greedy, strict=True)]

    # -- the update ------------------------------------------------------------------------------------
    def update(self, batches: list[Batch]) -> list[UpdateResult]:
        """One gradient step of every seed on its own batch (same batch size for all): DDQN.update per seed."""
        if len(batches) != self.num_seeds:
            raise ValueError(f"{len(batches)} batches for {self.num_seeds} seeds")
        bs = [flat_obs_batch(b).to_torch(self.device, dtype=torch.float32) for b in batches]
        sizes = {b.obs.shape for b in bs}
        if len(sizes) != 1:
            raise ValueError(f"every seed's batch must have the same shape, got {sorted(sizes)}")
        obs, next_obs = torch.stack([b.obs for b in bs]), torch.stack([b.next_obs for b in bs])
        reward, terminated = torch.stack([b.reward for b in bs]), torch.stack([b.terminated for b in bs])
        action = torch.stack([b.action.long() for b in bs])
        weight = torch.stack([nets.is_weight_of(b) for b in bs])
        discounts = [nets.td_discount(b, self.cfg.n_step, "DDQN") for b in bs]
        discount = (self.cfg.gamma * (1.0 - terminated) if discounts[0] is None else torch.stack(discounts))
        # 1. Double DQN target (Eq. 4): the online nets select a', the target nets evaluate it
        with torch.no_grad():
            next_a = self.forward(self.params, next_obs).argmax(dim=-1, keepdim=True)
            y = reward + discount * self.forward(self.target, next_obs).gather(2, next_a).squeeze(2)
        # 2. per seed: importance-weighted mean Huber loss; their sum gives each seed its own gradient
        q = self.forward(self.params, obs).gather(2, action.unsqueeze(2)).squeeze(2)  # [S, B]
        per_seed = (weight * F.huber_loss(q, y, reduction="none", delta=self.cfg.huber_delta)).mean(dim=1)
        for p in self.params:
            p.grad = None
        per_seed.sum().backward()
        if self.cfg.max_grad_norm is not None:  # each seed's own norm (clip_grad_norm_ per network)
            with torch.no_grad():
                sq = sum(_grad(p).reshape(self.num_seeds, -1).pow(2).sum(dim=1) for p in self.params)
                assert isinstance(sq, torch.Tensor)  # (a sum over the non-empty parameter list)
                coef = (self.cfg.max_grad_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
                for p in self.params:
                    _grad(p).mul_(coef.view(-1, *([1] * (p.dim() - 1))))
        if not (isinstance(self.opt, nets.LeanAdam) and self.opt.fused_step()):
            self.opt.step()
        self.num_updates += 1
        for a in self.agents:
            a.num_updates = self.num_updates
        # 3. hard target copy
        if self.num_updates % self.cfg.target_update_period == 0:
            with torch.no_grad():
                for t, p in zip(self.target, self.params, strict=True):
                    t.copy_(p)
        td = (q.detach() - y).cpu().numpy()
        losses, q_means = per_seed.detach().cpu().numpy(), q.detach().mean(dim=1).cpu().numpy()
        return [UpdateResult({"train/loss": float(losses[i]), "train/q_mean": float(q_means[i]),
                              "train/epsilon": self.agents[i].epsilon}, {"td_error": td[i]})
                for i in range(self.num_seeds)]

    # -- seeds leaving, state --------------------------------------------------------------------------
    def drop(self, index: int):
        """Remove seed ``index`` (its run has stopped): its state is written back into its single agent, which is
        returned; the other seeds continue exactly as before."""
        self.sync()
        keep = [i for i in range(self.num_seeds) if i != index]
        if not keep:
            raise ValueError("cannot drop the last seed")
        agent = self.agents[index]
        idx = torch.tensor(keep, device=self.device)
        state = {id(p): self.opt.state[p] for p in self.params}
        with torch.no_grad():
            new = [nn.Parameter(p.detach().index_select(0, idx).clone()) for p in self.params]
            self.target = [t.index_select(0, idx).clone() for t in self.target]
        self.opt = nets.adam(new, self.cfg.lr)
        for old, p in zip(self.params, new, strict=True):
            st = state[id(old)]
            self.opt.state[p] = {"step": st["step"].clone(), "exp_avg": st["exp_avg"].index_select(0, idx).clone(),
                                 "exp_avg_sq": st["exp_avg_sq"].index_select(0, idx).clone()}
        self.params = new
        self.agents = [self.agents[i] for i in keep]
        return agent

    @torch.no_grad()
    def sync(self, weights_only: bool = False) -> None:
        """Write the stacked weights, targets and Adam state back into the single agents (their ``state_dict``
        is then the single-seed checkpoint format); ``weights_only``: the Q-networks only (enough to act)."""
        for i, a in enumerate(self.agents):
            a.target_synced = False  # (its weights are written here: its next update runs the target forward)
            for layer, tlayer, j in zip(_linears(a.q), _linears(a.target_q), range(0, len(self.params), 2),
                                        strict=True):
                layer.weight.copy_(self.params[j][i])
                layer.bias.copy_(self.params[j + 1][i])
                if not weights_only:
                    tlayer.weight.copy_(self.target[j][i])
                    tlayer.bias.copy_(self.target[j + 1][i])
            if weights_only:
                continue
            if all(p in self.opt.state for p in self.params):
                sd = a.opt.state_dict()
                sd["state"] = {k: {"step": self.opt.state[p]["step"].clone(),
                                   "exp_avg": self.opt.state[p]["exp_avg"][i].clone(),
                                   "exp_avg_sq": self.opt.state[p]["exp_avg_sq"][i].clone()}
                               for k, p in enumerate(self.params)}
                a.opt.load_state_dict(sd)
            a.num_updates = self.num_updates

    def _load_optimizer_states(self) -> None:
        """Adam state from the single agents (when they have taken steps: a resumed run)."""
        states = [a.opt.state_dict()["state"] for a in self.agents]
        if not all(len(s) == len(self.params) for s in states):
            if any(states):
                raise ValueError("BatchedDDQN needs agents whose optimizers have all stepped or none")
            return
        for k, p in enumerate(self.params):
            self.opt.state[p] = {"step": states[0][k]["step"].clone(),
                                 "exp_avg": torch.stack([s[k]["exp_avg"] for s in states]).to(self.device),
                                 "exp_avg_sq": torch.stack([s[k]["exp_avg_sq"] for s in states]).to(self.device)}


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None  # every parameter is in the loss: backward gave it a gradient
    return p.grad
