"""Bytes per row of a full replay buffer, by column, for relive beside TorchRL and cpprb (issue 34 item 1).

Three row layouts: ``flat`` (Hopper-shaped: obs 11 float32, action 3 float32, reward, next_obs, terminated,
truncated: 106 bytes of data), ``dict`` (a Fetch goal dict: observation 10, achieved_goal 3, desired_goal 3, all
float32, action 4) and ``image`` (84x84x3 uint8 pixels + 4 float32 state, action 6). Each library fills a buffer of
N rows in a fresh process; the figure is the process's resident memory after the fill minus before it (the
buffer's real cost: data, per-slot bookkeeping, allocator slack), divided by N. relive's per-column bytes are the
arrays' sizes. relive keeps next_obs per row for flat rows (as TorchRL's and cpprb's ``next`` entries) and, for
dict and image rows, reads it from the next row of the episode (``dedup_next_obs``); TorchRL and cpprb store it
(cpprb's ``next_of`` could share it for flat rows; not used here, as in its default).

    python bench/bookkeeping_bytes.py                 # N = 1,000,000 (flat, dict), 20,000 (image)
    python bench/bookkeeping_bytes.py --rows 200000 --image-rows 5000

Prints a markdown table (docs/benchmarks.md "Bytes per row").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

LAYOUTS = {
    "flat": {"obs": (11,), "action": 3, "pixels": None},
    "dict": {"obs": {"observation": (10,), "achieved_goal": (3,), "desired_goal": (3,)}, "action": 4, "pixels": None},
    "image": {"obs": {"pixels": (84, 84, 3), "state": (4,)}, "action": 6, "pixels": "pixels"},
}
CHUNK = 10_000


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def data_bytes(layout: str) -> int:
    """Bytes of one row's data, next_obs included (what every library must hold one way or another)."""
    spec = LAYOUTS[layout]
    obs = spec["obs"]
    shapes = obs.values() if isinstance(obs, dict) else [obs]
    obs_bytes = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        obs_bytes += n * (1 if len(shape) == 3 else 4)
    return 2 * obs_bytes + 4 * spec["action"] + 4 + 2


def _obs_rows(layout: str, n: int, rng):
    """``n + 1`` observations of one trajectory: rows take ``[:-1]`` as obs and ``[1:]`` as next_obs (so a
    deduplicating buffer finds each next_obs in the next row, as in real episodes)."""
    import numpy as np

    obs = LAYOUTS[layout]["obs"]
    if isinstance(obs, dict):
        return {k: (rng.integers(0, 255, size=(n + 1, *s), dtype=np.uint8) if len(s) == 3
                    else rng.normal(size=(n + 1, *s)).astype(np.float32)) for k, s in obs.items()}
    return rng.normal(size=(n + 1, *obs)).astype(np.float32)


def _split(obs):
    if isinstance(obs, dict):
        return {k: v[:-1] for k, v in obs.items()}, {k: v[1:] for k, v in obs.items()}
    return obs[:-1], obs[1:]


def _relive_obs_shape(layout: str):
    import numpy as np

    obs = LAYOUTS[layout]["obs"]
    if isinstance(obs, dict):  # pixels stored as uint8
        return {k: ((s, np.uint8) if len(s) == 3 else s) for k, s in obs.items()}
    return obs


def fill_relive(layout: str, n: int, sampler: str) -> dict:
    import numpy as np

    from relive.replay import PrioritizedSampler, ReplayBuffer, UniformSampler

    spec = LAYOUTS[layout]
    rng = np.random.default_rng(0)

    def make(capacity):
        return ReplayBuffer(capacity, _relive_obs_shape(layout), spec["action"],
                            sampler=PrioritizedSampler() if sampler == "per" else UniformSampler())

    def fill(buf, count):
        for lo in range(0, count, CHUNK):
            k = min(CHUNK, count - lo)
            obs, nxt = _split(_obs_rows(layout, k, rng))
            buf.extend({"obs": obs, "action": rng.uniform(-1, 1, size=(k, spec["action"])).astype(np.float32),
                        "reward": rng.normal(size=k).astype(np.float32), "next_obs": nxt,
                        "terminated": np.zeros(k, bool), "truncated": (np.arange(lo, lo + k) % 1000) == 999})

    fill(make(2 * CHUNK), 2 * CHUNK)  # warm-up: imports, compiled kernels, the allocator's arenas
    before = rss()
    buf = make(n)
    fill(buf, n)
    total = rss() - before
    st = buf.storage
    by_column = {name: col.nbytes / n for name, col in st.columns.items()}
    stored = getattr(st, "_meta", st.meta)  # (relive before 2026-11-27 stored all six fields in meta)
    by_column |= {f"meta.{name}": arr.nbytes / n for name, arr in stored.items()}
    if st.dedup_next_obs:  # the explicit next_obs copies (episode ends) and the slot -> copy map
        by_column["next_obs store (map)"] = st._nx.map_nbytes / n
        by_column["next_obs store (copies)"] = sum(a.nbytes for a in st._nx.values.values()) / n
    if sampler == "per":
        s = buf.sampler
        trees = {id(t): t for t in (s.sum_tree, s.max_tree)}.values()  # (one tree keeps both since 2026-11-27)
        by_column["sampler (sum + max trees)"] = sum(v.nbytes for t in trees
                                                     for v in vars(t).values() if isinstance(v, np.ndarray)) / n
    return {"rss_per_row": total / n, "by_column": by_column}


def fill_torchrl(layout: str, n: int) -> dict:
    import numpy as np
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    torch.set_num_threads(1)
    spec = LAYOUTS[layout]
    rng = np.random.default_rng(0)

    def tensors(x):
        return {key: torch.from_numpy(v) for key, v in x.items()} if isinstance(x, dict) else torch.from_numpy(x)

    def fill(rb, count):
        for lo in range(0, count, CHUNK):
            k = min(CHUNK, count - lo)
            obs, nxt = _split(_obs_rows(layout, k, rng))
            td = TensorDict({"observation": tensors(obs), "action": torch.rand(k, spec["action"]),
                             "next": {"observation": tensors(nxt), "reward": torch.rand(k, 1),
                                      "done": torch.zeros(k, 1, dtype=torch.bool),
                                      "terminated": torch.zeros(k, 1, dtype=torch.bool),
                                      "truncated": torch.zeros(k, 1, dtype=torch.bool)}}, batch_size=[k])
            rb.extend(td)

    fill(ReplayBuffer(storage=LazyTensorStorage(2 * CHUNK), batch_size=256), 2 * CHUNK)  # warm-up
    before = rss()
    rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=256)
    fill(rb, n)
    total = rss() - before
    stored = rb._storage._storage
    by_column = {".".join(key if isinstance(key, tuple) else (key,)): t.numel() * t.element_size() / n
                 for key, t in stored.items(include_nested=True, leaves_only=True)}
    return {"rss_per_row": total / n, "by_column": by_column}


def fill_cpprb(layout: str, n: int) -> dict:
    import cpprb
    import numpy as np

    spec = LAYOUTS[layout]
    obs = spec["obs"]
    env = {"act": {"shape": spec["action"]}, "rew": {}, "done": {}}
    if isinstance(obs, dict):
        for key, shape in obs.items():
            dt = np.uint8 if len(shape) == 3 else np.float32
            env[key] = {"shape": shape, "dtype": dt}
            env["next_" + key] = {"shape": shape, "dtype": dt}
    else:
        env |= {"obs": {"shape": obs}, "next_obs": {"shape": obs}}
    rng = np.random.default_rng(0)

    def fill(rb, count):
        for lo in range(0, count, CHUNK):
            k = min(CHUNK, count - lo)
            o, nxt = _split(_obs_rows(layout, k, rng))
            cols = ({**o, **{"next_" + key: v for key, v in nxt.items()}} if isinstance(o, dict)
                    else {"obs": o, "next_obs": nxt})
            rb.add(**cols, act=rng.uniform(-1, 1, size=(k, spec["action"])).astype(np.float32),
                   rew=rng.normal(size=k).astype(np.float32), done=np.zeros(k, np.float32))

    fill(cpprb.ReplayBuffer(2 * CHUNK, env), 2 * CHUNK)  # warm-up
    before = rss()
    rb = cpprb.ReplayBuffer(n, env)
    fill(rb, n)
    total = rss() - before
    return {"rss_per_row": total / n, "by_column": {}}


def child(lib: str, layout: str, n: int) -> None:
    out = {"relive": lambda: fill_relive(layout, n, "uniform"), "relive PER": lambda: fill_relive(layout, n, "per"),
           "torchrl": lambda: fill_torchrl(layout, n), "cpprb": lambda: fill_cpprb(layout, n)}[lib]()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--image-rows", type=int, default=20_000)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    libs = ["relive", "relive PER", "torchrl", "cpprb"]
    results = {}
    for layout in LAYOUTS:
        n = args.image_rows if layout == "image" else args.rows
        for lib in libs:
            cmd = [sys.executable, __file__, "--child", lib, layout, str(n)]
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env=os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
            if proc.returncode:
                results[(layout, lib)] = {"error": proc.stderr.strip().splitlines()[-1][:120]}
            else:
                results[(layout, lib)] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{layout:6s} {lib:11s} {results[(layout, lib)]}", file=sys.stderr, flush=True)
    print("| rows | data B/row | " + " | ".join(f"{lib} B/row (overhead)" for lib in libs) + " |")
    print("|---|---|" + "---|" * len(libs))
    for layout in LAYOUTS:
        d = data_bytes(layout)
        cells = []
        for lib in libs:
            r = results[(layout, lib)]
            if "error" in r:
                cells.append(f"failed: {r['error']}")
            else:
                b = r["rss_per_row"]
                cells.append(f"{b:,.1f} ({(b - d) / d:+.1%})")
        n = args.image_rows if layout == "image" else args.rows
        print(f"| {layout} (N = {n:,}) | {d:,} | " + " | ".join(cells) + " |")
    print()
    for layout in LAYOUTS:
        r = results[(layout, "relive PER")]
        if "by_column" in r:
            cols = ", ".join(f"{k} {v:g}" for k, v in r["by_column"].items())
            print(f"relive PER, {layout}: bytes per row by array: {cols}")
    for layout in LAYOUTS:
        r = results[(layout, "torchrl")]
        if "by_column" in r:
            cols = ", ".join(f"{k} {v:g}" for k, v in r["by_column"].items())
            print(f"torchrl, {layout}: bytes per row by tensor: {cols}")


if __name__ == "__main__":
    main()
