"""relive's buffer feeding a Flax SAC update, RLPD-style (runnable as is: ``python examples/jax_sac.py``; needs the
extra "jax": ``pip install -c constraints.txt -e ".[jax]"``).

Pendulum-v1; an offline dataset of uniform-random episodes; each batch half offline, half online (RLPD's symmetric
sampling, Ball et al. 2023, Sec. 3.1: relive's ``MixtureSampler``), handed to JAX as one buffer (``Batch.pack()``: every
column's bytes in one array, unpacked inside the jitted update by its static layout; ``Batch.to_jax()`` gives one
JAX array a column instead, ~2x slower a step on CPU: docs/benchmarks.md, "relive -> JAX");
SAC (Haarnoja et al. 2018) with RLPD's LayerNorm critics (Sec. 3.2), an ensemble of two, clipped double Q:

    env.step -> buffer.add -> buffer.sample(B).pack() -> jitted SAC update (unpack; critic, actor, temperature, target)

The defaults take ~1,000 env steps (well under a minute on one core after the jit): far too few to solve Pendulum,
the point is the calls. The same with a torch network: examples/own_loop.py.
"""

from __future__ import annotations

import argparse
from functools import partial

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

from relive.replay import MixtureSampler, ReplayBuffer

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def random_episodes(env: gym.Env, num_rows: int, seed: int) -> dict:
    """``num_rows`` rows of uniform-random actions, episode after episode (the last one cut as truncated)."""
    env.action_space.seed(seed)
    rows: dict[str, list] = {k: [] for k in COLUMNS}
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
    """tanh-squashed Gaussian policy: (mean, log std) from an MLP."""

    act_dim: int

    @nn.compact
    def __call__(self, obs):
        h = nn.relu(nn.Dense(64)(nn.relu(nn.Dense(64)(obs))))
        return nn.Dense(self.act_dim)(h), jnp.clip(nn.Dense(self.act_dim)(h), -5.0, 2.0)


class Critics(nn.Module):
    """Two Q networks (nn.vmap over their parameters), LayerNorm after each hidden layer (RLPD, Sec. 3.2)."""

    @nn.compact
    def __call__(self, obs, action):
        q = nn.vmap(_Q, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, axis_size=2)
        return q()(obs, action)  # [2, B]


class _Q(nn.Module):
    @nn.compact
    def __call__(self, obs, action):
        h = jnp.concatenate([obs, action], -1)
        for _ in range(2):
            h = nn.relu(nn.LayerNorm()(nn.Dense(64)(h)))
        return nn.Dense(1)(h)[..., 0]


def sample_action(actor, params, obs, key):
    """a = tanh(mean + std eps) and log pi(a|s) with the tanh correction (SAC, Appendix C, eq. 21)."""
    mean, log_std = actor.apply(params, obs)
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    logp = (-0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
    return jnp.tanh(u), logp - jnp.log(1 - jnp.tanh(u) ** 2 + 1e-6).sum(-1)


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def update(actor, critics, opt, layout, state, data, key):
    """One SAC step on a packed batch (``data, layout = batch.pack()``): the critic to r + gamma (1 - terminated)
    (min Q' - alpha log pi'), the actor to alpha log pi - min Q, the temperature to the target entropy -|A| (SAC,
    eqs. 5, 7, 18), Polyak targets."""
    cols = layout.unpack(data)  # (slices and bit-casts of the one buffer, compiled into this update)
    obs, action, reward, next_obs = cols["obs"], cols["action"], cols["reward"], cols["next_obs"]
    terminated = cols["terminated"].astype(jnp.float32)
    gamma, tau, target_entropy = 0.99, 0.005, -action.shape[-1]
    k1, k2 = jax.random.split(key)
    alpha = jnp.exp(state["log_alpha"])
    next_a, next_logp = sample_action(actor, state["actor"], next_obs, k1)
    next_q = critics.apply(state["target"], next_obs, next_a).min(0) - alpha * next_logp
    target = reward + gamma * (1.0 - terminated) * next_q

    def critic_loss(p):
        return ((critics.apply(p, obs, action) - jax.lax.stop_gradient(target)) ** 2).mean()

    def actor_loss(p):
        a, logp = sample_action(actor, p, obs, k2)
        return (alpha * logp - critics.apply(state["critic"], obs, a).min(0)).mean(), logp

    def alpha_loss(log_alpha, logp):
        return -(log_alpha * jax.lax.stop_gradient(logp + target_entropy)).mean()

    new = dict(state)
    q_loss, g = jax.value_and_grad(critic_loss)(state["critic"])
    upd, new["opt_critic"] = opt.update(g, state["opt_critic"])
    new["critic"] = optax.apply_updates(state["critic"], upd)
    (pi_loss, logp), g = jax.value_and_grad(actor_loss, has_aux=True)(state["actor"])
    upd, new["opt_actor"] = opt.update(g, state["opt_actor"])
    new["actor"] = optax.apply_updates(state["actor"], upd)
    g = jax.grad(alpha_loss)(state["log_alpha"], logp)
    upd, new["opt_alpha"] = opt.update(g, state["opt_alpha"])
    new["log_alpha"] = optax.apply_updates(state["log_alpha"], upd)
    new["target"] = optax.incremental_update(new["critic"], state["target"], tau)
    return new, {"q_loss": q_loss, "pi_loss": pi_loss, "alpha": alpha}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-steps", type=int, default=1000, help="online env steps (default 1000)")
    p.add_argument("--offline-rows", type=int, default=1000, help="rows of the offline dataset (default 1000)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=100, help="online steps before the first gradient step")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    env = gym.make("Pendulum-v1")
    assert isinstance(env.observation_space, gym.spaces.Box) and isinstance(env.action_space, gym.spaces.Box)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    scale = float(env.action_space.high[0])  # the policy acts in [-1, 1]; the env takes [-2, 2]
    buffer = ReplayBuffer(args.offline_rows + args.env_steps, (obs_dim,), (act_dim,), seed=args.seed,
                          sampler=MixtureSampler(offline_fraction=0.5))  # RLPD: half of each batch offline
    offline = random_episodes(gym.make("Pendulum-v1"), args.offline_rows, args.seed + 1)
    offline["action"] = offline["action"] / scale
    buffer.add_offline(offline)

    actor, critics, opt = Actor(act_dim), Critics(), optax.adam(3e-4)
    key, k_actor, k_critic = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    o, a = jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim))
    state = {"actor": actor.init(k_actor, o), "critic": critics.init(k_critic, o, a), "log_alpha": jnp.zeros(())}
    state["target"] = state["critic"]
    state |= {"opt_actor": opt.init(state["actor"]), "opt_critic": opt.init(state["critic"]),
              "opt_alpha": opt.init(state["log_alpha"])}
    act = jax.jit(partial(sample_action, actor))

    obs, _ = env.reset(seed=args.seed)
    episodes, ep_return, grad_steps = 0, 0.0, 0
    returns: list[float] = []
    metrics: dict = {}
    for step in range(args.env_steps):
        key, k_act, k_update = jax.random.split(key, 3)
        action = np.asarray(act(state["actor"], jnp.asarray(obs[None]), k_act)[0][0])
        next_obs, reward, terminated, truncated, _ = env.step(scale * action)
        buffer.add(obs=obs, action=action, reward=np.float32(reward), next_obs=next_obs, terminated=terminated,
                   truncated=truncated)
        ep_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            episodes, returns, ep_return = episodes + 1, returns + [ep_return], 0.0
            obs, _ = env.reset()
        if step >= args.warmup:
            data, layout = buffer.sample(args.batch_size).pack()  # NumPy rows -> one byte buffer + its layout
            state, metrics = update(actor, critics, opt, layout, state, data, k_update)
            grad_steps += 1
    out = {"episodes": episodes, "grad_steps": grad_steps, "returns": returns,
           **{k: float(v) for k, v in metrics.items()}}
    print(f"{episodes} episodes, {grad_steps} gradient steps, returns {[round(r, 1) for r in returns]}, "
          f"q_loss {out.get('q_loss', float('nan')):.3f}")
    return out


if __name__ == "__main__":
    main()
