"""LeRobot camera features: "image" (PNG bytes in the parquet) and "video" (mp4 beside it) read as uint8 [C, H, W]
keys of dict observations, and written back. The hand-made directories are written with pyarrow, Pillow and PyAV
directly (the format's documented layout: see relive.data.lerobot_io), not with relive's writer."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")

from relive.data.lerobot_io import buffer_rows, read_lerobot, write_lerobot  # noqa: E402
from relive.replay import ReplayBuffer  # noqa: E402

FPS = 10
IMG = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def frame(e: int, t: int, c: int = 3, h: int = 6, w: int = 8) -> np.ndarray:
    """A frame-identifying uint8 [C, H, W] image (episode e, frame t)."""
    rng = np.random.default_rng(1000 * e + t)
    return rng.integers(0, 256, (c, h, w), dtype=np.uint8)


def png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    hwc = img.transpose(1, 2, 0)
    Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc).save(buf, format="PNG")
    return buf.getvalue()


def mp4(path, frames, fps=FPS):
    """Lossless H.264 (libx264rgb, qp 0) written with PyAV: frames uint8 [T, 3, H, W]."""
    av = pytest.importorskip("av")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264rgb", rate=fps)
        s.width, s.height, s.pix_fmt, s.options = frames.shape[3], frames.shape[2], "rgb24", {"qp": "0"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f.transpose(1, 2, 0)), "rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def write_v21(root, lengths=(5, 4), video=True, image_bytes=None, image_shape=(6, 8, 3)):
    """A v2.1 directory (one parquet and one mp4 per episode) with a PNG camera `observation.image`, a video camera
    `observation.images.top` (frames of episode e + 50) and a state vector."""
    feats = {
        "observation.image": {"dtype": "image", "shape": list(image_shape), "names": ["height", "width", "channel"]},
        "observation.state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [1], "names": None},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in ("frame_index", "episode_index", "index",
                                                                         "task_index")},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None}}
    if video:
        feats["observation.images.top"] = {"dtype": "video", "shape": [6, 8, 3],
                                           "names": ["height", "width", "channels"]}
    info = {"codebase_version": "v2.1", "fps": FPS, "chunks_size": 1000, "total_episodes": len(lengths),
            "total_frames": sum(lengths), "features": feats,
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"}
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    start = 0
    for e, n in enumerate(lengths):
        t = np.arange(n)
        cols = {"observation.image": pa.array([{"bytes": image_bytes if image_bytes is not None else
                                                png(frame(e, i)), "path": None} for i in t], IMG),
                "observation.state": pa.array([[e, i] for i in t], pa.list_(pa.float32())),
                "action": pa.array((t * 0.5).astype(np.float32)), "next.reward": pa.array(t.astype(np.float32)),
                "next.done": pa.array(t == n - 1 if e == 0 else np.zeros(n, bool)),
                "timestamp": pa.array((t / FPS).astype(np.float32)), "frame_index": pa.array(t),
                "episode_index": pa.array(np.full(n, e)), "index": pa.array(start + t),
                "task_index": pa.array(np.zeros(n, np.int64))}
        path = root / info["data_path"].format(episode_chunk=0, episode_index=e)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path)
        if video:
            mp4(root / info["video_path"].format(episode_chunk=0, video_key="observation.images.top",
                                                 episode_index=e), np.stack([frame(e + 50, i) for i in t]))
        start += n
    return root


def test_hand_made_v21_with_png_and_video_cameras_reads_as_dict_observations(tmp_path):
    pytest.importorskip("av")
    rows, meta = read_lerobot(write_v21(tmp_path / "d"))
    assert sorted(rows["obs"]) == ["image", "images_top", "state"]
    assert meta["obs_key_of_feature"] == {"observation.image": "image", "observation.state": "state",
                                          "observation.images.top": "images_top"}
    frames = np.stack([frame(e, i) for e, n in enumerate((5, 4)) for i in range(n)])
    top = np.stack([frame(e + 50, i) for e, n in enumerate((5, 4)) for i in range(n)])
    assert rows["obs"]["image"].dtype == np.uint8 and rows["obs"]["image"].shape == (9, 3, 6, 8)
    np.testing.assert_array_equal(rows["obs"]["image"], frames)  # PNG: lossless
    np.testing.assert_array_equal(rows["obs"]["images_top"], top)  # lossless H.264, each row its own frame
    np.testing.assert_array_equal(rows["obs"]["state"], [[0, i] for i in range(5)] + [[1, i] for i in range(4)])
    # next_obs: the next frame of the episode, the last frame its own
    nxt = np.r_[1:5, 4, 6:9, 8]
    for key in ("image", "images_top", "state"):
        np.testing.assert_array_equal(rows["next_obs"][key], rows["obs"][key][nxt], err_msg=key)
    np.testing.assert_array_equal(rows["terminated"], np.arange(9) == 4)
    np.testing.assert_array_equal(rows["truncated"], np.arange(9) == 8)
    assert meta["skipped_features"] == {}
    # cameras="skip": today's flat vector observation
    with pytest.warns(UserWarning, match="are skipped"):
        flat, meta = read_lerobot(tmp_path / "d", cameras="skip")
    assert flat["obs"].shape == (9, 2) and sorted(meta["skipped_features"]) == ["observation.image",
                                                                                "observation.images.top"]


def test_a_dict_dataset_fills_a_replay_buffer_and_samples_images(tmp_path):
    rows, _ = read_lerobot(write_v21(tmp_path / "d", video=False))
    shapes = {k: (v.shape[1:], v.dtype) for k, v in rows["obs"].items()}
    buf = ReplayBuffer(100, shapes, 1, seed=0)
    buf.add_offline(rows)
    batch = buf.sample(8)
    assert batch.obs["image"].dtype == np.uint8 and batch.obs["image"].shape == (8, 3, 6, 8)
    # every sampled image is one of the dataset's frames, paired with its own state
    frames = {(int(s[0]), int(s[1])): img for s, img in zip(rows["obs"]["state"], rows["obs"]["image"], strict=True)}
    for s, img in zip(batch.obs["state"], batch.obs["image"], strict=True):
        np.testing.assert_array_equal(img, frames[(int(s[0]), int(s[1]))])


@pytest.mark.parametrize("images", ["png", "video"])
def test_dict_rows_round_trip_through_our_writer(tmp_path, images):
    if images == "video":
        pytest.importorskip("av")
    n, lengths = 9, (5, 4)
    img = np.stack([frame(e, i) for e, m in enumerate(lengths) for i in range(m)])
    gray = np.stack([frame(e, i, c=1) for e, m in enumerate(lengths) for i in range(m)])
    state = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    last = np.isin(np.arange(n), [4, 8])
    nxt = np.r_[1:5, 4, 6:9, 8]
    rows = {"obs": {"cam": img, "wrist": gray, "state": state},
            "next_obs": {"cam": img[nxt], "wrist": gray[nxt], "state": state[nxt] + last[:, None]},
            "action": np.random.default_rng(1).normal(size=(n, 2)).astype(np.float32),
            "reward": np.arange(n, dtype=np.float32), "terminated": np.arange(n) == 4, "truncated": np.arange(n) == 8}
    out = write_lerobot(tmp_path / "out", rows, fps=FPS, images=images)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["features"]["observation.cam"]["dtype"] == ("image" if images == "png" else "video")
    assert info["features"]["observation.cam"]["shape"] == [6, 8, 3]
    assert info["features"]["observation.wrist"]["shape"] == [6, 8, 1]
    back, meta = read_lerobot(out)
    for k in ("action", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(back[k], rows[k], err_msg=k)
    for k in ("cam", "wrist", "state"):
        np.testing.assert_array_equal(back["obs"][k], rows["obs"][k], err_msg=k)
    # next_obs: vectors exactly (next.observation.state is written); cameras from the next frame, so exactly except
    # at the truncated end (the frame after a truncation is not stored: its own frame stands in)
    np.testing.assert_array_equal(back["next_obs"]["state"], rows["next_obs"]["state"])
    for k in ("cam", "wrist"):
        np.testing.assert_array_equal(back["next_obs"][k], rows["next_obs"][k], err_msg=k)
    stats = json.loads((out / "meta" / "stats.json").read_text())
    assert np.asarray(stats["observation.cam"]["mean"]).shape == (3, 1, 1)  # LeRobot's per-channel image stats
    np.testing.assert_allclose(np.asarray(stats["observation.cam"]["max"]).ravel(),
                               img.max(axis=(0, 2, 3)) / 255.0)


def test_v30_video_of_several_episodes_in_one_file_uses_from_timestamp(tmp_path):
    """v3.0 packs episodes into one mp4; meta/episodes says where each starts (videos/<key>/from_timestamp)."""
    pytest.importorskip("av")
    lengths = (5, 4)
    img = np.stack([frame(e, i) for e, m in enumerate(lengths) for i in range(m)])
    n = len(img)
    rows = {"obs": {"cam": img, "state": np.zeros((n, 1), np.float32)},
            "next_obs": {"cam": img, "state": np.zeros((n, 1), np.float32)},
            "action": np.zeros((n, 1), np.float32), "reward": np.zeros(n, np.float32),
            "terminated": np.arange(n) == 4, "truncated": np.arange(n) == 8}
    out = write_lerobot(tmp_path / "out", rows, fps=FPS, images="video")
    key = "observation.cam"
    info = json.loads((out / "meta" / "info.json").read_text())
    for f in (out / "videos").rglob("*.mp4"):
        f.unlink()
    mp4(out / info["video_path"].format(video_key=key, chunk_index=0, file_index=0), img)  # both episodes
    ep_file = next((out / "meta" / "episodes").rglob("*.parquet"))
    t = pq.read_table(ep_file)
    t = t.set_column(t.schema.get_field_index(f"videos/{key}/file_index"), f"videos/{key}/file_index",
                     pa.array([0, 0], pa.int64()))
    t = t.set_column(t.schema.get_field_index(f"videos/{key}/from_timestamp"), f"videos/{key}/from_timestamp",
                     pa.array([0.0, lengths[0] / FPS]))
    pq.write_table(t, ep_file)
    back, _ = read_lerobot(out)
    np.testing.assert_array_equal(back["obs"]["cam"], img)
    # a wrong offset puts rows past the end of the video: refused, naming the file and the timestamp
    t = t.set_column(t.schema.get_field_index(f"videos/{key}/from_timestamp"), f"videos/{key}/from_timestamp",
                     pa.array([0.0, 2.0]))
    pq.write_table(t, ep_file)
    with pytest.raises(ValueError, match=r"file-000\.mp4: no frame within half a frame period of timestamp "
                                         r"2\.0000 s \(row 0 of episode 1"):
        read_lerobot(out)


def test_camera_errors_are_one_clear_line(tmp_path):
    with pytest.raises(ValueError, match=r"image feature 'observation.image' row 0 is not a decodable image"):
        read_lerobot(write_v21(tmp_path / "a", video=False, image_bytes=b"\x89PNG not really"))
    with pytest.raises(ValueError, match=r"row 0 is 8x6 pixels \(width x height\) but meta/info.json says 8x8; "
                                         r"not decoded"):  # from the PNG header, before decoding
        read_lerobot(write_v21(tmp_path / "b", video=False, image_shape=(8, 8, 3)))
    pytest.importorskip("av")
    root = write_v21(tmp_path / "c")
    (root / "videos/chunk-000/observation.images.top/episode_000001.mp4").unlink()
    with pytest.raises(ValueError, match=r"video file videos/chunk-000/observation.images.top/episode_000001.mp4 "
                                         r"for feature 'observation.images.top' \(episode 1\) is missing"):
        read_lerobot(root)
    with pytest.raises(ValueError, match="cameras must be 'decode' or 'skip'"):
        read_lerobot(root, cameras="yes")
    rows = {"obs": {"cam": np.zeros((2, 2, 4, 4), np.uint8)}, "next_obs": {"cam": np.zeros((2, 2, 4, 4), np.uint8)},
            "action": np.zeros((2, 1), np.float32), "reward": np.zeros(2, np.float32),
            "terminated": np.array([False, True]), "truncated": np.zeros(2, bool)}
    with pytest.raises(ValueError, match="image key 'cam' has 2 channels"):
        write_lerobot(tmp_path / "w", rows)
    assert not (tmp_path / "w").exists()


def test_buffer_rows_export_dict_observations(tmp_path):
    """A buffer of dict observations (dedup next_obs) exports as a LeRobot dataset and reads back the same rows."""
    rows, _ = read_lerobot(write_v21(tmp_path / "d", video=False))
    shapes = {k: (v.shape[1:], v.dtype) for k, v in rows["obs"].items()}
    buf = ReplayBuffer(100, shapes, 1, seed=0)
    buf.add_offline(rows)
    out = buffer_rows(buf, "offline")
    back, _ = read_lerobot(write_lerobot(tmp_path / "out", out, fps=FPS))
    for k in rows["obs"]:
        np.testing.assert_array_equal(back["obs"][k], rows["obs"][k], err_msg=k)
        np.testing.assert_array_equal(back["next_obs"][k], rows["next_obs"][k], err_msg=k)


def test_export_lerobot_cli_writes_a_dict_buffer_as_video(tmp_path):
    pytest.importorskip("av")
    from relive.cli import main

    rows, _ = read_lerobot(write_v21(tmp_path / "d", video=False))
    shapes = {k: (v.shape[1:], v.dtype) for k, v in rows["obs"].items()}
    buf = ReplayBuffer(100, shapes, 1, seed=0)
    buf.add_offline(rows)
    buf.save(tmp_path / "buf")
    assert main(["data", "export-lerobot", str(tmp_path / "buf"), "--rows", "offline", "--images", "video",
                 "--fps", str(FPS), "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out" / "videos" / "observation.image").rglob("*.mp4"))) == 2  # one per episode
    back, _ = read_lerobot(tmp_path / "out")
    np.testing.assert_array_equal(back["obs"]["image"], rows["obs"]["image"])
