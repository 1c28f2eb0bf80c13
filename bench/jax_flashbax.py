"""relive -> JAX beside Flashbax (issue 49 item 2): sample(B) handed to JAX, and (PER) the priority update, on CPU.

    python bench/jax_flashbax.py                       # ~3 minutes on a 2-core Xeon (jit compiles included)
    python bench/jax_flashbax.py --batch-sizes 256 --rounds 5 --calls 200

Both buffers hold the same rows (HalfCheetah-shaped: obs 17 and next_obs 17 float32, action 6 float32, reward
float32, terminated / truncated bool), ``--capacity`` of them (full), and draw the same batch sizes, in one process:
the variants run interleaved, round by round (a shared machine's load hits all alike); each round times ``--calls``
calls; the median over rounds is reported (microseconds per call, wall-clock and the process's CPU time: the latter
is steadier on a loaded machine), with Flashbax / relive ratios (> 1: relive faster).

* **relive uniform**: ``buf.sample(B).to_jax()`` (NumPy gather, then DLPack), arrays ready (``block_until_ready``).
* **Flashbax uniform**: ``make_item_buffer`` (one item = one row), ``jax.jit(buffer.sample)`` with a fresh key
  split inside the jitted step, arrays ready.
* **relive PER** (``PrioritizedSampler``, alpha 0.6, IS weights computed): ``b = buf.sample(B).to_jax()``, then
  ``buf.update(b.info, td_error=np.asarray(td))`` with ``td`` a JAX array of B |TD errors| (a learner's output:
  its copy to NumPy is counted).
* **Flashbax PER**: ``make_prioritised_item_buffer`` (alpha 0.6), one jitted step: sample, then ``set_priorities``
  at the sampled indices (state donated, so the update is in place), arrays ready. Flashbax returns the rows'
  probabilities, not IS weights (a learner computes them: not counted).

* **relive packed** (uniform / PER): ``data, layout = buf.sample(B).pack()`` -- the batch's columns copied
  into one aligned NumPy buffer, which the learner's jitted update takes as its argument (jit moves it in one
  transfer) and unpacks inside (``layout.unpack(data)``). Counted: the packing only (the transfer is in the
  learner-step rows).
* **with a learner step** (uniform; the fair end-to-end pair): each path's batch goes into one jitted function that
  reads every column (a sum of each: a stand-in for an update's dispatch with the batch as input): Flashbax's sampled
  arrays, relive's ``to_jax()`` arrays, relive's packed buffer (unpacked inside).

Also reported: relive's NumPy ``sample(B)`` alone and ``to_jax`` of one batch alone (what the hand-over costs).
A peer's baseline beside relive, not part of the library (it needs the extra "jax": flashbax, jax).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from importlib.metadata import version as _version

import numpy as np

SHAPES = {"obs": ((17,), np.float32), "action": ((6,), np.float32), "reward": ((), np.float32),
          "next_obs": ((17,), np.float32), "terminated": ((), np.bool_), "truncated": ((), np.bool_)}


def rows(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for k, (shape, dtype) in SHAPES.items():
        out[k] = (rng.random((n, *shape)) < 0.01) if dtype == np.bool_ else rng.normal(size=(n, *shape)).astype(dtype)
    return out


def relive_variants(capacity: int, batch: int, seed: int) -> dict:
    import jax

    from relive.replay import PrioritizedSampler, ReplayBuffer, UniformSampler

    data = rows(capacity, seed)
    consume, consume_packed = _consumers()
    uni = ReplayBuffer(capacity, (17,), (6,), sampler=UniformSampler(), seed=seed)
    per = ReplayBuffer(capacity, (17,), (6,), sampler=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4),
                       seed=seed)
    for buf in (uni, per):
        buf.extend(data)
    td = jax.numpy.asarray(np.abs(np.random.default_rng(seed + 1).normal(size=batch)).astype(np.float32))
    one = uni.sample(batch)

    def uniform():
        jax.block_until_ready(uni.sample(batch).to_jax().columns())

    def uniform_packed():
        uni.sample(batch).pack()

    def prioritized_packed():
        b = per.sample(batch)
        b.pack()
        per.update(b.info, td_error=np.asarray(td))

    def learner_to_jax():
        b = uni.sample(batch).to_jax()
        jax.block_until_ready(consume(b.columns() | {"is_weight": b.info.is_weight}))

    def learner_packed():
        data, layout = uni.sample(batch).pack()
        jax.block_until_ready(consume_packed(data, layout))

    def prioritized():
        b = per.sample(batch).to_jax()
        jax.block_until_ready(b.columns())
        per.update(b.info, td_error=np.asarray(td))

    return {"relive uniform: sample(B).to_jax()": uniform,
            "relive PER: sample(B).to_jax() + update": prioritized,
            "relive uniform: sample(B) (NumPy, no hand-over)": lambda: uni.sample(batch),
            "relive: to_jax() of one batch": lambda: jax.block_until_ready(one.to_jax().columns()),
            "relive uniform: sample(B).pack() (host side)": uniform_packed,
            "relive PER: sample(B).pack() + update (host side)": prioritized_packed,
            "with a learner step: relive to_jax()": learner_to_jax,
            "with a learner step: relive pack()": learner_packed}


def _consume(cols):
    """A jitted learner's stand-in: reads every column of the batch (the sum of each, as float32)."""
    import jax

    return sum(jax.numpy.sum(v.astype(jax.numpy.float32)) for v in jax.tree_util.tree_leaves(cols))


def _consumers():
    import jax

    return jax.jit(_consume), jax.jit(lambda data, layout: _consume(layout.unpack(data)), static_argnums=1)


def flashbax_variants(capacity: int, batch: int, seed: int) -> dict:
    import flashbax as fbx
    import jax

    data = {k: jax.numpy.asarray(v) for k, v in rows(capacity, seed).items()}
    item = {k: v[0] for k, v in data.items()}
    out = {}
    uni = fbx.make_item_buffer(max_length=capacity, min_length=1, sample_batch_size=batch, add_sequences=True)
    per = fbx.make_prioritised_item_buffer(max_length=capacity, min_length=1, sample_batch_size=batch,
                                           add_sequences=True, priority_exponent=0.6, device="cpu")
    chunk = min(capacity, 10_000)
    states = {}
    for name, buf in (("uniform", uni), ("per", per)):
        state = buf.init(item)
        add = jax.jit(buf.add, donate_argnums=0)
        for start in range(0, capacity, chunk):
            state = add(state, {k: v[start:start + chunk] for k, v in data.items()})
        states[name] = state
    td = jax.numpy.asarray(np.abs(np.random.default_rng(seed + 1).normal(size=batch)).astype(np.float32))

    @jax.jit
    def uniform_step(state, key):
        key, sub = jax.random.split(key)
        return uni.sample(state, sub).experience, key

    @jax.jit
    def per_step_jit(state, key, td):
        key, sub = jax.random.split(key)
        sample = per.sample(state, sub)
        return per.set_priorities(state, sample.indices, td), sample.experience, sample.probabilities, key
    per_step = jax.jit(per_step_jit, donate_argnums=0)

    box = {"uniform": states["uniform"], "per": states["per"], "key": jax.random.PRNGKey(seed)}

    def uniform():
        exp, box["key"] = uniform_step(box["uniform"], box["key"])
        jax.block_until_ready(exp)

    def prioritized():
        box["per"], exp, prob, box["key"] = per_step(box["per"], box["key"], td)
        jax.block_until_ready((exp, prob))

    consume, _ = _consumers()

    def learner():
        exp, box["key"] = uniform_step(box["uniform"], box["key"])
        jax.block_until_ready(consume(exp))

    out["Flashbax uniform: sample"] = uniform
    out["Flashbax PER: sample + set_priorities"] = prioritized
    out["with a learner step: Flashbax"] = learner
    return out


def time_round(fn, calls: int) -> tuple[float, float]:
    """(wall-clock, process CPU time) microseconds per call over ``calls`` calls."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return f"{model}, {os.cpu_count()} cores; uptime: {load}"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=100, help="calls per round and variant")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import jax

    print(f"machine: {machine()}; jax {jax.__version__} ({jax.devices()[0].platform}), flashbax "
          f"{_version('flashbax')}", flush=True)
    results: dict = {}
    for batch in args.batch_sizes:
        variants = relive_variants(args.capacity, batch, args.seed) | flashbax_variants(args.capacity, batch,
                                                                                       args.seed)
        for fn in variants.values():  # warm-up: the jit compiles, the first touches
            for _ in range(5):
                fn()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(time_round(fn, args.calls))
        for clock, i in (("wall", 0), ("cpu", 1)):
            med = {name: round(statistics.median(t[i] for t in v), 1) for name, v in times.items()}
            med["ratio uniform (Flashbax / relive)"] = round(med["Flashbax uniform: sample"]
                                                             / med["relive uniform: sample(B).to_jax()"], 2)
            med["ratio PER (Flashbax / relive)"] = round(med["Flashbax PER: sample + set_priorities"]
                                                         / med["relive PER: sample(B).to_jax() + update"], 2)
            med["ratio with a learner step, to_jax (Flashbax / relive)"] = round(
                med["with a learner step: Flashbax"] / med["with a learner step: relive to_jax()"], 2)
            med["ratio with a learner step, packed (Flashbax / relive)"] = round(
                med["with a learner step: Flashbax"] / med["with a learner step: relive pack()"], 2)
            key = f"B={batch}, capacity {args.capacity}, {clock} us per call (median of {args.rounds} rounds)"
            results[key] = med
            print(json.dumps({key: med}, indent=1), flush=True)
    print(f"after: {machine()}", flush=True)
    return results


if __name__ == "__main__":
    main()
