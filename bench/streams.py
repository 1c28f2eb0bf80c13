"""Several streams into one buffer (issue 16): extend and sample throughput with 1 stream vs K streams.

Hopper-shaped rows (obs 11, action 3), a full ring of ``--rows`` online rows, episodes of 1000 steps per stream.
One "extend" = 1000 rows: with K streams, K chunks of 1000 / K rows, one per stream (the vector-env collector's
write pattern), so every call evicts rows of every stream. Samplers: uniform (the plain path) and ReaPER (whose
per-episode sums follow each stream). Reports rows/s for extend and batches/s for sample (batch 256) and for
ReaPER sample + td update: the fastest ~20 ms batch of calls within ``--seconds``, median over ``--repeats``
rounds.

    python bench/streams.py --streams 1,1/4,4                     # this tree
    PYTHONPATH=/path/to/old/src python bench/streams.py --streams 1   # the same numbers before streams existed
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import statistics
import time

import numpy as np

from relive.replay import ReaPERSampler, ReplayBuffer, UniformSampler

OBS, ACT, BATCH, CHUNK, EPISODE = 11, 3, 256, 1000, 1000


def rows(n: int, t0: int, rng) -> dict:
    t = t0 + np.arange(n)
    end = (t % EPISODE) == EPISODE - 1
    return dict(obs=rng.normal(size=(n, OBS)).astype(np.float32),
                action=rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
                reward=rng.normal(size=n).astype(np.float32), next_obs=rng.normal(size=(n, OBS)).astype(np.float32),
                terminated=np.zeros(n, bool), truncated=end)


def rate(fn, seconds: float, warmup: int = 5) -> float:
    """Calls per second of the fastest of many short batches (~20 ms each) within ``seconds``: on a machine
    shared with other work a mean rate moves by +-30% between rounds, the best batch much less (interference
    only ever slows a batch down)."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    per_batch = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-6)))
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        best = min(best, time.perf_counter() - t0)
    return per_batch / best


def measure(sampler_name: str, spec: str, capacity: int, seconds: float) -> dict:
    """``spec``: "K" = K streams, one chunk of 1000 / K rows each per round; "1/K" = one stream, K such chunks
    (the same write sizes with no stream switching: what several streams cost beyond smaller writes)."""
    k, splits = (1, int(spec[2:])) if spec.startswith("1/") else (int(spec), int(spec))
    rng = np.random.default_rng(0)
    sampler = UniformSampler() if sampler_name == "uniform" else ReaPERSampler()
    buf = ReplayBuffer(capacity, (OBS,), (ACT,), sampler=sampler, seed=0)
    has_streams = "stream" in inspect.signature(buf.extend).parameters
    if k > 1 and not has_streams:
        return {}
    per = CHUNK // splits
    pool = [rows(per, 0, rng) for _ in range(8)]  # pre-made chunks: time the buffer, not the row generator
    clock = [0] * k
    state = {"i": 0}

    def extend():
        for j in range(splits):
            s = j % k
            chunk = dict(pool[state["i"] % len(pool)])
            t = clock[s] + np.arange(per)
            chunk["truncated"] = (t % EPISODE) == EPISODE - 1
            buf.extend(chunk, stream=s) if has_streams else buf.extend(chunk)
            clock[s] += per
            state["i"] += 1

    while buf.num_online < capacity:  # a full ring: every extend evicts
        extend()
    out = {"extend_rows_per_s": rate(extend, seconds) * CHUNK}
    out["sample_per_s"] = rate(lambda: buf.sample(BATCH), seconds)
    if sampler_name == "reaper":
        def sample_update():
            b = buf.sample(BATCH)
            buf.update(b.info, td_error=rng.normal(size=BATCH))
        out["sample_update_per_s"] = rate(sample_update, seconds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--streams", default="1,1/4,4", help="comma-separated: K streams, or 1/K (one stream, "
                    "K chunks per 1000 rows)")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    results = {}
    for sampler in ("uniform", "reaper"):
        for k in args.streams.split(","):
            rounds = [measure(sampler, k, args.rows, args.seconds) for _ in range(args.repeats)]
            if not rounds[0]:
                print(f"{sampler:8s} streams={k}: this tree has no streams")
                continue
            med = {m: statistics.median(r[m] for r in rounds) for m in rounds[0]}
            results[f"{sampler}/{k}"] = med
            print(f"{sampler:8s} streams={k:4s}: " + "  ".join(f"{m} {v:,.0f}" for m, v in med.items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "python": platform.python_version(), "numpy": np.__version__,
                       "rows": args.rows}, f, indent=1)


if __name__ == "__main__":
    main()
