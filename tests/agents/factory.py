"""Small agents and hand-made batches shared by the agent tests."""

from __future__ import annotations

import numpy as np
import torch

from relive.agents.cal_ql import CalQL, CalQLConfig
from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.sac import SAC, SACConfig
from relive.types import Batch, SampleInfo

OBS, ACT, NUM_ACTIONS, B = 5, 2, 3, 32
LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32)
SMALL = dict(hidden=(32, 32))

KINDS = ["sac", "rlpd", "calql", "calql_lagrange", "calql_corl", "ddqn"]
CONTINUOUS = [k for k in KINDS if k != "ddqn"]


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
    raise ValueError(kind)


def batch(kind: str, seed: int = 0, n: int = B, is_weight=None, terminated=None, truncated=None,
          mc_return=None) -> Batch:
    rng = np.random.default_rng(seed)
    if kind == "ddqn":
        action = rng.integers(0, NUM_ACTIONS, n).astype(np.int64)
    else:
        action = rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n),
                      np.ones(n, np.float32) if is_weight is None else np.asarray(is_weight, np.float32),
                      np.zeros(n, np.int8))
    return Batch(obs=rng.normal(size=(n, OBS)).astype(np.float32), action=action,
                 reward=rng.normal(size=n).astype(np.float32),
                 next_obs=rng.normal(size=(n, OBS)).astype(np.float32),
                 terminated=rng.random(n) < 0.2 if terminated is None else np.asarray(terminated, bool),
                 truncated=np.zeros(n, bool) if truncated is None else np.asarray(truncated, bool), info=info,
                 extras={"mc_return": (rng.normal(size=n).astype(np.float32) if mc_return is None
                                       else np.asarray(mc_return, np.float32))})


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
    if isinstance(agent, DDQN):
        return {"q": agent.q, "target_q": agent.target_q}
    return {"actor": agent.actor, "critic": agent.critic, "target_critic": agent.target_critic}


def flat_params(agent) -> torch.Tensor:
    """Every learned number of the agent (networks, targets, temperatures) in one vector."""
    parts = [p.detach().flatten() for m in modules(agent).values() for p in m.parameters()]
    for name in ("log_alpha", "log_alpha_prime"):
        if hasattr(agent, name):
            parts.append(getattr(agent, name).detach().reshape(1))
    return torch.cat(parts)
