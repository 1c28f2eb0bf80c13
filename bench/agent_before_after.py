"""Agent updates before and after a change, in one process: the package at ``--ref`` (a git commit) is extracted
into a temporary directory under the name ``relive_old`` and imported beside the working tree's ``relive``; the
two versions of each agent alternate in rounds (interleaved, median of the per-round ratios, wall-clock and
process-CPU-time rates), each sampling its own 20k-row buffer.

    PYTHONPATH=src python bench/agent_before_after.py --ref 9e98b85 --threads 1 --rounds 7 --seconds 1.5

Agents: SAC (twin critics), ten LayerNorm critics with an actor step every update, RLPD as configured
(``SACConfig.rlpd()``) and Cal-QL (``CalQLConfig()``), Hopper shapes (obs 11, action 3), batch 256. Replay
operations (``--agents replay_uniform,replay_per,replay_reaper,replay_extend,replay_extend_small,replay_streams,
replay_to_torch``, 100k rows): a uniform sample, a PER / ReaPER sample + priority update, an extend of 1,000 rows
into a full ring, an extend of 4 rows (a vector env's step: the fixed cost of a write), the same with four streams
(the lane maps), and ``Batch.to_torch()`` of one 256-row batch.

    PYTHONPATH=src python bench/agent_before_after.py --ref fcab870 \
        --agents replay_uniform,replay_per,replay_reaper,replay_extend,replay_streams
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from agent_throughput import rates  # bench/ is on sys.path when run as a script

OBS, ACT, BATCH, ROWS = 11, 3, 256, 20_000
ROOT = Path(__file__).resolve().parents[1]


def extract(ref: str, into: Path) -> None:
    """src/relive at ``ref`` as the package ``relive_old`` under ``into``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src/relive"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    (into / "src" / "relive").rename(into / "relive_old")
    for path in (into / "relive_old").rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\bfrom relive\b", "from relive_old", text)
        text = re.sub(r"\bimport relive\b", "import relive_old", text)
        path.write_text(text.replace('"relive.', '"relive_old.'))


def make_replay(pkg: str, kind: str):
    import importlib

    replay = importlib.import_module(f"{pkg}.replay")
    testing = importlib.import_module(f"{pkg}.testing")
    n = 100_000
    sampler = {"replay_per": replay.PrioritizedSampler, "replay_reaper": replay.ReaPERSampler}.get(kind,
                                                                                                 replay.UniformSampler)
    buf = replay.ReplayBuffer(n, (OBS,), (ACT,), sampler=sampler(), seed=0)
    rows = testing.random_transitions(n, OBS, ACT, rng=0, episode_length=1000)
    buf.extend(rows)
    chunk = {k: v[:1000] for k, v in rows.items()}
    td = np.random.default_rng(0).random(BATCH).astype(np.float32)
    if kind == "replay_extend":
        return lambda: buf.extend(chunk)
    if kind == "replay_extend_small":  # a vector env's step (4 rows): the fixed cost of a write
        small = {k: v[:4] for k, v in rows.items()}
        return lambda: buf.extend(small)
    if kind == "replay_streams":
        stream = iter(range(10**9))
        return lambda: buf.extend(chunk, stream=next(stream) % 4)
    if kind == "replay_uniform":
        return lambda: buf.sample(BATCH)
    if kind == "replay_to_torch":  # one 256-row batch's conversion to torch tensors (Batch.to_torch)
        batch = buf.sample(BATCH)
        return lambda: batch.to_torch()

    def step():
        batch = buf.sample(BATCH)
        buf.update(batch.info, td_error=td)

    return step


def make(pkg: str, kind: str):
    import importlib

    if kind.startswith("replay_"):
        return make_replay(pkg, kind)
    sac = importlib.import_module(f"{pkg}.agents.sac")
    cal_ql = importlib.import_module(f"{pkg}.agents.cal_ql")
    replay = importlib.import_module(f"{pkg}.replay")
    testing = importlib.import_module(f"{pkg}.testing")
    extra = {"mc_return": ()} if kind == "calql" else {}
    buf = replay.ReplayBuffer(ROWS, (OBS,), (ACT,), seed=0, extra_columns=extra)
    rows = testing.random_transitions(ROWS, OBS, ACT, rng=0, episode_length=1000)
    if extra:
        rows = rows | {"mc_return": np.random.default_rng(0).normal(size=ROWS).astype(np.float32)}
    buf.extend(rows)
    low, high = -np.ones(ACT), np.ones(ACT)
    if kind == "calql":
        agent = cal_ql.CalQL(OBS, ACT, low, high, cal_ql.CalQLConfig(), seed=0)
    elif kind == "rlpd":
        agent = sac.SAC(OBS, ACT, low, high, sac.SACConfig.rlpd(), seed=0)
    elif kind == "ten_ln":
        agent = sac.SAC(OBS, ACT, low, high, sac.SACConfig(num_qs=10, critic_layer_norm=True), seed=0)
    else:
        agent = sac.SAC(OBS, ACT, low, high, sac.SACConfig(), seed=0)
    return lambda: agent.update(buf.sample(BATCH))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True, help="git commit of the 'before' version")
    p.add_argument("--agents", default="sac,ten_ln,rlpd,calql")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=1.5)
    args = p.parse_args(argv)
    import torch

    from relive.train.malloc import retain_freed_memory

    torch.set_num_threads(args.threads)
    retain_freed_memory()  # the process setting, for both versions
    warnings.filterwarnings("ignore")
    tmp = Path(tempfile.mkdtemp(prefix="relive_before_"))
    extract(args.ref, tmp)
    sys.path.insert(0, str(tmp))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").is_file() else []
    print(f"before = {args.ref}, after = working tree, threads {args.threads}, load average {' '.join(load)}",
          flush=True)
    kinds = args.agents.split(",")
    steps = {(k, v): make(pkg, k) for k in kinds for v, pkg in (("before", "relive_old"), ("after", "relive"))}
    wall: dict = {k: [] for k in steps}
    cpu: dict = {k: [] for k in steps}
    for r in range(args.rounds):
        for key, step in steps.items():
            w, c = rates(step, args.seconds, warmup=3)
            wall[key].append(w)
            cpu[key].append(c)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v} {wall[(k, v)][-1]:.1f}/s" for k, v in steps), flush=True)
    for k in kinds:
        ratio = {name: statistics.median(a / b for a, b in zip(t[(k, "after")], t[(k, "before")], strict=True))
                 for name, t in (("wall", wall), ("CPU time", cpu))}
        print(f"{k}: after / before = {ratio['wall']:.2f}x wall, {ratio['CPU time']:.2f}x CPU time "
              f"({statistics.median(wall[(k, 'before')]):.1f} -> {statistics.median(wall[(k, 'after')]):.1f} "
              "calls/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
