"""Agent throughput: relive SAC vs Stable-Baselines3 SAC, in one process with the same thread count.

    python bench/agent_throughput.py --threads 2

1. SAC gradient step (batch 256, Hopper shapes obs 11 / action 3, 256x256 networks, twin critics):
   relive ``SAC.update`` vs SB3 ``SAC.train(gradient_steps=1)``; both sample from their own full buffer.
2. A full training loop on Hopper-v5 at one update per env step (after ``--learning-starts`` random
   steps): relive (Collector + ReplayBuffer + SAC, the trainer's inner loop) vs SB3 ``SAC.learn``.
3. The price of an ensemble: relive SAC update with 10 LayerNorm critics (RLPD) vs 2 critics.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

OBS, ACT, BATCH = 11, 3, 256


def rate(fn, seconds: float, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def filled_relive_buffer(rows: int):
    from relive.replay import ReplayBuffer
    from relive.testing import random_transitions

    buf = ReplayBuffer(rows, (OBS,), (ACT,), seed=0)
    buf.extend(random_transitions(rows, OBS, ACT, rng=0, episode_length=1000))
    return buf


def relive_update_rate(seconds: float, **cfg) -> float:
    from relive.agents.sac import SAC, SACConfig

    buf = filled_relive_buffer(100_000)
    agent = SAC(OBS, ACT, -np.ones(ACT), np.ones(ACT), SACConfig(**cfg), seed=0)
    return rate(lambda: agent.update(buf.sample(BATCH)), seconds)


def sb3_update_rate(seconds: float) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    env = gym.make("Hopper-v5")
    model = SB3SAC("MlpPolicy", env, batch_size=BATCH, buffer_size=100_000, learning_starts=0, device="cpu", seed=0)
    rng = np.random.default_rng(0)
    rb = model.replay_buffer
    rb.observations[:] = rng.normal(size=rb.observations.shape)
    rb.next_observations[:] = rng.normal(size=rb.next_observations.shape)
    rb.actions[:] = rng.uniform(-1, 1, rb.actions.shape)
    rb.rewards[:] = rng.normal(size=rb.rewards.shape)
    rb.full = True
    model._setup_learn(total_timesteps=1, reset_num_timesteps=True)
    return rate(lambda: model.train(gradient_steps=1, batch_size=BATCH), seconds)


def relive_loop_rate(steps: int, learning_starts: int) -> float:
    from relive.agents.sac import SAC, SACConfig
    from relive.replay import ReplayBuffer
    from relive.train.collector import Collector
    from relive.train.envs import env_spec, make_env, random_actions

    env = make_env("Hopper-v5")
    spec = env_spec(env)
    agent = SAC(OBS, ACT, spec.action_low, spec.action_high, SACConfig(), seed=0)
    buf = ReplayBuffer(steps + 10, spec.obs_shape, spec.action_shape, seed=0)
    col = Collector(env, spec, seed=0)
    rng = np.random.default_rng(0)
    buf.extend(col.step(lambda o: random_actions(spec, 1, rng), learning_starts))
    start = time.perf_counter()
    for _ in range(steps):
        buf.extend(col.step(lambda o: agent.act(o, explore=True), 1))
        batch = buf.sample(BATCH)
        result = agent.update(batch)
        buf.update(batch.info, **result.signals)
    return steps / (time.perf_counter() - start)


def sb3_loop_rate(steps: int, learning_starts: int) -> float:
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC

    env = gym.make("Hopper-v5")
    model = SB3SAC("MlpPolicy", env, batch_size=BATCH, buffer_size=steps + learning_starts + 10,
                   learning_starts=learning_starts, device="cpu", seed=0)
    model.learn(total_timesteps=learning_starts)  # random warm-up, not timed
    start = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - start)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads for every contender")
    p.add_argument("--seconds", type=float, default=15.0, help="timing window of the update benchmarks")
    p.add_argument("--loop-steps", type=int, default=2000, help="timed env steps of the training loops")
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--json", default="bench/out/agent_throughput.json")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    res = {}
    print(f"torch threads: {args.threads}", flush=True)
    res["relive SAC update/s"] = relive_update_rate(args.seconds)
    print(f"relive SAC update:          {res['relive SAC update/s']:8.1f} /s", flush=True)
    res["SB3 SAC update/s"] = sb3_update_rate(args.seconds)
    print(f"SB3 SAC train step:         {res['SB3 SAC update/s']:8.1f} /s "
          f"-> ratio {res['relive SAC update/s'] / res['SB3 SAC update/s']:.2f}x (target >= 2x)", flush=True)
    res["relive RLPD-ensemble update/s"] = relive_update_rate(args.seconds, num_qs=10, critic_layer_norm=True)
    cost = res["relive SAC update/s"] / res["relive RLPD-ensemble update/s"]
    print(f"relive 10-critic update:    {res['relive RLPD-ensemble update/s']:8.1f} /s "
          f"-> costs {cost:.2f}x a twin-critic update (target <= 4x)", flush=True)
    res["relive loop env steps/s"] = relive_loop_rate(args.loop_steps, args.learning_starts)
    print(f"relive Hopper loop:         {res['relive loop env steps/s']:8.1f} env steps/s", flush=True)
    res["SB3 loop env steps/s"] = sb3_loop_rate(args.loop_steps, args.learning_starts)
    print(f"SB3 SAC.learn on Hopper:    {res['SB3 loop env steps/s']:8.1f} env steps/s "
          f"-> ratio {res['relive loop env steps/s'] / res['SB3 loop env steps/s']:.2f}x (target >= 1.5x)", flush=True)
    res["command"] = "python bench/agent_throughput.py " + " ".join(argv or sys.argv[1:])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
