"""A fingerprint of every preset's training: a seeded tiny run of each, the digest of what it logged.

Issue 29's check for a redesign that must not change behaviour: run this at the commit before and at the commit
after, on the same machine, and compare. Each preset trains a few hundred seeded steps (CartPole-v1 for the DQN
presets, MinAtar/Breakout-v1 and ALE/Pong-v5 for the image ones, FetchReach-v4 for the HER presets, Pendulum-v1 for
the rest; a tiny random Pendulum dataset for the offline ones, and a tiny BC base for residual SAC) in its own
process with one torch thread; the digest covers every logged value of metrics.jsonl and eval.csv except wall-clock
ones (``time/*``). Floating point differs between CPUs, so compare fingerprints
from one machine only.

    python bench/preset_fingerprint.py --out /tmp/before.json               # at the old commit
    python bench/preset_fingerprint.py --out /tmp/after.json --compare /tmp/before.json

Exit status 1 when ``--compare`` finds a preset whose logs differ (the first differing key is printed); a preset
that logs every old value unchanged plus new metrics counts as the same (the new keys are listed).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress", "--seed", "0",
        "--online-steps", "300", "--eval-every", "300", "--log-every", "100", "--checkpoint-every", "300"]
OFFLINE = ["--offline-steps", "60"]


def presets() -> list[str]:
    from relive.presets import PRESETS

    return sorted(PRESETS)


def preset_args(name: str, data: Path, base: Path) -> list[str]:
    if name == "ddqn_minatar":  # image Q-networks: their own envs (MinAtar's 10x10 planes, Atari's 84x84 frames)
        return ["--env", "MinAtar/Breakout-v1", "--warmup", "100"]
    if name.startswith("ddqn_atari"):
        return ["--env", "ALE/Pong-v5", "--warmup", "100"]
    if name.startswith("ddqn"):
        return ["--env", "CartPole-v1", "--warmup", "100"]
    if name.endswith("_her"):  # goal-conditioned (HER): Gymnasium-Robotics' FetchReach (MuJoCo 3.3.0)
        return ["--env", "FetchReach-v4", "--warmup", "100"]
    args = ["--env", "Pendulum-v1"]
    if name == "residual_sac":
        return [*args, "--dataset", str(data), "--base-policy", str(base), *OFFLINE, "--set", "agent.warmup=100",
                "--set", "agent.probe_max_steps=10"]
    if name.startswith("calql") or name == "wsrl_pretrain":  # (wsrl_pretrain: Cal-QL with WSRL's critics)
        return [*args, "--dataset", str(data), *OFFLINE, "--warmup", "0"]
    return [*args, "--warmup", "100"]


def make_inputs(work: Path) -> tuple[Path, Path]:
    """A tiny random Pendulum dataset (.npz, 4 episodes of 50 steps) and a BC base fitted to it."""
    import gymnasium as gym


    env, rng = gym.make("Pendulum-v1", max_episode_steps=50), np.random.default_rng(0)
    rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for ep in range(4):
        obs, _ = env.reset(seed=ep)
        for t in range(50):
            a = rng.uniform(-2, 2, size=1).astype(np.float32)
            nxt, r, term, _, _ = env.step(a)
            for k, v in zip(rows, (obs, a, r, nxt, term, t == 49), strict=True):
                rows[k].append(v)
            obs = nxt
    data = work / "pendulum.npz"  # (relive's .npz dataset format, written directly: the script runs on old commits)
    np.savez(data, **{k: np.asarray(v, bool if k in ("terminated", "truncated") else np.float32)
                      for k, v in rows.items()}, meta_env_id=np.asarray("Pendulum-v1"))
    base = work / "base"
    subprocess.run([sys.executable, "-m", "relive.cli", "bc", "--dataset", str(data), "--out", str(base), "--steps",
                    "50", "--eval-episodes", "0", "--no-progress"], check=True, capture_output=True, text=True)
    return data, base


def logged(run_dir: Path) -> dict[str, list]:
    """Every logged value by key, wall-clock keys dropped."""
    out: dict[str, list] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        for k, v in json.loads(line).items():
            if not k.startswith("time/"):
                out.setdefault(f"metrics:{k}", []).append(v)
    with open(run_dir / "eval.csv", newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if not k.startswith("time/") and "wall" not in k:
                    out.setdefault(f"eval:{k}", []).append(v)
    return out


def digest(values: dict[str, list]) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the fingerprint file to write (JSON)")
    p.add_argument("--compare", help="a fingerprint written before: report every preset whose logs differ")
    p.add_argument("--presets", nargs="+", help="only these presets (default: every registered one)")
    a = p.parse_args(argv)
    names = a.presets or presets()
    result: dict[str, dict] = {}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data, base = make_inputs(work)
        for i, name in enumerate(names):
            t0 = time.perf_counter()
            run = work / f"run-{name}"
            cmd = [sys.executable, "-m", "relive.cli", "train", name, *preset_args(name, data, base), *TINY,
                   "--run-dir", str(run)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                result[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
            else:
                values = logged(run)
                result[name] = {"digest": digest(values), "values": values}
            print(f"[{i + 1}/{len(names)}] {name}: {result[name].get('digest', result[name].get('error'))} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    Path(a.out).write_text(json.dumps({"presets": result, "python": sys.version.split()[0]}, indent=1))
    if not a.compare:
        return 0
    before = json.loads(Path(a.compare).read_text())["presets"]
    bad, new_names = 0, 0
    for name in names:
        old, new = before.get(name), result[name]
        if old is None:
            print(f"{name}: not in {a.compare} (a new preset: nothing to compare)")
            new_names += 1
            continue
        if old.get("digest") == new.get("digest") and old.get("error") == new.get("error"):
            continue
        ov, nv = old.get("values", {}), new.get("values", {})
        if not old.get("error") and not new.get("error") and set(ov) <= set(nv) \
                and all(nv[k] == v for k, v in ov.items()):  # every old value unchanged; only new metrics logged
            print(f"{name}: same values, new metrics {sorted(set(nv) - set(ov))}")
            continue
        bad += 1
        first = next((k for k in sorted(set(old.get("values", {})) | set(new.get("values", {})))
                      if old.get("values", {}).get(k) != new.get("values", {}).get(k)), None)
        print(f"{name}: DIFFERS ({old.get('digest') or old.get('error')} -> {new.get('digest') or new.get('error')}; "
              f"first differing key: {first})")
    compared = len(names) - new_names
    print(f"{compared - bad} of {compared} presets log the same values" + (f"; {bad} differ" if bad else "")
          + (f"; {new_names} new" if new_names else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
