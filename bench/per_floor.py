"""PER sample + update against its floor (issue 34, item 3), measured in one process, interleaved.

The floor of one prioritized step at N rows (Hopper-shaped: obs 11, action 3, batch 256) is what any
implementation must do: draw 256 masses and descend the sum tree once (relive's 8-ary tree, compiled), gather the
256 rows of every column (NumPy ``take``), and write the 256 new priorities into the sum tree. relive's step also
keeps the largest stored priority exact (new rows get the largest priority *currently stored* -- PER's rule; the
tree's maxima, :class:`~relive.replay.sum_tree.SumMaxTree`), checks its inputs, computes IS weights, tags each
row's source and drops rows overwritten since they were sampled (generation stamps: one more gathered column).
"floor + max tree" is the floor on a SumMaxTree; "floor + relive's design" adds the IS weights, the stamps (gathered
at sampling, read again at the update) and the source tags: the part of the gap that is a design choice rather
than glue (Python calls, checks, the batch's records). "floor + design, clock stamps" computes the stamps from the
ring's write clock instead of gathering a column (a ring slot's write count is a function of the slot and of the
rows written): what that design step, not taken, would save.

    PYTHONPATH=src python bench/per_floor.py --rows 1000000 --seconds 0.1 --repeats 60

(Short rounds, many of them: a shared machine's speed drifts within a second, and the per-round ratio cancels the
drift only when the variants of one round run close together.)

All variants first run together for ``--warmup`` seconds (the first seconds after filling 1M rows are slower and
uneven: pages of the new arrays settle), then in interleaved rounds. Prints each variant's median rate over the
rounds and the median of the per-round ratios relive step / floor (the issue's target: <= 1.5x the floor's
time), and a cProfile breakdown of relive's step.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from replay_throughput import BATCH, OBS, make_data, rate  # noqa: E402


def setup(rows: int):
    from relive.replay import PrioritizedSampler, ReplayBuffer
    from relive.replay.sum_tree import SumMaxTree, SumTree

    buf = ReplayBuffer(rows, (OBS,), (3,), sampler=PrioritizedSampler(0.6, 0.4), seed=0)
    buf.extend(make_data(rows))
    rng = np.random.default_rng(1)
    td = rng.random(BATCH)
    for _ in range(50):  # priorities that differ (not the all-equal start)
        b = buf.sample(BATCH)
        buf.update(b.info, td_error=rng.random(BATCH) * 3)
    sampler, st = buf.sampler, buf.storage
    cols = [st.columns[name] for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated")]
    alpha = sampler.priority_exponent

    def relive_step():
        b = buf.sample(BATCH)
        buf.update(b.info, td_error=td)

    leaves = np.array(sampler.sum_tree.leaves)
    plain, with_max = SumTree(rows), SumMaxTree(rows)  # the same leaves as relive's tree
    plain.set_all(leaves)
    with_max.set_all(leaves)

    stamps = st.meta["generation"]

    import numba

    @numba.njit(cache=True)
    def clock_kernel(idx, num_offline, ring_base, written, ring, out):
        for k in range(idx.size):
            r = idx[k] - ring_base
            out[k] = 1 if idx[k] < num_offline else ((written - r + ring - 1) // ring if r < written else 0)

    def clock_stamps(idx):  # a ring slot's write count from the ring's clock (the design step not taken), compiled
        out = np.empty(idx.size, np.int64)
        clock_kernel(idx, st.num_offline, st.ring_base, st.num_online_written, st.online_capacity, out)
        return out

    def descent_gather_update(tree, design: str = ""):
        def step():
            mass = rng.random(BATCH)
            mass *= tree.total
            idx, value = tree.find_prefix_with_values(mass)
            [c.take(idx, axis=0) for c in cols]
            if design:  # what relive's design adds: IS weights, the stamps gathered and compared, source tags
                prob = value / tree.total
                np.power(prob.min() / prob, 0.4).astype(np.float32)
                stamps_of = clock_stamps if design == "clock" else stamps.take
                gen = stamps_of(idx)
                (idx >= st.num_offline).view(np.int8)
                if not (stamps_of(idx) == gen).all():
                    raise AssertionError("no row is overwritten here")
            p = np.power(np.abs(td) + 1e-6, alpha)
            tree.update(idx, p)
        return step

    return buf, {"relive PER sample + update": relive_step, "floor": descent_gather_update(plain),
                 "floor + max tree": descent_gather_update(with_max),
                 "floor + relive's design": descent_gather_update(with_max, design="stamps"),
                 "floor + design, clock stamps": descent_gather_update(with_max, design="clock")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds of all variants before measuring")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    buf, ops = setup(args.rows)
    end = time.perf_counter() + args.warmup
    while time.perf_counter() < end:
        for fn in ops.values():
            fn()
    rates: dict[str, list[float]] = {k: [] for k in ops}
    for _ in range(args.repeats):
        for name, fn in ops.items():
            rates[name].append(rate(fn, args.seconds))
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratios = [f / r for f, r in zip(rates["floor"], rates["relive PER sample + update"], strict=True)]
    ratios_max = [f / r for f, r in zip(rates["floor + max tree"], rates["relive PER sample + update"], strict=True)]
    ratios_design = [f / r for f, r in zip(rates["floor + relive's design"], rates["relive PER sample + update"],
                                           strict=True)]
    print(f"{args.rows:,} rows, batch {BATCH}, {args.repeats} interleaved rounds of {args.seconds} s "
          f"({platform.processor() or platform.machine()})")
    for name, r in med.items():
        print(f"  {name:28s} {r:10,.0f}/s  {1e6 / r:7.1f} us")
    print(f"  relive step / floor: {statistics.median(ratios):.2f}x the floor's time "
          f"({min(ratios):.2f}-{max(ratios):.2f}); / floor + max tree: {statistics.median(ratios_max):.2f}x; "
          f"/ floor + relive's design: {statistics.median(ratios_design):.2f}x")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        ops["relive PER sample + update"]()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    print("\nrelive's step, by function (cProfile, 2,000 steps; profiling inflates Python's share):")
    print("\n".join(out.getvalue().splitlines()[6:22]))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": args.rows, "rates": rates, "median": med,
                                               "ratio_to_floor": ratios, "ratio_to_floor_max_tree": ratios_max,
                                               "ratio_to_floor_design": ratios_design},
                                              indent=1))


if __name__ == "__main__":
    main()
