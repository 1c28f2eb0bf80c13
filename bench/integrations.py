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
here) cancels; the median ratio and a bootstrap 95% interval over rounds are reported. A third model on SB3's own
buffer (another seed) is the control: its ratio to the first is what two models of one configuration differ by.

``--part sb3-split``: where DQN's gap goes -- the time inside ``replay_buffer.sample`` and in the rest of ``train()``
per env step, with two more variants that run both buffers side by side (one's batches, both's work), which tells a
gradient step slowed by the buffer's data from one slowed by the work done between the steps.

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
            # the control: a second model on SB3's buffer (A/A) -- what two models of one configuration differ by
            "SB3 ReplayBuffer, second model": cls("MlpPolicy", gym.make(env_id), learning_starts=100,
                                                  buffer_size=100_000, seed=seed + 1),
        }
        for m in models.values():  # past learning_starts: every chunk trains
            m.learn(max(200, 2 * chunk))
        rates: dict[str, list[float]] = {v: [] for v in models}
        for _ in range(rounds):
            for v, m in models.items():
                start = time.process_time()
                m.learn(chunk, reset_num_timesteps=False)
                rates[v].append(chunk / (time.process_time() - start))
        base = np.array(rates["SB3 ReplayBuffer"])
        ratios = np.array(rates["relive buffer (uniform), SB3's algorithm"]) / base
        control = np.array(rates["SB3 ReplayBuffer, second model"]) / base
        boot = np.random.default_rng(0).choice(ratios, (2000, ratios.size)).mean(axis=1)
        boot_control = np.random.default_rng(1).choice(control, (2000, control.size)).mean(axis=1)
        out[name] = {"chunk_steps": chunk, "rounds": rounds,
                     "steps_per_cpu_s": {v: round(statistics.median(r), 1) for v, r in rates.items()},
                     "ratio_relive_over_sb3_median": round(float(np.median(ratios)), 4),
                     "ratio_mean": round(float(ratios.mean()), 4),
                     "ratio_mean_95ci": [round(float(x), 4) for x in np.percentile(boot, [2.5, 97.5])],
                     "control_sb3_second_model_over_sb3_median": round(float(np.median(control)), 4),
                     "control_mean_95ci": [round(float(x), 4) for x in np.percentile(boot_control, [2.5, 97.5])]}
        print(name, json.dumps(out[name]), flush=True)
    return out


def _timed(fn, acc: dict, key: str):
    """``fn`` adding its wall-clock time to ``acc[key]``."""
    def timed(*a, **k):
        start = time.perf_counter()
        out = fn(*a, **k)
        acc[key] += time.perf_counter() - start
        return out
    return timed


def sb3_split(rounds: int, chunk: int, seed: int = 0) -> dict:
    """Where DQN's end-to-end gap goes: per env step, the time inside ``replay_buffer.sample`` and the rest of
    ``train()`` (SB3's gradient step), for four warmed models run in alternating ``learn`` chunks (wall clock): SB3's
    buffer; relive's; SB3's buffer with relive's buffer beside it doing the same adds and samples (SB3's batches,
    relive's work); relive's buffer with SB3's beside it. Whether a slower gradient step follows the data or the work
    done between the steps (cache and allocator state: the buffer's in-situ cost beyond its own calls)."""
    import gymnasium as gym
    import stable_baselines3 as sb3
    from stable_baselines3.common.buffers import ReplayBuffer

    from relive.integrations.sb3 import ReliveReplayBuffer

    def beside(main, other):  # ``main``'s batches, ``other``'s work too
        class Both(main):
            def __init__(self, *a, **k):
                super().__init__(*a, **k)
                self.shadow = other(*a, **k)

            def add(self, *a, **k):
                super().add(*a, **k)
                self.shadow.add(*a, **k)

            def sample(self, *a, **k):
                self.shadow.sample(*a, **k)
                return super().sample(*a, **k)
        return Both

    variants = {"SB3 ReplayBuffer": ReplayBuffer, "relive ReliveReplayBuffer": ReliveReplayBuffer,
                "SB3's batches, relive's buffer beside": beside(ReplayBuffer, ReliveReplayBuffer),
                "relive's batches, SB3's buffer beside": beside(ReliveReplayBuffer, ReplayBuffer)}
    spent: dict[str, dict[str, float]] = {v: {"learn": 0.0, "train": 0.0, "sample": 0.0} for v in variants}
    models = {}
    for v, cls in variants.items():
        m = sb3.DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=100, buffer_size=100_000, seed=seed,
                    replay_buffer_class=cls)
        m.learn(2 * chunk)
        for obj, attr in ((m.replay_buffer, "sample"), (m, "train")):
            setattr(obj, attr, _timed(getattr(obj, attr), spent[v], attr))
        models[v] = m
    for _ in range(rounds):
        for v, m in models.items():
            start = time.perf_counter()
            m.learn(chunk, reset_num_timesteps=False)
            spent[v]["learn"] += time.perf_counter() - start
    steps = rounds * chunk
    out = {v: {"learn_us": round(t["learn"] * 1e6 / steps, 1), "sample_us": round(t["sample"] * 1e6 / steps, 1),
               "train_minus_sample_us": round((t["train"] - t["sample"]) * 1e6 / steps, 1)}
           for v, t in spent.items()}
    for v, r in out.items():
        print(f"{v:40s} per env step: learn {r['learn_us']:7.1f} us, inside sample {r['sample_us']:6.1f} us, "
              f"rest of train() {r['train_minus_sample_us']:7.1f} us", flush=True)
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
    p.add_argument("--part", choices=("all", "sb3", "sb3-buffer", "sb3-chunks", "sb3-split", "torchrl"), default="all",
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
    if args.part == "sb3-split":
        res["sb3_split"] = sb3_split(args.chunk_rounds // 4 or 1, args.dqn_chunk)
    if args.part in ("all", "torchrl"):
        res["torchrl"] = torchrl_part(args.rows, args.calls, args.repeats)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
