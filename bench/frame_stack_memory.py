"""Frame stacks stored once: bytes per transition of an 84x84x4 uint8 Atari buffer, and ``sample(32)`` -> uint8
stacks -> torch, for relive (``frame_stack``) beside SB3's ``ReplayBuffer`` (with and without
``optimize_memory_usage``) and cpprb (``stack_compress`` + ``next_of``), in one process (issue 45, item 3).

Synthetic frames, no env: one stream of episodes (lengths uniform in [400, 1600] steps), each step a new 84x84 frame
from a pool of random frames, stacked as the wrappers stack them -- Gymnasium's ``FrameStackObservation`` (4, 84, 84),
reset padding, for relive and SB3 (which stores what it is given: the (4, 84, 84) stacks SB3's Atari DQN sees after
``VecTransposeImage``); SB3's ``VecFrameStack`` (84, 84, 4), zero padding, for cpprb (its stack axis must be the last)
and for relive a second time (``FrameStack.sb3(4)``). Each buffer is filled with N transitions (a ring of N slots,
filled once and wrapped by a tenth more), then:

- bytes per transition: the buffer's arrays (``nbytes`` of every column, bookkeeping, index and kept frame) / N, and
  the process's resident memory grown by the fill / N (allocator slack included). SB3 without
  ``optimize_memory_usage`` holds 56 KB a transition; it is filled to ``--sb3-rows`` only (default 20,000: its
  arrays are allocated for N, its resident bytes are measured over the rows it holds). A 1M-transition buffer is
  extrapolated: bytes per transition x 1e6 (every figure here is linear in N beyond the fixed part).
- ``sample(32)`` -> torch: a batch drawn and its obs / next_obs stacks as uint8 torch tensors (relive and cpprb:
  ``torch.from_numpy``; SB3's ``sample`` returns tensors), best of 5 windows.
- ``extend`` / ``add`` of one step into the full buffer, best of 5 windows.

    python bench/frame_stack_memory.py               # N = 100,000
    python bench/frame_stack_memory.py --rows 20000 --sb3-rows 5000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import numpy as np

from _timing import best_us

H = W = 84
K = 4
FRAME_BYTES = H * W


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Episodes:
    """One stream of episodes of synthetic frames, stacked as a wrapper stacks them: ``last=False`` Gymnasium
    (k, H, W) with reset padding, ``last=True`` SB3 channels-last (H, W, k) with zero padding."""

    def __init__(self, last: bool, seed: int = 0, pool: int = 2048):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, (pool, H, W), dtype=np.uint8)
        self.last = last
        self.g = 0  # frames made so far (the reset frame of each episode included)
        self.first = 0  # global index of this episode's first frame
        self.left = self._length()

    def _length(self) -> int:
        return int(self.rng.integers(400, 1601))

    def _stacks(self, g: np.ndarray, first: np.ndarray) -> np.ndarray:
        idx = g[:, None] + np.arange(-K + 1, 1)[None, :]
        pad = idx < first[:, None]
        frames = self.pool[np.maximum(idx, first[:, None]) % len(self.pool)]  # [n, k, H, W], reset padding
        if self.last:
            frames[pad] = 0
            return np.ascontiguousarray(frames.transpose(0, 2, 3, 1))
        return frames

    def steps(self, n: int) -> dict:
        g, first, end = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, bool)
        for i in range(n):  # (per step: the episode bookkeeping only; frames are gathered below)
            g[i], first[i] = self.g, self.first
            self.g += 1
            self.left -= 1
            if self.left == 0:
                end[i] = True
                self.g += 1  # the terminal frame (next_obs), then the next episode's reset frame
                self.first, self.left = self.g, self._length()
        return {"obs": self._stacks(g, first), "next_obs": self._stacks(g + 1, first),
                "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32), "terminated": end,
                "truncated": np.zeros(n, bool)}


def fill(add_chunk, episodes: Episodes, rows: int, chunk: int = 1000) -> None:
    done = 0
    while done < rows:
        n = min(chunk, rows - done)
        add_chunk(episodes.steps(n))
        done += n


def nbytes(*arrays) -> int:
    return int(sum(a.nbytes for a in arrays))


# -- relive --------------------------------------------------------------------------------------------------
def relive_case(rows: int, last: bool):
    from relive.replay import ReplayBuffer
    from relive.replay.storage.frame_stack import FrameStack

    shape, fs = ((H, W, K), FrameStack.sb3(K)) if last else ((K, H, W), FrameStack(K))
    eps = Episodes(last)
    before = rss()
    buf = ReplayBuffer(rows, shape, (), seed=0, obs_dtype=np.uint8, action_dtype=np.int64, frame_stack=fs)
    fill(buf.extend, eps, rows + rows // 10)
    grown = rss() - before
    st = buf.storage
    arrays = nbytes(*st.columns.values(), *st._meta.values(), st._nx.entry, *st._nx.values.values(), st._kept_pos,
                    *st._kept.values(), *st.episodes._rec.values())
    import torch

    def sample():
        b = buf.sample(32)
        return torch.from_numpy(b.obs), torch.from_numpy(b.next_obs)

    b = buf.sample(32)
    assert b.obs.shape == (32, *shape) and b.obs.dtype == np.uint8
    steps = [eps.steps(1) for _ in range(2000)]
    it = iter(steps)
    extend = best_us(lambda: buf.extend(next(it)), 300, 5)
    return {"arrays": arrays, "rss": grown, "held": rows, "sample": best_us(sample, 200, 5), "extend": extend,
            "detail": {"frames": st.columns["obs"].nbytes, "explicit next frames": nbytes(*st._nx.values.values()),
                       "action+reward+flags": nbytes(*(st.columns[c] for c in ("action", "reward", "terminated",
                                                                                 "truncated"))),
                       "bookkeeping (episode_id, generation, origin, next-obs entry)":
                           nbytes(*st._meta.values(), st._nx.entry),
                       "episode index + kept frames": nbytes(*st.episodes._rec.values(), st._kept_pos,
                                                             *st._kept.values())}}


# -- SB3 -----------------------------------------------------------------------------------------------------
def sb3_case(rows: int, optimize: bool, held: int):
    import warnings

    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    eps = Episodes(False)
    before = rss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (SB3 warns that the buffer may not fit in memory)
        rb = ReplayBuffer(rows, spaces.Box(0, 255, (K, H, W), np.uint8), spaces.Discrete(4), device="cpu",
                          n_envs=1, optimize_memory_usage=optimize, handle_timeout_termination=False)

    def add_chunk(r):
        for i in range(r["obs"].shape[0]):
            rb.add(r["obs"][i:i + 1], r["next_obs"][i:i + 1], r["action"][i:i + 1], r["reward"][i:i + 1],
                   r["terminated"][i:i + 1], [{}])

    fill(add_chunk, eps, held)
    grown = rss() - before
    arrays = nbytes(*(getattr(rb, n) for n in ("observations", "actions", "rewards", "dones", "timeouts")),
                    *([] if optimize else [rb.next_observations]))
    steps = [eps.steps(1) for _ in range(2000)]
    it = iter(steps)

    def add_one():
        r = next(it)
        rb.add(r["obs"], r["next_obs"], r["action"], r["reward"], r["terminated"], [{}])

    def sample():
        s = rb.sample(32)
        return s.observations, s.next_observations

    assert sample()[0].dtype.is_floating_point is False
    return {"arrays": arrays, "rss": grown, "held": held, "sample": best_us(sample, 200, 5),
            "extend": best_us(add_one, 300, 5)}


# -- cpprb ---------------------------------------------------------------------------------------------------
def cpprb_case(rows: int):
    import cpprb

    eps = Episodes(True)
    before = rss()
    rb = cpprb.ReplayBuffer(rows, {"obs": {"shape": (H, W, K), "dtype": np.uint8}, "act": {"dtype": np.int64},
                                   "rew": {}, "done": {}}, next_of="obs", stack_compress="obs")

    def add_chunk(r):
        for i in range(r["obs"].shape[0]):  # one step at a time, episode ends flushed (as its docs ask)
            rb.add(obs=r["obs"][i], next_obs=r["next_obs"][i], act=r["action"][i], rew=r["reward"][i],
                   done=r["terminated"][i])
            if r["terminated"][i]:
                rb.on_episode_end()

    fill(add_chunk, eps, rows + rows // 10)
    grown = rss() - before
    import torch

    def sample():
        s = rb.sample(32)
        return torch.from_numpy(s["obs"]), torch.from_numpy(s["next_obs"])

    assert sample()[0].dtype == torch.uint8
    steps = [eps.steps(1) for _ in range(2000)]
    it = iter(steps)

    def add_one():
        r = next(it)
        rb.add(obs=r["obs"][0], next_obs=r["next_obs"][0], act=r["action"][0], rew=r["reward"][0],
               done=r["terminated"][0])

    # cpprb's arrays live in C++: its resident growth is its size
    return {"arrays": None, "rss": grown, "held": rows, "sample": best_us(sample, 200, 5),
            "extend": best_us(add_one, 300, 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--sb3-rows", type=int, default=20_000, help="rows SB3 without optimize_memory_usage holds")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    import stable_baselines3  # noqa: F401

    import relive.replay  # noqa: F401  (imports and compiled kernels before any resident-memory reading)
    n = args.rows
    cases = {}
    print(f"N = {n} transitions of 84x84x{K} uint8 stacks; unique frames: {FRAME_BYTES} B a transition", flush=True)
    for name, run in (("relive frame_stack=4 (4, 84, 84)", lambda: relive_case(n, False)),
                      ("relive FrameStack.sb3(4) (84, 84, 4)", lambda: relive_case(n, True)),
                      ("cpprb stack_compress + next_of", lambda: cpprb_case(n)),
                      ("SB3 optimize_memory_usage=True", lambda: sb3_case(n, True, n)),
                      ("SB3 optimize_memory_usage=False", lambda: sb3_case(n, False, min(n, args.sb3_rows)))):
        try:
            cases[name] = run()
        except ImportError as e:
            print(f"{name}: not run ({e})", file=sys.stderr)
        gc.collect()
        print(f"  done: {name}", flush=True)
    ref = cases["relive frame_stack=4 (4, 84, 84)"]
    ref_bytes = ref["arrays"] / n
    print()
    print("| buffer | bytes / transition (arrays) | resident / transition | 1M transitions | vs relive "
          "| sample(32) -> torch | vs relive | extend 1 step | vs relive |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, c in cases.items():
        per = c["arrays"] / n if c["arrays"] is not None else c["rss"] / c["held"]
        res = c["rss"] / c["held"]
        arrays = f"{c['arrays'] / n:,.0f}" if c["arrays"] is not None else "(C++)"
        print(f"| {name} | {arrays} | {res:,.0f} | {per * 1e6 / 1e9:.2f} GB | {per / ref_bytes:.2f}x | "
              f"{c['sample']:.0f} us | {c['sample'] / ref['sample']:.2f}x | {c['extend']:.1f} us | "
              f"{c['extend'] / ref['extend']:.2f}x |")
    print()
    print(f"relive (4, 84, 84), bytes per transition by part (N = {n}):")
    for part, b in ref["detail"].items():
        print(f"  {part}: {b / n:,.2f}")
    print(f"  total / unique frames: {ref_bytes / FRAME_BYTES:.4f}")


if __name__ == "__main__":
    main()
