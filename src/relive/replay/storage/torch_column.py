"""A storage column as a tensor on a torch device (``Storage(backend="torch")``): the storage imports this module
only for that backend (it imports torch), and ``relive.replay.samplers.device`` builds its samplers on it."""

from __future__ import annotations

import numpy as np
import torch


def torch_dtype(dtype: np.dtype):
    return torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype


class TorchColumn:
    """One column of a ``backend="torch"`` storage: a tensor on ``device`` (``.tensor``) behind the few NumPy-style
    operations the host-side storage code uses (slice / index writes from arrays, ``take`` and slice reads that
    return NumPy copies). Host reads are for cold paths (checkpoints, hashes); batches gather ``.tensor``."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.tensor = torch.zeros(self.shape, dtype=torch_dtype(self.dtype), device=device)

    def __len__(self) -> int:
        return self.shape[0]

    def _key(self, key):
        if isinstance(key, np.ndarray | list):
            return torch.as_tensor(np.asarray(key, np.int64), device=self.tensor.device)
        if isinstance(key, np.integer):
            return int(key)
        return key

    def __getitem__(self, key) -> np.ndarray:
        out = self.tensor[self._key(key)]
        return out.numpy().copy() if out.device.type == "cpu" else out.cpu().numpy()  # (a CPU view: copied)

    def __setitem__(self, key, value) -> None:
        value = np.asarray(value, dtype=self.dtype)
        self.tensor[self._key(key)] = torch.as_tensor(value, device=self.tensor.device)

    def take(self, indices, axis: int = 0) -> np.ndarray:
        if axis != 0:
            raise ValueError("TorchColumn.take reads rows (axis=0)")
        return self[np.asarray(indices, np.int64)]
