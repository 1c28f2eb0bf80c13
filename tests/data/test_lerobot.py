"""LeRobot datasets (issue 17, item 4): relive rows <-> LeRobot dataset directories.

The ``lerobot`` package is not installed for these tests: ``pip install lerobot --dry-run`` (lerobot 0.3.2 under
this project's constraints) would downgrade gymnasium to 0.29 and pull torchvision, wandb, rerun, diffusers and
more. The datasets are therefore written by the tests themselves with ``pyarrow`` in the documented on-disk layout
(LeRobotDataset v2.1 by hand below, v3.0 by relive's writer), as checked against the lerobot source (see the
docstring of ``relive.data.lerobot_io``)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from relive.data.lerobot_io import buffer_rows, read_lerobot, write_lerobot  # noqa: E402
from relive.data.loaders import load_rows  # noqa: E402
from relive.data.rows import split_episodes  # noqa: E402
from relive.train.collector import collect_dataset  # noqa: E402


@pytest.fixture(scope="module")
def pendulum_rows():
    rows = collect_dataset("Pendulum-v1", 450, seed=0)  # 2 time-limit episodes + a cut one (truncated)
    rows["terminated"][79] = True  # and a terminal: episode ends of both kinds
    return rows


def _assert_rows_equal(got: dict, want: dict):
    for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        assert got[k].dtype == np.asarray(want[k]).dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_round_trip_rows_to_lerobot_v30_and_back(tmp_path, pendulum_rows):
    out = write_lerobot(tmp_path / "ds", pendulum_rows, fps=20, env_id="Pendulum-v1",
                        extra_metadata={"ref_min_return": -1500.0, "ref_max_return": -150.0})
    rows, meta = read_lerobot(out)
    _assert_rows_equal(rows, pendulum_rows)  # episode boundaries, flags, obs/action/reward/next_obs exact
    assert [(s.start, s.stop) for s in split_episodes(rows)] == [(0, 80), (80, 200), (200, 400), (400, 450)]
    assert meta["env_id"] == "Pendulum-v1" and meta["ref_min_return"] == -1500.0
    assert meta["observation_keys"] == [["observation.state", [3]]] and meta["total_episodes"] == 4
    # the layout LeRobot v3.0 reads
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20 and info["total_frames"] == 450
    assert info["total_episodes"] == 4
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["features"]["observation.state"]["shape"] == [3] and info["features"]["next.done"]["dtype"] == "bool"
    data = out / "data" / "chunk-000" / "file-000.parquet"
    assert pq.ParquetFile(data).num_row_groups == 4  # one row group per episode, as LeRobot's writer does
    table = pq.read_table(data)
    # column types as LeRobot's features map to datasets.Features: shape (1,) a scalar (Pendulum's one-dimensional
    # action too), a vector a fixed-size list (checked once with `datasets` 3.6's Dataset.from_parquet as well)
    assert table.schema.field("action").type == pa.float32() and table.schema.field("next.done").type == pa.bool_()
    assert table.schema.field("observation.state").type == pa.list_(pa.float32(), 3)
    np.testing.assert_array_equal(table.column("frame_index").to_numpy()[78:82], [78, 79, 0, 1])
    np.testing.assert_allclose(table.column("timestamp").to_numpy()[81], 1 / 20)
    assert table.column("next.done").to_numpy().sum() == 1
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    assert eps["length"] == [80, 120, 200, 50] and eps["dataset_to_index"] == [80, 200, 400, 450]
    assert eps["tasks"][0] == ["relive"] and eps["stats/action/count"][1] == [120]
    stats = json.loads((out / "meta" / "stats.json").read_text())
    np.testing.assert_allclose(stats["observation.state"]["mean"], pendulum_rows["obs"].mean(0), rtol=1e-5)
    assert stats["next.reward"]["count"] == [450] and "q99" in stats["action"]
    tasks = pq.read_table(out / "meta" / "tasks.parquet").to_pydict()
    assert tasks == {"task_index": [0], "task": ["relive"]}
    # never overwritten unless asked; nothing left behind by the staging directory
    with pytest.raises(ValueError, match="already exists; pass overwrite=True"):
        write_lerobot(out, pendulum_rows)
    half = {k: v[:200] for k, v in pendulum_rows.items()}
    write_lerobot(out, half, overwrite=True)
    _assert_rows_equal(read_lerobot(out)[0], half)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_discrete_actions_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    rows = dict(obs=rng.normal(size=(7, 4)).astype(np.float32), action=rng.integers(0, 2, 7),
                reward=np.ones(7, np.float32), terminated=np.array([0, 0, 1, 0, 0, 0, 0], bool),
                truncated=np.array([0, 0, 0, 0, 0, 0, 1], bool))
    rows["next_obs"] = rng.normal(size=(7, 4)).astype(np.float32)
    rows["action"] = rows["action"].astype(np.int64)
    _assert_rows_equal(read_lerobot(write_lerobot(tmp_path / "d", rows))[0], rows)


def _write_v21(root, *, reward=True, shape_in_info=3, done_at=(4,), frame_gap=False, lengths=(5, 4), cameras=False):
    """A LeRobot v2.1 directory as LeRobot 2.1 wrote it: one parquet file per episode under
    data/chunk-000/episode_XXXXXX.parquet, meta/info.json with the episode_chunk path template, meta/episodes.jsonl,
    tasks.jsonl and episodes_stats.jsonl; an image feature stored in the parquet (PNG bytes struct) and a video
    feature (mp4 files, not in the parquet), with ``cameras`` (placeholder bytes and no mp4 files: read with
    ``cameras="skip"``; the decoding of both is tested in test_lerobot_images.py)."""
    root.mkdir()
    (root / "meta").mkdir()
    feats = {
        "observation.image": {"dtype": "image", "shape": [8, 8, 3], "names": ["height", "width", "channel"]},
        "observation.images.top": {"dtype": "video", "shape": [8, 8, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [shape_in_info], "names": ["x", "y", "z"]},
        "observation.environment_state": {"dtype": "float32", "shape": [2], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": ["a0", "a1"]},
        "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        "next.done": {"dtype": "bool", "shape": [1], "names": None},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "frame_index": {"dtype": "int64", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
        "index": {"dtype": "int64", "shape": [1], "names": None},
        "task_index": {"dtype": "int64", "shape": [1], "names": None}}
    if not reward:
        del feats["next.reward"]
    if not cameras:
        del feats["observation.image"], feats["observation.images.top"]
    info = {"codebase_version": "v2.1", "robot_type": "koch", "total_episodes": len(lengths),
            "total_frames": sum(lengths), "total_tasks": 1, "total_videos": len(lengths), "total_chunks": 1,
            "chunks_size": 1000, "fps": 10, "splits": {"train": f"0:{len(lengths)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": feats}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    (root / "meta" / "tasks.jsonl").write_text(json.dumps({"task_index": 0, "task": "pick the cube"}) + "\n")
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": e, "tasks": ["pick the cube"], "length": n}) + "\n"
        for e, n in enumerate(lengths)))
    (root / "meta" / "episodes_stats.jsonl").write_text("")  # (not read)
    start, episodes = 0, []
    for e, n in enumerate(lengths):
        t = np.arange(n)
        state = (100 * e + 10 * t[:, None] + np.arange(3)).astype(np.float32)  # frame-identifying values
        env = (-state[:, :2]).astype(np.float32)
        cols = {
            "observation.image": pa.array([{"bytes": b"\x89PNG...", "path": None}] * n,
                                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "observation.state": pa.array([list(s) for s in state], pa.list_(pa.float32())),
            "observation.environment_state": pa.array([list(s) for s in env], pa.list_(pa.float32())),
            "action": pa.array([[0.1 * i, -0.1 * i] for i in t], pa.list_(pa.float32())),
            "next.reward": pa.array((t + 10 * e).astype(np.float32)),
            "next.done": pa.array([e == 0 and i in done_at for i in t]),
            "timestamp": pa.array((t / 10).astype(np.float32)),
            "frame_index": pa.array(np.where(t >= 2, t + 1, t) if frame_gap and e == 1 else t),
            "episode_index": pa.array(np.full(n, e)), "index": pa.array(start + t),
            "task_index": pa.array(np.zeros(n, int))}
        if not reward:
            del cols["next.reward"]
        if not cameras:
            del cols["observation.image"]
        table = pa.table(cols)
        if e == 1:  # rows out of time order in the file: the reader sorts by frame_index
            table = table.take(pa.array(np.r_[n - 1, np.arange(n - 1)]))
        path = root / info["data_path"].format(episode_chunk=0, episode_index=e)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        episodes.append((state, env))
        start += n
    return episodes


def test_hand_made_v21_directory_reads_with_episode_ends_and_next_obs(tmp_path):
    (s0, e0), (s1, e1) = _write_v21(tmp_path / "v21", cameras=True)
    with pytest.warns(UserWarning, match="image/video features .* are skipped"):
        rows, meta = read_lerobot(tmp_path / "v21", cameras="skip")
    obs0, obs1 = np.c_[s0, e0], np.c_[s1, e1]  # observation.* vectors concatenated in info.json order
    np.testing.assert_array_equal(rows["obs"], np.r_[obs0, obs1])
    # next_obs: the next frame of the same episode; an episode's last frame: its own observation
    np.testing.assert_array_equal(rows["next_obs"], np.r_[obs0[1:], obs0[-1:], obs1[1:], obs1[-1:]])
    # episode 0 ends with next.done (terminated), episode 1 without (truncated: the recording stopped)
    np.testing.assert_array_equal(rows["terminated"], np.arange(9) == 4)
    np.testing.assert_array_equal(rows["truncated"], np.arange(9) == 8)
    np.testing.assert_array_equal(rows["reward"], [0, 1, 2, 3, 4, 10, 11, 12, 13])
    np.testing.assert_allclose(rows["action"][6], [0.1, -0.1])
    assert meta["observation_keys"] == [["observation.state", [3]], ["observation.environment_state", [2]]]
    assert sorted(meta["skipped_features"]) == ["observation.image", "observation.images.top"]
    assert meta["codebase_version"] == "v2.1" and meta["fps"] == 10 and meta["robot_type"] == "koch"
    assert "its own observation" in meta["next_obs"] and meta["reward"] == "next.reward"
    # choosing the observation keys and how episode ends count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows, _ = read_lerobot(tmp_path / "v21", obs_keys=["observation.state"], episode_end="terminated")
    assert rows["obs"].shape == (9, 3) and rows["terminated"].sum() == 2 and not rows["truncated"].any()


def test_missing_reward_gives_zeros_with_a_warning(tmp_path):
    _write_v21(tmp_path / "v", reward=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows, meta = read_lerobot(tmp_path / "v")
    assert any("no next.reward feature; rewards are zeros" in str(w.message) for w in caught)
    assert meta["reward"] == "absent: zeros" and not rows["reward"].any()


@pytest.mark.parametrize("make, match", [
    (lambda r: (r / "meta" / "info.json").unlink(), "missing meta/info.json"),
    (lambda r: _set_info(r, shape=4), r"feature 'observation.state' has shape \[4\] in meta/info.json but its "
                                      r"parquet rows hold 3 values each"),
    (lambda r: _set_info(r, version="v1.6"), "codebase_version 'v1.6' is not supported"),
    (lambda r: _set_info(r, frames=10), "total_frames = 10 but the parquet files hold 9"),
    (lambda r: _set_info(r, drop="action"), "no vector 'action' feature"),
    (lambda r: _set_info(r, add="observation.velocity"), r"column\(s\) \['observation.velocity'\] declared in "
                                                         "meta/info.json are missing"),
    (lambda r: (r / "meta" / "episodes.jsonl").write_text(json.dumps({"episode_index": 0, "length": 5}) + "\n"
                                                          + json.dumps({"episode_index": 1, "length": 5}) + "\n"),
     "episode 1 has 4 frames in data/ but meta/episodes says 5"),
    (lambda r: (r / "data" / "chunk-000" / "episode_000001.parquet").write_bytes(b"PAR1 broken"),
     "episode_000001.parquet: not a readable parquet file"),
])
def test_bad_directories_get_one_line_errors(tmp_path, make, match):
    root = tmp_path / "bad"
    _write_v21(root)
    make(root)
    with warnings.catch_warnings(), pytest.raises(ValueError, match=match) as err:
        warnings.simplefilter("ignore")
        load_rows(root)
    assert "\n" not in str(err.value)


def test_inconsistent_episodes_are_refused(tmp_path):
    _write_v21(tmp_path / "a", done_at=(2,))
    _write_v21(tmp_path / "b", frame_gap=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="next.done is true at frame 2 of episode 0, before its last frame 4"):
            read_lerobot(tmp_path / "a")
        with pytest.raises(ValueError, match="episode 1 has frame_index 3 where 2 was expected"):
            read_lerobot(tmp_path / "b")
    with pytest.raises(ValueError, match="does not exist"):
        read_lerobot(tmp_path / "nope")


def _set_info(root, shape=None, version=None, frames=None, drop=None, add=None):
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    if shape is not None:
        info["features"]["observation.state"]["shape"] = [shape]
    if version is not None:
        info["codebase_version"] = version
    if frames is not None:
        info["total_frames"] = frames
    if drop is not None:
        del info["features"][drop]
    if add is not None:
        info["features"][add] = {"dtype": "float32", "shape": [1], "names": None}
    path.write_text(json.dumps(info))


def test_loader_checks_the_env_of_a_relive_written_dataset(tmp_path, pendulum_rows):
    out = write_lerobot(tmp_path / "ds", pendulum_rows, env_id="Pendulum-v1")
    rows, meta = load_rows(out, env_id="Pendulum-v1")
    assert meta["format"] == "lerobot" and len(rows["obs"]) == 450
    with pytest.raises(ValueError, match="was recorded on Pendulum-v1, not MountainCarContinuous-v0"):
        load_rows(out, env_id="MountainCarContinuous-v0")


def test_buffer_online_rows_export_after_wrap_around(tmp_path, pendulum_rows):
    """The online ring has overwritten the first rows of its oldest episode: the export starts that episode at
    its first stored row, keeps every later one whole, and the unfinished last episode reads back truncated."""
    from relive.replay import ReplayBuffer

    buf = ReplayBuffer(250, 3, 1)
    buf.add_offline({k: v[:100] for k, v in pendulum_rows.items()})
    online = {k: v[100:400] for k, v in pendulum_rows.items()}  # 300 online rows into a ring of 150
    online["truncated"] = online["truncated"].copy()
    online["truncated"][-1] = False  # the last episode is still running
    for i in range(0, 300, 70):
        buf.extend({k: v[i:i + 70] for k, v in online.items()})
    rows = buffer_rows(buf, "online")
    want = {k: v[150:] for k, v in online.items()}
    _assert_rows_equal(rows, want)
    back, _ = read_lerobot(write_lerobot(tmp_path / "online", rows))
    want["truncated"][-1] = True
    _assert_rows_equal(back, want)
    _assert_rows_equal(buffer_rows(buf, "offline"), {k: v[:100] for k, v in pendulum_rows.items()})
    with pytest.raises(ValueError, match="source must be one of"):
        buffer_rows(buf, "everything")


def test_a_lerobot_dataset_trains_and_the_run_exports_its_online_rows(tmp_path, pendulum_rows, capsys):
    from relive.cli import main
    from relive.replay import ReplayBuffer

    data = write_lerobot(tmp_path / "lerobot", pendulum_rows, env_id="Pendulum-v1")
    run = tmp_path / "run"
    assert main(["train", "calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "5",
                 "--online-steps", "10", "--warmup", "5", "--eval-every", "10", "--eval-episodes", "1",
                 "--batch-size", "32", "--set", "agent.hidden=[16,16]", "--set", "agent.cql_n_actions=2",
                 "--set", "run.save_final_buffer=true", "--run-dir", str(run), "--no-progress"]) == 0
    out = tmp_path / "exported"
    assert main(["data", "export-lerobot", str(run), "--out", str(out), "--fps", "20"]) == 0
    assert "10 frames" in capsys.readouterr().out
    rows, meta = load_rows(out, env_id="Pendulum-v1")
    buf = ReplayBuffer.load(run / "buffer_final")
    want = buffer_rows(buf, "online")
    want["truncated"][-1] = True  # the run's last episode was cut by the end of the run
    _assert_rows_equal(rows, want)
    assert meta["relive"]["source"] == str(run) and meta["fps"] == 20
    assert main(["data", "export-lerobot", str(run), "--out", str(out)]) == 2  # exists: refused
    assert "--overwrite" in capsys.readouterr().err
    assert main(["data", "export-lerobot", str(run / "buffer_final"), "--out", str(out), "--rows", "offline",
                 "--overwrite"]) == 0
    _assert_rows_equal(read_lerobot(out)[0], pendulum_rows)
    import shutil

    shutil.rmtree(run / "buffer_final")  # a run without it: the buffer of its last checkpoint (here: the last one)
    assert main(["data", "export-lerobot", str(run), "--out", str(tmp_path / "from_ckpt"), "--rows", "all"]) == 0
    from_ckpt, _ = read_lerobot(tmp_path / "from_ckpt")
    assert len(from_ckpt["obs"]) >= len(pendulum_rows["obs"])
    _assert_rows_equal({k: v[:450] for k, v in from_ckpt.items()}, pendulum_rows)
