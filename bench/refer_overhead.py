"""ReF-ER bookkeeping vs a DDPG update (issue 12): is ReF-ER's replay side <= 5% of a gradient step?

    python bench/refer_overhead.py --rows 262144 --threads 1

Hopper-shaped rows (obs 11, action 3), N = 2^18 stored rows (the paper's buffer), batch 256, DDPG 256x256. Timed,
interleaved in rounds (median over rounds of the per-call times):

- ``ddpg_update``: one plain DDPG gradient step (``DDPG.update``, no hints) on a sampled batch;
- ``ddpg_refer_update``: the same step under ReF-ER hints (adds the rho forward pass, the masks, the KL term;
  hints that keep every row near and beta at 0.5, so that no step is skipped);
- ``bookkeeping``: the sampler's side of one step: ``hints()`` + ``update`` (rho refresh of 256 rows, far counts,
  one beta step, t += 1);
- ``recount``: one full recount of all N rows with the agent's ``refer_log_rho`` (chunks of 65,536), amortized
  over its period (``--recount-every``, ``ReFERConfig.recount_every_grad_steps``' default 2000; smarties re-flags its
  stored rho against c_max every 1000 steps without a forward pass) -- printed for 1000 steps as well.

Reported: bookkeeping + amortized recount as a fraction of a DDPG update (the issue's target: <= 5%), and the
agent-side extra (``ddpg_refer_update`` / ``ddpg_update`` - 1) separately. Sampling itself is uniform and costs
what ``UniformSampler`` costs. ``torch.set_num_threads(--threads)``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _timing import per_call

OBS, ACT, BATCH = 11, 3, 256


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2**18)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--recount-every", type=int, default=2000)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", default="bench/out/refer_overhead.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from relive.agents.ddpg import DDPG, DDPGConfig
    from relive.replay import ReplayBuffer
    from relive.replay.samplers.refer import ReFERSampler
    from relive.types import unpack_acted

    agent = DDPG(OBS, ACT, -np.ones(ACT), np.ones(ACT), DDPGConfig(), seed=0, device=args.device)
    sampler = ReFERSampler()
    buf = ReplayBuffer(args.rows, OBS, ACT, sampler=sampler, seed=0,
                       extra_columns={d.name: d.spec for d in agent.stored_columns()})
    rng = np.random.default_rng(0)
    chunk = 65536
    for lo in range(0, args.rows, chunk):
        n = min(chunk, args.rows - lo)
        obs = rng.normal(size=(n, OBS)).astype(np.float32)
        action, record, _ = unpack_acted(agent.act(obs, explore=True))
        trunc = np.zeros(n, bool)
        trunc[999::1000] = True
        buf.extend(dict(obs=obs, action=action, reward=rng.normal(size=n).astype(np.float32),
                        next_obs=rng.normal(size=(n, OBS)).astype(np.float32), terminated=np.zeros(n, bool),
                        truncated=trunc, **record))
    plain_batch = buf.sample(BATCH)
    plain_batch = type(plain_batch)(**{k: getattr(plain_batch, k) for k in ("obs", "action", "reward", "next_obs",
                                                                            "terminated", "truncated")},
                                    info=type(plain_batch.info)(**{**plain_batch.info.__dict__, "hints": {}}),
                                    extras=plain_batch.extras)
    refer_batch = buf.sample(BATCH)
    rho = agent.update(refer_batch).signals["rho"]
    # the agent drifts while it is timed; hints that keep every row near (c_max huge) and the KL term on (beta 0.5)
    # time the full ReF-ER step (no optimizer step is ever skipped)
    worst = {"c_max": 1e9, "beta": 0.5, "lr_scale": 1.0, "refer_source": -1}
    refer_batch = type(refer_batch)(**{k: getattr(refer_batch, k) for k in ("obs", "action", "reward", "next_obs",
                                                                            "terminated", "truncated")},
                                    info=type(refer_batch.info)(**{**refer_batch.info.__dict__, "hints": worst}),
                                    extras=refer_batch.extras)

    def bookkeeping():
        sampler.hints()
        buf.update(refer_batch.info, rho=rho)

    fns = {"ddpg_update": lambda: agent.update(plain_batch), "ddpg_refer_update": lambda: agent.update(refer_batch),
           "bookkeeping": bookkeeping}
    times: dict[str, list[float]] = {k: [] for k in fns} | {"recount": []}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            times[name].append(per_call(fn, args.seconds))
        start = time.perf_counter()
        sampler.recount(agent.refer_log_rho)
        times["recount"].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = med["bookkeeping"] + med["recount"] / args.recount_every
    result = {
        "command": "python bench/refer_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "rows": args.rows, "threads": args.threads, "device": args.device, "recount_every": args.recount_every,
        "machine": {"processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "seconds_per_call": med,
        "bookkeeping_fraction_of_ddpg_update": med["bookkeeping"] / med["ddpg_update"],
        "amortized_recount_fraction_of_ddpg_update": med["recount"] / args.recount_every / med["ddpg_update"],
        "replay_overhead_fraction": overhead / med["ddpg_update"],
        "agent_side_extra_fraction": med["ddpg_refer_update"] / med["ddpg_update"] - 1,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"$ {result['command']}")
    print(f"rows {args.rows}, batch {BATCH}, threads {args.threads}, device {args.device}")
    for k, v in med.items():
        print(f"  {k:18s} {v * 1e3:9.3f} ms")
    print(f"ReF-ER replay bookkeeping per step: {med['bookkeeping'] * 1e6:.1f} us "
          f"= {result['bookkeeping_fraction_of_ddpg_update']:.2%} of a DDPG update")
    print(f"recount of {args.rows} rows every {args.recount_every} steps: "
          f"{result['amortized_recount_fraction_of_ddpg_update']:.2%} of a DDPG update")
    print(f"  (every 1000 steps: {med['recount'] / 1000 / med['ddpg_update']:.2%})")
    print(f"total replay-side overhead: {result['replay_overhead_fraction']:.2%} (target <= 5%)")
    print(f"agent-side extra (rho forward, masks, KL): {result['agent_side_extra_fraction']:.2%}")
    return result


if __name__ == "__main__":
    main()
