"""PLD stage 3, distillation (Probe, Learn, Distill; arXiv 2511.00091): the residual-corrected behaviour is
folded back into the base policy.

1. Hybrid rollouts: in each episode draw T_base ~ U{0, ..., H}; for t < T_base act with the base alone,
   a_t = pi_theta(x_t); from T_base on act with base + residual, a_t = residual(x_t, pi_theta(x_t)) (the
   residual callable returns the executed action, e.g. clip(a_base + beta * delta_a)). Starting the
   residual at random times covers the states the base itself visits (the probing idea of spec §9, here for
   the data).
2. Keep the successful episodes (``info["success"]`` at their last step; ``relive.envs.with_success``).
3. Fine-tune the base by behaviour cloning on the executed actions of those episodes
   (``relive.agents.bc.fine_tune``, MSE) -> a new base policy directory.
Repeating with the new base is the paper's data flywheel.

Example::

    residual = lambda obs, a_base: np.clip(a_base + 0.5 * my_residual(obs, a_base), -1, 1)
    stats = distill("runs/bc-umaze", residual, "PointMaze_UMaze-v3", num_episodes=100, out="runs/bc-umaze-d1")
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from relive.agents.base_policy import load_base_policy
from relive.agents.bc import (
    BCConfig,
    SquashedMLP,
    evaluate_policy,
    fine_tune,
    refuse_existing_out,
    save_bc_policy,
    train_bc,
)

COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def hybrid_rollouts(env, base, residual, num_episodes: int, seed: int, horizon: int | None = None) -> list[dict]:
    """``num_episodes`` hybrid episodes on ``env`` (which reports ``info["success"]``): reset seeds ``seed,
    seed + 1, ...``, T_base ~ U{0..horizon} from ``np.random.default_rng(seed)``; ``horizon`` defaults to the
    env's time limit. Each episode: its rows (``COLUMNS`` + ``base_action``), ``t_base``, ``success``,
    ``return``."""
    from relive.envs import episode_success  # (gymnasium, optional: imported only where an env is made)

    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if horizon is None:
        horizon = env.spec.max_episode_steps if env.spec is not None else None
        if horizon is None:
            raise ValueError("hybrid_rollouts: the env has no time limit; pass horizon (H of T_base ~ U{0..H})")
    if horizon < 0:
        raise ValueError(f"horizon must be >= 0, got {horizon}")
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(num_episodes):
        t_base = int(rng.integers(0, horizon + 1))
        obs, _ = env.reset(seed=int(seed) + i)
        rows: dict[str, list] = {k: [] for k in (*COLUMNS, "base_action")}
        t, done, info = 0, False, {}
        while not done:
            o = np.asarray(obs, np.float32)[None]
            a_base = np.asarray(base(o), np.float32).reshape(1, -1)
            a = a_base if t < t_base else np.asarray(residual(o, a_base), np.float32).reshape(1, -1)
            next_obs, reward, terminated, truncated, info = env.step(a[0])
            for k, v in (("obs", o[0]), ("action", a[0]), ("reward", reward), ("next_obs", next_obs),
                         ("terminated", terminated), ("truncated", truncated), ("base_action", a_base[0])):
                rows[k].append(v)
            obs, t, done = next_obs, t + 1, terminated or truncated
        ep = {k: np.asarray(v) for k, v in rows.items()}
        ep["reward"] = ep["reward"].astype(np.float32)
        episodes.append({"rows": ep, "t_base": t_base, "success": episode_success(info, env),
                         "return": float(ep["reward"].sum())})
    return episodes


def base_successes(base_path: str | Path, env_id: str, num_episodes: int, *, seed: int = 0,
                   success_return: float | None = None, max_episode_steps: int | None = None,
                   trusted: bool = False, success_key: str | None = None,
                   success_at: str = "any") -> tuple[dict, dict]:
    """PLD's D_offline (spec Sec. 8; paper stage 1 step 1): roll out the frozen base alone for ``num_episodes``
    episodes (reset seeds ``seed, seed + 1, ...``) and keep the successful ones. Returns their rows (``COLUMNS``)
    and statistics (success rate, episodes, successes, rows); a base that succeeds in none is a ValueError.
    Writing the rows is the caller's (``relive.train.pld_cli.collect_successes``: a relive ``.npz``).
    ``trusted``: the base may be a format that can run code (TorchScript, torch.export; ``load_base_policy``).
    ``success_key`` / ``success_at``: success from the task's own info flag (``relive.envs.with_success``; Fetch:
    ``"is_success"`` at the ``"last"`` step), as a training run's ``env.success_key`` / ``env.success_at``."""
    # (gymnasium, optional: imported only where an env is made)
    from relive.envs import env_spec, make_env, with_success

    env = with_success(make_env(env_id, max_episode_steps), success_return, success_key, success_at)
    base = load_base_policy(base_path, env_spec(env), trusted=trusted)
    episodes = hybrid_rollouts(env, base, lambda obs, a_base: a_base, num_episodes, seed, horizon=0)
    rows = successful_rows(episodes)
    rate = float(np.mean([e["success"] for e in episodes]))
    if rows is None:
        raise ValueError(f"the base policy at {base_path} succeeded in none of {num_episodes} episodes on {env_id}: "
                         f"no D_offline to save")
    rows = {k: v for k, v in rows.items() if k in COLUMNS}
    return rows, {"success_rate": rate, "episodes": num_episodes,
                  "successes": int(sum(e["success"] for e in episodes)), "rows": int(len(rows["reward"]))}


def successful_rows(episodes: list[dict]) -> dict | None:
    """The rows of the successful episodes, concatenated (None if none succeeded)."""
    ok = [e["rows"] for e in episodes if e["success"]]
    if not ok:
        return None
    return {k: np.concatenate([r[k] for r in ok]) for k in ok[0]}


def distill(base_path: str | Path, residual, env_id: str, num_episodes: int, out: str | Path, *,
            success_return: float | None = None, horizon: int | None = None, num_steps: int = 2000,
            lr: float = 3e-4, batch_size: int = 256, seed: int = 0, eval_episodes: int = 0,
            eval_seed: int = 10_000, max_episode_steps: int | None = None, allow_other_base: bool = False,
            overwrite: bool = False, trusted: bool = False) -> dict:
    """One round of distillation: hybrid rollouts of the base at ``base_path`` with ``residual(obs [1, O],
    base_action [1, A]) -> executed action [1, A]``, successes kept, and a new base saved to ``out`` (a ``relive
    bc``-style directory, itself a base policy): a BC MLP base (a ``relive bc`` directory or a safetensors MLP)
    is fine-tuned on the executed actions; any other base (a SAC / DDPG actor, a TorchScript module) cannot be
    trained in place, so a new BC MLP student (``BCConfig`` widths) is fitted to them from scratch
    (``stats["new_base"]`` says which). Returns statistics (also written to ``out/distill.json``); with
    ``eval_episodes``, the old and the new base's success rates on fresh episodes.

    ``max_episode_steps``: the time limit of the episodes (a residual run's ``env.max_episode_steps``; None: the
    env's registered one). A residual that says which base it was trained on (``residual.base_sha256``, set by
    ``residual_sac.load_residual``) is refused with a base of another digest unless ``allow_other_base``; an
    existing ``out`` is refused unless ``overwrite`` (both before any rollout). ``trusted``: the base may be a
    format that can run code (TorchScript,
    torch.export; see ``relive.agents.base_policy.load_base_policy``)."""
    # (gymnasium, optional: imported only where an env is made)
    from relive.envs import env_spec, make_env, with_success

    refuse_existing_out(out, overwrite)
    env = with_success(make_env(env_id, max_episode_steps), success_return)
    spec = env_spec(env)
    base = load_base_policy(base_path, spec, trusted=trusted)
    trained_on, digest = str(getattr(residual, "base_sha256", "") or ""), base.digest()
    if trained_on and trained_on != digest and not allow_other_base:
        env.close()
        raise ValueError(f"the residual was trained on a base policy with SHA-256 {trained_on[:16]}..., the base at "
                         f"{base_path} has {digest[:16]}...: a residual corrects the base it was trained on; give "
                         "that base (--base), or pass --allow-other-base (allow_other_base=True) to distill on it")
    episodes = hybrid_rollouts(env, base, residual, num_episodes, seed, horizon)
    env.close()
    rows = successful_rows(episodes)
    n_ok = sum(e["success"] for e in episodes)
    if rows is None:
        raise ValueError(f"distill: none of the {num_episodes} hybrid episodes on {env_id} succeeded; nothing to "
                         "distill (more episodes, or a better residual)")
    if isinstance(base.module, SquashedMLP):
        new, losses = fine_tune(base.module, rows, num_steps, batch_size, lr, seed)
        how = "the base fine-tuned"
    else:
        new, losses = train_bc(rows, spec.action_low, spec.action_high,
                               BCConfig(lr=lr, batch_size=batch_size, num_steps=num_steps), seed)
        how = "a new BC MLP fitted from scratch (the base is not a BC MLP)"
    stats = {"base": str(base_path), "base_sha256": digest, "residual_trained_on_base_sha256": trained_on,
             "max_episode_steps": max_episode_steps, "env_id": env_id, "episodes": num_episodes,
             "successful_episodes": int(n_ok),
             "new_base": how,
             "hybrid_success_rate": n_ok / num_episodes, "rows": int(len(rows["obs"])), "num_steps": num_steps,
             "lr": lr, "seed": seed, "success_return": success_return,
             "loss_first": float(losses[0]) if len(losses) else None,
             "loss_last100": float(losses[-100:].mean()) if len(losses) else None,
             "t_base": [e["t_base"] for e in episodes], "episode_successes": [bool(e["success"]) for e in episodes]}
    if eval_episodes > 0:
        def act(module):
            return lambda o: module(torch.as_tensor(o, dtype=torch.float32)).detach().numpy()

        stats["old_base_eval"] = evaluate_policy(base, env_id, eval_episodes, eval_seed, success_return,
                                                 max_episode_steps)
        stats["new_base_eval"] = evaluate_policy(act(new.eval()), env_id, eval_episodes, eval_seed, success_return,
                                                 max_episode_steps)
        for key in ("old_base_eval", "new_base_eval"):
            stats[key.replace("_eval", "_success_rate")] = stats[key]["success_rate"]
    out = save_bc_policy(out, new, {"distilled_from": str(base_path), "env_id": env_id, "distill": {
        k: v for k, v in stats.items() if k not in ("old_base_eval", "new_base_eval")}}, overwrite=overwrite)
    (Path(out) / "distill.json").write_text(json.dumps(stats, indent=1))
    return stats
