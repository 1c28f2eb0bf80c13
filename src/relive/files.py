"""Small file helpers shared by the run directory, the replay storage, checkpoints and dataset writers."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path``'s contents with ``text`` through a temporary file renamed over it: a process killed
    mid-write leaves the previous file (or none), never a truncated one -- for files that are rewritten
    (config.json on a resume that moves a run, logs cut back to a checkpoint) or whose presence means something
    (summary.json: the run finished)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def swap_into_place(staged: Path, target: Path) -> None:
    """Move the complete directory ``staged`` to ``target`` in one step; an existing ``target`` ends up at
    ``staged`` (deleted by the caller). Dataset writers stage a whole directory, then swap it into view."""
    if not target.exists():
        os.rename(staged, target)
    elif not _exchange(staged, target):  # no renameat2 (not Linux, old kernel or libc): two renames, the old
        old = staged.with_name(staged.name + ".old")  # directory kept (hidden) until the new one is in place
        os.rename(target, old)
        os.rename(staged, target)
        os.rename(old, staged)
    fsync_dir(target.parent)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 with RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename in it survives a crash); silently nothing where unsupported."""
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


def fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` (and the directories) before it is renamed into view."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb+") as f:
                os.fsync(f.fileno())
    for d in [path, *(p for p in path.rglob("*") if p.is_dir())]:
        fsync_dir(d)


class LockedError(RuntimeError):
    """Another process (or another object of this process) holds the lock; the message names the path and the
    holder's PID when it wrote one."""


class DirectoryLock:
    """One writer per directory: an exclusive ``flock`` on ``<directory>/<name>``, taken without waiting.

    The kernel drops the lock when its holder exits, however it exits (``kill -9`` included), so a crashed
    process never leaves a directory stuck; the lock file itself stays (it holds the last holder's PID, for the
    message) and means nothing when nobody holds the lock. ``flock`` locks belong to an open file, so two objects
    of one process that lock the same directory also exclude each other. Used by run directories (one
    ``relive train`` per run, the grid runner included) and memmap buffers (one buffer per column directory).

    >>> lock = DirectoryLock(run_dir, what="run")   # raises LockedError naming the holder
    >>> lock.release()                               # or use it as a context manager
    """

    def __init__(self, directory: str | os.PathLike, name: str = ".relive.lock", what: str = "directory"):
        import fcntl  # POSIX only; imported here so that importing relive.files works everywhere

        self.path = Path(directory) / name
        self._fd: int | None = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.read(fd, 64).decode(errors="replace").strip()
            finally:
                os.close(fd)
            who = f" by process {holder}" if holder else ""
            raise LockedError(f"{what} {Path(directory)} is in use{who} (lock {self.path}): one process writes a "
                              f"{what} at a time; wait for it to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()
