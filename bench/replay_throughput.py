"""Replay throughput: relive vs cpprb, TorchRL, Stable-Baselines3 and a raw NumPy gather, in one process.

Hopper-shaped rows (obs 11, action 3), batch 256, 1M rows by default; every library holds the same data.
Operations: uniform sample, PER sample + priority update, 50/50 offline/online mixture sample, batched extend
of 1000 rows (plain and with PER) into a full ring (the steady state of a long run: every extend evicts).

Timing is interleaved: each of ``--repeats`` rounds times every (operation, library) pair for ``--seconds``
(after a warm-up), so relive and each peer are measured minutes apart at most, never in separate phases; the
table shows the median rate over rounds and the median of the per-round ratios relive / peer (> 1 = relive
faster). Threads: ``torch.set_num_threads(--threads)`` (default 1) for TorchRL and SB3; the NumPy-based
libraries (relive, cpprb, raw NumPy) use one thread for these operations anyway.

    python bench/replay_throughput.py --rows 1000000 --out docs/img      # make bench
    python bench/replay_throughput.py --peers binary,numpy,cpprb          # the 8-ary tree against the binary one

What one sample returns (checked at start-up, printed under the table):
- relive: Batch of 6 columns (obs, action, reward, next_obs, terminated, truncated) + SampleInfo (indices,
  generation, probability, is_weight, source), NumPy.
- raw NumPy: 5 arrays (obs, action, reward, next_obs, done) gathered with randint + fancy indexing.
- cpprb: dict of 5 NumPy arrays (+ indexes and weights for PER).
- TorchRL: a TensorDict of 5 tensors (LazyTensorStorage) (+ index for the mixture).
- SB3: ReplayBufferSamples of 5 torch tensors (it always converts to torch).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

OBS, ACT, BATCH = 11, 3, 256
LABELS = {"relive": "relive", "numpy": "raw NumPy", "cpprb": "cpprb", "torchrl": "TorchRL", "sb3": "SB3",
          "binary": "relive, binary tree"}
TARGETS = {  # (operation, peer): minimum ratio relive / peer, from issue 2 (uniform: raised to 1x by issue 15)
    ("PER sample + update", "cpprb"): 2.0,
    ("uniform sample", "numpy"): 1.0,
    ("extend {n} rows", "cpprb"): 1.0,
}
TORCH_SAMPLE = "uniform sample -> torch tensors"
DEVICE_SAMPLE = "uniform sample, torch storage on CPU"
NOTES = {
    (TORCH_SAMPLE, "relive"): "relive: NumPy storage, sample(256).to_torch() (zero-copy tensors, float32 flags)",
    (DEVICE_SAMPLE, "relive"): "relive: ReplayBuffer(backend='torch', device='cpu'), columns and draws in torch",
    (TORCH_SAMPLE, "torchrl"): "LazyTensorStorage: tensors already (the same figure as its uniform sample)",
    (DEVICE_SAMPLE, "torchrl"): "LazyTensorStorage on CPU tensors (the same figure as its uniform sample)",
    (TORCH_SAMPLE, "sb3"): "SB3's sample converts to torch always (the same figure as its uniform sample)",
    ("mixture sample 50/50", "cpprb"): "two buffers, half a batch from each, concatenated (cpprb has no mixing)",
    ("mixture sample 50/50", "torchrl"): "OfflineToOnlineReplayBuffer (offline ReplayBuffer + online "
                                         "LazyTensorStorage, exact split)",
    ("extend {n} rows", "sb3"): "SB3 adds one transition per call (ReplayBuffer.add, one env): 1000 calls",
    ("PER sample + update", "binary"): "the same relive buffer with the binary sum / max trees used before the "
                                       "8-ary tree (bench/_binary_tree.py): ratio = 8-ary speed / binary speed",
}


def rate(fn: Callable, seconds: float, warmup: int = 10) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    inner = 1
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(inner):
            fn()
        n += inner
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed
        inner = min(inner * 2, 64)


def make_data(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(rows)
    return {
        "obs": rng.standard_normal((rows, OBS), dtype=np.float32),
        "action": rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
        "reward": rng.standard_normal(rows, dtype=np.float32),
        "next_obs": rng.standard_normal((rows, OBS), dtype=np.float32),
        "terminated": np.zeros(rows, bool),
        "truncated": t % 1000 == 999,  # 1000-step episodes
    }


def chunk(data: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in data.items()}


def shapes(x) -> str:
    """Compact description of what a sample call returned: column -> shape."""
    if hasattr(x, "info") and hasattr(x, "obs"):  # relive Batch
        cols = {k: x.columns()[k].shape for k in x.columns()}
        info = {k: getattr(x.info, k).shape for k in ("indices", "generation", "probability", "is_weight", "source")}
        return _fmt(cols) + " + info " + _fmt(info)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # SB3 ReplayBufferSamples
        return _fmt({k: tuple(getattr(x, k).shape) for k in x._fields if getattr(x, k) is not None})
    if isinstance(x, tuple):
        return _fmt({f"[{i}]": a.shape for i, a in enumerate(x)})
    if hasattr(x, "keys"):  # dict or TensorDict
        return _fmt({k: tuple(x[k].shape) for k in x.keys()})
    return type(x).__name__


def _fmt(d: dict) -> str:
    return "{" + ", ".join(f"{k} {'x'.join(map(str, v)) or 'scalar'}" for k, v in d.items()) + "}"


# -- setups: each returns {operation: (callable, sample_fn or None)} ----------------------------------------
def setup_relive(data, rows, ext_rows):
    from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler

    ops = {}
    uni = ReplayBuffer(rows, (OBS,), (ACT,), sampler=UniformSampler(), seed=0)
    uni.extend(data)
    ops["uniform sample"] = (lambda: uni.sample(BATCH), lambda: uni.sample(BATCH))
    ops[TORCH_SAMPLE] = (lambda: uni.sample(BATCH).to_torch(), lambda: uni.sample(BATCH).to_torch())
    try:  # the device buffer on CPU tensors (backend "torch"): columns and draws in torch
        import torch

        dev = ReplayBuffer(rows, (OBS,), (ACT,), sampler=UniformSampler(), seed=0, backend="torch", device="cpu")
        dev.extend(data)
        ops[DEVICE_SAMPLE] = (lambda: dev.sample(BATCH), lambda: dev.sample(BATCH))
        del torch
    except Exception as e:  # noqa: BLE001 - reported in the table
        ops[DEVICE_SAMPLE] = f"unavailable: {_reason(e)}"

    per = ReplayBuffer(rows, (OBS,), (ACT,), sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    per.extend(data)
    td = np.random.default_rng(1).random(BATCH)

    def per_step():
        b = per.sample(BATCH)
        per.update(b.info, td_error=td)

    ops["PER sample + update"] = (per_step, lambda: per.sample(BATCH))

    half = rows // 2
    mix = ReplayBuffer(rows, (OBS,), (ACT,), sampler=MixtureSampler(offline_fraction=0.5), seed=0)
    mix.add_offline(chunk(data, 0, half))
    mix.extend(chunk(data, half, rows))
    ops["mixture sample 50/50"] = (lambda: mix.sample(BATCH), lambda: mix.sample(BATCH))

    ext = chunk(data, 0, ext_rows)
    # ring buffers are full: every extend evicts the oldest rows. The uniform and PER buffers above double as
    # the rings so that no extra 1M-row copies are held; extend changes what is stored but not its shape.
    ops[f"extend {ext_rows} rows"] = (lambda: uni.extend(ext), None)
    ops[f"extend {ext_rows} rows (PER)"] = (lambda: per.extend(ext), None)
    return ops


def setup_numpy(data, rows, ext_rows):
    rng = np.random.default_rng(0)
    obs, act, rew, nobs = data["obs"], data["action"], data["reward"], data["next_obs"]
    done = data["terminated"] | data["truncated"]

    def sample():
        idx = rng.integers(0, rows, BATCH)
        return obs[idx], act[idx], rew[idx], nobs[idx], done[idx]

    return {"uniform sample": (sample, sample)}


def setup_cpprb(data, rows, ext_rows):
    import cpprb

    env_dict = {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {}, "next_obs": {"shape": OBS},
                "done": {}}
    fill = {"obs": data["obs"], "act": data["action"], "rew": data["reward"], "next_obs": data["next_obs"],
            "done": (data["terminated"] | data["truncated"]).astype(np.float32)}
    ops = {}
    rb = cpprb.ReplayBuffer(rows, env_dict)
    rb.add(**fill)
    ops["uniform sample"] = (lambda: rb.sample(BATCH), lambda: rb.sample(BATCH))

    per = cpprb.PrioritizedReplayBuffer(rows, env_dict, alpha=0.6)
    per.add(**fill)
    td = np.random.default_rng(1).random(BATCH)

    def per_step():
        s = per.sample(BATCH, beta=0.4)
        per.update_priorities(s["indexes"], td)

    ops["PER sample + update"] = (per_step, lambda: per.sample(BATCH, beta=0.4))

    half = rows // 2
    off, on = cpprb.ReplayBuffer(half, env_dict), cpprb.ReplayBuffer(rows - half, env_dict)
    off.add(**{k: v[:half] for k, v in fill.items()})
    on.add(**{k: v[half:] for k, v in fill.items()})

    def mixed():
        a, b = off.sample(BATCH // 2), on.sample(BATCH - BATCH // 2)
        return {k: np.concatenate([a[k], b[k]]) for k in a}

    ops["mixture sample 50/50"] = (mixed, mixed)
    ext = {k: v[:ext_rows] for k, v in fill.items()}
    ops[f"extend {ext_rows} rows"] = (lambda: rb.add(**ext), None)
    ops[f"extend {ext_rows} rows (PER)"] = (lambda: per.add(**ext), None)
    return ops


def setup_torchrl(data, rows, ext_rows):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    logging.getLogger("torchrl").setLevel(logging.WARNING)  # no INFO line per storage

    def td_of(lo, hi):
        return TensorDict({
            "obs": torch.from_numpy(data["obs"][lo:hi]), "action": torch.from_numpy(data["action"][lo:hi]),
            "reward": torch.from_numpy(data["reward"][lo:hi]),
            "next_obs": torch.from_numpy(data["next_obs"][lo:hi]),
            "done": torch.from_numpy(data["terminated"][lo:hi] | data["truncated"][lo:hi]),
        }, batch_size=[hi - lo])

    ops = {}
    rb = ReplayBuffer(storage=LazyTensorStorage(rows), batch_size=BATCH)
    rb.extend(td_of(0, rows))
    ops["uniform sample"] = (lambda: rb.sample(), lambda: rb.sample())
    ops[TORCH_SAMPLE] = ops[DEVICE_SAMPLE] = ops["uniform sample"]  # (its batches are torch tensors already)
    try:  # needs TorchRL's C++ extension (segment trees), which does not load with torch 2.13
        from torchrl.data import PrioritizedReplayBuffer

        per = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(rows), batch_size=BATCH)
        per.extend(td_of(0, rows))
        td = torch.rand(BATCH)

        def per_step():
            s = per.sample()
            per.update_priority(s["index"], td)

        ops["PER sample + update"] = (per_step, lambda: per.sample())
    except Exception as e:  # noqa: BLE001 - any failure of the extension is reported in the table
        ops["PER sample + update"] = f"unavailable: {_reason(e)}{_extension_failure()}"
    half = rows // 2
    try:
        from torchrl.data import OfflineToOnlineReplayBuffer

        offline = ReplayBuffer(storage=LazyTensorStorage(half), batch_size=BATCH)
        offline.extend(td_of(0, half))
        o2o = OfflineToOnlineReplayBuffer(offline, online_capacity=rows - half, offline_fraction=0.5,
                                          batch_size=BATCH)
        o2o.extend(td_of(half, rows))
        ops["mixture sample 50/50"] = (lambda: o2o.sample(), lambda: o2o.sample())
    except Exception as e:  # noqa: BLE001
        ops["mixture sample 50/50"] = f"unavailable: {_reason(e)}"
    ext = td_of(0, ext_rows)
    ops[f"extend {ext_rows} rows"] = (lambda: rb.extend(ext), None)
    return ops


def _reason(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0].replace(' See warning above.', '')[:80]}"


def _extension_failure() -> str:
    """Why TorchRL's C++ extension (its segment trees) did not load, if it did not."""
    import torch

    try:
        import torchrl._torchrl  # noqa: F401
    except ImportError as e:
        if "undefined symbol" in str(e):
            return (f" -- torchrl._torchrl does not load with torch {torch.__version__}: undefined symbol "
                    "(C++ ABI mismatch)")
        return f" -- torchrl._torchrl: {_reason(e)}"
    return ""


def setup_sb3(data, rows, ext_rows):
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
    o, a, r, no = data["obs"][:1], data["action"][:1], data["reward"][:1], data["next_obs"][:1]
    d = np.zeros(1, bool)
    infos = [{}]

    def ext():  # no batched insert in SB3: one transition per call
        for _ in range(ext_rows):
            rb.add(o, no, a, r, d, infos)

    sample = (lambda: rb.sample(BATCH), lambda: rb.sample(BATCH))
    return {"uniform sample": sample, TORCH_SAMPLE: sample, f"extend {ext_rows} rows": (ext, None)}


def setup_binary(data, rows, ext_rows):
    """relive's PER buffer with the binary trees it used before the 8-ary tree (the before of a before/after)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import _binary_tree
    from relive.replay import PrioritizedSampler, ReplayBuffer

    per = ReplayBuffer(rows, (OBS,), (ACT,), sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    per.extend(data)
    s = per.sampler
    leaves = np.array(s.sum_tree.leaves)
    s.sum_tree = _binary_tree.SumMaxPair(rows)
    s.sum_tree.set_all(leaves)
    td = np.random.default_rng(1).random(BATCH)

    def per_step():
        b = per.sample(BATCH)
        per.update(b.info, td_error=td)

    ext = chunk(data, 0, ext_rows)
    return {"PER sample + update": (per_step, lambda: per.sample(BATCH)),
            f"extend {ext_rows} rows (PER)": (lambda: per.extend(ext), None)}


SETUPS = {"relive": setup_relive, "binary": setup_binary, "numpy": setup_numpy, "cpprb": setup_cpprb,
          "torchrl": setup_torchrl, "sb3": setup_sb3}


# -- the trees alone: 8-ary vs the binary tree it replaced -------------------------------------------------
def tree_ops(leaves: int, seed: int = 0) -> dict[str, Callable]:
    """What PER does to its trees per step at ``leaves`` leaves: a prefix search for 256 fresh random masses,
    then a sum-tree and a max-tree update of the leaves found. Fresh masses every call (a fixed batch would walk
    the same, cached paths). One callable per tree: '8-ary' (relive.replay.sum_tree) and 'binary'."""
    sys.path.insert(0, str(Path(__file__).parent))
    import _binary_tree
    from relive.replay.sum_tree import MaxTree, SumTree

    rng = np.random.default_rng(seed)
    values = rng.random(leaves)
    masses = rng.random((512, BATCH))
    new_priorities = rng.random((512, BATCH))
    ops = {}
    for name, sum_cls, max_cls in (("8-ary", SumTree, MaxTree), ("binary", _binary_tree.SumTree,
                                                                   _binary_tree.MaxTree)):
        st, mt = sum_cls(leaves), max_cls(leaves)
        st.set_all(values)
        mt.set_all(values)
        step = iter(range(1 << 62))

        def op(st=st, mt=mt, step=step):
            i = next(step) & 511
            leaf, _ = st.find_prefix_with_values(masses[i] * st.total)
            st.update(leaf, new_priorities[i])
            mt.update(leaf, new_priorities[i])

        ops[name] = op
    return ops


def tree_table(sizes: list[int], seconds: float, repeats: int) -> dict:
    """Calls per second of ``tree_ops`` per size and tree, interleaved rounds; median and per-round ratios."""
    ops = {n: tree_ops(n) for n in sizes}
    rates = {(n, name): [] for n in sizes for name in ops[n]}
    for _ in range(repeats):
        for (n, name) in rates:
            rates[(n, name)].append(rate(ops[n][name], seconds))
    out = {}
    for n in sizes:
        per_round = [a / b for a, b in zip(rates[(n, "8-ary")], rates[(n, "binary")], strict=True)]
        out[str(n)] = {"8-ary": statistics.median(rates[(n, "8-ary")]),
                       "binary": statistics.median(rates[(n, "binary")]),
                       "ratio": {"median": statistics.median(per_round), "min": min(per_round),
                                 "max": max(per_round)}}
    return out


# -- environment record -----------------------------------------------------------------------------------
def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name in ("numpy", "numba", "torch", "cpprb", "torchrl", "tensordict", "stable-baselines3", "relive"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict:
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                      "RELIVE_NO_NUMBA") if k in os.environ}
    return {"cpu": model, "cores": cores, "platform": platform.platform(), "env": env}


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


# -- main -------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows stored in every buffer")
    p.add_argument("--extend-rows", type=int, default=1000, help="rows per batched extend")
    p.add_argument("--seconds", type=float, default=1.0, help="timing window per operation and round")
    p.add_argument("--repeats", type=int, default=3, help="rounds; the table shows medians over rounds")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for TorchRL and SB3")
    p.add_argument("--peers", default="numpy,cpprb,torchrl,sb3", help="comma-separated peers to run (also: "
                   "binary = relive's PER with the binary tree it used before the 8-ary one)")
    p.add_argument("--tree-sizes", default="", help="also time the trees alone (search + sum and max update of "
                   "256 leaves) at these comma-separated leaf counts, 8-ary vs binary, e.g. 1000,100000,1000000")
    # outside docs/: the committed plot is replaced only when asked (`--out docs/img`, as `make bench` does)
    p.add_argument("--out", default="bench/out", help="directory for the PNG and a copy of the JSON (default "
                   "bench/out; docs/img holds the committed ones)")
    p.add_argument("--json", default="bench/out/replay_throughput.json", help="where to write raw results")
    args = p.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    console = Console(width=None if sys.stdout.isatty() else 160)
    n_ext = args.extend_rows
    console.print(f"[bold]replay throughput[/]: {args.rows:,} rows (obs {OBS}, action {ACT}), batch {BATCH}, "
                  f"extend {n_ext} rows, {args.repeats} rounds x {args.seconds:.1f} s per operation, "
                  f"torch threads {args.threads}")
    load_before = load_average()
    data = make_data(args.rows)
    libs = ["relive", *[x for x in args.peers.split(",") if x]]
    setups: dict[str, dict] = {}
    for lib in libs:
        with console.status(f"filling {LABELS[lib]} with {args.rows:,} rows ..."):
            t0 = time.perf_counter()
            try:
                setups[lib] = SETUPS[lib](data, args.rows, n_ext)
            except ImportError as e:
                setups[lib] = {"_error": f"not installed ({e.name})"}
        console.print(f"  {LABELS[lib]:10s} filled in {time.perf_counter() - t0:5.1f} s")

    ops = list(setups["relive"])
    returns = {}  # what one sample call returns, per (operation, library)
    for op in ops:
        for lib in libs:
            entry = setups[lib].get(op)
            if isinstance(entry, tuple) and entry[1] is not None:
                returns[f"{op} | {lib}"] = shapes(entry[1]())

    pairs = [(op, lib) for op in ops for lib in libs if isinstance(setups[lib].get(op), tuple)]
    rates: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("timing", total=len(pairs) * args.repeats)
        for r in range(args.repeats):
            for op, lib in pairs:
                progress.update(task, description=f"round {r + 1}/{args.repeats}: {op} - {LABELS[lib]}")
                rates[(op, lib)].append(rate(setups[lib][op][0], args.seconds, warmup=2 if lib == "sb3" else 10))
                progress.advance(task)

    peers = [lib for lib in libs if lib != "relive"]
    results: dict[str, dict] = {lib: {} for lib in libs}
    ratios: dict[str, dict[str, dict]] = {}
    for op in ops:
        for lib in libs:
            entry = setups[lib].get(op)
            if isinstance(entry, tuple):
                rs = rates[(op, lib)]
                results[lib][op] = {"median": statistics.median(rs), "rounds": rs}
            elif isinstance(entry, str):
                results[lib][op] = entry
            elif "_error" in setups[lib]:
                results[lib][op] = setups[lib]["_error"]
        for lib in peers:
            if isinstance(results[lib].get(op), dict):
                per_round = [a / b for a, b in zip(rates[(op, "relive")], rates[(op, lib)], strict=True)]
                ratios.setdefault(op, {})[lib] = {"median": statistics.median(per_round), "min": min(per_round),
                                                  "max": max(per_round)}

    table = Table(title=f"calls per second, median of {args.repeats} rounds (ratio = relive / peer, median of "
                        "per-round ratios)")
    table.add_column("operation")
    table.add_column("relive", justify="right")
    for lib in peers:
        table.add_column(LABELS[lib], justify="right")
    unavailable = []  # (label, reason), footnotes of the table
    for op in ops:
        cells = [f"{results['relive'][op]['median']:,.0f}"]
        for lib in peers:
            res = results[lib].get(op)
            if isinstance(res, dict):
                cells.append(f"{res['median']:,.0f} ({ratios[op][lib]['median']:.2f}x)")
            elif isinstance(res, str):
                unavailable.append((f"{LABELS[lib]}, {op}", res))
                cells.append(f"unavailable ({len(unavailable)})")
            else:
                cells.append("-")
        table.add_row(op, *cells)
    console.print(table)
    for i, (label, reason) in enumerate(unavailable, 1):
        console.print(f"  ({i}) {label}: {reason}")
    for (op, lib), note in NOTES.items():
        if lib in peers:
            console.print(f"  {LABELS[lib]}, {op.format(n=n_ext)}: {note}")
    console.print("[bold]what one sample returns[/] (batch 256 everywhere):")
    for key, desc in returns.items():
        console.print(f"  {key}: {desc}")

    verdicts = []
    for (op, lib), target in TARGETS.items():
        op = op.format(n=n_ext)
        r = ratios.get(op, {}).get(lib)
        if r is None:
            verdicts.append(f"{op} vs {LABELS[lib]}: not measured")
        else:
            verdicts.append(f"{op} vs {LABELS[lib]}: {r['median']:.2f}x (rounds {r['min']:.2f}-{r['max']:.2f}, "
                            f"target >= {target}x) " + ("MET" if r["median"] >= target else "MISSED"))
    for v in verdicts:
        console.print(("[green]" if v.endswith("MET") else "[red]") + v)

    trees = {}
    if args.tree_sizes:
        sizes = [int(x) for x in args.tree_sizes.split(",") if x]
        with console.status("timing the trees alone ..."):
            trees = tree_table(sizes, args.seconds, args.repeats)
        tt = Table(title="the trees alone: prefix search of 256 random masses + sum and max update of the leaves "
                         "found, calls per second (median of rounds)")
        for col in ("leaves", "8-ary", "binary", "8-ary / binary (rounds)"):
            tt.add_column(col, justify="right")
        for n, res in trees.items():
            r = res["ratio"]
            tt.add_row(f"{int(n):,}", f"{res['8-ary']:,.0f}", f"{res['binary']:,.0f}",
                       f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})")
        console.print(tt)

    record = {"rows": args.rows, "trees": trees, "batch": BATCH, "extend_rows": n_ext, "seconds": args.seconds,
              "repeats": args.repeats, "torch_threads": args.threads, "machine": machine(),
              "load_average": {"before": load_before, "after": load_average()}, "versions": versions(),
              "results": results, "ratios": ratios, "returns": returns, "targets": verdicts,
              "command": "python bench/replay_throughput.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    text = json.dumps(record, indent=1)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay_throughput.json").write_text(text)
    png = plot(ratios, peers, out / "replay_throughput.png", args.rows, unavailable)
    console.print(f"raw results: {args.json} and {out / 'replay_throughput.json'}\nplot: {png}")
    return 0


def plot(ratios: dict, peers: list[str], path: Path, rows: int, unavailable: list[tuple[str, str]] = ()) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(ratios)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / max(1, len(peers))
    for i, lib in enumerate(peers):
        xs = np.arange(len(ops)) + i * width
        vals = [ratios[op][lib]["median"] if lib in ratios[op] else np.nan for op in ops]
        ax.bar(xs, vals, width, label=LABELS[lib], color=f"C{i}")
        for x, v in zip(xs, vals, strict=True):
            if np.isfinite(v):
                ax.text(x, v * 1.04, f"{v:.2f}", ha="center", va="bottom", fontsize=6.5)
        for label, _ in unavailable:
            lib_label, op = label.split(", ", 1)
            if lib_label == LABELS[lib] and op in ops:
                ax.text(ops.index(op) + i * width, 1.05, "n/a", ha="center", va="bottom", fontsize=6.5)
    n_ext = next((int(o.split()[1]) for o in ops if o.startswith("extend ")), 0)
    first = True
    for (op, lib), target in TARGETS.items():
        op = op.format(n=n_ext)
        if op in ops and lib in peers:
            x = ops.index(op) + peers.index(lib) * width
            ax.plot([x - width / 2, x + width / 2], [target, target], color="k", lw=2, ls=":",
                    label="issue-2 target" if first else None)
            first = False
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(ops)) + width * (len(peers) - 1) / 2, ops, rotation=12, fontsize=8)
    ax.set_ylabel("relive speed / peer speed")
    ax.set_yscale("log")
    ax.set_title(f"relive replay throughput relative to peers ({rows:,} rows, batch {BATCH}; > 1 = relive faster)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())
