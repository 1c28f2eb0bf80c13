"""Training runs: build (or resume) a run, then the loop (:mod:`relive.train.loop`), then its summary.

Read top to bottom: ``train`` = build (or resume) -> offline phase -> online phase -> summary. The loop itself
(gradient steps, the phases, the online cadences, the collection strategies) is :mod:`relive.train.loop`; this
module builds what it runs: the agent and the replay from the registries, the env or vector env (``env.num_envs``)
or Ray collectors (``collectors.num``), the dataset's offline rows (``stored_rows`` turns truncations into
terminations when ``env.truncation_as_termination`` is set), the run directory (held by one process) and its
config.json, and on resume the components' state from the last checkpoint. summary.json states executed, stored
and unstored env steps. Evaluations run every ``run.eval_every_env_steps`` (from step 0, or from the first interval
with ``run.eval_at_start = false``), on fixed reset seeds or, with ``run.eval_fresh_starts``, on new start states.
What a method needs from the loop it declares (``relive.hooks``); this file names no method.

Every component has its own random stream from ``SeedSequence(run.seed).spawn``. Checkpoints are the components'
``state_dict``s (agent, buffer with its sampler, collector, loop counters, warm-up RNG; ``train/checkpoint.py``),
written every ``checkpoint_every_offline_grad_steps`` offline and on the first episode boundary after every
``checkpoint_every_env_steps`` online, so ``train(resume_dir=...)`` continues exactly where the run stopped. (With N
envs a checkpoint falls mid-episode; resuming resets the envs and ends each stream's open episode where it stood.)
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from relive import hooks as H
from relive.agents.run_dir import CONFIG_FILE, open_run_dir, without_trust
from relive.config import ExperimentConfig, ScheduleConfig, config_from_dict, override, save_config
from relive.data.loaders import fill_offline, load_rows
from relive.data.rows import spec_from_rows
from relive.envs import EnvSpec, env_spec, make_env, make_vector_env
from relive.files import DirectoryLock, LockedError, write_text_atomic
from relive.presets import get_preset
from relive.registry import ReplayBuild, agent_entry, replay_entry
from relive.replay import ReplayBuffer
from relive.replay.buffer import HOST
from relive.replay.checkpoint import load_tree, save_tree
from relive.replay.storage import FrameStack
from relive.train.callbacks import Callback, as_callbacks
from relive.train.checkpoint import check_config, has_checkpoint, load_checkpoint, recorded_config
from relive.train.collector import Collector, NoCollector, VectorCollector
from relive.train.intervention import DemoWriter, build_intervener, intervention_columns, renders
from relive.train.logging import RunLogger, check_loggers
from relive.train.loop import (
    LoopState,
    Run,
    close_streams,
    offline_phase,
    online_phase,
    stored_env_steps,
    stored_rows,
)
from relive.train.malloc import retain_freed_memory
from relive.train.ray_collection import RayCollection
from relive.train.ray_collectors import RayCollectors, check_agent
from relive.train.sharded_replay import DIRECTORY as SHARDS_DIRECTORY
from relive.train.sharded_replay import ShardedReplay, check_hooks

STREAMS = ("agent", "buffer", "sampler", "warmup", "env", "eval")  # one SeedSequence child each, in this order


@dataclass(frozen=True)
class RunSummary:
    run_dir: str
    num_offline_grad_steps: int
    num_online_env_steps: int
    num_grad_steps: int
    final_return: float
    final_normalized_score: float
    offline_return: float  # evaluation right after the offline phase (online env step 0)
    best_return: float
    seconds: float  # wall clock of this process (a resumed run counts from its resume)
    status: str = "finished"
    git_sha: str = ""
    torch_version: str = ""
    # of num_online_env_steps (executed, the budget): the steps stored as rows, the data the update clock counts,
    # and the probing steps (executed with store=False: never stored, never trained on)
    num_stored_online_env_steps: int = 0
    num_probing_env_steps: int = 0


def online_grad_steps(s: ScheduleConfig) -> int:
    """Gradient steps of a full online phase (warm-up excluded only approximately: used for beta's annealing)."""
    if s.grad_steps_per_chunk:
        return s.num_online_env_steps * s.grad_steps_per_chunk // s.env_steps_per_chunk
    return s.num_online_env_steps * s.utd_ratio


def seed_streams(seed: int) -> dict[str, np.random.SeedSequence]:
    return dict(zip(STREAMS, np.random.SeedSequence(int(seed)).spawn(len(STREAMS)), strict=True))


def _int(ss: np.random.SeedSequence) -> int:
    return int(ss.generate_state(1)[0] % 2**31)


def build_sampler(cfg: ExperimentConfig, seed: np.random.SeedSequence | None = None):
    """The registered replay strategy ``cfg.replay.name`` built with its options (a composition -- the mixture, HER --
    builds its parts); what it reads from the task comes later, from the env (``Sampler.bind_env``)."""
    s = cfg.schedule
    ctx = ReplayBuild(total_grad_steps=s.num_offline_grad_steps + online_grad_steps(s),
                      env_steps_per_chunk=s.env_steps_per_chunk, online_env_steps=s.num_online_env_steps,
                      seed=seed if seed is not None else seed_streams(cfg.run.seed)["sampler"])
    return replay_entry(cfg.replay.name).target(cfg.replay.options, ctx)


def build_agent(cfg: ExperimentConfig, spec, seed: np.random.SeedSequence | None = None):
    """The registered agent ``cfg.agent_kind`` for ``spec``."""
    seed = seed if seed is not None else seed_streams(cfg.run.seed)["agent"]
    return agent_entry(cfg.agent_kind).target.from_spec(spec, cfg.agent, seed, cfg.run.device)


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """``runs/PRESET[-REPLAY]-ENV-seedN-STAMP``: the replay strategy named when it is not the preset's own (so two
    runs of one preset with other strategies are told apart at a glance); an env id's ``/`` (``ALE/Pong-v5``)
    becomes ``_`` (one directory, not two)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        own = get_preset(cfg.preset).replay.name
    except ValueError:  # (a configuration built in Python under a name that is not a preset)
        own = cfg.replay.name
    replay = "" if cfg.replay.name == own else f"-{cfg.replay.name}"
    env = (cfg.env.id or "offline").replace("/", "_").replace(":", "_")
    return Path("runs") / f"{cfg.preset}{replay}-{env}-seed{cfg.run.seed}-{stamp}"


#: what a resumed run may change: where and how it runs, never what it computes (``train(resume_settings=...)``)
RESUME_SETTINGS = ("run.device", "replay.device", "run.num_threads", "run.progress", "agent.trust_code",
                   "intervention.console_host", "intervention.console_port", "intervention.console_start_paused")


def train(cfg: ExperimentConfig | None = None, *, resume_dir: str | Path | None = None,
          resume_settings: Sequence[str] = (), on_step: Callable[[int, int], None] | None = None,
          wrap_agent: Callable | None = None, allow_other_base: bool = False,
          callbacks: Sequence[Callback] = ()) -> RunSummary:
    """Run an experiment, or resume the one in ``resume_dir`` from its last checkpoint; ``resume_settings``:
    ``section.key=value`` changes of :data:`RESUME_SETTINGS` for the resumed part (e.g. ``run.device=cpu`` and
    ``replay.device=none`` to continue a GPU run on a machine without one), written to its config.json.

    ``callbacks``: :class:`relive.train.callbacks.Callback` objects called on every step, evaluation and
    checkpoint; one that returns ``False`` or raises ``StopTraining`` ends the run cleanly (summary.json ``status =
    "stopped"``). ``on_step(env_steps, grad_steps)`` is called after every gradient step and every collected chunk
    (tests raise from it to simulate a run killed at an arbitrary point). ``wrap_agent(agent)``: what the loop uses as
    the agent (seeds batched in one process, :mod:`relive.train.seed_batch`). ``allow_other_base``: an agent on a
    frozen base policy (``allow_other_base`` attribute) may load a checkpoint / ``run.init_from`` state recorded on
    a base with another digest (refused otherwise).
    """
    checked = as_callbacks(callbacks, on_step)  # (a wrong one is refused before anything is built)
    if cfg is not None:  # (a missing wandb / mlflow: one line, before the run directory is written)
        check_loggers(cfg.run.loggers)
    with subnormals_flushed():
        run = build(cfg, resume_dir, None, wrap_agent, resume_settings, allow_other_base)  # (on_step: a callback)
        run.callbacks = checked
        return _run_to_end(run)


def _run_to_end(run: Run) -> RunSummary:
    """:func:`train`'s phases on a built run, then its final agent and summary.json; the run's resources are
    released whatever happens."""
    try:
        offline_phase(run)
        final = online_phase(run, RayCollection if run.cfg.collectors.num else None)  # (None: this process's envs)
        st = run.state
        run.logger.metrics(st.env_steps, dict(run.train_metrics) | run.buffer.stats()
                           | {"grad_step": st.grad_steps, "phase": "final"})
        agent: Any = run.agent  # (any registered agent: loop.Run types it as object)
        save_tree(run.run_dir / "agent_final", agent.state_dict(), kind="agent")  # the trained policy
        if run.cfg.run.save_final_buffer and isinstance(run.buffer, ShardedReplay):
            run.buffer.checkpoint()  # the shards' checkpoints (replay/shard-*) hold the final buffer
        elif run.cfg.run.save_final_buffer:
            run.buffer.save(run.run_dir / "buffer_final", offline="copy")  # self-contained, unlike checkpoints
        st, s = run.state, run.cfg.schedule
        summary = RunSummary(str(run.run_dir), s.num_offline_grad_steps, st.env_steps, st.grad_steps,
                             final["eval/return_mean"], final["eval/normalized_score"], st.offline_return,
                             st.best_return, time.perf_counter() - run.start,
                             status="stopped" if run.stop_reason else "finished", git_sha=_git_sha(),
                             torch_version=torch.__version__, num_stored_online_env_steps=stored_env_steps(run),
                             num_probing_env_steps=run.collector.num_unstored_steps)
        # (atomic: its presence means the run finished, so it is never seen half-written; still under the lock)
        # strict JSON (any reader parses it): a value that is not a finite number (no evaluation ran) is null
        fields = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.__dict__.items()}
        write_text_atomic(run.run_dir / "summary.json", json.dumps(fields, indent=1, allow_nan=False))
    finally:
        run.logger.close()
        if isinstance(run.buffer, ShardedReplay):  # its shard actors end (their checkpoints stay)
            run.buffer.close()
        if hasattr(run.collector, "close"):
            run.collector.close()  # (async vector envs: their worker processes; Ray collectors: the actors)
        if run.lock is not None:
            run.lock.release()
    return summary


@contextmanager
def subnormals_flushed() -> Iterator[None]:
    """This thread's float arithmetic flushes subnormals to zero inside the block (as XLA does on CPU), its mode
    restored after it: a long run's Adam moments of parameters whose gradient stays 0 (dead ReLUs) decay into
    subnormals, whose arithmetic costs the CPU ~100x a normal float's -- an Atari-100k DDQN update went 41 -> 47 ms
    by step 25k (docs/benchmarks.md). Set before the run is built (threads started later inherit it); restored
    because a library call changes no process state it does not own (Hypothesis, for one, refuses to run where
    subnormals are flushed)."""
    flushing = flushes_subnormals()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(flushing)


def flushes_subnormals() -> bool:
    """Whether this thread's float arithmetic flushes subnormals to zero (``torch.set_flush_denormal``, which has no
    getter): a subnormal times one comes out zero."""
    return bool((torch.tensor([1e-40], dtype=torch.float32) * 1.0).item() == 0.0)


# -- build ---------------------------------------------------------------------------------------------------
def _resume_config(cfg: ExperimentConfig, settings: Sequence[str]) -> ExperimentConfig:
    """The saved config with ``settings`` applied, each one of :data:`RESUME_SETTINGS` (else a ValueError)."""
    for item in settings:
        key = item.partition("=")[0].strip()
        if key not in RESUME_SETTINGS:
            raise ValueError(f"a resumed run continues as it was configured; only {', '.join(RESUME_SETTINGS)} may "
                             f"change (where and how it runs), got {item!r}")
    return override(cfg, list(settings))  # (trust only from them: open_run_dir read config.json without it)


def _changed(before: ExperimentConfig, after: ExperimentConfig) -> list[tuple[str, object]]:
    """(key, new value) of every RESUME_SETTINGS entry that differs."""
    out = []
    for key in RESUME_SETTINGS:
        section, name = key.split(".")
        old, new = getattr(getattr(before, section), name, None), getattr(getattr(after, section), name, None)
        if old != new:
            out.append((key, new))
    return out


def _check_devices(cfg: ExperimentConfig) -> None:
    """A device the config names must exist here, before anything is built (else torch fails deep inside)."""
    for key, device in (("run.device", cfg.run.device), ("replay.device", cfg.replay.device)):
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"{key} = {device!r}, but torch sees no CUDA device here (torch.cuda.is_available() "
                             f"is False, torch {torch.__version__}); use cpu, or a CUDA build of torch on a GPU (a "
                             "stopped GPU run continues here with `relive train --resume RUN_DIR --device cpu "
                             "--replay-device none`)")
        if device and device.startswith("cuda:") and int(device.split(":")[1]) >= torch.cuda.device_count():
            raise ValueError(f"{key} = {device!r}, but torch sees {torch.cuda.device_count()} CUDA device(s)")
        if device == "mps" and not torch.backends.mps.is_available():
            raise ValueError(f"{key} = 'mps', but torch sees no MPS device here")


RUN_LOCK = ".relive.lock"  # the run directory's DirectoryLock: one process runs a run at a time
#: what a directory may already hold for a new run to start in it: relive's lock, and the files a launcher
#: (``relive bench run``: its log, its claim, an earlier attempt's crash record) writes there before starting it
NEW_RUN_MAY_HOLD = frozenset({RUN_LOCK, "stdout.log", "running.lock", "crash.json"})


def _hold_run(run_dir: Path) -> DirectoryLock:
    """The run directory's lock for this process, for the whole run (the kernel drops it if the process dies);
    a ValueError naming the holder's PID when another process runs it."""
    try:
        return DirectoryLock(run_dir, RUN_LOCK, what="run")
    except LockedError as e:
        raise ValueError(str(e)) from None


def check_new_run_dir(run_dir: Path) -> None:
    """A new run starts in a new or empty directory (or one holding only :data:`NEW_RUN_MAY_HOLD`): never in an
    existing run (resume that) or in a directory of someone else's files, which the run would write into."""
    if not run_dir.exists() and not run_dir.is_symlink():
        return
    if not run_dir.is_dir():
        raise ValueError(f"run directory {run_dir} exists and is not a directory; pick another --run-dir")
    if (run_dir / "config.json").exists():
        raise ValueError(f"{run_dir} already holds a run; resume it with --resume or pick another --run-dir")
    other = sorted(p.name for p in run_dir.iterdir() if p.name not in NEW_RUN_MAY_HOLD)
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise ValueError(f"run directory {run_dir} exists and is not a relive run (it holds {shown}): a new run "
                         f"writes its files into a new or empty directory only; pick another --run-dir")


def _check_checkpoint_config(run_dir: Path, tree: dict, saved: ExperimentConfig) -> None:
    """config.json must describe the configuration the checkpoint was made with (recorded in it), but for where
    and how the run goes on (:data:`RESUME_SETTINGS`); a checkpoint of an earlier version records none."""
    try:
        recorded = recorded_config(tree)
        if recorded is None:
            return
        recorded = config_from_dict(recorded).to_dict()  # (the same layout as config.json's, migrated alike)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"cannot resume {run_dir}: the configuration its checkpoint records is not readable "
                         f"({type(e).__name__}: {e})") from None
    check_config(run_dir, recorded, saved.to_dict(), may_change=RESUME_SETTINGS)


def build(cfg: ExperimentConfig | None, resume_dir, on_step, wrap_agent: Callable | None = None,
          resume_settings: Sequence[str] = (), allow_other_base: bool = False) -> Run:
    """Components from the config (or the run directory's config), the dataset in the buffer, and on resume
    every component's state from the last checkpoint. ``config.json`` is written only once all of it worked.
    The run directory's lock is taken first on resume, before config.json is written on a new run; the returned
    run holds it (``train`` releases it at the end), a build that fails releases it."""
    held: list[DirectoryLock] = []
    try:
        run = _build(cfg, resume_dir, on_step, wrap_agent, resume_settings, held, allow_other_base)
    except BaseException:
        for lock in held:
            lock.release()
        raise
    run.lock = held[0]
    return run


def _build(cfg: ExperimentConfig | None, resume_dir, on_step, wrap_agent: Callable | None,
           resume_settings: Sequence[str], held: list, allow_other_base: bool = False) -> Run:
    """The steps of a build, in order: the run to start or resume (its directory held on resume), the process set
    up for it, the envs (or the dataset's spec), the agent, the replay buffer bound to the env, the starting point
    (dataset rows, ``run.init_from``), the collector, the loop hooks, then the run directory, and on resume the
    checkpoint's state."""
    start = _start_or_resume(cfg, resume_dir, resume_settings, held)
    cfg = start.cfg
    seeds = seed_streams(cfg.run.seed)
    _set_up_process(cfg, allow_other_base)
    envs = _make_envs(cfg, seeds)
    agent = _make_agent(cfg, envs.spec, seeds, wrap_agent, allow_other_base)
    columns = _stored_columns(cfg, agent, envs.spec)
    buffer = _new_buffer(cfg, envs.spec, columns, seeds)
    if envs.eval_env is not None:  # what the replay reads from the task (HER: its reward function)
        buffer.sampler.bind_env(envs.eval_env)
    gamma = cfg.data.discount if cfg.data.discount is not None else getattr(cfg.agent, "gamma", 0.99)
    state = _new_loop_state(cfg)
    if start.tree is None:  # (a checkpoint holds the buffer, offline rows included, and the agent)
        _load_start(cfg, agent, buffer, columns, gamma, state, envs.loaded)
    collector = _make_collector(cfg, envs, columns, seeds, agent, start.run_dir)
    # (a component that cannot run here refuses now, before the directory is written)
    hooks = _new_run_hooks(cfg, agent, buffer, gamma, envs.env) if resume_dir is None else []
    if cfg.collectors.num:
        collector.connect()  # start or join Ray (a bad address fails here, before the directory is written)
    saved_cfg = without_trust(cfg)[0]  # what the run records (config.json, checkpoints): trust is the command's
    if resume_dir is None:  # everything is built: only now does the directory become a run
        _create_run_dir(saved_cfg, start.run_dir, held, envs.env)
    if isinstance(buffer, ShardedReplay):  # its shard actors, on the Ray the collectors connected to
        buffer.start(start.run_dir / SHARDS_DIRECTORY, resume=start.tree is not None)
    s = cfg.schedule
    logger = RunLogger(start.run_dir, s.num_online_env_steps, s.num_offline_grad_steps, cfg.run.progress,
                       loggers=cfg.run.loggers, config=saved_cfg.to_dict())
    _print_start_notes(logger, start.notes, s, has_env=envs.eval_env is not None)
    run = Run(saved_cfg, start.run_dir, agent, buffer, collector, envs.eval_env, envs.spec,
              np.random.default_rng(seeds["warmup"]), _int(seeds["eval"]), logger, state, on_step, hooks)
    if start.saved is not None:
        _continue_resumed_run(run, start.tree, start.saved, gamma)
    collector.on_episode_start = H.episode_start_fns(run.hooks)
    if cfg.intervention.kind != "none":  # intervened stretches into the demonstration segment (of the resumed buffer)
        run.demo_writer = DemoWriter(run.buffer)
    return run


@dataclass(frozen=True)
class _Start:
    """What a build starts from: a new run's directory and config, or a resumed run's (with its saved config, the
    checkpoint if it has one, and notes on what its config.json said that was not taken)."""

    run_dir: Path
    cfg: ExperimentConfig  # the configuration the run goes on with
    saved: ExperimentConfig | None = None  # resumed: the config.json it was saved with
    tree: dict | None = None  # resumed: its last checkpoint (None: none yet)
    notes: tuple[str, ...] = ()


def _start_or_resume(cfg: ExperimentConfig | None, resume_dir, resume_settings: Sequence[str], held: list) -> _Start:
    """A resumed run's directory (held by this process from here on), saved config and checkpoint; or a new run's
    directory, which must be new or empty (checked again under the lock once everything is built)."""
    if resume_dir is not None:
        run_dir, saved, resumed, tree, notes = _open_resumed_run(Path(resume_dir), resume_settings, held)
        return _Start(run_dir, resumed, saved, tree, notes)
    if resume_settings:
        raise ValueError("resume_settings change a resumed run; give resume_dir (a new run takes them in its config)")
    if cfg is None:
        raise ValueError("train() needs a configuration (cfg) or a run directory to resume (resume_dir)")
    run_dir = Path(cfg.run.run_dir) if cfg.run.run_dir else default_run_dir(cfg)
    check_new_run_dir(run_dir)
    return _Start(run_dir, cfg)


def _set_up_process(cfg: ExperimentConfig, allow_other_base: bool) -> None:
    """The configuration checked before anything is built, and this process's torch threads and allocator."""
    _check_run_config(cfg, allow_other_base)
    torch.set_num_threads(cfg.run.num_threads)
    retain_freed_memory()  # no page faults on every update's activations (see the function)


@dataclass(frozen=True)
class _Envs:
    """The run's environments: ``env`` the one this process steps (None with Ray collectors or without an env id),
    ``eval_env`` the evaluation env (None without an env id), the spec the agent and buffer are built for, and an
    env-less run's dataset (read once, for its spec and its rows)."""

    env: Any
    eval_env: Any
    spec: EnvSpec
    loaded: tuple[dict, dict] | None = None


def _make_envs(cfg: ExperimentConfig, seeds: dict[str, np.random.SeedSequence]) -> _Envs:
    """The evaluation env and the training env(s), made as the replay needs them (``replay.env_options``: HER keeps
    goal dicts) with the run's ``env.kwargs`` (gym.make's keyword arguments); without an env id (offline only, from
    a dataset: real-robot data) the spec is read from the data."""
    if not cfg.env.id:
        loaded = load_rows(cfg.data.dataset) if cfg.data.dataset else None
        return _Envs(None, None, dataset_spec(cfg, loaded), loaded)
    e, kw = cfg.env, {**cfg.replay.env_options, "env_kwargs": cfg.env.kwargs}
    eval_env = make_env(e.id, e.max_episode_steps, evaluation=True, **kw)  # (Atari: full games)
    if cfg.collectors.num:  # Ray collectors make their own envs
        env = None
    elif e.num_envs == 1:
        env = make_env(e.id, e.max_episode_steps, render_mode=renders(cfg), **kw)  # (a console shows its frames)
    else:
        env = make_vector_env(e.id, e.num_envs, e.vector_mode, e.max_episode_steps, **kw)
    if cfg.run.eval_fresh_starts:  # seeded once; every evaluation continues the stream (a checkpoint holds it)
        eval_env.reset(seed=_int(seeds["eval"]))
    return _Envs(env, eval_env, env_spec(eval_env))


def _make_agent(cfg: ExperimentConfig, spec: EnvSpec, seeds: dict[str, np.random.SeedSequence],
                wrap_agent: Callable | None, allow_other_base: bool) -> Any:
    """The registered agent (the only use of the call's trust: loading a base policy), as the loop will use it."""
    agent = build_agent(cfg, spec, seeds["agent"])
    if allow_other_base:  # (checked by the agent's load_state_dict: resume and run.init_from)
        agent.allow_other_base = True
    return wrap_agent(agent) if wrap_agent is not None else agent


def _stored_columns(cfg: ExperimentConfig, agent, spec: EnvSpec) -> tuple:
    """The extra columns the buffer keeps: the agent's behaviour records, and with interventions the agent's
    proposal and the takeover flag."""
    columns = tuple(getattr(agent, "stored_columns", tuple)())
    if cfg.intervention.kind != "none":
        columns += intervention_columns(spec.action_shape, "int64" if spec.discrete else "float32")
    return columns


def _new_loop_state(cfg: ExperimentConfig) -> LoopState:
    """The loop's counters at the start of a new run (a resumed run's come from its checkpoint)."""
    if cfg.schedule.num_offline_grad_steps and not cfg.data.dataset:
        raise ValueError("num_offline_grad_steps > 0 needs a dataset (--dataset PATH)")
    return LoopState(next_ckpt=cfg.run.checkpoint_every_env_steps, next_log=cfg.run.log_every_env_steps,
                     next_eval=0 if cfg.run.eval_at_start else cfg.run.eval_every_env_steps,
                     ref_min=cfg.data.ref_min_return, ref_max=cfg.data.ref_max_return)


def _make_collector(cfg: ExperimentConfig, envs: _Envs, columns: tuple, seeds: dict[str, np.random.SeedSequence],
                    agent, run_dir: Path | None = None) -> Any:
    """Who steps the envs: Ray collectors (``collectors.num``; relive.train.ray_collectors imports Ray only when
    connected), this process's env or vector env, or nobody (an env-less offline run)."""
    seed = _int(seeds["env"])
    if cfg.collectors.num:
        check_agent(agent)
        return RayCollectors(cfg, seed)
    if envs.env is None:
        return NoCollector()
    if cfg.env.num_envs == 1:
        return Collector(envs.env, envs.spec, seed, record_columns=columns,
                         intervener=build_intervener(cfg, envs.spec, envs.env, run_dir))
    return VectorCollector(envs.env, envs.spec, seed, record_columns=columns)


def _print_start_notes(logger: RunLogger, notes: Sequence[str], s, has_env: bool) -> None:
    """What a user should know before the run starts: the loader's notes, a run without an environment, a warm-up
    that leaves the online phase without a gradient step."""
    for note in notes:
        logger.print(f"note: {note}")
    if not has_env:
        logger.print("no environment (offline only, from the dataset; action bounds from its actions): evaluation "
                     "skipped (eval rows are NaN); export the trained policy with `relive export RUN_DIR`")
    if 0 < s.num_online_env_steps <= s.num_warmup_env_steps:  # gradient steps start once the stored rows pass it
        logger.print(f"warning: {s.num_online_env_steps} online env steps do not exceed the warm-up of "
                     f"{s.num_warmup_env_steps} (--warmup): the online phase makes no gradient step; raise "
                     "--online-steps or lower --warmup")


def _open_resumed_run(run_dir: Path, resume_settings: Sequence[str],
                      held: list) -> tuple[Path, ExperimentConfig, ExperimentConfig, dict | None, tuple[str, ...]]:
    """A run directory to resume, held by this process: (run_dir, its saved config, the config it resumes with,
    its checkpoint or None, notes on what its config.json said that was not taken). config.json is read by
    ``open_run_dir`` (no trust from it: ``resume_settings`` are the call's, ``--trust-code`` among them)."""
    if not (run_dir / CONFIG_FILE).is_file():
        raise ValueError(f"cannot resume {run_dir}: no config.json (not a run directory)")
    held.append(_hold_run(run_dir))  # a second `--resume` of this run stops here
    if (run_dir / "summary.json").is_file():
        raise ValueError(f"{run_dir} has already finished (summary.json); nothing to resume")
    opened = open_run_dir(run_dir, where=f"cannot resume {run_dir}")
    saved = opened.config
    cfg = _resume_config(saved, resume_settings)
    tree = None
    if has_checkpoint(run_dir):
        tree = load_checkpoint(run_dir)
        _check_checkpoint_config(run_dir, tree, saved)
    return run_dir, saved, cfg, tree, opened.notes


def dataset_spec(cfg: ExperimentConfig, loaded: tuple[dict, dict] | None = None):
    """An offline-only run without an environment: the spec read from its dataset (``spec_from_rows``), which must
    exist and be the run's only data; nothing online, no evaluation."""
    s = cfg.schedule
    if not cfg.data.dataset:
        raise ValueError("a run without an environment (no --env) trains offline from a dataset: give --dataset")
    if s.num_online_env_steps or cfg.collectors.num or cfg.env.num_envs > 1:
        raise ValueError("a run without an environment (no --env) is offline only: --online-steps 0, no collectors "
                         "or vector envs")
    rows = (loaded or load_rows(cfg.data.dataset))[0]  # (``loaded``: the dataset already read by the caller)
    return spec_from_rows(rows, str(cfg.data.dataset))


def _check_run_config(cfg: ExperimentConfig, allow_other_base: bool) -> None:
    """What a configuration must satisfy before anything is built."""
    cfg.schedule.check_update_rule()
    cfg.check_sizes()
    _check_devices(cfg)
    _check_random_warmup(cfg, agent_entry(cfg.agent_kind).target)
    if allow_other_base and not hasattr(agent_entry(cfg.agent_kind).target, "allow_other_base"):
        raise ValueError(f"--allow-other-base: agent {cfg.agent_kind!r} has no frozen base policy to check")
    if cfg.intervention.kind != "none" and (cfg.env.num_envs != 1 or cfg.collectors.num or not cfg.env.id
                                            or cfg.replay.device):
        raise ValueError(f"intervention.kind = {cfg.intervention.kind!r}: interventions run with one env in this "
                         "process (env.num_envs = 1, collectors.num = 0, an env.id) and the replay on the host "
                         "(replay.device unset)")
    if cfg.replay.shards and (not cfg.collectors.num or cfg.replay.device):
        raise ValueError(f"replay.shards = {cfg.replay.shards} (--replay-shards): a sharded replay runs on the Ray "
                         "cluster of the run's collectors (--collectors N) and on the host (replay.device unset)")
    ic = cfg.intervention
    if ic.kind in ("scripted", "state") and ic.budget > ic.demo_capacity:
        raise ValueError(f"intervention.budget ({ic.budget} intervened steps) exceeds intervention.demo_capacity "
                         f"({ic.demo_capacity} rows of room for them): the run would stop when the segment fills up")


def _new_buffer(cfg: ExperimentConfig, spec, columns: tuple, seeds) -> ReplayBuffer:
    common = dict(obs_dtype=spec.obs_dtype, action_dtype=np.int64 if spec.discrete else np.float32,
                  # the env's frame stacks (Atari): each frame stored once, stacks rebuilt when sampled
                  frame_stack=_frame_stack(cfg, spec),
                  extra_columns={c.name: c.spec for c in columns} or None,
                  # the agent's n-step TD targets: the buffer sums the returns at sample time
                  n_step=getattr(cfg.agent, "n_step", 1), gamma=getattr(cfg.agent, "gamma", 0.99))
    if cfg.replay.shards:  # a service of Ray shard actors (started once Ray is up and the run directory exists)
        sharded = ShardedReplay(cfg.replay.shards, cfg.replay.capacity, spec.obs_shape, spec.action_shape,
                                build_sampler(cfg, seeds["sampler"]), seed=_int(seeds["buffer"]),
                                timeout=cfg.replay.shard_timeout_s, prefetch=cfg.replay.shard_prefetch, **common)
        return cast(ReplayBuffer, sharded)  # (what the loop asks of a buffer; relive.train.sharded_replay)
    return ReplayBuffer(cfg.replay.capacity, spec.obs_shape, spec.action_shape,
                        sampler=build_sampler(cfg, seeds["sampler"]), seed=_int(seeds["buffer"]), **common,
                        # interventions: room for them in the never-evicted demonstration segment
                        demo_capacity=cfg.intervention.demo_capacity if cfg.intervention.kind != "none" else 0,
                        # replay.device: columns, draws and priorities on a torch device (relive.replay.samplers.device)
                        backend="torch" if cfg.replay.device else "ram", device=cfg.replay.device)


def _frame_stack(cfg: ExperimentConfig, spec) -> FrameStack | None:
    """The buffer's ``frame_stack`` for an env whose observation is a frame stack (``spec.frame_stack``, read from
    Gymnasium's FrameStackObservation by ``env_spec``), else None. A replay on a torch device (replay.device) keeps
    whole stacks: its backend does not rebuild them (k times the frames' memory)."""
    if spec.frame_stack is None or cfg.replay.device:
        return None
    k, padding = spec.frame_stack
    return FrameStack.gymnasium(k, padding)


def _load_start(cfg: ExperimentConfig, agent, buffer: ReplayBuffer, columns: tuple, gamma: float,
                state: LoopState, loaded: tuple[dict, dict] | None = None) -> None:
    """A new run's starting point: the offline dataset into the buffer, the agent from ``run.init_from``."""
    if cfg.data.dataset:
        _load_dataset(cfg, buffer, columns, gamma, state, loaded)
    if cfg.run.init_from:  # one pre-trained agent shared by several fine-tuning runs
        init = Path(cfg.run.init_from) / "agent_final"
        if not (init / "MANIFEST.json").is_file():
            raise ValueError(f"run.init_from: {init} holds no agent (a finished run directory has agent_final/)")
        with _must_fit(f"run.init_from: {init}", "its agent does not fit this run's agent", ValueError, RuntimeError):
            agent.load_state_dict(load_tree(init, kind="agent"))


def _new_run_hooks(cfg: ExperimentConfig, agent, buffer: ReplayBuffer, gamma: float, env) -> list:
    """The loop hooks the agent and the sampler declare, checked against the run's envs (on a refusal the training
    env is closed first: async vector envs have worker processes)."""
    hooks = H.collect_hooks(H.LoopContext(agent, buffer, cfg, gamma), agent, buffer.sampler)
    try:
        _check_num_envs(cfg, hooks)
        if cfg.replay.shards:
            check_hooks(H.LoopContext(agent, buffer, cfg, gamma), agent, buffer.sampler)
    except ValueError:
        if env is not None:
            env.close()
        raise
    return hooks


def _create_run_dir(cfg: ExperimentConfig, run_dir: Path, held: list, env) -> None:
    """Make ``run_dir`` a run: held by this process, still free of another run, with its config.json (a directory
    this call created is removed again if the config cannot be written)."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        held.append(_hold_run(run_dir))
        check_new_run_dir(run_dir)  # under the lock: no other process started a run here meanwhile
    except ValueError:
        if env is not None:
            env.close()
        raise
    try:
        save_config(cfg, run_dir / "config.json")
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _continue_resumed_run(run: Run, tree: dict | None, saved: ExperimentConfig, gamma: float) -> None:
    """A resumed run takes its checkpoint (the checkpoint's buffer replaces the new one: hooks are collected from
    it), records settings that changed, and ends the episodes its envs were in when it stopped."""
    _resume(run, tree)
    if run.eval_env is not None:  # the checkpoint's sampler, bound to the env again (HER: functions are not saved)
        run.buffer.sampler.bind_env(run.eval_env)
    if run.cfg != saved:  # resumed where or how it runs differently: from now on its config says so
        save_config(run.cfg, run.run_dir / "config.json")
        run.logger.print("resumed with " + ", ".join(f"{k} = {v!r}" for k, v in _changed(saved, run.cfg)))
    run.hooks = H.collect_hooks(H.LoopContext(run.agent, run.buffer, run.cfg, gamma), run.agent, run.buffer.sampler)
    if getattr(run.collector, "resumed", False):  # envs were reset mid-episode: end their open episodes
        close_streams(run, range(run.collector.num_envs))


def _check_random_warmup(cfg: ExperimentConfig, agent_cls) -> None:
    """An agent class that cannot have uniform random actions in place of its own (``random_warmup_problem``, e.g. one
    whose warm-up is its own and whose episodes start with unstored steps) refuses the random warm-up by name,
    before anything runs, instead of failing mid-run."""
    s, problem = cfg.schedule, getattr(agent_cls, "random_warmup_problem", None)
    if problem and s.num_warmup_env_steps and s.warmup_policy == "random":
        raise ValueError(f"schedule.num_warmup_env_steps = {s.num_warmup_env_steps} (--warmup) with warmup_policy "
                         f"'random': agent {cfg.agent_kind!r} cannot take the trainer's random warm-up: {problem}")


def _check_num_envs(cfg: ExperimentConfig, hooks: list) -> None:
    """Per-episode state held for one environment (an OnEpisodeStart hook without ``per_env``) cannot serve several
    envs stepped together: refuse, naming the component. (The built-in agents keep theirs per env.)"""
    single = [h for h in H.of_type(hooks, H.OnEpisodeStart) if not h.per_env]
    if cfg.env.num_envs > 1 and single:
        owners = sorted({type(getattr(h.fn, "__self__", h.fn)).__name__ for h in single})
        raise ValueError(f"env.num_envs = {cfg.env.num_envs}: {', '.join(owners)} keeps per-episode state for one "
                         f"environment (an OnEpisodeStart hook without per_env=True), which several envs stepped "
                         f"together would share; use num_envs = 1, or declare the hook per_env and key the state "
                         f"by the env index it receives")


def _load_dataset(cfg, buffer: ReplayBuffer, columns, gamma: float, state: LoopState,
                  loaded: tuple[dict, dict] | None = None) -> None:
    rows, meta = loaded or load_rows(cfg.data.dataset, env_id=cfg.env.id)
    n = len(rows["reward"])
    for c in columns:
        if c.name not in rows and c.offline == "required":
            raise ValueError(f"dataset {cfg.data.dataset} lacks column {c.name!r}, which agent {cfg.agent_kind!r} "
                             f"needs for offline rows ({c.doc or 'a behaviour record'})")
        if c.name not in rows and c.name != "mc_return":  # (loaders compute returns-to-go themselves)
            rows[c.name] = c.filled(n)
    if cfg.schedule.num_offline_grad_steps and n < cfg.schedule.batch_size:
        raise ValueError(f"dataset {cfg.data.dataset} has {n} rows, fewer than one batch "
                         f"(schedule.batch_size = {cfg.schedule.batch_size}): the offline phase could not take a "
                         f"single gradient step; use a smaller --batch-size or a larger dataset")
    # named by its path / id: run checkpoints then refer to the offline rows by id + SHA-256 instead of copying
    # them (a 1M-row dataset would add ~120 MB to every checkpoint); a resume loads the dataset again (_resume)
    if isinstance(buffer, ShardedReplay):  # (no returns-to-go column: its agents' hooks are refused)
        buffer.add_offline(stored_rows(cfg, rows), dataset_id=str(cfg.data.dataset))
    else:
        fill_offline(buffer, stored_rows(cfg, rows), gamma, dataset_id=str(cfg.data.dataset))
    state.ref_min = state.ref_min if state.ref_min is not None else meta.get("ref_min_return")
    state.ref_max = state.ref_max if state.ref_max is not None else meta.get("ref_max_return")


def run_offline_rows(cfg: ExperimentConfig, buffer_state: dict, where):
    """For a run checkpoint's buffer that refers to its offline rows (``buffer_state``: its ``state_dict``): a function
    dataset id -> the rows as the run stored them, for ``ReplayBuffer.from_state_dict(..., offline_rows=)``: the
    config's dataset loaded again (``stored_rows``), and the extra columns (``mc_return``, behaviour records), which
    the checkpoint copies whole, taken from the checkpoint. The hash check there refuses a changed dataset."""
    def rows(dataset_id: str) -> dict:
        dataset = cfg.data.dataset
        if dataset is None or str(dataset) != dataset_id:
            raise ValueError(f"{where}: its checkpoint refers to offline dataset {dataset_id!r}, its config names "
                             f"{dataset!r}")
        data = stored_rows(cfg, load_rows(dataset, env_id=cfg.env.id)[0])
        k = int(buffer_state["storage"]["offline_ref"]["num_offline"])
        for name in buffer_state["config"]["storage"]["extra_columns"]:
            data[name] = np.asarray(buffer_state["storage"]["columns"][name])[:k]
        return data
    return rows


def _resume(run: Run, tree: dict | None) -> None:
    if tree is None:  # stopped before its first checkpoint: start over, cleanly
        run.logger.truncate_after(-1, -1)
        run.logger.print(f"{run.run_dir} has no checkpoint yet: starting it from the beginning")
        return
    if recorded_config(tree) is None:
        run.logger.print(f"{run.run_dir}: its checkpoint (an earlier relive version) records no configuration; "
                         "config.json is taken as the one it was made with")
    where = f"cannot resume {run.run_dir}"
    agent: Any = run.agent  # (any registered agent, and any env: loop.Run types them as object)
    eval_env: Any = run.eval_env
    with _must_fit(where, "its checkpoint's agent does not fit the agent its config.json describes", ValueError,
                   RuntimeError):  # (torch: a size mismatch, a missing tensor)
        agent.load_state_dict(tree["agent"])
    with _must_fit(where, "its checkpoint's state does not fit this run"):
        # the config says where the replay lives: a run saved with replay.device set resumes on the host without it
        if isinstance(run.buffer, ShardedReplay):  # (its shards restored themselves from their checkpoints)
            run.buffer.load_state_dict(tree["buffer"])
        else:
            run.buffer = ReplayBuffer.from_state_dict(tree["buffer"], offline_rows=run_offline_rows(
                run.cfg, tree["buffer"], where), device=run.cfg.replay.device or HOST)
        run.collector.load_state_dict(tree["collector"])
        run.warmup_rng.bit_generator.state = tree["warmup_rng"]
        if "eval_rng" in tree:
            eval_env.unwrapped.np_random.bit_generator.state = tree["eval_rng"]
        run.state = LoopState(**tree["loop"])
    st = run.state
    run.logger.truncate_after(st.env_steps, st.grad_steps)
    run.logger.print(f"resumed {run.run_dir} at env step {st.env_steps}, gradient step {st.grad_steps}")


@contextmanager
def _must_fit(where: str, what: str, *also: type[BaseException]):
    """A saved state that does not fit what loads it (a missing or unexpected key, a value of the wrong type; with
    ``also``, e.g. a torch size mismatch) as one ValueError naming ``where`` and ``what``, instead of a traceback
    from deep inside. (Running out of device memory is not a misfit: it passes.)"""
    misfits: tuple[type[BaseException], ...] = (KeyError, TypeError, IndexError, AttributeError, *also)
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise
    except misfits as e:
        text = " ".join(str(e).split())
        if len(text) > 600:  # (the end kept: that is where a message says what to do)
            text = f"{text[:250]} ... {text[-300:]}"
        raise ValueError(f"{where}: {what} ({type(e).__name__}: {text})") from None


def _git_sha() -> str:
    """The source tree's commit (+ "-dirty"), or "" outside a git checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"{sha}-dirty" if sha and dirty else sha
