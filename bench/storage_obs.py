"""Dict / image observations, next_obs without duplicated frames, and the memmap backend (issue 17): memory per
row and sampling throughput, with the flat-Box fast path compared against an earlier relive in the same process.

    git archive <commit> src | tar -x -C /tmp/relive_base      # the relive to compare with (optional)
    python bench/storage_obs.py --baseline-src /tmp/relive_base/src

1. Flat Box rows (Hopper-shaped: obs 11, action 3, 1M rows, batch 256): uniform sample, 50/50 mixture sample and
   a 1000-row extend into a full ring, for the earlier relive (``--baseline-src``), relive now (flat default:
   next_obs stored), relive with ``dedup_next_obs=True`` and the memmap backend. Each figure is the fastest ~20 ms
   batch of calls within ``--seconds`` (on a shared machine interference only slows a batch down); interleaved
   rounds, the versions' order alternating; medians over rounds and the median per-round ratio.
2. Memory per row of an image + state buffer (obs {"image": 3x64x64 uint8, "state": 7 float32}, action 4) with
   1000-step and 100-step episodes: relive before dict columns (the dict flattened into one float32 Box, next_obs
   copied), relive dict columns with next_obs copied, relive with dedup_next_obs (measured on a written
   buffer), and rlpd's MemoryEfficientReplayBuffer (computed from its design, see ``rlpd_bytes_per_row``).
3. Sampling an image buffer (20k rows, batch 256): dedup on / off, RAM / memmap backend.
4. ReaPER's per-episode arrays and trees (1M flat rows, 1000-step episodes): bytes, earlier vs now.

``--paired`` runs only a steadier check of the flat path (needs ``--baseline-src``): 200k rows, extend 1000 rows /
validate 1000 rows / uniform sample 256, the fastest of 60 batches of 20 calls, 8 rounds alternating which
version goes first; the minimum over rounds (microseconds per call).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_throughput import load_average  # noqa: E402
from streams import rate  # noqa: E402  the fastest ~20 ms batch: interference from other processes only slows

BATCH = 256
IMAGE, STATE, ACT = (3, 64, 64), 7, 4


@contextlib.contextmanager
def isolated(src: str):
    """``relive.replay`` from another source tree next to the one already imported (two versions in one process):
    inside the block ``relive`` is the other tree (build its objects there: ``bind`` imports lazily); its modules
    leave ``sys.modules`` again after the block, and the objects keep working (sampling imports nothing)."""
    import relive.replay  # noqa: F401  the current version, imported first

    saved = {k: v for k, v in sys.modules.items() if k == "relive" or k.startswith("relive.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, src)
    try:
        import relive.replay as other

        yield other
    finally:
        sys.path.remove(src)
        for k in [k for k in sys.modules if k == "relive" or k.startswith("relive.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def flat_data(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    frames = rng.standard_normal((rows + 1, 11), dtype=np.float32)
    t = np.arange(rows)
    return {"obs": frames[:-1], "action": rng.uniform(-1, 1, (rows, 3)).astype(np.float32),
            "reward": rng.standard_normal(rows, dtype=np.float32), "next_obs": frames[1:].copy(),
            "terminated": np.zeros(rows, bool), "truncated": t % 1000 == 999}


def chunk(data: dict, lo: int, hi: int) -> dict:
    return {k: ({kk: vv[lo:hi] for kk, vv in v.items()} if isinstance(v, dict) else v[lo:hi]) for k, v in data.items()}


def reaper_leaf_bytes(replay, data, rows) -> int:
    """Bytes of ReaPER's per-episode (leaf) arrays and its three trees after ``rows`` rows are written."""
    buf = replay.ReplayBuffer(rows, (11,), (3,), sampler=replay.ReaPERSampler(), seed=0)
    buf.extend(data)
    s = buf.sampler
    leaf = sum(getattr(s, n).nbytes for n in s._LEAF_ARRAYS)
    trees = sum(getattr(s, n).nodes.nbytes for n in ("finished_tree", "ongoing_tree", "total_tree"))
    return int(leaf + trees)


def flat_ops(replay, data, rows, **kw) -> dict:
    root = kw.pop("directory", None)  # memmap: one directory per buffer

    def sub(name):
        return {} if root is None else {"directory": root / name}

    uni = replay.ReplayBuffer(rows, (11,), (3,), sampler=replay.UniformSampler(), seed=0, **kw, **sub("uni"))
    uni.extend(data)
    mix = replay.ReplayBuffer(rows, (11,), (3,), sampler=replay.MixtureSampler(offline_fraction=0.5), seed=0, **kw,
                              **sub("mix"))
    mix.add_offline(chunk(data, 0, rows // 2))
    mix.extend(chunk(data, rows // 2, rows))
    ext = chunk(data, 0, 1000)
    return {"uniform sample": lambda: uni.sample(BATCH), "mixture sample 50/50": lambda: mix.sample(BATCH),
            "extend 1000 rows": lambda: uni.extend(ext)}


def image_data(rows: int, episode: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, size=(rows + 1, *IMAGE), dtype=np.uint8)
    state = rng.standard_normal((rows + 1, STATE), dtype=np.float32)
    end = np.arange(rows) % episode == episode - 1
    nxt_img, nxt_state = img[1:].copy(), state[1:].copy()
    nxt_img[end] = rng.integers(0, 256, size=(int(end.sum()), *IMAGE), dtype=np.uint8)  # the final observation
    return {"obs": {"image": img[:-1], "state": state[:-1]}, "next_obs": {"image": nxt_img, "state": nxt_state},
            "action": rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
            "reward": rng.standard_normal(rows, dtype=np.float32), "terminated": np.zeros(rows, bool),
            "truncated": end}


def rlpd_bytes_per_row(episode: int, num_stack: int) -> float:
    """rlpd ``MemoryEfficientReplayBuffer`` (rlpd/data/memory_efficient_replay_buffer.py): the pixel key keeps one
    unstacked frame per row (no next frame: obs and next_obs come from a sliding window over consecutive rows),
    and each episode start writes ``num_stack`` extra rows holding the first stack's frames (marked unsampleable);
    every other column is stored per row as in its ReplayBuffer: the non-pixel obs keys twice (observations and
    next_observations), actions, rewards float32, masks float32, dones bool, plus a bool ``_is_correct_index``.
    With ``num_stack`` = k the observation is k stacked 64x64x3 frames, of which each row stores one."""
    frame = int(np.prod(IMAGE))
    row = frame + 2 * 4 * STATE + 4 * ACT + 4 + 4 + 1 + 1
    return row * (1 + num_stack / episode)


def memory_table(rows: int, replay) -> list[dict]:
    out = []
    img, state = int(np.prod(IMAGE)), 4 * STATE
    tail = 4 * ACT + 4 + 1 + 1  # action, reward, terminated, truncated
    for episode in (1000, 100):
        data = image_data(rows, episode)
        spec = {"image": (IMAGE, np.uint8), "state": (STATE,)}
        measured = {}
        for dedup in (False, True):
            buf = replay.ReplayBuffer(rows, spec, (ACT,), dedup_next_obs=dedup)
            for lo in range(0, rows, 1000):  # written in collector-sized chunks, like an online run
                buf.extend(chunk(data, lo, min(rows, lo + 1000)))
            measured[dedup] = buf.storage.bytes_per_row()
        out.append({
            "episode_steps": episode,
            "relive flattened float32 (before)": 2 * (4 * img + state) + tail,
            "relive dict, next_obs copied": measured[False],
            "relive dict, dedup_next_obs": measured[True],
            "rlpd memory-efficient, num_stack=1": rlpd_bytes_per_row(episode, 1),
            # observations that stack 3 frames (image 9x64x64): relive stores the stack per row, rlpd one frame
            "relive dict, dedup_next_obs, 3 stacked frames (computed)": 3 * img + state + tail + 8
            + (3 * img + state) / episode,
            "rlpd memory-efficient, num_stack=3": rlpd_bytes_per_row(episode, 3),
        })
    return out


def paired_buffer(replay, rows: int = 200_000):
    buf = replay.ReplayBuffer(rows, (11,), (3,), seed=0)
    buf.extend(flat_data(rows))
    return buf


def paired(bufs: dict, rounds: int = 8) -> dict:
    ext = chunk(flat_data(1000, seed=1), 0, 1000)

    def best(fn, calls=20, batches=60):
        b = float("inf")
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            b = min(b, (time.perf_counter() - t) / calls)
        return b * 1e6

    out = {name: {"extend 1000 rows": [], "validate 1000 rows": [], "uniform sample": []} for name in bufs}
    for r in range(rounds):
        for name in (("earlier", "now") if r % 2 == 0 else ("now", "earlier")):
            buf = bufs[name]
            out[name]["extend 1000 rows"].append(best(lambda b=buf: b.extend(ext)))
            out[name]["validate 1000 rows"].append(best(lambda b=buf: b.storage.validate(ext)))
            out[name]["uniform sample"].append(best(lambda b=buf: b.sample(BATCH)))
    return {name: {op: min(v) for op, v in ops.items()} for name, ops in out.items()}


def timed(ops: dict[str, dict], seconds: float, repeats: int) -> dict:
    """ops: version -> {operation: fn}; interleaved rounds; returns {operation: {version: [rates]}} (each list in
    round order, so per-round ratios pair up)."""
    res: dict = {}
    for r in range(repeats):  # the versions' order alternates between rounds (no one always goes first)
        for version, fns in (list(ops.items()) if r % 2 == 0 else list(ops.items())[::-1]):
            for op, fn in fns.items():
                res.setdefault(op, {}).setdefault(version, []).append(rate(fn, seconds))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline-src", help="src/ directory of an earlier relive to compare the flat path with")
    p.add_argument("--rows", type=int, default=1_000_000, help="flat rows")
    p.add_argument("--image-rows", type=int, default=20_000, help="image rows (12 KiB each)")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default="bench/out/storage_obs.json")
    p.add_argument("--paired", action="store_true", help="only the paired fastest-batch check of the flat path")
    args = p.parse_args(argv)

    import relive.replay as now

    if args.paired:
        if not args.baseline_src:
            p.error("--paired needs --baseline-src")
        bufs = {"now": paired_buffer(now)}  # each version's objects built while its modules are imported
        with isolated(args.baseline_src) as earlier:
            bufs["earlier"] = paired_buffer(earlier)
        res = paired(bufs)
        print(f"paired, microseconds per call (min over rounds), cpu {_cpu()}, load {load_average()}")
        for op in res["now"]:
            print(f"  {op:20s} earlier {res['earlier'][op]:8.1f}  now {res['now'][op]:8.1f}  "
                  f"now / earlier {res['now'][op] / res['earlier'][op]:.3f}")
        return 0

    report: dict = {"machine": {"cpu": _cpu(), "python": platform.python_version(), "numpy": np.__version__},
                    "load_average_before": load_average()}
    data = flat_data(args.rows)
    flat_tmp = tempfile.TemporaryDirectory()
    versions = {"relive now": flat_ops(now, data, args.rows),
                "relive now, dedup_next_obs": flat_ops(now, data, args.rows, dedup_next_obs=True),
                "relive now, memmap": flat_ops(now, data, args.rows, backend="memmap", directory=Path(flat_tmp.name))}
    reaper_bytes = {"now": reaper_leaf_bytes(now, data, args.rows)}
    if args.baseline_src:
        with isolated(args.baseline_src) as earlier:
            versions = {"relive earlier": flat_ops(earlier, data, args.rows)} | versions
            reaper_bytes["earlier"] = reaper_leaf_bytes(earlier, data, args.rows)
    flat = timed(versions, args.seconds, args.repeats)
    print(f"\n1. flat rows ({args.rows} rows, batch {BATCH}): calls/s, median of {args.repeats} interleaved rounds")
    for op, by in flat.items():
        line = "  ".join(f"{v}: {statistics.median(r):,.0f}" for v, r in by.items())
        if "relive now, dedup_next_obs" in by:
            ratios = [a / b for a, b in zip(by["relive now, dedup_next_obs"], by["relive now"], strict=True)]
            line += f"  | dedup / now: {statistics.median(ratios):.3f}"
        if "relive earlier" in by:
            ratios = [a / b for a, b in zip(by["relive now"], by["relive earlier"], strict=True)]
            line += f"  | now / earlier: {statistics.median(ratios):.3f}"
        print(f"  {op:22s} {line}")
    report["flat"] = {op: {v: statistics.median(r) for v, r in by.items()} for op, by in flat.items()}
    if args.baseline_src:
        report["flat_ratio_now_over_earlier"] = {
            op: statistics.median([a / b for a, b in zip(by["relive now"], by["relive earlier"], strict=True)])
            for op, by in flat.items()}

    mem = memory_table(args.image_rows, now)
    print(f"\n2. bytes per row, image {IMAGE} uint8 + state {STATE} float32, action {ACT} ({args.image_rows} rows)")
    for row in mem:
        print("  " + ", ".join(f"{k}: {v:,.0f}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items()))
    report["bytes_per_row"] = mem

    data = image_data(args.image_rows, 1000)
    spec = {"image": (IMAGE, np.uint8), "state": (STATE,)}
    image_ops = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in (("dedup, RAM", {}), ("next_obs copied, RAM", {"dedup_next_obs": False}),
                         ("dedup, memmap", {"backend": "memmap", "directory": Path(tmp) / "mm"})):
            buf = now.ReplayBuffer(args.image_rows, spec, (ACT,), seed=0, **kw)
            for lo in range(0, args.image_rows, 1000):
                buf.extend(chunk(data, lo, min(args.image_rows, lo + 1000)))
            image_ops[name] = {"uniform sample (image)": (lambda b=buf: b.sample(BATCH))}
        image = timed(image_ops, args.seconds, args.repeats)
    print(f"\n3. image buffer ({args.image_rows} rows, batch {BATCH}): calls/s")
    for op, by in image.items():
        print(f"  {op:22s} " + "  ".join(f"{v}: {statistics.median(r):,.0f}" for v, r in by.items()))
    report["image"] = {op: {v: statistics.median(r) for v, r in by.items()} for op, by in image.items()}
    print(f"\n4. ReaPER per-episode arrays + trees, {args.rows} rows of 1000-step episodes: "
          + ", ".join(f"{k}: {v / 2**20:,.2f} MiB" for k, v in reaper_bytes.items()))
    report["reaper_leaf_bytes"] = reaper_bytes
    flat_tmp.cleanup()
    report["load_average_after"] = load_average()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
