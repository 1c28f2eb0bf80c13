"""D4RL-style datasets generated locally: random, medium, medium-replay, expert, medium-expert.

One SAC training run per task and seed (``expert_train_steps`` online steps, evaluated every 1/20 of it, the
agent of every evaluation kept) gives every level, as D4RL's recipe does:
- random: uniform actions.
- expert: the run's best evaluated policy (usually the final one; short runs on 2 cores are unstable, e.g.
  Walker2d's evaluation fell from 851 to 306 over the last 15k steps), rolled out with its stochastic policy.
- medium: an earlier snapshot whose evaluation return is closest to one third of the way from R_random to
  R_expert (D4RL: "a third of the expert return"), rolled out stochastically.
- medium-replay: the rows that run had stored when that snapshot was taken (its replay data).
- medium-expert: the union of medium and expert.
The run (policies, evaluations, replay buffer) stays in ``data/policies/<task>/seed<N>-steps<M>``
(pickle-free: .npy + JSON), so levels can be regenerated without training again. Reference returns for
normalized scores: R_random = mean return of the random level's episodes, R_expert = mean return of the
expert level's episodes; every level of a task records the same pair (cached in
``data/policies/<task>/references.json``), so a run on the medium level reports normalized scores too. The
random level records R_random only; the levels that know R_expert (medium, medium-replay, expert,
medium-expert, and the mazes' scripted level) also write the pair to ``<minari root>/relive/<task>/
references.json``, where ``read_minari`` finds R_expert for a dataset that lacks it. So the references a
dataset reports do not depend on which level was made first.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from relive.agents.run_dir import open_run_dir
from relive.config import override
from relive.data.maze import waypoint_policy
from relive.data.minari_io import default_root, write_minari, write_task_references
from relive.data.npz_io import load_dataset, save_dataset
from relive.data.rows import split_episodes
from relive.data.scores import d4rl_reference
from relive.presets import get_preset
from relive.replay.buffer import HOST, ReplayBuffer
from relive.replay.checkpoint import load_tree
from relive.replay.storage.layout import concat_rows

TASKS = {"hopper-v5": "Hopper-v5", "halfcheetah-v5": "HalfCheetah-v5", "walker2d-v5": "Walker2d-v5",
         "pendulum-v1": "Pendulum-v1", "pointmaze-umaze-v3": "PointMaze_UMaze-v3",
         "pointmaze-medium-v3": "PointMaze_Medium-v3"}
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert", "scripted", "noisy-scripted")
MAZE_TASKS = ("pointmaze-umaze-v3", "pointmaze-medium-v3")  # levels: random, scripted (waypoint controller)
# Meta-World manipulation (``metaworld-<task>``, e.g. metaworld-pick-place-v3; ``relive.metaworld_envs``,
# its own venv): levels random, scripted (Meta-World's hand-written expert) and noisy-scripted (the expert with
# Gaussian action noise of std ``noise``: near-miss failures, the base regime of PLD)
METAWORLD = "metaworld-"
SCRIPTED_NOISE = 0.5  # noisy-scripted's default action-noise std (actions in [-1, 1])
# pixel tasks (image + state observations, ``relive.pixel_envs``): the policies of their levels are the
# state-based task's (the same dynamics), rolled out in the pixel env from its true state; no medium-replay
# (that run's replay holds state observations, not images)
TASKS["pixel-pendulum-v0"] = "PixelPendulum-v0"
PIXEL_SOURCES = {"pixel-pendulum-v0": "pendulum-v1"}


@dataclass(frozen=True)
class Budget:
    steps: int  # rows in a random / medium / expert dataset
    expert_train_steps: int  # online SAC steps of the training run


# sized for a 2-core CPU (~130 SAC steps/s on MuJoCo tasks): the MuJoCo experts are far from D4RL's 1M-step
# SAC at these budgets; pass --expert-train-steps for more
BUDGETS = {"pendulum-v1": Budget(20_000, 15_000), "hopper-v5": Budget(100_000, 100_000),
           "halfcheetah-v5": Budget(100_000, 100_000), "walker2d-v5": Budget(100_000, 100_000),
           "pointmaze-umaze-v3": Budget(50_000, 0), "pointmaze-medium-v3": Budget(100_000, 0),
           "pixel-pendulum-v0": Budget(20_000, 15_000)}  # (the training run is pendulum-v1's)


def task_env(task: str) -> str:
    key = task.lower()
    if key.startswith(METAWORLD) and len(key) > len(METAWORLD):
        from relive.metaworld_envs import PREFIX, task_of  # (gymnasium and metaworld: optional)

        return PREFIX + task_of(key[len(METAWORLD):])  # a ValueError names the known tasks
    if key not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {sorted(TASKS)} and metaworld-<task> (e.g. "
                         "metaworld-pick-place-v3)")
    return TASKS[key]


def _budget(task: str) -> Budget:
    return Budget(20_000, 0) if task.lower().startswith(METAWORLD) else BUDGETS[task.lower()]


def _scripted_levels(task: str) -> tuple[str, ...] | None:
    """The levels of a task made by a scripted controller instead of a SAC run (None: the D4RL levels)."""
    if task.lower() in MAZE_TASKS:
        return ("random", "scripted")
    if task.lower().startswith(METAWORLD):
        return ("random", "scripted", "noisy-scripted")
    return None


def scripted_rows(task: str, env_id: str, steps: int, seed: int, noise: float, progress: str | None) -> dict:
    """``steps`` rows of the task's scripted controller: the mazes' waypoint controller, Meta-World's expert
    (with Gaussian action noise of std ``noise``)."""
    # (gymnasium and metaworld, optional: `relive --help` imports this module)
    from relive.envs import make_env
    from relive.train.collector import collect_dataset

    if task.lower() in MAZE_TASKS:
        policy = waypoint_policy(make_env(env_id), np.random.default_rng(seed + 3))
    else:
        from relive.metaworld_envs import scripted_policy

        policy = scripted_policy(env_id, noise, np.random.default_rng(seed + 3))
    return collect_dataset(env_id, steps, seed=seed, policy=policy, progress=progress)


def dataset_id(task: str, level: str) -> str:
    return f"relive/{task.lower()}/{level}-v0"


def random_dataset(env_id: str, num_steps: int, seed: int, progress: str | None = None) -> dict:
    """``num_steps`` rows of uniform-random actions on ``env_id`` (the ``random`` level): whole episodes, the
    last one cut as truncated; the same rows for the same seed."""
    # (gymnasium, optional: `relive --help` imports this module)
    from relive.train.collector import collect_dataset

    return collect_dataset(env_id, num_steps, seed=seed, progress=progress)


@overload
def _cached_reference(path: Path, key: str, compute: Callable[[], float]) -> float: ...
@overload
def _cached_reference(path: Path, key: str, compute: None = None) -> float | None: ...
def _cached_reference(path: Path, key: str, compute: Callable[[], float] | None = None) -> float | None:
    """A reference return stored under ``key`` in the JSON file ``path``; computed and stored on a miss
    (or None on a miss without ``compute``)."""
    cache = json.loads(path.read_text()) if path.is_file() else {}
    if key not in cache:
        if compute is None:
            return None
        cache[key] = float(compute())
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(path)
    return float(cache[key])


def _training_run(task: str, train_steps: int, seed: int, run_dir: Path, progress: bool) -> Path:
    """Train (or reuse) the task's SAC run, keeping the agent of every evaluation and the final buffer."""
    # (gymnasium, optional: `relive --help` imports this module)
    from relive.train.trainer import train

    if (run_dir / "summary.json").exists():
        return run_dir
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = override(get_preset("sac"), [
        f'env.id="{task_env(task)}"', f"run.seed={seed}", f'run.run_dir="{run_dir}"',
        f"schedule.num_online_env_steps={train_steps}", f"schedule.num_warmup_env_steps={min(5000, train_steps // 10)}",
        f"replay.capacity={train_steps + 1}", f"run.eval_every_env_steps={max(train_steps // 20, 1)}",
        f"run.checkpoint_every_env_steps={10**12}", "run.save_final_buffer=true", "run.save_agent_snapshots=true",
        f"run.progress={'true' if progress else 'false'}"])
    train(cfg)
    return run_dir


def _load_agent(run_dir: Path, snapshot: str):
    # (gymnasium, optional: `relive --help` imports this module)
    from relive.envs import env_spec, make_env
    from relive.train.trainer import build_agent

    cfg = open_run_dir(run_dir).config  # (as every command reads a run directory: no trust from it)
    agent = build_agent(cfg, env_spec(make_env(cfg.env.id)))
    agent.load_state_dict(load_tree(run_dir / snapshot, kind="agent"))
    return agent


def _evaluations(run_dir: Path) -> list[tuple[int, float]]:
    with open(run_dir / "eval.csv", newline="") as f:
        return [(int(float(r["env_step"])), float(r["eval/return_mean"])) for r in csv.DictReader(f)]


def _expert_snapshot(run_dir: Path) -> tuple[str, int, float]:
    """(agent path in the run, env step, eval return) of the best evaluated policy; the last one on ties."""
    evals = _evaluations(run_dir)
    i = max(range(len(evals)), key=lambda j: (evals[j][1], j))
    step, ret = evals[i]
    return ("agent_final" if i == len(evals) - 1 else f"snapshots/agent_{step}"), step, ret


def _medium_snapshot(run_dir: Path, expert_step: int, ref_min: float, ref_max: float) -> tuple[int, float]:
    """(env step, eval return) of the trained snapshot (after step 0, before the expert's) whose evaluation
    return is closest to R_random + (R_expert - R_random) / 3."""
    target = ref_min + (ref_max - ref_min) / 3
    evals = [e for e in _evaluations(run_dir) if 0 < e[0] < expert_step]
    if not evals:
        raise ValueError(f"{run_dir}: no evaluated snapshot between the start and the expert (step {expert_step}) "
                         "to serve as the medium policy; train longer (--expert-train-steps)")
    return min(evals, key=lambda e: abs(e[1] - target))


def _episode_returns(rows: dict) -> np.ndarray:
    return np.array([float(np.sum(rows["reward"][sl])) for sl in split_episodes(rows)])


def make_dataset(task: str, level: str, *, steps: int | None = None, seed: int = 0, root: str | Path | None = None,
                 out: str | Path = "data", expert_train_steps: int | None = None,
                 progress: bool = True, overwrite: bool = False, noise: float | None = None) -> tuple[str, dict]:
    """Generate one level and write it as a Minari dataset; returns (dataset id, summary). An existing dataset
    of that id is kept unless ``overwrite`` (checked before any work); the new one is written beside it and
    swapped in atomically once complete (see ``write_minari``). ``noise``: the action-noise std of the
    noisy-scripted level (default ``SCRIPTED_NOISE``)."""
    req = _request(task, level, steps, seed, Path(out), expert_train_steps, progress, noise)
    env_id, steps, label = req.env_id, req.steps, req.label
    did = dataset_id(task, level)
    root = Path(root) if root is not None else default_root()
    if (root / did).exists() and not overwrite:  # before any collection or training
        raise ValueError(f"dataset {did} already exists under {root}; pass --overwrite to regenerate it (the "
                         "existing one is kept until the new one is complete)")

    # every level records the same (R_random, R_expert): R_random is cached per task, R_expert in the training
    # run's directory (or per task for the mazes' scripted level), keyed by seed and size
    task_refs = Path(out) / "policies" / task.lower() / "references.json"
    random_rows = random_dataset(env_id, steps, seed, progress=label) if level == "random" else None
    ref_min = _cached_reference(task_refs, f"random/seed{seed}-steps{steps}", lambda: _episode_returns(
        random_rows if random_rows is not None else random_dataset(env_id, steps, seed, progress=label)).mean())
    rows: dict
    ref_max: float | None
    extra: dict
    if level == "random":
        assert random_rows is not None  # (made above for this level)
        # never records R_expert (it would depend on whether the expert was made first): readers take it from
        # the task's references.json, which the levels that know R_expert write (read_minari)
        rows, ref_max, extra = random_rows, None, {}
    elif level in ("scripted", "noisy-scripted"):
        # a scripted controller, no SAC run: R_expert is the scripted level's, cached per task
        rows, ref_max, extra = _scripted_level(req, task_refs)
    else:
        rows, ref_max, extra = _policy_level(req, ref_min)
    returns = _episode_returns(rows)
    d4rl = d4rl_reference(env_id)
    summary = {"task": task.lower(), "env_id": env_id, "level": level, "seed": seed, "rows": int(len(rows["reward"])),
               "episodes": int(returns.size), "return_mean": float(returns.mean()), "return_std": float(returns.std()),
               "ref_min_return": ref_min, "ref_max_return": ref_max, "d4rl_ref": list(d4rl) if d4rl else None} | extra
    write_minari(did, rows, env_id, root=root, algorithm_name=f"relive {level}",
                 description=f"{level} data for {env_id} generated by relive (seed {seed})",
                 ref_min_score=ref_min, ref_max_score=ref_max, extra_metadata=summary, overwrite=overwrite)
    if ref_max is not None:  # every level of the task reads these (the random level's own R_expert is None)
        write_task_references(root, did, {"ref_min_return": ref_min, "ref_max_return": ref_max, "written_by": did,
                                          "seed": seed, "steps": steps})
    return did, summary


@dataclass(frozen=True)
class _Request:
    """One checked ``make_dataset`` call: what the helpers of each level read."""
    task: str
    level: str
    env_id: str
    source: str | None  # a pixel task's state task: its training run's policies, fed the true state
    steps: int  # rows to write
    seed: int
    train_steps: int  # env steps of the SAC run whose snapshots are the medium and expert policies
    run_dir: Path  # that run's directory
    noise: float  # noisy-scripted's action-noise std
    progress: bool
    label: str | None  # the collections' progress label


def _request(task: str, level: str, steps: int | None, seed: int, out: Path, expert_train_steps: int | None,
             progress: bool, noise: float | None) -> _Request:
    """The arguments checked, with the task's defaults filled in; one ValueError naming the flag at fault."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; known: {LEVELS}")
    for name, value in (("steps", steps), ("expert_train_steps", expert_train_steps)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer (or left out for the task's budget), got {value!r}")
    if noise is not None and (level != "noisy-scripted" or not (np.isfinite(noise) and noise >= 0)):
        raise ValueError(f"noise (--noise) is the noisy-scripted level's action-noise std, a finite number >= 0; "
                         f"got {noise!r} for level {level!r}")
    env_id = task_env(task)
    scripted = _scripted_levels(task)
    if scripted is not None and level not in scripted or scripted is None and level in ("scripted", "noisy-scripted"):
        raise ValueError(f"level {level!r} is not made for {task}: mazes have random and scripted, Meta-World tasks "
                         "random, scripted and noisy-scripted, locomotion and pendulum tasks random, medium, "
                         "medium-replay, expert, medium-expert")
    source = PIXEL_SOURCES.get(task.lower())  # a pixel task: policies from the state task's run
    if source and level == "medium-replay":
        raise ValueError(f"{task} has no medium-replay level: its training run ({source}) stored state observations, "
                         "not images; levels: random, medium, expert, medium-expert")
    budget = _budget(task)
    train_steps = budget.expert_train_steps if expert_train_steps is None else expert_train_steps
    return _Request(task, level, env_id, source, steps=budget.steps if steps is None else steps, seed=seed,
                    train_steps=train_steps,
                    run_dir=out / "policies" / (source or task.lower()) / f"seed{seed}-steps{train_steps}",
                    noise=SCRIPTED_NOISE if noise is None else float(noise), progress=progress,
                    label="collecting" if progress else None)


def _scripted_level(req: _Request, task_refs: Path) -> tuple[dict, float, dict]:
    """(rows, R_expert, summary extras) of the scripted or noisy-scripted level: R_expert is the noiseless
    scripted controller's mean return, cached in the task's references."""
    noisy = req.level == "noisy-scripted"
    rows = scripted_rows(req.task, req.env_id, req.steps, req.seed, req.noise if noisy else 0.0, req.label)
    ref_max = _cached_reference(task_refs, f"scripted/seed{req.seed}-steps{req.steps}", lambda: _episode_returns(
        rows if not noisy else scripted_rows(req.task, req.env_id, req.steps, req.seed, 0.0, req.label)).mean())
    return rows, ref_max, {"action_noise_std": req.noise} if noisy else {}


def _policy_level(req: _Request, ref_min: float) -> tuple[dict, float, dict]:
    """(rows, R_expert, summary extras) of a level made from one SAC run's snapshots: medium (the snapshot nearest
    to halfway between R_random and R_expert), expert (the best), medium-expert (both), medium-replay (the run's
    online rows up to the medium snapshot). R_expert is cached in the run's directory."""
    level, steps, seed, run_dir = req.level, req.steps, req.seed, req.run_dir
    _training_run(req.source or req.task, req.train_steps, seed, run_dir, req.progress)
    expert_agent, expert_step, expert_eval = _expert_snapshot(run_dir)
    expert_rows = _policy_rows(req, expert_agent, steps, seed + 2) if level in ("expert", "medium-expert") else None
    ref_max = _cached_reference(run_dir / "references.json", f"expert/{expert_agent}/seed{seed}-steps{steps}",
                                lambda: _episode_returns(expert_rows if expert_rows is not None
                                                         else _policy_rows(req, expert_agent, steps, seed + 2)).mean())
    med_step, med_eval = _medium_snapshot(run_dir, expert_step, ref_min, ref_max)
    extra = {"training_run": str(run_dir), "train_steps": req.train_steps, "medium_snapshot_step": med_step,
             "medium_snapshot_eval_return": med_eval, "expert_snapshot": expert_agent,
             "expert_snapshot_step": expert_step, "expert_eval_return": expert_eval}
    if level == "medium-replay":
        st = ReplayBuffer.load(run_dir / "buffer_final", device=HOST).storage
        lo = st.num_offline  # online rows in the order they were written (the ring never wrapped)
        hi = lo + min(med_step, st.num_online)
        rows = {k: st.columns[k][lo:hi].copy() for k in ("obs", "action", "reward", "next_obs", "terminated",
                                                           "truncated")}
        rows["truncated"][-1] |= not rows["terminated"][-1]
        return rows, ref_max, extra
    parts = []
    if level in ("medium", "medium-expert"):
        parts.append(_policy_rows(req, f"snapshots/agent_{med_step}", steps, seed + 1))
    if expert_rows is not None:
        parts.append(expert_rows)
    return parts[0] if len(parts) == 1 else concat_rows(parts), ref_max, extra


def _policy_rows(req: _Request, agent_name: str, n: int, seed: int) -> dict:
    """A snapshot's stochastic rollout, kept in the run directory (.npz) so that medium-expert reuses the
    medium and expert rows instead of collecting them again."""
    path = req.run_dir / "rollouts" / f"{agent_name.replace('/', '_')}-seed{seed}-steps{n}.npz"
    if req.source:  # image rows: not cached (.npz columns are flat arrays; regenerating takes seconds)
        return _rollout(req, _load_agent(req.run_dir, agent_name), n, seed)
    if path.is_file():
        return load_dataset(path)[0]
    rows = _rollout(req, _load_agent(req.run_dir, agent_name), n, seed)
    save_dataset(path.with_suffix(".tmp.npz"), rows).replace(path)
    return rows


def _rollout(req: _Request, agent, n: int, seed: int) -> dict:
    from relive.train.collector import collect_dataset  # (gymnasium, optional: `relive --help` imports this module)

    if req.source:  # the state policy, fed the pixel env's true state
        return collect_dataset(req.env_id, n, seed=seed, progress=req.label, policy_from_env=lambda env: (
            lambda o: agent.act(env.get_wrapper_attr("true_state_obs")()[None], explore=True)))
    return collect_dataset(req.env_id, n, seed=seed, policy=lambda o: agent.act(o, explore=True), progress=req.label)
