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


# -- 7. one sampler instance cannot be both parts of a mixture -----------------------------------------------------
def test_mixture_refuses_the_same_instance_twice_and_parts_bound_elsewhere():
    u = UniformSampler()
    with pytest.raises(ValueError, match="same sampler instance for both parts"):
        MixtureSampler(u, u)
    _buffer(u)
    with pytest.raises(ValueError, match="already bound"):
        _buffer(MixtureSampler(u, UniformSampler()))


# -- 8. a mixture update is all-or-nothing ----------------------------------------------------------------------
def test_mixture_update_validates_every_part_before_changing_any():
    buf = _buffer(MixtureSampler(PrioritizedSampler(), ReaPERSampler()))
    info = buf.sample(8).info
    assert (info.source == 0).any() and (info.source == 1).any()
    before = buf.sampler.probabilities().copy()
    per_before = np.array(buf.sampler.offline.sum_tree.leaves)
    with pytest.raises(ValueError, match="ReaPERSampler.update needs a 'td_error' signal"):
        buf.update(info, priority=np.full(8, 7.0))
    np.testing.assert_array_equal(np.array(buf.sampler.offline.sum_tree.leaves), per_before)
    np.testing.assert_array_equal(buf.sampler.probabilities(), before)
    assert buf.num_updated == 0


# -- 9. extreme finite signals and bad hyper-parameters -----------------------------------------------------------
def _check_distribution(buf):
    p = buf.sampler.probabilities()
    assert np.isfinite(p).all() and (p >= 0).all()
    assert p[: len(buf)].sum() == pytest.approx(1.0) and not p[len(buf):].any()
    b = buf.sample(16)
    assert np.isfinite(b.info.probability).all() and np.isfinite(b.info.is_weight).all()
    assert (b.info.is_weight >= 0).all() and (b.info.is_weight <= 1).all()


@pytest.mark.parametrize("make", [
    ReaPERSampler, ReaPERReferenceSampler, lambda: PrioritizedSampler(priority_exponent=1.0),
    lambda: PrioritizedSampler(priority_exponent=4.0, is_exponent=1.0),
    lambda: MixtureSampler(PrioritizedSampler(priority_exponent=1.0), ReaPERSampler())])
@pytest.mark.parametrize("value", [1e308, -1e308, 0.0, 5e-324])
def test_extreme_finite_td_errors_keep_probabilities_finite(make, value):
    buf = _buffer(make())
    for _ in range(3):
        info = buf.sample(8).info
        buf.update(info, td_error=np.full(8, value))
        _check_distribution(buf)
    info = buf.sample(8).info
    buf.update(info, td_error=np.where(np.arange(8) % 2, 1e308, 1e-300))
    _check_distribution(buf)


def test_extreme_priorities_keep_per_finite_and_all_zero_priorities_sample_uniformly():
    buf = _buffer(PrioritizedSampler(priority_exponent=1.0, is_exponent=1.0))
    buf.update(buf.gather(np.arange(40)).info, priority=np.full(40, 1e308))
    _check_distribution(buf)
    buf.update(buf.gather(np.arange(40)).info, priority=np.zeros(40))
    _check_distribution(buf)
    np.testing.assert_allclose(buf.sampler.probabilities()[:40], 1 / 40)


NAN = float("nan")


@pytest.mark.parametrize("make, name", [
    (lambda: PrioritizedSampler(is_exponent=NAN), "is_exponent"),
    (lambda: PrioritizedSampler(priority_exponent=NAN), "priority_exponent"),
    (lambda: PrioritizedSampler(priority_exponent=float("inf")), "priority_exponent"),
    (lambda: PrioritizedSampler(is_exponent_final=NAN), "is_exponent_final"),
    (lambda: PrioritizedSampler(eps=NAN), "eps"),
    (lambda: PrioritizedSampler(initial_priority=NAN), "initial_priority"),
    (lambda: PrioritizedSampler(is_anneal_samples=2.5), "is_anneal_samples"),
    (lambda: ReaPERSampler(priority_exponent=NAN), "priority_exponent"),
    (lambda: ReaPERSampler(reliability_exponent=NAN), "reliability_exponent"),
    (lambda: ReaPERSampler(is_exponent=NAN), "is_exponent"),
    (lambda: ReaPERSampler(eps=NAN), "eps"),
    (lambda: ReaPERReferenceSampler(reliability_exponent=-1.0), "reliability_exponent"),
    (lambda: ARBSampler(temperature=NAN), "temperature"),
    (lambda: ARBSampler(is_exponent=NAN), "is_exponent"),
    (lambda: ARBSampler(log_p_low=NAN), "log_p_low"),
    (lambda: ARBSampler(amortized_rows_per_refresh=1.5), "amortized_rows_per_refresh"),
    (lambda: BERBSampler(temperature=NAN), "temperature"),
    (lambda: BERBSampler(lr=NAN), "lr"),
    (lambda: BERBSampler(clip_low=NAN), "clip_low"),
    (lambda: BERBSampler(init_online_fraction=NAN), "init_online_fraction"),
    (lambda: MixtureSampler(offline_fraction=NAN), "offline_fraction"),
    (lambda: PrioritizedSampler(priority_exponent=True), "priority_exponent"),
])
def test_bad_hyper_parameters_are_refused_at_construction(make, name):
    with pytest.raises(ValueError, match=rf"{name}.* must be .*got"):
        make()


# -- lower severity: negative priority signals everywhere --------------------------------------------------------
@pytest.mark.parametrize("make", [UniformSampler, ARBSampler, lambda: BERBSampler(hidden=(8,)), PrioritizedSampler,
                                  lambda: MixtureSampler(UniformSampler(), UniformSampler())])
def test_negative_priority_signals_are_refused_by_every_sampler(make):
    buf = _buffer(make())
    info = buf.sample(8).info
    before = buf.sampler.probabilities().copy()
    with pytest.raises(ValueError, match=r"signal 'priority' row 0: value -1.0 must be >= 0"):
        buf.update(info, priority=-np.ones(8))
    with pytest.raises(ValueError, match=r"'priority' row 0.*not finite"):
        buf.update(info, priority=np.full(8, np.inf))
    np.testing.assert_array_equal(buf.sampler.probabilities(), before)


# -- lower severity: every sampler works without numba ------------------------------------------------------------
NO_NUMBA_SCRIPT = r"""
import numpy as np
from relive.replay import _tree_kernels
from relive.replay import (ARBSampler, BERBSampler, MixtureSampler, PrioritizedSampler, ReaPERReferenceSampler,
                           ReaPERSampler, ReplayBuffer, UniformSampler)
from relive.testing import random_transitions

assert not _tree_kernels.AVAILABLE
makers = [UniformSampler, PrioritizedSampler, ReaPERSampler, ReaPERReferenceSampler, ARBSampler,
          lambda: ARBSampler(amortized_rows_per_refresh=7), lambda: BERBSampler(hidden=(8,)),
          lambda: MixtureSampler(UniformSampler(), PrioritizedSampler())]
for make in makers:
    buf = ReplayBuffer(60, (3,), (2,), sampler=make(), seed=0)
    buf.add_offline(random_transitions(20, (3,), (2,), rng=0, episode_length=7))
    for k in range(4):
        buf.extend(random_transitions(15, (3,), (2,), rng=k + 1, episode_length=6, start_step=15 * k))
        buf.refresh(lambda obs, act: -np.square(act).sum(1))
        b = buf.sample(16)
        mix = isinstance(buf.sampler, MixtureSampler)
        p = buf.sampler.probabilities(batch_size=16) if mix else buf.sampler.probabilities()
        assert np.isfinite(p).all() and abs(p[: len(buf)].sum() - 1) < 1e-9, type(buf.sampler).__name__
        np.testing.assert_allclose(b.info.probability, p[b.info.indices], rtol=1e-9)
        buf.update(b.info, td_error=np.linspace(-1, 1, 16) * 1e308)
print("ok", len(makers))
"""


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_every_sampler_samples_updates_and_refreshes_without_numba():
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = os.environ | {"RELIVE_NO_NUMBA": "1", "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", NO_NUMBA_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok 8"


def test_berb_stays_finite_with_extreme_but_finite_observations():
    buf = ReplayBuffer(60, (3,), (2,), sampler=BERBSampler(hidden=(8,), ratio_batch_size=8, first_chunk_rows=5))
    off = random_transitions(20, (3,), (2,), rng=0, episode_length=7)
    off["obs"][:, 0] = 3e38  # fits float32; the ratio network overflows on it
    buf.add_offline(off)
    buf.extend(random_transitions(20, (3,), (2,), rng=1, episode_length=6))
    s = buf.sampler
    for layer in (s.net[0], s.net[2]):  # 3 x 3e38 overflows float32: w = inf on the offline rows
        layer.weight.data.fill_(1.0)
    for _ in range(5):
        buf.update(buf.sample(8).info, td_error=np.ones(8))
        _check_distribution(buf)
    assert all(np.isfinite(q.detach().numpy()).all() for q in s.net.parameters())
    assert np.isfinite(s.normalizer) and np.isfinite(s.stats()["replay/berb_skipped_steps"])


def test_a_partial_left_by_an_older_version_without_the_marker_is_still_cleaned(tmp_path):
    path = tmp_path / "ckpt"
    old = tmp_path / "ckpt.partial"
    old.mkdir()
    np.save(old / "storage__columns__obs.npy", np.zeros(3))
    (old / "state.json").write_text("{}")
    _buffer().save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("amortized", [0, 5])
def test_arb_with_a_small_temperature_keeps_a_distribution(amortized):
    """exp(L / lambda) underflows to 0 for every trajectory when lambda is small: the refresh divided by 0."""
    buf = _buffer(ARBSampler(temperature=0.01, amortized_rows_per_refresh=amortized))
    rng = np.random.default_rng(0)

    def score_fn(obs, action):
        s = np.full(len(obs), -12.0)
        s[rng.integers(len(obs))] = 7.0
        return s

    for _ in range(3):
        buf.refresh(score_fn)
        _check_distribution(buf)
