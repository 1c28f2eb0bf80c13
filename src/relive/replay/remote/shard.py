"""One shard of a replay service: a :class:`~relive.replay.ReplayBuffer` behind a Ray actor (or in process).

What a shard answers (every call a whole batch; the client in :mod:`relive.replay.remote.client` fans out):

- ``extend(writer, seq, rows, stream)``: rows of one stream, numbered per (writer, shard) from 1. A shard takes
  ``seq == last + 1`` only: an older seq is a duplicate (acknowledged, not stored again), a newer one means a
  gap (the shard restarted from a checkpoint older than what the writer sent): the reply asks the writer to resend
  from ``last + 1``. Every reply carries ``committed``: the writer's last seq held in the shard's last checkpoint,
  so the writer drops what it kept for resending up to there.
- ``masses()``: per sampler part (one part, or a mixture's offline and online parts), the part's total mass (its row
  count for uniform, the sum of p^alpha for PER) and its row count;
- ``draw(counts)``: ``counts[k]`` rows from part ``k`` with the part's own sampler, gathered into columns, with the
  local per-draw probability (mass_i / part mass of this shard);
- ``update(slots, generation, signals)``: the shard's ``ReplayBuffer.update`` (stale rows skipped and counted);
- ``checkpoint()``: the buffer and the writers' seqs in one crash-safe relive checkpoint (``kind="replay_shard"``,
  :mod:`relive.replay.checkpoint`) in ``<directory>/shard-<i>``; a shard started where such a checkpoint exists
  (Ray's restart of a killed actor runs ``__init__`` again) loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from relive.replay import checkpoint
from relive.replay.buffer import ReplayBuffer
from relive.replay.samplers import MixtureSampler, PrioritizedSampler, Sampler, UniformSampler, sampler_from_config
from relive.replay.samplers.reaper import ReaPERSampler
from relive.types import new_sample_info

KIND = "replay_shard"
EXACT = "uniform, PER, ReaPER, or a mixture (symmetric) of such parts"
DRAWABLE = (UniformSampler, PrioritizedSampler, ReaPERSampler)  # a per-shard mass and a draw in proportion to it


def sampler_parts(sampler: Sampler) -> list[Sampler]:
    """The parts a global draw splits over: a mixture's offline and online parts, else the sampler itself. Refuses
    samplers whose distribution the service cannot draw exactly across shards."""
    if type(sampler) is MixtureSampler:
        if sampler.demonstrations is not None:
            raise ValueError("a remote replay does not take a mixture with a demonstrations part (HIL's demo "
                             "segment); use one process's ReplayBuffer")
        if sampler.schedule == "intervention_rate":
            raise ValueError("a remote replay does not take the 'intervention_rate' schedule")
        parts = [sampler.offline, sampler.online]
    else:
        parts = [sampler]
    for part in parts:
        if type(part) not in DRAWABLE:
            raise ValueError(f"a remote replay draws exactly from {EXACT}; {type(part).__name__} keeps whole-buffer "
                             f"state a global draw cannot split (use one process's ReplayBuffer for it)")
    return parts


def part_mass(part: Sampler) -> float:
    """What the part draws in proportion to, summed over this shard's rows: uniform, the rows; PER, sum p^alpha;
    ReaPER, sum Psi (Eq. 15) = the finished episodes' S_e^-omega U_e plus F^-omega U_e of the ongoing ones, with this
    shard's F (Eq. 17: the largest S_e among *its* episodes -- see the module docstring)."""
    if type(part) is PrioritizedSampler:
        total = float(part.sum_tree.total)
        return total if total > 0 else float(part.num_rows())  # (all priorities 0: it draws uniformly)
    if type(part) is ReaPERSampler:
        return part.total_mass()
    return float(part.num_rows())


def shard_path(directory: str | os.PathLike, index: int) -> Path:
    return Path(directory) / f"shard-{index:03d}"


class ReplayShard:
    def __init__(self, index: int, buffer_kwargs: dict, sampler_cfg: dict, seed: int,
                 directory: str | None = None, checkpoint_every_rows: int = 0):
        self.index = int(index)
        self.path = None if directory is None else shard_path(directory, self.index)
        self.checkpoint_every_rows = int(checkpoint_every_rows)
        # (a shard killed while saving leaves <path>.previous, which load_tree falls back to)
        self.restored = self.path is not None and ((self.path / "MANIFEST.json").is_file()
                                                   or self.path.with_name(self.path.name + ".previous").is_dir())
        if self.path is not None and self.path.is_symlink():
            raise ValueError(f"shard directory {self.path} is a symbolic link; refusing to write through it")
        if self.restored:
            assert self.path is not None
            tree = checkpoint.load_tree(self.path, kind=KIND)
            with checkpoint.loading(self.path, "replay shard"):
                self.buffer = ReplayBuffer.from_state_dict(tree["buffer"])
                ids, seqs = (np.asarray(tree["writers"][k], np.int64).reshape(-1) for k in ("ids", "seqs"))
                if ids.shape != seqs.shape:
                    raise ValueError("field 'writers': ids and seqs differ in length")
            self.last_seq = dict(zip(ids.tolist(), seqs.tolist(), strict=True))
        else:
            self.buffer = ReplayBuffer(**buffer_kwargs, sampler=sampler_from_config(sampler_cfg), seed=int(seed))
            self.last_seq = {}
        self.parts = sampler_parts(self.buffer.sampler)
        self.committed = dict(self.last_seq)  # the writers' seqs in the last checkpoint
        self.rows_since_checkpoint = 0
        self.num_duplicates = 0
        self.num_gaps = 0

    # -- writes ---------------------------------------------------------------------------------------------
    def extend(self, writer: int, seq: int, rows: dict, stream: int) -> dict:
        last = self.last_seq.get(writer, 0)
        if seq <= last:
            self.num_duplicates += 1
            return self._reply("duplicate", writer)
        if seq != last + 1:
            self.num_gaps += 1
            return self._reply("resend", writer)
        n = len(self.buffer.extend(rows, stream=int(stream)))
        self.last_seq[writer] = seq
        self.rows_since_checkpoint += n
        if self.path is not None and self.checkpoint_every_rows and \
                self.rows_since_checkpoint >= self.checkpoint_every_rows:
            self.checkpoint()
        return self._reply("ok", writer)

    def _reply(self, status: str, writer: int) -> dict:
        committed = self.committed.get(writer, 0) if self.path is not None else self.last_seq.get(writer, 0)
        return {"status": status, "expected": self.last_seq.get(writer, 0) + 1, "committed": committed,
                "shard": self.index}

    def committed_seq(self, writer: int) -> dict:
        return self._reply("status", writer)

    def add_offline(self, rows: dict, dataset_id: str | None = None) -> int:
        return len(self.buffer.add_offline(rows, dataset_id))

    def close_stream(self, stream: int, terminated: bool = False) -> int:
        return len(self.buffer.close_stream(int(stream), terminated))

    # -- draws ----------------------------------------------------------------------------------------------
    def _take_max_delta(self, union_max_delta: list | None) -> None:
        for part, m in zip(self.parts, union_max_delta or [None] * len(self.parts), strict=True):
            if m is not None and type(part) is ReaPERSampler:
                part.max_delta = max(part.max_delta, float(m))

    def masses(self, union_max_delta: list | None = None) -> dict:
        """Per part: its mass and rows; a ReaPER part also gives (finished mass, ongoing mass unscaled, F, its running
        max of d) so that the client can scale every shard's ongoing episodes by the union's F (Eq. 17: the largest
        S_e over all the stored episodes). ``union_max_delta[k]``: the largest d any shard of the service has seen
        (as the client last heard), which a ReaPER part takes as the d of its next new rows if larger than its own."""
        self._take_max_delta(union_max_delta)
        reaper = [(p.finished_mass(), p.ongoing_mass(), p.F, p.max_delta) if type(p) is ReaPERSampler else None
                  for p in self.parts]
        return {"mass": [part_mass(p) for p in self.parts], "rows": [p.num_rows() for p in self.parts],
                "online_written": int(self.buffer.storage.num_online_written), "reaper": reaper}

    def draw(self, counts: list[int], whole: bool = False, union_f: list | None = None,
             union_max_delta: list | None = None) -> dict:
        """``counts[k]`` rows from part ``k``; the columns of each part's rows one after the other. ``whole``: this
        shard is the whole buffer (a batch larger than its rows is refused, as locally). ``union_f[k]``: a ReaPER
        part's F over the union of the shards, used for this draw in place of the shard's own;
        ``union_max_delta``: as in :meth:`masses`."""
        self._take_max_delta(union_max_delta)
        buf = self.buffer
        if whole and sum(counts) > len(buf):
            raise ValueError(f"batch of {sum(counts)} rows requested but only {len(buf)} rows are stored")
        idx, prob = [], []
        for j, (part, k) in enumerate(zip(self.parts, counts, strict=True)):
            if k:
                f = None if union_f is None else union_f[j]
                if f is not None:
                    part.F_override = float(f)  # type: ignore[attr-defined]
                try:
                    d = part.sample(int(k), buf.rng)
                finally:
                    if f is not None:
                        part.F_override = None  # type: ignore[attr-defined]
                idx.append(d.indices)
                prob.append(d.probability)
        indices = np.concatenate(idx) if idx else np.zeros(0, np.int64)
        batch = buf.gather(indices)
        return {"indices": indices, "generation": batch.info.generation, "source": batch.info.source,
                "probability": np.concatenate(prob),
                "obs": batch.obs, "action": batch.action, "reward": batch.reward, "next_obs": batch.next_obs,
                "terminated": batch.terminated, "truncated": batch.truncated, "extras": batch.extras,
                "discount": batch.discount}

    # -- feedback -------------------------------------------------------------------------------------------
    def update(self, slots: np.ndarray, generation: np.ndarray, signals: dict) -> tuple[int, int]:
        """The buffer's update; rows this shard does not hold (yet) are stale too: a batch drawn before the shard
        restarted from its checkpoint names rows written after it, which the writer has not resent yet."""
        st = self.buffer.storage
        held = (slots >= 0) & (slots < st.size)
        if st.has_gap:
            held &= (slots < st.num_offline) | (slots >= st.ring_base)
        missing = int(slots.size - held.sum())
        if missing:
            slots, generation = slots[held], generation[held]
            signals = {k: np.asarray(v)[held] for k, v in signals.items()}
            self.buffer.num_stale += missing
            if not slots.size:
                return 0, missing
        n = slots.size
        info = new_sample_info(slots, generation, np.full(n, np.nan), np.ones(n, np.float32),
                               np.zeros(n, np.int8), {})
        report = self.buffer.update(info, **signals)
        return int(report.num_updated), int(report.num_stale) + missing

    # -- checkpoints and bookkeeping ---------------------------------------------------------------------------
    def checkpoint(self) -> dict:
        if self.path is None:
            raise ValueError("this replay service was built without a directory: nothing to checkpoint into")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ids = np.array(sorted(self.last_seq), np.int64)
        seqs = np.array([self.last_seq[i] for i in ids.tolist()], np.int64)
        checkpoint.save_tree(self.path, {"buffer": self.buffer.state_dict(offline="copy"),
                                         "writers": {"ids": ids, "seqs": seqs}}, kind=KIND)
        self.committed = dict(self.last_seq)
        self.rows_since_checkpoint = 0
        return {"shard": self.index, "rows": len(self.buffer)}

    def info(self) -> dict:
        return {"shard": self.index, "pid": os.getpid(), "rows": len(self.buffer), "restored": self.restored,
                "num_online": self.buffer.num_online, "num_offline": self.buffer.num_offline,
                "num_duplicates": self.num_duplicates, "num_gaps": self.num_gaps,
                "num_stale": self.buffer.num_stale, "num_updated": self.buffer.num_updated}

    def rows(self) -> dict:
        """Every stored row's columns in slot order (tests and diagnostics)."""
        st = self.buffer.storage
        slots = np.arange(st.size, dtype=np.int64)
        if st.has_gap:
            slots = slots[(slots < st.num_offline) | (slots >= st.ring_base)]
        batch = self.buffer.gather(slots)
        return {"slots": slots, "obs": batch.obs, "action": batch.action, "reward": st.columns["reward"].take(slots),
                "stream": st.stream_of(slots), "generation": batch.info.generation}

    def probabilities(self) -> list[np.ndarray]:
        """Each part's local per-slot distribution (tests)."""
        return [p.probabilities() for p in self.parts]
