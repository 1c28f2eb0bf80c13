"""Run checkpoints: everything a run needs to continue exactly where it stopped.

One directory ``<run_dir>/checkpoint`` holds the agent (networks, target networks, optimizers, its torch
generator and counters), the replay buffer (rows, episode index, sampler state, sampler RNG) and the
trainer's own state (step counters, schedule positions, warm-up RNG, the collector's env RNG). It is written
with ``relive.replay.checkpoint.save_tree``: ``.npy`` files + JSON + a SHA-256 manifest, nothing pickled, and a
save killed half-way leaves the previous checkpoint loadable (``checkpoint.previous``).
"""

from __future__ import annotations

from pathlib import Path

from relive.replay import ReplayBuffer
from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

CHECKPOINT = "checkpoint"
KIND = "run"


def has_checkpoint(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a checkpoint (or the previous one left by a save that was killed)."""
    path = Path(run_dir) / CHECKPOINT
    return path.exists() or path.with_name(CHECKPOINT + ".previous").exists()


def save_checkpoint(run_dir: str | Path, agent, buffer: ReplayBuffer, trainer_state: dict) -> Path:
    """Write agent + buffer (+ sampler) + trainer state; ``trainer_state`` holds numbers, strings and
    nested dicts of them (RNG states included)."""
    tree = {"agent": agent.state_dict(), "buffer": buffer.state_dict(), "trainer": trainer_state}
    return save_tree(Path(run_dir) / CHECKPOINT, tree, kind=KIND)


def load_checkpoint(run_dir: str | Path) -> tuple[dict, ReplayBuffer, dict]:
    """(agent state, rebuilt replay buffer, trainer state) of the run's last checkpoint."""
    try:
        tree = load_tree(Path(run_dir) / CHECKPOINT, kind=KIND)
    except CheckpointError as e:
        raise ValueError(f"cannot resume {run_dir}: {e}") from None
    return tree["agent"], ReplayBuffer.from_state_dict(tree["buffer"]), tree["trainer"]
