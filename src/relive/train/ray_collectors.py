"""Parallel collectors on Ray: ``relive train ... --collectors N`` (issue 16; docs/scaling.md).

The learner (the training process) keeps the replay buffer, the agent and the one training loop; N collector
actors step environments and ship rows. Sampling never crosses a process boundary (a buffer behind an actor serves
~40x fewer sample calls than one in process), only chunks of rows do::

    learner (this process)                          collector c (a Ray actor, CollectorWorker)
      buffer, agent, hooks, evaluation, checkpoints   its env(s): env.num_envs, a vector env if > 1
      RateLimiter: env steps vs gradient steps        a CPU copy of the agent (its acting modules)
      publish(weights) every k updates: ray.put  -->  pulls them (ray.get) when the version changed
      request(n env steps, random warm-up?)      -->  steps n, keeps its episodes across requests
                                                 <--  chunk: {stream: rows (NumPy)}, collector, incarnation,
                                                      chunk_id, policy_version, env_steps

- **Streams**: collector ``c``'s env ``j`` writes replay stream ``c * env.num_envs + j``; episodes, returns-to-go and
  per-episode sampler state follow each stream (``ReplayBuffer.extend(rows, stream=...)``).
- **Update-to-data ratio** is the learner's, enforced by :class:`RateLimiter` (Reverb's ``SampleToInsertRatio`` in
  env-step units): the learner takes a gradient step only while its steps stay below ``utd_ratio x`` (stored env
  steps received - warm-up; an unstored probing step earns none, as in the in-process loop), and waits for chunks
  otherwise; a collector gets its next request only while the env steps received + in flight stay within
  ``collectors.max_lag_env_steps`` of what the gradient steps consumed. A collector without a request is idle: that
  is how collectors block. The totals are exact: a run of T stored env steps takes ``utd_ratio x (T - warm-up)``
  online gradient steps whatever the timing.
- **Acting clock**: an agent whose exploration schedule counts the env steps it acted for names that counter
  (``acting_clock``: DDQN's epsilon); the learner sets it to the env steps received and publishes it with the
  weights, so epsilon follows the run's env steps, not each copy's own (to within one publication).
- **Policy version**: the learner's gradient step when the weights were published (``ray.put`` once, every
  ``collectors.sync_weights_every_grad_steps``); each chunk carries the version that acted
  (``collect/policy_lag_grad_steps`` in metrics.jsonl).
- **Faults**: a collector that dies (SIGKILL, node lost) is noticed when its request fails; its in-flight chunk is
  lost (never counted: those env steps are requested again), each of its streams' open episodes is ended where it
  stood (``ReplayBuffer.close_stream``: its last stored row becomes a truncation), and a new actor (next
  *incarnation*, fresh seeds) takes over with the next chunk id. Chunk ids are per collector and consecutive; a
  chunk whose id is not the expected one is dropped, so a row is never stored twice.
- **Checkpoints** hold the chunk ids, incarnations and the limiter's counters with the rest of the run (every
  ``run.checkpoint_every_env_steps``, at any chunk boundary). Resume starts new actors and ends every stream's open
  episode, as vector envs do; a learner crash loses what arrived after its last checkpoint (at most one interval),
  and ``chunks.jsonl`` (one line per received chunk or lost collector) is cut back to the checkpoint.

Ray is imported lazily: relive imports without it; ``--collectors`` without Ray says ``pip install 'relive[ray]'``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from types import ModuleType
from typing import Any

import numpy as np
import torch

from relive import hooks as H
from relive.agents import networks as nets
from relive.config import config_from_dict
from relive.envs import env_spec, make_env, make_vector_env, num_obs
from relive.envs import random_actions as uniform
from relive.registry import agent_entry
from relive.train.collector import Collector, VectorCollector

RAY_MISSING = "--collectors needs Ray, which is not installed: pip install 'relive[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(RAY_MISSING) from None
    return ray


def check_agent(agent) -> None:
    """Refuse an agent whose acting cannot run on a copy (``remote_acting_problem``: why, in words)."""
    problem = getattr(agent, "remote_acting_problem", None)
    if problem:
        raise ValueError(f"--collectors: {type(agent).__name__} cannot act in collector processes: {problem}; use "
                         f"--num-envs N (one process) instead")


def acting_state(agent) -> dict:
    """What a collector's copy needs to act: the modules the agent names in ``acting_modules`` (default: every
    ``torch.nn.Module`` attribute), as NumPy arrays, and the value of its ``acting_clock`` counter if it names one
    (an exploration schedule that counts the env steps acted for, e.g. DDQN's epsilon)."""
    names = getattr(agent, "acting_modules", None) or [k for k, v in vars(agent).items()
                                                       if isinstance(v, torch.nn.Module)]
    state: dict[str, Any] = {"modules": {name: nets.module_state(getattr(agent, name)) for name in names}}
    clock = getattr(agent, "acting_clock", None)
    if clock:
        state["clock"] = int(getattr(agent, clock))
    return state


def load_acting_state(agent, state: dict) -> None:
    for name, module_state in state["modules"].items():
        nets.load_module_state(getattr(agent, name), module_state)
    if "clock" in state:
        setattr(agent, agent.acting_clock, state["clock"])


class RateLimiter:
    """Env steps (inserts) against gradient steps (samples) at ``samples_per_insert = num / den`` (the update-to-data
    ratio), after ``min_inserts`` warm-up env steps: Reverb's ``SampleToInsertRatio`` counted in env steps.

    - the learner may take ``sample_budget()`` gradient steps now: floor(spi x (inserts - min_inserts)) - samples,
      never more (it waits for data instead);
    - a collector may be asked for ``n`` more env steps while inserts + in flight + n - min_inserts - samples / spi
      <= ``max_lag`` (env steps the data may run ahead of the updates).
    """

    def __init__(self, samples_per_insert: tuple[int, int], min_inserts: int, max_lag: int):
        self.num, self.den = (int(x) for x in samples_per_insert)
        if self.num < 1 or self.den < 1 or max_lag < 1:
            raise ValueError(f"RateLimiter needs samples_per_insert > 0 and max_lag >= 1, got "
                             f"{self.num}/{self.den}, {max_lag}")
        self.min_inserts, self.max_lag = int(min_inserts), int(max_lag)
        self.inserts = 0  # env steps received
        self.samples = 0  # gradient steps granted (online phase)

    def sample_budget(self) -> int:
        if self.inserts <= self.min_inserts:
            return 0
        return max(0, self.num * (self.inserts - self.min_inserts) // self.den - self.samples)

    def can_insert(self, n: int, in_flight: int) -> bool:
        ahead = (self.inserts + in_flight + n - self.min_inserts) * self.num - self.samples * self.den
        return ahead <= self.max_lag * self.num


class CollectorWorker:
    """One collector (run as a Ray actor): its env(s), a CPU copy of the agent, its own seeds
    ``SeedSequence([seed, index, incarnation])``; ``collect`` returns one chunk per request."""

    def __init__(self, cfg_dict: dict, index: int, incarnation: int, next_chunk_id: int, seed: int):
        torch.set_num_threads(1)
        cfg = config_from_dict(cfg_dict)
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, device="cpu"))
        agent_seed, env_seed, random_seed = np.random.SeedSequence([int(seed), int(index), int(incarnation)]).spawn(3)
        goal = cfg.replay.env_options  # as the replay needs them (HER: goal dicts kept, as the buffer stores them)
        one = make_env(cfg.env.id, cfg.env.max_episode_steps, **goal)
        self.spec = env_spec(one)
        n = cfg.env.num_envs
        env = one if n == 1 else make_vector_env(cfg.env.id, n, cfg.env.vector_mode, cfg.env.max_episode_steps,
                                                 **goal)
        if n > 1:
            one.close()
        # (trainer.build_agent's rule, with this collector's own seed: the trainer imports this module)
        self.agent = agent_entry(cfg.agent_kind).target.from_spec(self.spec, cfg.agent, agent_seed, cfg.run.device)
        columns = tuple(getattr(self.agent, "stored_columns", tuple)())
        self.collector = (Collector if n == 1 else VectorCollector)(
            env, self.spec, int(env_seed.generate_state(1)[0] % 2**31), record_columns=columns)
        ctx = H.LoopContext(self.agent, None, cfg, 0.0)  # (only the agent's episode-start hooks run here)
        self.collector.on_episode_start = H.episode_start_fns(H.collect_hooks(ctx, self.agent))
        self.random = np.random.default_rng(random_seed)
        self.index, self.incarnation, self.next_chunk_id = int(index), int(incarnation), int(next_chunk_id)
        self.version = -1

    def collect(self, n: int, weights: list, version: int, random_actions: bool) -> dict:
        """``n`` env steps (a multiple of the env count); ``weights``: ``[ObjectRef]`` of the published acting
        state (in a list, so Ray hands over the reference and the copy pulls it only when ``version`` changed)."""
        if version != self.version and weights and weights[0] is not None:
            import ray  # (optional: relive[ray])

            load_acting_state(self.agent, ray.get(weights[0]))
            self.version = int(version)

        def policy(obs):
            if random_actions:
                return uniform(self.spec, num_obs(obs), self.random)  # (dict observations too)
            return self.agent.act(obs, explore=True)

        c = self.collector
        unstored = c.num_unstored_steps
        streams, steps = c.step_streams(policy, int(n))
        chunk = {"collector": self.index, "incarnation": self.incarnation, "chunk_id": self.next_chunk_id,
                 "policy_version": self.version, "env_steps": int(steps), "streams": streams,
                 "finished_returns": list(c.finished_returns), "num_unstored_steps": c.num_unstored_steps - unstored,
                 "pid": os.getpid(), "node": _node()}
        c.finished_returns = []
        self.next_chunk_id += 1
        return chunk


class RayCollectors:
    """The learner's handle on N collector actors (``run.collector`` when ``collectors.num > 0``): requests,
    received chunks, restarts, weights, and its own ``state_dict`` for checkpoints."""

    can_checkpoint = True  # at any chunk boundary: resume ends the open episodes

    def __init__(self, cfg, seed: int):
        import_ray()  # (a clear error before anything is built)
        c = cfg.collectors
        self.cfg_dict, self.seed = cfg.to_dict(), int(seed)
        self.address = c.ray_address
        self.num_collectors, self.envs_per_collector = c.num, cfg.env.num_envs
        self.num_envs = c.num * cfg.env.num_envs  # replay streams
        e = self.envs_per_collector
        self.chunk = -(-c.chunk_env_steps // e) * e  # a multiple of the collector's env count
        self.next_chunk = np.zeros(c.num, np.int64)  # the chunk id expected next from each collector
        self.incarnation = np.zeros(c.num, np.int64)  # actors started per collector, minus one
        self.failures = np.zeros(c.num, np.int64)  # deaths since the collector's last chunk
        self.actors: list = [None] * c.num
        self.pids: list[int | None] = [None] * c.num  # each collector's process as of its last chunk
        self.last_request = np.full(c.num, -1, np.int64)  # request number of each collector's last request
        self.in_flight: dict = {}  # ObjectRef -> (collector, env steps requested)
        self.weights, self.version = None, -1
        self.finished_returns: list[float] = []
        self.num_unstored_steps = 0
        self.num_restarts = 0
        self.num_requests = 0
        self.limiter: RateLimiter | None = None
        self.log_lines = 0  # lines of chunks.jsonl (a checkpoint records how many belong to it)
        self.resumed = False
        self.started_ray = False
        self.ray: ModuleType | None = None  # the ray module, once connect() has run
        self.on_episode_start: list = []  # (the collectors run the agent's episode-start hooks themselves)

    # -- Ray ----------------------------------------------------------------------------------------------
    def connect(self) -> None:
        """Join ``collectors.ray_address``, or start a local Ray (loopback, no dashboard), unless this process is
        already connected (then it is left running at the end)."""
        ray = self.ray = import_ray()
        if not ray.is_initialized():
            kwargs = {"address": self.address} if self.address else {  # "local": a new Ray, never one found running
                "address": "local", "num_cpus": max(os.cpu_count() or 1, self.num_collectors)}
            try:
                ray.init(include_dashboard=False, log_to_driver=False, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ValueError(f"cannot start or join Ray (collectors.ray_address = {self.address!r}): {e}") from None
            self.started_ray = True
        self.worker_cls = ray.remote(num_cpus=1, max_restarts=0)(CollectorWorker)

    def _ray(self) -> ModuleType:
        assert self.ray is not None, "connect() first"
        return self.ray

    def close(self) -> None:
        if self.ray is None:
            return
        for actor in self.actors:
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
        self.actors = [None] * self.num_collectors
        self.in_flight.clear()
        if self.started_ray:
            self.ray.shutdown()
        self.ray = None

    def streams_of(self, collector: int) -> range:
        e = self.envs_per_collector
        return range(collector * e, (collector + 1) * e)

    # -- requests and chunks ---------------------------------------------------------------------------------
    def publish(self, agent, version: int) -> None:
        """``ray.put`` the acting weights once; collectors pull them with their next request."""
        self.weights, self.version = self._ray().put(acting_state(agent)), int(version)

    @property
    def in_flight_env_steps(self) -> int:
        return sum(n for _, n in self.in_flight.values())

    def request(self, limiter: RateLimiter, remaining: int, random_below: int) -> None:
        """Ask every idle collector for a chunk while env steps remain to be requested (``remaining``: the run's
        total minus those received) and the limiter allows; a chunk is random warm-up while fewer than
        ``random_below`` env steps were requested before it. The idle collector asked least recently goes first (no
        collector starves when the limiter lets one through at a time; a dead idle one is noticed at its turn)."""
        busy = {c for c, _ in self.in_flight.values()}
        for c in sorted(set(range(self.num_collectors)) - busy, key=lambda c: self.last_request[c]):
            flying = self.in_flight_env_steps
            left = remaining - flying
            if left <= 0:
                return
            n = min(self.chunk, -(-left // self.envs_per_collector) * self.envs_per_collector)
            if not limiter.can_insert(n, flying):
                return
            if self.actors[c] is None:
                self.actors[c] = self.worker_cls.remote(self.cfg_dict, c, int(self.incarnation[c]),
                                                        int(self.next_chunk[c]), self.seed)
            random = limiter.inserts + flying < random_below
            ref = self.actors[c].collect.remote(n, [self.weights], self.version, random)
            self.in_flight[ref] = (c, n)
            self.last_request[c] = self.num_requests
            self.num_requests += 1

    def poll(self, block: bool):
        """Yields the finished requests, one at a time (the caller stores each before taking the next, so a
        checkpoint between two sees consistent chunk ids): ``("chunk", chunk)``, or ``("lost", collector)`` for a
        collector that died (restarted at its next request). ``block``: wait for at least one."""
        if not self.in_flight:
            return
        refs = list(self.in_flight)
        ready, _ = self._ray().wait(refs, num_returns=1, timeout=None if block else 0)
        if ready:
            ready, _ = self._ray().wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            c, _ = self.in_flight.pop(ref)
            try:
                chunk = self._ray().get(ref)
            except self._ray().exceptions.RayActorError as e:
                self._restart(c, e)
                yield "lost", c
                continue
            if chunk["chunk_id"] != self.next_chunk[c] or chunk["incarnation"] != self.incarnation[c]:
                continue  # not the chunk expected from this collector: never stored twice
            self.next_chunk[c] += 1
            self.failures[c] = 0
            self.pids[c] = chunk["pid"]
            yield "chunk", chunk

    def _restart(self, c: int, error: Exception) -> None:
        if "creation task" in str(error):  # it never started (relive or the env missing on a node): not a crash
            raise RuntimeError(f"collector {c} could not start: {error}\n-> on a Ray cluster, relive (this version) "
                               f"and the environment's packages must be installed on every node") from None
        self.failures[c] += 1
        if self.failures[c] > 3:
            raise RuntimeError(f"collector {c} died {int(self.failures[c])} times without delivering a chunk: "
                               f"{error}") from None
        if self.actors[c] is not None:
            self._ray().kill(self.actors[c], no_restart=True)
        self.actors[c] = None  # a new actor, with the next incarnation's seeds, at the next request
        self.incarnation[c] += 1
        self.num_restarts += 1

    # -- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"num_collectors": self.num_collectors, "envs_per_collector": self.envs_per_collector,
                "next_chunk": self.next_chunk.copy(), "incarnation": self.incarnation.copy(),
                "limiter_samples": self.limiter.samples if self.limiter else 0, "log_lines": self.log_lines,
                "finished_returns": np.asarray(self.finished_returns, np.float64),
                "num_unstored_steps": self.num_unstored_steps, "num_restarts": self.num_restarts}

    def load_state_dict(self, state: dict) -> None:
        saved = (int(state["num_collectors"]), int(state["envs_per_collector"]))
        if saved != (self.num_collectors, self.envs_per_collector):
            raise ValueError(f"the checkpoint was written with {saved[0]} collectors x {saved[1]} envs, this run has "
                             f"{self.num_collectors} x {self.envs_per_collector}")
        self.next_chunk = np.asarray(state["next_chunk"], np.int64).copy()
        self.incarnation = np.asarray(state["incarnation"], np.int64) + 1  # new processes, new seeds
        self.resume_samples = int(state["limiter_samples"])
        self.log_lines = int(state["log_lines"])
        self.finished_returns = [float(r) for r in np.asarray(state["finished_returns"])]
        self.num_unstored_steps = int(state["num_unstored_steps"])
        self.num_restarts = int(state["num_restarts"])
        self.resumed = True  # the trainer ends every stream's open episode


def _node() -> str:
    return socket.gethostname()
