"""RLPD's eager update on a GPU: what the ensemble LayerNorm's formulation costs, and how many kernels an update is.

    python bench/gpu_update.py --out bench/out/gpu_update.json          # on a machine with CUDA
    python bench/gpu_update.py --device cpu --updates 3 --rounds 1     # the script itself, on CPU

``SACConfig.rlpd()`` (10 LayerNorm critics, UTD 20) on Hopper shapes (obs 11, action 3), batch 256, the replay on the
device with 50/50 symmetric sampling. Times per update (median over ``--rounds`` interleaved rounds of ``--updates``
updates), once with the ensemble LayerNorm computed member by member (``_EnsembleLayerNorm``, the CPU path) and
once with the plain formulation (``addcmul(bias, layer_norm(x), weight)``, what ``EnsembleLayerNorm`` runs on a GPU),
then counts the CUDA kernels and host-to-device copies of one update (``torch.profiler``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import BATCH, OBS, rows, sync  # noqa: E402  (the same rows and synchronization as bench/gpu.py)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="torch device (default cuda; cpu only to check the script)")
    p.add_argument("--updates", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from relive.agents import networks as nets
    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ReplayBuffer
    from relive.replay.samplers import MixtureSampler, UniformSampler

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no GPU (torch.cuda.is_available() is False): nothing measured")
        return 0
    data = rows(12_000, np.random.default_rng(0))
    cfg = SACConfig.rlpd(actor_per_env_step=False, actor_every=20)  # (a benchmark's own loop: the count)
    agent = SAC(OBS, 3, -np.ones(3), np.ones(3), cfg, seed=0, device=args.device)
    buf = ReplayBuffer(20_000, OBS, 3, sampler=MixtureSampler(UniformSampler(), UniformSampler(), 0.5),
                       backend="torch", device=args.device)
    buf.add_offline({k: v[:10_000] for k, v in data.items()})
    buf.extend({k: v[10_000:] for k, v in data.items()})

    def step():
        batch = buf.sample(BATCH)
        buf.update(batch.info, **agent.update(batch).signals)

    plain = nets.EnsembleLayerNorm.forward

    def member_loop(self, x, members=None):
        weight, bias = (self.weight, self.bias) if members is None else (self.weight[members], self.bias[members])
        return nets._EnsembleLayerNorm.apply(x, weight, bias)

    def per_update_us() -> float:
        for _ in range(3):
            step()
        sync(args.device)
        start = time.perf_counter()
        for _ in range(args.updates):
            step()
        sync(args.device)
        return (time.perf_counter() - start) / args.updates * 1e6

    times: dict[str, list[float]] = {"member loop": [], "plain": []}
    try:
        for _ in range(args.rounds):
            for label, forward in (("member loop", member_loop), ("plain", plain)):
                nets.EnsembleLayerNorm.forward = forward
                times[label].append(per_update_us())
    finally:
        nets.EnsembleLayerNorm.forward = plain
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    results = {"device": name, "command": " ".join(["python", "bench/gpu_update.py", *(argv or sys.argv[1:])]),
               "us_per_update": {k: statistics.median(v) for k, v in times.items()}}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        for _ in range(10):
            step()
        sync(args.device)
    events = prof.key_averages()
    results["kernels_per_update"] = sum(e.count for e in events if e.device_type.name == "CUDA") / 10
    results["h2d_copies_per_update"] = sum(e.count for e in events if e.key == "cudaMemcpyAsync") / 10
    print(f"device: {name}; RLPD update (10 LayerNorm critics, batch {BATCH}), replay on the device")
    for label, us in results["us_per_update"].items():
        print(f"  LayerNorm {label:12s} {us:10,.0f} us per update")
    print(f"  plain formulation: {results['kernels_per_update']:.0f} kernels, "
          f"{results['h2d_copies_per_update']:.0f} host copies per update")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
