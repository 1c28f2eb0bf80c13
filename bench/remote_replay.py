"""The replay service (relive.replay.remote) against the local buffer and TorchRL's RayReplayBuffer, in one process.

Hopper-v5-shaped rows (obs 11, action 3, float32), ``--rows`` rows stored per configuration before sampling. For
each configuration (every one in this one process run, interleaved over ``--repeats`` rounds, median reported):

- ``extend``: rows/s of chunks of ``--chunk`` rows written by one writer (relive: asynchronous, up to 8 calls in
  flight, then ``flush``; streams alternate so 2 shards both take writes; TorchRL: ``extend`` of a TensorDict);
- ``sample``: ms per ``sample(B)`` call for each ``--batch`` (relive: uniform, the two round trips of the exact
  global draw; TorchRL: ``sample(B)``), and relive with ``prefetch(4, B)`` (what the learner waits for when a
  background thread draws ahead);
- ``PER sample + update``: ms per ``sample(B)`` + ``update(info, td_error=...)`` (relive only).

Configurations: the local ``ReplayBuffer`` (in process: the floor), ``RemoteReplay`` with in-process shards
(``ray=False``: the client's own cost, no transport), ``RemoteReplay`` on Ray with 1 and 2 shard actors, TorchRL's
``RayReplayBuffer`` (one actor holding a ``LazyTensorStorage`` buffer). One local Ray (``num_cpus=2``).

    PYTHONPATH=src .venv/bin/python bench/remote_replay.py --out docs/img/remote_replay.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from functools import partial

import numpy as np

OBS, ACT = 11, 3  # Hopper-v5


def rows(n: int, rng: np.random.Generator, start: int = 0) -> dict:
    t = np.arange(start, start + n)
    return {"obs": rng.normal(size=(n, OBS)).astype(np.float32), "action": rng.uniform(-1, 1, (n, ACT)).astype(
        np.float32), "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, OBS)).astype(
        np.float32), "terminated": np.zeros(n, bool), "truncated": t % 1000 == 999}


def timed(fn, seconds: float) -> float:
    """Seconds per call over about ``seconds`` (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if (elapsed := time.perf_counter() - start) >= seconds:
            return elapsed / n


class Relive:
    def __init__(self, name: str, make, chunk: int):
        self.name, self.make, self.chunk = name, make, chunk
        self.rng = np.random.default_rng(0)
        self.data = rows(chunk, self.rng)

    def build(self, prioritized: bool, capacity: int):
        self.buf = self.make(prioritized, capacity)
        self.stream = 0
        return self

    def extend(self):
        self.buf.extend(self.data, stream=self.stream)
        self.stream ^= 1

    def flush(self):
        getattr(self.buf, "flush", lambda: None)()

    def sample(self, b):
        return self.buf.sample(b)

    def sample_update(self, b):
        batch = self.buf.sample(b)
        self.buf.update(batch.info, td_error=self.rng.normal(size=b))

    def close(self):
        getattr(self.buf, "close", lambda: None)()


class TorchRL:
    name = "TorchRL RayReplayBuffer"

    def __init__(self, chunk: int):
        import torch
        from tensordict import TensorDict

        r = rows(chunk, np.random.default_rng(0))
        self.data = TensorDict({k: torch.as_tensor(v) for k, v in r.items()}, batch_size=[chunk])

    def build(self, prioritized: bool, capacity: int):
        from torchrl.data import LazyTensorStorage, RayReplayBuffer

        self.buf = RayReplayBuffer(storage=partial(LazyTensorStorage, capacity), remote_config={"num_cpus": 0})
        return self

    def extend(self):
        self.buf.extend(self.data)

    def flush(self):
        pass

    def sample(self, b):
        return self.buf.sample(b)

    def close(self):
        self.buf.shutdown() if hasattr(self.buf, "shutdown") else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--batch", default="32,256")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import ray

    from relive.replay import PrioritizedSampler, ReplayBuffer, UniformSampler
    from relive.replay.remote import RemoteReplay

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    batches = [int(b) for b in args.batch.split(",")]

    def sampler(p):
        return PrioritizedSampler() if p else UniformSampler()

    def remote(shards: int, on_ray: bool):
        return lambda p, cap: RemoteReplay(cap // shards + args.chunk, (OBS,), (ACT,), sampler(p), num_shards=shards,
                                           ray=on_ray)

    systems = [Relive("local ReplayBuffer", lambda p, cap: ReplayBuffer(cap, (OBS,), (ACT,), sampler(p)), args.chunk),
               Relive("RemoteReplay, 2 in-process shards", remote(2, False), args.chunk),
               Relive("RemoteReplay on Ray, 1 shard", remote(1, True), args.chunk),
               Relive("RemoteReplay on Ray, 2 shards", remote(2, True), args.chunk),
               TorchRL(args.chunk)]
    results: dict[str, dict[str, list[float]]] = {s.name: {} for s in systems}

    def record(name, key, value):
        results[name].setdefault(key, []).append(value)

    n_chunks = args.rows // args.chunk
    for rnd in range(args.repeats):
        for sys_ in systems:
            for prioritized in (False, True):
                if prioritized and isinstance(sys_, TorchRL):
                    continue
                s = sys_.build(prioritized, args.rows + 2 * args.chunk)
                for _ in range(4):  # warm-up (compiled kernels, Ray's first calls): not timed, not counted
                    s.extend()
                s.flush()
                start = time.perf_counter()
                for _ in range(n_chunks):
                    s.extend()
                s.flush()
                if not prioritized:
                    record(s.name, "extend rows/s", n_chunks * args.chunk / (time.perf_counter() - start))
                for b in batches:
                    if prioritized:
                        record(s.name, f"PER sample+update({b}) ms", 1e3 * timed(lambda b=b, s=s: s.sample_update(b),
                                                                                  args.seconds))
                        continue
                    record(s.name, f"sample({b}) ms", 1e3 * timed(lambda b=b, s=s: s.sample(b), args.seconds))
                    if isinstance(s, Relive) and hasattr(s.buf, "prefetch") and b == batches[-1]:
                        s.buf.prefetch(4, b)
                        record(s.name, f"sample({b}) prefetch 4 ms", 1e3 * timed(lambda b=b, s=s: s.sample(b),
                                                                                 args.seconds))
                s.close()
        print(f"round {rnd + 1}/{args.repeats} done", flush=True)

    keys = list(dict.fromkeys(k for r in results.values() for k in r))
    base = results["local ReplayBuffer"]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores; uptime: {uptime}")
    print("| configuration | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for name, r in results.items():
        cells = []
        for k in keys:
            if k not in r:
                cells.append("")
                continue
            med = statistics.median(r[k])
            ref = base.get(k, base.get(k.replace(" prefetch 4", "")))
            ratio = med / statistics.median(ref) if ref else float("nan")
            cells.append(f"{med:,.0f} ({ratio:.2f}x)" if "rows/s" in k else f"{med:.3f} ({ratio:.1f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results, "cpus": os.cpu_count()}, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
