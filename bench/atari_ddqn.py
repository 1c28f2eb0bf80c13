"""Where the time of an Atari-100k DDQN run goes (issue 45), component by component, in one process.

    python bench/atari_ddqn.py --threads 1 --rows 5000 --rounds 5 --seconds 3 --json /tmp/atari_ddqn.json

The ``ddqn_atari100k`` preset (DrQ(epsilon)'s setting: one gradient step of batch 32 per env step, the Nature CNN,
Adam, a target copy every gradient step, 10 full evaluation games every 10k steps) on ``ALE/Pong-v5``:

1. **Components** (CPU and wall milliseconds a call; CPU time is the process's, which leaves out the time other
   jobs of a loaded machine took, and with 2 threads counts both): the training env's step (ALE, frame skip 4 with
   max-pooling, 84x84 grey, episodic life, the 4-frame stack; random actions), ``act`` (one forward of one stack),
   ``extend`` of one row (the frame-stack storage: each frame once), ``sample(32)`` (stacks rebuilt), and the
   update broken down: the batch to torch, the online forward of s with the loss, the target computation (online
   forward of s'; the target forward of s' only when the target net does not hold the online weights -- never
   with a target copy every step), backward, the optimizer step, the target copy; the evaluation env's step with
   ``act(explore=False)``; the length of one full evaluation game of the untrained agent (eval epsilon 0.001); a
   checkpoint of ``--rows`` rows (agent, buffer).
2. **Updates side by side**, alternating ``--rounds`` rounds of ``--seconds`` each (a loaded machine changes
   slowly compared with a round; the median of the per-round ratios): relive's update as the presets run it
   (``default``), as it ran before the target forward was reused (``before``: the target forward forced), with the
   opt-in speed flags (``fast``: ``agent.fused_adam`` and ``agent.channels_last``, float rounding away), and a plain
   PyTorch update written here the way CleanRL's ``dqn_atari.py`` writes one (``cleanrl_dqn``: its max-over-target
   target and MSE loss, two forwards; ``cleanrl_ddqn``: the same loop with Double DQN's target and the Huber loss,
   the work relive's update does).
3. **The 100k estimate** from the components: 1,600 warm-up steps (random actions, no updates), 98,400 steps of
   act + env + extend + sample + update, 10 evaluations of 10 games of the measured length, checkpoints at 25k,
   50k, 75k and 100k rows (scaled from ``--rows``). The loop's own Python (cadences, logging, chunk bookkeeping) is
   not in it: a real ``relive train`` run measures it (docs/benchmarks.md, "Atari-100k wall time").
4. (``--thread-counts 1 2``) ``default`` and ``fast`` updates at each torch thread count, alternating rounds: the
   wall time is what a run on an idle machine gets from a second thread; the CPU time (both threads counted) says
   how much of the second core the update uses, which a loaded machine does not hide.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ENV_ID = "ALE/Pong-v5"
BATCH = 32
STEPS, WARMUP, EVALS, EVAL_GAMES = 100_000, 1600, 10, 10  # the ddqn_atari100k preset's budget and protocol
CHECKPOINT_ROWS = (25_000, 50_000, 75_000, 100_000)  # buffer rows at its checkpoints (every 25k env steps)


def clock(fn, calls: int) -> tuple[float, float]:
    """(CPU ms, wall ms) a call of ``fn`` over ``calls`` calls."""
    w, c = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return 1e3 * (time.process_time() - c) / calls, 1e3 * (time.perf_counter() - w) / calls


def timed_for(fn, seconds: float) -> tuple[float, float, int]:
    """(CPU ms, wall ms, calls) a call of ``fn`` over about ``seconds`` of wall time."""
    w, c, n = time.perf_counter(), time.process_time(), 0
    while True:
        fn()
        n += 1
        if time.perf_counter() - w >= seconds:
            return 1e3 * (time.process_time() - c) / n, 1e3 * (time.perf_counter() - w) / n, n


class Parts:
    """Accumulated (CPU, wall) seconds by name."""

    def __init__(self):
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}
        self.calls = 0

    def run(self, name, fn):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
        self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
        return out

    def ms(self) -> dict[str, tuple[float, float]]:
        return {k: (1e3 * self.cpu[k] / self.calls, 1e3 * self.wall[k] / self.calls) for k in self.cpu}


def update_parts(agent, buffer, calls: int) -> dict[str, tuple[float, float]]:
    """relive's DDQN update (``DDQN.update``'s steps, in its order) with each step timed: CPU / wall ms a call."""
    import torch

    from relive.agents import networks as nets

    p = Parts()
    for _ in range(calls):
        batch = p.run("sample(32)", lambda: buffer.sample(BATCH))
        b = p.run("update: batch to torch", lambda batch=batch: agent.batch_to_torch(batch))
        reward = torch.sign(b.reward) if agent.cfg.clip_reward else b.reward
        y = p.run("update: target (online fwd of s'; target fwd skipped while synced)",
                  lambda b=b, reward=reward: agent.target(reward, b.next_obs, b.terminated,
                                                          nets.td_discount(b, agent.cfg.n_step, "DDQN")))

        def forward(b=b, y=y):
            per_sample, q = agent.loss(b, y)
            return nets.weighted_mean(per_sample, nets.is_weight_of(b))

        loss = p.run("update: online fwd of s + loss", forward)

        def backward(loss=loss):
            agent.opt.zero_grad(set_to_none=True)
            loss.backward()

        p.run("update: backward", backward)
        p.run("update: optimizer step", agent.opt.step)
        agent.target_synced = False
        agent.num_updates += 1
        p.run("update: target copy", agent.copy_target)
        p.calls += 1
    return p.ms()


class CleanRLUpdate:
    """One DQN update as CleanRL's ``dqn_atari.py`` writes it (a plain PyTorch loop, written here): the target under
    ``no_grad`` from the target network, the online Q of the taken actions, the loss, ``zero_grad`` / ``backward``
    / ``step``, then the target copied parameter by parameter (``tau`` = 1). ``double``: Double DQN's target (the
    online network's argmax of s', evaluated by the target network) and the Huber loss, as relive's update; else
    CleanRL's own: the target network's max and the MSE loss."""

    def __init__(self, q_network, lr: float, eps: float, gamma: float, double: bool):
        import torch

        self.q_network = copy.deepcopy(q_network)
        self.target_network = copy.deepcopy(q_network)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=lr, eps=eps)
        self.gamma, self.double = gamma, double

    def __call__(self, obs, actions, rewards, next_obs, dones) -> float:
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            if self.double:
                next_actions = self.q_network(next_obs).argmax(dim=1, keepdim=True)
                target_max = self.target_network(next_obs).gather(1, next_actions).squeeze(1)
            else:
                target_max, _ = self.target_network(next_obs).max(dim=1)
            td_target = torch.sign(rewards) + self.gamma * target_max * (1 - dones)
        old_val = self.q_network(obs).gather(1, actions.view(-1, 1)).squeeze(1)
        loss = F.huber_loss(old_val, td_target) if self.double else F.mse_loss(td_target, old_val)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        for target_param, q_param in zip(self.target_network.parameters(), self.q_network.parameters(),
                                         strict=True):
            target_param.data.copy_(q_param.data)
        return float(loss.detach())


def fill(env, buffer, rows: int, rng) -> tuple[float, float, float, float]:
    """``rows`` random-action steps of the training env into ``buffer``: (env CPU ms, env wall ms, extend CPU ms,
    extend wall ms) a step."""
    obs, _ = env.reset(seed=0)
    p = Parts()
    n = env.action_space.n
    for _ in range(rows):
        a = int(rng.integers(n))
        next_obs, r, term, trunc, _ = p.run("env", lambda a=a: env.step(a))
        row = {"obs": obs[None], "action": np.array([a]), "reward": np.array([r], np.float32),
               "next_obs": next_obs[None], "terminated": np.array([term]), "truncated": np.array([trunc])}
        p.run("extend", lambda row=row: buffer.extend(row))
        obs = next_obs
        if term or trunc:
            obs, _ = env.reset()
        p.calls += 1
    ms = p.ms()
    return (*ms["env"], *ms["extend"])


def eval_game(env, agent, seed: int) -> tuple[int, float, float, float]:
    """One full evaluation game (``act(explore=False)``: eval epsilon): (steps, return, CPU ms, wall ms a step)."""
    obs, _ = env.reset(seed=seed)
    steps, total, done = 0, 0.0, False
    w, c = time.perf_counter(), time.process_time()
    while not done:
        obs, r, term, trunc, _ = env.step(int(agent.act(obs, explore=False)))
        total += float(r)
        steps += 1
        done = term or trunc
    return steps, total, 1e3 * (time.process_time() - c) / steps, 1e3 * (time.perf_counter() - w) / steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the preset's run.num_threads: 1)")
    p.add_argument("--rows", type=int, default=5000, help="real Pong rows in the buffer the batches come from")
    p.add_argument("--calls", type=int, default=60, help="timed updates of the component breakdown")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds of the update comparison")
    p.add_argument("--seconds", type=float, default=3.0, help="seconds of each contender in a round")
    p.add_argument("--eval-games", type=int, default=1, help="full evaluation games played to measure their length")
    p.add_argument("--thread-counts", type=int, nargs="*", default=[],
                   help="section 4: the update at these torch thread counts (e.g. 1 2), alternating rounds")
    p.add_argument("--json", help="write the results here (JSON)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from relive.agents.ddqn import DDQN
    from relive.envs import env_spec, make_env
    from relive.presets import ddqn_atari100k
    from relive.replay import ReplayBuffer
    from relive.replay.storage import FrameStack
    from relive.train.checkpoint import save_checkpoint
    from relive.train.malloc import retain_freed_memory

    retain_freed_memory()  # as the trainer does
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch {torch.__version__}, {a.threads} thread(s)")
    cfg = ddqn_atari100k()
    env, eval_env = make_env(ENV_ID), make_env(ENV_ID, evaluation=True)
    spec = env_spec(env)

    def agent_of(**flags):
        agent_cfg = replace(cfg.agent, **flags)
        agent = DDQN.from_spec(spec, agent_cfg, seed=0)
        agent.num_act_steps = agent_cfg.eps_decay_steps  # epsilon at its floor (0.01), as after step 6,600
        return agent

    agent = agent_of()
    buffer = ReplayBuffer(a.rows, spec.obs_shape, spec.action_shape, obs_dtype=spec.obs_dtype, seed=0,
                          action_dtype=np.int64, frame_stack=FrameStack.gymnasium(4))
    rng = np.random.default_rng(0)
    comp: dict[str, tuple[float, float]] = {}
    env_cpu, env_wall, ext_cpu, ext_wall = fill(env, buffer, a.rows, rng)
    comp["env step (training env, random actions)"] = (env_cpu, env_wall)
    comp["extend (one row)"] = (ext_cpu, ext_wall)
    obs, _ = env.reset(seed=1)
    comp["act (explore, epsilon 0.01)"] = clock(lambda: agent.act(obs, explore=True), 300)
    for _ in range(5):  # (warm-up: the optimizer's state, oneDNN's kernels)
        agent.update(buffer.sample(BATCH))
    comp |= update_parts(agent, buffer, a.calls)
    comp["update (DDQN.update, sampled batch excluded)"] = clock(lambda: agent.update(buffer.sample(BATCH)), a.calls)
    sample_cpu, sample_wall = comp["sample(32)"]
    up_cpu, up_wall = comp["update (DDQN.update, sampled batch excluded)"]
    comp["update (DDQN.update, sampled batch excluded)"] = (up_cpu - sample_cpu, up_wall - sample_wall)
    games = [eval_game(eval_env, agent, seed=100 + i) for i in range(a.eval_games)]
    game_steps = float(np.mean([g[0] for g in games]))
    comp["eval step (full-game env + act)"] = (float(np.mean([g[2] for g in games])),
                                               float(np.mean([g[3] for g in games])))
    comp["buffer.stats() (a log row)"] = clock(buffer.stats, 20)
    with tempfile.TemporaryDirectory() as tmp:
        tree = {"agent": agent.state_dict(), "buffer": buffer.state_dict()}
        comp[f"checkpoint ({a.rows} rows)"] = clock(lambda: save_checkpoint(Path(tmp), tree), 2)
    print(f"\n1. components ({a.rows} rows of random-action Pong; an evaluation game of the untrained agent: "
          f"{game_steps:.0f} steps, return {np.mean([g[1] for g in games]):.0f})")
    print(f"{'component':66s} {'CPU ms':>8s} {'wall ms':>8s}")
    for k, (c, w) in comp.items():
        print(f"{k:66s} {c:8.3f} {w:8.3f}")

    # 2. the updates side by side, alternating rounds
    batches = [buffer.sample(BATCH) for _ in range(64)]
    contenders = {"default": agent_of(), "before": agent_of(),
                  "fast": agent_of(fused_adam=True, channels_last=True)}
    peers = {"cleanrl_dqn": CleanRLUpdate(agent.q, cfg.agent.lr, cfg.agent.optimizer_eps, cfg.agent.gamma, False),
             "cleanrl_ddqn": CleanRLUpdate(agent.q, cfg.agent.lr, cfg.agent.optimizer_eps, cfg.agent.gamma, True)}
    tb = [b.to_torch(dtype=torch.float32) for b in batches]
    counter = [0]

    def relive_step(ag, force_target: bool):
        def step():
            counter[0] += 1
            if force_target:
                ag.target_synced = False  # the update as it was: the target forward of s' every time
            ag.update(batches[counter[0] % len(batches)])
        return step

    def peer_step(peer):
        def step():
            counter[0] += 1
            b = tb[counter[0] % len(tb)]
            peer(b.obs, b.action.long(), b.reward, b.next_obs, b.terminated)
        return step

    steps = {name: relive_step(ag, name == "before") for name, ag in contenders.items()}
    steps |= {name: peer_step(peer) for name, peer in peers.items()}
    for fn in steps.values():
        for _ in range(3):
            fn()
    per_round: dict[str, list[tuple[float, float]]] = {k: [] for k in steps}
    for _ in range(a.rounds):
        for name, fn in steps.items():
            c, w, _ = timed_for(fn, a.seconds)
            per_round[name].append((c, w))
    print(f"\n2. one update (batch {BATCH}, sampled batch excluded), median of {a.rounds} alternating rounds; ratio: "
          "median of per-round ratios to cleanrl_ddqn")
    print(f"{'update':14s} {'CPU ms':>8s} {'wall ms':>8s} {'CPU ratio':>10s} {'wall ratio':>10s}")
    updates = {}
    for name, rows in per_round.items():
        c = statistics.median(r[0] for r in rows)
        w = statistics.median(r[1] for r in rows)
        rc = statistics.median(r[0] / p[0] for r, p in zip(rows, per_round["cleanrl_ddqn"], strict=True))
        rw = statistics.median(r[1] / p[1] for r, p in zip(rows, per_round["cleanrl_ddqn"], strict=True))
        updates[name] = {"cpu_ms": c, "wall_ms": w, "cpu_ratio": rc, "wall_ratio": rw}
        print(f"{name:14s} {c:8.2f} {w:8.2f} {rc:10.2f} {rw:10.2f}")

    # 3. the 100k estimate
    print(f"\n3. Atari-100k from the components (CPU minutes; evaluation games of {game_steps:.0f} steps, 10 x 10)")
    fixed = {k: comp[k][0] for k in ("env step (training env, random actions)", "extend (one row)",
                                     "act (explore, epsilon 0.01)", "sample(32)")}
    ckpt = comp[f"checkpoint ({a.rows} rows)"][0] * sum(CHECKPOINT_ROWS) / a.rows
    estimate = {}
    for name in ("before", "default", "fast"):
        update_ms = updates[name]["cpu_ms"]
        parts = {"warm-up steps (env + extend)": WARMUP * (fixed["env step (training env, random actions)"]
                                                            + fixed["extend (one row)"]),
                 "env steps (env + act + extend)": (STEPS - WARMUP) * (fixed["env step (training env, random actions)"]
                                                                       + fixed["extend (one row)"]
                                                                       + fixed["act (explore, epsilon 0.01)"]),
                 "updates (sample + update)": (STEPS - WARMUP) * (fixed["sample(32)"] + update_ms),
                 "evaluations": EVALS * EVAL_GAMES * game_steps * comp["eval step (full-game env + act)"][0],
                 "checkpoints": ckpt}
        total = sum(parts.values()) / 60e3
        estimate[name] = {k: v / 60e3 for k, v in parts.items()} | {"total_min": total}
        print(f"{name:8s} " + ", ".join(f"{k} {v / 60e3:.1f}" for k, v in parts.items()) + f" -> {total:.1f} min")
    threads: dict[str, dict[str, float]] = {}
    if a.thread_counts:
        per: dict[str, list[tuple[float, float]]] = {}
        for _ in range(a.rounds):
            for n in a.thread_counts:
                torch.set_num_threads(n)
                for name in ("default", "fast"):
                    c, w, _ = timed_for(steps[name], a.seconds)
                    per.setdefault(f"{name}, {n} thread(s)", []).append((c, w))
        torch.set_num_threads(a.threads)
        print(f"\n4. one update by torch thread count, median of {a.rounds} alternating rounds (load average now "
              f"{os.getloadavg()[0]:.2f})")
        print(f"{'update':24s} {'CPU ms':>8s} {'wall ms':>8s}")
        for name, rows in per.items():
            threads[name] = {"cpu_ms": statistics.median(r[0] for r in rows),
                             "wall_ms": statistics.median(r[1] for r in rows)}
            print(f"{name:24s} {threads[name]['cpu_ms']:8.2f} {threads[name]['wall_ms']:8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"load": load, "threads": a.threads, "torch": torch.__version__,
                                            "components_ms": comp, "eval_game_steps": game_steps,
                                            "updates": updates, "estimate_min": estimate,
                                            "thread_counts": threads}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
