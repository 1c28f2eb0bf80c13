"""What a dataset reader may open and allocate (docs/guarantees.md, "Datasets").

A dataset is outside input: every file a reader opens is resolved (symlinks followed) and must lie under the
dataset's own directory; HDF5 features that fill an array from other files (external links, external storage,
virtual datasets) are refused; sizes a file declares are checked against the bytes it really holds and against
this machine's memory before anything is allocated; path templates accept only known fields with short numeric
formats. Every refusal is one ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
import re
import string
from pathlib import Path

import numpy as np

# The most an HDF5 filter pipeline may expand stored bytes: deflate's limit is about 1032:1 (LZF, shuffle and
# fletcher32 expand less). A dataset declaring more bytes than its stored bytes allow is refused unread.
MAX_COMPRESSION_RATIO = 1100
# Declared bytes a dataset may hold beyond what the ratio allows (the header of a small or empty dataset).
SLACK_BYTES = 1 << 16
# Template fields: a name from the reader's list, an optional format of at most two digits of width (03d, 06d).
_SPEC = re.compile(r"0?\d{0,2}d?")
MAX_TEMPLATE_CHARS = 4096


def one_line(e: BaseException) -> str:
    """A foreign exception as one line: its type and its message, whitespace collapsed."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def memory_limit() -> int:
    """Bytes a dataset reader may allocate in all: this machine's physical memory."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: a bound that still stops absurd sizes
        return 1 << 40


def check_allocation(nbytes: int, where, what: str) -> None:
    """Refuse before allocating ``nbytes`` that this machine's memory cannot hold."""
    limit = memory_limit()
    if nbytes > limit:
        raise ValueError(f"{where}: {what} would take {nbytes / 2**30:.3g} GiB, more than this machine's memory "
                         f"({limit / 2**30:.3g} GiB); refused before allocating")


def inside(root: str | Path, path: str | Path, what: str = "file") -> Path:
    """``path`` (relative to ``root``, or absolute) resolved with every symlink followed; refused unless it lies
    under ``root`` (itself resolved)."""
    base = Path(root).resolve()
    target = Path(root) / path
    try:
        real = target.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise ValueError(f"{root}: {what} {path} cannot be resolved ({one_line(e)})") from None
    if real != base and base not in real.parents:
        raise ValueError(f"{root}: {what} {path} resolves to {real}, outside the dataset directory; a dataset "
                         "reads only files under its own directory")
    return real


def format_template(template, fields: dict, where, name: str) -> str:
    """A path template (LeRobot's ``video_path``) filled in: only the fields in ``fields``, no attribute or index
    access, no conversion, formats of at most two digits of width; anything else is refused."""
    if not isinstance(template, str) or len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(f"{where}: {name} must be a path template string of at most {MAX_TEMPLATE_CHARS} "
                         f"characters, got {type(template).__name__}")
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"{where}: {name} {template!r} is not a valid template ({one_line(e)})") from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in fields or conversion is not None or not _SPEC.fullmatch(spec or ""):
            raise ValueError(f"{where}: {name} {template!r} has field {{{field}{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}}; allowed: {sorted(fields)} with an optional format "
                             "such as 03d (at most two digits of width)")
    try:
        return template.format(**fields)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise ValueError(f"{where}: {name} {template!r} cannot be filled with {fields} ({one_line(e)})") from None


def read_json_object(path: str | Path) -> dict:
    """A JSON file that must hold an object (a dataset's metadata), or one ValueError naming the file."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({one_line(e)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: not a JSON object")
    return value


def open_hdf5(path: str | Path):
    """``h5py.File(path, "r")`` checked by :func:`check_hdf5` before the caller reads anything (closed again on a
    refusal); an unreadable file is one ValueError naming it."""
    import h5py  # (optional: relive[data])

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"{path}: not a readable HDF5 file ({one_line(e)})") from None
    try:
        check_hdf5(f, path)
    except BaseException:
        f.close()
        raise
    return f


def check_hdf5(f, path: str | Path) -> None:
    """Every link and dataset of an open ``h5py.File`` before anything is read: no external links, no external
    storage, no virtual datasets (each fills data from another file); every dataset's declared size within what
    its stored bytes can hold (its storage inside the file, expanded at most ``MAX_COMPRESSION_RATIO`` times by
    its filters, exactly once without filters); the whole within this machine's memory."""
    import h5py  # (optional: relive[data])

    path = Path(path)
    file_size = path.stat().st_size
    total = 0

    def visit(raw: bytes, link_type: int) -> None:
        nonlocal total
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path}: an object name is not UTF-8 ({raw[:40]!r}); a damaged file") from None
        if link_type == h5py.h5l.TYPE_EXTERNAL:
            link = f.get(name, getlink=True)
            raise ValueError(f"{path}: {name!r} is an HDF5 external link to {link.filename}:{link.path}; datasets "
                             "read only their own file")
        if link_type == h5py.h5l.TYPE_SOFT:
            return  # a name for another object of this file (visited under its own name)
        if link_type != h5py.h5l.TYPE_HARD:
            raise ValueError(f"{path}: {name!r} is an HDF5 link of an unsupported kind (type {link_type})")
        obj = f[name]
        if not isinstance(obj, h5py.Dataset):
            return
        if obj.is_virtual:
            raise ValueError(f"{path}: dataset {name!r} is an HDF5 virtual dataset (its data lives in other "
                             "files); refused")
        if obj.external:
            raise ValueError(f"{path}: dataset {name!r} uses HDF5 external storage ({obj.external[0][0]!r}, ...): "
                             "its data lives in another file; refused")
        declared = int(np.prod(obj.shape, dtype=object)) * obj.dtype.itemsize if obj.shape else obj.dtype.itemsize
        stored = int(obj.id.get_storage_size())
        plist = obj.id.get_create_plist()
        if plist.get_layout() == h5py.h5d.CONTIGUOUS and stored:
            end = int(obj.id.get_offset() or 0) + stored
            if end > file_size:
                raise ValueError(f"{path}: dataset {name!r} declares {stored} bytes ending at byte {end}, past the "
                                 f"end of the {file_size}-byte file (truncated or crafted)")
        if stored > file_size:
            raise ValueError(f"{path}: dataset {name!r} declares {stored} stored bytes, more than the {file_size}-byte "
                             "file holds")
        ratio = MAX_COMPRESSION_RATIO if plist.get_nfilters() else 1
        if declared > stored * ratio + SLACK_BYTES:
            raise ValueError(f"{path}: dataset {name!r} declares shape {obj.shape} ({declared} bytes) but stores only "
                             f"{stored} bytes{' (compressed)' if ratio > 1 else ''}; refused before allocating")
        total += declared

    try:
        links: list = []
        # raw names and link types (h5py's visititems_links decodes names and looks links up inside its callback,
        # where a damaged name becomes a SystemError); checked after the walk
        f.id.links.visit(lambda name, info: links.append((name, info.type)), info=True)
        for name, link_type in links:
            visit(name, link_type)
    except ValueError as e:
        if str(e).startswith(str(path)):  # a refusal above
            raise
        raise ValueError(f"{path}: not a readable HDF5 file ({one_line(e)})") from None
    except (OSError, RuntimeError, KeyError, TypeError, AttributeError, SystemError) as e:  # a damaged header
        raise ValueError(f"{path}: not a readable HDF5 file ({one_line(e)})") from None
    check_allocation(total, path, "its datasets")
