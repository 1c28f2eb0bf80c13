"""The loop: gradient steps, the offline phase, the online phase and its cadences (evaluate, checkpoint, log, stop).

A gradient step is [the components' due ``EveryGradSteps`` hooks] -> sample -> ``agent.update`` ->
``buffer.update(signals)`` -> ``AfterUpdate`` hooks. The online phase is one loop over a *collection strategy*:
:class:`LocalCollection` (one env, or a Gymnasium vector env, in this process: collect ``env_steps_per_chunk``
steps -> ``OnEpisodeEnd`` hooks -> ``stored rows x utd_ratio`` gradient steps) or, chosen by the trainer,
:class:`relive.train.ray_collection.RayCollection` (Ray actors ship chunks of rows; a rate limiter interleaves chunks
and gradient steps at the same update-to-data ratio). Both call :func:`cadence` (evaluation when due, the stop at
``run.stop_at_return``, a checkpoint when due) and the loop logs both the same way (:func:`log_online`).

The update clock counts stored rows: a step an agent executes without storing it (``Acted.store = False``, PLD's
probing) counts for the env-step budget (``schedule.num_online_env_steps``, evaluation and checkpoint cadences) but
is not data and earns no gradient step (``grad_steps_earned``). Building and resuming a run: :mod:`relive.train.
trainer`; the loop names no method (what a method needs it declares in :mod:`relive.hooks`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import gymnasium as gym
import numpy as np

from relive import hooks as H
from relive.agents.contract import Agent
from relive.config import ExperimentConfig, ScheduleConfig
from relive.envs import EnvSpec, num_obs, random_actions
from relive.files import DirectoryLock
from relive.replay import ReplayBuffer
from relive.replay.checkpoint import save_tree
from relive.train.callbacks import Callback, dispatch
from relive.train.checkpoint import save_checkpoint
from relive.train.collector import Collector, VectorCollector
from relive.train.evaluation import evaluate_episodes, normalized_score
from relive.train.intervention import DemoWriter
from relive.train.logging import RunLogger

if TYPE_CHECKING:
    from relive.train.ray_collectors import RayCollectors

FINISHED = "finished"  # a collection strategy's step result: the online budget is spent and nothing is owed


@dataclass
class LoopState:
    """The loop's own counters (checkpointed with the components)."""

    grad_steps: int = 0
    env_steps: int = 0
    offline_done: int = 0
    online_start_grad_step: int = -1  # gradient steps taken when the online phase began (-1: not yet)
    next_ckpt: int = 0
    next_eval: int = 0
    next_log: int = 0
    offline_return: float = math.nan
    best_return: float = -math.inf
    online_share_sum: float = 0.0  # sum of online shares of sampled batches since the last evaluation
    online_share_batches: int = 0
    ref_min: float | None = None
    ref_max: float | None = None


@dataclass
class Run:
    """Everything a running experiment holds."""

    cfg: ExperimentConfig
    run_dir: Path
    agent: Agent
    buffer: ReplayBuffer
    collector: Collector | VectorCollector | RayCollectors  # (Ray actors: collectors.num > 0)
    eval_env: gym.Env | None  # None: an offline-only run without an environment
    spec: EnvSpec
    warmup_rng: np.random.Generator
    eval_seed: int
    logger: RunLogger
    state: LoopState
    on_step: Callable[[int, int], None] | None  # (unused by the loop: train() passes on_step as a callback)
    hooks: list = field(default_factory=list)
    train_metrics: Mapping[str, float] = field(default_factory=dict)  # the last update's (read when logged)
    start: float = field(default_factory=time.perf_counter)
    last_checkpoint: float | None = None  # wall-clock (monotonic) of the last checkpoint, or of the first cadence
    demo_writer: DemoWriter | None = None  # interventions: intervened stretches into the demonstration segment
    lock: DirectoryLock | None = None  # the run directory, held by this process for the whole run
    callbacks: list[Callback] = field(default_factory=list)  # train(callbacks=...): notify() calls them
    stop_reason: str | None = None  # a callback asked the run to stop (it ends cleanly, as a finished run)


def stored_rows(cfg: ExperimentConfig, rows: dict) -> dict:
    """Rows as the buffer stores them: with ``env.truncation_as_termination`` a time-limit truncation becomes a
    termination (``terminated = True``, ``truncated = False``), so every agent's target there is r with no
    bootstrap, and episode bookkeeping (ReaPER's S_e) sees a terminal row. The one place the loop applies it,
    for online and dataset rows alike."""
    if not cfg.env.truncation_as_termination:
        return rows
    truncated = np.asarray(rows["truncated"], bool)
    return rows | {"terminated": np.asarray(rows["terminated"], bool) | truncated,
                   "truncated": np.zeros_like(truncated)}


def checkpoint(run: Run) -> None:
    run.state.online_share_sum = float(run.state.online_share_sum)  # (a device batch's share: a tensor until read)
    tree = {"agent": run.agent.state_dict(), "buffer": run.buffer.state_dict(),
            "collector": run.collector.state_dict(), "loop": asdict(run.state),
            "warmup_rng": run.warmup_rng.bit_generator.state}
    if run.cfg.run.eval_fresh_starts and run.eval_env is not None:  # the next evaluation's start states
        tree["eval_rng"] = run.eval_env.unwrapped.np_random.bit_generator.state
    save_checkpoint(run.run_dir, tree, config=run.cfg.to_dict())  # (resume compares config.json with it)
    run.last_checkpoint = time.monotonic()
    notify(run, "on_checkpoint", run.run_dir, run.state.env_steps, run.state.grad_steps)


def notify(run: Run, event: str, *args) -> None:
    """The callbacks' ``event`` (``on_step`` after every gradient step and collected chunk, ``on_evaluation``,
    ``on_checkpoint``; ``train(on_step=fn)`` is one too). One that asks to stop sets ``run.stop_reason``: the phases
    end at the end of the current step, with a checkpoint, and the run finishes as at the end (summary.json
    ``status = "stopped"``)."""
    reason = dispatch(run.callbacks, event, *args) if run.callbacks else None
    if reason is not None and run.stop_reason is None:
        run.stop_reason = reason
        run.logger.print(f"stopping at env step {run.state.env_steps}, gradient step {run.state.grad_steps}: "
                         f"{reason}")


def stopping(run: Run) -> bool:
    return run.stop_reason is not None


def close_streams(run: Run, streams) -> None:
    """End each stream's open episode where it stands (its env was reset or its collector lost), with the
    ``OnEpisodeEnd`` hooks of the cut episodes (returns-to-go)."""
    for stream in streams:
        slots = run.buffer.close_stream(stream, terminated=run.cfg.env.truncation_as_termination)
        for h in H.of_type(run.hooks, H.OnEpisodeEnd) if slots.size else ():
            h.fn(slots)



# -- one gradient step --------------------------------------------------------------------------------------
def gradient_step(run: Run, phase: str) -> None:
    st, s = run.state, run.cfg.schedule
    if len(run.buffer) < s.batch_size:
        return  # not enough rows yet (no dataset and a short warm-up): updates wait for a full batch
    in_phase = st.grad_steps - st.online_start_grad_step if phase == "online" else st.offline_done
    for h in H.of_type(run.hooks, H.EveryGradSteps):  # e.g. ARB Alg. 1 step b: re-score before sampling
        if h.phase == phase and in_phase % h.every == 0:
            h.fn()
    sequences = getattr(run.agent, "sequence_spec", None)  # an agent that trains on slices (recurrent, chunked)
    seq = sequences() if sequences is not None else None
    batch = run.buffer.sample(s.batch_size) if seq is None else run.buffer.sample_sequences(s.batch_size, **seq)
    result = run.agent.update(batch)
    if result.signals:
        run.buffer.update(batch.info, **result.signals)  # per-sample signals back to the sampler (td_error, ...)
    for h in H.of_type(run.hooks, H.AfterUpdate):
        h.fn(batch, result)
    run.train_metrics = result.metrics
    source = batch.info.source  # (a device batch: summed there, read when the row is logged)
    st.online_share_sum += float(np.mean(source)) if isinstance(source, np.ndarray) else source.float().mean()
    st.online_share_batches += 1
    st.grad_steps += 1
    notify(run, "on_step", st.env_steps, st.grad_steps)


def enter_phase(run: Run, phase: str) -> None:
    """The ``OnPhase`` hooks: a phase ("offline" / "online") begins."""
    for h in H.of_type(run.hooks, H.OnPhase):
        h.fn(phase)


# -- offline phase -------------------------------------------------------------------------------------------
def offline_phase(run: Run) -> None:
    st, s, rc = run.state, run.cfg.schedule, run.cfg.run
    if st.offline_done < s.num_offline_grad_steps:
        enter_phase(run, "offline")
    phase_start, phase_grad = time.perf_counter(), st.grad_steps
    while st.offline_done < s.num_offline_grad_steps and not stopping(run):
        gradient_step(run, "offline")
        st.offline_done += 1
        if st.offline_done % 100 == 0 or st.offline_done == s.num_offline_grad_steps:
            rate = (st.grad_steps - phase_grad) / max(time.perf_counter() - phase_start, 1e-9)
            run.logger.progress("offline", st.offline_done, f"{rate:.0f} grad/s")
        if st.offline_done % rc.log_every_env_steps == 0:
            run.logger.metrics(0, dict(run.train_metrics) | {"grad_step": st.grad_steps, "phase": "offline"})
        if st.offline_done % rc.checkpoint_every_offline_grad_steps == 0 \
                or st.offline_done == s.num_offline_grad_steps or stopping(run):
            checkpoint(run)


# -- online phase --------------------------------------------------------------------------------------------
def online_phase(run: Run, strategy: Callable[[Run], Collection] | None = None) -> dict:
    """Collect and update on the collection strategy, ``strategy(run)`` (the trainer's choice: Ray actors,
    :class:`relive.train.ray_collection.RayCollection`, for ``collectors.num > 0``; by default
    :class:`LocalCollection`, this process's env or vector env), with evaluation, checkpoints and the stop on
    :func:`cadence`, logging and progress here. Returns the last evaluation row."""
    st = run.state
    if stopping(run):  # a callback stopped the offline phase: no online phase, the final evaluation
        return evaluation(run)
    if st.online_start_grad_step < 0:
        st.online_start_grad_step = st.grad_steps
    enter_phase(run, "online")
    collection = (strategy or LocalCollection)(run)
    phase_start, phase_env, phase_grad = time.perf_counter(), st.env_steps, st.grad_steps
    try:
        stop: dict | str | None = collection.start()
        while stop is None:
            stop = collection.step()
            if stop is not None:
                break
            elapsed = max(time.perf_counter() - phase_start, 1e-9)
            env_rate, grad_rate = (st.env_steps - phase_env) / elapsed, (st.grad_steps - phase_grad) / elapsed
            if st.env_steps >= st.next_log and st.env_steps > 0:
                log_online(run, env_rate, grad_rate, collection.log_extra())
            run.logger.progress("online", st.env_steps, f"{env_rate:.0f} env/s {grad_rate:.0f} grad/s")
    finally:
        collection.close()
    if stopping(run) and run.collector.can_checkpoint:  # (one env mid-episode: the last checkpoint stays the last)
        checkpoint(run)
    if run.demo_writer is not None:  # the run stops: an intervened stretch still going on ends where it stands
        run.demo_writer.flush()
    return stop if isinstance(stop, dict) else evaluation(run)


def cadence(run: Run, before_checkpoint: Callable[[], None] | None = None) -> dict | None:
    """The online cadences, between chunks: evaluate when due, then checkpoint when due and the collection allows
    (one env: between episodes, exact; a vector env or Ray collectors: at any chunk). Returns the evaluation row
    when it reaches ``run.stop_at_return`` (the run stops there), else None."""
    st, seconds = run.state, run.cfg.run.checkpoint_every_seconds
    stop = due_evaluation(run)
    if stop is not None:
        return stop
    if run.last_checkpoint is None:  # (this process's first cadence: the wall-clock counts from here)
        run.last_checkpoint = time.monotonic()
    by_time = seconds is not None and time.monotonic() - run.last_checkpoint >= seconds
    if (st.env_steps >= st.next_ckpt or by_time) and run.collector.can_checkpoint:
        if st.env_steps >= st.next_ckpt:
            st.next_ckpt = st.env_steps + run.cfg.run.checkpoint_every_env_steps
        if before_checkpoint is not None:
            before_checkpoint()
        checkpoint(run)
    return None


class Collection(Protocol):
    """A collection strategy of the online phase: ``start()`` and then ``step()`` until one returns a stop (the
    evaluation row that reached ``run.stop_at_return``, or :data:`FINISHED`); ``log_extra()`` adds to the online
    log; ``close()`` at the end."""

    def start(self) -> dict | None: ...

    def step(self) -> dict | str | None: ...

    def log_extra(self) -> dict: ...

    def close(self) -> None: ...


class LocalCollection:
    """One env or a vector env in this process: each step is the cadences, one chunk of ``env_steps_per_chunk``
    env steps, then the gradient steps it earned (once the stored rows pass the warm-up)."""

    def __init__(self, run: Run):
        self.run = run

    def start(self) -> None:
        return None

    def step(self) -> dict | str | None:
        run, st, s = self.run, self.run.state, self.run.cfg.schedule
        if st.env_steps >= s.num_online_env_steps or stopping(run):
            return FINISHED
        stop = cadence(run)
        if stop is not None:
            return stop
        if stopping(run):  # (a callback of the checkpoint just written)
            return FINISHED
        stored_before = stored_env_steps(run)
        k = collect(run, min(s.env_steps_per_chunk, s.num_online_env_steps - st.env_steps))  # (a multiple of N)
        if stored_env_steps(run) > s.num_warmup_env_steps:
            for _ in range(grad_steps_earned(s, k, stored_env_steps(run) - stored_before)):
                if stopping(run):
                    break
                gradient_step(run, "online")
        return None

    def log_extra(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def stored_env_steps(run: Run) -> int:
    """Online env steps whose rows were stored: executed minus unstored (probing) steps. The update clock."""
    return run.state.env_steps - run.collector.num_unstored_steps


def grad_steps_earned(s: ScheduleConfig, executed: int, stored: int) -> int:
    """Gradient steps after a chunk of ``executed`` env steps of which ``stored`` were stored: ``utd_ratio`` per
    stored row, or ``grad_steps_per_chunk`` scaled by the chunk's stored share (rounded down). Unstored steps
    (PLD's probing: executed, not stored) are not data and earn none (PLD spec §10.2: updates run only inside
    the stored rollout loop); for an agent that stores every step this is ``chunk x utd_ratio`` as always."""
    if s.grad_steps_per_chunk:
        return s.grad_steps_per_chunk * stored // executed if executed else 0
    return stored * s.utd_ratio


def collect(run: Run, k: int) -> int:
    """``k`` env steps into the buffer (warm-up: uniform random actions unless ``warmup_policy = "agent"``), then
    the ``OnEpisodeEnd`` hooks of the episodes that ended among the stored rows. With ``num_envs`` envs, k is
    rounded up to a multiple of it and env i's rows go to stream i. Returns the env steps taken."""
    st, s, collector = run.state, run.cfg.schedule, run.collector
    if not isinstance(collector, Collector | VectorCollector):
        raise TypeError(f"collect() steps this process's env or vector env, not a {type(collector).__name__}")

    def policy(obs):
        if st.env_steps < s.num_warmup_env_steps and s.warmup_policy == "random":
            return random_actions(run.spec, num_obs(obs), run.warmup_rng)
        return run.agent.act(obs, explore=True)  # (may return a behaviour record, or store=False to probe)

    chunks, k = collector.step_streams(policy, k)  # truncation: next_obs is the true final obs
    store_chunks(run, chunks)
    st.env_steps += k
    notify(run, "on_step", st.env_steps, st.grad_steps)
    return k


def store_chunks(run: Run, chunks, stream_offset: int = 0) -> None:
    """``[(stream, rows)]`` into the buffer (stream ``stream_offset + stream``), then the ``OnEpisodeEnd`` hooks of
    the episodes that ended among the stored rows."""
    episode_end = H.of_type(run.hooks, H.OnEpisodeEnd)
    for stream, rows in chunks:
        rows = stored_rows(run.cfg, rows)
        if not len(rows["reward"]):
            continue
        if run.demo_writer is None:
            slots = run.buffer.extend(rows, stream=stream_offset + stream)
        else:  # interventions: tagged on the ring, and each intervened stretch into the demonstration segment
            slots = run.buffer.extend(rows, stream=stream_offset + stream, origin=DemoWriter.origin(rows))
            run.demo_writer.add(rows)
        if episode_end:
            for i in np.flatnonzero((rows["terminated"] | rows["truncated"]) & (slots >= 0)):
                ep = run.buffer.episode_slots_of(int(slots[i]))
                for h in episode_end:
                    h.fn(ep)


def due_evaluation(run: Run) -> dict | None:
    """Evaluate when due (``state.next_eval``); the evaluation row when it reaches ``run.stop_at_return`` (the run
    stops there), else None."""
    st, rc = run.state, run.cfg.run
    if st.env_steps < st.next_eval:
        return None
    row = evaluation(run)
    if st.env_steps == 0:
        st.offline_return = row["eval/return_mean"]
    st.next_eval += rc.eval_every_env_steps
    if stopping(run):  # a callback's on_evaluation asked to stop: this row is the final one
        return row
    if rc.stop_at_return is not None and row["eval/return_mean"] >= rc.stop_at_return:
        run.logger.print(f"evaluation return {row['eval/return_mean']:.1f} >= {rc.stop_at_return}: stopping "
                         f"at env step {st.env_steps} (run.stop_at_return)")
        return row
    return None


def evaluation(run: Run) -> dict:
    st, rc = run.state, run.cfg.run
    seed = None if rc.eval_fresh_starts else run.eval_seed  # None: new start states (the stream continues)
    if run.eval_env is None:  # an offline-only run without an environment: nothing to evaluate on (NaN rows)
        returns, successes = np.full(1, math.nan), None
    else:
        returns, successes = evaluate_episodes(run.eval_env, run.agent, rc.eval_episodes, seed=seed,
                                               success_key=run.cfg.env.success_key, success_at=run.cfg.env.success_at)
    mean = float(returns.mean())
    st.best_return = max(st.best_return, mean)
    frac = float(st.online_share_sum) / st.online_share_batches if st.online_share_batches else math.nan
    row = {"env_step": st.env_steps, "grad_step": st.grad_steps, "eval/return_mean": mean,
           "eval/return_std": float(returns.std()),
           "eval/normalized_score": normalized_score(mean, st.ref_min, st.ref_max),
           "replay/online_fraction": frac, "time/seconds": time.perf_counter() - run.start}
    if successes is not None:  # the task's own success flag (env.success_key: Meta-World, the mazes, Fetch)
        row["eval/success_rate"] = float(np.mean(successes))
    elif run.cfg.env.success_return is not None:  # goal tasks (return 1 on success) or a return threshold (PLD)
        row["eval/success_rate"] = float(np.mean(returns >= run.cfg.env.success_return))
    run.logger.evaluation(row)
    notify(run, "on_evaluation", dict(row))
    if rc.save_agent_snapshots:
        save_tree(run.run_dir / "snapshots" / f"agent_{st.env_steps}", run.agent.state_dict(), kind="agent")
    st.online_share_sum, st.online_share_batches = 0.0, 0  # the next row reports the batches since this one
    return row


def log_online(run: Run, env_rate: float, grad_rate: float, extra: dict | None = None) -> None:
    """A metrics row of the online phase (the agent's last update metrics, the buffer's stats, rates, the
    returns of the episodes finished since the last row), with ``extra`` (the collection strategy's own)."""
    st, c = run.state, run.collector
    returns = c.finished_returns
    run.logger.metrics(st.env_steps, dict(run.train_metrics) | run.buffer.stats() | {
        "grad_step": st.grad_steps, "phase": "online", "time/env_steps_per_s": env_rate,
        "time/grad_steps_per_s": grad_rate, "collect/num_unstored_steps": float(c.num_unstored_steps),
        "train/episode_return": float(np.mean(returns)) if returns else math.nan}
        | intervention_metrics(run) | (extra or {}))
    c.finished_returns = []
    st.next_log += run.cfg.run.log_every_env_steps


def intervention_metrics(run: Run) -> dict:
    """With an intervener: ``collect/interventions_per_episode`` (intervened steps per episode finished since the last
    row), ``collect/intervention_rate`` (their share of those episodes' steps), ``collect/num_intervened_steps``
    (all time) and ``replay/num_demonstrations`` (rows that joined the demonstration segment during online training;
    a stretch still going on joins when it ends)."""
    c = run.collector
    if not isinstance(c, Collector) or c.intervener is None:  # (an intervener steps one env in this process)
        return {}
    per_episode, lengths = c.finished_interventions, c.finished_lengths
    c.finished_interventions, c.finished_lengths = [], []
    st = run.buffer.storage
    return {"collect/interventions_per_episode": float(np.mean(per_episode)) if per_episode else math.nan,
            "collect/intervention_rate": float(np.sum(per_episode) / np.sum(lengths)) if per_episode else math.nan,
            "collect/num_intervened_steps": float(c.num_intervened_steps),
            "replay/num_demonstrations": float(st.num_offline - st.num_before_online)}
