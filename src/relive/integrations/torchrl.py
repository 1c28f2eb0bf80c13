"""relive's replay buffer behind TorchRL's interface (tested with torchrl 0.14.1 and tensordict 0.14.3, the
``torchrl`` extra's pins).

    from relive.integrations.torchrl import ReliveTensorDictReplayBuffer
    from relive.replay import PrioritizedSampler

    rb = ReliveTensorDictReplayBuffer(100_000, sampler=PrioritizedSampler(), batch_size=256)
    for data in collector:                    # TorchRL's collectors: a TensorDict of transitions per batch
        rb.extend(data.reshape(-1))
        sample = rb.sample()                  # TensorDict [256]: transitions + "index" + "priority_weight"
        loss = loss_module(sample)            # TorchRL's losses weight by "priority_weight", write "td_error"
        ...
        rb.update_tensordict_priority(sample) # (or rb.update_priority(sample["index"], sample["td_error"]))

What is stored: the transition keys TorchRL's losses read -- ``observation``, ``action``, ``("next", "observation")``,
``("next", "reward")``, ``("next", "terminated")``, ``("next", "truncated")`` (names configurable; ``done`` is
rebuilt as terminated | truncated). Other keys are not kept. A batch of ``[N]`` transitions is one stream in time
order; ``[E, T]`` (E envs of a parallel env, T steps each) goes in as E streams, so episodes stay whole.

A sample carries ``index`` (relive's slots), ``priority_weight`` (the IS weights; the key TorchRL 0.14's losses
read), ``_weight`` (the same, TorchRL's older name) and ``_generation`` (the slots' write stamps:
``update_tensordict_priority`` skips rows overwritten since they were sampled). ``update_priority(index,
priority)`` follows TorchRL's meaning: ``priority`` is the raw priority (PER stores priority^alpha); a sampler that
reads TD errors instead (ReaPER) gets it as ``td_error``.

Frame stacks (TorchRL's ``CatFrames`` transform on the env): ``frame_stack=`` the env's ``CatFrames`` (its ``N``,
``dim`` and padding: ``"same"`` pads with the episode's first frame, ``"constant"`` with zeros) or a relive
:class:`~relive.replay.storage.FrameStack` stores each frame once (:mod:`relive.replay.storage.frame_stack`) where
TorchRL's storages keep every stacked ``observation`` and ``("next", "observation")``; samples hold the same stacks,
and every stack extended is checked against its episode's earlier frames.

``state_dict()`` is plain tensors, numbers and strings (``torch.save`` / ``torch.load(weights_only=True)`` work);
``dumps(path)`` / ``loads(path)`` write and read relive's checkpoint directory (no pickle at all).
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Mapping

import numpy as np
import tensordict
import torch
import torchrl
from tensordict import TensorDict, TensorDictBase
from torchrl.envs.transforms import CatFrames

from relive.replay import MixtureSampler, ReplayBuffer, Sampler, UniformSampler
from relive.replay.storage import FrameStack, convert
from relive.replay.storage.frame_stack import as_frame_stack
from relive.types import Batch, SampleInfo, UpdateReport

TESTED = {"torchrl": "0.14.1", "tensordict": "0.14.3"}  # pyproject: extra "torchrl"
VERSIONS = {"torchrl": torchrl.__version__, "tensordict": tensordict.__version__}
if VERSIONS != TESTED:  # the keys and calls below follow these versions' interfaces
    warnings.warn(f"relive.integrations.torchrl is tested with {TESTED}, found {VERSIONS}", stacklevel=2)
DRAWS_KEPT = 16  # the latest draws whose generations update_priority(index, ...) can look up by their indices
ROWS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _flag(value, n: int, key: str) -> np.ndarray:
    """A ``("next", key)`` entry as [n] booleans: bool, or numbers 0 / 1 (a ``done`` of 2 is refused, naming the row,
    as relive's ``extend`` refuses it; never cast to True)."""
    arr = _numpy(value).reshape(n)
    if arr.dtype == np.bool_:
        return arr
    return convert(key, arr, np.dtype(np.bool_), f"extend: ('next', {key!r})")


def _to_tensors(state):
    """relive's state (NumPy arrays, numbers, strings, nested dicts / lists) with every array a tensor."""
    if isinstance(state, Mapping):
        return {k: _to_tensors(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_to_tensors(v) for v in state)
    if isinstance(state, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(state))
    if isinstance(state, np.generic):
        return state.item()
    return state


def _to_numpy(state):
    if isinstance(state, Mapping):
        return {k: _to_numpy(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_to_numpy(v) for v in state)
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().numpy()
    return state


def catframes_frame_stack(transform, observation_key="observation") -> FrameStack:
    """relive's :class:`~relive.replay.storage.FrameStack` for observations stacked by TorchRL's ``CatFrames``
    transform: ``N`` frames concatenated along ``dim`` (negative: counted from the observation's last axis), padded
    with the episode's first frame (``padding="same"``) or zeros (``"constant"`` with ``padding_value=0``)."""
    if not isinstance(transform, CatFrames):
        raise ValueError(f"expected TorchRL's CatFrames transform, got {type(transform).__name__}")
    in_keys = [k if isinstance(k, str) else tuple(k) for k in transform.in_keys]
    key = observation_key if isinstance(observation_key, str) else tuple(observation_key)
    if key not in in_keys:
        raise ValueError(f"frame_stack: the CatFrames transform stacks {in_keys}, not the observation key {key!r}")
    if transform.padding == "constant" and float(transform.padding_value) != 0.0:
        raise ValueError(f"frame_stack: CatFrames pads with {transform.padding_value}; relive pads with the episode's "
                         "first frame (padding='same') or zeros (padding='constant', padding_value=0)")
    return FrameStack(int(transform.N), int(transform.dim), "reset" if transform.padding == "same" else "zero")


def _stored_frame_stack(relive: ReplayBuffer):
    """The frame stack a relive buffer's storage rebuilds (None: full observations)."""
    option = getattr(relive.storage, "frame_stack_option", None)
    return option() if option is not None else None


def _frame_stack_option(frame_stack, observation_key) -> FrameStack | None:
    if frame_stack is None or isinstance(frame_stack, FrameStack):
        return frame_stack
    if isinstance(frame_stack, int | np.integer) and not isinstance(frame_stack, bool | np.bool_):
        return as_frame_stack(frame_stack)
    return catframes_frame_stack(frame_stack, observation_key)


class ReliveTensorDictReplayBuffer:
    """TorchRL's replay-buffer calls on a relive :class:`~relive.replay.ReplayBuffer` (``self.relive``).

    ``capacity``: online rows (the ring); ``offline`` rows (a TensorDict of transitions or a mapping of relive
    columns ``obs, action, reward, next_obs, terminated, truncated``) come on top, never evicted, and each batch
    holds exactly ``round(B * offline_fraction)`` of them (a ``MixtureSampler`` whose online part is ``sampler``,
    unless ``sampler`` is a ``MixtureSampler`` already). ``seed``: the buffer's own generator. ``device``: where
    sampled tensors go. The columns are created from the first ``extend`` (or the offline rows), like TorchRL's
    lazy storages. ``frame_stack``: the observation is a stack of frames made by the env's ``CatFrames`` (give the
    transform; or a :class:`~relive.replay.storage.FrameStack`; an int k is ``FrameStack(k)``: ``CatFrames(k,
    dim=-ndim)`` with ``padding="same"``), stored a frame a row."""

    def __init__(self, capacity: int, *, sampler: Sampler | None = None, batch_size: int | None = None,
                 seed: int = 0, offline=None, offline_fraction: float = 0.5, device="cpu",
                 observation_key="observation", action_key="action", reward_key="reward",
                 terminated_key="terminated", truncated_key="truncated", done_key="done",
                 priority_key="td_error", frame_stack=None):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer number of rows, got {capacity!r}")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise ValueError(f"sampler must be a relive Sampler (relive.replay), got {type(sampler).__name__}")
        self.capacity, self.batch_size, self.seed, self.device = capacity, batch_size, int(seed), torch.device(device)
        self.keys = dict(observation=observation_key, action=action_key, reward=reward_key,
                         terminated=terminated_key, truncated=truncated_key, done=done_key, priority=priority_key)
        self.frame_stack = _frame_stack_option(frame_stack, observation_key)
        rows = None
        if offline is not None:
            rows = self._rows(offline) if isinstance(offline, TensorDictBase) else self._offline_mapping(offline)
            if not isinstance(sampler, MixtureSampler):
                sampler = MixtureSampler(offline=UniformSampler(), online=sampler, offline_fraction=offline_fraction)
        self._sampler = sampler
        self._relive: ReplayBuffer | None = None
        self._draws: deque = deque(maxlen=DRAWS_KEPT)
        if rows is not None:
            self._create(rows, num_offline=len(rows["reward"]))
            self.relive.add_offline(rows)

    @staticmethod
    def _offline_mapping(rows: Mapping) -> dict:
        missing = [c for c in ROWS if c not in rows]
        if missing:
            raise ValueError(f"offline rows: missing column(s) {missing}; expected {list(ROWS)} (or a TensorDict)")
        return {c: _numpy(rows[c]) for c in ROWS}

    @property
    def relive(self) -> ReplayBuffer:
        if self._relive is None:
            raise ValueError("the buffer is empty: extend it first (its columns are made from the first batch)")
        return self._relive

    @classmethod
    def from_relive(cls, relive: ReplayBuffer, **kwargs) -> ReliveTensorDictReplayBuffer:
        """Wrap an existing relive buffer (e.g. ``ReplayBuffer.load(path)``); ``kwargs`` as the constructor's."""
        rb = cls(max(relive.storage.online_capacity, 1), **kwargs)
        rb._relive, rb._sampler = relive, relive.sampler
        rb.frame_stack = _stored_frame_stack(relive)
        return rb

    def _create(self, rows: dict, num_offline: int = 0) -> None:
        self._relive = ReplayBuffer(self.capacity + num_offline, rows["obs"].shape[1:], rows["action"].shape[1:],
                                    sampler=self._sampler, seed=self.seed, obs_dtype=rows["obs"].dtype,
                                    action_dtype=rows["action"].dtype, frame_stack=self.frame_stack)

    # -- writing ---------------------------------------------------------------------------------------
    def _rows(self, td: TensorDictBase) -> dict:
        """relive's columns of a TensorDict of transitions with batch shape [N]."""
        k = self.keys

        def need(key):
            value = td.get(key, None)
            if value is None:
                raise ValueError(f"extend: the TensorDict lacks the key {key!r} (transitions need "
                                 f"{k['observation']!r}, {k['action']!r} and ('next', {k['observation']!r} / "
                                 f"{k['reward']!r} / {k['terminated']!r} or {k['done']!r}))")
            return value

        obs, action = need(k["observation"]), need(k["action"])
        next_obs, reward = need(("next", k["observation"])), need(("next", k["reward"]))
        terminated = td.get(("next", k["terminated"]), None)
        truncated = td.get(("next", k["truncated"]), None)
        done = td.get(("next", k["done"]), None)
        n = td.batch_size[0]
        if terminated is None and done is None:
            raise ValueError(f"extend: the TensorDict has neither ('next', {k['terminated']!r}) nor "
                             f"('next', {k['done']!r})")
        term = _flag(terminated, n, k["terminated"]) if terminated is not None else _flag(done, n, k["done"])
        if truncated is not None:
            trunc = _flag(truncated, n, k["truncated"])
        elif done is not None:  # done without a truncated key: what is done but not terminated was truncated
            trunc = _flag(done, n, k["done"]) & ~term
        else:
            trunc = np.zeros(n, bool)
        return {"obs": _numpy(obs), "action": _numpy(action), "reward": _numpy(reward).reshape(n).astype(np.float32),
                "next_obs": _numpy(next_obs), "terminated": term, "truncated": trunc}

    def extend(self, data: TensorDictBase) -> torch.Tensor:
        """Add transitions: batch shape [N] (one stream, time order) or [E, T] (E streams). Returns the slots."""
        if not isinstance(data, TensorDictBase):
            raise ValueError(f"extend takes a TensorDict of transitions, got {type(data).__name__}")
        if data.batch_dims == 1:
            parts = [data]
        elif data.batch_dims == 2:
            parts = list(data.unbind(0))
        else:
            raise ValueError(f"extend: batch shape {tuple(data.batch_size)}: give [N] transitions or [envs, steps]")
        slots = []
        for stream, part in enumerate(parts):
            rows = self._rows(part)
            if self._relive is None:
                self._create(rows)
            slots.append(self.relive.extend(rows, stream=stream))
        return torch.as_tensor(np.concatenate(slots))

    def add(self, data: TensorDictBase) -> int:
        """One transition (batch shape [])."""
        return int(self.extend(data.unsqueeze(0))[0])

    def __len__(self) -> int:
        return 0 if self._relive is None else len(self._relive)

    # -- sampling --------------------------------------------------------------------------------------
    def sample(self, batch_size: int | None = None, return_info: bool = False):
        """A TensorDict [B] of transitions with ``index``, ``priority_weight`` / ``_weight`` and ``_generation``."""
        batch_size = batch_size if batch_size is not None else self.batch_size
        if batch_size is None:
            raise ValueError("sample: give batch_size here or to the constructor")
        batch = self.relive.sample(batch_size)
        self._draws.append((batch.info.indices, batch.info.generation))
        td = self.to_tensordict(batch)
        if return_info:
            return td, {"index": td["index"], "priority_weight": td["priority_weight"]}
        return td

    def to_tensordict(self, batch: Batch) -> TensorDict:
        k, dev, b = self.keys, self.device, len(batch)

        def t(x):
            return torch.as_tensor(x, device=dev)

        term = t(batch.terminated).reshape(b, 1)
        trunc = t(batch.truncated).reshape(b, 1)
        weight = t(np.asarray(batch.info.is_weight, dtype=np.float32))
        nxt = TensorDict({k["observation"]: t(batch.next_obs), k["reward"]: t(batch.reward).reshape(b, 1),
                          k["terminated"]: term, k["truncated"]: trunc, k["done"]: term | trunc}, batch_size=[b],
                         device=dev)
        return TensorDict({k["observation"]: t(batch.obs), k["action"]: t(batch.action), "next": nxt,
                           "index": t(batch.info.indices), "priority_weight": weight, "_weight": weight,
                           "_generation": t(batch.info.generation)}, batch_size=[b], device=dev)

    # -- priorities ------------------------------------------------------------------------------------
    def update_priority(self, index, priority, generation=None) -> UpdateReport | None:
        """``priority`` [B] for the rows at ``index`` (TorchRL's meaning: PER raises it to alpha). Rows overwritten
        since they were sampled are skipped when the generation is known: ``generation`` given, or ``index`` one of
        the latest draws. None when the sampler uses no signal (uniform, ARB)."""
        buf = self.relive
        signals = buf.sampler.signals
        if not signals:
            return None
        idx = _numpy(index).astype(np.int64).reshape(-1)
        if generation is None:
            generation = next((g for i, g in reversed(self._draws) if i.shape == idx.shape and np.array_equal(i, idx)),
                              None)
        if generation is None:  # not a recent draw: the rows as they are now
            generation = buf.storage.meta["generation"].take(buf.storage.check_slots(idx))
        n = idx.size
        info = SampleInfo(indices=idx, generation=_numpy(generation).astype(np.int64).reshape(-1),
                          probability=np.full(n, np.nan), is_weight=np.ones(n, np.float32),
                          source=(idx >= buf.num_offline).view(np.int8))
        value = _numpy(priority).astype(np.float64).reshape(-1)
        name = "priority" if "priority" in signals else "td_error"
        return buf.update(info, **{name: value})

    def update_tensordict_priority(self, data: TensorDictBase) -> UpdateReport | None:
        """Priorities from a sampled TensorDict after the loss wrote ``td_error`` into it (TorchRL's call)."""
        key = self.keys["priority"]
        if key not in data.keys(include_nested=True):
            raise ValueError(f"update_tensordict_priority: no {key!r} in the TensorDict (run the loss module first)")
        gen = data.get("_generation", None)
        return self.update_priority(data.get("index"), data.get(key), generation=gen)

    # -- checkpoint ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """relive's buffer state with every array a tensor (no Python objects: ``torch.load(weights_only=True)``)."""
        return {"relive": _to_tensors(self.relive.state_dict(offline="copy")), "versions": dict(VERSIONS)}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, Mapping) or "relive" not in state:
            raise ValueError("load_state_dict: not a ReliveTensorDictReplayBuffer state (no 'relive' entry)")
        self._relive = ReplayBuffer.from_state_dict(_to_numpy(state["relive"]))
        self._sampler, self.frame_stack = self._relive.sampler, _stored_frame_stack(self._relive)
        self._draws.clear()

    def dumps(self, path: str | os.PathLike) -> None:
        """relive's checkpoint directory (``.npy`` + JSON + SHA-256 manifest; TorchRL's method name)."""
        self.relive.save(path)

    def loads(self, path: str | os.PathLike) -> None:
        self._relive = ReplayBuffer.load(path)
        self._sampler, self.frame_stack = self._relive.sampler, _stored_frame_stack(self._relive)
        self._draws.clear()


__all__ = ["ReliveTensorDictReplayBuffer", "TESTED", "catframes_frame_stack"]
