"""Your own training loop on relive's buffer, end to end (runnable as is: ``python examples/own_loop.py``).

Pendulum-v1, a small DDPG-style actor-critic with a Gaussian policy written here in plain torch, and relive's
``ReplayBuffer`` holding an offline dataset (uniform-random episodes) and the online experience:

    env.step -> buffer.extend -> buffer.sample -> .to_torch -> IS-weighted TD loss -> buffer.update(td_error=)

Sampling is a 50/50 mixture (RLPD's symmetric sampling): the online half by prioritized replay (PER, beta
annealed to 1), the offline half by ARB, which weights each offline row by how likely the current policy is
to take its action; ``buffer.refresh(score_fn)`` re-scores them every ``--refresh-every`` gradient steps.
The defaults take ~2,000 env steps (a few tens of seconds on one core); far too few to solve Pendulum, the
point is the calls. The same task with relive's own agents: examples/relive_agents.py.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from relive.replay import ARBSampler, MixtureSampler, PrioritizedSampler, ReplayBuffer

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def random_episodes(env: gym.Env, num_rows: int, seed: int) -> dict:
    """``num_rows`` rows of uniform-random actions, episode after episode (the last one cut as truncated)."""
    env.action_space.seed(seed)
    rows = {k: [] for k in COLUMNS}
    obs, _ = env.reset(seed=seed)
    for i in range(num_rows):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for k, v in zip(COLUMNS, (obs, action, reward, next_obs, terminated, truncated or i == num_rows - 1),
                        strict=True):
            rows[k].append(v)
        obs = env.reset()[0] if terminated or truncated else next_obs
    return {k: np.asarray(v, np.float32 if k not in ("terminated", "truncated") else bool) for k, v in rows.items()}


class Actor(nn.Module):
    """A Gaussian policy: mean max_action * tanh(net(s)), a learned state-independent log std."""

    def __init__(self, obs_dim: int, act_dim: int, max_action: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 64), nn.ReLU(), nn.Linear(64, act_dim))
        self.log_std = nn.Parameter(torch.zeros(act_dim))
        self.max_action = max_action

    def forward(self, obs):
        return self.max_action * torch.tanh(self.net(obs)), self.log_std.clamp(-3, 1).exp()

    @torch.no_grad()
    def score(self, obs: np.ndarray, action: np.ndarray) -> np.ndarray:
        """ARB's per-row score: the mean over action dimensions of log pi(a|s) of the stored action."""
        mean, std = self(torch.as_tensor(obs))
        return torch.distributions.Normal(mean, std).log_prob(torch.as_tensor(action)).mean(-1).numpy()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-steps", type=int, default=2000, help="online env steps (default 2000)")
    p.add_argument("--offline-rows", type=int, default=2000, help="rows of the offline dataset (default 2000)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=200, help="online steps before the first gradient step")
    p.add_argument("--refresh-every", type=int, default=250, help="gradient steps between ARB refreshes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # networks this small run fastest on one thread

    env = gym.make("Pendulum-v1")
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    max_action = float(env.action_space.high[0])
    gamma, tau = 0.99, 0.005

    sampler = MixtureSampler(
        offline=ARBSampler(temperature=5.0),  # offline rows weighted by the current policy's likelihood
        online=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4,  # PER alpha, beta ...
                                  is_exponent_final=1.0, is_anneal_samples=args.env_steps),  # ... annealed to 1
        offline_fraction=0.5)
    buf = ReplayBuffer(capacity=args.offline_rows + args.env_steps, obs_shape=(obs_dim,), action_shape=(act_dim,),
                       sampler=sampler, seed=args.seed)
    buf.add_offline(random_episodes(gym.make("Pendulum-v1"), args.offline_rows, args.seed + 1))  # never evicted

    actor = Actor(obs_dim, act_dim, max_action)
    critic = nn.Sequential(nn.Linear(obs_dim + act_dim, 64), nn.ReLU(), nn.Linear(64, 1))
    target = nn.Sequential(nn.Linear(obs_dim + act_dim, 64), nn.ReLU(), nn.Linear(64, 1))
    target.load_state_dict(critic.state_dict())
    actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)

    def q(net, o, a):
        return net(torch.cat([o, a], dim=-1)).squeeze(-1)

    obs, _ = env.reset(seed=args.seed)
    episode_return, returns, grad_steps = 0.0, [], 0
    for step in range(args.env_steps):
        with torch.no_grad():
            mean, std = actor(torch.as_tensor(obs))
            action = torch.normal(mean, std).clamp(-max_action, max_action).numpy()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # one row, in time order; keep both flags (a time-limit truncation is not a terminal state)
        buf.extend({"obs": obs[None], "action": action[None], "reward": np.array([reward], np.float32),
                    "next_obs": next_obs[None], "terminated": np.array([terminated]),
                    "truncated": np.array([truncated])})
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            obs, episode_return = env.reset()[0], 0.0
        if step < args.warmup:
            continue

        batch = buf.sample(args.batch_size).to_torch("cpu")  # NumPy rows -> tensors; info.is_weight a tensor
        with torch.no_grad():
            next_mean, _ = actor(batch.next_obs)
            y = batch.reward + gamma * (1 - batch.terminated) * q(target, batch.next_obs, next_mean)
        td = q(critic, batch.obs, batch.action) - y
        critic_loss = (batch.info.is_weight * td.pow(2)).mean()  # PER's importance-sampling correction
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()
        buf.update(batch.info, td_error=td.detach().numpy())  # new priorities (rows overwritten since: skipped)

        mean, _ = actor(batch.obs)
        actor_loss = -(batch.info.is_weight * q(critic, batch.obs, mean)).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        with torch.no_grad():
            for t, s in zip(target.parameters(), critic.parameters(), strict=True):
                t.mul_(1 - tau).add_(tau * s)
        grad_steps += 1
        if grad_steps % args.refresh_every == 0:
            buf.refresh(actor.score)  # ARB: re-score every offline row with the current policy

    stats = buf.stats()
    probs = buf.sampler.probabilities()  # exact: one value per slot, offline prefix then the online ring
    assert np.isclose(probs.sum(), 1.0) and probs[len(buf):].sum() == 0
    out = {"episodes": len(returns), "last_return": returns[-1] if returns else float("nan"),
           "grad_steps": grad_steps, "rows": len(buf), "online_mass": stats["replay/online_mass"]}
    print(f"{out['episodes']} episodes, last return {out['last_return']:.1f}, {grad_steps} gradient steps, "
          f"{len(buf)} rows ({buf.num_offline} offline); online share of the sampling mass "
          f"{out['online_mass']:.2f}")
    return out


if __name__ == "__main__":
    main()
