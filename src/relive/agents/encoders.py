"""The observation encoder seam: how an agent turns a stored observation into the vector its networks read.

Flat observations pass through unchanged. Dict observations (``ReplayBuffer(obs_shape={key: ...})``, batches
with ``batch.obs["image"]``) are, by default, concatenated: every key flattened to [N, -1], cast to float32,
keys in sorted order -- the order gymnasium's ``FlattenObservation`` (and so relive's envs) and Minari's
flattening use, so an agent trained on flattened observations reads a dict buffer the same way. The agent's
MLPs then run over the concatenation (``obs_dim`` = the sum of the keys' sizes). Every agent applies
``flat_obs_batch`` in its update and ``as_obs_tensor`` (``networks.py``) in ``act`` and its scores, so this is the
one place a learned encoder (a CNN over image keys) plugs in.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import numpy as np
import torch
from torch import nn

from relive.agents import networks as nets
from relive.agents.networks import concat_keys
from relive.types import Batch


def flat_obs(obs):
    """:func:`concat_keys` of a dict observation; anything else unchanged."""
    return concat_keys(obs) if isinstance(obs, Mapping) else obs


def flat_obs_dim(obs_spec) -> int:
    """Size of the concatenated observation of a storage's ``obs_spec`` (a ColumnSpec or a dict of them), or of
    a shape / a dict key -> shape."""
    if isinstance(obs_spec, Mapping):
        return sum(flat_obs_dim(v) for v in obs_spec.values())
    shape = getattr(obs_spec, "shape", obs_spec)
    if isinstance(shape, tuple) and len(shape) == 2 and not isinstance(shape[1], int):  # (shape, dtype)
        shape = shape[0]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return int(np.prod(shape, dtype=np.int64))


def check_obs_keys(keys) -> None:
    """An agent's ``obs_keys`` setting: a tuple of distinct non-empty key names (``()``: every key)."""
    if not isinstance(keys, tuple) or not all(isinstance(k, str) and k for k in keys) or len(set(keys)) != len(keys):
        raise ValueError(f"obs_keys must be a tuple of distinct key names (() = every key), got {keys!r}")


def pick_keys(obs, keys: tuple[str, ...]):
    """A dict observation (or a dict observation spec) restricted to ``keys`` (an agent's ``obs_keys``: a
    goal-conditioned agent reads ``observation`` and ``desired_goal``, not ``achieved_goal``); ``keys = ()`` or a
    flat observation: unchanged. A missing key is a ValueError naming the keys there are."""
    if not keys or not isinstance(obs, Mapping):
        return obs
    missing = [k for k in keys if k not in obs]
    if missing:
        raise ValueError(f"agent.obs_keys {list(keys)}: the observations have no key {missing} (their keys: "
                         f"{sorted(obs)})")
    return {k: obs[k] for k in keys}


def pick_batch_keys(batch: Batch, keys: tuple[str, ...]) -> Batch:
    """The batch with ``obs`` / ``next_obs`` restricted to ``keys`` (:func:`pick_keys`)."""
    if not keys or not isinstance(batch.obs, Mapping):
        return batch
    return replace(batch, obs=pick_keys(batch.obs, keys), next_obs=pick_keys(batch.next_obs, keys))


def flat_obs_batch(batch: Batch) -> Batch:
    """The batch with dict ``obs`` / ``next_obs`` concatenated (:func:`concat_keys`); a flat batch as it is."""
    if not isinstance(batch.obs, Mapping):
        return batch
    return replace(batch, obs=concat_keys(batch.obs), next_obs=concat_keys(batch.next_obs))


# -- a learned encoder for image keys (SAC / RLPD / Cal-QL with ``encoder="cnn"``) -------------------------------
class DictObs(dict):
    """A batch of dict observations as torch tensors (key -> [B, ...]) with the few batch operations the agents
    apply to observation tensors: ``shape[0]``, ``repeat_interleave(n, dim=0)``, ``repeat(k, 1)`` and
    ``torch.cat([a, b])`` (rows), so that SAC and Cal-QL run unchanged on them; the networks' encoders read it."""

    @property
    def shape(self) -> tuple[int]:
        return (next(iter(self.values())).shape[0],)

    def repeat_interleave(self, n: int, dim: int = 0) -> DictObs:
        if dim != 0:
            raise ValueError("dict observations repeat along the batch axis (dim=0) only")
        return DictObs({k: v.repeat_interleave(n, dim=0) for k, v in self.items()})

    def repeat(self, *sizes) -> DictObs:
        if len(sizes) != 2 or sizes[1] != 1:
            raise ValueError(f"dict observations repeat as repeat(k, 1) (rows) only, got repeat{sizes}")
        return DictObs({k: v.repeat(sizes[0], *([1] * (v.dim() - 1))) for k, v in self.items()})

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.cat and kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0:
            parts = args[0]
            return DictObs({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        return NotImplemented


def image_keys(obs_spec: Mapping) -> list[str]:
    """Keys of a dict observation spec (key -> ColumnSpec, or (shape, dtype)) that are images: uint8, [C, H, W]."""
    out = []
    for k in sorted(obs_spec):
        shape, dtype = _shape_dtype(obs_spec[k])
        if len(shape) == 3 and np.dtype(dtype) == np.uint8:
            out.append(k)
    return out


def _shape_dtype(spec) -> tuple[tuple[int, ...], np.dtype]:
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        return tuple(spec.shape), np.dtype(spec.dtype)
    if isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], int):
        shape = (spec[0],) if isinstance(spec[0], int) else tuple(spec[0])
        return shape, np.dtype(spec[1])
    return ((spec,) if isinstance(spec, int) else tuple(spec)), np.dtype(np.float32)


def random_shift(images, pad: int, generator):
    """DrQ's augmentation (Kostrikov et al. 2020): pad each image by ``pad`` pixels (replicating the border) and
    crop it back at a random offset in [0, 2 pad] per image: [B, C, H, W] -> same shape and dtype. ``pad=0``: the
    images unchanged."""
    if pad == 0:
        return images
    b, _, h, w = images.shape
    padded = torch.nn.functional.pad(images.float(), (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=images.device)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device)[None])[:, :, None]  # [B, H, 1]
    cols = (dx[:, None] + torch.arange(w, device=images.device)[None])[:, None, :]  # [B, 1, W]
    out = padded[torch.arange(b, device=images.device)[:, None, None], :, rows, cols]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).to(images.dtype)


def pixel_encoder(obs_spec: Mapping, generator: torch.Generator, feature_dim: int = 50, channels: int = 32,
                  conv_layers: int = 4) -> PixelEncoder:
    """A :class:`PixelEncoder` with its parameters drawn from ``generator`` (PyTorch's default rule for every
    conv and linear layer: U(-1/sqrt(fan_in), 1/sqrt(fan_in)))."""
    with nets.private_rng():
        enc = PixelEncoder(obs_spec, feature_dim, channels, conv_layers)
    with torch.no_grad():
        for m in enc.modules():
            if isinstance(m, torch.nn.Conv2d):
                bound = 1.0 / float(np.sqrt(m.in_channels * m.kernel_size[0] * m.kernel_size[1]))
                m.weight.uniform_(-bound, bound, generator=generator)
                if m.bias is not None:  # (every conv layer here has one)
                    m.bias.uniform_(-bound, bound, generator=generator)
    return nets.init_(enc, generator, "torch")


class FeatureEncoder(nn.Module):
    """What the encoded networks read of an encoder: dict observations (key -> [B, ...]) -> features
    [B, ``out_dim``]; ``keys`` in the order they are concatenated, ``image_keys`` those that go through a CNN."""

    keys: list[str]
    image_keys: list[str]
    out_dim: int


class PixelEncoder(FeatureEncoder):
    """Image keys (uint8 [C, H, W]) through a small CNN each (DrQ / SAC-AE: a 3x3 conv of stride 2, then
    ``conv_layers - 1`` of stride 1, ``channels`` wide, ReLU; a linear layer to ``feature_dim``, LayerNorm,
    tanh), pixels scaled to [0, 1]; the other keys flattened; everything concatenated in sorted key order:
    [B, out_dim]."""

    def __init__(self, obs_spec: Mapping, feature_dim: int = 50, channels: int = 32, conv_layers: int = 4):
        super().__init__()
        self.keys = sorted(obs_spec)
        self.image_keys = image_keys(obs_spec)
        if not self.image_keys:
            raise ValueError(f"encoder='cnn' needs an image key (uint8, shape [C, H, W]); the observation keys "
                             f"are {({k: _shape_dtype(v)[0] for k, v in obs_spec.items()})}")
        self.convs = nn.ModuleDict()
        self.heads = nn.ModuleDict()
        out = 0
        for k in self.keys:
            shape, _ = _shape_dtype(obs_spec[k])
            if k not in self.image_keys:
                out += int(np.prod(shape, dtype=np.int64))
                continue
            layers: list[nn.Module] = [nn.Conv2d(shape[0], channels, 3, stride=2), nn.ReLU()]
            for _ in range(conv_layers - 1):
                layers += [nn.Conv2d(channels, channels, 3, stride=1), nn.ReLU()]
            conv = nn.Sequential(*layers, nn.Flatten())
            try:
                with torch.no_grad():
                    flat = conv(torch.zeros(1, *shape)).shape[1]
            except RuntimeError:
                raise ValueError(f"image key {k!r} of shape {shape} is too small for {conv_layers} 3x3 conv "
                                 f"layers (at least {4 * conv_layers - 1} pixels per side)") from None
            self.convs[k] = conv
            self.heads[k] = nn.Sequential(nn.Linear(flat, feature_dim), nn.LayerNorm(feature_dim), nn.Tanh())
            out += feature_dim
        self.out_dim = out

    def forward(self, obs) -> torch.Tensor:
        parts = []
        for k in self.keys:
            x = obs[k]
            if k in self.convs:
                parts.append(self.heads[k](self.convs[k](x.float() / 255.0)))
            else:
                parts.append(x.reshape(x.shape[0], -1).float())
        return torch.cat(parts, dim=-1)


class DetachedEncoder(FeatureEncoder):
    """The actor's encoder in DrQ's convention (Kostrikov et al. 2020, arXiv 2004.13649, Sec. 3 / reference code
    ``drq.py``: ``actor.encoder.copy_conv_weights_from(critic.encoder)`` and ``encoder(obs, detach=True)``; the
    same choice as SAC-AE, Yarats et al. 2019, Sec. 6): the conv layers are the critic's, read with a
    stop-gradient (only the critic loss trains them), and the projection (linear, LayerNorm, tanh) per image key
    is the actor's own. The critic's encoder is held outside this module's parameters and state (a plain list),
    so the actor's optimizer and ``state_dict`` hold only the projection."""

    def __init__(self, source: PixelEncoder):
        super().__init__()
        self._source = [source]
        self.keys, self.image_keys, self.out_dim = source.keys, source.image_keys, source.out_dim
        self.heads = copy.deepcopy(source.heads)

    @property
    def source(self) -> PixelEncoder:
        return self._source[0]

    def forward(self, obs) -> torch.Tensor:
        parts = []
        for k in self.keys:
            x = obs[k]
            if k in self.heads:
                with torch.no_grad():
                    h = self.source.convs[k](x.float() / 255.0)
                parts.append(self.heads[k](h))
            else:
                parts.append(x.reshape(x.shape[0], -1).float())
        return torch.cat(parts, dim=-1)


def detached_encoder(source: PixelEncoder, generator: torch.Generator) -> DetachedEncoder:
    """A :class:`DetachedEncoder` over ``source``'s conv layers, its projection drawn from ``generator``."""
    return nets.init_(DetachedEncoder(source), generator, "torch")


def obs_to_torch(obs, device, expected_keys=None) -> DictObs:
    """Dict observations (key -> array [N, ...]) as a :class:`DictObs` of tensors on ``device`` (dtypes kept)."""
    if not isinstance(obs, Mapping):
        raise ValueError(f"this agent encodes dict observations (keys {expected_keys}); got {type(obs).__name__}")
    if expected_keys is not None and sorted(obs) != sorted(expected_keys):
        raise ValueError(f"observation keys {sorted(obs)} differ from the agent's {sorted(expected_keys)}")
    return DictObs({k: torch.as_tensor(np.asarray(v) if not hasattr(v, "device") else v, device=device)
                    for k, v in obs.items()})


class EncodedActor(nets.TanhGaussianActor):
    """The SAC actor over an encoder's features: pi(a | encoder(s)): a :class:`DetachedEncoder` (DrQ: the
    critic's conv layers without their gradient, the actor's own projection; ``actor_encoder="shared"``) or a
    whole CNN of its own, trained by the actor loss (``actor_encoder="own"``)."""

    encoder: FeatureEncoder

    def __init__(self, encoder: FeatureEncoder, action_dim: int, hidden: tuple[int, ...], action_low, action_high):
        super().__init__(encoder.out_dim, action_dim, hidden, action_low, action_high)
        self.encoder = encoder

    def forward(self, obs):
        return super().forward(self.encoder(obs))


class EncodedCritic(nets.EnsembleCritic):
    """The critic ensemble over an encoder's features (one encoder shared by the members; the target critic, a
    copy, has its own, Polyak-averaged with the rest)."""

    encoder: FeatureEncoder

    def __init__(self, encoder: FeatureEncoder, num_members: int, action_dim: int, hidden: tuple[int, ...],
                 layer_norm: bool = False):
        super().__init__(num_members, encoder.out_dim, action_dim, hidden, layer_norm)
        self.encoder = encoder

    def forward(self, obs, action, members=None):
        return super().forward(self.encoder(obs), action, members)


class ActorCriticSettings(Protocol):
    """The agent settings :func:`actor_critic` builds from (``SACConfig`` and its variants' configs have them)."""

    @property
    def hidden(self) -> tuple[int, ...]: ...
    @property
    def num_qs(self) -> int: ...
    @property
    def critic_layer_norm(self) -> bool: ...
    @property
    def init(self) -> str: ...
    @property
    def encoder_feature_dim(self) -> int: ...
    @property
    def encoder_channels(self) -> int: ...
    @property
    def encoder_layers(self) -> int: ...
    @property
    def actor_encoder(self) -> str: ...


def cnn_obs_spec(encoder: str, obs_spec) -> dict | None:
    """The dict observation spec (key -> ColumnSpec or (shape, dtype)) an agent's CNN encoder is built for:
    ``encoder="cnn"`` (a ValueError without ``obs_spec``), or ``"auto"`` when ``obs_spec`` has an image key; None
    when the networks read flat (concatenated) observations."""
    if encoder == "cnn" or encoder == "auto" and isinstance(obs_spec, Mapping) and image_keys(obs_spec):
        if not isinstance(obs_spec, Mapping):
            raise ValueError("encoder='cnn' needs obs_spec: the dict observation's keys -> (shape, dtype), e.g. "
                             "buffer.storage.obs_spec")
        return dict(obs_spec)
    return None


def actor_critic(obs_dim: int, action_dim: int, action_low, action_high, cfg: ActorCriticSettings,
                 generator: torch.Generator, obs_spec: Mapping | None = None
                 ) -> tuple[nets.TanhGaussianActor, nets.EnsembleCritic]:
    """SAC's actor pi(a | s) and critic ensemble Q_e(s, a), every parameter drawn from ``generator`` (on the CPU).

    Flat observations (``obs_spec`` None): MLPs over ``obs_dim`` inputs, the actor's layers drawn first, then the
    critic's (``cfg.init``'s rule). With ``obs_spec`` (:func:`cnn_obs_spec`): an :class:`EncodedActor` and an
    :class:`EncodedCritic` over a CNN per image key (``obs_dim`` unused). ``actor_encoder="shared"`` (DrQ): the
    critic's :class:`PixelEncoder`, then the actor's :class:`DetachedEncoder` projection over its conv layers;
    ``"own"``: two PixelEncoders, the actor's first. Then the actor's head, then the critic's (``cfg.init``)."""
    if obs_spec is None:
        with nets.private_rng():
            actor = nets.TanhGaussianActor(obs_dim, action_dim, cfg.hidden, action_low, action_high)
            critic = nets.EnsembleCritic(cfg.num_qs, obs_dim, action_dim, cfg.hidden, cfg.critic_layer_norm)
        return nets.init_(actor, generator, cfg.init), nets.init_(critic, generator, cfg.init)
    actor_encoder, critic_encoder = _pixel_encoders(obs_spec, cfg, generator)
    with nets.private_rng():
        encoded_actor = EncodedActor(actor_encoder, action_dim, cfg.hidden, action_low, action_high)
        encoded_critic = EncodedCritic(critic_encoder, cfg.num_qs, action_dim, cfg.hidden, cfg.critic_layer_norm)
    for part in (encoded_actor, encoded_critic):  # the heads (the encoders are drawn above, from the same stream)
        for name, module in part.named_children():
            if name != "encoder":
                nets.init_(module, generator, cfg.init)
    return encoded_actor, encoded_critic


def _pixel_encoders(obs_spec: Mapping, cfg: ActorCriticSettings,
                    generator: torch.Generator) -> tuple[FeatureEncoder, PixelEncoder]:
    """(the actor's encoder, the critic's), drawn in :func:`actor_critic`'s order."""
    def cnn() -> PixelEncoder:
        return pixel_encoder(obs_spec, generator, cfg.encoder_feature_dim, cfg.encoder_channels, cfg.encoder_layers)

    if cfg.actor_encoder == "shared":  # DrQ: one CNN, trained by the critic; the actor reads it detached
        critic_encoder = cnn()
        return detached_encoder(critic_encoder, generator), critic_encoder
    actor_encoder = cnn()  # "own": the actor's CNN, trained by the actor loss
    return actor_encoder, cnn()


# -- image Q-networks (DDQN on Atari and MinAtar: ``agent.encoder``) ---------------------------------------------
#: conv layers (out channels, kernel, stride) and the fully connected width of each image Q-network:
#: "nature": Mnih et al. 2015 (Nature 518, Methods, "Model architecture"): 32 8x8/4, 64 4x4/2, 64 3x3/1, 512 fc,
#: ReLU after each, for 84 x 84 x 4 frames; "minatar": Young & Tian 2019 (arXiv 1903.03176, Sec. 4: the DQN
#: baseline): one 16-channel 3x3/1 conv, 128 fc, for MinAtar's 10 x 10 x C planes.
IMAGE_Q_NETS = {"nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
                "minatar": (((16, 3, 1),), 128)}


def is_image_shape(shape, dtype) -> bool:
    """A flat observation that is an image (or a frame stack): [C, H, W] of uint8 (pixels) or bool (MinAtar)."""
    return len(tuple(shape)) == 3 and np.dtype(dtype) in (np.dtype(np.uint8), np.dtype(np.bool_))


def image_q_net_name(shape) -> str:
    """``agent.encoder = "auto"`` for an image [C, H, W]: the Nature CNN when it fits (at least 36 pixels a side:
    its three convs need them), else MinAtar's small one."""
    return "nature" if min(shape[1:]) >= 36 else "minatar"


class ImageScale(nn.Module):
    """uint8 pixels -> float32 in [0, 1] (divided by 255), bool planes -> 0. / 1., on the tensor's device: the
    frames travel as bytes and become floats where the network runs."""

    def __init__(self, dtype):
        super().__init__()
        self.scale = 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float() * self.scale if self.scale != 1.0 else x.float()


def image_q_net(name: str, shape, dtype, num_actions: int, generator) -> nn.Sequential:
    """Q(s, .) over images [C, H, W] (:data:`IMAGE_Q_NETS`): scale, the convs with ReLU, the fully connected layer
    with ReLU, a linear layer to ``num_actions``; every layer initialized with PyTorch's default rule from
    ``generator`` (the reference codes' default init)."""
    if name not in IMAGE_Q_NETS:
        raise ValueError(f"image Q-network must be one of {sorted(IMAGE_Q_NETS)}, got {name!r}")
    convs, fc = IMAGE_Q_NETS[name]
    shape = tuple(int(d) for d in shape)
    layers: list[nn.Module] = [ImageScale(dtype)]
    channels = shape[0]
    with nets.private_rng():
        for out, kernel, stride in convs:
            layers += [nn.Conv2d(channels, out, kernel, stride=stride), nn.ReLU()]
            channels = out
        body = nn.Sequential(*layers, nn.Flatten())
        try:
            with torch.no_grad():
                flat = body(torch.zeros(1, *shape, dtype=torch.uint8)).shape[1]
        except RuntimeError:
            raise ValueError(f"images of shape {shape} are too small for the {name!r} Q-network's convolutions "
                             f"{convs} (agent.encoder = 'minatar' for small images)") from None
        net = nn.Sequential(*body, nn.Linear(flat, fc), nn.ReLU(), nn.Linear(fc, num_actions))
    return nets.init_(net, generator, "torch")
