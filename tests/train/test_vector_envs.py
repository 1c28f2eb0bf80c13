"""Vector envs in one process (issue 16, item 2): ``--num-envs N`` steps N envs with one policy call per step;
env i is replay stream i; a truncation's next_obs is the true final observation; rows of different envs never
share an episode; training and resume work with N envs."""

import json

import numpy as np
import pytest
import torch

from relive.cli import main
from relive.envs import env_spec, make_env, make_vector_env
from relive.replay.checkpoint import load_tree
from relive.train.collector import VectorCollector
from relive.train.trainer import train
from tests.train.test_trainer import TINY, SimulatedKill, cfg_for, kill_at


def _zeros(n):
    return lambda obs: np.zeros((obs.shape[0], 1), np.float32)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_truncation_next_obs_is_the_true_final_observation(mode):
    """Pendulum with time limits 5: both envs truncate at step 5; the stored next_obs there is the env's last
    observation (replayed on a single env), not the next episode's first, and one policy call serves both."""
    envs = make_vector_env("Pendulum-v1", 2, mode, max_episode_steps=5)
    spec = env_spec(make_env("Pendulum-v1"))
    collector = VectorCollector(envs, spec, seed=0)
    calls = []

    def policy(obs):
        calls.append(obs.shape)
        return np.zeros((obs.shape[0], 1), np.float32)

    chunks, steps = collector.step_streams(policy, 14)  # 7 vector steps = 14 env steps
    collector.close()
    assert steps == 14 and calls == [(2, 3)] * 7
    for stream, rows in chunks:
        assert rows["truncated"].tolist() == [False] * 4 + [True, False, False]
        assert not rows["terminated"].any()
        np.testing.assert_array_equal(rows["next_obs"][:4], rows["obs"][1:5])
        assert not np.allclose(rows["next_obs"][4], rows["obs"][5])  # the reset obs is the next row's obs
        ref = make_env("Pendulum-v1", max_episode_steps=5)
        obs, _ = ref.reset(seed=stream)  # the vector env seeds env i with seed + i
        np.testing.assert_allclose(rows["obs"][0], obs)
        for _ in range(5):
            final_obs, *_ = ref.step(np.zeros(1, np.float32))
        np.testing.assert_allclose(rows["next_obs"][4], final_obs, rtol=1e-6)
        first, _ = ref.reset()  # the next episode starts from the env's own RNG, as the vector env's reset does
        np.testing.assert_allclose(rows["obs"][5], first, rtol=1e-6)


def test_rows_of_different_envs_never_share_an_episode(tmp_path):
    """CartPole, 3 envs whose episodes end at different steps: every stored episode holds rows of one stream,
    consecutive steps, and its transitions chain (next_obs[t] == obs[t + 1]) -- the rows of one env trajectory."""
    run = tmp_path / "r"
    main(["--debug", "train", "ddqn", "--env", "CartPole-v1", "--online-steps", "600", "--warmup", "600",
          "--num-envs", "3",
          "--chunk", "30", "--eval-every", "600", "--run-dir", str(run), "--set", "run.save_final_buffer=true",
          *TINY])
    from relive.replay import ReplayBuffer

    buf = ReplayBuffer.load(run / "buffer_final")
    st = buf.storage
    assert len(buf) == 600 and sorted(set(st.meta["stream"][:600].tolist())) == [0, 1, 2]
    view = st.episodes.live()
    assert view.finished.sum() >= 10
    for start, length, src in zip(view.start, view.length, view.source, strict=True):
        slots = st.episode_slots([start], [length], [src])
        assert np.unique(st.meta["stream"][slots]).size == 1
        np.testing.assert_array_equal(st.meta["step_in_episode"][slots], np.arange(length))
        np.testing.assert_array_equal(st.columns["next_obs"][slots[:-1]], st.columns["obs"][slots[1:]])
        ends = st.columns["terminated"][slots] | st.columns["truncated"][slots]
        assert not ends[:-1].any()


@pytest.mark.parametrize("preset,env", [("sac", "Pendulum-v1"), ("ddqn", "CartPole-v1")])
def test_short_training_run_with_two_envs(tmp_path, preset, env):
    """env steps count both envs: 300 online steps = 150 vector steps; utd 1 -> one gradient step per env step
    after the warm-up (chunk 1 rounds up to 2 env steps, 2 gradient steps)."""
    run = tmp_path / preset
    code = main(["--debug", "train", preset, "--env", env, "--online-steps", "300", "--warmup", "100",
                 "--num-envs", "2",
                 "--eval-every", "300", "--run-dir", str(run), *TINY])
    assert code == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_online_env_steps"] == 300
    assert summary["num_grad_steps"] == 200  # (300 - 100) env steps x utd 1
    assert json.loads((run / "config.json").read_text())["env"]["num_envs"] == 2


def test_calql_with_async_envs_gets_returns_to_go_per_env(tmp_path):
    """Cal-QL's returns-to-go (OnEpisodeEnd) are written per stream, with subprocess envs."""
    run = tmp_path / "c"
    main(["--debug", "train", "calql", "--env", "Pendulum-v1", "--offline-steps", "0", "--online-steps", "440",
          "--warmup", "400", "--num-envs", "2",
          "--vector-mode", "async", "--set", "env.max_episode_steps=50", "--set", "agent.cql_n_actions=2",
          "--eval-every", "440", "--run-dir", str(run), "--set", "run.save_final_buffer=true", *TINY])
    from relive.replay import ReplayBuffer
    from relive.replay.returns import returns_to_go

    st = ReplayBuffer.load(run / "buffer_final").storage
    view = st.episodes.live()
    assert view.finished.sum() == 8  # 2 envs x 4 episodes of 50 steps
    for start, length, src, fin in zip(view.start, view.length, view.source, view.finished, strict=True):
        slots = st.episode_slots([start], [length], [src])
        if fin:
            end = np.zeros(length, bool)
            end[-1] = True
            want = returns_to_go(st.columns["reward"][slots], end, st.columns["terminated"][slots], 0.99)
            np.testing.assert_allclose(st.columns["mc_return"][slots], want, rtol=1e-5)


def test_resume_with_two_envs_ends_the_cut_episodes_and_finishes(tmp_path):
    """Killed after a mid-episode checkpoint, resumed: the streams' open episodes are ended at their last stored
    row (a truncation), the envs start new episodes, and the run finishes with every env step counted once."""
    args = ["sac", "--env", "Pendulum-v1", "--online-steps", "600", "--warmup", "100",
                 "--num-envs", "2",
            "--eval-every", "300", "--checkpoint-every", "150", "--set", "run.save_final_buffer=true", *TINY]
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=450))
    ckpt = load_tree(tmp_path / "cut" / "checkpoint", kind="run")
    saved = int(ckpt["loop"]["env_steps"])
    assert saved == 300 and saved % 200 != 0  # mid-episode for both envs (Pendulum episodes: 200 steps)
    summary = train(resume_dir=tmp_path / "cut")
    assert summary.num_online_env_steps == 600 and summary.num_grad_steps == 500
    from relive.replay import ReplayBuffer

    st = ReplayBuffer.load(tmp_path / "cut" / "buffer_final").storage
    for stream in (0, 1):
        slots = np.flatnonzero(st.meta["stream"][:600] == stream)
        assert slots.size == 300
        cut = slots[149]  # the stream's 150th row: the last one before the checkpoint
        assert st.columns["truncated"][cut] and st.meta["step_in_episode"][cut] == 149
        assert st.meta["step_in_episode"][slots[150]] == 0  # a new episode after the resume
        assert st.meta["episode_id"][cut] != st.meta["episode_id"][slots[150]]


def test_an_episode_hook_for_one_env_refuses_several_envs(tmp_path):
    """A component whose OnEpisodeStart hook is not per env (its state is one env's) refuses num_envs > 1; the
    built-in agents' hooks are per env."""
    from relive.config import EnvConfig, ExperimentConfig
    from relive.hooks import OnEpisodeStart
    from relive.train.trainer import _check_num_envs

    class OneEnvNoise:
        def reset(self):
            pass

    hooks = [OnEpisodeStart(OneEnvNoise().reset)]
    with pytest.raises(ValueError, match="OneEnvNoise keeps per-episode state for one environment"):
        _check_num_envs(ExperimentConfig(env=EnvConfig(num_envs=2)), hooks)
    _check_num_envs(ExperimentConfig(env=EnvConfig(num_envs=2)), [OnEpisodeStart(lambda env: None, per_env=True)])
    _check_num_envs(ExperimentConfig(), hooks)  # one env: fine
    with pytest.raises(ValueError, match="num_envs must be an integer >= 1"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--set", "env.num_envs=0", "--run-dir",
              str(tmp_path / "b"), *TINY])  # (the --num-envs flag is refused by argparse: tests/test_cli_errors.py)


def test_vector_collector_starts_each_envs_episodes_with_its_index():
    """Episode-start callbacks get the env index, before the env's first step and after each of its episode ends
    (Pendulum with time limits 3 and 3: both envs at steps 0, 3, 6)."""
    envs = make_vector_env("Pendulum-v1", 2, "sync", max_episode_steps=3)
    started = []
    collector = VectorCollector(envs, env_spec(make_env("Pendulum-v1")), seed=0)
    collector.on_episode_start = [lambda env: started.append((len(calls), env))]
    calls = []

    def policy(obs):
        calls.append(1)
        return np.zeros((obs.shape[0], 1), np.float32)

    collector.step_streams(policy, 14)
    collector.close()
    assert started == [(0, 0), (0, 1), (3, 0), (3, 1), (6, 0), (6, 1)]


def test_ddpg_ou_noise_is_kept_and_reset_per_env():
    """OU noise is one state per env: an episode start of env 1 zeroes env 1's noise only."""
    from relive.agents.ddpg import DDPG, DDPGConfig

    agent = DDPG(3, 1, [-2.0], [2.0], DDPGConfig(exploration_noise="ou", hidden=(8,)), seed=0)
    obs = np.zeros((2, 3), np.float32)
    for _ in range(3):
        agent.act(obs, explore=True)
    before = agent.ou_state.clone()
    assert (before != 0).all()
    agent.reset_noise(1)
    assert torch.equal(agent.ou_state[0], before[0]) and (agent.ou_state[1] == 0).all()
    agent.reset_noise()
    assert agent.ou_state.shape[0] == 0


@pytest.mark.parametrize("preset", ["rlpd", "calql", "calql_arb", "ddqn_per", "ddpg", "ddpg_per", "ddpg_refer",
                                    "sac_refer", "vracer", "vracer_refer", "residual_sac"])
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_every_preset_that_acts_through_the_collector_runs_with_two_envs(tmp_path, monkeypatch, preset):
    """Each preset for a few steps with 2 envs (sac and ddqn above): behaviour records (ReF-ER's mu/sigma,
    V-RACER's), ARB's re-scoring, Cal-QL's returns-to-go, DDPG's OU noise and residual SAC's probing per stream."""
    from relive.presets import get_preset

    env = "CartPole-v1" if get_preset(preset).agent_kind == "ddqn" else "Pendulum-v1"
    args = ["--debug", "train", preset, "--env", env, "--online-steps", "80", "--warmup", "40", "--num-envs", "2",
            "--offline-steps", "0", "--eval-every", "80", "--capacity", "5000", "--run-dir", str(tmp_path / "r"),
            *TINY]
    if preset == "residual_sac":  # a stand-in base policy (as tests/agents/test_residual_sac.py does)
        monkeypatch.setattr("relive.agents.residual_sac.load_base_policy",
                            lambda path, spec, trusted=False: (lambda obs: np.zeros((len(obs), 1), np.float32)))
        args += ["--base-policy", "tiny", "--set", "agent.warmup=20", "--set", "agent.probe_max_steps=5", "--set",
                 "env.max_episode_steps=10",  # (episodes that start after the warm-up probe)
                 "--warmup", "0"]  # its own base-only warm-up: the trainer's random one is refused (issue 28 item 5)
    if preset == "ddpg":
        args += ["--set", 'agent.exploration_noise="ou"']
    assert main(args) == 0
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_online_env_steps"] == 80
    if preset == "residual_sac":  # each env probes at the start of its episodes after the 20 warm-up steps: unstored
        final = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
        assert final["replay/num_online"] < 80


def test_ddqn_epsilon_is_scheduled_in_env_steps_whatever_the_number_of_envs(tmp_path):
    """One act call with N envs is N env steps of epsilon's schedule (as SB3's and CleanRL's total-timestep
    schedules): 300 env steps with 2 envs after a 100-step random warm-up -> epsilon at 200 of 400 steps, half-way
    (counting act calls, as before, gave a quarter: the schedule ran N times slower)."""
    run = tmp_path / "r"
    assert main(["--debug", "train", "ddqn", "--env", "CartPole-v1", "--online-steps", "300", "--warmup", "100",
                 "--num-envs", "2", "--set", "agent.eps_decay_steps=400", "--eval-every", "300", "--log-every", "300",
                 "--run-dir", str(run), *TINY]) == 0
    cfg = json.loads((run / "config.json").read_text())["agent"]
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["train/epsilon"] == pytest.approx(cfg["eps_start"] + (cfg["eps_end"] - cfg["eps_start"]) * 200 / 400)
