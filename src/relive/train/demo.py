"""`relive demo`: a short, real offline-to-online experiment with a plot (one process per replay strategy).

1. Generate a Pendulum-v1 dataset with a uniform-random policy (20k steps, 100 episodes): "random" data.
2. For each replay strategy -- uniform over the union of offline and online rows, symmetric 50/50 (RLPD),
   ARB (on-policyness weights over the union, trajectory level) -- pre-train Cal-QL offline, then fine-tune
   online. The three runs go in parallel, one process each (each with one torch thread), so a 2-core machine
   is kept busy; the parent prints one line per evaluation of each run (no interleaved progress bars).
3. Plot evaluation return and the online share of sampled batches against online env steps.
"""

from __future__ import annotations

import csv
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from relive.config import override
from relive.data.npz_io import save_dataset
from relive.presets import get_preset
from relive.train.collector import collect_dataset
from relive.train.trainer import train

VARIANTS = {"uniform over offline + online": "uniform", "symmetric 50/50 (RLPD)": "symmetric",
            "ARB (lambda 5, trajectory level)": "arb"}
# full: the three curves have settled by ~3,000 online steps (6,000-step runs stayed flat after that, issue 15)
BUDGETS = {"full": dict(dataset=20_000, offline=1500, online=3000, eval_every=500, hidden=128),
           "quick": dict(dataset=1000, offline=100, online=400, eval_every=200, hidden=32)}


def _run_config(replay: str, data_path: Path, run_dir: Path, seed: int, b: dict, quick: bool):
    return override(get_preset("calql"), [
        "env.id=\"Pendulum-v1\"", f"data.dataset=\"{data_path}\"", f"replay.name=\"{replay}\"",
        f"run.seed={seed}", f"run.run_dir=\"{run_dir}\"", f"run.eval_every_env_steps={b['eval_every']}",
        "run.eval_episodes=5", "run.log_every_env_steps=500", f"run.checkpoint_every_env_steps={10**9}",
        "run.progress=false", "run.num_threads=1",
        f"schedule.num_offline_grad_steps={b['offline']}", f"schedule.num_online_env_steps={b['online']}",
        "schedule.batch_size=128", f"agent.hidden=[{b['hidden']},{b['hidden']}]", "agent.cql_n_actions=4",
        "agent.cql_alpha=1.0",
    ] + ([f"replay.arb.refresh_every_grad_steps={1000 if not quick else 100}"] if replay == "arb" else []))


def _train_one(cfg):  # a worker process: one run, nothing printed (the parent reports from eval.csv)
    summary = train(cfg)
    return summary.offline_return, summary.final_return, summary.seconds


def _eval_rows(run_dir: Path) -> list[dict]:
    try:
        with open(run_dir / "eval.csv", newline="") as f:
            return [r for r in csv.DictReader(f) if r.get("eval/return_mean")]
    except FileNotFoundError:
        return []


def demo(out: str | Path = "runs/demo", seed: int = 0, quick: bool = False, workers: int | None = None) -> Path:
    """Run the demo into ``out`` and return the plot's path. ``workers``: parallel runs (default: one per
    variant, at most the number of CPU cores). Finished runs (``summary.json``) are reused."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    b = BUDGETS["quick" if quick else "full"]
    workers = workers or max(1, min(len(VARIANTS), os.cpu_count() or 1))
    t0 = time.perf_counter()
    print(f"[demo] 1/3 collecting a random-policy Pendulum-v1 dataset ({b['dataset']:,} steps) ...", flush=True)
    rows = collect_dataset("Pendulum-v1", b["dataset"], seed=seed)
    random_return = float(rows["reward"].sum() / max(1, (rows["terminated"] | rows["truncated"]).sum()))
    # normalized score: 0 = this dataset's random policy, 100 = -150, a typical converged SAC return on Pendulum-v1
    data_path = save_dataset(out / "pendulum-random.npz", rows, ref_min_return=random_return, ref_max_return=-150.0)
    runs = {label: out / f"calql-{replay}-seed{seed}" for label, replay in VARIANTS.items()}
    todo = {}
    for label, run_dir in runs.items():
        if (run_dir / "summary.json").exists():
            print(f"[demo] {label}: already finished in {run_dir}, reusing it", flush=True)
            continue
        if run_dir.exists():  # an unfinished demo run of ours: start it again

            shutil.rmtree(run_dir)
        todo[label] = _run_config(VARIANTS[label], data_path, run_dir, seed, b, quick)
    print(f"[demo] 2/3 Cal-QL, {b['offline']:,} offline gradient steps then {b['online']:,} online env steps, "
          f"{len(todo)} run(s) on {min(workers, max(1, len(todo)))} process(es) -> {out}", flush=True)
    if todo:
        # spawn, not fork: a forked child would inherit the parent's torch thread pools
        with ProcessPoolExecutor(min(workers, len(todo)), mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {label: pool.submit(_train_one, cfg) for label, cfg in todo.items()}
            shown = dict.fromkeys(todo, 0)
            while True:
                for label in todo:  # one line per new evaluation of each run, from its eval.csv
                    evals = _eval_rows(runs[label])
                    for r in evals[shown[label]:]:
                        phase = "after offline" if int(float(r["env_step"])) == 0 else \
                            f"online step {int(float(r['env_step'])):,}/{b['online']:,}"
                        print(f"[demo] {time.perf_counter() - t0:5.0f} s  {label:34s} {phase}: "
                              f"return {float(r['eval/return_mean']):.0f}", flush=True)
                    shown[label] = len(evals)
                if all(f.done() for f in futures.values()):
                    break
                time.sleep(1.0)
            for label, f in futures.items():
                off, final, secs = f.result()  # re-raises a worker's error here
                print(f"[demo] {label}: return {off:.0f} after the offline phase, {final:.0f} after fine-tuning "
                      f"({secs:.0f} s)", flush=True)
    print("[demo] 3/3 plotting ...", flush=True)
    png = plot_runs(runs, out / "demo.png")
    print(f"[demo] done in {time.perf_counter() - t0:.0f} s. Plot: {png}", flush=True)
    return png


def plot_runs(runs: dict[str, Path], path: Path) -> Path:
    import matplotlib  # (slow to import: only to plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # (slow to import: only to plot)

    fig, (ax_ret, ax_frac) = plt.subplots(1, 2, figsize=(11, 4))
    for label, run_dir in runs.items():
        with open(run_dir / "eval.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        step = [int(float(r["env_step"])) for r in rows]
        ax_ret.plot(step, [float(r["eval/return_mean"]) for r in rows], marker="o", label=label)
        frac = [(s, float(r["replay/online_fraction"])) for s, r in zip(step, rows, strict=True)
                if r["replay/online_fraction"] not in ("", "nan")]
        ax_frac.plot([s for s, _ in frac], [v for _, v in frac], marker="o", label=label)
    ax_ret.set(title="Pendulum-v1: Cal-QL fine-tuning from random data", xlabel="online env steps",
               ylabel="evaluation return (5 episodes)")
    ax_frac.set(title="online share of sampled batches", xlabel="online env steps", ylabel="fraction",
                ylim=(-0.02, 1.02))
    for ax in (ax_ret, ax_frac):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
