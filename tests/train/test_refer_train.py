"""ReF-ER presets through ``relive train`` (the trainer's seams: behaviour records, hints, signals, recount hooks)."""

import json

import numpy as np
import pytest

from relive.cli import main
from relive.presets import get_preset
from relive.replay import ReplayBuffer
from relive.train.trainer import train
from tests.train.test_trainer import SimulatedKill, assert_same_agent, cfg_for, kill_at

TINY = ["--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress"]
REFER = ["--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "100", "--eval-every", "300", "--log-every",
         "100", "--set", "replay.refer.recount_every_grad_steps=50", "--set", "replay.refer.A=0.001", *TINY]


def test_relive_train_ddpg_refer_on_pendulum(tmp_path):
    run = tmp_path / "r"
    assert main(["train", "ddpg_refer", *REFER, "--set", "run.save_final_buffer=true", "--run-dir", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["num_grad_steps"] == 200
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = lines[-2]  # the last online line
    for key in ("replay/far_policy_fraction", "replay/refer_beta", "replay/refer_c_max", "train/refer_kl",
                "train/kl_behaviour", "train/refer_near_fraction"):
        assert np.isfinite(last[key]), key
    assert last["replay/refer_c_max"] == pytest.approx(1 + 4 / (1 + 1e-3 * 200))
    assert last["replay/refer_recounts"] == 4  # gradient steps 0, 50, 100, 150 of the online phase
    buf = ReplayBuffer.load(run / "buffer_final")
    s = buf.sampler
    assert s.t == 200 and s.num_recounts == 4 and s.num_far == int(s.far[:300].sum())
    assert (buf.storage.columns["mu_std"][:300] == np.float32(0.2 * 2.0)).all()  # every row has its record
    assert last["replay/refer_beta"] == pytest.approx(s.beta)


@pytest.mark.parametrize("preset", ["ddpg", "ddpg_per", "ddpg_refer1", "ddpg_refer2", "sac_refer"])
def test_every_refer_preset_runs(preset, tmp_path):
    args = ["--env", "Pendulum-v1", "--online-steps", "120", "--warmup", "60", "--eval-every", "120", *TINY]
    assert main(["train", preset, *args, "--run-dir", str(tmp_path / preset)]) == 0
    cfg = get_preset(preset)
    assert cfg.schedule.warmup_policy == "agent" and cfg.replay.capacity == 2**18
    if preset == "ddpg_refer1":
        assert (cfg.agent.refer_rule1, cfg.agent.refer_rule2) == (True, False)
    if preset == "ddpg_refer2":
        assert (cfg.agent.refer_rule1, cfg.agent.refer_rule2) == (False, True)


def test_random_warmup_is_refused_with_a_pointer_to_the_fix(tmp_path):
    with pytest.raises(ValueError, match="warmup_policy"):
        main(["--debug", "train", "ddpg_refer", *REFER, "--set", "schedule.warmup_policy=random", "--run-dir",
              str(tmp_path / "x")])


def test_a_killed_ddpg_refer_run_resumes_exactly(tmp_path):
    """rho, far counts, beta and t travel in the checkpoint: the resumed run ends where the uninterrupted one does."""
    args = [*REFER, "--checkpoint-every", "150"]
    full = train(cfg_for(["ddpg_refer", *args], tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(["ddpg_refer", *args], tmp_path / "cut"), on_step=kill_at(env_step=250))
    resumed = train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert resumed.final_return == full.final_return


def test_offline_data_without_behaviour_records(tmp_path):
    """A dataset has no behaviour record (the agent's columns are filled with 0): ReF-ER over the whole buffer refuses
    it, naming the fix; ReF-ER on the online part of a 50/50 mixture runs (offline rows replayed as plain DDPG)."""
    from relive.data.npz_io import save_dataset
    from relive.train.collector import collect_dataset

    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 200, seed=0))
    args = ["ddpg_refer", *REFER, "--dataset", str(data), "--offline-steps", "20"]
    with pytest.raises(ValueError, match="refer_online"):
        main(["--debug", "train", *args, "--run-dir", str(tmp_path / "whole")])
    run = tmp_path / "online"
    online = [a.replace("replay.refer.", "replay.refer_online.") for a in args]
    assert main(["train", *online, "--replay", "refer_online", "--run-dir", str(run)]) == 0
    last = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()][-2]
    assert np.isfinite(last["replay/online/far_policy_fraction"]) and 0.3 < last["replay/online_fraction"] < 0.7
