"""Run checkpoints: everything a run needs to continue exactly where it stopped.

One directory ``<run_dir>/checkpoint`` holds each component's ``state_dict`` under its name: the agent
(networks, target networks, optimizers, its torch generator and counters), the replay buffer (rows, episode
index, sampler state, sampler RNG), the collector (the env's RNG) and the loop's counters and warm-up RNG. It is written
with ``relive.replay.checkpoint.save_tree``: ``.npy`` files + JSON + a SHA-256 manifest, nothing pickled, and a
save killed half-way leaves the previous checkpoint loadable (``checkpoint.previous``).
"""

from __future__ import annotations

from pathlib import Path

from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

CHECKPOINT = "checkpoint"
KIND = "run"


def has_checkpoint(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a checkpoint (or the previous one left by a save that was killed)."""
    path = Path(run_dir) / CHECKPOINT
    return path.exists() or path.with_name(CHECKPOINT + ".previous").exists()


def save_checkpoint(run_dir: str | Path, components: dict) -> Path:
    """Write the components' ``state_dict``s (``{"agent": ..., "buffer": ..., "collector": ..., "loop": ...}``):
    arrays, numbers, strings and nested dicts of them (RNG states included)."""
    return save_tree(Path(run_dir) / CHECKPOINT, components, kind=KIND)


def load_checkpoint(run_dir: str | Path) -> dict:
    """The components' states of the run's last checkpoint, by name."""
    try:
        tree = load_tree(Path(run_dir) / CHECKPOINT, kind=KIND)
    except CheckpointError as e:
        raise ValueError(f"cannot resume {run_dir}: {e}") from None
    if "trainer" in tree and "loop" not in tree:
        raise ValueError(f"cannot resume {run_dir}: its checkpoint was written by an earlier relive version (one "
                         f"'trainer' record instead of the components' states); start the run again")
    return tree
