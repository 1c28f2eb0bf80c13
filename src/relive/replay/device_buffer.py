"""DeviceReplayBuffer: a :class:`~relive.replay.buffer.ReplayBuffer` whose columns, draws and priority updates live
on a torch device (``ReplayBuffer(..., backend="torch", device="cuda")`` builds one).

The host buffer's API with tensors: batches and ``batch.info`` hold tensors on the device; an update reads nothing
back (stale rows and non-finite signals are counted on the device and folded into ``num_stale`` /
``num_invalid`` when ``stats`` or a checkpoint reads them). Samplers are the host ones' device twins
(:mod:`relive.replay.samplers.device`). Its checkpoints are the host format plus the device generator's state. torch is
imported only when such a buffer is built (``import relive.replay`` does not load it).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from relive.replay import returns
from relive.replay.buffer import BACKEND_CLASSES, ReplayBuffer
from relive.replay.samplers import Sampler
from relive.replay.state_checks import state_int
from relive.types import Batch, SampleInfo, UpdateReport

DRAWS_KNOWN = 16  # the latest draws whose indices an update may name without a host check


class DeviceReplayBuffer(ReplayBuffer):
    on_device = True
    sampler: Any  # a device sampler (relive.replay.samplers.device: sample_device / update_device)
    num_invalid: int

    def __init__(self, capacity: int, obs_shape, action_shape, sampler: Sampler | None = None, seed: int = 0,
                 **kwargs):
        if returns.check_n_step(kwargs.get("n_step", 1), capacity) > 1:
            raise ValueError("n_step > 1 needs a host backend ('ram' or 'memmap'): n-step returns are summed on the "
                             "host")
        super().__init__(capacity, obs_shape, action_shape, sampler, seed, **kwargs)

    def _own_sampler(self, sampler: Sampler) -> Sampler:
        from relive.replay.samplers.device import to_device_sampler  # (torch: imported only for a device buffer)

        return to_device_sampler(sampler)

    def _init_backend_state(self) -> None:
        """The draw generator on the device, and the update counters kept there (read by stats)."""
        import torch  # (torch: `import relive.replay` does not load it)

        dev = self.storage.device
        self.torch_rng = torch.Generator(device=dev).manual_seed(self.seed)
        self._counts_t = torch.zeros(3, dtype=torch.int64, device=dev)  # updated, stale, invalid since last read
        # the index tensors of the latest device draws: stored slots (the stored rows never shrink), so an update
        # naming one of them needs no host check; any other indices are checked as on the host (check_slots)
        self._drawn_t: list = []
        self.num_invalid = 0  # device updates: rows skipped for a non-finite or negative signal

    def _draw_batch(self, batch_size: int) -> Batch:
        """A batch drawn and gathered on the device: every column and ``info`` field a tensor there."""
        import torch  # (torch: `import relive.replay` does not load it)

        draw = self.sampler.sample_device(batch_size, self.torch_rng)
        st = self.storage
        idx = draw.indices
        self._drawn_t = [idx, *self._drawn_t[:DRAWS_KNOWN - 1]]
        cols = st.columns

        def obs(prefix):  # "obs" / "next_obs", flat or one tensor per key
            if st.obs_keys is None:
                return cols[prefix].tensor.index_select(0, idx)
            return {k: cols[f"{prefix}.{k}"].tensor.index_select(0, idx) for k in st.obs_keys}

        info = SampleInfo(indices=idx, generation=st.generation_tensor.index_select(0, idx),
                          probability=draw.probability, is_weight=draw.is_weight,
                          source=(idx >= st.num_offline).to(torch.int8), hints=self.sampler.hints())
        return Batch(obs("obs"), cols["action"].tensor.index_select(0, idx), cols["reward"].tensor.index_select(0, idx),
                     obs("next_obs"), cols["terminated"].tensor.index_select(0, idx),
                     cols["truncated"].tensor.index_select(0, idx), info=info,
                     extras={n: cols[n].tensor.index_select(0, idx) for n in st.extra_names})

    def sample_sequences(self, *args, **kwargs):
        raise ValueError("sample_sequences needs a host backend ('ram' or 'memmap'): slices are cut on the host")

    def update(self, info: SampleInfo, **signals) -> UpdateReport:
        """The device update: no value is read back to the host. A row overwritten since it was sampled
        (generation changed) and a row whose signal is not finite (or a negative ``priority``) keeps its priority;
        both are counted on the device and reach ``num_stale`` / ``num_invalid`` when ``stats`` reads them (a
        host check would stop the device once per batch). The report's counts are 0-d tensors."""
        import torch  # (torch: `import relive.replay` does not load it)

        if not signals:
            raise ValueError("update needs at least one signal, e.g. update(info, td_error=td)")
        dev = self.storage.device
        if not any(info.indices is t for t in self._drawn_t):  # not this buffer's draw: the host rule (one sync)
            self.storage.check_slots(info.indices)  # integers naming stored slots, else refused by index
        idx = torch.as_tensor(info.indices, device=dev).reshape(-1)
        gen = torch.as_tensor(info.generation, device=dev).reshape(-1)
        if gen.numel() != idx.numel():
            raise ValueError(f"info has {idx.numel()} indices but {gen.numel()} generations")
        arrays = {}
        valid = torch.ones(idx.numel(), dtype=torch.bool, device=dev)
        for name, value in signals.items():
            t = torch.as_tensor(value, device=dev)
            if t.numel() != idx.numel() or (t.dim() > 1 and max(t.shape) != t.numel()):
                raise ValueError(f"signal {name!r}: expected shape ({idx.numel()},), got {tuple(t.shape)}")
            if t.dtype == torch.bool or t.is_complex():  # (every real dtype is accepted, as on the host)
                raise ValueError(f"signal {name!r}: expected numbers, got dtype {t.dtype}")
            t = t.reshape(-1)
            if t.is_floating_point():
                valid &= torch.isfinite(t)
            if name == "priority":
                valid &= t >= 0
            arrays[name] = t
        fresh = self.storage.generation_tensor.index_select(0, idx) == gen
        keep = fresh & valid
        self.sampler.update_device(idx, arrays, keep)
        stale = ~fresh
        counts = torch.stack([keep.sum(), stale.sum(), (fresh & ~valid).sum()])
        self._counts_t += counts
        return UpdateReport(num_updated=counts[0], num_stale=counts[1], stale=stale)

    def _read_device_counts(self) -> None:
        """Fold the device's update counters into the host ones (a sync: stats / checkpoints only)."""
        updated, stale, invalid = (int(x) for x in self._counts_t.tolist())
        self._counts_t.zero_()
        self.num_updated += updated
        self.num_stale += stale
        self.num_invalid += invalid
        if invalid:
            warnings.warn(f"{invalid} replay update rows had a non-finite signal (or a negative priority) and kept "
                          f"their priority ({self.num_invalid} so far): check the agent's TD errors", stacklevel=3)

    def stats(self) -> dict[str, float]:
        return super().stats() | {"replay/num_invalid_signals": float(self.num_invalid)}

    def _backend_state(self) -> dict:
        return {"torch_rng": self.torch_rng.get_state().cpu().numpy(), "torch_rng_device": self._device_type(),
                "num_invalid": self.num_invalid}

    def _device_type(self) -> str:
        device = self.storage.device
        return "cpu" if device is None else device.type

    def _load_backend_state(self, saved: Mapping) -> None:
        self.num_invalid = state_int(saved, "num_invalid", "device buffer state") if "num_invalid" in saved else 0
        if saved.get("torch_rng_device") == self._device_type():  # (a generator's state is per device type)
            import torch  # (torch: `import relive.replay` does not load it)

            self.torch_rng.set_state(torch.as_tensor(np.asarray(saved["torch_rng"], np.uint8)))
        else:  # saved on the host or another device type: a fresh stream, derived from the seed and the clock
            self.torch_rng.manual_seed(self.seed * 1_000_003 + self.num_updated)


BACKEND_CLASSES["torch"] = DeviceReplayBuffer
