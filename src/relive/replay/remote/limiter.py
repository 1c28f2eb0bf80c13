"""Reverb's ``SampleToInsertRatio`` rate limiter for a replay service (rows, not calls).

``inserts`` counts rows granted to writers, ``samples`` rows granted to learners (a batch of B is B samples, as in
Reverb). With ``offset = samples_per_insert x min_size_to_sample`` and ``error_buffer`` e (a number: the window
``[offset - e, offset + e]``; a pair: ``(min_diff, max_diff)`` as given), and ``diff = inserts x spi - samples``:

- a writer may insert ``n`` rows when ``inserts + n <= min_size_to_sample`` (filling up is never held back) or
  ``(inserts + n) x spi - samples <= max_diff``;
- a learner may sample ``n`` rows when ``inserts >= min_size_to_sample`` and ``diff - n >= min_diff``.

The side running ahead blocks (``acquire_insert`` / ``acquire_sample`` wait on a condition) until the other side
catches up; every wait is counted, timed and logged (``relive.replay.remote`` logger, DEBUG per wait). Once
``inserts >= min_size_to_sample``, every grant keeps ``min_diff <= diff <= max_diff`` (a request larger than the
window can never be granted and is refused at once, never a deadlock). In a Ray service the limiter is one threaded
actor (``max_concurrency``) that every writer and learner asks before each write or draw."""

from __future__ import annotations

import logging
import threading
import time

LOG = logging.getLogger("relive.replay.remote")


class RateLimitTimeout(TimeoutError):
    """A writer or learner waited longer than its timeout for the other side."""


class SampleToInsertRatio:
    def __init__(self, samples_per_insert: float, min_size_to_sample: int = 1, error_buffer=None):
        spi = float(samples_per_insert)
        if not spi > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert!r}")
        if isinstance(min_size_to_sample, bool) or int(min_size_to_sample) != min_size_to_sample \
                or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {min_size_to_sample!r}")
        offset = spi * int(min_size_to_sample)
        if error_buffer is None:
            error_buffer = max(1.0, spi)  # the smallest window Reverb accepts for one-row grants
        if isinstance(error_buffer, tuple | list):
            lo, hi = (float(x) for x in error_buffer)
        else:
            if not float(error_buffer) >= 0:
                raise ValueError(f"error_buffer must be >= 0, got {error_buffer!r}")
            lo, hi = offset - float(error_buffer), offset + float(error_buffer)
        if not hi > lo:
            raise ValueError(f"error_buffer: max_diff must be > min_diff, got ({lo}, {hi})")
        self.samples_per_insert, self.min_size_to_sample = spi, int(min_size_to_sample)
        self.min_diff, self.max_diff = lo, hi
        self.inserts = 0
        self.samples = 0
        self.insert_waits = self.sample_waits = 0  # grants that had to wait
        self.insert_wait_s = self.sample_wait_s = 0.0
        self.history: list[tuple[str, int, int]] = []  # (side, inserts, samples) after each grant (kept if record)
        self.record = False
        self._cond = threading.Condition()

    # -- the rule ----------------------------------------------------------------------------------------
    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int) -> bool:
        if self.inserts + n <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int) -> bool:
        return self.inserts >= self.min_size_to_sample and self.diff - n >= self.min_diff

    def _check_size(self, side: str, n: int) -> None:
        width = self.max_diff - self.min_diff
        cost = n * self.samples_per_insert if side == "insert" else n
        if n < 0 or (cost > width and not (side == "insert" and n <= self.min_size_to_sample)):
            raise ValueError(f"a {side} of {n} rows can never be granted: it moves the samples-inserts difference by "
                             f"{cost}, more than the error window ({self.min_diff}, {self.max_diff}) allows; write or "
                             f"sample in smaller pieces or widen error_buffer")

    # -- grants --------------------------------------------------------------------------------------------
    def acquire_insert(self, n: int, timeout: float | None = None) -> float:
        """Block until ``n`` rows may be inserted, then count them. Returns the seconds waited."""
        return self._acquire("insert", int(n), timeout)

    def acquire_sample(self, n: int, timeout: float | None = None) -> float:
        """Block until ``n`` rows may be sampled, then count them. Returns the seconds waited."""
        return self._acquire("sample", int(n), timeout)

    def _acquire(self, side: str, n: int, timeout: float | None) -> float:
        self._check_size(side, n)
        ok = self.can_insert if side == "insert" else self.can_sample
        with self._cond:
            waited = 0.0
            if not ok(n):
                start = time.monotonic()
                if not self._cond.wait_for(lambda: ok(n), timeout):
                    raise RateLimitTimeout(f"{side} of {n} rows waited {timeout} s for the other side (inserts "
                                           f"{self.inserts}, samples {self.samples}, samples_per_insert "
                                           f"{self.samples_per_insert})")
                waited = time.monotonic() - start
                if side == "insert":
                    self.insert_waits, self.insert_wait_s = self.insert_waits + 1, self.insert_wait_s + waited
                else:
                    self.sample_waits, self.sample_wait_s = self.sample_waits + 1, self.sample_wait_s + waited
                LOG.debug("rate limiter: %s of %d rows waited %.4f s", side, n, waited)
            if side == "insert":
                self.inserts += n
            else:
                self.samples += n
            if self.record:
                self.history.append((side, self.inserts, self.samples))
            self._cond.notify_all()
        return waited

    def set_record(self, on: bool) -> None:
        self.record = bool(on)

    def get_history(self) -> list[tuple[str, int, int]]:
        return list(self.history)

    def stats(self) -> dict[str, float]:
        return {"replay/limiter_inserts": float(self.inserts), "replay/limiter_samples": float(self.samples),
                "replay/limiter_insert_waits": float(self.insert_waits),
                "replay/limiter_sample_waits": float(self.sample_waits),
                "replay/limiter_insert_wait_s": self.insert_wait_s,
                "replay/limiter_sample_wait_s": self.sample_wait_s}

    def state_dict(self) -> dict:
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state_dict(self, state: dict) -> None:
        with self._cond:
            self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
            self._cond.notify_all()
