"""Datasets as one ``.npz`` of columns (``save_dataset`` / ``load_dataset``): relive's own small format (PLD's
success-filtered rollouts, the generator's cached rollouts), read with the checks of docs/guarantees.md."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from relive.data.rows import check_widths
from relive.data.trust import MAX_COMPRESSION_RATIO, SLACK_BYTES, check_allocation, one_line


def save_dataset(path: str | Path, rows: dict, **meta) -> Path:
    """A dataset as one .npz of columns (no pickle); ``meta`` values are stored as 0-d arrays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta_arrays: dict[str, Any] = {f"meta_{k}": np.asarray(v) for k, v in meta.items()}  # (not savez's flags)
    np.savez(path, **rows, **meta_arrays)
    return path


def load_dataset(path: str | Path) -> tuple[dict, dict]:
    """Columns and metadata of a ``save_dataset`` .npz. Read member by member with the checks of
    docs/guarantees.md ("Datasets"): no pickles (object arrays refused), each member's declared shape within the
    bytes the archive really holds (a deflated member expands at most ``MAX_COMPRESSION_RATIO`` times) and the
    whole within memory, before anything is allocated; every problem one ``ValueError`` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"dataset {path} does not exist")
    size = path.stat().st_size
    arrays, total = {}, 0
    try:
        with zipfile.ZipFile(path) as z:
            members = [i for i in z.infolist() if not i.is_dir()]
            for info in members:
                name = info.filename.removesuffix(".npy")
                if info.compress_size > size:
                    raise ValueError(f"dataset {path}: member {info.filename!r} declares {info.compress_size} "
                                     f"bytes, more than the {size}-byte file")
                ratio = 1 if info.compress_type == zipfile.ZIP_STORED else MAX_COMPRESSION_RATIO
                with z.open(info) as fp:
                    version = np.lib.format.read_magic(fp)
                    if version not in ((1, 0), (2, 0)):
                        raise ValueError(f"dataset {path}: member {info.filename!r} is .npy format {version}; "
                                         "1.0 and 2.0 are read")
                    header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                              else np.lib.format.read_array_header_2_0)
                    shape, _, dtype = header(fp)
                    if dtype.hasobject:
                        raise ValueError(f"dataset {path}: member {info.filename!r} holds Python objects (pickles "
                                         "are never loaded)")
                    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize if shape else dtype.itemsize
                    if nbytes > info.file_size or nbytes > info.compress_size * ratio + SLACK_BYTES:
                        raise ValueError(f"dataset {path}: member {info.filename!r} declares shape {shape} "
                                         f"({nbytes} bytes) but holds {info.file_size} bytes; refused before "
                                         "allocating")
                    total += nbytes
                    check_allocation(total, f"dataset {path}", "its arrays")
                with z.open(info) as fp:
                    arrays[name] = np.lib.format.read_array(fp, allow_pickle=False)
    except ValueError as e:
        if str(path) in str(e):
            raise
        raise ValueError(f"dataset {path}: not a readable .npz of arrays ({one_line(e)})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError,
            KeyError, TypeError, IndexError) as e:  # zipfile and numpy's errors on a damaged file do not name it
        raise ValueError(f"dataset {path}: not a readable .npz of arrays ({one_line(e)})") from None
    rows = {k: v for k, v in arrays.items() if not k.startswith("meta_")}
    meta = {}
    for k, v in arrays.items():
        if k.startswith("meta_"):
            if v.size != 1:
                raise ValueError(f"dataset {path}: metadata {k!r} has {v.size} values, expected one")
            meta[k[5:]] = v.item()
    missing = {"obs", "action", "reward", "next_obs", "terminated", "truncated"} - set(rows)
    if missing:
        raise ValueError(f"dataset {path} lacks column(s) {sorted(missing)}")
    check_widths(rows, f"dataset {path}")
    return rows, meta
