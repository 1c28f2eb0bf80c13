"""Behaviour cloning: a deterministic MLP policy regressed on a dataset's actions (PLD's base policy, and the
fine-tuning step of its distillation stage).

The policy is ``a = center + scale * tanh(f((s - mu) / sigma))``: an MLP ``f`` (``networks.mlp``) on
standardized observations (mu, sigma from the training rows, kept as buffers; sigma = 1 for features that
barely vary in them), squashed into the action box.
The loss is the mean squared error to the dataset action,

    L(theta) = E_{(s, a) ~ D} || pi_theta(s) - a ||^2,

minimized with Adam on uniformly drawn minibatches. ``fine_tune`` continues from an existing policy on new
rows (its observation statistics stay fixed, so the old behaviour is the starting point).

Saved pickle-free (``relive.replay.checkpoint.save_tree``, kind ``"bc_policy"``): ``<dir>/policy`` holds the
parameters (.npy) and the architecture (JSON); ``relive.agents.base_policy.load_base_policy`` reads it.

Example::

    rows, meta = load_rows("relive/pointmaze-umaze-v3/scripted-v0")  # relive.data.loaders
    rows = select_episodes(rows, episodes=10)                          # few demos (relive.data.selection)
    policy, losses = train_bc(rows, low, high, BCConfig(num_steps=2000), seed=0)
    save_bc_policy("runs/bc", policy, info={"dataset": ...})
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from relive.agents import networks as nets
from relive.replay.checkpoint import load_tree, save_tree

KIND = "bc_policy"
POLICY_DIR = "policy"  # inside a `relive bc --out DIR` directory
MIN_OBS_STD = 1e-2  # observation features with a smaller std in the training rows are not rescaled


@dataclass(frozen=True)
class BCConfig:
    hidden: tuple[int, ...] = (256, 256)  # hidden layer widths of the MLP
    lr: float = 1e-3  # Adam learning rate
    batch_size: int = 256  # rows per gradient step
    num_steps: int = 5000  # gradient steps
    normalize_obs: bool = True  # standardize observations with the training rows' mean / std

    def __post_init__(self):
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"hidden must be a non-empty tuple of positive widths, got {self.hidden}")
        if self.lr <= 0 or self.batch_size < 1 or self.num_steps < 0:
            raise ValueError(f"need lr > 0, batch_size >= 1 and num_steps >= 0, got lr={self.lr}, "
                             f"batch_size={self.batch_size}, num_steps={self.num_steps}")


class SquashedMLP(nn.Module):
    """Deterministic policy ``center + scale * tanh(mlp((obs - obs_mean) / obs_std))``: [N, obs_dim] -> [N, A]."""

    obs_mean: torch.Tensor  # (buffers registered in __init__)
    obs_std: torch.Tensor
    scale: torch.Tensor
    center: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], action_low, action_high):
        super().__init__()
        low, high = nets.action_box(action_low, action_high, action_dim)
        self.obs_dim, self.action_dim, self.hidden = int(obs_dim), int(action_dim), tuple(int(h) for h in hidden)
        self.net = nets.mlp(obs_dim, self.hidden, action_dim)
        self.register_buffer("obs_mean", torch.zeros(obs_dim))
        self.register_buffer("obs_std", torch.ones(obs_dim))
        self.register_buffer("scale", torch.as_tensor((high - low) / 2))
        self.register_buffer("center", torch.as_tensor((high + low) / 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net((obs - self.obs_mean) / self.obs_std)) * self.scale + self.center

    def architecture(self) -> dict:
        """What it takes to rebuild the module (JSON)."""
        return {"obs_dim": self.obs_dim, "action_dim": self.action_dim, "hidden": list(self.hidden),
                "action_low": (self.center - self.scale).tolist(), "action_high": (self.center + self.scale).tolist()}

    @classmethod
    def from_architecture(cls, arch: dict) -> SquashedMLP:
        try:
            with nets.private_rng():
                return cls(int(arch["obs_dim"]), int(arch["action_dim"]), tuple(arch["hidden"]),
                           arch["action_low"], arch["action_high"])
        except KeyError as e:
            raise ValueError(f"an MLP policy description needs obs_dim, action_dim, hidden, action_low and "
                             f"action_high; {e.args[0]!r} is missing") from None


# -- training -------------------------------------------------------------------------------------------------
def _check_rows(policy: SquashedMLP, obs: np.ndarray, action: np.ndarray) -> None:
    if obs.ndim != 2 or obs.shape[1] != policy.obs_dim:
        raise ValueError(f"BC rows: obs must have shape [N, {policy.obs_dim}], got {obs.shape}")
    if action.shape != (obs.shape[0], policy.action_dim):
        raise ValueError(f"BC rows: action must have shape [{obs.shape[0]}, {policy.action_dim}], got {action.shape}")
    if obs.shape[0] == 0:
        raise ValueError("BC rows: no rows to train on")


def new_policy(obs_dim: int, action_dim: int, action_low, action_high, config: BCConfig, seed: int) -> SquashedMLP:
    with nets.private_rng():
        policy = SquashedMLP(obs_dim, action_dim, config.hidden, action_low, action_high)
    return nets.init_(policy, torch.Generator().manual_seed(int(seed)))


def fit(policy: SquashedMLP, rows: dict, num_steps: int, batch_size: int, lr: float, seed: int,
        progress=None) -> np.ndarray:
    """``num_steps`` Adam steps of the MSE loss on ``rows`` (obs, action), minibatches drawn uniformly with
    replacement from ``np.random.default_rng(seed)``. ``progress(i)`` is called after every step. Returns the
    per-step training losses."""
    obs = torch.as_tensor(np.asarray(rows["obs"], np.float32).reshape(len(rows["obs"]), -1))
    action = torch.as_tensor(np.asarray(rows["action"], np.float32))
    _check_rows(policy, obs.numpy(), action.numpy())
    low, high = policy.center - policy.scale, policy.center + policy.scale
    action = torch.minimum(torch.maximum(action, low), high)  # dataset actions beyond the box cannot be reached
    rng = np.random.default_rng(seed)
    opt = nets.adam(policy.parameters(), lr)
    losses = np.empty(num_steps, np.float64)
    policy.train()
    for i in range(num_steps):
        idx = torch.as_tensor(rng.integers(0, obs.shape[0], batch_size))
        loss = ((policy(obs[idx]) - action[idx]) ** 2).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[i] = loss.item()
        if progress is not None:
            progress(i)
    policy.eval()
    return losses


def train_bc(rows: dict, action_low, action_high, config: BCConfig | None = None, seed: int = 0,
             progress=None) -> tuple[SquashedMLP, np.ndarray]:
    """A new policy fitted to ``rows`` (obs, action): (policy, per-step losses)."""
    config = config if config is not None else BCConfig()
    obs = np.asarray(rows["obs"], np.float32)
    obs = obs.reshape(len(obs), -1)
    action = np.asarray(rows["action"], np.float32)
    if action.ndim != 2:
        raise ValueError(f"BC needs continuous actions [N, action_dim], got shape {action.shape}")
    policy = new_policy(obs.shape[1], action.shape[1], action_low, action_high, config, seed)
    if config.normalize_obs and len(obs):
        with torch.no_grad():
            policy.obs_mean.copy_(torch.as_tensor(obs.mean(0)))
            std = obs.std(0)  # features (almost) constant in the data, e.g. the goal of a single demo, are
            #                   centred but not scaled: dividing by a tiny std would blow up unseen values
            policy.obs_std.copy_(torch.as_tensor(np.where(std < MIN_OBS_STD, 1.0, std).astype(np.float32)))
    losses = fit(policy, rows, config.num_steps, config.batch_size, config.lr, seed + 1, progress)
    return policy, losses


def fine_tune(policy: SquashedMLP, rows: dict, num_steps: int, batch_size: int = 256, lr: float = 3e-4,
              seed: int = 0, progress=None) -> tuple[SquashedMLP, np.ndarray]:
    """A copy of ``policy`` trained further on ``rows`` (its observation statistics kept): (new, losses).
    The given policy is left unchanged."""
    if not isinstance(policy, SquashedMLP):
        raise ValueError(f"fine_tune needs a BC MLP policy (SquashedMLP: a `relive bc` directory or an MLP "
                         f"described by JSON), got {type(policy).__name__}")
    new = SquashedMLP.from_architecture(policy.architecture())
    new.load_state_dict(policy.state_dict())
    new.requires_grad_(True)
    losses = fit(new, rows, num_steps, batch_size, lr, seed, progress)
    return new, losses


# -- saving ---------------------------------------------------------------------------------------------------
def refuse_existing_out(out: str | Path, overwrite: bool) -> None:
    """A base policy directory is never replaced unless asked: a ValueError naming ``--overwrite`` when ``out``
    exists and ``overwrite`` is false (checked before any work, and again when writing)."""
    if Path(out).exists() and not overwrite:
        raise ValueError(f"{out} exists; pass --overwrite (overwrite=True) to replace it")


def save_bc_policy(out: str | Path, policy: SquashedMLP, info: dict | None = None, overwrite: bool = False) -> Path:
    """Write ``<out>/policy`` (parameters as .npy + architecture JSON, no pickle) and ``<out>/bc.json``
    (``info``: dataset, settings, losses...). Returns ``out``. An existing ``out`` is refused unless
    ``overwrite``; then the new directory is written beside it and moved into its place once complete (nothing
    of the old one is left in it)."""
    out = Path(out)
    refuse_existing_out(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = out.with_name(f".{out.name}.staging-{os.getpid()}")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        save_tree(staged / POLICY_DIR, {"net": nets.module_state(policy), "architecture": policy.architecture()},
                  kind=KIND)
        (staged / "bc.json").write_text(json.dumps(info or {}, indent=1, default=_json_default))
        if out.exists():  # (overwrite) the old one aside, the new one in, the old one deleted
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
            os.rename(staged, out)
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            os.rename(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out


def load_bc_policy(path: str | Path) -> SquashedMLP:
    """The policy of a ``relive bc`` directory (or of its ``policy`` checkpoint), in eval mode."""
    path = Path(path)
    if (path / POLICY_DIR / "MANIFEST.json").is_file():
        path = path / POLICY_DIR
    tree = load_tree(path, kind=KIND)
    policy = SquashedMLP.from_architecture(tree["architecture"])
    nets.load_module_state(policy, tree["net"])
    return policy.eval()


def _json_default(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


# -- evaluation ---------------------------------------------------------------------------------------------
def evaluate_policy(policy, env_id: str, episodes: int, seed: int, success_return: float | None = None,
                    max_episode_steps: int | None = None) -> dict:
    """Roll ``policy(obs [1, obs_dim]) -> action [1, A]`` for ``episodes`` episodes (reset seeds ``seed,
    seed + 1, ...``): mean return, and success rate when the task has a success signal (or ``success_return``
    is given; else ``success_rate`` is None)."""
    # (gymnasium, optional: imported only where an env is made)
    from relive.envs import episode_success, make_env, reports_success, with_success

    env = make_env(env_id, max_episode_steps)
    has_success = success_return is not None or reports_success(env)
    if has_success:
        env = with_success(env, success_return)
    returns, successes, lengths = [], [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=int(seed) + i)
        total, t, done = 0.0, 0, False
        info: dict = {}
        while not done:
            a = np.asarray(policy(np.asarray(obs, np.float32)[None]))[0]
            obs, reward, terminated, truncated, info = env.step(a)
            total += float(reward)
            t += 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(t)
        if has_success:
            successes.append(episode_success(info, env))
    env.close()
    return {"env_id": env_id, "episodes": episodes, "seed": seed, "return_mean": float(np.mean(returns)),
            "return_std": float(np.std(returns)), "length_mean": float(np.mean(lengths)),
            "success_rate": float(np.mean(successes)) if has_success else None,
            "success_return": success_return, "returns": [float(r) for r in returns],
            "successes": [bool(s) for s in successes] if has_success else None}


def config_dict(config: BCConfig) -> dict:
    return asdict(config)
