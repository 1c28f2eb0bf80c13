"""Stable-Baselines3's SAC + ``HerReplayBuffer`` beside relive's ``sac_her`` (issue 30), in relive's run layout.

    python bench/sb3_her.py run --root runs --seeds 0 1 2 3 4          # one run at a time, resumable
    python bench/sb3_her.py report --grid-root runs --root runs --out docs/results

A peer's baseline beside relive, not part of the library (it needs the ``bench`` extra: stable-baselines3).

**Settings** come from relive's preset (:func:`sb3_kwargs`, ``sac_her`` by default), so the two sides cannot drift
apart: discount, Adam learning rate (SB3 has one for actor, critics and temperature; relive's three are equal),
batch, Polyak rate per gradient step, hidden layers of the actor and of each of the two critics, 1 gradient step per
env step after the same number of random warm-up steps, buffer capacity, the initial temperature and the target
entropy -|A|, HER's k (``n_sampled_goal``) and strategy. The networks read the same keys (``agent.obs_keys``:
``desired_goal`` and ``observation``, concatenated in sorted order) through ``GoalKeysExtractor`` (SB3's
default ``CombinedExtractor`` would also read ``achieved_goal``). Not the same: SB3's HER relabels exactly
int(0.8 B) rows of a batch and samples only rows of finished episodes (relive: each row with probability 0.8, open
episodes too), and the random streams differ. Both: one Gymnasium env, one process, torch on 1 thread.

**Evaluation**: relive's protocol (``relive.train.loop.evaluation``): at env step 0 and every ``--eval-every`` env
steps, ``--eval-episodes`` deterministic episodes on a separate env reset with seeds e, e + 1, ... where e is the
seed relive's trainer gives its evaluation env for the same run seed (the same goals as the relive runs of that
seed); success = ``info["is_success"]`` at the episode's last step. ``time/seconds`` is wall-clock since the run
started (evaluations included, as relive's).

**Run layout** (what ``relive bench report`` reads): ``<root>/<grid>/<label>/<task>/seed_N/`` with ``config.json``,
``eval.csv``, ``metrics.jsonl`` (one line per evaluation) and, when finished, ``summary.json``. A run directory with
a ``summary.json`` is skipped; an unfinished one (killed) starts over; one process per run directory (the run lock
relive's trainer takes, so a second runner is refused with the holder's PID).

**Report**: ``relive bench report`` reads one root per grid; ``report`` links the relive grid's finished runs and the
SB3 runs into one combined root (symlinks: the grid's root is only read), reports the grid with the SB3 variant added,
and adds a success-vs-wall-clock figure.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from relive.envs import info_success, make_env
from relive.experiments.grid import Grid, Variant, load_grid
from relive.experiments.report import NOTES_MARKER, make_report
from relive.experiments.runner import FINISHED, RUN_LOCK
from relive.files import DirectoryLock
from relive.presets import get_preset
from relive.train.trainer import seed_streams

GRID, LABEL, TASK = "her-fetch", "sb3_sac_her", "FetchReach-v4"
EVAL_COLUMNS = ("env_step", "grad_step", "eval/return_mean", "eval/return_std", "eval/success_rate", "time/seconds")


def sb3_kwargs(preset: str = "sac_her") -> dict:
    """SB3 ``SAC(...)`` keyword arguments (and HER's) at the settings of relive's ``preset``."""
    cfg = get_preset(preset)
    a, s = cfg.agent, cfg.schedule
    if cfg.agent_kind != "sac" or cfg.replay.name != "her":
        raise ValueError(f"sb3_her: preset {preset!r} is not a SAC + HER preset (agent {cfg.agent_kind!r}, replay "
                         f"{cfg.replay.label!r})")
    her = cfg.replay.options
    if her.inner.name != "uniform":
        raise ValueError(f"sb3_her: SB3's HerReplayBuffer draws rows uniformly; preset {preset!r} relabels "
                         f"{her.inner.name!r}")
    if not a.actor_lr == a.critic_lr == a.temp_lr:
        raise ValueError(f"sb3_her: SB3's SAC has one learning rate; preset {preset!r} has actor / critic / "
                         f"temperature rates {a.actor_lr} / {a.critic_lr} / {a.temp_lr}")
    if s.env_steps_per_chunk != 1 or s.utd_ratio != 1 or s.grad_steps_per_chunk:
        raise ValueError(f"sb3_her: preset {preset!r} does not make 1 gradient step per env step")
    if a.target_entropy is not None or a.target_entropy_scale != 1.0 or a.num_qs != 2 or a.num_min_qs != 2:
        raise ValueError(f"sb3_her: preset {preset!r} is not SAC's default target entropy / twin critics")
    return {
        "learning_rate": a.actor_lr, "buffer_size": cfg.replay.capacity, "learning_starts": s.num_warmup_env_steps,
        "batch_size": s.batch_size, "tau": a.tau, "gamma": a.gamma, "train_freq": 1, "gradient_steps": 1,
        "ent_coef": f"auto_{a.init_temperature}" if a.learn_temperature else a.init_temperature,
        "target_entropy": "auto", "target_update_interval": 1,
        "policy_kwargs": {"net_arch": list(a.hidden), "obs_keys": sorted(a.obs_keys)},
        "her": {"n_sampled_goal": int(her.k), "goal_selection_strategy": her.strategy},
        "eval": {"success_key": cfg.env.success_key, "success_at": cfg.env.success_at},
    }


def eval_seed(seed: int) -> int:
    """The seed relive's trainer resets its evaluation episodes from (``seed_streams(seed)["eval"]``)."""
    return int(seed_streams(seed)["eval"].generate_state(1)[0] % 2**31)


def evaluate(model, env, episodes: int, seed: int, success_key: str, success_at: str) -> tuple[np.ndarray, np.ndarray]:
    """(returns, successes) of ``episodes`` deterministic episodes reset with seeds ``seed, seed + 1, ...``."""
    returns, successes = np.zeros(episodes), np.zeros(episodes, bool)
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        done, succeeded = False, False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            returns[i] += float(reward)
            now = info_success(info, success_key, env)
            succeeded = now if success_at == "last" else now or succeeded
            done = terminated or truncated
        successes[i] = succeeded
    return returns, successes


def _extractor_class():
    import torch
    from gymnasium import spaces  # (with SB3: imported only to run it)
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class GoalKeysExtractor(BaseFeaturesExtractor):
        """The named keys of a dict observation, flattened and concatenated in sorted order (relive's ``flat``
        encoder over ``agent.obs_keys``)."""

        def __init__(self, observation_space: spaces.Dict, obs_keys=("desired_goal", "observation")):
            keys = sorted(obs_keys)
            dim = sum(math.prod(observation_space[k].shape or ()) for k in keys)
            super().__init__(observation_space, features_dim=dim)
            self.keys = keys

        def forward(self, observations: dict) -> torch.Tensor:
            return torch.cat([observations[k].flatten(1) for k in self.keys], dim=1)

    return GoalKeysExtractor


def build_model(env, seed: int, settings: dict):
    """SB3's ``SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer, ...)`` at ``settings``."""
    from stable_baselines3 import SAC, HerReplayBuffer  # (a bench dependency: imported only to run it)

    kw = {k: v for k, v in settings.items() if k not in ("policy_kwargs", "her", "eval")}
    pk = settings["policy_kwargs"]
    policy_kwargs = {"net_arch": pk["net_arch"], "features_extractor_class": _extractor_class(),
                     "features_extractor_kwargs": {"obs_keys": tuple(pk["obs_keys"])}}
    return SAC("MultiInputPolicy", env, replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs=settings["her"],
               policy_kwargs=policy_kwargs, seed=seed, device="cpu", verbose=0, **kw)


class _EvalLog:
    """Evaluations into ``eval.csv`` and ``metrics.jsonl`` (relive's layout), every ``every`` env steps."""

    def __init__(self, run_dir: Path, model, env, episodes: int, seed: int, every: int, settings: dict):
        self.run_dir, self.model, self.env, self.episodes, self.seed, self.every = run_dir, model, env, episodes, \
            seed, every
        self.eval_cfg = settings["eval"]
        self.start = time.perf_counter()
        self.last: dict = {}
        with open(run_dir / "eval.csv", "w", newline="") as f:
            csv.writer(f).writerow(EVAL_COLUMNS)
        (run_dir / "metrics.jsonl").write_text("")

    def __call__(self, env_step: int) -> None:
        returns, successes = evaluate(self.model, self.env, self.episodes, self.seed, **self.eval_cfg)
        row = {"env_step": env_step, "grad_step": int(self.model._n_updates),
               "eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std()),
               "eval/success_rate": float(successes.mean()), "time/seconds": time.perf_counter() - self.start}
        with open(self.run_dir / "eval.csv", "a", newline="") as f:
            csv.writer(f).writerow([row[k] for k in EVAL_COLUMNS])
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row | {"phase": "online"}) + "\n")
        self.last = row


def _callback(log: _EvalLog):
    from stable_baselines3.common.callbacks import BaseCallback  # (imported only to run it)

    class EvalEvery(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % log.every == 0:
                log(self.num_timesteps)
            return True

    return EvalEvery()


def run_one(run_dir: str | Path, seed: int, *, task: str = TASK, env_steps: int = 20_000, eval_every: int = 1000,
            eval_episodes: int = 10, preset: str = "sac_her", overrides: dict | None = None) -> str:
    """One SB3 run into ``run_dir``: ``"skipped"`` when it holds a finished run, else ``"finished"`` (an unfinished
    directory starts over). ``overrides``: SB3 keyword arguments over the preset's (tests: a tiny budget)."""
    run_dir = Path(run_dir)
    if (run_dir / FINISHED).is_file():
        return "skipped"
    run_dir.mkdir(parents=True, exist_ok=True)
    with DirectoryLock(run_dir, RUN_LOCK, what="run"):
        if (run_dir / FINISHED).is_file():  # finished by the process that held the lock until now
            return "skipped"
        import torch  # (heavy: only to run)

        torch.set_num_threads(1)  # relive's run.num_threads
        settings = sb3_kwargs(preset) | (overrides or {})
        env, eval_env = make_env(task, keep_goal_dict=True), make_env(task, keep_goal_dict=True)
        e_seed = eval_seed(seed)
        eval_env.reset(seed=e_seed)
        model = build_model(env, seed, settings)
        versions = _versions()
        config = {"runner": "bench/sb3_her.py", "preset": preset, "task": task, "seed": seed,
                  "env_steps": env_steps, "eval_every": eval_every, "eval_episodes": eval_episodes,
                  "eval_seed": e_seed, "sb3": settings, "versions": versions}
        (run_dir / "config.json").write_text(json.dumps(config, indent=1))
        log = _EvalLog(run_dir, model, eval_env, eval_episodes, e_seed, eval_every, settings)
        log(0)
        model.learn(total_timesteps=env_steps, callback=_callback(log))
        last = log.last
        summary = {"run_dir": str(run_dir), "runner": config["runner"], "num_online_env_steps": env_steps,
                   "num_grad_steps": int(model._n_updates), "final_return": last["eval/return_mean"],
                   "final_success_rate": last["eval/success_rate"], "final_normalized_score": math.nan,
                   "seconds": time.perf_counter() - log.start, "status": "finished", **versions}
        (run_dir / FINISHED).write_text(json.dumps(summary, indent=1))
    return "finished"


def _versions() -> dict:
    import stable_baselines3
    import torch

    return {"sb3_version": stable_baselines3.__version__, "torch_version": torch.__version__}


def run_dir(root: str | Path, seed: int, task: str = TASK, label: str = LABEL, grid: str = GRID) -> Path:
    """``<root>/<grid>/<label>/<task>/seed_N``: where ``relive bench report`` looks for the variant's runs."""
    return Path(root) / grid / label / task / f"seed_{int(seed)}"


# -- the report ---------------------------------------------------------------------------------------------
def combined_root(grid_root: str | Path, root: str | Path, grid: Grid, label: str = LABEL) -> Path:
    """``<root>/combined``: symlinks to the grid's run directories under ``grid_root`` (only read) and to the SB3
    runs under ``root``, in one ``<grid>/<label>/<task>/seed_N`` tree that :func:`make_report` reads."""
    out = Path(root) / "combined" / grid.name
    for spec in grid.runs():
        src = Path(grid_root) / grid.name / spec.key if spec.label != label else Path(root) / grid.name / spec.key
        link = out / spec.key
        if not src.is_dir():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src.resolve(), target_is_directory=True)
    return out.parent


def with_sb3_variant(grid: Grid, label: str = LABEL) -> Grid:
    """``grid`` with the SB3 runs as one more variant (its ``preset`` names the relive preset it mirrors; the grid
    runner never runs it: these runs come from :func:`run_one`)."""
    if any(v.label == label for v in grid.variants):
        return grid
    tasks = (TASK,) if TASK in grid.tasks else grid.tasks
    return dataclasses.replace(grid, variants=(*grid.variants, Variant(label, "sac_her", tasks=tasks)))


def read_eval(path: Path) -> dict[str, np.ndarray]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: np.array([float(r[k]) for r in rows]) for k in (rows[0] if rows else {})}


def wallclock_figure(root: Path, grid: Grid, out: Path, score: str = "eval/success_rate") -> tuple[Path, list[str]]:
    """Success vs wall-clock per variant: the mean over seeds of the score against the mean over seeds of
    ``time/seconds`` at each evaluation step (runs of one variant evaluate at the same steps). Returns the PNG and
    Markdown table lines (seconds to the first evaluation at >= 0.9, per run)."""
    import matplotlib  # (slow to import: only to plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (slow to import: only to plot)

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    lines = ["| variant | n | seconds per run (mean) | seconds to success >= 0.9 (per run; - = never) | env steps to "
             "success >= 0.9 (per run) |", "|---|---|---|---|---|"]
    for v in grid.variants:
        runs = [read_eval(d / "eval.csv") for d in sorted((root / grid.name / v.label / TASK).glob("seed_*"))
                if (d / FINISHED).is_file() and (d / "eval.csv").is_file()]
        if not runs:
            continue
        n = min(len(r["env_step"]) for r in runs)
        secs = np.mean([r["time/seconds"][:n] for r in runs], axis=0)
        ax.plot(secs, np.mean([r[score][:n] for r in runs], axis=0), marker=".", label=f"{v.label} (n={len(runs)})")
        first = [np.flatnonzero(r[score] >= 0.9)[0] if (r[score] >= 0.9).any() else None for r in runs]
        reach = ["-" if i is None else f"{r['time/seconds'][i]:.0f}" for r, i in zip(runs, first, strict=True)]
        steps = ["-" if i is None else f"{r['env_step'][i]:.0f}" for r, i in zip(runs, first, strict=True)]
        lines.append(f"| {v.label} | {len(runs)} | {secs[-1]:.0f} | {', '.join(reach)} | {', '.join(steps)} |")
    ax.set_xlabel("wall-clock seconds (mean over seeds at each evaluation)")
    ax.set_ylabel(score)
    ax.set_title(f"{grid.name}: {TASK}, success vs wall-clock", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = out / f"{grid.name}_wallclock.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png, lines


def report(grid_root: str | Path, root: str | Path, out: str | Path, grid_name: str = GRID,
           overwrite: bool = False) -> Path:
    """``relive bench report``'s Markdown and plots of the grid with the SB3 variant, plus success vs wall-clock."""
    grid = with_sb3_variant(load_grid(grid_name))
    both = combined_root(grid_root, root, grid)
    md = make_report(grid, both, out, overwrite=overwrite)
    png, table = wallclock_figure(both, grid, Path(out))
    text = md.read_text()
    section = "\n".join(["## Success vs wall-clock", "", "Wall-clock seconds of each run since its start (evaluations "
                         "included), on whatever else the machine ran then.", "", *table, "",
                         f"![success vs wall-clock]({png.name})", "", ""])
    head, notes = text.split(NOTES_MARKER, 1) if NOTES_MARKER in text else (text, None)
    head = head.split("## Success vs wall-clock")[0].rstrip() + "\n\n" + section  # (a rerun replaces it)
    md.write_text(head if notes is None else head + NOTES_MARKER + notes)
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/sb3_her.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="SB3 SAC + HerReplayBuffer runs, one after another (finished seeds skipped)")
    r.add_argument("--root", required=True, help="runs go to ROOT/her-fetch/sb3_sac_her/TASK/seed_N")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    r.add_argument("--task", default=TASK)
    r.add_argument("--env-steps", type=int, default=20_000)
    r.add_argument("--eval-every", type=int, default=1000)
    r.add_argument("--eval-episodes", type=int, default=10)
    r.add_argument("--preset", default="sac_her", help="the relive preset whose settings SB3 gets (default sac_her)")
    rep = sub.add_parser("report", help="the grid's report with the SB3 variant, and success vs wall-clock")
    rep.add_argument("--grid-root", required=True, help="the relive grid's --root (only read)")
    rep.add_argument("--root", required=True, help="the SB3 runs' --root (the combined tree is written here)")
    rep.add_argument("--out", default="reports")
    rep.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "report":
        print(report(args.grid_root, args.root, args.out, overwrite=args.overwrite))
        return 0
    for seed in args.seeds:
        d = run_dir(args.root, seed, args.task)
        t0 = time.perf_counter()
        status = run_one(d, seed, task=args.task, env_steps=args.env_steps, eval_every=args.eval_every,
                         eval_episodes=args.eval_episodes, preset=args.preset)
        print(f"{d}: {status} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
