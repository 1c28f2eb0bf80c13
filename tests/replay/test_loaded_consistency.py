"""A loaded buffer is consistent (issue 44): a hash-valid checkpoint whose contents contradict each other -- an open
episode the table says is finished, NaN in the stored next_obs copies, stamps no write could make, cleared flags,
eviction bounds that disagree with the ring -- is refused with one CheckpointError naming the checkpoint and the
field, instead of loading and failing later; and the replay calls refuse slots that hold no row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.checkpoint import CheckpointError
from tests.replay.ckpt_edit import edit_array, edit_state, read_array

OBS, ACT = (3,), (2,)
DICT_OBS = {"observation": (3,), "achieved_goal": (2,), "desired_goal": (2,)}


def rows(n: int, seed: int = 0, ends=(), truncate=False) -> dict:
    rng = np.random.default_rng(seed)
    end = np.zeros(n, bool)
    end[list(ends)] = True
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32), "action": rng.normal(size=(n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
            "terminated": end & (not truncate), "truncated": end & truncate}


def dict_rows(n: int, seed: int = 0, ends=()) -> dict:
    rng = np.random.default_rng(seed)
    end = np.zeros(n, bool)
    end[list(ends)] = True
    obs = {k: rng.normal(size=(n + 1, *s)).astype(np.float32) for k, s in DICT_OBS.items()}
    return {"obs": {k: v[:-1] for k, v in obs.items()}, "next_obs": {k: v[1:] for k, v in obs.items()},
            "action": rng.normal(size=(n, 1)).astype(np.float32), "reward": rng.normal(size=n).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": end}


def refused(path, *match: str, **load) -> str:
    with pytest.raises(CheckpointError) as err:
        ReplayBuffer.load(path, **load)
    message = str(err.value)
    assert "\n" not in message and str(path) in message, message
    for m in match:
        assert m in message, message
    return message


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of one stream: episodes 0 (slots 0-3, terminated), 1 (4-10, truncated) and 2 (11-13, open)."""
    buf = ReplayBuffer(50, OBS, ACT, seed=0)
    buf.extend(rows(10, 1, ends=(3,)))
    buf.extend(rows(1, 2, ends=(0,), truncate=True))
    buf.extend(rows(3, 3))
    buf.save(tmp_path / "c")
    return tmp_path / "c", buf


# -- item 2: the episode table against the rows -----------------------------------------------------------------
def test_an_open_episode_that_the_table_says_is_finished_is_refused(saved):
    path, buf = saved
    assert buf.storage.episodes.is_open(1) == 2
    ReplayBuffer.load(path)  # as saved: fine
    edit_state(path, lambda t: t["storage"]["episodes"].__setitem__("open_online", 0))  # a finished episode
    refused(path, "open_online", "finished")


def test_an_unfinished_episode_no_stream_writes_is_refused(saved):
    path, _ = saved
    edit_array(path, "storage/episodes/rec_finished", lambda a: a.__setitem__(1, False))
    refused(path, "rec_finished", "episode 1")


def test_an_open_episode_of_another_stream_is_refused(tmp_path):
    buf = ReplayBuffer(50, OBS, ACT)
    buf.extend(rows(5, 1), stream=0)
    buf.extend(rows(4, 2), stream=7)
    buf.save(tmp_path / "c")
    ReplayBuffer.load(tmp_path / "c")
    lanes = read_array(tmp_path / "c", "storage/episodes/open_lanes")
    edit_array(tmp_path / "c", "storage/episodes/open_lanes", lambda a: a.__setitem__((0, 1), 0))
    assert lanes.tolist() == [[1, 1]]
    refused(tmp_path / "c", "open")


def test_the_next_write_after_a_contradictory_load_cannot_happen(saved):
    """The audit's case: before, the open episode pointed at a finished one loaded, the next write corrupted the table
    and the next save could never load again."""
    path, _ = saved
    edit_state(path, lambda t: t["storage"]["episodes"].__setitem__("open_online", 1))
    refused(path, "open_online")


# -- item 3: every float array of a checkpoint, checked as a write checks it -------------------------------------
def test_nan_in_the_stored_next_obs_copies_is_refused_naming_the_checkpoint(tmp_path):
    buf = ReplayBuffer(40, DICT_OBS, (1,))  # dict observations: next_obs deduplicated, copies at episode ends
    buf.extend(dict_rows(12, 1, ends=(4, 9)))
    buf.save(tmp_path / "c")
    key = "storage/next_obs_store/values/next_obs.observation"
    assert read_array(tmp_path / "c", key).shape[0] >= 2
    edit_array(tmp_path / "c", key, lambda a: a.__setitem__((1, 2), np.nan))
    refused(tmp_path / "c", "next_obs", "observation", "not finite")


def test_nan_in_a_her_buffers_next_obs_copies_is_refused(tmp_path):
    from relive.replay.samplers.her import HindsightSampler

    def reward_fn(achieved, desired, info):
        return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)

    buf = ReplayBuffer(40, DICT_OBS, (1,), sampler=HindsightSampler(UniformSampler(), reward_fn=reward_fn))
    buf.extend(dict_rows(12, 1, ends=(4, 9)))
    buf.sample(4)
    buf.save(tmp_path / "c")
    ReplayBuffer.load(tmp_path / "c")
    edit_array(tmp_path / "c", "storage/next_obs_store/values/next_obs.achieved_goal",
               lambda a: a.__setitem__((0, 0), np.inf))
    refused(tmp_path / "c", "achieved_goal", "not finite")


@pytest.mark.parametrize("column", ["terminated", "truncated"])
def test_a_flag_column_holding_a_byte_other_than_0_or_1_is_refused(saved, column):
    path, _ = saved
    edit_array(path, f"storage/columns/{column}", lambda a: a.view(np.uint8).__setitem__(5, 7))
    refused(path, column, "row 5")


def test_a_finished_flag_holding_byte_7_is_refused(saved):
    path, _ = saved
    edit_array(path, "storage/episodes/rec_finished", lambda a: a.view(np.uint8).__setitem__(0, 7))
    refused(path, "rec_finished")


# -- item 4: incomplete states --------------------------------------------------------------------------------
@pytest.mark.parametrize("state", [{}, {"config": {}}, [], None, {"config": {"storage": {}}, "storage": {}}])
def test_from_state_dict_of_an_incomplete_state_is_one_checkpoint_error(state):
    with pytest.raises(CheckpointError, match=r"ReplayBuffer.from_state_dict: .*(field|mapping|malformed)"):
        ReplayBuffer.from_state_dict(state)


# -- item 8: gather refuses slots that hold no row -------------------------------------------------------------
@pytest.mark.parametrize("backend", ["ram", "torch"])
def test_gather_refuses_unwritten_negative_and_out_of_range_slots(backend):
    if backend == "torch":
        pytest.importorskip("torch")
    buf = ReplayBuffer(100, OBS, ACT, backend=backend)
    buf.extend(rows(10, 1))
    for slots in ([-1], [99], [10], [100], [3, -5], [2**40]):
        with pytest.raises(ValueError, match=f"index {slots[-1]} at position {len(slots) - 1} does not exist"):
            buf.gather(np.array(slots))
    with pytest.raises(ValueError, match="integers"):
        buf.gather(np.array([1.0]))
    assert buf.gather([0, 9]).info.source.tolist() == [1, 1]  # stored rows: fine (a list too)


def test_gather_refuses_an_empty_demonstration_slot():
    buf = ReplayBuffer(40, OBS, ACT, sampler=MixtureSampler(UniformSampler(), PrioritizedSampler()), demo_capacity=6)
    buf.add_offline(rows(5, 1, ends=(4,)))
    buf.extend(rows(8, 2))
    buf.add_demonstrations(rows(2, 3, ends=(1,), truncate=True))
    buf.gather([6])  # a demonstration row
    with pytest.raises(ValueError, match="index 7 at position 0 does not exist: the demonstration segment's slots"):
        buf.gather([7])


def test_gather_without_the_compiled_check_refuses_the_same(monkeypatch):
    from relive.replay import _check_kernels

    monkeypatch.setattr(_check_kernels, "AVAILABLE", False)
    buf = ReplayBuffer(100, OBS, ACT)
    buf.extend(rows(10, 1))
    with pytest.raises(ValueError, match="index -1 at position 0 does not exist"):
        buf.gather(np.array([-1]))


# -- lesser: fields that contradict the rows --------------------------------------------------------------------
def test_gamma_nan_is_refused(saved):
    path, _ = saved
    edit_state(path, lambda t: t["config"].__setitem__("gamma", math.nan))
    assert "NaN" in (path / "state.json").read_text()
    refused(path, "gamma")


@pytest.mark.parametrize("field, value", [("num_stale", -1), ("num_updated", 2.5), ("n_step", 0), ("seed", "x")])
def test_counters_and_settings_out_of_range_are_refused(saved, field, value):
    path, _ = saved

    def change(t):
        (t["counters"] if field in ("num_stale", "num_updated") else t["config"])[field] = value

    edit_state(path, change)
    refused(path, field)


def test_reversed_generation_stamps_are_refused(tmp_path):
    buf = ReplayBuffer(20, OBS, ACT)
    buf.add_offline(rows(4, 0, ends=(3,)))
    buf.extend(rows(16, 1, ends=(5, 12)))
    buf.extend(rows(7, 2, ends=(4,)))  # the ring (16 rows) wraps: stamps 2 then 1
    buf.save(tmp_path / "c")
    gen = read_array(tmp_path / "c", "storage/meta/generation")
    assert sorted(set(gen.tolist())) == [1, 2]
    edit_array(tmp_path / "c", "storage/meta/generation", lambda a: a[::-1].copy())
    refused(tmp_path / "c", "generation")
    edit_array(tmp_path / "c", "storage/meta/generation", lambda a: a[::-1].copy())  # back as saved: loads
    ReplayBuffer.load(tmp_path / "c")
    edit_array(tmp_path / "c", "storage/meta/generation", lambda a: a.__setitem__(10, 5))  # no write made it 5
    refused(tmp_path / "c", "generation", "slot 10")


def test_a_cleared_truncated_flag_at_an_episode_end_is_refused(saved):
    path, _ = saved
    assert read_array(path, "storage/columns/truncated")[10]
    edit_array(path, "storage/columns/truncated", lambda a: a.__setitem__(10, False))
    refused(path, "truncated", "slot 10", "finished")


def test_a_flag_in_the_middle_of_an_episode_is_refused(saved):
    path, _ = saved
    edit_array(path, "storage/columns/terminated", lambda a: a.__setitem__(6, True))
    refused(path, "terminated", "slot 6")


@pytest.mark.parametrize("how", ["scalar", "array"])
def test_an_eviction_bound_of_0_in_a_wrapped_ring_is_refused(tmp_path, how):
    buf = ReplayBuffer(16, OBS, ACT)
    buf.extend(rows(24, 1, ends=(7, 15, 23)))  # episodes of 8: the ring holds the last two, whole
    buf.save(tmp_path / "c")
    assert buf.storage.episodes.online_evicted_before == 8
    if how == "scalar":
        edit_state(tmp_path / "c", lambda t: t["storage"]["episodes"].__setitem__("online_evicted_before", 0))
    else:
        edit_array(tmp_path / "c", "storage/episodes/lane_evicted", lambda a: a.__setitem__(0, 0))
    refused(tmp_path / "c", "evicted")


def test_positions_of_several_streams_out_of_order_are_refused(tmp_path):
    buf = ReplayBuffer(30, OBS, ACT)
    buf.extend(rows(6, 1), stream=0)
    buf.extend(rows(6, 2), stream=1)
    buf.extend(rows(6, 3), stream=0)
    buf.save(tmp_path / "c")
    pos = read_array(tmp_path / "c", "storage/streams/position")
    edit_array(tmp_path / "c", "storage/streams/position", lambda a: a.__setitem__([0, 1], a[[1, 0]]))
    assert pos[0] != pos[1]
    refused(tmp_path / "c")


def test_a_next_obs_copy_missing_at_an_episode_end_is_refused(tmp_path):
    buf = ReplayBuffer(40, DICT_OBS, (1,))
    buf.extend(dict_rows(12, 1, ends=(4, 9)))
    buf.save(tmp_path / "c")
    slots = read_array(tmp_path / "c", "storage/next_obs_store/slots")
    assert 4 in slots.tolist()

    for key in ("storage/next_obs_store/slots", "storage/next_obs_store/values/next_obs.observation",
                "storage/next_obs_store/values/next_obs.achieved_goal",
                "storage/next_obs_store/values/next_obs.desired_goal"):
        edit_array(tmp_path / "c", key, lambda a: a[slots != 4])
    refused(tmp_path / "c", "next_obs_store", "slot 4")


def test_a_tail_pointing_at_another_row_is_refused(tmp_path):
    buf = ReplayBuffer(40, DICT_OBS, (1,))
    buf.extend(dict_rows(12, 1, ends=(4,)))
    buf.save(tmp_path / "c")
    tails = read_array(tmp_path / "c", "storage/next_obs_store/tails")
    assert tails.tolist() == [[0, 11, 1]]
    edit_array(tmp_path / "c", "storage/next_obs_store/tails", lambda a: a.__setitem__((0, 1), 3))
    refused(tmp_path / "c", "tails")

