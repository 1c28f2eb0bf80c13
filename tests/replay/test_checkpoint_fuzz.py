"""Fuzzing the checkpoint reader with mutated files (issue 27): the manifest's JSON, state.json, the .npy headers
and bytes, truncations -- with or without re-hashing the manifest so that the hash check passes and the parsers and
``load_state_dict`` validation see the damage. Every outcome is a load (equal to the save when the hashes were left
alone) or one CheckpointError line naming the checkpoint; never another exception type."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.checkpoint import CheckpointError
from tests.replay.test_fuzz import _same

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _rows(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32), "action": rng.normal(size=(n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
            "terminated": np.arange(n) % 9 == 8, "truncated": np.arange(n) % 5 == 4}


@pytest.fixture(scope="module")
def original():
    root = Path(tempfile.mkdtemp(prefix="relive-ckpt-fuzz-"))
    buf = ReplayBuffer(40, (3,), (2,), sampler=MixtureSampler(UniformSampler(), PrioritizedSampler(),
                                                             offline_fraction=0.3), seed=4)
    buf.add_offline(_rows(8, 0))
    buf.extend(_rows(12, 1), stream=0)
    buf.extend(_rows(9, 2), stream=3)
    batch = buf.sample(6)
    buf.update(batch.info, td_error=np.linspace(0.5, 3.0, 6))
    buf.save(root / "ckpt")
    yield root / "ckpt", buf.state_dict()
    shutil.rmtree(root, ignore_errors=True)


def _paths(tree, prefix=()):
    """Every (path to a value) of a JSON tree, containers included."""
    yield prefix
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _paths(v, (*prefix, i))


def _mutate_json(tree, data):
    paths = [p for p in _paths(tree) if p]
    if not paths:
        return data.draw(json_value)
    path = data.draw(st.sampled_from(paths))
    node = tree
    for k in path[:-1]:
        node = node[k]
    if isinstance(node, dict) and data.draw(st.booleans()):
        del node[path[-1]]
    else:
        node[path[-1]] = data.draw(json_value)
    return tree


def _rehash(ckpt: Path) -> None:
    try:
        manifest = json.loads((ckpt / "MANIFEST.json").read_bytes())
    except ValueError:  # (the mutation broke the manifest itself: nothing to re-hash)
        return
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return
    for name, entry in manifest["files"].items():
        f = ckpt / str(name)
        if isinstance(entry, dict) and f.is_file() and f.parent == ckpt:
            data = f.read_bytes()
            entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest))


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_checkpoint_loads_as_saved_or_fails_with_one_checkpoint_error(original, data):
    src, saved_state = original
    work = Path(tempfile.mkdtemp(prefix="relive-ckpt-mut-"))
    try:
        ckpt = work / "ckpt"
        shutil.copytree(src, ckpt)
        files = sorted(p.name for p in ckpt.iterdir())
        kind = data.draw(st.sampled_from(["manifest", "state", "npy_header", "npy_bytes", "truncate"]))
        rehash = kind != "manifest" and data.draw(st.booleans())
        if kind in ("manifest", "state"):
            name = "MANIFEST.json" if kind == "manifest" else "state.json"
            tree = _mutate_json(json.loads((ckpt / name).read_text()), data)
            (ckpt / name).write_text(json.dumps(tree))
        else:
            name = data.draw(st.sampled_from([f for f in files if f.endswith(".npy")] if kind != "truncate"
                                             else files))
            raw = bytearray((ckpt / name).read_bytes())
            header_end = raw.index(b"\n") + 1 if b"\n" in raw else len(raw)
            if kind == "truncate":
                raw = raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]
            else:
                lo, hi = (0, header_end) if kind == "npy_header" else (header_end, len(raw))
                if hi > lo:
                    for _ in range(data.draw(st.integers(1, 4))):
                        raw[data.draw(st.integers(lo, hi - 1))] = data.draw(st.integers(0, 255))
            (ckpt / name).write_bytes(bytes(raw))
        if rehash:
            _rehash(ckpt)
        rows = {"obs": None}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = ReplayBuffer.load(ckpt, offline_rows=lambda _id: rows)
        except CheckpointError as e:
            message = str(e)
            assert "\n" not in message and str(ckpt) in message, message
            return
        if not rehash:  # the hashes vouch for the bytes: what loads is the save (or the mutation changed nothing)
            assert _same(loaded.state_dict(), saved_state)
        else:  # the contents passed validation: a buffer that works
            assert len(loaded) == loaded.storage.size
            loaded.sample(4)
            p = loaded.sampler.probabilities()
            assert np.isfinite(p).all() and (p >= 0).all()
    finally:
        shutil.rmtree(work, ignore_errors=True)
