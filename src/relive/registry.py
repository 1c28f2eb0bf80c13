"""One registry per kind: replay strategies and agents register once, beside their class, with their own frozen
config dataclass (whose defaults are the method's only defaults).

    @register_replay("reaper", ReaPERConfig)
    def _build(options: ReaPERConfig, ctx: ReplayBuild) -> Sampler: ...

    @register_agent("sac", SACConfig)
    class SAC: ...            # with a classmethod from_spec(spec, config, seed, device)

The run configuration nests the chosen method's options under its name (``replay.reaper.priority_exponent``,
``agent.num_qs``); ``relive presets --show NAME`` and ``relive train --help`` list them with their doc strings.
A test file can register a toy sampler or agent and run it through ``relive train`` without editing ``src/``.
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


@dataclass(frozen=True)
class Entry:
    name: str
    config_cls: type
    target: Any  # replay: build(options, ReplayBuild) -> Sampler; agent: the class (with from_spec)
    doc: str


REPLAYS: dict[str, Entry] = {}
AGENTS: dict[str, Entry] = {}
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
    old = table.get(name)
    if old is not None and (old.target.__module__, old.target.__qualname__) != (target.__module__,
                                                                                target.__qualname__):
        raise ValueError(f"{kind} {name!r} is already registered by {old.target.__module__}.{old.target.__qualname__}")
    text = doc or inspect.getdoc(target) or inspect.getdoc(config_cls) or ""
    table[name] = Entry(name, config_cls, target, text.strip().split("\n\n")[0].replace("\n", " "))


def register_replay(name: str, config_cls: type, doc: str | None = None) -> Callable:
    """Decorator for ``build(options, ctx: ReplayBuild) -> Sampler``; registers it as ``--replay NAME``."""

    def deco(build):
        _register(REPLAYS, "replay", name, config_cls, build, doc)
        return build

    return deco


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
        raise ValueError(f"unknown replay {name!r}; known: {sorted(REPLAYS)} (a plug-in's: import it first, "
                         "`relive --plugin MODULE ...`)") from None


def agent_entry(name: str) -> Entry:
    load_builtins()
    try:
        return AGENTS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {sorted(AGENTS)} (a plug-in's: import it first, "
                         "`relive --plugin MODULE ...`)") from None


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
