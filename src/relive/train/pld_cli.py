"""`relive bc` (behaviour cloning of a base policy from a dataset), `relive pld collect` (the base's successful
episodes as a dataset: ``collect_successes``) and `relive pld distill` (PLD's stage 3). The datasets are read and
written here, above ``agents``: ``relive.agents.bc`` and ``relive.agents.distill`` take and give rows."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

from relive.agents import residual_sac
from relive.agents.bc import (
    BCConfig,
    config_dict,
    evaluate_policy,
    refuse_existing_out,
    save_bc_policy,
    train_bc,
)
from relive.agents.distill import base_successes, distill
from relive.agents.run_dir import CONFIG_FILE, TRUST_FLAG, open_run_dir
from relive.cli import non_negative_int, positive_float, positive_int
from relive.data.loaders import load_rows
from relive.data.npz_io import save_dataset
from relive.data.rows import split_episodes
from relive.data.selection import select_episodes

TRUST_CODE_HELP = ("also read a base policy in a format that can run code when loaded (TorchScript .pt / .pth / .ts / "
                   ".jit, torch.export .pt2): only for files you trust; a run directory's config.json never says "
                   "it (docs/guarantees.md)")


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser(
        "bc", help="behaviour cloning: an MLP base policy from a dataset (few demos allowed)",
        description="Fits a deterministic tanh-squashed MLP to a dataset's actions (MSE), saves it pickle-free in "
                    "OUT/policy (load it with relive.agents.base_policy.load_base_policy or pass OUT as a base "
                    "policy), then evaluates it on the dataset's environment: success rate and return, printed "
                    "and written to OUT/eval.json.")
    p.add_argument("--dataset", required=True, help="a local Minari dataset id or directory, a D4RL .hdf5 or a "
                   "relive .npz")
    p.add_argument("--out", required=True, help="output directory (an existing one only with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--episodes", type=positive_int, help="use only the first N episodes (after --successful-only)")
    p.add_argument("--skip-episodes", type=non_negative_int, default=0, help="skip this many (successful) "
                   "episodes first: another set of few demos")
    p.add_argument("--successful-only", action="store_true", help="use only successful episodes (goal tasks: "
                   "ended by termination; with --success-return: return >= it)")
    p.add_argument("--success-return", type=float, help="success = episode return >= this (MuJoCo tasks), for "
                   "the episode filter and the evaluation")
    p.add_argument("--steps", type=positive_int, default=5000, help="gradient steps (default 5000)")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--lr", type=positive_float, default=1e-3)
    p.add_argument("--hidden", default="256,256", help="hidden widths, comma-separated (default 256,256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialization and minibatches (default 0)")
    p.add_argument("--env", help="environment for the evaluation (default: the dataset's)")
    p.add_argument("--eval-episodes", type=non_negative_int, default=50,
                   help="evaluation episodes (0: none; default 50)")
    p.add_argument("--eval-seed", type=int, default=10_000, help="first reset seed of the evaluation")
    p.add_argument("--root", help="Minari datasets root")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_bc)

    pld = subparsers.add_parser("pld", help="PLD (probe, learn, distill) tools on a frozen base policy")
    sub = pld.add_subparsers(dest="pld_command", required=True, metavar="ACTION")
    d = sub.add_parser("distill", help="distill a residual run's successes into a new base policy",
                       description="Rolls out hybrid episodes (the base alone for t < T_base, T_base ~ U{0..H}, then "
                                   "base + residual), keeps the successful ones and fine-tunes the base policy by "
                                   "behaviour cloning on their executed actions; OUT is a new base policy directory. "
                                   "Repeat with --base OUT for the data flywheel.")
    d.add_argument("--run", required=True, help="a residual SAC run directory (read by "
                   "relive.agents.residual_sac.load_residual)")
    d.add_argument("--episodes", type=positive_int, required=True, help="hybrid episodes to roll out")
    d.add_argument("--out", required=True, help="directory of the new base policy (an existing one only with "
                   "--overwrite)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    d.add_argument("--base", help="the base policy to fine-tune (a `relive bc` directory; default: the run's); one "
                   "whose weights differ from the base the run trained on only with --allow-other-base")
    d.add_argument("--allow-other-base", action="store_true", help="distill on a base policy whose digest differs "
                   "from the one the residual was trained on (the run's agent_final records it)")
    d.add_argument("--env", help="environment (default: the run's env.id)")
    d.add_argument("--success-return", type=float, help="success = episode return >= this (tasks without "
                   "info['success'])")
    d.add_argument("--horizon", type=non_negative_int, help="H of T_base ~ U{0..H} (default: the episodes' time "
                   "limit: the run's env.max_episode_steps, else the env's)")
    d.add_argument("--steps", type=positive_int, default=2000, help="BC fine-tuning gradient steps (default 2000)")
    d.add_argument("--lr", type=positive_float, default=3e-4)
    d.add_argument("--batch-size", type=positive_int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--eval-episodes", type=non_negative_int, default=50,
                   help="evaluate the old and the new base (0: none)")
    d.add_argument("--threads", type=positive_int, default=1)
    d.add_argument(TRUST_FLAG, action="store_true", help=TRUST_CODE_HELP)
    d.set_defaults(func=run_distill)

    c = sub.add_parser("collect", help="roll out the base alone and save its successful episodes (D_offline)",
                       description="PLD's offline data: the frozen base policy's successful episodes, saved as a "
                                   "relive .npz dataset for `relive train residual_sac --dataset OUT` (Cal-QL critic "
                                   "pre-training and the offline half of symmetric replay).")
    c.add_argument("--base", required=True, help="the frozen base policy (any path load_base_policy reads)")
    c.add_argument("--env", required=True, help="environment id, e.g. PointMaze_UMaze-v3")
    c.add_argument("--episodes", type=positive_int, required=True, help="base episodes to roll out")
    c.add_argument("--out", required=True, help="the dataset file to write (.npz; never overwritten)")
    c.add_argument("--success-return", type=float, help="success = episode return >= this (tasks without "
                   "info['success'])")
    add_success_key_flags(c)
    c.add_argument("--seed", type=int, default=0, help="first reset seed (default 0)")
    c.add_argument(TRUST_FLAG, action="store_true", help=TRUST_CODE_HELP)
    c.set_defaults(func=run_collect)


def add_success_key_flags(p: argparse.ArgumentParser) -> None:
    """--success-key / --success-at: success from the task's own info flag, as a training run's env.success_key /
    env.success_at."""
    p.add_argument("--success-key", help="success = the task's own info[KEY] (e.g. is_success for Fetch; a "
                   "training run's env.success_key)")
    p.add_argument("--success-at", choices=("any", "last"), default="any", help="with --success-key: true at some "
                   "step of the episode (any, default) or at its last step (last: Fetch)")


def collect_successes(base_path: str | Path, env_id: str, num_episodes: int, out: str | Path, *, seed: int = 0,
                      success_return: float | None = None, max_episode_steps: int | None = None,
                      trusted: bool = False, success_key: str | None = None, success_at: str = "any") -> dict:
    """PLD's D_offline (spec Sec. 8; paper stage 1 step 1) as a file: the frozen base's successful episodes
    (``relive.agents.distill.base_successes``, which takes the same settings) saved as a relive ``.npz`` dataset at
    ``out`` (``--dataset`` of a residual run; returns-to-go are computed when it is loaded). Returns the success
    rate and the number of rows kept; refuses to overwrite ``out`` (before any rollout) and to write an empty set.
    ``trusted``: the base may be a format that can run code (TorchScript, torch.export; ``load_base_policy``)."""
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} exists; pick another --out (datasets are never overwritten)")
    rows, stats = base_successes(base_path, env_id, num_episodes, seed=seed, success_return=success_return,
                                 max_episode_steps=max_episode_steps, trusted=trusted, success_key=success_key,
                                 success_at=success_at)
    save_dataset(out, rows, env_id=env_id, base_policy=str(base_path), success_rate=stats["success_rate"])
    return {**stats, "out": str(out)}


def run_collect(args: argparse.Namespace) -> int:
    if not args.out.endswith(".npz"):
        raise ValueError(f"--out must be a .npz file, got {args.out!r}")
    stats = collect_successes(args.base, args.env, args.episodes, args.out, seed=args.seed,
                              success_return=args.success_return, trusted=args.trust_code,
                              success_key=args.success_key, success_at=args.success_at)
    print(f"base success rate {stats['success_rate']:.2f} ({stats['successes']}/{stats['episodes']} episodes); "
          f"{stats['rows']} rows of successful episodes -> {stats['out']}")
    return 0


def _progress(enabled: bool, total: int, label: str):
    """(callback(i), context manager) of a rich progress bar, or no-ops."""
    if not enabled or total <= 0:
        return None, contextlib.nullcontext()
    # (only when a progress bar is shown)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    task = bar.add_task(label, total=total)

    def advance(i: int) -> None:
        if (i + 1) % 50 == 0 or i + 1 == total:
            bar.update(task, completed=i + 1)

    return advance, bar


def run_bc(args: argparse.Namespace) -> int:
    from relive.envs import env_spec, make_env  # (gymnasium, optional: imported only where an env is made)

    torch.set_num_threads(args.threads)
    refuse_existing_out(args.out, args.overwrite)  # before any work
    try:
        hidden = tuple(int(h) for h in args.hidden.split(","))
    except ValueError:
        raise ValueError(f"--hidden must be comma-separated integers, got {args.hidden!r}") from None
    config = BCConfig(hidden=hidden, lr=args.lr, batch_size=args.batch_size, num_steps=args.steps)
    rows, meta = load_rows(args.dataset, root=args.root)
    env_id = args.env or meta.get("env_id") or None
    n_all = len(rows["obs"])
    rows = select_episodes(rows, args.episodes, args.successful_only, args.success_return, args.skip_episodes)

    n_episodes = len(split_episodes(rows))
    if env_id:
        spec = env_spec(make_env(env_id))
        low, high = spec.action_low, spec.action_high
    else:  # no env: the box spanned by the data
        act = np.asarray(rows["action"], np.float32)
        low, high = act.min(0) - 1e-3, act.max(0) + 1e-3
    print(f"BC on {args.dataset}: {len(rows['obs']):,} of {n_all:,} rows, {n_episodes} episodes, "
          f"{args.steps} steps, seed {args.seed}")
    advance, bar = _progress(not args.no_progress, args.steps, "behaviour cloning")
    with bar:
        policy, losses = train_bc(rows, low, high, config, seed=args.seed, progress=advance)
    tail = float(losses[-min(100, len(losses)):].mean()) if len(losses) else float("nan")
    info = {"dataset": str(args.dataset), "env_id": env_id, "episodes": n_episodes, "rows": int(len(rows["obs"])),
            "skip_episodes": args.skip_episodes,
            "successful_only": args.successful_only, "success_return": args.success_return, "seed": args.seed,
            "config": config_dict(config), "loss_first": float(losses[0]) if len(losses) else None,
            "loss_last100": tail}
    out = save_bc_policy(args.out, policy, info, overwrite=args.overwrite)
    print(f"loss {info['loss_first']:.4f} -> {tail:.4f} (mean of the last 100 steps); policy in {out / 'policy'}")
    if args.eval_episodes > 0:
        if not env_id:
            raise ValueError(f"dataset {args.dataset} names no environment; pass --env (or --eval-episodes 0)")

        def act(obs):
            with torch.no_grad():
                return policy(torch.as_tensor(obs, dtype=torch.float32)).numpy()

        ev = evaluate_policy(act, env_id, args.eval_episodes, args.eval_seed, args.success_return)
        (out / "eval.json").write_text(json.dumps(ev, indent=1))
        sr = "n/a (no success signal)" if ev["success_rate"] is None else f"{ev['success_rate']:.2f}"
        print(f"evaluation on {env_id} ({args.eval_episodes} episodes): success rate {sr}, return "
              f"{ev['return_mean']:.2f} ± {ev['return_std']:.2f}; written to {out / 'eval.json'}")
    return 0


def _run_settings(run_dir: Path) -> dict:
    """env.id, env.max_episode_steps and the base policy path of a run, read as every command reads a run directory
    (``open_run_dir``: its trust setting is never taken; ``--trust-code`` here is this command's)."""
    if not (run_dir / CONFIG_FILE).is_file():  # (a load_residual of a plug-in may read another layout)
        return {}
    run = open_run_dir(run_dir)
    for note in run.notes:
        print(f"relive: note: {note}", file=sys.stderr)
    cfg = run.config
    return {"env_id": cfg.env.id or None, "max_episode_steps": cfg.env.max_episode_steps,
            "base_policy": getattr(cfg.agent, "base_policy", "") or None}


def run_distill(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    refuse_existing_out(args.out, args.overwrite)  # before any work
    run_dir = Path(args.run)
    residual = residual_sac.load_residual(run_dir)
    settings = _run_settings(run_dir)
    env_id = args.env or settings.get("env_id")
    base = args.base or settings.get("base_policy")
    if not env_id or not base:
        raise ValueError(f"{run_dir}: cannot tell the {'environment' if not env_id else 'base policy'} from its "
                         "config.json; pass --env and --base")
    # the run's time limit, unless another env is named (its episodes are as long as the residual trained on)
    max_steps = settings.get("max_episode_steps") if not args.env or args.env == settings.get("env_id") else None
    stats = distill(base, residual, env_id, args.episodes, args.out, success_return=args.success_return,
                    horizon=args.horizon, num_steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                    seed=args.seed, eval_episodes=args.eval_episodes, max_episode_steps=max_steps,
                    allow_other_base=args.allow_other_base, overwrite=args.overwrite,
                    trusted=args.trust_code)
    def brief(d):  # per-episode lists stay in OUT/distill.json
        return {k: brief(v) if isinstance(v, dict) else v for k, v in d.items() if not isinstance(v, list)}

    print(json.dumps(brief(stats), indent=1))
    return 0
