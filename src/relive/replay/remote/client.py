"""The client of a sharded replay service: :class:`RemoteReplay` (learner side) and :class:`Writer` (actor side).

Rows of stream ``s`` go to shard ``s % M`` (a stream's episodes stay whole on one shard: n-step returns and every
per-episode value are the local buffer's). A row's global id is ``shard << 40 | slot`` with the slot's generation
stamp beside it in ``batch.info.generation``: ``update`` goes to the shard that holds the row, and a stamp that no
longer matches is skipped and counted, as locally.

**Exact sampling.** ``sample(B)`` asks every shard for its parts' masses (uniform: rows; PER: sum of p^alpha; a
mixture: offline and online separately), computes the batch's part counts as the local mixture does over the union
(``round(B f)`` offline, the rest online; the schedule's t is the sum of the shards' online rows written), splits each
part's count over the shards with one multinomial draw in proportion to their masses, and each shard draws its share
with its own sampler. So a row is drawn with probability (mass_s / mass) x (m_i / mass_s) = m_i / mass: one buffer
over the union. ``probability`` is that global value (times the part's share k / B in a mixture) and PER's
``is_weight`` is (min_j P_j / P_i)^beta over the batch's part with the client's beta schedule, as the local sampler
computes it. The offline rows of a mixture are **sharded** (``add_offline`` splits them at episode ends, M parts),
drawn as any part. The masses are read in one round trip and the draws made in a second; a write landing between the
two changes a shard's rows before its draw (exact for the state the masses describe when writes pause, e.g. in the
tests; otherwise off by those rows, which is the staleness any asynchronous replay has).

**ReaPER** (a part of its own or inside a mixture): a stream's episodes are on one shard, so C_t and S_e are the
shard's; F, the largest S_e, is taken over the union (each shard reports its finished mass, its ongoing mass without
F^-omega, and F; the client recomputes the masses with the largest F and the shards draw with it), and the running
max of d that new rows take reaches every shard with the client's next calls (one sample of lag).
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Mapping

import numpy as np

from relive.replay.remote.limiter import SampleToInsertRatio
from relive.replay.remote.shard import ReplayShard, sampler_parts
from relive.replay.samplers import MixtureSampler, PrioritizedSampler, Sampler, UniformSampler, sampler_config
from relive.replay.samplers.mixture import scheduled_fraction
from relive.replay.samplers.per import linear_anneal
from relive.replay.samplers.reaper import ReaPERSampler
from relive.replay.storage.layout import concat_rows
from relive.types import Batch, SampleInfo, UpdateReport, new_batch, new_sample_info, new_update_report

LOG = logging.getLogger("relive.replay.remote")
SHARD_SHIFT = 40  # global row id = shard << 40 | slot
SLOT_MASK = (1 << SHARD_SHIFT) - 1
MAX_FAILURES = 5  # a writer's calls to one shard that may fail in a row (the shard restarting) before it gives up
RAY_MISSING = "a remote replay on Ray needs Ray, which is not installed: pip install 'relive[ray]'"


def import_ray():
    try:
        import ray  # (optional: relive[ray])
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    return ray


def global_ids(shard: int, slots: np.ndarray) -> np.ndarray:
    return (np.int64(shard) << SHARD_SHIFT) | np.asarray(slots, np.int64)


def split_ids(ids) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, np.int64)
    return ids >> SHARD_SHIFT, ids & SLOT_MASK


# -- transport: Ray actor handles, or objects in this process (tests, the overhead baseline) --------------------------
class _Done:
    """The result of a call already made (in-process shards)."""

    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error


class LocalHandle:
    """An in-process stand-in for an actor handle: ``call`` runs the method at once, under a lock (the prefetch
    thread and the caller may share a shard)."""

    def __init__(self, obj):
        self.obj, self.lock = obj, threading.Lock()

    def call(self, method: str, *args) -> _Done:
        with self.lock:
            try:
                return _Done(getattr(self.obj, method)(*args))
            except Exception as e:  # handed to the caller at get(), as Ray does
                return _Done(error=e)


def call(handle, method: str, *args):
    if isinstance(handle, LocalHandle):
        return handle.call(method, *args)
    return getattr(handle, method).remote(*args)


def get(futures: list, timeout: float | None = None) -> list:
    if not futures:
        return []
    if isinstance(futures[0], _Done):
        for f in futures:
            if f.error is not None:
                raise f.error
        return [f.value for f in futures]
    return import_ray().get(futures, timeout=timeout)


def _num_rows(rows: Mapping) -> int:
    return len(rows["reward"])


def _take(rows, sl):
    if isinstance(rows, Mapping):
        return {k: _take(v, sl) for k, v in rows.items()}
    return np.asarray(rows)[sl]


def offline_cuts(rows: Mapping, num_shards: int) -> list[int]:
    """Where to split offline rows into ``num_shards`` parts: the episode end nearest each equal cut (a part may be
    empty when the episodes are few)."""
    n = _num_rows(rows)
    ends = np.flatnonzero(np.asarray(rows["terminated"], bool) | np.asarray(rows["truncated"], bool)) + 1
    cuts = [0]
    for i in range(1, num_shards):
        target = round(n * i / num_shards)
        cut = int(ends[np.argmin(np.abs(ends - target))]) if ends.size else target
        cuts.append(max(cut, cuts[-1]))
    return [*cuts, n]


# -- writers ------------------------------------------------------------------------------------------------------
class Writer:
    """Writes rows into the service from any process (``RemoteReplay.writer()``; picklable with Ray's handles).

    ``extend(rows, stream)`` returns once the rows are sent (a Ray object ref per call); at most ``max_in_flight``
    calls wait for their acknowledgement, then ``extend`` blocks on the oldest (back-pressure). **Accepted** rows are
    those of a call the shard acknowledged. The writer keeps every sent call until the shard's checkpoint holds it
    (the ``committed`` seq of each reply), and resends from the shard's next expected seq when a restarted shard
    asks for it, so a shard killed and restored from its last checkpoint gets every accepted row back, in order, once.
    A killed writer loses its calls not yet acknowledged (and, if its shard dies too before the next checkpoint, the
    acknowledged ones after that checkpoint)."""

    def __init__(self, handles: list, limiter=None, max_in_flight: int = 8, timeout: float | None = None):
        self.handles, self.limiter = handles, limiter
        self.num_shards = len(handles)
        self.id = secrets.randbits(62) + 1
        self.max_in_flight, self.timeout = int(max_in_flight), timeout
        self.next_seq = [1] * self.num_shards
        self.pending: list[dict[int, tuple[Mapping, int]]] = [{} for _ in handles]  # shard: seq -> (rows, stream)
        self.in_flight: deque = deque()  # (shard, seq, future)
        self.resend_mark = [0] * self.num_shards
        self.failures = [0] * self.num_shards  # failed calls in a row, per shard
        self.num_acked = self.num_resent = self.num_retries = 0
        self.insert_wait_s = 0.0

    def shard_of(self, stream: int) -> int:
        return int(stream) % self.num_shards

    def extend(self, rows: Mapping, stream: int = 0) -> None:
        n = _num_rows(rows)
        if self.limiter is not None:
            self.insert_wait_s += _limiter_call(self.limiter, "acquire_insert", n, self.timeout)
        s = self.shard_of(stream)
        seq = self.next_seq[s]
        self.next_seq[s] += 1
        self.pending[s][seq] = (rows, int(stream))
        self._send(s, seq)
        while len(self.in_flight) > self.max_in_flight:
            self._settle_oldest()

    def _send(self, s: int, seq: int) -> None:
        rows, stream = self.pending[s][seq]
        self.in_flight.append((s, seq, call(self.handles[s], "extend", self.id, seq, rows, stream)))

    def flush(self) -> None:
        """Wait until every call sent so far is acknowledged."""
        while self.in_flight:
            self._settle_oldest()

    def sync(self) -> None:
        """Bring every shard up to this writer: a shard restarted from its checkpoint has lost this writer's calls
        after the checkpoint and asks for them only when the writer's next call reaches it. Ask each shard holding
        kept calls which seq it expects next, resend from there, and wait for the replies (what
        ``RemoteReplay.checkpoint`` does before the shards save)."""
        self.flush()
        shards = [s for s in range(self.num_shards) if self.pending[s]]
        for s, reply in zip(shards, get([call(self.handles[s], "committed_seq", self.id) for s in shards],
                                        self.timeout), strict=True):
            for q in sorted(q for q in self.pending[s] if q >= reply["expected"]):
                self.num_resent += 1
                self._send(s, q)
        self.flush()

    def forget_committed(self) -> None:
        """Ask the shards what their checkpoints hold and drop what this writer kept for resending up to there
        (each reply tells it too: this is for a writer that stopped writing)."""
        self.flush()
        shards = [s for s in range(self.num_shards) if self.pending[s]]
        for s, reply in zip(shards, get([call(self.handles[s], "committed_seq", self.id) for s in shards],
                                        self.timeout), strict=True):
            for old in [q for q in self.pending[s] if q <= reply["committed"]]:
                del self.pending[s][old]

    def _settle_oldest(self) -> None:
        s, seq, fut = self.in_flight.popleft()
        try:
            [reply] = get([fut], self.timeout)
        except Exception as e:
            if not _is_actor_error(e):
                raise
            self.failures[s] += 1  # the shard died and Ray gave up retrying this call: send it again
            if self.failures[s] > MAX_FAILURES:
                raise RuntimeError(f"shard {s} failed {self.failures[s]} calls in a row (is it gone for good, e.g. "
                                   f"built without a directory to restart from?): {e}") from None
            self.num_retries += 1
            LOG.warning("shard %d lost call %d (%s); resending", s, seq, type(e).__name__)
            time.sleep(0.2)
            if seq in self.pending[s]:
                self._send(s, seq)
            return
        self.failures[s] = 0
        for old in [q for q in self.pending[s] if q <= reply["committed"]]:
            del self.pending[s][old]
        if reply["status"] == "resend":
            start = reply["expected"]
            if start > self.resend_mark[s] or not any(x[0] == s for x in self.in_flight):
                self.resend_mark[s] = start
                for q in sorted(q for q in self.pending[s] if q >= start):
                    self.num_resent += 1
                    self._send(s, q)
        else:
            self.num_acked += 1

    def stats(self) -> dict[str, float]:
        return {"replay/writer_acked_calls": float(self.num_acked),
                "replay/writer_resent_calls": float(self.num_resent),
                "replay/writer_kept_calls": float(sum(len(p) for p in self.pending)),
                "replay/writer_insert_wait_s": self.insert_wait_s}


def _is_actor_error(e: BaseException) -> bool:
    try:
        import ray  # (optional: relive[ray])
    except ImportError:
        return False
    return isinstance(e, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError)


def _limiter_call(limiter, method: str, n: int, timeout: float | None) -> float:
    if isinstance(limiter, SampleToInsertRatio):
        return getattr(limiter, method)(n, timeout)
    return float(import_ray().get(getattr(limiter, method).remote(n, timeout)))


# -- the learner's client -----------------------------------------------------------------------------------------
class RemoteReplay:
    """A replay buffer served by ``num_shards`` shards (Ray actors, or in this process with ``ray=False``).

        replay = RemoteReplay(100_000, (17,), (6,), PrioritizedSampler(), num_shards=2, directory="runs/x/replay",
                              checkpoint_every_rows=10_000, limiter=SampleToInsertRatio(8.0, 1000, 400))
        writer = replay.writer()             # in any process (pass it to a Ray task / actor)
        writer.extend(rows, stream=3); writer.flush()
        batch = replay.sample(256)           # exact over the union of the shards; replay.prefetch(2): queued ahead
        replay.update(batch.info, td_error=td)

    ``capacity``: rows per shard. ``directory``: each shard checkpoints into ``directory/shard-<i>``
    (``checkpoint()`` all, and every ``checkpoint_every_rows`` rows a shard takes); a shard actor killed restarts
    (``max_restarts``; never without a directory: it would come back empty) from its last checkpoint and Ray retries
    the calls sent to it. Meanwhile a learner's ``sample`` **waits** for it (up to ``timeout`` seconds, then
    ``GetTimeoutError``): proceeding on the live shards would change every row's probability. A service built over
    an existing ``directory`` resumes from its shards' checkpoints.
    """

    def __init__(self, capacity: int, obs_shape, action_shape, sampler: Sampler | None = None, *,
                 num_shards: int = 2, seed: int = 0, directory: str | os.PathLike | None = None,
                 checkpoint_every_rows: int = 0, limiter=None, ray: bool = True, max_in_flight: int = 8,
                 max_restarts: int = -1, timeout: float | None = None, shard_options: dict | None = None,
                 **buffer_kwargs):
        if isinstance(num_shards, bool) or not isinstance(num_shards, int | np.integer) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, got {num_shards!r}")
        sampler = sampler if sampler is not None else UniformSampler()
        sampler_parts(sampler)  # (refuses a sampler the shards cannot draw exactly, before any actor starts)
        self.template = sampler
        self.num_shards, self.timeout = int(num_shards), timeout
        self.directory = None if directory is None else str(directory)
        kwargs = {"capacity": int(capacity), "obs_shape": obs_shape, "action_shape": action_shape, **buffer_kwargs}
        cfg = sampler_config(sampler)
        seeds = np.random.SeedSequence(int(seed)).spawn(self.num_shards + 1)
        args = [(i, kwargs, cfg, int(seeds[i].generate_state(1)[0]), self.directory, int(checkpoint_every_rows))
                for i in range(self.num_shards)]
        self.rng = np.random.default_rng(seeds[-1])
        self.uses_ray = bool(ray)
        if self.uses_ray:
            r = import_ray()
            if not r.is_initialized():
                raise ValueError("RemoteReplay(ray=True) needs a running Ray: call ray.init(...) first")
            # (without a directory a restarted shard would come back empty: no restart, its calls fail instead)
            restarts = int(max_restarts) if self.directory is not None else 0
            actor = r.remote(max_restarts=restarts, max_task_retries=-1 if restarts else 0,
                             **(shard_options or {"num_cpus": 0}))(ReplayShard)
            self.handles: list = [actor.remote(*a) for a in args]
            if isinstance(limiter, SampleToInsertRatio):  # one limiter for every writer and learner: an actor
                state = limiter.state_dict()
                lim = r.remote(num_cpus=0, max_concurrency=64)(SampleToInsertRatio).remote(
                    limiter.samples_per_insert, limiter.min_size_to_sample, (limiter.min_diff, limiter.max_diff))
                r.get(lim.load_state_dict.remote(state))
                limiter = lim
        else:
            self.handles = [LocalHandle(ReplayShard(*a)) for a in args]
        self.limiter = limiter
        self.max_in_flight = int(max_in_flight)
        self._writer: Writer | None = None
        self._updates: list = []  # the futures of the last update(block=False)
        self.num_samples = 0  # sample calls (PER's beta schedule)
        self.parts = sampler_parts(sampler)
        # ReaPER parts: the running max of d over the union, handed to the shards with the next masses and draw calls
        self.union_max_delta: list | None = [1.0 if type(p) is ReaPERSampler else None for p in self.parts] \
            if any(type(p) is ReaPERSampler for p in self.parts) else None
        self._queue: queue.Queue | None = None
        self._prefetcher: threading.Thread | None = None
        self._stop = threading.Event()
        self.sample_wait_s = 0.0
        get([call(h, "info") for h in self.handles], timeout)  # started (or restored), else the error now

    # -- writing -----------------------------------------------------------------------------------------------
    def writer(self, max_in_flight: int | None = None) -> Writer:
        """A new writer (its own id and seqs): one per process that writes."""
        return Writer(self.handles, self.limiter, self.max_in_flight if max_in_flight is None else max_in_flight,
                      self.timeout)

    def extend(self, rows: Mapping, stream: int = 0) -> None:
        """Through this client's own writer (asynchronous: ``flush()`` waits for the acknowledgements)."""
        if self._writer is None:
            self._writer = self.writer()
        self._writer.extend(rows, stream)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def add_offline(self, rows: Mapping, dataset_id: str | None = None) -> None:
        """Dataset rows, split over the shards at episode ends (the offline part is sharded, not replicated)."""
        cuts = offline_cuts(rows, self.num_shards)
        futs = [call(h, "add_offline", _take(rows, slice(a, b)), dataset_id)
                for h, a, b in zip(self.handles, cuts[:-1], cuts[1:], strict=True) if b > a]
        get(futs, self.timeout)

    def close_stream(self, stream: int, terminated: bool = False) -> None:
        self.flush()
        get([call(self.handles[int(stream) % self.num_shards], "close_stream", int(stream), terminated)],
            self.timeout)

    # -- sampling ----------------------------------------------------------------------------------------------
    def prefetch(self, depth: int, batch_size: int) -> None:
        """Keep ``depth`` batches of ``batch_size`` drawn ahead by a background thread; ``sample(batch_size)`` takes
        the oldest. A batch is drawn from the shards as they were when it was drawn (stale updates are skipped)."""
        if self._prefetcher is not None:
            raise ValueError("prefetch is already running")
        self._queue = queue.Queue(maxsize=max(1, int(depth)))
        self._prefetch_size = int(batch_size)

        def run():
            assert self._queue is not None
            while not self._stop.is_set():
                try:
                    item: object = self._draw(self._prefetch_size)
                except Exception as e:  # handed to the learner's next sample()
                    item = e
                    self._stop.wait(0.05)  # (e.g. too few rows yet: no busy loop)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue

        self._prefetcher = threading.Thread(target=run, name="relive-replay-prefetch", daemon=True)
        self._prefetcher.start()

    @property
    def prefetching(self) -> bool:
        """Whether a background thread draws batches ahead (:meth:`prefetch`)."""
        return self._prefetcher is not None

    def sample(self, batch_size: int) -> Batch:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if self._queue is not None and batch_size == self._prefetch_size:
            item = self._queue.get(timeout=self.timeout)
            if isinstance(item, Exception):
                raise item
            return item
        return self._draw(int(batch_size))

    def masses(self) -> list[dict]:
        masses = get([call(h, "masses", self.union_max_delta) for h in self.handles], self.timeout)
        if self.union_max_delta is not None:  # ReaPER: the new rows' d, the largest any shard has seen
            self.union_max_delta = [None if r is None else max(x for x in (m["reaper"][k][3] for m in masses))
                                    for k, r in enumerate(masses[0]["reaper"])]
        return masses

    def part_counts(self, batch_size: int, masses: list[dict]) -> list[int]:
        """Rows of a batch per part, as the local sampler computes them over the union."""
        if len(self.parts) == 1:
            return [batch_size]
        mix = self.template
        assert isinstance(mix, MixtureSampler)
        n_off, n_on = (sum(m["rows"][k] for m in masses) for k in (0, 1))
        if n_on == 0:
            f = 1.0
        elif n_off == 0:
            f = 0.0
        elif mix.schedule == "constant":
            f = mix.offline_fraction
        else:
            f = scheduled_fraction(mix.schedule, mix.offline_fraction, mix.offline_fraction_final,
                                   mix.schedule_steps, sum(m["online_written"] for m in masses))
        k_off = int(round(batch_size * f))
        return [k_off, batch_size - k_off]

    def _union_f(self, masses: list[dict], mass: np.ndarray) -> list | None:
        """ReaPER parts: F over the union (the largest of the shards' F, Eq. 17), and each shard's mass recomputed
        with it in ``mass`` (in place); None without a ReaPER part."""
        if not any(type(p) is ReaPERSampler for p in self.parts):
            return None
        out: list = [None] * len(self.parts)
        for k, part in enumerate(self.parts):
            if type(part) is ReaPERSampler:
                fin, ong, f = (np.array([m["reaper"][k][i] for m in masses], np.float64) for i in range(3))
                F = float(f.max())
                mass[:, k] = fin + ong * (F ** -part.reliability_exponent if F > 0 else 0.0)
                out[k] = F
        return out

    def _draw(self, batch_size: int) -> Batch:
        if self.limiter is not None:
            self.sample_wait_s += _limiter_call(self.limiter, "acquire_sample", batch_size, self.timeout)
        if self.num_shards == 1 and len(self.parts) == 1:  # nothing to split: one round trip (the shard checks B)
            mass, counts, part_k = np.ones((1, 1)), np.full((1, 1), batch_size, np.int64), [batch_size]
            union_f = None
        else:
            masses = self.masses()
            stored = sum(sum(m["rows"]) for m in masses)
            if batch_size > stored:
                raise ValueError(f"batch of {batch_size} rows requested but only {stored} rows are stored")
            mass = np.array([m["mass"] for m in masses], np.float64)  # [shards, parts]
            union_f = self._union_f(masses, mass)
            counts = np.zeros(mass.shape, np.int64)
            part_k = self.part_counts(batch_size, masses)
            for k, n in enumerate(part_k):
                if n:
                    counts[:, k] = self.rng.multinomial(n, mass[:, k] / mass[:, k].sum())
        asked = [s for s in range(self.num_shards) if counts[s].any()]
        whole = self.num_shards == 1
        replies = get([call(self.handles[s], "draw", counts[s].tolist(), whole, union_f, self.union_max_delta)
                       for s in asked], self.timeout)
        draws = dict(zip(asked, replies, strict=True))
        self.num_samples += 1
        # each part's rows from every shard, then the parts in order (a mixture: offline first, as locally): one
        # position per batch row into the shards' replies laid end to end, so every column is one concatenate + take
        base = dict(zip(asked, np.cumsum([0, *(int(counts[s].sum()) for s in asked)])[:-1].tolist(), strict=True))
        positions, probability, is_weight = [], [], []
        for k, n in enumerate(part_k):
            if not n:
                continue
            pos, prob = [], []
            for s in asked:
                c = int(counts[s, k])
                if c:
                    start = int(counts[s, :k].sum())
                    pos.append(base[s] + start + np.arange(c))
                    prob.append(draws[s]["probability"][start : start + c] * (mass[s, k] / mass[:, k].sum()))
            p = np.concatenate(prob)
            order = self.rng.permutation(p.size)  # positions exchangeable, as i.i.d. draws from one buffer
            positions.append(np.concatenate(pos)[order])
            p = p[order]
            part = self.parts[k]
            if isinstance(part, PrioritizedSampler | ReaPERSampler):  # (Eq. 18 of ReaPER is PER's weight)
                beta = linear_anneal(part.is_exponent, part.is_exponent_final, part.is_anneal_samples,
                                     self.num_samples - 1)
                is_weight.append(np.power(p.min() / p, beta).astype(np.float32))
            else:
                is_weight.append(np.ones(p.size, np.float32))
            probability.append(p * (n / batch_size))
        at = positions[0] if len(positions) == 1 else np.concatenate(positions)

        def column(name: str, key=None):
            cols = [d[name] if key is None else d[name][key] for d in replies]
            return _take(cols[0] if len(cols) == 1 else concat_rows(cols), at)

        ids = [global_ids(s, draws[s]["indices"]) for s in asked]
        info = new_sample_info(_take(ids[0] if len(ids) == 1 else np.concatenate(ids), at), column("generation"),
                               probability[0] if len(probability) == 1 else np.concatenate(probability),
                               is_weight[0] if len(is_weight) == 1 else np.concatenate(is_weight),
                               column("source"), {})
        extras = {name: column("extras", name) for name in replies[0]["extras"]}
        discount = None if replies[0]["discount"] is None else column("discount")
        return new_batch(column("obs"), column("action"), column("reward"), column("next_obs"), column("terminated"),
                         column("truncated"), info, extras, discount)

    # -- feedback ----------------------------------------------------------------------------------------------
    def update(self, info: SampleInfo, block: bool = True, **signals) -> UpdateReport | None:
        """Signals to the shards that hold the rows (``info`` of a batch this service drew); rows rewritten since
        they were drawn are skipped and counted by their shard. ``block=False``: send and return None."""
        if not signals:
            raise ValueError("update needs at least one signal, e.g. update(info, td_error=td)")
        shard, slots = split_ids(info.indices)
        if shard.size and (shard.min() < 0 or shard.max() >= self.num_shards):
            raise ValueError(f"info.indices name shard {int(shard.max())}, this service has {self.num_shards} shards")
        gen = np.asarray(info.generation, np.int64)
        arrays = {k: np.asarray(v).reshape(-1) for k, v in signals.items()}
        for k, v in arrays.items():
            if v.size != slots.size:
                raise ValueError(f"signal {k!r}: expected {slots.size} values, got {v.size}")
        futs = [call(self.handles[s], "update", slots[shard == s], gen[shard == s],
                     {k: v[shard == s] for k, v in arrays.items()}) for s in np.unique(shard).tolist()]
        if not block:  # (their replies are read at the next update or checkpoint: an error surfaces there)
            self.settle_updates()
            self._updates = futs
            return None
        self.settle_updates()
        done = get(futs, self.timeout)
        return new_update_report(sum(d[0] for d in done), sum(d[1] for d in done), None)

    def settle_updates(self) -> None:
        """Wait for the replies of the last ``update(block=False)`` (raising its error, if any)."""
        futs, self._updates = self._updates, []
        get(futs, self.timeout)

    # -- checkpoints, stats, shutdown -----------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Every shard saves (``directory/shard-<i>``) once it holds every call this client's writer had
        acknowledged (a shard restarted since gets them back first: :meth:`Writer.sync`). Other processes' writers
        resend what a restarted shard lost with their next call to it."""
        self.settle_updates()
        if self._writer is not None:
            self._writer.sync()
        get([call(h, "checkpoint") for h in self.handles], self.timeout)

    def shard_info(self) -> list[dict]:
        return get([call(h, "info") for h in self.handles], self.timeout)

    def __len__(self) -> int:
        return sum(i["rows"] for i in self.shard_info())

    def anneal_over_next(self, num_samples: int) -> None:
        for part in self.parts:
            if isinstance(part, PrioritizedSampler | ReaPERSampler) and part.options.is_anneal_samples is None:
                part.is_anneal_samples = self.num_samples + int(num_samples)

    def stats(self) -> dict[str, float]:
        infos = self.shard_info()
        out = {"replay/num_rows": float(sum(i["rows"] for i in infos)),
               "replay/num_stale": float(sum(i["num_stale"] for i in infos)),
               "replay/sample_wait_s": self.sample_wait_s}
        if self.limiter is not None:
            lim = self.limiter
            out |= lim.stats() if isinstance(lim, SampleToInsertRatio) else import_ray().get(lim.stats.remote())
        if self._writer is not None:
            out |= self._writer.stats()
        return out

    def close(self) -> None:
        """Stop prefetching and (Ray) end the shard actors; checkpoints stay."""
        self._stop.set()
        if self._prefetcher is not None:
            self._prefetcher.join(timeout=5)
            self._prefetcher = None
        if self.uses_ray:
            r = import_ray()
            for h in self.handles:
                r.kill(h, no_restart=True)
            if self.limiter is not None and not isinstance(self.limiter, SampleToInsertRatio):
                r.kill(self.limiter, no_restart=True)
        self.handles = []
