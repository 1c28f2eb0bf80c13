"""Small file helpers shared by the run directory, the replay storage, checkpoints and dataset writers."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace ``path``'s contents with ``text`` through a temporary file renamed over it: a process killed
    mid-write leaves the previous file (or none), never a truncated one -- for files that are rewritten
    (config.json on a resume that moves a run, logs cut back to a checkpoint) or whose presence means something
    (summary.json: the run finished). A symbolic link at ``path`` (or at the temporary's name) is replaced, never
    written through."""
    path = Path(path)
    replace_file(path, lambda tmp: tmp.write_text(text), tmp=path.with_name(path.name + ".tmp"))


def replace_file(path: str | os.PathLike, write: Callable[[Path], object], *, tmp: Path | None = None) -> Path:
    """Write the file ``path`` whole: ``write(tmp)`` fills a temporary file beside it (same suffix, so that writers
    that read the format off the name -- matplotlib, PyAV -- still do), which is then renamed over ``path``. The
    temporary is created by this function (``O_EXCL``, not following a link), so ``write`` writes into a new regular
    file; the rename replaces whatever entry ``path`` is -- a symbolic link, dangling or not, is replaced itself,
    never its target. A failed ``write`` removes the temporary and leaves ``path`` as it was."""
    path = Path(path)
    tmp = tmp if tmp is not None else path.with_name(f".partial-{path.name}")
    _fresh_file(tmp)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        raise
    return path


def _fresh_file(path: Path) -> None:
    """An empty regular file at ``path``, created here: whatever entry had that name (a leftover of a killed write,
    a symbolic link) is removed first, and the create refuses to follow a link or to reuse a file."""
    if path.is_symlink() or path.exists():
        path.unlink()  # (a directory there: IsADirectoryError / PermissionError, an OSError naming it)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    os.close(fd)


def refuse_existing_output(path: str | os.PathLike, overwrite: bool, flag: str = "--out") -> None:
    """An output file named on the command line (``flag``): a ValueError when something is there -- a file or a
    symbolic link (even a dangling one) unless ``overwrite``; a directory always (an output file never replaces a
    directory; nothing in it is deleted)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise ValueError(f"{flag} {path} is a directory: give the path of the file to write (a directory is never "
                         "replaced)")
    if (path.exists() or path.is_symlink()) and not overwrite:
        what = "is a symbolic link" if path.is_symlink() else "exists"
        raise ValueError(f"{flag} {path} {what}; pass --overwrite to replace it"
                         + (" (the link itself, never what it points to)" if path.is_symlink() else ""))


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
