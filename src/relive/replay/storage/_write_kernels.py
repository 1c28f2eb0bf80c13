"""Compiled (numba) part of a staged write (:mod:`relive.replay.stage`), used when numba is importable: a commit of
one stream's staged rows in one call -- their finiteness check, their copy into consecutive slots, their bookkeeping
and the episode records -- where a small write through ``extend`` spends a NumPy call (~1 us of fixed cost) per
column and a few dozen Python steps.

Columns travel as *byte views*: each column as a 2-D ``uint8`` array of one row per line (:func:`row_bytes`), so one
compiled copy serves every dtype and row shape; the float columns also as 2-D float views for the check
(:func:`row_values`). tests/replay/test_stage.py holds a commit equal to ``extend`` of the same rows.
"""

from __future__ import annotations

import numpy as np

from relive.replay._tree_kernels import AVAILABLE


def row_bytes(arr: np.ndarray) -> np.ndarray:
    """``arr`` (C-contiguous, rows first) as ``uint8`` rows: shape (rows, bytes per row), the same memory."""
    arr = np.asarray(arr)  # (a memmap column: its ndarray view)
    values = int(np.prod(arr.shape[1:], dtype=np.int64))
    if values == 0:  # (no bytes to copy; NumPy cannot view an empty row as bytes)
        return np.zeros((arr.shape[0], 0), np.uint8)
    return arr.reshape(arr.shape[0], values).view(np.uint8)


def row_values(arr: np.ndarray) -> np.ndarray:
    """``arr`` as a 2-D array of its dtype: (rows, values per row), the same memory."""
    return np.asarray(arr).reshape(arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64)))


if AVAILABLE:
    import numba

    @numba.njit(cache=True, nogil=True)
    def _finite(values, k):  # pragma: no cover - compiled
        # whether rows [0, k) of a 2-D float array are finite
        for i in range(k):
            for c in range(values.shape[1]):
                if not np.isfinite(values[i, c]):
                    return False
        return True

    @numba.njit(cache=True, nogil=True)
    def rows_finite(f32, f64, k):  # pragma: no cover - compiled
        # whether rows [0, k) of every float column are finite: f32 / f64, tuples of 2-D row views (one per dtype:
        # a tuple's items share one type)
        for j in range(len(f32)):
            if not _finite(f32[j], k):
                return False
        for j in range(len(f64)):
            if not _finite(f64[j], k):
                return False
        return True

    @numba.njit(cache=True, nogil=True)
    def commit_rows(dst, src, f32, f64, terminated, truncated, k, first, start, episode_col, origin_col, origin,
                    generation, rec_start, rec_length, rec_finished, rec_source, source, open_id, open_row, next_id,
                    num_records, id_mod):  # pragma: no cover - compiled
        # A whole staged commit of one lane: (-1, 0) and nothing written when a value is not finite or a flag
        # (terminated, truncated: their bytes) is not 0 / 1; else rows [0, k) of each staged column (src, byte views)
        # copied into slots [first, first + k) of the storage's (dst), each row's bookkeeping (its episode id modulo
        # id_mod, its origin tag, a new generation: the caller has checked that no stamp wraps) and the episode
        # records as EpisodeIndex.append keeps them: the rows join the open episode (open_id, record row open_row;
        # -1: none), each row that ends an episode finishes it, the next row starts a new record (ids from next_id,
        # record rows from num_records: the caller made room for k). Returns (new records, the id of the episode
        # left open or -1).
        if not rows_finite(f32, f64, k):
            return -1, 0
        for i in range(k):  # flags (their bytes): 0 or 1, else the NumPy path refuses them by name
            if terminated[i] > 1 or truncated[i] > 1:
                return -1, 0
        for j in range(len(dst)):
            d, s = dst[j], src[j]
            for i in range(k):
                d[first + i, :] = s[i, :]
        current, row, new = open_id, open_row, 0
        for i in range(k):
            if current == -1:  # row i starts an episode
                row, current = num_records + new, next_id + new
                new += 1
                rec_start[row] = start + i
                rec_length[row] = 0
                rec_finished[row] = False
                rec_source[row] = source
            rec_length[row] += 1
            episode_col[first + i] = current % id_mod
            origin_col[first + i] = origin
            generation[first + i] += 1
            if terminated[i] or truncated[i]:
                rec_finished[row] = True
                current = -1
        return new, current
