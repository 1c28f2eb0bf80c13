"""Regression tests of issue 14 (reliability): each fails on the code before the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import relive.replay.checkpoint as ckpt
from relive.replay import (
    ARBSampler,
    BERBSampler,
    CheckpointError,
    MixtureSampler,
    PrioritizedSampler,
    ReaPERReferenceSampler,
    ReaPERSampler,
    ReplayBuffer,
    UniformSampler,
)
from relive.testing import random_transitions


def _buffer(sampler=None, capacity=60, seed=0):
    buf = ReplayBuffer(capacity, (3,), (2,), sampler=sampler, seed=seed)
    buf.add_offline(random_transitions(20, (3,), (2,), rng=0, episode_length=7))
    buf.extend(random_transitions(20, (3,), (2,), rng=1, episode_length=6))
    return buf


# -- 1. save never destroys what it did not write ------------------------------------------------------------
def test_save_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "a.py").write_text("x")
    with pytest.raises(CheckpointError, match=r"proj is a directory that is not a relive checkpoint.*src"):
        _buffer().save(proj)
    assert (proj / "src" / "a.py").read_text() == "x"
    assert not (tmp_path / "proj.partial").exists() and not (tmp_path / "proj.previous").exists()


def test_save_refuses_an_existing_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    with pytest.raises(CheckpointError, match=r"notes.txt is an existing file"):
        _buffer().save(f)
    assert f.read_text() == "keep me"


def test_save_into_an_empty_directory_and_over_an_earlier_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    path.mkdir()
    buf = _buffer()
    buf.save(path)
    buf.extend(random_transitions(3, (3,), (2,), rng=4))
    buf.save(path)  # replaces the earlier checkpoint
    assert len(ReplayBuffer.load(path)) == 43
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_save_refuses_a_checkpoint_with_foreign_files_or_of_another_kind(tmp_path):
    path = tmp_path / "ckpt"
    _buffer().save(path)
    (path / "notes.md").write_text("mine")
    with pytest.raises(CheckpointError, match=r"relive did not write \(notes.md\)"):
        _buffer().save(path)
    assert (path / "notes.md").exists()
    ckpt.save_tree(tmp_path / "agent", {"w": np.ones(3)}, kind="agent")
    with pytest.raises(CheckpointError, match=r"holds a 'agent' checkpoint"):
        _buffer().save(tmp_path / "agent")


@pytest.mark.parametrize("suffix", [".previous", ".partial"])
def test_save_refuses_to_delete_foreign_previous_or_partial(tmp_path, suffix):
    path = tmp_path / "ckpt"
    other = tmp_path / f"ckpt{suffix}"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    with pytest.raises(CheckpointError, match=rf"ckpt{suffix}"):
        _buffer().save(path)
    assert (other / "thesis.tex").read_text() == "years of work"
    assert not path.exists()


def test_a_partial_left_by_a_killed_save_is_cleaned_and_a_failed_save_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    buf = _buffer()
    buf.save(path)
    real_save = np.save
    calls = []

    def die_mid_write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")  # a kill: nothing cleans up
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt.np, "save", die_mid_write)
    with pytest.raises(KeyboardInterrupt):
        buf.save(path)
    assert (tmp_path / "ckpt.partial").is_dir()
    monkeypatch.setattr(ckpt.np, "save", real_save)
    buf.save(path)  # the partial is relive's: removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.np, "save", disk_full)
    with pytest.raises(OSError, match="No space"):
        buf.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # an error: nothing half-written left
    assert len(ReplayBuffer.load(path)) == 40


# -- 4. integer and float casts never wrap or overflow ----------------------------------------------------------
def _int_buffer():
    return ReplayBuffer(10, (2,), (), obs_dtype=np.uint8, action_dtype=np.int32)


def _int_row(obs=(1, 2), action=3):
    return {"obs": np.array([obs]), "action": np.array([action]), "reward": np.zeros(1), "next_obs": np.array([[0, 0]]),
            "terminated": np.zeros(1, bool), "truncated": np.zeros(1, bool)}


@pytest.mark.parametrize("row, match", [
    (_int_row(obs=(300, 1)), r"column 'obs' row 0 element \(0,\): value 300 does not fit.*uint8 \[0, 255\]"),
    (_int_row(obs=(1, -1)), r"column 'obs' row 0 element \(1,\): value -1 does not fit.*uint8"),
    (_int_row(action=2**40), r"column 'action' row 0: value 1099511627776 does not fit.*int32"),
])
def test_out_of_range_integers_are_refused_naming_column_and_row(row, match):
    buf = _int_buffer()
    with pytest.raises(ValueError, match=match):
        buf.extend(row)
    assert len(buf) == 0
    buf.extend(_int_row(obs=(255, 0), action=-(2**31)))  # the extremes that fit are stored exactly
    assert buf.storage.columns["obs"][0].tolist() == [255, 0] and buf.storage.columns["action"][0] == -(2**31)


def test_float64_beyond_float32_is_refused_not_stored_as_inf():
    buf = ReplayBuffer(10, (2,), (1,))
    rows = _int_row() | {"obs": np.array([[0.0, 1e300]]), "action": np.zeros((1, 1))}
    with pytest.raises(ValueError, match=r"column 'obs' row 0 element \(1,\): value 1e\+300 does not fit.*float32"):
        buf.extend(rows)
    assert len(buf) == 0


@pytest.mark.parametrize("capacity", [2.7, True, "10", 0, -3])
def test_capacity_must_be_a_positive_integer(capacity):
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        ReplayBuffer(capacity, (3,), (2,))


@pytest.mark.parametrize("batch_size", [True, 2.0, 0])
def test_batch_size_must_be_a_positive_integer(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        _buffer().sample(batch_size)


@pytest.mark.parametrize("name", ["a/b", "a.b", "", "1x", "two words"])
def test_extra_column_names_must_be_identifiers(name, tmp_path):
    with pytest.raises(ValueError, match="must be an identifier"):
        ReplayBuffer(10, (3,), (2,), extra_columns={name: ()})
    assert not list(tmp_path.iterdir())
