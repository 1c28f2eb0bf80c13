import json
import os
import warnings

import numpy as np
import pytest

import relive.replay.checkpoint as ckpt
from relive.replay import (
    CheckpointError,
    MixtureSampler,
    PrioritizedSampler,
    ReplayBuffer,
    UniformSampler,
)
from relive.testing import random_transitions


def _state(buf):
    """A comparable snapshot of everything a write could touch."""
    st = buf.storage
    return ({k: v.copy() for k, v in st.columns.items()}, {k: v.copy() for k, v in st.meta.items()},
            st.num_offline, st.num_online_written, st.episodes.state_dict(),
            buf.sampler.probabilities().copy() if len(buf) else None)


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
        elif isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


def _per_buffer():
    buf = ReplayBuffer(100, (11,), (3,), sampler=PrioritizedSampler(), seed=0)
    buf.add_offline(random_transitions(20, rng=0))
    buf.extend(random_transitions(30, rng=1))
    return buf


def _bad(**changes):
    rows = random_transitions(4, rng=5)
    for k, v in changes.items():
        if v is None:
            del rows[k]
        else:
            rows[k] = v
    return rows


nan_reward = np.array([0.0, 1.0, np.nan, 0.0])
inf_obs = np.zeros((4, 11))
inf_obs[3, 2] = np.inf


@pytest.mark.parametrize("rows, match", [
    (_bad(obs=np.zeros((4, 10))), r"'obs'.*expected shape \(n, 11\)"),
    (_bad(action=np.zeros((4, 3, 1))), r"'action'.*shape"),
    (_bad(reward=np.zeros(3)), r"'reward' has 3 rows"),
    (_bad(reward=None), r"missing column.*'reward'"),
    (_bad(foo=np.zeros(4)), r"unknown column.*'foo'"),
    (_bad(reward=nan_reward), r"'reward' row 2.*not finite"),
    (_bad(obs=inf_obs), r"'obs' row 3.*not finite"),
    (_bad(action=np.full((4, 3), np.nan)), r"'action' row 0.*not finite"),
    (_bad(terminated=np.array([0, 2, 0, 0])), r"'terminated' row 1.*boolean"),
    (_bad(obs=np.array([["a"] * 11] * 4)), r"'obs'.*dtype"),
])
def test_bad_rows_raise_naming_the_problem_and_change_nothing(rows, match):
    buf = _per_buffer()
    before = _state(buf)
    with pytest.raises(ValueError, match=match):
        buf.extend(rows)
    _assert_same(before, _state(buf))


def test_capacity_smaller_than_offline_data():
    buf = ReplayBuffer(10, (11,), (3,))
    with pytest.raises(ValueError, match="capacity 10 is smaller than the offline data"):
        buf.add_offline(random_transitions(11, rng=0))
    assert len(buf) == 0


def test_offline_after_online_is_refused():
    buf = _per_buffer()
    with pytest.raises(ValueError, match="before any online row"):
        buf.add_offline(random_transitions(2, rng=0))


def test_bad_updates_and_samples():
    buf = _per_buffer()
    info = buf.sample(8).info
    before = _state(buf)
    with pytest.raises(ValueError, match=r"'td_error' row 3.*not finite"):
        buf.update(info, td_error=np.where(np.arange(8) == 3, np.nan, 1.0))
    with pytest.raises(ValueError, match=r"'priority' row 0.*>= 0"):
        buf.update(info, priority=-np.ones(8))
    with pytest.raises(ValueError, match=r"expected shape \(8,\)"):
        buf.update(info, td_error=np.ones(7))
    with pytest.raises(ValueError, match="index 500 at position 0 does not exist"):
        buf.update(info.__class__(np.array([500]), np.array([1]), np.ones(1), np.ones(1), np.ones(1)),
                   td_error=[1.0])
    with pytest.raises(ValueError, match="only 50 rows are stored"):
        buf.sample(51)
    with pytest.raises(ValueError, match="positive integer"):
        buf.sample(0)
    _assert_same(before, _state(buf))


def test_stale_updates_are_skipped_and_counted():
    buf = ReplayBuffer(40, (11,), (3,), sampler=PrioritizedSampler(priority_exponent=1.0), seed=0)
    buf.add_offline(random_transitions(10, rng=0))
    buf.extend(random_transitions(30, rng=1))
    batch = buf.gather(np.array([5, 12, 13, 39]))  # 12 and 13 are overwritten next
    buf.extend(random_transitions(4, rng=2))  # online slots 10..13
    tree = buf.sampler.sum_tree
    fresh_priority = tree[12]
    report = buf.update(batch.info, priority=[2.0, 3.0, 4.0, 5.0])
    assert (report.num_updated, report.num_stale) == (2, 2)
    assert report.stale.tolist() == [False, True, True, False]
    assert tree[12] == fresh_priority and tree[5] == 2.0 and tree[39] == 5.0
    assert buf.stats()["replay/num_stale"] == 2


@pytest.mark.parametrize("make_sampler", [
    UniformSampler,
    lambda: PrioritizedSampler(is_exponent=0.4, is_exponent_final=1.0, is_anneal_samples=100),
    lambda: MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.3),
])
def test_save_load_round_trip_gives_the_same_next_samples(tmp_path, make_sampler):
    buf = ReplayBuffer(120, (11,), (3,), sampler=make_sampler(), seed=3, extra_columns={"mc_return": ()})
    off = random_transitions(40, rng=0) | {"mc_return": np.arange(40.0)}
    buf.add_offline(off)
    for k in range(4):
        buf.extend(random_transitions(30, rng=k + 1, start_step=30 * k) | {"mc_return": np.zeros(30)})
        b = buf.sample(32)
        if buf.sampler.signals:
            buf.update(b.info, td_error=np.random.default_rng(k).normal(size=32))
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    _assert_same(_state(buf), _state(loaded))
    assert type(loaded.sampler) is type(buf.sampler)
    assert loaded.sampler.config() == buf.sampler.config()
    for _ in range(3):
        a, b = buf.sample(16), loaded.sample(16)
        np.testing.assert_array_equal(a.info.indices, b.info.indices)
        np.testing.assert_array_equal(a.info.is_weight, b.info.is_weight)
        np.testing.assert_array_equal(a.mc_return, b.mc_return)
    # the checkpoint is plain .npy + JSON: every array loads without pickle
    for f in os.listdir(tmp_path / "ckpt"):
        assert f.endswith((".npy", ".json"))
        if f.endswith(".npy"):
            np.load(tmp_path / "ckpt" / f, allow_pickle=False)


def test_killed_save_leaves_the_previous_checkpoint_usable(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    buf = _per_buffer()
    buf.save(path)
    first = buf.sample(8).info.indices
    buf.extend(random_transitions(5, rng=9))

    real_replace = os.replace
    calls = []

    def die_at_swap(src, dst):  # killed after the old checkpoint moved aside, before the new one landed
        calls.append((src, dst))
        if str(dst) == str(path):
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", die_at_swap)
    with pytest.raises(KeyboardInterrupt):
        buf.save(path)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert not path.exists() and (tmp_path / "ckpt.previous").exists()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loaded = ReplayBuffer.load(path)
    assert any("previous complete checkpoint" in str(x.message) for x in w)
    assert len(loaded) == 50
    np.testing.assert_array_equal(loaded.sample(8).info.indices, first)


def test_truncated_or_corrupted_checkpoints_are_detected(tmp_path):
    path = tmp_path / "ckpt"
    _per_buffer().save(path)
    victim = next(p for p in path.iterdir() if p.name.startswith("storage__columns__obs"))
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="has .* bytes, expected"):
        ReplayBuffer.load(path)
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CheckpointError, match="SHA-256"):
        ReplayBuffer.load(path)
    (path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="MANIFEST.json is missing"):
        ReplayBuffer.load(path)
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        ReplayBuffer.load(tmp_path / "nowhere")


def test_checkpoint_state_json_is_plain_json(tmp_path):
    _per_buffer().save(tmp_path / "c")
    state = json.loads((tmp_path / "c" / "state.json").read_text())
    assert state["config"]["sampler"]["type"] == "PrioritizedSampler"
    assert state["config"]["storage"]["obs_shape"] == [11]


def test_same_seed_same_samples_and_torch_batch():
    a, b = _per_buffer(), _per_buffer()
    np.testing.assert_array_equal(a.sample(16).info.indices, b.sample(16).info.indices)
    t = a.sample(16).to_torch()
    assert t.obs.shape == (16, 11) and t.terminated.dtype.is_floating_point and t.info.is_weight.shape == (16,)


def test_to_torch_gives_the_same_tensors_on_every_path_and_flags_in_the_dtype_asked():
    """The CPU fast path (torch.from_numpy of the batch's own arrays) and the general one (torch.as_tensor, taken
    for read-only arrays) give equal tensors of equal dtypes; flags as float32 by default, bool / uint8 on request;
    the tensors share the batch's memory on CPU (zero-copy), as before."""
    import warnings

    import torch

    from relive.testing import random_transitions

    buf = ReplayBuffer(200, (5,), (2,), sampler=UniformSampler(), seed=0)
    buf.extend(random_transitions(200, 5, 2, rng=0))
    b = buf.sample(64)
    fast = b.to_torch()
    frozen = {f: getattr(b, f).view() for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for v in frozen.values():
        v.flags.writeable = False
    from dataclasses import replace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns about read-only arrays on the general path, as it always did)
        slow = replace(b, **frozen).to_torch()
    for f in frozen:
        a, c = getattr(fast, f), getattr(slow, f)
        assert a.dtype == c.dtype and torch.equal(a, c), f
    assert fast.terminated.dtype == torch.float32 and fast.info.is_weight.dtype == torch.float32
    assert b.to_torch(flag_dtype=torch.bool).truncated.dtype == torch.bool
    assert torch.equal(b.to_torch(flag_dtype=torch.uint8).terminated, torch.as_tensor(b.terminated).to(torch.uint8))
    assert fast.obs.data_ptr() == b.obs.__array_interface__["data"][0]  # zero-copy
    assert b.to_torch(dtype=torch.float64).obs.dtype == torch.float64
