"""The presets of issue 32 item 4, from the CLI on a tiny budget: ``hil_rlpd`` (RLPD + demonstration segment +
interventions) and ``wsrl`` (warm start from a pre-trained agent, no offline data retained)."""

from __future__ import annotations

import json

from relive.cli import main
from relive.data.npz_io import save_dataset
from relive.presets import get_preset
from relive.replay import ReplayBuffer
from relive.train.collector import collect_dataset
from relive.types import INTERVENTION
from tests.train.test_trainer import TINY


def test_the_presets_carry_their_settings():
    hil = get_preset("hil_rlpd")
    assert hil.replay.label == "mixture(offline=uniform, online=uniform)"  # (RLPD's symmetric sampling)
    assert hil.replay.options.offline_fraction == 0.5  # half demonstrations
    assert (hil.agent.num_qs, hil.agent.critic_layer_norm, hil.schedule.utd_ratio) == (10, True, 20)  # RLPD's
    assert hil.intervention.kind == "scripted" and hil.intervention.demo_capacity == 100_000
    wsrl = get_preset("wsrl")
    assert wsrl.schedule.warmup_policy == "agent" and wsrl.schedule.num_warmup_env_steps == 5000
    assert wsrl.schedule.num_offline_grad_steps == 0 and wsrl.replay.name == "uniform"
    assert wsrl.agent_kind == "calql" and wsrl.agent.cql_alpha == 0 and not wsrl.agent.calibrate


def test_hil_serl_is_the_authors_code_and_hil_rlpd_stays_rlpd():
    """hil_serl at rail-berkeley/hil-serl's settings (the preset's docstring cites file and line for each)."""
    hs = get_preset("hil_serl")
    a = hs.agent
    assert (hs.agent_kind, a.num_qs, a.num_min_qs, a.critic_layer_norm, a.actor_q_reduce, a.init) == (
        "sac", 2, 2, True, "mean", "xavier")
    assert (a.gamma, a.tau, a.init_temperature, a.target_entropy_scale, a.backup_entropy) == (0.97, 0.005, 0.01, 0.5,
                                                                                            False)
    assert (a.actor_lr, a.critic_lr, a.temp_lr, a.hidden) == (3e-4, 3e-4, 3e-4, (256, 256))
    assert (a.actor_every, a.actor_per_env_step, hs.schedule.utd_ratio) == (2, False, 2)  # cta_ratio 2, 1 per step
    s = hs.schedule
    assert (s.batch_size, s.num_warmup_env_steps, s.warmup_policy, s.num_offline_grad_steps) == (256, 100, "agent", 0)
    assert hs.replay.label == "mixture(offline=uniform, online=uniform)" and hs.replay.options.offline_fraction == 0.5
    assert hs.replay.capacity == 400_000 and hs.intervention.demo_capacity == 200_000  # (online ring + demos)
    assert hs.intervention.kind == "scripted" and hs.preset == "hil_serl"
    hil = get_preset("hil_rlpd")
    assert hil.agent == get_preset("rlpd").agent and hil.schedule == get_preset("rlpd").schedule


def test_hil_serl_with_the_state_stand_in_from_the_cli_and_a_users_distance_from_a_plugin(tmp_path):
    """A user's distance is code: it comes from a file named with --plugin (the command line), and config.json only
    names it (an unregistered name is refused with the way to load it: test_intervention_state.py)."""
    (tmp_path / "angle.py").write_text(ANGLE_PLUGIN)
    data = save_dataset(tmp_path / "demos.npz", collect_dataset("Pendulum-v1", 100, seed=0))
    run = tmp_path / "hs"
    args = ["train", "hil_serl", "--env", "Pendulum-v1", "--dataset", str(data), "--online-steps", "100",
            "--warmup", "50", "--eval-every", "100", "--log-every", "50", "--capacity", "600",
            "--set", "intervention.kind=state", "--set", "intervention.distance=plugin_angle",
            "--set", "intervention.rising_steps=2", "--set", "intervention.demo_capacity=200", *TINY]
    assert main(["--plugin", str(tmp_path / "angle.py"), *args, "--run-dir", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in rows if r.get("phase") == "online"][-1]["collect/num_intervened_steps"] > 0
    state = json.loads((run / "config.json").read_text())
    assert state["preset"] == "hil_serl" and state["intervention"]["distance"] == "plugin_angle"


ANGLE_PLUGIN = '''
import numpy as np

from relive.train.intervention import register_distance


@register_distance("plugin_angle")
def angle(spec, env):
    """Pendulum's angle from upright, |theta| (its observation: cos theta, sin theta, theta dot)."""
    return lambda obs: float(abs(np.arctan2(obs[1], obs[0])))
'''


def test_hil_rlpd_runs_from_the_cli(tmp_path):
    data = save_dataset(tmp_path / "demos.npz", collect_dataset("Pendulum-v1", 100, seed=0))
    run = tmp_path / "hil"
    assert main(["train", "hil_rlpd", "--env", "Pendulum-v1", "--dataset", str(data), "--online-steps", "150",
                 "--warmup", "50", "--utd", "1", "--eval-every", "150", "--log-every", "50", "--capacity", "600",
                 "--set", "agent.num_qs=2", "--set", "intervention.threshold=1.0", "--set",
                 "intervention.demo_capacity=200", "--set", "run.save_final_buffer=true", *TINY,
                 "--run-dir", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r.get("phase") == "online"][-1]
    n = int(last["collect/num_intervened_steps"])
    assert 0 < last["replay/num_demonstrations"] <= n  # (a stretch still going on joins when it ends)
    buf = ReplayBuffer.load(run / "buffer_final")  # (a final buffer copies its offline rows)
    demos = buf.storage.meta["origin"][: buf.num_offline] == INTERVENTION
    assert demos.sum() == n and not demos[:100].any()  # the dataset's 100 rows, then every intervened step
    state = json.loads((run / "config.json").read_text())
    assert state["preset"] == "hil_rlpd" and state["intervention"]["kind"] == "scripted"


def test_wsrl_warm_starts_from_a_pretrained_run_without_its_data(tmp_path):
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 200, seed=0))
    pre = tmp_path / "pre"
    assert main(["train", "wsrl_pretrain", "--env", "Pendulum-v1", "--dataset", str(data), "--offline-steps", "20",
                 "--online-steps", "0", "--set", "agent.cql_n_actions=2", *TINY, "--run-dir", str(pre)]) == 0
    run = tmp_path / "wsrl"
    assert main(["train", "wsrl", "--env", "Pendulum-v1", "--init-from", str(pre), "--online-steps", "120",
                 "--warmup", "100", "--eval-every", "120", "--set", "agent.cql_n_actions=2", "--set",
                 "run.save_final_buffer=true", *TINY, "--run-dir", str(run)]) == 0
    buf = ReplayBuffer.load(run / "buffer_final")
    assert buf.num_offline == 0 and buf.num_online == 120  # no offline data retained
    assert not (buf.storage.meta["origin"][:120] == INTERVENTION).any()
