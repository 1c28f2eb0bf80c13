"""Compiled (numba) parts of frame-stack storage (:mod:`relive.replay.storage.frame_stack`), used when numba is
importable (``RELIVE_NO_NUMBA=1``: never); every result equals the NumPy path's (tests/replay/test_frame_stack.py runs
both).

Stacks travel as *byte rows* in a ``(pre, k, cp)`` geometry: a stack of k frames concatenated along its axis ``a`` is
``pre = prod(shape[:a])`` runs of ``k`` frame pieces of ``cp = C * prod(shape[a + 1:]) * itemsize`` bytes, and a
stored frame is its ``pre`` pieces back to back (``pre * cp`` bytes). Gymnasium's (k, 84, 84) is pre = 1, cp = 7056
(each frame one piece); SB3's channels-last (84, 84, 4) is pre = 7056, cp = 1 (the frames interleaved byte by byte).
One kernel serves every layout; for interleaved stacks of 2, 4 or 8 bytes a pixel (SB3's Atari stack) the pixel is read
as one word.

- :func:`one_step`: the frame work of a one-row online write of one stream (``FrameStackStorage._write_one_step``):
  the stack check (next_obs is obs shifted by a frame; obs's older frames are the episode's stored, kept or padding
  frames), then, only if it passes, the newest frame into the frame column, the next frame into its explicit copy and
  the frame about to be overwritten into the kept frames.
- :func:`gather_stacks`: interleaved stacks (frames along a later axis in pieces of several bytes, a channels-last
  camera) written straight into their layout from each row's frames, obs and next_obs in one pass
  (``FrameStackStorage.read_pair``; stacks along their first axis, and one-byte pieces, are NumPy's: as fast or
  faster there).
"""

from __future__ import annotations

import sys

import numpy as np

from relive.replay._tree_kernels import AVAILABLE

LITTLE = sys.byteorder == "little"  # the word reads below assume it (else the byte loops)

if AVAILABLE:
    import numba

    @numba.njit(cache=True, nogil=True, inline="always")
    def _frame_of(frames, kept, q, evicted, ring_base, ring, d):  # pragma: no cover - compiled
        # the stored frame of lane position q: kept below the lane's eviction bound, else its ring slot
        if q < evicted:
            return kept[q % d]
        return frames[ring_base + q % ring]

    # The byte loops index slices with their loop counters (never a sum: numba then proves the index non-negative,
    # drops its wrap-around test and the loops vectorize), accumulate in uint8 (numba widens ``a ^ b`` to int64
    # otherwise) instead of returning early, and copy element by element (a slice assignment is several times slower).
    @numba.njit(cache=True, nogil=True, inline="always")
    def _differ(a, b):  # pragma: no cover - compiled
        # whether two equal-length byte rows differ: nonzero if they do
        acc = np.uint8(0)
        for i in range(a.size):
            acc = np.uint8(acc | np.uint8(a[i] ^ b[i]))
        return acc

    @numba.njit(cache=True, nogil=True, inline="always")
    def _copy(dst, src):  # pragma: no cover - compiled
        for i in range(src.size):
            dst[i] = src[i]

    # With pre > 1 (frames interleaved in pieces of a few bytes) the loops go element by element: a slice a piece
    # costs more than its bytes. Pieces of 3 bytes (a channels-last RGB camera) go through 2-D views (_rgb_piece)
    # indexed by the loop counters with a literal inner loop of 3, which the compiler unrolls (~2.5x the general loop).
    @numba.njit(cache=True, nogil=True, inline="always")
    def _rgb_piece(x, j, pre, kc):  # pragma: no cover - compiled
        # frame j of the stack row x (pre, k, 3) as a (pre, 3) view
        return x.reshape(pre, kc)[:, 3 * j : 3 * j + 3]

    @numba.njit(cache=True, nogil=True)
    def _piece_differs(x, j, ref, pre, kc, cp):  # pragma: no cover - compiled
        # whether frame j of the stack row x (pre, k, cp) differs from the frame row ref (pre, cp)
        if pre == 1:
            return _differ(x[j * cp : (j + 1) * cp], ref) != 0
        acc = np.uint8(0)
        if cp == 3:
            x2, r2 = _rgb_piece(x, j, pre, kc), ref.reshape(pre, 3)
            for p in range(pre):
                for c in range(3):
                    acc = np.uint8(acc | np.uint8(x2[p, c] ^ r2[p, c]))
            return acc != 0
        for p in range(pre):
            o, i = p * kc + j * cp, p * cp
            for c in range(cp):
                acc = np.uint8(acc | np.uint8(x[o + c] ^ ref[i + c]))
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _pieces_differ(x, j, i, pre, kc, cp):  # pragma: no cover - compiled
        # whether frames j and i of the stack row x differ
        if pre == 1:
            return _differ(x[j * cp : (j + 1) * cp], x[i * cp : (i + 1) * cp]) != 0
        acc = np.uint8(0)
        if cp == 3:
            xj, xi = _rgb_piece(x, j, pre, kc), _rgb_piece(x, i, pre, kc)
            for p in range(pre):
                for c in range(3):
                    acc = np.uint8(acc | np.uint8(xj[p, c] ^ xi[p, c]))
            return acc != 0
        for p in range(pre):
            oj, oi = p * kc + j * cp, p * kc + i * cp
            for c in range(cp):
                acc = np.uint8(acc | np.uint8(x[oj + c] ^ x[oi + c]))
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _piece_zero(x, j, pre, kc, cp):  # pragma: no cover - compiled
        acc = np.uint8(0)
        if cp == 3:
            x2 = _rgb_piece(x, j, pre, kc)
            for p in range(pre):
                for c in range(3):
                    acc = np.uint8(acc | x2[p, c])
            return acc != 0
        for p in range(pre):
            o = p * kc + j * cp
            for c in range(cp):
                acc = np.uint8(acc | x[o + c])
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _shift_differs(x, y, pre, k, cp):  # pragma: no cover - compiled
        # whether y's frames 0 .. k-2 differ from x's frames 1 .. k-1
        kc = k * cp
        n = (k - 1) * cp
        if pre == 1:
            return _differ(y[:n], x[cp : cp + n]) != 0
        acc = np.uint8(0)
        if cp == 3:  # frame by frame
            for j in range(k - 1):
                ys, xs = _rgb_piece(y, j, pre, kc), _rgb_piece(x, j + 1, pre, kc)
                for p in range(pre):
                    for c in range(3):
                        acc = np.uint8(acc | np.uint8(ys[p, c] ^ xs[p, c]))
            return acc != 0
        for p in range(pre):
            o = p * kc
            for i in range(n):
                acc = np.uint8(acc | np.uint8(y[o + i] ^ x[o + cp + i]))
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _take_piece(dst, x, j, pre, kc, cp):  # pragma: no cover - compiled
        # frame j of the stack row x into the frame row dst
        if pre == 1:
            _copy(dst, x[j * cp : (j + 1) * cp])
            return
        if cp == 3:
            x2, d2 = _rgb_piece(x, j, pre, kc), dst.reshape(pre, 3)
            for p in range(pre):
                for c in range(3):
                    d2[p, c] = x2[p, c]
            return
        for p in range(pre):
            o, i = p * kc + j * cp, p * cp
            for c in range(cp):
                dst[i + c] = x[o + c]

    # -- interleaved one-byte frames (cp == 1) with k in (2, 4, 8): a pixel's k bytes as one word, frame j its byte j
    # (little-endian); the loops below read the words in order and vectorize
    @numba.njit(cache=True, nogil=True)
    def _w_piece_differs(xw, j, ref):  # pragma: no cover - compiled
        acc = np.uint8(0)
        sh, ff = np.uint64(8 * j), np.uint64(0xFF)
        for p in range(xw.size):
            acc |= np.uint8((np.uint64(xw[p]) >> sh) & ff) ^ ref[p]
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _w_pieces_differ(xw, j, i):  # pragma: no cover - compiled
        # whether byte j of every word differs from byte i (reset padding: an episode's first stack)
        acc = np.uint64(0)
        sj, si, ff = np.uint64(8 * j), np.uint64(8 * i), np.uint64(0xFF)
        for p in range(xw.size):
            w = np.uint64(xw[p])
            acc |= ((w >> sj) ^ (w >> si)) & ff
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _w_piece_zero(xw, j):  # pragma: no cover - compiled
        acc = np.uint64(0)
        sh, ff = np.uint64(8 * j), np.uint64(0xFF)
        for p in range(xw.size):
            acc |= (np.uint64(xw[p]) >> sh) & ff
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _w_shift_differs(xw, yw, k):  # pragma: no cover - compiled
        acc = np.uint64(0)
        mask, eight = np.uint64((1 << (8 * (k - 1))) - 1), np.uint64(8)
        for p in range(xw.size):
            acc |= (np.uint64(yw[p]) & mask) ^ (np.uint64(xw[p]) >> eight)
        return acc != 0

    @numba.njit(cache=True, nogil=True)
    def _w_take(dst, xw, j):  # pragma: no cover - compiled
        sh, ff = np.uint64(8 * j), np.uint64(0xFF)
        for p in range(xw.size):
            dst[p] = np.uint8((np.uint64(xw[p]) >> sh) & ff)

    @numba.njit(cache=True, nogil=True)
    def _one_step(x, y, xw, yw, frames, kept, kept_pos, nxv, params):  # pragma: no cover - compiled
        # one_step's body; xw / yw: x / y as words for interleaved one-byte frames (cp == 1, k in 2, 4, 8), else
        # None-like empty arrays (words == 0)
        k, pre, cp, slot, t, start, evicted, ring_base, ring, d, zero = params[:11]
        old, new_entry, tail_entry, words = params[11], params[12], params[13], params[14]
        kc = k * cp
        if (_w_shift_differs(xw, yw, k) if words else _shift_differs(x, y, pre, k, cp)):
            return 3
        for j in range(k - 1):
            q = t - (k - 1) + j
            if start < 0 or q < start:  # padding
                if zero:
                    if _w_piece_zero(xw, j) if words else _piece_zero(x, j, pre, kc, cp):
                        return 1 if start < 0 else 2
                    continue
                if start < 0:  # reset padding of an episode's first row: copies of its newest frame
                    if words:
                        if _w_pieces_differ(xw, j, k - 1):
                            return 1
                        continue
                    if _pieces_differ(x, j, k - 1, pre, kc, cp):
                        return 1
                    continue
                q = start  # reset padding inside an episode: its first frame
            ref = _frame_of(frames, kept, q, evicted, ring_base, ring, d)
            if _w_piece_differs(xw, j, ref) if words else _piece_differs(x, j, ref, pre, kc, cp):
                return 2
        same = 0
        if tail_entry >= 0:
            if not (_w_piece_differs(xw, k - 1, nxv[tail_entry]) if words
                    else _piece_differs(x, k - 1, nxv[tail_entry], pre, kc, cp)):
                same = 8
        if old >= 0:  # the frame the row overwrites: kept below the lane's new eviction bound
            _copy(kept[old % d], frames[slot])
            kept_pos[old % d] = old
        if words:
            _w_take(frames[slot], xw, k - 1)
            _w_take(nxv[new_entry], yw, k - 1)
        else:
            _take_piece(frames[slot], x, k - 1, pre, kc, cp)
            _take_piece(nxv[new_entry], y, k - 1, pre, kc, cp)
        return same

    @numba.njit(cache=True, nogil=True)
    def one_step(x, y, frames, kept, kept_pos, nxv, params):  # pragma: no cover - compiled
        # x, y: the write's obs / next_obs stack as byte rows (pre * k * cp); frames: the frame column as byte rows
        # (slot, pre * cp); kept: the lane's kept frames (d, pre * cp) and kept_pos their positions (d,); nxv: the
        # explicit next frames (entry, pre * cp). params (int64): k, pre, cp, slot (the row's), t (its lane
        # position), start (its open episode's first position; -1: the row starts an episode), evicted (the lane's
        # eviction bound), ring_base, ring, d, zero padding (0 / 1), old (the lane position the row overwrites; -1:
        # none), new_entry (the row's explicit next frame), tail_entry (the explicit next frame of the lane's last
        # row, compared with this row's newest frame; -1: none), words (k for interleaved one-byte frames with k in
        # 2, 4, 8, else 0).
        # Returns 1: obs starts an episode and its older frames are not padding; 2: its older frames are not the
        # episode's; 3: next_obs is not obs shifted by a frame -- nothing written; else 0, plus 8 when the tail's
        # next frame equals this row's newest frame.
        words = params[14]
        if words == 4:
            return _one_step(x, y, x.view(np.uint32), y.view(np.uint32), frames, kept, kept_pos, nxv, params)
        if words == 8:
            return _one_step(x, y, x.view(np.uint64), y.view(np.uint64), frames, kept, kept_pos, nxv, params)
        if words == 2:
            return _one_step(x, y, x.view(np.uint16), y.view(np.uint16), frames, kept, kept_pos, nxv, params)
        return _one_step(x, y, x[:0].view(np.uint32), y[:0].view(np.uint32), frames, kept, kept_pos, nxv, params)

    @numba.njit(cache=True, nogil=True)
    def _interleave(dst, scratch, j0, k, pre, cp):  # pragma: no cover - compiled
        # frames j0 .. j0 + k - 1 of scratch (frame rows) into the stack row dst (pre, k, cp): element by element
        # (a slice a piece costs more than its few bytes), the output in order
        kc = k * cp
        if cp == 1:
            for p in range(pre):
                for j in range(k):
                    dst[p * kc + j] = scratch[j0 + j, p]
            return
        if cp == 3:  # (a channels-last RGB camera)
            for p in range(pre):
                for j in range(k):
                    s = scratch[j0 + j]
                    o, i = p * kc + 3 * j, 3 * p
                    dst[o] = s[i]
                    dst[o + 1] = s[i + 1]
                    dst[o + 2] = s[i + 2]
            return
        for p in range(pre):
            for j in range(k):
                s = scratch[j0 + j]
                o, i = p * kc + j * cp, p * cp
                for c in range(cp):
                    dst[o + c] = s[i + c]

    @numba.njit(cache=True, nogil=True, inline="always")
    def _pixels3(w0, w1, w2):  # pragma: no cover - compiled
        # the four 3-byte pixels of 12 bytes read as three little-endian 32-bit words (widened to 64 bits)
        m24, lo = np.uint64(0xFFFFFF), w0 | (w1 << np.uint64(32))
        return (lo & m24, (lo >> np.uint64(24)) & m24, ((lo >> np.uint64(48)) | (w2 << np.uint64(16))) & m24,
                w2 >> np.uint64(8))

    @numba.njit(cache=True, nogil=True, inline="always")
    def _put_pixels9(d, j, a, b, c):  # pragma: no cover - compiled
        # four pixels of three frames (_pixels3 of each) as 9 words d[j:j + 9]: each pixel's 9 bytes, the frames' 3
        # in turn (pixel p's low 8 bytes in o_p, its last in h_p: bytes 9p .. 9p + 8)
        s8, s16, s24, s32, s48 = np.uint64(8), np.uint64(16), np.uint64(24), np.uint64(32), np.uint64(48)
        m32 = np.uint64(0xFFFFFFFF)
        o0, h0 = a[0] | (b[0] << s24) | (c[0] << s48), c[0] >> s16
        o1, h1 = a[1] | (b[1] << s24) | (c[1] << s48), c[1] >> s16
        o2, h2 = a[2] | (b[2] << s24) | (c[2] << s48), c[2] >> s16
        o3, h3 = a[3] | (b[3] << s24) | (c[3] << s48), c[3] >> s16
        d[j] = np.uint32(o0 & m32)
        d[j + 1] = np.uint32(o0 >> s32)
        d[j + 2] = np.uint32(h0 | ((o1 & np.uint64(0xFFFFFF)) << s8))
        d[j + 3] = np.uint32((o1 >> s24) & m32)
        d[j + 4] = np.uint32((o1 >> np.uint64(56)) | (h1 << s8) | ((o2 & np.uint64(0xFFFF)) << s16))
        d[j + 5] = np.uint32((o2 >> s16) & m32)
        d[j + 6] = np.uint32((o2 >> s48) | (h2 << s16) | ((o3 & np.uint64(0xFF)) << s24))
        d[j + 7] = np.uint32((o3 >> s8) & m32)
        d[j + 8] = np.uint32((o3 >> np.uint64(40)) | (h3 << s24))

    @numba.njit(cache=True, nogil=True, inline="always")
    def _bytes_rgb3(dst, s0, s1, s2, first, pre):  # pragma: no cover - compiled
        # pixels first .. pre - 1 of three frames into dst byte by byte: a constant body the compiler unrolls
        for p in range(first, pre):
            o, i = 9 * p, 3 * p
            dst[o] = s0[i]
            dst[o + 1] = s0[i + 1]
            dst[o + 2] = s0[i + 2]
            dst[o + 3] = s1[i]
            dst[o + 4] = s1[i + 1]
            dst[o + 5] = s1[i + 2]
            dst[o + 6] = s2[i]
            dst[o + 7] = s2[i + 1]
            dst[o + 8] = s2[i + 2]

    @numba.njit(cache=True, nogil=True, inline="always")
    def _interleave_rgb3(dst, s0, s1, s2, dst2, s3, pre):  # pragma: no cover - compiled
        # three frames of 3-byte pixels (a channels-last RGB camera stacked 3 deep, (H, W, 9)) into dst straight
        # from their rows, and, when dst2 has room (a one-step pair), frames s1, s2, s3 into dst2 from the same reads.
        # Little-endian: four pixels at a time as words (3 words of each frame in, 9 out a stack: ~1.5x the byte
        # loop, which takes frames of other sizes, and every frame on a big-endian machine). pre a multiple of 4: every
        # frame row and stack row starts at a multiple of 4 bytes, as the words' loads and stores assume
        pair = dst2.size > 0
        done = pre if LITTLE and pre % 4 == 0 else 0
        if done:
            n = 3 * done  # (a frame's bytes)
            d, a, b, c = dst[:3 * n].view(np.uint32), s0[:n].view(np.uint32), s1[:n].view(np.uint32), \
                s2[:n].view(np.uint32)
            d2, e = (dst2[:3 * n].view(np.uint32), s3[:n].view(np.uint32)) if pair else (d, a)
            for q in range(pre // 4):
                i = 3 * q
                pb = _pixels3(np.uint64(b[i]), np.uint64(b[i + 1]), np.uint64(b[i + 2]))
                pc = _pixels3(np.uint64(c[i]), np.uint64(c[i + 1]), np.uint64(c[i + 2]))
                _put_pixels9(d, 9 * q, _pixels3(np.uint64(a[i]), np.uint64(a[i + 1]), np.uint64(a[i + 2])), pb, pc)
                if pair:
                    _put_pixels9(d2, 9 * q, pb, pc, _pixels3(np.uint64(e[i]), np.uint64(e[i + 1]), np.uint64(e[i + 2])))
        _bytes_rgb3(dst, s0, s1, s2, done, pre)
        if pair:
            _bytes_rgb3(dst2, s1, s2, s3, done, pre)

    @numba.njit(cache=True, nogil=True, inline="always")
    def _table_of(frames, kept, nxv, kind):  # pragma: no cover - compiled
        # the frame table gather_stacks' kind names (0: slots, 1: kept, 3: explicit next frames; 2, zeros: none)
        return frames if kind == 0 else kept if kind == 1 else nxv

    @numba.njit(cache=True, nogil=True, inline="always")
    def _source_row(frames, kept, nxv, zero, kind, src):  # pragma: no cover - compiled
        # the frame row gather_stacks' (kind, src) names (src checked by the caller)
        return zero if kind == 2 else _table_of(frames, kept, nxv, kind)[src]

    @numba.njit(cache=True, nogil=True)
    def _gather_rgb3(frames, kept, nxv, which, row, pre, out_a, out_b, zero):  # pragma: no cover - compiled
        # gather_stacks for k = 3, cp = 3 without the scratch copy: each output's three frames read in place
        b_rows, w = which.shape
        for b in range(b_rows):
            for j in range(w):
                kind, src = which[b, j], row[b, j]
                if kind != 2 and (src < 0 or src >= _table_of(frames, kept, nxv, kind).shape[0]):
                    return -1
            f0 = _source_row(frames, kept, nxv, zero, which[b, 0], row[b, 0])
            f1 = _source_row(frames, kept, nxv, zero, which[b, 1], row[b, 1])
            f2 = _source_row(frames, kept, nxv, zero, which[b, 2], row[b, 2])
            if out_b.shape[0] and w == 4:  # (a one-step pair: next_obs is frames 1 .. 3, read once for both)
                f3 = _source_row(frames, kept, nxv, zero, which[b, 3], row[b, 3])
                _interleave_rgb3(out_a[b], f0, f1, f2, out_b[b], f3, pre)
                continue
            _interleave_rgb3(out_a[b], f0, f1, f2, zero[:0], f0, pre)
            if out_b.shape[0]:
                g0 = _source_row(frames, kept, nxv, zero, which[b, w - 3], row[b, w - 3])
                g1 = _source_row(frames, kept, nxv, zero, which[b, w - 2], row[b, w - 2])
                g2 = _source_row(frames, kept, nxv, zero, which[b, w - 1], row[b, w - 1])
                _interleave_rgb3(out_b[b], g0, g1, g2, zero[:0], g0, pre)
        return 0

    @numba.njit(cache=True, nogil=True)
    def gather_stacks(frames, kept, nxv, which, row, k, pre, cp, out_a, out_b, scratch):  # pragma: no cover
        # Interleaved stacks (pre > 1) of B rows from their frames: which / row (B, w) name frame j of row b --
        # which 0: frames[row] (a slot), 1: kept[row] (lane * depth + position % depth), 2: zeros, 3: nxv[row] (an
        # explicit next frame). out_a (B, pre * k * cp) receives the stacks of frames 0 .. k-1 and out_b, if it has
        # rows, those of frames w - k .. w - 1, in their interleaved layout, through scratch (w, F). Returns -1,
        # nothing promised, if a row index is out of range.
        b_rows, w = which.shape
        f = frames.shape[1]
        if k == 3 and cp == 3 and w >= 3:  # (a stacked RGB camera: its own loop, the same bytes)
            zero = scratch[0]
            for i in range(f):
                zero[i] = 0
            return _gather_rgb3(frames, kept, nxv, which, row, pre, out_a, out_b, zero)
        for b in range(b_rows):
            for j in range(w):
                src = row[b, j]
                kind = which[b, j]
                dst = scratch[j]
                if kind == 2:
                    for i in range(f):
                        dst[i] = 0
                    continue
                table = _table_of(frames, kept, nxv, kind)
                if src < 0 or src >= table.shape[0]:
                    return -1
                _copy(dst, table[src])
            _interleave(out_a[b], scratch, 0, k, pre, cp)
            if out_b.shape[0]:
                _interleave(out_b[b], scratch, w - k, k, pre, cp)
        return 0

    @numba.njit(cache=True, nogil=True)
    def pair_grid(flat, ids, rec_start, bits, pos_map, qmap, evicted, params, full, pad):  # pragma: no cover
        # The slots of the frames a one-step batch reads (FrameStackStorage._grid's "pair" grid) for RAM columns
        # whose episode ids are stored whole: full (B, d + 2) receives per row the slots of positions pos - d ..
        # pos - 1 (padding: the episode's first position), the row's slot, and its next row's slot (the row's own
        # where it holds an explicit next frame); pad (B, d) which of the first d are padding. flat: the rows' slots;
        # ids: the stored episode ids (int32); rec_start: the episode records' first positions
        # (Episodes.start_table); bits: the bitmap of slots holding an explicit next frame (NextObsStore.bits);
        # pos_map / qmap: with several streams (multi), the slot -> lane position map and the [lane, t % width] ->
        # slot map (relive.replay.storage.streams; else unused); evicted: per lane, its eviction bound.
        # params (int64): ring_base, capacity, online rows written, ring (online capacity, >= 1), id_base, id_shift,
        # d, multi (0 / 1), lane bits.
        # Returns a code, OR of 1: some entry is padding, 2: some frame was overwritten (kept: the caller takes the
        # NumPy path), 4: some row holds an explicit next frame (the caller looks its entry up).
        ring_base, capacity, written, ring = params[0], params[1], params[2], params[3]
        id_base, id_shift, d, multi, lane_bits = params[4], params[5], params[6], params[7], params[8]
        lane_mask = (np.int64(1) << lane_bits) - 1
        width = qmap.shape[1]
        base = written - ring
        code = 0
        for b in range(flat.shape[0]):
            s = flat[b]
            online = s >= ring_base and written > 0
            if s < ring_base:
                pos = s
            elif multi:
                pos = pos_map[s]
            else:
                pos = base + ((s - ring_base) - base) % ring
            eid = np.int64(ids[s])
            start = rec_start[eid if eid < id_base else eid - id_shift]
            for j in range(d):
                q = pos + j - d
                p = q < start
                pad[b, j] = p
                if p:
                    q = start
                    code |= 1
                if not online:
                    full[b, j] = q
                elif multi:
                    if q < evicted[q >> lane_bits]:
                        code |= 2
                    full[b, j] = qmap[q >> lane_bits, (q & lane_mask) % width] if width else -1
                else:
                    if q < evicted[0]:
                        code |= 2
                    full[b, j] = ring_base + q % ring
            full[b, d] = s
            if (bits[s >> 3] >> (s & 7)) & 1:
                full[b, d + 1] = s
                code |= 4
            elif multi and s >= ring_base:
                full[b, d + 1] = qmap[(pos + 1) >> lane_bits, ((pos + 1) & lane_mask) % width]
            elif multi:
                full[b, d + 1] = s + 1
            else:
                nxt = s + 1
                full[b, d + 1] = ring_base if nxt >= capacity else nxt
        return code
