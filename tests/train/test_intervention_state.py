"""The state stand-in (issue 46 item 4): an expert takes over when the task goes wrong (its distance to success rose at
each of the last k steps), after a reaction delay, and lets go when it is back on track (the distance fell at each of
m steps of the takeover, or is below a threshold). Exact checks on hand-made distance sequences, its state, the goal
distance of a real goal task, and a run through the trainer on FetchReach whose stored flags are replayed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from relive.config import InterventionConfig
from relive.envs import env_spec, make_env
from relive.presets import get_preset
from relive.replay import ReplayBuffer
from relive.train.intervention import (
    DISTANCES,
    EXPERTS,
    StateIntervener,
    build_intervener,
    expert_dataset,
    goal_distance,
)
from relive.train.trainer import train
from relive.types import INTERVENTION
from tests.train.test_trainer import TINY, cfg_for

EXPERT_ACTION = np.array([-1.0], np.float32)
PROPOSED = np.array([0.5], np.float32)


def run(distances, episode_starts=(), **settings):
    """The intervener's decisions over a hand-made sequence of distances (the observation *is* the distance here):
    one bool per step; ``episode_starts``: steps at which a new episode begins."""
    iv = StateIntervener(lambda obs: EXPERT_ACTION, lambda obs: obs, **settings)
    flags = []
    for t, d in enumerate(distances):
        if t in episode_starts:
            iv.on_episode_start()
        taken, action = iv(d, PROPOSED)
        assert action.tolist() == (EXPERT_ACTION if taken else PROPOSED).tolist() and action.dtype == np.float32
        flags.append(int(taken))
    return flags, iv


UP3_DOWN = [1.0, 1.1, 1.2, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8]  # rises at steps 1-3, falls from step 4 on


def test_takes_over_once_the_distance_rose_at_each_of_the_last_k_steps_and_lets_go_after_m_falls():
    flags, iv = run(UP3_DOWN, rising_steps=3, recovered_steps=3)
    # step 3 is the third rise in a row: the expert acts at 3; it falls at 4, 5, 6 (three falls of the takeover):
    # the agent acts again at 6
    assert flags == [0, 0, 0, 1, 1, 1, 0, 0, 0] and iv.used == 3
    assert run(UP3_DOWN, rising_steps=4, recovered_steps=3)[0] == [0] * 9  # only 3 rises in a row: never
    assert run(UP3_DOWN, rising_steps=2, recovered_steps=1)[0] == [0, 0, 1, 1, 0, 0, 0, 0, 0]  # (rise 2 at step 2)


def test_a_flat_or_interrupted_rise_is_not_a_rise():
    assert run([1.0, 1.1, 1.1, 1.2, 1.3, 1.0], rising_steps=3)[0] == [0] * 6  # equal distances break the streak
    assert run([1.0, 1.1, 1.0, 1.1, 1.2, 1.3, 1.4], rising_steps=3, recovered_steps=1)[0] == [0, 0, 0, 0, 0, 1, 1]


def test_the_reaction_delay_postpones_the_takeover_whatever_happens_meanwhile():
    # the rise is seen at step 3; with a delay of 2 the expert takes over at step 5, though the distance has been
    # falling since step 4 (the person committed); the falls before the takeover do not count towards letting go
    flags, _ = run(UP3_DOWN, rising_steps=3, recovered_steps=2, reaction_steps=2)
    assert flags == [0, 0, 0, 0, 0, 1, 1, 0, 0]  # falls at 6 and 7 within the takeover: agent again at 7
    assert run(UP3_DOWN, rising_steps=3, recovered_steps=3, reaction_steps=1)[0] == [0, 0, 0, 0, 1, 1, 1, 0, 0]


def test_holds_while_the_distance_does_not_fall_and_lets_go_below_the_on_track_distance():
    d = [1.0, 1.1, 1.2, 1.3, 1.3, 1.4, 1.2, 1.25, 1.1, 1.0, 0.9, 0.8]
    assert run(d, rising_steps=3, recovered_steps=2)[0] == [0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0]  # falls: 6; 8, 9
    near = [0.3, 0.31, 0.32, 0.33, 0.2, 0.04, 0.05, 0.06, 0.07, 0.08]
    # below 0.05 at step 5: back on track, whatever the falls; the rises at 6-9 start at 0.05 (not below it) but
    # the streak restarted at 5, so the third rise is step 8
    assert run(near, rising_steps=3, recovered_steps=5, on_track_distance=0.05)[0] == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    low = [0.01, 0.02, 0.03, 0.04, 0.045]  # rising, but below the on-track distance: never
    assert run(low, rising_steps=1, on_track_distance=0.05)[0] == [0] * 5


def test_the_budget_ends_a_takeover_and_the_next_ones():
    d = UP3_DOWN + [0.9, 1.0, 1.1, 1.2, 1.3]
    flags, iv = run(d, rising_steps=3, recovered_steps=3, budget=4)
    # the second takeover (rises at 9, 10, 11) gets one step of the budget
    assert flags == [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0] and iv.used == 4
    assert run(d, rising_steps=3, recovered_steps=3)[0][11:] == [1, 1, 1]  # (without a budget)


def test_a_new_episode_starts_with_the_agent_in_control_and_no_history():
    # rises across the episode boundary (step 2 starts an episode) do not count; a takeover does not carry over
    d = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    assert run(d, episode_starts=(2,), rising_steps=3)[0] == [0, 0, 0, 0, 0, 1]
    assert run(d, episode_starts=(4,), rising_steps=3, recovered_steps=5)[0] == [0, 0, 0, 1, 0, 0]


def test_state_dict_round_trips_mid_takeover_through_json():
    d = [1.0, 1.1, 1.2, 1.3, 1.25, 1.3, 1.2, 1.1, 1.0, 1.1, 1.2, 1.3, 1.4]
    full, _ = run(d, rising_steps=3, recovered_steps=2, reaction_steps=1, budget=6)
    for cut in range(len(d)):
        a = StateIntervener(lambda obs: EXPERT_ACTION, lambda obs: obs, 3, 2, 1, 0.0, 6)
        head = [int(a(x, PROPOSED)[0]) for x in d[:cut]]
        b = StateIntervener(lambda obs: EXPERT_ACTION, lambda obs: obs, 3, 2, 1, 0.0, 6)
        b.load_state_dict(json.loads(json.dumps(a.state_dict())))
        assert b.state_dict() == a.state_dict()
        assert head + [int(b(x, PROPOSED)[0]) for x in d[cut:]] == full


def test_bad_settings_and_distances_are_refused():
    with pytest.raises(ValueError, match="rising_steps >= 1"):
        StateIntervener(lambda o: 0, lambda o: 0, rising_steps=0)
    with pytest.raises(ValueError, match="on_track_distance"):
        StateIntervener(lambda o: 0, lambda o: 0, on_track_distance=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        StateIntervener(lambda o: 0, lambda o: float("inf"))(None, PROPOSED)
    for bad in ({"reaction_steps": -1}, {"recovered_steps": 0}, {"on_track_distance": -0.1}, {"distance": ""}):
        with pytest.raises(ValueError, match="intervention"):
            InterventionConfig(**bad)


def test_goal_distance_reads_a_goal_task_as_a_dict_or_flattened():
    for keep in (False, True):
        env = make_env("FetchReach-v4", keep_goal_dict=keep)
        obs, _ = env.reset(seed=0)
        raw = env.unwrapped._get_obs()  # (the env's own dict)
        want = float(np.linalg.norm(raw["achieved_goal"] - raw["desired_goal"]))
        assert goal_distance(env_spec(env), env)(obs) == pytest.approx(want, rel=1e-6) and want > 0.05
        env.close()
    env = make_env("Pendulum-v1")
    with pytest.raises(ValueError, match="needs a goal task.*register_distance"):
        goal_distance(env_spec(env), env)


def test_the_registry_builds_it_and_names_what_is_missing():
    env = make_env("FetchReach-v4")
    spec = env_spec(env)
    cfg = get_preset("hil_serl")
    state = {"kind": "state", "expert": "reach_goal", "rising_steps": 2, "reaction_steps": 4, "recovered_steps": 5,
             "on_track_distance": 0.05, "budget": 7}
    iv = build_intervener(_with_intervention(cfg, state), spec, env)
    assert isinstance(iv, StateIntervener)
    assert (iv.rising_steps, iv.reaction_steps, iv.recovered_steps, iv.on_track_distance, iv.budget) == (2, 4, 5,
                                                                                                       0.05, 7)
    with pytest.raises(ValueError, match="distance 'mine' is not registered.*--plugin"):
        build_intervener(_with_intervention(cfg, {**state, "distance": "mine"}), spec, env)
    with pytest.raises(ValueError, match="expert 'nobody' is not registered"):
        build_intervener(_with_intervention(cfg, {**state, "expert": "nobody"}), spec, env)
    assert "goal" in DISTANCES and "reach_goal" in EXPERTS


def _with_intervention(cfg, settings: dict):
    from dataclasses import replace

    return replace(cfg, intervention=replace(cfg.intervention, **settings))


def test_a_fetchreach_run_intervenes_exactly_where_the_rule_says(tmp_path, monkeypatch):
    """Through the trainer (hil_serl, a few hundred steps; nothing is learned here): every stored online row's flag
    is what a fresh state intervener decides on the distances the run saw (recorded as it ran, and those of the
    stored observations), and an intervened row's action is the expert's."""
    seen: list[float] = []

    def recorded_goal(spec, env):  # (the goal distance, recorded: the stored observations are float32 copies)
        distance = goal_distance(spec, env)
        return lambda obs: seen.append(distance(obs)) or seen[-1]

    monkeypatch.setitem(DISTANCES, "recorded_goal", recorded_goal)
    data = expert_dataset("FetchReach-v4", "reach_goal", 2, tmp_path / "demos.npz")
    run_dir = tmp_path / "run"
    settings = ["--set", "intervention.kind=state", "--set", "intervention.expert=reach_goal",
                "--set", "intervention.distance=recorded_goal", "--set", "intervention.rising_steps=2",
                "--set", "intervention.reaction_steps=2", "--set", "intervention.recovered_steps=2",
                "--set", "intervention.on_track_distance=0.05", "--set", "intervention.demo_capacity=300"]
    train(cfg_for(["hil_serl", "--env", "FetchReach-v4", "--dataset", str(data), "--online-steps", "150",
                   "--eval-every", "150", "--log-every", "50", "--capacity", "800",
                   "--set", "run.save_final_buffer=true", *settings, *TINY], run_dir))
    st = ReplayBuffer.load(run_dir / "buffer_final").storage
    ring = slice(st.ring_base, st.ring_base + st.num_online)
    obs, action, flags = st.columns["obs"][ring], st.columns["action"][ring], st.columns["intervened"][ring]
    ends = st.columns["terminated"][ring] | st.columns["truncated"][ring]
    assert len(flags) == len(seen) == 150 and 0 < flags.sum() < 150
    env = make_env("FetchReach-v4")
    spec = env_spec(env)
    np.testing.assert_allclose(seen, [goal_distance(spec, env)(o) for o in obs], atol=1e-6)  # the rows' distances
    iv = StateIntervener(lambda t: EXPERT_ACTION, lambda t: seen[t], rising_steps=2, recovered_steps=2,
                         reaction_steps=2, on_track_distance=0.05)
    decided = []
    for t in range(len(flags)):
        if t == 0 or ends[t - 1]:
            iv.on_episode_start()
        decided.append(iv(t, PROPOSED)[0])
    assert decided == flags.tolist()
    expert = EXPERTS["reach_goal"](spec, env)
    np.testing.assert_allclose(action[flags], [expert(o) for o in obs[flags]], atol=1e-5)
    assert not np.allclose(action[~flags], [expert(o) for o in obs[~flags]], atol=1e-3)  # (the agent's own)
    demos = slice(st.num_before_online, st.num_offline)  # every intervened step joined the segment
    assert st.num_offline - st.num_before_online == flags.sum()
    assert (st.meta["origin"][demos] == INTERVENTION).all()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in metrics if r.get("phase") == "online"][-1]["collect/num_intervened_steps"] == flags.sum()
