"""The square root of zero moments on a CPU, and what flooring it saves a pixel DDQN update (relive.agents.optimizers),
in one process, alternating rounds, CPU time, one torch thread.

    python bench/optimizer_sqrt.py [--rounds 5] [--updates 20] [--dead 0.3] [RUN_DIR ...]

1. ``Tensor.sqrt`` of 131,072 float32 values (a 1024 x 128 layer): all positive, all zero, 30% zero; and the floored
   root (``clamp_min(tiny).sqrt_()``) of the same.
2. DDQN updates of ``ddqn_minatar`` (centered RMSprop), ``ddqn_atari`` (centered RMSprop) and ``ddqn_atari100k``
   (Adam, epsilon 1.5e-4) on random batches, subnormals flushed as ``train`` does: two agents of one seed, one with
   torch's optimizer class, one with relive's floored one, updated alike; ``--dead`` of the units of the widest
   hidden layer are dead (their incoming weights and bias zeroed: ReLU(0) passes no gradient, so their moments stay
   0, as units that never fire in training). Their weights are checked bit-equal at the end.
3. ``RUN_DIR``: a finished DDQN run's trained agent (``agent_final``: weights and moments), the same A/B from it.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import numpy as np
import torch

from relive.agents.ddqn import DDQN
from relive.agents.optimizers import SQRT_FLOOR, FloorSqrtAdam, FloorSqrtRMSprop
from relive.presets import get_preset
from subnormal_update import B, batch  # (bench/: the same random batches)

PRESETS = (("ddqn_minatar", (4, 10, 10), 6), ("ddqn_atari", (4, 84, 84), 6), ("ddqn_atari100k", (4, 84, 84), 6))


def cpu_us(fn, n: int) -> float:
    c = time.process_time()
    for _ in range(n):
        fn()
    return 1e6 * (time.process_time() - c) / n


def sqrt_table(rounds: int) -> None:
    n = 1024 * 128
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(n, generator=g) + 0.1
    part = pos.clone()
    part[torch.rand(n, generator=g) < 0.3] = 0
    cases = {"all positive": pos, "all zero": torch.zeros(n), "30% zero": part}
    got: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, x in cases.items():
            got.setdefault(f"{name}: sqrt", []).append(cpu_us(lambda x=x: x.sqrt(), 200))
            got.setdefault(f"{name}: floored sqrt", []).append(cpu_us(lambda x=x: x.clamp_min(SQRT_FLOOR).sqrt_(), 200))
    print(f"\nTensor.sqrt of {n:,} float32 values, CPU us (median of {rounds} rounds of 200)")
    for k, v in got.items():
        print(f"  {k}: {np.median(v):.0f}")


def kill_units(agent: DDQN, fraction: float) -> int:
    """Zero the incoming weights and bias of ``fraction`` of the widest hidden Linear layer's units (both nets)."""
    lin = [m for m in agent.q.modules() if isinstance(m, torch.nn.Linear)][:-1]
    layer = max(lin, key=lambda m: m.weight.shape[0] * m.weight.shape[1])
    k = int(fraction * layer.weight.shape[0])
    with torch.no_grad():
        layer.weight[:k] = 0
        layer.bias[:k] = 0
    agent.target_q.load_state_dict(agent.q.state_dict())
    return k * (layer.weight.shape[1] + 1)


def ab(name: str, torch_agent: DDQN, floor_agent: DDQN, shape, rounds: int, updates: int) -> None:
    base = type(floor_agent.opt).__mro__[1]
    assert isinstance(floor_agent.opt, FloorSqrtAdam | FloorSqrtRMSprop) and floor_agent.opt._plain()
    torch_agent.opt.__class__ = base  # (the same object, torch's step)
    rng = np.random.default_rng(0)
    got: dict[str, list[float]] = {"torch": [], "floored": []}
    step_s: dict[str, list[float]] = {"torch": [], "floored": []}
    for label, agent in (("torch", torch_agent), ("floored", floor_agent)):
        def timed_step(closure=None, _step=agent.opt.step, _acc=step_s[label]):  # (the optimizer step alone)
            c = time.process_time()
            _step()
            _acc.append(time.process_time() - c)
        agent.opt.step = timed_step  # type: ignore[method-assign]
    for _ in range(rounds):
        batches = [batch(rng, shape, torch_agent.num_actions) for _ in range(updates)]
        for label, agent in (("torch", torch_agent), ("floored", floor_agent)):
            c = time.process_time()
            for b in batches:
                agent.update(b)
            got[label].append(1e3 * (time.process_time() - c) / updates)
    same = all(torch.equal(a, b) for a, b in zip(torch_agent.q.parameters(), floor_agent.q.parameters(), strict=True))
    t, f = np.median(got["torch"]), np.median(got["floored"])
    st, sf = (1e3 * np.median(step_s[k]) for k in ("torch", "floored"))
    print(f"  {name}: an update {t:.2f} CPU ms with torch's {base.__name__}, {f:.2f} floored ({t / f:.2f}x); its "
          f"optimizer step {st:.2f} vs {sf:.2f} ms ({st / sf:.2f}x); weights bit-equal after: {same}\n"
          f"    (update rounds: torch {', '.join(f'{x:.1f}' for x in got['torch'])} / floored "
          f"{', '.join(f'{x:.1f}' for x in got['floored'])})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--dead", type=float, default=0.3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sqrt_table(args.rounds)
    torch.set_flush_denormal(True)
    print(f"\nDDQN updates, batch {B}, {args.dead:.0%} of the widest layer's units dead, subnormals flushed")
    for name, shape, actions in PRESETS:
        cfg = get_preset(name).agent
        agents = [DDQN(0, actions, cfg, seed=0, image=(shape, np.uint8)) for _ in range(2)]
        zeros = [kill_units(a, args.dead) for a in agents][0]
        for a in agents:
            a.update(batch(np.random.default_rng(1), shape, actions))  # (the optimizer's state exists)
        print(f"  ({name}: {zeros:,} of {sum(p.numel() for p in agents[0].q.parameters()):,} parameters dead)")
        ab(name, agents[0], agents[1], shape, args.rounds, args.updates)
    if args.run_dirs:
        from relive.train.run_cli import load_run_agent

        print("\nTrained agents")
        for run_dir in args.run_dirs:
            _, env, _, agent, _ = load_run_agent(run_dir)
            if env is not None:
                env.close()
            if not (isinstance(agent.opt, FloorSqrtAdam | FloorSqrtRMSprop) and agent.opt._plain()):
                print(f"  ({run_dir.name}: its optimizer, {type(agent.opt).__name__}, takes no floored root: skipped)")
                continue
            twin = copy.deepcopy(agent)
            sq = [v for st in agent.opt.state.values() for k, v in st.items() if k in ("exp_avg_sq", "square_avg")]
            zeros = sum(int((v == 0).sum()) for v in sq)
            print(f"  ({run_dir.name}: {zeros:,} of {sum(v.numel() for v in sq):,} second moments exactly 0)")
            ab(run_dir.name, agent, twin, agent.image_shape, args.rounds, args.updates)
    torch.set_flush_denormal(False)


if __name__ == "__main__":
    main()
