"""A small write two ways, interleaved in one process: ``extend`` of k rows against a ``Stage`` commit of the same
k rows (``ReplayBuffer.stage``), one stream, on a full ring (every write evicts), CartPole-shaped rows (obs 4, action 1
int64) and HalfCheetah-shaped ones (obs 17, action 6 float32). Microseconds per write, median of per-round times,
and extend / commit (> 1: the commit is faster).

    PYTHONPATH=src python bench/stage_commit.py                  # ~1 minute
    PYTHONPATH=src python bench/stage_commit.py --rows 4 --rounds 15
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics

import numpy as np

from _timing import per_call
from relive.replay import ReplayBuffer
from relive.testing import random_transitions


def pair(obs: int, act: int, action_dtype, k: int, capacity: int):
    rows = random_transitions(k, obs, act, rng=0, episode_length=50)
    rows["action"] = rows["action"].astype(action_dtype)
    fill = random_transitions(capacity, obs, act, rng=1, episode_length=50)
    fill["action"] = fill["action"].astype(action_dtype)
    bufs = []
    for _ in range(2):
        buf = ReplayBuffer(capacity, (obs,), (act,), action_dtype=action_dtype, seed=0)
        buf.extend(fill)
        bufs.append(buf)
    stage = bufs[1].stage(rows=k)
    for name, column in stage.columns.items():
        column[0, :k] = rows[name]
    return (lambda: bufs[0].extend(rows)), (lambda: stage.commit(k))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--seconds", type=float, default=0.3, help="per variant per round")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    res: dict = {"machine": platform.processor() or platform.machine(), "results": {}}
    for label, obs, act, dtype in (("CartPole-shaped", 4, 1, np.int64), ("HalfCheetah-shaped", 17, 6, np.float32)):
        for k in args.rows:
            extend, commit = pair(obs, act, dtype, k, args.capacity)
            times: dict[str, list[float]] = {"extend": [], "commit": []}
            for _ in range(args.rounds):
                for name, fn in (("extend", extend), ("commit", commit)):
                    times[name].append(per_call(fn, args.seconds) * 1e6)
            med = {n: statistics.median(t) for n, t in times.items()}
            ratios = [a / b for a, b in zip(times["extend"], times["commit"], strict=True)]
            row = {"extend_us": round(med["extend"], 2), "commit_us": round(med["commit"], 2),
                   "extend_over_commit": round(statistics.median(ratios), 2)}
            res["results"][f"{label}, {k} rows"] = row
            print(f"{label:19s} {k:3d} rows: extend {row['extend_us']:6.2f} us, commit {row['commit_us']:6.2f} us, "
                  f"extend / commit {row['extend_over_commit']:.2f}x", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
