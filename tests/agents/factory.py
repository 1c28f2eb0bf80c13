"""Small agents and hand-made batches shared by the agent tests.

``REGISTERED`` maps every registered agent to the factory kinds (configurations) that put it through the contract
(``tests/agents/test_contract.py``); a newly registered agent without an entry fails that test."""

from __future__ import annotations

import functools

import numpy as np
import torch

from relive.agents.cal_ql import CalQL, CalQLConfig
from relive.agents.ddpg import DDPG, DDPGConfig
from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig
from relive.agents.sac import SAC, SACConfig
from relive.agents.sac_refer import SACReFER, SACReFERConfig
from relive.agents.vracer import Q_RET_UNSET, VRACER, VRACERConfig
from relive.types import Batch, SampleInfo

OBS, ACT, NUM_ACTIONS, B = 5, 2, 3, 32
LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32)
SMALL = dict(hidden=(32, 32))

# registered agent name -> the kinds below that configure it (each runs the whole contract)
REGISTERED: dict[str, tuple[str, ...]] = {
    "sac": ("sac", "rlpd"),
    "calql": ("calql", "calql_lagrange", "calql_corl"),
    "ddqn": ("ddqn",),
    "ddpg": ("ddpg", "ddpg_refer", "td3", "ddpg_her"),
    "sac_refer": ("sac_refer",),
    "vracer": ("vracer", "vracer_refer"),
    "residual_sac": ("residual_sac", "residual_sac_pretrain"),
}
KINDS = [k for kinds in REGISTERED.values() for k in kinds]
AGENT_OF = {k: name for name, kinds in REGISTERED.items() for k in kinds}
DISCRETE = ["ddqn"]
CONTINUOUS = [k for k in KINDS if k not in DISCRETE]
# the kinds whose batches carry a ReF-ER sampler's hints (c_max so large that no row is far: Rule 2 and the rho
# signal are exercised, Rule 1's masks are tested in test_refer.py)
REFER_HINTS = {"c_max": 1e6, "beta": 0.6, "lr_scale": 1.0, "refer_source": -1}
HINTED = ("ddpg_refer", "sac_refer", "vracer_refer")
# the per-sample signals each kind's update promises (what the samplers read: PER td_error, ARB log_likelihood,
# ReF-ER rho)
SIGNALS = {k: {"td_error", "log_likelihood"} for k in ("sac", "rlpd", "calql", "calql_lagrange", "calql_corl")} | {
    "ddqn": {"td_error"}, "ddpg": {"td_error"}, "td3": {"td_error"}, "ddpg_her": {"td_error"},
    "ddpg_refer": {"td_error", "rho"},
    "sac_refer": {"td_error", "log_likelihood", "rho"}, "vracer": {"rho", "td_error"},
    "vracer_refer": {"rho", "td_error"},
    "residual_sac": {"td_error"}, "residual_sac_pretrain": {"td_error"}}


class LinearBase:
    """A fixed linear base policy for residual SAC, a = W x + b on NumPy arrays (no torch module: building it
    draws nothing from the global RNG)."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w = (0.3 * rng.normal(size=(ACT, OBS))).astype(np.float32)
        self.b = (0.1 * rng.normal(size=ACT)).astype(np.float32)

    def __call__(self, obs):
        return np.asarray(obs, np.float32) @ self.w.T + self.b


def make(kind: str, seed: int = 0, **overrides):
    """A small agent of the given kind; ``overrides`` replace config fields."""
    if kind == "sac":
        return SAC(OBS, ACT, LOW, HIGH, SACConfig(**(SMALL | overrides)), seed=seed)
    if kind == "rlpd":  # actor every step so that one update exercises everything
        cfg = SACConfig.rlpd(**(dict(SMALL, num_qs=5, actor_every=1) | overrides))
        return SAC(OBS, ACT, LOW, HIGH, cfg, seed=seed)
    if kind == "calql":
        return CalQL(OBS, ACT, LOW, HIGH, CalQLConfig(**(dict(SMALL, cql_n_actions=3) | overrides)), seed=seed)
    if kind == "calql_lagrange":  # + importance sampling off, plain targets, 4 members: the other branches
        cfg = dict(SMALL, cql_n_actions=3, lagrange=True, max_target_backup=False, cql_importance_sample=False,
                   num_qs=4, num_min_qs=2)
        return CalQL(OBS, ACT, LOW, HIGH, CalQLConfig(**(cfg | overrides)), seed=seed)
    if kind == "calql_corl":
        cfg = dict(SMALL, cql_n_actions=3, calibrate_online=False, clip_diff_min=-5.0)
        agent = CalQL(OBS, ACT, LOW, HIGH, CalQLConfig(**(cfg | overrides)), seed=seed)
        agent.set_online(True)
        return agent
    if kind == "ddqn":
        return DDQN(OBS, NUM_ACTIONS, DDQNConfig(**(dict(SMALL, target_update_period=2) | overrides)), seed=seed)
    if kind in ("ddpg", "ddpg_refer"):
        return DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(**(SMALL | overrides)), seed=seed)
    if kind == "td3":  # twin critics and smoothing; actor every step so that one update exercises everything
        cfg = dict(SMALL, num_critics=2, target_noise=0.2, actor_every=1)
        return DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(**(cfg | overrides)), seed=seed)
    if kind == "ddpg_her":  # the HER code's options: random actions, inputs normalized by statistics of some rows
        cfg = dict(SMALL, random_eps=0.3, obs_norm=True, action_l2=1.0, target_range=(-50.0, 0.0))
        agent = DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(**(cfg | overrides)), seed=seed)
        agent.observe_rows(np.random.default_rng(seed + 7).normal(2.0, 3.0, size=(40, OBS)))
        return agent
    if kind == "sac_refer":
        return SACReFER(OBS, ACT, LOW, HIGH, SACReFERConfig(**(SMALL | overrides)), seed=seed)
    if kind in ("vracer", "vracer_refer"):
        return VRACER(OBS, ACT, LOW, HIGH, VRACERConfig(**(SMALL | overrides)), seed=seed)
    if kind in ("residual_sac", "residual_sac_pretrain"):  # no base-only warm-up, no probing: every step acts
        cfg = ResidualSACConfig(**(dict(SMALL, warmup=0, probe_max_steps=0, cql_n_actions=3) | overrides))
        agent = ResidualSAC(OBS, ACT, LOW, HIGH, cfg, seed=seed, base_policy=LinearBase())
        if kind == "residual_sac_pretrain":  # the offline phase: Cal-QL critic pre-training
            agent.on_phase("offline")
        return agent
    raise ValueError(kind)


def from_spec_kwargs(kind: str) -> dict:
    """What ``from_spec`` needs beside (spec, config, seed, device) for this kind."""
    return {"base_policy": LinearBase()} if AGENT_OF[kind] == "residual_sac" else {}


@functools.cache
def columns(kind: str) -> tuple:
    """The stored columns the kind's agent declares (``ColumnDecl``s)."""
    return tuple(getattr(make(kind), "stored_columns", tuple)())


def _column(name: str, rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    """Values for a declared column of ``n`` rows (what a buffer would hold)."""
    if name == "mc_return":
        return rng.normal(size=n).astype(np.float32)
    if name == "mu_mean":  # behaviour mean (env units; SAC + ReF-ER: pre-squash)
        return (0.5 * rng.normal(size=(n, ACT))).astype(np.float32)
    if name == "mu_std":
        return rng.uniform(0.3, 1.0, (n, ACT)).astype(np.float32)
    if name == "q_ret":  # a third without a target yet (the one-step fallback)
        return np.where(rng.random(n) < 0.3, Q_RET_UNSET, rng.normal(size=n)).astype(np.float32)
    if name == "base_action":
        return rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32)
    if name == "delta_action":
        return rng.uniform(-(HIGH - LOW) / 2, (HIGH - LOW) / 2, (n, ACT)).astype(np.float32)
    if name == "beta":
        return rng.uniform(0, 1, n).astype(np.float32)
    raise ValueError(f"tests/agents/factory.py: no values for column {name!r} (declared by {kind!r}); add them to "
                     f"_column")


def batch(kind: str, seed: int = 0, n: int = B, is_weight=None, terminated=None, truncated=None,
          mc_return=None) -> Batch:
    """A batch as the buffer would hand it to ``kind``'s agent: the core columns and exactly the columns the
    agent declares (``columns(kind)``), with a ReF-ER sampler's hints for the ``HINTED`` kinds."""
    rng = np.random.default_rng(seed)
    if kind == "ddqn":
        action = rng.integers(0, NUM_ACTIONS, n).astype(np.int64)
    else:
        action = rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n),
                      np.ones(n, np.float32) if is_weight is None else np.asarray(is_weight, np.float32),
                      np.zeros(n, np.int8), hints=dict(REFER_HINTS) if kind in HINTED else {})
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    reward = rng.normal(size=n).astype(np.float32)
    next_obs = rng.normal(size=(n, OBS)).astype(np.float32)
    done = rng.random(n) < 0.2
    extras = {c.name: _column(c.name, rng, n, kind) for c in columns(kind)}
    if mc_return is not None:
        extras["mc_return"] = np.asarray(mc_return, np.float32)
    return Batch(obs=obs, action=action, reward=reward, next_obs=next_obs,
                 terminated=done if terminated is None else np.asarray(terminated, bool),
                 truncated=np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool), info=info,
                 extras=extras)


def replace_rows(b: Batch, other: Batch, rows: np.ndarray) -> Batch:
    """``b`` with the given rows taken from ``other`` (sample info kept from ``b``)."""
    def mix(x, y):
        x = np.array(x, copy=True)
        x[rows] = y[rows]
        return x
    cols = {k: mix(getattr(b, k), getattr(other, k))
            for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    return Batch(**cols, info=b.info, extras={k: mix(v, other.extras[k]) for k, v in b.extras.items()})


def modules(agent) -> dict[str, torch.nn.Module]:
    """Every torch module the agent holds (networks and their targets), by attribute name."""
    return {k: v for k, v in vars(agent).items() if isinstance(v, torch.nn.Module)}


def flat_params(agent, exclude=()) -> torch.Tensor:
    """Every learned number of the agent (networks, targets, temperatures) in one vector; ``exclude``: module names
    left out."""
    parts = [p.detach().flatten() for name, m in modules(agent).items() if name not in exclude
             for p in m.parameters()]
    for name in ("log_alpha", "log_alpha_prime"):
        if hasattr(agent, name) and name not in exclude:
            parts.append(getattr(agent, name).detach().reshape(1))
    return torch.cat(parts)
