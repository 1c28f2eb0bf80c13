"""A trained agent's deterministic policy for deployment: a torch module obs [N, obs_dim] -> action, written as
TorchScript, ONNX or safetensors (weights + what rebuilds the module), each reproducing the agent's
``act(obs, explore=False)``.

Which policy an agent acts with is read from what it acts with, conservatively: an agent whose ``act`` is SAC's
(SAC, RLPD, Cal-QL) acts with its actor's squashed mean, one whose ``act`` is DDPG's with its deterministic actor,
one whose ``act`` is DDQN's greedily in its Q-network -- an MLP over flat observations or an image Q-network (the
Nature CNN, MinAtar's) over [N, C, H, W] frames in their stored dtype (uint8 pixels, bool planes), scaled inside the
exported module as in the agent. An agent that acts otherwise (a residual on a base policy, V-RACER, any plug-in) is
refused by name rather than exported wrong; an agent may also declare its own ``deterministic_policy() ->
torch.nn.Module`` (flat observations).

Loading a TorchScript or ONNX file runs what it holds (load it only where you trust it: ``torch.jit.load``,
``onnxruntime``); the safetensors form holds numbers only and :func:`load_safetensors_policy` rebuilds the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from relive.agents import encoders as enc
from relive.agents import networks as nets
from relive.agents.ddpg import DDPG, DeterministicActor
from relive.agents.ddqn import DDQN
from relive.agents.sac import SAC
from relive.extras import require
from relive.files import replace_file

FORMATS = ("torchscript", "onnx", "safetensors")


class _BoxPolicy(nn.Module):
    """A policy into the action box: center + scale * tanh(u), clipped to [low, high] as the agents' ``act`` does."""

    low: torch.Tensor  # (buffers registered in __init__)
    high: torch.Tensor
    scale: torch.Tensor
    center: torch.Tensor

    def __init__(self, trunk: nn.Sequential, action_dim: int, low, high):
        super().__init__()
        self.trunk, self.action_dim = trunk, int(action_dim)
        low, high = nets.action_box(low, high, action_dim)
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))
        self.register_buffer("scale", (self.high - self.low) / 2)
        self.register_buffer("center", (self.high + self.low) / 2)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        return torch.minimum(torch.maximum(torch.tanh(u) * self.scale + self.center, self.low), self.high)


class SquashedMeanPolicy(_BoxPolicy):
    """SAC's evaluation action: the squashed mean of its Gaussian (``SAC.act(explore=False)``)."""

    kind = "squashed_mean"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.squash(self.trunk(obs)[..., : self.action_dim])


class DeterministicPolicy(_BoxPolicy):
    """DDPG's evaluation action: its actor, center + scale * tanh(f(s)), clipped to the box."""

    kind = "deterministic"

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.squash(self.trunk(obs))


class GreedyPolicy(nn.Module):
    """DDQN's evaluation action: argmax_a Q(s, a) (int64). ``image``: (network name, [C, H, W], dtype) of an image
    Q-network (:func:`relive.agents.encoders.image_q_net`); None for an MLP."""

    kind = "greedy"

    def __init__(self, trunk: nn.Sequential, image: tuple | None = None):
        super().__init__()
        self.trunk, self.image = trunk, image

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(obs).argmax(dim=-1)


def _copy_mlp(module: nn.Module) -> nn.Sequential:
    """A CPU copy of a plain MLP (Linear / ReLU layers), refused otherwise (the safetensors form rebuilds these)."""
    if not isinstance(module, nn.Sequential) or not all(isinstance(m, nn.Linear | nn.ReLU) for m in module):
        raise ValueError(f"exporting a policy network of type {type(module).__name__} (not a plain MLP) is not "
                         "supported")
    linear = [m for m in module if isinstance(m, nn.Linear)]
    copy = nets.mlp(linear[0].in_features, tuple(m.out_features for m in linear[:-1]), linear[-1].out_features)
    copy.load_state_dict({k: v.detach().cpu() for k, v in module.state_dict().items()})
    return copy.eval().requires_grad_(False)


def deterministic_policy(agent) -> nn.Module:
    """The module ``agent.act(obs, explore=False)`` computes, on CPU, in eval mode (see the module docstring)."""
    own = getattr(agent, "deterministic_policy", None)
    if callable(own):
        return own().cpu().eval().requires_grad_(False)
    act = getattr(type(agent), "act", None)
    name = type(agent).__name__
    if act is SAC.act and isinstance(agent.actor, nets.TanhGaussianActor) and hasattr(agent.actor, "trunk"):
        low, high = agent.action_low, agent.action_high
        return SquashedMeanPolicy(_copy_mlp(agent.actor.trunk), agent.action_dim, low, high).eval()
    if act is DDPG.act and isinstance(agent.actor, DeterministicActor) and not agent.cfg.obs_norm:
        return DeterministicPolicy(_copy_mlp(agent.actor.net), agent.action_dim, agent.action_low,
                                   agent.action_high).eval()
    if act is DDQN.act and getattr(agent, "image_shape", None) is not None:
        image = (agent.image_net, tuple(agent.image_shape), np.dtype(agent.image_dtype))
        trunk = enc.image_q_net(*image, agent.num_actions, torch.Generator())
        trunk.load_state_dict({k: v.detach().cpu().contiguous() for k, v in agent.q.state_dict().items()})
        return GreedyPolicy(trunk.eval().requires_grad_(False), image).eval()
    if act is DDQN.act:
        return GreedyPolicy(_copy_mlp(agent.q)).eval()
    raise ValueError(f"agent {name} acts in a way relive cannot export as one network (a residual on a base policy, "
                     "inputs normalized by running statistics, a recurrent or plug-in agent): give it a "
                     "deterministic_policy() method returning the module")


def policy_input(policy: nn.Module, obs_dim: int | None = None) -> str:
    """What an exported ``policy`` takes, for messages: ``[N, D]`` (flat) or ``[N, C, H, W] uint8`` (frames)."""
    image = getattr(policy, "image", None)
    if image is None:
        return f"[N, {obs_dim}]"
    return f"[N, {', '.join(map(str, image[1]))}] {image[2].name}"


def export_policy(agent, path: str | Path, fmt: str, obs_dim: int | tuple | None = None) -> Path:
    """Write ``agent``'s deterministic policy to ``path`` as ``fmt`` (torchscript | onnx | safetensors): through a
    temporary file renamed over ``path`` (a symbolic link there is replaced, never written through; a directory is
    refused). ``obs_dim``: the flat observation's size, or the env's observation shape (flat: (D,); an image
    Q-network's frames: its own [C, H, W], which the shape must be)."""
    check_format(fmt)  # (before the policy is made)
    return write_policy(deterministic_policy(agent), path, fmt, obs_dim)


def check_format(fmt: str) -> None:
    """``fmt`` is an export format whose extra is installed (before any work: one line naming the extra, never a
    traceback from inside torch)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt != "torchscript":
        require("onnx" if fmt == "onnx" else "safetensors", f"--format {fmt}")


def write_policy(policy: nn.Module, path: str | Path, fmt: str, obs_dim: int | tuple | None = None) -> Path:
    """:func:`export_policy` of a :func:`deterministic_policy` already made (e.g. to describe it as well)."""
    check_format(fmt)
    image = getattr(policy, "image", None)
    shape = (obs_dim,) if isinstance(obs_dim, int) else obs_dim
    if image is not None and shape is not None and tuple(shape) != image[1]:
        raise ValueError(f"observations of shape {tuple(shape)}: the image Q-network takes {image[1]}")
    if image is None and (shape is None or len(shape) != 1):
        raise ValueError(f"observations of shape {shape}: export takes flat observations (and an image "
                         "Q-network's frames)")
    flat = 0 if image is not None or shape is None else int(shape[0])
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise ValueError(f"{path} is a directory: export writes one file (a directory is never replaced)")
    path.parent.mkdir(parents=True, exist_ok=True)
    example = (torch.zeros(2, flat) if image is None  # (images: the frames' own dtype, as stored)
               else torch.zeros(2, *image[1], dtype=torch.from_numpy(np.zeros(0, image[2])).dtype))

    def write(tmp: Path) -> None:
        with torch.no_grad():
            if fmt == "torchscript":
                torch.jit.save(torch.jit.trace(policy, example), str(tmp))
            elif fmt == "onnx":
                import warnings

                with warnings.catch_warnings():  # (the TorchScript-based exporter: no onnxscript needed)
                    warnings.simplefilter("ignore")
                    torch.onnx.export(policy, (example,), str(tmp), input_names=["obs"], output_names=["action"],
                                      dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, dynamo=False)
            else:
                from safetensors.torch import save_file

                mlp: Any = policy  # (one of the policies above, or an agent's own with their trunk / kind / low / high)
                layers = [m.out_features for m in mlp.trunk if isinstance(m, nn.Linear)]
                if image is not None:  # (an image Q-network: rebuilt from its name, input shape and dtype)
                    meta = {"kind": mlp.kind, "image_net": image[0], "obs_shape": list(image[1]),
                            "obs_dtype": image[2].name, "out": layers[-1]}
                else:
                    meta = {"kind": mlp.kind, "obs_dim": flat, "hidden": layers[:-1], "out": layers[-1]}
                if mlp.kind != "greedy":
                    meta |= {"action_dim": int(mlp.low.numel()), "low": mlp.low.tolist(), "high": mlp.high.tolist()}
                save_file({k: v.contiguous() for k, v in mlp.state_dict().items()}, str(tmp),
                          metadata={"relive_policy": json.dumps(meta)})

    # (whole or not at all; a symbolic link at ``path`` is replaced, never written through)
    return replace_file(path, write)


def load_safetensors_policy(path: str | Path) -> nn.Module:
    """Rebuild a policy written by ``export_policy(..., "safetensors")``: numbers only (no code is loaded); the
    declared sizes are checked against the tensors before the module is filled."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get("relive_policy")
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has keys(), no iteration)
    if raw is None:
        raise ValueError(f"{path}: not a policy written by relive export (no 'relive_policy' metadata)")
    with _metadata_of(path):
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
    if "image_net" in meta:
        return _image_policy(path, meta, tensors)
    with _metadata_of(path):
        kind, obs_dim, hidden, out = meta["kind"], int(meta["obs_dim"]), tuple(int(h) for h in meta["hidden"]), \
            int(meta["out"])
    if not (0 < obs_dim <= 1 << 20 and 0 < out <= 1 << 20 and len(hidden) <= 64
            and all(0 < h <= 1 << 16 for h in hidden)):
        raise ValueError(f"{path}: declared sizes out of range")
    trunk = nets.mlp(obs_dim, hidden, out)
    policy: nn.Module
    if kind == "greedy":
        policy = GreedyPolicy(trunk)
    elif kind in ("squashed_mean", "deterministic"):
        low, high = np.asarray(meta["low"], np.float32), np.asarray(meta["high"], np.float32)
        cls = SquashedMeanPolicy if kind == "squashed_mean" else DeterministicPolicy
        policy = cls(trunk, int(meta["action_dim"]), low, high)
    else:
        raise ValueError(f"{path}: unknown policy kind {kind!r}")
    return _filled(path, policy, tensors)


def _filled(path, policy: nn.Module, tensors: dict) -> nn.Module:
    """``policy`` with ``tensors`` loaded, once their names and shapes are the declared policy's."""
    expect = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    if expect != got:
        raise ValueError(f"{path}: its tensors {got} do not match the declared policy {expect}")
    policy.load_state_dict(tensors)
    return policy.eval().requires_grad_(False)


@contextmanager
def _metadata_of(path) -> Iterator[None]:
    """A missing or mistyped field of a policy file's metadata as one ValueError naming the file."""
    try:
        yield
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: malformed 'relive_policy' metadata ({e})") from None


def _image_policy(path, meta: dict, tensors: dict) -> nn.Module:
    """An image Q-network's greedy policy from its metadata (name, [C, H, W], dtype, actions), sizes checked before
    the network is built."""
    with _metadata_of(path):
        name, shape, dtype, out = meta["image_net"], tuple(int(d) for d in meta["obs_shape"]), meta["obs_dtype"], \
            int(meta["out"])
    if meta["kind"] != "greedy" or name not in enc.IMAGE_Q_NETS or dtype not in ("uint8", "bool"):
        raise ValueError(f"{path}: unknown image policy ({meta['kind']!r}, {name!r}, {dtype!r})")
    if len(shape) != 3 or not all(0 < d <= 1024 for d in shape) or not 1 < out <= 1 << 16:
        raise ValueError(f"{path}: declared sizes out of range")
    image = (name, shape, np.dtype(dtype))
    return _filled(path, GreedyPolicy(enc.image_q_net(*image, out, torch.Generator()), image), tensors)
