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
import time

import numpy as np

H = W = 84
K = 4
FRAME_BYTES = H * W


def median_us(fn, calls: int, repeats: int = 15) -> tuple[float, float]:
    """Microseconds per call of ``fn``: the medians over ``repeats`` windows of ``calls`` calls (after a warm-up of a
    tenth of a window, at least 3 calls) of the wall time and of the thread's CPU time (user + system: what the call
    costs this process, less sensitive to other processes on a shared machine than the wall time)."""
    for _ in range(max(3, calls // 10)):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        cpu.append((time.thread_time() - c) / calls * 1e6)
        wall.append((time.perf_counter() - w) / calls * 1e6)
    return float(np.median(wall)), float(np.median(cpu))


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
    arrays = nbytes(*st.columns.values(), *st._meta.values(), *st._nx.values.values(), st._kept_pos,
                    *st._kept.values(), *st.episodes._rec.values()) + st._nx.map_nbytes
    import torch

    def sample():
        b = buf.sample(32)
        return torch.from_numpy(b.obs), torch.from_numpy(b.next_obs)

    b = buf.sample(32)
    assert b.obs.shape == (32, *shape) and b.obs.dtype == np.uint8
    steps = [eps.steps(1) for _ in range(3500)]
    it = iter(steps)
    extend = median_us(lambda: buf.extend(next(it)), 200)
    return {"arrays": arrays, "rss": grown, "held": rows, "sample": median_us(sample, 100), "extend": extend,
            "detail": {"frames": st.columns["obs"].nbytes, "explicit next frames": nbytes(*st._nx.values.values()),
                       "action+reward+flags": nbytes(*(st.columns[c] for c in ("action", "reward", "terminated",
                                                                                 "truncated"))),
                       "bookkeeping (episode_id, generation, origin; next-obs bitmap + map)":
                           nbytes(*st._meta.values()) + st._nx.map_nbytes,
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
    steps = [eps.steps(1) for _ in range(3500)]
    it = iter(steps)

    def add_one():
        r = next(it)
        rb.add(r["obs"], r["next_obs"], r["action"], r["reward"], r["terminated"], [{}])

    def sample():
        s = rb.sample(32)
        return s.observations, s.next_observations

    assert sample()[0].dtype.is_floating_point is False
    return {"arrays": arrays, "rss": grown, "held": held, "sample": median_us(sample, 100),
            "extend": median_us(add_one, 200)}


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
    steps = [eps.steps(1) for _ in range(3500)]
    it = iter(steps)

    def add_one():
        r = next(it)
        rb.add(obs=r["obs"][0], next_obs=r["next_obs"][0], act=r["action"][0], rew=r["reward"][0],
               done=r["terminated"][0])

    # cpprb's arrays live in C++: its resident growth is its size
    return {"arrays": None, "rss": grown, "held": rows, "sample": median_us(sample, 100),
            "extend": median_us(add_one, 200)}

# -- TorchRL -------------------------------------------------------------------------------------------------
def _torchrl_buffer(rows: int, n: int, key: str, dim: int, padding: str):
    """TorchRL's recommended frame stacking in a replay buffer (``CatFrames`` docs, 0.14): each row stores its
    frame and its next frame (``key``, ``("next", key)``), and ``CatFrames.make_rb_transform_and_sampler`` gives a
    ``SliceSampler`` of slices of ``n`` steps within an episode (``traj_key``) and a transform stacking them at
    sample time (distinct out_keys, as its docs ask, so that the stacks are not stored)."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.envs import CatFrames

    cat = CatFrames(N=n, dim=dim, in_keys=[key], out_keys=[key + "_stack"], padding=padding, reset_key="_reset",
                    done_key="done")
    transform, sampler = cat.make_rb_transform_and_sampler(batch_size=32, traj_key="episode")
    return ReplayBuffer(storage=LazyTensorStorage(rows), sampler=sampler, transform=transform, batch_size=32)


def _torchrl_rows(r: dict, episode: list, obs: dict, next_obs: dict):
    import torch
    from tensordict import TensorDict

    n = r["action"].shape[0]
    ends = np.asarray(r["terminated"])
    ids = episode[0] + np.concatenate(([0], np.cumsum(ends[:-1]))).astype(np.int64)
    episode[0] += int(ends.sum())
    t = torch.from_numpy
    done = t(ends).unsqueeze(-1)
    return TensorDict({**obs, "action": t(r["action"]), "episode": t(ids),
                       "next": {**next_obs, "reward": t(r["reward"]), "done": done, "terminated": done}},
                      batch_size=[n])


def _torchrl_measure(rb, add_rows, steps, rows: int, held: int, before: int, stack_key: str) -> dict:
    import torch

    grown = rss() - before
    arrays = int(sum(v.nbytes for v in rb.storage._storage.values(True, True)))

    def sample():
        s = rb.sample()
        return s[stack_key], s["next", stack_key]

    x, y = sample()
    assert x.dtype == torch.uint8 and x.shape[0] == 32
    it = iter(steps)
    return {"arrays": arrays, "rss": grown, "held": held, "sample": median_us(sample, 2, 9),
            "extend": median_us(lambda: add_rows(next(it)), 200)}


def torchrl_case(rows: int):
    import torch

    eps, episode = Episodes(False), [0]
    before = rss()
    rb = _torchrl_buffer(rows, K, "pixels", -3, "same")

    def add_rows(r):  # the newest frame of each stack: (1, 84, 84), as CatFrames(dim=-3) concatenates them
        rb.extend(_torchrl_rows(r, episode, {"pixels": torch.from_numpy(np.ascontiguousarray(r["obs"][:, -1:]))},
                                {"pixels": torch.from_numpy(np.ascontiguousarray(r["next_obs"][:, -1:]))}))

    fill(add_rows, eps, rows + rows // 10)
    return _torchrl_measure(rb, add_rows, [eps.steps(1) for _ in range(3500)], rows, rows, before, "pixels_stack")


# -- the robot case: a 3-frame 84x84x3 camera + a 9-float state ----------------------------------------------
RK, RC, RS = 3, 3, 9  # frames a stack, channels a frame, state floats
ROBOT_FRAME = H * W * RC


class RobotEpisodes:
    """One stream of episodes of a dict observation: ``image`` a stack of RK 84x84x3 frames as SB3's
    ``VecFrameStack`` stacks a channels-last camera (``layout="sb3"``: (84, 84, 9), frames along the last axis,
    zeros before an episode; ``"split"``: (84, 84, 3, 3), the stack on its own last axis, as cpprb's
    ``stack_compress`` needs; ``"gym"``: Gymnasium's ``FrameStackObservation`` of the camera key, (3, 84, 84, 3),
    reset padding), ``state`` 9 floats (not stacked)."""

    def __init__(self, layout: str = "sb3", seed: int = 1, pool: int = 1024):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, (pool, H, W, RC), dtype=np.uint8)
        self.layout = layout
        self.g, self.first, self.left = 0, 0, self._length()

    def _length(self) -> int:
        return int(self.rng.integers(100, 401))

    def _stacks(self, g: np.ndarray, first: np.ndarray) -> np.ndarray:
        idx = g[:, None] + np.arange(-RK + 1, 1)[None, :]
        frames = self.pool[np.maximum(idx, first[:, None]) % len(self.pool)]  # [n, k, H, W, C], reset padding
        if self.layout == "gym":
            return frames
        frames[idx < first[:, None]] = 0
        if self.layout == "split":
            return np.ascontiguousarray(np.moveaxis(frames, 1, -1))  # [n, H, W, C, k]
        return np.ascontiguousarray(np.moveaxis(frames, 1, 3)).reshape(-1, H, W, RK * RC)  # frames along the last

    def steps(self, n: int) -> dict:
        g, first, end = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, bool)
        for i in range(n):
            g[i], first[i] = self.g, self.first
            self.g += 1
            self.left -= 1
            if self.left == 0:
                end[i] = True
                self.g += 1
                self.first, self.left = self.g, self._length()
        state = (g[:, None] % 97 + np.arange(RS)).astype(np.float32)
        return {"obs": {"image": self._stacks(g, first), "state": state},
                "next_obs": {"image": self._stacks(g + 1, first), "state": state + 1},
                "action": np.zeros((n, 7), np.float32), "reward": np.ones(n, np.float32), "terminated": end,
                "truncated": np.zeros(n, bool)}


def robot_relive(rows: int, layout: str):
    from relive.replay import ReplayBuffer
    from relive.replay.storage import FrameStack

    eps = RobotEpisodes(layout)
    before = rss()
    shape, fs = ((RK, H, W, RC), FrameStack(RK)) if layout == "gym" else ((H, W, RK * RC), FrameStack.sb3(RK))
    buf = ReplayBuffer(rows, {"image": (shape, np.uint8), "state": ((RS,), np.float32)}, (7,), seed=0,
                       frame_stack={"image": fs})
    fill(buf.extend, eps, rows + rows // 10)
    grown = rss() - before
    st = buf.storage
    arrays = nbytes(*st.columns.values(), *st._meta.values(), *st._nx.values.values(), st._kept_pos,
                    *st._kept.values(), *st.episodes._rec.values()) + st._nx.map_nbytes
    import torch

    def sample():
        b = buf.sample(32)
        return ({k: torch.from_numpy(v) for k, v in b.obs.items()},
                {k: torch.from_numpy(v) for k, v in b.next_obs.items()})

    assert sample()[0]["image"].shape == (32, *shape)
    it = iter([eps.steps(1) for _ in range(3500)])
    return {"arrays": arrays, "rss": grown, "held": rows, "sample": median_us(sample, 100),
            "extend": median_us(lambda: buf.extend(next(it)), 200)}


def robot_sb3(rows: int, held: int):
    import warnings

    from gymnasium import spaces
    from stable_baselines3.common.buffers import DictReplayBuffer

    eps = RobotEpisodes()
    before = rss()
    space = spaces.Dict({"image": spaces.Box(0, 255, (H, W, RK * RC), np.uint8),
                         "state": spaces.Box(-np.inf, np.inf, (RS,), np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (memory warning; DictReplayBuffer has no optimize_memory_usage)
        rb = DictReplayBuffer(rows, space, spaces.Box(-1, 1, (7,), np.float32), device="cpu", n_envs=1,
                              handle_timeout_termination=False)

    def add_chunk(r):
        for i in range(r["action"].shape[0]):
            rb.add({k: v[i:i + 1] for k, v in r["obs"].items()}, {k: v[i:i + 1] for k, v in r["next_obs"].items()},
                   r["action"][i:i + 1], r["reward"][i:i + 1], r["terminated"][i:i + 1], [{}])

    fill(add_chunk, eps, held)
    grown = rss() - before
    arrays = nbytes(*rb.observations.values(), *rb.next_observations.values(), rb.actions, rb.rewards, rb.dones,
                    rb.timeouts)

    def sample():
        s = rb.sample(32)
        return s.observations, s.next_observations

    it = iter([eps.steps(1) for _ in range(3500)])
    return {"arrays": arrays, "rss": grown, "held": held, "sample": median_us(sample, 100),
            "extend": median_us(lambda: add_chunk(next(it)), 200)}


def robot_cpprb(rows: int):
    import cpprb
    import torch

    eps = RobotEpisodes("split")
    before = rss()
    rb = cpprb.ReplayBuffer(rows, {"image": {"shape": (H, W, RC, RK), "dtype": np.uint8},
                                   "state": {"shape": RS, "dtype": np.float32}, "act": {"shape": 7},
                                   "rew": {}, "done": {}}, next_of=("image", "state"), stack_compress="image")

    def add_chunk(r):
        for i in range(r["action"].shape[0]):
            rb.add(image=r["obs"]["image"][i], next_image=r["next_obs"]["image"][i], state=r["obs"]["state"][i],
                   next_state=r["next_obs"]["state"][i], act=r["action"][i], rew=r["reward"][i],
                   done=r["terminated"][i])
            if r["terminated"][i]:
                rb.on_episode_end()

    fill(add_chunk, eps, rows + rows // 10)
    grown = rss() - before

    def sample():
        s = rb.sample(32)
        return ({k: torch.from_numpy(s[k]) for k in ("image", "state")},
                {k: torch.from_numpy(s["next_" + k]) for k in ("image", "state")})

    assert sample()[0]["image"].dtype == torch.uint8
    it = iter([eps.steps(1) for _ in range(3500)])
    return {"arrays": None, "rss": grown, "held": rows, "sample": median_us(sample, 100),
            "extend": median_us(lambda: add_chunk(next(it)), 200)}


def robot_torchrl(rows: int):
    import torch

    eps, episode = RobotEpisodes("split"), [0]  # (84, 84, 3, 3): the newest frame is [..., -1]
    before = rss()
    rb = _torchrl_buffer(rows, RK, "image", -3, "constant")

    def chw(x):  # the newest frame as a torch image (3, 84, 84) (ToTensorImage's layout), stacked into (9, 84, 84)
        return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x[..., -1], -1, 1)))

    def add_rows(r):
        t = torch.from_numpy
        rb.extend(_torchrl_rows(r, episode, {"image": chw(r["obs"]["image"]), "state": t(r["obs"]["state"])},
                                {"image": chw(r["next_obs"]["image"]), "state": t(r["next_obs"]["state"])}))

    fill(add_rows, eps, rows + rows // 10)
    return _torchrl_measure(rb, add_rows, [eps.steps(1) for _ in range(3500)], rows, rows, before, "image_stack")


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def table(cases: dict, ref_name: str, n: int, unique: int) -> None:
    ref = cases[ref_name]
    ref_bytes = ref["arrays"] / n
    print("| buffer | bytes / transition (arrays) | resident / transition | 1M transitions | / relive "
          "| sample(32) -> torch, wall (CPU) | / relive (CPU) | extend 1 step, wall (CPU) | / relive (CPU) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, c in cases.items():
        per = c["arrays"] / n if c["arrays"] is not None else c["rss"] / c["held"]
        res = c["rss"] / c["held"]
        arrays = f"{c['arrays'] / n:,.0f}" if c["arrays"] is not None else "(C++)"
        (sw, sc), (ew, ec) = c["sample"], c["extend"]
        print(f"| {name} | {arrays} | {res:,.0f} | {per * 1e6 / 1e9:.2f} GB | {per / ref_bytes:.2f}x | "
              f"{sw:,.0f} us ({sc:,.0f}) | {sc / ref['sample'][1]:.2f}x | {ew:,.1f} us ({ec:,.1f}) | "
              f"{ec / ref['extend'][1]:.2f}x |")
    print(f"(unique frames: {unique:,} B a transition; relive / unique: {ref_bytes / unique:.4f})")


def run_cases(runs) -> dict:
    cases = {}
    for name, run in runs:
        try:
            cases[name] = run()
        except ImportError as e:
            print(f"{name}: not run ({e})", file=sys.stderr)
        gc.collect()
        print(f"  done: {name}", flush=True)
    return cases


def grid_ab(rows: int, rounds: int = 6) -> None:
    """``sample(32)`` -> torch with the compiled frame-slot grid (``FrameStackStorage._pair_grid``) and with the
    NumPy grid (the method stubbed to decline), alternating rounds on the same buffers: CPU us, median of rounds."""
    import torch

    from relive.replay import ReplayBuffer
    from relive.replay.storage.frame_stack import FrameStack, FrameStackStorage

    for last in (False, True):
        eps = Episodes(last)
        shape, fs = ((H, W, K), FrameStack.sb3(K)) if last else ((K, H, W), FrameStack(K))
        buf = ReplayBuffer(rows, shape, (), seed=0, obs_dtype=np.uint8, action_dtype=np.int64, frame_stack=fs)
        fill(buf.extend, eps, rows + rows // 10)
        st = buf.storage

        def sample(buf=buf):
            b = buf.sample(32)
            return torch.from_numpy(b.obs), torch.from_numpy(b.next_obs)

        got: dict = {"NumPy grid": [], "compiled grid": []}
        for _ in range(rounds):
            for name in got:
                st._pair_grid = ((lambda flat: None) if name == "NumPy grid"
                                 else (lambda flat, st=st: FrameStackStorage._pair_grid(st, flat)))
                got[name].append(median_us(sample, 100, repeats=5)[1])
        print(f"{shape}: " + ", ".join(f"{name} {np.median(v):.0f} us" for name, v in got.items())
              + f" (CPU, median of {rounds} alternating rounds)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--sb3-rows", type=int, default=20_000, help="rows SB3 without optimize_memory_usage holds")
    ap.add_argument("--robot-rows", type=int, default=20_000, help="rows of the robot case (0: skip it)")
    ap.add_argument("--robot-only", action="store_true", help="only the robot case (a 3-frame 84x84x3 camera + 9 "
                    "floats) at --robot-rows transitions")
    ap.add_argument("--grid-ab", action="store_true", help="only: sample(32) with the compiled frame-slot grid vs "
                    "the NumPy one, alternating rounds on the same buffers of --rows transitions")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.grid_ab:
        print(f"load average at the start: {load()}")
        grid_ab(args.rows)
        print(f"load average at the end: {load()}")
        return
    import stable_baselines3  # noqa: F401

    import relive.replay  # noqa: F401  (imports and compiled kernels before any resident-memory reading)
    try:
        import torchrl.data  # noqa: F401
    except ImportError:
        pass
    n, m = args.rows, args.robot_rows
    print(f"load average at the start: {load()}")
    if not args.robot_only:
        print(f"N = {n} transitions of 84x84x{K} uint8 stacks; unique frames: {FRAME_BYTES} B a transition",
              flush=True)
    atari = {} if args.robot_only else run_cases((
        ("relive frame_stack=4 (4, 84, 84)", lambda: relive_case(n, False)),
        ("relive FrameStack.sb3(4) (84, 84, 4)", lambda: relive_case(n, True)),
        ("cpprb stack_compress + next_of", lambda: cpprb_case(n)),
        ("SB3 optimize_memory_usage=True", lambda: sb3_case(n, True, n)),
        ("SB3 optimize_memory_usage=False", lambda: sb3_case(n, False, min(n, args.sb3_rows))),
        ("TorchRL CatFrames + SliceSampler", lambda: torchrl_case(n))))
    robot = {}
    if m:
        robot = run_cases((
            ("relive frame_stack={'image': 3} (3, 84, 84, 3)", lambda: robot_relive(m, "gym")),
            ("relive frame_stack={'image': FrameStack.sb3(3)} (84, 84, 9)", lambda: robot_relive(m, "sb3")),
            ("cpprb stack_compress='image' + next_of", lambda: robot_cpprb(m)),
            ("SB3 DictReplayBuffer", lambda: robot_sb3(m, min(m, args.sb3_rows // 2))),
            ("TorchRL CatFrames + SliceSampler", lambda: robot_torchrl(m))))
    print(f"load average at the end: {load()}")
    print()
    if atari:
        table(atari, "relive frame_stack=4 (4, 84, 84)", n, FRAME_BYTES)
        print()
    if robot:
        print(f"robot case: N = {m} transitions of a 3-frame 84x84x3 camera + 9 floats")
        table(robot, "relive frame_stack={'image': 3} (3, 84, 84, 3)", m, ROBOT_FRAME + 4 * RS)
    if atari:
        print()
        print(f"relive (4, 84, 84), bytes per transition by part (N = {n}):")
        for part, b in atari["relive frame_stack=4 (4, 84, 84)"]["detail"].items():
            print(f"  {part}: {b / n:,.2f}")


if __name__ == "__main__":
    main()
