"""The memmap backend's files: column files created with their blocks reserved, reopened from a checkpoint only as
regular files of the declared shape and dtype, and the marker (``MEMMAP_STATE``) that ties a directory's files to
the checkpoints that refer to them."""

from __future__ import annotations

import errno
import json
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from relive.files import DirectoryLock, write_text_atomic
from relive.replay.storage.layout import StorageFields

MEMMAP_STATE = "relive_memmap.json"  # in a memmap directory: the token of the checkpoint its files match
LOCK_NAME = ".relive.lock"  # the DirectoryLock's file in a memmap directory


def write_json(path: Path, obj: dict) -> None:
    write_text_atomic(path, json.dumps(obj))


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def directory_of(value) -> Path | None:
    """A directory from a storage config: a Path (a loaded checkpoint's reference), a DirectoryRef (a state_dict
    in memory) or a string (checkpoints before 2026-11-26: the absolute directory)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ValueError(f"memmap directory {value!r} is not a path")
    return Path(os.fspath(value))


def reserve(fd: int, path: Path, size: int) -> None:
    """Allocate the blocks of a column file for real (``posix_fallocate``): a sparse file on a full disk would
    end the process with SIGBUS at the first write through the map; this fails here, with an error."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: the free-space check stands
            return
        raise OSError(e.errno, f"cannot reserve {size / 1e9:.3g} GB for memmap column file {path} ({e.strerror}); "
                      "free space on its file system or choose a smaller capacity") from None


def open_column(path: Path, shape: tuple, dtype: np.dtype) -> np.memmap:
    """Reopen a column file of a memmap checkpoint: a regular file in the directory (no symbolic link followed),
    of the shape and dtype the checkpoint's config declares, its blocks reserved."""
    def refuse(why: str):
        return ValueError(f"memmap column file {path} {why}; the checkpoint refers to it instead of holding its rows")

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise refuse(f"cannot be opened as a regular file ({e.strerror})") from None
    with os.fdopen(fd, "r+b") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise refuse("is not a regular file")
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, fortran, got_dtype = read(f)
        except Exception as e:  # numpy's header parser: any failure means a malformed header
            raise refuse(f"is not a valid .npy file ({e})") from None
        if got_shape != shape or got_dtype != dtype or fortran:
            raise refuse(f"has shape {got_shape} dtype {got_dtype}, expected {shape} {dtype}")
        offset = f.tell()
        size = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if os.fstat(fd).st_size != size:
            raise refuse(f"has {os.fstat(fd).st_size} bytes, expected {size}")
        reserve(fd, path, size)
        return np.memmap(f, dtype=dtype, mode="r+", offset=offset, shape=shape)


class MemmapBackend(StorageFields):
    """The memmap backend's part of a :class:`~relive.replay.storage.Storage` (mixed in): taking the directory,
    closing it, and the checks that keep a checkpoint and the column files it refers to together."""

    @property
    def memmap_directory(self) -> Path:
        """The directory of a memmap storage's column files."""
        if self.directory is None:
            raise ValueError(f"a {self.backend!r} storage has no memmap directory")
        return self.directory

    def _open_memmap_directory(self) -> None:
        """Memmap: take the directory (one buffer writes it at a time: a lock the kernel drops when this process
        ends) and, for a new buffer, check that the file system has room for every column file before creating
        them (each file is then allocated for real: writes through the map never meet a full disk)."""
        self.directory = Path(os.path.abspath(self.memmap_directory))
        self._made: list[Path] = []  # a new buffer: what it created (the directory, the lock file), removed if refused
        if self._open_existing:
            if not self.directory.is_dir():
                raise ValueError(f"memmap directory {self.directory} does not exist; the checkpoint refers to its "
                                 "column files instead of holding its rows (copy it along with the checkpoint)")
            self._lock = DirectoryLock(self.directory, what="memmap directory")
            return
        need = sum(self.capacity * int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize + 4096
                   for s in self.specs.values())
        probe = self.directory  # (before anything is created: a refused buffer leaves nothing behind)
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        fs = os.statvfs(probe)
        free = fs.f_bavail * fs.f_frsize
        if need > free:
            raise ValueError(f"memmap buffer of capacity {self.capacity} needs {need / 1e9:.3g} GB of column files in "
                             f"{self.directory}, but its file system has {free / 1e9:.3g} GB free; choose a smaller "
                             "capacity or another directory")
        missing = [d for d in (self.directory, *self.directory.parents) if not d.exists()]
        self.directory.mkdir(parents=True, exist_ok=True)
        self._made = missing[::-1]  # (outermost first; removed innermost first)
        lock_file = self.directory / LOCK_NAME
        new_lock = not (lock_file.exists() or lock_file.is_symlink())
        self._lock = DirectoryLock(self.directory, name=LOCK_NAME, what="memmap directory")
        if new_lock:
            self._made.append(lock_file)

    def _give_up_new_directory(self) -> None:
        """A new buffer refused after its directory was taken: remove the lock file and the directories it created
        (if they are empty), then give the directory up."""
        for path in reversed(self._made):
            try:
                path.unlink() if path.name == LOCK_NAME else path.rmdir()
            except OSError:  # (not empty: something else is there; leave it)
                break
        self._made = []
        if self._lock is not None:
            self._lock.release()

    def close(self) -> None:
        """Memmap: flush the column files and give the directory up (another buffer may then load it); the
        storage refuses writes afterwards. Nothing to do for the other backends."""
        if self._lock is not None and self._lock.held:
            for arr in self.columns.values():
                arr.flush()
            self._lock.release()

    def _check_open(self) -> None:
        if self._lock is not None and not self._lock.held:
            raise ValueError(f"this memmap buffer was closed (its directory {self.directory} was given up); load it "
                             "again from a checkpoint")

    def claim_checkpoint(self, path: str | os.PathLike, *, loading: bool) -> None:
        """Memmap: record that the checkpoint at ``path`` refers to this directory's files (``loading=False``,
        after a save), or check, when it is loaded, that it is not a copy of another checkpoint that refers to the
        same files: a checkpoint copied without its column directory (which stayed where it was) would make this
        buffer write into the other checkpoint's rows, so it is refused, naming both.

        Each recorded checkpoint is kept with its directory's identity (device and inode): a checkpoint moved
        elsewhere keeps it, a copy gets a new one. So a moved checkpoint is recognised as the one saved here wherever
        it is now, and loading a copy first (while the original was moved away, out of sight) does not make the
        original "a copy" afterwards: loads add to the record, never replace it."""
        if self.backend != "memmap":
            return
        marker_path = self.memmap_directory / MEMMAP_STATE
        marker = read_json(marker_path)
        me = os.path.abspath(path)
        mine = _identity(me)
        entries = [e for e in (_entry(c) for c in marker.get("checkpoints", [])) if e is not None]
        if loading:
            known = [e for e in entries if mine is not None and e["id"] == mine] or [e for e in entries
                                                                                   if e["path"] == me]
            if not known:  # not a checkpoint saved (or loaded) here: a copy, refused while its original exists
                others = [e["path"] for e in entries if Path(e["path"], "MANIFEST.json").is_file()
                          and (e["id"] is None or _identity(e["path"]) == e["id"])]
                if others:
                    raise ValueError(f"checkpoint {me} refers to memmap directory {self.directory}, whose rows belong "
                                     f"to checkpoint {others[0]} (saved there): {me} is a copy made without the "
                                     f"column files, and extending it would change {others[0]}'s rows. Copy the "
                                     "memmap directory along with the checkpoint (at the same place relative to "
                                     "it), or move the checkpoint instead of copying it")
        # this checkpoint, at its path and identity now (a save's swap gives the path a new directory)
        kept = [e for e in entries if e["path"] != me and (mine is None or e["id"] != mine)]
        updated = [*kept, {"path": me, "id": mine}]
        if updated != entries:
            write_json(marker_path, marker | {"checkpoints": updated, "directory": str(self.directory)})

    def _touch(self) -> None:
        """Memmap: the first change after a save marks the files as changed, so the checkpoint that refers to them
        is refused from now on (a small file, written once per checkpoint interval)."""
        if self.backend == "memmap" and self._memmap_clean:
            write_json(self.memmap_directory / MEMMAP_STATE, {"token": None, "changed_after_save": True})
            self._memmap_clean = False

    def _check_memmap_files(self, saved) -> None:
        """A state that refers to this buffer's memmap column files: they must be unchanged since its save (the token
        in MEMMAP_STATE); a copied or moved directory is adopted as this buffer's own."""
        if self.backend != "memmap":
            raise ValueError("storage state 'memmap': the checkpoint refers to memmap column files but its config "
                             f"says backend {self.backend!r}")
        marker = read_json(self.memmap_directory / MEMMAP_STATE)
        token = saved.get("token") if isinstance(saved, Mapping) else None
        if not isinstance(token, str) or marker.get("token") != token:
            raise ValueError(f"memmap directory {self.directory} was changed after this checkpoint was saved "
                             "(rows written since, or by another run): the rows it refers to are gone. Resume "
                             "from the checkpoint saved last, or save with a RAM buffer to copy rows")
        self._memmap_token = token
        recorded = marker.get("directory")
        if isinstance(recorded, str) and recorded != str(self.directory):
            warnings.warn(f"memmap directory {self.directory} is a copy of {recorded} (or was moved from there): "
                          f"this buffer writes its own column files in {self.directory}, never {recorded}'s",
                          stacklevel=3)  # (the caller of load_state_dict)
            write_json(self.memmap_directory / MEMMAP_STATE, marker | {"directory": str(self.directory),
                                                                  "checkpoints": []})


def _identity(path) -> list[int] | None:
    """A directory's (device, inode): kept by a move, new for a copy; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [int(st.st_dev), int(st.st_ino)]


def _entry(value) -> dict | None:
    """A recorded checkpoint: ``{"path", "id"}`` (markers before issue 44: a bare path, identity unknown)."""
    if isinstance(value, str):
        return {"path": value, "id": None}
    if isinstance(value, Mapping) and isinstance(value.get("path"), str):
        ident = value.get("id")
        ok = isinstance(ident, list) and len(ident) == 2 and all(isinstance(x, int) for x in ident)
        return {"path": value["path"], "id": ident if ok else None}
    return None
