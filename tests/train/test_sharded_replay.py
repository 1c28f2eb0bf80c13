"""The trainer on a sharded replay service (issue 49 item 1: ``--collectors N --replay-shards M``): the refusals and
the learner's client in this process (default suite), then on a real local Ray: exact counts with every row on its
stream's shard, a shard actor killed mid-run, a learner crash and its resume."""

import json

import numpy as np
import pytest

from relive.cli import main
from relive.config import ExperimentConfig, ReplayConfig, config_from_dict
from relive.replay import ReplayBuffer
from relive.replay.checkpoint import load_tree
from relive.replay.samplers import MixtureSampler, PrioritizedSampler, UniformSampler
from relive.train.sharded_replay import ShardedReplay
from tests.train.test_ray_collectors import local_ray  # noqa: F401  (a fixture: one local Ray)
from tests.train.test_trainer import TINY, SimulatedKill, cfg_for, kill_at


# -- settings and refusals (no Ray) ----------------------------------------------------------------------------
def test_replay_shards_round_trips_and_a_run_without_it_records_nothing_new():
    assert "shards" not in ExperimentConfig().to_dict()["replay"]  # (config.json of every earlier run unchanged)
    cfg = cfg_for(["sac", "--env", "Pendulum-v1", "--collectors", "2", "--replay-shards", "3"], "/tmp/unused")
    assert cfg.replay.shards == 3 and cfg.to_dict()["replay"]["shards"] == 3
    assert config_from_dict(cfg.to_dict()).replay == cfg.replay
    cfg2 = cfg_for(["sac", "--env", "Pendulum-v1", "--collectors", "2", "--set", "replay.shards=3", "--replay",
                    "per"], "/tmp/unused")
    assert cfg2.replay.shards == 3 and cfg2.replay.name == "per"  # (a new replay name keeps the shards)
    with pytest.raises(ValueError, match="replay.shards must be an integer >= 0"):
        ReplayConfig(shards=-1)


def test_bad_shard_settings_are_refused_before_the_run_directory_exists(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "sac", "--env", "Pendulum-v1", "--replay-shards", "0", "--run-dir", str(tmp_path / "a")])
    assert "positive" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"runs on the Ray cluster of the run's collectors \(--collectors N\)"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--replay-shards", "2", "--run-dir",
              str(tmp_path / "b"), *TINY])
    # Cal-QL writes returns-to-go into the rows of each finished episode: the learner does not hold them
    with pytest.raises(ValueError, match="CalQL reads or writes replay rows in the learner's process"):
        main(["--debug", "train", "calql", "--env", "Pendulum-v1", "--collectors", "2", "--replay-shards", "2",
              "--offline-steps", "0", "--run-dir", str(tmp_path / "c"), *TINY])
    with pytest.raises(ValueError, match="ARBSampler keeps whole-buffer state"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--collectors", "2", "--replay-shards", "2",
              "--replay", "arb", "--run-dir", str(tmp_path / "d"), *TINY])
    assert not any((tmp_path / d).exists() for d in "abcd")


# -- the learner's client, shards in this process ------------------------------------------------------------------
def _episodes(n_episodes, length, start=0.0):
    n = n_episodes * length
    obs = (start + np.arange(n, dtype=np.float32))[:, None].repeat(3, 1)
    end = np.zeros(n, bool)
    end[length - 1 :: length] = True
    return {"obs": obs, "action": np.zeros((n, 1), np.float32), "reward": obs[:, 0].copy(), "next_obs": obs + 0.5,
            "terminated": end, "truncated": np.zeros(n, bool)}


def _service(sampler=None, capacity=600):
    sampler = sampler or MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.5)
    return ShardedReplay(2, capacity, (3,), (1,), sampler, seed=7, timeout=None, ray=False)


def test_the_client_splits_the_dataset_routes_streams_and_resumes_drawing_the_same_batches(tmp_path):
    """Offline rows split over the shards at episode ends, each shard's capacity its offline part plus half the online
    room; stream s on shard s % 2; a service restarted from the checkpoint with the client's saved state draws the
    batches the first one goes on to draw (the shards' RNGs are in their checkpoints, the split's in the run's)."""
    a = _service()
    a.add_offline(_episodes(10, 20), dataset_id="d")  # 200 rows
    assert a.per_shard_capacity() == 100 + 200  # (600 - 200) / 2 online rows per shard
    a.start(tmp_path / "replay", resume=False)
    for stream in range(4):
        a.extend(_episodes(3, 10, start=1000 * (stream + 1)), stream=stream)
    assert len(a) == 200 + 120
    b1 = a.sample(64)
    a.update(b1.info, td_error=np.linspace(0, 3, 64))
    state = json.loads(json.dumps(a.state_dict()))  # (the run's checkpoint holds it as plain values)
    infos = a._live().shard_info()
    assert [i["num_offline"] for i in infos] == [100, 100] and [i["num_online"] for i in infos] == [60, 60]
    for shard in (0, 1):  # every online row of streams 2k + shard, and only those, on that shard
        st = ReplayBuffer.from_state_dict(load_tree(tmp_path / "replay" / f"shard-00{shard}",
                                                    kind="replay_shard")["buffer"]).storage
        streams = st.meta["stream"][100:160]
        assert sorted(set(streams.tolist())) == [shard, shard + 2]
    expected = [a.sample(64) for _ in range(3)]
    a.close()

    b = _service()
    b.start(tmp_path / "replay", resume=True)
    b.load_state_dict(state)
    assert len(b) == 320
    for want in expected:
        got = b.sample(64)
        np.testing.assert_array_equal(got.info.indices, want.info.indices)
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_allclose(got.info.is_weight, want.info.is_weight)
    b.close()
    with pytest.raises(ValueError, match="holds no shard checkpoints"):
        _service().start(tmp_path / "empty", resume=True)


def test_updates_skip_samplers_that_take_no_signal_and_surface_a_shard_s_error_at_the_next_update(tmp_path):
    """Uniform parts take no signal: the learner's update sends nothing (no round trip per gradient step). PER's
    updates go out without waiting; a shard's refusal (a non-finite TD error) is raised by the next update."""
    u = _service(UniformSampler())
    u.start(tmp_path / "u", resume=False)
    u.extend(_episodes(2, 10), stream=0)
    u.update(u.sample(8).info, td_error=np.ones(8))
    assert sum(i["num_updated"] for i in u._live().shard_info()) == 0
    p = _service(PrioritizedSampler())
    p.start(tmp_path / "p", resume=False)
    p.extend(_episodes(2, 10), stream=0)
    p.update(p.sample(8).info, td_error=np.ones(8))
    p._live().settle_updates()
    assert sum(i["num_updated"] for i in p._live().shard_info()) == 8
    p.update(p.sample(8).info, td_error=np.full(8, np.nan))  # (sent; the shard refuses it)
    with pytest.raises(ValueError, match="finite"):
        p.update(p.sample(8).info, td_error=np.ones(8))
    u.close()
    p.close()


def test_with_prefetch_batches_come_from_the_queue_and_the_first_waits_for_the_rows(tmp_path):
    a = ShardedReplay(2, 600, (3,), (1,), UniformSampler(), seed=7, timeout=30, ray=False, prefetch=2)
    a.start(tmp_path / "replay", resume=False)
    a.extend(_episodes(3, 10), stream=0)
    a.extend(_episodes(3, 10, start=1000), stream=1)
    batches = [a.sample(16) for _ in range(5)]
    assert a._live().prefetching  # (drawn by the thread)
    got = np.concatenate([b.reward for b in batches])
    assert set(got.tolist()) <= set(np.arange(30.0).tolist()) | set((1000 + np.arange(30.0)).tolist())
    assert (got >= 1000).any() and (got < 1000).any()  # both shards
    a.close()


def test_a_new_run_clears_shard_checkpoints_left_by_one_that_stopped_before_its_first_checkpoint(tmp_path):
    a = _service(UniformSampler())
    a.start(tmp_path / "replay", resume=False)
    a.extend(_episodes(2, 10), stream=0)
    a.checkpoint()
    a.close()
    b = _service(UniformSampler())
    b.start(tmp_path / "replay", resume=False)  # (not resumed: the old rows are not this run's)
    assert sum(i["rows"] for i in b._live().shard_info()) == 0
    b.close()


def test_too_small_a_capacity_for_the_dataset_is_refused():
    a = _service(capacity=201)
    a.add_offline(_episodes(10, 20))
    with pytest.raises(ValueError, match="leaves 1 rows for online data over 2 shards"):
        a.per_shard_capacity()


# -- on a real local Ray --------------------------------------------------------------------------------------------
EPISODE = 97
ARGS = ["sac", "--env", "Pendulum-v1", "--collectors", "2", "--replay-shards", "2", "--replay", "per",
        "--online-steps", "600", "--warmup", "100", "--eval-every", "600", "--checkpoint-every", "200",
        "--capacity", "5000", "--set", f"env.max_episode_steps={EPISODE}", "--set", "collectors.chunk_env_steps=50",
        "--set", "run.save_final_buffer=true", *TINY]


@pytest.fixture
def services(monkeypatch):
    """The ShardedReplay objects the trainer starts (the tests kill their shard actors)."""
    seen = []
    start = ShardedReplay.start

    def record(self, *a, **k):
        start(self, *a, **k)
        seen.append(self)

    monkeypatch.setattr(ShardedReplay, "start", record)
    return seen


def check_shards(run_dir, num_rows):
    """The shards' final checkpoints: every received row stored once, stream s (collector s) on shard s, steps
    counting up inside each episode and a new episode only after an end."""
    chunks = [json.loads(x) for x in (run_dir / "chunks.jsonl").read_text().splitlines()]
    chunks = [c for c in chunks if "chunk_id" in c]
    assert sum(sum(c["rows"]) for c in chunks) == num_rows
    total = 0
    for shard in (0, 1):
        st = ReplayBuffer.from_state_dict(load_tree(run_dir / "replay" / f"shard-00{shard}",
                                                    kind="replay_shard")["buffer"]).storage
        n = st.size
        total += n
        assert set(st.meta["stream"][:n].tolist()) <= {shard}
        assert n == sum(c["rows"][0] for c in chunks if c["collector"] == shard)
        step, end = st.meta["step_in_episode"][:n], st.columns["terminated"][:n] | st.columns["truncated"][:n]
        for i in range(1, n):
            assert step[i] == (0 if end[i - 1] else step[i - 1] + 1)
    assert total == num_rows


@pytest.mark.slow  # (a local Ray, 2 collectors and 2 shard actors start: ~20 s on 2 cores)
@pytest.mark.usefixtures("local_ray")
def test_a_shard_actor_killed_mid_run_restarts_from_its_checkpoint_and_no_row_is_lost(tmp_path, services):
    """Shard 0's actor is killed (Ray's kill, as a crash) after env step 300, once it has acknowledged calls that its
    last checkpoint does not hold; Ray restarts it from that checkpoint, the learner's writer resends every call
    since then, the learner's samples wait for it; the run ends with exactly 600 env steps, every received row
    stored once."""
    import ray

    from relive.train.trainer import train

    killed = []

    def on_step(env_steps, grad_steps):
        if killed or env_steps < 300:
            return
        replay = services[0].replay
        replay.flush()  # (every call sent so far acknowledged: the kill loses acknowledged rows, not in-flight ones,
        if not replay._writer.pending[0]:  # which Ray would retry in order; and only if shard 0 has any: the
            return  # chunks between two checkpoints may all have come from collector 1)
        killed.append(replay.shard_info()[0]["pid"])
        ray.kill(replay.handles[0], no_restart=False)

    summary = train(cfg_for(ARGS, tmp_path / "r"), on_step=on_step)
    assert killed and summary.num_online_env_steps == 600
    metrics = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["replay/num_rows"] == 600
    assert max(m.get("replay/writer_resent_calls", 0) for m in metrics) > 0  # the restarted shard asked for them
    check_shards(tmp_path / "r", 600)


@pytest.mark.slow  # (~30 s on 2 cores: two learners, their collectors and shards start)
@pytest.mark.usefixtures("local_ray")
def test_a_learner_crash_resumes_with_its_shards_from_the_runs_checkpoint(tmp_path):
    """The learner dies at env step 450 (its shard actors end with it); the resume restores the shards from the
    checkpoint at 400 (the rows after it died with the learner, as without shards) and finishes at 600."""
    from relive.train.trainer import train

    run_dir = tmp_path / "r"
    with pytest.raises(SimulatedKill):
        train(cfg_for(ARGS, run_dir), on_step=kill_at(env_step=450))
    tree = load_tree(run_dir / "checkpoint", kind="run")
    assert int(tree["loop"]["env_steps"]) == 400 and int(tree["buffer"]["num_online_sent"]) == 400
    summary = train(resume_dir=run_dir)
    assert summary.num_online_env_steps == 600
    chunks = [json.loads(x) for x in (run_dir / "chunks.jsonl").read_text().splitlines()]
    assert sum(sum(c["rows"]) for c in chunks if "chunk_id" in c) == 600
    total = sum(ReplayBuffer.from_state_dict(load_tree(run_dir / "replay" / f"shard-00{s}", kind="replay_shard")
                                             ["buffer"]).storage.size for s in (0, 1))
    assert total == 600

