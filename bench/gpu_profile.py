"""Where the device path's time goes: CUDA kernels, host copies and syncs per replay call and per RLPD update.

    python bench/gpu_profile.py bench/out/gpu_profile.json cuda 1000000     # OUT DEVICE ROWS (ran on an H200)

torch.profiler over 20 calls each: device / host uniform sample, device / host PER sample + priority update (the host
variants with the copies a GPU agent makes), one RLPD update with the replay on the device. Prints wall time, GPU
busy time, kernels, launches, syncs, copies per call, and the 12 operators with the most CPU time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu import ACT, BATCH, OBS, rows  # noqa: E402
from relive.agents.sac import SAC, SACConfig  # noqa: E402
from relive.replay import ReplayBuffer  # noqa: E402
from relive.replay.samplers import MixtureSampler, PrioritizedSampler, UniformSampler  # noqa: E402

LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def main(out_path: str, dev: str = "cuda", n_rows: int = 1_000_000) -> dict:
    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    out: dict = {}

    def prof(name, fn, n=20):
        for _ in range(5):
            fn()
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(n):
                fn()
            sync()
        ev = p.key_averages()
        cuda = torch.autograd.DeviceType.CUDA
        sync()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        top = [(e.key, round(e.self_cpu_time_total / n, 1), e.count // n)
               for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:12]]
        out[name] = dict(wall_us=(time.perf_counter() - start) / n * 1e6,
                         gpu_busy_us=sum(e.self_device_time_total for e in ev if e.device_type == cuda) / n,
                         kernels=sum(e.count for e in ev if e.device_type == cuda) / n,
                         launches=sum(e.count for e in ev if e.key in LAUNCH) / n,
                         syncs=sum(e.count for e in ev if "Synchronize" in e.key) / n,
                         memcpy_calls=sum(e.count for e in ev if "Memcpy" in e.key and e.device_type != cuda) / n,
                         top_cpu=top)
        print(name, {k: v for k, v in out[name].items() if k != "top_cpu"}, flush=True)
        for t in top:
            print("    ", t, flush=True)

    data = rows(n_rows, np.random.default_rng(0))
    td = torch.rand(BATCH, device=dev)
    for label, kw in (("device", {"backend": "torch", "device": dev}), ("host", {})):
        for sname, sampler in (("uniform", UniformSampler), ("per", PrioritizedSampler)):
            buf = ReplayBuffer(n_rows, OBS, ACT, sampler=sampler(), **kw)
            for lo in range(0, n_rows, 100_000):
                buf.extend({k: v[lo:lo + 100_000] for k, v in data.items()})

            def call(b=buf, label=label, per=sname == "per"):
                batch = b.sample(BATCH)
                if label == "host":
                    batch.to_torch(dev)
                if per:
                    b.update(batch.info, td_error=td if label == "device" else td.cpu().numpy())

            prof(f"{label} {sname}", call)
    cfg = SACConfig.rlpd(actor_per_env_step=False, actor_every=20)  # (a benchmark's own loop: the count)
    agent = SAC(OBS, ACT, -np.ones(ACT), np.ones(ACT), cfg, seed=0, device=dev)
    buf = ReplayBuffer(20_000, OBS, ACT, sampler=MixtureSampler(UniformSampler(), UniformSampler(), 0.5),
                       backend="torch", device=dev)
    buf.add_offline({k: v[:min(n_rows, 20_000) // 2] for k, v in data.items()})
    buf.extend({k: v[:2_000] for k, v in data.items()})

    def update():
        b = buf.sample(BATCH)
        buf.update(b.info, **agent.update(b).signals)

    prof("rlpd update (eager, replay on device)", update)
    Path(out_path).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3]), *(int(a) for a in sys.argv[3:4]))
