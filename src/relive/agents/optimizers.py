"""torch's RMSprop and Adam updates with square roots that skip the CPU's slow path for zeros.

On a CPU (torch 2.13, AVX-512) ``Tensor.sqrt`` of a float32 tensor that holds zeros runs ~30x slower than of one
that does not (670 vs 24 us for 131,072 values; bench/optimizer_sqrt.py), and an image Q-network's second moments
hold many zeros: the weights of units that never fire get a zero gradient on every step, their moment decays to a
subnormal, and ``train`` flushes subnormals to zero. RMSprop (``ddqn_atari``, ``ddqn_minatar``) and the unfused Adam
(``ddqn_atari100k``: epsilon 1.5e-4) take that square root on every parameter at every update.

:class:`FloorSqrtRMSprop` and :class:`FloorSqrtAdam` are ``torch.optim.RMSprop`` / ``torch.optim.Adam`` (their state
dicts too) whose CPU step is torch's single-tensor update op for op, except that the square root is of
``max(v, m)``, ``m`` the smallest normal float32 (1.18e-38): for every ``v >= m`` the same value; for ``v`` below it
(0, a subnormal) ``sqrt(m) = 1.08e-19``, scaled by Adam's bias correction, where torch's is 0 -- and then ``eps`` is
added, which rounds both to ``eps`` whenever ``eps`` is large enough that 1.08e-19 is below half its float32 spacing
(:func:`floor_is_exact`; checked, else torch's own step runs). So the steps are bit-identical to torch's, with one
exception: centered RMSprop's ``square_avg - grad_avg**2`` can round below zero, where torch takes the root of a
negative number and writes NaN into the weight; here that weight moves by ``grad / eps`` as for a zero variance.
Parameters on another device, closures, weight decay, amsgrad, ``maximize``, ``foreach`` / ``fused`` /
``capturable`` / ``differentiable`` take torch's step.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.optim.optimizer import _get_scalar_dtype

#: the smallest normal float32: the square roots of second moments below it are taken of it
SQRT_FLOOR = float(torch.finfo(torch.float32).tiny)


def floor_is_exact(eps: float, scale: float = 1.0) -> bool:
    """Whether ``sqrt(SQRT_FLOOR) * scale + eps`` rounds to ``eps`` in float32 with a factor 2 to spare (``scale``:
    Adam's largest ``1 / sqrt(bias_correction2)``, RMSprop's 1)."""
    eps32 = np.float32(eps)
    return bool(eps32 > 0 and np.isfinite(eps32)
                and 2.0 * np.sqrt(SQRT_FLOOR) * scale < float(np.spacing(eps32)) / 2)


def _on_cpu(group: dict) -> bool:
    return all(p.device.type == "cpu" and p.dtype == torch.float32 for p in group["params"])


class FloorSqrtRMSprop(torch.optim.RMSprop):
    """``torch.optim.RMSprop`` whose CPU step takes the square root of max(v, the smallest normal float32) (see the
    module docstring: bit-identical steps where torch's are finite)."""

    def _plain(self) -> bool:
        return all(g["weight_decay"] == 0 and not g["maximize"] and not g["capturable"] and not g["differentiable"]
                   and not g["foreach"] and not isinstance(g["lr"], torch.Tensor) and floor_is_exact(g["eps"])
                   and _on_cpu(g) for g in self.param_groups)

    def step(self, closure=None):
        if closure is not None or not self._plain():
            return super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                alpha, eps, lr = group["alpha"], group["eps"], group["lr"]
                momentum, centered = group["momentum"], group["centered"]
                for p in group["params"]:
                    grad = p.grad
                    if grad is None:
                        continue
                    if grad.is_sparse:
                        raise RuntimeError("RMSprop does not support sparse gradients")
                    state = self.state[p]
                    if len(state) == 0:  # (as RMSprop._init_group)
                        state["step"] = torch.zeros((), dtype=_get_scalar_dtype())
                        state["square_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        if momentum > 0:
                            state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        if centered:
                            state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["step"] += 1
                    square_avg = state["square_avg"]
                    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                    if centered:
                        grad_avg = state["grad_avg"]
                        grad_avg.lerp_(grad, 1 - alpha)
                        avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).clamp_min_(SQRT_FLOOR).sqrt_()
                    else:
                        avg = square_avg.clamp_min(SQRT_FLOOR).sqrt_()
                    avg = avg.add_(eps)
                    if momentum > 0:
                        buf = state["momentum_buffer"]
                        buf.mul_(momentum).addcdiv_(grad, avg)
                        p.add_(buf, alpha=-lr)
                    else:
                        p.addcdiv_(grad, avg, value=-lr)
        return None


class FloorSqrtAdam(torch.optim.Adam):
    """``torch.optim.Adam`` (unfused) whose CPU step takes the square root of max(v, the smallest normal float32)
    (see the module docstring: bit-identical steps)."""

    def _plain(self) -> bool:
        return all(not g["amsgrad"] and g["weight_decay"] == 0 and not g["maximize"] and not g["capturable"]
                   and not g["differentiable"] and not g["foreach"] and not g.get("fused")
                   and not g.get("decoupled_weight_decay", False)
                   and not any(isinstance(v, torch.Tensor) for v in (g["lr"], *g["betas"]))
                   and 0 <= g["betas"][1] < 1
                   and floor_is_exact(g["eps"], 1.0 / float(np.sqrt(1.0 - g["betas"][1]))) and _on_cpu(g)
                   for g in self.param_groups)

    def step(self, closure=None):
        if closure is not None or not self._plain():
            return super().step(closure)
        with torch.no_grad():
            for group in self.param_groups:
                (beta1, beta2), eps, lr = group["betas"], group["eps"], group["lr"]
                for p in group["params"]:
                    grad = p.grad
                    if grad is None:
                        continue
                    if grad.is_sparse:
                        raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
                    state = self.state[p]
                    if len(state) == 0:  # (as Adam._init_group)
                        state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
                    step_t += 1
                    exp_avg.lerp_(grad, 1 - beta1)
                    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    step = step_t.item()
                    bias_correction1 = 1 - beta1**step
                    bias_correction2 = 1 - beta2**step
                    step_size = lr / bias_correction1
                    bias_correction2_sqrt = bias_correction2**0.5
                    denom = (exp_avg_sq.clamp_min(SQRT_FLOOR).sqrt_() / bias_correction2_sqrt).add_(eps)
                    p.addcdiv_(exp_avg, denom, value=-step_size)
        return None
