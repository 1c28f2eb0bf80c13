"""V-RACER: one network for V(s) and a diagonal Gaussian policy, trained from single replayed time steps with
Retrace targets, the off-policy policy gradient and (when a sampler publishes its hints) ReF-ER's two rules.

Novati & Koumoutsakos, "Remember and Forget for Experience Replay", ICML 2019, arXiv 1807.05827 (equation
numbers below refer to it); reference code ``cselab/smarties`` (``RACER_train.cpp``, ``MemoryProcessing.cpp``).
V-RACER is the paper's Sec. 2 (the off-policy PG Eq. 5, Retrace Eq. 6, the V-trace-like target Eq. 7-8, the value
loss Eq. 9), ReF-ER its Sec. 3 (Eq. 10-13); the implementation details the paper defers to its App. A follow the
reference code.

**Index convention.** A stored row t holds (s_t, a_t, r_{t+1}, s_{t+1}, terminated, truncated): ``reward[t]``
is the paper's r_{t+1}. Eq. 6, Q^ret_{t-1} = r_t + gamma V(s_t) + gamma rho-bar_t (Q^ret_t - V(s_t)), is then,
per row (Q := V in V-RACER, plus Retrace's trace factor lambda, 1 in the paper):

    q_ret[t] = reward[t] + gamma (1 - terminated[t]) [V(s_{t+1}) + lambda min(1, rho_{t+1}) (q_ret[t+1] - V(s_{t+1}))]

with the episode's last stored row closing the recursion: ``terminated`` -> q_ret = reward (nothing after);
``truncated``, or an episode still running (its last stored row so far) -> q_ret = reward + gamma V(next_obs)
(smarties: V(s_T) of a truncated episode with a zero trace). rho_{t+1} is the *next* row's importance weight
under the current policy, in log space clipped to [-7, 7] as everywhere in ReF-ER.

``update(batch)``, for each sampled row t, in the paper's order (smarties ``RACER::Train``):
  1. pi^w(.|s_t), V^w(s_t) from one forward pass; rho_t = pi^w(a_t|s_t) / mu_t(a_t|s_t) against the stored
     behaviour (``batch.mu_mean``, ``batch.mu_std``), log-ratio clipped to [-7, 7];
  2. Rule 1: far-policy iff rho_t outside (1/c_max, c_max) -- such rows get zero value and policy gradient;
  3. value (Eq. 7-9): loss 1/2 (V^w(s_t) - V^tbc_t)^2 with the target V^tbc_t = V(s_t) + min(1, rho_t)
     (Q^ret_t - V(s_t)) held fixed, i.e. the gradient step on V is min(1, rho_t) (Q^ret_t - V(s_t));
  4. policy (Eq. 5): off-policy gradient rho_t A-hat_t grad log pi^w(a_t|s_t), A-hat_t = Q^ret_t - V^w(s_t)
     (smarties clips rho at c_max here, which never binds under Rule 1);
  5. Rule 2 (Eq. 10-11): the step is beta * (steps 3-4) - (1 - beta) grad D_KL(mu_t || pi^w(.|s_t)), the
     penalty on every sampled row, near or far (smarties scales the value gradient by beta too: so do we);
  6. one Adam step with the annealed rate lr / (1 + A t) (Eq. 13), t = gradient steps taken.
c_max, beta and the annealing come from the ReF-ER sampler's hints (``replay.name = "refer"``: ``c_max``,
``beta``, ``lr_scale``, ``refer_source``; the math is ``relive.agents.refer``'s). Without them (any other
sampler) c_max = inf, beta = 1 and lr / (1 + A t) with this agent's own A and t: plain V-RACER. A batch that is
all far with beta = 1 has nothing to learn from, so no optimizer step is taken (Adam's momentum would still
move the parameters otherwise); the step counter still advances. ``refer_rule1`` / ``refer_rule2`` switch a
rule off (the paper's ReF-ER-2 / ReF-ER-1). The agent's ``refer_log_rho`` serves the sampler's recounts.

**Stored targets, and what is refreshed when.** The agent declares (``stored_columns``) the behaviour record
``mu_mean``/``mu_std`` (what ``act`` returns) and ``q_ret``. Its loop hooks (``loop_hooks``) keep ``q_ret``
current through ``ctx.buffer`` -- the update itself never touches the buffer:
  - ``OnEpisodeEnd``: the Retrace targets of the episode that just ended, from the current network;
  - ``EveryGradSteps(refresh_every_grad_steps)``: V and rho of every stored row with the current network, then
    every episode's targets, backward in one vectorized pass (chunked by whole episodes), written with
    ``buffer.set_column`` (smarties: every 1000 steps, ``bRecomputeProperties``).
Between refreshes a sampled row uses its stored Q^ret with the *current* V(s_t) and rho_t (steps 1-4); unlike
smarties, the stored targets of the row's predecessors are not corrected on the fly (that needs the whole
episode per sampled step). Rows whose episode has not ended since the last refresh have no target yet
(``q_ret == Q_RET_UNSET``); they use the one-step target r + gamma (1 - terminated) V(s_{t+1}) instead.
Rewards enter every target times a scale, by default 1 / sqrt(mean r^2) over the stored rows, re-estimated
at every refresh just before all targets are recomputed (smarties ``updateRewardsStats``), so V is learned in
units of the RMS reward.

**Actions and their density.** pi^w is a diagonal Gaussian in the env's action units, mean = center + scale
m(s), std = scale (softplus(.) + min_std); the executed (and stored) action is the sample clipped to the
box. Its density is the *clipped* (censored) Gaussian's: a coordinate strictly inside the box has the Gaussian
density, a coordinate on a bound the probability mass beyond it (log Phi((low - m)/std) or
log Phi((m - high)/std)). Behaviour and target are censored on the same bounds, so rho is an exact likelihood
ratio of the executed actions, no unclipped copy of the action has to be stored, and grad log pi is the
censored one. The KL penalty is the plain (uncensored) diagonal-Gaussian KL, as in the paper.

Example::

    agent = VRACER(obs_dim=3, action_dim=1, action_low=[-2.0], action_high=[2.0], config=VRACERConfig())
    buffer = ReplayBuffer(2**18, (3,), (1,), extra_columns={d.name: d.spec for d in agent.stored_columns()})
    acted = agent.act(obs, explore=True)        # Acted(action, record={"mu_mean", "mu_std"})
    result = agent.update(buffer.sample(256))   # UpdateResult(metrics, signals={"rho", "td_error"})
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from relive.agents import networks as nets
from relive.agents import refer
from relive.agents.encoders import flat_obs, flat_obs_batch
from relive.hooks import EveryGradSteps, OnEpisodeEnd
from relive.registry import register_agent
from relive.replay import refer_schedule
from relive.types import Acted, Batch, ColumnDecl, UpdateResult

ACTIVATIONS = {"tanh": nn.Tanh, "softsign": nn.Softsign}
Q_RET_UNSET = float(np.finfo(np.float32).min)  # q_ret of a row whose target was never computed
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class VRACERConfig:
    """V-RACER hyperparameters. Defaults: smarties' code defaults (``HyperParameters.h``) and ``default.json``
    where the paper's text gives none (it gives C, D, A and N = 2^18 in Sec. 3 and the learning rates of Fig. 4;
    the rest is in its App. A, not reproduced here). The batch size (256) and one gradient
    step per env step (smarties obsPerStep) are schedule settings: ``schedule.batch_size``, ``schedule.utd_ratio``
    (the ``vracer`` preset)."""

    hidden: tuple[int, ...] = (128, 128)  # hidden layer widths of the one network (smarties nnLayerSizes)
    activation: str = "tanh"  # hidden activation: "tanh" (smarties code default) or "softsign" (default.json)
    out_init_scale: float = 0.1  # output-layer init prefactor (default.json; smarties code default 1e-3)
    init_std: float = 0.4472  # policy std at init, in units of the action half-range (smarties explNoise sqrt(.2))
    min_std: float = 1e-3  # lower bound of the std, in units of the action half-range (keeps rho and KL finite)
    lr: float = 1e-4  # Adam learning rate eta at t = 0 (smarties learnrate)
    lr_anneal: float = 5e-7  # A in eta / (1 + A t), t = gradient steps (smarties); ReF-ER: the lr_scale hint instead
    gamma: float = 0.995  # discount (smarties code default)
    retrace_lambda: float = 1.0  # trace factor lambda: 1 = the paper's Eq. 6 and the code default (default.json 0.95)
    reward_scale: float | None = None  # reward factor in the targets; None: 1 / RMS of stored rewards, per refresh
    refresh_every_grad_steps: int = 1000  # recompute V, rho and Q^ret of every stored row this often (smarties)
    refresh_chunk_rows: int = 65536  # rows per forward pass of a refresh (whole episodes per chunk)
    kl_direction: str = "mu_pi"  # Rule 2 penalty: "mu_pi" = D_KL(mu || pi) (paper), "pi_mu" (smarties as built)
    refer_rule1: bool = True  # under ReF-ER hints: far rows get no gradient (off: the paper's ReF-ER-2)
    refer_rule2: bool = True  # under ReF-ER hints: beta * task - (1 - beta) grad KL (off: ReF-ER-1, beta = 1)
    # must stay 1: the targets are Retrace estimates over whole stored episodes (Eq. 6), multi-step already and
    # off-policy corrected by the trace factors; an uncorrected n-step sum would replace them (retrace_lambda sets
    # how far they look)
    n_step: int = 1

    def __post_init__(self):
        if nets.check_n_step(self.n_step) != 1:
            raise ValueError(f"V-RACER takes n_step = 1 only, got {self.n_step}: its value targets are Retrace "
                             "estimates over whole stored episodes (Eq. 6), already multi-step and corrected by the "
                             "trace factors min(1, rho); tune retrace_lambda for how far they look instead")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.kl_direction not in refer.KL_DIRECTIONS:
            raise ValueError(f"kl_direction must be one of {refer.KL_DIRECTIONS}, got {self.kl_direction!r}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if not 0 <= self.gamma <= 1 or not 0 <= self.retrace_lambda <= 1:
            raise ValueError(f"gamma and retrace_lambda must be in [0, 1], got {self.gamma}, {self.retrace_lambda}")
        if not 0 < self.min_std < self.init_std:
            raise ValueError(f"need 0 < min_std < init_std, got {self.min_std}, {self.init_std}")
        if self.reward_scale is not None and not self.reward_scale > 0:
            raise ValueError(f"reward_scale must be > 0 (or None: 1 / RMS reward), got {self.reward_scale}")
        if self.lr <= 0 or self.lr_anneal < 0 or self.out_init_scale <= 0:
            raise ValueError("lr and out_init_scale must be > 0 and lr_anneal >= 0")
        if min(self.refresh_every_grad_steps, self.refresh_chunk_rows) < 1:
            raise ValueError("refresh_every_grad_steps and refresh_chunk_rows must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


# -- the policy's density and Retrace ------------------------------------------------------------------
def clipped_gaussian_log_prob(mean: torch.Tensor, std: torch.Tensor, action: torch.Tensor, low: torch.Tensor,
                              high: torch.Tensor) -> torch.Tensor:
    """log-density of an executed action under N(mean, std^2) clipped to [low, high], summed over dimensions:
    Gaussian log-density inside the box, log P(u <= low) / log P(u >= high) for coordinates on a bound."""
    log_pdf = -0.5 * ((action - mean) / std) ** 2 - torch.log(std) - _LOG_SQRT_2PI
    log_below = torch.special.log_ndtr((low - mean) / std)
    log_above = torch.special.log_ndtr((mean - high) / std)
    return torch.where(action <= low, log_below, torch.where(action >= high, log_above, log_pdf)).sum(-1)


def retrace_targets(reward: np.ndarray, terminated: np.ndarray, v_next: np.ndarray, trace_next: np.ndarray,
                    lengths: np.ndarray, gamma: float) -> np.ndarray:
    """Q^ret of episodes laid end to end (rows in episode, then time order; ``lengths`` per episode), backward:

        q[t] = r[t] + gamma (1 - terminated[t]) (v_next[t] + trace_next[t] (q[t+1] - v_next[t]))   (Eq. 6)
        q[last] = r[last] + gamma (1 - terminated[last]) v_next[last]

    ``v_next[t]`` = V(s_{t+1}) (V(next_obs) at an episode's last stored row), ``trace_next[t]`` = lambda
    min(1, rho_{t+1}) (unused at last rows). Vectorized over episodes: one NumPy step per distance from the
    episode end, every episode at once (O(rows) work, max-length iterations). float64 inside."""
    lengths = np.asarray(lengths, np.int64)
    n = int(lengths.sum())
    r = np.asarray(reward, np.float64).reshape(-1)
    if r.size != n:
        raise ValueError(f"{r.size} rows but the episode lengths sum to {n}")
    cont = gamma * (1.0 - np.asarray(terminated, np.float64).reshape(-1))
    v = np.asarray(v_next, np.float64).reshape(-1)
    c = np.asarray(trace_next, np.float64).reshape(-1)
    ends = np.cumsum(lengths)
    to_end = np.repeat(ends, lengths) - 1 - np.arange(n)  # 0 at each episode's last row
    is_last = to_end == 0
    a = r + cont * np.where(is_last, v, v * (1.0 - c))  # q[t] = a[t] + b[t] q[t+1]
    b = np.where(is_last, 0.0, cont * c)
    q = np.empty(n)
    order = np.argsort(to_end, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(to_end, minlength=1))))
    for k in range(bounds.size - 1):
        rows = order[bounds[k]:bounds[k + 1]]
        q[rows] = a[rows] if k == 0 else a[rows] + b[rows] * q[rows + 1]
    return q


# -- the network -----------------------------------------------------------------------------------------
class VRACERNet(nn.Module):
    """One MLP s -> (V(s), mean(s), std(s)): [B], [B, A], [B, A], mean and std in the env's action units."""

    low: torch.Tensor  # the action box (buffers registered in __init__)
    high: torch.Tensor
    scale: torch.Tensor
    center: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], activation: str, action_low,
                 action_high, init_std: float, min_std: float):
        super().__init__()
        low, high = nets.action_box(action_low, action_high, action_dim)
        layers: list[nn.Module] = []
        d = obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), ACTIVATIONS[activation]()]
            d = h
        self.trunk = nn.Sequential(*layers)
        self.head = nn.Linear(d, 1 + 2 * action_dim)
        self.action_dim = action_dim
        self.register_buffer("low", torch.as_tensor(low))
        self.register_buffer("high", torch.as_tensor(high))
        self.register_buffer("scale", torch.as_tensor((high - low) / 2))
        self.register_buffer("center", torch.as_tensor((high + low) / 2))
        self.min_std = float(min_std)
        self.std_shift = math.log(math.expm1(init_std - min_std))  # softplus(0 + shift) + min_std = init_std

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.head(self.trunk(obs))
        v, m, s = out[:, 0], out[:, 1:1 + self.action_dim], out[:, 1 + self.action_dim:]
        mean = self.center + self.scale * m
        std = self.scale * (F.softplus(s + self.std_shift) + self.min_std)
        return v, mean, std

    def log_prob(self, mean: torch.Tensor, std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return clipped_gaussian_log_prob(mean, std, action, self.low, self.high)


@register_agent("vracer", VRACERConfig)
class VRACER:
    """V-RACER agent (see the module docstring for the update, the targets and their refresh)."""

    acting_modules = ("net",)  # what a Ray collector's copy needs to act (relive.train.ray_collectors)

    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high, config: VRACERConfig | None = None,
                 seed: int = 0, device: str = "cpu"):
        self.cfg = cfg = config if config is not None else VRACERConfig()
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.device = torch.device(device)
        self.action_low = np.asarray(action_low, np.float32).reshape(-1)
        self.action_high = np.asarray(action_high, np.float32).reshape(-1)
        init_gen = torch.Generator().manual_seed(int(seed))  # parameters (CPU: identical on every device)
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)  # exploration
        with nets.private_rng():
            net = VRACERNet(obs_dim, action_dim, cfg.hidden, cfg.activation, action_low, action_high,
                            cfg.init_std, cfg.min_std)
        nets.init_(net, init_gen, "torch")
        with torch.no_grad():  # small linear outputs at init (smarties outWeightsPrefac)
            net.head.weight.mul_(cfg.out_init_scale)
            net.head.bias.mul_(cfg.out_init_scale)
        self.net = net.to(self.device)
        self.opt = nets.adam(self.net.parameters(), cfg.lr)
        self.num_grad_steps = 0  # t of the learning-rate annealing
        self.num_skipped_steps = 0  # all-far batches with beta = 1: no optimizer step
        self.num_refreshes = 0
        self.reward_scale = 1.0 if cfg.reward_scale is None else float(cfg.reward_scale)  # r -> r * this

    @classmethod
    def from_spec(cls, spec, config: VRACERConfig, seed: np.random.SeedSequence, device: str = "cpu") -> VRACER:
        if spec.discrete:
            raise ValueError(f"V-RACER needs a continuous action space; {spec.id} is discrete")
        return cls(nets.vector_obs_dim(spec, "V-RACER"), int(np.prod(spec.action_shape)), spec.action_low,
                   spec.action_high, config, seed=nets.seed_int(seed), device=device)

    # -- what the loop stores and serves ---------------------------------------------------------------
    def stored_columns(self) -> tuple[ColumnDecl, ...]:
        a = (self.action_dim,)
        return (
            ColumnDecl("mu_mean", a, offline="required", doc="behaviour policy mean (env action units)"),
            ColumnDecl("mu_std", a, offline="required", doc="behaviour policy std (env action units)"),
            ColumnDecl("q_ret", (), fill=Q_RET_UNSET,
                       doc="Retrace target Q^ret of the row (Q_RET_UNSET until its episode ends or a refresh)"),
        )

    def loop_hooks(self, ctx) -> list:
        buffer = ctx.buffer
        every = self.cfg.refresh_every_grad_steps
        return [EveryGradSteps(every, lambda: self.refresh_targets(buffer), phase="offline"),
                EveryGradSteps(every, lambda: self.refresh_targets(buffer), phase="online"),
                OnEpisodeEnd(lambda slots: self.fill_episode_targets(buffer, slots))]

    # -- acting ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool) -> Acted:
        """Acted(action [N, A] inside the box, record={"mu_mean", "mu_std"} [N, A]): a = clip(m + std eps) if
        ``explore``, else clip(m). The record is the Gaussian either way (a deterministic action has no
        density under it: store only exploring steps)."""
        o, single = nets.as_obs_tensor(obs, self.obs_dim, self.device)
        _, mean, std = self.net(o)
        u = mean
        if explore:
            u = mean + std * torch.randn(mean.shape, generator=self.gen, device=self.device, dtype=mean.dtype)
        a = np.clip(u.cpu().numpy(), self.action_low, self.action_high)
        record = {"mu_mean": mean.cpu().numpy(), "mu_std": std.cpu().numpy()}
        if single:
            return Acted(a[0], {k: v[0] for k, v in record.items()})
        return Acted(a, record)

    # -- targets (the hooks) -----------------------------------------------------------------------------
    @torch.no_grad()
    def _value_and_log_rho(self, obs: np.ndarray, action: np.ndarray, mu_mean: np.ndarray, mu_std: np.ndarray):
        """V(s) and clipped log rho of stored rows under the current network, in chunks: ([n], [n]) NumPy."""
        vs, lrs = [], []
        step = self.cfg.refresh_chunk_rows
        for i in range(0, obs.shape[0], step):
            o, a, m_mu, s_mu = (torch.as_tensor(x[i:i + step], dtype=torch.float32, device=self.device)
                                for x in (obs, action, mu_mean, mu_std))
            v, mean, std = self.net(o)
            log_rho = refer.clipped_log_rho(self.net.log_prob(mean, std, a), self.net.log_prob(m_mu, s_mu, a))
            vs.append(v.cpu().numpy())
            lrs.append(log_rho.cpu().numpy())
        return np.concatenate(vs), np.concatenate(lrs)

    def refer_log_rho(self, obs, action, mu_mean, mu_std) -> np.ndarray:
        """The ReF-ER sampler's recount: clipped log rho of stored rows under the current policy (the censored
        density, as in ``update``), in chunks: [n] NumPy."""
        return self._value_and_log_rho(*(np.asarray(x, np.float32) for x in (flat_obs(obs), action, mu_mean,
                                                                             mu_std)))[1]

    @torch.no_grad()
    def targets_of(self, cols: dict, lengths: np.ndarray) -> np.ndarray:
        """Q^ret of whole stored episodes laid end to end (``cols``: their rows' columns in episode then time
        order, ``lengths`` per episode) with the current network: float32 [n]. Inside an episode row t + 1 must
        be row t's successor (obs[t+1] == next_obs[t], as the collector writes them): V(s_{t+1}) and rho_{t+1}
        come from row t + 1's forward pass, so one pass over the rows (plus one per episode end) suffices."""
        lengths = np.asarray(lengths, np.int64)
        cols = dict(cols) | {"obs": flat_obs(cols["obs"]), "next_obs": flat_obs(cols["next_obs"])}
        v, log_rho = self._value_and_log_rho(cols["obs"], cols["action"], cols["mu_mean"], cols["mu_std"])
        last = np.cumsum(lengths) - 1
        v_next = np.empty_like(v)
        v_next[:-1] = v[1:]  # V(s_{t+1}) = V(obs[t+1]) inside an episode
        o_last = torch.as_tensor(cols["next_obs"][last], dtype=torch.float32, device=self.device)
        v_next[last] = self.net(o_last)[0].cpu().numpy()  # bootstrap value at each episode's last stored row
        trace = np.empty_like(v)
        trace[:-1] = self.cfg.retrace_lambda * np.minimum(1.0, np.exp(log_rho[1:]))
        trace[last] = 0.0
        reward = self.reward_scale * np.asarray(cols["reward"], np.float64)
        q = retrace_targets(reward, cols["terminated"], v_next, trace, lengths, self.cfg.gamma)
        return q.astype(np.float32)

    def fill_episode_targets(self, buffer, slots: np.ndarray) -> None:
        """``OnEpisodeEnd``: the targets of one episode (its stored rows' slots, in time order)."""
        slots = np.asarray(slots, np.int64)
        if slots.size == 0:
            return
        cols = {k: buffer.storage.read(k, slots) for k in
                ("obs", "action", "reward", "next_obs", "terminated", "mu_mean", "mu_std")}
        buffer.set_column("q_ret", slots, self.targets_of(cols, np.array([slots.size])))

    def refresh_targets(self, buffer) -> None:
        """``EveryGradSteps``: the reward scale (``reward_scale=None``: 1 / RMS of the stored rewards), then V,
        rho and Q^ret of every stored episode (the running one included) with the current network, in chunks
        of whole episodes of about ``refresh_chunk_rows`` rows."""
        st = buffer.storage
        ep = st.episodes.live()
        if len(ep) == 0:
            return
        if self.cfg.reward_scale is None:
            rms = float(np.sqrt(np.mean(np.square(st.columns["reward"][:st.size], dtype=np.float64))))
            self.reward_scale = 1.0 / rms if rms > 0 else 1.0
        keep = ep.length > 0
        start, length, source = ep.start[keep], ep.length[keep], ep.source[keep]
        group = np.cumsum(length) // self.cfg.refresh_chunk_rows  # episodes of one chunk share a group number
        for g in np.unique(group):
            sel = group == g
            slots = st.episode_slots(start[sel], length[sel], source[sel])
            cols = {k: st.read(k, slots) for k in
                    ("obs", "action", "reward", "next_obs", "terminated", "mu_mean", "mu_std")}
            buffer.set_column("q_ret", slots, self.targets_of(cols, length[sel]))
        self.num_refreshes += 1

    # -- the update --------------------------------------------------------------------------------------
    def lr_now(self, hints=None) -> float:
        """eta(t) = eta / (1 + A t) (Eq. 13; smarties ``annealRate``): the ReF-ER sampler's schedule when it
        publishes one (``lr_scale`` hint, its own A and t), else this agent's ``lr_anneal`` and step count."""
        if hints and "lr_scale" in hints:
            return self.cfg.lr * float(hints["lr_scale"])
        return refer_schedule.annealed_lr(self.cfg.lr, self.num_grad_steps, self.cfg.lr_anneal)

    def refer_view(self, b: Batch) -> tuple[float, float, torch.Tensor]:
        """(c_max, beta, covered [B]) from the ReF-ER sampler's hints (``relive.replay.samplers.refer``);
        without them (any other sampler) c_max = inf and beta = 1: plain V-RACER. ``covered``: the rows of the
        source the sampler keeps far-policy counts for (``refer_source``; all rows by default) -- the rules
        apply to them only. ``refer_rule1`` / ``refer_rule2`` off give the paper's ReF-ER-2 / ReF-ER-1."""
        hints, ones = b.info.hints, torch.ones(b.obs.shape[0], device=self.device)
        if "c_max" not in hints:
            return math.inf, 1.0, ones
        c_max = float(hints["c_max"]) if self.cfg.refer_rule1 else math.inf
        beta = float(hints["beta"]) if self.cfg.refer_rule2 else 1.0
        source = int(hints.get("refer_source", refer_schedule.ALL_SOURCES))
        covered = ones if source == refer_schedule.ALL_SOURCES else torch.as_tensor(
            b.info.source == source, device=self.device).float()
        return c_max, beta, covered

    def losses(self, b: Batch, v: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, c_max: float = math.inf,
               covered: torch.Tensor | None = None):
        """Per-sample task loss (value + policy, zero on far rows), KL penalty (zero on uncovered rows), and
        diagnostics, from a forward pass (v, mean, std) of a torch batch. Gradients: d/dV = -min(1, rho)
        (Q^ret - V) (Eq. 9 with the TBC target of Eq. 7 held fixed); d/dw of the policy part = -rho A-hat
        grad log pi (Eq. 5)."""
        covered = torch.ones_like(v) if covered is None else covered
        log_pi = self.net.log_prob(mean, std, b.action)
        with torch.no_grad():
            log_mu = self.net.log_prob(b.mu_mean, b.mu_std, b.action)
            rho = torch.exp(refer.clipped_log_rho(log_pi, log_mu))  # 1.
            near = ~(refer_schedule.is_far(rho, c_max) & (covered > 0))  # 2. Rule 1
            q_ret = b.q_ret.to(v.dtype)
            unset = q_ret <= 0.5 * Q_RET_UNSET
            if bool(unset.any()):  # no stored target yet: one-step r + gamma (1 - terminated) V(s')
                v_next = self.net(b.next_obs)[0]
                one_step = self.reward_scale * b.reward + self.cfg.gamma * (1 - b.terminated) * v_next
                q_ret = torch.where(unset, one_step, q_ret)
            adv = q_ret - v  # A-hat = Q^ret - V(s)
            v_tbc = v + torch.clamp(rho, max=1.0) * adv  # Eq. 7
        value_loss = 0.5 * (v - v_tbc) ** 2  # 3. Eq. 9
        pg_loss = -rho * adv * log_pi  # 4. Eq. 5 (smarties clips rho at c_max here: never binds under Rule 1)
        task = near.to(v.dtype) * (value_loss + pg_loss)
        kl = refer.refer_kl(b.mu_mean, b.mu_std, mean, std, self.cfg.kl_direction) * covered  # 5. every row
        return task, kl, {"rho": rho, "near": near, "adv": adv, "q_ret": q_ret, "unset": unset,
                          "value_loss": value_loss.detach(), "pg_loss": pg_loss.detach()}

    def update(self, batch: Batch) -> UpdateResult:
        nets.td_discount(batch, 1, "V-RACER")  # (refuses an n-step batch: rewards must be one-step)
        flat = flat_obs_batch(batch)  # dict obs: keys concatenated
        for name, width in (("obs", self.obs_dim), ("action", self.action_dim)):
            x = getattr(flat, name)
            if x.ndim != 2 or x.shape[1] != width:
                raise ValueError(f"batch.{name} must have shape [B, {width}], got {tuple(x.shape)}")
        b = flat.to_torch(self.device, torch.float32)
        if not bool((b.mu_std > 0).all()):
            row = int(torch.nonzero(~(b.mu_std > 0))[0, 0])
            raise ValueError(f"batch row {row} (slot {int(batch.info.indices[row])}): the behaviour std mu_std must "
                             f"be > 0, got {b.mu_std[row].tolist()} (a row stored without a behaviour record?)")
        c_max, beta, covered = self.refer_view(b)
        w = nets.is_weight_of(b)
        v, mean, std = self.net(b.obs)  # 1.
        task, kl, d = self.losses(b, v, mean, std, c_max, covered)  # 2.-4.
        loss = beta * nets.weighted_mean(task, w) + (1.0 - beta) * nets.weighted_mean(kl, w)  # 5. Eq. 10
        lr = self.lr_now(b.info.hints)
        if beta < 1.0 or bool(d["near"].any()):  # 6.
            refer.set_lr(self.opt, lr)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        else:
            self.num_skipped_steps += 1
        self.num_grad_steps += 1
        rho, near = d["rho"], d["near"]
        with torch.no_grad():
            kl_behaviour = refer.gaussian_kl(b.mu_mean, b.mu_std, mean, std).mean().item()
        metrics = {
            "train/value_loss": (d["value_loss"] * near).mean().item(),
            "train/pg_loss": (d["pg_loss"] * near).mean().item(),
            "train/kl_behaviour": kl_behaviour,  # D_KL(mu || pi) of the replayed rows (the paper's Fig. 2 measure)
            "train/v_mean": v.detach().mean().item(),
            "train/q_ret_mean": d["q_ret"].mean().item(),
            "train/std_mean": std.detach().mean().item(),
            "train/rho_mean": rho.mean().item(),
            "train/unset_target_fraction": d["unset"].float().mean().item(),
            "train/lr": lr,
            "train/reward_scale": self.reward_scale,
        }
        if "c_max" in b.info.hints:
            metrics |= {"train/refer_near_fraction": near.float().mean().item(), "train/refer_beta": beta,
                        "train/refer_kl": kl.detach().mean().item()}
        signals = {"rho": rho.cpu().numpy().astype(np.float64), "td_error": d["adv"].cpu().numpy()}
        return UpdateResult(metrics, signals)

    # -- state -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Parameters, optimizer state, exploration RNG and counters (NumPy / JSON)."""
        return {
            "net": nets.module_state(self.net),
            "opt": nets.optimizer_state(self.opt),
            "generator": nets.generator_state(self.gen),
            "counters": {"num_grad_steps": self.num_grad_steps, "num_skipped_steps": self.num_skipped_steps,
                         "num_refreshes": self.num_refreshes, "reward_scale": self.reward_scale},
        }

    def load_state_dict(self, state: dict) -> None:
        nets.load_module_state(self.net, state["net"])
        nets.load_optimizer_state(self.opt, state["opt"])
        nets.load_generator_state(self.gen, state["generator"])
        c = state["counters"]
        self.num_grad_steps = int(c["num_grad_steps"])
        self.num_skipped_steps = int(c["num_skipped_steps"])
        self.num_refreshes = int(c["num_refreshes"])
        self.reward_scale = float(c["reward_scale"])
