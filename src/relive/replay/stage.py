"""Stage: steps of one or more streams gathered in place, then written to the buffer with one call.

    stage = buf.stage(streams=4, rows=64)   # e.g. a vector env of 4: stream i is env i
    stage.columns["obs"][:, k] = obs        # step k of every stream; each column is (streams, rows, *row shape)
    ...                                     # action, reward, next_obs, terminated, truncated (and extra columns)
    stage.commit(k + 1)                     # = buf.extend({name: col[i, :k + 1]}, stream=i) for each stream i

The columns have the storage's dtypes and row shapes, so a commit needs no conversion: with numba and the common
case (a stream's rows in consecutive slots of a RAM or memmap buffer, one stream so far) it is one compiled call that
checks the rows are finite, copies every column and writes the rows' bookkeeping and episode records
(:mod:`relive.replay.storage._write_kernels`); every other case goes through ``extend``. Either way a commit stores
exactly what ``extend`` of the same rows stores (tests/replay/test_stage.py), and rows ``extend`` refuses (NaN, ...) are
refused the same way, with nothing written for that stream (the streams before it stay written); so is a flag column
holding a byte other than 0 / 1 (written through a byte view), naming column and row. Commit before
anything reads the buffer (a sample sees committed rows only) and before any other write of the same stream. Flat
observations only (a dict-observation buffer: ``extend``).
"""

from __future__ import annotations

import numpy as np

from relive.replay.samplers import Sampler
from relive.replay.storage import _write_kernels
from relive.types import ONLINE


class Stage:
    def __init__(self, buffer, streams=1, rows: int = 64) -> None:
        if isinstance(rows, bool | np.bool_) or not isinstance(rows, int | np.integer) or rows < 1:
            raise ValueError(f"rows must be a positive integer, got {rows!r}")
        if isinstance(streams, int | np.integer) and not isinstance(streams, bool | np.bool_):
            if streams < 1:
                raise ValueError(f"streams must be a positive number of streams or a sequence of stream ids, got "
                                 f"{streams!r}")
            streams = range(int(streams))
        self.streams = tuple(streams)
        if not self.streams or len(set(self.streams)) != len(self.streams):
            raise ValueError(f"streams must be distinct stream ids, at least one, got {streams!r}")
        st = buffer.storage
        if st.obs_keys is not None:
            raise ValueError("a stage holds flat observations; this buffer stores dict observations (keys "
                             f"{list(st.obs_keys)}): write them with extend")
        self.buffer = buffer
        self.rows = int(rows)
        specs = st.row_specs()
        self.columns: dict[str, np.ndarray] = {
            name: np.zeros((len(self.streams), self.rows, *spec.shape), spec.dtype) for name, spec in specs.items()}
        self._views = self._compiled_views(st)

    def _compiled_views(self, st) -> list | None:
        """Per stream, what the compiled commit reads: every column's byte view (in the storage's column order) and
        the finite-checked float columns as 2-D views; None without numba or with a float column it cannot check."""
        if not _write_kernels.AVAILABLE:
            return None
        checked = st.finite_checked()
        if any(self.columns[n].dtype.char not in "fd" for n in checked):  # (float16: NumPy's check, via extend)
            return None
        views = []
        for i in range(len(self.streams)):
            src = tuple(_write_kernels.row_bytes(self.columns[n][i]) for n in st.columns)
            by_dtype: dict[np.dtype, list[np.ndarray]] = {np.dtype(np.float32): [], np.dtype(np.float64): []}
            for n in checked:
                by_dtype[self.columns[n].dtype].append(_write_kernels.row_values(self.columns[n][i]))
            f32, f64 = (tuple(v) or (np.zeros((self.rows, 0), dt),) for dt, v in by_dtype.items())
            # the flags as bytes: the compiled commit refuses (hands to the NumPy path) a byte other than 0 / 1
            views.append((src, f32, f64, self.columns["terminated"][i].view(np.uint8),
                          self.columns["truncated"][i].view(np.uint8)))
        return views

    def commit(self, k: int | None = None) -> np.ndarray:
        """Write rows ``[0, k)`` of every stream (default: all ``rows``) to the buffer, stream by stream in the order
        of ``streams``; returns their slots, shape (streams, k) (-1 as ``extend`` returns them). The stage is then
        free to refill from row 0."""
        if k is None:
            k = self.rows
        elif type(k) is not int and (isinstance(k, bool | np.bool_) or not isinstance(k, int | np.integer)) \
                or not 0 <= k <= self.rows:
            raise ValueError(f"k must be an integer number of staged rows in [0, {self.rows}], got {k!r}")
        k = int(k)
        if k == 0:
            return np.empty((len(self.streams), 0), np.int64)
        buf, cols, views = self.buffer, self.columns, self._views
        sampler = buf.sampler
        checks = type(sampler).check_insert is not Sampler.check_insert
        if views is not None and not checks and len(views) == 1:  # one stream, no insert checks: the short way
            slots = buf.storage.write_staged(views[0], k, self.streams[0])
            if slots is not None:
                sampler.on_insert(slots)
                return slots.reshape(1, k)
        out = []
        for i, stream in enumerate(self.streams):
            slots = None
            if views is not None:
                if checks:  # (before anything is written, as extend does)
                    sampler.check_insert(ONLINE, {n: v[i, :k] for n, v in cols.items()})
                slots = buf.storage.write_staged(views[i], k, stream)
                if slots is not None:
                    sampler.on_insert(slots)
            if slots is None:  # every other case, and rows the compiled check refused (extend names what is wrong)
                self._check_flags(i, k)
                slots = buf.extend({n: v[i, :k] for n, v in cols.items()}, stream=stream)
            out.append(slots)
        return out[0].reshape(1, k) if len(out) == 1 else np.stack(out)

    def _check_flags(self, i: int, k: int) -> None:
        """Stream ``i``'s staged flags hold bytes 0 / 1: a bool column written through a byte view (or shared memory)
        can hold another byte, which is neither False nor a clean True (``~flag`` of it is True too); refused as
        ``extend`` refuses a flag other than 0 / 1, naming column and row (``extend`` keeps a bool array's bytes)."""
        for name in ("terminated", "truncated"):
            raw = self.columns[name][i, :k].view(np.uint8)
            if raw.max(initial=0) > 1:
                row = int(np.argmax(raw > 1))
                raise ValueError(f"stage column {name!r} stream {self.streams[i]} row {row}: expected a boolean flag "
                                 f"(True/False or 0/1), got byte {int(raw[row])}")
