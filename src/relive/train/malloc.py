"""glibc malloc's thresholds for the training process: freed memory kept for reuse (``retain_freed_memory``, which the
trainer applies to its own process, like its torch thread count)."""

from __future__ import annotations

import ctypes
import ctypes.util

MMAP_THRESHOLD_BYTES = 64 << 20  # allocations below this come from the heap, not from fresh mmap'ed pages
TRIM_THRESHOLD_BYTES = 256 << 20  # freed heap memory kept for reuse up to this much


def retain_freed_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse (``mallopt`` M_MMAP_THRESHOLD = 64 MiB, M_TRIM_THRESHOLD =
    256 MiB) instead of returning it to the kernel. PyTorch's CPU allocator is plain malloc: every update
    allocates and frees activations of a few MB ([10, 256, 256] floats for a ten-member critic layer), and by
    default each of them comes back as fresh pages whose first touch faults and zero-fills them -- ~2,500 page
    faults and ~8 ms of kernel time per ten-critic update on a 2-core EPYC (a third of what the non-matmul
    work costs). A process setting: the trainer applies it to its own process, like its torch thread count.
    No-op (False) where glibc is not the C library."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc malloc.h
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)) and bool(mallopt(m_trim_threshold,
                                                                                  TRIM_THRESHOLD_BYTES))
