"""Experiment configuration: frozen dataclasses grouped by concern, validated on construction, saved as
``config.json`` and reloaded to an equal object (``load_config``)."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from relive.agents.cal_ql import CalQLConfig
from relive.agents.ddqn import DDQNConfig
from relive.agents.sac import SACConfig

AGENT_CONFIGS = {"sac": SACConfig, "calql": CalQLConfig, "ddqn": DDQNConfig}
REPLAY_NAMES = ("uniform", "per", "symmetric", "symmetric_per", "arb", "arb_transition", "reaper",
               "reaper_reference", "berb")


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    run_dir: str | None = None  # default: runs/<preset>-<env>-seed<seed>-<time>
    device: str = "cpu"
    num_threads: int = 1  # torch intra-op threads
    log_every_env_steps: int = 1000
    eval_every_env_steps: int = 5000
    eval_episodes: int = 5
    checkpoint_every_env_steps: int = 10_000  # checkpoints land on the first episode end after this many steps
    checkpoint_every_offline_grad_steps: int = 10_000  # offline phase (and always at its end)
    progress: bool = True
    save_final_buffer: bool = False  # also write the replay buffer at the end (buffer_final/)
    save_agent_snapshots: bool = False  # keep the agent of every evaluation (snapshots/agent_<env_step>/)
    # start from the agent a finished run saved (<dir>/agent_final: networks, optimizers, temperatures), e.g. one
    # offline pre-training shared by fine-tuning runs that differ only in their replay (the ARB paper's protocol)
    init_from: str | None = None
    stop_at_return: float | None = None  # end the online phase at the first evaluation with mean return >= this

    def __post_init__(self):
        for name in ("log_every_env_steps", "eval_every_env_steps", "eval_episodes", "checkpoint_every_env_steps",
                     "checkpoint_every_offline_grad_steps", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"run.{name} must be >= 1, got {getattr(self, name)}")
        if not (self.device == "cpu" or self.device.startswith(("cuda", "mps"))):
            raise ValueError(f"run.device must be 'cpu', 'cuda[:N]' or 'mps', got {self.device!r}")


@dataclass(frozen=True)
class EnvConfig:
    id: str = "Pendulum-v1"
    max_episode_steps: int | None = None  # override the registered time limit

    def __post_init__(self):
        if not self.id:
            raise ValueError("env.id must name a Gymnasium environment, e.g. 'Pendulum-v1'")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"env.max_episode_steps must be >= 1 or null, got {self.max_episode_steps}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str | None = None  # a relive .npz, a D4RL .hdf5 file, or a local Minari dataset (id or directory)
    discount: float | None = None  # for Monte-Carlo returns-to-go; default: the agent's gamma
    ref_min_return: float | None = None  # reference returns for normalized scores (D4RL style)
    ref_max_return: float | None = None

    def __post_init__(self):
        if self.discount is not None and not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"data.discount must be in [0, 1], got {self.discount}")
        refs = (self.ref_min_return, self.ref_max_return)
        if None not in refs and not refs[0] < refs[1]:
            raise ValueError(f"data.ref_min_return must be below data.ref_max_return, got {refs}")


@dataclass(frozen=True)
class ScheduleConfig:
    num_offline_grad_steps: int = 0
    num_online_env_steps: int = 10_000
    env_steps_per_chunk: int = 1  # collect this many env steps, then chunk x utd_ratio gradient steps
    utd_ratio: int = 1
    # > 0: this many gradient steps after each chunk instead of chunk x utd_ratio (RL Zoo's train_freq /
    # gradient_steps, e.g. 128 updates every 256 env steps on CartPole)
    grad_steps_per_chunk: int = 0
    num_warmup_env_steps: int = 1000  # no updates at the start of the online phase
    warmup_policy: str = "random"  # warm-up actions: "random" (uniform) or "agent" (the pre-trained policy)
    batch_size: int = 256
    refresh_every_grad_steps: int = 1000  # sampler.refresh cadence (ARB-style samplers)

    def __post_init__(self):
        if min(self.env_steps_per_chunk, self.utd_ratio, self.batch_size, self.refresh_every_grad_steps) < 1:
            raise ValueError("env_steps_per_chunk, utd_ratio, batch_size and refresh_every_grad_steps must be >= 1")
        if min(self.num_offline_grad_steps, self.num_online_env_steps, self.num_warmup_env_steps,
               self.grad_steps_per_chunk) < 0:
            raise ValueError("step counts must be >= 0")
        if self.warmup_policy not in ("random", "agent"):
            raise ValueError(f"schedule.warmup_policy must be 'random' or 'agent', got {self.warmup_policy!r}")


@dataclass(frozen=True)
class ReplayConfig:
    # uniform | per | symmetric (RLPD 50/50) | symmetric_per (uniform offline, PER online) | arb (trajectory level)
    # | arb_transition | reaper | reaper_reference (the reference code's open choices) | berb
    name: str = "uniform"
    capacity: int = 1_000_000
    offline_fraction: float = 0.5
    priority_exponent: float = 0.6
    is_exponent: float = 0.4
    is_exponent_final: float = 1.0
    score_mode: str = "standardized"  # ARB per-row score: "standardized" (reference code) or "log_prob"
    arb_temperature: float = 5.0  # ARB lambda (reference defaults: Cal-QL 5, PEX 0.5, FamO2O 2)
    arb_amortized_rows: int = 0  # > 0: re-score this many rows per refresh instead of the whole buffer
    reliability_exponent: float = 0.2  # ReaPER omega (alpha: priority_exponent)
    berb_temperature: float = 5.0
    berb_init_online_fraction: float = 0.5

    def __post_init__(self):
        if self.name not in REPLAY_NAMES:
            raise ValueError(f"replay.name must be one of {REPLAY_NAMES}, got {self.name!r}")
        if not 0.0 <= self.offline_fraction <= 1.0 or self.capacity < 1:
            raise ValueError("replay.offline_fraction must be in [0, 1] and capacity >= 1")
        if self.score_mode not in ("standardized", "log_prob"):
            raise ValueError(f"replay.score_mode must be 'standardized' or 'log_prob', got {self.score_mode!r}")
        for name in ("priority_exponent", "is_exponent", "is_exponent_final", "reliability_exponent"):
            if getattr(self, name) < 0:
                raise ValueError(f"replay.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("arb_temperature", "berb_temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"replay.{name} must be > 0, got {getattr(self, name)}")
        if self.arb_amortized_rows < 0 or not 0.0 <= self.berb_init_online_fraction <= 1.0:
            raise ValueError("replay.arb_amortized_rows must be >= 0 and berb_init_online_fraction in [0, 1]")


@dataclass(frozen=True)
class ExperimentConfig:
    preset: str = "sac"
    agent_kind: str = "sac"  # sac | calql | ddqn
    agent: SACConfig | CalQLConfig | DDQNConfig = field(default_factory=SACConfig)
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def __post_init__(self):
        if self.agent_kind not in AGENT_CONFIGS:
            raise ValueError(f"agent_kind must be one of {list(AGENT_CONFIGS)}, got {self.agent_kind!r}")
        if type(self.agent) is not AGENT_CONFIGS[self.agent_kind]:
            raise ValueError(f"agent_kind {self.agent_kind!r} needs a {AGENT_CONFIGS[self.agent_kind].__name__}, "
                             f"got {type(self.agent).__name__}")
        if getattr(self.agent, "utd_ratio", self.schedule.utd_ratio) != self.schedule.utd_ratio:
            raise ValueError(f"agent.utd_ratio ({self.agent.utd_ratio}) and schedule.utd_ratio "
                             f"({self.schedule.utd_ratio}) differ; the trainer uses schedule.utd_ratio: set both "
                             f"(relive train --utd N does)")

    def to_dict(self) -> dict:
        return asdict(self)


def _build(cls, data):
    """Rebuild a dataclass (recursively) from JSON data, turning lists back into tuples where typed so."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp, value):
    if dataclasses.is_dataclass(value):
        return value
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return _build(tp, value)
    origin = typing.get_origin(tp)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    if origin in (typing.Union, types.UnionType):
        return next((_convert(a, value) for a in typing.get_args(tp) if typing.get_origin(a) is tuple
                     and isinstance(value, list)), value)
    return value


def config_from_dict(d: dict) -> ExperimentConfig:
    d = dict(d)
    kind = d.get("agent_kind", "sac")
    if kind not in AGENT_CONFIGS:
        raise ValueError(f"agent_kind must be one of {list(AGENT_CONFIGS)}, got {kind!r}")
    d["agent"] = _build(AGENT_CONFIGS[kind], d.get("agent", {}))
    return _build(ExperimentConfig, d)


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(cfg.to_dict(), indent=1, allow_nan=True))


def load_config(path: str | Path) -> ExperimentConfig:
    return config_from_dict(json.loads(Path(path).read_text()))


def override(cfg: ExperimentConfig, assignments: list[str]) -> ExperimentConfig:
    """Apply ``section.key=value`` strings (value parsed as JSON, else a string), e.g. ``agent.num_qs=10``."""
    d = cfg.to_dict()
    for item in assignments:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ValueError(f"--set expects section.key=value (e.g. agent.num_qs=10), got {item!r}")
        key, raw = item.split("=", 1)
        section, name = key.split(".", 1)
        if section not in d or not isinstance(d[section], dict) or name not in d[section]:
            known = {s: list(v) for s, v in d.items() if isinstance(v, dict)}
            raise ValueError(f"unknown setting {key!r}; known: {known}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        d[section][name] = value
    return config_from_dict(d)
