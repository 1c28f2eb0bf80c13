"""Frame stacks stored once (``ReplayBuffer(..., frame_stack=4)``): an observation (or one key of a dict observation)
declared as a stack of k frames is stored as its newest frame per row, and every ``obs`` / ``next_obs`` stack is
rebuilt from the episode's frames when it is read (gather, sample, n-step, ``sample_sequences``).

**What it accepts.** What the env gives, unchanged, declared by :class:`FrameStack` (``num_frames``, ``axis``,
``padding``; an int ``k`` means ``FrameStack(k)``):

- Gymnasium's ``FrameStackObservation(env, k)``: shape ``(k, *frame)``, the frames along a new axis 0, newest last,
  frames before an episode's first step padded with copies of its first frame (``padding_type="reset"``, the default
  of gymnasium 1.x's wrapper, the one installed here): ``FrameStack(k)`` (= ``FrameStack.gymnasium(k)``);
  ``padding_type="zero"``: ``FrameStack(k, padding="zero")``.
- SB3's ``VecFrameStack(venv, k)``: the frames concatenated along the channel axis, newest last -- the last axis for
  channels-last images and for vectors (``(84, 84, 4)`` from Atari's ``(84, 84, 1)``), the first for channels-first
  ones -- and zeros before an episode's first step (SB3 zeroes the stack at each reset):
  ``FrameStack.sb3(k)`` (= ``FrameStack(k, axis=-1, padding="zero")``; ``channels_order="first"``: ``axis=0``).

In general a stack of k frames is the concatenation of k frames along ``axis`` (Gymnasium's case: frames with a
leading axis of 1), so the declared observation shape holds ``k * C`` along that axis and a frame ``C``.

**Checked, never trusted.** Every write checks, row by row, that the older ``k - 1`` frames of each ``obs`` stack are
the previous steps' frames of that episode (the stored ones for the first row of a write that continues an episode;
the padding at an episode's first step) and that each ``next_obs`` stack is its ``obs`` stack shifted by one frame; a
stack that does not follow its episode is refused with a ValueError naming the column and the row, and nothing is
written. That is a comparison of ``2 (k - 1)`` frames a row, the size of the input: cheap next to storing it.

**Storage.** The physical ``obs`` column (``obs.<key>``) holds frames; ``next_obs`` is deduplicated as
relive.replay.storage.next_obs does it (``dedup_next_obs`` is forced on): a row's next frame is the next row's frame
of its lane, and only rows without a stored successor (episode ends, the newest row of a stream) keep an explicit
copy of one frame. A row at logical position t of an episode that started at position s (relive.replay.storage.episodes:
positions follow each stream's lane, so streams, the offline prefix and the demonstration segment need nothing
special) reads the frames of positions ``t - k + 1 .. t``, where a position before s is padding (``reset``: the frame
of s; ``zero``: zeros); its ``next_obs`` reads ``t - k + 2 .. t`` and its next frame.

**Eviction (why no row becomes unsampleable).** When the ring overwrites an episode's oldest rows, its oldest
surviving rows still look back up to ``k - 1`` frames before them (and, for reset padding, at the episode's first
frame, which lies among those whenever a surviving row needs it: a row at t >= E needs padding only if s > t - k + 1
>= E - k + 1). So the storage keeps, per lane, the frames of the ``k - 1`` positions just below the lane's eviction
bound E (``episodes.lane_evicted``): ``(k - 1) * frame`` bytes per stream, 21 KB for an 84x84 Atari stack of 4,
captured from the rows a write is about to overwrite (or the rows of a write longer than the ring that are never
stored) and committed once the write succeeded. Every stored row then returns its exact stack, every sampler keeps
seeing slots only, and ``probabilities()`` is unchanged.

The alternatives: Dopamine's ``OutOfGraphReplayBuffer`` writes k - 1 zero frames before every episode and makes the
rows near its write cursor, whose stack or n-step window crosses it, impossible to sample (``is_valid_transition``,
with rejection in ``sample_index_batch``) -- a rule every sampler here would have to build into its probabilities
(PER's sum tree, ReaPER's, the mixture's per-source counts). cpprb's ``stack_compress`` writes each stack into
overlapping strided memory (the stack along the last axis) and caches the last stacks when the user calls
``on_episode_end`` (and at wrap-around), trusting that the stacks really are a sliding window (its issue #110: an
episode shorter than the stack cached frames of the previous one); nothing checks the input.

**Compiled paths** (numba; :mod:`relive.replay.storage._frame_kernels`; without it the NumPy paths, same results, and
tests/replay/test_frame_stack.py compares the two on every check): a write of one row of the only stream (the env loop's
``extend`` of one step) checks its stack against the stored, kept or padding frames and stores the frame, its explicit
next frame and the kept frame in one call, the few scalars of the row in Python (a write of several rows or streams,
and any row it refuses, take the general path, which names what is wrong); a one-step batch's grid of frame slots
(each row's positions, its episode's start for the padding, ring and per-stream slot maps, the next row or an
explicit next frame) is one call (``pair_grid``; a batch that reads a kept frame takes the NumPy grid); a read
gathers each row's frames by index
(slot, kept frame, zero padding, explicit next frame) straight into the stacks' layout, one pass for obs and next_obs,
for interleaved stacks of multi-byte pieces (elsewhere NumPy's gather was as fast or faster: see ``read_pair``).

Backends: RAM and memmap (``backend="memmap"``: the frame columns are the column files, one frame a row; the frames
kept below each lane's eviction bound and the explicit next frames are small arrays beside them that a checkpoint
holds, as it holds every memmap buffer's bookkeeping; see :func:`check_backend`). The torch backend refuses
``frame_stack``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from relive.replay.state_checks import state_array, state_field
from relive.replay.storage import _frame_kernels
from relive.replay.storage._write_kernels import row_bytes
from relive.replay.storage.bookkeeping import GEN_MAX, ID_MOD
from relive.replay.storage.episodes import LANE_BITS
from relive.replay.storage.layout import ColumnSpec, as_numpy, convert, obs_layout
from relive.replay.storage.next_obs import differs
from relive.replay.storage.storage import Storage, all_finite
from relive.types import AGENT, OFFLINE, ONLINE

_NO_POS, _NO_QMAP = np.zeros(1, np.int64), np.zeros((1, 0), np.int64)  # (_pair_grid's maps of one stream: unused)

PADDINGS = ("reset", "zero")
BACKENDS = ("ram", "memmap")  # the backends whose frame columns FrameStackStorage reads with NumPy


def check_backend(backend: str) -> None:
    """The backends that rebuild stacks: RAM and memmap (NumPy columns: the memmap's column files hold one frame a
    row; the kept frames and explicit next frames live in RAM and in the checkpoint). The torch backend gathers on
    the device and has no stack rebuild there: refused."""
    if backend not in BACKENDS:
        raise ValueError(f"frame_stack needs backend 'ram' or 'memmap' (backend={backend!r}: a device buffer does not "
                         "rebuild frame stacks; store full stacks there (no frame_stack), or keep the frames in "
                         "host memory / a memmap directory and move batches with batch.to_torch(device))")


@dataclass(frozen=True)
class FrameStack:
    """An observation that is a stack of ``num_frames`` frames concatenated along ``axis`` (of the observation,
    not counting the batch), newest last; frames before an episode's first step are ``padding``: ``"reset"``
    (copies of the episode's first frame: Gymnasium's ``FrameStackObservation`` default) or ``"zero"`` (SB3's
    ``VecFrameStack``, Gymnasium's ``padding_type="zero"``)."""

    num_frames: int
    axis: int = 0
    padding: str = "reset"

    def __post_init__(self):
        k = self.num_frames
        if isinstance(k, bool | np.bool_) or not isinstance(k, int | np.integer) or k < 2:
            raise ValueError(f"frame_stack: num_frames must be an integer >= 2 (a stack of one frame is the frame: "
                             f"leave frame_stack out), got {k!r}")
        if isinstance(self.axis, bool | np.bool_) or not isinstance(self.axis, int | np.integer):
            raise ValueError(f"frame_stack: axis must be an integer, got {self.axis!r}")
        if self.padding not in PADDINGS:
            raise ValueError(f"frame_stack: padding must be one of {PADDINGS} ('reset': Gymnasium's "
                             f"FrameStackObservation default; 'zero': SB3's VecFrameStack), got {self.padding!r}")

    @classmethod
    def gymnasium(cls, num_frames: int, padding: str = "reset") -> FrameStack:
        """Gymnasium's ``FrameStackObservation(env, num_frames, padding_type=padding)``: shape (k, *frame)."""
        return cls(num_frames, 0, padding)

    @classmethod
    def sb3(cls, num_frames: int, channels_order: str = "last") -> FrameStack:
        """SB3's ``VecFrameStack(venv, num_frames, channels_order)``: frames concatenated along the last axis
        (channels-last images, vectors) or the first (``channels_order="first"``), zeros before an episode."""
        if channels_order not in ("last", "first"):
            raise ValueError(f"channels_order must be 'last' or 'first' (as SB3's VecFrameStack), got "
                             f"{channels_order!r}")
        return cls(num_frames, -1 if channels_order == "last" else 0, "zero")

    def to_json(self) -> dict:
        return {"num_frames": int(self.num_frames), "axis": int(self.axis), "padding": self.padding}

    @staticmethod
    def from_json(d) -> FrameStack:
        if not isinstance(d, Mapping):
            raise ValueError(f"frame_stack entry must be a mapping, got {type(d).__name__}")
        return FrameStack(d.get("num_frames"), d.get("axis", 0), d.get("padding", "reset"))  # type: ignore[arg-type]


def _finite(v: np.ndarray) -> bool:
    """Whether a float array's values are finite (the one-step path's rows: one value, or a compiled pass)."""
    if v.dtype.kind != "f":
        return True
    return math.isfinite(v.item()) if v.size == 1 else all_finite(v)


def as_frame_stack(value) -> FrameStack:
    if isinstance(value, FrameStack):
        return value
    if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
        return FrameStack(int(value))
    raise ValueError(f"frame_stack: expected a number of frames or a FrameStack, got {value!r}")


class StackLayout:
    """One stacked observation column: the stack's shape, the frame's, and the views between them."""

    def __init__(self, column: str, label: str, stack: ColumnSpec, fs: FrameStack):
        self.column, self.label, self.fs = column, label, fs
        shape, k = stack.shape, fs.num_frames
        if not -len(shape) <= fs.axis < len(shape):
            raise ValueError(f"frame_stack for {label}: axis {fs.axis} is out of range for observations of shape "
                             f"{shape}")
        a = fs.axis % len(shape)
        if shape[a] % k:
            raise ValueError(f"frame_stack for {label}: observations of shape {shape} do not hold {k} frames along "
                             f"axis {fs.axis} ({shape[a]} is not a multiple of {k})")
        self.k, self.axis, self.c = k, a, shape[a] // k
        self.stack = stack
        self.frame = ColumnSpec((*shape[:a], self.c, *shape[a + 1:]), stack.dtype)
        self.suffix = label[len("column 'obs'"):]  # "" or " key '<key>'" (for messages about obs / next_obs)
        # the byte geometry of relive.replay.storage._frame_kernels: a stack is pre runs of k pieces of cp bytes
        self.pre = int(np.prod(shape[:a], dtype=np.int64))
        self.cp = int(np.prod(shape[a + 1:], dtype=np.int64)) * self.c * stack.dtype.itemsize
        # interleaved one-byte frames (SB3's channels-last Atari stack) with k in 2, 4, 8: a pixel read as a word
        self.words = k if self.cp == 1 and self.pre > 1 and k in (2, 4, 8) and _frame_kernels.LITTLE else 0

    def frames(self, x: np.ndarray) -> np.ndarray:
        """Stacks [n, *stack] as frames [n, k, *frame] (a view)."""
        s, a = x.shape[1:], self.axis
        g = x.reshape(x.shape[0], *s[:a], self.k, self.c, *s[a + 1:])
        return g if a == 0 else np.moveaxis(g, 1 + a, 1)

    def stacks(self, g: np.ndarray) -> np.ndarray:
        """Frames [n, k, *frame] as stacks [n, *stack] (a view for axis 0, else a copy)."""
        if self.axis:
            g = np.moveaxis(g, 1, 1 + self.axis)
        return g.reshape(g.shape[0], *self.stack.shape)


def stack_layouts(frame_stack, obs_shape, obs_dtype) -> dict[str, StackLayout]:
    """The stacked physical obs columns of a ``frame_stack`` option (flat observations: an int or a FrameStack;
    dict observations: key -> int or FrameStack)."""
    keys, spec, _ = obs_layout(obs_shape, obs_dtype)
    if keys is None:
        assert isinstance(spec, ColumnSpec)  # (flat observations: one spec)
        if isinstance(frame_stack, Mapping):
            raise ValueError(f"frame_stack={dict(frame_stack)!r} names keys, but the observations are flat (shape "
                             f"{spec.shape}): pass frame_stack=k or a FrameStack")
        return {"obs": StackLayout("obs", "column 'obs'", spec, as_frame_stack(frame_stack))}
    if not isinstance(frame_stack, Mapping) or not frame_stack:
        raise ValueError(f"dict observations (keys {list(keys)}): name the stacked key(s), e.g. "
                         f"frame_stack={{{keys[0]!r}: 4}}, got {frame_stack!r}")
    assert isinstance(spec, dict)  # (dict observations: a spec per key)
    unknown = [k for k in frame_stack if k not in keys]
    if unknown:
        raise ValueError(f"frame_stack names unknown observation key(s) {unknown} (keys: {list(keys)})")
    return {f"obs.{k}": StackLayout(f"obs.{k}", f"column 'obs' key {k!r}", spec[k], as_frame_stack(v))
            for k, v in frame_stack.items()}


def _kept_cols(lanes: np.ndarray, q: np.ndarray, gone: np.ndarray, lo: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept entries of a :meth:`FrameStackStorage._resolve` grid that lie in its columns ``lo:``."""
    if lo == 0:
        return lanes, q
    mine = np.broadcast_to(np.arange(gone.shape[1]) >= lo, gone.shape)[gone]
    return lanes[mine], q[mine]


class FrameStackStorage(Storage):
    """A :class:`~relive.replay.storage.Storage` whose stacked observation columns hold one frame a row (see the
    module docstring). ``obs_spec`` is the stacked observation (what writes take and reads return); the physical
    columns (``specs``, ``columns``) hold frames."""

    def __init__(self, capacity: int, obs_shape, action_shape, *, frame_stack, obs_dtype=np.float32,
                 dedup_next_obs: bool | None = None, backend: str = "ram", **kwargs):
        check_backend(backend)
        if dedup_next_obs is False:
            raise ValueError("frame_stack stores next_obs as the next row's frame (dedup_next_obs): "
                             "dedup_next_obs=False contradicts it")
        layouts = stack_layouts(frame_stack, obs_shape, obs_dtype)
        keys, stacked, _ = obs_layout(obs_shape, obs_dtype)
        frames = layouts["obs"].frame if keys is None else {
            k: layouts[f"obs.{k}"].frame if f"obs.{k}" in layouts else s
            for k, s in stacked.items()}  # type: ignore[union-attr]
        super().__init__(capacity, frames, action_shape, obs_dtype=obs_dtype, dedup_next_obs=True, backend=backend,
                         **kwargs)
        self.obs_spec = stacked  # what writes take and reads return (the physical columns hold frames)
        self.frame_stack = layouts
        self._depth = max(lay.k for lay in layouts.values()) - 1  # frames kept per lane below its eviction bound
        # per lane, the frames of the positions [lane_evicted - depth, lane_evicted), at position % depth
        self._kept_pos = np.full((1, self._depth), -1, np.int64)
        self._kept = {c: np.zeros((1, self._depth, *lay.frame.shape), lay.frame.dtype) for c, lay in layouts.items()}
        self._prepared: tuple | None = None  # write(): (the frames dict it made, its validated rows)
        self._pending: dict | None = None  # write(): kept frames to commit once the write succeeded
        self._gather_compiled = _frame_kernels.AVAILABLE and backend == "ram"  # reads: gather_stacks (else NumPy)
        self._step_plan: tuple | None = self._one_step_plan()
        if self._step_plan is not None:
            lay = self._step_plan[1]
            self._step_params = np.array((lay.k, lay.pre, lay.cp, 0, 0, 0, 0, 0, 0, self._depth,
                                          lay.fs.padding == "zero", 0, 0, 0, lay.words), np.int64)
        self._step_views: tuple = (None, None, None)  # _write_one_step: (sources, byte views) of kept / next frames

    # -- configuration ---------------------------------------------------------------------------------
    def frame_stack_option(self):
        """The ``frame_stack`` argument that rebuilds this storage."""
        if self.obs_keys is None:
            return self.frame_stack["obs"].fs
        return {c[len("obs."):]: lay.fs for c, lay in self.frame_stack.items()}

    def config(self) -> dict:
        return super().config() | {"frame_stack": {c: lay.fs.to_json() for c, lay in self.frame_stack.items()}}

    @classmethod
    def from_config(cls, cfg: Mapping, **kwargs) -> FrameStackStorage:
        saved = state_field(cfg, "frame_stack", "storage config")
        if not isinstance(saved, Mapping) or not saved:
            raise ValueError("storage config field 'frame_stack': expected a mapping column -> frame stack")
        fs = {c: FrameStack.from_json(v) for c, v in saved.items()}
        option = fs.get("obs") if "obs_keys" not in cfg else {c[len("obs."):]: v for c, v in fs.items()
                                                             if c.startswith("obs.")}
        if option is None or (isinstance(option, dict) and len(option) != len(fs)):
            raise ValueError(f"storage config field 'frame_stack': columns {list(fs)} do not match the observations")
        out = super().from_config(cfg, frame_stack=option, **kwargs)
        assert isinstance(out, FrameStackStorage)
        return out

    def row_specs(self) -> dict[str, ColumnSpec]:
        specs = super().row_specs()
        specs["obs"] = specs["next_obs"] = self.obs_spec  # (a Stage holds what extend takes: stacks)
        return specs

    def bytes_per_row(self) -> float:
        kept = self._kept_pos.nbytes + sum(a.nbytes for a in self._kept.values())
        return super().bytes_per_row() + kept / max(self.size, 1)

    # -- writing ---------------------------------------------------------------------------------------
    def validate(self, data: Mapping) -> tuple[dict[str, np.ndarray], int]:
        """As :meth:`Storage.validate`, for rows holding stacks: returns the rows with each stack's newest frame (the
        consistency of the stacks with their episodes is :meth:`write`'s check: it needs the stream)."""
        prepared = self._prepared
        if prepared is not None and data is prepared[0]:  # write(): the frames it made and validated a moment ago
            return prepared[1]
        return super().validate(self._unstack(data)[0])

    def write(self, source: int, data: Mapping, stream: int = 0, origin=None) -> np.ndarray:
        """As :meth:`Storage.write`, for rows holding stacks: each stack is checked against its episode (a ValueError
        names the column and row of one that does not follow it; nothing is written) and its newest frame stored."""
        self._check_open()
        if source == ONLINE and origin is None and type(data) is dict and self._step_plan is not None:
            slot = self._write_one_step(data, stream)  # (None: a case for the general path below)
            if slot >= 0:
                return np.array([slot], np.int64)
        frames_data, stacks = self._unstack(data)
        rows, n = super().validate(frames_data)
        if stacks is not None and n:
            self._check_follows(source, stream, stacks, rows, n)
        self._prepared, self._pending = (frames_data, (rows, n)), None
        try:
            slots = super().write(source, frames_data, stream, origin)
        finally:
            self._prepared = None
        if self._pending:
            self._commit_kept(self._pending)
        self._pending = None
        return slots

    # -- the one-step write ------------------------------------------------------------------------------
    def _one_step_plan(self) -> tuple | None:
        """What :meth:`_write_one_step` checks a write against: (the stacked column, its layout, the obs key or None;
        (name, dtype, row shape, finite) of every other column a write holds; (key, dtype, row shape, finite) of the
        obs keys that are not stacked), or None where it never applies (no numba, several stacked keys, a float16
        column to check, a backend other than RAM)."""
        if not _frame_kernels.AVAILABLE or len(self.frame_stack) != 1 or self.backend != "ram":
            return None
        (col, lay), = self.frame_stack.items()
        finite = {name: f for name, _, _, f in self._plan}
        others = tuple((name, self.specs[name].dtype, (1, *self.specs[name].shape), finite[name])
                       for name in self._names if name not in ("obs", "next_obs"))
        plain = () if self.obs_keys is None else tuple(
            (k, self.specs[f"obs.{k}"].dtype, (1, *self.specs[f"obs.{k}"].shape), True)
            for k in self.obs_keys if f"obs.{k}" != col)
        checked = [dt for _, dt, _, f in (*others, *plain) if f] + [lay.stack.dtype]
        if any(dt.kind == "f" and dt.char not in "fd" for dt in checked):
            return None
        key = None if self.obs_keys is None else col[len("obs."):]
        return col, lay, key, others, plain

    def _write_one_step(self, data: dict, stream: int) -> int:
        """:meth:`write` of one online row of the only stream, checked and stored as the general path checks and
        stores it (tests/replay/test_frame_stack.py holds the two equal), the frame work in one compiled call
        (:func:`relive.replay.storage._frame_kernels.one_step`): its slot, or -1 before anything changes for every other
        case -- several streams, a ring of at most k - 1 rows, arrays not as stored (dtype, shape, layout), a value
        that is not finite or a stack that does not follow its episode (the general path then names it)."""
        if self._pos is not None or self._lane_of.get(stream) != 0 or data.keys() != self._name_set:
            return -1
        plan = self._step_plan
        assert plan is not None  # (write() calls this only with a plan)
        col, lay, key, others, plain = plan
        eps, nx = self.episodes, self._nx
        ring, clock, d = self.capacity - self.ring_base, self.num_online_written, self._depth
        if (ring <= d or self.num_offline + clock + 1 >= GEN_MAX or eps.next_id + 1 - eps.first_live_online_id >= ID_MOD
                or eps.is_open(OFFLINE) != -1):
            return -1
        arrays = self._step_arrays(data, plan)
        if arrays is None:
            return -1
        obs, nxt, x, y = arrays
        # where the row goes and what it looks back at
        slot = self.ring_base + clock % ring
        open_id = eps.is_open(ONLINE, 0)
        start = -1 if open_id == -1 else int(eps._rec["start"][eps._row(open_id)])
        tail_entry, tail = -1, nx.tails.get(0)
        gen = self._meta["generation"]
        term, trunc = data["terminated"], data["truncated"]
        if tail is not None:
            t_slot, t_gen = tail
            if (int(gen[t_slot]) == t_gen and not self.columns["terminated"][t_slot]
                    and not self.columns["truncated"][t_slot]):
                tail_entry = nx.entry_of(t_slot)
        new_entry = nx.next_entry()
        kept_src, kept, nxv = self._step_views
        if kept_src is not self._kept[col] or nxv is None or nxv[0] is not nx.values["next_" + col]:
            kept_src = self._kept[col]
            nxv_src = nx.values["next_" + col]
            kept = row_bytes(kept_src[0])
            self._step_views = kept_src, kept, (nxv_src, row_bytes(nxv_src))
            nxv = self._step_views[2]
        params = self._step_params  # (see one_step; the layout's entries set once)
        params[3], params[4], params[5], params[6], params[7], params[8] = slot, clock, start, eps.lane_evicted[0], \
            self.ring_base, ring
        params[11], params[12], params[13] = clock - ring if clock >= ring else -1, new_entry, tail_entry
        frames = self._frame_bytes(col)
        code = _frame_kernels.one_step(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8), frames, kept,
                                       self._kept_pos[0], nxv[1], params)
        if code & 7:  # refused, nothing written: the general path names the column and the row
            return -1
        # the frames are in; the rest of the row, as the general path writes it
        same = bool(code & 8)
        if same and plain:  # the tail's next obs equals this row's obs in every key, not the stack alone
            e = tail_entry
            same = all(nx.values[f"next_obs.{k}"][e].tobytes() == obs[k].tobytes() for k, *_ in plain)
        nx.put_one(slot)  # (first: it takes the entry the kernel wrote)
        if same:
            nx.release_one(tail[0])
        for k, *_ in plain:
            self.columns[f"obs.{k}"][slot] = obs[k][0]
            nx.values[f"next_obs.{k}"][new_entry] = nxt[k][0]
        for name, *_ in others:
            self.columns[name][slot] = data[name][0]
        episode_id = eps.append_lane0_row(clock, bool(term[0]) or bool(trunc[0]))
        self._meta["episode_id"][slot] = episode_id if eps.next_id <= ID_MOD else episode_id % ID_MOD
        self._meta["origin"][slot] = AGENT
        g = int(gen[slot]) + 1
        gen[slot] = g
        nx.tails[0] = (slot, g)
        self._one_lane_advance(1)
        return slot

    def _step_arrays(self, data: dict, plan) -> tuple | None:
        """The one-step path's input checks: (obs, next_obs, the stack's obs, the stack's next_obs) when every array
        is as stored (type, dtype, shape, C-contiguous stacks, finite floats), else None (the general path)."""
        _, lay, key, others, plain = plan
        for name, dtype, shape, finite in others:
            v = data[name]
            if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype or (finite and not _finite(v)):
                return None
        obs, nxt = data["obs"], data["next_obs"]
        if key is not None:
            if type(obs) is not dict or type(nxt) is not dict or obs.keys() != nxt.keys() \
                    or len(obs) != len(self.obs_keys):  # type: ignore[arg-type]
                return None
            for k, dtype, shape, finite in plain:
                for part in (obs, nxt):
                    v = part.get(k)
                    if (type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype
                            or (finite and not _finite(v))):
                        return None
            x, y = obs.get(key), nxt.get(key)
        else:
            x, y = obs, nxt
        spec = lay.stack
        for v in (x, y):
            if (type(v) is not np.ndarray or v.shape[1:] != spec.shape or v.shape[0] != 1 or v.dtype != spec.dtype
                    or not v.flags.c_contiguous or (spec.dtype.kind == "f" and not all_finite(v))):
                return None
        assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray)  # (checked above)
        return obs, nxt, x, y

    def _frame_bytes(self, col: str) -> np.ndarray:
        """The frame column ``col`` as byte rows (the columns never move: made once)."""
        views = self.__dict__.setdefault("_frame_byte_views", {})
        if col not in views:
            views[col] = row_bytes(self.columns[col])
        return views[col]

    def _unstack(self, data: Mapping) -> tuple[Mapping, dict | None]:
        """The rows with every stack replaced by its newest frame (a view), and the stacks as frames [n, k, *frame]
        per column: (obs, next_obs), converted to the column's dtype. Anything malformed but the stacks' shapes is
        left to :meth:`Storage.validate` to name (None for the stacks)."""
        if not isinstance(data, Mapping) or "obs" not in data or "next_obs" not in data:
            return data, None
        out = dict(data)
        stacks: dict = {}
        for logical in ("obs", "next_obs"):
            value = data[logical]
            if self.obs_keys is not None:
                if not isinstance(value, Mapping) or any(c[len("obs."):] not in value for c in self.frame_stack):
                    return data, None
                value = out[logical] = dict(value)
            for col, lay in self.frame_stack.items():
                key = col[len("obs."):]
                arr = as_numpy(value if self.obs_keys is None else value[key])
                label = f"column {logical!r}" + ("" if self.obs_keys is None else f" key {key!r}")
                if arr.ndim == 0 or arr.shape[1:] != lay.stack.shape:
                    single = arr.ndim and np.prod(arr.shape[1:]) == np.prod(lay.frame.shape)
                    hint = " (single frames? pass the env's stacked observation)" if single else ""
                    raise ValueError(f"{label}: expected stacks of {lay.k} frames, shape (n, "
                                     f"{', '.join(map(str, lay.stack.shape))}), got {arr.shape}{hint}")
                arr = convert(col, arr, lay.stack.dtype, label)
                g = lay.frames(arr)
                stacks.setdefault(col, []).append(g)
                newest = g[:, lay.k - 1]
                if self.obs_keys is None:
                    out[logical] = newest
                else:
                    value[key] = newest
        for col, (x, y) in stacks.items():
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"{self.frame_stack[col].label}: {x.shape[0]} obs stacks but {y.shape[0]} next_obs "
                                 "stacks")
        return out, stacks

    def _check_follows(self, source: int, stream: int, stacks: dict, rows: dict, n: int) -> None:
        """Refuse stacks that do not follow their episode (see the module docstring); nothing has changed yet."""
        end = rows["terminated"] | rows["truncated"]
        open_id, t0, online = -1, 0, False
        if source == OFFLINE:
            open_id, t0 = self.episodes.is_open(OFFLINE), self.num_offline
        elif source == ONLINE and stream in self._lane_of:
            lane = self._lane_of[stream]
            open_id, online = self.episodes.is_open(ONLINE, lane), True
            t0 = (lane << LANE_BITS) + self.lane_written[lane]
        first = np.zeros(n, bool)  # rows that start an episode
        first[0] = open_id == -1
        first[1:] = end[:-1]
        before = None
        if open_id != -1:  # the first row continues a stored episode: its older frames are stored (or kept)
            start = self.episodes.start_of(np.array([open_id]))
            before = self._resolve(np.array([t0]), start, np.array([online]), self._depth, 0)
        for col, (x, y) in stacks.items():
            lay, k = self.frame_stack[col], self.frame_stack[col].k
            bad = np.zeros(n, bool)
            if n > 1:  # within the write: row i's older frames are row i - 1's newer ones
                bad[1:] = differs(x[1:, : k - 1], x[:-1, 1:]) & ~first[1:]
            if before is not None:
                bad[0] = bool(differs(x[:1, : k - 1], self._older(col, before, k))[0])
            if first.any():  # an episode's first row: its older frames are padding
                at = np.flatnonzero(first)
                pad = (np.broadcast_to(x[at, k - 1 : k], x[at, : k - 1].shape) if lay.fs.padding == "reset"
                       else np.zeros_like(x[at, : k - 1]))
                bad[at] |= differs(x[at, : k - 1], pad)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                if first[i]:
                    what = (f"it starts an episode, so its {k - 1} older frames must be padding ("
                            + ("copies of its newest frame: padding 'reset'" if lay.fs.padding == "reset" else
                               "zeros: padding 'zero'") + ")")
                else:
                    what = (f"its {k - 1} older frames must be the episode's previous {k - 1} frames (the "
                            + ("stored rows'" if i == 0 else "previous row's newer frames") + ")")
                raise ValueError(f"column 'obs'{lay.suffix} row {i}: the stack does not follow its episode: {what}; "
                                 f"write each stream's steps in time order, as the env stacked them ({lay.fs})")
            bad = differs(y[:, : k - 1], x[:, 1:])
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"column 'next_obs'{lay.suffix} row {i}: the stack does not follow its episode: its "
                                 f"{k - 1} older frames must be the obs stack's {k - 1} newer ones ({lay.fs})")

    def _dedup_before_write(self, tail_key: int, rows: dict, end: np.ndarray, slots: np.ndarray,
                            skip: int) -> np.ndarray:
        """Before an online write overwrites slots: the frames to keep below each lane's new eviction bound (from
        the rows about to be overwritten, the kept frames, or rows of this write that are never stored), committed
        by :meth:`write` once the write succeeded."""
        if tail_key != -1:  # (an online write; offline rows overwrite nothing)
            self._pending = self._frames_to_keep(tail_key, rows, slots, skip)
        return super()._dedup_before_write(tail_key, rows, end, slots, skip)

    def _frames_to_keep(self, lane: int, rows: dict, slots: np.ndarray, skip: int) -> dict:
        d, base = self._depth, self.ring_base
        old = slots[slots - base < self.num_online]  # slots that hold a row now (the ring fills in order)
        bounds: dict[int, int] = {}
        if old.size:
            pos = self.position_of(old)
            lanes = pos >> LANE_BITS
            for lane_ in np.unique(lanes).tolist():
                bounds[lane_] = int(pos[lanes == lane_].max()) + 1
        start = (lane << LANE_BITS) + self.lane_written[lane]
        if skip:  # rows of this write that the ring overwrites at once
            bounds[lane] = max(bounds.get(lane, 0), start + skip)
        pending = {}
        for lane_, bound in bounds.items():
            # the positions newly below the bound; those kept already stay at their entries (position % depth)
            evicted = int(self.episodes.lane_evicted[lane_])
            q = np.arange(max(bound - d, evicted, lane_ << LANE_BITS), bound, dtype=np.int64)
            new = q >= (lane_ << LANE_BITS) + self.lane_written[lane_]  # rows of this write, never stored
            frames = {}
            for col in self.frame_stack:
                if not new.any():
                    frames[col] = self.columns[col].take(self.online_slot(q), axis=0)
                    continue
                f = np.empty((q.size, *self.specs[col].shape), self.specs[col].dtype)
                f[~new] = self.columns[col].take(self.online_slot(q[~new]), axis=0)
                f[new] = rows[col][q[new] - start]
                frames[col] = f
            pending[lane_] = (q, frames)
        return pending

    def _commit_kept(self, pending: dict) -> None:
        lanes = self._kept_pos.shape[0]
        need = max(pending) + 1
        if need > lanes:  # a new stream: room for its lane
            grow = max(need, 2 * lanes)
            self._kept_pos = np.concatenate((self._kept_pos, np.full((grow - lanes, self._depth), -1, np.int64)))
            self._kept = {c: np.concatenate((a, np.zeros((grow - lanes, *a.shape[1:]), a.dtype)))
                          for c, a in self._kept.items()}
        for lane, (q, frames) in pending.items():
            at = q % self._depth
            self._kept_pos[lane, at] = q
            for col, f in frames.items():
                self._kept[col][lane, at] = f

    def _kept_frames(self, col: str, lanes: np.ndarray, q: np.ndarray) -> np.ndarray:
        at = q % self._depth
        if (self._kept_pos[lanes, at] != q).any():  # (an invariant: would be a bug, never a silent wrong frame)
            raise RuntimeError(f"frame_stack: an overwritten frame a stored row needs was not kept (positions "
                               f"{q[self._kept_pos[lanes, at] != q][:4].tolist()}); please report this")
        return self._kept[col][lanes, at]

    # -- reading ---------------------------------------------------------------------------------------
    def _resolve(self, pos: np.ndarray, start: np.ndarray, online: np.ndarray | None, depth: int, shift: int):
        """Where the frames of positions ``pos + shift - depth .. pos + shift - 1`` (per row: [B, depth]) are, for rows
        at positions ``pos`` of episodes starting at ``start`` (``online``: which rows are online; None: none is):
        (slots in the frame columns, which entries come from the kept frames (their lanes and positions; None: none
        does), which are before the episode's start (None: none is)). Padding entries point
        at the episode's first frame (``reset``), which is stored or kept whenever a stored row needs it."""
        q = pos[:, None] + (np.arange(shift - depth, shift, dtype=np.int64))[None, :]
        before = q < start[:, None]
        pad = before if before.any() else None
        if pad is not None:
            q = np.where(pad, start[:, None], q)
        if online is None or not online.any():
            return q, None, pad
        if self.episodes.multi:
            lane = q >> LANE_BITS
            gone = online[:, None] & (q < self.episodes.lane_evicted[np.where(online[:, None], lane, 0)])
        else:
            gone = online[:, None] & (q < self.episodes.lane_evicted[0])
        any_gone = gone.any()
        slots = self.online_slot(np.where(gone, pos[:, None], q) if any_gone else q)
        if not online.all():
            slots = np.where(online[:, None], slots, q)
        kept = (q[gone] >> LANE_BITS, q[gone], gone) if any_gone else None
        return slots, kept, pad

    def _grid(self, flat: np.ndarray, what: str) -> tuple:
        """The grid of frame slots the rows ``flat`` read, oldest first: the d positions before the row's
        (pos - d .. pos - 1; for "next": pos + 1 - d .. pos), then the row's own frame ("obs", "pair") and its next
        frame ("next", "pair"); obs reads columns [lo, lo + k), next_obs [lo + 1, lo + k + 1) ("pair") of one gather.
        Returns (the slots [B, width], the kept entries (see :meth:`_resolve`; None: none), the padding entries
        [B, d] (None: none), the rows with an explicit next frame and their entries (None: none))."""
        b, d = flat.size, self._depth
        pos = self.position_of(flat)
        start = self.episodes.start_of(self.episode_ids(flat))
        online = flat >= self.ring_base if self.num_online_written else None
        grid, kept, pad = self._resolve(pos, start, online, d, 1 if what == "next" else 0)
        width = d + 2 if what == "pair" else d + 1
        full = np.empty((b, width), np.int64)
        full[:, :d] = grid
        explicit = None
        if what != "next":
            full[:, d] = flat
        if what != "obs":  # the next frame: the next row's, or an explicit copy (relive.replay.storage.next_obs)
            entry = self._nx.entries_of(flat)
            ex = entry >= 0
            has = ex.any()
            full[:, width - 1] = (np.where(ex, flat, self.next_slot(flat)) if has else self.next_slot(flat))
            explicit = (np.flatnonzero(ex), entry[ex]) if has else None
        return full, kept, pad, explicit

    def _pair_grid(self, flat: np.ndarray) -> tuple | None:
        """:meth:`_grid` for "pair" in one compiled pass (:func:`relive.replay.storage._frame_kernels.pair_grid`):
        RAM columns, episode ids stored whole; None where it does not apply (else, and for batches that read an
        overwritten, kept frame: the NumPy path)."""
        ids = self._meta["episode_id"]
        if self.episodes.next_id > ID_MOD or type(ids) is not np.ndarray:
            return None
        b, d = flat.size, self._depth
        id_base, id_shift, starts = self.episodes.start_table()
        multi = self._pos is not None
        params = np.array((self.ring_base, self.capacity, self.num_online_written, max(self.online_capacity, 1),
                           id_base, id_shift, d, multi, LANE_BITS), np.int64)
        full, pad = np.empty((b, d + 2), np.int64), np.empty((b, d), np.bool_)
        code = _frame_kernels.pair_grid(flat, ids, starts, self._nx.bits, self._pos if multi else _NO_POS,
                                        self._qmap if multi else _NO_QMAP, self.episodes.lane_evicted, params, full,
                                        pad)
        if code & 2:
            return None
        explicit = None
        if code & 4:
            ex = np.flatnonzero(self._nx.has(flat))
            explicit = (ex, self._nx.entries_of(flat[ex]))
        return full, None, pad if code & 1 else None, explicit

    def _older(self, col: str, grid: tuple, k: int) -> np.ndarray:
        """The last ``k - 1`` frames of a :meth:`_resolve` grid, padding applied: [B, k - 1, *frame]."""
        slots, kept, pad = grid
        g = self.columns[col].take(slots, axis=0)
        if kept is not None:
            lanes, q, gone = kept
            g[gone] = self._kept_frames(col, lanes, q)
        if pad is not None and self.frame_stack[col].fs.padding == "zero":
            g[pad] = 0
        return g if k - 1 == self._depth else g[:, self._depth - (k - 1):]

    def read(self, name: str, slots: np.ndarray, keys=None):
        """As :meth:`Storage.read`; ``obs`` / ``next_obs`` come back as stacks, rebuilt from the frames: one gather of
        k frames a row from the frame column into the stack's memory (a view for ``axis`` 0), patched where a frame
        is kept, padding or an explicit next frame."""
        if name != "obs" and name != "next_obs":
            return super().read(name, slots, keys)
        return self._read_stacks(np.asarray(slots, np.int64), keys, "next" if name == "next_obs" else "obs")

    def read_pair(self, slots: np.ndarray, last: np.ndarray | None = None):
        """``(read("obs", slots), read("next_obs", last))`` (``last``: the rows whose next_obs; default ``slots``).
        For one-step rows (``last`` is ``slots``) both come from one gather of ``k + 1`` frames a row (a row's
        next_obs stack is its obs stack shifted by one frame). Stacks along their first axis (Gymnasium's layout,
        SB3's channels-first): ``obs`` and ``next_obs`` are views of the same memory, sharing ``k - 1`` frames a row
        (copy one before writing into it in place), 5/8 of the bytes two gathers copy for k = 4. Interleaved stacks
        whose frames are pieces of several bytes (a channels-last camera, SB3's (84, 84, 9)) with numba: two
        contiguous arrays written in one compiled pass (NumPy's strided copy of 3-byte pieces is several times
        slower); one-byte pieces (SB3's Atari (84, 84, 4)) and runs without numba: views of one gather as above, the
        layout made by NumPy (measured faster than the compiled pass there: docs/benchmarks.md). Either way, treat
        them as possibly sharing memory."""
        slots = np.asarray(slots, np.int64)
        if last is not None and last is not slots and not np.array_equal(last, slots):
            return self.read("obs", slots), self.read("next_obs", last)
        return self._read_stacks(slots, None, "pair")

    def _read_stacks(self, slots: np.ndarray, keys, what: str):
        """``what``: "obs", "next" (next_obs) or "pair" (both, from one grid; see :meth:`read_pair`)."""
        dict_obs = self.obs_keys is not None
        cols = [c for c in self.frame_stack if keys is None or c[len("obs."):] in keys]
        out: dict = {}
        out2: dict = {}
        if dict_obs:
            others = [k for k in (self.obs_keys if keys is None else keys)  # type: ignore[union-attr]
                      if f"obs.{k}" not in self.frame_stack]
            if others:
                if what != "next":
                    out = super().read("obs", slots, others)
                if what != "obs":
                    out2 = super().read("next_obs", slots, others)
        if not cols:
            return out2 if what == "next" else (out, out2) if what == "pair" else out
        shape, flat = slots.shape, slots.reshape(-1)
        b, d = flat.size, self._depth
        got = self._pair_grid(flat) if what == "pair" and self._gather_compiled else None
        full, kept, pad, explicit = got if got is not None else self._grid(flat, what)
        compiled = self._gather_compiled and b > 0
        for col in cols:
            lay = self.frame_stack[col]
            k, lo = lay.k, d - (lay.k - 1)
            if compiled and lay.pre > 1 and not lay.words:  # (see read_pair: where the compiled gather wins)
                got = self._gather_col(col, full[:, lo:] if lo else full, kept, pad, explicit, lo, what == "pair")
                if what == "pair":
                    a, n = (x.reshape(*shape, *lay.stack.shape) for x in got)
                    if not dict_obs:
                        return a, n
                    out[col[len("obs."):]], out2[col[len("obs."):]] = a, n
                    continue
                stacks = got[0].reshape(*shape, *lay.stack.shape)
                if not dict_obs:
                    return stacks
                (out2 if what == "next" else out)[col[len("obs."):]] = stacks
                continue
            g = self.columns[col].take(full[:, lo:] if lo else full, axis=0, mode="clip")  # [B, w, *frame]
            if kept is not None:
                lanes, q, gone = kept
                g[:, : k - 1][gone[:, lo:]] = self._kept_frames(col, *_kept_cols(lanes, q, gone, lo))
            if pad is not None and lay.fs.padding == "zero":
                g[:, : k - 1][pad[:, lo:]] = 0
            if explicit is not None:
                g[explicit[0], -1] = self._nx.values["next_" + col][explicit[1]]
            if what == "pair":
                a = lay.stacks(g[:, :k]).reshape(*shape, *lay.stack.shape)
                n = lay.stacks(g[:, 1:]).reshape(*shape, *lay.stack.shape)
                if not dict_obs:
                    return a, n
                out[col[len("obs."):]], out2[col[len("obs."):]] = a, n
                continue
            stacks = lay.stacks(g).reshape(*shape, *lay.stack.shape)
            if not dict_obs:
                return stacks
            (out2 if what == "next" else out)[col[len("obs."):]] = stacks
        names = self.obs_keys if keys is None else keys
        if what == "pair":
            return {k: out[k] for k in names}, {k: out2[k] for k in names}  # type: ignore[union-attr]
        return {k: (out2 if what == "next" else out)[k] for k in names}  # type: ignore[union-attr]

    def _gather_col(self, col: str, slots: np.ndarray, kept, pad, explicit, lo: int, pair: bool) -> tuple:
        """:meth:`_read_stacks`'s gather for one column in one compiled pass
        (:func:`relive.replay.storage._frame_kernels.gather_stacks`): the frames of ``slots`` [B, w] (a grid's columns
        ``lo:``), patched where a frame is kept, padding or an explicit next frame, written as stacks; returns the
        stacks of frames 0 .. k-1 and, for a pair, of frames 1 .. k (two arrays; interleaved layouts only)."""
        lay = self.frame_stack[col]
        k, b, w = lay.k, slots.shape[0], slots.shape[1]
        row = slots.copy()
        which = np.zeros(row.shape, np.int8)
        if kept is not None:
            lanes, q, gone = kept
            lanes, q = _kept_cols(lanes, q, gone, lo)
            at = q % self._depth
            if (self._kept_pos[lanes, at] != q).any():  # (as _kept_frames: a bug, never a silent wrong frame)
                self._kept_frames(col, lanes, q)
            mine = gone[:, lo:]
            row[:, : k - 1][mine] = lanes * self._depth + at
            which[:, : k - 1][mine] = 1
        if pad is not None and lay.fs.padding == "zero":
            which[:, : k - 1][pad[:, lo:]] = 2
        if explicit is not None:
            row[explicit[0], -1] = explicit[1]
            which[explicit[0], -1] = 3
        f = lay.pre * lay.cp
        kept_bytes = row_bytes(self._kept[col].reshape(-1, *lay.frame.shape))
        nxv_bytes = row_bytes(self._nx.values["next_" + col])
        out_a = np.empty((b, k * f), np.uint8)
        out_b = np.empty((b if pair else 0, k * f), np.uint8)
        scratch = np.empty((w, f), np.uint8)
        if _frame_kernels.gather_stacks(self._frame_bytes(col), kept_bytes, nxv_bytes, which, row, k, lay.pre, lay.cp,
                                        out_a, out_b, scratch) < 0:
            raise RuntimeError("frame_stack: a frame index out of range in a stacked read; please report this")
        dt = lay.stack.dtype
        return (out_a.view(dt).reshape(b, *lay.stack.shape),) + ((out_b.view(dt).reshape(b, *lay.stack.shape),)
                                                                 if pair else ())

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self, offline: str = "copy") -> dict:
        """As :meth:`Storage.state_dict` (frames, not stacks) plus the frames kept below each lane's eviction bound."""
        keep = self._kept_pos >= 0
        lanes, at = np.nonzero(keep)
        return super().state_dict(offline) | {"frame_stack_kept": {
            "lane": lanes.astype(np.int64), "position": self._kept_pos[lanes, at],
            "frames": {c: a[lanes, at] for c, a in self._kept.items()}}}

    def load_state_dict(self, state: Mapping) -> None:
        """As :meth:`Storage.load_state_dict`, and the kept frames, checked: one per position each lane's stored rows
        may look back at below its eviction bound, no more, no less."""
        super().load_state_dict(state)
        owner = "storage state frame_stack_kept"
        kept = state_field(state, "frame_stack_kept", "storage state")
        lanes = state_array(kept, "lane", owner, dtype=np.int64, low=0, high=max(len(self.lanes) - 1, 0))
        q = state_array(kept, "position", owner, length=lanes.size, dtype=np.int64, low=0)
        d = self._depth
        want = []
        for lane in range(len(self.lanes)):
            bound = int(self.episodes.lane_evicted[lane])
            want += [(lane, p) for p in range(max(bound - d, lane << LANE_BITS), bound)]
        if sorted(zip(lanes.tolist(), q.tolist(), strict=True)) != want:
            raise ValueError(f"{owner}: positions {q[:8].tolist()} of lanes {lanes[:8].tolist()} are not the {d} "
                             "frames below each stream's eviction bound that its stored rows look back at")
        frames = state_field(kept, "frames", owner)
        self._kept_pos = np.full((max(len(self.lanes), 1), d), -1, np.int64)
        self._kept = {}
        for col, lay in self.frame_stack.items():
            f = np.asarray(state_field(frames, col, f"{owner} frames"))
            if f.shape != (lanes.size, *lay.frame.shape) or f.dtype != lay.frame.dtype:
                raise ValueError(f"{owner} frames {col!r}: shape {f.shape} dtype {f.dtype}, expected "
                                 f"{(lanes.size, *lay.frame.shape)} {lay.frame.dtype}")
            if f.dtype.kind == "f" and not np.isfinite(f).all():
                raise ValueError(f"{owner} frames {col!r}: a value is not finite")
            self._kept[col] = np.zeros((self._kept_pos.shape[0], d, *lay.frame.shape), lay.frame.dtype)
            self._kept[col][lanes, q % d] = f
        self._kept_pos[lanes, q % d] = q


__all__ = ["FrameStack", "FrameStackStorage", "StackLayout", "stack_layouts"]
