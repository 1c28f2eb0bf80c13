"""BERB: balanced experience replay (Lee, Seo, Lee, Abbeel, Shin; CoRL 2021, arXiv 2107.00591).

Prioritize rows by how *online-like* they are, with a density ratio w(s, a) ~ d_online(s, a) / d_offline(s, a)
learned by a small network (Sec. 4.2; the variational f-divergence estimator of Sinha et al., LFIW):

    L(psi) = E_offline[ f*(f'(w)) ] - E_online[ f'(w) ],  Jensen-Shannon: f'(w) = log(2w / (w + 1)),
             f*(f'(w)) = -log(2 / (w + 1))                                                     [L_w]
    priority_i = clip( w(s_i, a_i)^(1/T) / mean_{offline batch} w^(1/T), 1e-3, 1e3 ),  T = 5      [p_i]

(The paper's text was not available to us: the formulas, their constants and their order are those of the
official code, shlee94/Off2OnRL ``rlkit/torch/sac/ours.py``; [L_w] and [p_i] label them below.)

One sum tree over the union of offline and online rows, i.i.d. proportional draws, no importance-sampling
correction (as in the reference code, shlee94/Off2OnRL ``ours.py``).

How the trainer drives it: nothing beyond the usual loop. Every ``buffer.update(info, **signals)`` after a
gradient step calls ``update``, which (in the reference code's order) evaluates w on the rows just sampled and
on a uniform offline and a uniform online batch of ``ratio_batch_size`` rows (drawn by the sampler's own
generator), sets those rows' priorities from the *pre-step* network and the offline batch's mean of w^(1/T),
then takes one Adam step on L(psi): one density-ratio step per RL step. The signals themselves are not used.
``train_ratio()`` is the same step without a priority refresh (e.g. to pre-train w), and ``ratio(slots)``
evaluates w. Before the first online row (offline pre-training) ``update`` does nothing.

Offline rows enter with priority 1. Online rows enter with the all-time maximum priority (reference code);
before the first online row that maximum is set to M f / ((1 - f) N), M = number of offline rows,
N = ``first_chunk_rows``, so that the first online chunk receives the fraction f of the sampling mass.
The network (``hidden`` layers, ReLU, a ReLU on the output so that w >= 0, last bias 1 so that w starts near 1)
is built and trained here in torch, seeded from ``seed`` without touching the global torch RNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from relive.registry import ReplayBuild, register_replay
from relive.replay.samplers.base import MAX_PRIORITY, Draw, Sampler, check_number, state_array, state_float, state_int
from relive.replay.samplers.per import proportional_draw, tree_probabilities
from relive.replay.sum_tree import SumTree
from relive.types import ONLINE


@dataclass(frozen=True)
class BERBConfig:
    """Balanced replay (Lee et al. 2021): rows prioritized by a learned density ratio d_online / d_offline."""

    temperature: float = 5.0  # T in w = ratio^(1/T)
    init_online_fraction: float = 0.5  # online share of the probability mass before the ratio net is trained
    # online rows collected before the ratio net's first training; None: a run's max(env steps per chunk, 1000)
    # (a buffer built outside a run: 1000)
    first_chunk_rows: int | None = None
    hidden: tuple[int, ...] = (256, 256)  # the ratio net's hidden layer widths
    lr: float = 3e-4  # the ratio net's Adam learning rate
    ratio_batch_size: int = 256  # rows of each source per ratio-net step
    clip_low: float = 1e-3  # the ratio is clipped to [clip_low, clip_high]
    clip_high: float = 1e3
    seed: int | None = None  # the ratio net's initialization and batches; None: the run's sampler stream (else 0)
    device: str = "cpu"  # torch device of the ratio net

    def __post_init__(self):
        name = type(self).__name__
        check_number(name, "temperature", self.temperature, low=0, low_open=True)
        check_number(name, "init_online_fraction", self.init_online_fraction, low=0, high=1, low_open=True,
                     high_open=True)
        if self.first_chunk_rows is not None:
            check_number(name, "first_chunk_rows", self.first_chunk_rows, low=1, integer=True)
        if isinstance(self.hidden, str) or not hasattr(self.hidden, "__iter__"):
            raise ValueError(f"{name}: hidden must be a list of layer widths, got {self.hidden!r}")
        object.__setattr__(self, "hidden", tuple(check_number(name, "hidden layer width", h, low=1, integer=True)
                                                 for h in self.hidden))
        check_number(name, "lr", self.lr, low=0, low_open=True)
        check_number(name, "ratio_batch_size", self.ratio_batch_size, low=1, integer=True)
        check_number(name, "clip_low", self.clip_low, low=0, low_open=True, high=MAX_PRIORITY)
        check_number(name, "clip_high", self.clip_high, low=0, low_open=True, high=MAX_PRIORITY)
        if not self.clip_low < self.clip_high:
            raise ValueError(f"need 0 < clip_low < clip_high, got {self.clip_low}, {self.clip_high}")
        if self.seed is not None:
            check_number(name, "seed", self.seed, integer=True)
        if not isinstance(self.device, str):
            raise ValueError(f"{name}: device must be a torch device name, got {self.device!r}")


@register_replay("berb")
class BERBSampler(Sampler):
    """learned online/offline density ratio (balanced replay)"""

    Config = BERBConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.options
        self.temperature, self.init_online_fraction = float(o.temperature), float(o.init_online_fraction)
        self.first_chunk_rows = int(o.first_chunk_rows or 1000)
        self.hidden = o.hidden
        self.lr, self.ratio_batch_size = float(o.lr), int(o.ratio_batch_size)
        self.clip_low, self.clip_high = float(o.clip_low), float(o.clip_high)
        self.seed = int(o.seed or 0)
        self.device = o.device
        self.rng = np.random.default_rng(self.seed)
        self.max_priority = 1.0
        self.normalizer = 1.0  # mean over the last offline batch of w^(1/T)
        self.num_ratio_steps = 0
        self.num_skipped_ratio_steps = 0  # steps skipped for a non-finite loss or gradient
        self.last_ratio_loss = float("nan")
        self.seen_online = False

    def bind(self, storage, source=None) -> None:
        if source is not None:
            raise ValueError("BERBSampler weighs offline against online rows; it cannot be restricted to one source")
        super().bind(storage, source)
        import torch  # (torch: `import relive.replay` does not load it)
        from torch import nn

        self.tree = SumTree(storage.capacity)
        obs_dim = sum(int(np.prod(spec.shape)) for spec in _obs_specs(storage))  # dict obs: keys concatenated
        act_spec = storage.specs["action"]
        act_dim = int(np.prod(act_spec.shape)) if act_spec.shape else 1
        with torch.random.fork_rng(devices=[]):  # seeded init that leaves the global RNG alone
            torch.manual_seed(self.seed)
            layers: list[nn.Module] = []
            d = obs_dim + act_dim
            for h in self.hidden:
                layers += [nn.Linear(d, h), nn.ReLU()]
                d = h
            head = nn.Linear(d, 1)
            self.net = nn.Sequential(*layers, head).to(self.device)
        with torch.no_grad():
            head.bias.fill_(1.0)  # w starts near 1 (reference code)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)

    # -- density ratio ---------------------------------------------------------------------------------
    def ratio(self, slots: np.ndarray):
        """w(s, a) >= 0 of stored rows (a ReLU on the output), as a torch tensor [n] (with autograd)."""
        import torch  # (torch: `import relive.replay` does not load it)

        cols = self.storage.columns
        n = len(slots)
        obs = self.storage.read("obs", slots)
        if isinstance(obs, dict):
            obs = np.concatenate([v.reshape(n, -1).astype(np.float32, copy=False) for v in obs.values()], axis=1)
        obs = torch.as_tensor(obs.reshape(n, -1), dtype=torch.float32, device=self.device)
        act = torch.as_tensor(cols["action"].take(slots, axis=0).reshape(n, -1), dtype=torch.float32,
                              device=self.device)
        return torch.relu(self.net(torch.cat([obs, act], dim=1))).squeeze(-1)

    def _ratio_batches(self) -> tuple[np.ndarray, np.ndarray] | None:
        st = self.storage
        (off_lo, off_hi), (on_lo, on_hi) = st.slot_range(0), st.slot_range(ONLINE)
        if off_hi <= off_lo or on_hi <= on_lo:
            return None
        return (self.rng.integers(off_lo, off_hi, self.ratio_batch_size),
                self.rng.integers(on_lo, on_hi, self.ratio_batch_size))

    def _step(self, slots: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
        """One density-ratio step (False while a source is empty); with ``slots``, first their priorities
        [p_i] from the network before this step, as the reference code orders it."""
        import torch  # (torch: `import relive.replay` does not load it)

        batches = self._ratio_batches()
        if batches is None:
            return False, None
        off, on = batches
        w_off, w_on = self.ratio(off), self.ratio(on)
        f_star = -torch.log(2.0 / (w_off + 1.0) + 1e-10)  # f*(f'(w)) on offline rows, JS [L_w]
        f_prime = torch.log(2.0 * w_on / (w_on + 1.0) + 1e-10)  # f'(w) on online rows
        loss = (f_star - f_prime).mean()
        priority = None
        with torch.no_grad():
            inv_t = 1.0 / self.temperature
            normalizer = float((w_off.detach().double() ** inv_t).mean())  # MC E_off[w^(1/T)]
            if math.isfinite(normalizer):  # (extreme observations can overflow w: keep the last good one)
                self.normalizer = normalizer + 1e-10
            if slots is not None:
                priority = self.priority(slots)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.last_ratio_loss = float(loss.item())
        if math.isfinite(self.last_ratio_loss) and all(bool(torch.isfinite(q.grad).all())
                                                       for q in self.net.parameters() if q.grad is not None):
            self.opt.step()
        else:  # a non-finite loss or gradient would turn every weight into NaN: skip the step
            self.num_skipped_ratio_steps += 1
        self.num_ratio_steps += 1
        return True, priority

    def train_ratio(self) -> float:
        """One Adam step of the JS variational objective [L_w] on uniform offline and online batches, without
        a priority refresh; returns the loss (nan, and no step, while either source is empty)."""
        stepped, _ = self._step(None)
        return self.last_ratio_loss if stepped else float("nan")

    def priority(self, slots: np.ndarray) -> np.ndarray:
        """[p_i] for stored rows with the current network and the last offline batch's normalizer."""
        import torch  # (torch: `import relive.replay` does not load it)

        with torch.no_grad():
            w = self.ratio(slots).double()
            p = w ** (1.0 / self.temperature) / self.normalizer
            # a ratio that overflowed (extreme observations) gets the clip bound it exceeds; NaN the neutral 1
            p = torch.nan_to_num(p, nan=1.0, posinf=self.clip_high, neginf=self.clip_low)
            return p.clamp(self.clip_low, self.clip_high).cpu().numpy()

    # -- buffer hooks ----------------------------------------------------------------------------------
    def on_insert(self, slots: np.ndarray) -> None:
        st = self.storage
        online = st.source_of(slots) == ONLINE
        if online.any() and not self.seen_online:
            # the first online rows: give the first chunk the fraction f of the mass (reference code)
            self.seen_online = True
            f, m = self.init_online_fraction, max(st.num_offline, 1)
            self.max_priority = m * f / ((1 - f) * self.first_chunk_rows)
        self.tree.update(slots, np.where(online, self.max_priority, 1.0))

    def update(self, slots: np.ndarray, signals: dict) -> None:
        """After each RL step, with the rows it used: refresh their priorities, train w one step."""
        _, priority = self._step(slots)
        if priority is not None:
            self.tree.update(slots, priority)
            self.max_priority = max(self.max_priority, float(priority.max()))  # all-time max (reference)

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        return proportional_draw(self.tree, batch_size, rng)  # no importance-sampling correction (BERB)

    def probabilities(self) -> np.ndarray:
        return tree_probabilities(self.tree)

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/berb_ratio_loss": self.last_ratio_loss,
                                  "replay/berb_max_priority": self.max_priority,
                                  "replay/berb_normalizer": self.normalizer,
                                  "replay/berb_skipped_steps": float(self.num_skipped_ratio_steps)}

    # -- checkpoint ------------------------------------------------------------------------------------
    @classmethod
    def from_run(cls, options: BERBConfig, ctx: ReplayBuild) -> BERBSampler:
        """The first chunk and the seed from the run, unless set."""
        if options.first_chunk_rows is None:
            options = replace(options, first_chunk_rows=max(ctx.env_steps_per_chunk, 1000))
        if options.seed is None:
            options = replace(options, seed=int(ctx.seed.generate_state(1)[0] % 2**31))
        return cls(options)

    def state_dict(self) -> dict:
        size = self.storage.size
        net = {k.replace(".", "__"): v.detach().cpu().numpy().copy() for k, v in self.net.state_dict().items()}
        opt = self.opt.state_dict()
        opt_state = {str(k): {n: (v.detach().cpu().numpy().copy() if hasattr(v, "detach") else v) for n, v in s.items()}
                     for k, s in opt["state"].items()}
        return super().state_dict() | {
            "priority": np.array(self.tree.leaves[:size]), "net": net, "opt_state": opt_state,
            "rng": self.rng.bit_generator.state, "max_priority": self.max_priority,
            "normalizer": self.normalizer, "num_ratio_steps": self.num_ratio_steps,
            "num_skipped_ratio_steps": self.num_skipped_ratio_steps,
            "last_ratio_loss": self.last_ratio_loss, "seen_online": self.seen_online}

    def load_state_dict(self, state: dict) -> None:
        import torch  # (torch: `import relive.replay` does not load it)

        super().load_state_dict(state)
        owner = self._owner()
        leaves = np.zeros(self.storage.capacity)
        leaves[: self.storage.size] = state_array(state, "priority", owner, length=self.storage.size, low=0.0)
        for name in ("max_priority", "normalizer"):
            state_float(state, name, owner, low=0.0)
        for name in ("num_ratio_steps", "num_skipped_ratio_steps"):
            if name in state:
                state_int(state, name, owner)
        self.tree.set_all(leaves)
        self.net.load_state_dict({k.replace("__", "."): torch.as_tensor(np.asarray(v), device=self.device)
                                  for k, v in state["net"].items()})
        opt = self.opt.state_dict()  # param groups (lr, betas, ...) come from the config
        opt["state"] = {int(k): {n: (torch.as_tensor(np.asarray(v)) if isinstance(v, np.ndarray) else v)
                                 for n, v in s.items()} for k, s in state["opt_state"].items()}
        self.opt.load_state_dict(opt)
        self.rng.bit_generator.state = state["rng"]
        self.max_priority = float(state["max_priority"])
        self.normalizer = float(state["normalizer"])
        self.num_ratio_steps = int(state["num_ratio_steps"])
        self.num_skipped_ratio_steps = int(state.get("num_skipped_ratio_steps", 0))
        self.last_ratio_loss = float(state.get("last_ratio_loss", float("nan")))
        self.seen_online = bool(state.get("seen_online", self.storage.num_online_written > 0))


def _obs_specs(storage) -> list:
    spec = storage.obs_spec
    return list(spec.values()) if isinstance(spec, dict) else [spec]
