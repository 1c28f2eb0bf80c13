"""relive's replay buffer under Stable-Baselines3's off-policy algorithms (tested with stable-baselines3 2.9.2, the
``sb3`` extra's pin).

    from relive.integrations.sb3 import DQN, ReliveReplayBuffer
    from relive.replay import PrioritizedSampler

    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReliveReplayBuffer,
                replay_buffer_kwargs=dict(sampler=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4)))
    model.learn(20_000)
    model.save_replay_buffer("buffer_ckpt")   # relive's pickle-free checkpoint directory, not a pickle

Two parts:

* :class:`ReliveReplayBuffer` -- usable as ``replay_buffer_class=`` of SB3's own DQN, SAC, TD3 and DDPG: SB3's
  ``add`` / ``sample`` on relive's storage with any relive sampler. Each env of a vector env is its own stream
  (episodes stay whole), ``terminated`` / ``truncated`` are kept apart (SB3's ``TimeLimit.truncated``), offline
  rows (``offline=``) form a frozen prefix sampled with an exact share per batch (``MixtureSampler``), n-step
  returns come from relive (``n_steps=``, ``gamma=``). Samples are SB3's ``ReplayBufferSamples`` fields plus
  ``is_weights`` [B, 1] and ``info`` (relive's :class:`~relive.types.SampleInfo`).
* :class:`DQN`, :class:`SAC`, :class:`TD3`, :class:`DDPG` -- SB3's algorithms whose ``train()`` is SB3 2.9.2's,
  line for line, with two changes: the critic's per-sample loss is multiplied by the batch's IS weights before the
  mean (SB3's own loss functions, ``reduction="none"``), and |TD error| goes back to the sampler
  (``buffer.update``). SB3 has no hook for either (its ``train()`` samples, computes the loss and steps in one
  method), so the subclasses override ``train()``, SB3's public extension point for an algorithm's update; with
  all-ones weights (a sampler without IS correction) the loss is SB3's exactly. The actor's loss is not weighted
  (as in the PER variants of DDPG / TD3 / SAC in common use): the IS correction is for the critic's regression
  targets. ``save_replay_buffer`` / ``load_replay_buffer`` write and read relive's checkpoint directory
  (``.npy`` + JSON + SHA-256 manifest, no pickle); ``model.save`` does not pickle the buffer's arguments (the
  sampler, offline rows). The sampler's loop hooks (``relive.hooks``) are served before each gradient step: ARB
  (``ARBSampler``) re-scores the stored rows every ``refresh_every_grad_steps`` with SAC's actor (``SAC.score_fn``,
  relive's scoring functions; TD3 / DDPG have a deterministic actor and DQN none, so ARB needs SAC).

Observation spaces: Box, Discrete, MultiDiscrete, MultiBinary, and a Dict of Boxes (SB3's ``MultiInputPolicy``, in
place of SB3's ``DictReplayBuffer``: each key its own relive column ``obs.<key>``, batches of dicts of tensors; offline
rows and ``from_relive`` take flat observations only).

Frame stacks (``VecFrameStack``): ``replay_buffer_kwargs=dict(frame_stack=4)`` stores each frame once
(:mod:`relive.replay.storage.frame_stack`) where SB3's buffer keeps every stacked observation (twice without
``optimize_memory_usage``); the stacks SB3 adds are checked against their episodes and the batches hold the same
stacks, zeros before an episode's first step, as VecFrameStack made them. The stacking axis is found from the
observation space as VecFrameStack finds it (``channels_order=`` as VecFrameStack's to say it), a Dict's keys are all
stacked (VecFrameStack's way) unless ``frame_stack`` maps keys to counts.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import stable_baselines3 as sb3
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.preprocessing import (
    get_action_dim,
    get_obs_shape,
    is_image_space,
    is_image_space_channels_first,
)
from stable_baselines3.common.type_aliases import TrainFrequencyUnit
from stable_baselines3.common.utils import get_device, polyak_update
from torch.nn import functional as F

from relive.agents.scoring import log_prob_score, standardized_score
from relive.data.frame_stacks import add_offline_stacked
from relive.hooks import EveryGradSteps, LoopContext, collect_hooks
from relive.replay import MixtureSampler, ReplayBuffer, Sampler, UniformSampler
from relive.replay.storage import FrameStack
from relive.types import Batch, SampleInfo, UpdateReport, as_tensor

TESTED_SB3 = "2.9.2"  # the version whose train() methods the subclasses below follow (pyproject: extra "sb3")
COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
STAGED_STEPS = 64  # steps per env gathered in a relive Stage before a commit (see ReliveReplayBuffer._init_staging)
WARN_AFTER_SAMPLES = 1000  # a sampler that wants TD errors but got none after this many batches: warn once

if sb3.__version__ != TESTED_SB3:  # train() below mirrors this version's; another may have changed its losses
    warnings.warn(f"relive.integrations.sb3 is tested with stable-baselines3 {TESTED_SB3}, found {sb3.__version__}",
                  stacklevel=2)


class ReliveReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields (same names, order and shapes), then relive's: ``is_weights`` [B, 1]
    float32 (the sampler's importance-sampling weights, ones without IS correction) and ``info`` (which rows, for
    ``ReliveReplayBuffer.update``)."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None = None
    is_weights: th.Tensor | None = None
    info: SampleInfo | None = None


def _offline_rows(offline) -> tuple[dict | None, str | None]:
    """(rows, dataset id) of ``offline=``: a mapping of columns, or a dataset (Minari id, .npz, D4RL .hdf5, LeRobot
    directory) read with relive's loaders."""
    if offline is None:
        return None, None
    if isinstance(offline, Mapping):
        missing = [c for c in COLUMNS if c not in offline]
        if missing:
            raise ValueError(f"offline rows: missing column(s) {missing}; expected {list(COLUMNS)}")
        return dict(offline), None
    if isinstance(offline, str | os.PathLike):
        from relive.data.loaders import load_rows

        rows, _ = load_rows(offline)
        return rows, str(offline)
    raise ValueError(f"offline must be a mapping of columns {list(COLUMNS)} or a dataset id / path, got "
                     f"{type(offline).__name__}")


def offline_columns(rows: Mapping, obs_shape: tuple, action_space: spaces.Space, action_dtype) -> dict:
    """Dataset rows as SB3 stores steps: observations and actions reshaped to the spaces, Box actions rescaled from
    [low, high] to [-1, 1] (SB3's ``policy.scale_action``), flags as booleans."""
    n = len(np.asarray(rows["reward"]))
    out = {c: np.asarray(rows[c]) for c in COLUMNS}
    out["obs"] = out["obs"].reshape(n, *obs_shape)
    out["next_obs"] = out["next_obs"].reshape(n, *obs_shape)
    action = out["action"].reshape(n, get_action_dim(action_space))
    if isinstance(action_space, spaces.Box):
        low, high = action_space.low, action_space.high
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError("offline rows with an unbounded Box action space: SB3 rescales actions to [-1, 1] and "
                             "needs finite bounds")
        action = 2.0 * ((action - low) / (high - low)) - 1.0
    out["action"] = action.astype(action_dtype)
    out["reward"] = out["reward"].reshape(n).astype(np.float32)
    out["terminated"] = out["terminated"].reshape(n).astype(bool)
    out["truncated"] = out["truncated"].reshape(n).astype(bool)
    return out


def _box_frame_stack(space: spaces.Box, value, channels_order, what: str) -> FrameStack:
    """One Box's ``FrameStack`` as SB3's ``VecFrameStack(venv, k, channels_order)`` stacks it: zeros before an
    episode, the frames along the first axis (channels-first images) or the last (channels-last images, vectors);
    ``channels_order=None`` finds it as VecFrameStack does, from the space (here the stacked one)."""
    if isinstance(value, FrameStack):
        return value
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise ValueError(f"frame_stack{what}: expected the number of stacked frames (VecFrameStack's n_stack) or a "
                         f"relive FrameStack, got {value!r}")
    if channels_order is None:
        first = bool(is_image_space(space) and is_image_space_channels_first(space))
        channels_order = "first" if first else "last"
    return FrameStack.sb3(int(value), channels_order)


def sb3_frame_stack(observation_space: spaces.Space, frame_stack, channels_order=None):
    """relive's ``frame_stack`` option for observations stacked by SB3's ``VecFrameStack``: a count (``n_stack``) or
    a :class:`~relive.replay.storage.FrameStack`; for a Dict space a count stacks every key (as VecFrameStack does)
    and a mapping names the stacked keys; ``channels_order`` is VecFrameStack's (None: found from the space; a
    Dict: one for all keys or a mapping key -> order). None: no frame stack."""
    if frame_stack is None:
        return None
    if channels_order not in (None, "first", "last") and not isinstance(channels_order, Mapping):
        raise ValueError(f"channels_order must be None, 'first' or 'last' (VecFrameStack's; a Dict: or a mapping), "
                         f"got {channels_order!r}")
    if isinstance(observation_space, spaces.Dict):
        subspaces = observation_space.spaces
        chosen = frame_stack if isinstance(frame_stack, Mapping) else dict.fromkeys(subspaces, frame_stack)
        unknown = [k for k in chosen if k not in subspaces]
        if unknown:
            raise ValueError(f"frame_stack names unknown observation key(s) {unknown} (keys: {list(subspaces)})")
        orders = channels_order if isinstance(channels_order, Mapping) else dict.fromkeys(subspaces, channels_order)
        boxes = {k: sub for k, sub in subspaces.items() if isinstance(sub, spaces.Box)}
        if len(boxes) != len(subspaces):
            raise ValueError(f"frame_stack needs a Dict of Boxes, as VecFrameStack does; got {observation_space}")
        return {k: _box_frame_stack(boxes[k], v, orders.get(k), f" key {k!r}") for k, v in chosen.items()}
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(f"frame_stack needs a Box (or Dict of Boxes) observation space, as VecFrameStack does; got "
                         f"{observation_space}")
    if isinstance(frame_stack, Mapping) or isinstance(channels_order, Mapping):
        raise ValueError("frame_stack / channels_order as mappings are for Dict observation spaces; this one is a Box")
    return _box_frame_stack(observation_space, frame_stack, channels_order, "")


class ReliveReplayBuffer(SB3ReplayBuffer):
    """SB3's replay buffer interface on a relive :class:`~relive.replay.ReplayBuffer` (``self.relive``).

    SB3 passes ``buffer_size, observation_space, action_space, device, n_envs, optimize_memory_usage``; the rest
    comes from ``replay_buffer_kwargs``: ``sampler`` (any relive sampler; default uniform), ``offline`` (rows as a
    mapping of columns ``obs, action, reward, next_obs, terminated, truncated`` with actions in the env's units,
    or a dataset id / path), ``offline_fraction`` (each batch's exact offline share, used when ``offline`` is given
    and ``sampler`` is not already a ``MixtureSampler``: the online part is then sampled by ``sampler``), ``seed``
    (the buffer's own generator), ``n_steps`` / ``gamma`` (n-step returns), ``frame_stack`` / ``channels_order``
    (observations stacked by SB3's ``VecFrameStack``: each frame stored once; see :func:`sb3_frame_stack`). The
    online ring holds ``buffer_size`` rows; offline rows come on top and are never evicted.

    Box actions are stored as SB3 stores them, rescaled to [-1, 1] (``policy.scale_action``); offline actions are
    rescaled the same way on the way in. A batch larger than the stored rows is drawn with replacement, as SB3's
    own buffer does (SB3 starts training after ``learning_starts`` steps, whatever the batch size)."""

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, sampler: Sampler | None = None, offline=None,
                 offline_fraction: float = 0.5, seed: int = 0, n_steps: int = 1, gamma: float = 0.99,
                 frame_stack=None, channels_order=None):
        self._init_spaces(buffer_size, observation_space, action_space, device, n_envs)
        if optimize_memory_usage:
            raise ValueError("ReliveReplayBuffer: optimize_memory_usage=True is SB3's own buffer layout; relive stores "
                             "next_obs once already (leave optimize_memory_usage off; frame stacks from VecFrameStack: "
                             "replay_buffer_kwargs=dict(frame_stack=n_stack) stores each frame once)")
        stacked = sb3_frame_stack(observation_space, frame_stack, channels_order)
        subspaces = observation_space.spaces if isinstance(observation_space, spaces.Dict) else None
        is_dict = subspaces is not None
        if not (isinstance(observation_space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary)
                or subspaces is not None and all(isinstance(sub, spaces.Box) for sub in subspaces.values())):
            raise ValueError(f"ReliveReplayBuffer: observation space {observation_space} is not supported (Box, "
                             "Discrete, MultiDiscrete, MultiBinary, or a Dict of Boxes)")
        if sampler is not None and not isinstance(sampler, Sampler):
            raise ValueError(f"sampler must be a relive Sampler (relive.replay), got {type(sampler).__name__}")
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.buffer_size = max(buffer_size // n_envs, 1)
        rows, dataset_id = _offline_rows(offline)
        if rows is not None and is_dict:
            raise ValueError("ReliveReplayBuffer: offline rows with a Dict observation space are not supported yet "
                             "(flat observations only)")
        if rows is not None and not isinstance(sampler, MixtureSampler):
            sampler = MixtureSampler(offline=UniformSampler(), online=sampler, offline_fraction=offline_fraction)
        wants = sampler.signals if sampler is not None else ()
        if wants and "td_error" not in wants:
            raise ValueError(f"ReliveReplayBuffer: {type(sampler).__name__} needs the signal(s) {list(wants)}, "
                             "which SB3's algorithms do not compute (td_error only)")
        num_offline = 0 if rows is None else len(np.asarray(rows["reward"]))
        # a Dict: key -> (shape, dtype), a column per key (dict observations' next_obs is read from the next row
        # where it is that row's obs: relive's dedup_next_obs, stored only at episode ends)
        obs_shape = ({k: (sub.shape, sub.dtype) for k, sub in subspaces.items()} if subspaces is not None
                     else self.obs_shape)
        self._relive = ReplayBuffer(self.buffer_size * n_envs + num_offline, obs_shape, (self.action_dim,),
                                   sampler=sampler, seed=seed, obs_dtype=observation_space.dtype,
                                   action_dtype=self._maybe_cast_dtype(action_space.dtype), n_step=n_steps,
                                   gamma=gamma, frame_stack=stacked)
        if rows is not None:
            self._add_offline(rows, dataset_id)
        self._init_staging()

    def _add_offline(self, rows: Mapping, dataset_id: str | None) -> None:
        """Offline rows into the prefix. With ``frame_stack``, rows of single frames (a dataset's: one frame a step)
        get their stacks built from their episodes, padded as the declared stack says (VecFrameStack: zeros), and are
        stored a frame a row (relive.data.frame_stacks; the checkpoint then copies them instead of naming the
        dataset); rows of stacks go in as they are."""
        st = self._relive.storage
        frame = tuple(st.specs["obs"].shape)
        if (getattr(st, "frame_stack", None) and st.obs_keys is None
                and np.asarray(rows["obs"]).shape[1:] == frame != tuple(st.obs_spec.shape)):
            add_offline_stacked(self._relive, offline_columns(rows, frame, self.action_space,
                                                              st.specs["action"].dtype))
            return
        self._relive.add_offline(self._offline_columns(rows), dataset_id=dataset_id)

    def _init_spaces(self, buffer_size, observation_space, action_space, device, n_envs) -> None:
        """BaseBuffer's attributes, except ``pos`` / ``full`` (read from relive's storage: properties here)."""
        self.buffer_size = buffer_size
        self.observation_space, self.action_space = observation_space, action_space
        self.obs_shape = get_obs_shape(observation_space)  # type: ignore[assignment]
        self.action_dim = get_action_dim(action_space)
        self.device = get_device(device)
        self.n_envs = n_envs

    def _init_staging(self) -> None:
        """SB3 adds one step at a time; the steps wait here (per env, in order) and go to relive in one ``extend``
        per env before anything reads the buffer (``sample``, ``size``, ``relive``, ``save``) or when
        ``STAGED_STEPS`` have gathered. Sampling therefore always sees every added step."""
        n = self.n_envs
        if self._relive.storage.obs_keys is not None:  # dict observations: NumPy arrays here, one extend per env
            self._stage = None
            self._staged = _dict_stage(self._relive, n, STAGED_STEPS)
        else:
            self._stage = self._relive.stage(streams=n, rows=STAGED_STEPS)  # env i -> stream i
            self._staged = self._stage.columns  # (n, STAGED_STEPS, ...) per column, in the storage's dtypes
        # step k of every env, per column (views made once: add writes into them)
        names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
        self._step_views = [tuple(_step(self._staged[c], k) for c in names) for k in range(STAGED_STEPS)]
        self._num_staged = 0
        # one env step's obs and actions (a Dict: its obs are written key by key)
        self._staged_shapes = ((n, *self.obs_shape) if isinstance(self.obs_shape, tuple) else None,
                               (n, self.action_dim))
        self.last_info: SampleInfo | None = None  # the latest batch's rows (``update`` takes any batch's info)
        self._samples_since_update = 0
        self._warned = False

    def _flush(self) -> None:
        k = self._num_staged
        if k == 0:
            return
        self._num_staged = 0
        if self._stage is not None:
            self._stage.commit(k)
            return
        for i in range(self.n_envs):  # (dict observations: the rows of env i into stream i)
            self._relive.extend({c: {key: v[i, :k] for key, v in col.items()} if isinstance(col, dict) else col[i, :k]
                                 for c, col in self._staged.items()}, stream=i)

    @property
    def relive(self) -> ReplayBuffer:
        """The relive buffer underneath, every added step in it."""
        self._flush()
        return self._relive

    @property
    def pos(self) -> int:  # type: ignore[override]
        """SB3's write position (per env) of the next step, as SB3's own buffer counts it."""
        st = self._relive.storage
        return ((st.num_online_written // self.n_envs) + self._num_staged) % self.buffer_size

    @property
    def full(self) -> bool:  # type: ignore[override]
        st = self._relive.storage
        return st.num_online + self._num_staged * self.n_envs >= st.online_capacity

    @classmethod
    def from_relive(cls, relive: ReplayBuffer, observation_space: spaces.Space, action_space: spaces.Space,
                    device: th.device | str = "auto", n_envs: int = 1,
                    handle_timeout_termination: bool = True) -> ReliveReplayBuffer:
        """Wrap an existing relive buffer (e.g. ``ReplayBuffer.load(path)``) whose rows match the spaces."""
        buf = cls.__new__(cls)
        buf._init_spaces(relive.storage.capacity, observation_space, action_space, device, n_envs)
        st = relive.storage
        if st.obs_keys is not None or tuple(st.obs_spec.shape) != tuple(buf.obs_shape):  # (obs_spec: stacks too)
            got = "dict observations" if st.obs_keys is not None else f"observations {st.obs_spec.shape}"
            raise ValueError(f"the relive buffer's {got} do not match the observation space's shape {buf.obs_shape}")
        if tuple(st.specs["action"].shape) != (buf.action_dim,):
            raise ValueError(f"the relive buffer's actions {tuple(st.specs['action'].shape)} do not match the action "
                             f"space ({buf.action_dim},)")
        if st.extra_names:  # (SB3's add has no values for them: they would be written as zeros)
            raise ValueError(f"the relive buffer has extra columns {list(st.extra_names)}, which SB3's add does not "
                             "provide; wrap a buffer without extra columns")
        buf.optimize_memory_usage = False
        buf.handle_timeout_termination = handle_timeout_termination
        buf.buffer_size = max(st.online_capacity // n_envs, 1)
        buf._relive = relive
        buf._init_staging()
        return buf

    def _offline_columns(self, rows: Mapping) -> dict:
        return offline_columns(rows, self.obs_shape, self.action_space, self._relive.storage.specs["action"].dtype)

    # -- SB3's interface -------------------------------------------------------------------------------
    def size(self) -> int:
        """Stored rows, offline ones included."""
        return len(self.relive)

    def reset(self) -> None:
        raise ValueError("ReliveReplayBuffer.reset is not supported: make a new buffer (offline rows stay frozen)")

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]]) -> None:
        """One step of every env; env i's row goes to stream i (its own episode sequence)."""
        n = self.n_envs
        done = np.asarray(done, dtype=bool).reshape(n)
        k = self._num_staged
        obs_k, action_k, reward_k, next_obs_k, terminated_k, truncated_k = self._step_views[k]
        obs_shape, act_shape = self._staged_shapes
        asarray = np.asarray  # (SB3 hands ndarrays: asarray is then free, and .reshape a view)
        if obs_shape is None:  # a Dict space: key by key
            for key, view in obs_k.items():
                view[...] = asarray(obs[key]).reshape(view.shape)
            for key, view in next_obs_k.items():
                view[...] = asarray(next_obs[key]).reshape(view.shape)
        else:
            obs_k[...] = asarray(obs).reshape(obs_shape)
            next_obs_k[...] = asarray(next_obs).reshape(obs_shape)
        action_k[...] = asarray(action).reshape(act_shape)
        reward_k[...] = asarray(reward).reshape(n)
        # infos are read only where an env is done (most steps: none), and only when timeouts are told apart
        # (handle_timeout_termination=False is SB3's meaning: a timeout counts as a termination)
        if self.handle_timeout_termination and True in done.tolist():  # (a list of n bools: no ufunc call)
            timeout = np.fromiter((bool(info.get("TimeLimit.truncated", False)) for info in infos), bool, n)
            terminated_k[...] = done & ~timeout
            truncated_k[...] = done & timeout
        else:
            terminated_k[...] = done
            truncated_k[...] = False
        self._num_staged = k + 1
        if self._num_staged == STAGED_STEPS:
            self._flush()

    def sample(self, batch_size: int, env=None) -> ReliveReplayBufferSamples:  # type: ignore[override]
        if self._num_staged:
            self._flush()  # (sampling sees every added step)
        buf = self._relive
        stored = buf.storage.num_rows
        if stored == 0:
            raise ValueError("ReliveReplayBuffer.sample: the buffer is empty")
        if type(batch_size) is int and 0 < batch_size <= stored:  # (SB3's int: ReplayBuffer.sample's checks hold)
            batch = buf._draw_batch(batch_size)
        elif batch_size <= stored:
            batch = buf.sample(batch_size)  # (it names what is wrong)
        else:  # SB3 samples with replacement from the first step on; relive's samplers draw with replacement too
            draw = buf.sampler.sample(int(batch_size), buf.rng)
            batch = buf.gather(draw.indices, draw.probability, draw.is_weight, buf.sampler.hints())
        self.last_info = batch.info
        self._samples_since_update += 1
        if self._samples_since_update > WARN_AFTER_SAMPLES and buf.sampler.signals and not self._warned:
            self._warned = True
            warnings.warn(f"{type(buf.sampler).__name__} has had no TD error for {WARN_AFTER_SAMPLES} batches: SB3's "
                          "own algorithms do not report them (nor apply IS weights); use relive.integrations.sb3's "
                          "DQN / SAC / TD3 / DDPG", stacklevel=2)
        return self.to_samples(batch, env)

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> ReliveReplayBufferSamples:  # type: ignore[override]
        """The rows at slots ``batch_inds`` (SB3's internal hook; relive slots, offline rows first)."""
        return self.to_samples(self.relive.gather(batch_inds), env)

    def to_samples(self, batch: Batch, env=None) -> ReliveReplayBufferSamples:
        """A relive batch as SB3's sample tuple on ``self.device`` (VecNormalize applied when ``env`` is given)."""
        # relive's gather already copied the rows: on CPU the tensors share them (device None: as_tensor's zero-copy
        # path without a device check per column)
        device = None if self.device.type == "cpu" else self.device

        def t(x):
            if isinstance(x, dict):  # (a Dict observation space: a dict of tensors, as SB3's DictReplayBuffer)
                return {k: as_tensor(v, device) for k, v in x.items()}
            return as_tensor(x, device)

        obs, next_obs = batch.obs, batch.next_obs
        rewards = batch.reward.reshape(-1, 1).astype(np.float32, copy=False)
        if env is not None:  # VecNormalize
            obs, next_obs = self._normalize_obs(obs, env), self._normalize_obs(next_obs, env)
            rewards = self._normalize_reward(rewards, env)
        return ReliveReplayBufferSamples(
            t(obs), t(batch.action), t(next_obs),
            t(batch.terminated.astype(np.float32).reshape(-1, 1)),  # dones: SB3's dones * (1 - timeouts)
            t(rewards),
            None if batch.discount is None else t(batch.discount.astype(np.float32).reshape(-1, 1)),  # discounts
            t(np.asarray(batch.info.is_weight, dtype=np.float32).reshape(-1, 1)),  # is_weights
            batch.info,
        )

    # -- relive's feedback and checkpoint --------------------------------------------------------------
    def update(self, info: SampleInfo, td_error) -> UpdateReport | None:
        """|TD error| per sampled row back to the sampler (rows overwritten since are skipped); None when the
        sampler uses no signal (uniform, ARB, ...)."""
        self._samples_since_update = 0
        if "td_error" not in self.relive.sampler.signals:
            return None
        if isinstance(td_error, th.Tensor):
            td_error = td_error.detach().cpu().numpy()
        return self.relive.update(info, td_error=np.asarray(td_error, dtype=np.float64).reshape(-1))

    def save(self, path: str | os.PathLike) -> None:
        """relive's checkpoint directory (no pickle; see ``ReplayBuffer.save``)."""
        self.relive.save(path)

    def __getstate__(self):
        raise TypeError("ReliveReplayBuffer is not pickled: save it with buffer.save(path) or the "
                        "relive.integrations.sb3 algorithms' save_replay_buffer (a pickle-free checkpoint)")


def _step(column, k: int):
    """Step ``k`` of every env of a staging column (a dict of them for dict observations)."""
    return {key: v[:, k] for key, v in column.items()} if isinstance(column, dict) else column[:, k]


def _dict_stage(relive: ReplayBuffer, n: int, rows: int) -> dict:
    """The staging columns of a dict-observation buffer: (n, rows, ...) arrays in the storage's dtypes, ``obs`` and
    ``next_obs`` dicts of one array per key (``add`` writes step k of every env, ``_flush`` extends per env)."""
    specs = relive.storage.specs
    out: dict[str, Any] = {c: np.zeros((n, rows, *specs[c].shape), specs[c].dtype)
                           for c in ("action", "reward", "terminated", "truncated")}
    for c in ("obs", "next_obs"):
        out[c] = {k: np.zeros((n, rows, *spec.shape), spec.dtype) for k, spec in relive.storage.obs_spec.items()}
    return out


# -- the algorithms ------------------------------------------------------------------------------------
def _weighted_mean(per_sample: th.Tensor, replay_data) -> th.Tensor:
    """mean_i w_i l_i with the batch's IS weights (SB3's mean when there are none)."""
    w = getattr(replay_data, "is_weights", None)
    return (per_sample * w).mean() if w is not None else per_sample.mean()


class _ReliveAlgorithm:
    """What the four algorithms share: relive's buffer by default, TD errors back to it, pickle-free buffer files,
    the sampler's loop hooks (ARB's periodic re-scoring)."""

    replay_buffer: Any
    replay_buffer_class: Any  # (SB3's attribute; set here when None)
    _replay_hooks: list | None

    def _setup_model(self) -> None:
        if self.replay_buffer_class is None:
            self.replay_buffer_class = ReliveReplayBuffer
        if issubclass(self.replay_buffer_class, ReliveReplayBuffer):
            kw = self.replay_buffer_kwargs  # type: ignore[attr-defined]
            kw.setdefault("seed", 0 if self.seed is None else int(self.seed))  # type: ignore[attr-defined]
            if kw.get("n_steps", 1) > 1:
                kw.setdefault("gamma", self.gamma)  # type: ignore[attr-defined]
        super()._setup_model()  # type: ignore[misc]

    def _excluded_save_params(self) -> list[str]:
        # the buffer's arguments hold the sampler and offline rows: not pickled into the model's zip (the buffer,
        # sampler included, is saved by save_replay_buffer); the hooks are functions of the buffer, built again
        return super()._excluded_save_params() + ["replay_buffer_kwargs", "_replay_hooks"]  # type: ignore[misc]

    def _setup_learn(self, total_timesteps: int, *args, **kwargs):
        """SB3's set-up, then the sampler's unconfigured schedules (PER's / ReaPER's IS exponent, as SB3's own
        schedules run over ``learn``) over the gradient steps this ``learn`` call will make."""
        total_timesteps, callback = super()._setup_learn(total_timesteps, *args, **kwargs)  # type: ignore[misc]
        if isinstance(self.replay_buffer, ReliveReplayBuffer):
            planned = self._planned_grad_steps(total_timesteps)
            if planned is not None:
                self.replay_buffer.relive.sampler.anneal_over_next(planned)
        return total_timesteps, callback

    def _planned_grad_steps(self, total_timesteps: int) -> int | None:
        """Gradient steps (one sample call each) from now to ``total_timesteps`` env steps: a train call every
        ``train_freq`` steps of every env after ``learning_starts``, ``gradient_steps`` each (-1: as many as env
        steps collected). None for ``train_freq`` in episodes (the count is not known ahead)."""
        freq = self.train_freq  # type: ignore[attr-defined]
        if freq.unit != TrainFrequencyUnit.STEP:
            return None
        per_call_env_steps = freq.frequency * self.n_envs  # type: ignore[attr-defined]
        start = max(self.num_timesteps, self.learning_starts)  # type: ignore[attr-defined]
        calls = max(0, total_timesteps - start) // per_call_env_steps
        steps = self.gradient_steps  # type: ignore[attr-defined]
        return calls * (steps if steps >= 0 else per_call_env_steps)

    def _feed_back(self, replay_data, td_error: th.Tensor) -> None:
        info = getattr(replay_data, "info", None)
        if info is not None and isinstance(self.replay_buffer, ReliveReplayBuffer):
            self.replay_buffer.update(info, td_error.abs().reshape(-1))

    def _before_grad_step(self) -> None:
        """Serve the sampler's loop hooks (relive.hooks) before each gradient step: ARB re-scores the stored rows
        with ``score_fn`` every ``refresh_every_grad_steps`` steps, counted from the first one."""
        if not isinstance(self.replay_buffer, ReliveReplayBuffer):
            return
        hooks = getattr(self, "_replay_hooks", None)
        if hooks is None:
            relive = self.replay_buffer.relive
            ctx = LoopContext(agent=self, buffer=relive, config=None, gamma=self.gamma)  # type: ignore[attr-defined]
            declared = collect_hooks(ctx, relive.sampler)
            others = [type(h).__name__ for h in declared if not isinstance(h, EveryGradSteps)]
            if others:
                raise ValueError(f"{type(relive.sampler).__name__} needs loop hooks {others} that SB3's loop does "
                                 "not serve (only EveryGradSteps: ARB's re-scoring)")
            hooks = self._replay_hooks = declared
            self._replay_grad_steps = 0
        for h in hooks:
            if self._replay_grad_steps % h.every == 0:
                h.fn()
        self._replay_grad_steps += 1

    def score_fn(self, mode: str = "standardized"):
        raise ValueError(f"replay ARB re-scores rows with the policy's likelihood of the stored action; "
                         f"{type(self).__name__}'s policy has none (use relive.integrations.sb3.SAC)")

    def save_replay_buffer(self, path) -> None:
        """relive's checkpoint directory at ``path`` (``.npy`` + JSON + SHA-256 manifest; nothing is pickled)."""
        if not isinstance(self.replay_buffer, ReliveReplayBuffer):
            raise ValueError(f"save_replay_buffer: the replay buffer is {type(self.replay_buffer).__name__}, not "
                             "ReliveReplayBuffer (SB3's own buffers are saved with pickle: use SB3's classes)")
        if not isinstance(path, str | os.PathLike):
            raise ValueError("save_replay_buffer: give a directory path (relive's checkpoint is a directory)")
        self.replay_buffer.save(path)

    def load_replay_buffer(self, path, truncate_last_traj: bool = True, *, offline_rows=None) -> None:
        """Load a directory written by :meth:`save_replay_buffer` (no unpickling): same rows, sampler state and
        generator, so the same next batches. A checkpoint whose offline rows came from a dataset id / path
        (``offline="..."``) refers to them by id and SHA-256, and the checkpoint never decides which dataset is
        opened: the rows come from this call -- ``offline_rows`` (the rows prepared as the buffer stored them, a
        function dataset id -> such rows, or a dataset id / path to read and prepare), or by default the offline rows
        of this model's own buffer when it was built from the same dataset id (``replay_buffer_kwargs=dict(offline=
        ...)``); anything else is refused, naming the id. ``truncate_last_traj`` is HER's and ignored."""
        if not isinstance(path, str | os.PathLike):
            raise ValueError("load_replay_buffer: give the checkpoint's directory path")
        me: Any = self
        rows = offline_rows
        if isinstance(offline_rows, str | os.PathLike):  # a dataset the caller names: read it and prepare it
            named = str(offline_rows)

            def rows(dataset_id: str):
                from relive.data.loaders import load_rows

                action_dtype = SB3ReplayBuffer._maybe_cast_dtype(me.action_space.dtype)
                obs_shape = get_obs_shape(me.observation_space)
                assert isinstance(obs_shape, tuple)  # (a flat observation space: ReliveReplayBuffer is not a Dict one)
                return offline_columns(load_rows(named)[0], obs_shape, me.action_space, action_dtype)
        elif offline_rows is None:  # this model's own offline rows, if they came from the dataset the checkpoint names
            def rows(dataset_id: str):
                current = me.replay_buffer
                if isinstance(current, ReliveReplayBuffer):
                    st = current.relive.storage
                    if set(st.offline_dataset_ids) == {dataset_id}:
                        slots = np.arange(st.num_before_online)
                        return {c: st.read(c, slots) for c in COLUMNS}
                raise ValueError(f"load_replay_buffer: the checkpoint refers to offline dataset {dataset_id!r}, which "
                                 "this model's buffer was not built from; a checkpoint does not choose what is read: "
                                 "build the model with replay_buffer_kwargs=dict(offline=...) naming that dataset, or "
                                 "pass offline_rows=(the rows, or the dataset id / path)")
        relive = ReplayBuffer.load(path, offline_rows=rows)
        old = self.replay_buffer
        self._replay_hooks = None  # the sampler's hooks are built again for the loaded buffer
        self.replay_buffer = ReliveReplayBuffer.from_relive(
            relive, self.observation_space, self.action_space, device=self.device,  # type: ignore[attr-defined]
            n_envs=self.n_envs,  # type: ignore[attr-defined]
            handle_timeout_termination=getattr(old, "handle_timeout_termination", True))


class DQN(_ReliveAlgorithm, sb3.DQN):
    """SB3's DQN with IS-weighted Huber loss and |TD error| fed back (``train`` as SB3 2.9.2's otherwise)."""

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            self._before_grad_step()
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            with th.no_grad():
                next_q_values = self.q_net_target(replay_data.next_observations)
                next_q_values, _ = next_q_values.max(dim=1)
                next_q_values = next_q_values.reshape(-1, 1)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
            current_q_values = self.q_net(replay_data.observations)
            current_q_values = th.gather(current_q_values, dim=1, index=replay_data.actions.long())
            loss = _weighted_mean(F.smooth_l1_loss(current_q_values, target_q_values, reduction="none"), replay_data)
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            self._feed_back(replay_data, (current_q_values - target_q_values).detach())
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))


class SAC(_ReliveAlgorithm, sb3.SAC):
    """SB3's SAC with IS-weighted critic loss and |TD error| (mean over the critics) fed back."""

    def score_fn(self, mode: str = "standardized"):
        """``score(obs, action) -> [N]``: ARB's on-policyness of stored actions (already in [-1, 1], as SB3 stores
        them) under the current actor's tanh-Gaussian, by relive's scoring functions (``relive.agents.scoring``:
        ``"standardized"``, the ARB reference code's, or ``"log_prob"``)."""
        if mode not in ("standardized", "log_prob"):
            raise ValueError(f"score mode must be 'standardized' or 'log_prob', got {mode!r}")
        if self.use_sde:
            raise ValueError("ARB's scores need SAC's Gaussian actor; use_sde=True is not supported")

        @th.no_grad()
        def score(obs, action):
            mean, log_std, _ = self.actor.get_action_dist_params(th.as_tensor(obs, device=self.device))
            a = th.as_tensor(np.asarray(action, np.float32), device=self.device)
            if mode == "log_prob":
                return log_prob_score(mean, log_std, a)
            return standardized_score(mean, log_std.exp(), a)
        return score

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        self.policy.set_training_mode(True)
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers += [self.ent_coef_optimizer]
        self._update_learning_rate(optimizers)
        ent_coef_losses, ent_coefs = [], []
        actor_losses, critic_losses = [], []
        for gradient_step in range(gradient_steps):
            self._before_grad_step()
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            if self.use_sde:
                self.actor.reset_noise()
            actions_pi, log_prob = self.actor.action_log_prob(replay_data.observations)
            log_prob = log_prob.reshape(-1, 1)
            ent_coef_loss = None
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                ent_coef = th.exp(self.log_ent_coef.detach())
                # (SB3's _setup_model made target_entropy a float; its type still allows the "auto" it was given)
                ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()  # type: ignore[operator]
                ent_coef_losses.append(ent_coef_loss.item())
            else:
                ent_coef = self.ent_coef_tensor
            ent_coefs.append(ent_coef.item())
            if ent_coef_loss is not None and self.ent_coef_optimizer is not None:
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()
                self.ent_coef_optimizer.step()
            with th.no_grad():
                next_actions, next_log_prob = self.actor.action_log_prob(replay_data.next_observations)
                next_q_values = th.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
                next_q_values, _ = th.min(next_q_values, dim=1, keepdim=True)
                next_q_values = next_q_values - ent_coef * next_log_prob.reshape(-1, 1)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
            current_q_values = self.critic(replay_data.observations, replay_data.actions)
            critic_loss = 0.5 * sum(_weighted_mean(F.mse_loss(current_q, target_q_values, reduction="none"),
                                                   replay_data) for current_q in current_q_values)
            assert isinstance(critic_loss, th.Tensor)  # (a sum over the critics, at least one)
            critic_losses.append(critic_loss.item())
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()
            self._feed_back(replay_data, th.stack([(q - target_q_values).detach() for q in current_q_values])
                            .abs().mean(0))
            q_values_pi = th.cat(self.critic(replay_data.observations, actions_pi), dim=1)
            min_qf_pi, _ = th.min(q_values_pi, dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - min_qf_pi).mean()
            actor_losses.append(actor_loss.item())
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()
            if gradient_step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if len(ent_coef_losses) > 0:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))


class _TD3Train(_ReliveAlgorithm):
    """TD3's (and DDPG's) ``train``, SB3 2.9.2's with IS-weighted critic loss and |TD error| fed back."""

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)  # type: ignore[attr-defined]
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])  # type: ignore[attr-defined]
        actor_losses, critic_losses = [], []
        s: Any = self
        for _ in range(gradient_steps):
            s._n_updates += 1
            self._before_grad_step()
            replay_data = self.replay_buffer.sample(batch_size, env=s._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else s.gamma
            with th.no_grad():
                noise = replay_data.actions.clone().data.normal_(0, s.target_policy_noise)
                noise = noise.clamp(-s.target_noise_clip, s.target_noise_clip)
                next_actions = (s.actor_target(replay_data.next_observations) + noise).clamp(-1, 1)
                next_q_values = th.cat(s.critic_target(replay_data.next_observations, next_actions), dim=1)
                next_q_values, _ = th.min(next_q_values, dim=1, keepdim=True)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
            current_q_values = s.critic(replay_data.observations, replay_data.actions)
            critic_loss = sum(_weighted_mean(F.mse_loss(current_q, target_q_values, reduction="none"), replay_data)
                              for current_q in current_q_values)
            assert isinstance(critic_loss, th.Tensor)  # (a sum over the critics, at least one)
            critic_losses.append(critic_loss.item())
            s.critic.optimizer.zero_grad()
            critic_loss.backward()
            s.critic.optimizer.step()
            self._feed_back(replay_data, th.stack([(q - target_q_values).detach() for q in current_q_values])
                            .abs().mean(0))
            if s._n_updates % s.policy_delay == 0:
                actor_loss = -s.critic.q1_forward(replay_data.observations, s.actor(replay_data.observations)).mean()
                actor_losses.append(actor_loss.item())
                s.actor.optimizer.zero_grad()
                actor_loss.backward()
                s.actor.optimizer.step()
                polyak_update(s.critic.parameters(), s.critic_target.parameters(), s.tau)
                polyak_update(s.actor.parameters(), s.actor_target.parameters(), s.tau)
                polyak_update(s.critic_batch_norm_stats, s.critic_batch_norm_stats_target, 1.0)
                polyak_update(s.actor_batch_norm_stats, s.actor_batch_norm_stats_target, 1.0)
        s.logger.record("train/n_updates", s._n_updates, exclude="tensorboard")
        if len(actor_losses) > 0:
            s.logger.record("train/actor_loss", np.mean(actor_losses))
        s.logger.record("train/critic_loss", np.mean(critic_losses))


class TD3(_TD3Train, sb3.TD3):
    """SB3's TD3 with IS-weighted critic loss and |TD error| (mean over the critics) fed back."""


class DDPG(_TD3Train, sb3.DDPG):
    """SB3's DDPG (TD3 with one critic, no delay, no target noise) with IS weights and |TD error| fed back."""


__all__ = ["ReliveReplayBuffer", "ReliveReplayBufferSamples", "sb3_frame_stack", "DQN", "SAC", "TD3", "DDPG",
           "TESTED_SB3"]
