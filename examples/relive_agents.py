"""The task of examples/own_loop.py with relive's own agent (runnable as is: ``python examples/relive_agents.py``).

Same environment (Pendulum-v1), same offline dataset and same buffer (a 50/50 mixture: ARB over the offline
rows, PER over the online ones), but the agent is relive's SAC with RLPD's settings, built through the agent
registry from the ``rlpd`` preset's options. The loop only moves data between the parts:

    agent.act -> buffer.extend -> buffer.sample -> agent.update -> buffer.update(**result.signals)
    every --refresh-every gradient steps: buffer.refresh(agent.score_fn())

``relive train rlpd --env Pendulum-v1`` runs a loop like this one (plus evaluation, checkpoints and logs) from
the command line. The defaults take ~2,000 env steps; the networks are shrunk (64 x 64, 4 critics) to keep
the example short.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from relive.envs import env_spec
from relive.presets import get_preset
from relive.registry import agent_entry
from relive.replay import ARBSampler, MixtureSampler, PrioritizedSampler, ReplayBuffer
from relive.types import unpack_acted

sys.path.insert(0, str(Path(__file__).parent))
from own_loop import random_episodes  # noqa: E402  (the same offline dataset as the own-loop example)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-steps", type=int, default=2000, help="online env steps (default 2000)")
    p.add_argument("--offline-rows", type=int, default=2000, help="rows of the offline dataset (default 2000)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=200, help="online steps before the first gradient step")
    p.add_argument("--refresh-every", type=int, default=250, help="gradient steps between ARB refreshes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # networks this small run fastest on one thread

    env = gym.make("Pendulum-v1")
    spec = env_spec(env)  # shapes and action bounds, what every agent's from_spec takes
    preset = get_preset("rlpd")  # the options `relive train rlpd` would use ...
    config = replace(preset.agent, hidden=(64, 64), num_qs=4, actor_every=1)  # ... made smaller for a quick run
    entry = agent_entry(preset.agent_kind)  # "sac": any registered agent, yours included (docs/extending.md)
    agent = entry.target.from_spec(spec, config, np.random.SeedSequence(args.seed), "cpu")

    sampler = MixtureSampler(
        offline=ARBSampler(temperature=5.0),
        online=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4, is_exponent_final=1.0,
                                  is_anneal_samples=args.env_steps),
        offline_fraction=0.5)
    buf = ReplayBuffer(capacity=args.offline_rows + args.env_steps, obs_shape=spec.obs_shape,
                       action_shape=spec.action_shape, sampler=sampler, seed=args.seed)
    buf.add_offline(random_episodes(gym.make("Pendulum-v1"), args.offline_rows, args.seed + 1))

    obs, _ = env.reset(seed=args.seed)
    episode_return, returns, grad_steps, metrics = 0.0, [], 0, {}
    for step in range(args.env_steps):
        # an agent may return a bare action or an Acted (with a behaviour record to store, or store=False)
        action, record, store = unpack_acted(agent.act(obs[None], explore=True))
        next_obs, reward, terminated, truncated, _ = env.step(action[0])
        if store[0]:
            buf.extend({"obs": obs[None], "action": action, "reward": np.array([reward], np.float32),
                        "next_obs": next_obs[None], "terminated": np.array([terminated]),
                        "truncated": np.array([truncated])} | dict(record))
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            obs, episode_return = env.reset()[0], 0.0
        if step < args.warmup:
            continue
        batch = buf.sample(args.batch_size)  # NumPy; the agent moves it to its device (to_torch)
        result = agent.update(batch)  # IS weights applied inside (batch.info.is_weight)
        buf.update(batch.info, **result.signals)  # td_error (PER) and log_likelihood back to the sampler
        metrics = dict(result.metrics)
        grad_steps += 1
        if grad_steps % args.refresh_every == 0:
            buf.refresh(agent.score_fn())  # ARB: re-score the offline rows with the current policy

    out = {"episodes": len(returns), "last_return": returns[-1] if returns else float("nan"),
           "grad_steps": grad_steps, "rows": len(buf), "critic_loss": metrics.get("train/critic_loss", float("nan"))}
    print(f"{out['episodes']} episodes, last return {out['last_return']:.1f}, {grad_steps} gradient steps, "
          f"{len(buf)} rows ({buf.num_offline} offline), last critic loss {out['critic_loss']:.3f}")
    return out


if __name__ == "__main__":
    main()
