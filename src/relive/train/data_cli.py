"""`relive data make TASK LEVEL`, `relive data list`, `relive data info ID`,
`relive data export-lerobot SOURCE --out DIR`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from relive.agents.run_dir import CONFIG_FILE, open_run_dir
from relive.cli import positive_int, refuse_overwrite, write_generated
from relive.data.lerobot_io import buffer_rows, write_lerobot
from relive.data.loaders import load_rows
from relive.data.minari_io import default_root, list_local
from relive.data.rows import split_episodes
from relive.data.scores import d4rl_reference, normalized_score
from relive.replay.buffer import HOST, ReplayBuffer
from relive.train.checkpoint import has_checkpoint, load_checkpoint
from relive.train.generate import BUDGETS, LEVELS, TASKS, make_dataset


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("data", help="generate, list and inspect offline datasets (Minari format)",
                              description="D4RL-style offline datasets made locally, stored as Minari datasets.")
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    mk = sub.add_parser("make", help="generate a dataset level for a task",
                        description="Levels: random (uniform actions), medium (SAC stopped early), medium-replay "
                                    "(that run's replay data), expert (SAC trained longer), medium-expert (union). "
                                    "One SAC run per task gives the medium and expert policies. Budgets: "
                                    + ", ".join(f"{t}: {b.steps:,} rows, {b.expert_train_steps:,} training steps"
                                                for t, b in BUDGETS.items()))
    mk.add_argument("task", help=f"one of {sorted(TASKS)} (case-insensitive)")
    mk.add_argument("level", choices=LEVELS)
    mk.add_argument("--steps", type=positive_int, help="rows to collect (default: the task's budget)")
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--noise", type=float, help="noisy-scripted: action-noise std (default 0.5; actions in [-1, 1])")
    mk.add_argument("--expert-train-steps", type=positive_int, help="online SAC steps of the training run")
    mk.add_argument("--overwrite", action="store_true", help="replace an existing dataset of this task and level "
                    "(the old one is kept until the new one is complete)")
    mk.add_argument("--root", help="Minari datasets root (default: $MINARI_DATASETS_PATH or data/minari)")
    mk.add_argument("--out", default="data", help="where trained policies are kept (default data/)")
    mk.add_argument("--no-progress", action="store_true")
    mk.set_defaults(func=_make)
    ls = sub.add_parser("list", help="list local datasets")
    ls.add_argument("--root")
    ls.set_defaults(func=_list)
    rep = sub.add_parser("report", help="a Markdown table of every local dataset (default reports/datasets.md)")
    rep.add_argument("--root")
    # outside docs/: a tracked doc is rewritten only when asked (--out docs/datasets.md --overwrite)
    rep.add_argument("--out", default="reports/datasets.md", help="the Markdown file (default reports/datasets.md)")
    rep.add_argument("--overwrite", action="store_true", help="replace an existing --out file (notes below its "
                     "marker line are kept)")
    rep.set_defaults(func=_report)
    info = sub.add_parser("info", help="size, returns and reference scores of a dataset")
    info.add_argument("dataset", help="a dataset id (see `relive data list`), a Minari or LeRobot dataset directory, a "
                      "D4RL-style .hdf5 or a .npz (any format --dataset accepts)")
    info.add_argument("--root")
    info.set_defaults(func=_info)
    ex = sub.add_parser("export-lerobot", help="write a run's online experience (or any dataset) as a LeRobot dataset",
                        description="Writes a LeRobot v3.0 dataset directory (meta/info.json, data/ parquet, "
                                    "episodes, tasks and stats metadata; needs pyarrow) from a run directory "
                                    "(its buffer_final/, else its last checkpoint's buffer), a saved replay buffer, "
                                    "or any dataset --dataset reads. Written beside DIR, then renamed into place.")
    ex.add_argument("source", help="a run directory, a replay buffer directory, or a dataset (.npz, .hdf5, Minari, "
                    "LeRobot)")
    ex.add_argument("--out", required=True, help="the LeRobot dataset directory to create")
    ex.add_argument("--rows", choices=("online", "offline", "all"), default="online",
                    help="which rows of a buffer (default online; a dataset source is written whole)")
    ex.add_argument("--fps", type=positive_int, default=30, help="frames per second recorded in info.json "
                    "(timestamps = frame_index / fps; default 30)")
    ex.add_argument("--task", default="relive", help="the task string of every episode (default 'relive')")
    ex.add_argument("--images", choices=("png", "video"), default="png",
                    help="camera keys of dict observations as PNG image features (default) or lossless mp4 video "
                         "features (needs PyAV: pip install av)")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    ex.set_defaults(func=_export_lerobot)


def _make(args: argparse.Namespace) -> int:
    did, summary = make_dataset(args.task, args.level, steps=args.steps, seed=args.seed, root=args.root,
                                out=args.out, expert_train_steps=args.expert_train_steps,
                                progress=not args.no_progress, overwrite=args.overwrite, noise=args.noise)
    print(f"wrote {did}: {summary['rows']:,} rows, {summary['episodes']} episodes, "
          f"return {summary['return_mean']:.1f} ± {summary['return_std']:.1f}")
    return 0


def _list(args: argparse.Namespace) -> int:
    found = list_local(args.root)
    print("\n".join(found) if found else f"no datasets under {args.root or default_root()}")
    return 0


def describe(dataset: str, root=None) -> dict:
    """Size, returns and normalized scores (relive's references and D4RL's where published) of a dataset: any format
    ``--dataset`` accepts (a Minari id or directory, a D4RL-style ``.hdf5``, a LeRobot directory, a ``.npz``)."""
    rows, meta = load_rows(dataset, root=root)  # (the one dispatch over the formats: relive.data.loaders)
    meta = {k: v for k, v in meta.items() if v is None or isinstance(v, str | int | float | bool | dict | list)}
    meta.setdefault("path", str(dataset))
    returns = np.array([rows["reward"][sl].sum() for sl in split_episodes(rows)])
    where = Path(meta["path"]) if meta.get("path") else None
    files = (where.rglob("*") if where.is_dir() else [where]) if where is not None else ()
    out = {k: v for k, v in meta.items() if k != "relive"} | {
        "rows": int(len(rows["obs"])), "episodes": int(returns.size),
        "megabytes": sum(f.stat().st_size for f in files if f.is_file()) / 2**20,
        "return_mean": float(returns.mean()), "return_std": float(returns.std()),
        "normalized_score": normalized_score(float(returns.mean()), meta.get("ref_min_return"),
                                             meta.get("ref_max_return"))}
    ref = d4rl_reference(meta.get("env_id") or "")
    if ref:
        out["d4rl_normalized_score"] = normalized_score(float(returns.mean()), *ref)
    if "relive" in meta:
        out["generated"] = meta["relive"]
    return out


NOTES_MARKER = "<!-- notes below are kept by `relive data report` -->"


def _report(args: argparse.Namespace) -> int:
    refuse_overwrite(args.out, args.overwrite)  # before reading every dataset

    def fmt(x, d=1):
        return "—" if x is None or x != x else f"{x:.{d}f}"

    lines = ["# Generated datasets", "",
             "Made on the project machine (2 CPU cores) with `relive data make TASK LEVEL` (default budgets and "
             "seed 0 unless noted); regenerate this table with `relive data report --out docs/datasets.md "
             "--overwrite`. Normalized score = 100 x "
             "(R - R_random) / (R_expert - R_random) with relive's references (R_random: uniform-random "
             "episodes; R_expert: the task's expert dataset, or the maze's scripted one; the levels that know "
             "R_expert write both to `relive/TASK/references.json` in the Minari root, and a dataset without "
             "its own R_expert, such as the random level, reads it there, so the references do not depend on "
             "the order the levels were made in) and, for the MuJoCo tasks, D4RL's published "
             "references (measured on the older -v2 environments, so only roughly comparable).", "",
             "| dataset | env | rows | episodes | MB | return (mean ± std) | score (relive refs) | score (D4RL refs) "
             "| R_random / R_expert | how |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    ids = list_local(args.root)
    experts = {}
    for did in ids:
        if did.endswith("/expert-v0"):
            experts[did.rsplit("/", 1)[0]] = describe(did, args.root)["return_mean"]
    for did in ids:
        d = describe(did, args.root)
        g = d.get("generated", {})
        # (the expert's return: for datasets made before references.json, which describe reads, existed)
        ref_max = d["ref_max_return"] if d["ref_max_return"] is not None else experts.get(did.rsplit("/", 1)[0])
        score = normalized_score(d["return_mean"], d["ref_min_return"], ref_max)
        if "train_steps" in g:
            how = f"SAC run of {g['train_steps']:,} steps; medium = snapshot at {g['medium_snapshot_step']:,}"
        else:
            how = "waypoint controller" if g.get("level") == "scripted" else "uniform actions"
        lines.append(f"| `{did}` | {d['env_id']} | {d['rows']:,} | {d['episodes']:,} | {d['megabytes']:.1f} | "
                     f"{d['return_mean']:.1f} ± {d['return_std']:.1f} | {fmt(score)} | "
                     f"{fmt(d.get('d4rl_normalized_score'))} | {fmt(d['ref_min_return'])} / {fmt(ref_max)} | {how} |")
    if not ids:
        lines.append(f"| (no datasets under {args.root or default_root()}) | | | | | | | | | |")
    write_generated(args.out, "\n".join(lines), NOTES_MARKER, args.overwrite)  # notes below the marker are kept
    print(f"wrote {args.out} ({len(ids)} datasets)")
    return 0


def _info(args: argparse.Namespace) -> int:
    print(json.dumps(describe(args.dataset, args.root), indent=1, allow_nan=True))
    return 0



def load_experience(source: str | Path, rows: str = "online") -> tuple[dict, dict]:
    """Rows and metadata from a run directory (its ``buffer_final/``, else its last checkpoint's buffer), a saved
    replay buffer directory (``ReplayBuffer.save``), or any dataset ``load_rows`` reads (all its rows)."""
    p = Path(source)
    meta: dict = {"source": str(p)}
    run = open_run_dir(p) if (p / CONFIG_FILE).is_file() else None  # (read as every command reads a run)
    if run is not None and run.config.env.id:
        meta["env_id"] = run.config.env.id
    if (p / "buffer_final").is_dir():
        return buffer_rows(ReplayBuffer.load(p / "buffer_final", device=HOST), rows), meta
    if has_checkpoint(p):
        from relive.train.trainer import run_offline_rows  # (gymnasium, optional: only for a run checkpoint)

        state = load_checkpoint(p)["buffer"]
        offline = run_offline_rows(run.config, state, p) if run is not None else None
        return buffer_rows(ReplayBuffer.from_state_dict(state, offline_rows=offline, device=HOST), rows), meta
    if (p / "MANIFEST.json").is_file():
        return buffer_rows(ReplayBuffer.load(p, device=HOST), rows), meta
    data, dmeta = load_rows(p)
    return data, meta | {k: dmeta.get(k) for k in ("env_id", "ref_min_return", "ref_max_return") if dmeta.get(k)}


def _export_lerobot(args: argparse.Namespace) -> int:
    rows, meta = load_experience(args.source, args.rows)
    env_id = meta.get("env_id")
    out = write_lerobot(args.out, rows, fps=args.fps, task=args.task, robot_type=env_id, env_id=env_id,
                        extra_metadata={"source": meta["source"], "rows": args.rows,
                                        **{k: meta[k] for k in ("ref_min_return", "ref_max_return") if k in meta}},
                        overwrite=args.overwrite, images=args.images)
    print(f"wrote {out}: {len(rows['reward']):,} frames, {len(split_episodes(rows))} episodes (LeRobot v3.0)")
    return 0

