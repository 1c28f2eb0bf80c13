"""The sampler interface every replay strategy implements.

A sampler decides *which* stored rows a batch holds. It is bound to a :class:`~relive.replay.storage.Storage`
and optionally to one source (offline or online rows only, used inside :class:`MixtureSampler`). Its state
is plain arrays and numbers (``state_dict``), its randomness comes from the generator it is handed, and its
constructor arguments (``config``) are JSON, so checkpoints need no pickle.

Subclasses implement ``_draw`` and, when they use signals, ``update``; ``probabilities`` must return the
exact distribution that ``_draw`` samples from (the tests hold every sampler to it).

**Options are declared once**, as the sampler's ``Config``: a frozen dataclass whose fields are every setting with
its default and whose ``__post_init__`` validates them. ``Sampler(config)`` or ``Sampler(**settings)`` (or the
fields positionally, in order) builds ``self.options``; ``config()`` (the checkpoint's record) is that dataclass as
JSON; ``relive train`` offers the same fields as ``replay.<name>.*`` (``relive.registry.register_replay``). A setting
a run derives (PER's ``is_anneal_samples``: the run's gradient steps) defaults to None and is filled by ``from_run``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, ClassVar, Literal, NamedTuple, overload

import numpy as np

from relive.registry import SAMPLER_CLASSES, ReplayBuild, options_dict, register_sampler_class
from relive.replay.state_checks import MAX_COUNTER, state_array, state_field, state_float, state_int  # noqa: F401
from relive.replay.storage import StorageView
from relive.types import SOURCE_NAMES

#: largest priority base a sampler stores: |td_error| + eps and raw ``priority`` signals are clamped to it, so that
#: sums over any buffer of p^alpha (alpha <= MAX_EXPONENT) stay finite in float64 (documented in docs/guarantees.md)
MAX_PRIORITY = 1e20
#: ReaPER floors |td_error| + eps at this (a tiny eps cannot underflow d^alpha to 0): its total mass stays > 0
MIN_PRIORITY = 1e-20
#: largest priority / reliability exponent a sampler accepts (MAX_PRIORITY ** MAX_EXPONENT stays far from overflow)
MAX_EXPONENT = 4.0


@overload  # integer=True returns an int (counts: is_anneal_samples, refresh_every_grad_steps)
def check_number(owner: str, name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: Literal[True]) -> int: ...
@overload
def check_number(owner: str, name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: Literal[False] = False) -> float: ...
def check_number(owner: str, name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> float | int:
    """A hyper-parameter as float (or int with ``integer``): a real number (not a bool, not NaN / inf) within the
    bounds, else a ValueError naming ``owner``, ``name``, the value and the allowed range."""
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    allowed = f"{lo}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi}"
    kind = "an integer" if integer else "a finite number"
    ok = not isinstance(value, bool | np.bool_) and isinstance(value, int | float | np.integer | np.floating)
    if ok and integer and not isinstance(value, int | np.integer):
        ok = False
    if ok:
        v = float(value)
        ok = (math.isfinite(v) and (low is None or (v > low if low_open else v >= low))
              and (high is None or (v < high if high_open else v <= high)))
    if not ok:
        raise ValueError(f"{owner}: {name} must be {kind} in {allowed}, got {value!r}")
    return int(value) if integer else float(value)


class Draw(NamedTuple):
    indices: np.ndarray  # int64 slots
    probability: np.ndarray  # float64, per-draw probability of each row
    is_weight: np.ndarray  # float32 importance-sampling weights (ones when the sampler applies none)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """No settings."""


class Sampler:
    #: names of the per-sample signals this sampler consumes in ``update`` (e.g. ``("td_error",)``)
    signals: tuple[str, ...] = ()
    #: the sampler's settings: a frozen dataclass, every field with its default, validated in ``__post_init__``
    Config: ClassVar[type] = NoOptions
    #: whether ``relabel_batch`` rewrites the rows it is given (HER: new goals); ``sample_sequences`` refuses such a
    #: sampler (a slice would need one goal for all its steps)
    relabels: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A sampler built from its ``Config`` (``__init__(*args, **kwargs)``) shows the Config's fields as its
        signature: ``help(PrioritizedSampler)`` and ``inspect.signature`` list ``priority_exponent=0.6, ...``."""
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("Config")
        init = inspect.signature(cls.__init__).parameters.values()
        generic = all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name == "self" for p in init)
        if config is not None and dataclasses.is_dataclass(config) and generic:
            defaults = cls.Config()  # (every option has a default: a sampler builds with none)
            cls.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
                inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=getattr(defaults, f.name),
                                  annotation=f.type) for f in dataclasses.fields(config) if f.init])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self).Config
        given = len(args) == 1 and not kwargs and isinstance(args[0], cls)
        # (typed Any: each subclass's Config is its own dataclass; ``o = self.options`` reads its fields)
        self.options: Any = args[0] if given else cls(*args, **kwargs)
        # unbound until bind() (the buffer binds before any use); typed as bound so the samplers need no narrowing
        self.storage: StorageView = None  # type: ignore[assignment]
        self.source: int | None = None
        self._last_indices = np.zeros(0, np.int64)

    # -- wiring ----------------------------------------------------------------------------------------
    def bind(self, storage, source: int | None = None) -> None:
        """Attach to ``storage`` (read through a :class:`~relive.replay.storage.StorageView`: samplers never write
        rows); ``source`` restricts the sampler to offline (0) or online (1) rows."""
        self.storage = storage if isinstance(storage, StorageView) else StorageView(storage)
        self.source = source

    def bind_env(self, env) -> None:
        """The run's environment, for what a sampler reads from the task rather than from its rows (HER: the task's
        reward function). The trainer calls it for a new run and again on resume (functions are not in checkpoints);
        a wrapper passes it on to its inner sampler. Default: nothing."""

    def domain(self) -> tuple[int, int]:
        """The contiguous slot range this sampler draws from."""
        return self.storage.slot_range(self.source)

    def drawable(self, length: int) -> np.ndarray:
        """Per slot of ``[0, length)``: whether this sampler may draw it -- inside its source's slots, and holding a
        row (a demonstration segment's empty slots hold none). A loaded per-row state must be zero elsewhere."""
        mask = np.zeros(length, bool)
        lo, hi = self.domain()
        mask[lo:min(hi, length)] = True
        st = self.storage
        if st.has_gap:
            mask[st.num_offline : min(st.ring_base, length)] = False
        return mask

    def num_rows(self) -> int:
        """Rows this sampler draws from (all stored rows when unrestricted: a demonstration segment's empty slots,
        between the offline and the online rows, are not rows)."""
        if self.source is None:
            return self.storage.num_rows
        lo, hi = self.domain()
        return hi - lo

    def on_insert(self, slots: np.ndarray) -> None:
        """Rows were written into ``slots`` (new or overwritten), all within this sampler's domain."""

    def on_episodes_closed(self, ids: np.ndarray) -> None:
        """Open online episodes ``ids`` were ended where they stood (``ReplayBuffer.close_stream``): their last
        stored row is now their end. Samplers that keep per-episode state update it here."""

    def check_insert(self, source: int, rows) -> None:
        """Raise ValueError if rows about to be written with ``source`` are unusable to this sampler (called
        before anything is written, so a refused batch leaves the buffer unchanged)."""

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self, batch_size: int, rng: np.random.Generator) -> Draw:
        n = self.num_rows()
        if n == 0:
            raise ValueError(f"cannot sample: no {self._domain_name()} rows stored yet")
        draw = self._draw(int(batch_size), rng)
        self._last_indices = draw.indices  # the online share of the last batch is computed in stats()
        return draw

    def _draw(self, batch_size: int, rng: np.random.Generator) -> Draw:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_signals(self, slots: np.ndarray, signals: dict[str, np.ndarray]) -> None:
        """Raise ValueError, changing nothing, if ``update(slots, signals)`` could not use these signals (called
        by the buffer before any update, and by a mixture on both parts before updating either: updates are
        all-or-nothing). The buffer has checked shapes and finiteness; the base refuses a negative
        ``priority``; a sampler that needs a signal checks that it is there."""
        if "priority" in signals:
            p = np.asarray(signals["priority"])
            if p.size and (p < 0).any():
                i = int(np.flatnonzero(p.reshape(-1) < 0)[0])
                raise ValueError(f"signal 'priority' row {i}: value {p.reshape(-1)[i].item()!r} must be >= 0")

    def update(self, slots: np.ndarray, signals: dict[str, np.ndarray]) -> None:
        """Per-sample signals for rows that were sampled and are still stored (stale rows already removed)."""

    def hints(self) -> dict:
        """Per-batch values for the agent's update, carried on ``batch.info.hints`` (e.g. ReF-ER's ``c_max``
        and ``beta``). Called once per ``sample``, after the draw."""
        return {}

    def relabel_batch(self, batch, n_step: int, gamma: float):
        """The gathered batch of the latest draw, as the agent gets it (``ReplayBuffer.sample`` calls it on every
        sampler; ``n_step`` / ``gamma``: the buffer's returns). HER writes new goals and rewards into it (``relabels``).
        Default: the batch unchanged."""
        return batch

    def anneal_over_next(self, num_samples: int) -> None:
        """A schedule over sample calls that was not configured (PER's and ReaPER's IS exponent with
        ``is_anneal_samples=None``) reaches its final value after ``num_samples`` more calls; others: nothing. A loop
        that knows its length calls it (the SB3 adapter at each ``learn``; relive's trainer configures the length
        through ``from_run``)."""

    def refresh(self, score_fn, chunk_size: int = 65536) -> bool:
        """Whole-buffer recompute from an agent-supplied ``score_fn(obs, action)``. Returns whether the
        sampler uses it (uniform and PER do not)."""
        return False

    # -- diagnostics -----------------------------------------------------------------------------------
    def probabilities(self) -> np.ndarray:
        """Exact per-draw probability of every slot (length ``capacity``, zero outside the domain)."""
        raise NotImplementedError

    def stats(self) -> dict[str, float]:
        """``replay/...`` metrics. O(capacity): call at logging frequency, not every step."""
        p = self.probabilities()
        lo, hi = self.domain()
        stored = p[:hi]
        n = self.num_rows()
        ess = 1.0 / float(np.sum(stored * stored)) if n else 0.0
        positive = stored[stored > 0]
        online_lo = self.storage.num_offline
        return {
            "replay/size": float(n),
            "replay/online_fraction": self.last_online_fraction(),
            "replay/online_mass": float(stored[online_lo:].sum()) if n else 0.0,
            "replay/ess": ess,
            "replay/ess_fraction": ess / n if n else 0.0,
            "replay/max_min_ratio": float(positive.max() / positive.min()) if positive.size else 0.0,
        }

    def last_online_fraction(self) -> float:
        """Share of online rows in the most recent batch (nan before the first)."""
        idx = self._last_indices
        if idx.size == 0:
            return float("nan")
        return float(np.mean(idx >= self.storage.num_offline))

    # -- construction and checkpoint -------------------------------------------------------------------
    @classmethod
    def from_run(cls, options, ctx: ReplayBuild) -> Sampler:
        """The sampler a run builds from its options (``replay.<name>.*``); a sampler with run-derived settings
        (None in ``options``) fills them from ``ctx`` here."""
        return cls(options)

    def config(self) -> dict:
        """Constructor keyword arguments, JSON-serializable: the options."""
        return options_dict(self.options)

    @classmethod
    def from_config(cls, cfg: dict) -> Sampler:
        return cls(**cfg)

    def state_dict(self) -> dict:
        return {"last_indices": self._last_indices.copy()}

    def load_state_dict(self, state: dict) -> None:
        """Subclasses call this first, then read their own fields with :func:`state_array` / :func:`state_int` /
        :func:`state_float`: a checkpoint's state obeys the same rules as the values it came from."""
        if not isinstance(state, dict):
            raise ValueError(f"{self._owner()} is not a mapping")
        self._last_indices = (state_array(state, "last_indices", self._owner(), dtype=np.int64, low=0,
                                          high=max(self.storage.size - 1, 0))
                              if "last_indices" in state else np.zeros(0, np.int64))

    def _owner(self) -> str:
        where = "" if self.source is None else f" ({SOURCE_NAMES[self.source]} part)"
        return f"sampler state of {type(self).__name__}{where}"

    def _domain_name(self) -> str:
        return SOURCE_NAMES[self.source] if self.source is not None else ""


# -- samplers by class name, for checkpoints: the registry's table (register_replay fills it) ----------------------
SAMPLERS: dict[str, type[Sampler]] = SAMPLER_CLASSES  # (the registry types it as dict[str, type]: below replay)
#: a sampler class loadable from checkpoints by its class name, offered under no replay name
register_sampler = register_sampler_class


def sampler_config(sampler: Sampler) -> dict:
    """``checkpoint_name``: the class a sampler is saved as (a device sampler saves as its host twin, so its
    checkpoints load on either backend)."""
    return {"type": getattr(sampler, "checkpoint_name", type(sampler).__name__), "params": sampler.config()}


def sampler_from_config(cfg: dict) -> Sampler:
    try:
        cls = SAMPLERS[cfg["type"]]
    except KeyError:
        raise ValueError(f"unknown sampler type {cfg.get('type')!r}; known: {sorted(SAMPLERS)}") from None
    return cls.from_config(cfg["params"])
