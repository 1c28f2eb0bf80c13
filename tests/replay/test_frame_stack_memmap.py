"""Frame stacks on the memmap backend (``frame_stack`` + ``backend="memmap"``): the column files hold one frame a row,
every stack read equals the naive stack before and after the buffer is closed and reopened from its checkpoint (the
frames kept below each lane's eviction bound travel in the checkpoint), and the same writes give the same batches as
the RAM backend."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay import PrioritizedSampler, ReplayBuffer
from tests.replay.test_frame_stack import FRAME, SETTINGS, Layout, World, scenarios


def run_memmap_scenario(s, reopen_at: int) -> None:
    """A :func:`tests.replay.test_frame_stack.run_scenario` on the memmap backend, closed and reopened from its
    checkpoint after write ``reopen_at`` (then written on: episodes continue across the reopen)."""
    world = World(s["layout"], s["seed"], s["dict_obs"])
    capacity = s["capacity"] + s["offline"]
    with tempfile.TemporaryDirectory() as d:
        buf = world.buffer(capacity, n_step=s["n_step"], backend="memmap", directory=Path(d, "replay"))
        if s["offline"]:
            buf.add_offline(world.rows(99, s["offline"], s["end_p"]))
            world.current.pop(99, None)
        for j, (stream, n) in enumerate(s["writes"]):
            buf.extend(world.rows(stream, n, s["end_p"]), stream=stream)
            world.check(buf)
            if j == reopen_at:
                buf.save(Path(d, f"ckpt{j}"))
                buf.close()
                buf = ReplayBuffer.load(Path(d, f"ckpt{j}"))
                world.check(buf)
        world.check(buf)
        buf.close()


@settings(max_examples=12, **SETTINGS)
@given(scenarios(), st.integers(0, 11))
def test_memmap_stacks_equal_naive_stacks_across_a_reopen(s, reopen_at):
    run_memmap_scenario(s, min(reopen_at, len(s["writes"]) - 1))


@pytest.mark.slow
@settings(max_examples=150, **SETTINGS)
@given(scenarios(), st.integers(0, 11))
def test_memmap_stacks_equal_naive_stacks_across_a_reopen_long(s, reopen_at):
    run_memmap_scenario(s, reopen_at)


def test_the_column_files_hold_frames_and_the_kept_frames_survive_a_reopen(tmp_path):
    world = World(Layout("gym", 4), 0)
    buf = world.buffer(10, backend="memmap", directory=tmp_path / "replay")
    for _ in range(7):  # one long episode over several wraps: the oldest rows look back at evicted frames
        buf.extend(world.rows(0, 4, end_p=0.0))
    world.check(buf)
    on_disk = np.load(tmp_path / "replay" / "obs.npy", mmap_mode="r")
    assert on_disk.shape == (10, 1, *FRAME)  # a frame a row: no stacks in the files
    assert not (tmp_path / "replay" / "next_obs.npy").exists()  # next frames: the next row's
    buf.save(tmp_path / "ckpt")
    assert not list((tmp_path / "ckpt").rglob("obs*.npy"))  # the checkpoint refers to the files, copies no frame
    buf.close()
    again = ReplayBuffer.load(tmp_path / "ckpt")
    world.check(again)  # the oldest rows' stacks need the kept frames: they came back from the checkpoint
    again.extend(world.rows(0, 25, end_p=0.0))  # a write longer than the ring, continuing the episode
    world.check(again)
    again.close()


@pytest.mark.parametrize("layout", ["gym", "sb3_last"])
def test_memmap_and_ram_give_the_same_batches(tmp_path, layout):
    world = World(Layout(layout, 3, "zero"), 5)
    ram = world.buffer(30, sampler=PrioritizedSampler(priority_exponent=0.6), seed=1, n_step=2)
    mm = world.buffer(30, sampler=PrioritizedSampler(priority_exponent=0.6), seed=1, n_step=2, backend="memmap",
                      directory=tmp_path / "replay")
    for stream, n in [(0, 7), (1, 11), (0, 9), (2, 5), (1, 13), (0, 8)]:
        rows = world.rows(stream, n)
        ram.extend(rows, stream=stream)
        mm.extend(rows, stream=stream)
    for _ in range(3):
        a, b = ram.sample(16), mm.sample(16)
        np.testing.assert_array_equal(a.info.indices, b.info.indices)
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.next_obs, b.next_obs)
        ram.update(a.info, td_error=np.arange(16.0))
        mm.update(b.info, td_error=np.arange(16.0))
    mm.close()


def test_the_device_backend_still_refuses_frame_stacks_with_a_way_out():
    with pytest.raises(ValueError, match=r"'ram' or 'memmap'.*to_torch"):
        ReplayBuffer(10, (4, 2, 3), 1, obs_dtype=np.uint8, frame_stack=4, backend="torch")
