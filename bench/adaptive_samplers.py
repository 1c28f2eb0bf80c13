"""Adaptive samplers: ARB refresh and sampling, ReaPER sample + update, against uniform and cpprb PER.

    python bench/adaptive_samplers.py --rows 1000000 --threads 2

1. ARB full refresh of N Hopper-shaped rows (obs 11, action 3) scored by a 256x256 tanh-Gaussian policy
   (relive's SAC actor, ``score_fn("standardized")``), in chunks of 65,536 rows.
2. ARB sampling (batch 256) vs uniform sampling of the same buffer.
3. ARB amortized mode: re-scoring N / 1000 rows per gradient step (a full sweep every 1000 steps, the paper's
   cadence) vs one SAC update (batch 256, 256x256).
4. ReaPER sample + update vs cpprb PrioritizedReplayBuffer sample + update_priorities (N rows, episodes of
   1000 steps, batch 256), and ReaPER's update cost at N rows vs at 10k rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

OBS, ACT, BATCH = 11, 3, 256


def rate(fn, seconds: float, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def data(rows: int) -> dict:
    from relive.testing import random_transitions

    d = random_transitions(rows, OBS, ACT, rng=0, episode_length=1000)
    d["action"] = np.tanh(d["action"] * 2).astype(np.float32)
    return d


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", default="bench/out/adaptive_samplers.json")
    args = p.parse_args(argv)

    import torch

    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ARBSampler, ReaPERSampler, ReplayBuffer, UniformSampler

    torch.set_num_threads(args.threads)
    N = args.rows
    rows = data(N)
    agent = SAC(OBS, ACT, -np.ones(ACT), np.ones(ACT), SACConfig(), seed=0)
    score = agent.score_fn("standardized")
    out: dict = {"rows": N, "threads": args.threads}

    arb = ReplayBuffer(N, (OBS,), (ACT,), sampler=ARBSampler(temperature=5.0), seed=0)
    arb.extend(rows)
    arb.refresh(score)  # warm-up (allocations, numba compile)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        arb.refresh(score)
        times.append(time.perf_counter() - t)
    out["ARB full refresh s"] = min(times)
    print(f"ARB full refresh of {N:,} rows (256x256 policy): {min(times):.2f} s (target <= 3 s)", flush=True)

    uni = ReplayBuffer(N, (OBS,), (ACT,), sampler=UniformSampler(), seed=0)
    uni.extend(rows)
    out["uniform sample/s"] = rate(lambda: uni.sample(BATCH), args.seconds)
    out["ARB sample/s"] = rate(lambda: arb.sample(BATCH), args.seconds)
    print(f"ARB sample: {out['ARB sample/s']:,.0f}/s vs uniform {out['uniform sample/s']:,.0f}/s -> "
          f"{out['ARB sample/s'] / out['uniform sample/s']:.2f}x (target >= 0.8x)", flush=True)

    k = max(1, N // 1000)
    amort = ReplayBuffer(N, (OBS,), (ACT,), sampler=ARBSampler(temperature=5.0, amortized_rows_per_refresh=k), seed=0)
    amort.extend(rows)
    out["ARB amortized refresh/s"] = rate(lambda: amort.refresh(score), args.seconds)
    sac_buf = uni
    out["SAC update/s"] = rate(lambda: agent.update(sac_buf.sample(BATCH)), args.seconds, warmup=3)
    added = out["SAC update/s"] / out["ARB amortized refresh/s"]
    out["ARB amortized cost / SAC update"] = added
    print(f"ARB amortized ({k:,} rows per step): {1e3 / out['ARB amortized refresh/s']:.2f} ms per step = "
          f"{100 * added:.1f}% of a SAC update ({1e3 / out['SAC update/s']:.1f} ms) (target <= 10%)", flush=True)

    def reaper_rate(n: int) -> tuple[float, float]:
        buf = ReplayBuffer(n, (OBS,), (ACT,), sampler=ReaPERSampler(0.4, 0.2, 0.4), seed=0)
        buf.extend({key: v[:n] for key, v in rows.items()})
        td = np.random.default_rng(1).random(BATCH)

        def step():
            b = buf.sample(BATCH)
            buf.update(b.info, td_error=td)

        info = buf.sample(BATCH).info
        return rate(step, args.seconds), rate(lambda: buf.update(info, td_error=td), args.seconds)

    out["ReaPER sample+update/s"], upd_big = reaper_rate(N)
    _, upd_small = reaper_rate(10_000)
    out["ReaPER update/s at N"], out["ReaPER update/s at 10k"] = upd_big, upd_small

    import cpprb

    env_dict = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS}, "done": {}}
    per = cpprb.PrioritizedReplayBuffer(N, env_dict, alpha=0.6)
    per.add(obs=rows["obs"], act=rows["action"], rew=rows["reward"], next_obs=rows["next_obs"],
            done=(rows["terminated"] | rows["truncated"]).astype(np.float32))
    td = np.random.default_rng(1).random(BATCH)

    def cpprb_step():
        s = per.sample(BATCH, beta=0.4)
        per.update_priorities(s["indexes"], td)

    out["cpprb PER sample+update/s"] = rate(cpprb_step, args.seconds)
    print(f"ReaPER sample + update: {out['ReaPER sample+update/s']:,.0f}/s vs cpprb PER "
          f"{out['cpprb PER sample+update/s']:,.0f}/s -> "
          f"{out['ReaPER sample+update/s'] / out['cpprb PER sample+update/s']:.2f}x (target >= 1x)", flush=True)
    print(f"ReaPER update cost at {N:,} rows / at 10k rows: {upd_small / upd_big:.2f}x (target <= 1.5x)", flush=True)
    out["command"] = "python bench/adaptive_samplers.py " + " ".join(argv or sys.argv[1:])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
