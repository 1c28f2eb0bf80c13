"""A replay buffer served by Ray actors: M shards drawn exactly as one buffer over their union, a Reverb-style rate
limiter, checkpoints per shard and restarts (docs/scaling.md, "A replay service").

    from relive.replay.remote import RemoteReplay, SampleToInsertRatio
"""

from relive.replay.remote.client import LocalHandle, RemoteReplay, Writer, global_ids, split_ids
from relive.replay.remote.limiter import RateLimitTimeout, SampleToInsertRatio
from relive.replay.remote.shard import ReplayShard

__all__ = ["RemoteReplay", "Writer", "ReplayShard", "SampleToInsertRatio", "RateLimitTimeout", "LocalHandle",
           "global_ids", "split_ids"]
