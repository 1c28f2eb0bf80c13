"""Experiment configuration: frozen dataclasses grouped by concern, validated on construction, saved as
``config.json`` and reloaded to an equal object (``load_config``).

The agent and the replay strategy are chosen by name from their registries (``relive.registry``); each brings its
own frozen config dataclass, nested here: ``agent_kind = "calql"`` with ``agent`` a ``CalQLConfig``, and
``replay.name = "reaper"`` with ``replay.options`` a ``ReaPERConfig`` (``replay.reaper.*`` in JSON and on the
command line). Defaults live only in those dataclasses. ``override`` parses ``--set section.key=value`` against each
field's declared type.
"""

from __future__ import annotations

import dataclasses
import json
import keyword
import math
import re
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from relive.files import write_text_atomic
from relive.registry import (
    ALIASES,
    REPLAYS,
    ReplaySpec,
    agent_entry,
    env_options,
    field_docs,
    intervener_entry,
    load_builtins,
    options_dict,
    replay_entry,
)

_DEVICE = re.compile(r"cpu|mps|cuda(:\d+)?")


def check_device(key: str, device: str) -> None:
    """A torch device name: cpu, cuda, cuda:N or mps (whether it exists here is checked when a run starts)."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ValueError(f"{key} must be 'cpu', 'cuda', 'cuda:N' (N a device number) or 'mps', got {device!r}")


LOGGERS = ("tensorboard", "wandb", "mlflow")  # run.loggers: what relive.train.logging writes to


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # run seed: every component gets its own stream from SeedSequence(seed).spawn
    run_dir: str | None = None  # default: runs/<preset>-<env>-seed<seed>-<time>
    device: str = "cpu"  # torch device of the agent: cpu, cuda[:N], mps
    num_threads: int = 1  # torch intra-op threads
    log_every_env_steps: int = 1000  # env steps between metrics.jsonl / TensorBoard lines
    eval_every_env_steps: int = 5000  # env steps between evaluations
    eval_episodes: int = 5  # episodes per evaluation
    # evaluation start states: false = every evaluation resets with the same seeds (seed, seed + 1, ...: the same
    # start states each time, comparable over a run); true = the eval env is seeded once and every evaluation
    # continues its random stream (new start states each time), as SB3's EvalCallback (the ReaPER authors' loop)
    eval_fresh_starts: bool = False
    # evaluate at online env step 0 (after the offline phase); false: the first evaluation is at
    # eval_every_env_steps, as SB3's EvalCallback (the ReaPER authors: every 500 steps, the first at step 500)
    eval_at_start: bool = True
    checkpoint_every_env_steps: int = 10_000  # checkpoints land on the first episode end after this many steps
    checkpoint_every_offline_grad_steps: int = 10_000  # offline phase (and always at its end)
    # also checkpoint when this many seconds of wall-clock passed since the last one (a person's session is counted in
    # minutes); online, at the first chunk boundary where the collection allows it (one env: an episode end); None: off
    checkpoint_every_seconds: float | None = None
    progress: bool = True  # progress bar on the terminal
    save_final_buffer: bool = False  # also write the replay buffer at the end (buffer_final/)
    save_agent_snapshots: bool = False  # keep the agent of every evaluation (snapshots/agent_<env_step>/)
    # start from the agent a finished run saved (<dir>/agent_final: networks, optimizers, temperatures), e.g. one
    # offline pre-training shared by fine-tuning runs that differ only in their replay (the ARB paper's protocol)
    init_from: str | None = None
    stop_at_return: float | None = None  # end the online phase at the first evaluation with mean return >= this
    # where metrics go besides metrics.jsonl / eval.csv (relive.train.logging): tensorboard (tb/), wandb (offline,
    # RUN/wandb/), mlflow (a file store RUN/mlruns/, or $MLFLOW_TRACKING_URI); [] for none of them
    loggers: tuple[str, ...] = ("tensorboard",)

    def __post_init__(self):
        names = self.loggers
        if not isinstance(names, tuple) or not set(names) <= set(LOGGERS) or len(set(names)) != len(names):
            shown = list(names) if isinstance(names, tuple) else names
            raise ValueError(f"run.loggers must be a list of distinct names out of {', '.join(LOGGERS)}, got {shown!r}")
        for name in ("log_every_env_steps", "eval_every_env_steps", "eval_episodes", "checkpoint_every_env_steps",
                     "checkpoint_every_offline_grad_steps", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        sec = self.checkpoint_every_seconds
        if sec is not None and (isinstance(sec, bool) or not isinstance(sec, int | float) or not math.isfinite(sec)
                                or sec <= 0):
            raise ValueError(f"run.checkpoint_every_seconds must be a number of seconds > 0 (or None), got {sec!r}")
        check_device("run.device", self.device)


def check_env_kwargs(kwargs: object, key: str = "env.kwargs") -> None:
    """``kwargs`` must be what ``gymnasium.make(id, **kwargs)`` takes from a command line: a dict whose keys are Python
    identifiers and whose values are JSON scalars (null, true/false, numbers, strings) or lists of them (nested lists
    too); a ValueError naming ``key`` otherwise."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"{key} must be a JSON object of keyword arguments, e.g. {{\"g\": 9.81}}, got {kwargs!r}")
    for name, value in kwargs.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"{key}: {name!r} is not a keyword argument name (a Python identifier)")
        if not _json_value(value):
            raise ValueError(f"{key}: {name} = {value!r} is not a JSON scalar (null, true/false, a finite number, a "
                             "string) or a list of them")


def _json_value(value: object) -> bool:
    if isinstance(value, list | tuple):
        return all(_json_value(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, bool | int | str)


SUCCESS_AT = ("any", "last")  # env.success_at: at which step of an episode info[success_key] counts
MAX_NUM_ENVS = 1024  # env.num_envs above this is refused (each env is a replay stream; async: a process each)


@dataclass(frozen=True)
class EnvConfig:
    id: str = "Pendulum-v1"  # Gymnasium environment id; "": none (offline only from --dataset, no --env given)
    max_episode_steps: int | None = None  # override the registered time limit
    success_return: float | None = None  # evaluations also log eval/success_rate = share of returns >= this
    # or: eval/success_rate = share of evaluation episodes where info[success_key] was true at some step (the
    # task's own flag: "success" for Meta-World and the mazes, "is_success" for Gymnasium-Robotics Fetch)
    success_key: str | None = None
    # with success_key: "any" = info[success_key] true at some step of the episode; "last" = true at its last step
    # (Gymnasium-Robotics Fetch, as its papers and Stable-Baselines3 count it: the object must still be at the goal)
    success_at: str = "any"
    # store time-limit truncations as terminations (terminated = true, truncated = false) for every row entering
    # the buffer, so every agent's target at such a row is r with no bootstrap. Off by default: a time limit is
    # not part of the task's state, and bootstrapping from the true next observation is the correct target. The
    # option exists to reproduce loops that did otherwise, e.g. the ReaPER authors' SB3 buffer
    # (handle_timeout_termination=False); ReaPER's per-episode bookkeeping then sees a terminal row too.
    truncation_as_termination: bool = False
    # environments stepped together in one Gymnasium vector env, one policy call per step for all; env i's rows are
    # replay stream i. Env steps (schedule.num_online_env_steps, utd_ratio, warm-up, evaluation and checkpoint
    # cadences) count the steps of every env: a chunk is rounded up to a multiple of num_envs. 1: one env, as before
    num_envs: int = 1
    vector_mode: str = "sync"  # num_envs > 1: "sync" (SyncVectorEnv, one process) or "async" (a subprocess per env)
    # keyword arguments of gymnasium.make(id, **kwargs) for every env of the run (training, evaluation, vector envs,
    # Ray collectors), e.g. {"g": 9.81}: a JSON object, keys Python identifiers, values JSON scalars or lists
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        check_env_kwargs(self.kwargs)
        if not isinstance(self.id, str):
            raise ValueError(f"env.id must name a Gymnasium environment, e.g. 'Pendulum-v1' (or be '' for an "
                             f"offline-only run from a dataset), got {self.id!r}")
        if ":" in self.id:  # (gym.make would import the module: relive.envs.check_env_id, here at once)
            raise ValueError(f"env.id: environment id {self.id!r} names a module to import "
                             f"({self.id.split(':', 1)[0]!r}): relive never imports code named by an environment id; "
                             "register the environment in your own code (gymnasium.register) and pass its plain id")
        if isinstance(self.num_envs, bool) or not isinstance(self.num_envs, int) or self.num_envs < 1:
            raise ValueError(f"env.num_envs must be an integer >= 1, got {self.num_envs!r}")
        if self.num_envs > MAX_NUM_ENVS:
            raise ValueError(f"env.num_envs must be at most {MAX_NUM_ENVS} (envs stepped together in one process, "
                             f"each its own replay stream), got {self.num_envs}")
        if self.vector_mode not in ("sync", "async"):
            raise ValueError(f"env.vector_mode must be 'sync' or 'async', got {self.vector_mode!r}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"env.max_episode_steps must be >= 1 or null, got {self.max_episode_steps}")
        if self.success_return is not None and not math.isfinite(self.success_return):
            raise ValueError(f"env.success_return must be a finite number or null, got {self.success_return}")
        if self.success_key is not None and (not isinstance(self.success_key, str) or not self.success_key):
            raise ValueError(f"env.success_key must be a non-empty string or null, got {self.success_key!r}")
        if self.success_key is not None and self.success_return is not None:
            raise ValueError("env.success_key and env.success_return both define eval/success_rate: set one")
        if self.success_at not in SUCCESS_AT:
            raise ValueError(f"env.success_at must be one of {SUCCESS_AT}, got {self.success_at!r}")


@dataclass(frozen=True)
class CollectorsConfig:
    """Parallel collectors on Ray (``relive.train.ray_collectors``; docs/scaling.md)."""

    num: int = 0  # collector processes (Ray actors) feeding the learner's buffer; 0: the trainer steps its own env(s)
    ray_address: str | None = None  # join this Ray cluster ("auto", "host:6379", "ray://host:10001"); null: local Ray
    # env steps a collector takes per request: one chunk of rows per stream, shipped through the object store
    chunk_env_steps: int = 64
    sync_weights_every_grad_steps: int = 100  # the learner publishes the acting weights this often (ray.put once)
    # rate limiter: env steps the collectors may run ahead of the update-to-data ratio (received + in flight,
    # beyond what the learner's gradient steps have consumed); null: 2 x num x chunk_env_steps. The learner never
    # runs ahead: it waits for data once its gradient steps reach utd_ratio x env steps received
    max_lag_env_steps: int | None = None

    def __post_init__(self):
        if isinstance(self.num, bool) or not isinstance(self.num, int) or self.num < 0:
            raise ValueError(f"collectors.num must be an integer >= 0 (0: no Ray collectors), got {self.num!r}")
        if self.chunk_env_steps < 1 or self.sync_weights_every_grad_steps < 1:
            raise ValueError(f"collectors.chunk_env_steps and collectors.sync_weights_every_grad_steps must be >= 1, "
                             f"got {self.chunk_env_steps}, {self.sync_weights_every_grad_steps}")
        if self.ray_address and not self.num:
            raise ValueError(f"collectors.ray_address = {self.ray_address!r} needs collectors.num >= 1 "
                             f"(--collectors N)")
        if self.max_lag_env_steps is not None and self.max_lag_env_steps < self.chunk_env_steps:
            raise ValueError(f"collectors.max_lag_env_steps must be >= collectors.chunk_env_steps (else no chunk could "
                             f"ever be requested), got {self.max_lag_env_steps} < {self.chunk_env_steps}")

    @property
    def max_lag(self) -> int:
        return self.max_lag_env_steps if self.max_lag_env_steps is not None else 2 * self.num * self.chunk_env_steps


@dataclass(frozen=True)
class InterventionConfig:
    """Interventions during online training (HIL-SERL; ``relive.train.intervention``, docs/hil.md): the intervener
    may take over the agent's action; intervened rows are tagged, kept on the ring and in a demonstration segment."""

    # none; scripted (an expert takes over when the agent's action deviates); state (an expert takes over when the task
    # goes wrong, as a person watching it would); device (a gamepad, pygame); console (a person in a browser:
    # relive.train.console, `relive train --console`); or a plug-in's (relive.registry.register_intervener)
    kind: str = "none"
    expert: str = "zero"  # scripted, state: a registered expert (relive.train.intervention.EXPERTS: zero, reach_goal)
    threshold: float = 0.5  # scripted: take over when ||agent action - expert action||_2 exceeds this
    budget: int = 0  # scripted, state: at most this many intervened steps in the run (0: no limit)
    hold_steps: int = 1  # scripted: a takeover lasts this many steps
    # state (a person who watches the task: relive.train.intervention.StateIntervener, docs/hil.md); budget as scripted
    distance: str = "goal"  # state: the task's distance to success, registered (goal: ||achieved - desired goal||)
    rising_steps: int = 3  # state: take over once the distance rose at each of this many steps in a row
    reaction_steps: int = 0  # state: ... this many steps later (a person's reaction; the agent acts meanwhile)
    recovered_steps: int = 3  # state: let go once it fell at each of this many steps of the takeover
    on_track_distance: float = 0.0  # state: let go below this distance (and never take over below it)
    demo_capacity: int = 100_000  # rows of room in the demonstration segment for interventions (never evicted)
    console_host: str = "127.0.0.1"  # console: the address it listens on (another than this machine's: a token)
    console_port: int = 8765  # console: its port (0: any free port, printed)
    console_start_paused: bool = True  # console: the online phase waits at its first step until Resume is pressed

    def __post_init__(self):
        if not isinstance(self.kind, str):
            raise ValueError(f"intervention.kind must be a name, got {self.kind!r}")
        intervener_entry(self.kind)  # (an unknown name: a ValueError listing the registered ones)
        if not isinstance(self.console_host, str) or not self.console_host:
            raise ValueError(f"intervention.console_host must be a host name or address, got {self.console_host!r}")
        port = self.console_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"intervention.console_port must be an integer in [0, 65535], got {port!r}")
        if not isinstance(self.console_start_paused, bool):
            raise ValueError(f"intervention.console_start_paused must be true or false, got "
                             f"{self.console_start_paused!r}")
        th = self.threshold
        if isinstance(th, bool) or not isinstance(th, int | float) or not math.isfinite(th) or th < 0:
            raise ValueError(f"intervention.threshold must be a finite number >= 0, got {th!r}")
        if not isinstance(self.distance, str) or not self.distance:
            raise ValueError(f"intervention.distance must be the name of a registered distance, got {self.distance!r}")
        d = self.on_track_distance
        if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d < 0:
            raise ValueError(f"intervention.on_track_distance must be a finite number >= 0, got {d!r}")
        for name, low in (("budget", 0), ("hold_steps", 1), ("demo_capacity", 1), ("rising_steps", 1),
                          ("reaction_steps", 0), ("recovered_steps", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"intervention.{name} must be an integer >= {low}, got {v!r}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = None  # a relive .npz, a D4RL .hdf5 file, or a local Minari dataset (id or directory)
    discount: float | None = None  # for Monte-Carlo returns-to-go; default: the agent's gamma
    ref_min_return: float | None = None  # reference returns for normalized scores (D4RL style)
    ref_max_return: float | None = None  # (default: the dataset's own, when it records them)

    def __post_init__(self):
        if self.discount is not None and not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"data.discount must be in [0, 1], got {self.discount}")
        lo, hi = refs = (self.ref_min_return, self.ref_max_return)
        if lo is not None and hi is not None and not lo < hi:
            raise ValueError(f"data.ref_min_return must be below data.ref_max_return, got {refs}")


@dataclass(frozen=True)
class ScheduleConfig:
    num_offline_grad_steps: int = 0  # gradient steps on the dataset before going online
    num_online_env_steps: int = 10_000  # online environment steps executed (unstored probing steps included)
    env_steps_per_chunk: int = 1  # collect this many env steps, then chunk x utd_ratio gradient steps
    utd_ratio: int = 1  # gradient steps per stored env step (update-to-data ratio); the only copy of it
    # > 0: this many gradient steps after each chunk instead of chunk x utd_ratio (RL Zoo's train_freq /
    # gradient_steps, e.g. 128 updates every 256 env steps on CartPole)
    grad_steps_per_chunk: int = 0
    num_warmup_env_steps: int = 1000  # no updates until this many online env steps were stored
    warmup_policy: str = "random"  # warm-up actions: "random" (uniform) or "agent" (the pre-trained policy)
    batch_size: int = 256  # rows per gradient step (updates wait until the buffer holds this many rows)

    def __post_init__(self):
        if min(self.env_steps_per_chunk, self.utd_ratio, self.batch_size) < 1:
            raise ValueError("env_steps_per_chunk, utd_ratio and batch_size must be >= 1")
        if min(self.num_offline_grad_steps, self.num_online_env_steps, self.num_warmup_env_steps,
               self.grad_steps_per_chunk) < 0:
            raise ValueError("step counts must be >= 0")
        if self.warmup_policy not in ("random", "agent"):
            raise ValueError(f"schedule.warmup_policy must be 'random' or 'agent', got {self.warmup_policy!r}")

    def check_update_rule(self) -> None:
        """grad_steps_per_chunk replaces chunk x utd_ratio: both set would leave one silently unused, so a run
        refuses it (checked when a run starts, not per ``--set``: settings are applied one at a time)."""
        if self.grad_steps_per_chunk and self.utd_ratio != 1:
            raise ValueError(f"schedule.grad_steps_per_chunk ({self.grad_steps_per_chunk} updates per chunk) replaces "
                             f"utd_ratio ({self.utd_ratio} updates per env step): set one of them (--utd N, or "
                             "--grad-steps-per-chunk N with --chunk and --utd 1)")


@dataclass(frozen=True)
class ReplayConfig:
    """The replay strategy (a registered name and its options), the buffer's capacity and device. An alias
    (``symmetric``: a ``mixture`` of two uniform parts) is expanded on construction: ``name`` is always a registered
    strategy."""

    name: str = "uniform"  # a registered replay strategy (`relive presets --show replays`)
    capacity: int = 1_000_000  # rows, offline + online
    options: Any = None  # the strategy's own config dataclass (``replay.<name>.*``); None: its defaults
    device: str | None = None  # torch device of the buffer's columns and sampling (uniform, per, and mixtures of
    #                            them; relive.replay.samplers.device), e.g. the agent's "cuda"; None: NumPy on the host
    shards: int = 0  # > 0: the replay is a service of that many Ray shard actors (relive.train.sharded_replay; with
    #                  Ray collectors), drawn exactly as one buffer; 0: one buffer in the learner's process
    shard_timeout_s: float = 600.0  # with shards: how long a call (a sample waiting for a restarting shard) may take
    shard_prefetch: int = 0  # with shards: batches a background thread draws ahead (hides the round trips behind the
    #                          update; a batch is then drawn up to this many updates before it is used); 0: none

    def __post_init__(self):
        if self.device is not None:
            check_device("replay.device", self.device)
        load_builtins()
        if self.name in ALIASES:
            if self.options is not None:
                raise ValueError(f"replay {self.name!r} is an alias of {ALIASES[self.name].target!r}: give its "
                                 f"options by name, ReplayConfig.of({self.name!r}, ...)")
            name, options = expand_alias(self.name, {}, raw=False)
            object.__setattr__(self, "name", name)
            object.__setattr__(self, "options", options)
        cls = replay_entry(self.name).config_cls
        if self.options is None:
            object.__setattr__(self, "options", cls())
        elif type(self.options) is not cls:
            raise ValueError(f"replay {self.name!r} takes a {cls.__name__}, got {type(self.options).__name__}")
        if self.capacity < 1:
            raise ValueError(f"replay.capacity must be >= 1, got {self.capacity}")
        if isinstance(self.shards, bool) or not isinstance(self.shards, int) or self.shards < 0:
            raise ValueError(f"replay.shards must be an integer >= 0 (0: one buffer in this process), got "
                             f"{self.shards!r}")
        if isinstance(self.shard_prefetch, bool) or not isinstance(self.shard_prefetch, int) or self.shard_prefetch < 0:
            raise ValueError(f"replay.shard_prefetch must be an integer >= 0, got {self.shard_prefetch!r}")
        if not self.shard_timeout_s > 0:
            raise ValueError(f"replay.shard_timeout_s must be > 0, got {self.shard_timeout_s!r}")

    @classmethod
    def of(cls, name: str, capacity: int = 1_000_000, **options) -> ReplayConfig:
        """``ReplayConfig.of("symmetric", offline_fraction=0.5)``: the named strategy (or alias) with some options
        set."""
        load_builtins()
        if name in ALIASES:
            target, opts = expand_alias(name, options, raw=False)
            return cls(target, capacity, opts)
        return cls(name, capacity, replay_entry(name).config_cls(**options))

    @property
    def label(self) -> str:
        """The strategy in a few words: ``per``, ``mixture(offline=uniform, online=per)``,
        ``her(k=4, future, inner=per)``."""
        return str(ReplaySpec(self.name, self.options))

    @property
    def env_options(self) -> dict[str, Any]:
        """What this replay needs of the run's envs, as ``make_env`` keyword arguments (HER: goal dicts kept;
        ``relive.registry.env_options``): every place that makes a run's env passes them, none names a replay."""
        return env_options(self.options)

    def to_dict(self) -> dict:
        return {"name": self.name, "capacity": self.capacity, self.name: options_dict(self.options)} | (
            {"device": self.device} if self.device is not None else {}) | (
            {"shards": self.shards} if self.shards else {}) | (
            {"shard_timeout_s": self.shard_timeout_s} if self.shard_timeout_s != 600.0 else {}) | (
            {"shard_prefetch": self.shard_prefetch} if self.shard_prefetch else {})


# a replay table's keys that are not its spec
_REPLAY_FIELDS = ("capacity", "device", "shards", "shard_timeout_s", "shard_prefetch")


# -- replay options: nested parts (a mixture's offline / online) and aliases ----------------------------------------
_RENAMED_OPTIONS = {"ARBConfig": {"amortized_rows": "amortized_rows_per_refresh"}}  # old option name -> field


def _option_name(options, name: str) -> str:
    return _RENAMED_OPTIONS.get(type(options).__name__, {}).get(name, name)


def set_option(options, path: list[str], value, key: str, *, raw: bool):
    """``options`` (a replay's config dataclass) with the setting at ``path`` replaced: ``["priority_exponent"]``,
    or into a part, ``["online", "name"]`` (the part becomes that strategy with its defaults) and
    ``["online", "per", "priority_exponent"]``. ``raw``: ``value`` is command-line text, parsed against the field's
    type; else JSON data."""
    name = _option_name(options, path[0])
    names = [f.name for f in dataclasses.fields(options)]
    if name not in names:
        raise ValueError(f"unknown setting {key!r}; {type(options).__name__} has {names}")
    current = getattr(options, name)
    if isinstance(current, ReplaySpec):
        rest = path[1:]
        if rest == ["name"]:
            new_name = parse_value(str, value, key) if raw else value
            return _replace(options, name, ReplaySpec(new_name), key, value)
        if len(rest) >= 2 and rest[0] == current.name:
            return _replace(options, name, ReplaySpec(current.name, set_option(current.options, rest[1:], value, key,
                                                                               raw=raw)), key, value)
        if len(rest) >= 2:
            raise ValueError(f"--set {key}: the options of replay {rest[0]!r} apply only when {name}.name is "
                             f"{rest[0]!r}; this part is {current.name!r} (set {name}.name={rest[0]} first)")
        raise ValueError(f"--set {key}: {name} is a replay part: set {name}.name=STRATEGY or "
                         f"{name}.{current.name}.OPTION")
    if len(path) > 1:
        raise ValueError(f"unknown setting {key!r}; {name} has no settings of its own")
    if raw:  # command-line text: parsed against the field's type, as every other --set
        return _set_field(options, name, value, key, type(options).__name__)
    return _replace(options, name, _from_json(_field_type(type(options), name), value), key, value)


def _replace(options, name: str, value, key: str, raw):
    try:
        return dataclasses.replace(options, **{name: value})
    except (ValueError, TypeError) as e:
        raise ValueError(f"--set {key}={raw}: {e}") from None


def _alias_path(alias, key: str) -> list[str]:
    """The path under the alias's target of the alias's own option ``key``."""
    if key in alias.keys:
        return alias.keys[key].split(".")
    return (alias.keys.get("*", "") + key).split(".")


def expand_alias(name: str, settings: dict, *, raw: bool) -> tuple[str, Any]:
    """An alias and its own options (``{"priority_exponent": 0.7}`` for ``symmetric_per``) -> (the registered
    strategy, its options)."""
    alias = ALIASES[name]
    options = replay_entry(alias.target).config_cls()
    for item in alias.sets:
        path, _, text = item.partition("=")
        options = set_option(options, path.split("."), text, f"replay.{alias.target}.{path}", raw=True)
    for key, value in settings.items():
        options = set_option(options, _alias_path(alias, key), value, f"replay.{name}.{key}", raw=raw)
    return alias.target, options


def _spec_from_dict(data, where: str) -> ReplaySpec:
    """A replay part from JSON (``{"name": "per", "per": {...}}``; an alias's name expands)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a replay part is a table with a name, e.g. {{name = \"uniform\"}}, got {data!r}")
    name = data.get("name", "uniform")
    extra = sorted(set(data) - {"name", name})
    if extra:
        raise ValueError(f"{where}: unknown setting(s) {extra}; replay {name!r} takes {where}.{name}.* options")
    load_builtins()
    if name in ALIASES:
        return ReplaySpec(*expand_alias(name, data.get(name, {}), raw=False))
    return ReplaySpec(name, _build(replay_entry(name).config_cls, data.get(name, {}), f"{where}.{name}"))


@dataclass(frozen=True)
class ExperimentConfig:
    preset: str = "sac"  # the preset this configuration started from (`relive presets`)
    agent_kind: str = "sac"  # a registered agent (`relive presets --show agents`)
    agent: Any = field(default_factory=lambda: agent_entry("sac").config_cls())  # the agent's own config dataclass
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    collectors: CollectorsConfig = field(default_factory=CollectorsConfig)
    intervention: InterventionConfig = field(default_factory=InterventionConfig)

    def __post_init__(self):
        cls = agent_entry(self.agent_kind).config_cls
        if type(self.agent) is not cls:
            raise ValueError(f"agent_kind {self.agent_kind!r} needs a {cls.__name__}, got {type(self.agent).__name__}")

    def check_sizes(self) -> None:
        """Sizes that only make sense together (checked when a run starts, not per ``--set``: settings are applied
        one at a time): a buffer that can hold a batch, and no more replay streams than rows."""
        s, capacity = self.schedule, self.replay.capacity
        if capacity < s.batch_size:
            raise ValueError(f"replay.capacity ({capacity} rows, --capacity) is below schedule.batch_size "
                             f"({s.batch_size}, --batch-size): the buffer could never hold one batch and the run "
                             "would take no gradient step; raise --capacity or lower --batch-size")
        streams = self.env.num_envs * max(1, self.collectors.num)
        if streams > capacity:
            raise ValueError(f"env.num_envs ({self.env.num_envs}, --num-envs)"
                             + (f" x collectors.num ({self.collectors.num})" if self.collectors.num else "")
                             + f" = {streams} replay streams, more than replay.capacity ({capacity} rows, "
                             "--capacity): every stream needs room for its rows; use fewer envs or a larger buffer")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: (v.to_dict() if isinstance(v, ReplayConfig)
                    else asdict(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v)
                for k, v in d.items()}


# -- loading ----------------------------------------------------------------------------------------------
# replay settings of config.json files written before the per-strategy options (flat ReplayConfig fields):
# old field -> field of the new options, for the strategies that had it
_OLD_REPLAY_FIELDS = {"offline_fraction": "offline_fraction", "priority_exponent": "priority_exponent",
                      "is_exponent": "is_exponent", "is_exponent_final": "is_exponent_final",
                      "score_mode": "score_mode", "arb_temperature": "temperature", "arb_amortized_rows":
                      "amortized_rows", "reliability_exponent": "reliability_exponent",
                      "berb_temperature": "temperature", "berb_init_online_fraction": "init_online_fraction"}
_OLD_ONLY_FOR = {"arb_temperature": ("arb", "arb_transition"), "arb_amortized_rows": ("arb", "arb_transition"),
                 "berb_temperature": ("berb",), "berb_init_online_fraction": ("berb",)}
_MOVED = {"schedule.refresh_every_grad_steps": "replay.arb.refresh_every_grad_steps (an option of the ARB replays)",
          "agent.utd_ratio": "schedule.utd_ratio (its only place; relive train --utd N)"}


def _migrate(d: dict) -> dict:
    """A config.json of an earlier version -> today's layout (flat replay fields -> replay.<name>.*)."""
    d = dict(d)
    replay = dict(d.get("replay", {}))
    name = replay.get("name", "uniform")
    schedule = dict(d.get("schedule", {}))
    refresh = schedule.pop("refresh_every_grad_steps", None)
    if name not in replay:
        load_builtins()
        if name in ALIASES:  # the alias's own option names: those that reach a field of its expansion
            base = expand_alias(name, {}, raw=False)[1]
            names = {f for f in {*_OLD_REPLAY_FIELDS.values(), "refresh_every_grad_steps"}
                     if _reaches(base, _alias_path(ALIASES[name], f))}
        else:
            names = {f.name for f in dataclasses.fields(replay_entry(name).config_cls)}
        opts = {}
        for old, new in _OLD_REPLAY_FIELDS.items():
            if old in replay and new in names and name in _OLD_ONLY_FOR.get(old, (name,)):
                opts[new] = replay[old]
        if refresh is not None and "refresh_every_grad_steps" in names:
            opts["refresh_every_grad_steps"] = refresh
        replay = {"name": name, "capacity": replay.get("capacity", 1_000_000), name: opts}
    d["replay"], d["schedule"] = _migrate_her(d.pop("her", None), replay), schedule
    if isinstance(d.get("agent"), dict):
        d["agent"] = {k: v for k, v in d["agent"].items() if k != "utd_ratio"}
    return d


_OLD_HER = {"enabled": False, "k": 4.0, "strategy": "future"}  # the top-level her section (issue 30) and its defaults


def _migrate_her(her, replay: dict) -> dict:
    """The replay of a config.json that still has the top-level ``her`` section (before issue 48): with
    ``her.enabled``, ``her(inner=<that replay>, k, strategy)``; without, the replay as it was (k, strategy unused)."""
    if her is None:
        return replay
    if not isinstance(her, dict) or set(her) - set(_OLD_HER):
        raise ValueError(f"her: expected a table of {sorted(_OLD_HER)} (the settings of earlier versions; HER is now "
                         f"the replay her: replay.her.k, replay.her.strategy, replay.her.inner), got {her!r}")
    her = _OLD_HER | her
    if not isinstance(her["enabled"], bool):
        raise ValueError(f"her.enabled must be true or false, got {her['enabled']!r}")
    if not her["enabled"]:
        return replay
    if replay.get("name") == "her":
        raise ValueError("her.enabled = true and replay.name = her: HER is the replay now; drop the her section")
    inner = {k: v for k, v in replay.items() if k not in _REPLAY_FIELDS}
    out = {"name": "her", "her": {"inner": inner, "k": her["k"], "strategy": her["strategy"]}}
    return out | {k: replay[k] for k in _REPLAY_FIELDS if k in replay}


def _her_alias(r: ReplayConfig, name: str, raw: str, key: str) -> ReplayConfig:
    """``--set her.enabled=...`` / ``her.k=...`` / ``her.strategy=...`` of earlier versions on today's replay: enabled
    wraps the replay in her (or unwraps it), k and strategy set ``replay.her.*`` of a her replay."""
    if name not in _OLD_HER:
        raise ValueError(f"unknown setting {key!r}: HER is the replay her now (replay.her.k, replay.her.strategy, "
                         "replay.her.inner.name)")
    if name == "enabled":
        if parse_value(bool, raw, key) == (r.name == "her"):
            return r
        if r.name == "her":  # off: the replay it wrapped
            return ReplayConfig(r.options.inner.name, r.capacity, r.options.inner.options, r.device)
        return ReplayConfig("her", r.capacity, replay_entry("her").config_cls(inner=ReplaySpec(r.name, r.options)),
                            r.device)
    if r.name != "her":
        raise ValueError(f"--set {key}: HER is the replay her now and this run's replay is {r.label!r}: set "
                         f"replay.her.{name} with --replay her (replay.her.inner.name={r.name}), or --set "
                         f"her.enabled=true first")
    return dataclasses.replace(r, options=set_option(r.options, [name], raw, f"replay.her.{name}", raw=True))


def _reaches(options, path: list[str]) -> bool:
    """Whether ``path`` names a setting of ``options`` (through its parts)."""
    names = {f.name for f in dataclasses.fields(options)}
    if path[0] not in names:
        return False
    value = getattr(options, path[0])
    if isinstance(value, ReplaySpec):
        return len(path) >= 3 and path[1] == value.name and _reaches(value.options, path[2:])
    return len(path) == 1


def _build(cls, data: dict, where: str):
    """Rebuild a dataclass from JSON data, turning lists back into tuples where typed so; a replay part
    (``ReplaySpec``) from its ``{"name": ..., name: {...}}`` table."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a table of settings, got {data!r}")
    renamed = _RENAMED_OPTIONS.get(cls.__name__, {})
    data = {renamed.get(k, k): v for k, v in data.items()}
    legacy = getattr(cls, "from_legacy_dict", None)  # a config class's own migration of its earlier fields
    if callable(legacy):
        data = legacy(data)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known: {sorted(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            tp, value, at = hints[f.name], data[f.name], f"{where}.{f.name}"
            if tp is ReplaySpec:
                kwargs[f.name] = _spec_from_dict(value, at)
            elif dataclasses.is_dataclass(tp) and isinstance(value, dict):
                kwargs[f.name] = _build(tp, value, at)
            else:
                kwargs[f.name] = _from_json(tp, value)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None


def _from_json(tp, value):
    origin = typing.get_origin(tp)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if origin in (typing.Union, types.UnionType):
        return next((tuple(value) for a in typing.get_args(tp) if typing.get_origin(a) is tuple
                     and isinstance(value, list)), value)
    return value


def config_from_dict(d: dict) -> ExperimentConfig:
    d = _migrate(d)
    kind = d.get("agent_kind", "sac")
    agent = _build(agent_entry(kind).config_cls, d.get("agent", {}), "agent")
    r = d.get("replay", {})
    spec = _spec_from_dict({k: v for k, v in r.items() if k not in _REPLAY_FIELDS}, "replay")
    replay = ReplayConfig(spec.name, r.get("capacity", 1_000_000), spec.options, r.get("device"), r.get("shards", 0),
                          r.get("shard_timeout_s", 600.0), r.get("shard_prefetch", 0))
    sections = {k: _build(t, d[k], k) for k, t in (("run", RunConfig), ("env", EnvConfig), ("data", DataConfig),
                                                   ("schedule", ScheduleConfig),
                                                   ("collectors", CollectorsConfig),
                                                   ("intervention", InterventionConfig)) if k in d}
    return ExperimentConfig(preset=d.get("preset", "sac"), agent_kind=kind, agent=agent, replay=replay, **sections)


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write ``config.json`` atomically (a temporary file renamed over it): a process killed mid-write leaves the
    previous file, never a truncated one (a resumed run rewrites its config when it moves to another device)."""
    write_text_atomic(path, json.dumps(cfg.to_dict(), indent=1, allow_nan=True))


def load_config(path: str | Path) -> ExperimentConfig:
    return config_from_dict(json.loads(Path(path).read_text()))


# -- --set section.key=value ------------------------------------------------------------------------------
def parse_value(tp, raw: str, key: str):
    """Parse a command-line string against a field's declared type (bool: true/false in any case; int: no
    fraction; X | None: null/none; tuple[int, ...]: a JSON list); a clear error naming key, value and type."""
    text = raw.strip()
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and text.lower() in ("null", "none"):
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return parse_value(a, raw, key)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(f"--set {key}={raw}: expected {_type_name(tp)}")
    try:
        if tp is bool:
            if text.lower() in ("true", "false"):
                return text.lower() == "true"
            raise ValueError
        if tp is int:
            value = json.loads(text)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError
            return value
        if tp is float:
            if text.lower() in ("inf", "+inf", "infinity", "-inf", "-infinity", "nan"):
                return float(text.lower().replace("infinity", "inf"))
            value = json.loads(text)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError
            return float(value)
        if tp is str:
            if len(text) >= 2 and text[0] == text[-1] == '"':
                return json.loads(text)
            return raw
        if origin is dict:  # (env.kwargs: a JSON object; its __post_init__ checks the keys and values)
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
        if origin is tuple:
            value = json.loads(text)
            if not isinstance(value, list):
                raise ValueError
            elem = args[0] if args else Any
            return tuple(parse_value(elem, json.dumps(v), key) if elem in (int, float, bool) else v for v in value)
        if tp is Any:
            return json.loads(text)
    except (ValueError, json.JSONDecodeError):
        raise ValueError(f"--set {key}={raw}: expected {_type_name(tp)}, got {raw!r}") from None
    raise ValueError(f"--set {key}: settings of type {tp} cannot be set from the command line")


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is tuple:
        plural = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}
        return f"a list of {plural.get(args[0], 'values') if args else 'values'} (e.g. [256,256])"
    if origin is dict:
        return 'a JSON object (e.g. {"g": 9.81})'
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _field_type(cls, name: str):
    return typing.get_type_hints(cls)[name]


def override(cfg: ExperimentConfig, assignments: list[str]) -> ExperimentConfig:
    """Apply ``section.key=value`` strings in order, each parsed against the field's declared type, e.g.
    ``agent.num_qs=10``, ``replay.name=reaper``, ``replay.reaper.priority_exponent=0.4``. Setting
    ``replay.name`` (or ``agent_kind``) resets that part's options to the new method's defaults."""
    for item in assignments:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts) or (len(parts) < 2 and parts[0] not in ("agent_kind", "preset")):
            raise ValueError(f"--set expects section.key=value (e.g. agent.num_qs=10), got {item!r}")
        cfg = _assign(cfg, parts, raw, key.strip())
    return cfg


def _assign(cfg: ExperimentConfig, parts: list[str], raw: str, key: str) -> ExperimentConfig:
    if key in _MOVED:
        raise ValueError(f"--set {key}: this setting moved to {_MOVED[key]}")
    if parts == ["agent_kind"]:
        kind = parse_value(str, raw, key)
        return dataclasses.replace(cfg, agent_kind=kind, agent=agent_entry(kind).config_cls())
    if parts == ["preset"]:
        return dataclasses.replace(cfg, preset=parse_value(str, raw, key))
    section = parts[0]
    if section == "agent" and len(parts) == 2:
        return dataclasses.replace(cfg, agent=_set_field(cfg.agent, parts[1], raw, key, "agent"))
    if section == "replay":
        r = cfg.replay
        if parts[1:] == ["name"]:
            name = parse_value(str, raw, key)
            return dataclasses.replace(cfg, replay=ReplayConfig(name, r.capacity, device=r.device, shards=r.shards,
                                                                shard_timeout_s=r.shard_timeout_s,
                                                                shard_prefetch=r.shard_prefetch))
        if parts[1:] == ["capacity"]:
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, capacity=parse_value(int, raw, key)))
        if parts[1:] == ["device"]:
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, device=parse_value(str | None, raw, key)))
        if parts[1:] == ["shards"]:
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, shards=parse_value(int, raw, key)))
        if parts[1:] == ["shard_prefetch"]:
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, shard_prefetch=parse_value(int, raw, key)))
        if parts[1:] == ["shard_timeout_s"]:
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, shard_timeout_s=parse_value(float, raw,
                                                                                                      key)))
        if len(parts) >= 3:
            alias = ALIASES.get(parts[1])
            if parts[1] == r.name:
                path = parts[2:]
            elif alias is not None and alias.target == r.name:  # replay.symmetric_per.priority_exponent
                path = _alias_path(alias, parts[2]) + parts[3:]
            else:
                raise ValueError(f"--set {key}: the options of replay {parts[1]!r} apply only when replay.name is "
                                 f"{parts[1]!r}; this run uses {r.label!r} (set --replay {parts[1]} first)")
            opts = set_option(r.options, path, raw, key, raw=True)
            return dataclasses.replace(cfg, replay=dataclasses.replace(r, options=opts))
        if len(parts) == 2 and parts[1] in _OLD_REPLAY_FIELDS:
            new = _OLD_REPLAY_FIELDS[parts[1]]

            having = [n for n, e in sorted(REPLAYS.items())
                      if new in {f.name for f in dataclasses.fields(e.config_cls)}]
            raise ValueError(f"--set {key}: replay options are now per strategy: replay.<name>.{new}, for "
                             f"<name> in {having} (`relive presets --show NAME` lists each one's options)")
        known = ["replay.name", "replay.capacity", "replay.device", "replay.shards", "replay.shard_timeout_s",
                 "replay.shard_prefetch"]
        known += [f"replay.{r.name}.{f.name}" for f in dataclasses.fields(r.options)]
        raise ValueError(f"unknown setting {key!r}; known: {known}")
    if section == "her" and len(parts) == 2:  # the top-level her.* of earlier versions: HER is a replay now
        return dataclasses.replace(cfg, replay=_her_alias(cfg.replay, parts[1], raw, key))
    sections = {"run": "run", "env": "env", "data": "data", "schedule": "schedule", "collectors": "collectors",
                "intervention": "intervention"}
    if section in sections and len(parts) == 2:
        obj = getattr(cfg, section)
        return dataclasses.replace(cfg, **{section: _set_field(obj, parts[1], raw, key, section)})
    fields_of = {s: [f.name for f in dataclasses.fields(getattr(cfg, s))] for s in ("agent", *sections)}
    raise ValueError(f"unknown setting {key!r}; known: {fields_of} and replay.name, replay.capacity, "
                     f"replay.{cfg.replay.name}.*")


def _set_field(obj, name: str, raw: str, key: str, where: str):
    names = [f.name for f in dataclasses.fields(obj)]
    if name not in names:
        raise ValueError(f"unknown setting {key!r}; {where} has {names}")
    value = parse_value(_field_type(type(obj), name), raw, key)
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"--set {key}={raw}: NaN is not a valid setting")
    try:
        return dataclasses.replace(obj, **{name: value})
    except (ValueError, TypeError) as e:
        raise ValueError(f"--set {key}={raw}: {e}") from None


def describe(config_obj) -> list[tuple[str, Any, str]]:
    """(field, value, doc) of a config dataclass, for `relive presets --show`; a replay part (``ReplaySpec``) as
    ``part.name`` and its options as ``part.<name>.<option>``."""
    docs = field_docs(type(config_obj))
    out = []
    for f in dataclasses.fields(config_obj):
        value = getattr(config_obj, f.name)
        if isinstance(value, ReplaySpec):
            out.append((f"{f.name}.name", value.name, docs.get(f.name, "")))
            out += [(f"{f.name}.{value.name}.{k}", v, d) for k, v, d in describe(value.options)]
        else:
            out.append((f.name, value, docs.get(f.name, "")))
    return out
