import csv
import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from relive.cli import build_parser, main
from relive.config import load_config
from relive.data.npz_io import save_dataset
from relive.envs import env_spec, make_env
from relive.replay import ReplayBuffer
from relive.replay.checkpoint import load_tree
from relive.replay.returns import returns_to_go, write_returns_to_go
from relive.train.cli import config_from_args
from relive.train.collector import Collector, collect_dataset
from relive.train.trainer import build_agent, train

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress"]


class SimulatedKill(Exception):
    pass


def kill_at(env_step=None, grad_step=None):
    """An on_step hook that 'kills' the run at the first step reaching the given counters."""
    def hook(e, g):
        if (env_step is not None and e >= env_step) or (grad_step is not None and g >= grad_step):
            raise SimulatedKill(f"killed at env step {e}, gradient step {g}")
    return hook


def cfg_for(args, run_dir):
    return config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(run_dir)]))


def assert_same_agent(dir_a, dir_b):
    """Every leaf of the final agent state (networks, targets, optimizers, RNG, counters) is identical."""
    a, b = _leaves(load_tree(dir_a / "agent_final")), _leaves(load_tree(dir_b / "agent_final"))
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _leaves(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out |= _leaves(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out


def _logs_without_times(run_dir):
    """metrics.jsonl and eval.csv with the wall-clock columns removed (they differ between runs)."""
    metrics = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        metrics.append({k: "nan" if v != v else v for k, v in d.items() if not k.startswith("time/")})
    rows = [ln.split(",")[:-1] for ln in (run_dir / "eval.csv").read_text().splitlines()]  # last: time/seconds
    return metrics, rows


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_cli_train_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    code = main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "400", "--warmup", "100",
                 "--eval-every", "200", "--log-every", "100", "--run-dir", str(run), "--seed", "3", *TINY])
    assert code == 0
    for name in ("config.json", "metrics.jsonl", "eval.csv", "summary.json", "agent_final/MANIFEST.json"):
        assert (run / name).exists(), name
    assert list((run / "tb").glob("events.out.tfevents.*")), "no TensorBoard events"
    cfg = load_config(run / "config.json")
    assert cfg.run.seed == 3 and cfg.env.id == "Pendulum-v1" and cfg.agent.hidden == (16, 16)
    assert cfg == config_from_args(build_parser().parse_args(
        ["train", "sac", "--env", "Pendulum-v1", "--online-steps", "400", "--warmup", "100", "--eval-every", "200",
         "--log-every", "100", "--run-dir", str(run), "--seed", "3", *TINY]))  # reloads to an equal config
    rows = (run / "eval.csv").read_text().splitlines()
    assert rows[0].startswith("env_step,grad_step,eval/return_mean") and len(rows) == 1 + 3  # 0, 200, final
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [d["env_step"] for d in lines] == [100, 200, 300, 400, 400]
    assert [d["phase"] for d in lines] == ["online"] * 4 + ["final"]
    assert lines[0]["grad_step"] == 0 and lines[1]["grad_step"] == 100  # no updates during the warm-up
    for key in ("train/critic_loss", "replay/online_fraction", "time/env_steps_per_s", "time/grad_steps_per_s"):
        assert np.isfinite(lines[2][key]), key
    summary = json.loads((run / "summary.json").read_text())
    assert summary["num_online_env_steps"] == 400 and summary["num_grad_steps"] == 300
    assert summary["status"] == "finished" and summary["best_return"] >= summary["final_return"]
    assert summary["torch_version"]
    with pytest.raises(ValueError, match="already holds a run"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--run-dir", str(run), *TINY])


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_resume_after_a_kill_in_the_online_phase_reproduces_the_uninterrupted_run(tmp_path):
    """Cal-QL + ARB with chunks of 40 env steps: killed in the middle of a chunk's updates, resumed from the
    last checkpoint, the run ends with the same parameters, optimizer states, evaluations and log lines."""
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 400, seed=0))
    args = ["calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "30", "--online-steps", "520",
            "--eval-every", "200", "--log-every", "80", "--checkpoint-every", "150", "--replay", "arb", "--chunk",
            "40", "--set", "replay.arb.refresh_every_grad_steps=40", "--set", "agent.cql_n_actions=2", *TINY]
    full = train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(grad_step=30 + 333))  # past the step-200 checkpoint
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert load_tree(tmp_path / "cut" / "checkpoint", kind="run")["loop"]["env_steps"] == 200
    resumed = train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert resumed.final_return == full.final_return and resumed.num_grad_steps == full.num_grad_steps
    assert _logs_without_times(tmp_path / "cut") == _logs_without_times(tmp_path / "full")  # each line once


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_resume_after_a_kill_in_the_offline_phase(tmp_path):
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 400, seed=1))
    args = ["calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "120", "--online-steps", "200",
            "--warmup", "0", "--eval-every", "100", "--log-every", "50", "--offline-checkpoint-every", "50",
            "--replay", "symmetric_per", "--set", "agent.cql_n_actions=2", *TINY]
    train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(grad_step=77))
    assert load_tree(tmp_path / "cut" / "checkpoint", kind="run")["loop"]["offline_done"] == 50
    train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert _logs_without_times(tmp_path / "cut") == _logs_without_times(tmp_path / "full")


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_run_checkpoints_refer_to_the_dataset_and_a_changed_dataset_is_refused_on_resume(tmp_path):
    """The offline rows are not copied into run checkpoints (dataset path + SHA-256 instead); resuming loads the
    dataset again (mc_return recomputed: Cal-QL) and gets the uninterrupted result; a dataset file changed in
    between is refused, naming it; buffer_final stays self-contained."""
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 400, seed=2))
    args = ["calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "20", "--online-steps", "300",
            "--eval-every", "150", "--log-every", "100", "--checkpoint-every", "100", "--set",
            "agent.cql_n_actions=2", "--set", "run.save_final_buffer=true", *TINY]
    train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=250))
    buf = load_tree(tmp_path / "cut" / "checkpoint", kind="run")["buffer"]["storage"]
    assert buf["offline_ref"]["dataset_id"] == str(data) and buf["offline_ref"]["num_offline"] == 400
    assert len(buf["columns"]["reward"]) == 200  # the online rows only (env step 200's checkpoint)
    copy = tmp_path / "copy"

    shutil.copytree(tmp_path / "cut", copy)
    train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert _logs_without_times(tmp_path / "cut") == _logs_without_times(tmp_path / "full")
    final = ReplayBuffer.load(tmp_path / "cut" / "buffer_final")  # no offline_rows needed
    assert final.storage.num_offline == 400
    d = dict(np.load(data))
    d["reward"] = d["reward"] + 1.0
    np.savez(data, **d)
    with pytest.raises(ValueError, match="changed since the checkpoint was saved"):
        train(resume_dir=copy)


def sigkill_after_first_checkpoint(args: list[str], run) -> None:
    """`relive train ARGS --run-dir RUN` in a subprocess, killed with SIGKILL as soon as its first checkpoint is
    complete (it must not have finished by then)."""
    code = f"from relive.cli import main; main({['train', *args, '--run-dir', str(run)]!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not (run / "checkpoint" / "MANIFEST.json").exists():
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    proc.kill()
    proc.wait()
    assert not (run / "summary.json").exists()


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_resume_after_the_process_is_killed(tmp_path):
    """A real SIGKILL of `relive train` in a subprocess, then `relive train --resume`."""
    args = ["sac", "--env", "Pendulum-v1", "--online-steps", "1500", "--warmup", "100", "--eval-every", "500",
            "--checkpoint-every", "200", *TINY]
    run = tmp_path / "killed"
    sigkill_after_first_checkpoint(args, run)
    assert main(["train", "--resume", str(run)]) == 0
    train(cfg_for(args, tmp_path / "full"))
    assert_same_agent(tmp_path / "full", run)


def test_resume_without_a_checkpoint_starts_over_and_bad_resume_dirs(tmp_path):
    args = ["sac", "--env", "Pendulum-v1", "--online-steps", "150", "--warmup", "50", "--eval-every", "100", *TINY]
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=120))  # before the first checkpoint
    train(resume_dir=tmp_path / "cut")
    train(cfg_for(args, tmp_path / "full"))
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert _logs_without_times(tmp_path / "cut") == _logs_without_times(tmp_path / "full")
    with pytest.raises(ValueError, match="no config.json"):
        train(resume_dir=tmp_path / "nothing-here")
    with pytest.raises(ValueError, match="already finished"):
        main(["--debug", "train", "--resume", str(tmp_path / "full")])


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_run_resumes_on_another_device_and_other_options_are_refused(tmp_path, capsys):
    """A run whose config names a GPU (and keeps its replay on a device) goes on without one: --device cpu
    --replay-device none; the config then says where it runs. Options that would change what it computes are
    refused by name, not ignored."""
    import torch

    run = tmp_path / "run"
    args = ["sac", "--env", "Pendulum-v1", "--online-steps", "400", "--warmup", "100", "--eval-every", "200",
            "--checkpoint-every", "200", "--replay-device", "cpu", *TINY]
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, run), on_step=kill_at(env_step=300))
    saved = json.loads((run / "config.json").read_text())
    assert saved["replay"]["device"] == "cpu"
    for bad, name in ((["--online-steps", "1000"], "--online-steps"), (["sac"], "PRESET"),
                      (["--set", "agent.num_qs=4"], "agent.num_qs=4")):
        with pytest.raises(ValueError, match=name):
            main(["--debug", "train", "--resume", str(run), *bad])
    if not torch.cuda.is_available():  # what a GPU run's directory says, read on this machine
        saved["run"]["device"] = "cuda"
        (run / "config.json").write_text(json.dumps(saved))
        with pytest.raises(ValueError, match="--resume RUN_DIR --device cpu --replay-device none"):
            main(["--debug", "train", "--resume", str(run)])
    capsys.readouterr()
    assert main(["--debug", "train", "--resume", str(run), "--device", "cpu", "--replay-device", "none",
                 "--threads", "2"]) == 0
    assert "resumed with run.device = 'cpu', replay.device = None, run.num_threads = 2" in capsys.readouterr().out
    cfg = load_config(run / "config.json")
    assert (cfg.run.device, cfg.replay.device, cfg.run.num_threads) == ("cpu", None, 2)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["num_online_env_steps"] == 400


def test_a_generator_state_from_another_device_type_seeds_a_repeatable_stream():
    import torch

    from relive.agents.networks import generator_state, load_generator_state

    cuda_like = np.arange(16, dtype=np.uint8)  # a CUDA (Philox) generator's state: 16 bytes
    draws = []
    for _ in range(2):
        gen = torch.Generator()
        with pytest.warns(UserWarning, match="another device type"):
            load_generator_state(gen, cuda_like)
        draws.append(torch.rand(4, generator=gen))
    assert torch.equal(draws[0], draws[1])
    other = torch.Generator()
    with pytest.warns(UserWarning):
        load_generator_state(other, np.arange(1, 17, dtype=np.uint8))
    assert not torch.equal(torch.rand(4, generator=other), draws[0])
    same = torch.Generator().manual_seed(5)  # the same device type: the exact state, no warning
    state = generator_state(same)
    expected = torch.rand(3, generator=same)
    load_generator_state(same, state)
    assert torch.equal(torch.rand(3, generator=same), expected)


def test_arb_is_rescored_after_each_collected_chunk_as_in_its_algorithm(tmp_path, monkeypatch):
    """ARB Alg. 1: collect d_update env steps, re-score every row (current policy), then d_weight updates;
    never during the offline phase."""
    calls = []
    original = ReplayBuffer.refresh

    def spy(self, score_fn, chunk_size=65536):
        calls.append(self.num_online)
        return original(self, score_fn, chunk_size)

    monkeypatch.setattr(ReplayBuffer, "refresh", spy)
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 400, seed=0))
    grad_steps = []
    train(cfg_for(["calql_arb", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "20",
                   "--online-steps", "200", "--chunk", "50", "--eval-every", "1000",
                   "--set", "replay.arb.refresh_every_grad_steps=50", "--set", "agent.cql_n_actions=2", *TINY],
                  tmp_path / "arb"), on_step=lambda e, g: grad_steps.append(g))
    assert calls == [50, 100, 150, 200]  # right after each chunk; none in the offline phase (0 online rows)
    assert max(grad_steps) == 20 + 200
    calls.clear()  # amortized mode re-scores a slice before every online gradient step
    train(cfg_for(["calql_arb", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "20",
                   "--online-steps", "100", "--chunk", "50", "--eval-every", "1000",
                   "--set", "replay.arb.amortized_rows=64", "--set", "agent.cql_n_actions=2", *TINY],
                  tmp_path / "arb_amortized"))
    assert calls == [50] * 50 + [100] * 50


def test_warmup_with_the_agents_policy(tmp_path):
    """warmup_policy=agent: the warm-up rows' actions are the (untrained) agent's exploration actions."""
    def run(policy):
        args = ["sac", "--env", "Pendulum-v1", "--online-steps", "30", "--warmup", "30", "--warmup-policy", policy,
                "--eval-every", "1000", "--set", "run.save_final_buffer=true", *TINY]
        cfg = cfg_for(args, tmp_path / policy)
        train(cfg)
        buf = ReplayBuffer.load(tmp_path / policy / "buffer_final")
        agent = build_agent(cfg, env_spec(make_env("Pendulum-v1")))  # same seed stream, same generator
        obs, action = buf.storage.columns["obs"][:30], buf.storage.columns["action"][:30]
        return action, np.concatenate([agent.act(o[None], explore=True) for o in obs])

    stored, replayed = run("agent")
    np.testing.assert_array_equal(stored, replayed)
    stored, replayed = run("random")
    assert not np.allclose(stored, replayed)


def test_truncation_bootstraps_from_the_true_final_observation():
    env = make_env("Pendulum-v1", max_episode_steps=5)
    collector = Collector(env, env_spec(env), seed=0)
    rows = collector.step(lambda o: np.zeros((1, 1), np.float32), 7)
    assert rows["truncated"].tolist() == [False] * 4 + [True, False, False]
    assert not rows["terminated"].any()  # a time limit is not a terminal: the critic bootstraps from next_obs
    # the truncated row's next_obs is the last observation of its episode (the env's final obs), not the
    # first observation of the next episode; inside an episode next_obs[t] == obs[t + 1]
    assert not np.allclose(rows["next_obs"][4], rows["obs"][5])
    np.testing.assert_array_equal(rows["next_obs"][:4], rows["obs"][1:5])
    ref = make_env("Pendulum-v1", max_episode_steps=5)
    ref.reset(seed=0)
    for _ in range(5):
        final_obs, *_ = ref.step(np.zeros(1, np.float32))
    np.testing.assert_allclose(rows["next_obs"][4], final_obs)


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
    assert (buf.storage.columns["mc_return"][s1] == 0).all()  # episode not over yet
    s2 = buf.extend(second)
    episode = buf.episode_slots_of(int(s2[-1]))  # what the trainer hands to OnEpisodeEnd hooks
    np.testing.assert_array_equal(episode, np.r_[s1, s2])
    write_returns_to_go(buf, episode, 0.9, "mc_return")  # Cal-QL's hook
    np.testing.assert_allclose(buf.storage.columns["mc_return"][np.r_[s1, s2]],
                               [1 + 0.9 + 0.81 + 0.729, 1 + 0.9 + 0.81, 1.9, 1.0], rtol=1e-6)


def test_ddqn_runs_on_cartpole_with_per(tmp_path):
    code = main(["train", "ddqn_per", "--env", "CartPole-v1", "--online-steps", "300", "--warmup", "50",
                 "--eval-every", "300", "--run-dir", str(tmp_path / "d"), *TINY])
    assert code == 0
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["num_grad_steps"] == 250


def test_agent_and_environment_mismatches_are_named(tmp_path):
    with pytest.raises(ValueError, match="discrete action space"):
        main(["--debug", "train", "ddqn", "--env", "Pendulum-v1", "--run-dir", str(tmp_path / "a"), *TINY])
    with pytest.raises(ValueError, match="continuous action space"):
        main(["--debug", "train", "sac", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "b"), *TINY])
    with pytest.raises(ValueError, match="ddqn has none"):
        main(["--debug", "train", "ddqn", "--env", "CartPole-v1", "--replay", "arb", "--run-dir", str(tmp_path / "c"),
              *TINY])
    with pytest.raises(ValueError, match="needs a dataset"):
        main(["--debug", "train", "calql", "--env", "Pendulum-v1", "--run-dir", str(tmp_path / "d"), *TINY])
    with pytest.raises(ValueError, match="cannot make environment"):
        main(["--debug", "train", "sac", "--env", "NoSuchEnv-v0", "--run-dir", str(tmp_path / "e"), *TINY])
    # a run that could not start leaves nothing behind: the same command works once the mistake is fixed
    assert not any((tmp_path / d).exists() for d in "abcde")


def test_a_dataset_smaller_than_a_batch_is_refused_before_training(tmp_path):
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 20, seed=0))
    with pytest.raises(ValueError, match="20 rows, fewer than one batch"):
        main(["--debug", "train", "calql", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "10",
              "--run-dir", str(tmp_path / "r"), *TINY])
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_demo_quick_runs_end_to_end_and_plots(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "[demo] done" in out and "Plot:" in out
    png = tmp_path / "demo" / "demo.png"
    assert png.stat().st_size > 10_000
    for replay in ("uniform", "symmetric", "arb"):
        summary = json.loads((tmp_path / "demo" / f"calql-{replay}-seed0" / "summary.json").read_text())
        assert summary["num_online_env_steps"] == 400


def test_zoo_schedule_and_stop_at_threshold(tmp_path):
    """--grad-steps-per-chunk: 128 updates after every 256 env steps (RL Zoo's CartPole train_freq /
    gradient_steps); --stop-at-return ends the online phase at the first evaluation that reaches it."""
    base = ["train", "ddqn", "--env", "CartPole-v1", "--warmup", "256", "--chunk", "256",
            "--grad-steps-per-chunk", "128", "--eval-every", "512", *TINY]
    assert main([*base, "--online-steps", "1024", "--run-dir", str(tmp_path / "a")]) == 0
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["num_online_env_steps"] == 1024 and s["num_grad_steps"] == 3 * 128  # no updates in the warm-up chunk
    # any CartPole episode returns >= 1: the evaluation at env step 0 already reaches the threshold
    assert main([*base, "--online-steps", "1024", "--stop-at-return", "1", "--run-dir", str(tmp_path / "b")]) == 0
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["num_online_env_steps"] == 0 and s["num_grad_steps"] == 0
    assert len((tmp_path / "b" / "eval.csv").read_text().splitlines()) == 2  # header + the one evaluation
    # unreachable threshold: the run goes to the end
    assert main([*base, "--online-steps", "512", "--stop-at-return", "1e9", "--run-dir", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["num_online_env_steps"] == 512


def test_init_from_a_pretraining_run_shares_its_agent(tmp_path):
    """--init-from: a fine-tuning run starts from the agent another run saved (the same leaves), and a directory
    without an agent is named."""
    pre = ["train", "sac", "--env", "Pendulum-v1", "--warmup", "50", "--eval-every", "1000", *TINY]
    assert main([*pre, "--online-steps", "100", "--run-dir", str(tmp_path / "pre")]) == 0
    cfg = cfg_for([*pre[1:], "--online-steps", "0", "--init-from", str(tmp_path / "pre")], tmp_path / "fine")
    train(cfg)
    a, b = _leaves(load_tree(tmp_path / "pre" / "agent_final")), _leaves(load_tree(tmp_path / "fine" / "agent_final"))
    assert a.keys() == b.keys()
    for k in a:  # no updates in between: the fine-tuning run's final agent is the pre-trained one
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with pytest.raises(ValueError, match="holds no agent"):
        train(cfg_for([*pre[1:], "--init-from", str(tmp_path / "nowhere")], tmp_path / "bad"))


def test_success_rate_is_the_share_of_evaluation_returns_at_or_above_the_threshold(tmp_path):
    """env.success_return adds eval/success_rate; Pendulum returns are negative, so -1e9 gives 1 and 0 gives 0."""
    rates = {}
    for threshold in (-1e9, 0.0):
        run = tmp_path / f"r{threshold}"
        assert main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "64", "--warmup", "32",
                     "--eval-every", "64", "--run-dir", str(run), "--set", f"env.success_return={threshold}",
                     *TINY]) == 0
        with open(run / "eval.csv", newline="") as f:
            rates[threshold] = [float(r["eval/success_rate"]) for r in csv.DictReader(f)]
    assert len(rates[-1e9]) >= 2 and set(rates[-1e9]) == {1.0}
    assert len(rates[0.0]) >= 2 and set(rates[0.0]) == {0.0}


def test_the_update_clock_counts_stored_rows_not_executed_steps():
    """Gradient steps per chunk: utd_ratio per stored row, or grad_steps_per_chunk scaled by the stored share;
    unstored (probing) steps are executed, not data, and earn none (issue 28 item 2; the end-to-end count is in
    tests/test_plugins.py with a probing toy agent)."""
    from relive.config import ScheduleConfig
    from relive.train.loop import grad_steps_earned

    s = ScheduleConfig(utd_ratio=3)
    assert [grad_steps_earned(s, 10, n) for n in (10, 4, 0)] == [30, 12, 0]
    s = ScheduleConfig(env_steps_per_chunk=100, grad_steps_per_chunk=50)
    assert [grad_steps_earned(s, 100, n) for n in (100, 40, 0)] == [50, 20, 0]
