"""Datasets of single camera frames read as frame stacks (relive.data.frame_stacks): a LeRobot directory and a Minari
dataset written here, read with ``frame_stack=``, stored a frame a row, and every stack the buffer returns equal to a
naive stack built from the episode's frames (padding before an episode's first step as FrameStackObservation's
reset padding, or zeros)."""

from __future__ import annotations

import numpy as np
import pytest

from relive.data.frame_stacks import add_offline_stacked, frame_stack_buffer, stacked_obs_spec
from relive.replay import ReplayBuffer
from relive.replay.storage import FrameStack

LENGTHS = (1, 4, 2, 7, 3)  # episodes (one of a single step: all padding)
SHAPE = (3, 6, 8)  # a uint8 [C, H, W] camera


def camera_rows(seed: int = 0) -> dict:
    """Dict observations (``image`` + ``state``), next_obs[t] = obs[t + 1] inside each episode, ends alternating
    terminated / truncated (the last episode truncated)."""
    rng = np.random.default_rng(seed)
    obs, nxt, state, nstate, term, trunc = [], [], [], [], [], []
    for e, n in enumerate(LENGTHS):
        frames = rng.integers(0, 256, (n + 1, *SHAPE), dtype=np.uint8)
        s = rng.normal(size=(n + 1, 2)).astype(np.float32)
        obs.append(frames[:-1])
        nxt.append(frames[1:])
        state.append(s[:-1])
        nstate.append(s[1:])
        end = np.zeros(n, bool)
        end[-1] = True
        term.append(end & (e % 2 == 0) & (e != len(LENGTHS) - 1))
        trunc.append(end & ~term[-1])
    total = sum(LENGTHS)
    return {"obs": {"image": np.concatenate(obs), "state": np.concatenate(state)},
            "next_obs": {"image": np.concatenate(nxt), "state": np.concatenate(nstate)},
            "action": rng.uniform(-1, 1, (total, 1)).astype(np.float32),
            "reward": rng.normal(size=total).astype(np.float32),
            "terminated": np.concatenate(term), "truncated": np.concatenate(trunc)}


def naive_stacks(frames: np.ndarray, next_frames: np.ndarray, ends: np.ndarray, fs: FrameStack):
    """obs / next_obs stacks row by row from the episode's frames (its obs frames, then the row's next frame)."""
    k = fs.num_frames
    obs, nxt = [], []
    start = 0
    for i in range(len(frames)):
        seq = [*frames[start : i + 1], next_frames[i]]  # the episode's frames up to the row's next one
        t = i - start

        pad = seq[0] if fs.padding == "reset" else np.zeros_like(seq[0])
        obs.append(np.concatenate([seq[j] if j >= 0 else pad for j in range(t - k + 1, t + 1)], axis=fs.axis))
        nxt.append(np.concatenate([seq[j] if j >= 0 else pad for j in range(t - k + 2, t + 2)], axis=fs.axis))
        if ends[i]:
            start = i + 1
    return np.stack(obs), np.stack(nxt)


def check_buffer(buf: ReplayBuffer, rows: dict, key, fs: FrameStack) -> None:
    n = len(rows["reward"])
    b = buf.gather(np.arange(n))  # (offline rows: slots 0 .. n - 1 in order)
    ends = rows["terminated"] | rows["truncated"]
    frames = rows["obs"][key] if key else rows["obs"]
    next_frames = rows["next_obs"][key] if key else rows["next_obs"]
    want_obs, want_next = naive_stacks(frames, next_frames, ends, fs)
    got_obs, got_next = (b.obs[key], b.next_obs[key]) if key else (b.obs, b.next_obs)
    np.testing.assert_array_equal(got_obs, want_obs)
    np.testing.assert_array_equal(got_next, want_next)
    if key:
        np.testing.assert_array_equal(b.obs["state"], rows["obs"]["state"])
    assert buf.storage.specs["obs." + key if key else "obs"].shape == frames.shape[1:]  # a frame a row


@pytest.mark.parametrize("fs", [FrameStack(3), FrameStack(4, padding="zero"), FrameStack(2, axis=-1)])
def test_single_frame_rows_become_naive_stacks_across_chunks(fs):
    rows = camera_rows()
    buf = frame_stack_buffer(rows, {"image": fs}, online_capacity=8, seed=0)
    check_buffer(buf, rows, "image", fs)
    # the same rows a few at a time (chunks cut episodes): the same stacks
    spec, _ = stacked_obs_spec(rows, {"image": fs})
    again = ReplayBuffer(len(rows["reward"]) + 8, spec, (1,), frame_stack={"image": fs})
    add_offline_stacked(again, rows, chunk_rows=3)
    check_buffer(again, rows, "image", fs)
    # sampled batches hold the stacks too (the buffer rebuilds them at sample time)
    batch = buf.sample(16)
    want, _ = naive_stacks(rows["obs"]["image"], rows["next_obs"]["image"], rows["terminated"] | rows["truncated"], fs)
    np.testing.assert_array_equal(batch.obs["image"], want[batch.info.indices])


def test_flat_observations():
    rows = camera_rows(1)
    flat = dict(rows, obs=rows["obs"]["image"], next_obs=rows["next_obs"]["image"])
    buf = frame_stack_buffer(flat, 3, online_capacity=4)
    check_buffer(buf, flat, None, FrameStack(3))
    assert buf.sample(4).obs.shape == (4, 9, 6, 8)


def test_lerobot_camera_as_a_frame_stack(tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("PIL")
    from relive.data.lerobot_io import read_lerobot, write_lerobot

    write_lerobot(tmp_path / "ds", camera_rows(2), fps=10, images="png")
    rows, meta = read_lerobot(tmp_path / "ds", frame_stack={"image": 3})
    assert meta["frame_stack"] == {"image": {"num_frames": 3, "axis": 0, "padding": "reset"}}
    assert rows["obs"]["image"].shape == (sum(LENGTHS), *SHAPE)  # the rows keep a frame a step
    buf = frame_stack_buffer(rows, meta["frame_stack"], online_capacity=10)
    check_buffer(buf, rows, "image", FrameStack(3))
    np.testing.assert_array_equal(rows["obs"]["image"], camera_rows(2)["obs"]["image"])  # (PNG: lossless)
    with pytest.raises(ValueError, match="unknown observation key"):
        read_lerobot(tmp_path / "ds", frame_stack={"top": 3})
    assert "frame_stack" not in read_lerobot(tmp_path / "ds")[1]


def test_minari_camera_as_a_frame_stack(tmp_path):
    pytest.importorskip("minari")
    from relive.data.minari_io import read_minari, write_minari

    write_minari("test/cam/frames-v0", camera_rows(3), "Pendulum-v1", root=tmp_path)
    rows, meta = read_minari("test/cam/frames-v0", root=tmp_path, flatten=False,
                             frame_stack={"image": FrameStack(2, padding="zero")})
    assert meta["frame_stack"] == {"image": {"num_frames": 2, "axis": 0, "padding": "zero"}}
    buf = frame_stack_buffer(rows, meta["frame_stack"], online_capacity=10)
    check_buffer(buf, rows, "image", FrameStack(2, padding="zero"))
    with pytest.raises(ValueError, match="flatten=False"):
        read_minari("test/cam/frames-v0", root=tmp_path, frame_stack={"image": 2})


def test_declarations_are_checked():
    rows = camera_rows()
    with pytest.raises(ValueError, match="name the stacked key"):
        frame_stack_buffer(rows, 3, online_capacity=1)
    with pytest.raises(ValueError, match="out of range"):
        frame_stack_buffer(rows, {"image": FrameStack(2, axis=5)}, online_capacity=1)
    with pytest.raises(ValueError, match="no frame_stack"):
        add_offline_stacked(ReplayBuffer(10, (3,), (1,)), rows)
    broken = camera_rows()
    broken["next_obs"]["image"] = broken["next_obs"]["image"][::-1].copy()  # next frames of other steps
    buf = frame_stack_buffer(camera_rows(), {"image": 2}, online_capacity=1)
    assert buf.num_offline == sum(LENGTHS)
    spec, _ = stacked_obs_spec(broken, {"image": 2})
    other = ReplayBuffer(40, spec, (1,), frame_stack={"image": 2})
    add_offline_stacked(other, broken)  # (a dataset's next frame is its own: stored, and read back as given)
    check_buffer(other, broken, "image", FrameStack(2))
