"""Interventions (issue 32 item 2): the collector's intervener seam, the built-in interveners, where intervened rows
are stored (tagged on the ring, and each stretch in the never-evicted demonstration segment) and what is logged."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from relive.envs import env_spec, make_env
from relive.replay import MixtureSampler, ReplayBuffer, UniformSampler
from relive.replay.checkpoint import load_tree
from relive.train.collector import Collector
from relive.train.intervention import (
    DemoWriter,
    DeviceIntervener,
    DeviceState,
    ScriptedIntervener,
    intervention_columns,
)
from relive.train.trainer import train
from relive.types import AGENT, INTERVENTION, OFFLINE, ONLINE
from tests.train.test_trainer import (
    TINY,
    SimulatedKill,
    assert_same_agent,
    cfg_for,
    kill_at,
    sigkill_after_first_checkpoint,
)


class FakeDevice:
    """A gamepad that replays a script of (engaged, action) reads."""

    def __init__(self, script):
        self.script, self.reads = list(script), 0

    def read(self) -> DeviceState:
        engaged, action = self.script[self.reads % len(self.script)]
        self.reads += 1
        return DeviceState(engaged, np.asarray(action, np.float32))


def test_scripted_intervener_takes_over_beyond_the_threshold_holds_and_spends_its_budget():
    expert = ScriptedIntervener(lambda obs: np.zeros(2, np.float32), threshold=0.5, budget=3, hold_steps=2)
    near, far = np.array([0.3, 0.3], np.float32), np.array([0.6, 0.0], np.float32)
    assert expert(None, near)[0] is False  # ||(0.3, 0.3)|| = 0.42 <= 0.5
    taken, action = expert(None, far)
    assert taken and (action == 0).all() and action.dtype == np.float32
    assert expert(None, near) == (True, pytest.approx(np.zeros(2)))  # held for a second step
    assert expert(None, near)[0] is False
    assert expert(None, far)[0] is True  # the budget's third step
    assert expert(None, far)[0] is False and expert.used == 3  # spent
    with pytest.raises(ValueError, match="threshold"):
        ScriptedIntervener(lambda obs: 0, threshold=float("nan"))


def test_device_intervener_reads_the_device_once_per_step_and_clips():
    device = FakeDevice([(False, [0.9]), (True, [5.0]), (True, [-0.25])])
    iv = DeviceIntervener(device, low=np.array([-2.0]), high=np.array([2.0]))
    proposed = np.array([0.1], np.float32)
    assert iv(None, proposed)[0] is False
    assert iv(None, proposed)[1].tolist() == [2.0]  # clipped to the action bounds
    assert iv(None, proposed)[1].tolist() == [-0.25]
    assert device.reads == 3
    with pytest.raises(ValueError, match="non-finite"):
        DeviceIntervener(FakeDevice([(True, [np.nan])]), [-1.0], [1.0])(None, proposed)


class RecordActions(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.executed = []

    def step(self, action):
        self.executed.append(np.array(action))
        return super().step(action)


def test_the_collector_executes_the_intervener_action_and_stores_both():
    env = RecordActions(make_env("Pendulum-v1", 10))
    spec = env_spec(env)
    device = FakeDevice([(False, [0.0])] * 3 + [(True, [-1.5])] * 4)
    collector = Collector(env, spec, seed=0, record_columns=intervention_columns(spec.action_shape),
                          intervener=DeviceIntervener(device, spec.action_low, spec.action_high))
    rows = collector.step(lambda obs: np.full((1, 1), 0.5, np.float32), 20)
    flag = rows["intervened"]
    assert flag.tolist() == ([False] * 3 + [True] * 4) * 2 + [False] * 3 + [True] * 3
    np.testing.assert_array_equal(np.concatenate(env.executed), rows["action"][:, 0])  # stored = executed
    assert (rows["action"][flag] == -1.5).all() and (rows["action"][~flag] == 0.5).all()
    assert (rows["proposed_action"] == 0.5).all()  # the agent's proposal, kept
    assert collector.finished_interventions == [4, 7] and collector.num_intervened_steps == 11  # episodes of 10


def test_intervened_stretches_go_to_the_demonstration_segment_and_stay_there():
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(24, (3,), (1,), sampler=MixtureSampler(UniformSampler(), UniformSampler()), demo_capacity=12,
                       extra_columns={c.name: c.spec for c in intervention_columns((1,))})
    writer = DemoWriter(buf)

    def chunk(flags, end_at=None):
        n = len(flags)
        return {"obs": rng.normal(size=(n, 3)).astype(np.float32), "action": rng.normal(size=(n, 1)).astype(np.float32),
                "reward": np.ones(n, np.float32), "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
                "terminated": np.arange(n) == end_at, "truncated": np.zeros(n, bool),
                "proposed_action": np.zeros((n, 1), np.float32), "intervened": np.array(flags, bool)}

    stored = []
    for flags in ([0, 1, 1], [1], [0, 0], [1, 1]):  # a stretch across chunks, then one still going on
        rows = chunk(flags)
        buf.extend(rows, origin=DemoWriter.origin(rows))
        writer.add(rows)
        stored.append(rows)
    st_ = buf.storage
    assert st_.num_offline == 3  # the first stretch (3 rows, 2 chunks) is written; the second is pending
    np.testing.assert_array_equal(st_.columns["obs"][:3], np.concatenate([stored[0]["obs"][1:], stored[1]["obs"]]))
    assert st_.columns["truncated"][:3].tolist() == [False, False, True]  # the stretch ends where the person let go
    assert (st_.meta["origin"][:3] == INTERVENTION).all() and (st_.meta["source"][:3] == OFFLINE).all()
    ring = slice(st_.ring_base, st_.size)
    assert st_.meta["origin"][ring].tolist() == [AGENT, INTERVENTION, INTERVENTION, INTERVENTION, AGENT, AGENT,
                                                 INTERVENTION, INTERVENTION]
    rows = chunk([1, 0], end_at=0)  # the pending stretch ends with the episode: terminated, not truncated
    buf.extend(rows, origin=DemoWriter.origin(rows))
    writer.add(rows)
    assert st_.num_offline == 6 and st_.columns["terminated"][5] and not st_.columns["truncated"][5]
    for _ in range(5):  # the ring (room 12) wraps several times: the demonstrations stay
        rows = chunk([0] * 7)
        buf.extend(rows, origin=DemoWriter.origin(rows))
        writer.add(rows)
    assert (st_.meta["origin"][:6] == INTERVENTION).all() and (st_.meta["origin"][st_.ring_base:] == AGENT).all()
    assert (st_.meta["source"][st_.ring_base:] == ONLINE).all()


HIL = ["sac", "--env", "Pendulum-v1", "--set", "env.max_episode_steps=50", "--replay", "symmetric", "--warmup", "40",
       "--capacity", "120", "--log-every", "50", "--set", "intervention.kind=scripted",
       "--set", "intervention.threshold=1.0", "--set", "intervention.budget=40", "--set", "intervention.hold_steps=5",
       "--set", "intervention.demo_capacity=60", *TINY]


def test_a_run_with_interventions_logs_them_and_keeps_them_as_demonstrations(tmp_path):
    result = train(cfg_for([*HIL, "--online-steps", "250", "--eval-every", "250"], tmp_path / "r"))
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    online = [r for r in rows if r.get("phase") == "online"]
    assert online[-1]["collect/num_intervened_steps"] == 40  # the budget, spent
    assert online[-1]["replay/num_demonstrations"] == 40  # each intervened step also a demonstration
    rates = [r["collect/intervention_rate"] for r in online if r["collect/intervention_rate"] == r[
        "collect/intervention_rate"]]
    assert rates and 0 < max(rates) <= 1
    assert result.num_grad_steps > 0


def test_a_killed_run_with_interventions_resumes_bit_exact_with_every_stored_intervention(tmp_path):
    args = [*HIL, "--online-steps", "250", "--eval-every", "125", "--checkpoint-every", "60"]
    train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=130))  # mid-episode (episodes of 50)
    ckpt = load_tree(tmp_path / "cut" / "checkpoint", kind="run")
    st_ = ckpt["buffer"]["storage"]
    assert ckpt["loop"]["env_steps"] == 100  # the first episode end after 60 steps, then 120 -> 150 not reached
    k = int(st_["num_offline"])
    assert k == int(ckpt["collector"]["intervention"]["num_intervened_steps"]) > 0  # every one stored
    assert (np.asarray(st_["meta"]["origin"])[:k] == INTERVENTION).all()
    train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")


class FakeClock:
    """``time`` for the loop with a monotonic clock driven by the env steps (0.1 s each): wall-clock cadences are
    tested without waiting or timing anything."""

    def __init__(self):
        self.env_steps = 0

    def monotonic(self):
        return self.env_steps * 0.1

    def perf_counter(self):
        return self.env_steps * 0.1


def test_checkpoints_every_so_many_seconds_of_wall_clock_at_episode_ends(tmp_path, monkeypatch):
    import relive.train.loop as loop

    clock, saved = FakeClock(), []
    real_checkpoint = loop.checkpoint
    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(loop, "checkpoint", lambda run: (saved.append(run.state.env_steps), real_checkpoint(run)))

    def on_step(env_steps, grad_steps):
        clock.env_steps = env_steps

    args = [*HIL, "--online-steps", "260", "--eval-every", "1000", "--checkpoint-every", "100000"]
    train(cfg_for([*args, "--set", "run.checkpoint_every_seconds=7"], tmp_path / "timed"), on_step=on_step)
    assert saved == [100, 200]  # 7 s = 70 steps after the last one (or the start), at the next episode end (of 50)
    saved.clear()
    clock.env_steps = 0
    train(cfg_for(args, tmp_path / "steps"), on_step=on_step)
    assert saved == []  # (no step cadence due within the run)
    with pytest.raises(ValueError, match="checkpoint_every_seconds"):
        cfg_for([*args, "--set", "run.checkpoint_every_seconds=0"], tmp_path / "bad")
    with pytest.raises(ValueError, match="exceeds intervention.demo_capacity"):
        train(cfg_for([*args, "--set", "intervention.budget=61"], tmp_path / "full"))


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_sigkilled_run_keeps_its_interventions_and_resumes_bit_exact(tmp_path):
    """A real SIGKILL of `relive train` with interventions and a wall-clock checkpoint cadence, wherever it falls
    (mid-episode, mid-update), then `relive train --resume`: the checkpoint holds every intervention stored as of it,
    and the resumed run ends with the uninterrupted run's agent."""
    from relive.cli import main

    args = [*HIL, "--online-steps", "700", "--eval-every", "350", "--checkpoint-every", "100000",
            "--set", "run.checkpoint_every_seconds=0.2", "--set", "intervention.budget=200",
            "--set", "intervention.demo_capacity=200", "--capacity", "400"]
    run = tmp_path / "killed"
    sigkill_after_first_checkpoint(args, run)
    ckpt = load_tree(run / "checkpoint", kind="run")
    st_ = ckpt["buffer"]["storage"]
    k, n = int(st_["num_offline"]), int(ckpt["collector"]["intervention"]["num_intervened_steps"])
    assert k == n and (np.asarray(st_["meta"]["origin"])[:k] == INTERVENTION).all()  # every one, as demonstrations
    ring = np.asarray(st_["meta"]["origin"])[int(st_["ring_base"]):]
    assert (ring == INTERVENTION).sum() == n  # and on the ring (the ring holds every step so far)
    assert main(["train", "--resume", str(run)]) == 0
    train(cfg_for(args, tmp_path / "full"))
    assert_same_agent(tmp_path / "full", run)


def test_expert_dataset_saves_whole_episodes_of_a_registered_expert(tmp_path):
    from relive.train.intervention import expert_dataset

    path = expert_dataset("Pendulum-v1", "zero", 2, tmp_path / "demos.npz", max_episode_steps=10)
    with np.load(path, allow_pickle=False) as d:
        assert d["reward"].shape == (20,) and np.flatnonzero(d["truncated"]).tolist() == [9, 19]
        assert (d["action"] == 0).all()
    with pytest.raises(ValueError, match="not registered"):
        expert_dataset("Pendulum-v1", "nope", 1, tmp_path / "x.npz")


def test_closing_the_collector_closes_its_intervener_and_only_once_asked():
    """The run's end (train()'s finally: collector.close()) lets an intervener's resources go -- the browser
    console's server thread outlived train() before; an intervener without close is left as it is."""

    class Holding:
        closed = 0

        def __call__(self, obs, proposed):
            return False, proposed

        def on_episode_start(self):
            pass

        def close(self):
            self.closed += 1

    env = make_env("Pendulum-v1")
    spec = env_spec(env)
    held = Holding()
    collector = Collector(env, spec, seed=0, intervener=held)
    assert held.closed == 0
    collector.close()
    assert held.closed == 1
    Collector(make_env("Pendulum-v1"), spec, seed=0, intervener=lambda obs, proposed: (False, proposed)).close()
