"""Compact per-slot bookkeeping (issue 34 item 1): 9 bytes a slot stored (int32 episode id and generation, int8
origin), source / step_in_episode / stream computed; ids past 2**31 and stamps past 2**31 - 1 wrap and are handled
(checked here with the moduli made small); checkpoints from before the change load, their stored copies checked."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import relive.replay.storage.bookkeeping as bk
import relive.replay.storage.small_writes as small_writes_mod
import relive.replay.storage.storage as storage_mod
from relive.replay import PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.types import OFFLINE, ONLINE


def episodes(n, length, obs_dim=2, start=0):
    t = np.arange(start, start + n)
    return {"obs": np.stack([t, t], 1).astype(np.float32), "action": np.zeros((n, 1), np.float32),
            "reward": t.astype(np.float32), "next_obs": np.stack([t + 1, t + 1], 1).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": (t % length) == length - 1}


def test_nine_bytes_a_slot_stored_and_the_six_fields_read_as_before():
    buf = ReplayBuffer(64, (2,), (1,), sampler=UniformSampler(), seed=0)
    st = buf.storage
    assert sum(a.itemsize for a in st._meta.values()) == 9
    assert {n: a.dtype for n, a in st._meta.items()} == {"episode_id": np.int32, "generation": np.int32,
                                                        "origin": np.int8}
    buf.add_offline(episodes(10, 5))
    buf.extend(episodes(12, 4, start=100), stream=3)
    buf.extend(episodes(6, 3, start=300), stream=5)
    assert list(st.meta) == ["episode_id", "step_in_episode", "source", "generation", "stream", "origin"]
    size = st.size
    np.testing.assert_array_equal(st.meta["source"][:size], [OFFLINE] * 10 + [ONLINE] * 18)
    np.testing.assert_array_equal(st.meta["step_in_episode"][:size],
                                  [0, 1, 2, 3, 4] * 2 + [0, 1, 2, 3] * 3 + [0, 1, 2] * 2)
    np.testing.assert_array_equal(st.meta["stream"][:size], [0] * 10 + [3] * 12 + [5] * 6)
    np.testing.assert_array_equal(st.meta["episode_id"][:size], st.episode_ids(np.arange(size)))
    assert not st.meta["source"][size:].any() and not st.meta["stream"][size:].any()


def test_episode_ids_past_the_modulus_are_restored(monkeypatch):
    """Ids stored modulo 16 here (2**31 in the library): after 40 episodes on a small ring every stored row still
    reads its full id (the episode table's), n-step returns and episode queries stay right."""
    monkeypatch.setattr(bk, "ID_MOD", 16)
    monkeypatch.setattr(storage_mod, "ID_MOD", 16)
    monkeypatch.setattr(small_writes_mod, "ID_MOD", 16)
    buf = ReplayBuffer(24, (2,), (1,), sampler=UniformSampler(), seed=0, n_step=3, gamma=0.5)
    st = buf.storage
    for e in range(40):
        buf.extend(episodes(4, 4, start=4 * e))
    assert st.episodes.next_id == 40
    assert st._meta["episode_id"][: st.size].max() < 16  # stored modulo 16
    view = st.episodes.live()
    slots = st.episode_slots(view.start, view.length, view.source)
    np.testing.assert_array_equal(st.episode_ids(slots), np.repeat(view.ids, view.length))
    assert (np.repeat(view.ids, view.length) >= 16).all()
    np.testing.assert_array_equal(st.step_of(slots), np.tile([0, 1, 2, 3], slots.size // 4))
    # the n-step return of a row whose episode id wrapped: its own episode's rewards, not another's
    b = buf.gather(slots[:1])
    r = float(st.columns["reward"][slots[0]])
    assert b.reward[0] == pytest.approx(r + 0.5 * (r + 1) + 0.25 * (r + 2))


def test_more_live_episodes_than_the_modulus_are_refused_changing_nothing(monkeypatch):
    monkeypatch.setattr(bk, "ID_MOD", 8)
    monkeypatch.setattr(storage_mod, "ID_MOD", 8)
    monkeypatch.setattr(small_writes_mod, "ID_MOD", 8)
    buf = ReplayBuffer(24, (2,), (1,), sampler=UniformSampler(), seed=0)
    buf.extend(episodes(5, 1))  # five one-row episodes, all live
    state = copy.deepcopy(buf.state_dict())
    with pytest.raises(ValueError, match="episode 0 is still stored and this write would take episode ids 8 past "
                                         "it.*close_stream"):
        buf.extend(episodes(4, 1, start=5))
    after = buf.state_dict()
    np.testing.assert_array_equal(after["storage"]["meta"]["episode_id"], state["storage"]["meta"]["episode_id"])
    assert after["storage"]["num_online_written"] == state["storage"]["num_online_written"]


def test_generation_stamps_wrap_to_one_and_still_tell_a_stale_update(monkeypatch):
    """Stamps wrap past 5 here (2**31 - 1 in the library): never 0 for a stored row, and an update for a row
    overwritten since its sample (stamp changed) is still dropped."""
    monkeypatch.setattr(storage_mod, "GEN_MAX", 5)
    monkeypatch.setattr(small_writes_mod, "GEN_MAX", 5)
    buf = ReplayBuffer(4, (2,), (1,), sampler=PrioritizedSampler(priority_exponent=1.0), seed=0)
    st = buf.storage
    seen = []
    for i in range(23):
        buf.extend(episodes(1, 1, start=i))
        seen.append(int(st._meta["generation"][0]))
    assert min(seen) == 1 and max(seen) <= 5 and (st._meta["generation"][:4] >= 1).all()
    batch = buf.sample(4)
    buf.extend(episodes(2, 1, start=50))  # overwrites two of the sampled rows
    leaves = buf.sampler.leaf_values().copy()
    result = buf.update(batch.info, td_error=np.full(4, 9.0))
    assert result.num_stale >= 1
    fresh = st._meta["generation"][batch.info.indices] == batch.info.generation
    changed = buf.sampler.leaf_values() != leaves
    np.testing.assert_array_equal(changed[batch.info.indices], fresh)


def test_a_checkpoint_in_the_old_layout_loads_and_its_copies_are_checked(tmp_path):
    """A state with every field stored as int64 / int32 (the layout before 2026-11-27) loads to the same buffer; a
    stored stream or source copy that disagrees with the rows is refused naming the field."""
    buf = ReplayBuffer(40, (2,), (1,), sampler=UniformSampler(), seed=0)
    buf.add_offline(episodes(8, 4))
    buf.extend(episodes(10, 5, start=20), stream=2)
    buf.extend(episodes(6, 3, start=40), stream=7)
    state = buf.state_dict()
    size = buf.storage.size
    old = copy.deepcopy(state)
    meta = old["storage"]["meta"]
    for name, dtype in bk.LEGACY_DTYPES.items():
        meta[name] = np.asarray(buf.storage.meta[name][:size], dtype=dtype)
    fresh = ReplayBuffer.from_state_dict(old)
    for name in bk.LEGACY_DTYPES:
        np.testing.assert_array_equal(fresh.storage.meta[name][:size], buf.storage.meta[name][:size], err_msg=name)
    for name, match in (("stream", "'stream' disagrees with the streams' lanes"),
                        ("source", "'source' disagrees with num_offline")):
        bad = copy.deepcopy(old)
        bad["storage"]["meta"][name][12] += 1
        with pytest.raises(ValueError, match=match):
            ReplayBuffer.from_state_dict(bad)
