"""relive's buffers inside Stable-Baselines3 and TorchRL, against those libraries' own buffers (issue 31).

    python bench/integrations.py                 # both parts (~4 minutes on a 2-core Xeon)
    python bench/integrations.py --part sb3 --rounds 3

SB3: the buffer calls of one training iteration (adds + a sample, no networks; best of windows, steadier on a
shared machine), then ``model.learn(N)`` steps per second of DQN (CartPole-v1) and SAC (Pendulum-v1) with SB3's own
ReplayBuffer, with relive's ``ReliveReplayBuffer`` (uniform) under SB3's own algorithm, and with relive's DQN / SAC
subclasses and PER (IS weights + TD-error feedback). The variants run interleaved, round by round, in one process,
each a fresh seeded model; the median over rounds is reported, with relive / SB3 ratios (> 1: relive faster).

``--part sb3-chunks``: the end-to-end effect resolved finer. One model per variant (SB3's buffer, relive's buffer
under SB3's algorithm), built once and warmed past ``learning_starts``; then ``learn(chunk,
reset_num_timesteps=False)`` alternates between them, ``--chunk-rounds`` times, each chunk timed in process CPU time.
A round's ratio compares two chunks a fraction of a second apart, so the machine's drift (+-25% between whole runs
here) cancels; the median ratio and a bootstrap 95% interval over rounds are reported.

TorchRL: microseconds per ``extend`` (a 100-transition batch), ``sample(256)`` and ``update_priority`` on a full
100,000-row buffer (HalfCheetah-shaped: observation 17, action 6), relive's buffer against TorchRL's
``TensorDictReplayBuffer(LazyTensorStorage)``; TorchRL's prioritized buffer is tried and reported when it loads.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import warnings

import numpy as np
import torch

from _timing import best_us


def sb3_buffer_calls(calls: int, repeats: int) -> dict:
    """The buffer's share of a training iteration, without the networks (steadier than ``learn`` on a shared
    machine): DQN's default (train_freq 4): 4 ``add`` + ``sample(32)``; SAC's (train_freq 1): ``add`` +
    ``sample(256)``; best of ``repeats`` windows (alternating between the buffers), microseconds, on a buffer of
    10,000 stored rows."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer

    from relive.integrations.sb3 import ReliveReplayBuffer

    out = {}
    for env_id, adds, batch in (("CartPole-v1", 4, 32), ("Pendulum-v1", 1, 256)):
        env = gym.make(env_id)
        obs = np.zeros((1, *env.observation_space.shape), np.float32)
        act = np.zeros((1, 1), np.int64 if env_id == "CartPole-v1" else np.float32)
        row = (obs, obs, act, np.zeros(1, np.float32), np.zeros(1, bool), [{}])
        iterations = {}
        for name, cls in (("SB3 ReplayBuffer", ReplayBuffer), ("relive ReliveReplayBuffer", ReliveReplayBuffer)):
            buf = cls(100_000, env.observation_space, env.action_space, device="cpu")
            for _ in range(10_000):
                buf.add(*row)

            def iteration(buf=buf, adds=adds, row=row, batch=batch):
                for _ in range(adds):
                    buf.add(*row)
                buf.sample(batch)

            iterations[name] = iteration
        # windows of the two buffers alternate (a shared machine's load hits both alike); the best window of each
        best = {name: float("inf") for name in iterations}
        for _ in range(repeats):
            for name, fn in iterations.items():
                best[name] = min(best[name], best_us(fn, calls, 1))
        res = {name: round(v, 1) for name, v in best.items()}
        res["ratio_sb3_over_relive"] = round(res["SB3 ReplayBuffer"] / res["relive ReliveReplayBuffer"], 3)
        out[f"{env_id}: {adds} add + sample({batch}), us"] = res
        print(env_id, res, flush=True)
    return out


def sb3_part(rounds: int, dqn_steps: int, sac_steps: int) -> dict:
    import gymnasium as gym
    import stable_baselines3 as sb3

    from relive.integrations import sb3 as rsb3
    from relive.replay import PrioritizedSampler

    def variants(algo: str):
        plain, ours = getattr(sb3, algo), getattr(rsb3, algo)
        return {
            "SB3 ReplayBuffer": lambda env, kw: plain("MlpPolicy", env, **kw),
            "relive buffer (uniform), SB3's algorithm": lambda env, kw: plain(
                "MlpPolicy", env, replay_buffer_class=rsb3.ReliveReplayBuffer, **kw),
            "relive buffer (PER) + relive's subclass": lambda env, kw: ours(
                "MlpPolicy", env, replay_buffer_kwargs=dict(sampler=PrioritizedSampler()), **kw),
        }

    setups = {
        "DQN CartPole-v1": ("DQN", "CartPole-v1", dqn_steps, dict(learning_starts=100)),
        "SAC Pendulum-v1": ("SAC", "Pendulum-v1", sac_steps, dict(learning_starts=100)),
    }
    out = {}
    for name, (algo, env_id, steps, kw) in setups.items():
        runs: dict[str, list[float]] = {v: [] for v in variants(algo)}
        for r in range(rounds):
            for v, make in variants(algo).items():
                model = make(gym.make(env_id), dict(kw, seed=r))
                start = time.perf_counter()
                model.learn(steps)
                runs[v].append(steps / (time.perf_counter() - start))
        med = {v: statistics.median(x) for v, x in runs.items()}
        base = med["SB3 ReplayBuffer"]
        out[name] = {v: {"steps_per_s": round(m, 1), "runs": [round(x, 1) for x in runs[v]],
                         "ratio_to_sb3": round(m / base, 3)} for v, m in med.items()}
        print(name, json.dumps(out[name], indent=1), flush=True)
    return out


def sb3_chunks(rounds: int, dqn_chunk: int, sac_chunk: int, seed: int = 0) -> dict:
    import gymnasium as gym
    import stable_baselines3 as sb3

    from relive.integrations.sb3 import ReliveReplayBuffer

    out = {}
    for name, algo, env_id, chunk in (("DQN CartPole-v1", "DQN", "CartPole-v1", dqn_chunk),
                                      ("SAC Pendulum-v1", "SAC", "Pendulum-v1", sac_chunk)):
        cls = getattr(sb3, algo)
        models = {
            "SB3 ReplayBuffer": cls("MlpPolicy", gym.make(env_id), learning_starts=100, buffer_size=100_000,
                                    seed=seed),
            "relive buffer (uniform), SB3's algorithm": cls("MlpPolicy", gym.make(env_id), learning_starts=100,
                                                            buffer_size=100_000, seed=seed,
                                                            replay_buffer_class=ReliveReplayBuffer),
        }
        for m in models.values():  # past learning_starts: every chunk trains
            m.learn(max(200, 2 * chunk))
        rates: dict[str, list[float]] = {v: [] for v in models}
        for _ in range(rounds):
            for v, m in models.items():
                start = time.process_time()
                m.learn(chunk, reset_num_timesteps=False)
                rates[v].append(chunk / (time.process_time() - start))
        base, ours = np.array(rates["SB3 ReplayBuffer"]), np.array(rates["relive buffer (uniform), SB3's algorithm"])
        ratios = ours / base
        boot = np.random.default_rng(0).choice(ratios, (2000, ratios.size)).mean(axis=1)
        out[name] = {"chunk_steps": chunk, "rounds": rounds,
                     "steps_per_cpu_s": {v: round(statistics.median(r), 1) for v, r in rates.items()},
                     "ratio_relive_over_sb3_median": round(float(np.median(ratios)), 4),
                     "ratio_mean": round(float(ratios.mean()), 4),
                     "ratio_mean_95ci": [round(float(x), 4) for x in np.percentile(boot, [2.5, 97.5])]}
        print(name, json.dumps(out[name]), flush=True)
    return out


def _transitions(n: int, rng: np.random.Generator):
    from tensordict import TensorDict

    done = torch.as_tensor(rng.random((n, 1)) < 0.001)
    return TensorDict({
        "observation": torch.as_tensor(rng.standard_normal((n, 17), dtype=np.float32)),
        "action": torch.as_tensor(rng.uniform(-1, 1, (n, 6)).astype(np.float32)),
        "next": TensorDict({"observation": torch.as_tensor(rng.standard_normal((n, 17), dtype=np.float32)),
                            "reward": torch.as_tensor(rng.standard_normal((n, 1), dtype=np.float32)),
                            "done": done, "terminated": done, "truncated": torch.zeros(n, 1, dtype=torch.bool)},
                           batch_size=[n]),
    }, batch_size=[n])


def torchrl_part(rows: int, calls: int, repeats: int) -> dict:
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from relive.integrations.torchrl import ReliveTensorDictReplayBuffer
    from relive.replay import PrioritizedSampler, UniformSampler

    rng = np.random.default_rng(0)
    fill, chunk = _transitions(rows, rng), _transitions(100, rng)
    priority = torch.rand(256) + 0.1
    buffers = {
        "TorchRL TensorDictReplayBuffer(LazyTensorStorage), uniform":
            TensorDictReplayBuffer(storage=LazyTensorStorage(rows), batch_size=256),
        "relive, uniform": ReliveTensorDictReplayBuffer(rows, sampler=UniformSampler(), batch_size=256),
        "relive, PER": ReliveTensorDictReplayBuffer(rows, sampler=PrioritizedSampler(), batch_size=256),
    }
    try:
        from torchrl.data import TensorDictPrioritizedReplayBuffer

        buffers["TorchRL TensorDictPrioritizedReplayBuffer"] = TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=LazyTensorStorage(rows), batch_size=256)
        per_error = None
    except Exception as e:  # torch 2.13: "SumSegmentTreeFp32 is not available"
        per_error = f"{type(e).__name__}: {e}"
        print("TorchRL's TensorDictPrioritizedReplayBuffer does not load:", per_error)
    out: dict = {"torchrl_per_error": per_error}
    for name, rb in buffers.items():
        for part in fill.split(10_000):
            rb.extend(part)
        last = {}

        def sample(rb=rb, last=last):
            last["td"] = rb.sample()

        def update(rb=rb, last=last):
            rb.update_priority(last["td"]["index"], priority)

        res = {"extend_100_us": best_us(lambda rb=rb: rb.extend(chunk), calls, repeats),
               "sample_256_us": best_us(sample, calls, repeats)}
        if "uniform" not in name:
            res["update_priority_256_us"] = best_us(update, calls, repeats)
        out[name] = {k: round(v, 1) for k, v in res.items()}
        print(name, out[name], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("all", "sb3", "sb3-buffer", "sb3-chunks", "torchrl"), default="all",
                   help="sb3-buffer: only the SB3 buffer calls (no learn())")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chunk-rounds", type=int, default=40, help="sb3-chunks: alternations of the two models")
    p.add_argument("--dqn-chunk", type=int, default=400, help="sb3-chunks: DQN env steps per chunk")
    p.add_argument("--sac-chunk", type=int, default=20, help="sb3-chunks: SAC env steps per chunk")
    p.add_argument("--dqn-steps", type=int, default=2000)
    p.add_argument("--sac-steps", type=int, default=300)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    res: dict = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    if args.part in ("all", "sb3", "sb3-buffer"):
        res["sb3_buffer_calls"] = sb3_buffer_calls(args.calls, args.repeats)
    if args.part in ("all", "sb3"):
        res["sb3"] = sb3_part(args.rounds, args.dqn_steps, args.sac_steps)
    if args.part == "sb3-chunks":
        res["sb3_chunks"] = sb3_chunks(args.chunk_rounds, args.dqn_chunk, args.sac_chunk)
    if args.part in ("all", "torchrl"):
        res["torchrl"] = torchrl_part(args.rows, args.calls, args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
