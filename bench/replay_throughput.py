"""Replay throughput: relive vs cpprb, TorchRL, Stable-Baselines3 and a raw NumPy gather, in one process.

Hopper-shaped rows (obs 11, action 3), batch 256, 1M rows by default. Every library holds the same data.
Prints a table of operations per second and ratios, writes JSON and a PNG bar chart of the ratios.

    python bench/replay_throughput.py --rows 1000000 --out docs/img

What each sample returns (so that the work compared is equivalent):
- relive: 6 columns (obs, action, reward, next_obs, terminated, truncated) + SampleInfo (indices,
  generation, probability, is_weight, source), NumPy.
- raw NumPy: 5 arrays (obs, action, reward, next_obs, done) gathered with randint + fancy indexing.
- cpprb: dict of 5 NumPy arrays (+ indexes and weights for PER).
- TorchRL: a TensorDict of 5 tensors (LazyTensorStorage); PER adds index and _weight.
- SB3: ReplayBufferSamples of 5 torch tensors (it always converts to torch).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

OBS, ACT, BATCH = 11, 3, 256


def timeit(fn, seconds: float, warmup: int = 20) -> float:
    """Calls per second of ``fn`` measured over about ``seconds`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            fn()
        n += 20
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def make_data(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    return {
        "obs": rng.standard_normal((rows, OBS), dtype=np.float32),
        "action": rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
        "reward": rng.standard_normal(rows, dtype=np.float32),
        "next_obs": rng.standard_normal((rows, OBS), dtype=np.float32),
        "terminated": np.zeros(rows, bool),
        "truncated": t % 1000 == 999,
    }


def chunk(data: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in data.items()}


# -- relive -------------------------------------------------------------------------------------------
def bench_relive(data, rows, seconds, ext_rows):
    from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler

    out = {}
    buf = ReplayBuffer(rows, (OBS,), (ACT,), sampler=UniformSampler(), seed=0)
    buf.extend(data)
    out["uniform sample"] = timeit(lambda: buf.sample(BATCH), seconds)

    per = ReplayBuffer(rows, (OBS,), (ACT,), sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    per.extend(data)
    td = np.random.default_rng(1).random(BATCH)

    def per_step():
        b = per.sample(BATCH)
        per.update(b.info, td_error=td)

    out["PER sample + update"] = timeit(per_step, seconds)

    half = rows // 2
    mix = ReplayBuffer(rows, (OBS,), (ACT,), sampler=MixtureSampler(offline_fraction=0.5), seed=0)
    mix.add_offline(chunk(data, 0, half))
    mix.extend(chunk(data, half, rows))
    out["mixture sample 50/50"] = timeit(lambda: mix.sample(BATCH), seconds)

    ring = ReplayBuffer(rows, (OBS,), (ACT,), seed=0)
    ring.extend(data)  # full: every extend overwrites (the steady state of a long run)
    ext = chunk(data, 0, ext_rows)
    out[f"extend {ext_rows} rows"] = timeit(lambda: ring.extend(ext), seconds)

    per_ring = ReplayBuffer(rows, (OBS,), (ACT,), sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    per_ring.extend(data)
    out[f"extend {ext_rows} rows (PER)"] = timeit(lambda: per_ring.extend(ext), seconds)
    return out


# -- raw numpy ----------------------------------------------------------------------------------------
def bench_numpy(data, rows, seconds):
    rng = np.random.default_rng(0)
    obs, act, rew, nobs = data["obs"], data["action"], data["reward"], data["next_obs"]
    done = data["terminated"] | data["truncated"]

    def sample():
        idx = rng.integers(0, rows, BATCH)
        return obs[idx], act[idx], rew[idx], nobs[idx], done[idx]

    return {"uniform sample": timeit(sample, seconds)}


# -- cpprb --------------------------------------------------------------------------------------------
def bench_cpprb(data, rows, seconds, ext_rows):
    import cpprb

    env_dict = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS},
                "done": {}}
    fill = {"obs": data["obs"], "act": data["action"], "rew": data["reward"], "next_obs": data["next_obs"],
            "done": (data["terminated"] | data["truncated"]).astype(np.float32)}
    out = {}
    rb = cpprb.ReplayBuffer(rows, env_dict)
    rb.add(**fill)
    out["uniform sample"] = timeit(lambda: rb.sample(BATCH), seconds)
    ext = {k: v[:ext_rows] for k, v in fill.items()}
    out[f"extend {ext_rows} rows"] = timeit(lambda: rb.add(**ext), seconds)

    per = cpprb.PrioritizedReplayBuffer(rows, env_dict, alpha=0.6)
    per.add(**fill)
    td = np.random.default_rng(1).random(BATCH)

    def per_step():
        s = per.sample(BATCH, beta=0.4)
        per.update_priorities(s["indexes"], td)

    out["PER sample + update"] = timeit(per_step, seconds)
    out[f"extend {ext_rows} rows (PER)"] = timeit(lambda: per.add(**ext), seconds)

    # the usual way to mix offline and online data today: two buffers, half a batch each, concatenated
    half = rows // 2
    off, on = cpprb.ReplayBuffer(half, env_dict), cpprb.ReplayBuffer(rows - half, env_dict)
    off.add(**{k: v[:half] for k, v in fill.items()})
    on.add(**{k: v[half:] for k, v in fill.items()})

    def mixed():
        a, b = off.sample(BATCH // 2), on.sample(BATCH - BATCH // 2)
        return {k: np.concatenate([a[k], b[k]]) for k in a}

    out["mixture sample 50/50"] = timeit(mixed, seconds)
    return out


# -- TorchRL ------------------------------------------------------------------------------------------
def bench_torchrl(data, rows, seconds, ext_rows):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, OfflineToOnlineReplayBuffer, ReplayBuffer

    def td_of(d, lo, hi):
        return TensorDict({
            "obs": torch.from_numpy(d["obs"][lo:hi]), "action": torch.from_numpy(d["action"][lo:hi]),
            "reward": torch.from_numpy(d["reward"][lo:hi]), "next_obs": torch.from_numpy(d["next_obs"][lo:hi]),
            "done": torch.from_numpy(d["terminated"][lo:hi] | d["truncated"][lo:hi]),
        }, batch_size=[hi - lo])

    out = {}
    rb = ReplayBuffer(storage=LazyTensorStorage(rows), batch_size=BATCH)
    rb.extend(td_of(data, 0, rows))
    out["uniform sample"] = timeit(lambda: rb.sample(), seconds)
    ext = td_of(data, 0, ext_rows)
    out[f"extend {ext_rows} rows"] = timeit(lambda: rb.extend(ext), seconds)

    try:
        from torchrl.data import PrioritizedReplayBuffer

        per = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(rows), batch_size=BATCH)
        per.extend(td_of(data, 0, rows))
        td = torch.rand(BATCH)

        def per_step():
            s = per.sample()
            per.update_priority(s["index"], td)

        out["PER sample + update"] = timeit(per_step, seconds)
    except Exception as e:  # its C++ extension does not load with torch 2.13 (undefined symbol)
        out["PER sample + update"] = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:70]}"

    half = rows // 2
    try:
        offline = ReplayBuffer(storage=LazyTensorStorage(half), batch_size=BATCH)
        offline.extend(td_of(data, 0, half))
        o2o = OfflineToOnlineReplayBuffer(offline, online_capacity=rows - half, offline_fraction=0.5,
                                          batch_size=BATCH)
        o2o.extend(td_of(data, half, rows))
        out["mixture sample 50/50"] = timeit(lambda: o2o.sample(), seconds)
    except Exception as e:
        out["mixture sample 50/50"] = f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:70]}"
    return out


# -- Stable-Baselines3 --------------------------------------------------------------------------------
def bench_sb3(data, rows, seconds, ext_rows):
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    obs_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = spaces.Box(-1, 1, (ACT,), np.float32)
    rb = ReplayBuffer(rows, obs_space, act_space, device="cpu", handle_timeout_termination=False)
    rb.observations[:, 0] = data["obs"]
    rb.next_observations[:, 0] = data["next_obs"]
    rb.actions[:, 0] = data["action"]
    rb.rewards[:, 0] = data["reward"]
    rb.dones[:, 0] = data["terminated"] | data["truncated"]
    rb.full, rb.pos = True, 0
    out = {"uniform sample": timeit(lambda: rb.sample(BATCH), seconds)}
    o, a, r, no = data["obs"][:1], data["action"][:1], data["reward"][:1], data["next_obs"][:1]
    d = np.zeros(1, bool)
    infos = [{}]

    def ext():  # SB3 adds one transition per call with one env
        for _ in range(ext_rows):
            rb.add(o, no, a, r, d, infos)

    out[f"extend {ext_rows} rows"] = timeit(ext, seconds, warmup=2)
    return out


PEERS = ("relive", "numpy", "cpprb", "torchrl", "sb3")
LABELS = {"relive": "relive", "numpy": "raw NumPy", "cpprb": "cpprb", "torchrl": "TorchRL", "sb3": "SB3"}
TARGETS = {  # (operation, peer, minimum ratio relive / peer) from issue 2
    ("PER sample + update", "cpprb"): 2.0,
    ("uniform sample", "numpy"): 0.8,
    ("extend {n} rows", "cpprb"): 1.0,
}


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0], "numpy": np.__version__}
    for name in ("torch", "cpprb", "torchrl", "stable-baselines3", "relive"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows stored in every buffer")
    p.add_argument("--extend-rows", type=int, default=1000, help="rows per batched extend")
    p.add_argument("--seconds", type=float, default=1.5, help="timing window per operation")
    p.add_argument("--threads", type=int, default=1, help="torch threads (TorchRL, SB3)")
    p.add_argument("--peers", default=",".join(PEERS[1:]), help="comma-separated peers to run")
    p.add_argument("--out", default="docs/img", help="directory for the PNG")
    p.add_argument("--json", default="bench/out/replay_throughput.json", help="where to write raw results")
    args = p.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    console = Console()
    console.print(f"[bold]replay throughput[/]: {args.rows:,} rows (obs {OBS}, action {ACT}), batch {BATCH}, "
                  f"{args.seconds:.1f} s per operation, torch threads {args.threads}")
    data = make_data(args.rows)
    results: dict[str, dict] = {}
    runners = {
        "relive": lambda: bench_relive(data, args.rows, args.seconds, args.extend_rows),
        "numpy": lambda: bench_numpy(data, args.rows, args.seconds),
        "cpprb": lambda: bench_cpprb(data, args.rows, args.seconds, args.extend_rows),
        "torchrl": lambda: bench_torchrl(data, args.rows, args.seconds, args.extend_rows),
        "sb3": lambda: bench_sb3(data, args.rows, args.seconds, args.extend_rows),
    }
    for peer in ["relive", *[x for x in args.peers.split(",") if x]]:
        with console.status(f"measuring {LABELS[peer]} ..."):
            t0 = time.perf_counter()
            try:
                results[peer] = runners[peer]()
            except ImportError as e:
                results[peer] = {"_error": f"not installed ({e.name})"}
        console.print(f"  {LABELS[peer]:10s} done in {time.perf_counter() - t0:5.1f} s")

    ops = list(results["relive"])
    peers = [x for x in results if x != "relive"]
    table = Table(title="operations per second (ratio = relive / peer)")
    table.add_column("operation")
    table.add_column("relive", justify="right")
    for peer in peers:
        table.add_column(LABELS[peer], justify="right")
    ratios: dict[str, dict[str, float]] = {}
    for op in ops:
        ours = results["relive"][op]
        cells = [f"{ours:,.0f}"]
        for peer in peers:
            theirs = results[peer].get(op)
            if isinstance(theirs, float):
                ratios.setdefault(op, {})[peer] = ours / theirs
                cells.append(f"{theirs:,.0f} ({ours / theirs:.2f}x)")
            elif isinstance(theirs, str):
                cells.append(theirs)
            else:
                cells.append("—")
        table.add_row(op, *cells)
    console.print(table)

    verdicts = []
    for (op, peer), target in TARGETS.items():
        op = op.format(n=args.extend_rows)
        r = ratios.get(op, {}).get(peer)
        if r is None:
            verdicts.append(f"{op} vs {LABELS[peer]}: not measured")
        else:
            verdicts.append(f"{op} vs {LABELS[peer]}: {r:.2f}x (target >= {target}x) "
                            + ("MET" if r >= target else "MISSED"))
    for v in verdicts:
        console.print(("[green]" if v.endswith("MET") else "[red]") + v)

    record = {"rows": args.rows, "batch": BATCH, "extend_rows": args.extend_rows, "threads": args.threads,
              "cpu": cpu_model(), "versions": versions(), "results": results, "ratios": ratios,
              "targets": verdicts, "command": "python bench/replay_throughput.py " + " ".join(argv or sys.argv[1:])}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=1))
    png = plot(ratios, peers, Path(args.out) / "replay_throughput.png", args.rows)
    console.print(f"raw results: {args.json}\nplot: {png}")
    return 0


def plot(ratios: dict, peers: list[str], path: Path, rows: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(ratios)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        vals = [ratios[op].get(peer, np.nan) for op in ops]
        ax.bar(np.arange(len(ops)) + i * width, vals, width, label=LABELS[peer])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(ops)) + width * (len(peers) - 1) / 2, ops, rotation=15, fontsize=8)
    ax.set_ylabel("relive speed / peer speed")
    ax.set_yscale("log")
    ax.set_title(f"relive replay throughput relative to peers ({rows:,} rows, batch {BATCH}; >1 = relive faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
