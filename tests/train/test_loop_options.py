"""Loop options that reproduce other training loops (issue 18: the ReaPER authors' SB3 loop):
``env.truncation_as_termination`` (time-limit truncations stored as terminations) and the evaluation protocol
(``run.eval_fresh_starts``, ``run.eval_at_start``)."""

import json

import numpy as np
import pytest
import torch

from relive.cli import build_parser, main
from relive.config import load_config
from relive.data.npz_io import save_dataset
from relive.envs import make_env
from relive.replay import ReaPERSampler, ReplayBuffer
from relive.replay.checkpoint import load_tree
from relive.train.cli import config_from_args
from relive.train.collector import collect_dataset
from relive.train.evaluation import evaluate
from relive.train.loop import collect, stored_rows
from relive.train.trainer import build, train
from tests.train.test_trainer import TINY, SimulatedKill, _logs_without_times, assert_same_agent, kill_at


def cfg_for(args, run_dir):
    return config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(run_dir)]))


def short_episodes(preset, env_id, run_dir, on, extra=()):
    """A run built (not trained) with 5-step episodes: nearly every episode ends at the time limit."""
    args = [preset, "--env", env_id, "--set", "env.max_episode_steps=5", "--warmup", "100", *TINY, *extra]
    if on:
        args += ["--set", "env.truncation_as_termination=true"]
    return build(cfg_for(args, run_dir), None, None)


def stored(run):
    n = len(run.buffer)
    cols = run.buffer.storage.columns
    return cols["terminated"][:n].copy(), cols["truncated"][:n].copy()


# -- truncation as termination -------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,env_id", [("ddqn", "CartPole-v1"), ("sac", "Pendulum-v1"), ("ddpg", "Pendulum-v1"),
                                           ("vracer", "Pendulum-v1")])
def test_truncated_rows_are_stored_as_terminated_for_every_agent(tmp_path, preset, env_id):
    off = short_episodes(preset, env_id, tmp_path / "off", on=False)
    collect(off, 20)
    term_off, trunc_off = stored(off)
    assert trunc_off.sum() >= 3  # time limits happened
    on = short_episodes(preset, env_id, tmp_path / "on", on=True)
    collect(on, 20)
    term_on, trunc_on = stored(on)
    # the same episodes (same seeds, random warm-up): every end is now a termination, none a truncation
    np.testing.assert_array_equal(term_on, term_off | trunc_off)
    assert not trunc_on.any()
    # the episode structure is unchanged (an episode ends where it ended before)
    np.testing.assert_array_equal(on.buffer.storage.meta["episode_id"][:20], off.buffer.storage.meta["episode_id"][:20])


def test_ddqn_target_at_a_truncated_row_is_r_with_the_option_and_bootstraps_without(tmp_path):
    def target_at_ends(on):
        run = short_episodes("ddqn", "CartPole-v1", tmp_path / f"t{on}", on=on)
        collect(run, 20)
        term, trunc = stored(run)
        ends = np.flatnonzero(term | trunc)
        b = run.buffer.gather(ends).to_torch()
        return b.reward, run.agent.target(b.reward, b.next_obs.float(), b.terminated), run.agent, b

    r, y, _, _ = target_at_ends(True)
    torch.testing.assert_close(y, r)  # y = r: no bootstrap
    r, y, agent, b = target_at_ends(False)  # the same rows (same seeds), bootstrapped: y = r + gamma Q'(s', a*)
    with torch.no_grad():
        q_next = agent.target_q(b.next_obs.float()).gather(1, agent.q(b.next_obs.float()).argmax(1, keepdim=True))
    torch.testing.assert_close(y, r + agent.cfg.gamma * q_next.squeeze(1))
    assert (y - r).abs().min() > 0


def test_reapers_episode_bookkeeping_sees_the_fake_terminal(tmp_path):
    """With ReaPER's conservative reading (``truncation="ongoing"``: only a terminal row finishes an episode), a
    truncated episode stays ongoing (R = C_t / F); stored as terminated, it is finished (R = C_t / S_e, the last
    row's R = 1), as in the authors' buffer."""
    cfg_on = cfg_for(["ddqn", "--env", "CartPole-v1", "--set", "env.truncation_as_termination=true", *TINY],
                     tmp_path / "x")
    rows = collect_dataset("CartPole-v1", 5, seed=0, max_episode_steps=5)  # one episode of 5 rows, truncated
    assert rows["truncated"][-1] and not rows["terminated"].any()
    for cfg, finished in ((cfg_on, True), (None, False)):
        sampler = ReaPERSampler(truncation="ongoing")
        buf = ReplayBuffer(50, (4,), (), sampler=sampler, action_dtype=np.int64)
        slots = buf.extend(stored_rows(cfg, rows) if cfg else rows)
        later = collect_dataset("CartPole-v1", 8, seed=1, max_episode_steps=50)
        buf.extend(later | {"terminated": np.zeros(8, bool), "truncated": np.zeros(8, bool)})  # a longer, ongoing one
        leaf = sampler.slot_leaf[slots[-1]]
        assert bool(sampler.finished[leaf]) is finished
        r = sampler.reliability(slots)
        expected = sampler.prefix[slots] / (sampler.total[leaf] if finished else sampler.F)
        np.testing.assert_allclose(r, expected)
        assert bool(r[-1] == 1.0) is finished  # ongoing: C = 5 of F = 8


def test_the_option_applies_to_dataset_rows_and_round_trips_through_config_json(tmp_path):
    data = save_dataset(tmp_path / "d.npz", collect_dataset("CartPole-v1", 30, seed=0, max_episode_steps=5))
    args = ["ddqn", "--env", "CartPole-v1", "--dataset", str(data), "--set", "env.truncation_as_termination=true",
            *TINY]
    run = build(cfg_for(args, tmp_path / "r"), None, None)
    term, trunc = stored(run)
    assert term.sum() == 6 and not trunc.any()  # 6 episodes of 5 rows, each ended at the time limit
    cfg = load_config(tmp_path / "r" / "config.json")
    assert cfg.env.truncation_as_termination is True and cfg == run.cfg
    assert json.loads((tmp_path / "r" / "config.json").read_text())["env"]["truncation_as_termination"] is True
    assert cfg_for(args[:5] + TINY, tmp_path / "s").env.truncation_as_termination is False  # off by default


# -- the evaluation protocol ---------------------------------------------------------------------------------
class FirstObs:
    """A constant-action agent that records the first observation of every episode it is asked to act in."""

    def __init__(self):
        self.firsts, self.new = [], True

    def act(self, obs, explore):
        if self.new:
            self.firsts.append(obs[0].copy())
        self.new = False
        return np.zeros(1, np.int64)


def starts(env, seed, evaluations=2, episodes=3):
    agent, out = FirstObs(), []
    for _ in range(evaluations):
        agent.firsts = []
        orig = env.step

        def step(a, orig=orig):
            result = orig(a)
            agent.new = result[2] or result[3]
            return result
        env.step = step
        evaluate(env, agent, episodes, seed=seed)
        env.step = orig
        out.append(np.array(agent.firsts))
    return out


def test_fixed_seeds_repeat_the_start_states_and_fresh_starts_do_not():
    a, b = starts(make_env("CartPole-v1"), seed=7)
    np.testing.assert_array_equal(a, b)  # every evaluation: the same 3 start states
    assert not np.allclose(a[0], a[1])  # (different across its episodes)
    env = make_env("CartPole-v1")
    env.reset(seed=7)  # seeded once, as the trainer does
    a, b = starts(env, seed=None)
    assert not np.isclose(a[:, None], b[None]).all(-1).any()  # no start state of the first evaluation comes back
    env2 = make_env("CartPole-v1")
    env2.reset(seed=7)
    np.testing.assert_array_equal(starts(env2, seed=None)[0], a)  # repeatable from the one seed


def test_first_evaluation_at_the_first_interval_without_eval_at_start(tmp_path):
    base = ["train", "ddqn", "--env", "CartPole-v1", "--online-steps", "300", "--warmup", "50", "--eval-every", "100",
            *TINY]
    assert main([*base, "--run-dir", str(tmp_path / "a")]) == 0
    assert main([*base, "--set", "run.eval_at_start=false", "--set", "run.eval_fresh_starts=true",
                 "--run-dir", str(tmp_path / "b")]) == 0
    steps = [[int(r.split(",")[0]) for r in (tmp_path / d / "eval.csv").read_text().splitlines()[1:]] for d in "ab"]
    assert steps == [[0, 100, 200, 300], [100, 200, 300]]  # SB3's EvalCallback: first at eval_freq
    cfg = load_config(tmp_path / "b" / "config.json")
    assert cfg.run.eval_fresh_starts is True and cfg.run.eval_at_start is False
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["offline_return"] is None  # (no evaluation)


def test_resume_with_fresh_evaluation_starts_reproduces_the_uninterrupted_run(tmp_path):
    """The eval env's random stream is checkpointed: a killed and resumed run evaluates on the same start
    states as the uninterrupted one (same eval.csv, same agent)."""
    args = ["ddqn", "--env", "CartPole-v1", "--online-steps", "600", "--warmup", "50", "--eval-every", "100",
            "--checkpoint-every", "150", "--set", "run.eval_fresh_starts=true", "--set", "run.eval_at_start=false",
            "--set", "env.truncation_as_termination=true", "--set", "env.max_episode_steps=40", *TINY]
    train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=420))
    assert "eval_rng" in load_tree(tmp_path / "cut" / "checkpoint", kind="run")
    train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert _logs_without_times(tmp_path / "cut") == _logs_without_times(tmp_path / "full")


def test_progress_is_plain_lines_when_stdout_is_not_a_terminal(tmp_path, capsys, monkeypatch):
    """Issue 31 item 6: a run whose output goes to a file or a pipe (bench run's per-run logs) prints plain progress
    lines with an ETA instead of a terminal bar (pytest's captured stdout is not a terminal)."""
    from relive.train.logging import RunLogger

    monkeypatch.setenv("RELIVE_PROGRESS_SECONDS", "0")
    logger = RunLogger(tmp_path, 1000, 0, progress=True)
    assert logger._bar is None
    logger.progress("online", 100, "50 env/s 50 grad/s")
    logger.progress("online", 1000, "50 env/s 50 grad/s")
    for _ in range(5):  # Ray collectors' learner calls on after the last step: the last line is printed once
        logger.progress("online", 1000, "50 env/s 50 grad/s")
    logger.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("online: 100/1,000 env steps (10%) 50 env/s 50 grad/s | ETA")
    assert lines[1].startswith("online: 1,000/1,000 env steps (100%)") and "ETA -" in lines[1]
    monkeypatch.setenv("RELIVE_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match="RELIVE_PROGRESS_SECONDS"):
        RunLogger(tmp_path, 1000, 0, progress=True)


def test_online_steps_within_the_warmup_are_warned_about(tmp_path, capsys):
    """Issue 31 item 6: a run whose online steps do not pass its warm-up makes no online gradient step: said at the
    start, not discovered in the logs."""
    assert main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "100", "--warmup", "200", "--run-dir",
                 str(tmp_path / "r"), "--eval-episodes", "1", "--no-progress", "--set", "agent.hidden=[8,8]"]) == 0
    out = capsys.readouterr().out
    assert "warning: 100 online env steps do not exceed the warm-up of 200" in out
    assert main(["train", "sac", "--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "200", "--run-dir",
                 str(tmp_path / "r2"), "--eval-episodes", "1", "--no-progress", "--set", "agent.hidden=[8,8]"]) == 0
    assert "warning" not in capsys.readouterr().out


@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_closed_pipe_ends_a_command_quietly():
    """``relive presets | head -1``: the reader closes the pipe; relive stops without a traceback or an error line.
    (Here stdout is a pipe whose reader is already closed, so the first write fails as it would after head exits.)"""
    import subprocess
    import sys

    code = ("import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
            "from relive.cli import main; sys.exit(main(['presets']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr[-1000:]
