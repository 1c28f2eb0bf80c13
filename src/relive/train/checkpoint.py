"""Run checkpoints: everything a run needs to continue exactly where it stopped.

One directory ``<run_dir>/checkpoint`` holds each component's ``state_dict`` under its name: the agent
(networks, target networks, optimizers, its torch generator and counters), the replay buffer (rows, episode
index, sampler state, sampler RNG), the collector (the env's RNG) and the loop's counters and warm-up RNG, and the
run's configuration as it was when the checkpoint was made (``config``: config.json's JSON), which a resume
compares with config.json (:func:`check_config`). It is written with ``relive.replay.checkpoint.save_tree``:
``.npy`` files + JSON + a SHA-256 manifest, nothing pickled, and a save killed half-way leaves the previous
checkpoint loadable (``checkpoint.previous``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from relive.agents.run_dir import CHECKPOINT
from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

KIND = "run"
CONFIG = "config"  # the tree's entry holding the run configuration (a JSON string)


def has_checkpoint(run_dir: str | Path) -> bool:
    """True when ``run_dir`` holds a checkpoint (or the previous one left by a save that was killed)."""
    path = Path(run_dir) / CHECKPOINT
    return path.exists() or path.with_name(CHECKPOINT + ".previous").exists()


def save_checkpoint(run_dir: str | Path, components: dict, config: dict | None = None) -> Path:
    """Write the components' ``state_dict``s (``{"agent": ..., "buffer": ..., "collector": ..., "loop": ...}``):
    arrays, numbers, strings and nested dicts of them (RNG states included); ``config``: the run's configuration
    (``ExperimentConfig.to_dict()``), recorded with them."""
    tree = dict(components)
    if config is not None:
        tree[CONFIG] = json.dumps(config, allow_nan=True, sort_keys=True)
    return save_tree(Path(run_dir) / CHECKPOINT, tree, kind=KIND)


def load_checkpoint(run_dir: str | Path) -> dict:
    """The components' states of the run's last checkpoint, by name."""
    try:
        tree = load_tree(Path(run_dir) / CHECKPOINT, kind=KIND)
    except CheckpointError as e:
        raise ValueError(f"cannot resume {run_dir}: {e}") from None
    if "trainer" in tree and "loop" not in tree:
        raise ValueError(f"cannot resume {run_dir}: its checkpoint was written by an earlier relive version (one "
                         f"'trainer' record instead of the components' states); start the run again")
    missing = [k for k in ("agent", "buffer", "collector", "loop", "warmup_rng") if not isinstance(tree.get(k), dict)]
    if missing:
        raise ValueError(f"cannot resume {run_dir}: its checkpoint lacks {missing} (not a run checkpoint)")
    return tree


def recorded_config(tree: dict) -> dict | None:
    """The configuration a checkpoint was made with (a dict as config.json holds it); None for a checkpoint of an
    earlier relive version, which recorded none."""
    raw = tree.get(CONFIG)
    if raw is None:
        return None
    try:
        config = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        config = None
    if not isinstance(config, dict):
        raise ValueError("its checkpoint's recorded configuration is not a JSON object")
    return config


def check_config(run_dir: str | Path, recorded: dict, current: dict, may_change: Iterable[str] = ()) -> None:
    """Refuse to resume ``run_dir`` when its config.json (``current``) differs from the configuration its checkpoint
    was made with (``recorded``) in any setting but ``may_change`` (dotted keys: where and how the run goes on);
    the message names each setting that differs with both values."""
    a, b = dict(_leaves(recorded)), dict(_leaves(current))
    keep = set(may_change)
    differ = [k for k in sorted(a.keys() | b.keys()) if k not in keep and _canon(a, k) != _canon(b, k)]
    if not differ:
        return
    shown = "; ".join(f"{k} = {_show(a, k)} in the checkpoint, {_show(b, k)} in config.json" for k in differ[:6])
    more = f" (and {len(differ) - 6} more)" if len(differ) > 6 else ""
    raise ValueError(f"cannot resume {run_dir}: its config.json does not match the configuration its checkpoint was "
                     f"made with: {shown}{more}; a resumed run continues as it was configured (only "
                     f"{', '.join(sorted(keep))} may change); start a new run for other settings")


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


_ABSENT = object()


def _canon(d: dict, key: str) -> str:
    v = d.get(key, _ABSENT)
    return "<absent>" if v is _ABSENT else json.dumps(v, allow_nan=True, sort_keys=True)  # (tuples = lists, NaN = NaN)


def _show(d: dict, key: str) -> str:
    v = d.get(key, _ABSENT)
    return "(absent)" if v is _ABSENT else json.dumps(v, allow_nan=True)
