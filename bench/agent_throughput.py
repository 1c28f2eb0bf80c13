"""Agent throughput: relive SAC vs Stable-Baselines3 SAC, in one process, with the same torch thread count.

    python bench/agent_throughput.py --threads 1 --rounds 9 --seconds 2 --sections update --profile

1. One SAC gradient step (batch 256, Hopper shapes obs 11 / action 3, 256x256 networks, twin critics):
   relive ``SAC.update`` (which also returns per-sample ``td_error`` and ``log_likelihood``) vs SB3
   ``SAC.train(gradient_steps=1)``; each samples from its own full 100k-row buffer. The contenders alternate
   in ``--rounds`` short rounds (the machine is shared: contention changes slowly compared with a round) and
   the median of the per-round ratios is reported, for wall-clock rates and for process-CPU-time rates (the
   latter does not count time the process spent descheduled by other jobs; with 2 threads it counts both).
2. The price of an ensemble: relive SAC update with 10 critics (plain, and with LayerNorm as in RLPD, eager
   and with ``compile=True``; actor and temperature step in every update, as in the twin-critic update) vs
   the twin-critic update, same rounds; and RLPD as configured (``SACConfig.rlpd()``: subset-min of 2, actor
   once per 20 critic steps, so most updates are critic-only) and Cal-QL (``CalQLConfig()``: n = 10 sampled
   actions per kind) for the record.
3. (``--sections loop``) A full SAC training loop on Hopper-v5 at one update per env step, after
   ``--learning-starts`` random steps (untimed): a minimal loop written here (gymnasium env, relive
   ``ReplayBuffer`` + ``SAC``, act -> env.step -> add -> sample -> update -> buffer.update(signals)) vs SB3
   ``SAC.learn``, in alternating chunks of ``--loop-steps`` env steps (both loops continue where they stopped).
``--profile`` adds where the time of one step goes (torch profiler: matmul kernels vs the rest, operator
count, matmul FLOPs) for relive SAC, SB3 and the 10 LayerNorm critics: the floor that bounds the ratios.
4. (``--sections floor``) The floor of relive's SAC step, measured: the step's wall time; its matmul calls (shapes
   and time inside the step, from the torch profiler); the same matmuls timed alone (``timeit``, best of 5, the
   operands reused, so in cache); and the critic's forward + backward at E = 2, 10, 20, 40 members per 2 members
   (plain and LayerNorm): flat in E means batching more members (or seeds) saves no matmul time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

OBS, ACT, BATCH, ROWS = 11, 3, 256, 100_000
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def rate(fn, seconds: float, warmup: int = 10) -> float:
    return rates(fn, seconds, warmup)[0]


def rates(fn, seconds: float, warmup: int = 10) -> tuple[float, float]:
    """(calls per wall-clock second, calls per second of this process's CPU time)."""
    for _ in range(warmup):
        fn()
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start), n / max(time.process_time() - cpu, 1e-9)


# -- contenders: one gradient step ------------------------------------------------------------------
def relive_step(preset: str = "sac", **cfg):
    """One relive update per call: ``preset`` "sac" (``SACConfig(**cfg)``), "rlpd" (``SACConfig.rlpd(**cfg)``) or
    "calql" (``CalQLConfig(**cfg)``, with returns-to-go in the buffer)."""
    from relive.agents.cal_ql import CalQL, CalQLConfig
    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ReplayBuffer
    from relive.testing import random_transitions

    extra = {"mc_return": ()} if preset == "calql" else {}
    buf = ReplayBuffer(ROWS, (OBS,), (ACT,), seed=0, extra_columns=extra)
    rows = random_transitions(ROWS, OBS, ACT, rng=0, episode_length=1000)
    if extra:
        rows = rows | {"mc_return": np.random.default_rng(0).normal(size=ROWS).astype(np.float32)}
    buf.extend(rows)
    low, high = -np.ones(ACT), np.ones(ACT)
    if preset == "calql":
        agent = CalQL(OBS, ACT, low, high, CalQLConfig(**cfg), seed=0)
    else:
        agent = SAC(OBS, ACT, low, high, SACConfig.rlpd(**cfg) if preset == "rlpd" else SACConfig(**cfg), seed=0)
    return lambda: agent.update(buf.sample(BATCH))


def sb3_step():
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    model = SB3SAC("MlpPolicy", gym.make("Hopper-v5"), batch_size=BATCH, buffer_size=ROWS, learning_starts=0,
                   device="cpu", seed=0)
    rng = np.random.default_rng(0)
    rb = model.replay_buffer
    rb.observations[:] = rng.normal(size=rb.observations.shape)
    rb.next_observations[:] = rng.normal(size=rb.next_observations.shape)
    rb.actions[:] = rng.uniform(-1, 1, rb.actions.shape)
    rb.rewards[:] = rng.normal(size=rb.rewards.shape)
    rb.full = True
    model._setup_learn(total_timesteps=1, reset_num_timesteps=True)
    return lambda: model.train(gradient_steps=1, batch_size=BATCH)


# -- contenders: the training loop ------------------------------------------------------------------
def relive_loop(learning_starts: int, capacity: int, seed: int = 0):
    """A minimal relive SAC loop on Hopper-v5; returns ``run(n) -> seconds`` for n more timed env steps."""
    import gymnasium as gym

    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ReplayBuffer

    env = gym.make("Hopper-v5")
    low, high = env.action_space.low, env.action_space.high
    agent = SAC(OBS, ACT, low, high, SACConfig(), seed=seed)
    buf = ReplayBuffer(capacity, (OBS,), (ACT,), seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)

    def env_step(action: np.ndarray) -> None:
        nonlocal obs
        next_obs, reward, terminated, truncated, _ = env.step(action)
        buf.add(obs=obs, action=action, reward=reward, next_obs=next_obs, terminated=terminated,
                truncated=truncated)  # next_obs is the true final observation on truncation
        obs = env.reset()[0] if terminated or truncated else next_obs

    for _ in range(learning_starts):  # random warm-up, not timed
        env_step(rng.uniform(low, high).astype(np.float32))

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            env_step(agent.act(obs[None], explore=True)[0])
            batch = buf.sample(BATCH)
            result = agent.update(batch)
            buf.update(batch.info, **result.signals)
        return time.perf_counter() - start

    return run


def sb3_loop(learning_starts: int, capacity: int, seed: int = 0):
    """SB3 ``SAC.learn`` on Hopper-v5 (train_freq 1, one gradient step per env step); ``run(n) -> seconds``."""
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    model = SB3SAC("MlpPolicy", gym.make("Hopper-v5"), batch_size=BATCH, buffer_size=capacity,
                   learning_starts=learning_starts, device="cpu", seed=seed)
    model.learn(total_timesteps=learning_starts)  # random warm-up, not timed

    def run(n: int) -> float:
        start = time.perf_counter()
        model.learn(total_timesteps=n, reset_num_timesteps=False)
        return time.perf_counter() - start

    return run


# -- where the time goes ------------------------------------------------------------------------------
def profile_step(step, n: int = 20) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        step()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(n):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / n / 1e3
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS) / n / 1e3
    return {"ms per step (profiled)": total, "matmul ms": matmul, "matmul share": matmul / total,
            "matmul MFLOP": sum(e.flops for e in events if e.key in MATMULS) / n / 1e6,
            "operators": sum(e.count for e in events) / n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads for every contender")
    p.add_argument("--seconds", type=float, default=2.0, help="timing window per contender and round")
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds of the update measurements")
    p.add_argument("--sections", default="update,loop", help="comma-separated: update (sections 1-2), loop (3), "
                   "floor (4)")
    p.add_argument("--no-compile", action="store_true", help="leave out the compile=True contender")
    p.add_argument("--default-malloc", action="store_true", help="leave glibc's malloc thresholds as they are "
                   "(by default the process keeps freed memory, as relive's trainer does: retain_freed_memory)")
    p.add_argument("--loop-steps", type=int, default=500, help="timed env steps per training loop and round")
    p.add_argument("--loop-rounds", type=int, default=4, help="alternating rounds of the loop measurements "
                   "(both loops keep going: round r times env steps r x loop-steps .. (r + 1) x loop-steps)")
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--profile", action="store_true", help="also profile one step of each (matmul share)")
    p.add_argument("--json", default="bench/out/agent_throughput.json")
    args = p.parse_args(argv)
    sections = set(args.sections.split(","))

    import torch

    torch.set_num_threads(args.threads)
    if not args.default_malloc:  # as relive's trainer does for its process; every contender runs with it
        from relive.train.malloc import retain_freed_memory

        retain_freed_memory()
    warnings.filterwarnings("ignore")
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown") if Path("/proc/cpuinfo").is_file() else "unknown"
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").is_file() else []
    print(f"torch {torch.__version__}, threads {args.threads}, CPU {cpu!r}, load average {' '.join(load)}",
          flush=True)
    res: dict = {"threads": args.threads, "torch": torch.__version__, "cpu": cpu, "load average before": load,
                 "retain_freed_memory": not args.default_malloc}
    if "update" in sections:
        res |= measure_updates(args)
    if "loop" in sections:
        res |= measure_loops(args)
    if "floor" in sections:
        res |= measure_floor()
    if Path("/proc/loadavg").is_file():
        res["load average after"] = Path("/proc/loadavg").read_text().split()[:3]
    res["command"] = "python bench/agent_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


TWIN, SB3, TEN, TEN_LN, TEN_LN_COMPILED = ("relive SAC", "SB3 SAC", "relive 10 critics", "relive 10 LayerNorm critics",
                                          "relive 10 LayerNorm critics, compile=True")
RLPD, CALQL = "relive RLPD preset (actor every 20)", "relive Cal-QL"


def measure_updates(args) -> dict:
    steps = {TWIN: relive_step(), SB3: sb3_step(), TEN: relive_step(num_qs=10),
             TEN_LN: relive_step(num_qs=10, critic_layer_norm=True)}
    if not args.no_compile:
        steps[TEN_LN_COMPILED] = relive_step(num_qs=10, critic_layer_norm=True, compile=True)
        start = time.perf_counter()
        steps[TEN_LN_COMPILED]()
        print(f"compile=True: first update (compilation) {time.perf_counter() - start:.1f} s", flush=True)
    steps |= {RLPD: relive_step("rlpd"), CALQL: relive_step("calql")}
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(args.rounds):
        for name, step in steps.items():
            w, c = rates(step, args.seconds, warmup=3)
            wall[name].append(w)
            cpu[name].append(c)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in wall.items()), flush=True)

    def ratio(a: str, b: str, table=wall) -> float:
        return statistics.median(x / y for x, y in zip(table[a], table[b], strict=True))

    def spread(a: str, b: str, table=wall) -> list[float]:
        r = [x / y for x, y in zip(table[a], table[b], strict=True)]
        return [min(r), max(r)]

    res: dict = {"updates per second (median, wall)": {k: statistics.median(v) for k, v in wall.items()},
                 "updates per CPU second (median)": {k: statistics.median(v) for k, v in cpu.items()},
                 "rates per round (wall)": wall, "rates per round (cpu)": cpu}
    res["update ratio relive / SB3"] = ratio(TWIN, SB3)
    res["update ratio relive / SB3, range over rounds"] = spread(TWIN, SB3)
    res["update ratio relive / SB3 (CPU time)"] = ratio(TWIN, SB3, cpu)
    for name, key in ((TEN, "10-critic update cost vs twin"), (TEN_LN, "RLPD critic update cost vs twin"),
                      (TEN_LN_COMPILED, "RLPD critic update cost vs twin, compiled"),
                      (RLPD, "RLPD preset update cost vs twin"), (CALQL, "Cal-QL update cost vs twin")):
        if name in steps:
            res[key] = ratio(TWIN, name)
            res[key + " (CPU time)"] = ratio(TWIN, name, cpu)
            res[key + ", range over rounds"] = spread(TWIN, name)
    print(f"SAC update: relive / SB3 = {res['update ratio relive / SB3']:.2f}x wall "
          f"(rounds {res['update ratio relive / SB3, range over rounds'][0]:.2f}-"
          f"{res['update ratio relive / SB3, range over rounds'][1]:.2f}), "
          f"{res['update ratio relive / SB3 (CPU time)']:.2f}x CPU time (target >= 1.5x)", flush=True)
    for key in ("10-critic update cost vs twin", "RLPD critic update cost vs twin",
                "RLPD critic update cost vs twin, compiled", "RLPD preset update cost vs twin",
                "Cal-QL update cost vs twin"):
        if key in res:
            print(f"{key}: {res[key]:.2f}x wall, {res[key + ' (CPU time)']:.2f}x CPU time"
                  + (" (target <= 3x)" if key.startswith("RLPD critic") else ""), flush=True)
    if args.profile:
        res["profile"] = {name: profile_step(steps[name]) for name in (TWIN, SB3, TEN_LN)}
        for name, prof in res["profile"].items():
            print(f"profile {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in prof.items()), flush=True)
    return res


def measure_floor(steps: int = 200) -> dict:
    """Section 4: relive's SAC step against its own matmuls, in the step and alone; the critic's cost per member."""
    import timeit

    import torch
    from torch.profiler import ProfilerActivity, profile

    step = relive_step()
    for _ in range(20):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    step_ms = (time.perf_counter() - start) / steps * 1e3
    n = 40
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(n):
            step()
    calls = [(e.key, [list(x) for x in e.input_shapes], e.count / n, e.self_cpu_time_total / n / 1e3)
             for e in prof.key_averages(group_by_input_shape=True) if e.key in MATMULS]

    def operands(op: str, shapes: list[list[int]]):
        t = [torch.randn(*sh) if sh else 1 for sh in shapes]
        fn = {"aten::mm": torch.mm, "aten::bmm": torch.bmm, "aten::addmm": torch.addmm,
              "aten::baddbmm": torch.baddbmm}[op]
        args = [x for x in t if torch.is_tensor(x)]
        return lambda: fn(*args)

    rows, alone_ms = [], 0.0
    for op, shapes, count, in_step in sorted(calls, key=lambda c: -c[3]):
        fn = operands(op, shapes)
        for _ in range(10):
            fn()
        one = min(timeit.repeat(fn, number=50, repeat=5)) / 50 * 1e3
        alone_ms += one * count
        rows.append({"op": op, "shapes": shapes, "calls per step": count, "ms per step in the step": in_step,
                     "ms per call alone": one})
    in_step_ms = sum(r["ms per step in the step"] for r in rows)
    print(f"floor: SAC step {step_ms:.2f} ms; its matmuls {in_step_ms:.2f} ms inside the step (profiled), "
          f"{alone_ms:.2f} ms timed alone; the rest {step_ms - in_step_ms:.2f} ms", flush=True)
    for r in rows[:6]:
        per_call = r["ms per step in the step"] / r["calls per step"]
        print(f"  {r['op']} {r['shapes']} x{r['calls per step']:.0f}: {per_call:.3f} ms in the step, "
              f"{r['ms per call alone']:.3f} ms alone", flush=True)

    members: dict[str, dict[int, float]] = {}
    for ln in (False, True):
        key = "LayerNorm" if ln else "plain"
        members[key] = {e: critic_ms(e, ln) / (e / 2) for e in (2, 10, 20, 40)}
        print(f"critic forward + backward per 2 members ({key}): "
              + ", ".join(f"E={e} {v:.2f} ms" for e, v in members[key].items()), flush=True)
    return {"floor": {"SAC step ms": step_ms, "matmuls in the step ms": in_step_ms, "matmuls alone ms": alone_ms,
                      "matmul calls": rows, "critic fwd+bwd ms per 2 members": members}}


def critic_ms(members: int, layer_norm: bool) -> float:
    """ms of one forward + backward of a 256x256 ensemble critic (every member's own batch of BATCH rows)."""
    import timeit

    import torch

    from relive.agents.networks import EnsembleCritic, init_

    critic = init_(EnsembleCritic(members, OBS, ACT, (256, 256), layer_norm), torch.Generator().manual_seed(0))
    obs, act = torch.randn(members, BATCH, OBS), torch.rand(members, BATCH, ACT)
    params = list(critic.parameters())

    def fb():
        for q in params:
            q.grad = None
        critic(obs, act).sum().backward()

    for _ in range(5):
        fb()
    return min(timeit.repeat(fb, number=10, repeat=5)) / 10 * 1e3


def measure_loops(args) -> dict:
    capacity = args.learning_starts + args.loop_steps * args.loop_rounds + 10
    loop_runs = {"relive": relive_loop(args.learning_starts, capacity), "SB3": sb3_loop(args.learning_starts, capacity)}
    loops: dict[str, list[float]] = {k: [] for k in loop_runs}
    for r in range(args.loop_rounds):
        for name, run in loop_runs.items():
            loops[name].append(args.loop_steps / run(args.loop_steps))
        print(f"loop round {r + 1}: relive {loops['relive'][-1]:.1f}, SB3 {loops['SB3'][-1]:.1f} env steps/s",
              flush=True)
    res = {"loop env steps per second (median)": {k: statistics.median(v) for k, v in loops.items()},
           "loop ratio relive / SB3": statistics.median(
               x / y for x, y in zip(loops["relive"], loops["SB3"], strict=True))}
    print(f"Hopper-v5 loop: relive / SB3 = {res['loop ratio relive / SB3']:.2f}x", flush=True)
    return res


if __name__ == "__main__":
    sys.exit(main())
