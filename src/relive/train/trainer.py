"""The one training loop: offline phase (gradient steps on the dataset), then online phase in chunks.

Read top to bottom: build -> (resume) -> offline phase -> online phase -> summary. Every gradient step is
[refresh the sampler on its cadence] -> sample -> agent.update -> buffer.update(signals). Checkpoints (agent,
optimizers, buffer, sampler, RNGs, counters; ``train/checkpoint.py``) are written every
``checkpoint_every_offline_grad_steps`` in the offline phase and on the first episode boundary after every
``checkpoint_every_env_steps`` online, so ``train(resume_dir=...)`` continues exactly where the run stopped.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relive.config import ExperimentConfig, ScheduleConfig, load_config, save_config
from relive.replay import (
    ARBSampler,
    BERBSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaPERReferenceSampler,
    ReaPERSampler,
    ReplayBuffer,
    UniformSampler,
)
from relive.replay.checkpoint import load_tree, save_tree
from relive.train.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from relive.train.collector import Collector, returns_to_go
from relive.train.envs import env_spec, make_env, random_actions
from relive.train.evaluation import evaluate, normalized_score
from relive.train.logging import RunLogger

REFRESHED_REPLAYS = ("arb", "arb_transition")  # samplers re-scored by the agent's score_fn


@dataclass(frozen=True)
class RunSummary:
    run_dir: str
    num_offline_grad_steps: int
    num_online_env_steps: int
    num_grad_steps: int
    final_return: float
    final_normalized_score: float
    offline_return: float  # evaluation right after the offline phase (online env step 0)
    best_return: float
    seconds: float  # wall clock of this process (a resumed run counts from its resume)
    status: str = "finished"
    git_sha: str = ""
    torch_version: str = ""


def online_grad_steps(s: ScheduleConfig) -> int:
    """Gradient steps of a full online phase (warm-up excluded only approximately: used for beta's annealing)."""
    if s.grad_steps_per_chunk:
        return s.num_online_env_steps * s.grad_steps_per_chunk // s.env_steps_per_chunk
    return s.num_online_env_steps * s.utd_ratio


def build_sampler(cfg: ExperimentConfig):
    r = cfg.replay
    per = dict(priority_exponent=r.priority_exponent, is_exponent=r.is_exponent,
               is_exponent_final=r.is_exponent_final,
               is_anneal_samples=cfg.schedule.num_offline_grad_steps + online_grad_steps(cfg.schedule))
    match r.name:
        case "uniform":
            return UniformSampler()
        case "per":
            return PrioritizedSampler(**per)
        case "symmetric":
            return MixtureSampler(UniformSampler(), UniformSampler(), offline_fraction=r.offline_fraction)
        case "symmetric_per":
            return MixtureSampler(UniformSampler(), PrioritizedSampler(**per), offline_fraction=r.offline_fraction)
        case "arb" | "arb_transition":
            return ARBSampler(temperature=r.arb_temperature, level="transition" if r.name == "arb_transition"
                              else "trajectory", amortized_rows_per_refresh=r.arb_amortized_rows)
        case "reaper" | "reaper_reference":
            cls = ReaPERReferenceSampler if r.name == "reaper_reference" else ReaPERSampler
            return cls(priority_exponent=r.priority_exponent, reliability_exponent=r.reliability_exponent,
                       is_exponent=r.is_exponent, is_exponent_final=r.is_exponent_final,
                       is_anneal_samples=per["is_anneal_samples"])
        case "berb":
            return BERBSampler(temperature=r.berb_temperature, init_online_fraction=r.berb_init_online_fraction,
                               first_chunk_rows=max(cfg.schedule.env_steps_per_chunk, 1000), seed=cfg.run.seed)
    raise ValueError(f"unknown replay {r.name!r}")


def build_agent(cfg: ExperimentConfig, spec, seed: int):
    from relive.agents.cal_ql import CalQL
    from relive.agents.ddqn import DDQN
    from relive.agents.sac import SAC

    obs_dim = int(np.prod(spec.obs_shape))
    if cfg.agent_kind == "ddqn":
        if not spec.discrete:
            raise ValueError(f"ddqn needs a discrete action space; {spec.id} has a continuous one")
        if cfg.replay.name in REFRESHED_REPLAYS:
            raise ValueError(f"replay {cfg.replay.name!r} re-scores rows with a policy's likelihood; ddqn has none")
        return DDQN(obs_dim, spec.num_actions, cfg.agent, seed=seed, device=cfg.run.device)
    if spec.discrete:
        raise ValueError(f"{cfg.agent_kind} needs a continuous action space; {spec.id} is discrete")
    cls = CalQL if cfg.agent_kind == "calql" else SAC
    return cls(obs_dim, spec.action_shape[0], spec.action_low, spec.action_high, cfg.agent, seed=seed,
               device=cfg.run.device)


def default_run_dir(cfg: ExperimentConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{cfg.preset}-{cfg.env.id}-seed{cfg.run.seed}-{stamp}"


def train(cfg: ExperimentConfig | None = None, *, resume_dir: str | Path | None = None,
          on_step: Callable[[int, int], None] | None = None) -> RunSummary:
    """Run an experiment, or resume the one in ``resume_dir`` from its last checkpoint.

    ``on_step(env_steps, grad_steps)`` is called after every gradient step and every collected chunk (tests
    raise from it to simulate a run killed at an arbitrary point).
    """
    # -- build ---------------------------------------------------------------------------------------
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        if not (run_dir / "config.json").is_file():
            raise ValueError(f"cannot resume {run_dir}: no config.json (not a run directory)")
        if (run_dir / "summary.json").is_file():
            raise ValueError(f"{run_dir} has already finished (summary.json); nothing to resume")
        cfg = load_config(run_dir / "config.json")
    else:
        run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else default_run_dir(cfg)
        if (run_dir / "config.json").exists():
            raise ValueError(f"{run_dir} already holds a run; resume it with --resume or pick another --run-dir")
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.json")
    s, seed = cfg.schedule, cfg.run.seed
    torch.set_num_threads(cfg.run.num_threads)
    env, eval_env = make_env(cfg.env.id, cfg.env.max_episode_steps), make_env(cfg.env.id, cfg.env.max_episode_steps)
    spec = env_spec(env)
    agent = build_agent(cfg, spec, seed)
    gamma = cfg.data.discount if cfg.data.discount is not None else getattr(cfg.agent, "gamma", 0.99)
    needs_mc = cfg.agent_kind == "calql"
    extra = {"mc_return": ()} if needs_mc else None
    buffer = ReplayBuffer(cfg.replay.capacity, spec.obs_shape, spec.action_shape, sampler=build_sampler(cfg),
                          seed=seed, action_dtype=np.int64 if spec.discrete else np.float32, extra_columns=extra)
    ref_min, ref_max = cfg.data.ref_min_return, cfg.data.ref_max_return
    resuming = resume_dir is not None and has_checkpoint(run_dir)
    if cfg.data.dataset and not resuming:  # (a checkpoint holds the buffer, offline rows included)
        from relive.data.loaders import fill_offline, load_rows

        rows, meta = load_rows(cfg.data.dataset, env_id=cfg.env.id)
        fill_offline(buffer, rows, gamma)
        ref_min = ref_min if ref_min is not None else meta.get("ref_min_return")
        ref_max = ref_max if ref_max is not None else meta.get("ref_max_return")
    elif s.num_offline_grad_steps and not cfg.data.dataset:
        raise ValueError("num_offline_grad_steps > 0 needs a dataset (--dataset PATH)")
    if cfg.run.init_from and not resuming:  # one pre-trained agent shared by several fine-tuning runs
        init = Path(cfg.run.init_from) / "agent_final"
        if not (init / "MANIFEST.json").is_file():
            raise ValueError(f"run.init_from: {init} holds no agent (a finished run directory has agent_final/)")
        agent.load_state_dict(load_tree(init, kind="agent"))
    rng = np.random.default_rng(seed + 7)  # warm-up actions
    collector = Collector(env, spec, seed)
    logger = RunLogger(run_dir, s.num_online_env_steps, s.num_offline_grad_steps, cfg.run.progress)
    grad_steps, env_steps, offline_done = 0, 0, 0
    next_ckpt, next_eval, next_log = cfg.run.checkpoint_every_env_steps, 0, cfg.run.log_every_env_steps
    train_metrics: dict = {}
    online_draws = [0.0, 0]  # sum of online shares of sampled batches, number of batches (since last eval)
    offline_return, best_return = math.nan, -math.inf
    switch_grad_step: int | None = None  # gradient steps taken when the online phase began
    start = time.perf_counter()

    # -- resume --------------------------------------------------------------------------------------
    if resume_dir is not None and not resuming:  # stopped before its first checkpoint: start over, cleanly
        logger.truncate_after(-1, -1)
        logger.print(f"{run_dir} has no checkpoint yet: starting it from the beginning")
    if resuming:
        agent_state, buffer, t = load_checkpoint(run_dir)
        agent.load_state_dict(agent_state)
        grad_steps, env_steps, offline_done = int(t["grad_steps"]), int(t["env_steps"]), int(t["offline_done"])
        next_ckpt, next_eval, next_log = int(t["next_ckpt"]), int(t["next_eval"]), int(t["next_log"])
        offline_return, best_return = float(t["offline_return"]), float(t.get("best_return", -math.inf))
        switch_grad_step = None if int(t.get("switch_grad_step", -1)) < 0 else int(t["switch_grad_step"])
        online_draws[:] = [float(t.get("online_share_sum", 0.0)), int(t.get("online_share_batches", 0))]
        ref_min, ref_max = t["ref_min"], t["ref_max"]
        rng.bit_generator.state = t["rng"]
        collector.load_state_dict(t["collector"])
        logger.truncate_after(env_steps, grad_steps)
        logger.print(f"resumed {run_dir} at env step {env_steps}, gradient step {grad_steps}")

    # amortized ARB re-scores a rotating slice per call: it is called every gradient step (its contract)
    refresh_every = 1 if cfg.replay.arb_amortized_rows else s.refresh_every_grad_steps

    def gradient_step() -> None:
        nonlocal grad_steps, train_metrics
        if len(buffer) < s.batch_size:
            return  # not enough rows yet (no dataset and a short warm-up)
        # ARB Alg. 1 step b: re-score every row with the current policy every d_weight online gradient steps,
        # before sampling (the offline phase is the base algorithm's own: no re-scoring there)
        if cfg.replay.name in REFRESHED_REPLAYS and switch_grad_step is not None \
                and (grad_steps - switch_grad_step) % refresh_every == 0:
            buffer.refresh(agent.score_fn(cfg.replay.score_mode))
        batch = buffer.sample(s.batch_size)
        result = agent.update(batch)
        buffer.update(batch.info, **result.signals)  # per-sample signals back to the sampler (td_error, ...)
        train_metrics = result.metrics
        online_draws[0] += float(np.mean(batch.info.source))
        online_draws[1] += 1
        grad_steps += 1
        if on_step is not None:
            on_step(env_steps, grad_steps)

    def run_eval() -> dict:
        nonlocal best_return
        returns = evaluate(eval_env, agent, cfg.run.eval_episodes, seed=10_000 + 1000 * seed)
        mean = float(returns.mean())
        best_return = max(best_return, mean)
        frac = online_draws[0] / online_draws[1] if online_draws[1] else math.nan
        row = {"env_step": env_steps, "grad_step": grad_steps, "eval/return_mean": mean,
               "eval/return_std": float(returns.std()),
               "eval/normalized_score": normalized_score(mean, ref_min, ref_max),
               "replay/online_fraction": frac, "time/seconds": time.perf_counter() - start}
        logger.evaluation(row)
        if cfg.run.save_agent_snapshots:
            save_tree(run_dir / "snapshots" / f"agent_{env_steps}", agent.state_dict(), kind="agent")
        online_draws[:] = [0.0, 0]  # the next row reports the batches drawn since this evaluation
        return row

    def checkpoint() -> None:
        save_checkpoint(run_dir, agent, buffer, {
            "grad_steps": grad_steps, "env_steps": env_steps, "offline_done": offline_done,
            "next_ckpt": next_ckpt, "next_eval": next_eval, "next_log": next_log,
            "offline_return": offline_return, "best_return": best_return, "ref_min": ref_min, "ref_max": ref_max,
            "switch_grad_step": -1 if switch_grad_step is None else switch_grad_step,
            "online_share_sum": online_draws[0], "online_share_batches": online_draws[1],
            "rng": rng.bit_generator.state, "collector": collector.state_dict()})

    # -- offline phase -------------------------------------------------------------------------------
    try:
        phase_start, phase_grad = time.perf_counter(), grad_steps
        while offline_done < s.num_offline_grad_steps:
            gradient_step()
            offline_done += 1
            if offline_done % 100 == 0 or offline_done == s.num_offline_grad_steps:
                rate = (grad_steps - phase_grad) / max(time.perf_counter() - phase_start, 1e-9)
                logger.progress("offline", offline_done, f"{rate:.0f} grad/s")
            if offline_done % cfg.run.log_every_env_steps == 0:
                logger.metrics(0, train_metrics | {"grad_step": grad_steps, "phase": "offline"})
            if offline_done % cfg.run.checkpoint_every_offline_grad_steps == 0 \
                    or offline_done == s.num_offline_grad_steps:
                checkpoint()
        if switch_grad_step is None:
            switch_grad_step = grad_steps
        if hasattr(agent, "set_online"):
            agent.set_online(True)

        # -- online phase ------------------------------------------------------------------------------
        def policy(obs):
            if env_steps < s.num_warmup_env_steps and s.warmup_policy == "random":
                return random_actions(spec, obs.shape[0], rng)
            return agent.act(obs, explore=True)  # ("agent" warm-up: the pre-trained policy, no updates yet)

        phase_start, phase_env, phase_grad = time.perf_counter(), env_steps, grad_steps
        stop_at, stopped = cfg.run.stop_at_return, None
        while env_steps < s.num_online_env_steps:
            if env_steps >= next_eval:
                row = run_eval()
                if env_steps == 0:
                    offline_return = row["eval/return_mean"]
                next_eval += cfg.run.eval_every_env_steps
                if stop_at is not None and row["eval/return_mean"] >= stop_at:
                    logger.print(f"evaluation return {row['eval/return_mean']:.1f} >= {stop_at}: stopping at env "
                                 f"step {env_steps} (run.stop_at_return)")
                    stopped = row
                    break
            if env_steps >= next_ckpt and collector.at_episode_start:  # between episodes: exact resume
                next_ckpt = env_steps + cfg.run.checkpoint_every_env_steps
                checkpoint()
            k = min(s.env_steps_per_chunk, s.num_online_env_steps - env_steps)
            rows = collector.step(policy, k)  # truncation: next_obs is the true final obs (bootstrapped)
            if needs_mc:
                rows["mc_return"] = np.zeros(k, np.float32)  # filled when the episode ends (below)
            slots = buffer.extend(rows)
            if needs_mc:
                _fill_online_returns(buffer, slots, rows, gamma)
            env_steps += k
            if on_step is not None:
                on_step(env_steps, grad_steps)
            if env_steps > s.num_warmup_env_steps:
                for _ in range(s.grad_steps_per_chunk or k * s.utd_ratio):
                    gradient_step()
            elapsed = max(time.perf_counter() - phase_start, 1e-9)
            env_rate, grad_rate = (env_steps - phase_env) / elapsed, (grad_steps - phase_grad) / elapsed
            if env_steps >= next_log:
                returns = collector.finished_returns
                logger.metrics(env_steps, train_metrics | buffer.stats() | {
                    "grad_step": grad_steps, "phase": "online", "time/env_steps_per_s": env_rate,
                    "time/grad_steps_per_s": grad_rate,
                    "train/episode_return": float(np.mean(returns)) if returns else math.nan})
                collector.finished_returns = []
                next_log += cfg.run.log_every_env_steps
            logger.progress("online", env_steps, f"{env_rate:.0f} env/s {grad_rate:.0f} grad/s")

        # -- summary -----------------------------------------------------------------------------------
        final = stopped if stopped is not None else run_eval()
        logger.metrics(env_steps, train_metrics | buffer.stats() | {"grad_step": grad_steps, "phase": "final"})
        save_tree(run_dir / "agent_final", agent.state_dict(), kind="agent")  # the trained policy, reusable
        if cfg.run.save_final_buffer:
            buffer.save(run_dir / "buffer_final")
    finally:
        logger.close()
    summary = RunSummary(str(run_dir), s.num_offline_grad_steps, env_steps, grad_steps, final["eval/return_mean"],
                         final["eval/normalized_score"], offline_return, best_return, time.perf_counter() - start,
                         git_sha=_git_sha(), torch_version=torch.__version__)
    (run_dir / "summary.json").write_text(json.dumps(summary.__dict__, indent=1, allow_nan=True))
    return summary


def _fill_online_returns(buffer: ReplayBuffer, slots: np.ndarray, rows: dict, gamma: float) -> None:
    """Official Cal-QL: once an online episode ends, its rows get their true Monte-Carlo returns-to-go."""
    ends = np.flatnonzero(rows["terminated"] | rows["truncated"])
    if ends.size == 0:
        return
    episodes = buffer.storage.episodes
    for i in ends:
        view = episodes.get([buffer.storage.meta["episode_id"][slots[i]]])
        ep_slots = buffer.storage.episode_slots(view.start, view.length, view.source)
        reward = buffer.storage.columns["reward"][ep_slots]
        term = buffer.storage.columns["terminated"][ep_slots]
        end = np.zeros(ep_slots.size, bool)
        end[-1] = True
        buffer.set_column("mc_return", ep_slots, returns_to_go(reward, end, term, gamma))


def _git_sha() -> str:
    """The source tree's commit (+ "-dirty"), or "" outside a git checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{sha}-dirty" if sha and dirty else sha
