"""One registry per kind: replay strategies and agents register once, beside their class, with their own frozen
config dataclass (whose defaults are the method's only defaults).

    @register_replay("per")                     # a sampler class: its options are its own ``Config`` dataclass,
    class PrioritizedSampler(Sampler): ...     # the run builds it with ``from_run``, checkpoints name its class

    @register_replay("mine", MineConfig)       # or a builder function (a composition, a plug-in's wrapper)
    def _build(options: MineConfig, ctx: ReplayBuild) -> Sampler: ...

    register_alias("symmetric", "mixture", keys={"offline_fraction": "offline_fraction"})  # an old name, expanded

    @register_agent("sac", SACConfig)
    class SAC: ...            # with a classmethod from_spec(spec, config, seed, device)

    @register_intervener("mine")
    def _build(ctx: InterventionBuild) -> Intervener: ...   # intervention.kind = "mine" (docs/hil.md)

The run configuration nests the chosen method's options under its name (``replay.reaper.priority_exponent``,
``agent.num_qs``); ``relive presets --show NAME`` and ``relive train --help`` list them with their doc strings.
A test file can register a toy sampler or agent and run it through ``relive train`` without editing ``src/``.

Samplers have one table: ``REPLAYS`` (what ``--replay NAME`` builds) and ``SAMPLER_CLASSES`` (what a checkpoint's
``{"type": class name}`` loads) are filled by the same ``register_replay``; a sampler offered under no name (a part
of a composition only) registers its class with ``register_sampler_class``. ``ReplaySpec`` is one named strategy
with its options: a composition's parts (``replay.mixture.online = {name = "per", per = {...}}``) are specs.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ReplayBuild:
    """What a replay builder may use beside its options."""

    total_grad_steps: int  # gradient steps the run will take (IS-exponent annealing)
    env_steps_per_chunk: int  # env steps per collected chunk
    seed: np.random.SeedSequence  # the sampler's own stream (spawned from the run seed)
    online_env_steps: int = 0  # online env steps the run will take (offline-share schedules)


@dataclass(frozen=True)
class Entry:
    name: str
    config_cls: type
    target: Any  # replay: build(options, ReplayBuild) -> Sampler; agent: the class (with from_spec)
    doc: str
    sampler_cls: type | None = None  # replay registered as a sampler class: that class


@dataclass(frozen=True)
class Alias:
    """An old replay name kept as a shorthand: ``target`` with the options ``sets`` (``"online.name=per"``, paths
    under ``replay.<target>``), and the alias's own option names mapped to paths under the target (``keys``)."""

    name: str
    target: str
    sets: tuple[str, ...]
    keys: dict[str, str]
    doc: str


REPLAYS: dict[str, Entry] = {}
AGENTS: dict[str, Entry] = {}
ALIASES: dict[str, Alias] = {}
SAMPLER_CLASSES: dict[str, type] = {}  # class name -> sampler class, for checkpoints (relive.replay.samplers.SAMPLERS)
_BUILTINS = ("relive.replay.samplers", "relive.agents.sac", "relive.agents.cal_ql", "relive.agents.ddqn")
_OPTIONAL_BUILTINS = ("relive.replay.samplers.refer", "relive.agents.ddpg", "relive.agents.sac_refer",
                      "relive.agents.vracer", "relive.agents.residual_sac")


def _check_config_cls(name: str, config_cls: type) -> None:
    # __dataclass_params__ is set on every dataclass but is not in typeshed's DataclassInstance protocol
    if not (dataclasses.is_dataclass(config_cls) and config_cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{name!r}: the config must be a frozen dataclass, got {config_cls!r}")
    missing = [f.name for f in dataclasses.fields(config_cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise TypeError(f"{name!r}: every field of {config_cls.__name__} needs a default; {missing} have none")
    config_cls()  # the defaults themselves must be valid


def _register(table: dict, kind: str, name: str, config_cls: type, target, doc: str | None) -> None:
    if not name.isidentifier():
        raise ValueError(f"{kind} name must be an identifier, got {name!r}")
    _check_config_cls(name, config_cls)
    if table is REPLAYS and name in ALIASES:
        raise ValueError(f"replay {name!r} is already an alias of {ALIASES[name].target!r}")
    owner = getattr(target, "__self__", target)  # a sampler class's bound from_run: the class
    old = table.get(name)
    if old is not None:
        old_owner = getattr(old.target, "__self__", old.target)
        if (old_owner.__module__, old_owner.__qualname__) != (owner.__module__, owner.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered by "
                             f"{old_owner.__module__}.{old_owner.__qualname__}")
    text = doc or inspect.getdoc(target if owner is target else owner) or inspect.getdoc(config_cls) or ""
    table[name] = Entry(name, config_cls, target, text.strip().split("\n\n")[0].replace("\n", " "),
                        owner if owner is not target else None)


def register_sampler_class(cls: type) -> type:
    """Make a sampler class loadable from checkpoints by its class name (``register_replay`` does this for the
    classes it registers; this is for a sampler offered under no replay name)."""
    SAMPLER_CLASSES[cls.__name__] = cls
    return cls


def register_replay(name: str, config_cls: type | None = None, doc: str | None = None) -> Callable:
    """Decorator registering ``--replay NAME``, on either

    - a sampler class: its options are its ``Config`` dataclass (the one declaration of every setting), a run
      builds it with ``cls.from_run(options, ctx)``, and checkpoints load it by class name; or
    - a builder ``build(options, ctx: ReplayBuild) -> Sampler`` with its ``config_cls`` (a composition, a plug-in)."""

    def deco(target):
        if isinstance(target, type):
            register_sampler_class(target)
            _register(REPLAYS, "replay", name, config_cls or target.Config, target.from_run, doc)
        elif config_cls is None:
            raise TypeError(f"replay {name!r}: a builder function needs its config dataclass, "
                            "register_replay(name, ConfigCls)")
        else:
            _register(REPLAYS, "replay", name, config_cls, target, doc)
        return target

    return deco


def register_alias(name: str, target: str, sets: tuple[str, ...] = (), keys: dict[str, str] | None = None,
                   doc: str = "") -> None:
    """Keep ``name`` as a shorthand of the registered replay ``target`` with the options ``sets`` (paths under
    ``replay.<target>``): ``--replay name``, ``replay.name = "name"`` in a config file and ``replay.<name>.<key>``
    expand to the target (``keys``: the alias's option names -> their paths under the target)."""
    if not name.isidentifier():
        raise ValueError(f"replay alias must be an identifier, got {name!r}")
    if name in REPLAYS:
        raise ValueError(f"replay {name!r} is already registered; an alias needs a name of its own")
    ALIASES[name] = Alias(name, target, tuple(sets), dict(keys or {}), doc)


def register_agent(name: str, config_cls: type, doc: str | None = None) -> Callable:
    """Class decorator; the class needs ``from_spec(spec, config, seed: SeedSequence, device) -> agent``."""

    def deco(cls):
        if not callable(getattr(cls, "from_spec", None)):
            raise TypeError(f"agent {name!r}: {cls.__name__} needs a classmethod from_spec(spec, config, seed, device)")
        _register(AGENTS, "agent", name, config_cls, cls, doc)
        return cls

    return deco


def load_builtins() -> None:
    """Import the modules that register the built-in methods (idempotent)."""
    for module in _BUILTINS:
        importlib.import_module(module)
    for module in _OPTIONAL_BUILTINS:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def replay_entry(name: str) -> Entry:
    load_builtins()
    try:
        return REPLAYS[name]
    except KeyError:
        if name in ALIASES:
            raise ValueError(f"replay {name!r} is an alias of {ALIASES[name].target!r} "
                             f"({', '.join(ALIASES[name].sets) or 'its defaults'}): expand it first "
                             "(relive.config.ReplayConfig.of)") from None
        raise ValueError(f"unknown replay {name!r}; known: {sorted(REPLAYS) + sorted(ALIASES)} (a plug-in's: "
                         "import it first, `relive --plugin MODULE ...`)") from None


def replay_names() -> list[str]:
    """Every name ``--replay`` accepts: registered strategies and their aliases."""
    load_builtins()
    return sorted(REPLAYS) + sorted(ALIASES)


@dataclass(frozen=True)
class ReplaySpec:
    """One registered replay strategy with its options (``options`` None: its defaults) -- a part of a composition,
    e.g. ``MixtureConfig.online``. In JSON: ``{"name": "per", "per": {...options}}``."""

    name: str = "uniform"
    options: Any = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise ValueError(f"a replay part's name must be a string, got {self.name!r}")
        entry = REPLAYS.get(self.name)  # (registered already: no import of the built-ins, which may be importing)
        cls = (entry or replay_entry(self.name)).config_cls
        if self.options is None:
            object.__setattr__(self, "options", cls())
        elif type(self.options) is not cls:
            raise ValueError(f"replay {self.name!r} takes a {cls.__name__}, got {type(self.options).__name__}")

    def build(self, ctx: ReplayBuild):
        """The sampler this part describes, built as a run builds it."""
        return replay_entry(self.name).target(self.options, ctx)

    def to_dict(self) -> dict:
        return {"name": self.name, self.name: options_dict(self.options)}

    def __str__(self) -> str:
        """``per(priority_exponent=0.5)``: the name and the options that differ from its defaults; a composition's
        parts always (``mixture(offline=uniform, online=per)``), but those its options class lists in
        ``optional_parts`` only when changed. An options class with a ``label()`` method words its own
        (``her(k=4, future, inner=per)``)."""
        label = getattr(self.options, "label", None)
        if callable(label):
            return str(label())
        default = type(self.options)()
        optional = getattr(type(self.options), "optional_parts", ())
        shown = [f"{f.name}={v}" for f in dataclasses.fields(self.options)
                 if (isinstance(v := getattr(self.options, f.name), ReplaySpec) and f.name not in optional)
                 or v != getattr(default, f.name)]
        return self.name + (f"({', '.join(shown)})" if shown else "")


def env_options(options) -> dict[str, Any]:
    """What a replay needs of the run's environments, as ``make_env`` keyword arguments: the ``env_options`` its
    options class declares (a ``ClassVar`` mapping; HER: ``{"keep_goal_dict": True}``), merged over its parts. The
    trainer, the collectors and ``relive eval`` make their envs with them and never ask which replay it is."""
    out = dict(getattr(type(options), "env_options", {}))
    for f in dataclasses.fields(options):
        part = getattr(options, f.name)
        if isinstance(part, ReplaySpec):
            out |= env_options(part.options)
    return out


def options_dict(options) -> dict:
    """A replay's options as JSON data: nested parts (``ReplaySpec``) as ``{"name": ..., name: {...}}``, tuples as
    lists."""
    out = {}
    for f in dataclasses.fields(options):
        v = getattr(options, f.name)
        out[f.name] = v.to_dict() if isinstance(v, ReplaySpec) else list(v) if isinstance(v, tuple) else v
    return out


def agent_entry(name: str) -> Entry:
    load_builtins()
    try:
        return AGENTS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {sorted(AGENTS)} (a plug-in's: import it first, "
                         "`relive --plugin MODULE ...`)") from None


# -- interveners (intervention.kind) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class InterventionBuild:
    """What an intervener's builder may use: the run's config (its ``intervention`` section), the env spec, the env
    the collector steps (created with ``render_mode="rgb_array"`` when the kind was registered with
    ``renders=True``) and the run directory."""

    config: Any  # the ExperimentConfig
    spec: Any  # relive.envs.EnvSpec
    env: Any
    run_dir: Any = None  # pathlib.Path of the run (its metrics.jsonl), or None


@dataclass(frozen=True)
class IntervenerEntry:
    name: str
    build: Callable[[InterventionBuild], Any]  # -> an Intervener (relive.train.intervention), or None
    doc: str
    renders: bool = False  # the env is created with render_mode="rgb_array" (a console shows its frames)


def _no_intervener(ctx: InterventionBuild) -> None:
    """No interventions: the agent acts alone."""
    return None


INTERVENERS: dict[str, IntervenerEntry] = {"none": IntervenerEntry("none", _no_intervener, "the agent acts alone")}
_INTERVENER_BUILTINS = ("relive.train.intervention", "relive.train.console")


def register_intervener(name: str, renders: bool = False, doc: str | None = None) -> Callable:
    """Decorator registering ``intervention.kind = NAME`` on ``build(ctx: InterventionBuild) -> Intervener``: a
    function, or a class whose constructor takes the ``ctx`` (an intervener is ``intervener(obs, proposed) ->
    (take_over, action)`` with ``on_episode_start``, ``state_dict``, ``load_state_dict``;
    :mod:`relive.train.intervention`). ``renders``: the collector's env renders ``rgb_array`` frames."""

    def deco(target):
        if not name.isidentifier():
            raise ValueError(f"intervener name must be an identifier, got {name!r}")
        old = INTERVENERS.get(name)
        if old is not None and (getattr(old.build, "__module__", None), getattr(old.build, "__qualname__", None)) != \
                (getattr(target, "__module__", None), getattr(target, "__qualname__", None)):
            raise ValueError(f"intervener {name!r} is already registered by {old.build.__module__}."
                             f"{old.build.__qualname__}")
        text = doc or inspect.getdoc(target) or ""
        INTERVENERS[name] = IntervenerEntry(name, target, text.strip().split("\n\n")[0].replace("\n", " "),
                                            bool(renders))
        return target

    return deco


def intervener_entry(name: str) -> IntervenerEntry:
    """The registered ``intervention.kind`` ``name`` (the built-ins are imported on the first look-up of another
    name than ``none``, so that a config is built without importing the envs)."""
    if name in INTERVENERS:
        return INTERVENERS[name]
    for module in _INTERVENER_BUILTINS:
        importlib.import_module(module)
    try:
        return INTERVENERS[name]
    except KeyError:
        raise ValueError(f"intervention.kind {name!r} is not registered; known: {sorted(INTERVENERS)} (a plug-in's: "
                         "import it first, `relive --plugin MODULE ...`)") from None


def field_docs(config_cls: type) -> dict[str, str]:
    """The comment after each field of a config dataclass (``x: int = 1  # what x is``), by field name; a
    comment continued on the following lines (``#`` lines indented under it) is joined."""
    out: dict[str, str] = {}
    for cls in reversed(config_cls.__mro__):
        if not dataclasses.is_dataclass(cls) or cls is object:
            continue
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        tree = ast.parse(inspect.cleandoc("\n".join(lines)) if lines and lines[0].startswith(" ") else "\n".join(lines))
        cls_node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
        src = inspect.cleandoc("\n".join(lines)).splitlines() if lines[0].startswith(" ") else lines
        for node in cls_node.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                i = (node.end_lineno or node.lineno) - 1  # end_lineno is Optional in ast's types, set by parse
                indent = len(src[node.lineno - 1]) - len(src[node.lineno - 1].lstrip())
                parts = []
                if "#" in src[i]:  # a trailing comment, maybe continued on deeper-indented comment lines
                    parts.append(src[i].split("#", 1)[1].strip())
                    j = i + 1
                    while j < len(src) and src[j].strip().startswith("#") and \
                            len(src[j]) - len(src[j].lstrip()) > indent:
                        parts.append(src[j].strip()[1:].strip())
                        j += 1
                else:  # a comment block right above the field, at its indentation
                    j = node.lineno - 2
                    while j >= 0 and src[j].strip().startswith("#") and len(src[j]) - len(src[j].lstrip()) == indent:
                        parts.insert(0, src[j].strip()[1:].strip())
                        j -= 1
                if parts:
                    out[node.target.id] = " ".join(parts)
    return out
