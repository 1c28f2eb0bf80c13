"""Pickle-free, crash-safe checkpoint directories.

A checkpoint is a directory of ``.npy`` arrays plus ``state.json`` (numbers, strings, nested dicts) and a
``MANIFEST.json`` written last that lists every file with its size and SHA-256. ``save`` writes into
``<path>.partial``, then swaps it into place (``<path>`` -> ``<path>.previous``, ``.partial`` -> ``<path>``,
then deletes ``.previous``): at every instant one complete checkpoint exists on disk. It never deletes what it
did not write: ``<path>`` must be missing, empty or an earlier relive checkpoint of the same kind, and a
``.partial`` / ``.previous`` that relive did not write is refused, by name, before anything is written.
``load`` verifies the manifest and falls back to ``<path>.previous`` when ``<path>`` is missing or incomplete
(a process killed while saving). Arrays are read with ``allow_pickle=False``; nothing is ever unpickled.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "relive-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or corrupted."""


def _flatten(tree: dict, prefix: str = "") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split a nested dict into arrays keyed by their path ('a/b/c') and a JSON tree of everything else."""
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Any] = {}
    for key, value in tree.items():
        if "/" in key:
            raise ValueError(f"checkpoint key {key!r} must not contain '/' (nest dicts instead)")
        if isinstance(value, dict):
            sub_arrays, sub_scalars = _flatten(value, f"{prefix}{key}/")
            arrays.update(sub_arrays)
            scalars[key] = sub_scalars
        elif isinstance(value, np.ndarray):
            arrays[f"{prefix}{key}"] = value
        elif isinstance(value, np.generic):
            scalars[key] = value.item()
        else:
            scalars[key] = value
    return arrays, scalars


def _unflatten(arrays: dict[str, np.ndarray], scalars: dict) -> dict:
    out = copy.deepcopy(scalars)
    for path, arr in arrays.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = arr
    return out


def _file_name(key: str) -> str:
    return key.replace("/", "__") + ".npy"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_tree(path: str | os.PathLike, tree: dict, *, kind: str) -> Path:
    """Write ``tree`` (nested dicts of arrays and JSON scalars) as a checkpoint directory at ``path``.

    ``path`` must be missing, an empty directory or an earlier relive checkpoint of the same ``kind`` (which is
    replaced atomically); anything else is refused with a :class:`CheckpointError` naming it, before anything
    is written. ``<path>.partial`` and ``<path>.previous`` are removed only when relive wrote them."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    previous = path.with_name(path.name + ".previous")
    arrays, scalars = _flatten(tree)  # everything is checked before the first byte is written
    for key, arr in arrays.items():
        if arr.dtype.hasobject:
            raise ValueError(f"array {key!r} has dtype object; checkpoints hold plain numeric arrays only")
    state_text = json.dumps(scalars, indent=1, sort_keys=True, allow_nan=True)
    _check_replaceable(path, kind, what="checkpoint path")
    if previous.exists() or previous.is_symlink():
        _check_replaceable(previous, kind, what="previous checkpoint")
    if partial.exists() or partial.is_symlink():
        if not _is_our_partial(partial):
            raise CheckpointError(f"{partial} exists and was not written by relive; refusing to delete it "
                                  "(move it away, then save again)")
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        (partial / PARTIAL_MARKER).write_text(json.dumps({"format": FORMAT, "version": VERSION, "kind": kind}))
        files = {}
        for key, arr in arrays.items():
            name = _file_name(key)
            np.save(partial / name, arr if arr.flags.c_contiguous else arr.copy(order="C"), allow_pickle=False)
            files[name] = key
        (partial / "state.json").write_text(state_text)
        entries = {name: {"bytes": (partial / name).stat().st_size, "sha256": _sha256(partial / name)}
                   for name in [*files, "state.json"]}
        manifest = {"format": FORMAT, "version": VERSION, "kind": kind, "arrays": files, "files": entries}
        tmp = partial / "MANIFEST.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp, partial / "MANIFEST.json")
        (partial / PARTIAL_MARKER).unlink()  # complete now: the manifest marks it as relive's
        _fsync_dir(partial)
    except Exception:
        shutil.rmtree(partial, ignore_errors=True)  # an error (not a kill): leave nothing half-written
        raise
    # the swap: at every instant <path> or <path>.previous holds a complete checkpoint
    if path.exists():
        if any(path.iterdir()):
            if previous.exists():
                shutil.rmtree(previous)
            os.replace(path, previous)
        else:
            path.rmdir()  # an empty directory the caller made for the checkpoint
    os.replace(partial, path)
    _fsync_dir(path.parent)
    if previous.exists():
        shutil.rmtree(previous)
    return path


PARTIAL_MARKER = "PARTIAL.json"  # first file of a checkpoint being written; removed once the manifest is in


def _read_manifest(path: Path) -> dict | None:
    """The manifest of a directory relive wrote as a checkpoint, or None."""
    try:
        manifest = json.loads((path / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _check_replaceable(path: Path, kind: str, *, what: str) -> None:
    """Refuse (naming ``path``) unless it is missing, an empty directory, or a relive checkpoint of ``kind``
    holding only the files its manifest lists."""
    if path.is_symlink():
        raise CheckpointError(f"{what} {path} is a symbolic link; refusing to replace it")
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"{what} {path} is an existing file, not a relive checkpoint; refusing to "
                              "overwrite it (choose another path or remove it)")
    names = sorted(p.name for p in path.iterdir())
    if not names:
        return
    manifest = _read_manifest(path)
    if manifest is None:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise CheckpointError(f"{what} {path} is a directory that is not a relive checkpoint (it holds {shown}); "
                              "refusing to overwrite it (choose another path or remove it)")
    if manifest.get("kind") != kind:
        raise CheckpointError(f"{what} {path} holds a {manifest.get('kind')!r} checkpoint; refusing to replace "
                              f"it with a {kind!r} one")
    ours = {"MANIFEST.json", *manifest.get("files", {})}
    foreign = [n for n in names if n not in ours]
    if foreign:
        raise CheckpointError(f"{what} {path} is a relive checkpoint but also holds file(s) relive did not write "
                              f"({', '.join(foreign[:5])}); refusing to delete them")


def _is_our_partial(path: Path) -> bool:
    """A ``.partial`` directory left by a save that was killed: it starts with relive's marker (or is complete)."""
    if path.is_symlink() or not path.is_dir():
        return False
    if _read_manifest(path) is not None:
        return True
    try:
        marker = json.loads((path / PARTIAL_MARKER).read_text())
        return isinstance(marker, dict) and marker.get("format") == FORMAT
    except (OSError, ValueError):
        pass
    # left by a version without the marker: only the plain files a save writes, nothing else
    entries = list(path.iterdir())
    return bool(entries) and all(p.is_file() and not p.is_symlink() and (p.suffix == ".npy" or p.name in (
        "state.json", "MANIFEST.json.tmp")) for p in entries)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def verify(path: str | os.PathLike, *, kind: str | None = None, check_hashes: bool = True) -> dict:
    """Return the manifest of a complete checkpoint, or raise :class:`CheckpointError` saying what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no checkpoint directory")
    manifest_path = path / "MANIFEST.json"
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: MANIFEST.json is missing (the save did not finish)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: MANIFEST.json is not valid JSON ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a {FORMAT} v{VERSION} checkpoint "
                              f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})")
    if kind is not None and manifest.get("kind") != kind:
        raise CheckpointError(f"{path}: holds a {manifest.get('kind')!r} checkpoint, expected {kind!r}")
    for name, entry in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: file {name} listed in the manifest is missing")
        if f.stat().st_size != entry["bytes"]:
            raise CheckpointError(f"{path}: file {name} has {f.stat().st_size} bytes, expected {entry['bytes']}")
        if check_hashes and _sha256(f) != entry["sha256"]:
            raise CheckpointError(f"{path}: file {name} does not match its SHA-256 (corrupted)")
    return manifest


def load_tree(path: str | os.PathLike, *, kind: str | None = None, check_hashes: bool = True) -> dict:
    """Read a checkpoint written by :func:`save_tree`; fall back to ``<path>.previous`` if ``path`` is
    incomplete (with a warning), raise :class:`CheckpointError` if neither is complete."""
    path = Path(path)
    previous = path.with_name(path.name + ".previous")
    try:
        manifest = verify(path, kind=kind, check_hashes=check_hashes)
    except CheckpointError as err:
        if not previous.is_dir():
            raise
        try:
            manifest = verify(previous, kind=kind, check_hashes=check_hashes)
        except CheckpointError:
            raise err from None
        warnings.warn(f"{err}; loading the previous complete checkpoint {previous}", stacklevel=2)
        path = previous
    scalars = json.loads((path / "state.json").read_text())
    arrays = {key: np.load(path / name, allow_pickle=False) for name, key in manifest["arrays"].items()}
    return _unflatten(arrays, scalars)
