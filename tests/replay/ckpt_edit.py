"""Hash-valid edits of a saved checkpoint (for tests): change one array or the JSON state of a checkpoint directory,
then re-hash the manifest as the format requires, so that the load's hash check passes and only the contents checks
stand between the edit and a loaded buffer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def rehash(ckpt: Path) -> None:
    """Write every listed file's size and SHA-256 into the manifest again."""
    ckpt = Path(ckpt)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


def array_keys(ckpt: Path) -> dict[str, str]:
    """Array key ('storage/columns/obs') -> file name, for every array of a checkpoint."""
    manifest = json.loads((Path(ckpt) / "MANIFEST.json").read_text())
    return {key: name for name, key in manifest["arrays"].items()}


def read_array(ckpt: Path, key: str) -> np.ndarray:
    return np.load(Path(ckpt) / array_keys(ckpt)[key], allow_pickle=False)


def edit_array(ckpt: Path, key: str, change: Callable[[np.ndarray], np.ndarray | None]) -> None:
    """Replace the array ``key`` by ``change(a copy of it)`` (or the copy, changed in place, when it returns None)."""
    path = Path(ckpt) / array_keys(ckpt)[key]
    arr = np.load(path, allow_pickle=False).copy()
    out = change(arr)
    np.save(path, arr if out is None else out, allow_pickle=False)
    rehash(ckpt)


def edit_state(ckpt: Path, change: Callable[[dict], None]) -> None:
    """Change ``state.json`` (the tree of numbers and strings) in place with ``change(tree)``."""
    path = Path(ckpt) / "state.json"
    tree = json.loads(path.read_text())
    change(tree)
    path.write_text(json.dumps(tree))
    rehash(ckpt)
