"""A DDQN update on a trained agent's state with and without subnormals flushed to zero (issue 45: why an Atari run's
step grew as it trained), in one process, alternating rounds.

    python bench/subnormal_update.py RUN_DIR [--rounds 3] [--updates 30] [--threads 1]

RUN_DIR: a finished ``ddqn_atari100k`` run (its ``agent_final``: the weights and Adam's moments). Prints the count
of subnormal values in the agent's state, then CPU ms per update of random batches of 32 for the trained state and a
fresh agent of the same configuration, each with the flush off and on (``torch.set_flush_denormal``)."""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch

from relive.train.run_cli import load_run_agent
from relive.train.trainer import build_agent
from relive.types import Batch, SampleInfo

B = 32


def batch(rng, shape, num_actions) -> Batch:
    z = np.zeros(B, np.float32)
    return Batch(obs=rng.integers(0, 255, (B, *shape), dtype=np.uint8), action=rng.integers(0, num_actions, B),
                 reward=rng.choice([-1.0, 0.0, 0.0, 0.0, 1.0], B).astype(np.float32),
                 next_obs=rng.integers(0, 255, (B, *shape), dtype=np.uint8), terminated=z, truncated=z,
                 info=SampleInfo(np.arange(B), np.zeros(B, np.int64), np.full(B, 1.0 / B), np.ones(B, np.float32),
                                 np.ones(B, np.int8)))


def subnormals(state: dict) -> int:
    tiny, n = np.finfo(np.float32).tiny, 0
    for v in state.values() if isinstance(state, dict) else state:
        if isinstance(v, dict | list | tuple):
            n += subnormals(v)
        elif isinstance(v, torch.Tensor | np.ndarray):
            a = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
            if a.dtype == np.float32:
                n += int(((a != 0) & (np.abs(a) < tiny)).sum())
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, env, spec, agent, _ = load_run_agent(args.run_dir)
    if env is not None:
        env.close()
    trained = copy.deepcopy(agent.state_dict())
    fresh_agent = build_agent(cfg, spec)
    fresh = copy.deepcopy(fresh_agent.state_dict())
    print(f"subnormal values in the trained agent's state: {subnormals(trained):,}")
    rng = np.random.default_rng(0)
    got: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, ag, state in (("trained", agent, trained), ("fresh", fresh_agent, fresh)):
            for flush in (False, True):
                ag.load_state_dict(copy.deepcopy(state))
                torch.set_flush_denormal(flush)
                batches = [batch(rng, agent.image_shape, agent.num_actions) for _ in range(args.updates + 1)]
                ag.update(batches[0])
                c = time.process_time()
                for b in batches[1:]:
                    ag.update(b)
                got.setdefault(f"{name}, flush {'on' if flush else 'off'}", []).append(
                    1e3 * (time.process_time() - c) / args.updates)
    torch.set_flush_denormal(False)
    for k, v in got.items():
        print(f"{k}: {np.median(v):.1f} CPU ms an update (rounds: {', '.join(f'{x:.1f}' for x in v)})")


if __name__ == "__main__":
    main()
