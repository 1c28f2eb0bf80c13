"""--env-kwargs '{...}' (env.kwargs): validated, kept in config.json, passed to gymnasium.make for the training env,
the evaluation env, vector envs and a resumed run; a custom env registered by a --plugin file takes them."""

import csv
import json

import gymnasium as gym
import numpy as np
import pytest

from relive.cli import build_parser, main
from relive.envs import make_env, make_vector_env
from relive.train.cli import config_from_args
from relive.train.trainer import train

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "16", "--eval-episodes", "1", "--no-progress"]

# a plug-in file as docs/training.md shows it: registers a task whose every reward is its keyword argument `level`
PLUGIN = '''
import gymnasium as gym
import numpy as np


class LevelEnv(gym.Env):
    """Reward `level` at each of its 5 steps: an episode's return shows the keyword argument the env was made with."""

    def __init__(self, level=1.0):
        self.level = level
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), float(self.level), False, False, {}


gym.register("ReliveLevel-v0", entry_point=LevelEnv, max_episode_steps=5)
'''


def test_env_kwargs_reach_gymnasium_make():
    assert make_env("Pendulum-v1", env_kwargs={"g": 2.5}).unwrapped.g == 2.5
    assert make_env("Pendulum-v1").unwrapped.g == 10.0
    vec = make_vector_env("Pendulum-v1", 2, env_kwargs={"g": 3.5})
    assert [e.unwrapped.g for e in vec.envs] == [3.5, 3.5]
    vec.close()
    with pytest.raises(ValueError, match=r"env.kwargs: cannot make environment 'Pendulum-v1' with \{'gravity': 1\}"):
        make_env("Pendulum-v1", env_kwargs={"gravity": 1})
    with pytest.raises(ValueError, match="env.kwargs: max_episode_steps has a setting of its own"):
        make_env("Pendulum-v1", env_kwargs={"max_episode_steps": 3})


def test_the_flag_is_validated_and_stored(capsys):
    parse = build_parser().parse_args
    cfg = config_from_args(parse(["train", "sac", "--env", "Pendulum-v1", "--env-kwargs", '{"g": 2.5, "x": [1, 2]}']))
    assert cfg.env.kwargs == {"g": 2.5, "x": [1, 2]}
    assert config_from_args(parse(["train", "sac"])).env.kwargs == {}
    for bad, why in (('{"g": 2.5', "not JSON"), ("[1]", "must be a JSON object"),
                     ('{"1g": 1}', "not a keyword argument name"), ('{"class": 1}', "not a keyword argument name"),
                     ('{"g": {"a": 1}}', "not a JSON scalar"), ('{"g": NaN}', "not a JSON scalar")):
        with pytest.raises(SystemExit):
            parse(["train", "sac", "--env-kwargs", bad])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("relive train: error: argument --env-kwargs:") and why in err, (bad, err)


def _returns(run_dir):
    with open(run_dir / "eval.csv") as f:
        evals = [float(r["eval/return_mean"]) for r in csv.DictReader(f)]
    lines = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return evals, [d["train/episode_return"] for d in lines if d.get("phase") == "online"]


def _args(tmp_path, run_dir):
    (tmp_path / "my_envs.py").write_text(PLUGIN)
    return ["train", "sac", "--env", "ReliveLevel-v0", "--env-kwargs", '{"level": 3}', "--warmup", "10",
            "--online-steps", "40", "--eval-every", "20", "--log-every", "10", "--checkpoint-every", "10",
            "--logger", "none", "--run-dir", str(run_dir), *TINY]


def test_a_plugin_env_trains_and_evaluates_with_its_kwargs(tmp_path):
    run_dir = tmp_path / "r"
    assert main(["--debug", "--plugin", str(tmp_path / "my_envs.py"), *_args(tmp_path, run_dir)]) == 0
    gym.registry.pop("ReliveLevel-v0")
    assert json.loads((run_dir / "config.json").read_text())["env"]["kwargs"] == {"level": 3}
    evals, train_returns = _returns(run_dir)
    assert evals == [15.0, 15.0, 15.0]  # 5 steps x level 3: the evaluation env took the keyword argument
    assert train_returns and all(r == 15.0 for r in train_returns if np.isfinite(r))  # and the training env


@pytest.mark.slow
def test_a_resumed_run_keeps_its_kwargs(tmp_path):
    class Killed(Exception):
        pass

    def kill(e, g):
        if e >= 30:
            raise Killed

    args = _args(tmp_path, tmp_path / "k")
    main(["--plugin", str(tmp_path / "my_envs.py"), "presets"])  # (registers the env in this process)
    with pytest.raises(Killed):
        train(config_from_args(build_parser().parse_args(args)), on_step=kill)
    summary = train(resume_dir=tmp_path / "k")  # (the kwargs from config.json: the env of the plug-in takes them)
    gym.registry.pop("ReliveLevel-v0")
    assert summary.num_online_env_steps == 40 and summary.final_return == 15.0
    assert _returns(tmp_path / "k")[0] == [15.0, 15.0, 15.0]


@pytest.mark.slow  # (importing ray: ~10 s here)
@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_ray_collector_makes_its_envs_with_the_kwargs(num_envs):
    """The Ray collector's worker (the class its actor runs, built here in-process) gets env.kwargs from the config
    the learner ships it."""
    pytest.importorskip("ray")
    from relive.train.ray_collectors import CollectorWorker

    cfg = config_from_args(build_parser().parse_args(["train", "sac", "--env", "Pendulum-v1", "--env-kwargs",
                                                      '{"g": 1.5}', "--num-envs", str(num_envs), *TINY]))
    collector = CollectorWorker(cfg.to_dict(), 0, 0, 0, seed=0).collector
    envs = collector.envs.envs if num_envs > 1 else [collector.env]
    assert [e.unwrapped.g for e in envs] == [1.5] * num_envs
