"""Scaling out (issue 16): env steps/s with N envs in one process or N Ray collectors, next to the single-env loop;
learner updates/s with and without collectors.

Collection: the SAC actor (hidden 256x256, CPU, 1 torch thread) acts with exploration on every step, as in
training; no learning. Modes, each for ``--steps`` env steps after a warm-up:

- ``loop``: the trainer's single-env ``Collector`` (one policy call per env step);
- ``sync N`` / ``async N``: ``VectorCollector`` over a Gymnasium vector env (one policy call per step for all N);
- ``ray N``: N collector actors (``relive.train.ray_collectors``) on a local Ray, chunks of ``--chunk`` env steps
  each, shipped to this process and stored in a replay buffer; the rate limiter never blocks (no learner).

Learner: ``relive train sac`` with UTD 1 for ``--train-steps`` online env steps (warm-up ``--train-steps / 4``),
in-process (one env, collect and update alternate) and with ``--collectors 2``; updates/s = gradient steps / wall
time between the first metrics line after the warm-up and the last (from ``metrics.jsonl``).

    PYTHONPATH=src python bench/scaling.py --env Hopper-v5 --steps 4000 --out docs/img/scaling.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def load_average() -> float:
    return os.getloadavg()[0]


def make_agent(env_id: str):
    from relive.agents.sac import SACConfig
    from relive.config import ExperimentConfig
    from relive.envs import env_spec, make_env
    from relive.train.trainer import build_agent

    cfg = ExperimentConfig(agent=SACConfig())
    env = make_env(env_id)
    spec = env_spec(env)
    env.close()
    return build_agent(cfg, spec, np.random.SeedSequence(0)), spec


def local_rate(env_id: str, mode: str, n: int, steps: int) -> float:
    import torch

    from relive.envs import make_env, make_vector_env
    from relive.train.collector import Collector, VectorCollector

    torch.set_num_threads(1)
    agent, spec = make_agent(env_id)
    policy = lambda obs: agent.act(obs, explore=True)  # noqa: E731
    if mode == "loop":
        c = Collector(make_env(env_id), spec, 0)
    else:
        c = VectorCollector(make_vector_env(env_id, n, mode), spec, 0)
    c.step_streams(policy, 200)  # warm-up (async: the subprocesses are up)
    t = time.perf_counter()
    _, done = c.step_streams(policy, steps)
    rate = done / (time.perf_counter() - t)
    if mode != "loop":
        c.close()
    return rate


def ray_rate(env_id: str, n: int, steps: int, chunk: int) -> float:
    """N collector actors with nothing to wait for; env steps/s received and stored by this process."""
    from relive.config import CollectorsConfig, EnvConfig, ExperimentConfig
    from relive.replay import ReplayBuffer
    from relive.train.ray_collectors import RateLimiter, RayCollectors

    cfg = ExperimentConfig(env=EnvConfig(id=env_id), collectors=CollectorsConfig(num=n, chunk_env_steps=chunk))
    agent, spec = make_agent(env_id)
    pool = RayCollectors(cfg, seed=0)
    pool.connect()
    buffer = ReplayBuffer(steps + 10 * n * chunk, spec.obs_shape, spec.action_shape, seed=0)
    limiter = RateLimiter((1, 1), min_inserts=10**12, max_lag=10**9)  # never blocks
    pool.publish(agent, 0)

    def run_until(total: int) -> None:
        while limiter.inserts < total:
            pool.request(limiter, total - limiter.inserts, 0)
            for kind, chunk_ in pool.poll(block=True):
                assert kind == "chunk"
                for stream, rows in chunk_["streams"]:
                    buffer.extend(rows, stream=chunk_["collector"] + stream)
                limiter.inserts += chunk_["env_steps"]

    run_until(2 * n * chunk)  # warm-up: every actor started and has delivered
    while pool.in_flight:
        for _, chunk_ in pool.poll(block=True):
            limiter.inserts += chunk_["env_steps"]
    start, t = limiter.inserts, time.perf_counter()
    run_until(start + steps)
    rate = (limiter.inserts - start) / (time.perf_counter() - t)
    pool.close()
    return rate


def learner_rate(env_id: str, steps: int, collectors: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["relive", "train", "sac", "--env", env_id, "--online-steps", str(steps), "--warmup", str(steps // 4),
               "--eval-every", str(10 * steps), "--eval-episodes", "1", "--log-every", str(steps // 4), "--no-progress",
               "--run-dir", f"{tmp}/r"]
        if collectors:
            cmd += ["--collectors", str(collectors)]
        from relive.cli import main

        main(cmd[1:])
        rows = [json.loads(x) for x in Path(f"{tmp}/r/metrics.jsonl").read_text().splitlines()]
        online = [r for r in rows if r.get("phase") == "online" and r["grad_step"] > 0]
        first, last = online[0], online[-1]  # (after the warm-up: both have updates)
        t = [r["grad_step"] / r["time/grad_steps_per_s"] for r in (first, last)]  # seconds since the phase began
        return {"grad_steps_per_s": (last["grad_step"] - first["grad_step"]) / (t[1] - t[0]),
                "env_steps_per_s": (last["env_step"] - first["env_step"]) / (t[1] - t[0])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="Hopper-v5")
    p.add_argument("--steps", type=int, default=4000, help="env steps measured per collection point")
    p.add_argument("--chunk", type=int, default=100, help="Ray collectors: env steps per chunk")
    p.add_argument("--counts", default="1,2,4", help="numbers of envs / collectors")
    p.add_argument("--train-steps", type=int, default=2000, help="online env steps of each learner run (0: skip)")
    p.add_argument("--out", default="docs/img/scaling.png")
    p.add_argument("--json", default=None, help="results file (default: --out with .json)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the collection points (median reported; the "
                   "rounds alternate over all points, so a burst of load hits one round, not one mode)")
    p.add_argument("--plot-only", metavar="JSON", help="redraw the plot from a results file")
    a = p.parse_args()
    if a.plot_only:
        plot(json.loads(Path(a.plot_only).read_text()), Path(a.out))
        return
    counts = [int(x) for x in a.counts.split(",")]
    import ray

    ray.init(address="local", num_cpus=max(counts), include_dashboard=False, log_to_driver=False)  # once, for all
    res = {"env": a.env, "cpu": cpu_model(), "cores": os.cpu_count(), "steps": a.steps, "chunk": a.chunk,
           "repeats": a.repeats, "loads": [load_average()], "collect": {}, "rounds": {}, "learner": {}}
    points = [("loop", 1)] + [(m, n) for m in ("sync", "async", "ray") for n in counts if not (m == "async" and n == 1)]
    for r in range(a.repeats):
        for mode, n in points:
            rate = ray_rate(a.env, n, a.steps, a.chunk) if mode == "ray" else local_rate(a.env, mode, n, a.steps)
            res["rounds"].setdefault(mode, {}).setdefault(str(n), []).append(rate)
            res["loads"].append(load_average())
            print(f"round {r}: {mode} {n}: {rate:.0f} env steps/s (load {load_average():.1f})", flush=True)
    res["collect"] = {m: {n: float(np.median(v)) for n, v in d.items()} for m, d in res["rounds"].items()}
    if a.train_steps:
        for k in (0, 2):
            res["learner"][str(k)] = learner_rate(a.env, a.train_steps, k)
            print("learner, collectors", k, res["learner"][str(k)], flush=True)
    ray.shutdown()
    res["loads"].append(load_average())
    out = Path(a.out)
    Path(a.json or out.with_suffix(".json")).write_text(json.dumps(res, indent=1))
    plot(res, out)


def plot(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = res["collect"]["loop"]["1"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, label in (("sync", "vector env, sync"), ("async", "vector env, async"), ("ray", "Ray collectors")):
        pts = sorted((int(n), r / base) for n, r in res["collect"][mode].items())
        ax.plot([n for n, _ in pts], [r for _, r in pts], "o-", label=label)
    ax.axhline(1.0, color="gray", ls="--", lw=1, label="single-env loop (= 1)")
    ax.set_xlabel("envs (vector) or collectors (Ray)")
    ax.set_ylabel("env steps/s relative to the single-env loop")
    ax.set_xticks(sorted({int(n) for m in res["collect"].values() for n in m}))
    loads = res.get("loads", [])
    shared = f", shared: load {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    ax.set_title(f"{res['env']}, SAC actor acting; {res['cores']}-core {res['cpu']}{shared}\n"
                 f"median of {res.get('repeats', 1)} round(s); single-env loop = {base:.0f} env steps/s", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
