"""Proportional prioritized experience replay (Schaul et al., ICLR 2016, arXiv 1511.05952).

P(i) = p_i^alpha / sum_k p_k^alpha with p_i = |delta_i| + eps                    (Sec. 3.3, proportional)
w_i  = (N * P(i))^-beta / max_j w_j, max over the sampled batch                 (Sec. 3.4)
beta annealed linearly from ``is_exponent`` to ``is_exponent_final`` over ``is_anneal_samples`` sample calls.
New and overwritten rows get the largest priority *currently stored* (a max tree keeps it exact when the
row that held it is overwritten or lowered), so every row is replayed at least once; an empty buffer uses
``initial_priority``.

The tree stores p_i^alpha (float64). Draws are i.i.d. (not stratified), so ``probability`` is exact per draw.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relive.registry import ReplayBuild, register_replay
from relive.replay import _check_kernels
from relive.replay.samplers.base import MAX_EXPONENT, MAX_PRIORITY, Draw, Sampler, check_number, state_array, state_int
from relive.replay.sum_tree import SumMaxTree, SumTree


def check_signal(name: str, values: np.ndarray, *, nonnegative: bool = False) -> np.ndarray:
    """float64 view of a signal; the buffer has checked shape and finiteness, this checks the sign."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if nonnegative and (values < 0).any():
        i = int(np.flatnonzero(values < 0)[0])
        raise ValueError(f"signal {name!r} row {i}: value {values[i]!r} must be >= 0")
    return values


def contiguous_runs(slots: np.ndarray, max_runs: int = 2) -> list[tuple[int, int]] | None:
    """``slots`` as at most ``max_runs`` ascending runs of consecutive slots ((start, length) pairs), which is
    what appending to the storage produces (two runs when the ring wraps); None otherwise."""
    n = slots.size
    if n == 0:
        return []
    breaks = np.flatnonzero((slots[1:] - slots[:-1]) != 1)
    if breaks.size >= max_runs:
        return None
    if breaks.size == 0:
        return [(int(slots[0]), n)]
    bounds = [0, *(breaks + 1).tolist(), n]
    return [(int(slots[a]), b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def linear_anneal(start: float, final: float, steps: int, t: int) -> float:
    """``start`` moved linearly to ``final`` over ``steps`` calls (constant when steps <= 0)."""
    if steps <= 0:
        return start
    return start + min(1.0, t / steps) * (final - start)


def proportional_draw(tree: SumTree, batch_size: int, rng: np.random.Generator,
                      is_exponent: float | None = None) -> Draw:
    """i.i.d. draws proportional to the tree's leaves; IS weights (N P)^-beta / batch max when ``is_exponent``
    is given, ones otherwise."""
    indices, probability, ratio = tree.draw(rng.random(batch_size))
    if is_exponent is None:
        return Draw(indices, probability, np.ones(batch_size, np.float32))
    # (N P_i)^-beta / max_j (N P_j)^-beta = (min_j P_j / P_i)^beta: N cancels, the largest weight is exactly 1
    np.power(ratio, is_exponent, out=ratio)
    return Draw(indices, probability, ratio.astype(np.float32))


def tree_probabilities(tree: SumTree) -> np.ndarray:
    leaves = np.array(tree.leaves)
    total = leaves.sum()
    return leaves / total if total > 0 else leaves


@dataclass(frozen=True)
class PERConfig:
    """Proportional prioritized replay (Schaul et al. 2016)."""

    priority_exponent: float = 0.6  # alpha: P(i) ~ p_i^alpha
    is_exponent: float = 0.4  # beta at the start: IS weight (N P(i))^-beta, normalized by the batch max
    is_exponent_final: float = 1.0  # beta at the end of the annealing
    # sample calls over which beta moves linearly from is_exponent to is_exponent_final; None: the run's gradient
    # steps (a buffer built outside a run: 0, beta stays at is_exponent)
    is_anneal_samples: int | None = None
    eps: float = 1e-6  # p_i = |delta_i| + eps: a row with a zero TD error can still be drawn
    initial_priority: float = 1.0  # the priority of the first rows (an empty buffer stores no largest priority)

    def __post_init__(self):
        name = type(self).__name__
        check_number(name, "priority_exponent", self.priority_exponent, low=0, high=MAX_EXPONENT)
        check_number(name, "is_exponent", self.is_exponent, low=0)
        check_number(name, "is_exponent_final", self.is_exponent_final, low=0)
        if self.is_anneal_samples is not None:
            check_number(name, "is_anneal_samples", self.is_anneal_samples, low=0, integer=True)
        check_number(name, "eps", self.eps, low=0, high=MAX_PRIORITY)
        check_number(name, "initial_priority", self.initial_priority, low=0, low_open=True, high=MAX_PRIORITY)


@register_replay("per")
class PrioritizedSampler(Sampler):
    """proportional PER over offline + online rows, IS exponent annealed over the run"""

    signals = ("td_error", "priority")
    Config = PERConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.priority_exponent, self.is_exponent = float(o.priority_exponent), float(o.is_exponent)
        self.is_exponent_final = float(o.is_exponent_final)
        self.is_anneal_samples = int(o.is_anneal_samples or 0)
        self.eps, self.initial_priority = float(o.eps), float(o.initial_priority)
        self.num_samples = 0
        # built in bind() (capacity unknown before; the buffer binds before any use): typed as built, no narrowing.
        # One tree answers both sums (draws) and the largest stored priority (new rows): sum_tree is max_tree.
        self.sum_tree: SumMaxTree = None  # type: ignore[assignment]

    def bind(self, storage, source=None) -> None:
        super().bind(storage, source)
        self.sum_tree = SumMaxTree(storage.capacity)

    @property
    def max_tree(self) -> SumMaxTree:
        """The tree that answers the largest stored priority (the sum tree itself: it keeps the maxima too)."""
        return self.sum_tree

    def anneal_over_next(self, num_samples: int) -> None:
        """beta reaches ``is_exponent_final`` after ``num_samples`` more sample calls, unless ``is_anneal_samples``
        was configured."""
        if self.options.is_anneal_samples is None:
            self.is_anneal_samples = self.num_samples + int(num_samples)

    @property
    def beta(self) -> float:
        """Current importance-sampling exponent of the linear schedule."""
        return linear_anneal(self.is_exponent, self.is_exponent_final, self.is_anneal_samples, self.num_samples)

    def on_insert(self, slots: np.ndarray) -> None:
        tree = self.sum_tree
        runs = contiguous_runs(slots)
        # the overwritten rows no longer count towards "the largest priority currently stored"
        if runs is None:  # scattered slots (the storage always writes runs): clear them, then read the root
            tree.update(slots, np.zeros(slots.size))
            current = tree.max
        else:  # the max over the leaves outside the runs: range queries, nothing written twice
            current, lo = 0.0, 0
            for start, n in sorted(runs):
                current = max(current, tree.range_max(lo, start))
                lo = start + n
            current = max(current, tree.range_max(lo, tree.capacity))
        p = current if current > 0 else self.initial_priority ** self.priority_exponent
        values = np.full(slots.size, p)
        if runs is None:
            tree.update(slots, values)
        else:
            offset = 0
            for start, n in runs:
                tree.update_range(start, values[offset : offset + n])
                offset += n

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        if self.sum_tree.total > 0:
            draw = proportional_draw(self.sum_tree, batch_size, rng, self.beta)
        else:  # every stored priority is 0 (or underflowed): no proportional distribution, draw uniformly
            lo, hi = self.domain()
            draw = Draw(rng.integers(lo, hi, size=batch_size, dtype=np.int64), np.full(batch_size, 1.0 / (hi - lo)),
                        np.ones(batch_size, np.float32))
        self.num_samples += 1
        return draw

    def priority_from_signals(self, signals: dict) -> np.ndarray:
        """p^alpha from ``td_error`` ((|delta| + eps)^alpha) or from a raw ``priority`` (priority^alpha); the base
        is clamped to ``MAX_PRIORITY`` so that every probability and IS weight stays finite."""
        if "td_error" in signals:
            td = signals["td_error"]
            if _check_kernels.AVAILABLE and type(td) is np.ndarray and td.dtype == np.float64 and td.ndim == 1:
                p = np.empty(td.size)  # the buffer's checked [B] signal: abs, eps and the cap in one compiled pass
                _check_kernels.td_priority(td, self.eps, MAX_PRIORITY, p)
                return np.power(p, self.priority_exponent, out=p)
            p = np.abs(check_signal("td_error", td))
            p += self.eps
        elif "priority" in signals:
            p = check_signal("priority", signals["priority"], nonnegative=True).copy()
        else:
            raise ValueError(f"{type(self).__name__}.update needs a 'td_error' or 'priority' signal, "
                             f"got {sorted(signals)}")
        np.minimum(p, MAX_PRIORITY, out=p)
        return np.power(p, self.priority_exponent, out=p)

    def check_signals(self, slots: np.ndarray, signals: dict) -> None:
        super().check_signals(slots, signals)
        if "td_error" not in signals and "priority" not in signals:
            raise ValueError(f"{type(self).__name__}.update needs a 'td_error' or 'priority' signal, "
                             f"got {sorted(signals)}")

    def update(self, slots: np.ndarray, signals: dict) -> None:
        p = self.priority_from_signals(signals)
        if p.size != slots.size:
            raise ValueError(f"got {p.size} signal values for {slots.size} rows")
        self.sum_tree.update(slots, p)

    def leaf_values(self) -> np.ndarray:
        """p^alpha of every slot (a copy; length capacity)."""
        return np.array(self.sum_tree.leaves)

    def set_leaf_values(self, leaves: np.ndarray) -> None:
        self.sum_tree.set_all(leaves)

    def probabilities(self) -> np.ndarray:
        leaves = self.leaf_values()
        total = leaves.sum()
        if total > 0:
            return leaves / total
        p = np.zeros(self.storage.capacity)  # every priority 0: uniform over the stored rows, as _draw
        lo, hi = self.domain()
        if hi > lo:
            p[lo:hi] = 1.0 / (hi - lo)
        return p

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/is_exponent": self.beta}

    @classmethod
    def from_run(cls, options: PERConfig, ctx: ReplayBuild) -> PrioritizedSampler:
        """beta anneals over the run's gradient steps unless ``is_anneal_samples`` is set."""
        if options.is_anneal_samples is None:
            options = replace(options, is_anneal_samples=ctx.total_grad_steps)
        return cls(options)

    def state_dict(self) -> dict:
        return super().state_dict() | {"priority": self.leaf_values()[: self.storage.size],
                                       "num_samples": self.num_samples,
                                       "is_anneal_samples": self.is_anneal_samples}  # (planned by anneal_over_next)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        owner = self._owner()
        leaves = np.zeros(self.storage.capacity)
        pr = state_array(state, "priority", owner, length=self.storage.size, low=0.0)
        stray = np.flatnonzero((pr != 0) & ~self.drawable(pr.size))
        if stray.size:  # (it would be drawn: a row this sampler does not hold, or an empty demonstration slot)
            raise ValueError(f"{owner} field 'priority' entry {stray[0]}: slot {stray[0]} is not a row this sampler "
                             f"draws, yet has priority {pr[stray[0]]!r}")
        leaves[: pr.size] = pr
        num_samples = state_int(state, "num_samples", owner)
        horizon = state_int(state, "is_anneal_samples", owner) if "is_anneal_samples" in state else None
        self.set_leaf_values(leaves)
        self.num_samples = num_samples
        if horizon is not None:  # (checkpoints before anneal_over_next have none: the configured one stays)
            self.is_anneal_samples = horizon
