"""Bytes a transition of an 84x84x4 uint8 Atari stack under SB3's DQN: relive's ``ReliveReplayBuffer(frame_stack=4)``
(each frame once) against SB3's ``ReplayBuffer`` with and without ``optimize_memory_usage`` (the arrays it allocates).

    PYTHONPATH=src python bench/sb3_frame_stack_bytes.py [--steps 10000]

Fills the relive buffer through SB3's ``add`` with VecFrameStack-like stacks of random frames (500-step episodes,
zeros before each episode's first step) past its capacity; the counts do not depend on the machine.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer

from relive.integrations.sb3 import ReliveReplayBuffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    n = parser.parse_args().steps
    space, act = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(4)
    ours = ReliveReplayBuffer(n, space, act, device="cpu", frame_stack=4)
    rng = np.random.default_rng(0)
    stack = np.zeros((1, 84, 84, 4), np.uint8)
    for t in range(n + 100):
        nxt = np.concatenate([stack[..., 1:], rng.integers(0, 256, (1, 84, 84, 1), np.uint8)], -1)
        done = np.array([t % 500 == 499])
        ours.add(stack, nxt, np.zeros((1, 1)), np.zeros(1, np.float32), done, [{}])
        stack = np.zeros_like(nxt) if done[0] else nxt
    print(f"| relive ReliveReplayBuffer(frame_stack=4) | {ours.relive.storage.bytes_per_row():,.0f} |")
    for opt in (False, True):
        sb = ReplayBuffer(n, space, act, device="cpu", optimize_memory_usage=opt, handle_timeout_termination=not opt)
        arrays = [sb.observations, sb.actions, sb.rewards, sb.dones, sb.timeouts]
        if not opt:
            arrays.append(sb.next_observations)
        print(f"| SB3 ReplayBuffer(optimize_memory_usage={opt}) | {sum(a.nbytes for a in arrays) / n:,.0f} |")


if __name__ == "__main__":
    main()
