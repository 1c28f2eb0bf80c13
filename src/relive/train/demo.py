"""`relive demo`: a short, real offline-to-online experiment with a plot (about 5 minutes on 2 cores).

1. Generate a Pendulum-v1 dataset with a uniform-random policy (20k steps, 100 episodes): "random" data.
2. For each replay strategy -- uniform over the union of offline and online rows, symmetric 50/50 (RLPD),
   ARB (on-policyness weights over the union, trajectory level) -- pre-train Cal-QL offline, then fine-tune
   online.
3. Plot evaluation return and the online share of sampled batches against online env steps.
"""

from __future__ import annotations

import time
from pathlib import Path

from relive.config import override
from relive.presets import get_preset
from relive.train.collector import collect_dataset, save_dataset
from relive.train.trainer import train

VARIANTS = {"uniform over offline + online": "uniform", "symmetric 50/50 (RLPD)": "symmetric",
            "ARB (lambda 5, trajectory level)": "arb"}


def demo(out: str | Path = "runs/demo", seed: int = 0, quick: bool = False) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    steps = dict(dataset=1000, offline=100, online=400, eval_every=200, hidden=32) if quick else \
        dict(dataset=20_000, offline=2000, online=6000, eval_every=1000, hidden=128)
    t0 = time.perf_counter()
    print(f"[demo] 1/3 collecting a random-policy Pendulum-v1 dataset ({steps['dataset']:,} steps) ...", flush=True)
    rows = collect_dataset("Pendulum-v1", steps["dataset"], seed=seed)
    random_return = float(rows["reward"].sum() / max(1, (rows["terminated"] | rows["truncated"]).sum()))
    # normalized score: 0 = this dataset's random policy, 100 = -150, a typical converged SAC return on Pendulum-v1
    data_path = save_dataset(out / "pendulum-random.npz", rows, ref_min_return=random_return, ref_max_return=-150.0)
    runs = {}
    for i, (label, replay) in enumerate(VARIANTS.items(), 1):
        run_dir = out / f"calql-{replay}-seed{seed}"
        print(f"[demo] 2/3 run {i}/{len(VARIANTS)}: Cal-QL, {label}: {steps['offline']:,} offline gradient steps, "
              f"then {steps['online']:,} online env steps -> {run_dir}", flush=True)
        if (run_dir / "summary.json").exists():
            print("[demo]     already finished, reusing it", flush=True)
        else:
            if run_dir.exists():
                import shutil

                shutil.rmtree(run_dir)
            cfg = override(get_preset("calql"), [
                "env.id=\"Pendulum-v1\"", f"data.dataset=\"{data_path}\"", f"replay.name=\"{replay}\"",
                f"run.seed={seed}", f"run.run_dir=\"{run_dir}\"", f"run.eval_every_env_steps={steps['eval_every']}",
                "run.eval_episodes=5", "run.log_every_env_steps=500", f"run.checkpoint_every_env_steps={10**9}",
                f"schedule.num_offline_grad_steps={steps['offline']}",
                f"schedule.num_online_env_steps={steps['online']}", "schedule.batch_size=128",
                f"agent.hidden=[{steps['hidden']},{steps['hidden']}]", "agent.cql_n_actions=4", "agent.cql_alpha=1.0",
            ] + ([f"replay.arb.refresh_every_grad_steps={1000 if not quick else 100}"] if replay == "arb" else []))
            summary = train(cfg)
            print(f"[demo]     return after offline phase {summary.offline_return:.0f}, "
                  f"after fine-tuning {summary.final_return:.0f} ({summary.seconds:.0f} s)", flush=True)
        runs[label] = run_dir
    print("[demo] 3/3 plotting ...", flush=True)
    png = plot_runs(runs, out / "demo.png")
    print(f"[demo] done in {time.perf_counter() - t0:.0f} s. Plot: {png}", flush=True)
    return png


def plot_runs(runs: dict[str, Path], path: Path) -> Path:
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
