"""Stepping an environment with a policy into replay rows, and datasets collected that way (``collect_dataset``;

``Collector`` keeps the current episode between calls so the trainer can collect in chunks. On truncation
(time limit) the stored ``next_obs`` is the true final observation, so the critic bootstraps from it
(``terminated`` is False); on termination there is no bootstrap. (The trainer's ``stored_rows`` can store
truncations as terminations instead: ``env.truncation_as_termination``.)

``VectorCollector`` steps a Gymnasium vector env of N copies with one policy call per step for all N; env ``i``
is replay stream ``i``. Its autoreset is SAME_STEP (``envs.make_vector_env``): the step that ends an episode
already returns the next episode's first observation, and the stored ``next_obs`` is ``info["final_obs"]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from relive.envs import EnvSpec, env_spec, make_env, num_obs, one_row, random_actions, stack_obs
from relive.replay.storage.layout import concat_rows
from relive.types import unpack_acted


class _ColumnSource(Protocol):
    """What ``Collector._columns`` reads (a Collector's or a VectorCollector's)."""

    spec: EnvSpec
    record_columns: tuple


class Collector:
    """Steps one environment with a policy and returns the rows to store.

    ``policy(obs [1, ...])`` returns actions or a :class:`relive.types.Acted` (actions + a behaviour record to
    store with the row + whether to store it). Declared ``record_columns`` (``ColumnDecl``) missing from a step's
    record (e.g. random warm-up actions) get their ``fill`` value. A step with ``store=False`` is executed and
    advances the episode (its return, its length), but no row is written; such steps must come before any
    stored step of the same episode (PLD's probing: the stored part of the episode starts at the takeover).
    ``on_episode_start`` callbacks ``fn(env index)`` run before the first step of every episode (index 0).

    ``intervener`` (:mod:`relive.train.intervention`): called at every step with the observation and the agent's
    proposed action, it may take over; the executed action is stored as ``action``, the proposal and the flag as the
    behaviour columns ``proposed_action`` / ``intervened`` (declared in ``record_columns``). Interventions are counted
    per episode (``finished_interventions``) and per step (``num_intervened_steps``).
    """

    def __init__(self, env, spec: EnvSpec, seed: int, record_columns=(), on_episode_start=(), intervener=None):
        self.env, self.spec = env, spec
        self.intervener = intervener
        self.episode_interventions = 0  # intervened steps of the current episode
        self.finished_interventions: list[int] = []  # intervened steps of each episode finished since last read
        self.finished_lengths: list[int] = []  # (their lengths: the intervention rate)
        self.num_intervened_steps = 0  # (all time)
        self.record_columns = tuple(record_columns)
        self.on_episode_start = list(on_episode_start)
        self.obs, _ = env.reset(seed=int(seed))
        self.needs_reset = False  # episodes are reset lazily, so a checkpoint between episodes holds the
        self.episode_return = 0.0  # env RNG state *before* the next reset (exact resume)
        self.episode_length = 0
        self.stored_in_episode = False  # some step of the current episode was stored
        self.finished_returns: list[float] = []  # returns of episodes finished since last read
        self.num_unstored_steps = 0  # steps executed with store=False (all time)

    num_envs = 1

    @property
    def at_episode_start(self) -> bool:
        return self.episode_length == 0

    @property
    def can_checkpoint(self) -> bool:
        """Checkpoints wait for an episode boundary, so that a resume continues exactly (the env's RNG)."""
        return self.at_episode_start

    def step_streams(self, policy, n: int) -> tuple[list[tuple[int, dict]], int]:
        """``n`` env steps as ``([(stream, rows)], env steps executed)``: one stream (0)."""
        return [(0, self.step(policy, n))], n

    def step(self, policy, n: int) -> dict:
        """Run ``n`` env steps with ``policy``; return the stored rows (core columns + records), which may be
        fewer than ``n``."""
        names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
        rows: dict[str, list] = {k: [] for k in names}
        records: list[dict] = []
        for _ in range(n):
            if self.needs_reset:
                self.obs, _ = self.env.reset()
                self.needs_reset = False
            if self.episode_length == 0:
                for fn in self.on_episode_start:
                    fn(0)
                if self.intervener is not None:
                    self.intervener.on_episode_start()
            action, record, store = unpack_acted(policy(one_row(self.obs)))
            action, stored = action[0], bool(store[0])
            if self.intervener is not None:  # the agent proposes, the intervener may take over
                proposed = action
                taken, action = self.intervener(self.obs, proposed)
                record = {**record, "proposed_action": np.asarray(proposed)[None], "intervened": np.array([taken])}
                self.episode_interventions += int(taken)
                self.num_intervened_steps += int(taken)
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            if stored:
                for k, v in zip(names, (self.obs, action, reward, next_obs, terminated, truncated), strict=True):
                    rows[k].append(v)
                records.append({k: np.asarray(v)[0] for k, v in record.items()})
                self.stored_in_episode = True
            elif self.stored_in_episode:
                raise ValueError("act returned store=False after a stored step of the same episode; unstored steps "
                                 "(probing) must come first in an episode")
            else:
                self.num_unstored_steps += 1
            self.episode_return += float(reward)
            self.episode_length += 1
            if terminated or truncated:
                self.finished_returns.append(self.episode_return)
                if self.intervener is not None:
                    self.finished_interventions.append(self.episode_interventions)
                    self.finished_lengths.append(self.episode_length)
                    self.episode_interventions = 0
                self.needs_reset = True
                self.episode_return, self.episode_length, self.stored_in_episode = 0.0, 0, False
            else:
                self.obs = next_obs
        return self._columns(rows, records)

    def _columns(self: _ColumnSource, rows: dict, records: list[dict]) -> dict:  # (VectorCollector's too)
        m = len(records)
        spec = self.spec
        act_shape = tuple(spec.action_shape)
        out = {
            "obs": stack_obs(rows["obs"], m, spec.obs_shape),
            "action": np.asarray(rows["action"]).reshape(m, *act_shape),
            "reward": np.asarray(rows["reward"], np.float32).reshape(m),  # the storage's reward dtype
            "next_obs": stack_obs(rows["next_obs"], m, spec.obs_shape),
            "terminated": np.asarray(rows["terminated"], bool).reshape(m),
            "truncated": np.asarray(rows["truncated"], bool).reshape(m),
        }
        declared = {c.name: c for c in self.record_columns}
        for rec in records:
            unknown = set(rec) - set(declared)
            if unknown:
                raise ValueError(f"act returned record column(s) {sorted(unknown)} that the agent does not declare in "
                                 f"stored_columns() (declared: {sorted(declared)})")
        for name, decl in declared.items():
            col = decl.filled(m)
            for i, rec in enumerate(records):
                if name in rec:
                    col[i] = rec[name]
            out[name] = col
        return out

    def close(self) -> None:
        """The run is over: an intervener that holds resources (the browser console's server thread) lets them go."""
        close = getattr(self.intervener, "close", None)  # (an intervener's close is optional: the protocol's extra)
        if close is not None:
            close()

    def state_dict(self) -> dict:
        """Only valid between episodes (``at_episode_start``): the env's RNG before its next reset."""
        if not self.at_episode_start:
            raise ValueError("a collector can only be checkpointed between episodes")
        state = {"env_rng": self.env.unwrapped.np_random.bit_generator.state, "needs_reset": self.needs_reset,
                 "finished_returns": np.asarray(self.finished_returns, np.float64),
                 "num_unstored_steps": self.num_unstored_steps}
        if self.intervener is not None:
            state["intervention"] = {"intervener": self.intervener.state_dict(),
                                     "finished": np.asarray(self.finished_interventions, np.int64),
                                     "finished_lengths": np.asarray(self.finished_lengths, np.int64),
                                     "num_intervened_steps": self.num_intervened_steps}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.env.unwrapped.np_random.bit_generator.state = state["env_rng"]
        self.needs_reset = bool(state["needs_reset"])
        self.episode_return, self.episode_length, self.stored_in_episode = 0.0, 0, False
        self.finished_returns = [float(r) for r in np.asarray(state.get("finished_returns", []))]
        self.num_unstored_steps = int(state.get("num_unstored_steps", 0))
        if self.intervener is not None and "intervention" in state:
            saved = state["intervention"]
            self.intervener.load_state_dict(saved["intervener"])
            self.finished_interventions = [int(x) for x in np.asarray(saved["finished"])]
            self.finished_lengths = [int(x) for x in np.asarray(saved["finished_lengths"])]
            self.num_intervened_steps = int(saved["num_intervened_steps"])
            self.episode_interventions = 0


class VectorCollector:
    """Steps a Gymnasium vector env of ``num_envs`` copies (``envs.make_vector_env``, SAME_STEP autoreset): one
    ``policy(obs [N, ...])`` call per step for all envs; env ``i``'s rows are replay stream ``i``.

    A truncated episode's stored ``next_obs`` is the true final observation (``info["final_obs"]``), never the
    next episode's first one. ``store=False`` (probing) and behaviour records work per env as in
    :class:`Collector`; ``on_episode_start`` callbacks ``fn(i)`` run for env ``i`` before the first step of each of
    its episodes, in env order (per-episode state kept per env: residual SAC's probing, DDPG's OU noise). A
    checkpoint may fall mid-episode: resuming resets every env (seeded from the checkpoint) and the trainer ends
    each stream's open episode in the buffer where it stood (``ReplayBuffer.close_stream``), so no episode mixes
    two env trajectories.
    """

    def __init__(self, envs, spec: EnvSpec, seed: int, record_columns=(), on_episode_start=()):
        self.envs, self.spec = envs, spec
        self.num_envs = int(envs.num_envs)
        self.record_columns = tuple(record_columns)
        self.on_episode_start = list(on_episode_start)  # fn(env index)
        self.seed_rng = np.random.default_rng(int(seed))  # seeds of the resets after a resume
        self.obs, _ = envs.reset(seed=int(seed))
        n = self.num_envs
        self.episode_return = np.zeros(n)
        self.episode_length = np.zeros(n, np.int64)
        self.stored_in_episode = np.zeros(n, bool)
        self.finished_returns: list[float] = []
        self.num_unstored_steps = 0
        self.resumed = False  # set by load_state_dict: the trainer closes the streams' open episodes

    at_episode_start = property(lambda self: bool((self.episode_length == 0).all()))
    can_checkpoint = property(lambda self: True)  # any step: a resume ends the open episodes (close_stream)

    def step_streams(self, policy, n: int) -> tuple[list[tuple[int, dict]], int]:
        """ceil(n / num_envs) vector steps; returns ``([(env index = stream, stored rows)], env steps executed)``."""
        N = self.num_envs
        steps = -(-int(n) // N)
        names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
        rows: list[dict[str, list]] = [{k: [] for k in names} for _ in range(N)]
        records: list[list[dict]] = [[] for _ in range(N)]
        for _ in range(steps):
            if self.on_episode_start:
                for j in np.flatnonzero(self.episode_length == 0):
                    for fn in self.on_episode_start:
                        fn(int(j))
            action, record, store = unpack_acted(policy(self.obs))
            store = np.asarray(store, bool).reshape(N)
            next_obs, reward, terminated, truncated, info = self.envs.step(action)
            done = np.logical_or(terminated, truncated)
            true_next = next_obs
            if done.any():  # SAME_STEP autoreset: next_obs holds the new episodes' first observations
                true_next = _copy_obs(next_obs)
                for j in np.flatnonzero(done):
                    _set_row(true_next, j, info["final_obs"][j])
            for i in range(N):
                if store[i]:
                    r = rows[i]
                    r["obs"].append(_row(self.obs, i))
                    r["action"].append(action[i])
                    r["reward"].append(reward[i])
                    r["next_obs"].append(_row(true_next, i))
                    r["terminated"].append(terminated[i])
                    r["truncated"].append(truncated[i])
                    records[i].append({k: np.asarray(v)[i] for k, v in record.items()})
                    self.stored_in_episode[i] = True
                elif self.stored_in_episode[i]:
                    raise ValueError("act returned store=False after a stored step of the same episode; unstored "
                                     "steps (probing) must come first in an episode")
                else:
                    self.num_unstored_steps += 1
            self.episode_return += np.asarray(reward, np.float64)
            self.episode_length += 1
            for j in np.flatnonzero(done):
                self.finished_returns.append(float(self.episode_return[j]))
                self.episode_return[j], self.episode_length[j], self.stored_in_episode[j] = 0.0, 0, False
            self.obs = next_obs
        return [(i, Collector._columns(self, rows[i], records[i])) for i in range(N)], steps * N

    def state_dict(self) -> dict:
        return {"resume_seed": int(self.seed_rng.integers(2**31)), "num_envs": self.num_envs,
                "finished_returns": np.asarray(self.finished_returns, np.float64),
                "num_unstored_steps": self.num_unstored_steps}

    def load_state_dict(self, state: dict) -> None:
        if int(state["num_envs"]) != self.num_envs:
            raise ValueError(f"the checkpoint was written with {int(state['num_envs'])} envs, this run has "
                             f"{self.num_envs}")
        self.obs, _ = self.envs.reset(seed=int(state["resume_seed"]))
        self.seed_rng = np.random.default_rng(int(state["resume_seed"]))
        self.episode_return[:], self.episode_length[:], self.stored_in_episode[:] = 0.0, 0, False
        self.finished_returns = [float(r) for r in np.asarray(state.get("finished_returns", []))]
        self.num_unstored_steps = int(state.get("num_unstored_steps", 0))
        self.resumed = True

    def close(self) -> None:
        self.envs.close()



def collect_dataset(env_id: str, num_steps: int, seed: int, policy=None, max_episode_steps: int | None = None,
                    progress: str | None = None, policy_from_env=None) -> dict:
    """Rows of ``num_steps`` env steps with ``policy`` (uniform random actions when None); the last
    episode is cut as truncated so the dataset holds whole episodes. ``progress``: a label for a progress bar.
    ``policy_from_env(env) -> policy``: a policy that reads the env itself (a state policy driving a pixel task).
    A dataset holds the env's own episodes: on Atari whole games (the evaluation env), not the lives training cuts
    them into (a lost life ends a training episode for the learner's targets: a training device, not the data's), so
    that a dataset's episode returns are game scores, as evaluations and normalized scores count them."""
    env = make_env(env_id, max_episode_steps, evaluation=True)  # (Atari: no life-loss termination; else the same)
    if policy_from_env is not None:
        policy = policy_from_env(env)
    spec = env_spec(env)
    rng = np.random.default_rng(seed)
    collector = Collector(env, spec, seed)
    act = policy if policy is not None else (lambda obs: random_actions(spec, num_obs(obs), rng))
    chunks: Iterable[int] = [min(10_000, num_steps - i) for i in range(0, num_steps, 10_000)]
    if progress:
        from rich.progress import track  # (only when a progress bar is shown)

        chunks = track(chunks, description=f"{progress} ({num_steps:,} steps)")
    parts = [collector.step(act, k) for k in chunks]
    rows = concat_rows(parts)
    rows["truncated"][-1] = rows["truncated"][-1] or not rows["terminated"][-1]
    env.close()
    return rows


def _row(obs, i: int):
    """Env ``i``'s observation of a vector env's batch (dict observations: key -> [N, ...])."""
    return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]


def _copy_obs(obs):
    return {k: np.array(v, copy=True) for k, v in obs.items()} if isinstance(obs, dict) else np.array(obs, copy=True)


def _set_row(obs, i: int | np.integer, value) -> None:
    if isinstance(obs, dict):
        for k in obs:
            obs[k][i] = value[k]
    else:
        obs[i] = value


class NoCollector:
    """An offline-only run without an environment (``env.id = ""``): nothing to step; the loop's collector interface
    with nothing collected."""

    num_envs = 1
    num_unstored_steps = 0
    can_checkpoint = True
    resumed = False

    def __init__(self):
        self.finished_returns: list[float] = []
        self.on_episode_start = None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
