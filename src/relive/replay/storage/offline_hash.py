"""The offline segment's fingerprint: a checkpoint that refers to its offline rows instead of copying them
(``offline="reference"``) names their SHA-256, checked when they are written again before a load."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import numpy as np

from relive.replay.storage.bookkeeping import LEGACY_DTYPES
from relive.replay.storage.layout import StorageFields


class OfflineHashing(StorageFields):
    """Hashes of a :class:`~relive.replay.storage.Storage`'s offline rows and their bookkeeping (mixed in)."""

    def offline_sha256(self) -> str:
        """SHA-256 of the offline segment: the offline rows of every column but the extra ones (which
        ``set_column`` may change later, so checkpoints always copy them), their explicit next_obs copies, the
        column names and shapes. Cached: these offline rows are frozen once written."""
        k = self.num_before_online  # the rows written before the first online one (all of them, before it)
        if self._offline_hash is not None and self._offline_hash[0] == k:
            return self._offline_hash[1]
        h = hashlib.sha256()
        for name in sorted(n for n in self.columns if n not in self.extra_names):
            arr = self.columns[name]
            h.update(json.dumps([name, list(arr.shape[1:]), arr.dtype.str, k]).encode())
            for lo in range(0, k, 65536):
                h.update(np.ascontiguousarray(arr[lo : min(k, lo + 65536)]).data.cast("B"))
        if self.dedup_next_obs:
            slots = self._nx.slots_below(k)
            h.update(slots.astype(np.int64).tobytes())
            for name in sorted(self._nx.values):
                h.update(np.ascontiguousarray(self._nx.values[name][self._nx.entries_of(slots)]).tobytes())
        digest = h.hexdigest()
        self._offline_hash = (k, digest)
        return digest

    def _meta_sha256(self, k: int) -> str:
        h = hashlib.sha256()
        # the bookkeeping of the first k rows as laid out before 2026-11-27 (every field stored, int64 ids, steps
        # and stamps), so a checkpoint's hash from then still checks; origin was added later (a referenced prefix
        # holds dataset rows only, written again as such)
        slots = np.arange(k, dtype=np.int64)
        values = {"episode_id": self.episode_ids(slots), "generation": self._meta["generation"][:k],
                  "source": self.source_of(slots), "step_in_episode": self.step_of(slots),
                  "stream": self.stream_of(slots)}
        for name in sorted(values):
            h.update(name.encode())
            h.update(np.ascontiguousarray(values[name], dtype=LEGACY_DTYPES[name]).tobytes())
        return h.hexdigest()

    def check_offline_reference(self, ref: Mapping) -> None:
        """The offline rows written into this storage are the ones a checkpoint refers to (same count, same hash)."""
        dataset = ref["dataset_id"]
        if self.num_offline != int(ref["num_offline"]):  # (the caller wrote the referenced rows again, nothing else)
            raise ValueError(f"offline dataset {dataset!r} changed since the checkpoint was saved: it has "
                             f"{self.num_offline} rows, the checkpoint's had {int(ref['num_offline'])}")
        digest = self.offline_sha256()
        if digest != ref["sha256"]:
            raise ValueError(f"offline dataset {dataset!r} changed since the checkpoint was saved: its rows hash to "
                             f"sha256 {digest[:16]}..., the checkpoint's to {str(ref['sha256'])[:16]}...; load the "
                             "same rows (same dataset version, same gamma for mc_return) or a checkpoint that "
                             "copies them")
