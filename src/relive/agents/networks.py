"""Networks shared by the agents: MLPs, a batched critic ensemble, a tanh-Gaussian actor, explicit seeded
initialization, and the conversions that make agent state checkpointable without pickle.

Every parameter is drawn from the agent's own ``torch.Generator`` (:func:`init_`); building a network never
reads or advances the global torch RNG.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from relive.replay.returns import MAX_N_STEP
from relive.types import Batch

_ModuleT = TypeVar("_ModuleT", bound=nn.Module)

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC / RLPD clipping of the state-dependent log-std
INIT_SCHEMES = ("torch", "xavier")


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> nn.Sequential:
    """Linear -> ReLU for every hidden layer, then a linear head."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, out_dim))
    return nn.Sequential(*layers)


class EnsembleLinear(nn.Module):
    """E independent linear layers applied in one batched matmul: [E, B, in] -> [E, B, out].

    ``members`` (optional, an index tensor of length M) evaluates only those members: [M, B, in] -> [M, B, out]
    with member ``members[i]``'s weights in row i (a REDQ / RLPD target needs 2 of 10)."""

    def __init__(self, num_members: int, in_dim: int, out_dim: int):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(num_members, in_dim, out_dim))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_dim))

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        if self.out_dim == 1:  # a value head: bmm with one output column is ~10x slower than this on CPU
            return _EnsembleHead.apply(x, weight, bias)
        return torch.baddbmm(bias, x, weight)


class _EnsembleHead(torch.autograd.Function):
    """y = x @ w + b for E members with one output: x [E, B, D], w [E, D, 1], b [E, 1, 1] -> [E, B, 1].

    The same product as ``torch.baddbmm(b, x, w)``, laid out for CPU BLAS: forward as w^T x^T ([E, 1, B], a
    row times a matrix), and the input gradient as the broadcast outer product g w^T. Autograd's ``bmm``
    backward would run a [E, B, 1] x [E, 1, D] matmul with inner dimension 1, which is as slow as the
    forward's single output column (both ~10x a whole 256x256 layer's cost per FLOP on this CPU)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.baddbmm(bias, weight.mT, x.mT).mT  # [E, 1, B] -> [E, B, 1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        g = grad.mT  # [E, 1, B]
        grad_x = grad * weight.mT if ctx.needs_input_grad[0] else None  # [E, B, 1] * [E, 1, D]
        grad_w = torch.bmm(g, x).mT if ctx.needs_input_grad[1] else None  # [E, 1, D] -> [E, D, 1]
        grad_b = grad.sum(1, keepdim=True) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


class EnsembleLayerNorm(nn.Module):
    """LayerNorm over features with a separate affine transform per ensemble member: [E, B, D]."""

    def __init__(self, num_members: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, dim))
        self.dim = dim

    def forward(self, x: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        # the compiler fuses the plain formulation itself; on a GPU the member loop's ~6 launches per member cost more
        # than the passes it saves (an H200 ran RLPD's eager update launch-bound: 750 us of kernels in 11 ms)
        if torch.compiler.is_compiling() or x.dim() != 3 or x.device.type != "cpu":
            return torch.addcmul(bias, F.layer_norm(x, (self.dim,)), weight)
        return _EnsembleLayerNorm.apply(x, weight, bias)


class _EnsembleLayerNorm(torch.autograd.Function):
    """LayerNorm over the last dim with member e's affine weight[e], bias[e]: x [E, B, D] -> [E, B, D].

    The same values as ``torch.addcmul(bias, F.layer_norm(x, (D,)), weight)``, computed member by member with
    the native LayerNorm kernel and its affine transform fused (forward and backward: one kernel each gives
    the input, weight and bias gradients), writing into the output in place. Each member's [B, D] slice stays
    in cache, where the plain formulation makes five passes over the whole [E, B, D] tensor (normalize,
    scale-and-shift, and in backward the products with weight and with the normalized input plus the
    LayerNorm backward): on a 2-core EPYC the LayerNorm part of ten 256-wide critics took ~2.3x less time. CPU
    tensors only: on a GPU each member's kernels are launched one by one, and launches are what an update waits on."""

    EPS = 1e-5  # F.layer_norm's default

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        e, b, d = x.shape
        x = x.contiguous()
        out = torch.empty_like(x)
        mean, rstd = x.new_empty(e, b, 1), x.new_empty(e, b, 1)
        for i in range(e):
            torch.ops.aten.native_layer_norm.out(x[i], [d], weight[i, 0], bias[i, 0], _EnsembleLayerNorm.EPS,
                                                 out0=out[i], out1=mean[i], out2=rstd[i])
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        mask = list(ctx.needs_input_grad)
        grad = grad.contiguous()
        d = x.shape[-1]
        grad_x = torch.empty_like(x) if mask[0] else None
        grad_w = torch.empty_like(weight) if mask[1] else None
        grad_b = torch.empty_like(bias) if mask[2] else None
        for i in range(x.shape[0]):
            if all(mask):  # written in place
                assert grad_x is not None and grad_w is not None and grad_b is not None  # (every mask entry set)
                torch.ops.aten.native_layer_norm_backward.out(grad[i], x[i], [d], mean[i], rstd[i], weight[i, 0],
                                                              bias[i, 0], mask, out0=grad_x[i], out1=grad_w[i, 0],
                                                              out2=grad_b[i, 0])
                continue
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(grad[i], x[i], [d], mean[i], rstd[i],
                                                                   weight[i, 0], bias[i, 0], mask)
            for full, part in ((grad_x, gx), (grad_w, gw), (grad_b, gb)):
                if full is not None:
                    full[i].view(-1).copy_(part.view(-1))
        return grad_x, grad_w, grad_b


class EnsembleCritic(nn.Module):
    """E Q-functions Q_e(s, a) evaluated together, with no Python loop over members: returns [E, B].

    Each layer is one ``baddbmm`` over all members. With ``layer_norm`` every hidden layer is
    Linear -> LayerNorm -> ReLU, the last hidden layer included, then a plain linear head (RLPD, Ball et al.
    2023, Sec. 4.2 / reference code ``MLP(activate_final=True, use_layer_norm=True)``).
    """

    def __init__(self, num_members: int, obs_dim: int, action_dim: int, hidden: tuple[int, ...],
                 layer_norm: bool = False):
        super().__init__()
        self.num_members = num_members
        layers: list[nn.Module] = []
        d = obs_dim + action_dim
        for h in hidden:
            layers.append(EnsembleLinear(num_members, d, h))
            if layer_norm:
                layers.append(EnsembleLayerNorm(num_members, h))
            layers.append(nn.ReLU(inplace=True))  # in place on a fresh output: one [E, B, h] buffer less
            d = h
        layers.append(EnsembleLinear(num_members, d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, members: torch.Tensor | None = None) -> torch.Tensor:
        """obs [B, O] and action [B, A] (same inputs for every member) or [E, B, *] (one per member): [E, B].
        ``members`` (an index tensor of length M): evaluate only those members, [M, B] (row i = member
        ``members[i]``; the same values as ``forward(obs, action)[members]``, without the other members' work)."""
        x = torch.cat([obs, action], dim=-1)
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.num_members if members is None else len(members), -1, -1)
        if members is None:
            return self.net(x).squeeze(-1)
        for layer in self.net:
            x = layer(x, members) if isinstance(layer, EnsembleLinear | EnsembleLayerNorm) else layer(x)
        return x.squeeze(-1)


def action_box(action_low, action_high, action_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) as float32 arrays of shape [action_dim], refused unless finite with low < high."""
    low = np.asarray(action_low, np.float32).reshape(-1)
    high = np.asarray(action_high, np.float32).reshape(-1)
    if low.shape != (action_dim,) or high.shape != (action_dim,):
        raise ValueError(f"action_low / action_high must have shape ({action_dim},), got {low.shape} / {high.shape}")
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low < high).all()):
        raise ValueError(f"the action box must be finite with low < high, got low={low}, high={high}")
    return low, high


class TanhGaussianActor(nn.Module):
    """pi(a|s): a = center + scale * tanh(u), u ~ N(mu(s), sigma(s)^2) with a state-dependent, clipped
    log-std (SAC, Haarnoja et al. 2018, arXiv 1812.05905, App. C)."""

    scale: torch.Tensor  # the action box (buffers registered in __init__)
    center: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], action_low, action_high):
        super().__init__()
        low, high = action_box(action_low, action_high, action_dim)
        self.trunk = mlp(obs_dim, hidden, 2 * action_dim)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2))
        self.register_buffer("center", torch.as_tensor((high + low) / 2))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and clipped log-std of the pre-squash Gaussian: ([B, A], [B, A])."""
        mean, log_std = self.trunk(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        return torch.tanh(u) * self.scale + self.center

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None,
               deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized action in the env's box and its log-density log pi(a|s), summed over dims."""
        mean, log_std = self(obs)
        return self.sample_from(mean, log_std, generator, deterministic)

    def sample_from(self, mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator | None = None,
                    deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`sample`, from an already computed forward pass (SAC Eq. 8: a = f(eps; s))."""
        if deterministic:
            u, gauss = mean, -log_std
        else:
            eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            u = mean + log_std.exp() * eps
            gauss = -0.5 * eps.square() - log_std  # (u - mean) / std is eps: no need to recompute it
        const = 0.5 * math.log(2 * math.pi) * u.shape[-1]
        log_prob = (gauss - _tanh_log_det(u)).sum(-1) - (const + self.log_scale_sum())
        return self.squash(u), log_prob

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(a|s) of given (stored) actions, per dimension: [B, A] (tanh-squash corrected)."""
        mean, log_std = self(obs)
        return self.log_prob_from(mean, log_std, action, eps)

    def log_prob_from(self, mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor,
                      eps: float = 1e-6) -> torch.Tensor:
        y = ((action - self.center) / self.scale).clamp(-1 + eps, 1 - eps)
        return tanh_gaussian_log_prob(mean, log_std, torch.atanh(y)) - torch.log(self.scale)

    def log_scale_sum(self) -> torch.Tensor:
        return torch.log(self.scale).sum()


def tanh_gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per-dimension log-density of a = tanh(u), u ~ N(mean, std^2): the Gaussian log-density minus
    log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) (SAC App. C, Eq. 21, stable form)."""
    gauss = -0.5 * ((u - mean) * torch.exp(-log_std)) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    return gauss - _tanh_log_det(u)


def _tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log|d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), per dimension."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


# -- seeded initialization --------------------------------------------------------------------------
@contextmanager
def private_rng() -> Iterator[None]:
    """Build modules without touching the global torch RNG: whatever their constructors draw is discarded
    (parameters are then set by :func:`init_` from the agent's own generator)."""
    with torch.random.fork_rng(devices=[]):
        yield


def init_(module: _ModuleT, generator: torch.Generator, scheme: str = "torch") -> _ModuleT:
    """(Re-)initialize every linear layer of ``module`` from ``generator``.

    ``"torch"``: PyTorch's ``nn.Linear`` default, weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (what
    CleanRL and Stable-Baselines3 use). ``"xavier"``: Xavier-uniform weights, zero biases (RLPD's reference
    code). Ensemble layers are initialized member by member with the same rule; convolutions (image encoders)
    with the same rule over their fan-in (in_channels x kernel area). A layer made with ``bias=False`` has its
    weight initialized only.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init scheme must be one of {INIT_SCHEMES}, got {scheme!r}")
    weight: torch.Tensor
    bias: torch.Tensor | None
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                fan_in, fan_out, weight, bias = m.in_features, m.out_features, m.weight, m.bias
            elif isinstance(m, EnsembleLinear):
                fan_in, fan_out, weight, bias = m.in_dim, m.out_dim, m.weight, m.bias
            elif isinstance(m, nn.Conv2d):  # (image encoders) fans per output pixel: channels x kernel area
                k = m.kernel_size[0] * m.kernel_size[1]
                fan_in, fan_out, weight, bias = m.in_channels * k, m.out_channels * k, m.weight, m.bias
            else:
                continue
            if scheme == "torch":
                bound = 1.0 / math.sqrt(fan_in)
                weight.uniform_(-bound, bound, generator=generator)
                if bias is not None:
                    bias.uniform_(-bound, bound, generator=generator)
            else:
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                weight.uniform_(-bound, bound, generator=generator)
                if bias is not None:
                    bias.zero_()
    return module


# -- optimization helpers ---------------------------------------------------------------------------
def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- target + tau (source - target), all parameters in one foreach call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def adam(params, lr: float, weight_decay: float = 0.0) -> torch.optim.Adam:
    """Adam with the fused kernel where the device supports it (CPU and CUDA in recent torch: ~7% faster
    SAC steps here), called directly by :class:`LeanAdam`; the default implementation otherwise.
    ``weight_decay``: Adam's (coupled) L2 penalty, weight_decay * w added to every gradient."""
    params = list(params)
    try:
        return LeanAdam(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)


class LeanAdam(torch.optim.Adam):
    """``torch.optim.Adam(fused=True)`` whose ``step()`` goes straight to the fused kernel once every parameter
    has its state: the same kernel with the same arguments, so bit-identical steps and the same state dict,
    without the ~80 µs of Python that ``Adam.step`` spends per call on a CPU (grouping, checks, hooks) -- three
    optimizer steps per SAC update. Anything unusual (a closure, a missing gradient or state, amsgrad, tensor
    learning rates, mixed devices) takes ``Adam.step``."""

    def step(self, closure=None):
        if closure is not None or not self.fused_step():
            return super().step(closure)
        return None

    def minimize(self, loss: torch.Tensor) -> None:
        """Gradients to None, ``loss.backward()``, one step: ``zero_grad(set_to_none=True)``, backward, ``step()``
        without the profiling wrappers ``torch.optim`` puts around both (tens of µs per call on a CPU)."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        loss.backward()
        if not self.fused_step():
            self.step()

    def fused_step(self) -> bool:
        """The fused kernel on every parameter group; False (nothing done) when a group needs ``Adam.step``."""
        fused = getattr(torch, "_fused_adam_", None)
        if fused is None:
            return False
        calls = []
        for group in self.param_groups:
            params = group["params"]
            if (not params or group["amsgrad"] or not group["fused"] or group["maximize"]
                    or group["differentiable"] or group.get("decoupled_weight_decay", False)
                    or isinstance(group["lr"], torch.Tensor)
                    or any(p.grad is None or p not in self.state for p in params)
                    or len({(p.device, p.dtype) for p in params}) != 1):
                return False
            states = [self.state[p] for p in params]
            calls.append((params, [p.grad for p in params], [st["exp_avg"] for st in states],
                          [st["exp_avg_sq"] for st in states], [st["step"] for st in states], group))
        with torch.no_grad():
            for params, grads, exp_avgs, exp_avg_sqs, steps, group in calls:
                beta1, beta2 = group["betas"]
                torch._foreach_add_(steps, 1)
                fused(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"], beta1=beta1,
                      beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                      grad_scale=None, found_inf=None)
        return True


def optimize(opt: torch.optim.Optimizer, loss: torch.Tensor, max_grad_norm: float = 0.0) -> None:
    """One gradient step of ``opt`` on ``loss``: gradients reset to None, backward, step. ``max_grad_norm`` > 0:
    the gradient of ``opt``'s parameters is first scaled to at most that norm (``clip_grad_norm_``)."""
    if max_grad_norm > 0:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for group in opt.param_groups for p in group["params"]], max_grad_norm)
        opt.step()
        return
    if isinstance(opt, LeanAdam):
        opt.minimize(loss)
        return
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def check_n_step(n_step) -> int:
    """An agent's ``n_step`` setting: an integer in [1, ``relive.replay.returns.MAX_N_STEP``], else a ValueError."""
    if isinstance(n_step, bool) or not isinstance(n_step, int) or not 1 <= n_step <= MAX_N_STEP:
        raise ValueError(f"n_step must be an integer in [1, {MAX_N_STEP}] (the buffer sums n-step returns at every "
                         f"sample, one pass per step ahead), got {n_step!r}")
    return n_step


def td_discount(batch, n_step: int, owner: str):
    """The bootstrap discount of a TD target for ``batch``: None for a one-step batch (the target uses
    gamma (1 - terminated), as always), the batch's per-row gamma^{n'} (1 - terminated) for an n-step one
    (``ReplayBuffer(n_step=...)``: ``reward`` is then the n-step return, ``next_obs`` the bootstrap state).
    Refuses a batch that does not match the agent's ``n_step`` (a buffer built without the agent's setting)."""
    if batch.discount is None:
        if n_step > 1:
            raise ValueError(f"{owner}: n_step = {n_step} but the batch holds one-step rows (no discount); build the "
                             f"buffer with ReplayBuffer(..., n_step={n_step}, gamma=<the agent's gamma>)")
        return None
    if n_step == 1:
        raise ValueError(f"{owner}: the batch holds n-step returns (a per-row discount) but the agent's n_step is 1; "
                         f"set the agent's n_step to the buffer's")
    return batch.discount


def signals_out(batch, **signals) -> dict:
    """Per-sample signals for ``ReplayBuffer.update`` (None values dropped): detached tensors that stay on the device
    when ``batch`` came from a device buffer (its ``info.indices`` is a tensor: no copy back to the host per update),
    NumPy arrays otherwise (host buffers and loop hooks read arrays)."""
    on_device = torch.is_tensor(batch.info.indices)
    return {k: (v.detach() if on_device else v.detach().cpu().numpy()) for k, v in signals.items() if v is not None}


def is_weight_of(batch: Batch) -> torch.Tensor:
    """``batch.info.is_weight`` of a batch moved to torch (``Batch.to_torch`` makes it a float32 tensor)."""
    w = batch.info.is_weight
    assert isinstance(w, torch.Tensor), "the importance weights of a batch moved to torch are a tensor"
    return w


def weighted_mean(per_sample: torch.Tensor, is_weight: torch.Tensor) -> torch.Tensor:
    """mean_i w_i l_i: every per-sample loss is multiplied by its importance-sampling weight (PER Alg. 1
    l.12); rows with weight 0 contribute nothing, not even through the normalization."""
    return (is_weight * per_sample).mean()


# -- pickle-free state ------------------------------------------------------------------------------
def module_state(module: nn.Module) -> dict[str, np.ndarray]:
    return {k.replace(".", "__"): v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()}


def load_module_state(module: nn.Module, state: dict) -> None:
    """Set ``module``'s parameters and buffers from :func:`module_state`'s arrays. A state of another architecture
    (missing or unexpected keys, another shape, non-numeric values) is a ValueError naming the tensor, raised
    before any of them is copied."""
    owner = type(module).__name__
    if not isinstance(state, Mapping):
        raise ValueError(f"the saved state of a {owner} must map tensor names to arrays, got {type(state).__name__}")
    current = module.state_dict()
    saved = {str(k).replace("__", "."): v for k, v in state.items()}
    missing, unexpected = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
    if missing or unexpected:
        raise ValueError(f"the saved state does not match this {owner} (another architecture?): missing "
                         f"{missing[:6]}, unexpected {unexpected[:6]}")
    tensors = {}
    for name, value in saved.items():
        arr = np.asarray(value)
        if arr.dtype.kind not in "fiub":
            raise ValueError(f"the saved {owner} tensor {name} holds {arr.dtype} values, not numbers")
        if arr.shape != tuple(current[name].shape):
            raise ValueError(f"the saved {owner} tensor {name} has shape {arr.shape}, this {owner} has "
                             f"{tuple(current[name].shape)} (another architecture: check the layer sizes)")
        tensors[name] = torch.as_tensor(arr, device=current[name].device)
    module.load_state_dict(tensors)


def optimizer_state(opt: torch.optim.Optimizer) -> dict:
    sd = opt.state_dict()
    return {
        "state": {str(k): {n: (v.detach().cpu().numpy().copy() if torch.is_tensor(v) else v)
                           for n, v in s.items()} for k, s in sd["state"].items()},
        "param_groups": {str(i): {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
                         for i, g in enumerate(sd["param_groups"])},
    }


def load_optimizer_state(opt: torch.optim.Optimizer, state: dict) -> None:
    """Set ``opt`` from :func:`optimizer_state`'s output. A state of another optimizer or architecture (other
    groups, parameters, or moment shapes) is a ValueError, raised before anything is set."""
    owner = type(opt).__name__
    try:
        groups = [dict(state["param_groups"][str(i)]) for i in range(len(state["param_groups"]))]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
            g["params"] = [int(p) for p in g["params"]]
        per_param = {int(k): {n: (torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray) else v)
                              for n, v in s.items()} for k, s in state["state"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"the saved {owner} state is malformed ({type(e).__name__}: {e})") from None
    params = [p for g in opt.param_groups for p in g["params"]]
    for k, s in per_param.items():
        if not 0 <= k < len(params):
            raise ValueError(f"the saved {owner} state names parameter {k}; this optimizer has {len(params)}")
        for n, v in s.items():
            if torch.is_tensor(v) and v.dim() > 0 and tuple(v.shape) != tuple(params[k].shape):
                raise ValueError(f"the saved {owner} state {n!r} of parameter {k} has shape {tuple(v.shape)}, the "
                                 f"parameter has {tuple(params[k].shape)} (another architecture?)")
    opt.load_state_dict({"state": per_param, "param_groups": groups})


def generator_state(gen: torch.Generator) -> np.ndarray:
    return gen.get_state().cpu().numpy().copy()


def load_generator_state(gen: torch.Generator, state) -> None:
    """Set ``gen`` to a saved state. A state from another device type (a CUDA generator's on a CPU, or the other
    way: a run resumed on another device) has another layout and cannot be set: ``gen`` is then seeded from the
    saved bytes (a fresh stream, the same for the same checkpoint), with a warning."""
    saved = np.asarray(state, dtype=np.uint8).reshape(-1)
    if saved.size != gen.get_state().numel():
        gen.manual_seed(int.from_bytes(hashlib.sha256(saved.tobytes()).digest()[:8], "little") >> 1)
        warnings.warn(f"a generator state of {saved.size} bytes (another device type's) loaded on {gen.device}: "
                      "seeded from it instead (the random stream differs from an uninterrupted run's)", stacklevel=2)
        return
    gen.set_state(torch.as_tensor(saved))


def concat_keys(obs: Mapping) -> np.ndarray | torch.Tensor:
    """[N, D] float32: the keys of a dict observation ([N, ...] each), each flattened, concatenated in sorted key
    order (torch tensors -- a batch from a device buffer -- are concatenated on their device)."""
    if not obs:
        raise ValueError("a dict observation needs at least one key")
    on_device = all(torch.is_tensor(v) for v in obs.values())  # a device batch: concatenated where it is
    parts: list[Any] = [obs[k] if on_device else np.asarray(obs[k]) for k in sorted(obs)]  # tensors or arrays
    n = parts[0].shape[0] if parts[0].ndim else 1
    for k, p in zip(sorted(obs), parts, strict=True):
        if (p.shape[0] if p.ndim else 1) != n:
            raise ValueError(f"observation key {k!r} has {p.shape[0] if p.ndim else 1} rows, the first key has {n}")
    if on_device:
        return torch.cat([p.reshape(n, -1).to(torch.float32) for p in parts], dim=1)
    return np.concatenate([p.reshape(n, -1).astype(np.float32, copy=False) for p in parts], axis=1)


# the learned state of a soft actor-critic (SAC and its variants, residual SAC): attribute -> state key, in order
SOFT_ACTOR_CRITIC_MODULES = ("actor", "critic", "target_critic")
SOFT_ACTOR_CRITIC_OPTIMIZERS = ("actor_opt", "critic_opt", "alpha_opt")


def soft_actor_critic_state(agent) -> dict:
    """What every soft actor-critic saves: its actor, critic and target critic, log alpha, the three optimizers
    and the generator (NumPy), from the attributes of those names. The agent adds its counters and the rest."""
    return {name: module_state(getattr(agent, name)) for name in SOFT_ACTOR_CRITIC_MODULES} | {
        "log_alpha": agent.log_alpha.detach().cpu().numpy().copy()} | {
        name: optimizer_state(getattr(agent, name)) for name in SOFT_ACTOR_CRITIC_OPTIMIZERS} | {
        "generator": generator_state(agent.gen)}


def load_soft_actor_critic_state(agent, state: dict) -> None:
    """Set what :func:`soft_actor_critic_state` saved."""
    for name in SOFT_ACTOR_CRITIC_MODULES:
        load_module_state(getattr(agent, name), state[name])
    with torch.no_grad():
        agent.log_alpha.copy_(torch.as_tensor(np.asarray(state["log_alpha"])))
    for name in SOFT_ACTOR_CRITIC_OPTIMIZERS:
        load_optimizer_state(getattr(agent, name), state[name])
    load_generator_state(agent.gen, state["generator"])


def as_obs_tensor(obs, obs_dim: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """[N, obs_dim] float32 tensor from array-like observations; a single [obs_dim] observation is accepted
    and flagged so that ``act`` can return a single action. Dict observations are concatenated
    (:func:`concat_keys`: the default encoder seam); they need the batch axis ([N, ...] per key)."""
    if isinstance(obs, Mapping):
        obs = concat_keys(obs)
    o = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=device)
    single = o.dim() == 1
    if single:
        o = o.unsqueeze(0)
    if o.dim() != 2 or o.shape[1] != obs_dim:
        raise ValueError(f"obs must have shape [N, {obs_dim}] (or [{obs_dim}]), got {tuple(np.shape(obs))}")
    return o, single


def seed_int(seed) -> int:
    """A 31-bit integer seed from an int or a ``numpy.random.SeedSequence`` (a component's own stream)."""
    if isinstance(seed, np.random.SeedSequence):
        return int(seed.generate_state(1)[0] % 2**31)
    return int(seed)


def vector_obs_dim(spec, owner: str) -> int:
    """The observation size of an agent that takes flat vectors; dict observations (``spec.obs_shape`` a mapping
    key -> shape) are refused naming the agents that take them through an encoder."""
    if isinstance(spec.obs_shape, Mapping):
        raise ValueError(f"{owner} takes flat vector observations; {getattr(spec, 'id', 'this env')} has dict "
                         f"observations (keys {', '.join(spec.obs_shape)}). SAC, RLPD and Cal-QL take "
                         "dict observations (agent.encoder), SAC + ReF-ER as their concatenation; or flatten them with "
                         "gymnasium's FlattenObservation")
    return int(np.prod(spec.obs_shape))
