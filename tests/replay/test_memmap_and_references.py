"""Storage beyond RAM (issue 17, item 3): the memmap backend gives the same samples as RAM for the same seed, its
checkpoints refer to its files instead of copying them (and are refused once the files changed), and checkpoints
refer to the offline segment by dataset id + SHA-256 (refused, with a clear error, when the dataset changed)."""

import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer
from tests.replay.test_dict_obs import OBS, episode_rows


def rows_of(seed, n_eps=6):
    return episode_rows(np.random.default_rng(seed), [7, 3, 11, 5, 9, 4][:n_eps], 1000 * seed,
                        ("terminated", "truncated"))


def fill(buf, dataset_id=None):
    buf.add_offline(rows_of(1), dataset_id=dataset_id)
    for i, seed in enumerate((2, 3, 4, 5)):  # 4 x 39 online rows into a ring of 60 - 39 = 21: it wraps
        buf.extend(rows_of(seed), stream=i % 2)


@pytest.mark.parametrize("dedup", [True, False])
def test_memmap_and_ram_give_identical_samples(tmp_path, dedup):
    backends = ({}, {"backend": "memmap", "directory": tmp_path / "mm"})
    bufs = [ReplayBuffer(60, OBS, (1,), sampler=MixtureSampler(PrioritizedSampler(0.6, 0.4)), seed=7,
                         dedup_next_obs=dedup, **kw) for kw in backends]
    for b in bufs:
        fill(b)
    assert isinstance(bufs[1].storage.columns["obs.image"], np.memmap)
    assert (tmp_path / "mm" / "obs.image.npy").is_file()
    for step in range(5):
        x, y = (b.sample(16) for b in bufs)
        np.testing.assert_array_equal(x.info.indices, y.info.indices)
        for col in ("obs", "next_obs"):
            for k in ("image", "state"):
                np.testing.assert_array_equal(getattr(x, col)[k], getattr(y, col)[k])
        np.testing.assert_array_equal(x.action, y.action)
        for b, s in zip(bufs, (x, y), strict=True):
            b.update(s.info, td_error=np.arange(16.0) + step)


def test_memmap_checkpoint_refers_to_its_files(tmp_path):
    buf = ReplayBuffer(60, OBS, (1,), seed=3, backend="memmap", directory=tmp_path / "mm")
    fill(buf)
    buf.save(tmp_path / "ckpt")
    files = sorted(f.name for f in (tmp_path / "ckpt").iterdir())
    assert not [f for f in files if f.startswith("storage__columns")], files  # no column is copied
    want = buf.sample(8)
    buf.rng = np.random.default_rng(0)
    x = buf.sample(8)
    buf.close()  # one buffer per memmap directory: the loaded one takes it over
    back = ReplayBuffer.load(tmp_path / "ckpt")
    assert back.storage.backend == "memmap"
    back.rng = np.random.default_rng(0)
    y = back.sample(8)
    np.testing.assert_array_equal(x.obs["image"], y.obs["image"])
    np.testing.assert_array_equal(x.next_obs["state"], y.next_obs["state"])
    assert want.obs["image"].shape == (8, 2, 3)
    back.extend(rows_of(9))  # the files change: the checkpoint no longer matches them
    back.close()
    with pytest.raises(ValueError, match="was changed after this checkpoint was saved"):
        ReplayBuffer.load(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="exists: a memmap buffer creates its column files in a fresh directory"):
        ReplayBuffer(60, OBS, (1,), backend="memmap", directory=tmp_path / "mm")
    with pytest.raises(ValueError, match="backend='memmap' needs a directory"):
        ReplayBuffer(60, OBS, (1,), backend="memmap")


def test_checkpoint_refers_to_the_offline_dataset_by_id_and_hash(tmp_path):
    buf = ReplayBuffer(60, OBS, (1,), seed=3, dedup_next_obs=True)
    fill(buf, dataset_id="test/pixels-v0")
    buf.save(tmp_path / "ref")  # auto: one dataset id -> a reference
    ReplayBuffer(60, OBS, (1,), seed=3).save(tmp_path / "empty")
    full = ReplayBuffer(60, OBS, (1,), seed=3)
    fill(full)
    full.save(tmp_path / "copy")  # no dataset id: the rows are copied
    size = {p: (tmp_path / p / "storage__columns__obs.image.npy").stat().st_size for p in ("ref", "copy")}
    assert size["ref"] == size["copy"] - buf.num_offline * 6  # the 39 offline images are not in the checkpoint
    with pytest.raises(ValueError, match=r"refers to offline dataset 'test/pixels-v0' \(sha256 [0-9a-f]{16}\.\.\.\) "
                                         "instead of holding its rows: pass offline_rows"):
        ReplayBuffer.load(tmp_path / "ref")
    back = ReplayBuffer.load(tmp_path / "ref", offline_rows=lambda dataset_id: rows_of(1))
    np.testing.assert_array_equal(back.sample(32).info.indices, buf.sample(32).info.indices)
    everything = np.arange(len(buf))
    for col in ("obs", "next_obs"):
        for k in ("image", "state"):
            np.testing.assert_array_equal(back.storage.read(col, everything)[k], buf.storage.read(col, everything)[k])
    changed = rows_of(1)
    changed["obs"]["image"][5, 0, 0] ^= 1  # one bit of one pixel
    with pytest.raises(ValueError, match="offline dataset 'test/pixels-v0' changed since the checkpoint was saved: "
                                         "its rows hash to sha256"):
        ReplayBuffer.load(tmp_path / "ref", offline_rows=changed)
    with pytest.raises(ValueError, match="it has 35 rows, the checkpoint's had 39"):
        ReplayBuffer.load(tmp_path / "ref", offline_rows=rows_of(1, n_eps=5))
    with pytest.raises(ValueError, match="offline='reference' needs offline rows that came from one dataset"):
        full.save(tmp_path / "copy", offline="reference")


def test_a_referenced_offline_part_keeps_no_per_row_bookkeeping_and_rebuilds_it(tmp_path):
    """Its episode ids, steps, sources, generations and streams come from writing the rows again, checked against a
    hash: the checkpoint's meta arrays hold the online rows only, and the loaded buffer's equal the saved one's."""
    buf = ReplayBuffer(60, OBS, (1,), seed=3)
    fill(buf, dataset_id="test/pixels-v0")
    buf.save(tmp_path / "ref")
    k = buf.num_offline
    meta = np.load(tmp_path / "ref" / "storage__meta__episode_id.npy")
    assert meta.shape == (len(buf) - k,)
    back = ReplayBuffer.load(tmp_path / "ref", offline_rows=rows_of(1))
    for name, arr in buf.storage.meta.items():
        np.testing.assert_array_equal(back.storage.meta[name][: len(buf)], arr[: len(buf)], err_msg=name)
    live, back_live = buf.storage.episodes.live(), back.storage.episodes.live()
    for field in ("ids", "start", "length", "source"):
        np.testing.assert_array_equal(getattr(back_live, field), getattr(live, field), err_msg=field)
    from relive.replay.checkpoint import load_tree

    state = load_tree(tmp_path / "ref", kind="replay_buffer")
    state["storage"]["offline_ref"]["meta_sha256"] = "0" * 64  # as if the rebuilt bookkeeping differed
    with pytest.raises(ValueError, match="episode bookkeeping rebuilt from them differs"):
        ReplayBuffer.from_state_dict(state, offline_rows=rows_of(1))
    # a checkpoint from before (no meta_sha256, the offline rows' bookkeeping saved whole) still loads
    del state["storage"]["offline_ref"]["meta_sha256"]
    state["storage"]["meta"] = {n: a[: len(buf)].copy() for n, a in buf.storage.meta.items()}
    old = ReplayBuffer.from_state_dict(state, offline_rows=rows_of(1))
    np.testing.assert_array_equal(old.storage.meta["step_in_episode"][: len(buf)],
                                  buf.storage.meta["step_in_episode"][: len(buf)])


def test_extra_columns_are_copied_even_when_the_offline_rows_are_referenced(tmp_path):
    """set_column may change an extra column of offline rows after add_offline (returns-to-go, V-RACER's q_ret):
    a checkpoint that references the offline rows still copies the extra columns whole."""
    rows = rows_of(1)
    n = len(rows["reward"])
    buf = ReplayBuffer(60, OBS, (1,), seed=3, extra_columns={"q_ret": ()})
    buf.add_offline(rows | {"q_ret": np.zeros(n, np.float32)}, dataset_id="test/pixels-v0")
    buf.extend(rows_of(2) | {"q_ret": np.zeros(n, np.float32)})
    buf.set_column("q_ret", np.arange(5), np.arange(1.0, 6.0))
    buf.save(tmp_path / "ref")
    back = ReplayBuffer.load(tmp_path / "ref", offline_rows=rows | {"q_ret": np.zeros(n, np.float32)})
    np.testing.assert_array_equal(back.storage.columns["q_ret"][:6], [1, 2, 3, 4, 5, 0])


def test_saving_a_clean_memmap_buffer_twice_keeps_the_first_checkpoint_loadable(tmp_path):
    buf = ReplayBuffer(60, OBS, (1,), seed=3, backend="memmap", directory=tmp_path / "mm")
    fill(buf)
    buf.save(tmp_path / "a")
    buf.save(tmp_path / "b")  # nothing written in between: same files, same token
    buf.close()
    buf = ReplayBuffer.load(tmp_path / "a")
    buf.extend(rows_of(7))
    buf.save(tmp_path / "c")
    buf.close()
    ReplayBuffer.load(tmp_path / "c").close()
    with pytest.raises(ValueError, match="was changed after this checkpoint was saved"):
        ReplayBuffer.load(tmp_path / "a")


def test_an_extra_column_named_like_an_obs_column_is_an_extra_column():
    buf = ReplayBuffer(10, (2,), (1,), extra_columns={"next_obs_goal": (2,), "abcdeobs": ()})
    assert buf.storage.extra_names == ("next_obs_goal", "abcdeobs")
