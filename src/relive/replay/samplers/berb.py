"""BERB: balanced experience replay (Lee, Seo, Lee, Abbeel, Shin; CoRL 2021, arXiv 2107.00591).

Prioritize rows by how *online-like* they are, with a density ratio w(s, a) ~ d_online(s, a) / d_offline(s, a)
learned by a small network (Sec. 4.2; the variational f-divergence estimator of Sinha et al., LFIW):

    L(psi) = E_offline[ f*(f'(w)) ] - E_online[ f'(w) ],  Jensen-Shannon: f'(w) = log(2w / (w + 1)),
             f*(f'(w)) = -log(2 / (w + 1))                                                     (Eq. 5)
    priority_i = clip( w(s_i, a_i)^(1/T) / mean_{offline batch} w^(1/T), 1e-3, 1e3 ),  T = 5      (Eq. 6)

One sum tree over the union of offline and online rows, no importance-sampling correction. The network is
trained one step per ``update`` call (one per RL gradient step, on 256 offline + 256 online rows drawn
uniformly by this sampler's own generator) and the priorities of the rows just sampled are refreshed with it
-- the trainer needs nothing special: ``buffer.update(info, **signals)`` drives both.

Offline rows enter with priority 1. Online rows enter with the all-time maximum priority (reference code);
before the first online row that maximum is set to M f / ((1 - f) N), M = number of offline rows,
N = ``first_chunk_rows``, so that the first online chunk receives the fraction f of the sampling mass.
"""

from __future__ import annotations

import numpy as np

from relive.replay.samplers.base import Draw, Sampler
from relive.replay.samplers.per import proportional_draw, tree_probabilities
from relive.replay.sum_tree import SumTree
from relive.types import ONLINE


class BERBSampler(Sampler):
    def __init__(self, temperature: float = 5.0, init_online_fraction: float = 0.5, first_chunk_rows: int = 1000,
                 hidden: tuple[int, ...] = (256, 256), lr: float = 3e-4, ratio_batch_size: int = 256,
                 clip_low: float = 1e-3, clip_high: float = 1e3, seed: int = 0, device: str = "cpu"):
        super().__init__()
        if temperature <= 0 or not 0 < init_online_fraction < 1 or first_chunk_rows < 1:
            raise ValueError("need temperature > 0, 0 < init_online_fraction < 1, first_chunk_rows >= 1")
        self.temperature = float(temperature)
        self.init_online_fraction = float(init_online_fraction)
        self.first_chunk_rows = int(first_chunk_rows)
        self.hidden = tuple(int(h) for h in hidden)
        self.lr = float(lr)
        self.ratio_batch_size = int(ratio_batch_size)
        self.clip_low, self.clip_high = float(clip_low), float(clip_high)
        self.seed = int(seed)
        self.device = device
        self.rng = np.random.default_rng(seed)
        self.max_priority = 1.0
        self.normalizer = 1.0  # mean over the last offline batch of w^(1/T)
        self.num_ratio_steps = 0
        self.last_ratio_loss = float("nan")

    def bind(self, storage, source=None) -> None:
        if source is not None:
            raise ValueError("BERBSampler weighs offline against online rows; it cannot be restricted to one source")
        super().bind(storage, source)
        import torch

        from relive.agents.networks import mlp

        self.tree = SumTree(storage.capacity)
        obs_dim = int(np.prod(storage.specs["obs"].shape))
        act_spec = storage.specs["action"]
        act_dim = int(np.prod(act_spec.shape)) if act_spec.shape else 1
        gen = torch.Generator().manual_seed(self.seed)
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.set_state(gen.get_state())
            self.net = mlp(obs_dim + act_dim, self.hidden, 1).to(self.device)
        with torch.no_grad():
            self.net[-1].bias.fill_(1.0)  # w starts near 1 (reference code)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)

    # -- density ratio ---------------------------------------------------------------------------------
    def ratio(self, slots: np.ndarray):
        """w(s, a) >= 0 of stored rows (a ReLU on the output), as a torch tensor [n]."""
        import torch

        cols = self.storage.columns
        obs = torch.as_tensor(cols["obs"].take(slots, axis=0), dtype=torch.float32, device=self.device)
        act = torch.as_tensor(cols["action"].take(slots, axis=0), dtype=torch.float32, device=self.device)
        x = torch.cat([obs.reshape(len(slots), -1), act.reshape(len(slots), -1)], dim=1)
        return torch.relu(self.net(x)).squeeze(-1)

    def train_ratio(self) -> float:
        """One Adam step of the JS variational objective (Eq. 5) on uniform offline and online batches."""
        import torch

        st = self.storage
        (off_lo, off_hi), (on_lo, on_hi) = st.slot_range(0), st.slot_range(ONLINE)
        if off_hi <= off_lo or on_hi <= on_lo:
            return float("nan")
        off = self.rng.integers(off_lo, off_hi, self.ratio_batch_size)
        on = self.rng.integers(on_lo, on_hi, self.ratio_batch_size)
        w_off, w_on = self.ratio(off), self.ratio(on)
        f_star = -torch.log(2.0 / (w_off + 1.0) + 1e-10)  # f*(f'(w)) on offline rows
        f_prime = torch.log(2.0 * w_on / (w_on + 1.0) + 1e-10)  # f'(w) on online rows
        loss = f_star.mean() - f_prime.mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        with torch.no_grad():
            self.normalizer = float((w_off.detach() ** (1.0 / self.temperature)).mean().clamp_min(1e-10))
        self.num_ratio_steps += 1
        self.last_ratio_loss = float(loss.item())
        return self.last_ratio_loss

    def priority(self, slots: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            w = self.ratio(slots).cpu().numpy().astype(np.float64)
        return np.clip(w ** (1.0 / self.temperature) / self.normalizer, self.clip_low, self.clip_high)

    # -- buffer hooks ----------------------------------------------------------------------------------
    def on_insert(self, slots: np.ndarray) -> None:
        st = self.storage
        online = st.meta["source"].take(slots) == ONLINE
        if online.any() and st.num_online == online.sum() and self.num_ratio_steps == 0 and \
                self.max_priority == 1.0:
            # first online rows: give the first chunk the fraction f of the mass (reference code)
            f, m = self.init_online_fraction, max(st.num_offline, 1)
            self.max_priority = m * f / ((1 - f) * self.first_chunk_rows)
        values = np.where(online, self.max_priority, 1.0)
        self.tree.update(slots, values)

    def update(self, slots: np.ndarray, signals: dict) -> None:
        """Called after each RL step with the rows it used: train w one step, refresh those rows' priorities."""
        self.train_ratio()
        if self.num_ratio_steps:
            p = self.priority(slots)
            self.tree.update(slots, p)
            self.max_priority = max(self.max_priority, float(p.max()))

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        return proportional_draw(self.tree, batch_size, rng)  # no importance-sampling correction (BERB)

    def probabilities(self) -> np.ndarray:
        return tree_probabilities(self.tree)

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/berb_ratio_loss": self.last_ratio_loss,
                                  "replay/berb_max_priority": self.max_priority}

    # -- checkpoint ------------------------------------------------------------------------------------
    def config(self) -> dict:
        return dict(temperature=self.temperature, init_online_fraction=self.init_online_fraction,
                    first_chunk_rows=self.first_chunk_rows, hidden=list(self.hidden), lr=self.lr,
                    ratio_batch_size=self.ratio_batch_size, clip_low=self.clip_low, clip_high=self.clip_high,
                    seed=self.seed, device=self.device)

    def state_dict(self) -> dict:
        from relive.agents.networks import module_state, optimizer_state

        size = self.storage.size
        return super().state_dict() | {
            "priority": np.array(self.tree.leaves[:size]), "net": module_state(self.net),
            "opt": optimizer_state(self.opt), "rng": self.rng.bit_generator.state, "max_priority": self.max_priority,
            "normalizer": self.normalizer, "num_ratio_steps": self.num_ratio_steps}

    def load_state_dict(self, state: dict) -> None:
        from relive.agents.networks import load_module_state, load_optimizer_state

        super().load_state_dict(state)
        leaves = np.zeros(self.storage.capacity)
        leaves[: len(state["priority"])] = state["priority"]
        self.tree.set_all(leaves)
        load_module_state(self.net, state["net"])
        load_optimizer_state(self.opt, state["opt"])
        self.rng.bit_generator.state = state["rng"]
        self.max_priority = float(state["max_priority"])
        self.normalizer = float(state["normalizer"])
        self.num_ratio_steps = int(state["num_ratio_steps"])
