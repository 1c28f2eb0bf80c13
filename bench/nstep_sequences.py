"""Cost of the sample-time views: n-step returns and slices next to a plain one-step sample.

Hopper-shaped rows (obs 11, action 3), episodes of 1000 steps (truncated), uniform sampling; prints the best of
``--repeats`` timing windows (microseconds per call) for each operation. One stream, and four interleaved streams
(the per-lane position maps) for n-step.

    python bench/nstep_sequences.py --rows 100000
"""

from __future__ import annotations

import argparse
import platform

import numpy as np

from _timing import best_us
from relive.replay import ReplayBuffer

OBS, ACT = 11, 3


def filled(rows: int, n_step: int, streams: int = 1) -> ReplayBuffer:
    buf = ReplayBuffer(rows, (OBS,), (ACT,), seed=0, n_step=n_step, gamma=0.99)
    rng = np.random.default_rng(0)
    end = np.zeros(rows, bool)
    end[999::1000] = True
    data = dict(obs=rng.normal(size=(rows, OBS)).astype(np.float32),
                action=rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
                reward=rng.normal(size=rows).astype(np.float32),
                next_obs=rng.normal(size=(rows, OBS)).astype(np.float32), terminated=np.zeros(rows, bool),
                truncated=end)
    chunk = 500 if streams > 1 else rows
    for k, lo in enumerate(range(0, rows, chunk)):
        buf.extend({name: col[lo : lo + chunk] for name, col in data.items()}, stream=k % streams)
    return buf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rows stored (the buffer is full)")
    p.add_argument("--calls", type=int, default=300, help="calls per timing window")
    p.add_argument("--repeats", type=int, default=5, help="timing windows; the best is shown")
    args = p.parse_args()
    one, three, three_streams = filled(args.rows, 1), filled(args.rows, 3), filled(args.rows, 3, streams=4)
    ops = {
        "sample(256), n_step=1": lambda: one.sample(256),
        "sample(256), n_step=3": lambda: three.sample(256),
        "sample(256), n_step=3, 4 streams": lambda: three_streams.sample(256),
        "sample_sequences(32, 8), pad": lambda: one.sample_sequences(32, 8),
        "sample_sequences(32, 8), reject": lambda: one.sample_sequences(32, 8, at_episode_end="reject"),
        "sample_sequences(32, 8), pad, n_step=3": lambda: three.sample_sequences(32, 8),
    }
    print(f"{platform.processor() or platform.machine()}, {args.rows} rows, best of {args.repeats} x {args.calls}")
    for name, fn in ops.items():
        print(f"{name:42s} {best_us(fn, args.calls, args.repeats):8.0f} us")


if __name__ == "__main__":
    main()
