"""Symmetric sampling over offline and online rows (RLPD, Ball et al. 2023 Sec. 3.1; PLD).

Every batch holds exactly ``round(B * f)`` offline rows and the rest online, each part drawn by its own sampler
restricted to its source (e.g. uniform offline, prioritized online). While one part is empty the whole batch comes
from the other.

The offline share f is ``offline_fraction``, or follows a schedule over t = online rows stored so far (env steps,
less unstored probing steps; read from the storage, so a resumed buffer continues the schedule exactly), from
f_0 = ``offline_fraction`` to f_1 = ``offline_fraction_final`` over T = ``schedule_steps``:

    constant  f(t) = f_0
    linear    f(t) = f_0 + min(t / T, 1) (f_1 - f_0)
    cosine    f(t) = f_1 + (f_0 - f_1) (1 + cos(pi min(t / T, 1))) / 2      (TorchRL's / LeRobot's anneal shapes)
    intervention_rate  f = f_1 + (f_0 - f_1) r, r = the share of intervened rows (``storage.meta["origin"]``) among
              the last T online rows stored: as many demonstrations as a person is needed (HIL; docs/hil.md)

With a demonstration segment (``ReplayBuffer(demo_capacity=...)``, HIL) each source can have its own part:
given ``demonstrations`` (a sampler) and ``demonstration_fraction`` s, the offline rows of a batch are split
again, ``round(k_off * s)`` from the demonstrations that joined during online training (slots
``[num_before_online, num_offline)``) and the rest from the dataset (``[0, num_before_online)``), so the shares
are dataset f (1 - s), demonstrations f s, agent 1 - f. A part with no rows gives its share to its sibling
(demonstrations <-> dataset), an empty offline side to the online part and vice versa.

Per-draw probability of a row of source s is
``f_s * p_s(row)`` where ``f_s`` is that part's share of the batch; ``is_weight`` is the part's own
(each child normalizes its weights within its part). Signals are routed to the part that owns the row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from relive.hooks import collect_hooks
from relive.registry import ReplayBuild, ReplaySpec, register_alias, register_replay, register_sampler_class
from relive.replay.samplers.base import Draw, Sampler, check_number, sampler_config, sampler_from_config, state_field
from relive.replay.samplers.uniform import UniformSampler
from relive.types import DATASET_ROWS, DEMONSTRATION_ROWS, INTERVENTION, OFFLINE, ONLINE

SCHEDULES = ("constant", "linear", "cosine", "intervention_rate")
INTERVENTION_WINDOW = 1000  # intervention_rate's default window of recent online rows


def scheduled_fraction(schedule: str, start: float, final: float, steps: int, t: int) -> float:
    """The offline share after ``t`` online rows (the module docstring's formulas)."""
    if schedule == "constant":
        return start
    x = min(t / steps, 1.0) if steps > 0 else float(t > 0)  # (no length: the end share from the first online row)
    if schedule == "linear":
        return start + x * (final - start)
    return final + (start - final) * (1.0 + math.cos(math.pi * x)) / 2.0


class MixtureSampler(Sampler):
    def __init__(self, offline: Sampler | None = None, online: Sampler | None = None,
                 offline_fraction: float = 0.5, schedule: str = "constant", offline_fraction_final: float | None = None,
                 schedule_steps: int = 0, demonstrations: Sampler | None = None,
                 demonstration_fraction: float | None = None):
        super().__init__()
        owner = type(self).__name__
        check_number(owner, "offline_fraction", offline_fraction, low=0, high=1)
        if schedule not in SCHEDULES:
            raise ValueError(f"{owner}: schedule must be one of {SCHEDULES}, got {schedule!r}")
        final = offline_fraction if offline_fraction_final is None else offline_fraction_final
        check_number(owner, "offline_fraction_final", final, low=0, high=1)
        self.schedule, self.offline_fraction_final = schedule, float(final)
        self.schedule_steps = check_number(owner, "schedule_steps", schedule_steps, low=0, integer=True)
        if offline is not None and offline is online:
            raise ValueError("MixtureSampler got the same sampler instance for both parts; give each part its own "
                             "(e.g. MixtureSampler(UniformSampler(), UniformSampler()))")
        self.offline = offline if offline is not None else UniformSampler()
        self.online = online if online is not None else UniformSampler()
        self.offline_fraction = float(offline_fraction)
        # per-source parts: the demonstrations (rows joined during online training) drawn apart from the dataset
        if demonstrations is not None and demonstration_fraction is None:
            raise ValueError(f"{owner}: a demonstrations part needs its demonstration_fraction (the share of a "
                             "batch's offline rows drawn from it)")
        self.demonstration_fraction = (0.0 if demonstration_fraction is None else  # (0: no demonstrations part)
                                       float(check_number(owner, "demonstration_fraction", demonstration_fraction,
                                                          low=0, high=1)))
        self.demonstrations = (None if demonstration_fraction is None else
                               demonstrations if demonstrations is not None else UniformSampler())
        if self.demonstrations is not None and (self.demonstrations is self.offline
                                                or self.demonstrations is self.online):
            raise ValueError(f"{owner} got the same sampler instance for two parts; give each part its own")

    def parts(self) -> list[tuple[str, Sampler]]:
        """(name, sampler) of every part: ``offline`` (the dataset alone when demonstrations have their own part),
        ``demonstrations`` when given, ``online``."""
        demos = [] if self.demonstrations is None else [("demonstrations", self.demonstrations)]
        return [("offline", self.offline), *demos, ("online", self.online)]

    def route(self, slots: np.ndarray) -> list[tuple[Sampler, np.ndarray]]:
        """Which part owns each of ``slots``: (part, mask) per part. By segment, not by ``origin``: a
        demonstration written before the first online row belongs to the dataset's range."""
        online = self.storage.source_of(slots) == ONLINE
        if self.demonstrations is None:
            return [(self.offline, ~online), (self.online, online)]
        demo = ~online & (slots >= self.storage.num_before_online)
        return [(self.offline, ~online & ~demo), (self.demonstrations, demo), (self.online, online)]

    @property
    def signals(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(dict.fromkeys(sum((part.signals for _, part in self.parts()), ())))

    def bind(self, storage, source=None) -> None:
        if source is not None:
            raise ValueError("a MixtureSampler spans both sources; it cannot be restricted to one")
        if any(part.storage is not None for _, part in self.parts()):
            raise ValueError("a part of this MixtureSampler is already bound to a buffer; give each buffer its own")
        super().bind(storage, None)
        if self.demonstrations is None:
            self.offline.bind(storage, OFFLINE)
        else:
            self.offline.bind(storage, DATASET_ROWS)
            self.demonstrations.bind(storage, DEMONSTRATION_ROWS)
        self.online.bind(storage, ONLINE)

    def on_insert(self, slots: np.ndarray) -> None:
        for part, mask in self.route(slots):
            if mask.all():
                part.on_insert(slots)
            elif mask.any():
                part.on_insert(slots[mask])

    def on_episodes_closed(self, ids: np.ndarray) -> None:
        self.online.on_episodes_closed(ids)

    def check_insert(self, source: int, rows) -> None:
        if source != OFFLINE:
            self.online.check_insert(source, rows)
            return
        self.offline.check_insert(source, rows)
        if self.demonstrations is not None:
            self.demonstrations.check_insert(source, rows)

    def split(self, batch_size: int) -> tuple[int, int]:
        """(offline, online) row counts of a batch, given what is stored (offline: dataset and demonstrations)."""
        counts = self.counts(batch_size)
        return batch_size - counts[-1], counts[-1]

    def counts(self, batch_size: int) -> tuple[int, ...]:
        """Rows of a batch per part, in the order of :meth:`parts`: ``k_off = round(B f)`` offline and the rest
        online, ``round(k_off s)`` of the offline ones from the demonstrations when they have their own part; an
        empty part's rows go to its sibling (:meth:`_fractions`)."""
        f, s = self._fractions()
        k_off = int(round(batch_size * f))
        if self.demonstrations is None:
            return k_off, batch_size - k_off
        k_demo = int(round(k_off * s))
        return k_off - k_demo, k_demo, batch_size - k_off

    def shares(self) -> tuple[float, ...]:
        """Each part's expected share of a batch (``counts`` before rounding), in the order of :meth:`parts`."""
        f, s = self._fractions()
        if self.demonstrations is None:
            return f, 1.0 - f
        return f * (1.0 - s), f * s, 1.0 - f

    def _fractions(self) -> tuple[float, float]:
        """(offline share f, demonstrations' share s of the offline rows) given what is stored: an empty side
        gives its share to the other (no online rows: f = 1; no offline rows: f = 0; no demonstrations: s = 0; no
        dataset rows: s = 1)."""
        n_on, n_data = self.online.num_rows(), self.offline.num_rows()
        n_demo = 0 if self.demonstrations is None else self.demonstrations.num_rows()
        f = 1.0 if n_on == 0 else 0.0 if n_data + n_demo == 0 else self.current_fraction()
        s = 0.0 if n_demo == 0 else 1.0 if n_data == 0 else self.demonstration_fraction
        return f, s

    def current_fraction(self) -> float:
        """The offline share of the next batch (``offline_fraction`` unless scheduled)."""
        if self.schedule == "constant":
            return self.offline_fraction
        if self.schedule == "intervention_rate":
            r = self.recent_intervention_rate()
            return self.offline_fraction_final + (self.offline_fraction - self.offline_fraction_final) * r
        return scheduled_fraction(self.schedule, self.offline_fraction, self.offline_fraction_final,
                                  self.schedule_steps, self.storage.num_online_written)

    def recent_intervention_rate(self) -> float:
        """Share of rows tagged ``INTERVENTION`` among the last ``schedule_steps`` (default 1,000) online rows
        stored, all streams (0 before any)."""
        st = self.storage
        written = st.num_online_written
        n = min(self.schedule_steps or INTERVENTION_WINDOW, st.num_online, written)
        if n == 0:
            return 0.0
        slots = st.ring_slot(np.arange(written - n, written, dtype=np.int64))
        return float(np.count_nonzero(st.meta["origin"].take(slots) == INTERVENTION)) / n

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:
        return self.joined_parts(batch_size, lambda child, k: child.sample(k, rng), np.concatenate)

    def joined_parts(self, batch_size: int, draw_part, concatenate):
        """The batch's parts, ``draw_part(child, k)`` each (a Draw, or the device sampler's DeviceDraw), every
        probability scaled by its part's share k / B, joined with ``concatenate``."""
        parts = []
        for (_, child), k in zip(self.parts(), self.counts(batch_size), strict=True):
            if k:
                d = draw_part(child, k)
                parts.append(type(d)(d.indices, d.probability * (k / batch_size), d.is_weight))
        if len(parts) == 1:
            return parts[0]
        return type(parts[0])(*(concatenate(x) for x in zip(*parts, strict=True)))

    def check_signals(self, slots: np.ndarray, signals: dict) -> None:
        """Every part validates its rows' signals before any changes (an update is all-or-nothing)."""
        self._checked_parts(slots, signals)

    def update(self, slots: np.ndarray, signals: dict) -> None:
        for child, part_slots, part_signals in self._checked_parts(slots, signals):
            child.update(part_slots, part_signals)

    def _checked_parts(self, slots: np.ndarray, signals: dict) -> list[tuple[Sampler, np.ndarray, dict]]:
        """(part, its slots, its signals) for every part that owns some of ``slots``, each checked by its part."""
        super().check_signals(slots, signals)
        parts = [(child, slots[mask], {k: np.asarray(v)[mask] for k, v in signals.items()})
                 for child, mask in self.route(slots) if mask.any()]
        for child, part_slots, part_signals in parts:
            child.check_signals(part_slots, part_signals)
        return parts

    def hints(self) -> dict:
        """The parts' hints; a name several publish is kept per part as ``offline/NAME``, ``online/NAME``, ..."""
        per_part = [(name, part.hints()) for name, part in self.parts()]
        seen = Counter(k for _, h in per_part for k in h)
        out = {}
        for name, h in per_part:
            out.update({(k if seen[k] == 1 else f"{name}/{k}"): v for k, v in h.items()})
        return out

    def loop_hooks(self, ctx) -> list:
        return collect_hooks(ctx, *(part for _, part in self.parts()))

    def anneal_over_next(self, num_samples: int) -> None:
        """Every part's schedule (each part draws at most once per batch)."""
        for _, part in self.parts():
            part.anneal_over_next(num_samples)

    def refresh(self, score_fn, chunk_size: int = 65536) -> bool:
        used = [part.refresh(score_fn, chunk_size) for _, part in self.parts()]
        return any(used)

    def probabilities(self, batch_size: int | None = None) -> np.ndarray:
        """Per-draw probability of each slot: each part's own probabilities times its share (:meth:`shares`), or,
        given ``batch_size``, its exact share of a batch of that size (:meth:`counts` / B)."""
        shares = self.shares() if batch_size is None else [k / batch_size for k in self.counts(batch_size)]
        out = np.zeros(self.storage.capacity)
        for (_, part), share in zip(self.parts(), shares, strict=True):
            if share > 0:
                out += share * part.probabilities()
        return out

    def stats(self) -> dict[str, float]:
        out = super().stats() | {"replay/offline_fraction": self.current_fraction()}
        if self.demonstrations is not None:
            out["replay/demonstration_fraction"] = self.shares()[1]
        for name, child in self.parts():
            if child.num_rows():
                out.update({k.replace("replay/", f"replay/{name}/"): v for k, v in child.stats().items()
                            if k not in ("replay/online_fraction", "replay/online_mass")})
        return out

    def config(self) -> dict:
        scheduled = {} if self.schedule == "constant" else {  # (a constant share: the record as before schedules)
            "schedule": self.schedule, "offline_fraction_final": self.offline_fraction_final,
            "schedule_steps": self.schedule_steps}
        demos = {} if self.demonstrations is None else {  # (no per-source parts: the record as before them)
            "demonstrations": sampler_config(self.demonstrations),
            "demonstration_fraction": self.demonstration_fraction}
        return {"offline": sampler_config(self.offline), "online": sampler_config(self.online),
                "offline_fraction": self.offline_fraction} | scheduled | demos

    @classmethod
    def from_config(cls, cfg: dict) -> MixtureSampler:
        demos = cfg.get("demonstrations")
        return cls(sampler_from_config(cfg["offline"]), sampler_from_config(cfg["online"]),
                   cfg["offline_fraction"], cfg.get("schedule", "constant"), cfg.get("offline_fraction_final"),
                   cfg.get("schedule_steps", 0), None if demos is None else sampler_from_config(demos),
                   cfg.get("demonstration_fraction"))

    def state_dict(self) -> dict:
        return super().state_dict() | {name: part.state_dict() for name, part in self.parts()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for name, part in self.parts():
            part.load_state_dict(state_field(state, name, self._owner()))


def _part(name: str) -> Callable[[], ReplaySpec]:
    return lambda: ReplaySpec(name)


@dataclass(frozen=True)
class MixtureConfig:
    """An exact offline / online split of every batch, each part drawn by its own replay strategy."""

    optional_parts: ClassVar[tuple[str, ...]] = ("demonstrations",)  # named in a run's label only when changed

    offline_fraction: float = 0.5  # offline share of every batch (RLPD, PLD: 0.5); a schedule's start
    # the share's course over online env steps: "constant", "linear" or "cosine" from offline_fraction to
    # offline_fraction_final over schedule_env_steps, or "intervention_rate": offline_fraction when every recent row
    # was intervened, offline_fraction_final when none was (relive.replay.samplers.mixture)
    schedule: str = "constant"
    offline_fraction_final: float | None = None  # a schedule's end (null: offline_fraction, i.e. constant)
    # a schedule's length in online env steps (null: the whole online phase); intervention_rate: the window of
    # recent online rows (null: 1,000)
    schedule_env_steps: int | None = None
    offline: ReplaySpec = field(default_factory=_part("uniform"))  # the offline part's strategy and its options
    online: ReplaySpec = field(default_factory=_part("uniform"))  # the online part's strategy and its options
    # per-source parts (a demonstration segment, HIL): the share of a batch's offline rows drawn from the
    # demonstrations that joined during online training, the rest from the dataset (null: one offline part for both)
    demonstration_fraction: float | None = None
    # the demonstrations' part when demonstration_fraction is set (the offline part then draws the dataset alone)
    demonstrations: ReplaySpec = field(default_factory=_part("uniform"))

    def __post_init__(self):
        check_number(type(self).__name__, "offline_fraction", self.offline_fraction, low=0.0, high=1.0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.offline_fraction_final is not None:
            check_number(type(self).__name__, "offline_fraction_final", self.offline_fraction_final, low=0.0,
                         high=1.0)
        if self.schedule_env_steps is not None:
            check_number(type(self).__name__, "schedule_env_steps", self.schedule_env_steps, low=1, integer=True)
        if self.demonstration_fraction is not None:
            check_number(type(self).__name__, "demonstration_fraction", self.demonstration_fraction, low=0.0,
                         high=1.0)
        for name in ("offline", "online", "demonstrations"):
            if not isinstance(getattr(self, name), ReplaySpec):
                raise ValueError(f"{type(self).__name__}.{name} must be a ReplaySpec (a replay name and its options), "
                                 f"got {getattr(self, name)!r}")


@register_replay("mixture", MixtureConfig)
def build_mixture(options: MixtureConfig, ctx: ReplayBuild) -> MixtureSampler:
    """exact offline/online split per batch, each part its own strategy (RLPD's symmetric sampling: uniform parts)"""
    steps = options.schedule_env_steps if options.schedule_env_steps is not None else (
        INTERVENTION_WINDOW if options.schedule == "intervention_rate" else ctx.online_env_steps)
    return MixtureSampler(options.offline.build(ctx), options.online.build(ctx),
                          offline_fraction=options.offline_fraction, schedule=options.schedule,
                          offline_fraction_final=options.offline_fraction_final, schedule_steps=steps,
                          demonstrations=(None if options.demonstration_fraction is None
                                          else options.demonstrations.build(ctx)),
                          demonstration_fraction=options.demonstration_fraction)


register_sampler_class(MixtureSampler)
register_alias("symmetric", "mixture",
               doc="exact offline/online split per batch, uniform within each part (RLPD)")
register_alias("symmetric_per", "mixture", sets=("online.name=per",),
               keys={"offline_fraction": "offline_fraction", "*": "online.per."},
               doc="symmetric split, uniform offline, PER online")
