"""relive.train(cfg, callbacks=[...]): the three events, each can stop the run, and a stopped run ends as a finished
one (checkpoint, agent_final, summary.json with status "stopped")."""

import csv
import json

import pytest

import relive.train
from relive.cli import build_parser
from relive.data.npz_io import save_dataset
from relive.train.checkpoint import has_checkpoint
from relive.train.cli import config_from_args
from relive.train.collector import collect_dataset
from relive.train.trainer import train

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "16", "--eval-episodes", "1", "--no-progress"]


def cfg_for(run_dir, *args):
    return config_from_args(build_parser().parse_args(
        ["train", "ddqn", "--env", "CartPole-v1", "--warmup", "20", "--online-steps", "200", "--eval-every", "50",
         "--checkpoint-every", "40", "--run-dir", str(run_dir), *TINY, *args]))


class Recorder(relive.train.Callback):
    """Records every event; stops (by ``how``) at the first ``event`` whose env step reaches ``at``."""

    def __init__(self, event=None, at=0, how="false"):
        self.event, self.at, self.how = event, at, how
        self.steps, self.evals, self.checkpoints = [], [], []

    def _answer(self, event, env_steps):
        if event == self.event and env_steps >= self.at:
            if self.how == "raise":
                raise relive.train.StopTraining("enough")
            return False
        return None

    def on_step(self, env_steps, grad_steps):
        self.steps.append((env_steps, grad_steps))
        return self._answer("on_step", env_steps)

    def on_evaluation(self, row):
        self.evals.append((row["env_step"], row["eval/return_mean"]))
        return self._answer("on_evaluation", row["env_step"])

    def on_checkpoint(self, run_dir, env_steps, grad_steps):
        self.checkpoints.append((str(run_dir), env_steps))
        return self._answer("on_checkpoint", env_steps)


def _eval_rows(run_dir):
    with open(run_dir / "eval.csv") as f:
        return [(int(r["env_step"]), float(r["eval/return_mean"])) for r in csv.DictReader(f)]


def test_callbacks_see_every_event_of_a_full_run(tmp_path):
    rec = Recorder()
    summary = relive.train(cfg_for(tmp_path / "r"), callbacks=[rec])
    assert summary.status == "finished" and summary.num_online_env_steps == 200
    # on_step after every chunk (1 env step) and every gradient step: the last call sees the run's counts
    assert rec.steps[-1] == (200, summary.num_grad_steps)
    assert len(rec.steps) == 200 + summary.num_grad_steps
    # on_evaluation: every eval.csv row (steps 0, 50, ..., 200: the last one is the final evaluation)
    assert rec.evals == _eval_rows(tmp_path / "r")
    assert [e for e, _ in rec.evals] == [0, 50, 100, 150, 200]
    assert rec.checkpoints and all(d == str(tmp_path / "r") for d, _ in rec.checkpoints)


@pytest.mark.parametrize("how", ["false", "raise"])
def test_on_evaluation_stops_the_run_cleanly(tmp_path, how):
    rec, other = Recorder("on_evaluation", at=100, how=how), Recorder()
    summary = relive.train(cfg_for(tmp_path / "r"), callbacks=[rec, other])
    run_dir = tmp_path / "r"
    assert summary.status == "stopped"
    assert summary.num_online_env_steps == 100  # stopped at the evaluation of env step 100: its row is the final one
    assert [e for e, _ in _eval_rows(run_dir)] == [0, 50, 100]
    assert summary.final_return == _eval_rows(run_dir)[-1][1]
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["status"] == "stopped" and saved["num_online_env_steps"] == 100
    assert (run_dir / "agent_final" / "MANIFEST.json").is_file()
    assert other.evals == rec.evals  # every callback sees the event that stopped the run
    assert not any(e > 100 for e, _ in other.steps)  # nothing ran after it


def test_on_step_stop_in_the_offline_phase_skips_online_and_checkpoints(tmp_path):
    save_dataset(tmp_path / "d.npz", collect_dataset("CartPole-v1", 300, seed=0))

    class StopAt(relive.train.Callback):
        def __init__(self):
            self.checkpoints = []

        def on_step(self, env_steps, grad_steps):
            return grad_steps < 7  # False at gradient step 7

        def on_checkpoint(self, run_dir, env_steps, grad_steps):
            self.checkpoints.append(grad_steps)

    cb = StopAt()
    summary = train(cfg_for(tmp_path / "r", "--dataset", str(tmp_path / "d.npz"), "--offline-steps", "50"),
                    callbacks=[cb])
    assert summary.status == "stopped" and summary.num_grad_steps == 7 and summary.num_online_env_steps == 0
    assert cb.checkpoints == [7]  # the stop's checkpoint (the offline cadence is every 10,000)
    assert has_checkpoint(tmp_path / "r")


def test_on_checkpoint_stop_and_on_step_as_a_function(tmp_path):
    seen = []
    rec = Recorder("on_checkpoint", at=1)
    summary = relive.train(cfg_for(tmp_path / "r"), callbacks=[rec], on_step=lambda e, g: seen.append((e, g)))
    assert summary.status == "stopped"
    first = rec.checkpoints[0][1]  # the first checkpoint: the first episode end after 40 env steps
    assert first >= 40 and summary.num_online_env_steps == first
    assert seen == rec.steps  # train(on_step=fn) is called as a callback is, at every step


def test_a_wrong_callback_is_refused_before_the_run_starts(tmp_path):
    with pytest.raises(ValueError, match="callbacks: .* is not a relive.train.Callback"):
        relive.train(cfg_for(tmp_path / "r"), callbacks=[lambda e, g: None])
    assert not (tmp_path / "r").exists()
