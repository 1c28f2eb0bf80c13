"""Cost of Hindsight Experience Replay at sample time: relive's HindsightSampler vs the same sampler without it vs
Stable-Baselines3's HerReplayBuffer, over the same rows, in one process.

FetchPush-shaped rows (observation 25, goals 3, action 4), episodes of 50 steps (truncated), one env; HER with
k = 4, strategy "future", the Fetch sparse reward -(|a - g| > 0.05) computed vectorized. Prints the best of
``--repeats`` timing windows (microseconds per ``sample(256)``) and the ratios. SB3's ``sample`` returns torch
tensors, so relive is also timed with ``batch.to_torch()`` (the like-for-like figure). ``--clock cpu`` times with
this process's CPU time instead of the wall clock: on a shared machine the time the process waits for a core is
then not counted (the windows of each figure are interleaved with the others', so a busy spell hits all alike).

    PYTHONPATH=src python bench/her.py --rows 100000 [--clock cpu]
    git show 5e8ae96:src/relive/replay/samplers/her.py > /tmp/her_before.py
    PYTHONPATH=src python bench/her.py --clock cpu --before /tmp/her_before.py   # + the old relabeling, same process

``--before FILE``: another version of ``samplers/her.py`` (loaded as its own module over the same relive) timed in
the same process, its windows interleaved with the current one's, so that a before / after comparison does not
depend on what else the machine runs between two commands.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from _timing import best_us
from relive.replay import ReplayBuffer, UniformSampler
from relive.replay.samplers.her import HindsightSampler

OBS, GOAL, ACT, EPISODE = 25, 3, 4, 50


def compute_reward(achieved, desired, info):
    """Fetch's sparse reward (gymnasium_robotics.envs.fetch: -(distance > 0.05)), vectorized."""
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def rows(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    frames = n + n // EPISODE  # one extra observation per episode (its final next_obs)
    obs = rng.normal(size=(frames, OBS)).astype(np.float32)
    ach = rng.normal(size=(frames, GOAL)).astype(np.float32)
    keep = np.ones(frames, bool)
    keep[EPISODE::EPISODE + 1] = False  # drop each episode's final frame from obs
    first = np.flatnonzero(keep)
    desired = np.repeat(rng.normal(size=(n // EPISODE, GOAL)).astype(np.float32), EPISODE, axis=0)
    trunc = (np.arange(n) % EPISODE) == EPISODE - 1
    return {"obs": {"observation": obs[first], "achieved_goal": ach[first], "desired_goal": desired},
            "next_obs": {"observation": obs[first + 1], "achieved_goal": ach[first + 1], "desired_goal": desired},
            "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
            "reward": compute_reward(ach[first + 1], desired, {}), "terminated": np.zeros(n, bool),
            "truncated": trunc}


def relive_buffer(data: dict, n: int, her: bool, cls=HindsightSampler) -> ReplayBuffer:
    shape = {"observation": (OBS,), "achieved_goal": (GOAL,), "desired_goal": (GOAL,)}
    sampler = cls(UniformSampler(), "future", 4, compute_reward) if her else UniformSampler()
    buf = ReplayBuffer(n, shape, (ACT,), sampler=sampler, seed=0)
    buf.extend(data)
    return buf


def sb3_buffer(data: dict, n: int):
    import gymnasium as gym
    from stable_baselines3 import HerReplayBuffer

    class OneEnv:  # what HerReplayBuffer asks of its VecEnv: the env's compute_reward
        num_envs = 1

        def env_method(self, name, *args, indices=None, **kwargs):
            assert name == "compute_reward"
            return [compute_reward(*args)]

    box = lambda k: gym.spaces.Box(-np.inf, np.inf, (k,), np.float32)  # noqa: E731
    space = gym.spaces.Dict({"observation": box(OBS), "achieved_goal": box(GOAL), "desired_goal": box(GOAL)})
    buf = HerReplayBuffer(n, space, gym.spaces.Box(-1, 1, (ACT,), np.float32), env=OneEnv(), device="cpu",
                          n_sampled_goal=4, goal_selection_strategy="future")
    for t in range(n):
        end = bool(data["truncated"][t])
        buf.add({k: v[t:t + 1] for k, v in data["obs"].items()}, {k: v[t:t + 1] for k, v in data["next_obs"].items()},
                data["action"][t:t + 1], data["reward"][t:t + 1], np.array([end]),
                [{"TimeLimit.truncated": end}])
    return buf


def load_before(path: str):
    """``HindsightSampler`` of another version of samplers/her.py, imported under its own module name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("her_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.HindsightSampler


def interleaved_best_us(ops: dict, calls: int, repeats: int, clock) -> dict[str, float]:
    """Best of ``repeats`` windows of ``calls`` calls per op, in microseconds; the windows of the ops take turns."""
    for fn in ops.values():
        for _ in range(max(10, calls // 10)):
            fn()
    best = {name: float("inf") for name in ops}
    for _ in range(repeats):
        for name, fn in ops.items():
            start = clock()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (clock() - start) / calls * 1e6)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rows stored (a multiple of 50)")
    p.add_argument("--calls", type=int, default=300, help="calls per timing window")
    p.add_argument("--repeats", type=int, default=5, help="timing windows; the best is shown")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: time.perf_counter; cpu: this process's CPU time (a shared machine)")
    p.add_argument("--before", help="another samplers/her.py to time in the same process (before / after)")
    args = p.parse_args()
    n = args.rows - args.rows % EPISODE
    data = rows(n)
    plain, her = relive_buffer(data, n, False), relive_buffer(data, n, True)
    ops = {"relive uniform, no HER": lambda: plain.sample(256),
           "relive HER(uniform), k=4 future": lambda: her.sample(256),
           "relive uniform, no HER + to_torch": lambda: plain.sample(256).to_torch(),
           "relive HER + to_torch": lambda: her.sample(256).to_torch()}
    if args.before:
        old = relive_buffer(data, n, True, load_before(args.before))
        ops["relive HER, --before's her.py"] = lambda: old.sample(256)
    try:
        sb3 = sb3_buffer(data, n)
        ops["SB3 HerReplayBuffer, k=4 future"] = lambda: sb3.sample(256)
    except ImportError:
        print("stable-baselines3 not importable: SB3 skipped")
    if args.clock == "cpu":
        us = interleaved_best_us(ops, args.calls, args.repeats, time.process_time)
    else:
        us = {name: best_us(fn, args.calls, args.repeats) for name, fn in ops.items()}
    for name in ops:
        print(f"{name:38s} {us[name]:9.1f} us/sample(256)")
    print(f"HER overhead: {us['relive HER(uniform), k=4 future'] / us['relive uniform, no HER'] - 1:+.0%} "
          f"(numpy batches), {us['relive HER + to_torch'] / us['relive uniform, no HER + to_torch'] - 1:+.0%} "
          "(torch batches)")
    if args.before:
        before = us["relive HER, --before's her.py"] / us["relive uniform, no HER"] - 1
        print(f"HER overhead with --before's her.py: {before:+.0%} (numpy batches)")
    if "SB3 HerReplayBuffer, k=4 future" in us:
        ratio = us["SB3 HerReplayBuffer, k=4 future"] / us["relive HER + to_torch"]
        print(f"SB3 / relive HER (torch batches): {ratio:.2f}x")
    print(f"rows {n}, {platform.processor() or platform.machine()}, python {platform.python_version()}, clock "
          f"{args.clock}, load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
