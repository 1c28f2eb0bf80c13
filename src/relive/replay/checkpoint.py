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

import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from relive.files import fsync_dir

FORMAT = "relive-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or corrupted."""


class DirectoryRef:
    """A directory a checkpoint refers to without copying it (a memmap buffer's column files): saved as a path
    relative to the checkpoint directory, so that a copied project (``cp -r p1 p2``, with the directory inside it)
    refers to its own copy; loaded back as an absolute :class:`~pathlib.Path`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __repr__(self) -> str:
        return f"DirectoryRef({str(self.path)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, DirectoryRef) and self.path == other.path

    # unhashable, as any class defining __eq__ alone; typeshed declares object.__hash__ a method, not Optional
    __hash__ = None  # type: ignore[assignment]


def _flatten(tree: dict, prefix: str = "", base: Path | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split a nested dict into arrays keyed by their path ('a/b/c') and a JSON tree of everything else
    (a :class:`DirectoryRef` becomes its path relative to ``base``, the checkpoint directory)."""
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, Any] = {}
    for key, value in tree.items():
        if not isinstance(key, str) or "/" in key or not key:
            raise ValueError(f"checkpoint key {key!r} must be a non-empty string without '/' (nest dicts instead)")
        if isinstance(value, dict):
            sub_arrays, sub_scalars = _flatten(value, f"{prefix}{key}/", base)
            arrays.update(sub_arrays)
            scalars[key] = sub_scalars
        elif isinstance(value, np.ndarray):
            arrays[f"{prefix}{key}"] = value
        elif isinstance(value, np.generic):
            scalars[key] = value.item()
        elif isinstance(value, DirectoryRef):
            target = value.path.absolute()
            scalars[key] = {_RELATIVE: str(target) if base is None else os.path.relpath(target, base)}
        else:
            scalars[key] = value
    return arrays, scalars


def _unflatten(arrays: dict[str, np.ndarray], scalars: dict, where: str = "checkpoint") -> dict:
    out = scalars  # (freshly parsed: changed in place)
    for path, arr in arrays.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise CheckpointError(f"{where}: array {path!r} is nested under a value that is not a dict")
        if leaf in node:
            raise CheckpointError(f"{where}: array {path!r} collides with a value of state.json")
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
    base = path.parent.absolute() / path.name
    arrays, scalars = _flatten(tree, base=base)  # everything is checked before the first byte is written
    for key, arr in arrays.items():
        if arr.dtype.hasobject:
            raise ValueError(f"array {key!r} has dtype object; checkpoints hold plain numeric arrays only")
    if ARRAY_KEYS in scalars:
        raise ValueError(f"checkpoint key {ARRAY_KEYS!r} is reserved")
    # state.json (hashed) records which arrays belong to the tree: a manifest edited to drop or rename one is refused
    state_text = json.dumps({**scalars, ARRAY_KEYS: sorted(arrays)}, indent=1, sort_keys=True, allow_nan=True)
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
        fsync_dir(partial)
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
    fsync_dir(path.parent)
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


MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists names and hashes: far below this
_RELATIVE = "$relative_to_checkpoint"  # JSON form of a DirectoryRef (see _flatten)
ARRAY_KEYS = "$arrays"  # in state.json: the keys of the tree's arrays


def _plain_name(name) -> bool:
    """A file name inside the checkpoint directory itself: no separator, no '..', nothing absolute."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\x00" not in name and name == os.path.basename(name))


def _check_manifest(where: str, manifest, kind: str | None) -> dict:
    """Refuse a manifest that is not the shape :func:`save_tree` writes; every array is a listed file."""
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where}: MANIFEST.json is not a JSON object")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{where}: not a {FORMAT} v{VERSION} checkpoint "
                              f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})")
    if kind is not None and manifest.get("kind") != kind:
        raise CheckpointError(f"{where}: holds a {manifest.get('kind')!r} checkpoint, expected {kind!r}")
    files, arrays = manifest.get("files"), manifest.get("arrays")
    if not isinstance(files, dict) or not isinstance(arrays, dict):
        raise CheckpointError(f"{where}: MANIFEST.json has no 'files' / 'arrays' maps")
    for name, entry in files.items():
        if not _plain_name(name) or name == "MANIFEST.json":
            raise CheckpointError(f"{where}: MANIFEST.json lists file {name!r}, which is not a plain file name inside "
                                  "the checkpoint directory; refusing to read it")
        size = entry.get("bytes") if isinstance(entry, dict) else None
        if (isinstance(size, bool) or not isinstance(size, int) or size < 0
                or not isinstance(entry.get("sha256"), str)):
            raise CheckpointError(f"{where}: MANIFEST.json entry of file {name!r} is not {{bytes, sha256}}")
    if "state.json" not in files:
        raise CheckpointError(f"{where}: MANIFEST.json does not list state.json")
    for name, key in arrays.items():
        if name not in files or not name.endswith(".npy"):
            raise CheckpointError(f"{where}: MANIFEST.json maps array {key!r} to {name!r}, which is not a listed .npy "
                                  "file of the checkpoint (every file read is listed and hashed)")
        if not isinstance(key, str) or not key or any(not part for part in key.split("/")):
            raise CheckpointError(f"{where}: MANIFEST.json has an invalid array key {key!r} for {name!r}")
    return manifest


def _read_file(dir_fd: int, where: str, name: str, entry: dict, check_hashes: bool) -> bytearray:
    """The bytes of one listed file, read once through the directory's descriptor (a regular file, no symbolic
    link followed), checked against the manifest's size and hash: what is checked is what is parsed."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    except FileNotFoundError:
        raise CheckpointError(f"{where}: file {name} listed in the manifest is missing") from None
    except OSError as e:  # ELOOP: a symbolic link
        raise CheckpointError(f"{where}: file {name} cannot be opened as a regular file of the checkpoint "
                              f"({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: {name} is not a regular file; refusing to read it")
        if st.st_size != entry["bytes"]:
            raise CheckpointError(f"{where}: file {name} has {st.st_size} bytes, expected {entry['bytes']}")
        data = bytearray(st.st_size)
        view, got = memoryview(data), 0
        while got < st.st_size:
            n = os.readv(fd, [view[got:]])
            if n == 0:
                break
            got += n
        if got != st.st_size or os.read(fd, 1):
            raise CheckpointError(f"{where}: file {name} changed size while it was read")
    finally:
        os.close(fd)
    if check_hashes and hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{where}: file {name} does not match its SHA-256 (corrupted)")
    return data


def _parse_npy(where: str, name: str, data: bytearray) -> np.ndarray:
    """An array from the bytes of a ``.npy`` file: header checked (no object dtype, sizes that add up to the file),
    data used in place (one copy only when it is misaligned)."""
    try:
        stream = io.BytesIO(memoryview(data)[: min(len(data), 65536)])
        major, minor = np.lib.format.read_magic(stream)
        if (major, minor) == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif (major, minor) in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unsupported .npy version {major}.{minor}")
        offset = stream.tell()
    except Exception as e:  # numpy's header parser: any failure means a malformed header
        raise CheckpointError(f"{where}: file {name} is not a valid .npy array ({e})") from None
    if dtype.hasobject or dtype.itemsize == 0 and dtype.kind not in "SUV":
        raise CheckpointError(f"{where}: file {name} holds dtype {dtype}; checkpoints hold plain numeric arrays only")
    if any(d < 0 for d in shape):
        raise CheckpointError(f"{where}: file {name} declares a negative shape {shape}")
    count = math.prod(shape)
    if offset + count * dtype.itemsize != len(data):
        raise CheckpointError(f"{where}: file {name} declares shape {shape} dtype {dtype} ({count * dtype.itemsize} "
                              f"bytes) but holds {len(data) - offset} bytes of data")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    return np.require(arr, requirements=["A", "W"])


def _read_checkpoint(path: Path, kind: str | None, check_hashes: bool) -> tuple[dict, dict, dict[str, np.ndarray]]:
    """(manifest, state.json tree, arrays by key) of one checkpoint directory, every byte read once.

    Files are opened through one descriptor of the directory, so a save that swaps a new checkpoint in while
    this reads cannot mix two saves: this either reads all files of the directory it opened or meets a file
    that the saver has deleted since (a :class:`CheckpointError`)."""
    where = str(path)
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"{where}: no checkpoint directory") from None
    except OSError as e:
        raise CheckpointError(f"{where}: cannot open the checkpoint directory ({e.strerror})") from None
    try:
        try:
            fd = os.open("MANIFEST.json", os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
        except FileNotFoundError:
            raise CheckpointError(f"{where}: MANIFEST.json is missing (the save did not finish)") from None
        except OSError as e:
            raise CheckpointError(f"{where}: MANIFEST.json cannot be opened as a regular file ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
                raise CheckpointError(f"{where}: MANIFEST.json is not a regular file of at most "
                                      f"{MAX_MANIFEST_BYTES} bytes")
            raw = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
        finally:
            os.close(fd)
        try:
            manifest = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise CheckpointError(f"{where}: MANIFEST.json is not valid JSON ({e})") from None
        manifest = _check_manifest(where, manifest, kind)
        contents = {name: _read_file(dir_fd, where, name, entry, check_hashes)
                    for name, entry in manifest["files"].items()}
    finally:
        os.close(dir_fd)
    try:
        scalars = json.loads(bytes(contents["state.json"]))
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: state.json is not valid JSON ({e})") from None
    if not isinstance(scalars, dict):
        raise CheckpointError(f"{where}: state.json is not a JSON object")
    recorded = scalars.pop(ARRAY_KEYS, None)  # (absent in checkpoints written before 2026-11-26)
    if recorded is not None and (not isinstance(recorded, list) or sorted(manifest["arrays"].values()) != recorded):
        raise CheckpointError(f"{where}: MANIFEST.json's arrays do not match the arrays state.json records "
                              "(the manifest was edited or damaged)")
    arrays = {key: _parse_npy(where, name, contents[name]) for name, key in manifest["arrays"].items()}
    return manifest, scalars, arrays


def verify(path: str | os.PathLike, *, kind: str | None = None, check_hashes: bool = True) -> dict:
    """Return the manifest of a complete checkpoint, or raise :class:`CheckpointError` saying what is wrong."""
    return _read_checkpoint(Path(path), kind, check_hashes)[0]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def load_tree(path: str | os.PathLike, *, kind: str | None = None, check_hashes: bool = True) -> dict:
    """Read a checkpoint written by :func:`save_tree`; fall back to ``<path>.previous`` if ``path`` is
    incomplete (with a warning), raise :class:`CheckpointError` if neither is complete.

    Only regular files inside the checkpoint directory that its manifest lists are read, each once, and what is
    hash-checked is what is parsed. A load that meets a save swapping a new checkpoint in (the directory it
    opened was replaced meanwhile) starts over, a few times; every load returns one whole save or an error."""
    path = Path(path)
    previous = path.with_name(path.name + ".previous")
    for attempt in range(8):
        before = _identity(path), _identity(previous)
        try:
            return _load_once(path, previous, kind, check_hashes)
        except CheckpointError:
            if attempt == 7 or (_identity(path), _identity(previous)) == before:
                raise  # nothing was swapped while reading: the checkpoint itself is at fault
    raise AssertionError("unreachable")


def _load_once(path: Path, previous: Path, kind: str | None, check_hashes: bool) -> dict:
    try:
        _, scalars, arrays = _read_checkpoint(path, kind, check_hashes)
        loaded_from = path
    except CheckpointError as err:
        if not previous.is_dir():
            raise
        try:
            _, scalars, arrays = _read_checkpoint(previous, kind, check_hashes)
        except CheckpointError:
            raise err from None
        warnings.warn(f"{err}; loading the previous complete checkpoint {previous}", stacklevel=3)
        loaded_from = previous
    tree = _unflatten(arrays, scalars, str(path))
    return _resolve_refs(tree, loaded_from.parent.absolute() / loaded_from.name)


def _resolve_refs(tree, base: Path):
    """Turn the JSON form of :class:`DirectoryRef` back into absolute paths, relative to the directory loaded."""
    if isinstance(tree, dict):
        if set(tree) == {_RELATIVE}:
            rel = tree[_RELATIVE]
            if not isinstance(rel, str) or "\x00" in rel or os.path.isabs(rel):
                raise CheckpointError(f"{base}: a directory reference {rel!r} is not a relative path")
            return Path(os.path.normpath(base / rel))
        return {k: _resolve_refs(v, base) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_resolve_refs(v, base) for v in tree]
    return tree


@contextlib.contextmanager
def loading(path: str | os.PathLike, what: str):
    """Around rebuilding objects from a loaded checkpoint's tree: any error the contents cause (a missing or
    mistyped field, a value out of range, an array of the wrong size) becomes one :class:`CheckpointError` line
    naming the checkpoint, instead of a KeyError / TypeError / IndexError traceback from deep inside."""
    try:
        yield
    except CheckpointError as e:
        if str(path) in str(e):
            raise
        raise CheckpointError(f"{path}: {e}") from None
    except KeyError as e:
        raise CheckpointError(f"{path}: {what} has no field {e.args[0] if e.args else ''!r} (incomplete or from "
                              "another relive version)") from None
    except (ValueError, TypeError, IndexError, AttributeError, AssertionError, ArithmeticError, MemoryError,
            RecursionError, RuntimeError) as e:  # (RuntimeError: torch's load_state_dict of a sampler's network)
        if type(e).__name__ == "LockedError":  # a memmap directory in use: its own message, not the contents
            raise
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not isinstance(e, ValueError):
            detail = f"{what} is malformed ({type(e).__name__}: {detail})"
        raise CheckpointError(f"{path}: {detail}") from None
