"""DDPG (Lillicrap et al., ICLR 2016, arXiv 1509.02971), with ReF-ER's two rules (Novati & Koumoutsakos, ICML 2019,
arXiv 1807.05827) when the sampler publishes them. Equation numbers are the ReF-ER paper's.

Acting: a = m^w(s) + N(0, sigma^2 I) with sigma = 0.2 (in units of the action box's half-width), clipped to the
box (the ReF-ER paper, Sec. 2: Gaussian noise so that the behaviour has a density). ``act`` returns the behaviour
record ``mu_mean = m^w(s)`` and ``mu_std = sigma`` per dimension (env units); ``stored_columns()`` declares them.
Ornstein-Uhlenbeck noise is an option only without ReF-ER (its density is not tractable). rho is evaluated at the
clipped, stored action: at the box's faces this is the Gaussian density, not the clipped distribution's mass.

The HER code's exploration and inputs (openai/baselines her/ddpg.py, ``get_actions`` and ``_preprocess_og``; options,
off by default; the ``ddpg_her`` preset turns them on):
  - ``sigma`` is baselines' ``noise_eps``: its noise is ``noise_eps * max_u * N(0, 1)`` on a box [-max_u, max_u],
    whose half-width is max_u, so ``sigma = noise_eps`` exactly (on any box: sigma x the half-width);
  - ``random_eps``: after the noise and the clip, each env's action is replaced, with probability random_eps, by
    one drawn uniformly from the box (baselines: ``u += binomial(1, random_eps) * (uniform(-max_u, max_u) - u)``).
    The behaviour is then a mixture with no Gaussian density: refused under ReF-ER;
  - ``obs_norm``: the network inputs (the ``obs_keys`` concatenated: observation and desired goal) are clipped to
    [-obs_clip, obs_clip], then normalized per dimension by running statistics and clipped:
    clip((x - mean) / std, -obs_norm_clip, obs_norm_clip), at acting, training (obs and next_obs of every batch,
    for the actor, the critic and their targets) and evaluation time. The statistics are baselines' Normalizer
    (her/normalizer.py): sums of x and x^2 over the rows seen and a count that starts at 1 (its count variable's
    ``tf.ones_initializer``), mean = sum / count, std = sqrt(max(eps^2, sumsq / count - mean^2)), recomputed after
    each update; before the first update mean 0 and std 1. Per dimension, so one normalizer over the concatenated
    input is baselines' two (o_stats, g_stats). **What updates them**: the stored rows of each online episode when
    it ends (an ``OnEpisodeEnd`` hook: each row's obs once, as collected). Baselines updates them when it stores an
    episode batch, from as many transitions drawn from that batch with HER's relabeling, so its goal statistics
    mix the episodes' desired goals with achieved goals (80% at k = 4); relive's goal statistics are the desired
    goals as collected. Offline rows (a dataset) do not enter the statistics. Saved in checkpoints (the agent's
    state: plain arrays), shipped with the actor to Ray collectors.

``update(batch)``, in the paper's order:
  0. ReF-ER only: learning rates lr / (1 + A t) (Eq. 13; the sampler's ``lr_scale`` hint), and per row
     rho = pi^w(a|s) / mu(a|s) with pi^w = N(m^w(s), sigma^2 I), i.e.
     rho = exp(-(|a - m^w(s)|^2 - |a - m_t|^2) / (2 sigma^2)), log clipped to [-7, 7]; far iff
     rho not in (1/c_max, c_max)  (Sec. 3);
  1. critic: L_Q = E[w (Q(s, a) - y)^2], y = r + gamma (1 - terminated) Q'(s', m'(s'))  (Eq. 2),
     w = ``is_weight`` (PER); Rule 1: far rows contribute zero (their loss is masked);
  2. actor: L = E[beta * near * (-Q(s, m^w(s)))  +  (1 - beta) * D_KL(mu || pi^w)]  (Eq. 3, 10, 11): the
     gradient is beta g - (1 - beta) g^D with g the deterministic policy gradient over near rows and g^D the
     KL gradient over all (covered) rows; pi's std is pinned to sigma (as smarties), so the KL is
     |m^w(s) - m_t|^2 / (2 sigma^2) in either direction;
  3. Polyak update of both target networks.
An optimizer step whose loss has no contributing row (every row far under Rule 1 alone) is not taken, and the
targets then stay as they are: far rows change nothing, not even through Adam's momentum.

Without ReF-ER hints this is plain DDPG (uniform replay or PER; ``td_error`` signal). ``refer_rule1`` /
``refer_rule2`` switch each rule off for the paper's ReF-ER-1 / ReF-ER-2 ablations. Rows of a source the ReF-ER
sampler does not cover (offline rows when ReF-ER is on the online part of a mixture, ``refer_source`` hint) have
no behaviour record: they are near and carry no KL term. Signals: ``td_error`` [B] and, with ReF-ER, ``rho`` [B].
Metric ``train/kl_behaviour``: mean D_KL(mu_t || pi^w) of the replayed rows with a record under the actor before
the step (the paper's Fig. 2), logged with or without ReF-ER.

Defaults: CleanRL's DDPG (Adam 3e-4, tau 0.005, 256x256) but the ReF-ER paper's sigma 0.2; the paper ran DDPG
with lr 1e-4 (critic) / 1e-5 (actor), which ``DDPGConfig.paper()`` gives (with the authors' 2x128 networks and
critic L2 penalty 1e-4, ``critic_weight_decay``); the ``ddpg*_paper`` presets use it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
from torch import nn

from relive.agents import encoders as enc
from relive.agents import networks as nets
from relive.agents import refer
from relive.agents.encoders import flat_obs, flat_obs_batch
from relive.hooks import OnEpisodeEnd, OnEpisodeStart
from relive.registry import register_agent
from relive.types import Acted, Batch, ColumnDecl, UpdateResult

NOISES = ("gaussian", "ou")


@dataclass(frozen=True)
class DDPGConfig:
    """DDPG hyperparameters, with the ReF-ER rule switches (the rules apply only under a ReF-ER sampler)."""

    hidden: tuple[int, ...] = (256, 256)  # hidden layer widths of the actor and of the critic
    gamma: float = 0.99  # discount
    n_step: int = 1  # TD targets on n-step returns, which the buffer sums at sample time; 1: one-step
    tau: float = 0.005  # Polyak rate of the target actor and critic
    actor_lr: float = 3e-4  # Adam learning rate of the actor (ReF-ER paper: 1e-5)
    critic_lr: float = 3e-4  # Adam learning rate of the critic (ReF-ER paper: 1e-4)
    # L2 penalty of the critic (Adam weight decay; 0: none). The ReF-ER paper (Sec. 5.1) found it necessary for
    # DDPG with ER / PER without giving a value; its authors' code sets 1e-4 (smarties DPG.cpp, nnLambda);
    # Lillicrap et al. used 1e-2
    critic_weight_decay: float = 0.0
    exploration_noise: str = "gaussian"  # "gaussian" (needed by ReF-ER) or "ou" (Ornstein-Uhlenbeck, no ReF-ER)
    sigma: float = 0.2  # exploration std, in units of the action box's half-width (ReF-ER paper: 0.2)
    ou_theta: float = 0.15  # OU mean reversion per step (Lillicrap et al.)
    refer_rule1: bool = True  # under ReF-ER: far rows contribute no gradient (off: the paper's ReF-ER-2)
    refer_rule2: bool = True  # under ReF-ER: beta g - (1 - beta) grad KL for the actor (off: ReF-ER-1)
    kl_direction: str = "mu_pi"  # "mu_pi" (the paper) or "pi_mu" (smarties); equal here (pinned std)
    init: str = "torch"  # parameter init: "torch" (nn.Linear default) or "xavier"
    # TD3's target policy smoothing (Fujimoto et al. 2018, Eq. 14): the target action m'(s') + clip(N(0, std^2),
    # -clip, clip), both in units of the action box's half-width (TD3: 0.2, 0.5); 0: plain DDPG targets
    target_noise: float = 0.0
    target_noise_clip: float = 0.5
    # TD3's clipped double-Q (Eq. 10): this many critics, each regressed on one target built from the min of the
    # target critics (TD3: 2; 1: DDPG's single critic). The actor ascends the first critic (TD3 Alg. 1)
    num_critics: int = 1
    # TD3's delayed policy updates (Alg. 1, d = 2): the actor and the target networks step once every this many
    # critic steps (1: every step, DDPG)
    actor_every: int = 1
    # the HER paper's actor penalty (Andrychowicz et al. 2017, App. A: "we penalize the square of the
    # pre-activations"; its code: the mean squared action in half-widths, coefficient 1): + action_l2 E[(a/scale)^2]
    action_l2: float = 0.0
    # critic targets clipped to [low, high] (HER, App. A: to [-1/(1-gamma), 0], the range of possible returns of
    # rewards in {-1, 0}); null: unclipped
    target_range: tuple[float, float] | None = None
    # dict observations (goal-conditioned tasks): the keys the networks read, concatenated in sorted order; (): all
    obs_keys: tuple[str, ...] = ()
    # the HER code's exploration (openai/baselines her/ddpg.py get_actions; DEFAULT_PARAMS random_eps 0.3): the
    # probability that an exploring step's action is replaced by a uniformly random one from the box; 0: never
    # (sigma above is baselines' noise_eps, 0.2 there: Gaussian std in fractions of max_u, the box's half-width)
    random_eps: float = 0.0
    # the HER code's input normalization (baselines her/normalizer.py, her/ddpg.py _preprocess_og; DEFAULT_PARAMS
    # norm_eps 0.01, norm_clip 5, clip_obs 200): inputs clipped to [-obs_clip, obs_clip], then
    # clip((x - mean) / std, -obs_norm_clip, obs_norm_clip) with running statistics of the collected rows (module
    # docstring); obs_norm_eps floors std. Off: the inputs as they are (obs_clip unused)
    obs_norm: bool = False
    obs_norm_eps: float = 0.01
    obs_norm_clip: float = 5.0
    obs_clip: float = 200.0

    def __post_init__(self):
        if not 0 < self.tau <= 1 or not 0 <= self.gamma <= 1:
            raise ValueError(f"tau must be in (0, 1] and gamma in [0, 1], got tau={self.tau}, gamma={self.gamma}")
        if self.exploration_noise not in NOISES:
            raise ValueError(f"exploration_noise must be one of {NOISES}, got {self.exploration_noise!r}")
        if not self.critic_weight_decay >= 0:
            raise ValueError(f"critic_weight_decay must be >= 0, got {self.critic_weight_decay}")
        if self.sigma <= 0 or not 0 < self.ou_theta <= 1:
            raise ValueError(f"sigma must be > 0 and ou_theta in (0, 1], got {self.sigma}, {self.ou_theta}")
        if self.kl_direction not in refer.KL_DIRECTIONS:
            raise ValueError(f"kl_direction must be one of {refer.KL_DIRECTIONS}, got {self.kl_direction!r}")
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if self.init not in nets.INIT_SCHEMES:
            raise ValueError(f"init must be one of {nets.INIT_SCHEMES}, got {self.init!r}")
        nets.check_n_step(self.n_step)
        if not (self.target_noise >= 0 and self.target_noise_clip >= 0 and self.action_l2 >= 0):
            raise ValueError(f"target_noise, target_noise_clip and action_l2 must be >= 0, got {self.target_noise}, "
                             f"{self.target_noise_clip}, {self.action_l2}")
        if self.target_range is not None and (len(self.target_range) != 2
                                              or not self.target_range[0] < self.target_range[1]):
            raise ValueError(f"target_range must be (low, high) with low < high, or null, got {self.target_range}")
        enc.check_obs_keys(self.obs_keys)
        if not 0 <= self.random_eps <= 1:
            raise ValueError(f"random_eps must be in [0, 1], got {self.random_eps}")
        if not isinstance(self.obs_norm, bool):
            raise ValueError(f"obs_norm must be a bool, got {self.obs_norm!r}")
        if not (self.obs_norm_eps > 0 and self.obs_norm_clip > 0 and self.obs_clip > 0):
            raise ValueError(f"obs_norm_eps, obs_norm_clip and obs_clip must be > 0, got {self.obs_norm_eps}, "
                             f"{self.obs_norm_clip}, {self.obs_clip}")
        for name in ("num_critics", "actor_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @classmethod
    def paper(cls, **overrides) -> DDPGConfig:
        """The ReF-ER paper's DDPG (Sec. 5.1, below Fig. 2: "we use eta = 1e-4 for the critic and eta = 1e-5 for the
        policy"; Sec. 2 / Fig. 2: Gaussian exploration sigma 0.2), with the authors' code where the paper gives no
        value: 2x128 networks (smarties settings/DPG.json: a 128-unit encoder and a 128-unit layer) and the critic's
        L2 penalty 1e-4 (smarties DPG.cpp; the paper, Sec. 5.1, found a critic weight decay necessary). The rest
        (tau, batch, gamma) are relive's defaults: the paper's text does not give them."""
        return replace(cls(actor_lr=1e-5, critic_lr=1e-4, hidden=(128, 128), critic_weight_decay=1e-4), **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


class DeterministicActor(nn.Module):
    """m^w(s) = center + scale * tanh(f(s)): a deterministic action inside the box."""

    scale: torch.Tensor  # the action box (buffers registered in __init__)
    center: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], action_low, action_high):
        super().__init__()
        low, high = nets.action_box(action_low, action_high, action_dim)
        self.net = nets.mlp(obs_dim, hidden, action_dim)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2))
        self.register_buffer("center", torch.as_tensor((high + low) / 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.center + self.scale * torch.tanh(self.net(obs))


class InputNormalizer(nn.Module):
    """Running mean / std of the network inputs, as baselines' Normalizer (her/normalizer.py) with its clips
    (her/ddpg.py ``_preprocess_og``): ``x -> clip((clip(x, -obs_clip, obs_clip) - mean) / std, -clip, clip)``.

    ``update(x)`` adds rows (clipped to obs_clip first, as baselines feeds its preprocessed rows) to the sums, then
    recomputes mean = sum / count and std = sqrt(max(eps^2, sumsq / count - mean^2)); count starts at 1 (baselines'
    ``tf.ones_initializer``), mean and std start at 0 and 1. Sums in float64 (baselines: float32)."""

    count: torch.Tensor  # (buffers registered in __init__)
    sum: torch.Tensor
    sumsq: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, dim: int, eps: float = 0.01, clip: float = 5.0, obs_clip: float = 200.0):
        super().__init__()
        self.eps, self.clip, self.obs_clip = float(eps), float(clip), float(obs_clip)
        self.register_buffer("count", torch.ones(1, dtype=torch.float64))
        self.register_buffer("sum", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("sumsq", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))

    @torch.no_grad()
    def update(self, x) -> None:
        x = torch.as_tensor(np.asarray(x, np.float64), device=self.sum.device).reshape(-1, self.sum.shape[0])
        x = x.clamp(-self.obs_clip, self.obs_clip)
        self.sum += x.sum(0)
        self.sumsq += (x * x).sum(0)
        self.count += x.shape[0]
        mean = self.sum / self.count
        var = torch.clamp(self.sumsq / self.count - mean * mean, min=self.eps**2)
        self.mean.copy_(mean)
        self.std.copy_(var.sqrt())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.clamp(-self.obs_clip, self.obs_clip)
        return ((x - self.mean) / self.std).clamp(-self.clip, self.clip)


@register_agent("ddpg", DDPGConfig)
class DDPG:
    """DDPG with optional ReF-ER rules (see the module docstring)."""

    # what a Ray collector's copy needs to act (relive.train.ray_collectors); the normalizer is the identity's
    # few numbers when obs_norm is off
    acting_modules = ("actor", "obs_normalizer")

    def __init__(self, obs_dim: int, action_dim: int, action_low, action_high, config: DDPGConfig | None = None,
                 seed: int = 0, device: str = "cpu"):
        self.cfg = cfg = config if config is not None else DDPGConfig()
        self.obs_dim, self.action_dim = int(obs_dim), int(action_dim)
        self.device = torch.device(device)
        self.action_low = np.asarray(action_low, np.float32).reshape(-1)
        self.action_high = np.asarray(action_high, np.float32).reshape(-1)
        init_gen = torch.Generator().manual_seed(int(seed))
        self.gen = torch.Generator(device=self.device).manual_seed(int(seed) + 1)  # exploration noise
        with nets.private_rng():
            actor = DeterministicActor(obs_dim, action_dim, cfg.hidden, action_low, action_high)
            critic = nets.EnsembleCritic(cfg.num_critics, obs_dim, action_dim, cfg.hidden)
        self.actor = nets.init_(actor, init_gen, cfg.init).to(self.device)
        self.critic = nets.init_(critic, init_gen, cfg.init).to(self.device)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = nets.adam(self.actor.parameters(), cfg.actor_lr)
        self.critic_opt = nets.adam(self.critic.parameters(), cfg.critic_lr, cfg.critic_weight_decay)
        self.std = cfg.sigma * self.actor.scale  # [A] exploration std in env units: mu's and (pinned) pi's
        self.ou_state = torch.zeros(0, action_dim, device=self.device)  # [N, A] OU noise, in half-widths
        self.obs_normalizer = InputNormalizer(obs_dim, cfg.obs_norm_eps, cfg.obs_norm_clip,
                                              cfg.obs_clip).to(self.device)
        self.num_updates = 0

    @classmethod
    def from_spec(cls, spec, config: DDPGConfig, seed, device: str = "cpu") -> DDPG:
        """Build for an environment (``relive.envs.EnvSpec``); ``seed``: int or SeedSequence."""
        if spec.discrete:
            raise ValueError(f"{cls.__name__} needs a continuous action space; {spec.id} is discrete")
        if isinstance(spec.obs_shape, Mapping) and not enc.image_keys(spec.obs_shape):  # goal dicts: keys concatenated
            obs_dim = enc.flat_obs_dim(enc.pick_keys(spec.obs_shape, config.obs_keys))
        elif config.obs_keys and not isinstance(spec.obs_shape, Mapping):
            raise ValueError(f"agent.obs_keys {list(config.obs_keys)} selects keys of dict observations; {spec.id} "
                             f"has flat observations {spec.obs_shape}")
        else:
            obs_dim = nets.vector_obs_dim(spec, "DDPG")
        return cls(obs_dim, spec.action_shape[0], spec.action_low, spec.action_high, config,
                   seed=nets.seed_int(seed), device=device)

    # -- acting ----------------------------------------------------------------------------------------
    def stored_columns(self) -> tuple[ColumnDecl, ...]:
        a = (self.action_dim,)
        return (ColumnDecl("mu_mean", a, doc="behaviour mean m^w(s) at collection (env units); ReF-ER's mu_t"),
                ColumnDecl("mu_std", a, doc="behaviour std (sigma x half-width); 0 = no record (offline rows)"))

    @torch.no_grad()
    def act(self, obs: np.ndarray, explore: bool):
        """``Acted(action [N, A], record={"mu_mean": m^w(s), "mu_std": sigma})``: a = m^w(s) + noise if
        ``explore``, else m^w(s); clipped to the box. A single observation gives a single bare action."""
        o, single = nets.as_obs_tensor(enc.pick_keys(obs, self.cfg.obs_keys), self.obs_dim, self.device)
        mean = self.actor(self.inputs(o))
        a = mean
        if explore:
            if self.cfg.exploration_noise == "gaussian":
                a = mean + self.std * torch.randn(mean.shape, generator=self.gen, device=self.device)
            else:
                a = mean + self.actor.scale * self._ou_step(mean.shape[0])
        a = np.clip(a.cpu().numpy(), self.action_low, self.action_high)
        if explore and self.cfg.random_eps > 0:  # baselines' eps-greedy: the whole action, per env, after the clip
            n = a.shape[0]
            pick = torch.rand(n, generator=self.gen, device=self.device) < self.cfg.random_eps
            u = torch.rand(a.shape, generator=self.gen, device=self.device).cpu().numpy()
            a = np.where(pick.cpu().numpy()[:, None], self.action_low + u * (self.action_high - self.action_low), a)
            a = a.astype(np.float32)
        if single:
            return a[0]
        m = mean.cpu().numpy()
        return Acted(a, record={"mu_mean": m, "mu_std": np.broadcast_to(self.std.cpu().numpy(), m.shape).copy()})

    def _ou_step(self, n: int) -> torch.Tensor:
        """x <- x - theta x + sigma eps (Lillicrap et al., theta 0.15, dt 1), one state per env."""
        if self.ou_state.shape[0] != n:
            self.ou_state = torch.zeros(n, self.action_dim, device=self.device)
        eps = torch.randn(self.ou_state.shape, generator=self.gen, device=self.device)
        self.ou_state = self.ou_state - self.cfg.ou_theta * self.ou_state + self.cfg.sigma * eps
        return self.ou_state

    def reset_noise(self, env: int | None = None) -> None:
        """OU noise back to 0: every env's (``env=None``) or env ``env``'s alone (its episode starts; the others'
        noise goes on). A state not yet sized for ``env`` is zero when ``_ou_step`` sizes it."""
        if env is None:
            self.ou_state = torch.zeros(0, self.action_dim, device=self.device)
        elif env < self.ou_state.shape[0]:
            self.ou_state[env] = 0.0

    def inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The networks' input: ``obs`` (flat, torch) normalized when ``obs_norm`` is on, else as it is."""
        return self.obs_normalizer(obs) if self.cfg.obs_norm else obs

    def observe_rows(self, obs) -> None:
        """Add stored rows' observations (a dict observation: the ``obs_keys``) to the input statistics."""
        self.obs_normalizer.update(flat_obs(enc.pick_keys(obs, self.cfg.obs_keys)))

    def loop_hooks(self, ctx) -> list:
        hooks: list = [OnEpisodeStart(self.reset_noise, per_env=True)] if self.cfg.exploration_noise == "ou" else []
        if self.cfg.obs_norm:  # the statistics from each online episode's stored rows, once each, when it ends
            hooks.append(OnEpisodeEnd(lambda slots: self.observe_rows(ctx.buffer.storage.read("obs", slots))))
        return hooks

    # -- ReF-ER ----------------------------------------------------------------------------------------
    def log_rho(self, mean: torch.Tensor, action, mu_mean, mu_std) -> torch.Tensor:
        """Clipped log pi^w(a|s) / mu(a|s) with pi^w = N(m^w(s), sigma^2) (std pinned): [B]."""
        return refer.gaussian_log_rho(mean, self.std.expand_as(mean), mu_mean, mu_std, action)

    @torch.no_grad()
    def refer_log_rho(self, obs, action, mu_mean, mu_std) -> np.ndarray:
        """The sampler's recount: clipped log rho of stored rows under the current actor: [n] NumPy."""
        t = [torch.as_tensor(np.asarray(x, np.float32), device=self.device)
             for x in (flat_obs(enc.pick_keys(obs, self.cfg.obs_keys)), action, mu_mean, mu_std)]
        return self.log_rho(self.actor(self.inputs(t[0])), *t[1:]).cpu().numpy()

    def refer_masks(self, b: Batch, mean: torch.Tensor | None = None):
        """(covered, near, rho, mu_std) of a torch batch under the current actor (``refer.batch_rows``); ``mean``:
        m^w(s) of the batch if already computed."""
        if "c_max" in b.info.hints and (self.cfg.exploration_noise != "gaussian" or self.cfg.random_eps > 0):
            raise ValueError("ReF-ER needs Gaussian exploration (rho needs the behaviour's density); "
                             f"exploration_noise is {self.cfg.exploration_noise!r}, random_eps {self.cfg.random_eps}")
        m = (lambda: self.actor(b.obs)) if mean is None else (lambda: mean)
        return refer.batch_rows(b, lambda mu_std: self.log_rho(m(), b.action, b.mu_mean, mu_std), self.cfg.refer_rule1)

    @torch.no_grad()
    def behaviour_kl(self, b: Batch, mean: torch.Tensor | None = None) -> dict[str, float]:
        """``{"train/kl_behaviour": mean D_KL(mu_t || pi^w)}`` over the batch's rows that have a behaviour record
        (std > 0): the paper's Fig. 2 measure of how off-policy the replayed data is ({} without records)."""
        if "mu_std" not in b.extras:
            return {}
        has = (b.mu_std > 0).all(-1)
        if not has.any():
            return {}
        mean = self.actor(b.obs[has]) if mean is None else mean[has]
        kl = refer.refer_kl(b.mu_mean[has], b.mu_std[has], mean, self.std.expand_as(mean))
        return {"train/kl_behaviour": kl.mean().item()}

    # -- losses (pure; unit-tested) --------------------------------------------------------------------
    @torch.no_grad()
    def critic_target(self, reward, next_obs, terminated, discount=None) -> torch.Tensor:
        """y = r + gamma (1 - terminated) Q'(s', m'(s')) (Eq. 2 with the target networks; with several critics the
        min over the target critics, TD3 Eq. 10): [B]. ``discount``: an n-step batch's gamma^{n'} (1 - terminated)
        (``reward`` its n-step return, ``next_obs`` s_{t+n'})."""
        next_a = self.target_actor(next_obs)
        if self.cfg.target_noise > 0:  # TD3's target policy smoothing, in half-widths of the box
            eps = torch.randn(next_a.shape, generator=self.gen, device=self.device) * self.cfg.target_noise
            eps = eps.clamp(-self.cfg.target_noise_clip, self.cfg.target_noise_clip)
            next_a = torch.maximum(torch.minimum(next_a + self.actor.scale * eps, self.actor.center + self.actor.scale),
                                   self.actor.center - self.actor.scale)
        q_next = self.target_critic(next_obs, next_a).min(dim=0).values  # one critic: its value
        if discount is None:
            discount = self.cfg.gamma * (1.0 - terminated)
        y = reward + discount * q_next
        return y if self.cfg.target_range is None else y.clamp(*self.cfg.target_range)

    def critic_loss(self, b: Batch, near: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """E[is_weight * near * sum_i (Q_i(s, a) - y)^2] over the batch (Rule 1 masks far rows; TD3 sums its two
        critics' losses): (loss, Q_1 [B], y [B])."""
        y = self.critic_target(b.reward, b.next_obs, b.terminated,
                               nets.td_discount(b, self.cfg.n_step, type(self).__name__))
        q = self.critic(b.obs, b.action)  # [E, B]
        return nets.weighted_mean(((q - y) ** 2).sum(0), nets.is_weight_of(b) * near), q[0], y

    def actor_loss(self, b: Batch, near, covered, beta: float, mu_std=None) -> tuple[torch.Tensor, torch.Tensor]:
        """E[beta * near * (-Q(s, m^w(s))) + (1 - beta) * covered * KL(mu || pi^w)] (Eq. 3, 10, 11): its negative
        gradient is beta g - (1 - beta) g^D. (loss, KL [B]). The critic must be frozen by the caller."""
        mean = self.actor(b.obs)
        dpg = -self.critic(b.obs, mean)[0]
        if self.cfg.action_l2:  # HER's penalty on the (half-width) actions, per row
            dpg = dpg + self.cfg.action_l2 * (((mean - self.actor.center) / self.actor.scale) ** 2).mean(-1)
        if beta == 1.0:  # plain DDPG / Rule 1 only: no KL term (and no behaviour columns needed)
            return (near * dpg).mean(), torch.zeros_like(dpg)
        mu_std = b.mu_std if mu_std is None else mu_std
        kl = refer.refer_kl(b.mu_mean, mu_std, mean, self.std.expand_as(mean), self.cfg.kl_direction) * covered
        return (beta * near * dpg + (1.0 - beta) * kl).mean(), kl.detach()

    # -- the update ------------------------------------------------------------------------------------
    def update(self, batch: Batch) -> UpdateResult:
        b = self._to_torch(batch)
        # 0. ReF-ER: annealed learning rates (Eq. 13) and the near/far split of the batch (Sec. 3)
        hints = b.info.hints
        with torch.no_grad():  # m^w(s) before the step: rho, and the KL metric (Fig. 2), when rows have records
            mean = self.actor(b.obs) if "mu_std" in b.extras else None
        covered, near, rho, mu_std = self.refer_masks(b, mean)
        kl_metric = self.behaviour_kl(b, mean)
        refer_on = "c_max" in hints
        beta = float(hints["beta"]) if refer_on and self.cfg.refer_rule2 else 1.0
        if "lr_scale" in hints:
            refer.set_lr(self.critic_opt, self.cfg.critic_lr * float(hints["lr_scale"]))
            refer.set_lr(self.actor_opt, self.cfg.actor_lr * float(hints["lr_scale"]))
        # 1. critic (Eq. 2), far rows masked (Rule 1)
        critic_loss, q, y = self.critic_loss(b, near)
        critic_steps = bool((b.info.is_weight * near).any())
        if critic_steps:
            _step(self.critic_opt, critic_loss)
        # 2. actor: beta * DPG on near rows - (1 - beta) * grad KL on all rows (Eq. 3, 10, 11); with delayed policy
        # updates (TD3 Alg. 1) only every actor_every-th update, like the target networks
        actor_turn = (self.num_updates + 1) % self.cfg.actor_every == 0
        actor_steps = False
        kl = torch.zeros_like(near)
        if actor_turn:
            self.critic.requires_grad_(False)
            actor_loss, kl = self.actor_loss(b, near, covered, beta, mu_std)
            actor_steps = bool(near.any()) or beta < 1.0
            if actor_steps:
                _step(self.actor_opt, actor_loss)
            self.critic.requires_grad_(True)
        # 3. target networks (Polyak)
        if actor_turn and (critic_steps or actor_steps):
            nets.polyak(self.target_critic, self.critic, self.cfg.tau)
            nets.polyak(self.target_actor, self.actor, self.cfg.tau)
        self.num_updates += 1
        metrics = {"train/critic_loss": critic_loss.item(), "train/q_mean": q.mean().item(),
                   "train/target_mean": y.mean().item()} | kl_metric
        if actor_turn:  # (as SAC's delayed actor: no actor loss on a critic-only step)
            metrics["train/actor_loss"] = actor_loss.item()
        signals = nets.signals_out(batch, td_error=q - y)
        if refer_on:
            metrics |= {"train/refer_near_fraction": near.mean().item(), "train/refer_beta": beta,
                        "train/refer_kl": kl.mean().item()}
            signals["rho"] = rho.cpu().numpy().astype(np.float64)
        return UpdateResult(metrics, signals)

    def _to_torch(self, batch: Batch) -> Batch:
        batch = flat_obs_batch(enc.pick_batch_keys(batch, self.cfg.obs_keys))  # dict obs: keys concatenated (the seam)
        if batch.obs.ndim != 2 or batch.obs.shape[1] != self.obs_dim:
            raise ValueError(f"batch.obs must have shape [B, {self.obs_dim}], got {tuple(batch.obs.shape)}")
        if batch.action.ndim != 2 or batch.action.shape[1] != self.action_dim:
            raise ValueError(f"batch.action must have shape [B, {self.action_dim}], got {tuple(batch.action.shape)}")
        b = batch.to_torch(self.device, dtype=torch.float32)
        if self.cfg.obs_norm:  # (the actor, the critic and their targets all read normalized inputs)
            b = replace(b, obs=self.inputs(b.obs), next_obs=self.inputs(b.next_obs))
        return b

    # -- state -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "actor": nets.module_state(self.actor),
            "critic": nets.module_state(self.critic),
            "target_actor": nets.module_state(self.target_actor),
            "target_critic": nets.module_state(self.target_critic),
            "actor_opt": nets.optimizer_state(self.actor_opt),
            "critic_opt": nets.optimizer_state(self.critic_opt),
            "generator": nets.generator_state(self.gen),
            "ou_state": self.ou_state.cpu().numpy().copy(),
            "counters": {"num_updates": self.num_updates},
        } | ({"obs_normalizer": nets.module_state(self.obs_normalizer)} if self.cfg.obs_norm else {})

    def load_state_dict(self, state: dict) -> None:
        for name in ("actor", "critic", "target_actor", "target_critic"):
            nets.load_module_state(getattr(self, name), state[name])
        nets.load_optimizer_state(self.actor_opt, state["actor_opt"])
        nets.load_optimizer_state(self.critic_opt, state["critic_opt"])
        nets.load_generator_state(self.gen, state["generator"])
        self.ou_state = torch.as_tensor(np.asarray(state["ou_state"], np.float32), device=self.device)
        self.num_updates = int(state["counters"]["num_updates"])
        if self.cfg.obs_norm:
            if "obs_normalizer" not in state:
                raise ValueError("this DDPG normalizes its inputs (agent.obs_norm) but the saved state has no input "
                                 "statistics (saved by a DDPG without obs_norm?)")
            nets.load_module_state(self.obs_normalizer, state["obs_normalizer"])


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
