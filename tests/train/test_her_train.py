"""HER in training runs (issue 30 items 3-5): goal tasks (a tiny goal-conditioned point env registered here, Fetch where
its mujoco allows, PointMaze with Ray collectors), SAC / DDPG on goal dicts (agent.obs_keys), the sac_her / ddpg_her
presets from the CLI (--num-envs, --collectors, --resume), success at an episode's last step, clear refusals."""

from __future__ import annotations

import csv
import json

import gymnasium as gym
import numpy as np
import pytest

from relive.agents.ddpg import DDPG, DDPGConfig
from relive.agents.sac import SAC, SACConfig
from relive.cli import main
from relive.config import EnvConfig, ExperimentConfig, ReplayConfig, config_from_dict, load_config, override
from relive.envs import InfoKeySuccess, env_spec, goal_functions, make_env
from relive.presets import get_preset
from relive.registry import SAMPLER_CLASSES, ReplaySpec, load_builtins
from relive.replay.samplers.her import HERConfig
from relive.train.evaluation import evaluate_episodes
from relive.train.trainer import train
from relive.types import unpack_acted
from tests.train.test_ray_collectors import local_ray  # noqa: F401  (a fixture: one local Ray)
from tests.train.test_success_key import FlagEnv, ZeroAgent
from tests.train.test_trainer import SimulatedKill, cfg_for, kill_at


class PointGoalEnv(gym.Env):
    """Fetch-like reaching in the plane: observation = position, achieved_goal = position, desired_goal = a point of
    [-1, 1]^2; a = a move of up to 0.25 per axis; reward -1 until within 0.15 of the goal, then 0 (sparse, the Fetch
    convention); info["is_success"]; episodes end only at the time limit (as Fetch's)."""

    TOLERANCE, SPEED = 0.15, 0.25

    def __init__(self):
        box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({"observation": box, "achieved_goal": box, "desired_goal": box})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self):
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action):
        self.pos = np.clip(self.pos + self.SPEED * np.asarray(action, np.float32), -1, 1).astype(np.float32)
        reward = float(self.compute_reward(self.pos, self.goal, {}))
        return self._obs(), reward, False, False, {"is_success": float(reward == 0.0)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > self.TOLERANCE).astype(np.float32)


GOAL_ENV = "RelivePointGoal-v0"
gym.register(GOAL_ENV, entry_point=PointGoalEnv, max_episode_steps=15)


def fetch_or_skip(env_id: str = "FetchReach-v4") -> None:
    """Skip unless this venv makes the Fetch tasks (Gymnasium-Robotics' Fetch needs mujoco 3.3.0)."""
    pytest.importorskip("gymnasium_robotics")
    try:
        make_env(env_id).close()
    except ValueError as e:
        pytest.skip(f"{env_id} cannot be made here ({e}); run with a mujoco 3.3.0 venv (make .venv-metaworld)")


SMALL = ["--set", "agent.hidden=[32,32]", "--batch-size", "32", "--eval-episodes", "2", "--no-progress"]


def cli_train(tmp_path, name, *args):
    run_dir = tmp_path / name
    assert main(["train", *args, "--run-dir", str(run_dir)]) == 0
    return run_dir


def eval_rows(run_dir):
    with open(run_dir / "eval.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


# -- tasks ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hit, expected", [(None, False), (3, False), (6, True)])
def test_success_at_the_last_step_counts_only_an_episode_that_ends_at_the_goal(hit, expected):
    # Fetch's is_success is true mid-episode when the object passes the goal; the paper and SB3 count the last step
    _, successes = evaluate_episodes(FlagEnv(hit), ZeroAgent(), 2, seed=0, success_key="is_success",
                                     success_at="last")
    assert successes.tolist() == [expected] * 2
    env = InfoKeySuccess(FlagEnv(hit), "is_success", at="last")
    env.reset(seed=0)
    flags = [env.step(np.zeros(1, np.float32))[4]["success"] for _ in range(6)]
    assert flags[-1] is expected and flags[:5] == [t + 1 == hit for t in range(5)]


def test_success_at_is_checked():
    with pytest.raises(ValueError, match="env.success_at must be one of"):
        EnvConfig(success_key="is_success", success_at="first")
    with pytest.raises(ValueError, match="success_at must be one of"):
        evaluate_episodes(FlagEnv(2), ZeroAgent(), 1, seed=0, success_key="is_success", success_at="end")


def test_her_config_is_checked():
    with pytest.raises(ValueError, match="replay.her.k must be a finite number >= 0"):
        HERConfig(k=-1)
    with pytest.raises(ValueError, match="replay.her.strategy must be one of"):
        HERConfig(strategy="later")
    with pytest.raises(ValueError, match="replay.her.inner cannot be her again"):
        HERConfig(inner=ReplaySpec("her"))
    cfg = override(get_preset("sac_her"), ["replay.her.k=0", "replay.her.strategy=final", "replay.her.inner.name=per",
                                           "replay.her.inner.per.priority_exponent=0.5"])
    assert cfg.replay.options == HERConfig(inner=ReplaySpec("per", cfg.replay.options.inner.options), k=0.0,
                                           strategy="final")
    assert cfg.replay.label == "her(k=0, final, inner=per(priority_exponent=0.5))"
    assert get_preset("sac_her").replay.label == "her(k=4, future, inner=uniform)"
    assert override(get_preset("sac"), ["replay.name=her"]).replay.label == "her(k=4, future, inner=uniform)"


def test_her_is_a_replay_that_asks_for_goal_dicts_by_its_options_not_its_name():
    assert get_preset("sac_her").replay.env_options == {"keep_goal_dict": True}
    assert get_preset("sac").replay.env_options == {}
    assert ReplayConfig.of("symmetric_per").env_options == {}


def test_the_old_her_settings_are_aliases_of_the_her_replay():
    """--set her.* of earlier versions: enabled wraps (unwraps) today's replay, k / strategy set replay.her.*;
    k without HER says where the setting went."""
    cfg = override(get_preset("sac_her"), ["her.k=0", "her.strategy=final"])
    assert cfg.replay.options == HERConfig(k=0.0, strategy="final")
    per = override(get_preset("sac"), ["replay.name=per", "replay.per.priority_exponent=0.5"])
    wrapped = override(per, ["her.enabled=true", "her.k=8"])
    assert wrapped.replay.label == "her(k=8, future, inner=per(priority_exponent=0.5))"
    assert override(wrapped, ["her.enabled=false"]).replay == per.replay
    assert override(per, ["her.enabled=false"]) == per
    with pytest.raises(ValueError, match=r"--set her.k: HER is the replay her now .* replay.her.k"):
        override(per, ["her.k=2"])
    with pytest.raises(ValueError, match="unknown setting 'her.relabel'.*replay.her.k"):
        override(per, ["her.relabel=2"])


def _old_layout(cfg: ExperimentConfig) -> dict:
    """A config.json as versions before issue 48 wrote it: HER as a top-level section over the replay."""
    d = cfg.to_dict()
    r = d["replay"]
    if r["name"] != "her":
        return d | {"her": {"enabled": False, "k": 4.0, "strategy": "future"}}
    opts = r["her"]
    return d | {"replay": {"capacity": r["capacity"]} | opts["inner"],
                "her": {"enabled": True, "k": opts["k"], "strategy": opts["strategy"]}}


@pytest.mark.parametrize("preset", ["sac_her", "ddpg_her", "sac", "rlpd"])
def test_an_old_config_with_a_her_section_loads_as_the_her_replay(preset):
    cfg = override(get_preset(preset), ["replay.her.inner.name=per"] if preset == "sac_her" else [])
    old = _old_layout(cfg)
    assert config_from_dict(old) == cfg
    assert "her" not in cfg.to_dict()
    with pytest.raises(ValueError, match="her: expected a table of"):
        config_from_dict(old | {"her": {"enabled": True, "relabel": 2}})


def test_a_run_whose_config_json_has_the_old_her_section_resumes(tmp_path):
    """A run directory written before issue 48 (config.json with her.enabled and the replay it wrapped) resumes:
    the config migrates to replay her over that replay, the checkpoint's sampler is the same HindsightSampler."""
    args = ["sac_her", "--env", GOAL_ENV, "--online-steps", "150", "--warmup", "40", "--eval-every", "150",
            "--checkpoint-every", "60", "--set", "replay.her.inner.name=per", *SMALL]
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "r"), on_step=kill_at(env_step=100))
    path = tmp_path / "r" / "config.json"
    path.write_text(json.dumps(_old_layout(load_config(path))))
    summary = train(resume_dir=tmp_path / "r")
    assert summary.num_online_env_steps == 150


def test_the_trainer_and_the_buffer_name_no_sampler():
    """What a replay needs from the run reaches the trainer by contract (env_options, bind_env, relabel_batch): the
    trainer's source names no sampler class and no replay option section, the buffer asks no attribute by name."""
    from pathlib import Path

    import relive

    load_builtins()
    src = Path(relive.__file__).parent
    trainer = (src / "train" / "trainer.py").read_text()
    assert [name for name in SAMPLER_CLASSES if name in trainer] == []
    assert ".her" not in trainer and "keep_goal_dict" not in trainer
    assert 'getattr(sampler, "relabels"' not in (src / "replay" / "buffer.py").read_text()
    assert 'getattr(self.sampler, "relabels"' not in (src / "replay" / "buffer.py").read_text()


def test_fetch_without_mujoco_3_3_is_a_clear_error_else_a_goal_env():
    pytest.importorskip("gymnasium_robotics")
    try:
        env = make_env("FetchReach-v4", keep_goal_dict=True)
    except ValueError as e:
        assert "mujoco 3.3.0" in str(e) and "constraints.txt" in str(e)
        return
    reward_fn, success_fn = goal_functions(env)
    assert success_fn is None  # Fetch episodes end at the time limit only
    assert reward_fn(np.zeros((3, 3)), np.ones((3, 3)), {}).tolist() == [-1.0] * 3


def test_goal_functions_of_an_episodic_maze_recompute_termination_row_by_row():
    pytest.importorskip("gymnasium_robotics")
    env = make_env("PointMaze_UMaze-v3", keep_goal_dict=True)
    reward_fn, success_fn = goal_functions(env)
    achieved, desired = np.zeros((3, 2)), np.array([[0.0, 0.1], [3.0, 0.0], [0.0, 0.0]])
    assert success_fn(achieved, desired, {}).tolist() == [True, False, True]
    assert reward_fn(achieved, desired, {}).tolist() == [1.0, 0.0, 1.0]


def test_a_non_goal_env_is_refused_by_name():
    with pytest.raises(ValueError, match="Pendulum-v1 is not a goal-conditioned task"):
        goal_functions(make_env("Pendulum-v1"))


# -- agents on goal dicts ------------------------------------------------------------------------------------
@pytest.mark.parametrize("agent_cls, cfg_cls", [(SAC, SACConfig), (DDPG, DDPGConfig)])
def test_agents_read_only_their_obs_keys_of_a_goal_dict(agent_cls, cfg_cls):
    spec = env_spec(make_env(GOAL_ENV, keep_goal_dict=True))
    agent = agent_cls.from_spec(spec, cfg_cls(hidden=(8,), obs_keys=("desired_goal", "observation")), 0)
    assert agent.obs_dim == 4  # 2 + 2: achieved_goal left out
    obs = {"observation": np.ones((2, 2), np.float32), "desired_goal": np.zeros((2, 2), np.float32),
           "achieved_goal": np.zeros((2, 2), np.float32)}
    a = unpack_acted(agent.act(obs, explore=False))[0]
    a2 = unpack_acted(agent.act(obs | {"achieved_goal": np.full((2, 2), 5.0, np.float32)}, explore=False))[0]
    np.testing.assert_array_equal(a, a2)
    everything = agent_cls.from_spec(spec, cfg_cls(hidden=(8,)), 0)
    assert everything.obs_dim == 6
    with pytest.raises(ValueError, match=r"agent.obs_keys \['goal'\]: the observations have no key \['goal'\]"):
        agent_cls.from_spec(spec, cfg_cls(obs_keys=("goal",)), 0)
    with pytest.raises(ValueError, match="selects keys of dict observations"):
        agent_cls.from_spec(env_spec(make_env("Pendulum-v1")), cfg_cls(obs_keys=("observation",)), 0)


def test_ddpg_target_smoothing_action_penalty_and_target_range():
    import torch

    kw = dict(hidden=(8,), obs_keys=())
    obs = torch.randn(64, 3)
    plain = DDPG(3, 2, -np.ones(2), np.ones(2), DDPGConfig(**kw), seed=0)
    smooth = DDPG(3, 2, -np.ones(2), np.ones(2), DDPGConfig(target_noise=0.2, **kw), seed=0)
    r, t = torch.zeros(64), torch.zeros(64)
    assert not torch.equal(plain.critic_target(r, obs, t), smooth.critic_target(r, obs, t))
    clipped = DDPG(3, 2, -np.ones(2), np.ones(2), DDPGConfig(target_range=(-0.01, 0.0), **kw), seed=0)
    y = clipped.critic_target(r - 5.0, obs, t)
    assert float(y.min()) >= -0.01 and float(y.max()) <= 0.0
    with pytest.raises(ValueError, match="target_range must be"):
        DDPGConfig(target_range=(0.0, -1.0))


# -- the presets from the CLI ------------------------------------------------------------------------------------
def test_sac_her_on_a_non_goal_env_is_a_clear_error_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="Pendulum-v1 is not a goal-conditioned task.*sac_her"):
        main(["--debug", "train", "sac_her", "--env", "Pendulum-v1", "--run-dir", str(tmp_path / "r"), *SMALL])
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("preset, extra", [("sac_her", ["--num-envs", "2"]),
                                           ("sac_her", ["--set", "replay.her.inner.name=per"]),
                                           ("ddpg_her", ["--chunk", "30"])])
def test_the_her_presets_train_from_the_cli(tmp_path, preset, extra):
    run_dir = cli_train(tmp_path, "r", preset, "--env", GOAL_ENV, "--online-steps", "120", "--warmup", "40",
                        "--eval-every", "60", *extra, *SMALL)
    rows = eval_rows(run_dir)
    assert [r["env_step"] for r in rows] == [0, 60, 120] and all("eval/success_rate" in r for r in rows)
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0.5 < last["replay/her_relabeled_fraction"] < 1.0  # k = 4: 0.8 in expectation
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["replay"]["name"] == "her" and "her" not in cfg and cfg["env"]["success_at"] == "last"
    assert (cfg["replay"]["her"]["k"], cfg["replay"]["her"]["strategy"]) == (4, "future")
    assert cfg["replay"]["her"]["inner"]["name"] == ("per" if "replay.her.inner.name=per" in extra else "uniform")


def test_a_resumed_her_run_gets_its_reward_function_again(tmp_path):
    # functions are not saved in checkpoints: without re-attaching compute_reward, the first batch after --resume
    # would be refused ("HindsightSampler has no reward_fn")
    args = ["sac_her", "--env", GOAL_ENV, "--online-steps", "150", "--warmup", "40", "--eval-every", "150",
            "--checkpoint-every", "60", *SMALL]
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "r"), on_step=kill_at(env_step=100))
    summary = train(resume_dir=tmp_path / "r")
    assert summary.num_online_env_steps == 150


def test_sac_her_on_fetch_reach_from_the_cli(tmp_path):
    fetch_or_skip()
    run_dir = cli_train(tmp_path, "r", "sac_her", "--env", "FetchReach-v4", "--online-steps", "100", "--warmup", "50",
                        "--eval-every", "100", "--num-envs", "2", *SMALL)
    rows = eval_rows(run_dir)
    assert rows[-1]["env_step"] == 100 and 0.0 <= rows[-1]["eval/success_rate"] <= 1.0


def test_fetch_push_makes_a_goal_buffer():
    fetch_or_skip("FetchPush-v4")
    env = make_env("FetchPush-v4", keep_goal_dict=True)
    spec = env_spec(env)
    assert spec.obs_shape["desired_goal"][0] == (3,) and spec.obs_shape["observation"][0] == (25,)
    assert goal_functions(env)[1] is None


# -- learning --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_sac_her_learns_a_sparse_goal_task_that_sac_without_relabeling_does_not(tmp_path):
    """Same seed, same budget (1500 env steps), same networks: HER (k = 4, future) reaches the goal in most
    evaluation episodes, the same run with replay.her.k = 0 (no relabeled goal) in few."""
    rates = {}
    for k in (4, 0):
        run_dir = cli_train(tmp_path, f"k{k}", "sac_her", "--env", GOAL_ENV, "--online-steps", "1500", "--warmup",
                            "300", "--eval-every", "1500", "--set", f"replay.her.k={k}", "--set",
                            "agent.hidden=[64,64]", "--batch-size", "64", "--eval-episodes", "20", "--no-progress")
        rates[k] = eval_rows(run_dir)[-1]["eval/success_rate"]
    assert rates[4] >= 0.7 and rates[0] <= 0.4 and rates[4] > rates[0] + 0.3, rates


@pytest.mark.usefixtures("local_ray")
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_sac_her_with_ray_collectors_on_an_episodic_maze(tmp_path):
    """2 Ray collectors step PointMaze (mujoco 4 runs it; the collectors make their envs with the goal dicts the
    learner's buffer stores); reaching the goal ends a maze episode, so relabeled rows get terminated recomputed."""
    pytest.importorskip("gymnasium_robotics")
    run_dir = cli_train(tmp_path, "r", "sac_her", "--env", "PointMaze_UMaze-v3", "--collectors", "2",
                        "--online-steps", "200", "--warmup", "100", "--eval-every", "200", "--set",
                        "env.max_episode_steps=50", "--set", "env.success_key=success", "--set", "env.success_at=any",
                        "--set", "collectors.chunk_env_steps=50", *SMALL)
    assert eval_rows(run_dir)[-1]["env_step"] == 200
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["num_online_env_steps"] == 200


class PassingFlagEnv(FlagEnv):
    """FlagEnv (is_success true at step 3 of 6 only) with a 2-D observation box and a [-1, 1] action."""

    def __init__(self):
        super().__init__(3)


gym.register("RelivePassingFlag-v0", entry_point=PassingFlagEnv)


def test_pld_collect_reads_the_success_key_at_the_chosen_step(tmp_path):
    # an episode that passes the goal (is_success at step 3) and leaves it: kept with --success-at any, not with last
    from relive.agents.bc import BCConfig, new_policy, save_bc_policy
    from relive.data.npz_io import load_dataset

    base = save_bc_policy(tmp_path / "base", new_policy(2, 1, [-1.0], [1.0], BCConfig(hidden=(8,)), seed=0), {})
    args = ["pld", "collect", "--base", str(base), "--env", "RelivePassingFlag-v0", "--episodes", "2",
            "--success-key", "is_success"]
    assert main([*args, "--out", str(tmp_path / "any.npz")]) == 0
    assert load_dataset(tmp_path / "any.npz")[1]["success_rate"] == 1.0
    with pytest.raises(ValueError, match="succeeded in none of 2 episodes"):
        main(["--debug", *args, "--success-at", "last", "--out", str(tmp_path / "last.npz")])
