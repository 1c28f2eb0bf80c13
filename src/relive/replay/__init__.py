"""Replay: columnar storage with a frozen offline prefix and an online ring, plus swappable samplers."""

from relive.replay.buffer import ReplayBuffer
from relive.replay.checkpoint import CheckpointError
from relive.replay.device_buffer import DeviceReplayBuffer
from relive.replay.samplers import (
    SAMPLERS,
    ARBSampler,
    BERBSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaPERReferenceSampler,
    ReaPERSampler,
    Sampler,
    UniformSampler,
    register_sampler,
)
from relive.replay.samplers.base import Draw
from relive.replay.stage import Stage
from relive.replay.storage import ColumnSpec, EpisodeIndex, EpisodeView, Storage
from relive.replay.sum_tree import MaxTree, SumTree
from relive.types import OFFLINE, ONLINE, Batch, SampleInfo, UpdateReport

__all__ = [
    "ReplayBuffer", "DeviceReplayBuffer", "Stage", "Storage", "ColumnSpec", "EpisodeIndex", "EpisodeView", "SumTree",
    "MaxTree",
    "Sampler", "UniformSampler", "PrioritizedSampler", "MixtureSampler", "ARBSampler", "ReaPERSampler",
    "ReaPERReferenceSampler", "BERBSampler", "SAMPLERS", "register_sampler", "Draw",
    "Batch", "SampleInfo", "UpdateReport", "CheckpointError", "OFFLINE", "ONLINE",
]
