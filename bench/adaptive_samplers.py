"""Adaptive samplers (issue 3): ARB refresh, sampling and amortized mode; ReaPER sample + update vs cpprb PER.

    python bench/adaptive_samplers.py --rows 1000000 --threads 2

Hopper-shaped rows (obs 11, action 3) in 1000-step episodes, batch 256. The policy and the SAC update are
built here (a plain 256x256 tanh-Gaussian actor and twin 256x256 critics in PyTorch), so the figures do not
depend on the agent code. ``torch.set_num_threads(--threads)``; everything else is single-threaded.

1. ARB full refresh of N rows: the actor's forward pass over every row in chunks of 65,536 under
   ``torch.no_grad()`` with ``relive.agents.scoring`` (both score modes), then the weights (min of 3).
2. ARB sampling vs uniform sampling of the same rows (interleaved rounds, median of the per-round ratios).
3. ARB amortized mode: one ``buffer.refresh`` re-scoring k rows (k = N/4000, N/2000, N/1000: a full sweep every
   4000 / 2000 / 1000 gradient steps) vs one SAC gradient step (sample + update), interleaved; and amortized
   sampling (from the sum tree) vs uniform.
4. ReaPER sample + update vs cpprb ``PrioritizedReplayBuffer`` sample + ``update_priorities`` (alpha 0.6) at N
   rows, interleaved; ReaPER's batch-update cost at N rows vs at 10k rows, the rows it recomputes per update
   (the suffixes of the touched episodes), and the cost of a one-row update at both sizes.
Results go to ``--json`` (default bench/out/adaptive_samplers.json) and are summarized on stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from _timing import per_call

OBS, ACT, BATCH = 11, 3, 256


def rate(fn: Callable, seconds: float, warmup: int = 3) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (after ``warmup`` calls)."""
    return 1.0 / per_call(fn, seconds, warmup)


def interleaved(fns: dict[str, Callable], rounds: int, seconds: float) -> dict[str, list[float]]:
    """Rates of each function measured in turn, ``rounds`` times (so that load changes hit all of them)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name].append(rate(fn, seconds))
    return out


def median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def make_rows(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return {
        "obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "action": np.tanh(2 * rng.standard_normal((n, ACT), dtype=np.float32)),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS), dtype=np.float32),
        "terminated": np.zeros(n, bool),
        "truncated": t % 1000 == 999,  # 1000-step episodes
    }


def build_sac(seed: int = 0):
    """A plain SAC (Haarnoja et al. 2018): 256x256 tanh-Gaussian actor, twin 256x256 critics, target critics,
    learned temperature, Adam 3e-4, Polyak 0.005. Returns (actor, update(batch) -> None)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)

    def mlp(i, o):
        return nn.Sequential(nn.Linear(i, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, o))

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp(OBS, 2 * ACT)

        def forward(self, obs):
            mean, log_std = self.net(obs).chunk(2, -1)
            return mean, log_std.clamp(-20, 2)

        def sample(self, obs):
            mean, log_std = self(obs)
            u = mean + log_std.exp() * torch.randn_like(mean)
            a = torch.tanh(u)
            logp = (-0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
                    - 2 * (np.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)
            return a, logp

    actor, q1, q2 = Actor(), mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)
    t1, t2 = mlp(OBS + ACT, 1), mlp(OBS + ACT, 1)
    t1.load_state_dict(q1.state_dict())
    t2.load_state_dict(q2.state_dict())
    log_alpha = torch.zeros(1, requires_grad=True)
    critic_params = list(q1.parameters()) + list(q2.parameters())
    opt_q = torch.optim.Adam(critic_params, lr=3e-4)
    opt_pi = torch.optim.Adam(actor.parameters(), lr=3e-4)
    opt_alpha = torch.optim.Adam([log_alpha], lr=3e-4)
    target_params = list(t1.parameters()) + list(t2.parameters())

    def update(batch) -> None:
        b = batch.to_torch("cpu")
        obs, act, rew, nxt = b.obs, b.action, b.reward, b.next_obs
        done = b.terminated
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            a2, logp2 = actor.sample(nxt)
            x2 = torch.cat([nxt, a2], -1)
            y = rew + 0.99 * (1 - done) * (torch.min(t1(x2), t2(x2)).squeeze(-1) - alpha * logp2)
        x = torch.cat([obs, act], -1)
        q_loss = ((q1(x).squeeze(-1) - y) ** 2).mean() + ((q2(x).squeeze(-1) - y) ** 2).mean()
        opt_q.zero_grad(set_to_none=True)
        q_loss.backward()
        opt_q.step()
        a, logp = actor.sample(obs)
        xa = torch.cat([obs, a], -1)
        pi_loss = (alpha * logp - torch.min(q1(xa), q2(xa)).squeeze(-1)).mean()
        opt_pi.zero_grad(set_to_none=True)
        pi_loss.backward()
        opt_pi.step()
        alpha_loss = -(log_alpha * (logp.detach() - ACT)).mean()
        opt_alpha.zero_grad(set_to_none=True)
        alpha_loss.backward()
        opt_alpha.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, critic_params, 0.005)

    return actor, update


def make_score_fn(actor, mode: str):
    import torch

    from relive.agents.scoring import log_prob_score, standardized_score

    def score(obs, action):  # the ARB sampler calls this under torch.no_grad(), chunk by chunk
        mean, log_std = actor(torch.as_tensor(obs))
        a = torch.as_tensor(action)
        return standardized_score(mean, log_std.exp(), a) if mode == "standardized" else log_prob_score(mean,
                                                                                                         log_std, a)
    return score


def say(msg: str) -> None:
    print(msg, flush=True)


def full_refresh(ctx, out) -> None:
    import torch

    arb, N, rows = ctx["arb"], ctx["N"], ctx["rows"]
    for mode in ("standardized", "log_prob"):
        score = make_score_fn(ctx["actor"], mode)
        arb.refresh(score)  # warm-up (allocations, compiled kernels)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            arb.refresh(score)
            times.append(time.perf_counter() - t)
        out[f"ARB full refresh s ({mode})"] = min(times)
        say(f"ARB full refresh of {N:,} rows, {mode}: {min(times):.2f} s (target <= 3 s)")
    score = make_score_fn(ctx["actor"], "standardized")
    with torch.no_grad():  # the forward pass alone, for the split
        t = time.perf_counter()
        for a in range(0, N, 65536):
            score(rows["obs"][a : a + 65536], rows["action"][a : a + 65536])
        out["policy forward over all rows s"] = time.perf_counter() - t
    say(f"  of which the policy's forward pass: {out['policy forward over all rows s']:.2f} s")


def sampling(ctx, out) -> None:
    arb, uni, R, S = ctx["arb"], ctx["uni"], ctx["rounds"], ctx["seconds"]
    r = interleaved({"uniform": lambda: uni.sample(BATCH), "ARB": lambda: arb.sample(BATCH)}, R, S)
    out["uniform sample/s"], out["ARB sample/s"] = statistics.median(r["uniform"]), statistics.median(r["ARB"])
    out["ARB / uniform sample"] = median_ratio(r["ARB"], r["uniform"])
    say(f"ARB sample {out['ARB sample/s']:,.0f}/s vs uniform {out['uniform sample/s']:,.0f}/s: "
        f"{out['ARB / uniform sample']:.2f}x (target >= 0.8x)")


def amortized_mode(ctx, out) -> None:
    from relive.replay import ARBSampler, ReplayBuffer

    N, uni, sac_update, R, S = ctx["N"], ctx["uni"], ctx["sac_update"], ctx["rounds"], ctx["seconds"]
    score = make_score_fn(ctx["actor"], "standardized")
    fns = {"SAC step": lambda: sac_update(uni.sample(BATCH))}
    buffers = {}
    for sweep in (4000, 2000, 1000):
        k = max(1, N // sweep)
        buf = ReplayBuffer(N, (OBS,), (ACT,), sampler=ARBSampler(temperature=5.0, amortized_rows_per_refresh=k),
                           seed=0)
        buf.extend(ctx["rows"])
        buffers[sweep] = buf
        fns[f"amortized k={k}"] = (lambda b: lambda: b.refresh(score))(buf)
    r = interleaved(fns, R, S)
    out["SAC step/s"] = statistics.median(r["SAC step"])
    say(f"SAC gradient step (sample + update, 256x256): {1e3 / out['SAC step/s']:.2f} ms")
    for sweep in (4000, 2000, 1000):
        k = max(1, N // sweep)
        cost = median_ratio(r["SAC step"], r[f"amortized k={k}"])
        out[f"ARB amortized k={k} ms"] = 1e3 / statistics.median(r[f"amortized k={k}"])
        out[f"ARB amortized k={k} / SAC step"] = cost
        say(f"ARB amortized, {k:,} rows per step (sweep every {sweep} steps): "
            f"{out[f'ARB amortized k={k} ms']:.2f} ms = {100 * cost:.1f}% of a SAC step (target <= 10%)")
    buf = buffers[1000]
    r = interleaved({"uniform": lambda: uni.sample(BATCH), "amortized": lambda: buf.sample(BATCH)}, R, S)
    out["ARB amortized / uniform sample"] = median_ratio(r["amortized"], r["uniform"])
    say(f"ARB amortized-mode sample (sum tree) vs uniform: {out['ARB amortized / uniform sample']:.2f}x")


def reaper_vs_per(ctx, out) -> None:
    import cpprb

    from relive.replay import ReaPERSampler, ReplayBuffer

    N, rows, R, S = ctx["N"], ctx["rows"], ctx["rounds"], ctx["seconds"]
    td = np.random.default_rng(1).random(BATCH)

    def reaper(n: int):
        b = ReplayBuffer(n, (OBS,), (ACT,), sampler=ReaPERSampler(0.4, 0.2, 0.4), seed=0)
        b.extend({key: v[:n] for key, v in rows.items()})
        rng = np.random.default_rng(2)
        for a in range(0, n, 65536):  # every row gets a TD error of its own, as in a running buffer
            slots = np.arange(a, min(n, a + 65536))
            b.update(b.gather(slots).info, td_error=rng.random(slots.size))
        return b

    big = reaper(N)
    per = cpprb.PrioritizedReplayBuffer(N, {"obs": {"shape": OBS}, "act": {"shape": ACT}, "rew": {},
                                            "next_obs": {"shape": OBS}, "done": {}}, alpha=0.6)
    per.add(obs=rows["obs"], act=rows["action"], rew=rows["reward"], next_obs=rows["next_obs"],
            done=(rows["terminated"] | rows["truncated"]).astype(np.float32))

    def reaper_step():
        b = big.sample(BATCH)
        big.update(b.info, td_error=td)

    def cpprb_step():
        s = per.sample(BATCH, beta=0.4)
        per.update_priorities(s["indexes"], td)

    r = interleaved({"ReaPER": reaper_step, "cpprb": cpprb_step}, R, S)
    out["ReaPER sample+update/s"] = statistics.median(r["ReaPER"])
    out["cpprb PER sample+update/s"] = statistics.median(r["cpprb"])
    out["ReaPER / cpprb PER"] = median_ratio(r["ReaPER"], r["cpprb"])
    say(f"ReaPER sample + update {out['ReaPER sample+update/s']:,.0f}/s vs cpprb PER "
        f"{out['cpprb PER sample+update/s']:,.0f}/s: {out['ReaPER / cpprb PER']:.2f}x (target >= 1x)")

    small = reaper(10_000)

    def rows_recomputed(buf) -> float:  # an update recomputes each touched episode from its earliest updated row
        s, st = buf.sampler, buf.storage
        counts = []
        for _ in range(50):
            idx = buf.sample(BATCH).info.indices
            ep = st.meta["episode_id"][idx]
            pos = s._positions(idx)
            counts.append(sum(int(s.live_end[s._leaf_of(np.array([e]))[0]] - pos[ep == e].min())
                              for e in np.unique(ep)))
        return float(np.mean(counts))

    infos = {n: b.sample(BATCH).info for n, b in ((N, big), (10_000, small))}
    ones = {n: b.sample(1).info for n, b in ((N, big), (10_000, small))}
    r = interleaved({"update N": lambda: big.update(infos[N], td_error=td),
                     "update 10k": lambda: small.update(infos[10_000], td_error=td),
                     "1-row N": lambda: big.update(ones[N], td_error=td[:1]),
                     "1-row 10k": lambda: small.update(ones[10_000], td_error=td[:1])}, R, S)
    out["ReaPER update ms at N"] = 1e3 / statistics.median(r["update N"])
    out["ReaPER update ms at 10k"] = 1e3 / statistics.median(r["update 10k"])
    out["ReaPER update cost N / 10k"] = median_ratio(r["update 10k"], r["update N"])
    out["ReaPER rows recomputed per update at N"] = rows_recomputed(big)
    out["ReaPER rows recomputed per update at 10k"] = rows_recomputed(small)
    out["ReaPER 1-row update cost N / 10k"] = median_ratio(r["1-row 10k"], r["1-row N"])
    out["ReaPER 1-row update us at N"] = 1e6 / statistics.median(r["1-row N"])
    say(f"ReaPER update (batch {BATCH}): {out['ReaPER update ms at N']:.2f} ms at {N:,} rows vs "
        f"{out['ReaPER update ms at 10k']:.2f} ms at 10k: {out['ReaPER update cost N / 10k']:.2f}x "
        f"(target <= 1.5x); rows recomputed per update {out['ReaPER rows recomputed per update at N']:,.0f} vs "
        f"{out['ReaPER rows recomputed per update at 10k']:,.0f}")
    say(f"ReaPER one-row update: {out['ReaPER 1-row update us at N']:.0f} us at {N:,} rows, "
        f"{out['ReaPER 1-row update cost N / 10k']:.2f}x the cost at 10k rows")


SECTIONS = {"refresh": full_refresh, "sample": sampling, "amortized": amortized_mode, "reaper": reaper_vs_per}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=1.0, help="per measurement, per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    p.add_argument("--json", default="bench/out/adaptive_samplers.json")
    args = p.parse_args(argv)
    sections = args.sections.split(",")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")

    import torch

    from relive.replay import ARBSampler, ReplayBuffer, UniformSampler

    torch.set_num_threads(args.threads)
    N = args.rows
    rows = make_rows(N)
    actor, sac_update = build_sac()
    arb = ReplayBuffer(N, (OBS,), (ACT,), sampler=ARBSampler(temperature=5.0), seed=0)
    arb.extend(rows)
    arb.refresh(make_score_fn(actor, "standardized"))
    uni = ReplayBuffer(N, (OBS,), (ACT,), sampler=UniformSampler(), seed=0)
    uni.extend(rows)
    ctx = {"N": N, "rows": rows, "actor": actor, "sac_update": sac_update, "arb": arb, "uni": uni,
           "rounds": args.rounds, "seconds": args.seconds}
    out: dict = {"rows": N, "threads": args.threads, "rounds": args.rounds, "seconds": args.seconds,
                 "versions": {"python": platform.python_version(), "numpy": np.__version__,
                              "torch": torch.__version__, "cpprb": importlib.metadata.version("cpprb")}}
    for name in sections:
        SECTIONS[name](ctx, out)
    out["command"] = "python bench/adaptive_samplers.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
