"""Issue 27, items 3, 4 and 13: a dataset reads only files under its own directory, a Minari directory is read as
named, and a small file cannot make a reader allocate what it does not hold. Each test builds its files with
relive's own writers (then edits them the way an attacker or a careless copy would)."""

from __future__ import annotations

import io
import json
import shutil
import tracemalloc
import zipfile

import h5py
import numpy as np
import pytest

from relive.data.d4rl_io import read_d4rl_hdf5, write_d4rl_hdf5
from relive.data.loaders import load_rows
from relive.data.minari_io import read_minari, write_minari
from relive.data.npz_io import load_dataset, save_dataset
from relive.train.collector import collect_dataset


@pytest.fixture(scope="module")
def rows():
    return collect_dataset("Pendulum-v1", 20, seed=0, max_episode_steps=10)  # two 10-step episodes


def _peak_bytes(fn) -> tuple[int, BaseException | None]:
    """Peak of Python-traced memory (numpy arrays included) while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    err = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the caller, who checks it
        err = e
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, err


# -- D4RL ----------------------------------------------------------------------------------------------------
def _d4rl_with(path, rows, **replace):
    """A D4RL file written by relive, then keys replaced by ``replace[key](f, key)``."""
    write_d4rl_hdf5(path, rows)
    with h5py.File(path, "a") as f:
        for key, make in replace.items():
            del f[key]
            make(f, key)
    return path


def test_d4rl_external_storage_is_refused_not_read(tmp_path, rows):
    secret = tmp_path / "elsewhere.bin"
    secret.write_bytes(np.arange(60, dtype=np.float32).tobytes())
    path = _d4rl_with(tmp_path / "d.hdf5", rows, observations=lambda f, k: f.create_dataset(
        k, shape=(20, 3), dtype="f4", external=[(str(secret), 0, 240)]))
    with pytest.raises(ValueError, match=r"d\.hdf5: dataset 'observations' uses HDF5 external storage"):
        read_d4rl_hdf5(path)


def test_d4rl_external_link_and_virtual_dataset_are_refused(tmp_path, rows):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["obs"] = rows["obs"]
    path = _d4rl_with(tmp_path / "link.hdf5", rows,
                      observations=lambda f, k: f.__setitem__(k, h5py.ExternalLink(str(other), "/obs")))
    with pytest.raises(ValueError, match=r"link\.hdf5: 'observations' is an HDF5 external link to .*other\.h5"):
        read_d4rl_hdf5(path)

    def virtual(f, k):
        layout = h5py.VirtualLayout(shape=(20, 3), dtype="f4")
        layout[:] = h5py.VirtualSource(str(other), "obs", shape=(20, 3))
        f.create_virtual_dataset(k, layout)

    path = _d4rl_with(tmp_path / "virtual.hdf5", rows, observations=virtual)
    with pytest.raises(ValueError, match=r"virtual\.hdf5: dataset 'observations' is an HDF5 virtual dataset"):
        read_d4rl_hdf5(path)


def test_d4rl_declared_size_beyond_the_file_is_refused_before_allocating(tmp_path, rows):
    # chunked, never written: a few KB on disk, 24 MB when read (issue 27: 4.6 KB -> 1.2 GB)
    path = _d4rl_with(tmp_path / "big.hdf5", rows, observations=lambda f, k: f.create_dataset(
        k, shape=(2_000_000, 3), dtype="f4", chunks=(4096, 3)))
    assert path.stat().st_size < 64_000
    peak, err = _peak_bytes(lambda: read_d4rl_hdf5(path))
    assert isinstance(err, ValueError)
    assert "big.hdf5: dataset 'observations' declares shape (2000000, 3) (24000000 bytes) but stores only 0" in str(err)
    assert peak < 4_000_000


def test_d4rl_truncated_file_is_named(tmp_path, rows):
    path = write_d4rl_hdf5(tmp_path / "cut.hdf5", rows)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 200])
    with pytest.raises(ValueError, match=r"cut\.hdf5"):
        read_d4rl_hdf5(path)


# -- Minari --------------------------------------------------------------------------------------------------
def _minari(tmp_path, rows, name="t/pend/orig-v0"):
    return write_minari(name, rows, "Pendulum-v1", root=tmp_path / "minari")


def test_a_minari_directory_is_read_as_named_not_by_the_id_in_its_metadata(tmp_path, rows):
    orig = _minari(tmp_path, rows)
    copy = orig.parent / "edited-v0"  # a copy beside it: its metadata still says t/pend/orig-v0
    shutil.copytree(orig, copy)
    with h5py.File(copy / "data" / "main_data.hdf5", "a") as f:
        f["episode_0/rewards"][...] = 7.0
    got, meta = read_minari(copy)
    np.testing.assert_array_equal(got["reward"][:10], 7.0)  # the edited copy, not the original
    np.testing.assert_allclose(got["reward"][10:], rows["reward"][10:], rtol=1e-6)
    assert meta["path"] == str(copy.resolve()) and meta["dataset_id"] == "t/pend/orig-v0"
    original, _ = read_minari(orig)
    np.testing.assert_allclose(original["reward"], rows["reward"], rtol=1e-6)
    # a copy far from any Minari root reads the same
    far = tmp_path / "far" / "x"
    shutil.copytree(copy, far)
    np.testing.assert_array_equal(read_minari(far)[0]["reward"][:10], 7.0)


def test_minari_external_storage_is_refused(tmp_path, rows):
    path = _minari(tmp_path, rows)
    secret = tmp_path / "elsewhere.bin"
    secret.write_bytes(np.ones(10).tobytes())
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:
        del f["episode_0/rewards"]
        f.create_dataset("episode_0/rewards", shape=(10,), dtype="f8", external=[(str(secret), 0, 80)])
    with pytest.raises(ValueError, match=r"main_data\.hdf5: dataset 'episode_0/rewards' uses HDF5 external storage"):
        read_minari(path)


def test_minari_data_file_symlinked_outside_is_refused(tmp_path, rows):
    path = _minari(tmp_path, rows)
    outside = tmp_path / "outside.hdf5"
    (path / "data" / "main_data.hdf5").rename(outside)
    (path / "data" / "main_data.hdf5").symlink_to(outside)
    with pytest.raises(ValueError, match=r"data/main_data\.hdf5 resolves to .*outside\.hdf5, outside the dataset"):
        read_minari(path)


def _edit_metadata(path, **changes):
    meta_path = path / "data" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for k, v in changes.items():
        if v is None:
            meta.pop(k, None)
        else:
            meta[k] = v
    meta_path.write_text(json.dumps(meta))


def test_minari_declared_sizes_are_checked_before_minari_allocates(tmp_path, rows):
    path = _minari(tmp_path, rows)
    _edit_metadata(path, total_episodes=10**12)  # minari would allocate np.arange(total_episodes)
    with pytest.raises(ValueError, match=r"metadata\.json: total_episodes = 1000000000000 but .*main_data\.hdf5 "
                                         r"holds 2 entries"):
        read_minari(path)
    _edit_metadata(path, total_episodes=2, observation_space=json.dumps(
        {"type": "Box", "dtype": "float32", "shape": [100000, 100000], "low": -1.0, "high": 1.0}))
    with pytest.raises(ValueError, match=r"metadata\.json: observation_space: Box of shape \[100000, 100000\]"):
        read_minari(path)
    path = _minari(tmp_path, rows, "t/pend/big-v0")
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:  # never written: stored in 0 bytes
        del f["episode_1/rewards"]
        f.create_dataset("episode_1/rewards", shape=(3_000_000,), dtype="f8", chunks=(4096,))
    peak, err = _peak_bytes(lambda: read_minari(path))
    assert isinstance(err, ValueError) and "dataset 'episode_1/rewards' declares shape (3000000,)" in str(err)
    assert peak < 8_000_000


def test_minari_metadata_without_spaces_does_not_build_the_env_it_names(tmp_path, rows, monkeypatch):
    """minari builds the environment of ``env_spec`` when the spaces are missing: gym.make imports the module
    named in the file. Refused before minari runs."""
    marker = tmp_path / "imported"
    (tmp_path / "evil_env_module.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "class Env:\n    def __init__(self, **kw):\n        raise RuntimeError('built')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _minari(tmp_path, rows)
    meta = json.loads((path / "data" / "metadata.json").read_text())
    spec = json.loads(meta["env_spec"])
    spec.update(id="Evil-v0", entry_point="evil_env_module:Env")
    _edit_metadata(path, observation_space=None, env_spec=json.dumps(spec))
    with pytest.raises(ValueError, match=r"metadata\.json: no observation_space recorded"):
        read_minari(path)
    assert not marker.exists()


# -- npz -----------------------------------------------------------------------------------------------------
def test_npz_header_declaring_more_than_the_member_holds_is_refused_before_allocating(tmp_path, rows):
    path = save_dataset(tmp_path / "d.npz", rows)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**9,)})
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("zz_obs_huge.npy", header.getvalue() + b"\0" * 64)  # 4 GB declared, 64 bytes held
    peak, err = _peak_bytes(lambda: load_dataset(path))
    assert isinstance(err, ValueError)
    assert "d.npz: member 'zz_obs_huge.npy' declares shape (1000000000,)" in str(err)
    assert peak < 50_000_000


@pytest.mark.parametrize("column, value", [("obs", np.float32(1)), ("reward", np.float32(1)),
                                           ("terminated", np.array(["a"] * 20)), ("obs", np.zeros((20, 3), complex))])
def test_npz_columns_that_are_not_arrays_of_numbers_are_named(tmp_path, rows, column, value):
    path = save_dataset(tmp_path / "c.npz", {**rows, column: value})
    with pytest.raises(ValueError, match=rf"c\.npz: column '{column}' must be an array of numbers or booleans"):
        load_rows(path)


def test_npz_object_arrays_and_non_zip_files_are_one_line_errors(tmp_path, rows):
    path = save_dataset(tmp_path / "o.npz", rows)
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("meta_x.npy", buf.getvalue())
    with pytest.raises(ValueError, match=r"o\.npz: member 'meta_x.npy' holds Python objects"):
        load_dataset(path)
    plain = tmp_path / "plain.npz"
    np.save(plain.with_suffix(".npy"), np.zeros(3))
    plain.with_suffix(".npy").rename(plain)  # an .npy under an .npz name
    with pytest.raises(ValueError, match=r"plain\.npz: not a readable \.npz"):
        load_dataset(plain)
    meta = save_dataset(tmp_path / "m.npz", rows, env_id=["a", "b"])
    with pytest.raises(ValueError, match=r"m\.npz: metadata 'meta_env_id' has 2 values"):
        load_dataset(meta)


# -- LeRobot -------------------------------------------------------------------------------------------------
def _lerobot_video(tmp_path, n=6, side=8, name="ds"):
    """A one-episode LeRobot v3.0 directory written by relive with a video camera ``observation.cam``."""
    pytest.importorskip("av")
    pytest.importorskip("pyarrow")
    from relive.data.lerobot_io import write_lerobot

    cam = np.random.default_rng(0).integers(0, 256, (n, 3, side, side), dtype=np.uint8)
    state = np.zeros((n, 2), np.float32)
    video_rows = {"obs": {"cam": cam, "state": state}, "next_obs": {"cam": cam, "state": state},
                  "action": np.zeros((n, 1), np.float32), "reward": np.zeros(n, np.float32),
                  "terminated": np.arange(n) == n - 1, "truncated": np.zeros(n, bool)}
    return write_lerobot(tmp_path / name, video_rows, fps=10, images="video")


def _set_info(root, **changes):
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    info.update(changes)
    path.write_text(json.dumps(info))


V3_VIDEO = "{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


@pytest.mark.parametrize("where", ["relative", "absolute", "symlinked directory"])
def test_lerobot_videos_outside_the_dataset_are_refused(tmp_path, where):
    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / "videos", elsewhere)  # the same, readable mp4s, outside the directory
    if where == "relative":
        _set_info(root, video_path="../elsewhere/" + V3_VIDEO)
    elif where == "absolute":
        _set_info(root, video_path=str(elsewhere) + "/" + V3_VIDEO)
    else:
        (root / "videos").symlink_to(elsewhere)
    with pytest.raises(ValueError, match=r"video file for feature 'observation.cam' \(episode 0\) .* resolves to "
                                         r".*elsewhere/observation.cam/chunk-000/file-000\.mp4, outside the dataset"):
        read_lerobot(root)


def test_lerobot_data_and_metadata_files_symlinked_outside_are_refused(tmp_path):
    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path)
    data = root / "data" / "chunk-000" / "file-000.parquet"
    data.rename(tmp_path / "outside.parquet")
    data.symlink_to(tmp_path / "outside.parquet")
    with pytest.raises(ValueError, match=r"data file data/chunk-000/file-000\.parquet resolves to .*outside\.parquet"):
        read_lerobot(root)
    root = _lerobot_video(tmp_path, name="ds2")
    info = root / "meta" / "info.json"
    info.rename(tmp_path / "info.json")
    info.symlink_to(tmp_path / "info.json")
    with pytest.raises(ValueError, match=r"metadata file meta/info\.json resolves to .*/info\.json, outside"):
        read_lerobot(root)


@pytest.mark.parametrize("template, match", [
    ("videos/{video_key}/chunk-{chunk_index:01000d}/file-{file_index:03d}.mp4", r"at most two digits of width"),
    ("videos/{video_key.__class__}/file-{file_index:03d}.mp4", r"has field \{video_key\.__class__\}"),
    ("videos/{video_key!r}/file-{file_index:03d}.mp4", r"has field \{video_key!r\}"),
    ("videos/{0}/file.mp4", r"has field \{0\}"),
])
def test_lerobot_video_path_template_fields_are_bounded(tmp_path, template, match):
    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path)
    _set_info(root, video_path=template)
    with pytest.raises(ValueError, match=r"info\.json: video_path .*" + match):
        read_lerobot(root)


def _mp4(path, frames: int, side: int, fps: int = 10) -> None:
    """A constant-colour lossless mp4 (small on disk whatever its frame count and size)."""
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264rgb", rate=fps)
        s.width, s.height, s.pix_fmt, s.options = side, side, "rgb24", {"qp": "0"}
        img = np.full((side, side, 3), 90, np.uint8)
        for _ in range(frames):
            for p in s.encode(av.VideoFrame.from_ndarray(img, "rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


class _CountingAv:
    """``av.open`` that counts the frames converted to arrays (PyAV's frame buffers are not traced by
    tracemalloc, so the count stands for the memory they take)."""

    def __init__(self, av):
        self.real_open, self.converted = av.open, 0

    def open(self, *args, **kwargs):
        counter, container = self, self.real_open(*args, **kwargs)

        class Frame:
            def __init__(self, frame):
                self._frame = frame

            def __getattr__(self, name):
                return getattr(self._frame, name)

            def to_ndarray(self, *a, **kw):
                counter.converted += 1
                return self._frame.to_ndarray(*a, **kw)

        class Container:
            streams = container.streams

            def __enter__(self):
                container.__enter__()
                return self

            def __exit__(self, *exc):
                return container.__exit__(*exc)

            def decode(self, *a, **kw):
                return (Frame(f) for f in container.decode(*a, **kw))

        return Container()


def test_lerobot_video_larger_than_declared_is_refused_before_decoding(tmp_path, monkeypatch):
    import av

    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path)
    video = root / "videos" / "observation.cam" / "chunk-000" / "file-000.mp4"
    _mp4(video, frames=60, side=256)  # the feature says 8 x 8
    assert video.stat().st_size < 100_000
    counting = _CountingAv(av)
    monkeypatch.setattr(av, "open", counting.open)
    with pytest.raises(ValueError, match=r"file-000\.mp4: frames are 256x256 \(width x height\) but meta/info\.json "
                                         r"says 8x8; not decoded"):
        read_lerobot(root)
    assert counting.converted == 0


def test_lerobot_video_is_decoded_frame_by_frame_keeping_only_the_frames_rows_use(tmp_path, monkeypatch):
    import av

    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path, side=64)
    video = root / "videos" / "observation.cam" / "chunk-000" / "file-000.mp4"
    _mp4(video, frames=400, side=64)  # 6 rows use the first 6 of 400 frames
    counting = _CountingAv(av)
    monkeypatch.setattr(av, "open", counting.open)
    rows, _ = read_lerobot(root)
    np.testing.assert_array_equal(rows["obs"]["cam"], 90)
    assert counting.converted == 6  # decoded whole, all 400 frames were converted and kept


def test_lerobot_png_declaring_a_huge_image_is_not_decoded(tmp_path):
    pytest.importorskip("pyarrow")
    from PIL import Image

    from relive.data.lerobot_io import read_lerobot, write_lerobot

    n = 3
    cam = np.zeros((n, 3, 4, 4), np.uint8)
    state = np.zeros((n, 1), np.float32)
    root = write_lerobot(tmp_path / "png", {
        "obs": {"cam": cam, "state": state}, "next_obs": {"cam": cam, "state": state},
        "action": np.zeros((n, 1), np.float32), "reward": np.zeros(n, np.float32),
        "terminated": np.arange(n) == n - 1, "truncated": np.zeros(n, bool)})
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    Image.new("RGB", (3000, 3000)).save(buf, format="PNG")  # 27 MB decoded, 26 KB stored
    f = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(f)
    col = pa.array([{"bytes": buf.getvalue(), "path": None}] * n, t.schema.field("observation.cam").type)
    pq.write_table(t.set_column(t.schema.get_field_index("observation.cam"), "observation.cam", col), f)
    peak, err = _peak_bytes(lambda: read_lerobot(root))
    assert isinstance(err, ValueError)
    assert "row 0 is 3000x3000 pixels (width x height) but meta/info.json says 4x4; not decoded" in str(err)
    assert peak < 10_000_000


@pytest.mark.parametrize("changes, match", [
    ({"features": {"observation.state": {"dtype": "float32", "shape": [2**20, 2**20]}}},
     r"one frame of feature 'observation.state' \(shape \[1048576, 1048576\]\) would take 8\.19e\+03 GiB"),
    ({"features": {"observation.state": {"dtype": "float32", "shape": [2, -1]}}}, r"at most 8 positive integers"),
    ({"fps": "ten"}, r"fps must be a positive number"),
    ({"total_frames": 10**12}, r"total_frames = 1000000000000 but the parquet files hold 6"),
])
def test_lerobot_info_declarations_are_checked_before_reading(tmp_path, changes, match):
    from relive.data.lerobot_io import read_lerobot

    root = _lerobot_video(tmp_path)
    if "features" in changes:
        info = json.loads((root / "meta" / "info.json").read_text())
        info["features"].update(changes.pop("features"))
        changes["features"] = info["features"]
    _set_info(root, **changes)
    with pytest.raises(ValueError, match=match):
        read_lerobot(root)


def test_minari_jpeg_images_are_checked_from_their_headers_before_minari_decodes(tmp_path, rows):
    """minari stores uint8 [H, W, C] spaces of 32 x 32 and more as JPEG and decodes an episode into an array shaped
    by its first image: a small JPEG declaring a huge image is refused from its header."""
    from PIL import Image

    n = len(rows["reward"])
    image = np.full((n, 32, 32, 3), 100, np.uint8)
    cams = {**rows, "obs": {"image": image, "state": rows["obs"]},
            "next_obs": {"image": image, "state": rows["next_obs"]}}
    path = write_minari("t/cam/jpeg-v0", cams, "Pendulum-v1", root=tmp_path / "minari")
    got, _ = read_minari(path, flatten=False)
    assert got["obs"]["image"].shape == (n, 32, 32, 3)  # (JPEG: lossy)
    big = io.BytesIO()
    Image.new("RGB", (4000, 4000)).save(big, format="JPEG")  # 48 MB decoded, ~100 KB stored
    with h5py.File(path / "data" / "main_data.hdf5", "a") as f:
        rows_of = [np.frombuffer(big.getvalue(), np.uint8)] + list(f["episode_0/observations/image"][1:])
        del f["episode_0/observations/image"]
        f.create_dataset("episode_0/observations/image", data=rows_of, dtype=h5py.vlen_dtype(np.uint8))
    peak, err = _peak_bytes(lambda: read_minari(path, flatten=False))
    assert isinstance(err, ValueError)
    assert "'episode_0/observations/image' row 0 is a 4000x4000 image (width x height) but its space says 32x32" in \
        str(err)
    assert peak < 20_000_000


def test_an_empty_dataset_is_refused_by_name(tmp_path):
    cartpole = collect_dataset("CartPole-v1", 4, seed=0)
    path = save_dataset(tmp_path / "empty.npz", {k: v[:0] for k, v in cartpole.items()})
    with pytest.raises(ValueError, match=r"empty\.npz: the dataset holds no rows"):
        load_rows(path, env_id="CartPole-v1")  # (a discrete env: the action range check met an empty array)
