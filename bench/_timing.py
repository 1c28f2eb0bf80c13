"""Timing helper shared by the bench scripts (run as ``python bench/X.py``: this folder is on ``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable


def per_call(fn: Callable, seconds: float, warmup: int = 3) -> float:
    """Seconds per call of ``fn`` over about ``seconds`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / n


def best_us(fn: Callable, calls: int, repeats: int) -> float:
    """Microseconds per call of ``fn``: the best of ``repeats`` windows of ``calls`` calls (after a warm-up of a
    tenth of a window, at least 10 calls)."""
    for _ in range(max(10, calls // 10)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)
