"""relive.replay.remote on a local multi-node Ray cluster (ray.cluster_utils.Cluster: a head with no CPUs and two
one-CPU worker nodes, so the two shards land on two nodes): the sampling contract through Ray, a shard actor killed
with SIGKILL mid-run (restarted from its checkpoint, every acknowledged row back once, the learner's sample waits
and goes on), a writer actor killed with SIGKILL (the shards hold a gap-free prefix of its calls, at least every one it
saw acknowledged), and the limiter as an actor. Slow: Ray starts in ~10-20 s on the 2-core machine."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from relive.replay import PrioritizedSampler
from relive.replay.remote import RemoteReplay, SampleToInsertRatio
from relive.testing import chisquare_pvalue, local_ray_cluster
from relive.types import SampleInfo
from tests.replay.test_remote import ACT, BATCH, DRAWS, OBS, fill, make_sampler, priority_of, reference, rows_with_ids

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    with local_ray_cluster(paths=[Path(__file__).resolve().parents[2]]) as (c, _):  # (workers import tests/ too)
        yield c


def on_nodes(**kw) -> dict:
    return {"shard_options": {"num_cpus": 1}, "timeout": 120, **kw}  # one shard per one-CPU node


def test_per_through_ray_fits_one_buffer_over_the_union(cluster):
    p, _ = reference("per")
    r = RemoteReplay(300, OBS, ACT, make_sampler("per"), num_shards=2, **on_nodes())
    try:
        fill(r, "per")
        r.flush()
        for s, h in enumerate(r.handles):  # priorities as the in-process test sets them, through Ray
            rows = ray.get(h.rows.remote())
            ids = (np.int64(s) << 40) | rows["slots"]
            info = SampleInfo(ids, rows["generation"], np.ones(ids.size), np.ones(ids.size, np.float32),
                              np.zeros(ids.size, np.int8))
            r.update(info, priority=priority_of(rows["reward"]))
        assert len({i["pid"] for i in r.shard_info()}) == 2
        r.prefetch(2, BATCH)
        batches = [r.sample(BATCH) for _ in range(DRAWS // BATCH)]
        ids = np.concatenate([b.reward for b in batches]).astype(np.int64)
        assert chisquare_pvalue(ids, p) > 1e-3
        for b in batches[:10]:
            i = b.reward.astype(np.int64)
            np.testing.assert_allclose(b.info.probability, p[i], rtol=1e-12)
    finally:
        r.close()


def test_a_shard_killed_with_sigkill_restarts_from_its_checkpoint_and_loses_no_acknowledged_row(cluster, tmp_path):
    r = RemoteReplay(5000, OBS, ACT, PrioritizedSampler(), num_shards=2, directory=tmp_path / "replay",
                     checkpoint_every_rows=50, max_in_flight=4, **on_nodes())
    try:
        w = r.writer()
        for chunk in range(40):
            if chunk == 16:
                w.flush()
                victim = r.shard_info()[1]
                os.kill(victim["pid"], signal.SIGKILL)  # (the cluster's nodes are processes of this machine)
            stream = chunk % 4
            w.extend(rows_with_ids(10, stream * 1000 + (chunk // 4) * 10, chunk), stream=stream)
            if chunk == 18:
                b = r.sample(32)  # waits for the restarted shard (the documented choice), then draws
                assert b.reward.shape == (32,)
        w.flush()
        info = r.shard_info()
        assert info[1]["pid"] != victim["pid"] and info[1]["restored"] and not info[0]["restored"]
        for s, h in enumerate(r.handles):
            ids = ray.get(h.rows.remote())["reward"].astype(np.int64)
            for stream in (s, s + 2):  # shard s holds streams s and s + 2, every row once, in order
                got = ids[ids // 1000 == stream]
                np.testing.assert_array_equal(got, stream * 1000 + np.arange(100))
        assert w.num_resent > 0
        b = r.sample(64)
        assert r.update(b.info, td_error=np.ones(64)).num_updated == 64
    finally:
        r.close()


@ray.remote(num_cpus=0, max_restarts=0)
class WriterActor:
    def run(self, writer, progress: str, chunks: int) -> None:
        for chunk in range(chunks):
            writer.extend(rows_with_ids(10, 5000 + chunk * 10, chunk), stream=5)
            writer.flush()
            Path(progress).write_text(str(chunk))  # acknowledged up to here
            time.sleep(0.02)

    def pid(self) -> int:
        return os.getpid()


def test_a_writer_killed_with_sigkill_loses_only_its_unacknowledged_calls(cluster, tmp_path):
    r = RemoteReplay(5000, OBS, ACT, num_shards=2, directory=tmp_path / "replay", checkpoint_every_rows=50,
                     **on_nodes())
    try:
        actor = WriterActor.remote()
        pid = ray.get(actor.pid.remote())
        progress = tmp_path / "acked"
        done = actor.run.remote(r.writer(), str(progress), 1000)
        deadline = time.monotonic() + 120
        while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 10):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(done, timeout=60)
        acked = int(progress.read_text())
        ids = ray.get(r.handles[1].rows.remote())["reward"].astype(np.int64)
        n = ids.size // 10
        assert n >= acked + 1  # every acknowledged call is there ...
        np.testing.assert_array_equal(ids, 5000 + np.arange(n * 10))  # ... once, in order, no gap
    finally:
        r.close()


def test_the_limiter_actor_holds_the_ratio_for_writers_and_learners_in_other_processes(cluster):
    lim = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=20, error_buffer=(10.0, 80.0))
    r = RemoteReplay(5000, OBS, ACT, num_shards=2, limiter=lim, **on_nodes())
    try:
        w = r.writer()
        for chunk in range(4):
            w.extend(rows_with_ids(10, chunk * 10, chunk), stream=chunk % 2)
        w.flush()
        ray.get(r.limiter.set_record.remote(True))
        stats = ray.get(r.limiter.stats.remote())
        assert stats["replay/limiter_inserts"] == 40.0  # (20 above min size: 40 x 2 = 80 = max_diff)
        r.sample(20)
        r.sample(20)  # diff 40 x 2 - 40 = 40
        blocked = r.limiter.acquire_insert.remote(25, None)  # 65 x 2 - 40 = 90 > 80: waits for a learner
        ready, _ = ray.wait([blocked], timeout=1.0)
        assert not ready
        r.sample(10)  # 130 - 50 = 80: the writer may go on
        ray.get(blocked, timeout=60)
        stats = ray.get(r.limiter.stats.remote())
        assert stats["replay/limiter_insert_waits"] == 1.0 and stats["replay/limiter_samples"] == 50.0
        for side, inserts, samples in ray.get(r.limiter.get_history.remote()):
            assert 10.0 <= inserts * 2.0 - samples <= 80.0, side
    finally:
        r.close()
