"""Small file helpers shared by the run directory and the replay storage."""

from __future__ import annotations

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
