"""relive.replay.remote with in-process shards (the Ray transport: tests/replay/test_remote_ray.py, slow).

- the global sampling contract: for 1, 2 and 3 shards and uniform, PER and a mixture (uniform offline, PER online),
  the drawn rows fit (chi-square, 60,000 draws) the distribution of ONE ReplayBuffer holding the union of the rows
  with the same priorities, with a power companion that rejects a distribution 10% off on a fifth of the rows;
  every reported probability and PER is_weight equals that buffer's exactly;
- routing: stream s on shard s % M, its episodes whole; update reaches only the shard and rows named, stale across
  shards; the writer protocol (duplicates, gaps, resend after a shard restored from its checkpoint);
- the rate limiter: Reverb's arithmetic, and the ratio held within its window under a slow learner and a slow writer.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, ReaPERSampler, ReplayBuffer, UniformSampler
from relive.replay.remote import RateLimitTimeout, RemoteReplay, ReplayShard, SampleToInsertRatio, Writer, split_ids
from relive.replay.remote.client import offline_cuts
from relive.testing import chisquare_pvalue, random_transitions
from relive.types import SampleInfo

OBS, ACT = (3,), (2,)
STREAMS, ONLINE_ROWS, OFFLINE_ROWS = 3, 40, 60
DRAWS, BATCH = 60_000, 100


def rows_with_ids(n: int, first_id: int, seed: int) -> dict:
    rows = random_transitions(n, OBS, ACT, rng=seed, episode_length=15)
    rows["reward"] = np.arange(first_id, first_id + n, dtype=np.float32)  # the row's id, read back from batches
    return rows


def priority_of(ids) -> np.ndarray:
    return 1.0 + (np.asarray(ids, np.int64) % 7).astype(np.float64)


def make_sampler(kind: str):
    return {"uniform": UniformSampler, "per": lambda: PrioritizedSampler(is_exponent=0.4, is_exponent_final=0.4),
            "reaper": lambda: ReaPERSampler(is_exponent=0.4, is_exponent_final=0.4),
            "reaper_open": lambda: ReaPERSampler(is_exponent=0.4, is_exponent_final=0.4),
            "mixture": lambda: MixtureSampler(UniformSampler(), PrioritizedSampler(is_exponent=0.5,
                                                                                   is_exponent_final=0.5),
                                              offline_fraction=0.3)}[kind]()


def fill(target, kind: str) -> None:
    """The same rows into a RemoteReplay or a ReplayBuffer: offline (mixture only), then the streams' chunks
    (``reaper``: then every stream's open episode ended, so that no row's priority depends on F; ``reaper_open``:
    left open, their rows' priorities scaled by F, the largest episode total over the union, which the client
    gathers from the shards)."""
    if kind == "mixture":
        target.add_offline(rows_with_ids(OFFLINE_ROWS, 10_000, 0))
    for chunk in range(2):
        for s in range(STREAMS):
            target.extend(rows_with_ids(ONLINE_ROWS // 2, s * 100 + chunk * 20, 1 + s + 10 * chunk), stream=s)
    if kind == "reaper":
        for s in range(STREAMS):
            target.close_stream(s)


def signal(sampler, ids) -> dict:
    """PER's priorities, or ReaPER's |TD errors| (its own priority is built from them), = 1 + id % 7."""
    return {"td_error" if isinstance(sampler, ReaPERSampler) else "priority": priority_of(ids)}


def set_priorities(replay: RemoteReplay | ReplayBuffer) -> None:
    """priority = 1 + id % 7 on every PER row, written through update (the ids read back from the rows)."""
    if isinstance(replay, ReplayBuffer):
        st = replay.storage
        slots = np.arange(st.size, dtype=np.int64)
        ids = st.columns["reward"][slots]
        info = SampleInfo(slots, st.meta["generation"][slots], np.ones(slots.size), np.ones(slots.size, np.float32),
                          np.zeros(slots.size, np.int8))
        replay.update(info, **signal(replay.sampler, ids))
        return
    for s, h in enumerate(replay.handles):
        r = h.obj.rows()
        ids = (np.int64(s) << 40) | r["slots"]
        info = SampleInfo(ids, r["generation"], np.ones(ids.size), np.ones(ids.size, np.float32),
                          np.zeros(ids.size, np.int8))
        replay.update(info, **signal(replay.template, r["reward"]))


def reference(kind: str) -> tuple[np.ndarray, ReplayBuffer]:
    """One buffer over the union: per-draw probability of each row id (a batch of BATCH, as the mixture counts)."""
    buf = ReplayBuffer(1000, OBS, ACT, sampler=make_sampler(kind), seed=0)
    fill(buf, kind)
    if kind != "uniform":
        set_priorities(buf)
    sampler = buf.sampler
    p_slot = sampler.probabilities(BATCH) if kind == "mixture" else sampler.probabilities()
    ids = buf.storage.columns["reward"][: buf.storage.size].astype(np.int64)
    p = np.zeros(ids.max() + 1)
    p[ids] = p_slot[: ids.size]
    return p, buf


def remote(kind: str, shards: int, seed: int = 0, **kw) -> RemoteReplay:
    r = RemoteReplay(300, OBS, ACT, make_sampler(kind), num_shards=shards, seed=seed, ray=False, **kw)
    fill(r, kind)
    r.flush()
    if kind != "uniform":
        set_priorities(r)
    return r


CASES = [(k, m) for k in ("uniform", "per", "mixture", "reaper", "reaper_open") for m in (1, 2, 3)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-{m}shards" for k, m in CASES])
def drawn(request):
    kind, shards = request.param
    p, _ = reference(kind)
    r = remote(kind, shards)
    batches = [r.sample(BATCH) for _ in range(DRAWS // BATCH)]
    return kind, shards, p, batches


def test_drawn_rows_fit_one_buffer_over_the_union(drawn):
    kind, shards, p, batches = drawn
    ids = np.concatenate([b.reward for b in batches]).astype(np.int64)
    assert chisquare_pvalue(ids, p) > 1e-3, (kind, shards)


def test_the_chisquare_rejects_a_slightly_wrong_distribution(drawn):
    kind, shards, p, batches = drawn
    ids = np.concatenate([b.reward for b in batches]).astype(np.int64)
    stored = np.flatnonzero(p)
    wrong = p.copy()
    wrong[stored[: len(stored) // 5]] *= 1.10
    assert chisquare_pvalue(ids, wrong / wrong.sum()) < 1e-3, (kind, shards)


def test_probability_and_is_weight_equal_one_buffer_s(drawn):
    """Each row's probability is the union buffer's; PER's is_weight is (min_j P_j / P_i)^beta over the batch's
    part, as the local sampler computes it; a mixture's batch holds exactly round(B f) offline rows."""
    kind, shards, p, batches = drawn
    for b in batches[:20]:
        ids = b.reward.astype(np.int64)
        np.testing.assert_allclose(b.info.probability, p[ids], rtol=1e-12)
        if kind == "uniform":
            assert (b.info.is_weight == 1).all()
        elif kind in ("per", "reaper", "reaper_open"):
            np.testing.assert_allclose(b.info.is_weight, (p[ids].min() / p[ids]) ** 0.4, rtol=1e-6)
        else:
            off = b.info.source == 0
            assert off.sum() == 30 and (ids[off] >= 10_000).all() and (ids[~off] < 10_000).all()
            assert (b.info.is_weight[off] == 1).all()
            np.testing.assert_allclose(b.info.is_weight[~off], (p[ids[~off]].min() / p[ids[~off]]) ** 0.5, rtol=1e-6)


def test_streams_stay_whole_on_their_shard_and_offline_rows_are_split_at_episode_ends():
    r = remote("mixture", 2)
    for s, h in enumerate(r.handles):
        rows = h.obj.rows()
        online = rows["stream"] >= 0
        ids = rows["reward"].astype(np.int64)
        streams = set((ids[ids < 10_000] // 100).tolist())
        assert streams == {x for x in range(STREAMS) if x % 2 == s}
        for x in streams:  # in time order, whole
            np.testing.assert_array_equal(np.sort(ids[ids // 100 == x]), np.arange(x * 100, x * 100 + ONLINE_ROWS))
        assert online.any()
    offline = random_transitions(OFFLINE_ROWS, OBS, ACT, episode_length=15)
    assert offline_cuts(offline, 2) == [0, 30, 60] and offline_cuts(offline, 3) == [0, 15, 45, 60]
    assert offline_cuts(offline, 5) == [0, 15, 30, 30, 45, 60]


def test_n_step_returns_equal_the_local_buffer_s():
    """A stream's episodes stay on one shard, so its n-step returns are the local buffer's."""
    local = ReplayBuffer(1000, OBS, ACT, n_step=3, gamma=0.9)
    r = RemoteReplay(300, OBS, ACT, num_shards=2, ray=False, n_step=3, gamma=0.9)
    fill(local, "uniform")
    fill(r, "uniform")
    r.flush()
    ids = local.storage.columns["reward"][: local.storage.size]
    want = dict(zip(ids.astype(np.int64).tolist(), zip(*_nstep(local), strict=True), strict=True))
    for h in r.handles:
        rows = h.obj.rows()
        got = h.obj.buffer.gather(rows["slots"])
        assert got.discount is not None
        for i, rw, d in zip(rows["reward"], got.reward, got.discount, strict=True):
            np.testing.assert_allclose((rw, d), want[int(i)], rtol=1e-6)
    b = r.sample(100)
    assert b.discount is not None and b.discount.shape == (100,)


def _nstep(buf: ReplayBuffer):
    slots = np.arange(buf.storage.size, dtype=np.int64)
    g = buf.gather(slots)
    return g.reward, g.discount


def test_updates_reach_only_the_rows_named_and_stale_ones_are_skipped_across_shards():
    r = RemoteReplay(20, OBS, ACT, PrioritizedSampler(), num_shards=2, ray=False)
    for s in range(2):
        r.extend(rows_with_ids(20, s * 100, s), stream=s)
    r.flush()
    b = r.sample(8)
    shard, slots = split_ids(b.info.indices)
    before = [h.obj.buffer.sampler.leaf_values() for h in r.handles]
    report = r.update(b.info, priority=np.full(8, 5.0))
    assert report.num_updated == 8 and report.num_stale == 0
    for s, h in enumerate(r.handles):
        after = h.obj.buffer.sampler.leaf_values()
        named = np.zeros(after.size, bool)
        named[slots[shard == s]] = True
        np.testing.assert_allclose(after[named], 5.0 ** 0.6)
        np.testing.assert_array_equal(after[~named], before[s][~named])
    r.extend(rows_with_ids(20, 500, 9), stream=1)  # shard 1's ring rewritten: its rows of b are stale
    r.flush()
    report = r.update(b.info, priority=np.full(8, 1.0))
    assert report.num_stale == int((shard == 1).sum()) and report.num_updated == int((shard == 0).sum())
    with pytest.raises(ValueError, match="name shard 7"):
        r.update(SampleInfo(np.array([7 << 40]), np.array([1]), np.ones(1), np.ones(1, np.float32),
                            np.zeros(1, np.int8)), priority=np.ones(1))


def test_reaper_new_rows_take_the_largest_d_any_shard_has_seen_after_the_next_sample():
    """ReaPER gives a new row d = the largest d seen so far (over the whole buffer); a service's client carries the
    largest over its shards to every shard with the next sample's masses call, so a shard whose own rows never had a
    large TD error still writes its next rows at the union's running max (one sample of lag)."""
    r = RemoteReplay(300, OBS, ACT, ReaPERSampler(), num_shards=2, seed=0, ray=False)
    r.extend(rows_with_ids(20, 0, 0), stream=0)
    r.extend(rows_with_ids(20, 100, 1), stream=1)
    r.flush()
    batch = r.sample(32)
    shard, _ = split_ids(batch.info.indices)
    r.update(batch.info, td_error=np.where(shard == 0, 10.0, 0.5))  # (both shards drawn from: seed 0)
    assert {0, 1} <= set(shard.tolist())
    shard1 = r.handles[1].obj.buffer.sampler
    assert shard1.max_delta < 2  # its own rows' errors were small
    r.sample(32)
    r.extend(rows_with_ids(5, 200, 2), stream=1)
    r.flush()
    new = np.arange(20, 25)  # (shard 1's slots of the new rows)
    np.testing.assert_allclose(shard1.delta[new], 10.0 + shard1.eps)


def test_samplers_that_cannot_be_split_exactly_are_refused():
    from relive.replay import ARBSampler

    with pytest.raises(ValueError, match="ARBSampler keeps whole-buffer state"):
        RemoteReplay(10, OBS, ACT, ARBSampler(), num_shards=2, ray=False)
    with pytest.raises(ValueError, match="num_shards must be a positive integer"):
        RemoteReplay(10, OBS, ACT, num_shards=0, ray=False)
    for shards in (1, 2):  # (one shard: no masses round trip, the shard checks)
        r = RemoteReplay(10, OBS, ACT, num_shards=shards, ray=False)
        r.extend(rows_with_ids(5, 0, 0))
        r.flush()
        with pytest.raises(ValueError, match="only 5 rows are stored"):
            r.sample(6)


# -- the writer protocol and checkpoints ------------------------------------------------------------------------------
def test_a_shard_takes_each_call_once_and_asks_for_a_resend_after_a_gap(tmp_path):
    shard = ReplayShard(0, {"capacity": 100, "obs_shape": OBS, "action_shape": ACT},
                        {"type": "UniformSampler", "params": {}}, 0, str(tmp_path))
    rows = rows_with_ids(5, 0, 0)
    assert shard.extend(7, 1, rows, 0)["status"] == "ok"
    assert shard.extend(7, 1, rows, 0) == {"status": "duplicate", "expected": 2, "committed": 0, "shard": 0}
    assert shard.extend(7, 3, rows, 0)["status"] == "resend"  # seq 2 missing
    assert len(shard.buffer) == 5
    shard.checkpoint()
    assert shard.extend(7, 2, rows, 0)["committed"] == 1


def test_a_restored_shard_gets_every_acknowledged_row_back_once_through_the_writer_s_resends(tmp_path):
    """Shard 1 checkpoints, takes more rows, then is replaced by a shard built from its directory (what Ray's
    restart of a killed actor does): the writer's next call hits a gap, it resends what the checkpoint lacks, and
    the shard ends with every acknowledged row once, in order."""
    r = RemoteReplay(500, OBS, ACT, num_shards=2, ray=False, directory=tmp_path / "replay")
    w = r.writer(max_in_flight=0)
    for chunk in range(3):
        w.extend(rows_with_ids(10, 100 + 10 * chunk, chunk), stream=1)
    w.flush()
    r.checkpoint()
    assert len(w.pending[1]) == 3
    w.forget_committed()
    assert sum(len(p) for p in w.pending) == 0  # all held by a checkpoint: nothing kept
    for chunk in range(3, 6):
        w.extend(rows_with_ids(10, 100 + 10 * chunk, chunk), stream=1)
    w.flush()
    assert len(w.pending[1]) == 3  # acknowledged, not yet in a checkpoint: kept for a resend
    h = r.handles[1]
    h.obj = ReplayShard(1, {}, {}, 0, str(tmp_path / "replay"))  # "killed" and restarted from its checkpoint
    assert h.obj.restored and len(h.obj.buffer) == 30
    w.extend(rows_with_ids(10, 160, 6), stream=1)
    w.flush()
    ids = h.obj.rows()["reward"].astype(np.int64)
    np.testing.assert_array_equal(ids, np.arange(100, 170))
    assert w.num_resent == 4 and h.obj.num_gaps == 1


def test_a_checkpoint_after_a_shard_restart_holds_every_acknowledged_row_without_a_new_write(tmp_path):
    """A shard restarted from its checkpoint asks a writer for what it lost only when that writer's next call reaches
    it; a checkpoint taken before that call must not save the shard without those rows (a run resumed from it would
    have lost them: found in a Hopper run with a shard killed by SIGKILL, 128 of 1,792 rows missing on resume).
    ``checkpoint()`` first brings every shard up to the client's writer."""
    r = RemoteReplay(500, OBS, ACT, num_shards=2, ray=False, directory=tmp_path / "replay")
    r.extend(rows_with_ids(10, 0, 0), stream=0)
    r.checkpoint()
    for chunk in range(1, 3):
        r.extend(rows_with_ids(10, 10 * chunk, chunk), stream=0)
    r.flush()  # acknowledged, not yet in a checkpoint
    r.handles[0].obj = ReplayShard(0, {}, {}, 0, str(tmp_path / "replay"))  # "killed" and restarted
    assert len(r.handles[0].obj.buffer) == 10
    r.extend(rows_with_ids(5, 100, 3), stream=1)  # (the other shard only)
    r.checkpoint()
    again = ReplayShard(0, {}, {}, 0, str(tmp_path / "replay"))
    np.testing.assert_array_equal(again.rows()["reward"].astype(np.int64), np.arange(30))


def test_updates_for_rows_a_restarted_shard_does_not_hold_yet_are_skipped_as_stale(tmp_path):
    """A batch drawn before a shard died names rows written after its last checkpoint; the shard restarted from that
    checkpoint does not hold them until the writer resends them: the learner's update skips them (counted stale),
    it does not fail (found in a Hopper run with a shard killed by SIGKILL)."""
    r = RemoteReplay(500, OBS, ACT, PrioritizedSampler(), num_shards=1, ray=False, directory=tmp_path / "replay")
    r.extend(rows_with_ids(20, 0, 0), stream=0)
    r.checkpoint()
    r.extend(rows_with_ids(20, 20, 1), stream=0)
    r.flush()
    batch = r.sample(32)
    h = r.handles[0]
    h.obj = ReplayShard(0, {}, {}, 0, str(tmp_path / "replay"))  # "killed" and restarted from its checkpoint
    assert len(h.obj.buffer) == 20
    _, slots = split_ids(batch.info.indices)
    report = r.update(batch.info, td_error=np.ones(32))
    assert report.num_stale == int((slots >= 20).sum()) > 0 and report.num_updated == int((slots < 20).sum()) > 0


def test_a_service_built_over_a_directory_resumes_from_its_shards_checkpoints(tmp_path):
    r = remote("per", 2, directory=tmp_path / "replay")
    r.checkpoint()
    masses = r.masses()
    again = RemoteReplay(300, OBS, ACT, make_sampler("per"), num_shards=2, ray=False, directory=tmp_path / "replay")
    assert again.masses() == masses and all(i["restored"] for i in again.shard_info())
    assert (tmp_path / "replay" / "shard-000" / "MANIFEST.json").is_file()


# -- the rate limiter -------------------------------------------------------------------------------------------------
def test_rate_limiter_follows_reverb_s_sample_to_insert_ratio():
    lim = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=8)
    assert (lim.min_diff, lim.max_diff) == (12.0, 28.0)
    assert lim.can_insert(10) and not lim.can_sample(1)  # filling up: inserts never held back, no samples
    lim.acquire_insert(10)
    assert lim.can_sample(8) and not lim.can_sample(9)  # diff 20 - 8 = 12 >= min_diff; 11 < 12
    assert lim.can_insert(4) and not lim.can_insert(5)  # (14) x 2 = 28 <= 28; 30 > 28
    lim.acquire_sample(8)
    assert lim.can_insert(8) and not lim.can_insert(9)
    with pytest.raises(ValueError, match="can never be granted"):
        lim.acquire_sample(17)
    with pytest.raises(RateLimitTimeout):
        lim.acquire_sample(1, timeout=0.01)
    assert lim.sample_waits == 0  # a timed-out wait is not a grant
    with pytest.raises(ValueError, match="samples_per_insert must be > 0"):
        SampleToInsertRatio(0)


def run_limited(slow: str, spi: float = 4.0, batch: int = 16, chunk: int = 8):
    """A writer and a learner thread on a limiter; the ``slow`` side sleeps between calls."""
    lim = SampleToInsertRatio(samples_per_insert=spi, min_size_to_sample=32, error_buffer=(64.0, 256.0))
    lim.set_record(True)
    r = RemoteReplay(10_000, OBS, ACT, num_shards=2, ray=False, limiter=lim, timeout=0.05)  # (the learner's wait)
    done = threading.Event()

    def writer():
        w = Writer(r.handles, lim)  # (no timeout: waits as long as the learner needs)
        for i in range(60):
            w.extend(rows_with_ids(chunk, i * chunk, i), stream=i % 2)
            w.flush()
            if slow == "writer":
                time.sleep(0.003)
        done.set()

    def learner():  # samples until the writer is done and the limiter lets no more through
        while True:
            try:
                r.sample(batch)
            except RateLimitTimeout:
                if done.is_set():
                    return
                continue
            if slow == "learner":
                time.sleep(0.003)

    threads = [threading.Thread(target=writer), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return lim


@pytest.mark.parametrize("slow", ["learner", "writer"])
def test_rate_limiter_holds_the_ratio_within_its_window_and_blocks_the_side_running_ahead(slow):
    lim = run_limited(slow)
    assert lim.inserts == 480 and 4.0 * 480 - 64 - 16 < lim.samples <= 4.0 * 480 - 64  # the learner: to the floor
    for side, inserts, samples in lim.get_history():
        diff = inserts * 4.0 - samples
        if side == "sample":
            assert 64.0 <= diff <= 256.0
        elif inserts > 32:
            assert diff <= 256.0
    if slow == "learner":
        assert lim.insert_waits > 0  # the writer ran ahead and was held back
    else:
        assert lim.sample_waits > 0


def test_a_scheduled_mixture_counts_the_union_s_online_rows():
    """The offline share follows the schedule over t = the online rows written to all shards together."""

    def mix():
        return MixtureSampler(offline_fraction=0.9, schedule="linear", offline_fraction_final=0.1, schedule_steps=200)

    local = ReplayBuffer(1000, OBS, ACT, sampler=mix())
    r = RemoteReplay(300, OBS, ACT, mix(), num_shards=3, ray=False)
    fill(local, "mixture")
    fill(r, "mixture")
    r.flush()
    assert r.part_counts(100, r.masses()) == list(local.sampler.counts(100))
    b = r.sample(100)
    assert int((b.info.source == 0).sum()) == local.sampler.counts(100)[0] == 42  # 0.9 - 0.8 x 120 / 200 = 0.42


def test_prefetched_batches_come_from_the_shards_and_errors_reach_the_learner():
    r = RemoteReplay(100, OBS, ACT, num_shards=2, ray=False, timeout=30)
    r.prefetch(2, 8)
    with pytest.raises(ValueError, match="only 0 rows are stored"):
        r.sample(8)  # the drawing thread's error, handed over
    r.extend(rows_with_ids(20, 0, 0), stream=0)
    r.extend(rows_with_ids(20, 100, 1), stream=1)
    r.flush()
    ids = set()
    for _ in range(20):
        try:
            b = r.sample(8)
        except ValueError:  # (batches drawn before the rows arrived)
            continue
        ids |= set(b.reward.astype(np.int64).tolist())
    assert ids and ids <= set(range(20)) | set(range(100, 120))
    assert r.sample(4).reward.shape == (4,)  # another size: drawn at once
    r.close()
