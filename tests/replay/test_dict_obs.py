"""Dict observations as columns and next_obs without duplicated frames (issue 17, items 1 and 2).

The reference for ``dedup_next_obs=True`` is the same buffer with ``dedup_next_obs=False``, which stores next_obs
as an explicit copy of every row: after any sequence of writes (several streams interleaved, ring wrap-around,
episodes evicted from their first rows, an offline prefix, streams closed mid-episode, a checkpoint round trip)
both must return bit-identical next_obs for every stored row."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from relive.replay import (
    ARBSampler,
    BERBSampler,
    MixtureSampler,
    ReaPERSampler,
    ReplayBuffer,
    UniformSampler,
)
from relive.replay.samplers.refer import ReFERSampler

OBS = {"image": ((2, 3), np.uint8), "state": (2,)}


def episode_rows(rng, lengths, token0, ends=("truncated",), breaks=0.0, flat=False) -> dict:
    """Rows of consecutive episodes of one stream: within an episode next_obs[t] == obs[t + 1] (except at a
    fraction ``breaks`` of rows, where the data itself breaks it); the last row of each episode has a fresh
    final observation. state[0] is a unique token per row."""
    obs_i, obs_s, nxt_i, nxt_s, term, trunc = [], [], [], [], [], []
    token = token0
    for length in lengths:
        frames_i = rng.integers(0, 256, size=(length + 1, 2, 3), dtype=np.uint8)
        frames_s = rng.normal(size=(length + 1, 2)).astype(np.float32)
        frames_s[:, 0] = token + np.arange(length + 1)
        token += length + 1
        ni, ns = frames_i[1:].copy(), frames_s[1:].copy()
        broken = rng.random(length) < breaks
        ni[broken] = rng.integers(0, 256, size=(int(broken.sum()), 2, 3), dtype=np.uint8)
        obs_i.append(frames_i[:-1])
        obs_s.append(frames_s[:-1])
        nxt_i.append(ni)
        nxt_s.append(ns)
        kind = ends[int(rng.integers(len(ends)))]
        term.append(np.arange(length) == length - 1 if kind == "terminated" else np.zeros(length, bool))
        trunc.append(np.arange(length) == length - 1 if kind == "truncated" else np.zeros(length, bool))
    rows = {"obs": {"image": np.concatenate(obs_i), "state": np.concatenate(obs_s)},
            "next_obs": {"image": np.concatenate(nxt_i), "state": np.concatenate(nxt_s)},
            "terminated": np.concatenate(term), "truncated": np.concatenate(trunc)}
    n = rows["terminated"].size
    rows["action"] = rng.normal(size=(n, 1)).astype(np.float32)
    rows["reward"] = rng.normal(size=n).astype(np.float32)
    if flat:
        for c in ("obs", "next_obs"):
            rows[c] = np.concatenate([rows[c]["image"].reshape(n, -1).astype(np.float32), rows[c]["state"]], axis=1)
    return rows


def cut(rows: dict, a: int, b: int) -> dict:
    return {k: ({kk: vv[a:b] for kk, vv in v.items()} if isinstance(v, dict) else v[a:b]) for k, v in rows.items()}


def assert_same_obs(a, b, slots):
    for col in ("obs", "next_obs"):
        x, y = a.storage.read(col, slots), b.storage.read(col, slots)
        if isinstance(x, dict):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"{col}[{k!r}]")
        else:
            np.testing.assert_array_equal(x, y, err_msg=col)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=hst.integers(0, 2**31 - 1), capacity=hst.integers(8, 60), num_streams=hst.integers(1, 3),
       offline=hst.booleans(), flat=hst.booleans(), breaks=hst.sampled_from([0.0, 0.2]))
def test_dedup_next_obs_equals_explicit_copy(seed, capacity, num_streams, offline, flat, breaks):
    rng = np.random.default_rng(seed)
    obs_shape = (8,) if flat else OBS
    bufs = [ReplayBuffer(capacity, obs_shape, (1,), seed=0, dedup_next_obs=d) for d in (True, False)]
    if offline:
        rows = episode_rows(rng, rng.integers(1, 6, size=3), 0, ("terminated", "truncated"), breaks, flat)
        rows = cut(rows, 0, min(rows["reward"].size, capacity // 2))
        rows["truncated"][-1] &= bool(rng.integers(2))  # the dataset may end mid-episode
        for b in bufs:
            b.add_offline(rows)
    # each stream: episodes, written in chunks that cut episodes anywhere; chunks of streams interleaved
    pending = []
    for s in range(num_streams):
        rows = episode_rows(rng, rng.integers(1, 12, size=int(rng.integers(1, 8))), (s + 1) * 100_000,
                            ("terminated", "truncated", "truncated"), breaks, flat)
        n = rows["reward"].size
        bounds = [0, *sorted(set(rng.integers(1, max(n, 2), size=int(rng.integers(0, 5))).tolist()) - {n}), n]
        pending.append([cut(rows, a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a])
    step = 0
    while any(pending):
        s = int(rng.choice([i for i, p in enumerate(pending) if p]))
        chunk = pending[s].pop(0)
        if rng.random() < 0.1:  # an env reset mid-episode (a resumed run): the stream's episode is cut
            for b in bufs:
                b.close_stream(7 * s)
        for b in bufs:
            b.extend(chunk, stream=7 * s)
        step += 1
        if step % 3 == 0:  # a checkpoint round trip keeps the copies and the tails
            bufs[0] = ReplayBuffer.from_state_dict(bufs[0].state_dict())
        assert len(bufs[0]) == len(bufs[1])
        assert_same_obs(bufs[0], bufs[1], np.arange(len(bufs[0])))
    st = bufs[0].storage
    assert st._nx.num_used <= len(bufs[0])
    if breaks == 0.0:  # clean data: a copy per episode end and per stream's last row, at most
        ends = int((st.columns["terminated"][: st.size] | st.columns["truncated"][: st.size]).sum())
        assert st._nx.num_used <= ends + num_streams + int(offline)


def test_dedup_halves_an_image_buffer():
    rng = np.random.default_rng(0)
    obs = {"image": ((3, 32, 32), np.uint8), "state": (4,)}
    rows = episode_rows(rng, [100] * 10, 0)
    n = rows["reward"].size
    rows["obs"]["image"] = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    rows["next_obs"]["image"] = np.concatenate([rows["obs"]["image"][1:], rows["obs"]["image"][:1]])
    rows["obs"]["state"] = np.zeros((n, 4), np.float32)
    rows["next_obs"]["state"] = np.zeros((n, 4), np.float32)
    dedup, copy = (ReplayBuffer(n, obs, (1,), dedup_next_obs=d) for d in (True, False))
    for b in (dedup, copy):
        b.add_offline(rows)
    assert copy.storage.bytes_per_row() == 2 * (3 * 32 * 32 + 16) + 4 + 4 + 2
    # one copy per episode end: 10 copies over 1000 rows
    assert dedup.storage._nx.num_used == 10
    # (+ the slot -> copy map of the explicit next_obs copies: a bit a slot, the entries of the 10 copies)
    map_bytes = dedup.storage._nx.map_nbytes
    assert map_bytes / n < 2  # (an int32 entry a slot was 4 bytes a row; fixed parts dominate at 1000 rows)
    assert dedup.storage.bytes_per_row() == pytest.approx(3 * 32 * 32 + 16 + 4 + 4 + 2 + (3 * 32 * 32 + 16) / 100
                                                          + map_bytes / n)
    assert_same_obs(dedup, copy, np.arange(n))


def dict_rows(n, t0=0, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": {"image": rng.integers(0, 256, size=(n, 2, 3), dtype=np.uint8),
                    "state": np.arange(t0, t0 + n, dtype=np.float32)[:, None] * [1, -1]},
            "next_obs": {"image": rng.integers(0, 256, size=(n, 2, 3), dtype=np.uint8),
                         "state": np.arange(t0 + 1, t0 + n + 1, dtype=np.float32)[:, None] * [1, -1]},
            "action": np.zeros((n, 1), np.float32), "reward": np.arange(n, dtype=np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.arange(n) % 5 == 4}


def test_dict_columns_round_trip_storage_batch_torch_checkpoint(tmp_path):
    buf = ReplayBuffer(30, OBS, (1,), sampler=MixtureSampler(offline_fraction=0.5), seed=4)
    buf.add_offline(dict_rows(10))
    rows = dict_rows(35, 100, seed=1)  # wraps the ring of 20 slots
    buf.extend(rows)
    assert buf.storage.obs_keys == ("image", "state")
    assert set(buf.storage.columns) >= {"obs.image", "obs.state"}
    assert buf.storage.columns["obs.image"].dtype == np.uint8
    b = buf.gather(np.arange(10, 30))
    assert b.obs["image"].dtype == np.uint8 and b.obs["image"].shape == (20, 2, 3)
    assert b.obs["state"].dtype == np.float32
    np.testing.assert_array_equal(b.obs["state"][:, 0], 100 + np.r_[20:35, 15:20])  # ring: rows 15..19 in slots 25..29
    np.testing.assert_array_equal(b.next_obs["state"][:, 0], b.obs["state"][:, 0] + 1)
    t = b.to_torch()
    assert str(t.obs["image"].dtype) == "torch.uint8" and tuple(t.next_obs["state"].shape) == (20, 2)
    buf.save(tmp_path / "ckpt")
    back = ReplayBuffer.load(tmp_path / "ckpt")
    assert back.storage.obs_keys == ("image", "state") and back.storage.dedup_next_obs
    x, y = buf.sample(16), back.sample(16)
    np.testing.assert_array_equal(x.info.indices, y.info.indices)
    for k in ("image", "state"):
        np.testing.assert_array_equal(x.obs[k], y.obs[k])
        np.testing.assert_array_equal(x.next_obs[k], y.next_obs[k])


def test_dict_obs_errors_name_the_key():
    buf = ReplayBuffer(10, OBS, (1,))
    rows = dict_rows(3)
    with pytest.raises(ValueError, match=r"column 'obs' is missing key\(s\) \['state'\]"):
        buf.extend(rows | {"obs": {"image": rows["obs"]["image"]}})
    with pytest.raises(ValueError, match=r"column 'next_obs' has unknown key\(s\) \['goal'\]"):
        buf.extend(rows | {"next_obs": rows["next_obs"] | {"goal": np.zeros((3, 2))}})
    with pytest.raises(ValueError, match=r"column 'obs' key 'image': expected shape \(n, 2, 3\), got \(3, 3, 2\)"):
        buf.extend(rows | {"obs": rows["obs"] | {"image": np.zeros((3, 3, 2), np.uint8)}})
    with pytest.raises(ValueError, match=r"column 'obs' key 'image': expected dtype uint8"):
        buf.extend(rows | {"obs": rows["obs"] | {"image": np.zeros((3, 2, 3), np.float32)}})
    with pytest.raises(ValueError, match=r"column 'next_obs' key 'state' row 1 element \(0,\): value nan"):
        bad = rows["next_obs"]["state"].copy()
        bad[1, 0] = np.nan
        buf.extend(rows | {"next_obs": rows["next_obs"] | {"state": bad}})
    with pytest.raises(ValueError, match=r"column 'obs': this buffer stores dict observations"):
        buf.extend(rows | {"obs": np.zeros((3, 8), np.float32)})
    with pytest.raises(ValueError, match=r"column 'obs': got a dict"):
        ReplayBuffer(10, (8,), (1,)).extend(rows)
    with pytest.raises(ValueError, match="observation key 'a b' must be an identifier"):
        ReplayBuffer(10, {"a b": (2,)}, (1,))
    assert len(buf) == 0  # nothing was written by a refused batch


@pytest.mark.parametrize("make", [UniformSampler, lambda: MixtureSampler(offline_fraction=0.5),
                                  lambda: ReaPERSampler(), lambda: ARBSampler(),
                                  lambda: BERBSampler(hidden=(8,), ratio_batch_size=8, first_chunk_rows=5)])
def test_samplers_sample_dict_buffers(make):
    buf = ReplayBuffer(40, OBS, (1,), sampler=make(), seed=1)
    buf.add_offline(dict_rows(10))
    buf.extend(dict_rows(15, 50, seed=2))
    b = buf.sample(8)
    np.testing.assert_array_equal(b.obs["state"], buf.storage.columns["obs.state"][b.info.indices])
    buf.update(b.info, td_error=np.ones(8))


def test_arb_refresh_gets_dict_obs():
    seen = []

    def score_fn(obs, action):
        seen.append(obs)
        return np.zeros(len(action))

    buf = ReplayBuffer(40, OBS, (1,), sampler=ARBSampler(), seed=1)
    buf.add_offline(dict_rows(10))
    buf.extend(dict_rows(15, 50, seed=2))
    buf.refresh(score_fn)
    assert seen and isinstance(seen[0], dict) and seen[0]["image"].dtype == np.uint8
    assert seen[0]["image"].shape[1:] == (2, 3)


def flat_rows(values, next_values, end_last=False):
    n = len(values)
    return {"obs": np.asarray(values, np.float32)[:, None], "next_obs": np.asarray(next_values, np.float32)[:, None],
            "action": np.zeros((n, 1), np.float32), "reward": np.zeros(n, np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.arange(n) == n - 1 if end_last else np.zeros(n, bool)}


def test_a_tail_overwritten_by_another_stream_keeps_the_new_rows_copy():
    """Stream 0's last row (slot 2, open episode, next obs 9) is overwritten by stream 1's last row (also open,
    also next obs 9). Stream 0's next chunk starts with obs 9: the copy at slot 2 is stream 1's and must stay."""
    buf = ReplayBuffer(4, (1,), (1,), dedup_next_obs=True)
    buf.extend(flat_rows([0, 1, 2], [1, 2, 9]), stream=0)  # slots 0, 1, 2
    buf.extend(flat_rows([5, 6, 7, 8], [6, 7, 8, 9]), stream=1)  # slots 3, 0, 1, 2 (the ring wraps)
    assert buf.storage._nx.entry_of(2) >= 0
    buf.extend(flat_rows([9], [10]), stream=0)  # slot 3
    assert buf.storage._nx.entry_of(2) >= 0  # stream 1's row 8 still has no stored successor
    np.testing.assert_array_equal(buf.storage.read("next_obs", [0, 1, 2, 3])[:, 0], [7, 8, 9, 10])


def test_refer_recount_gets_dict_obs():
    seen = []

    def log_rho_fn(obs, action, mu_mean, mu_std):
        seen.append(obs)
        return np.zeros(len(action))

    cols = {"mu_mean": (1,), "mu_std": (1,)}
    buf = ReplayBuffer(40, OBS, (1,), sampler=ReFERSampler(), seed=1, extra_columns=cols)
    rows = dict_rows(15, 50, seed=2)
    buf.extend(rows | {"mu_mean": np.zeros((15, 1)), "mu_std": np.ones((15, 1))})
    buf.sampler.recount(log_rho_fn)
    assert seen and set(seen[0]) == {"image", "state"}
    np.testing.assert_array_equal(seen[0]["state"], rows["obs"]["state"])
