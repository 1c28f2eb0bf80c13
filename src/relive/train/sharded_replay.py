"""The run's replay as a sharded service on Ray (``replay.shards = M``, ``--replay-shards M``; issue 49): the
learner's end of :class:`relive.replay.remote.RemoteReplay`, with what the training loop asks of a
:class:`~relive.replay.ReplayBuffer` (``extend`` per stream, ``add_offline``, ``sample``, ``update``,
``close_stream``, ``len``, ``stats``, ``state_dict``).

- **Layout.** ``replay.capacity`` rows in all: each shard holds its part of the dataset's offline rows (split at
  episode ends) plus ``ceil((capacity - offline rows) / M)`` online rows. Stream ``s`` (collector ``c``'s env ``j``
  is ``c x num_envs + j``) lives on shard ``s % M``, so every episode stays whole on one shard.
- **Prefetch** (``replay.shard_prefetch = k``): a thread draws k batches ahead, hiding the two round trips of a
  draw behind the learner's update; a batch is then drawn from the shards as they were up to k updates earlier (its
  rows' priorities before those updates), and a resumed run does not redraw the batches that were queued.
- **Who writes.** The collectors' chunks reach the learner as without shards (the rate limiter, the chunk log and
  the episode bookkeeping stay the learner's) and the learner's writer sends each stream's rows to its shard,
  asynchronously (at most ``max_in_flight`` unacknowledged calls).
- **Checkpoints.** A run checkpoint first checkpoints every shard into ``<run_dir>/replay/shard-<i>`` (the shards
  checkpoint only then), then saves the run's checkpoint with this client's sampling RNG and counters. A shard actor
  that dies is restarted by Ray from its checkpoint and the writer resends every call since then (it keeps them until
  a checkpoint holds them), so a killed shard loses no row; the learner's next sample waits for it (up to
  ``replay.shard_timeout_s``). A resumed run rebuilds the shards from their checkpoints, which match the run's
  checkpoint (one documented gap: a learner that dies between the shards' save and the run's save resumes with shards
  that hold the rows of up to one checkpoint interval more).
- **What it refuses.** A sampler the shards cannot draw exactly (:func:`relive.replay.remote.shard.sampler_parts`),
  loop hooks that read or write the buffer in this process (returns-to-go, ARB's re-scoring, observation
  normalisation: one process's buffer serves them). ``run.save_final_buffer`` checkpoints the shards at the end
  (their checkpoints are the final buffer, one directory per shard).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np

from relive import hooks as H
from relive.replay.remote import RemoteReplay
from relive.replay.remote.client import offline_cuts
from relive.replay.remote.shard import sampler_parts
from relive.types import Batch, SampleInfo

DIRECTORY = "replay"  # under the run directory
KIND = "replay_service"  # the run checkpoint's "buffer" entry
BUFFER_HOOKS = (H.OnEpisodeEnd, H.EveryGradSteps, H.AfterUpdate)  # hooks that read or write this process's buffer


def check_hooks(ctx: H.LoopContext, *components) -> None:
    """Refuse components (the agent, the sampler) whose loop hooks need the rows in this process, naming them."""
    for c in components:
        kinds = sorted({type(h).__name__ for h in H.collect_hooks(ctx, c) if isinstance(h, BUFFER_HOOKS)})
        if kinds:
            raise ValueError(f"replay.shards: {type(c).__name__} reads or writes replay rows in the learner's process "
                             f"({', '.join(kinds)} hooks), which a sharded replay does not hold; run it with one "
                             f"process's buffer (replay.shards = 0)")


class ShardedReplay:
    """The run's sharded replay. Built before Ray is up (the dataset's offline rows are held until :meth:`start`),
    started once the run directory exists."""

    def __init__(self, num_shards: int, capacity: int, obs_shape, action_shape, sampler, *, seed: int,
                 timeout: float | None, ray: bool = True, prefetch: int = 0, **buffer_kwargs):
        sampler_parts(sampler)  # (refuses a sampler the shards cannot draw exactly, before anything runs)
        self.num_shards, self.capacity, self.sampler = int(num_shards), int(capacity), sampler
        self.obs_shape, self.action_shape, self.buffer_kwargs = obs_shape, action_shape, buffer_kwargs
        self.seed, self.timeout, self.ray, self.prefetch = int(seed), timeout, bool(ray), int(prefetch)
        self.offline: list[tuple[dict, str | None]] = []
        self.num_offline = 0
        self.num_online_sent = 0  # online rows handed to the writer (the stored rows once they are acknowledged)
        self.replay: RemoteReplay | None = None
        self.directory: Path | None = None

    # -- building ----------------------------------------------------------------------------------------------
    def add_offline(self, rows: dict, dataset_id: str | None = None) -> np.ndarray:
        """The dataset's rows, held until :meth:`start` splits them over the shards."""
        if self.replay is not None:
            raise ValueError("a sharded replay takes its offline rows before it starts")
        self.offline.append((rows, dataset_id))
        n = len(rows["reward"])
        self.num_offline += n
        return np.full(n, -1, np.int64)

    def per_shard_capacity(self) -> int:
        parts = [0] * self.num_shards
        for rows, _ in self.offline:
            cuts = offline_cuts(rows, self.num_shards)
            parts = [p + b - a for p, a, b in zip(parts, cuts[:-1], cuts[1:], strict=True)]
        room = self.capacity - self.num_offline
        if room < self.num_shards:
            raise ValueError(f"replay.capacity = {self.capacity} leaves {room} rows for online data over "
                             f"{self.num_shards} shards after the dataset's {self.num_offline}: raise --capacity")
        return max(parts) + math.ceil(room / self.num_shards)

    def start(self, directory: Path, resume: bool) -> None:
        """Start the shard actors (on the Ray this process is connected to): restored from ``directory``'s shard
        checkpoints on ``resume``, else new ones (any shard checkpoints there, left by a run that stopped before its
        first checkpoint, are removed first: the directory is this run's) with the offline rows."""
        self.directory = Path(directory)
        if self.directory.is_symlink():
            raise ValueError(f"{self.directory} is a symbolic link; refusing to write through it")
        if not resume and self.directory.is_dir():
            for old in sorted(self.directory.glob("shard-*")):
                if old.is_dir() and not old.is_symlink() and ((old / "MANIFEST.json").is_file()
                                                              or old.name.endswith(".previous")):
                    shutil.rmtree(old)
        if resume and not any(self.directory.glob("shard-*")):
            raise ValueError(f"cannot resume: {self.directory} holds no shard checkpoints (the run's checkpoint "
                             f"refers to them)")
        self.replay = RemoteReplay(self.per_shard_capacity(), self.obs_shape, self.action_shape, self.sampler,
                                   num_shards=self.num_shards, seed=self.seed, directory=self.directory,
                                   checkpoint_every_rows=0, ray=self.ray, timeout=self.timeout, **self.buffer_kwargs)
        if resume:
            infos = self.replay.shard_info()
            if not all(i["restored"] for i in infos):
                raise ValueError(f"cannot resume: not every shard under {self.directory} has a checkpoint")
        else:
            for rows, dataset_id in self.offline:
                self.replay.add_offline(rows, dataset_id)
        self.offline = []  # (the shards hold them now)

    def _live(self) -> RemoteReplay:
        if self.replay is None:
            raise RuntimeError("the sharded replay has not started (ShardedReplay.start)")
        return self.replay

    # -- the loop's side -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Rows stored or on their way (a lower bound once acknowledged; the ring never shrinks)."""
        return min(self.num_offline + self.num_online_sent, self.capacity)

    def extend(self, rows: dict, stream: int = 0, origin=None) -> np.ndarray:
        if origin is not None:
            raise ValueError("a sharded replay has no demonstration segment (interventions run with one process's "
                             "buffer)")
        n = len(rows["reward"])
        self._live().extend(rows, stream=int(stream))
        self.num_online_sent += n
        return np.full(n, -1, np.int64)  # (slots live on the shards; no hook here reads them)

    def close_stream(self, stream: int, terminated: bool = False) -> np.ndarray:
        self._live().close_stream(int(stream), terminated)
        return np.zeros(0, np.int64)

    def sample(self, batch_size: int) -> Batch:
        replay = self._live()
        if self.prefetch and not replay.prefetching:  # (from the first batch on: the thread draws ahead)
            replay.prefetch(self.prefetch, batch_size)
        for attempt in range(self.prefetch + 2):  # (a prefetched batch may be an error drawn before the flush)
            try:
                return replay.sample(batch_size)
            except ValueError as e:  # rows sent but not yet acknowledged: wait for them
                if "rows are stored" not in str(e) or attempt == self.prefetch + 1:
                    raise
                replay.flush()
        raise AssertionError("unreachable")

    def sample_sequences(self, *args, **kwargs):
        raise ValueError("a sharded replay samples transitions, not sequences (replay.shards = 0 for this agent)")

    def update(self, info: SampleInfo, **signals) -> None:
        """To the shards, without waiting (the replies are read at the next update: an error surfaces one step
        later); nothing at all when no part of the sampler takes any of the signals (uniform parts take none)."""
        replay = self._live()
        if not any(name in part.signals for part in replay.parts for name in signals):
            return
        replay.update(info, block=False, **signals)

    def stats(self) -> dict[str, float]:
        return self._live().stats()

    def state_dict(self) -> dict:
        """Checkpoint every shard, then this client's part of the run's checkpoint (the sampling RNG, the counters)."""
        replay = self._live()
        self.checkpoint()
        return {"kind": KIND, "num_shards": self.num_shards, "num_offline": self.num_offline,
                "num_online_sent": self.num_online_sent, "num_samples": replay.num_samples,
                "rng": replay.rng.bit_generator.state}

    def checkpoint(self) -> None:
        """Every shard saves into ``<directory>/shard-<i>`` (the writer's calls acknowledged so far included)."""
        self._live().checkpoint()

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != KIND or int(state["num_shards"]) != self.num_shards:
            raise ValueError(f"the checkpoint's replay is not a service of {self.num_shards} shards")
        replay = self._live()
        self.num_offline, self.num_online_sent = int(state["num_offline"]), int(state["num_online_sent"])
        replay.num_samples = int(state["num_samples"])
        replay.rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        if self.replay is not None:
            self.replay.close()
            self.replay = None
