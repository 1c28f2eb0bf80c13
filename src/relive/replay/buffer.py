"""ReplayBuffer: one logical buffer over offline and online rows = Storage + a swappable Sampler.

    buf = ReplayBuffer(capacity, obs_shape, action_shape, sampler=MixtureSampler(), seed=0)
    buf.add_offline(dataset_columns)        # frozen prefix, never evicted
    buf.extend(online_rows)                 # ring after it (one stream, time-ordered)
    ReplayBuffer(..., demo_capacity=10_000, sampler=MixtureSampler())  # room for demonstrations during online
    buf.add_demonstrations(rows)            # training: never evicted, sampled as offline rows, tagged (types.ORIGIN_*)
    buf.extend(env_1_rows, stream=1)        # several streams (vector envs): each time-ordered, chunks interleaved
    stage = buf.stage(streams=4)            # steps gathered in place, stage.commit(k): a small write's cost cut
    batch = buf.sample(256)                 # Batch with .info (indices, generation, probability, is_weight)
    buf.update(batch.info, td_error=td)     # stale rows (overwritten since sampling) are skipped and counted
    buf.save(path); ReplayBuffer.load(path) # pickle-free; same contents, sampler state and RNG

    ReplayBuffer(..., n_step=3, gamma=0.99)  # batches carry 3-step returns and a per-row discount (returns.py)
    ReplayBuffer(..., backend="torch", device="cuda")  # columns, sampling and priorities on a device (device.py)
    seq = buf.sample_sequences(32, 16)      # [32, 16, ...] slices within episodes, seq.mask [32, 16]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

from relive.replay import _check_kernels, checkpoint, returns
from relive.replay.samplers import (
    MixtureSampler,
    PrioritizedSampler,
    Sampler,
    UniformSampler,
    sampler_config,
    sampler_from_config,
)
from relive.replay.stage import Stage
from relive.replay.state_checks import state_field, state_int
from relive.replay.storage import FrameStackStorage, Storage, as_numpy
from relive.types import (
    INTERVENTION,
    OFFLINE,
    ONLINE,
    ORIGIN_NAMES,
    Batch,
    SampleInfo,
    UpdateReport,
    new_batch,
    new_sample_info,
    new_update_report,
)

# backend name -> the ReplayBuffer subclass built for it (relive.replay.device_buffer registers "torch")
BACKEND_CLASSES: dict[str, type] = {}

HOST = "host"  # ReplayBuffer.load(..., device=HOST): NumPy columns in RAM, whatever the checkpoint's backend


_INT64 = np.dtype(np.int64)
_STAMP_DTYPES = frozenset(np.dtype(t) for t in (np.int32, np.int64))  # a batch's generations (int64: old buffers)
_FLOAT_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64))  # (numba has no float16)


class ReplayBuffer:
    storage: Storage
    sampler: Sampler
    seed: int
    rng: np.random.Generator
    num_stale: int  # updates skipped because the row was overwritten after sampling
    num_updated: int
    n_step: int
    gamma: float

    def __init__(self, capacity: int, obs_shape, action_shape, sampler: Sampler | None = None, seed: int = 0,
                 *, obs_dtype=np.float32, action_dtype=np.float32, extra_columns: Mapping | None = None,
                 n_step: int = 1, gamma: float = 0.99, dedup_next_obs: bool | None = None, backend: str = "ram",
                 directory: str | os.PathLike | None = None, device=None, demo_capacity: int = 0,
                 frame_stack=None):
        """``obs_shape``: a shape (flat observations of ``obs_dtype``), or a dict key -> shape / (shape, dtype)
        for dict observations (``{"image": ((3, 64, 64), np.uint8), "state": (7,)}``: each key its own column;
        batches hold ``batch.obs["image"]``). ``dedup_next_obs`` (default: on for dict observations, off for flat
        ones): next_obs is read from the next row of the episode and stored only where it is not (episode ends,
        the last row of a write), which halves an image buffer. ``backend="memmap"`` keeps the data columns in
        ``.npy`` files under ``directory`` (``np.memmap``) instead of RAM. ``n_step`` > 1: every batch carries
        n-step returns with discount ``gamma`` (see :meth:`gather`); 1 (the default): one-step rows, ``gamma``
        unused. ``backend="torch"`` with ``device`` (default cpu): columns are tensors on that device and batches
        are drawn, gathered and updated there (:mod:`relive.replay.samplers.device`; uniform, PER, symmetric samplers,
        converted from their host classes; batches and ``batch.info`` hold tensors). ``demo_capacity``: rows of room
        for demonstrations written during online training (:meth:`add_demonstrations`; the layout:
        :mod:`relive.replay.storage`); needs a mixture sampler (uniform / PER parts) and a host backend.
        ``frame_stack``: the observation is a stack of k frames (``4``, a :class:`~relive.replay.storage.FrameStack`
        such as ``FrameStack.sb3(4)``, or for dict observations ``{"image": 3}``): writes take the env's stacks,
        checked against their episode, and the storage keeps each frame once (:mod:`relive.replay.storage.frame_stack`;
        RAM and memmap backends)."""
        self.n_step, self.gamma = returns.check_n_step(n_step, capacity), returns.check_gamma(gamma)
        if demo_capacity and backend == "torch":
            raise ValueError("demo_capacity (a demonstration segment) needs a host backend ('ram' or 'memmap'), not "
                             "backend='torch'")
        sampler = sampler if sampler is not None else UniformSampler()
        if demo_capacity:
            check_demo_sampler(sampler)
        stacked = {} if frame_stack is None else {"frame_stack": frame_stack}  # (frames stored once: its own class)
        self.storage = (Storage if frame_stack is None else FrameStackStorage)(
            capacity, obs_shape, action_shape, obs_dtype=obs_dtype, action_dtype=action_dtype,
            extra_columns=extra_columns, dedup_next_obs=dedup_next_obs, backend=backend, directory=directory,
            device=device, demo_capacity=demo_capacity, **stacked)
        self.sampler = self._own_sampler(sampler)
        if self.sampler.storage is not None:
            raise ValueError("this sampler is already bound to another buffer; give each buffer its own")
        self.sampler.bind(self.storage)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.num_stale = 0  # updates skipped because the row was overwritten after sampling
        self.num_updated = 0
        self._init_backend_state()

    def __new__(cls, *args, backend: str = "ram", **kwargs):
        """``backend="torch"`` builds a :class:`~relive.replay.device_buffer.DeviceReplayBuffer` (registered in
        ``BACKEND_CLASSES`` by that module): the device path is its own class, the host path has no device branch."""
        klass = BACKEND_CLASSES.get(backend, cls) if cls is ReplayBuffer else cls
        return super().__new__(klass)

    on_device = False  # batches, indices and signals are tensors on a device (DeviceReplayBuffer)

    def _own_sampler(self, sampler: Sampler) -> Sampler:
        """The sampler this buffer binds (a device buffer converts the host samplers to their device twins)."""
        return sampler

    def _init_backend_state(self) -> None:
        """State a backend keeps beside the storage and the sampler (a device buffer: its generator, counters)."""

    # -- sizes -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.storage.num_rows

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    @property
    def num_offline(self) -> int:
        return self.storage.num_offline

    @property
    def num_online(self) -> int:
        return self.storage.num_online

    # -- writing ---------------------------------------------------------------------------------------
    def add_offline(self, rows: Mapping, dataset_id: str | None = None) -> np.ndarray:
        """Append dataset rows to the frozen offline prefix (before any online row). Returns their slots.

        ``dataset_id`` names where the rows come from (a Minari id, a file): checkpoints then refer to the offline
        rows by that id and their SHA-256 instead of copying them (``save(path, offline="reference")``, the default
        when every offline row came with the same id)."""
        if dataset_id is not None and not isinstance(dataset_id, str):
            raise ValueError(f"dataset_id must be a string, got {dataset_id!r}")
        slots = self._write(OFFLINE, rows)
        self.storage.offline_dataset_ids.append(dataset_id)
        return slots

    def add_demonstrations(self, rows: Mapping, origin: int = INTERVENTION) -> np.ndarray:
        """Append demonstration rows (an intervention's, by default) to the never-evicted offline segment, before or
        during online training (``demo_capacity`` rows of room after the first online row). They are sampled as
        offline rows (the offline part of a mixture) and tagged with ``origin`` in ``storage.meta["origin"]``.
        Rows of one call are consecutive in time; end a demonstration's last row with ``truncated`` (or
        ``terminated``) so that the next demonstration starts a new episode. Returns their slots."""
        if isinstance(origin, bool | np.bool_) or origin not in ORIGIN_NAMES:
            raise ValueError(f"origin must be one of {ORIGIN_NAMES} (relive.types), got {origin!r}")
        return self._write(OFFLINE, rows, origin=origin)

    def extend(self, rows: Mapping, stream: int = 0, origin=None) -> np.ndarray:
        """Append online rows of one ``stream`` to the ring, in that stream's time order. Returns their slots.

        Streams are independent sources of rows: each environment of a vector env, each collector's env. A chunk
        of one stream may arrive between chunks of another; episodes, steps and per-episode values (returns-to-go,
        ReaPER's sums, ARB's trajectory means) follow each stream. One stream (the default, 0) is the fast path;
        the stream of every stored row is ``storage.stream_of(slots)``. ``origin``: the rows' tag, one or one per row
        (default agent; an intervened step's row: ``relive.types.INTERVENTION``)."""
        return self._write(ONLINE, rows, stream, origin)

    def add(self, stream: int = 0, **row) -> int:
        """Append one online transition given as keyword arguments (convenience; prefer ``extend``)."""
        return int(self.extend({k: as_numpy(v)[None] for k, v in row.items()}, stream=stream)[0])

    def stage(self, streams=1, rows: int = 64) -> Stage:
        """A :class:`~relive.replay.stage.Stage`: ``rows`` steps of each of ``streams`` (a count, or the stream ids)
        gathered in place in the storage's dtypes, then written with ``stage.commit(k)`` -- what ``extend`` of the
        same rows stores, at a fraction of a small write's fixed cost (e.g. an env loop that steps one row at a
        time: commit before each sample)."""
        return Stage(self, streams, rows)

    def _write(self, source: int, rows: Mapping, stream: int = 0, origin=None) -> np.ndarray:
        self.sampler.check_insert(source, rows)
        slots = self.storage.write(source, rows, stream, origin)
        live = slots if slots.size == 0 or slots[0] >= 0 else slots[slots >= 0]  # -1s come first, if any
        if live.size:
            self.sampler.on_insert(live)
        return slots

    def close_stream(self, stream: int, terminated: bool = False) -> np.ndarray:
        """End ``stream``'s open episode where it stands (its env was reset mid-episode, e.g. a resumed run with
        vector envs): its last stored row becomes a truncation (``terminated=True``: a termination). Returns the
        slots of the episode's stored rows in time order (for returns-to-go), empty if there was none."""
        episode_id = self.storage.close_stream(stream, terminated)
        if episode_id == -1:
            return np.zeros(0, np.int64)
        self.sampler.on_episodes_closed(np.array([episode_id]))
        if not self.storage.episodes.is_live([episode_id])[0]:
            return np.zeros(0, np.int64)
        view = self.storage.episodes.get([episode_id])
        return self.storage.episode_slots(view.start, view.length, view.source)

    def episode_slots_of(self, slot: int) -> np.ndarray:
        """Slots of the stored rows of the episode that holds ``slot``, in time order."""
        st = self.storage
        view = st.episodes.get([int(st.episode_ids(st.check_slots([slot]))[0])])
        return st.episode_slots(view.start, view.length, view.source)

    def set_column(self, name: str, indices, values) -> None:
        """Fill an extra column of stored rows (e.g. ``mc_return`` when an episode ends)."""
        self.storage.set_column(name, indices, values)

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self, batch_size: int) -> Batch:
        if type(batch_size) is not int and (isinstance(batch_size, bool | np.bool_)  # (a plain int: one test)
                                            or not isinstance(batch_size, int | np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        stored = self.storage.num_rows
        if batch_size > stored:
            raise ValueError(f"batch of {batch_size} rows requested but only {stored} rows are stored")
        return self._draw_batch(int(batch_size))

    def _draw_batch(self, batch_size: int) -> Batch:
        sampler = self.sampler
        indices, probability, is_weight = sampler.sample(batch_size, self.rng)
        batch = self.gather(indices, probability, is_weight, sampler.hints())
        return sampler.relabel_batch(batch, self.n_step, self.gamma)  # (HER: new goals; others: the batch as is)

    def gather(self, indices, probability=None, is_weight=None, hints=None) -> Batch:
        """A Batch of given slots (e.g. to evaluate specific rows); probability / is_weight default to nan / 1,
        ``hints`` (the sampler's per-batch values for the agent) to none.

        With ``n_step > 1``, ``reward`` is each row's n-step return, ``next_obs`` / ``terminated`` /
        ``truncated`` come from its bootstrap row and ``discount`` = gamma^{n'} (1 - terminated) (the formulas:
        :mod:`relive.replay.returns`); obs, action and extra columns stay the row's own."""
        st = self.storage
        idx = as_numpy(indices)
        if idx.dtype != np.int64:
            idx = st.check_slots(idx).reshape(idx.shape)  # (integers only: a float index is refused, never cast)
        cols = st.columns
        n = idx.size
        stamps = st.meta["generation"]
        # offline rows are the prefix [0, num_offline): the source needs no read of a per-row column. Every slot must
        # hold a row (as update and the n-step path require): the compiled pass checks it on the way, else NumPy
        gap_lo, gap_hi = (st.num_offline, st.ring_base) if st.has_gap else (0, 0)
        if _check_kernels.AVAILABLE and type(stamps) is np.ndarray and idx.ndim == 1 and 0 < n:
            generation, source = np.empty(n, stamps.dtype), np.empty(n, np.int8)
            if not _check_kernels.stamps_and_source(idx, stamps, st.num_offline, st.size, gap_lo, gap_hi, generation,
                                                    source):
                st.check_slots(idx)  # raises, naming the slot
                generation, source = stamps.take(idx), (idx >= st.num_offline).view(np.int8)
        else:
            st.check_slots(idx)
            generation, source = stamps.take(idx), (idx >= st.num_offline).view(np.int8)
        info = new_sample_info(idx, generation, np.full(n, np.nan) if probability is None else probability,
                               np.ones(n, np.float32) if is_weight is None else is_weight, source,
                               hints if hints is not None else {})
        extras = {name: cols[name].take(idx, axis=0) for name in st.extra_names} if st.extra_names else {}
        last, discount = idx, None  # the row whose next_obs and flags the batch holds: the row itself (one step)
        if self.n_step > 1:
            ret = returns.n_step_returns(st, st.check_slots(idx), self.n_step, self.gamma)
            last, discount = ret.last.reshape(idx.shape), ret.discount.reshape(idx.shape)
            reward = ret.reward.reshape(idx.shape)
        else:
            reward = cols["reward"].take(idx)
        if isinstance(st, FrameStackStorage):  # frame stacks: one-step rows' obs and next_obs from one gather
            obs, next_obs = st.read_pair(idx, last)
        elif st.obs_keys is not None or st.dedup_next_obs:  # dict columns, or next_obs read from the next row
            obs, next_obs = st.read("obs", idx), st.read("next_obs", last)
        else:
            obs, next_obs = cols["obs"].take(idx, axis=0), cols["next_obs"].take(last, axis=0)
        return new_batch(obs, cols["action"].take(idx, axis=0), reward, next_obs, cols["terminated"].take(last),
                         cols["truncated"].take(last), info, extras, discount)

    def sample_sequences(self, batch_size: int, length: int, at_episode_end: str = "pad",
                         max_redraws: int = 64) -> Batch:
        """``batch_size`` contiguous slices of ``length`` rows, each within one episode: every column is
        [B, L, ...] (with ``n_step > 1`` each step carries its own n-step return and discount, as :meth:`gather`),
        ``mask`` [B, L] is True on the steps that belong to the slice.

        The sampler draws each slice's *start row*, so a slice's probability, ``is_weight`` and priority are its
        first row's, and ``update(batch.info, td_error=...)`` (shape [B]) goes to the start rows (reduce per-step
        errors over the mask first). ``at_episode_end``: ``"pad"`` -- a slice that reaches the last stored row
        of its episode (a termination, a truncation, the newest row of an open episode) stops there, its
        remaining steps are zeros with ``mask`` False; ``"reject"`` -- start rows with fewer than ``length``
        stored rows left in their episode are redrawn (every ``mask`` is True): each redraw samples a whole new
        batch and takes its row at the rejected positions, so a mixture's per-source counts stay exact; the
        start rows then follow the sampler's distribution restricted to valid starts, and ``probability`` /
        ``is_weight`` are those of the draw each row came from (not renormalized). A redraw is a sample call
        for the sampler (PER's IS-exponent schedule advances per call). After ``max_redraws`` rounds with rows
        still rejected, a ValueError."""
        if isinstance(length, bool | np.bool_) or not isinstance(length, int | np.integer) or length < 1:
            raise ValueError(f"sequence length must be a positive integer, got {length!r}")
        if length > self.capacity:
            raise ValueError(f"sequence length {length} is larger than the buffer's capacity ({self.capacity} rows)")
        if at_episode_end not in ("pad", "reject"):
            raise ValueError(f"at_episode_end must be 'pad' or 'reject', got {at_episode_end!r}")
        if isinstance(batch_size, bool | np.bool_) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if batch_size > self.storage.num_rows:
            raise ValueError(f"batch of {batch_size} slices requested but only {self.storage.num_rows} rows are "
                             "stored")
        if self.sampler.relabels:
            raise ValueError(f"sample_sequences does not relabel goals: {type(self.sampler).__name__} relabels rows of "
                             "sample() only (use sample(), or the inner sampler for sequences)")
        st = self.storage
        draw = self.sampler.sample(int(batch_size), self.rng)
        if at_episode_end == "reject":
            draw = self._redraw_until_fit(draw, length, max_redraws)
        hints = self.sampler.hints()
        slots, mask = returns.slices(st, draw.indices, length)
        rows = self.gather(slots.reshape(-1))
        shape = slots.shape
        pad = ~mask.reshape(-1)

        def fold(x):
            if isinstance(x, Mapping):  # dict observations: each key
                return {k: fold(v) for k, v in x.items()}
            if pad.any():
                x[pad] = 0  # (a fresh array: gather copies)
            return x.reshape(*shape, *x.shape[1:])

        info = SampleInfo(indices=draw.indices, generation=st.meta["generation"].take(draw.indices),
                          probability=draw.probability, is_weight=draw.is_weight,
                          source=(draw.indices >= st.num_offline).view(np.int8), hints=hints)
        return Batch(fold(rows.obs), fold(rows.action), fold(rows.reward), fold(rows.next_obs), fold(rows.terminated),
                     fold(rows.truncated), info=info, extras={k: fold(v) for k, v in rows.extras.items()},
                     discount=None if rows.discount is None else fold(rows.discount), mask=mask)

    def _redraw_until_fit(self, draw, length: int, max_redraws: int):
        """Replace start rows whose episode has fewer than ``length`` rows left, position by position, with the
        same positions of fresh draws of the whole batch."""
        indices, probability, is_weight = (np.array(x) for x in draw)
        bad = ~returns.slice_fits(self.storage, indices, length)
        for _ in range(max_redraws):
            if not bad.any():
                return type(draw)(indices, probability, is_weight)
            fresh = self.sampler.sample(indices.size, self.rng)
            take = bad & returns.slice_fits(self.storage, fresh.indices, length)
            indices[take], probability[take], is_weight[take] = (x[take] for x in fresh)
            bad &= ~take
        if not bad.any():
            return type(draw)(indices, probability, is_weight)
        if returns.max_rows_left(self.storage) < length:  # (checked only here: it reads every live episode)
            raise ValueError(f"no stored episode has {length} rows: no slice of that length fits "
                             f"(use at_episode_end='pad')")
        raise ValueError(f"{int(bad.sum())} of {indices.size} start rows still had fewer than {length} rows left in "
                         f"their episode after {max_redraws} redraws; use a shorter length or at_episode_end='pad'")

    # -- feedback --------------------------------------------------------------------------------------
    def update(self, info: SampleInfo, **signals) -> UpdateReport:
        """Hand per-sample signals (``td_error=...``, ``priority=...``, ...) back to the sampler.

        Rows whose slot was overwritten since ``info`` was sampled are skipped and counted (``num_stale``)."""
        if not signals:
            raise ValueError("update needs at least one signal, e.g. update(info, td_error=td)")
        checked = self._check_update_compiled(info, signals) if _check_kernels.AVAILABLE else None
        idx, arrays, stale, n_stale = checked if checked is not None else self._check_update(info, signals)
        self.sampler.check_signals(idx, arrays)  # every part validates before any state changes
        if n_stale:
            fresh = ~stale
            idx = idx[fresh]
            arrays = {k: v[fresh] for k, v in arrays.items()}
        if idx.size:
            self.sampler.update(idx, arrays)
        self.num_stale += n_stale
        self.num_updated += idx.size
        return new_update_report(idx.size, n_stale, stale)

    def _check_update(self, info: SampleInfo, signals: dict) -> tuple[np.ndarray, dict, np.ndarray, int]:
        """The update's checks with NumPy, naming the first problem: every index a stored slot, one generation
        per index, each signal one number per row ([B] or [B, 1]), float signals finite. Returns the slots (int64),
        the signals ([B] arrays), the stale mask (slot rewritten since sampled) and the number of stale rows."""
        idx = self.storage.check_slots(info.indices)
        gen = np.asarray(info.generation, dtype=np.int64).reshape(-1)
        if gen.size != idx.size:
            raise ValueError(f"info has {idx.size} indices but {gen.size} generations")
        arrays = {}
        for name, value in signals.items():
            arr = as_numpy(value)
            if arr.shape != (idx.size,):
                if arr.size == idx.size and arr.ndim == 2 and 1 in arr.shape:
                    arr = arr.reshape(-1)  # [B, 1] is fine
                else:
                    raise ValueError(f"signal {name!r}: expected shape ({idx.size},), got {arr.shape}")
            if arr.dtype.kind not in "fiub":
                raise ValueError(f"signal {name!r}: expected numbers, got dtype {arr.dtype}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                i = int(np.flatnonzero(~np.isfinite(arr))[0])
                raise ValueError(f"signal {name!r} row {i}: value {arr[i]!r} is not finite (NaN/inf)")
            arrays[name] = arr
        stale = self.storage.meta["generation"].take(idx) != gen
        return idx, arrays, stale, int(stale.sum())

    def _check_update_compiled(self, info: SampleInfo, signals: dict):
        """:meth:`_check_update` in one compiled pass for the usual call (one float signal of shape [B], the
        batch's own int64 indices and generations), None for any other call or any problem found (the NumPy
        path then names it)."""
        if len(signals) != 1:
            return None
        ((name, arr),) = signals.items()
        idx, gen = info.indices, info.generation
        # (dtypes compared by identity: NumPy's native dtypes are singletons; any other spelling takes the NumPy path)
        if not (type(arr) is np.ndarray and type(idx) is np.ndarray and type(gen) is np.ndarray
                and idx.dtype is _INT64 and gen.dtype in _STAMP_DTYPES and arr.dtype in _FLOAT_DTYPES
                and idx.ndim == 1 and gen.shape == idx.shape == arr.shape):
            return None
        st = self.storage
        gap_lo, gap_hi = (st.num_offline, st.ring_base) if st.has_gap else (0, 0)
        stale = np.empty(idx.size, np.bool_)
        n_stale = _check_kernels.check_update(idx, gen, st.meta["generation"], st.size, gap_lo, gap_hi, arr, stale)
        return None if n_stale < 0 else (idx, {name: arr}, stale, n_stale)

    def _read_device_counts(self) -> None:
        """Fold counters a backend keeps elsewhere into the host ones (a device buffer's: a sync)."""

    def refresh(self, score_fn: Callable, chunk_size: int = 65536) -> bool:
        """Let the sampler re-score every stored row with ``score_fn(obs, action) -> per-row score`` (ARB).
        Returns whether the sampler used it."""
        return self.sampler.refresh(score_fn, chunk_size)

    def stats(self) -> dict[str, float]:
        self._read_device_counts()
        return self.sampler.stats() | {
            "replay/num_offline": float(self.num_offline),
            "replay/num_online": float(self.num_online),
            "replay/num_stale": float(self.num_stale),
        }

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self, offline: str = "auto") -> dict:
        """``offline``: ``"copy"`` the offline rows into the state, or ``"reference"`` them by dataset id + SHA-256
        (see ``add_offline``); ``"auto"``: reference when every offline row came with one dataset id. A memmap
        buffer copies no rows at all (its column files are referred to)."""
        if offline not in ("auto", "copy", "reference"):
            raise ValueError(f"offline must be 'auto', 'copy' or 'reference', got {offline!r}")
        if offline == "auto":
            ids = set(self.storage.offline_dataset_ids)
            offline = "reference" if len(ids) == 1 and None not in ids else "copy"
        self._read_device_counts()
        device = self._backend_state()
        return {
            "config": {"storage": self.storage.config(), "sampler": sampler_config(self.sampler),
                       "seed": self.seed, "n_step": self.n_step, "gamma": self.gamma},
            "storage": self.storage.state_dict(offline),
            "sampler": self.sampler.state_dict(),
            "rng": self.rng.bit_generator.state,
            "counters": {"num_stale": self.num_stale, "num_updated": self.num_updated},
        } | ({"device": device} if device else {})

    def _backend_state(self) -> dict:
        """A backend's own part of the checkpoint (``state["device"]``; none for the host buffer)."""
        return {}

    def save(self, path: str | os.PathLike, offline: str = "auto") -> None:
        """Write a pickle-free checkpoint directory (see :mod:`relive.replay.checkpoint`); ``offline`` as in
        :meth:`state_dict`."""
        checkpoint.save_tree(path, self.state_dict(offline), kind="replay_buffer")
        self.storage.claim_checkpoint(path, loading=False)  # memmap: the files now belong to this checkpoint

    def close(self) -> None:
        """A memmap buffer: flush its column files and give its directory up, so that another buffer (this process
        or another) may load it; the buffer refuses writes afterwards. Other backends: nothing to do."""
        self.storage.close()

    @classmethod
    def load(cls, path: str | os.PathLike, *, check_hashes: bool = True, offline_rows=None,
             device=None) -> ReplayBuffer:
        """Rebuild a buffer from ``save``: same rows, sampler state and RNG, so the same next samples.
        ``offline_rows``: the offline rows of a checkpoint that refers to them (the rows given to ``add_offline``,
        or a function dataset id -> rows); checked against the SHA-256 the checkpoint recorded. ``device``: load
        into a torch-backend buffer on that device (from either backend's checkpoint), ``"host"``: NumPy columns
        (a device buffer's checkpoint goes to RAM, e.g. read where there is no GPU, its draws continuing from the
        host generator; a RAM or memmap one loads as saved), None: as it was saved."""
        state = checkpoint.load_tree(path, kind="replay_buffer", check_hashes=check_hashes)
        with checkpoint.loading(path, "replay buffer state"):
            buf = cls._from_state(state, offline_rows, device)
            try:
                buf.storage.claim_checkpoint(path, loading=True)
            except BaseException:
                buf.close()
                raise
        return buf

    @classmethod
    def from_state_dict(cls, state: dict, offline_rows=None, device=None) -> ReplayBuffer:
        """Rebuild a buffer from :meth:`state_dict` (arguments as :meth:`load`'s), checked as a loaded checkpoint is:
        a missing, mistyped or contradictory field is one :class:`~relive.replay.checkpoint.CheckpointError` naming
        it (``replay buffer state: ...``), never a KeyError / TypeError from inside."""
        with checkpoint.loading("ReplayBuffer.from_state_dict", "replay buffer state"):
            if not isinstance(state, Mapping):
                raise ValueError(f"expected a mapping (a ReplayBuffer.state_dict()), got {type(state).__name__}")
            return cls._from_state(state, offline_rows, device)

    @classmethod
    def _from_state(cls, state: Mapping, offline_rows, device) -> ReplayBuffer:
        cfg = state["config"]
        scfg = dict(cfg["storage"])
        if device == HOST:  # NumPy columns (the checkpoint format is the host's for every backend)
            if scfg.get("backend") == "torch":
                scfg = {k: v for k, v in scfg.items() if k != "device"} | {"backend": "ram"}
        elif device is not None:
            if scfg.get("backend", "ram") not in ("ram", "torch"):
                raise ValueError(f"a {scfg['backend']} checkpoint loads on the host (device=None)")
            scfg |= {"backend": "torch", "device": str(device), "dedup_next_obs": False}
            if scfg.get("obs_keys") is not None and cfg["storage"].get("dedup_next_obs"):
                raise ValueError("this checkpoint stores next_obs deduplicated (dict observations): it loads on the "
                                 "host only")
        if "frame_stack" in scfg and scfg.get("backend", "ram") == "torch":
            raise ValueError("a checkpoint with frame stacks (frame_stack) loads on the host only (device=None)")
        if scfg.get("demo_capacity") and scfg.get("backend") == "torch":
            raise ValueError("a checkpoint with a demonstration segment (demo_capacity) loads on the host only")
        buf: ReplayBuffer = object.__new__(BACKEND_CLASSES.get(scfg.get("backend", "ram"), ReplayBuffer))
        buf.storage = (FrameStackStorage if "frame_stack" in scfg else Storage).from_config(scfg)
        try:
            buf._load_state(state, cfg, offline_rows)
        except BaseException:
            buf.storage.close()  # a memmap directory is given up again
            raise
        return buf

    def _load_state(self, state: Mapping, cfg: Mapping, offline_rows) -> None:
        buf = self
        ref = state["storage"].get("offline_ref")
        if ref is not None:
            dataset = ref["dataset_id"]
            rows = offline_rows(dataset) if callable(offline_rows) else offline_rows
            if rows is None:
                raise ValueError(f"this checkpoint refers to offline dataset {dataset!r} (sha256 "
                                 f"{str(ref['sha256'])[:16]}...) instead of holding its rows: pass offline_rows=... "
                                 "(the rows given to add_offline, or a function dataset id -> rows)")
            buf.storage.write(OFFLINE, rows)
            buf.storage.offline_dataset_ids.append(dataset)
        buf.storage.load_state_dict(state["storage"])
        buf.sampler = buf._own_sampler(sampler_from_config(cfg["sampler"]))
        if buf.storage.demo_capacity:
            check_demo_sampler(buf.sampler)
        buf.sampler.bind(buf.storage)
        buf.sampler.load_state_dict(state["sampler"])
        buf.seed = state_int(cfg, "seed", "replay buffer config", high=2**128)  # (a seed as default_rng takes it)
        # (checkpoints before n-step returns: one-step rows) -- checked as the constructor checks them
        buf.n_step = returns.check_n_step(cfg.get("n_step", 1), buf.capacity)
        buf.gamma = returns.check_gamma(cfg.get("gamma", 0.99))
        buf.rng = np.random.default_rng()
        buf.rng.bit_generator.state = state["rng"]
        counters = state_field(state, "counters", "replay buffer state")
        buf.num_stale = state_int(counters, "num_stale", "replay buffer counters")
        buf.num_updated = state_int(counters, "num_updated", "replay buffer counters")
        buf._init_backend_state()
        buf._load_backend_state(state.get("device", {}))

    def _load_backend_state(self, saved: Mapping) -> None:
        """A backend's own part of a checkpoint (see :meth:`_backend_state`)."""


def check_demo_sampler(sampler: Sampler) -> None:
    """A demonstration segment leaves empty slots between the offline and the online rows while it has room: a
    sampler must draw each source from its own contiguous range, i.e. be a mixture whose parts are uniform or PER
    (the parts this layout is tested with; others read the ring's arithmetic from ``num_offline``)."""
    ok = type(sampler) is MixtureSampler and all(type(part) in (UniformSampler, PrioritizedSampler)
                                                 for _, part in sampler.parts())
    if not ok:
        raise ValueError(f"demo_capacity (a demonstration segment) needs a MixtureSampler with UniformSampler or "
                         f"PrioritizedSampler parts (e.g. replay.name 'symmetric' or 'symmetric_per'), got "
                         f"{type(sampler).__name__}")
