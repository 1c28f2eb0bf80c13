import json

import numpy as np
import pytest

from relive.cli import build_parser, main
from relive.config import load_config
from relive.replay import ReplayBuffer
from relive.replay.checkpoint import load_tree
from relive.train.cli import config_from_args
from relive.train.collector import Collector, collect_dataset, returns_to_go, save_dataset
from relive.train.envs import env_spec, make_env
from relive.train.trainer import _fill_online_returns, train

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress"]


def test_cli_train_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    code = main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "400", "--warmup", "100",
                 "--eval-every", "200", "--run-dir", str(run), "--seed", "3", *TINY])
    assert code == 0
    for name in ("config.json", "metrics.jsonl", "eval.csv", "summary.json", "agent_final/MANIFEST.json"):
        assert (run / name).exists(), name
    cfg = load_config(run / "config.json")
    assert cfg.run.seed == 3 and cfg.env.id == "Pendulum-v1" and cfg.agent.hidden == (16, 16)
    assert load_config(run / "config.json") == cfg  # reloads to an equal config
    rows = (run / "eval.csv").read_text().splitlines()
    assert rows[0].startswith("env_step,grad_step,eval/return_mean") and len(rows) == 1 + 3  # 0, 200, final
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_online_env_steps"] == 400 and summary["num_grad_steps"] == 300
    with pytest.raises(ValueError, match="already holds a run"):
        main(["train", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), *TINY])


def test_cli_presets_and_bad_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "rlpd" in out and "calql" in out and "ddqn" in out
    assert main(["presets", "rlpd"]) == 0
    assert json.loads(capsys.readouterr().out)["agent"]["num_qs"] == 10
    with pytest.raises(ValueError, match="unknown preset"):
        main(["train", "nope", "--env", "Pendulum-v1"])
    with pytest.raises(ValueError, match="unknown setting"):
        main(["train", "sac", "--set", "agent.no_such_key=1"])


def test_resume_after_interruption_reproduces_the_uninterrupted_run(tmp_path):
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 400, seed=0))
    args = ["calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "30", "--online-steps", "500",
            "--eval-every", "250", "--checkpoint-every", "150", "--replay", "symmetric_per",
            "--set", "agent.cql_n_actions=2", *TINY]

    def cfg_for(run_dir):
        return config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(run_dir)]))

    full = train(cfg_for(tmp_path / "full"))
    assert train(cfg_for(tmp_path / "cut"), stop_after_env_steps=330) is None  # "killed" at step 330
    assert (tmp_path / "cut" / "checkpoint").exists() and not (tmp_path / "cut" / "summary.json").exists()
    resumed = train(resume_dir=tmp_path / "cut")
    a = load_tree(tmp_path / "full" / "agent_final")
    b = load_tree(tmp_path / "cut" / "agent_final")
    for part in ("actor", "critic"):
        for k in a[part]:
            np.testing.assert_array_equal(a[part][k], b[part][k], err_msg=f"{part}.{k}")
    assert resumed.final_return == full.final_return
    # each evaluation appears once in the resumed run's log
    steps = [ln.split(",")[0] for ln in (tmp_path / "cut" / "eval.csv").read_text().splitlines()[1:]]
    assert steps == [ln.split(",")[0] for ln in (tmp_path / "full" / "eval.csv").read_text().splitlines()[1:]]


def test_truncation_bootstraps_from_the_true_final_observation():
    env = make_env("Pendulum-v1", max_episode_steps=5)
    collector = Collector(env, env_spec(env), seed=0)
    rows = collector.step(lambda o: np.zeros((1, 1), np.float32), 7)
    assert rows["truncated"].tolist() == [False] * 4 + [True, False, False]
    assert not rows["terminated"].any()
    # the truncated row's next_obs is the last observation of its episode, not the next episode's first
    assert not np.allclose(rows["next_obs"][4], rows["obs"][5])
    np.testing.assert_allclose(rows["obs"][4 - 1 + 1], rows["next_obs"][3])


def test_returns_to_go_with_discount_terminal_and_timeout():
    reward = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 5.0])
    terminated = np.array([False, False, True, False, False, False])
    end = np.array([False, False, True, False, True, True])  # terminal at 2, time limit at 4, dataset end at 5
    g = returns_to_go(reward, end, terminated, gamma=0.5)
    np.testing.assert_allclose(g, [1 + 0.5 * (2 + 0.5 * 3), 2 + 0.5 * 3, 3, 10 + 0.5 * 20, 20, 5])


def test_online_rows_get_their_returns_to_go_when_the_episode_ends():
    buf = ReplayBuffer(50, (2,), (1,), extra_columns={"mc_return": ()})
    n = 4
    rows = dict(obs=np.zeros((n, 2)), action=np.zeros((n, 1)), reward=np.array([1.0, 1.0, 1.0, 1.0]),
                next_obs=np.zeros((n, 2)), terminated=np.array([False, False, False, True]),
                truncated=np.zeros(n, bool), mc_return=np.zeros(n))
    first = {k: v[:2] for k, v in rows.items()}
    second = {k: v[2:] for k, v in rows.items()}
    s1 = buf.extend(first)
    _fill_online_returns(buf, s1, first, 0.9)
    assert (buf.storage.columns["mc_return"][s1] == 0).all()  # episode not over yet
    s2 = buf.extend(second)
    _fill_online_returns(buf, s2, second, 0.9)
    np.testing.assert_allclose(buf.storage.columns["mc_return"][np.r_[s1, s2]],
                               [1 + 0.9 + 0.81 + 0.729, 1 + 0.9 + 0.81, 1.9, 1.0], rtol=1e-6)


def test_ddqn_runs_on_cartpole_with_per(tmp_path):
    code = main(["train", "ddqn_per", "--env", "CartPole-v1", "--online-steps", "300", "--warmup", "50",
                 "--eval-every", "300", "--run-dir", str(tmp_path / "d"), *TINY])
    assert code == 0
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["num_grad_steps"] == 250


def test_demo_quick_runs_end_to_end_and_plots(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "[demo] done" in out and "Plot:" in out
    png = tmp_path / "demo" / "demo.png"
    assert png.stat().st_size > 10_000
    for replay in ("uniform", "symmetric", "arb"):
        summary = json.loads((tmp_path / "demo" / f"calql-{replay}-seed0" / "summary.json").read_text())
        assert summary["num_online_env_steps"] == 400
