"""Seeds as a batch dimension (issue 15, item 4): S DDQN updates one after the other vs one BatchedDDQN update,
and whole grids: runs per hour with ``relive bench run --seed-batch S`` against one process per run.

    python bench/seed_batch.py --seeds 1 5 10 --threads 1
    python bench/seed_batch.py --grid-runs 10 --seeds 1 5 10 --steps 10000

``--grid-runs N``: a grid of N seeds of the ``reaper-authors`` Acrobot-v1 PER cell cut to ``--steps`` env steps without
the early stop (so every run does the same work), run with ``run_grid(..., workers=2, seed_batch=S)`` for each S
(S = 1: N processes, two at a time; S = 5: two processes of 5 seeds; S = 10: one process of 10), each from an empty
directory; reported: wall time and runs per hour, and the ratio to S = 1.

The ReaPER setting (``reaper-authors`` grid, Acrobot-v1): obs 6, 3 actions, 64x64 Q-network, batch 128, gradient
clip 10, Adam. Each contender updates S seeds on S pre-sampled PER batches (``ReplayBuffer.sample`` of S buffers with
2,000 random rows each; the sampling and priority updates, the same in both, are not timed). Timed interleaved
in rounds (median over rounds of the per-call times); reported: microseconds per seed-update for each, and the
speed-up of the batched update (ratio of the per-call times, median of the per-round ratios). This is the update
alone: a training run also steps its env, acts and evaluates per seed, which batching does not change.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from _timing import per_call
from relive.agents.ddqn import DDQN, DDQNConfig
from relive.agents.ddqn_batched import BatchedDDQN
from relive.replay import PrioritizedSampler, ReplayBuffer

OBS, ACTIONS, BATCH = 6, 3, 128


def batches(s: int) -> list:
    out = []
    for seed in range(s):
        rng = np.random.default_rng(seed)
        buf = ReplayBuffer(2000, OBS, (), sampler=PrioritizedSampler(), seed=seed, action_dtype=np.int64)
        n = 2000
        buf.extend({"obs": rng.normal(size=(n, OBS)).astype(np.float32), "action": rng.integers(0, ACTIONS, n),
                    "reward": rng.normal(size=n).astype(np.float32),
                    "next_obs": rng.normal(size=(n, OBS)).astype(np.float32),
                    "terminated": np.arange(n) % 200 == 199, "truncated": np.zeros(n, bool)})
        out.append(buf.sample(BATCH))
    return out


def grid_runs(n: int, seeds: list[int], steps: int) -> dict:
    import tempfile

    from relive.experiments.grid import load_grid, parse_grid
    from relive.experiments.runner import run_grid

    base = load_grid("reaper-authors")
    spec = next(r for r in base.runs() if r.task == "Acrobot-v1" and r.label == "per")
    args = list(spec.args)
    i = args.index("--stop-at-return")
    del args[i:i + 2]
    i = args.index("--online-steps")
    args[i + 1] = str(steps)
    grid = parse_grid({"name": "seedbatch", "seeds": n, "tasks": ["Acrobot-v1"],
                       "variant": [{"label": "per", "preset": "ddqn", "args": args}]})
    out = {}
    for s in seeds:
        with tempfile.TemporaryDirectory() as root:
            start = time.perf_counter()
            outcomes = run_grid(grid, root, workers=2, progress=False, seed_batch=s)
            seconds = time.perf_counter() - start
        ok = sum(o.status == "finished" for o in outcomes)
        out[s] = {"seconds": seconds, "finished": ok, "runs_per_hour": 3600 * ok / seconds}
        print(f"--seed-batch {s:2d}: {ok} runs in {seconds:6.1f} s = {out[s]['runs_per_hour']:6.0f} runs/hour "
              f"({out[s]['runs_per_hour'] / out[seeds[0]]['runs_per_hour']:.2f}x --seed-batch {seeds[0]})")
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 5, 10])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--grid-runs", type=int, default=0, help="time whole grids of this many runs instead")
    p.add_argument("--steps", type=int, default=10000, help="env steps per run with --grid-runs")
    p.add_argument("--json", default="bench/out/seed_batch.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.grid_runs:
        out = {"args": vars(args), "results": grid_runs(args.grid_runs, args.seeds, args.steps)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).with_name("seed_batch_grid.json").write_text(json.dumps(out, indent=1))
        return out
    cfg = DDQNConfig(hidden=(64, 64), lr=6.3e-4, target_update_period=250)
    results = {}
    for s in args.seeds:
        data = batches(s)
        singles = [DDQN(OBS, ACTIONS, cfg, seed=i) for i in range(s)]
        batched = BatchedDDQN([DDQN(OBS, ACTIONS, cfg, seed=i) for i in range(s)])

        def separate(singles=singles, data=data):
            for a, b in zip(singles, data, strict=True):
                a.update(b)

        def together(batched=batched, data=data):
            batched.update(data)

        times = {"separate": [], "batched": []}
        for _ in range(args.rounds):
            for name, fn in (("separate", separate), ("batched", together)):
                times[name].append(per_call(fn, args.seconds))
        ratios = [a / b for a, b in zip(times["separate"], times["batched"], strict=True)]
        results[s] = {"us_per_seed_update_separate": 1e6 * statistics.median(times["separate"]) / s,
                      "us_per_seed_update_batched": 1e6 * statistics.median(times["batched"]) / s,
                      "speedup_median": statistics.median(ratios), "speedup_min": min(ratios),
                      "speedup_max": max(ratios)}
        r = results[s]
        print(f"S = {s:2d}: {r['us_per_seed_update_separate']:7.0f} us / seed-update separate, "
              f"{r['us_per_seed_update_batched']:7.0f} batched: {r['speedup_median']:.2f}x "
              f"(rounds {r['speedup_min']:.2f}-{r['speedup_max']:.2f})")
    out = {"args": vars(args), "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
           "results": results}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
