"""Compiled (numba) checks of the small hot calls, used when numba is importable: each replaces a few NumPy calls
whose fixed cost (~1 us each) dominates a small batch.

Checks: ``check_update`` -- ``ReplayBuffer.update``'s checks in one pass (every slot is stored, every signal value
is finite, which rows are stale: their slot rewritten since they were sampled); ``all_finite`` -- the finiteness
check of a small write (``Storage.validate``). These only *detect* a problem; the NumPy path then runs and names it,
so both paths accept exactly the same inputs and raise the same errors. Two small computations of the same economy:
``stamps_and_source`` -- a batch's generation stamps and source tags (``ReplayBuffer.gather``; a slot that holds no
row hands the batch to the storage's NumPy check, which names it), ``td_priority`` -- PER's |delta| + eps, capped.
tests/replay/test_hot_paths.py runs each against its NumPy counterpart.
"""

from __future__ import annotations

from relive.replay._tree_kernels import AVAILABLE

if AVAILABLE:
    import numba
    import numpy as np

    @numba.njit(cache=True, nogil=True)
    def check_update(slots, generation, stamps, size, gap_lo, gap_hi, signal, stale):  # pragma: no cover - compiled
        # Returns the number of stale rows and fills stale[k] (the slot's stamp differs from the one sampled), or
        # -1 when a slot is not stored (outside [0, size) or in the empty demonstration slots [gap_lo, gap_hi)) or
        # a signal value is NaN / inf: the caller then checks again with NumPy, which says which.
        n_stale = 0
        for k in range(slots.size):
            s = slots[k]
            if s < 0 or s >= size or (s >= gap_lo and s < gap_hi) or not np.isfinite(signal[k]):
                return -1
            is_stale = stamps[s] != generation[k]
            stale[k] = is_stale
            n_stale += is_stale
        return n_stale

    @numba.njit(cache=True, nogil=True)
    def stamps_and_source(slots, stamps, num_offline, size, gap_lo, gap_hi, generation, source):  # pragma: no cover
        # a batch's record in one pass: each slot's generation stamp and its source (1: online, past the offline
        # prefix). False, at once, for a slot that holds no row (outside [0, size), or in the empty demonstration
        # slots [gap_lo, gap_hi)): the caller's NumPy check then names it -- no read of an unwritten slot
        for k in range(slots.size):
            s = slots[k]
            if s < 0 or s >= size or (s >= gap_lo and s < gap_hi):
                return False
            generation[k] = stamps[s]
            source[k] = s >= num_offline
        return True

    @numba.njit(cache=True, nogil=True)
    def td_priority(td, eps, cap, out):  # pragma: no cover - compiled
        # PER's priority base min(|delta| + eps, cap) per row: NumPy's abs, add and minimum on finite float64, the
        # same IEEE operations, so the same bits (the exponent stays NumPy's power: its SIMD pow rounds differently)
        for k in range(td.size):
            p = abs(td[k]) + eps
            out[k] = p if p < cap else cap

    @numba.njit(cache=True, nogil=True)
    def all_finite(values):  # pragma: no cover - compiled
        # whether every element of a float array of any shape and layout is finite (stops at the first that is not)
        for x in values.flat:
            if not np.isfinite(x):
                return False
        return True
