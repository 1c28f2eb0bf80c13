"""Datasets of single frames into a frame-stack buffer: a camera key declared a stack of k frames
(``read_lerobot(path, frame_stack={"images_top": 3})``, ``read_minari(id, frame_stack=...)``, or the rows of any
loader) is stored one frame a row by a :class:`~relive.replay.ReplayBuffer` with ``frame_stack``
(:mod:`relive.replay.storage.frame_stack`), which rebuilds every stack when it is sampled.

Datasets store one frame per step; a policy that reads k stacked frames needs, at step t of an episode, the frames
of steps ``t - k + 1 .. t`` (and for ``next_obs`` ``t - k + 2 .. t`` and the step's next frame). Steps before the
episode's first are padding as the declared :class:`~relive.replay.storage.FrameStack` says: ``"reset"`` (the
default: copies of the episode's first frame, Gymnasium's ``FrameStackObservation`` default and TorchRL's
``CatFrames(padding="same")``) or ``"zero"`` (SB3's ``VecFrameStack``). A stack is the k frames concatenated along
the declared axis, newest last: ``FrameStack(k)`` (axis 0) turns a uint8 [C, H, W] camera into [k * C, H, W], what
relive's CNN encoders read (and TorchRL's ``CatFrames(k, dim=-3)`` makes).

The stacks exist only briefly: :func:`add_offline_stacked` builds them a chunk of rows at a time (``chunk_rows``
rows, ``2 k`` frames each) and the buffer keeps each frame once, checking every stack against its episode.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from relive.data.rows import check_columns, split_episodes
from relive.replay import ReplayBuffer
from relive.replay.storage import ColumnSpec, FrameStack
from relive.replay.storage.frame_stack import StackLayout, as_frame_stack

CHUNK_ROWS = 512  # rows whose stacks are built at once (84x84x3 frames, k = 3: 2 x 512 x 3 x 21 KB = 65 MB)


def _as_fs(value, where: str) -> FrameStack:
    if isinstance(value, Mapping):  # (a FrameStack's to_json(), as a loader's meta records it)
        return FrameStack.from_json(value)
    try:
        return as_frame_stack(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def frame_stacks_of(rows: Mapping, frame_stack) -> dict[str | None, FrameStack]:
    """The declared stacks of single-frame ``rows``: key -> FrameStack (flat observations: the key None). For dict
    observations ``frame_stack`` maps camera keys to a count, a FrameStack or its JSON; flat ones take one of those."""
    obs = rows["obs"]
    if isinstance(obs, Mapping):
        if not isinstance(frame_stack, Mapping) or not frame_stack or "num_frames" in frame_stack:
            raise ValueError(f"dict observations (keys {sorted(obs)}): name the stacked key(s), e.g. "
                             f"frame_stack={{{sorted(obs)[0]!r}: 3}}, got {frame_stack!r}")
        unknown = [k for k in frame_stack if k not in obs]
        if unknown:
            raise ValueError(f"frame_stack names unknown observation key(s) {unknown} (keys: {sorted(obs)})")
        out: dict[str | None, FrameStack] = {k: _as_fs(v, f"frame_stack key {k!r}") for k, v in frame_stack.items()}
    else:
        if isinstance(frame_stack, Mapping) and "num_frames" not in frame_stack:
            raise ValueError(f"frame_stack={dict(frame_stack)!r} names keys, but the observations are flat: pass a "
                             "number of frames or a FrameStack")
        out = {None: _as_fs(frame_stack, "frame_stack")}
    for key, fs in out.items():
        frame = np.asarray(obs if key is None else obs[key]).shape[1:]
        if not -len(frame) <= fs.axis < len(frame):
            where = "observations" if key is None else f"observation key {key!r}"
            raise ValueError(f"frame_stack for {where}: axis {fs.axis} is out of range for frames of shape {frame}")
    return out


def _stack_shape(frame: tuple, fs: FrameStack) -> tuple:
    a = fs.axis % len(frame)
    return (*frame[:a], frame[a] * fs.num_frames, *frame[a + 1:])


def stacked_obs_spec(rows: Mapping, frame_stack):
    """``(obs_shape, obs_dtype)`` for the :class:`~relive.replay.ReplayBuffer` that stores single-frame ``rows`` with
    ``frame_stack``: the declared keys' shapes hold k frames (dict observations: ``{key: (shape, dtype)}``)."""
    stacks = frame_stacks_of(rows, frame_stack)
    obs = rows["obs"]
    if not isinstance(obs, Mapping):
        arr = np.asarray(obs)
        return _stack_shape(arr.shape[1:], stacks[None]), arr.dtype
    spec = {}
    for key, v in obs.items():
        arr = np.asarray(v)
        shape = _stack_shape(arr.shape[1:], stacks[key]) if key in stacks else arr.shape[1:]
        spec[key] = (shape, arr.dtype)
    return spec, None


def frame_stack_buffer(rows: Mapping, frame_stack, online_capacity: int, **buffer_kwargs) -> ReplayBuffer:
    """A :class:`~relive.replay.ReplayBuffer` holding single-frame dataset ``rows`` as its offline prefix, the
    declared keys as frame stacks (each frame stored once), with room for ``online_capacity`` online rows
    (``buffer_kwargs``: ``sampler``, ``seed``, ``n_step``, ``backend``...)."""
    n = check_columns(dict(rows), "frame_stack_buffer rows")
    obs_shape, obs_dtype = stacked_obs_spec(rows, frame_stack)
    stacks = frame_stacks_of(rows, frame_stack)
    option = stacks[None] if None in stacks else dict(stacks)
    action = np.asarray(rows["action"])
    buf = ReplayBuffer(online_capacity + n, obs_shape, action.shape[1:], action_dtype=action.dtype,
                       frame_stack=option, **({} if obs_dtype is None else {"obs_dtype": obs_dtype}) | buffer_kwargs)
    add_offline_stacked(buf, rows, chunk_rows=CHUNK_ROWS)
    return buf


def add_offline_stacked(buffer: ReplayBuffer, rows: Mapping, *, chunk_rows: int = CHUNK_ROWS) -> np.ndarray:
    """Append single-frame dataset ``rows`` to a frame-stack ``buffer``'s offline prefix: the stacks of the keys the
    buffer declares (``frame_stack``) are built from each episode's frames, padded before its first step, a chunk
    of ``chunk_rows`` rows at a time (the buffer keeps each frame once). Returns the slots."""
    option = getattr(buffer.storage, "frame_stack_option", None)
    if option is None:
        raise ValueError("add_offline_stacked: the buffer has no frame_stack (build it with ReplayBuffer(..., "
                         "frame_stack=...) or frame_stack_buffer)")
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")
    n = check_columns(dict(rows), "add_offline_stacked rows")
    stacks = frame_stacks_of(rows, option())
    start = np.zeros(n, np.int64)  # each row's episode start
    for sl in split_episodes(dict(rows)):
        start[sl] = sl.start
    slots = []
    for a in range(0, n, chunk_rows):
        b = min(a + chunk_rows, n)
        slots.append(buffer.add_offline(_chunk(rows, stacks, start, a, b)))
    return np.concatenate(slots) if slots else np.zeros(0, np.int64)


def _chunk(rows: Mapping, stacks: dict, start: np.ndarray, a: int, b: int) -> dict:
    """Rows ``a:b`` with the declared keys' obs / next_obs as stacks."""
    out = {c: (np.asarray(v)[a:b] if not isinstance(v, Mapping) else {k: np.asarray(x)[a:b] for k, x in v.items()})
           for c, v in rows.items()}
    for key, fs in stacks.items():
        obs = np.asarray(rows["obs"] if key is None else rows["obs"][key])
        nxt = np.asarray(rows["next_obs"] if key is None else rows["next_obs"][key])
        k, frame = fs.num_frames, obs.shape[1:]
        lay = StackLayout("obs", "column 'obs'", ColumnSpec(_stack_shape(frame, fs), obs.dtype), fs)
        i = np.arange(a, b)
        s = start[a:b, None]
        q = i[:, None] + np.arange(-(k - 1), 1)[None, :]  # the frames' rows, oldest first
        pad = q < s
        # obs: the rows t - k + 1 .. t; next_obs: t - k + 2 .. t, then the row's own next frame
        g = obs[np.where(pad, s, q)]
        h = np.empty_like(g)
        h[:, : k - 1] = g[:, 1:]
        h[:, k - 1] = nxt[a:b]
        if fs.padding == "zero":
            g[pad] = 0
            h[:, : k - 1][pad[:, 1:]] = 0
        for col, frames in (("obs", g), ("next_obs", h)):
            stacked = np.ascontiguousarray(lay.stacks(frames))
            if key is None:
                out[col] = stacked
            else:
                out[col][key] = stacked
    return out


def declared(rows: Mapping, frame_stack, where: str):
    """A loader's ``frame_stack=`` checked against its rows, as JSON for its metadata (``meta["frame_stack"]``:
    key -> FrameStack JSON, or one FrameStack JSON for flat observations); None when not given."""
    if frame_stack is None:
        return None
    try:
        stacks = frame_stacks_of(rows, frame_stack)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if None in stacks:
        return stacks[None].to_json()
    return {k: fs.to_json() for k, fs in stacks.items()}


__all__ = ["add_offline_stacked", "declared", "frame_stack_buffer", "frame_stacks_of", "stacked_obs_spec"]
