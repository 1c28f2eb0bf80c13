"""What a sampler or an agent needs from the training loop, declared as data; the trainer serves declarations
and never names a method.

A component (the agent, the buffer's sampler and, inside a mixture, each part) may define
``loop_hooks(ctx: LoopContext) -> list[Hook]``. The trainer collects them once, after building everything:

- :class:`EveryGradSteps` -- ``fn()`` before sampling, on gradient steps ``0, k, 2k, ...`` of a phase (ARB: re-score
  every row with the agent's scoring function every ``k`` online gradient steps; ``k = 1`` for amortized ARB);
- :class:`OnPhase` -- ``fn(phase)`` when a phase starts (``"offline"``, ``"online"``; Cal-QL turns calibration on
  or off at the switch);
- :class:`AfterUpdate` -- ``fn(batch, result)`` after every gradient step, once signals reached the buffer;
- :class:`OnEpisodeEnd` -- ``fn(slots)`` with the slots of the stored rows of an online episode that just ended,
  in time order (returns-to-go for Cal-QL);
- :class:`OnEpisodeStart` -- ``fn()`` before the first step of every online episode (PLD: draw the probing length);
  with ``per_env=True`` it is ``fn(env)``, the index of the env (among the ones stepped together) whose episode
  starts, so that per-episode state can be kept per env (``--num-envs N``, Ray collectors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

PHASES = ("offline", "online")


@dataclass(frozen=True)
class LoopContext:
    """What a component may use to build its hooks."""

    agent: Any
    buffer: Any
    config: Any  # the ExperimentConfig
    gamma: float  # discount for returns-to-go (data.discount, else the agent's gamma)


@dataclass(frozen=True)
class EveryGradSteps:
    every: int
    fn: Callable[[], Any]
    phase: str = "online"

    def __post_init__(self):
        if self.every < 1 or self.phase not in PHASES:
            raise ValueError(f"EveryGradSteps needs every >= 1 and phase in {PHASES}, got {self.every}, {self.phase!r}")


@dataclass(frozen=True)
class OnPhase:
    fn: Callable[[str], Any]


@dataclass(frozen=True)
class AfterUpdate:
    fn: Callable[[Any, Any], Any]


@dataclass(frozen=True)
class OnEpisodeEnd:
    fn: Callable[[np.ndarray], Any]


@dataclass(frozen=True)
class OnEpisodeStart:
    fn: Callable[..., Any]  # fn() or, with per_env, fn(env index)
    per_env: bool = False  # False: the state is kept for one env (the loop refuses num_envs > 1)


Hook = EveryGradSteps | OnPhase | AfterUpdate | OnEpisodeEnd | OnEpisodeStart


def collect_hooks(ctx: LoopContext, *components) -> list:
    """Every hook the components declare (a mixture sampler forwards its parts' hooks)."""
    hooks: list = []
    for c in components:
        fn = getattr(c, "loop_hooks", None)
        if fn is not None:
            hooks.extend(fn(ctx))
    return hooks


def of_type(hooks: list, kind: type) -> list:
    return [h for h in hooks if isinstance(h, kind)]


def episode_start_fns(hooks: list) -> list[Callable[[int], Any]]:
    """The ``OnEpisodeStart`` hooks as ``fn(env index)`` callables (a hook without ``per_env`` ignores the index:
    the loop allows it only with one env)."""
    return [h.fn if h.per_env else _ignoring_env(h.fn) for h in of_type(hooks, OnEpisodeStart)]


def _ignoring_env(fn: Callable[[], Any]) -> Callable[[int], Any]:
    return lambda env: fn()
