"""A bit-level fingerprint of ResidualSAC's updates: seeded update sequences, the SHA-256 of every number they leave.

The check for a change to ``relive.agents.residual_sac`` that must not change what its update computes (issue 48
item 3: ResidualSAC shares SAC's losses and steps). Each case builds a small agent on a fixed linear base policy,
runs Cal-QL critic pre-training steps (the offline phase) and then online updates on seeded batches with
non-uniform importance weights, and digests, after every update, the agent's whole ``state_dict()`` (parameters,
target critics, log alpha, optimizer moments, generators, counters), the metrics and the ``td_error`` signal.
Floating point differs between CPUs and torch builds, so compare fingerprints from one machine only:

    PYTHONPATH=/tmp/old/src python bench/residual_sac_fingerprint.py --out /tmp/before.json   # the old code
    PYTHONPATH=src python bench/residual_sac_fingerprint.py --out /tmp/after.json --compare /tmp/before.json

Exit status 1 when ``--compare`` finds a case whose digests differ (the first differing update is printed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

OBS, ACT = 5, 2
BATCH = int(os.environ.get("FINGERPRINT_BATCH", "30"))  # not a power of two: a sum / B and a sum of x / B round apart
LOW, HIGH = -np.ones(ACT, np.float32), np.ones(ACT, np.float32)
# (name, config overrides, offline steps, online steps, n-step batches)
CASES = [
    ("defaults", {}, 4, 12, False),
    ("no_grad_clip", {"grad_clip_norm": 0.0}, 2, 8, False),
    ("actor_every_2_table5", {"actor_every": 2, "init_temperature": 1.0}, 0, 10, False),
    ("fixed_temperature", {"learn_temperature": False}, 0, 6, False),
    ("otf_1_three_critics", {"otf_candidates": 1, "num_qs": 3, "critic_layer_norm": False}, 0, 6, False),
    ("uncalibrated_beta_linear", {"calibrate": False, "beta_schedule": "linear", "beta_ramp_steps": 5}, 3, 6, False),
    ("n_step_3", {"n_step": 3, "residual_input": "obs"}, 0, 6, True),
]


class LinearBase:
    """A fixed base policy a = clip(x W + b) on NumPy arrays."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.w = (0.3 * rng.normal(size=(OBS, ACT))).astype(np.float32)
        self.b = (0.1 * rng.normal(size=ACT)).astype(np.float32)

    def __call__(self, obs):
        return np.clip(np.asarray(obs, np.float32) @ self.w + self.b, LOW, HIGH)


def batch(rng: np.random.Generator, n_step: bool):
    from relive.types import Batch, SampleInfo

    n = BATCH
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n),
                      rng.uniform(0.2, 1.0, n).astype(np.float32), np.zeros(n, np.int8))
    terminated = rng.random(n) < 0.2
    extras = {"mc_return": rng.normal(size=n).astype(np.float32)}
    discount = None
    if n_step:  # what a buffer with n_step = 3 hands over: gamma^{n'} (1 - terminated), n' in 1..3
        discount = (0.99 ** rng.integers(1, 4, n) * (1.0 - terminated)).astype(np.float32)
    return Batch(obs=rng.normal(size=(n, OBS)).astype(np.float32),
                 action=rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32),
                 reward=rng.normal(size=n).astype(np.float32),
                 next_obs=rng.normal(size=(n, OBS)).astype(np.float32),
                 terminated=terminated, truncated=np.zeros(n, bool), info=info, extras=extras,
                 discount=discount)


def digest(tree, h) -> None:
    """Feed every leaf of a nested state (dicts, lists, arrays, tensors, numbers, strings) into ``h``."""
    if isinstance(tree, dict):
        for k in sorted(tree, key=str):
            h.update(str(k).encode())
            digest(tree[k], h)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            digest(v, h)
    elif torch.is_tensor(tree):
        digest(tree.detach().cpu().numpy(), h)
    elif isinstance(tree, np.ndarray):
        h.update(str((tree.dtype.str, tree.shape)).encode())
        h.update(np.ascontiguousarray(tree).tobytes())
    else:
        h.update(repr(tree).encode())


def run_case(overrides: dict, offline: int, online: int, n_step: bool) -> list[str]:
    from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig

    cfg = ResidualSACConfig(**({"hidden": (16, 16), "warmup": 0, "probe_max_steps": 0} | overrides))
    agent = ResidualSAC(OBS, ACT, LOW, HIGH, cfg, seed=3, base_policy=LinearBase())
    rng = np.random.default_rng(7)
    agent.num_env_steps = 2  # (beta_t's clock: a linear schedule moves)
    out = []
    agent.on_phase("offline")
    for step in range(offline + online):
        if step == offline:
            agent.on_phase("online")
        result = agent.update(batch(rng, n_step))
        agent.num_env_steps += 1
        h = hashlib.sha256()
        digest(agent.state_dict(), h)
        metrics = result.metrics
        metrics = dict(metrics.items()) if hasattr(metrics, "items") else metrics
        digest({k: float(v) for k, v in metrics.items()}, h)
        digest(dict(result.signals), h)
        out.append(h.hexdigest())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where to write the fingerprint (JSON)")
    p.add_argument("--compare", help="an earlier fingerprint to compare with (exit 1 on a difference)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    import relive

    result = {"torch": torch.__version__, "relive": str(Path(relive.__file__).parent), "cases": {}}
    for name, overrides, offline, online, n_step in CASES:
        result["cases"][name] = run_case(overrides, offline, online, n_step)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{len(CASES)} cases, {sum(len(v) for v in result['cases'].values())} updates -> {args.out} "
          f"(relive at {result['relive']})")
    if not args.compare:
        return 0
    old = json.loads(Path(args.compare).read_text())
    bad = 0
    for name, digests in result["cases"].items():
        before = old["cases"].get(name)
        if before is None:
            print(f"{name}: not in {args.compare}")
            bad += 1
            continue
        first = next((i for i, (a, b) in enumerate(zip(before, digests, strict=True)) if a != b), None)
        if first is not None:
            print(f"{name}: differs from update {first} on (of {len(digests)})")
            bad += 1
        else:
            print(f"{name}: {len(digests)} updates bit-identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
