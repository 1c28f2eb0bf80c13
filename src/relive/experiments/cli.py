"""`relive bench run GRID` / `relive bench report GRID` / `relive bench list`."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from relive.cli import positive_float, positive_int, refuse_overwrite
from relive.experiments.grid import GRID_DIR, load_grid
from relive.experiments.report import make_report, report_path
from relive.experiments.runner import run_grid


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run experiment grids and report on them",
                              description="Experiment grids: presets x tasks x seeds, resumable.")
    sub = p.add_subparsers(dest="bench_command", required=True, metavar="ACTION")

    run = sub.add_parser("run", help="run every unfinished run of a grid (skips finished ones)")
    run.add_argument("grid", help="a built-in grid name (see `relive bench list`) or a TOML file")
    run.add_argument("--root", default="runs", help="where run directories go (default: runs/)")
    run.add_argument("--workers", type=positive_int, default=None,
                     help="concurrent runs (default: CPU cores / --threads-per-run)")
    run.add_argument("--threads-per-run", type=positive_int, default=1, help="torch threads per run (default 1)")
    run.add_argument("--timeout", type=positive_float, default=None, help="seconds before a run is killed and "
                     "recorded as crashed (default: none)")
    run.add_argument("--seeds", type=positive_int, default=None, help="only the first N seeds of the grid")
    run.add_argument("--seed-batch", type=positive_int, default=1, metavar="S",
                     help="train up to S new seeds of one variant and task in one process, their networks batched "
                          "(DDQN grids; default 1: one process per run)")
    run.add_argument("--tasks", nargs="+", default=None, metavar="TASK", help="only these tasks of the grid")
    run.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                     help="run on a Ray cluster: each run a Ray task with --threads-per-run CPUs (and "
                          "--gpus-per-run GPUs); concurrency is the cluster's (docs/cluster.md)")
    run.add_argument("--storage", choices=("shared", "gather"), default="shared",
                     help="with --ray-address: 'shared' (default): --root is a path every node sees and runs write "
                          "there; 'gather': runs write node-local scratch directories that the head gathers "
                          "under --root")
    run.add_argument("--gpus-per-run", type=positive_float, default=None, help="with --ray-address: GPUs per run "
                     "(e.g. 1, or 0.5 for two runs per GPU; default none)")
    run.add_argument("--trust-code", action="store_true", help="let every run whose args name a base policy read "
                     "a file that can run code when loaded (TorchScript, torch.export .pt2): `relive train "
                     "--trust-code` for those runs, again when they resume; only for files you trust (a grid file "
                     "cannot say it: docs/guarantees.md)")
    run.add_argument("--report", action="store_true", help="write the report when the runs are done")
    run.add_argument("--out", default="reports", help="report directory (with --report; default reports/)")
    run.add_argument("--overwrite", action="store_true", help="with --report: replace an existing report (notes "
                     "below its marker line are kept)")
    run.set_defaults(func=_run)

    rep = sub.add_parser("report", help="Markdown tables and plots from a grid's run directories")
    rep.add_argument("grid", help="a built-in grid name or a TOML file")
    rep.add_argument("--root", default="runs", help="where the run directories are (default: runs/)")
    # outside docs/: a tracked report is rewritten only when asked (--out docs/results --overwrite)
    rep.add_argument("--out", default="reports", help="where the Markdown and PNGs go (default reports/)")
    rep.add_argument("--overwrite", action="store_true", help="replace an existing GRID.md and its plots (notes "
                     "below its marker line are kept)")
    rep.add_argument("--reps", type=positive_int, default=2000, help="bootstrap resamples for the CIs")
    rep.set_defaults(func=_report)

    ls = sub.add_parser("list", help="list the built-in grids")
    ls.set_defaults(func=_list)


def _grid(args):
    grid = load_grid(args.grid)
    if getattr(args, "trust_code", False):
        grid = replace(grid, trust_code=True)
    if getattr(args, "seeds", None):
        grid = replace(grid, seeds=grid.seeds[: args.seeds])
    if getattr(args, "tasks", None):
        known = set(grid.tasks) | {t for v in grid.variants for t in v.tasks}
        unknown = sorted(set(args.tasks) - known)
        if unknown:
            raise ValueError(f"--tasks: grid {grid.name!r} has no task(s) {unknown}; its tasks: {sorted(known)}")
        grid = replace(grid, only_tasks=tuple(args.tasks))
    return grid


def _run(args: argparse.Namespace) -> int:
    grid = _grid(args)
    if args.report:  # refused before hours of runs, not after

        refuse_overwrite(report_path(load_grid(args.grid), args.out), args.overwrite)
    if args.ray_address is None:
        for flag, value in (("--gpus-per-run", args.gpus_per_run), ("--storage", args.storage != "shared" or None)):
            if value is not None:
                raise ValueError(f"{flag} goes with --ray-address (a run on a Ray cluster)")
        outcomes = run_grid(grid, args.root, workers=args.workers, threads_per_run=args.threads_per_run,
                            timeout=args.timeout, seed_batch=args.seed_batch)
    else:
        if args.workers is not None:
            raise ValueError("--workers: with --ray-address the cluster's resources set how many runs go at once "
                             "(each asks for --threads-per-run CPUs)")
        from relive.experiments.ray_runner import run_grid_ray  # (imports Ray only when asked)

        outcomes = run_grid_ray(grid, args.root, args.ray_address, storage=args.storage,
                                threads_per_run=args.threads_per_run, gpus_per_run=args.gpus_per_run or 0.0,
                                timeout=args.timeout, seed_batch=args.seed_batch)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("finished", "skipped", "busy", "crashed")}
    print(f"{grid.name}: {counts['finished']} finished now, {counts['skipped']} already done, "
          f"{counts['busy']} left to another process, {counts['crashed']} crashed "
          f"(run directories under {Path(args.root) / grid.name})")
    if args.report:
        _report(argparse.Namespace(grid=args.grid, root=args.root, out=args.out, reps=2000,
                                   overwrite=args.overwrite))
    return 1 if counts["crashed"] else 0


def _report(args: argparse.Namespace) -> int:
    md = make_report(load_grid(args.grid), args.root, args.out, reps=args.reps, overwrite=args.overwrite)
    print(f"report written to {md}")
    return 0


def _list(args: argparse.Namespace) -> int:
    for path in [*sorted(GRID_DIR.glob("*.toml")), *sorted(GRID_DIR.glob("plans/*.toml"))]:
        grid = load_grid(path)  # (plans: the papers' budgets, for a cluster; docs/cluster.md)
        name = str(path.relative_to(GRID_DIR).with_suffix(""))
        first_line = grid.description.strip().splitlines()[0] if grid.description else ""
        print(f"{name:28s} {len(grid.runs()):4d} runs  {first_line}")
    return 0
