"""After training (issue 31, item 4): `relive eval RUN_DIR` evaluates a run's saved agent; `relive plot RUN_DIR...`
draws one curve per configuration with a band across seeds. Both read only the runs named, write only --out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from relive.cli import main
from relive.envs import env_spec, make_env
from relive.replay.checkpoint import load_tree
from relive.train.evaluation import evaluate_episodes
from relive.train.run_cli import bootstrap_band, read_curve, run_config
from relive.train.trainer import build_agent

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress",
        "--online-steps", "300", "--warmup", "100", "--eval-every", "100", "--log-every", "100",
        "--checkpoint-every", "100"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        assert main(["train", "sac", "--env", "Pendulum-v1", "--seed", str(seed), "--run-dir",
                     str(root / f"sac{seed}"), *TINY]) == 0
    return root


def test_eval_gives_the_saved_agents_returns(runs, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval", str(runs / "sac0"), "--episodes", "2", "--seed", "7", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    cfg = run_config(runs / "sac0")
    env = make_env("Pendulum-v1", cfg.env.max_episode_steps)
    agent = build_agent(cfg, env_spec(env))
    agent.load_state_dict(load_tree(runs / "sac0" / "agent_final", kind="agent"))
    expect = evaluate_episodes(env, agent, 2, 7)[0]
    np.testing.assert_allclose(res["returns"], expect, rtol=1e-6)
    assert res["agent"] == "agent_final" and f"{expect.mean():.1f}" in capsys.readouterr().out
    assert main(["eval", str(runs / "sac0"), "--episodes", "1", "--out", str(out)]) == 2  # no overwrite
    assert main(["eval", str(runs / "sac0"), "--episodes", "1", "--checkpoint"]) == 0


def test_eval_refuses_what_is_not_a_finished_run(runs, tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a relive run directory" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text((runs / "sac0" / "config.json").read_text())
    assert main(["eval", str(unfinished)]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_plot_draws_one_curve_per_configuration(runs, tmp_path, capsys):
    png = tmp_path / "curves.png"
    assert main(["plot", str(runs / "sac0"), str(runs / "sac1"), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 runs" in capsys.readouterr().out  # the two seeds are one configuration
    assert main(["plot", str(runs / "sac0"), "--out", str(png)]) == 2  # refused: exists
    assert main(["plot", str(runs / "sac0"), "--metric", "train/critic_loss", "--out", str(png),
                 "--overwrite"]) == 0  # a key of metrics.jsonl
    x, y = read_curve(runs / "sac0", "eval/return_mean")
    assert x.tolist() == [0.0, 100.0, 200.0, 300.0] and np.isfinite(y).all()
    assert main(["plot", str(runs / "sac0"), "--metric", "no/such", "--out", str(tmp_path / "b.png")]) == 2


def test_the_band_covers_the_mean_and_shrinks_with_agreement():
    rng = np.random.default_rng(0)
    spread = rng.normal(size=(5, 4))
    lo, hi = bootstrap_band(spread, np.random.default_rng(1))
    assert (lo <= spread.mean(0)).all() and (spread.mean(0) <= hi).all()
    lo2, hi2 = bootstrap_band(spread * 0.1, np.random.default_rng(1))
    assert ((hi2 - lo2) < (hi - lo)).all()
    lo3, hi3 = bootstrap_band(np.ones((3, 4)), np.random.default_rng(1))
    assert np.allclose(lo3, 1) and np.allclose(hi3, 1)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx", "safetensors"])
def test_an_exported_policy_reproduces_the_agents_actions(runs, tmp_path, fmt):
    import torch

    from relive.agents.export import load_safetensors_policy

    out = tmp_path / f"policy.{fmt}"
    assert main(["export", str(runs / "sac0"), "--format", fmt, "--out", str(out)]) == 0
    cfg = run_config(runs / "sac0")
    env = make_env("Pendulum-v1", cfg.env.max_episode_steps)
    agent = build_agent(cfg, env_spec(env))
    agent.load_state_dict(load_tree(runs / "sac0" / "agent_final", kind="agent"))
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32) * 3
    expect = agent.act(obs, explore=False)
    if fmt == "torchscript":
        got = torch.jit.load(str(out))(torch.as_tensor(obs)).numpy()  # trusted-code: the file this test just wrote
    elif fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
        got = ort.InferenceSession(str(out)).run(None, {"obs": obs})[0]
    else:
        got = load_safetensors_policy(out)(torch.as_tensor(obs)).detach().numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    assert main(["export", str(runs / "sac0"), "--format", fmt, "--out", str(out)]) == 2  # no overwrite


def test_export_refuses_an_agent_it_cannot_reproduce():
    from relive.agents.export import deterministic_policy

    class Residual:  # acts otherwise than any agent export knows
        def act(self, obs, explore):
            return obs

    with pytest.raises(ValueError, match="cannot export"):
        deterministic_policy(Residual())


def test_a_ddqn_policy_exports_its_greedy_actions(tmp_path):
    import torch

    from relive.agents.ddqn import DDQN, DDQNConfig
    from relive.agents.export import export_policy, load_safetensors_policy

    agent = DDQN(4, 3, DDQNConfig(hidden=(16,)), seed=0)
    obs = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32)
    path = export_policy(agent, tmp_path / "q.safetensors", "safetensors", 4)
    np.testing.assert_array_equal(load_safetensors_policy(path)(torch.as_tensor(obs)).numpy(),
                                  agent.act(obs, explore=False))


def test_offline_only_from_a_dataset_without_an_environment(tmp_path, capsys):
    """Issue 31 item 5: `relive train calql --dataset D --offline-steps N --online-steps 0` without --env (real-robot
    data): the spec from the dataset, evaluation skipped with a note, the policy exported and acting in the
    dataset's action range."""
    import torch

    from relive.agents.export import load_safetensors_policy
    from relive.data.npz_io import save_dataset
    from relive.train.collector import collect_dataset

    rows = collect_dataset("Pendulum-v1", 400, seed=0)
    data = save_dataset(tmp_path / "robot.npz", rows)  # (no env id recorded: a robot's log)
    run = tmp_path / "offline"
    assert main(["train", "calql", "--dataset", str(data), "--offline-steps", "40", "--online-steps", "0",
                 "--batch-size", "32", "--set", "agent.hidden=[16,16]", "--no-progress", "--run-dir", str(run)]) == 0
    assert "no environment (offline only" in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["env"]["id"] == ""
    def strict(token):  # summary.json is strict JSON: a value that is not a number is null, never NaN
        raise AssertionError(f"summary.json holds {token}")

    summary = json.loads((run / "summary.json").read_text(), parse_constant=strict)
    assert summary["num_grad_steps"] == 40 and summary["final_return"] is None  # (no env: no evaluation)
    out = tmp_path / "p.safetensors"
    assert main(["export", str(run), "--format", "safetensors", "--out", str(out)]) == 0
    actions = load_safetensors_policy(out)(torch.as_tensor(rows["obs"][:20], dtype=torch.float32)).numpy()
    assert actions.shape == (20, 1) and (np.abs(actions) <= np.abs(rows["action"]).max() + 1e-6).all()
    assert main(["eval", str(run)]) == 2 and "without an environment" in capsys.readouterr().err
    # online steps need an environment: refused, naming the option
    import dataclasses

    from relive.train.trainer import dataset_spec

    cfg = run_config(run)
    online = dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, num_online_env_steps=100))
    with pytest.raises(ValueError, match="--online-steps 0"):
        dataset_spec(online)
    assert dataset_spec(cfg).action_shape == (1,)


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_eval_writes_a_video_per_episode_with_the_same_returns(runs, tmp_path):
    pytest.importorskip("av")
    import av

    out, videos = tmp_path / "e.json", tmp_path / "videos"
    assert main(["eval", str(runs / "sac0"), "--episodes", "2", "--seed", "7", "--video", str(videos),
                 "--out", str(out)]) == 0
    assert sorted(p.name for p in videos.iterdir()) == ["episode_0.mp4", "episode_1.mp4"]
    with av.open(str(videos / "episode_0.mp4")) as container:
        frames = sum(1 for _ in container.decode(video=0))
    assert frames == 201  # the reset frame and one per step of Pendulum's 200
    plain = tmp_path / "plain.json"
    assert main(["eval", str(runs / "sac0"), "--episodes", "2", "--seed", "7", "--out", str(plain)]) == 0
    assert json.loads(out.read_text())["returns"] == json.loads(plain.read_text())["returns"]  # (same returns)
    assert main(["eval", str(runs / "sac0"), "--episodes", "1", "--video", str(videos)]) == 2  # no overwrite
    victim = tmp_path / "victim.mp4"  # --overwrite onto a link: the link is replaced, its target kept
    victim.write_bytes(b"precious")
    (videos / "episode_0.mp4").unlink()
    (videos / "episode_0.mp4").symlink_to(victim)
    assert main(["eval", str(runs / "sac0"), "--episodes", "1", "--video", str(videos), "--overwrite"]) == 0
    assert victim.read_bytes() == b"precious" and not (videos / "episode_0.mp4").is_symlink()


def test_eval_of_a_her_run_makes_its_env_as_the_run_did(tmp_path, capsys):
    """A HER run's agent reads goal dicts: relive eval makes the env with them kept (keep_goal_dict)."""
    try:
        make_env("FetchReach-v4").close()
    except ValueError as e:  # (MuJoCo 4: the Fetch tasks need 3.3.0, constraints.txt)
        pytest.skip(str(e))
    run = tmp_path / "her"
    assert main(["train", "sac_her", "--env", "FetchReach-v4", "--warmup", "100", "--set", "agent.hidden=[16,16]",
                 "--batch-size", "32", "--eval-episodes", "1", "--no-progress", "--online-steps", "150",
                 "--eval-every", "150", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--episodes", "1"]) == 0
    assert "success rate" in capsys.readouterr().out


def test_a_ddpg_policy_exports_its_actors_actions(tmp_path):
    import torch

    from relive.agents.ddpg import DDPG, DDPGConfig
    from relive.agents.export import export_policy, load_safetensors_policy

    agent = DDPG(3, 2, -np.array([1.0, 2.0]), np.array([1.0, 0.5]), DDPGConfig(hidden=(16,)), seed=0)
    obs = np.random.default_rng(2).normal(size=(50, 3)).astype(np.float32) * 4
    path = export_policy(agent, tmp_path / "a.safetensors", "safetensors", 3)
    np.testing.assert_array_equal(load_safetensors_policy(path)(torch.as_tensor(obs)).numpy(),
                                  agent.act(obs, explore=False).action)


# -- where eval / export / plot write (issue 44, items 5 and lesser) --------------------------------------------------
def _error(argv, capsys) -> str:
    """The command's one error line (exit code 2)."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relive: error: "), lines
    return lines[0]


@pytest.mark.parametrize("fmt", ["safetensors", "onnx", "torchscript"])
def test_export_over_a_directory_is_one_clear_error_and_the_directory_is_kept(runs, tmp_path, capsys, fmt):
    """`export --out EXISTING_DIR --overwrite` (a SafetensorError traceback before): refused before any work, naming
    the directory; nothing in it is touched, with or without --overwrite."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        line = _error(["export", str(runs / "sac0"), "--format", fmt, "--out", str(out), *extra], capsys)
        assert f"--out {out} is a directory" in line and "Safetensor" not in line
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_eval_out_over_a_directory_and_video_onto_a_file_are_clear_errors(runs, tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    assert f"--out {d} is a directory" in _error(["eval", str(runs / "sac0"), "--episodes", "1", "--out", str(d),
                                                  "--overwrite"], capsys)
    file = tmp_path / "video.mp4"
    file.write_text("not a directory")
    line = _error(["eval", str(runs / "sac0"), "--episodes", "1", "--video", str(file)], capsys)
    assert f"--video {file} is a file, not a directory" in line and "FileExistsError" not in line
    assert file.read_text() == "not a directory"


def _outputs(runs, tmp_path):
    """(name, argv without --out, the file's suffix) of every command that writes an output file."""
    run = str(runs / "sac0")
    return [("eval json", ["eval", run, "--episodes", "1"], ".json"),
            ("export safetensors", ["export", run, "--format", "safetensors"], ".safetensors"),
            ("export onnx", ["export", run, "--format", "onnx"], ".onnx"),
            ("export torchscript", ["export", run, "--format", "torchscript"], ".pt"),
            ("plot png", ["plot", run], ".png")]


def test_outputs_onto_symbolic_links_replace_the_link_never_its_target(runs, tmp_path, capsys):
    """A dangling link at --out is refused without --overwrite (it was written through before, creating its
    target); with --overwrite, a link -- dangling or to a file -- is replaced by the new file and its target is
    neither created nor changed."""
    for name, argv, suffix in _outputs(runs, tmp_path):
        where = tmp_path / name.replace(" ", "_")
        where.mkdir()
        dangling, missing = where / f"dangling{suffix}", where / f"missing{suffix}"
        dangling.symlink_to(missing)
        line = _error([*argv, "--out", str(dangling)], capsys)
        assert "is a symbolic link; pass --overwrite" in line and "marker" not in line, name
        assert main([*argv, "--out", str(dangling), "--overwrite"]) == 0, name
        assert not missing.exists() and not missing.is_symlink(), name  # (the target was never created)
        assert dangling.is_file() and not dangling.is_symlink() and dangling.stat().st_size > 0, name
        victim, link = where / "victim.txt", where / f"link{suffix}"
        victim.write_text("precious")
        link.symlink_to(victim)
        assert main([*argv, "--out", str(link), "--overwrite"]) == 0, name
        assert victim.read_text() == "precious" and not link.is_symlink() and link.stat().st_size > 0, name


def test_overwrite_refusals_of_binary_outputs_name_no_marker_line(runs, tmp_path, capsys):
    """The "notes below its marker line are kept" wording belongs to generated Markdown with a marker; a refused
    PNG / ONNX / safetensors / TorchScript / JSON / mp4 says only how to replace it."""
    pytest.importorskip("av")
    for name, argv, suffix in _outputs(runs, tmp_path):
        out = tmp_path / f"existing{suffix}"
        out.write_bytes(b"old")
        line = _error([*argv, "--out", str(out)], capsys)
        assert f"{out} exists; pass --overwrite to replace it" in line and "marker" not in line, name
        assert out.read_bytes() == b"old"
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "episode_0.mp4").write_bytes(b"old")
    line = _error(["eval", str(runs / "sac0"), "--episodes", "1", "--video", str(videos)], capsys)
    assert "episode_0.mp4 exists; pass --overwrite" in line and "marker" not in line


def test_plot_refuses_a_seed_twice_and_labels_runs_of_other_lengths(runs, tmp_path, capsys):
    """A curve averages over seeds: one seed's run given twice (a copy, a rerun) is refused, naming both; runs of one
    configuration that end at other steps are drawn on their common steps, and the legend says where they end."""
    import shutil

    twin = tmp_path / "sac0-again"
    shutil.copytree(runs / "sac0", twin)
    assert main(["plot", str(runs / "sac0"), str(twin), "--out", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err
    assert "seed 0" in err and "sac0-again" in err
    longer = tmp_path / "long"
    assert main(["train", "sac", "--env", "Pendulum-v1", "--seed", "2", "--run-dir", str(longer),
                 *[a if a != "300" else "400" for a in TINY]]) == 0
    from relive.train.run_cli import curve_label

    assert main(["plot", str(runs / "sac0"), str(longer), "--out", str(tmp_path / "b.png")]) == 0
    curves = [read_curve(d, "eval/return_mean") for d in (runs / "sac0", longer)]
    assert curve_label("sac", curves, 300) == "sac, 2 runs, cut to step 300 (runs end at 300-400)"
    assert curve_label("sac", curves[:1], 300) == "sac, 1 run"
