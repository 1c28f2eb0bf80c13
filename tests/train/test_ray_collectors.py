"""Parallel collectors on Ray (issue 16, items 3-4): the rate limiter's arithmetic, the refusals, and on a real local
Ray (loopback, 2 CPUs): exact env step and gradient step counts, chunk ids, a collector killed with SIGKILL, a
learner crash and its resume -- no received row lost or stored twice, episodes intact per stream."""

import json
import os
import signal
import sys

import numpy as np
import pytest

from relive.cli import main
from relive.train.ray_collectors import RateLimiter
from tests.train.test_trainer import TINY, SimulatedKill, cfg_for, kill_at


# -- the rate limiter (no Ray) ---------------------------------------------------------------------------------
def test_rate_limiter_grants_exactly_utd_updates_per_env_step_after_the_warm_up():
    lim = RateLimiter((3, 1), min_inserts=10, max_lag=20)
    assert lim.sample_budget() == 0 and lim.can_insert(20, in_flight=10)  # warm-up: data only
    lim.inserts = 10
    assert lim.sample_budget() == 0
    lim.inserts = 14
    assert lim.sample_budget() == 12  # 3 x (14 - 10)
    lim.samples = 12
    assert lim.sample_budget() == 0  # the learner never runs ahead of the data
    assert lim.can_insert(20, in_flight=0) and not lim.can_insert(21, in_flight=0)  # 4 + 20 - 10 - 4 = 20 ahead
    assert not lim.can_insert(5, in_flight=16)
    lim.samples = 9  # the learner is 1 env step behind
    assert lim.can_insert(19, in_flight=0) and not lim.can_insert(20, in_flight=0)


def test_rate_limiter_with_a_fractional_ratio_is_exact():
    lim = RateLimiter((128, 256), min_inserts=0, max_lag=256)  # RL Zoo: 128 updates per 256 env steps
    lim.inserts = 255
    assert lim.sample_budget() == 127
    lim.inserts = 256
    assert lim.sample_budget() == 128
    with pytest.raises(ValueError, match="samples_per_insert > 0"):
        RateLimiter((0, 1), 0, 10)


# -- refusals (no Ray needed) --------------------------------------------------------------------------------
def test_bad_collector_settings_are_refused_with_a_clear_message(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "sac", "--env", "Pendulum-v1", "--collectors", "0", "--run-dir", str(tmp_path / "a")])
    assert "positive" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs collectors.num >= 1"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--ray-address", "auto", "--run-dir",
              str(tmp_path / "b")])
    with pytest.raises(ValueError, match="max_lag_env_steps must be >= collectors.chunk_env_steps"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--collectors", "2", "--set",
              "collectors.max_lag_env_steps=10", "--run-dir", str(tmp_path / "c")])
    assert not any((tmp_path / d).exists() for d in "abc")


def test_without_ray_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'relive\[ray\]'"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--collectors", "2", "--run-dir",
              str(tmp_path / "r"), *TINY])
    assert not (tmp_path / "r").exists()


def test_residual_sac_refuses_collectors_naming_why(tmp_path, monkeypatch):

    monkeypatch.setattr("relive.agents.residual_sac.load_base_policy",
                        lambda path, spec, trusted=False: (lambda obs: np.zeros((len(obs), 1), np.float32)))
    with pytest.raises(ValueError, match="ResidualSAC cannot act in collector processes: its beta schedule"):
        main(["--debug", "train", "residual_sac", "--env", "Pendulum-v1", "--collectors", "2", "--base-policy", "x",
              "--offline-steps", "0", "--run-dir", str(tmp_path / "r"), *TINY])
    assert not (tmp_path / "r").exists()


# -- on a real local Ray -----------------------------------------------------------------------------------------
EPISODE = 97  # Pendulum time limit: never a multiple of the 50-step chunks below, so a cut always has an open episode
ARGS = ["sac", "--env", "Pendulum-v1", "--collectors", "2", "--online-steps", "600", "--warmup", "100",
        "--eval-every", "600", "--checkpoint-every", "200", "--capacity", "5000", "--set",
        f"env.max_episode_steps={EPISODE}", "--set", "collectors.chunk_env_steps=50", "--set",
        "run.save_final_buffer=true", *TINY]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (the trainer joins a running Ray and leaves it running)."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def pools(monkeypatch):
    """The RayCollectors the trainer builds (the tests read their collectors' process ids)."""
    from relive.train import ray_collectors

    seen = []
    init = ray_collectors.RayCollectors.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        seen.append(self)

    monkeypatch.setattr(ray_collectors.RayCollectors, "__init__", record)
    return seen


def read_run(run_dir):
    from relive.replay import ReplayBuffer

    lines = [json.loads(x) for x in (run_dir / "chunks.jsonl").read_text().splitlines()]
    storage = ReplayBuffer.load(run_dir / "buffer_final").storage
    summary = json.loads((run_dir / "summary.json").read_text())
    return [x for x in lines if "chunk_id" in x], [x for x in lines if "lost" in x], storage, summary


def check_integrity(chunks, storage, num_rows, envs=1):
    """Every received row stored once: the chunk log's rows = the buffer's online rows, per stream (collector c's env
    j is stream c x envs + j); chunk ids 0, 1, 2, ... per collector (no duplicates, no gaps); in each stream, steps
    count up from 0 inside an episode and a new episode starts only after a terminated or truncated row."""
    assert sum(sum(c["rows"]) for c in chunks) == num_rows == int((storage.meta["source"][:num_rows] == 1).sum())
    for collector in (0, 1):
        ids = [c["chunk_id"] for c in chunks if c["collector"] == collector]
        assert ids == list(range(len(ids)))
        for j in range(envs):
            assert sum(c["rows"][j] for c in chunks if c["collector"] == collector) == \
                int((storage.meta["stream"][:num_rows] == collector * envs + j).sum())
    for stream in range(2 * envs):
        slots = np.flatnonzero(storage.meta["stream"][:num_rows] == stream)  # (no ring wrap: capacity 5000)
        step, ep = storage.meta["step_in_episode"][slots], storage.meta["episode_id"][slots]
        end = storage.columns["terminated"][slots] | storage.columns["truncated"][slots]
        assert step[0] == 0
        for i in range(1, slots.size):
            if end[i - 1]:
                assert step[i] == 0 and ep[i] != ep[i - 1]
            else:
                assert step[i] == step[i - 1] + 1 and ep[i] == ep[i - 1]


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_two_collectors_of_two_envs_fill_one_buffer_with_exact_counts(local_ray, tmp_path):
    """2 collectors x 2 envs (a vector env in each actor) = 4 streams; exactly 600 env steps and 500 updates."""
    from relive.train.trainer import train

    summary = train(cfg_for([*ARGS, "--num-envs", "2"], tmp_path / "r"))
    chunks, lost, storage, _ = read_run(tmp_path / "r")
    assert summary.num_online_env_steps == 600 and summary.num_grad_steps == 500  # utd 1 x (600 - 100 warm-up)
    assert not lost and {c["collector"] for c in chunks} == {0, 1}
    assert all(c["env_steps"] == 50 and c["rows"] == [25, 25] for c in chunks)
    check_integrity(chunks, storage, 600, envs=2)
    for collector in (0, 1):
        versions = [c["policy_version"] for c in chunks if c["collector"] == collector]
        assert versions == sorted(versions) and versions[0] == 0  # weights published at gradient step 0, 100, ...
    assert all(v % 100 == 0 for v in (c["policy_version"] for c in chunks))
    assert any(c["policy_version"] > 0 for c in chunks)


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_collector_killed_with_sigkill_is_restarted_and_nothing_is_lost_or_stored_twice(local_ray, tmp_path, pools):
    """The first collector to have delivered a seeded random number (1 or 2) of chunks gets SIGKILL while its next
    request is in flight, i.e. mid-chunk (or just after: 50 Pendulum steps take ~10 ms). (Which collector that is
    depends on which actor process started first: one often delivers several chunks before the other's first.) A
    chunk in flight is lost and requested again (else the next request fails); its stream's open episode ends as a
    truncation; a new actor goes on with the next chunk id; the run ends with exactly 600 env steps and 500 gradient
    steps."""
    from relive.train.trainer import train

    kill_after = int(np.random.default_rng(16).integers(1, 3))
    killed = []  # (collector, pid)

    def on_step(env_steps, grad_steps):  # (called after every chunk and every gradient step)
        pool = pools[0]
        if killed:
            return
        for c in sorted({c for c, _ in pool.in_flight.values()}):
            if pool.next_chunk[c] >= kill_after:
                killed.append((c, pool.pids[c]))
                os.kill(pool.pids[c], signal.SIGKILL)
                return

    summary = train(cfg_for(ARGS, tmp_path / "r"), on_step=on_step)
    assert killed and summary.num_online_env_steps == 600 and summary.num_grad_steps == 500
    victim, pid = killed[0]
    chunks, lost, storage, _ = read_run(tmp_path / "r")
    check_integrity(chunks, storage, 600)
    assert [x["lost"] for x in lost] == [victim]
    assert {c["incarnation"] for c in chunks if c["collector"] == victim} == {0, 1}
    assert {c["incarnation"] for c in chunks if c["collector"] != victim} == {0}
    assert pid in {c["pid"] for c in chunks if c["collector"] == victim and c["incarnation"] == 0}
    first = [c["chunk_id"] for c in chunks if c["collector"] == victim and c["incarnation"] == 0]
    assert first in (list(range(kill_after)), list(range(kill_after + 1)))  # (+1: it finished before the signal hit)
    # the rows of the victim received before its death end with a truncation; its new actor starts an episode
    n = sum(c["rows"][0] for c in chunks if c["collector"] == victim and c["incarnation"] == 0)
    slots = np.flatnonzero(storage.meta["stream"][:600] == victim)
    assert storage.columns["truncated"][slots[n - 1]]
    assert storage.meta["step_in_episode"][slots[n - 1]] == (n - 1) % EPISODE
    assert not storage.columns["terminated"][slots[n - 1]] and storage.meta["step_in_episode"][slots[n]] == 0


@pytest.mark.slow  # (15 s on 2 quiet cores, ~38 s at load 7: two learners, up to four actor processes start)
def test_a_learner_crash_resumes_from_its_checkpoint_with_new_collectors(local_ray, tmp_path):
    """The learner dies at env step 450; its checkpoint at 400 holds the chunk ids; the resume starts new actors
    (next incarnation), ends both streams' episodes at the checkpoint, drops the chunks received after it from
    chunks.jsonl (they died with the learner) and finishes with exactly 600 env steps and 500 gradient steps."""
    from relive.replay.checkpoint import load_tree
    from relive.train.trainer import train

    run_dir = tmp_path / "r"
    with pytest.raises(SimulatedKill):
        train(cfg_for(ARGS, run_dir), on_step=kill_at(env_step=450))
    assert int(load_tree(run_dir / "checkpoint", kind="run")["loop"]["env_steps"]) == 400  # first chunk >= 400
    summary = train(resume_dir=run_dir)
    assert summary.num_online_env_steps == 600 and summary.num_grad_steps == 500
    chunks, lost, storage, _ = read_run(run_dir)
    check_integrity(chunks, storage, 600)
    assert not lost
    before = {(c["collector"], c["incarnation"]) for c in chunks if c["env_steps_total"] <= 400}
    after = {(c["collector"], c["incarnation"]) for c in chunks if c["env_steps_total"] > 400}
    assert before and before <= {(0, 0), (1, 0)} and after and after <= {(0, 1), (1, 1)}  # (a slow actor start may
    # leave one collector without a chunk before the crash)
    for stream in (0, 1):  # the resume cut both streams' episodes where the checkpoint left them
        rows = sum(c["rows"][0] for c in chunks if c["collector"] == stream and c["env_steps_total"] <= 400)
        slots = np.flatnonzero(storage.meta["stream"][:600] == stream)
        assert rows % 50 == 0
        if rows:
            assert storage.columns["truncated"][slots[rows - 1]]
        if 0 < rows < slots.size:
            assert storage.meta["step_in_episode"][slots[rows]] == 0


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_ddqn_epsilon_follows_the_runs_env_steps_on_collectors(local_ray, tmp_path):
    """DDQN's epsilon counts act calls; with collectors the learner keeps that clock at its env steps received and
    the copies get it with the weights: epsilon at the end is the schedule's value at 300 env steps."""
    from relive.train.trainer import train

    args = ["ddqn", "--env", "CartPole-v1", "--collectors", "2", "--online-steps", "300", "--warmup", "100",
            "--eval-every", "300", "--log-every", "300", "--capacity", "2000", "--set", "agent.eps_decay_steps=600",
            "--set", "collectors.chunk_env_steps=50", "--chunk", "1", "--grad-steps-per-chunk", "0", *TINY]
    cfg = cfg_for(args, tmp_path / "r")
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    c = cfg.agent
    assert c.eps_decay_steps == 600
    expected = c.eps_start + (c.eps_end - c.eps_start) * 300 / 600  # half-way through the linear schedule
    assert rows[-1]["train/epsilon"] == pytest.approx(expected)


def test_the_acting_state_carries_the_weights_and_the_acting_clock():
    import torch

    from relive.agents.ddqn import DDQN, DDQNConfig
    from relive.train.ray_collectors import acting_state, load_acting_state

    learner, copy = DDQN(4, 2, DDQNConfig(hidden=(8,)), seed=0), DDQN(4, 2, DDQNConfig(hidden=(8,)), seed=1)
    learner.num_act_steps = 123
    state = acting_state(learner)
    assert set(state) == {"modules", "clock"} and set(state["modules"]) == {"q"}  # no target net, no optimizer
    load_acting_state(copy, state)
    assert copy.num_act_steps == 123
    obs = torch.randn(5, 4).numpy()
    assert (copy.act(obs, explore=False) == learner.act(obs, explore=False)).all()
