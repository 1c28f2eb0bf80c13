"""Checkpoints that cannot lie (issue 27): a checkpoint reads only the files it lists, inside its own directory, each
read once and hash-checked as read (items 2, 7); a memmap buffer owns its directory (item 8) and reserves its disk
space (item 9); loaded state is validated like input (item 11); malformed contents give one CheckpointError line."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import relive.replay.storage.storage as storage_mod
from relive.files import LockedError
from relive.replay import PrioritizedSampler, ReplayBuffer
from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

OBS, ACT = (3,), (2,)


def rows(n: int, seed: int = 0, episode: int = 5) -> dict:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return {"obs": rng.normal(size=(n, *OBS)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(n, *ACT)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, *OBS)).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": t % episode == episode - 1}


def _manifest(path: Path) -> dict:
    return json.loads((path / "MANIFEST.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (path / "MANIFEST.json").write_text(json.dumps(manifest))


def _entry(file: Path) -> dict:
    data = file.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture
def saved(tmp_path):
    buf = ReplayBuffer(32, OBS, ACT, sampler=PrioritizedSampler(), seed=1)
    buf.extend(rows(20))
    buf.save(tmp_path / "ckpt")
    return tmp_path / "ckpt"


# -- item 2: nothing outside the checkpoint, nothing unlisted ------------------------------------------------------
def test_an_array_the_manifest_maps_but_does_not_list_is_refused(saved):
    np.save(saved / "extra.npy", np.arange(3))
    m = _manifest(saved)
    m["arrays"]["extra.npy"] = "extra"  # never hash-checked before: now every array is a listed file
    _write_manifest(saved, m)
    with pytest.raises(CheckpointError, match="extra.npy.*not a listed .npy file"):
        load_tree(saved)


@pytest.mark.parametrize("how", ["absolute", "dotdot"])
def test_a_file_name_outside_the_checkpoint_is_refused_even_with_the_right_hash(saved, tmp_path, how):
    outside = tmp_path / "outside.npy"
    np.save(outside, np.full(20, 7.0, np.float32))
    name = str(outside) if how == "absolute" else "../outside.npy"
    m = _manifest(saved)
    key = m["arrays"].pop("storage__columns__reward.npy")
    del m["files"]["storage__columns__reward.npy"]
    m["arrays"][name] = key
    m["files"][name] = _entry(outside)
    _write_manifest(saved, m)
    with pytest.raises(CheckpointError, match="not a plain file name inside the checkpoint directory"):
        ReplayBuffer.load(saved)


def test_a_listed_file_that_is_a_symlink_out_of_the_checkpoint_is_not_followed(saved, tmp_path):
    target = saved / "storage__columns__reward.npy"
    outside = tmp_path / "reward_elsewhere.npy"
    shutil.copy(target, outside)  # same bytes: the hash matches, only the link is wrong
    target.unlink()
    target.symlink_to(outside)
    with pytest.raises(CheckpointError, match="storage__columns__reward.npy cannot be opened as a regular file"):
        ReplayBuffer.load(saved)


def test_a_memmap_column_file_that_is_a_symlink_is_not_followed(tmp_path):
    buf = ReplayBuffer(16, OBS, ACT, backend="memmap", directory=tmp_path / "p" / "mm")
    buf.extend(rows(10))
    buf.save(tmp_path / "p" / "ckpt")
    buf.close()
    col = tmp_path / "p" / "mm" / "reward.npy"
    shutil.copy(col, tmp_path / "reward.npy")
    col.unlink()
    col.symlink_to(tmp_path / "reward.npy")
    with pytest.raises(CheckpointError, match="reward.npy cannot be opened as a regular file"):
        ReplayBuffer.load(tmp_path / "p" / "ckpt")


# -- item 7: a load never mixes two saves ---------------------------------------------------------------------------
def test_loads_while_another_thread_saves_in_a_loop_are_each_one_whole_save(tmp_path):
    path = tmp_path / "ckpt"
    save_tree(path, {"i": 0, "a": np.zeros(1 << 17), "b": np.zeros(1 << 17)}, kind="t")
    stop = threading.Event()
    errors: list[BaseException] = []

    def saver():
        i = 0
        try:
            while not stop.is_set():
                i += 1
                save_tree(path, {"i": i, "a": np.full(1 << 17, float(i)), "b": np.full(1 << 17, float(i))}, kind="t")
        except BaseException as e:  # (reported by the main thread)
            errors.append(e)

    thread = threading.Thread(target=saver, daemon=True)
    thread.start()
    loaded = refused = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a load may fall back to checkpoint.previous: still one whole save)
            for _ in range(300):
                try:
                    tree = load_tree(path, kind="t")
                except CheckpointError:
                    refused += 1
                    continue
                loaded += 1
                i = tree["i"]
                assert (tree["a"] == i).all() and (tree["b"] == i).all(), f"load {loaded} mixed save {i} with another"
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert loaded > 0


# -- item 8: one buffer per memmap directory, a copied project is its own ------------------------------------------
def test_two_buffers_cannot_load_one_memmap_checkpoint_at_once(tmp_path):
    buf = ReplayBuffer(16, OBS, ACT, backend="memmap", directory=tmp_path / "mm")
    buf.extend(rows(10))
    buf.save(tmp_path / "ckpt")
    buf.close()
    first = ReplayBuffer.load(tmp_path / "ckpt")
    with pytest.raises(LockedError, match="memmap directory .*mm is in use"):
        ReplayBuffer.load(tmp_path / "ckpt")
    with pytest.raises(LockedError):  # nor a new buffer in it
        ReplayBuffer(16, OBS, ACT, backend="memmap", directory=tmp_path / "mm")
    first.close()
    with pytest.raises(ValueError, match="was closed"):
        first.extend(rows(2))
    ReplayBuffer.load(tmp_path / "ckpt").close()  # given up: loadable again


def test_a_copied_project_writes_its_own_column_files(tmp_path):
    p1 = tmp_path / "p1"
    buf = ReplayBuffer(16, OBS, ACT, seed=2, backend="memmap", directory=p1 / "replay")
    buf.extend(rows(10))
    buf.save(p1 / "ckpt")
    buf.close()
    before = {f.name: f.read_bytes() for f in (p1 / "replay").glob("*.npy")}
    shutil.copytree(p1, tmp_path / "p2")
    with pytest.warns(UserWarning, match="is a copy of"):
        p2 = ReplayBuffer.load(tmp_path / "p2" / "ckpt")
    assert p2.storage.directory == tmp_path / "p2" / "replay"
    p2.extend(rows(12, seed=5))
    p2.close()
    assert {f.name: f.read_bytes() for f in (p1 / "replay").glob("*.npy")} == before  # p1 untouched
    ReplayBuffer.load(p1 / "ckpt").close()  # and its checkpoint still loads


def test_a_checkpoint_copied_without_its_column_files_is_refused_naming_both(tmp_path):
    buf = ReplayBuffer(16, OBS, ACT, backend="memmap", directory=tmp_path / "shared_mm")
    buf.extend(rows(10))
    buf.save(tmp_path / "p1" / "ckpt")
    buf.close()
    shutil.copytree(tmp_path / "p1", tmp_path / "p2")  # the column directory stays where it is
    with pytest.raises(CheckpointError, match=r"p2/ckpt is a copy made without the column files.*p1/ckpt"):
        ReplayBuffer.load(tmp_path / "p2" / "ckpt")
    ReplayBuffer.load(tmp_path / "p1" / "ckpt").close()  # the original is fine (and the lock was given back)
    shutil.rmtree(tmp_path / "p1")  # moved rather than copied: p2 takes the files over
    ReplayBuffer.load(tmp_path / "p2" / "ckpt").close()


def test_a_moved_original_is_not_called_a_copy_after_its_copy_loaded(tmp_path):
    """Issue 44: copy a checkpoint (sharing the column directory), move the original away, load the copy: the copy
    took the record over, and the moved original was then refused as "a copy". A checkpoint is known by its
    directory's identity, which a move keeps."""
    buf = ReplayBuffer(16, OBS, ACT, backend="memmap", directory=tmp_path / "shared_mm")
    buf.extend(rows(10))
    buf.save(tmp_path / "p1" / "ckpt")
    buf.close()
    shutil.copytree(tmp_path / "p1", tmp_path / "p2")
    os.rename(tmp_path / "p1", tmp_path / "moved")  # the original, moved: out of sight at its recorded path
    ReplayBuffer.load(tmp_path / "p2" / "ckpt").close()  # (its original cannot be found: the copy loads)
    ReplayBuffer.load(tmp_path / "moved" / "ckpt").close()  # the original is still the original


def test_a_memmap_buffer_refused_for_its_size_leaves_nothing_behind(tmp_path, monkeypatch):
    """Issue 44: the refusal left the directory it made and its ``.relive.lock``."""
    real = os.statvfs

    class Small:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, (20 << 20) // st.f_frsize  # 20 MB free

    monkeypatch.setattr(storage_mod.os, "statvfs", lambda p: Small(real(p)))
    with pytest.raises(ValueError, match="GB free"):
        ReplayBuffer(10_000_000, (1000,), ACT, backend="memmap", directory=tmp_path / "new" / "mm")
    assert not (tmp_path / "new").exists()
    (tmp_path / "there").mkdir()
    with pytest.raises(ValueError, match="GB free"):
        ReplayBuffer(10_000_000, (1000,), ACT, backend="memmap", directory=tmp_path / "there")
    assert list((tmp_path / "there").iterdir()) == []


def test_a_memmap_buffer_whose_reservation_fails_leaves_no_lock_file(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    (tmp_path / "mm").mkdir()
    monkeypatch.setattr(storage_mod.os, "posix_fallocate", no_space)
    with pytest.raises(OSError, match="cannot reserve"):
        ReplayBuffer(100, OBS, ACT, backend="memmap", directory=tmp_path / "mm")
    assert list((tmp_path / "mm").iterdir()) == []
    monkeypatch.undo()
    ReplayBuffer(100, OBS, ACT, backend="memmap", directory=tmp_path / "mm").close()


# -- item 9: a full disk is an error at creation, never a SIGBUS later ----------------------------------------------
def test_memmap_refuses_a_buffer_larger_than_the_free_space(tmp_path, monkeypatch):
    real = os.statvfs

    class Small:
        def __init__(self, st):
            self.f_frsize, self.f_bavail = st.f_frsize, (20 << 20) // st.f_frsize  # 20 MB free

    monkeypatch.setattr(storage_mod.os, "statvfs", lambda p: Small(real(p)))
    with pytest.raises(ValueError, match=r"needs .* GB of column files in .*mm.* GB free"):
        ReplayBuffer(10_000_000, (1000,), ACT, backend="memmap", directory=tmp_path / "mm")
    assert not list((tmp_path / "mm").glob("*.npy"))
    ReplayBuffer(100, OBS, ACT, backend="memmap", directory=tmp_path / "mm").close()  # small fits; lock released


def test_memmap_column_files_are_allocated_for_real(tmp_path):
    buf = ReplayBuffer(4096, (64,), ACT, backend="memmap", directory=tmp_path / "mm")
    obs = tmp_path / "mm" / "obs.npy"
    size = obs.stat().st_size
    assert size > 4096 * 64 * 4
    assert obs.stat().st_blocks * 512 >= size, "sparse column file: a full disk would SIGBUS on a later write"
    buf.close()


def test_a_failed_reservation_is_an_error_and_leaves_no_files(tmp_path, monkeypatch):
    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(storage_mod.os, "posix_fallocate", no_space)
    with pytest.raises(OSError, match="cannot reserve .* for memmap column file .*obs.npy"):
        ReplayBuffer(100, OBS, ACT, backend="memmap", directory=tmp_path / "mm")
    assert not list((tmp_path / "mm").glob("*.npy"))


# -- item 11: hashes that match do not make contents right ----------------------------------------------------------
def _resaved(tmp_path, sampler, change, n=20, streams=1) -> Path:
    """A checkpoint of a small buffer, loaded, changed by ``change(tree)`` and saved again (so its hashes match)."""
    buf = ReplayBuffer(32, OBS, ACT, sampler=sampler, seed=1)
    for i in range(streams):
        buf.extend(rows(n, seed=i), stream=i)
    batch = buf.sample(8)
    buf.update(batch.info, td_error=np.linspace(0.1, 2.0, 8))
    buf.save(tmp_path / "good")
    tree = load_tree(tmp_path / "good")
    change(tree)
    save_tree(tmp_path / "bad", tree, kind="replay_buffer")
    return tmp_path / "bad"


def _priority(value):
    def change(tree):
        tree["sampler"]["priority"][3] = value
    return change


@pytest.mark.parametrize(("change", "match"), [
    (_priority(np.nan), r"'priority' entry 3: value nan is not allowed"),
    (_priority(-1.0), r"'priority' entry 3: value -1.0 is not allowed"),
    (_priority(np.inf), r"'priority' entry 3: value inf is not allowed"),
    (lambda t: t["sampler"].update(priority=t["sampler"]["priority"][:5]), r"'priority' has 5 entries, expected 20"),
    (lambda t: t["sampler"].update(num_samples=-3), r"'num_samples' must be an integer in \[0, "),
    (lambda t: t["storage"].update(num_online_written=2**62), r"'num_online_written' must be an integer in \[0, "),
    (lambda t: t["storage"].update(num_offline=-1), r"'num_offline' must be an integer in \[0, 32\]"),
    (lambda t: t["storage"]["meta"]["episode_id"].__setitem__(7, 0), r"'episode_id' slot 7: 0 disagrees"),
    (lambda t: t["storage"]["episodes"]["rec_length"].__setitem__(1, 9),
     r"episodes.*do not cover the 20 stored rows exactly once"),
    # (a checkpoint from before 2026-11-27 stores step_in_episode; it must be what the episode table says)
    (lambda t: t["storage"]["meta"].update(step_in_episode=np.full(20, 7)), r"'step_in_episode' is not consecutive"),
    (lambda t: t["storage"]["meta"]["generation"].__setitem__(3, 0), r"'generation' slot 3: stamp 0 is not"),
    (lambda t: t["storage"]["columns"]["reward"].__setitem__(4, np.nan), r"'reward' row 4: value nan is not finite"),
    (lambda t: t["storage"].pop("meta"), r"storage state has no field 'meta'"),
    (lambda t: t["sampler"].pop("priority"), r"has no field 'priority'"),
])
def test_a_checkpoint_with_wrong_contents_but_matching_hashes_is_refused_naming_the_field(tmp_path, change, match):
    bad = _resaved(tmp_path, PrioritizedSampler(), change)
    with pytest.raises(CheckpointError, match=match) as err:
        ReplayBuffer.load(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_every_sampler_validates_its_per_row_state(tmp_path):
    from relive.replay import ARBSampler, MixtureSampler, ReaPERSampler

    cases = [
        (ARBSampler(), lambda t: t["sampler"]["weight"].__setitem__(2, np.nan), "'weight' entry 2"),
        (ReaPERSampler(), lambda t: t["sampler"]["slots"]["delta"].__setitem__(2, -5.0), "'delta' entry 2"),
        (ReaPERSampler(), lambda t: t["sampler"]["slots"]["slot_leaf"].__setitem__(2, 10**6), "'slot_leaf' entry 2"),
        (MixtureSampler(PrioritizedSampler(), PrioritizedSampler()),
         lambda t: t["sampler"]["online"]["priority"].__setitem__(1, np.inf), r"online part\) field 'priority'"),
    ]
    for i, (sampler, change, match) in enumerate(cases):
        bad = _resaved(tmp_path / str(i), sampler, change)
        with pytest.raises(CheckpointError, match=match):
            ReplayBuffer.load(bad)


def test_several_streams_positions_are_validated(tmp_path):
    def change(tree):
        tree["storage"]["streams"]["position"][-1] = (7 << 40) + 3  # a lane that does not exist
    bad = _resaved(tmp_path, PrioritizedSampler(), change, n=8, streams=3)
    with pytest.raises(CheckpointError, match="'position': positions beyond what their stream has written"):
        ReplayBuffer.load(bad)


@pytest.mark.parametrize("edit", ["drop", "rename"])
def test_a_manifest_edited_to_drop_or_rename_an_array_is_refused(saved, edit):
    """The manifest is not itself hashed; state.json (hashed) records the tree's array keys, so an edited manifest
    cannot silently hide an array (an optional field would load with its default) -- found by the fuzz test."""
    m = _manifest(saved)
    if edit == "drop":
        del m["arrays"]["sampler__last_indices.npy"]
        del m["files"]["sampler__last_indices.npy"]
    else:
        m["arrays"]["sampler__last_indices.npy"] = "sampler/other"
    _write_manifest(saved, m)
    with pytest.raises(CheckpointError, match="arrays do not match the arrays state.json records"):
        load_tree(saved)


def test_a_berb_network_entry_of_the_wrong_shape_is_one_checkpoint_error(tmp_path):
    """torch's load_state_dict raises RuntimeError (several lines) for a wrong tensor: one CheckpointError line."""
    from relive.replay import BERBSampler

    def change(tree):
        net = tree["sampler"]["net"]
        key = next(iter(net))
        net[key] = np.zeros((1, 1), np.float32)

    bad = _resaved(tmp_path, BERBSampler(hidden=(8,), ratio_batch_size=8, first_chunk_rows=5), change)
    with pytest.raises(CheckpointError, match="sampler state is malformed|replay buffer state is malformed") as err:
        ReplayBuffer.load(bad)
    assert "\n" not in str(err.value) and str(bad) in str(err.value)
