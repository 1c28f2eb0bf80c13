"""S seeds of one configuration trained in one process around one batched agent (issue 15, item 4).

``train_seeds(cfgs)`` runs the ordinary training loop (:func:`relive.train.trainer.train`) once per seed, each in its
own thread with its own env, buffer, sampler, RNG streams, logger and run directory -- the same files a single run
writes --, but every seed's agent is a :class:`_SeedProxy` whose ``update`` hands its batch to a shared
:class:`~relive.agents.ddqn_batched.BatchedDDQN`: once every live seed has handed in its k-th batch, one batched
update runs for all of them (so seed i's k-th update is its own, as in a single run), and each thread continues with
its own result. A seed whose run ends (budget done, score threshold reached, or an error) leaves the batch; the
others go on. Acting and evaluation use each seed's own single agent, whose Q-network is refreshed from the
batched weights before it acts after an update. Env stepping and evaluation are Python and take turns under the
GIL; the batched update (torch) is where the time is saved: S small networks for about the operator count of one.

Supported: the agents that declare a ``seed_batcher`` (DDQN, the ReaPER reproduction's agent). Not supported:
resuming a batched run (a batched run that stops is run again from scratch; its seeds' run directories are left as a
stopped single run leaves them).
"""

from __future__ import annotations

import threading
from typing import Protocol

from relive.registry import AGENTS, agent_entry, load_builtins


def batchable_agents() -> list[str]:
    """The registered agents that declare a ``seed_batcher``: a class built from S single agents of one
    configuration (``seed_batcher(agents)``) whose ``update(batches)`` updates them as one (DDQN's BatchedDDQN)."""
    load_builtins()
    return sorted(name for name, entry in AGENTS.items() if getattr(entry.target, "seed_batcher", None))


class _SeedBatcher(Protocol):
    """What the coordinator asks of ``seed_batcher(agents)`` (DDQN's BatchedDDQN)."""

    def update(self, batches: list) -> list: ...
    def sync(self, weights_only: bool = False) -> None: ...
    def drop(self, index: int) -> object: ...


class _Coordinator:
    """Pairs the k-th update of every live seed into one batched update (a condition-variable barrier)."""

    def __init__(self, n: int, seed_batcher: type):
        self.cond = threading.Condition()
        self.seed_batcher = seed_batcher  # the agent's declared class: seed_batcher(agents).update(batches)
        self.agents: dict[int, object] = {}
        self.live = set(range(n))
        self.pending: dict[int, object] = {}
        self.results: dict[int, object] = {}
        self.batched: _SeedBatcher | None = None  # seed_batcher(live seeds' agents), built at the first complete round
        self.order: list[int] = []  # seed index of each position of self.batched
        self.stale_weights: set[int] = set()  # seeds whose single agent's Q-network lags the batched weights
        self.stale_all: set[int] = set()  # ... whose target network / Adam state / counters lag

    def register(self, i: int, agent) -> None:
        with self.cond:
            self.agents[i] = agent
            self.cond.notify_all()

    def update(self, i: int, batch):
        with self.cond:
            self.pending[i] = batch
            self._run_if_complete()
            while i not in self.results:
                self.cond.wait()
            result = self.results.pop(i)
        if isinstance(result, BaseException):
            raise result
        return result

    def leave(self, i: int) -> None:
        with self.cond:
            self.live.discard(i)
            if self.batched is not None and i in self.order:
                if len(self.order) > 1:
                    self.batched.drop(self.order.index(i))
                else:
                    self.batched.sync()
                self.order.remove(i)
            self._run_if_complete()
            self.cond.notify_all()

    def refresh(self, i: int, full: bool) -> None:
        """Seed i's single agent gets the batched Q-weights (before it acts) or everything (before a checkpoint)."""
        with self.cond:
            if self.batched is None:
                return
            if full and i in self.stale_all:
                self.batched.sync()
                self.stale_all.clear()
                self.stale_weights.clear()
            elif i in self.stale_weights:
                self.batched.sync(weights_only=True)
                self.stale_weights.clear()

    def _run_if_complete(self) -> None:
        if not self.live or set(self.pending) != self.live or not self.live <= set(self.agents):
            return
        try:
            if self.batched is None:
                self.order = sorted(self.live)
                self.batched = self.seed_batcher([self.agents[j] for j in self.order])
            results = self.batched.update([self.pending[j] for j in self.order])
            out = dict(zip(self.order, results, strict=True))
        except BaseException as e:  # every waiting seed gets the error instead of waiting for ever
            out = {j: e for j in self.pending}
        self.results.update(out)
        self.stale_weights |= set(self.pending)
        self.stale_all |= set(self.pending)
        self.pending.clear()
        self.cond.notify_all()


class _SeedProxy:
    """Seed i's agent inside a batched run: its single agent for everything but ``update``."""

    def __init__(self, agent, index: int, coordinator: _Coordinator):
        self._agent, self._i, self._c = agent, index, coordinator
        coordinator.register(index, agent)

    def update(self, batch):
        return self._c.update(self._i, batch)

    def act(self, obs, explore: bool):
        self._c.refresh(self._i, full=False)
        return self._agent.act(obs, explore)

    def state_dict(self) -> dict:
        self._c.refresh(self._i, full=True)
        return self._agent.state_dict()

    def __getattr__(self, name):  # everything else: the seed's own agent (config, counters, hooks, ...)
        return getattr(self._agent, name)


def check_batchable(cfgs) -> None:
    """One configuration, seeds differing (and run directories), on a supported agent; else a clear error."""
    if not cfgs:
        raise ValueError("train_seeds needs at least one configuration")
    kinds = {c.agent_kind for c in cfgs}
    if kinds - set(batchable_agents()):
        raise ValueError(f"seeds batched in one process support the agents {batchable_agents()}; got {sorted(kinds)} "
                         "(run the seeds as separate runs)")
    if len({c.run.seed for c in cfgs}) != len(cfgs):
        raise ValueError(f"the batched seeds must differ, got {[c.run.seed for c in cfgs]}")
    dirs = [c.run.run_dir for c in cfgs]
    if None in dirs or len(set(dirs)) != len(dirs):
        raise ValueError(f"every batched seed needs its own run directory, got {dirs}")
    for c in cfgs[1:]:
        if (c.agent, c.replay, c.schedule, c.env) != (cfgs[0].agent, cfgs[0].replay, cfgs[0].schedule, cfgs[0].env):
            raise ValueError("the batched seeds must share one configuration (agent, replay, schedule, env); "
                             f"seed {c.run.seed} differs from seed {cfgs[0].run.seed}")
        if c.collectors.num > 0:
            raise ValueError("seeds batched in one process cannot use Ray collectors")


def train_seeds(cfgs) -> list:
    """Train the seeds ``cfgs`` (one ExperimentConfig per seed, each with its ``run.run_dir``) in one process;
    returns each seed's RunSummary (or the exception its run raised), in order."""
    # (gymnasium, optional: the grid runner imports this module)
    from relive.train.trainer import train

    check_batchable(cfgs)
    coordinator = _Coordinator(len(cfgs), agent_entry(cfgs[0].agent_kind).target.seed_batcher)
    out: list = [None] * len(cfgs)

    def one(i: int) -> None:
        try:
            out[i] = train(cfgs[i], wrap_agent=lambda agent: _SeedProxy(agent, i, coordinator))
        except BaseException as e:  # noqa: BLE001 (reported per seed; the others go on)
            out[i] = e
        finally:
            coordinator.leave(i)

    threads = [threading.Thread(target=one, args=(i,), name=f"seed-{cfgs[i].run.seed}") for i in range(len(cfgs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
