"""After training: ``relive eval RUN_DIR`` (a run's saved agent on fresh episodes), ``relive export RUN_DIR`` (its
deterministic policy as TorchScript, ONNX or safetensors) and ``relive plot RUN_DIR...`` (curves of several runs,
mean and a bootstrap confidence band across the seeds of each configuration).

They only read the run directories they are given (config.json, agent_final/ or the last checkpoint, eval.csv,
metrics.jsonl; ``relive.agents.run_dir.open_run_dir``) and write only the file named by ``--out`` (and ``--video``'s
episode files): refused over an existing file or symbolic link without ``--overwrite``, never over a directory;
written whole through a temporary renamed over it, so a symbolic link there is replaced, never written through.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np

from relive.agents.export import FORMATS, deterministic_policy, policy_input, write_policy
from relive.agents.run_dir import TRUST_FLAG, open_run_dir
from relive.cli import non_negative_int, positive_int
from relive.config import ExperimentConfig
from relive.data.lerobot_io import write_video
from relive.envs import env_spec, make_env
from relive.extras import require
from relive.files import refuse_existing_output, replace_file, write_text_atomic
from relive.train.checkpoint import has_checkpoint, load_checkpoint
from relive.train.evaluation import evaluate_episodes
from relive.train.trainer import build_agent

TRUST_HELP = ("let the run's base policy be a file that can run code when loaded (TorchScript, torch.export .pt2): "
              "only for runs you trust; a run directory's config.json never says it (docs/guarantees.md)")


def add_parsers(subparsers) -> None:
    ev = subparsers.add_parser("eval", help="evaluate a finished run's agent on fresh episodes",
                               description="The deterministic policy of a run (agent_final/, or with --checkpoint "
                                           "its last checkpoint's agent) on new episodes of its env: return mean, "
                                           "std, min, max and the success rate where the task reports success.")
    ev.add_argument("run_dir", type=Path)
    ev.add_argument("--episodes", type=positive_int, default=10)
    ev.add_argument("--seed", type=non_negative_int, default=1_000_000, help="episode i resets with seed + i "
                    "(default 1,000,000: start states the run's own evaluations did not use)")
    ev.add_argument("--checkpoint", action="store_true", help="the last checkpoint's agent (an unfinished run)")
    ev.add_argument("--device", default="cpu", help="torch device for the agent (default cpu)")
    ev.add_argument("--video", type=Path, metavar="DIR", help="also write each episode as DIR/episode_<i>.mp4 (the "
                    "env's rgb_array frames, lossless H.264; needs PyAV)")
    ev.add_argument("--out", type=Path, help="also write the results as JSON here")
    ev.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    ev.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    ev.set_defaults(func=_eval)
    ex = subparsers.add_parser("export", help="write a run's deterministic policy for deployment",
                               description="The policy a run's agent acts with at evaluation (SAC / RLPD / Cal-QL: "
                                           "the squashed mean; DDPG: the actor; DDQN: greedy in Q) as TorchScript, "
                                           "ONNX or safetensors (numbers only; relive.agents.export."
                                           "load_safetensors_policy rebuilds it); it reproduces the agent's "
                                           "actions. Flat observations only.")
    ex.add_argument("run_dir", type=Path)
    ex.add_argument("--format", choices=FORMATS, required=True)
    ex.add_argument("--out", type=Path, required=True, help="the file to write")
    ex.add_argument("--checkpoint", action="store_true", help="the last checkpoint's agent (an unfinished run)")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    ex.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    ex.set_defaults(func=_export)
    pl = subparsers.add_parser("plot", help="curves of several runs: mean and confidence band across seeds",
                               description="One curve per configuration (runs that differ only in their seed are "
                                           "one configuration): the mean over its runs and a 95%% bootstrap band "
                                           "(with two or more runs), against env steps.")
    pl.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR")
    pl.add_argument("--metric", default="eval/return_mean", help="a column of eval.csv, or a key of metrics.jsonl "
                    "(default eval/return_mean)")
    pl.add_argument("--out", type=Path, required=True, help="the PNG to write")
    pl.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    pl.set_defaults(func=_plot)


# -- relive eval ---------------------------------------------------------------------------------------------
def run_config(run_dir: Path) -> ExperimentConfig:
    """A run's configuration as every command reads it (``relive.agents.run_dir.open_run_dir``: no trust, the
    directory where it is)."""
    return open_run_dir(run_dir).config


def load_run_agent(run_dir: Path, checkpoint: bool = False, device: str = "cpu", render_mode: str | None = None,
                   *, trusted: bool = False):
    """(config, env, spec, agent, where its state came from) of a run: ``agent_final/``, or the last checkpoint's.
    ``trusted``: the caller's opt-in (``--trust-code``) to a base policy file that can run code; config.json's is
    never taken (``open_run_dir``), and what it said is noted on stderr."""
    run = open_run_dir(run_dir, trusted=trusted)
    for note in run.notes:
        print(f"relive: note: {note}", file=sys.stderr)
    cfg = run.config
    if checkpoint:
        if not has_checkpoint(run.path):
            raise ValueError(f"{run.path} has no checkpoint yet")
        state, source = load_checkpoint(run.path)["agent"], "last checkpoint"
    else:
        if not run.agent_final.is_dir():
            raise ValueError(f"{run.path} has no agent_final/ (the run has not finished): evaluate its last "
                             "checkpoint's agent with --checkpoint")
        state, source = run.final_agent_state(), "agent_final"
    if not cfg.env.id:  # an offline-only run without an environment: its spec from its dataset
        from relive.train.trainer import dataset_spec

        env, spec = None, dataset_spec(cfg)
    else:
        env = make_env(cfg.env.id, cfg.env.max_episode_steps, render_mode=render_mode, evaluation=True,
                       env_kwargs=cfg.env.kwargs, **cfg.replay.env_options)  # (as the run made it: its replay's
        # needs, HER keeps goal dicts; Atari: full games, as the run's evaluations; its env.kwargs)
        spec = env_spec(env)
    agent = build_agent(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device=device)), spec)
    agent.load_state_dict(state)
    return cfg, env, spec, agent, source


class FrameRecorder(gym.Wrapper):
    """Keeps the env's rendered frame after every reset and step, one list per episode (``relive eval --video``)."""

    def __init__(self, env):
        super().__init__(env)
        self.episodes: list[list[np.ndarray]] = []

    def reset(self, **kwargs):
        out = self.env.reset(**kwargs)
        self.episodes.append([np.asarray(self.env.render())])
        return out

    def step(self, action):
        out = self.env.step(action)
        self.episodes[-1].append(np.asarray(self.env.render()))
        return out


def evaluate_run(run_dir: Path, episodes: int, seed: int, checkpoint: bool = False, device: str = "cpu",
                 video: Path | None = None, *, trusted: bool = False) -> dict:
    """The run's agent on ``episodes`` episodes seeded ``seed, seed + 1, ...``: returns, successes and their
    summary; with ``video``, each episode as ``video/episode_<i>.mp4``. ``trusted``: see :func:`load_run_agent`."""
    cfg, env, _, agent, source = load_run_agent(run_dir, checkpoint, device,
                                                render_mode="rgb_array" if video is not None else None,
                                                trusted=trusted)
    if env is None:
        raise ValueError(f"{run_dir} trained without an environment (offline only): nothing to evaluate it on; "
                         "`relive export` writes its policy")
    if video is not None:
        require("av", "--video (mp4 files)")  # (before the episodes run)
        env = FrameRecorder(env)
    returns, successes = evaluate_episodes(env, agent, episodes, seed, success_key=cfg.env.success_key,
                                           success_at=cfg.env.success_at)
    if video is not None:
        fps = int(env.metadata.get("render_fps") or 30)
        Path(video).mkdir(parents=True, exist_ok=True)
        for i, frames in enumerate(env.episodes):
            hwc = np.stack(frames)
            if hwc.ndim != 4 or hwc.shape[-1] != 3 or hwc.dtype != np.uint8:
                raise ValueError(f"{cfg.env.id}: rendered frames of shape {hwc.shape} {hwc.dtype}, not RGB images")
            replace_file(Path(video) / f"episode_{i}.mp4",  # (a symbolic link there: replaced, not written through)
                         _video_writer(hwc, fps))
    env.close()
    out = {"run_dir": str(run_dir), "agent": source, "env": cfg.env.id, "episodes": episodes, "seed": seed,
           "returns": returns.tolist(), "return_mean": float(returns.mean()), "return_std": float(returns.std()),
           "return_min": float(returns.min()), "return_max": float(returns.max())}
    if successes is not None:
        out["success_rate"] = float(successes.mean())
    elif cfg.env.success_return is not None:
        out["success_rate"] = float(np.mean(returns >= cfg.env.success_return))
    return out


def _video_writer(hwc: np.ndarray, fps: int) -> Callable[[Path], object]:
    """``write(tmp)`` for :func:`~relive.files.replace_file`: frames ``[T, H, W, 3]`` as an mp4 at ``fps``."""
    return lambda tmp: write_video(tmp, hwc.transpose(0, 3, 1, 2), fps)


def _eval(args: argparse.Namespace) -> int:
    if args.out is not None:
        refuse_existing_output(args.out, args.overwrite)
    if args.video is not None:
        if args.video.is_symlink() and not args.video.exists() or args.video.exists() and not args.video.is_dir():
            raise ValueError(f"--video {args.video} is {'a dangling link' if args.video.is_symlink() else 'a file'}, "
                             "not a directory: give the directory to write episode_<i>.mp4 files into")
        for i in range(args.episodes):
            refuse_existing_output(args.video / f"episode_{i}.mp4", args.overwrite, "--video")
    res = evaluate_run(args.run_dir, args.episodes, args.seed, args.checkpoint, args.device, args.video,
                       trusted=args.trust_code)
    success = f", success rate {res['success_rate']:.2f}" if "success_rate" in res else ""
    print(f"{res['run_dir']} ({res['agent']}) on {res['env']}: {res['episodes']} episodes, return "
          f"{res['return_mean']:.1f} +- {res['return_std']:.1f} (min {res['return_min']:.1f}, max "
          f"{res['return_max']:.1f}){success}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(res, indent=1))  # (a symbolic link there: replaced, not followed)
    return 0


# -- relive export ---------------------------------------------------------------------------------------------
def _export(args: argparse.Namespace) -> int:
    refuse_existing_output(args.out, args.overwrite)
    cfg, env, spec, agent, source = load_run_agent(args.run_dir, args.checkpoint, trusted=args.trust_code)
    if env is not None:
        env.close()
    if not isinstance(spec.obs_shape, tuple):
        raise ValueError(f"{args.run_dir}: dict observations ({sorted(spec.obs_shape)}): export takes flat "
                         "observations (and an image Q-network's frames)")
    policy = deterministic_policy(agent)
    path = write_policy(policy, args.out, args.format, spec.obs_shape)
    shown = policy_input(policy, spec.obs_shape[0])
    print(f"wrote {path} ({args.format}): the deterministic policy of {args.run_dir} ({source}), obs {shown} -> action")
    return 0


# -- relive plot ---------------------------------------------------------------------------------------------
def read_curve(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, values) of ``metric`` in a run: eval.csv's column, else metrics.jsonl's key (rows without it and
    non-finite values skipped)."""
    run_dir = Path(run_dir)
    steps, values = [], []
    eval_csv = run_dir / "eval.csv"
    if eval_csv.is_file():
        with open(eval_csv, newline="") as f:
            reader = csv.DictReader(f)
            if metric in (reader.fieldnames or []):
                for row in reader:
                    steps.append(float(row["env_step"]))
                    values.append(_number(row[metric]))
    if not steps and (run_dir / "metrics.jsonl").is_file():
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # (a line cut by a kill)
            if isinstance(row, dict) and metric in row and row.get("phase") != "offline":
                steps.append(float(row.get("env_step", math.nan)))
                values.append(_number(row[metric]))
    x, y = np.asarray(steps), np.asarray(values)
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.any():
        raise ValueError(f"{run_dir}: no values of {metric!r} in eval.csv or metrics.jsonl")
    return x[keep], y[keep]


def _number(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def group_label(cfg: ExperimentConfig) -> str:
    """What a curve is named by: the run's configuration without its seed and directory."""
    return f"{cfg.preset} ({cfg.replay.label}) on {cfg.env.id}"


def bootstrap_band(values: np.ndarray, rng: np.random.Generator, resamples: int = 2000,
                   level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap band of the mean over runs (rows) at every step (columns)."""
    n = values.shape[0]
    idx = rng.integers(0, n, size=(resamples, n))
    means = values[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return lo, hi


def curve_label(label: str, curves: list[tuple[np.ndarray, np.ndarray]], last_common_step: int) -> str:
    """A curve's legend: its configuration, its runs and, when they end at other steps, where it is cut."""
    ends = sorted({int(x[-1]) for x, _ in curves if len(x)})
    cut = f", cut to step {last_common_step:,} (runs end at {ends[0]:,}-{ends[-1]:,})" if len(ends) > 1 else ""
    return f"{label}, {len(curves)} run{'s' if len(curves) > 1 else ''}{cut}"


def plot_runs(run_dirs, metric: str, out: Path) -> dict[str, int]:
    """One curve per configuration: the mean over its runs on the env steps every run of it logged, with a 95%
    bootstrap band over runs (two or more). Returns the runs per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    seeds: dict[tuple[str, int], Path] = {}
    for d in run_dirs:
        cfg = run_config(d)
        label = group_label(cfg)
        twin = seeds.setdefault((label, cfg.run.seed), Path(d))
        if twin != Path(d):  # a seed twice would count as two seeds in the mean and the band
            raise ValueError(f"{twin} and {d} are both {label}, seed {cfg.run.seed}: a curve averages over seeds, "
                             "so give each seed's run once")
        groups.setdefault(label, []).append(read_curve(d, metric))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rng = np.random.default_rng(0)
    for label, curves in sorted(groups.items()):
        common = sorted(set.intersection(*(set(x.tolist()) for x, _ in curves)))
        if not common:
            raise ValueError(f"{label}: its runs logged {metric!r} at no common env step")
        grid = np.asarray(common)
        at = [dict(zip(x.tolist(), y.tolist(), strict=True)) for x, y in curves]  # step -> value (the last wins)
        values = np.asarray([[run[s] for s in common] for run in at])
        mean = values.mean(axis=0)
        (line,) = ax.plot(grid, mean, label=curve_label(label, curves, int(grid[-1])))
        if len(curves) > 1:
            lo, hi = bootstrap_band(values, rng)
            ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:  # (a symbolic link at out: replaced, not written through)
        replace_file(out, lambda tmp: fig.savefig(tmp, dpi=120, format=out.suffix[1:] or "png"))
    finally:
        plt.close(fig)
    return {label: len(curves) for label, curves in groups.items()}


def _plot(args: argparse.Namespace) -> int:
    refuse_existing_output(args.out, args.overwrite)
    counts = plot_runs(args.run_dirs, args.metric, args.out)
    print(f"wrote {args.out}: " + "; ".join(f"{k}: {v} run{'s' if v > 1 else ''}" for k, v in counts.items()))
    return 0
