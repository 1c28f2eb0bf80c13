"""The GPU path: replay ops on the device and RLPD at UTD 20, with the replay on the device vs in host memory.

    python bench/gpu.py                          # on a machine with CUDA; prints "no GPU" and exits 0 otherwise
    python bench/gpu.py --device cpu --rows 2000 --env-steps 40 --seconds 0.2     # the script itself, on CPU

1. Replay ops at ``--rows`` rows (Hopper shapes: obs 11, action 3), batch 256, in one process, interleaved over
   ``--rounds`` rounds (median): a device buffer (``ReplayBuffer(backend="torch", device=...)``: uniform sample;
   PER sample + priority update with the TD errors already on the device, in both PER layouts) vs the host
   buffer as a GPU agent uses it (NumPy sample, the batch copied to the device, the TD errors copied back for
   the update).
2. RLPD at UTD 20 (``SACConfig.rlpd()``: 10 LayerNorm critics, symmetric 50/50 sampling over ``--offline-rows``
   random-policy rows and the online ones) on ``--env`` for ``--env-steps`` env steps after a warm-up of 1,000
   random steps (untimed): env steps/s and updates/s, replay on the device vs in host memory, the agent on the
   device in both; ``--compile`` adds the critics under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs).

The results go to stdout and, with ``--out``, to a JSON file (with the GPU's name and the command).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

OBS, ACT, BATCH = 11, 3, 256


def rows(n: int, rng: np.random.Generator) -> dict:
    return dict(obs=rng.normal(size=(n, OBS)).astype(np.float32),
                action=rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
                reward=rng.normal(size=n).astype(np.float32), next_obs=rng.normal(size=(n, OBS)).astype(np.float32),
                terminated=rng.random(n) < 0.001, truncated=np.zeros(n, bool))


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, seconds: float, device, warmup: int = 5) -> float:
    """Calls per second of ``fn`` (the device synchronized before the clock starts and stops)."""
    for _ in range(warmup):
        fn()
    sync(device)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    sync(device)
    return n / (time.perf_counter() - start)


def replay_ops(args) -> dict:
    import torch

    from relive.replay import ReplayBuffer
    from relive.replay.samplers import PrioritizedSampler, UniformSampler
    from relive.replay.samplers.device import DevicePrioritizedSampler

    rng = np.random.default_rng(0)
    data = rows(args.rows, rng)
    bufs = {}
    dev = {"backend": "torch", "device": args.device}
    for name, sampler, kw in (("device uniform", UniformSampler, dev), ("host uniform", UniformSampler, {}),
                              ("device per", PrioritizedSampler, dev),  # the default layout, "scan"
                              ("device per, tree layout", lambda: DevicePrioritizedSampler(layout="tree"), dev),
                              ("host per", PrioritizedSampler, {})):
        buf = ReplayBuffer(args.rows, OBS, ACT, sampler=sampler(), **kw)
        for lo in range(0, args.rows, 100_000):
            buf.extend({k: v[lo : lo + 100_000] for k, v in data.items()})
        bufs[name] = buf
    td_dev = torch.rand(BATCH, device=args.device)

    def device_uniform():
        bufs["device uniform"].sample(BATCH)

    def host_uniform():
        bufs["host uniform"].sample(BATCH).to_torch(args.device)

    def device_per():
        b = bufs["device per"].sample(BATCH)
        bufs["device per"].update(b.info, td_error=td_dev)

    def device_per_tree():
        b = bufs["device per, tree layout"].sample(BATCH)
        bufs["device per, tree layout"].update(b.info, td_error=td_dev)

    def host_per():
        b = bufs["host per"].sample(BATCH).to_torch(args.device)
        bufs["host per"].update(b.info, td_error=td_dev.cpu().numpy())

    fns = {"device uniform": device_uniform, "host uniform": host_uniform, "device per": device_per,
           "device per, tree layout": device_per_tree, "host per": host_per}
    per_round = {k: [] for k in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            per_round[name].append(timed(fn, args.seconds, args.device))
    out = {name: statistics.median(v) for name, v in per_round.items()}
    out["ratio uniform (device / host)"] = statistics.median(
        d / h for d, h in zip(per_round["device uniform"], per_round["host uniform"], strict=True))
    out["ratio per (device / host)"] = statistics.median(
        d / h for d, h in zip(per_round["device per"], per_round["host per"], strict=True))
    out["ratio per (scan / tree layout)"] = statistics.median(
        d / h for d, h in zip(per_round["device per"], per_round["device per, tree layout"], strict=True))
    return out


def rlpd_loop(args, replay_device: str | None, compile_mode: str | None) -> dict:
    import gymnasium as gym
    import torch

    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ReplayBuffer
    from relive.replay.samplers import MixtureSampler, UniformSampler

    torch.manual_seed(0)
    env = gym.make(args.env)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    cfg = SACConfig.rlpd(actor_per_env_step=False, actor_every=args.utd,
                         **({"compile": True, "compile_mode": compile_mode} if compile_mode else {}))
    agent = SAC(obs_dim, act_dim, env.action_space.low, env.action_space.high, cfg, seed=0, device=args.device)
    kw = {"backend": "torch", "device": replay_device} if replay_device else {}
    buf = ReplayBuffer(args.offline_rows + args.env_steps + 2_000, obs_dim, act_dim,
                       sampler=MixtureSampler(UniformSampler(), UniformSampler(), 0.5), **kw)
    rng = np.random.default_rng(0)

    def collect(n: int, policy) -> dict:
        out = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
        for _ in range(n):
            a = policy(obs)
            nxt, r, term, trunc, _ = env.step(a)
            for k, v in zip(out, (obs, a, r, nxt, term, trunc), strict=True):
                out[k].append(v)
            obs = nxt if not (term or trunc) else env.reset()[0]
        return {k: np.asarray(v) for k, v in out.items()}

    buf.add_offline(collect(args.offline_rows, lambda o: env.action_space.sample()))
    buf.extend(collect(1_000, lambda o: env.action_space.sample()))  # the warm-up (untimed)
    obs, _ = env.reset(seed=1)
    for _ in range(3):  # first updates (and compilation) untimed
        batch = buf.sample(BATCH)
        buf.update(batch.info, **agent.update(batch).signals)
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.env_steps):
        a = agent.act(obs[None], explore=True)[0]
        nxt, r, term, trunc, _ = env.step(a)
        buf.extend({"obs": obs[None], "action": a[None], "reward": np.array([r]), "next_obs": nxt[None],
                    "terminated": np.array([term]), "truncated": np.array([trunc])})
        obs = nxt if not (term or trunc) else env.reset()[0]
        for _ in range(args.utd):
            batch = buf.sample(BATCH)
            buf.update(batch.info, **agent.update(batch).signals)
    sync(args.device)
    elapsed = time.perf_counter() - start
    return {"env_steps_per_s": args.env_steps / elapsed, "updates_per_s": args.env_steps * args.utd / elapsed}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="torch device (default cuda; cpu only to check the script)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--env-steps", type=int, default=500)
    p.add_argument("--utd", type=int, default=20)
    p.add_argument("--offline-rows", type=int, default=10_000)
    p.add_argument("--compile", action="store_true", help="also RLPD with the critics compiled (reduce-overhead)")
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no GPU (torch.cuda.is_available() is False): nothing measured")
        return 0
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    results = {"device": name, "command": " ".join(["python", "bench/gpu.py", *(argv or sys.argv[1:])])}
    print(f"device: {name}; rows {args.rows:,}, batch {BATCH}")
    results["replay"] = replay_ops(args)
    save(args, results)
    for k, v in results["replay"].items():
        print(f"  {k:32s} {v:12,.2f}" + ("" if k.startswith("ratio") else " /s"), flush=True)
    results["rlpd"] = {}
    variants = [("replay on device", args.device, None), ("replay in host memory", None, None)]
    if args.compile:
        variants += [("replay on device, compiled critics", args.device, "reduce-overhead"),
                     ("replay in host memory, compiled critics", None, "reduce-overhead")]
    print(f"RLPD on {args.env}, UTD {args.utd}, {args.env_steps} env steps (agent on {args.device}):")
    for label, replay_device, mode in variants:
        r = rlpd_loop(args, replay_device, mode)
        results["rlpd"][label] = r
        print(f"  {label:40s} {r['env_steps_per_s']:8.1f} env steps/s {r['updates_per_s']:9.1f} updates/s",
              flush=True)
        save(args, results)
    return 0


def save(args, results: dict) -> None:
    """Written after each section, so a run stopped at its time limit keeps what it measured."""
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())
