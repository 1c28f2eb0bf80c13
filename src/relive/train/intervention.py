"""Interventions: a person (or an expert standing in for one) takes over from the agent during online training, the
HIL-SERL pattern (Luo et al. 2024): the executed action is the intervener's, the row is tagged, and it is kept as a
demonstration.

The seam is one call per env step, in the collector (:class:`~relive.train.collector.Collector`)::

    take_over, action = intervener(obs, proposed_action)     # obs: one env's observation, proposed: the agent's

The collector executes ``action`` when ``take_over`` and stores both: ``action`` is the executed one (what the
critic learns from) and the behaviour columns ``proposed_action`` / ``intervened`` keep the agent's proposal and the
flag (:data:`COLUMNS`). Where the rows go (:class:`DemoWriter`, called by the loop): every row to the online ring as
always, an intervened one tagged ``origin = INTERVENTION`` there, and each intervened stretch (consecutive intervened
steps of one episode) also to the buffer's demonstration segment (``ReplayBuffer.add_demonstrations``), never evicted
and sampled by the offline part of the mixture. Both, as HIL-SERL does (its interventions go to the demo buffer and
the RL buffer): the ring copy keeps the agent's episodes whole (n-step returns, returns-to-go, the episode index see
no holes) and the data online as the agent experienced it; the demonstration copy is what survives the ring's
eviction and what the offline half of every batch draws. A stretch is written when it ends (the person lets go, or
the episode ends); its last row is marked ``truncated`` unless it terminated, so the next stretch is a new offline
episode and bootstrapping from its true next observation stays right.

Built-ins: :class:`ScriptedIntervener` (an expert or base policy takes over when the agent's proposal is farther than
``threshold`` from the expert's action, for ``hold_steps`` steps, within a ``budget`` of intervened steps: the stand-
in for a person in tests and experiments), :class:`StateIntervener` (an expert takes over when the task goes wrong --
its distance to success rose for a few steps -- after a reaction delay, and lets go when it is back on track: a
person who watches the task) and :class:`DeviceIntervener` (a keyboard / gamepad read through a
:class:`DeviceReader`; tests use a fake device, :class:`GamepadReader` needs pygame); the browser console
(:mod:`relive.train.console`) is a fourth. ``intervention.kind`` names one in the registry
(:func:`relive.registry.register_intervener`; a device reader in one class: :func:`register_device`). Experts are
registered by name (:func:`register_expert`); ``intervention.expert`` picks one; so are the state intervener's
distances (:func:`register_distance`, ``intervention.distance``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import gymnasium as gym
import numpy as np

from relive.data.npz_io import save_dataset
from relive.envs import GOAL_KEYS, env_spec, has_goal_keys, make_env
from relive.registry import InterventionBuild, intervener_entry, register_intervener
from relive.train.collector import Collector
from relive.types import AGENT, INTERVENTION, ColumnDecl


class Intervener(Protocol):
    def __call__(self, obs, proposed: np.ndarray) -> tuple[bool, np.ndarray]: ...  # (take over?, executed action)

    def on_episode_start(self) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def intervention_columns(action_shape, action_dtype: str = "float32") -> tuple[ColumnDecl, ...]:
    """The behaviour columns an intervened run stores: the agent's proposal and whether the step was taken over."""
    return (ColumnDecl("proposed_action", tuple(action_shape), action_dtype, doc="the agent's proposed action"),
            ColumnDecl("intervened", (), "bool", doc="the executed action was the intervener's"))


COLUMNS = ("proposed_action", "intervened")


class ScriptedIntervener:
    """An expert policy that takes over when the agent deviates: at a step where
    ``||proposed - expert(obs)||_2 > threshold`` it executes the expert's action for ``hold_steps`` steps (a person
    keeps control for a while once they step in), until ``budget`` intervened steps are spent (0: no budget). The
    counters are its state (checkpointed with the collector)."""

    def __init__(self, expert: Callable, threshold: float, budget: int = 0, hold_steps: int = 1):
        if not (isinstance(threshold, int | float) and np.isfinite(threshold) and threshold >= 0):
            raise ValueError(f"intervention.threshold must be a finite number >= 0, got {threshold!r}")
        if int(budget) < 0 or int(hold_steps) < 1:
            raise ValueError(f"intervention.budget must be >= 0 and hold_steps >= 1, got {budget!r}, {hold_steps!r}")
        self.expert, self.threshold = expert, float(threshold)
        self.budget, self.hold_steps = int(budget), int(hold_steps)
        self.used = 0  # intervened steps so far
        self.holding = 0  # steps left of the current takeover

    def __call__(self, obs, proposed: np.ndarray) -> tuple[bool, np.ndarray]:
        if self.budget and self.used >= self.budget:
            return False, proposed
        expert = np.asarray(self.expert(obs), dtype=np.asarray(proposed).dtype).reshape(np.shape(proposed))
        if self.holding == 0 and float(np.linalg.norm(np.asarray(proposed, np.float64) - expert)) > self.threshold:
            self.holding = self.hold_steps
        if self.holding == 0:
            return False, proposed
        self.holding -= 1
        self.used += 1
        return True, expert

    def on_episode_start(self) -> None:
        self.holding = 0

    def state_dict(self) -> dict:
        return {"used": self.used, "holding": self.holding}

    def load_state_dict(self, state: dict) -> None:
        self.used, self.holding = int(state["used"]), int(state["holding"])


AGENT_ACTS, REACTING, EXPERT_ACTS = 0, 1, 2  # StateIntervener's phases


class StateIntervener:
    """A stand-in for a person who watches the task, not the actions: the expert takes over when the task goes wrong
    and lets go when it is back on track (issue 46 item 4). ``distance(obs)`` is the task's distance to success (a
    goal task's ``||achieved_goal - desired_goal||``: :func:`goal_distance`; any other task: a registered function).

    At each step (``d`` the distance at this step's observation, compared with the previous step's of the episode):

    - the agent acts while the distance has not **risen at each of the last** ``rising_steps`` steps (strictly);
      when it has, and ``d >= on_track_distance``, the person has seen the task go wrong: after ``reaction_steps``
      more steps (the agent still acting; 0: this very step) the expert takes over, whatever happened meanwhile;
    - the expert acts until the task is back on track: the distance **fell at each of the last** ``recovered_steps``
      steps of the takeover, or ``d < on_track_distance``; at that step the agent acts again (a takeover therefore
      lasts at least one step, and at least ``recovered_steps`` steps unless the distance drops below
      ``on_track_distance``);
    - at most ``budget`` intervened steps in the run (0: no limit); a takeover stops when it is spent.

    An episode starts with the agent in control and no history. Phase, counters and the last distance are its
    state (checkpointed with the collector)."""

    def __init__(self, expert: Callable, distance: Callable, rising_steps: int = 3, recovered_steps: int = 3,
                 reaction_steps: int = 0, on_track_distance: float = 0.0, budget: int = 0):
        if int(rising_steps) < 1 or int(recovered_steps) < 1 or int(reaction_steps) < 0 or int(budget) < 0:
            raise ValueError(f"intervention: need rising_steps >= 1, recovered_steps >= 1, reaction_steps >= 0 and "
                             f"budget >= 0, got {rising_steps!r}, {recovered_steps!r}, {reaction_steps!r}, {budget!r}")
        if not (isinstance(on_track_distance, int | float) and np.isfinite(on_track_distance)
                and on_track_distance >= 0):
            raise ValueError(f"intervention.on_track_distance must be a finite number >= 0, got {on_track_distance!r}")
        self.expert, self.distance = expert, distance
        self.rising_steps, self.recovered_steps = int(rising_steps), int(recovered_steps)
        self.reaction_steps, self.on_track_distance = int(reaction_steps), float(on_track_distance)
        self.budget = int(budget)
        self.used = 0  # intervened steps so far (all episodes)
        self.phase, self.countdown = AGENT_ACTS, 0  # (who acts; steps left of the reaction)
        self.last: float | None = None  # the previous step's distance (None: the episode's first step)
        self.rising = self.falling = 0  # steps in a row the distance rose / fell

    def __call__(self, obs, proposed: np.ndarray) -> tuple[bool, np.ndarray]:
        d = float(self.distance(obs))
        if not np.isfinite(d):
            raise ValueError(f"intervention.distance returned {d!r}; a distance must be a finite number")
        if self.last is not None:
            self.rising = self.rising + 1 if d > self.last else 0
            self.falling = self.falling + 1 if d < self.last else 0
        self.last = d
        if self.budget and self.used >= self.budget:
            self.phase = AGENT_ACTS
            return False, proposed
        if self.phase == EXPERT_ACTS and (self.falling >= self.recovered_steps or d < self.on_track_distance):
            self.phase = AGENT_ACTS  # back on track: the person lets go
            return False, proposed
        if self.phase == REACTING:
            self.countdown -= 1
            if self.countdown == 0:
                self._take_over()
        elif (self.phase == AGENT_ACTS and self.rising >= self.rising_steps
              and d >= self.on_track_distance):  # going wrong: the person reacts
            self.phase, self.countdown = REACTING, self.reaction_steps
            if self.countdown == 0:
                self._take_over()
        if self.phase != EXPERT_ACTS:
            return False, proposed
        self.used += 1
        return True, np.asarray(self.expert(obs), dtype=np.asarray(proposed).dtype).reshape(np.shape(proposed))

    def _take_over(self) -> None:
        self.phase, self.falling = EXPERT_ACTS, 0  # (the fall that ends a takeover is counted within it)

    def on_episode_start(self) -> None:
        self.phase, self.countdown, self.last, self.rising, self.falling = AGENT_ACTS, 0, None, 0, 0

    def state_dict(self) -> dict:
        return {"used": self.used, "phase": self.phase, "countdown": self.countdown, "last": self.last,
                "rising": self.rising, "falling": self.falling}

    def load_state_dict(self, state: dict) -> None:
        self.used, self.phase, self.countdown = int(state["used"]), int(state["phase"]), int(state["countdown"])
        self.last = None if state["last"] is None else float(state["last"])
        self.rising, self.falling = int(state["rising"]), int(state["falling"])


@dataclass(frozen=True)
class DeviceState:
    """One read of an input device: whether the person holds the takeover button, and the action they command."""

    engaged: bool
    action: np.ndarray


class DeviceReader(Protocol):
    def read(self) -> DeviceState: ...


class DeviceIntervener:
    """A person at a keyboard or gamepad: while they hold the takeover button (``DeviceState.engaged``), their
    action, clipped to ``[low, high]``, is executed. The device is read once per env step."""

    def __init__(self, reader: DeviceReader, low, high):
        self.reader = reader
        self.low, self.high = np.asarray(low), np.asarray(high)

    def __call__(self, obs, proposed: np.ndarray) -> tuple[bool, np.ndarray]:
        state = self.reader.read()
        if not state.engaged:
            return False, proposed
        action = np.asarray(state.action, dtype=np.asarray(proposed).dtype).reshape(np.shape(proposed))
        if not np.isfinite(action).all():
            raise ValueError(f"the input device sent a non-finite action {action.tolist()}")
        return True, np.clip(action, self.low, self.high).astype(action.dtype)

    def on_episode_start(self) -> None:
        pass

    def state_dict(self) -> dict:  # (a person is not replayed: nothing to restore)
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class GamepadReader:
    """A gamepad through pygame (an optional dependency, imported here only): action dimension i is the pad's axis i
    (pygame's numbering) for the first ``action_dim`` axes, clipped to the action box (a dimension beyond the pad's
    axes is 0); button ``button`` engages the takeover."""

    def __init__(self, action_dim: int, button: int = 0, joystick: int = 0):
        import pygame  # (optional, heavy: only a run with a gamepad imports it)

        pygame.init()
        pygame.joystick.init()
        if pygame.joystick.get_count() <= joystick:
            raise OSError(f"no gamepad {joystick} found (pygame sees {pygame.joystick.get_count()})")
        self.pygame, self.pad = pygame, pygame.joystick.Joystick(joystick)
        self.action_dim, self.button = int(action_dim), int(button)

    def read(self) -> DeviceState:
        self.pygame.event.pump()
        axes = [self.pad.get_axis(i) for i in range(min(self.action_dim, self.pad.get_numaxes()))]
        action = np.zeros(self.action_dim, np.float32)
        action[: len(axes)] = axes
        return DeviceState(bool(self.pad.get_button(self.button)), action)


# -- experts by name (intervention.expert) ---------------------------------------------------------------------------
EXPERTS: dict[str, Callable] = {}


def register_expert(name: str):
    """``factory(spec, env) -> policy(obs) -> action`` registered as ``intervention.expert = name``."""
    def deco(factory):
        EXPERTS[name] = factory
        return factory
    return deco


@register_expert("zero")
def _zero_expert(spec, env):
    """All-zero actions (a stand-in that takes over whenever the agent's action is large: tests)."""
    shape = tuple(spec.action_shape)
    return lambda obs: np.zeros(shape, np.float32)


@register_expert("reach_goal")
def _reach_goal_expert(spec, env, gain: float = 10.0):
    """Gymnasium-Robotics FetchReach (relive flattens its dict observation as ``achieved_goal`` (the gripper's
    position), ``desired_goal``, ``observation``): move the gripper toward the goal, a P-controller."""
    def act(obs):
        obs = np.asarray(obs, np.float64).reshape(-1)
        grip, goal = obs[:3], obs[3:6]
        out = np.zeros(tuple(spec.action_shape), np.float32)
        out[:3] = np.clip(gain * (goal - grip), -1, 1)
        return out
    return act


# -- the task's distance to success by name (intervention.distance; the state intervener) ---------------------------
DISTANCES: dict[str, Callable] = {}


def register_distance(name: str):
    """``factory(spec, env) -> distance(obs) -> float`` registered as ``intervention.distance = name``: the task's
    distance to success (lower is better; the :class:`StateIntervener` watches it rise and fall). ``obs`` is one env's
    observation as the collector sees it. A user's function is code: it comes in with the module that registers it
    (``relive --plugin FILE``), never from a config file, which only names it."""
    def deco(factory):
        if not name.isidentifier():
            raise ValueError(f"distance name must be an identifier, got {name!r}")
        DISTANCES[name] = factory
        return factory
    return deco


@register_distance("goal")
def goal_distance(spec, env) -> Callable:
    """A goal task's (Gymnasium-Robotics: dict observations with ``achieved_goal`` / ``desired_goal``)
    ``||achieved_goal - desired_goal||_2``: from the dict, or from the flat vector relive makes of it
    (``gymnasium.wrappers.FlattenObservation``, unflattened with the wrapped env's Dict space)."""
    space = _goal_dict_space(env)
    if space is None:
        raise ValueError(f"intervention.distance = 'goal' needs a goal task (dict observations with "
                         f"{GOAL_KEYS}); {spec.id} has {getattr(env, 'observation_space', None)}. Register a distance "
                         "of your own (relive.train.intervention.register_distance, loaded with relive --plugin FILE) "
                         "and name it: --set intervention.distance=NAME")

    def distance(obs) -> float:
        if not isinstance(obs, dict):
            obs = gym.spaces.unflatten(space, np.asarray(obs))
        return float(np.linalg.norm(np.asarray(obs["achieved_goal"], np.float64)
                                    - np.asarray(obs["desired_goal"], np.float64)))
    return distance


def _goal_dict_space(env):
    """The goal Dict space of the observations the collector sees: the env's own, or the one a FlattenObservation
    wrapper flattens; None when neither is a goal dict."""
    while env is not None:
        if has_goal_keys(env.observation_space):
            return env.observation_space
        if isinstance(env, gym.wrappers.FlattenObservation):
            inner = env.env.observation_space
            return inner if has_goal_keys(inner) else None
        env = getattr(env, "env", None)
    return None


def expert_dataset(env_id: str, expert: str, num_episodes: int, path, seed: int = 0,
                   max_episode_steps: int | None = None):
    """A few demonstrations: ``num_episodes`` whole episodes of a registered expert on ``env_id``, saved as a relive
    ``.npz`` dataset at ``path`` (the "few demos" a HIL-RLPD run starts from); returns the path."""
    if expert not in EXPERTS:
        raise ValueError(f"expert {expert!r} is not registered; known: {sorted(EXPERTS)}")
    env = make_env(env_id, max_episode_steps)
    spec = env_spec(env)
    policy = EXPERTS[expert](spec, env)
    collector = Collector(env, spec, seed)
    parts = []
    while len(collector.finished_returns) < num_episodes:
        parts.append(collector.step(lambda obs: np.asarray(policy(obs[0]))[None], 1))
    env.close()
    rows = {k: (np.concatenate([p[k] for p in parts]) if not isinstance(parts[0][k], dict)
                else {kk: np.concatenate([p[k][kk] for p in parts]) for kk in parts[0][k]}) for k in parts[0]}
    return save_dataset(path, rows)


def build_intervener(cfg, spec, env, run_dir=None) -> Intervener | None:
    """The run's intervener: ``intervention.kind`` built from the registry (None for ``none``)."""
    return intervener_entry(cfg.intervention.kind).build(InterventionBuild(cfg, spec, env, run_dir))


def renders(cfg) -> str | None:
    """The ``render_mode`` of the env the collector steps: ``"rgb_array"`` when the run's intervener shows frames
    (registered with ``renders=True``: the console), else None."""
    return "rgb_array" if intervener_entry(cfg.intervention.kind).renders else None


@register_intervener("scripted")
def _scripted(ctx: InterventionBuild) -> ScriptedIntervener:
    """An expert policy takes over when the agent deviates (intervention.expert, threshold, hold_steps, budget)."""
    ic = ctx.config.intervention
    if ic.expert not in EXPERTS:
        raise ValueError(f"intervention.expert {ic.expert!r} is not registered; known: {sorted(EXPERTS)}")
    return ScriptedIntervener(EXPERTS[ic.expert](ctx.spec, ctx.env), ic.threshold, ic.budget, ic.hold_steps)


@register_intervener("state")
def _state(ctx: InterventionBuild) -> StateIntervener:
    """An expert takes over when the task goes wrong, after a reaction delay, until it is back on track (a person
    watching the task: intervention.expert, distance, rising_steps, reaction_steps, recovered_steps,
    on_track_distance, budget)."""
    ic = ctx.config.intervention
    if ic.expert not in EXPERTS:
        raise ValueError(f"intervention.expert {ic.expert!r} is not registered; known: {sorted(EXPERTS)}")
    if ic.distance not in DISTANCES:
        raise ValueError(f"intervention.distance {ic.distance!r} is not registered; known: {sorted(DISTANCES)} (a "
                         "function of your own: register it with relive.train.intervention.register_distance in a "
                         "file and load it with `relive --plugin FILE train ...`)")
    return StateIntervener(EXPERTS[ic.expert](ctx.spec, ctx.env), DISTANCES[ic.distance](ctx.spec, ctx.env),
                           ic.rising_steps, ic.recovered_steps, ic.reaction_steps, ic.on_track_distance, ic.budget)


def register_device(name: str, renders: bool = False):
    """Class decorator: a :class:`DeviceReader` class (``reader_cls(spec)``, ``read() -> DeviceState``) as
    ``intervention.kind = name``, read once per env step by a :class:`DeviceIntervener` that clips its action to the
    env's action box (docs/hil.md, "Your own device")."""
    def deco(reader_cls):
        def build(ctx: InterventionBuild) -> DeviceIntervener:
            return DeviceIntervener(reader_cls(ctx.spec), ctx.spec.action_low, ctx.spec.action_high)

        build.__module__, build.__qualname__ = reader_cls.__module__, reader_cls.__qualname__
        register_intervener(name, renders=renders, doc=inspect.getdoc(reader_cls) or f"device {name}")(build)
        return reader_cls
    return deco


@register_device("device")
class _Gamepad(GamepadReader):
    """A gamepad read through pygame: button 0 held takes over, axis i is action dimension i (GamepadReader)."""

    def __init__(self, spec):
        super().__init__(int(np.prod(spec.action_shape)))


class DemoWriter:
    """Intervened stretches into the buffer's demonstration segment (see the module docstring), with the counts the
    loop logs. One stream (one env): a stretch is written when it ends."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.pending: list[dict] = []  # rows of the stretch still going on

    @staticmethod
    def origin(rows: dict) -> np.ndarray:
        """Per row: its origin on the ring (intervention or agent)."""
        return np.where(np.asarray(rows["intervened"], bool), INTERVENTION, AGENT).astype(np.int8)

    def add(self, rows: dict) -> None:
        """A chunk of stored rows of the stream, in time order (the same rows the ring got)."""
        flag = np.asarray(rows["intervened"], bool)
        end = np.asarray(rows["terminated"], bool) | np.asarray(rows["truncated"], bool)
        for i in range(flag.size):
            if flag[i]:
                self.pending.append({k: _row(v, i) for k, v in rows.items()})
                if end[i]:
                    self.flush()
            elif self.pending:
                self.flush()

    def flush(self) -> None:
        """Write the stretch so far (its last row truncated unless it terminated)."""
        if not self.pending:
            return
        rows = {k: _stack([r[k] for r in self.pending]) for k in self.pending[0]}
        rows["truncated"][-1] = not rows["terminated"][-1]
        self.pending = []
        self.buffer.add_demonstrations(rows)


def _row(v, i):
    return {k: np.asarray(a[i]) for k, a in v.items()} if isinstance(v, dict) else np.asarray(v[i])


def _stack(parts):
    if isinstance(parts[0], dict):
        return {k: np.stack([p[k] for p in parts]) for k in parts[0]}
    return np.stack(parts)
