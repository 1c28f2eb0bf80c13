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


# -- hash-valid edits of every array (issue 44) ---------------------------------------------------------------------
# A checkpoint of each kind -- HER over dict observations (n-step, offline prefix, two streams), dict observations with
# deduplicated next_obs, a demonstration segment with room left (empty slots between offline and online rows), a flat
# buffer written through a Stage of two streams (PER) -- has one of its arrays edited (an entry set to an extreme or a
# neighbouring value, bytes flipped, entries swapped, reversed, cut or repeated), then re-hashed as the format
# requires. Either the load refuses it (one CheckpointError line naming the checkpoint) or the loaded buffer survives
# more of the API -- writes (a Stage's too), samples, sequences, updates, a save and a load -- without an error: nothing
# loads that fails later.
DICT = {"observation": (3,), "achieved_goal": (2,), "desired_goal": (2,)}


def _dict_rows(rng, n: int, episode: int) -> dict:
    obs = {k: rng.normal(size=(n + 1, *s)).astype(np.float32) for k, s in DICT.items()}
    end = np.arange(n) % episode == episode - 1
    return {"obs": {k: v[:-1] for k, v in obs.items()}, "next_obs": {k: v[1:] for k, v in obs.items()},
            "action": rng.normal(size=(n, 1)).astype(np.float32), "reward": rng.normal(size=n).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": end}


def _her_reward(achieved, desired, info):
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)


def _flat_rows(rng, n: int, episode: int) -> dict:
    rows = _rows(n, int(rng.integers(2**31)))
    rows["terminated"], rows["truncated"] = np.zeros(n, bool), np.arange(n) % episode == episode - 1
    return rows


def _build(kind: str, rng) -> ReplayBuffer:
    if kind == "her":
        from relive.replay.samplers.her import HindsightSampler

        buf = ReplayBuffer(60, DICT, (1,), sampler=HindsightSampler(PrioritizedSampler(), k=4, reward_fn=_her_reward),
                           n_step=3, seed=1)
        buf.add_offline(_dict_rows(rng, 12, 5))
        for i in range(6):
            buf.extend(_dict_rows(rng, 9, 4 + i % 3), stream=i % 2)
    elif kind == "dict":
        buf = ReplayBuffer(30, DICT, (1,), seed=2)
        for i in range(5):
            buf.extend(_dict_rows(rng, 8, 3 + i), stream=(0, 3)[i % 2])
    elif kind == "demo":
        buf = ReplayBuffer(40, (3,), (2,), sampler=MixtureSampler(UniformSampler(), PrioritizedSampler(),
                                                                offline_fraction=0.5), demo_capacity=8, seed=3)
        buf.add_offline(_flat_rows(rng, 6, 4))
        buf.extend(_flat_rows(rng, 30, 7))
        buf.add_demonstrations(_flat_rows(rng, 3, 3))
        buf.extend(_flat_rows(rng, 5, 7))
    else:  # "stage"
        buf = ReplayBuffer(24, (3,), (2,), sampler=PrioritizedSampler(), seed=4)
        stage = buf.stage(streams=2, rows=8)
        for _ in range(4):
            for s in range(2):
                for name, col in _flat_rows(rng, 8, 5 + s).items():
                    stage.columns[name][s] = col
            stage.commit(int(rng.integers(3, 9)))
    batch = buf.sample(6)
    buf.update(batch.info, td_error=rng.random(6) + 0.1)
    return buf


def _more(kind: str, buf: ReplayBuffer, rng, path) -> None:
    """The API after a load: every call must work on a buffer that loaded."""
    if kind == "her":
        buf.sampler.set_reward_fn(_her_reward)
    for _ in range(2):
        if kind in ("her", "dict"):
            buf.extend(_dict_rows(rng, 7, 3), stream=0)
            buf.extend(_dict_rows(rng, 4, 5), stream=9)
        elif kind == "demo":
            buf.extend(_flat_rows(rng, 9, 4))
            if buf.storage.ring_base - buf.num_offline >= 2:
                buf.add_demonstrations(_flat_rows(rng, 2, 2))
        else:
            stage = buf.stage(streams=(0, 1), rows=6)
            for s in range(2):
                for name, col in _flat_rows(rng, 6, 4).items():
                    stage.columns[name][s] = col
            stage.commit(6)
        batch = buf.sample(min(8, len(buf)))
        buf.update(batch.info, td_error=rng.random(batch.info.indices.size) + 0.1)
        if kind != "her":
            buf.sample_sequences(2, 3)
        buf.gather(batch.info.indices)
    buf.save(path)
    back = ReplayBuffer.load(path)
    if kind == "her":
        back.sampler.set_reward_fn(_her_reward)
    back.sample(min(4, len(back)))


@pytest.fixture(scope="module")
def saved_kinds():
    root = Path(tempfile.mkdtemp(prefix="relive-ckpt-arrays-"))
    out = {}
    for kind in ("her", "dict", "demo", "stage"):
        buf = _build(kind, np.random.default_rng(7))
        buf.save(root / kind, offline="copy")
        out[kind] = root / kind
    yield out
    shutil.rmtree(root, ignore_errors=True)


def _edit(arr: np.ndarray, data) -> np.ndarray:
    """One hash-valid edit of an array, drawn."""
    how = data.draw(st.sampled_from(["set", "nudge", "flip_byte", "swap", "reverse", "cut", "repeat", "fill"]))
    if arr.size == 0 or arr.ndim == 0:
        how = "repeat" if arr.ndim else "set"
    flat = arr.reshape(-1).copy()
    if how in ("set", "nudge", "flip_byte", "swap", "fill") and flat.size:
        i = data.draw(st.integers(0, flat.size - 1))
        if how == "set":
            if arr.dtype.kind == "f":
                flat[i] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -1.0, 1e30, 1e-300]))
            elif arr.dtype.kind == "b":
                flat[i] = not flat[i]
            else:
                info = np.iinfo(arr.dtype)
                flat[i] = data.draw(st.sampled_from([0, -1, 1, 2, info.max, info.min, 1 << 40]).filter(
                    lambda v: info.min <= v <= info.max))
        elif how == "nudge":
            if arr.dtype.kind == "b":
                flat[i] = not flat[i]
            else:
                flat[i] = flat[i] + data.draw(st.sampled_from([-1, 1, 2, -2]))
        elif how == "flip_byte":
            raw = flat.view(np.uint8)
            raw[data.draw(st.integers(0, raw.size - 1))] = data.draw(st.integers(0, 255))
        elif how == "swap":
            j = data.draw(st.integers(0, flat.size - 1))
            flat[i], flat[j] = flat[j], flat[i]
        else:
            flat[:] = flat[i]
        return flat.reshape(arr.shape)
    if how == "reverse":
        return arr[::-1].copy()
    if how == "cut":
        return arr[:-1].copy()
    return np.concatenate([arr, arr[-1:]]) if arr.size else np.zeros((1, *arr.shape[1:]), arr.dtype)


def _array_edit_case(saved_kinds, data) -> None:
    from tests.replay.ckpt_edit import array_keys, edit_array

    kind = data.draw(st.sampled_from(sorted(saved_kinds)), label="kind")
    work = Path(tempfile.mkdtemp(prefix="relive-ckpt-edit-"))
    try:
        path = work / "ckpt"
        shutil.copytree(saved_kinds[kind], path)
        key = data.draw(st.sampled_from(sorted(array_keys(path))), label="array")
        edit_array(path, key, lambda a: _edit(a, data))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loaded = ReplayBuffer.load(path)
        except CheckpointError as e:
            message = str(e)
            assert "\n" not in message and str(path) in message, message
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _more(kind, loaded, np.random.default_rng(data.draw(st.integers(0, 2**16))), work / "again")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_hash_valid_edit_of_any_array_is_refused_or_loads_a_buffer_that_keeps_working(saved_kinds, data):
    _array_edit_case(saved_kinds, data)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, derandomize=True, database=None,  # (the same cases in every CI run)
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_hash_valid_edit_of_any_array_long(saved_kinds, data):
    _array_edit_case(saved_kinds, data)


def test_a_priority_on_a_slot_the_sampler_does_not_draw_is_refused(saved_kinds, tmp_path):
    """Found by the long fuzzer in CI's slow stage: the online PER part's priorities reversed put mass on empty
    demonstration-segment slots; the load accepted it and the next sample drew a slot that holds no row."""
    from tests.replay.ckpt_edit import edit_array

    path = tmp_path / "ckpt"
    shutil.copytree(saved_kinds["demo"], path)
    edit_array(path, "sampler/online/priority", lambda a: a[::-1].copy())
    with pytest.raises(CheckpointError, match=r"'priority' entry \d+: slot \d+ is not a row this sampler draws"):
        ReplayBuffer.load(path)


def test_a_generation_below_a_next_obs_tail_stamp_is_refused(saved_kinds, tmp_path):
    """Found by the long fuzzer in CI's slow stage: every generation set to one slot's (lower than some slots' own)
    loaded, and a stream's recorded newest row (a next_obs tail: slot and the generation it had then) went inert;
    after more writes a rewritten slot's generation met the old stamp again, and the next save did not load."""
    from tests.replay.ckpt_edit import edit_array

    path = tmp_path / "ckpt"
    shutil.copytree(saved_kinds["dict"], path)
    edit_array(path, "storage/meta/generation", lambda a: np.full_like(a, a.reshape(-1)[10]))
    with pytest.raises(CheckpointError, match=r"'tails': slot \d+ has generation \d+, below the stamp \d+"):
        ReplayBuffer.load(path)
    shutil.rmtree(path)
    shutil.copytree(saved_kinds["dict"], path)  # the control: the checkpoint as saved loads and keeps working
    _more("dict", ReplayBuffer.load(path), np.random.default_rng(0), tmp_path / "again")


def test_an_episode_start_past_its_stream_s_clock_is_refused(saved_kinds, tmp_path):
    """Found by the long fuzzer in CI's slow stage: an episode's start moved by a multiple of the ring (position 15 ->
    25359 on a 48-row ring) maps to the same slots, so the episodes still covered the rows exactly once; the load
    accepted positions its stream never wrote, and after more writes the next save did not load."""
    from tests.replay.ckpt_edit import edit_array

    path = tmp_path / "ckpt"
    shutil.copytree(saved_kinds["her"], path)

    def move(a):
        flat = a.reshape(-1).copy()
        flat.view(np.uint8)[65] = 99  # the fuzzer's edit: record 8's start, one byte
        return flat.reshape(a.shape)

    edit_array(path, "storage/episodes/rec_start", move)
    with pytest.raises(CheckpointError, match=r"live episode \d+ ends at position \d+ of its stream, past the rows"):
        ReplayBuffer.load(path)
