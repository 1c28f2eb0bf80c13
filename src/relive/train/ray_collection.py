"""The online phase's collection strategy on Ray actors (``collectors.num > 0``): :class:`RayCollection`, which the
trainer hands to :func:`relive.train.loop.online_phase` in place of :class:`~relive.train.loop.LocalCollection`.

The actors (:class:`~relive.train.ray_collectors.RayCollectors`, ``run.collector``) ship chunks of rows; a rate
limiter interleaves the chunks and the gradient steps at the run's update-to-data ratio; after every stored chunk the
loop's cadences run (:func:`~relive.train.loop.cadence`: evaluation, stop, checkpoint), as after every local chunk.
``chunks.jsonl`` in the run directory records every chunk (and every lost collector), cut back on resume to the
lines before the checkpoint.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from relive.files import write_text_atomic
from relive.train.loop import (
    FINISHED,
    Run,
    cadence,
    close_streams,
    gradient_step,
    store_chunks,
    stored_env_steps,
)
from relive.train.ray_collectors import RateLimiter, RayCollectors


class RayCollection:
    """Ray collectors (:class:`~relive.train.ray_collectors.RayCollectors`, ``run.collector``): requests for chunks,
    the chunks as they arrive (the cadences after each stored one, as after every local chunk) and gradient steps,
    interleaved under a rate limiter that keeps the update-to-data ratio; ``chunks.jsonl`` records every chunk."""

    def __init__(self, run: Run):
        st, s, cc = run.state, run.cfg.schedule, run.cfg.collectors
        self.run, self.pool = run, run.collector
        ratio = (s.grad_steps_per_chunk, s.env_steps_per_chunk) if s.grad_steps_per_chunk else (s.utd_ratio, 1)
        self.limiter = self.pool.limiter = RateLimiter(ratio, s.num_warmup_env_steps, cc.max_lag)
        # inserts = stored env steps: unstored (probing) steps are not data and earn no update (agents/contract.py)
        self.limiter.inserts, self.limiter.samples = stored_env_steps(run), getattr(self.pool, "resume_samples", 0)
        self.log = _chunk_log(run.run_dir / "chunks.jsonl", self.pool.log_lines)
        self.random_below = s.num_warmup_env_steps if s.warmup_policy == "random" else 0
        self.lags: list[int] = []
        self.pool.publish(run.agent, st.grad_steps)

    def _request(self) -> None:
        self.pool.request(self.limiter, self.run.cfg.schedule.num_online_env_steps - self.run.state.env_steps,
                          self.random_below)

    def _cadence(self) -> dict | None:
        if self.run.state.env_steps >= self.run.cfg.schedule.num_online_env_steps:
            return None  # (the budget is spent: the owed gradient steps run, the final evaluation follows)
        return cadence(self.run, before_checkpoint=self.log.flush)

    def start(self) -> dict | None:
        self._request()  # (actors start during the evaluation)
        return self._cadence()

    def step(self) -> dict | str | None:
        run, st, s, pool, limiter = self.run, self.run.state, self.run.cfg.schedule, self.pool, self.limiter
        self._request()
        budget = limiter.sample_budget()
        if not budget and not pool.in_flight:
            if st.env_steps >= s.num_online_env_steps:
                return FINISHED
            raise RuntimeError(f"rate limiter: no request allowed and nothing to update at env step {st.env_steps} "
                               f"(collectors.max_lag_env_steps = {run.cfg.collectors.max_lag})")
        for kind, payload in pool.poll(block=not budget):
            if kind == "lost":
                close_streams(run, pool.streams_of(payload))
                pool.log_lines += _write(self.log, {"lost": payload, "incarnation": int(pool.incarnation[payload]) - 1,
                                                    "env_steps_total": st.env_steps})
                run.logger.print(f"collector {payload} died: restarted; its open episodes end as truncated")
                continue
            _ingest(run, pool, payload)
            limiter.inserts = stored_env_steps(run)
            self.lags.append(st.grad_steps - payload["policy_version"])
            pool.log_lines += _write(self.log, {k: payload[k] for k in ("collector", "incarnation", "chunk_id", "pid",
                                                                          "policy_version", "env_steps")}
                                     | {"rows": [len(r["reward"]) for _, r in payload["streams"]],
                                        "env_steps_total": st.env_steps})
            if run.on_step is not None:
                run.on_step(st.env_steps, st.grad_steps)
            stop = self._cadence()
            if stop is not None:
                return stop
        if budget:
            gradient_step(run, "online")
            limiter.samples += 1
            if limiter.samples % run.cfg.collectors.sync_weights_every_grad_steps == 0:
                pool.publish(run.agent, st.grad_steps)
        return None

    def log_extra(self) -> dict:
        extra = {"collect/policy_lag_grad_steps": float(np.mean(self.lags)) if self.lags else math.nan,
                 "collect/num_collector_restarts": float(self.pool.num_restarts)}
        self.lags = []
        return extra

    def close(self) -> None:
        self.log.close()


def _ingest(run, pool: RayCollectors, chunk: dict) -> None:
    store_chunks(run, chunk["streams"], stream_offset=chunk["collector"] * pool.envs_per_collector)
    run.state.env_steps += chunk["env_steps"]
    clock = getattr(run.agent, "acting_clock", None)
    if clock:  # the learner never acts: its clock is the env steps all collectors took
        setattr(run.agent, clock, run.state.env_steps)
    pool.finished_returns += chunk["finished_returns"]
    pool.num_unstored_steps += chunk["num_unstored_steps"]


def _chunk_log(path: Path, keep_lines: int):
    """``chunks.jsonl`` cut back to the first ``keep_lines`` lines (those before the checkpoint resumed from)."""
    lines = path.read_text().splitlines(keepends=True)[:keep_lines] if path.exists() else []
    write_text_atomic(path, "".join(lines))
    return path.open("a", buffering=1)  # (line-buffered: the file shows what the learner has received)


def _write(log, record: dict) -> int:
    log.write(json.dumps(record) + "\n")
    return 1
