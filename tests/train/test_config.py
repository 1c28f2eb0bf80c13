import argparse
import dataclasses

import pytest

from relive.cli import build_parser, main
from relive.config import REPLAY_NAMES, ExperimentConfig, load_config, override, save_config
from relive.presets import PRESETS, get_preset
from relive.replay import (
    ARBSampler,
    BERBSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaPERReferenceSampler,
    ReaPERSampler,
    UniformSampler,
)
from relive.train.cli import config_from_args
from relive.train.trainer import build_sampler


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_config_json(name, tmp_path):
    cfg = override(get_preset(name), ["run.seed=5", "data.ref_min_return=-3.5", "env.max_episode_steps=7"])
    save_config(cfg, tmp_path / "config.json")
    again = load_config(tmp_path / "config.json")
    assert again == cfg and type(again.agent) is type(cfg.agent)
    assert isinstance(again.agent.hidden, tuple)  # JSON lists come back as the declared tuples


def test_presets_carry_the_papers_settings():
    rlpd = get_preset("rlpd")
    assert (rlpd.agent.num_qs, rlpd.agent.num_min_qs, rlpd.agent.critic_layer_norm) == (10, 2, True)
    assert rlpd.schedule.utd_ratio == 20 and rlpd.agent.target_entropy_scale == 0.5
    assert rlpd.replay.name == "symmetric" and rlpd.replay.offline_fraction == 0.5
    arb = get_preset("calql_arb")
    assert arb.replay.name == "arb" and arb.schedule.env_steps_per_chunk == 1000
    assert arb.schedule.refresh_every_grad_steps == 1000 and arb.agent.calibrate_online is False
    assert get_preset("calql").agent.calibrate_online is True and get_preset("ddqn_per").replay.name == "per"
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")


@pytest.mark.parametrize("name,kind", [
    ("uniform", UniformSampler), ("per", PrioritizedSampler), ("symmetric", MixtureSampler),
    ("symmetric_per", MixtureSampler), ("arb", ARBSampler), ("arb_transition", ARBSampler),
    ("reaper", ReaPERSampler), ("reaper_reference", ReaPERReferenceSampler), ("berb", BERBSampler)])
def test_replay_names_build_their_samplers(name, kind):
    cfg = override(get_preset("sac"), [f'replay.name="{name}"', "replay.offline_fraction=0.25"])
    sampler = build_sampler(cfg)
    assert type(sampler) is kind
    if name == "symmetric_per":
        assert type(sampler.online) is PrioritizedSampler and type(sampler.offline) is UniformSampler
    if name.startswith("symmetric"):
        assert sampler.config()["offline_fraction"] == 0.25
    if name.startswith("arb"):
        assert sampler.config()["level"] == ("transition" if name == "arb_transition" else "trajectory")
    assert set(REPLAY_NAMES) == {"uniform", "per", "symmetric", "symmetric_per", "arb", "arb_transition",
                                 "reaper", "reaper_reference", "berb"}


@pytest.mark.parametrize("setting,match", [
    ("replay.name=\"fifo\"", "replay.name"), ("replay.offline_fraction=1.5", "offline_fraction"),
    ("replay.arb_temperature=0", "arb_temperature"), ("replay.priority_exponent=-1", "priority_exponent"),
    ("replay.score_mode=\"x\"", "score_mode"), ("schedule.batch_size=0", "batch_size"),
    ("schedule.num_online_env_steps=-1", "step counts"), ("schedule.warmup_policy=\"expert\"", "warmup_policy"),
    ("run.eval_episodes=0", "eval_episodes"), ("run.device=\"tpu\"", "run.device"),
    ("run.checkpoint_every_offline_grad_steps=0", "checkpoint_every_offline"),
    ("env.id=\"\"", "env.id"), ("env.max_episode_steps=0", "max_episode_steps"),
    ("data.discount=1.5", "data.discount"), ("data.ref_min_return=10", "ref_min_return"),
    ("agent.num_min_qs=3", "num_min_qs"), ("schedule.utd_ratio=5", "utd_ratio"),
    ("agent_kind.x=1", "unknown setting")])
def test_bad_settings_raise_a_value_error_naming_them(setting, match):
    base = override(get_preset("sac"), ["data.ref_max_return=1.0"])
    with pytest.raises(ValueError, match=match):
        override(base, [setting])


def test_agent_config_must_match_agent_kind():
    with pytest.raises(ValueError, match="needs a DDQNConfig"):
        dataclasses.replace(get_preset("sac"), agent_kind="ddqn")
    with pytest.raises(ValueError, match="agent_kind"):
        ExperimentConfig(agent_kind="ppo")


def test_utd_flag_keeps_the_agent_in_step():
    def cfg(*args):
        return config_from_args(build_parser().parse_args(["train", *args]))

    rlpd = cfg("rlpd", "--utd", "10")  # RLPD updates the actor once per env step: actor_every follows the UTD
    assert (rlpd.schedule.utd_ratio, rlpd.agent.utd_ratio, rlpd.agent.actor_every) == (10, 10, 10)
    sac = cfg("sac", "--utd", "4")  # plain SAC keeps one actor step per critic step
    assert (sac.schedule.utd_ratio, sac.agent.utd_ratio, sac.agent.actor_every) == (4, 4, 1)
    assert cfg("ddqn", "--utd", "2").agent.utd_ratio == 2


def test_every_cli_option_is_documented(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("train", "presets", "demo"):
        for action in sub.choices[command]._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"relive {command}: {action.option_strings or action.dest} has no help"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for name in REPLAY_NAMES:
        assert name in text
    assert "--resume" in text and "--warmup-policy" in text


def test_presets_command_lists_and_shows(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert f"\n{name} " in "\n" + out
    assert main(["presets", "rlpd"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["agent"]["num_qs"] == 10
    with pytest.raises(ValueError, match="unknown preset"):
        main(["--debug", "train", "nope", "--env", "Pendulum-v1"])
    with pytest.raises(ValueError, match="unknown setting"):
        main(["--debug", "train", "sac", "--set", "agent.no_such_key=1"])
    with pytest.raises(SystemExit, match="PRESET"):
        main(["--debug", "train"])
