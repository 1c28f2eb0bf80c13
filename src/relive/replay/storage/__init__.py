"""The replay storage and its parts: columns of rows in a frozen offline segment and an online ring
(:class:`Storage`), and what it is made of, one file each.

    storage.py       Storage: the slots, the write paths, checkpoints (state_dict / load_state_dict)
    layout.py        the column layout: column specs, flat or dict observations, core and bookkeeping columns
    bookkeeping.py   per-slot bookkeeping (episode id, generation stamp, origin; the rest computed)
    episodes.py      the episode index over logical positions (lanes), across ring wraps
    streams.py       several interleaved writers (vector envs, collectors): a lane each
    small_writes.py  a few rows of the only stream: the short write path (_write_kernels.py: its compiled commit)
    next_obs.py      next observations without duplicated frames (dedup_next_obs)
    frame_stack.py   frame stacks stored once (FrameStackStorage)
    memmap_files.py  the memmap backend's files; torch_column.py: the torch backend's columns (imports torch)
    offline_hash.py  the offline segment's fingerprint (offline="reference" checkpoints)
    consistency.py   the invariants a loaded storage is checked against
    view.py          what a sampler may read of a storage (StorageView)

Samplers (:mod:`relive.replay.samplers`) read a storage through :class:`StorageView`; the buffer
(:mod:`relive.replay.buffer`) binds a storage to a sampler. Nothing here imports a sampler or the buffer.
"""

from relive.replay.storage.episodes import LANE_BITS, LANE_MASK, EpisodeIndex, EpisodeView
from relive.replay.storage.frame_stack import FrameStack, FrameStackStorage
from relive.replay.storage.layout import ColumnSpec, as_numpy, convert
from relive.replay.storage.storage import Storage
from relive.replay.storage.view import StorageView

__all__ = ["Storage", "FrameStackStorage", "FrameStack", "ColumnSpec", "StorageView", "EpisodeIndex", "EpisodeView",
           "LANE_BITS", "LANE_MASK", "as_numpy", "convert"]
