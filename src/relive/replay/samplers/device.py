"""Replay on a torch device: columns as tensors, and uniform / PER / symmetric sampling that never leaves it.

    buf = ReplayBuffer(capacity, obs_shape, action_shape, sampler=DevicePrioritizedSampler(), backend="torch",
                       device="cuda")
    buf.extend(rows)                        # host rows -> device columns (one copy per write)
    batch = buf.sample(256)                 # every field a tensor on the device, info included
    buf.update(batch.info, td_error=td)     # td a tensor on the device: priorities change there

What runs where. Writes come from the environment (host arrays): the bookkeeping that follows them (episodes,
streams, generations) stays on the host as in the NumPy storage, and the data columns, the generation stamps and
the priority tree get a copy on the device. A batch is drawn, gathered, importance-weighted and fed back on the
device: nothing is read back to the host per batch (the stale-row check compares generations there, and counts
stale rows in a device tensor read only by ``stats``). Everything cold (checkpoints, ``stats``, ``probabilities``,
reading rows through the storage's NumPy API) copies to the host; checkpoints are those of the NumPy storage and
load into either.

What it supports: flat or dict observations (stored explicitly: ``dedup_next_obs`` is off), extra columns, one or
several streams; the samplers of this module (uniform, proportional PER, the symmetric offline / online split of
RLPD with a uniform or PER online part: ``to_device_sampler`` converts the host ones). n-step returns and slices
(``sample_sequences``) are host-only.

PER's priorities (``DevicePrioritizedSampler(layout=...)``): ``"scan"`` (default, :class:`TorchScanLeaves`) keeps
them in one tensor and draws a batch with a cumulative sum and one ``searchsorted`` -- O(capacity) work in a few
kernels, the right trade on a GPU; ``"tree"`` (:class:`TorchSumTree`) is 8-ary like the host tree
(relive.replay.sum_tree): a batch walks it level by level, each level one gather of 8 children per row; an update
writes the leaves, then recomputes the parents of the touched nodes from their 8 children in a fixed order, so totals
do not drift. In both a duplicate index writes the same value everywhere (the last write of the batch wins, as on the
host).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from relive.replay.samplers.base import MAX_PRIORITY, Sampler
from relive.replay.samplers.mixture import MixtureSampler
from relive.replay.samplers.per import PrioritizedSampler
from relive.replay.samplers.uniform import UniformSampler
from relive.replay.storage.torch_column import TorchColumn, torch_dtype

if TYPE_CHECKING:
    from relive.replay.storage import StorageView

ARITY = 8


class DeviceDraw(NamedTuple):
    indices: torch.Tensor  # int64 tensor [B] on the device
    probability: torch.Tensor  # float64 tensor [B]
    is_weight: torch.Tensor  # float32 tensor [B]


# -- the tree -------------------------------------------------------------------------------------------------
class TorchSumTree:
    """An 8-ary sum tree over ``capacity`` float64 leaves on a torch device (levels[0] is the root, levels[-1]
    the leaves, padded with zeros to a power of 8). No operation reads a value back to the host."""

    def __init__(self, capacity: int, device):
        self.capacity = int(capacity)
        depth = 1
        while ARITY**depth < self.capacity:
            depth += 1
        self.depth = depth
        self.levels = [torch.zeros(ARITY**d, dtype=torch.float64, device=device) for d in range(depth + 1)]

    @property
    def leaves(self):
        """The leaf values (a view: do not write it, use ``update``)."""
        return self.levels[-1][: self.capacity]

    @property
    def total(self):
        return self.levels[0][0]

    def set_all(self, values) -> None:
        leaves = self.levels[-1]
        leaves.zero_()
        leaves[: self.capacity] = torch.as_tensor(np.asarray(values, np.float64), device=leaves.device)
        for d in range(self.depth - 1, -1, -1):
            self.levels[d].copy_(self.levels[d + 1].view(-1, ARITY).sum(dim=1))

    def clear(self, indices) -> None:
        """Set leaves to 0 (rows about to be overwritten)."""
        self.update(indices, self.levels[-1].new_zeros(indices.numel()))

    def update(self, indices, values) -> None:
        """Set leaves ``indices`` to ``values`` (tensors on the device); the last write of a duplicate index wins."""
        idx, val = last_write_wins(indices, values)
        self.levels[-1][idx] = val
        node = idx
        for d in range(self.depth - 1, -1, -1):
            node = node // ARITY
            self.levels[d][node] = self.levels[d + 1].view(-1, ARITY)[node].sum(dim=1)

    def draw(self, u):
        """Leaves drawn proportionally to their values for uniforms ``u`` in [0, 1): (indices, values, total)."""
        total = self.total
        idx, value = self.find_prefix(u * total)
        return idx, value, total

    def find_prefix(self, mass):
        """For each mass in [0, total): the leaf where the running sum of the leaves passes it, and its value.
        Leaves of value 0 are never returned while the tree holds a positive value (rounding at the top end
        lands on the last positive child)."""
        node = torch.zeros_like(mass, dtype=torch.int64)
        mass = mass.clone()
        arange = torch.arange(ARITY, device=mass.device)
        for d in range(1, self.depth + 1):
            children = self.levels[d].view(-1, ARITY)[node]  # [B, 8]
            cums = torch.cumsum(children, dim=1)
            child = (mass.unsqueeze(1) >= cums).sum(dim=1)
            last_positive = torch.where(children > 0, arange, -1).amax(dim=1).clamp_min(0)
            child = torch.minimum(child, last_positive)
            mass = (mass - (cums - children).gather(1, child.unsqueeze(1)).squeeze(1)).clamp_min(0)
            node = node * ARITY + child
        return node, self.levels[-1][node]


def last_write_wins(indices, values):
    """(indices, values) sorted by index, every copy of a duplicate index carrying the value of its last occurrence,
    so that an indexed write gives the same result whichever copy lands last (index_put's order is unspecified)."""
    idx = indices.reshape(-1).to(torch.int64)
    val = values.reshape(-1).to(torch.float64)
    if idx.numel() < 2:
        return idx, val
    order = torch.arange(idx.numel(), device=idx.device)
    sorted_idx, perm = torch.sort(idx, stable=True)
    first = torch.ones_like(sorted_idx, dtype=torch.bool)
    first[1:] = sorted_idx[1:] != sorted_idx[:-1]
    run = torch.cumsum(first.to(torch.int64), 0) - 1
    last = torch.zeros(idx.numel(), dtype=torch.int64, device=idx.device).scatter_reduce(
        0, run, order, "amax", include_self=False)  # position (in sorted order) of each run's last copy
    return sorted_idx, val[perm][last[run]]


class TorchScanLeaves:
    """The leaves in one float64 tensor, no tree: a draw is one cumulative sum over them and one ``searchsorted`` per
    batch (O(capacity) work in a few kernels, where the tree walk is O(B log capacity) work in ~12 kernels per level),
    an update one indexed write. Same interface as :class:`TorchSumTree`."""

    def __init__(self, capacity: int, device):
        self.capacity = int(capacity)
        self.values = torch.zeros(self.capacity, dtype=torch.float64, device=device)

    @property
    def leaves(self):
        return self.values

    def set_all(self, values) -> None:
        self.values.copy_(torch.as_tensor(np.asarray(values, np.float64), device=self.values.device))

    def clear(self, indices) -> None:
        self.values[indices.reshape(-1)] = 0.0

    def update(self, indices, values) -> None:
        idx, val = last_write_wins(indices, values)
        self.values[idx] = val

    def draw(self, u):
        cums = torch.cumsum(self.values, 0)
        total = cums[-1]
        idx = torch.searchsorted(cums, u * total, right=True)
        # rounding at the top end (u * total == total): the last positive leaf, the first where cums reaches total
        idx = torch.minimum(idx, torch.searchsorted(cums, total.reshape(1)))
        return idx, self.values[idx], total


# -- samplers ---------------------------------------------------------------------------------------------------
class DeviceSamplerMixin:
    """What a device sampler adds to its host class: ``sample_device`` / ``update_device`` on tensors (the host
    ``sample`` is refused: its draws would be NumPy arrays the device batch cannot use)."""

    if TYPE_CHECKING:  # what it reads of the host sampler class it is mixed into (and of the device class)
        storage: StorageView

        def num_rows(self) -> int: ...
        def _domain_name(self) -> str: ...
        def _draw_device(self, batch_size: int, gen) -> DeviceDraw: ...

    def sample_device(self, batch_size: int, gen) -> DeviceDraw:
        if self.num_rows() == 0:
            raise ValueError(f"cannot sample: no {self._domain_name()} rows stored yet")
        draw = self._draw_device(int(batch_size), gen)
        self._last_device_indices = draw.indices
        return draw

    def last_online_fraction(self) -> float:
        idx = getattr(self, "_last_device_indices", None)
        if idx is None:
            return float("nan")
        return float((idx >= self.storage.num_offline).double().mean())

    def update_device(self, slots, signals: dict, keep) -> None:
        """Per-sample signals (tensors [B]) for the rows where ``keep`` (a bool tensor) is True."""

    def _draw(self, batch_size: int, rng: np.random.Generator):
        raise ValueError("a device sampler draws with sample_device (ReplayBuffer(backend='torch').sample)")


def _uniform(lo: int, hi: int, batch_size: int, gen, device) -> DeviceDraw:
    idx = torch.randint(lo, hi, (batch_size,), generator=gen, device=device)
    return DeviceDraw(idx, torch.full((batch_size,), 1.0 / (hi - lo), dtype=torch.float64, device=device),
                      torch.ones(batch_size, dtype=torch.float32, device=device))


class DeviceUniformSampler(DeviceSamplerMixin, UniformSampler):
    """Uniform over the stored rows (of one source), drawn on the device."""

    checkpoint_name = "UniformSampler"

    def _draw_device(self, batch_size: int, gen) -> DeviceDraw:
        lo, hi = self.domain()
        return _uniform(lo, hi, batch_size, gen, self.storage.device)


class DevicePrioritizedSampler(DeviceSamplerMixin, PrioritizedSampler):
    """Proportional PER (relive.replay.samplers.per, the same rules and checkpoints) with its tree on the device:
    P(i) = p_i^alpha / sum_k p_k^alpha, w_i = (min_j P_j / P_i)^beta over the batch (Schaul et al. Sec. 3.3-3.4);
    new rows get the largest priority stored outside the rows they overwrite (``initial_priority`` when none)."""

    checkpoint_name = "PrioritizedSampler"

    def __init__(self, *args, layout: str = "scan", **kwargs):
        """``layout``: ``"scan"`` (default: the leaves in one tensor, a cumulative sum + searchsorted per batch) or
        ``"tree"`` (the 8-ary :class:`TorchSumTree`); the same distribution, different costs (docs/gpu.md)."""
        super().__init__(*args, **kwargs)
        if layout not in ("scan", "tree"):
            raise ValueError(f"DevicePrioritizedSampler: layout must be 'scan' or 'tree', got {layout!r}")
        self.layout = layout

    def bind(self, storage, source=None) -> None:
        Sampler.bind(self, storage, source)
        cls = TorchScanLeaves if self.layout == "scan" else TorchSumTree
        self.tree = cls(storage.capacity, storage.device)
        self.sum_tree = None  # type: ignore[assignment]  # (the host tree: not used on the device, so not kept)

    def on_insert(self, slots: np.ndarray) -> None:
        leaves = self.tree.leaves
        idx = torch.as_tensor(np.asarray(slots, np.int64), device=leaves.device)
        self.tree.clear(idx)  # the overwritten rows no longer count towards the largest stored priority
        current = leaves.max()
        p = torch.where(current > 0, current, torch.full_like(current, self.initial_priority ** self.priority_exponent))
        self.tree.update(idx, p.expand(idx.numel()))

    def _draw_device(self, batch_size: int, gen) -> DeviceDraw:
        device = self.storage.device
        u = torch.rand(batch_size, generator=gen, dtype=torch.float64, device=device)
        idx, value, total = self.tree.draw(u)
        probability = value / total
        beta = self.beta
        self.num_samples += 1
        # every stored priority 0 (or underflowed): no proportional distribution, draw uniformly (as the host)
        lo, hi = self.domain()
        flat = _uniform(lo, hi, batch_size, gen, device)
        positive = total > 0
        idx = torch.where(positive, idx, flat.indices)
        probability = torch.where(positive, probability, flat.probability)
        # (N P_i)^-beta / max_j (N P_j)^-beta = (min_j P_j / P_i)^beta (Sec. 3.4): N cancels, the largest is 1
        is_weight = torch.where(positive, (probability.min() / probability) ** beta, 1.0).to(torch.float32)
        return DeviceDraw(idx, probability, is_weight)

    def priority_device(self, signals: dict):
        if "td_error" in signals:
            p = signals["td_error"].to(torch.float64).abs() + self.eps
        elif "priority" in signals:
            p = signals["priority"].to(torch.float64).clamp_min(0)
        else:
            raise ValueError(f"{type(self).__name__}.update needs a 'td_error' or 'priority' signal, "
                             f"got {sorted(signals)}")
        return p.clamp_max(MAX_PRIORITY) ** self.priority_exponent

    def update_device(self, slots, signals: dict, keep) -> None:
        p = self.priority_device(signals)
        self.tree.update(slots, torch.where(keep, p, self.tree.leaves[slots]))  # a skipped row keeps its own

    # the host API, through the device tree (tests, stats, checkpoints)
    def update(self, slots: np.ndarray, signals: dict) -> None:
        device = self.storage.device
        idx = torch.as_tensor(np.asarray(slots, np.int64), device=device)
        sig = {k: torch.as_tensor(np.asarray(v, np.float64), device=device) for k, v in signals.items()}
        self.update_device(idx, sig, torch.ones(idx.numel(), dtype=torch.bool, device=device))

    def leaf_values(self) -> np.ndarray:
        return self.tree.leaves.cpu().numpy()

    def set_leaf_values(self, leaves: np.ndarray) -> None:
        self.tree.set_all(leaves)


class DeviceMixtureSampler(DeviceSamplerMixin, MixtureSampler):
    """RLPD's symmetric split (relive.replay.samplers.mixture: round(B f) offline rows, the rest online, each part's
    probability scaled by its share) with both parts drawn on the device."""

    checkpoint_name = "MixtureSampler"

    def _draw_device(self, batch_size: int, gen) -> DeviceDraw:
        return self.joined_parts(batch_size, lambda child, k: child.sample_device(k, gen), torch.cat)

    def update_device(self, slots, signals: dict, keep) -> None:
        online = slots >= self.storage.num_offline
        offline_part, online_part = self.offline, self.online
        assert isinstance(offline_part, DeviceSamplerMixin) and isinstance(online_part, DeviceSamplerMixin)  # (twins)
        offline_part.update_device(slots, signals, keep & ~online)
        online_part.update_device(slots, signals, keep & online)


DEVICE_SAMPLERS = (DeviceUniformSampler, DevicePrioritizedSampler, DeviceMixtureSampler)


def to_device_sampler(sampler: Sampler) -> Sampler:
    """The device twin of a host sampler with the same settings: uniform, PER, and the symmetric mixture of those
    (RLPD's ``symmetric`` / ``symmetric_per``). Any other strategy: a ValueError naming what runs on a device."""
    if isinstance(sampler, DEVICE_SAMPLERS):
        return sampler
    if type(sampler) is UniformSampler:
        return DeviceUniformSampler()
    if type(sampler) is PrioritizedSampler:
        return DevicePrioritizedSampler(**sampler.config())
    if type(sampler) is MixtureSampler and sampler.demonstrations is not None:
        raise ValueError("a MixtureSampler with a demonstrations part has no device version (a demonstration "
                         "segment needs a host backend); leave replay.device unset")
    if type(sampler) is MixtureSampler:
        return DeviceMixtureSampler(to_device_sampler(sampler.offline), to_device_sampler(sampler.online),
                                    sampler.offline_fraction, sampler.schedule, sampler.offline_fraction_final,
                                    sampler.schedule_steps)
    raise ValueError(f"{type(sampler).__name__} has no device version: replay on a device (replay.device) "
                     "supports uniform, per and mixtures of them (symmetric, symmetric_per); the other strategies "
                     "read rows per batch on the host (leave replay.device unset)")


__all__ = ["TorchColumn", "TorchSumTree", "DeviceDraw", "DeviceUniformSampler", "DevicePrioritizedSampler",
           "DeviceMixtureSampler", "to_device_sampler", "torch_dtype"]
