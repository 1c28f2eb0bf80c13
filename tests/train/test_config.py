import argparse
import dataclasses

import pytest

from relive.cli import build_parser, main
from relive.config import ExperimentConfig, config_from_dict, load_config, override, save_config
from relive.presets import PRESETS, get_preset
from relive.registry import load_builtins, replay_names
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

load_builtins()
REPLAY_NAMES = ("uniform", "per", "mixture", "symmetric", "symmetric_per", "arb", "arb_transition", "reaper",
                "reaper_reference", "berb")  # the built-in strategies and short names (a test file may register more)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_round_trips_through_config_json(name, tmp_path):
    cfg = override(get_preset(name), ["run.seed=5", "data.ref_min_return=-3.5", "env.max_episode_steps=7"])
    save_config(cfg, tmp_path / "config.json")
    again = load_config(tmp_path / "config.json")
    assert again == cfg and type(again.agent) is type(cfg.agent)
    assert isinstance(again.agent.hidden, tuple)  # JSON lists come back as the declared tuples


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_presets_demonstration_segment_fits_its_buffer(name):
    """A preset's demonstration room is a part of its replay capacity (the storage refuses demo_capacity >=
    capacity at build time: hil_serl once set both to 200k and did not start)."""
    cfg = get_preset(name)
    demo = cfg.intervention.demo_capacity if cfg.intervention.kind != "none" else 0  # (no intervener: no segment)
    assert 0 <= demo < cfg.replay.capacity, (name, demo, cfg.replay.capacity)


def test_presets_carry_the_papers_settings():
    rlpd = get_preset("rlpd")
    assert (rlpd.agent.num_qs, rlpd.agent.num_min_qs, rlpd.agent.critic_layer_norm) == (10, 2, True)
    assert rlpd.schedule.utd_ratio == 20 and rlpd.agent.target_entropy_scale == 0.5
    assert rlpd.replay.label == "mixture(offline=uniform, online=uniform)"  # RLPD's symmetric sampling
    assert rlpd.replay.options.offline_fraction == 0.5
    arb = get_preset("calql_arb")
    assert arb.replay.name == "arb" and arb.schedule.env_steps_per_chunk == 1000
    assert arb.replay.options.refresh_every_grad_steps == 1000 and arb.agent.calibrate_online is False
    assert get_preset("calql").agent.calibrate_online is True and get_preset("ddqn_per").replay.name == "per"
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("nope")


@pytest.mark.parametrize("name,kind", [
    ("uniform", UniformSampler), ("per", PrioritizedSampler), ("symmetric", MixtureSampler),
    ("symmetric_per", MixtureSampler), ("arb", ARBSampler), ("arb_transition", ARBSampler),
    ("reaper", ReaPERSampler), ("reaper_reference", ReaPERReferenceSampler), ("berb", BERBSampler)])
def test_replay_names_build_their_samplers(name, kind):
    cfg = override(get_preset("sac"), [f'replay.name="{name}"'])
    if name.startswith("symmetric"):
        cfg = override(cfg, [f"replay.{name}.offline_fraction=0.25"])
    sampler = build_sampler(cfg)
    assert type(sampler) is kind
    if name == "symmetric_per":
        assert type(sampler.online) is PrioritizedSampler and type(sampler.offline) is UniformSampler
    if name.startswith("symmetric"):
        assert sampler.config()["offline_fraction"] == 0.25
    if name.startswith("arb"):
        assert sampler.config()["level"] == ("transition" if name == "arb_transition" else "trajectory")
    assert {"uniform", "per", "symmetric", "symmetric_per", "arb", "arb_transition", "reaper", "reaper_reference",
            "berb"} <= set(replay_names())


@pytest.mark.parametrize("setting,match", [
    ("replay.name=\"fifo\"", "unknown replay"), ("replay.symmetric.offline_fraction=1.5", "offline_fraction"),
    ("replay.arb.temperature=0", "temperature"), ("replay.per.priority_exponent=-1", "priority_exponent"),
    ("replay.arb.score_mode=\"x\"", "score_mode"), ("schedule.batch_size=0", "batch_size"),
    ("schedule.num_online_env_steps=-1", "step counts"), ("schedule.warmup_policy=\"expert\"", "warmup_policy"),
    ("run.eval_episodes=0", "eval_episodes"), ("run.device=\"tpu\"", "run.device"),
    ("run.checkpoint_every_offline_grad_steps=0", "checkpoint_every_offline"),
    ("env.id=\"os:Env-v0\"", "env.id"), ("env.max_episode_steps=0", "max_episode_steps"),
    ("data.discount=1.5", "data.discount"), ("data.ref_min_return=10", "ref_min_return"),
    ("agent.num_min_qs=3", "num_min_qs"), ("schedule.utd_ratio=0", "utd_ratio"),
    ("agent_kind.x=1", "unknown setting"), ("agent.utd_ratio=5", "schedule.utd_ratio"),
    ("schedule.refresh_every_grad_steps=5", "replay.arb.refresh_every_grad_steps")])
def test_bad_settings_raise_a_value_error_naming_them(setting, match):
    base = override(get_preset("sac"), ["data.ref_max_return=1.0"])
    name = setting.split(".")[1] if setting.startswith("replay.") and setting.count(".") == 2 else None
    if name:
        base = override(base, [f"replay.name={name}"])
    with pytest.raises(ValueError, match=match):
        override(base, [setting])


@pytest.mark.parametrize("setting,expected", [
    ("agent.learn_temperature=False", "true or false"), ("agent.learn_temperature=maybe", "true or false"),
    ("agent.actor_lr=fast", "a number"), ("agent.hidden=64", "a list of integers"),
    ("agent.num_qs=2.5", "an integer"), ("schedule.batch_size=64.7", "an integer"),
    ("agent.num_qs=true", "an integer"), ("data.ref_min_return=low", "a number or null"),
    ("agent.actor_lr=nan", "NaN")])
def test_set_values_are_parsed_against_the_declared_type(setting, expected):
    cfg = get_preset("sac")
    if setting == "agent.learn_temperature=False":  # parsed, not stored as the (truthy) string "False"
        assert override(cfg, [setting]).agent.learn_temperature is False
        assert override(cfg, ["agent.learn_temperature=TRUE"]).agent.learn_temperature is True
        return
    with pytest.raises(ValueError, match=expected) as e:
        override(cfg, [setting])
    assert setting.split("=")[0] in str(e.value)  # the message names the key
    ok = override(cfg, ["agent.hidden=[64,64]", "agent.num_qs=4", "data.ref_min_return=null"])
    assert ok.agent.hidden == (64, 64)


def test_replay_options_are_nested_under_the_strategy_and_old_keys_say_where_they_went():
    cfg = override(get_preset("ddqn"), ["replay.name=reaper", "replay.reaper.priority_exponent=0.5"])
    assert cfg.replay.options.priority_exponent == 0.5 and cfg.replay.options.reliability_exponent == 0.2
    assert cfg.to_dict()["replay"] == {"name": "reaper", "capacity": 100_000,
                                       "reaper": {"priority_exponent": 0.5, "reliability_exponent": 0.2,
                                                  "is_exponent": 0.4, "is_exponent_final": 1.0,
                                                  "is_anneal_samples": None, "eps": 1e-6, "truncation": "finished",
                                                  "use_kernels": None}}
    with pytest.raises(ValueError, match=r"replay.<name>.priority_exponent.*'per'.*'reaper'"):
        override(cfg, ["replay.priority_exponent=0.4"])
    with pytest.raises(ValueError, match="set --replay per first"):
        override(cfg, ["replay.per.priority_exponent=0.4"])
    # switching the strategy starts from the new strategy's own defaults (one source of truth)
    assert override(cfg, ["replay.name=per"]).replay.options.priority_exponent == 0.6


def test_config_json_of_the_earlier_flat_layout_still_loads():
    old = {"preset": "calql_arb", "agent_kind": "calql", "agent": {"utd_ratio": 1, "cql_n_actions": 4},
           "schedule": {"utd_ratio": 1, "refresh_every_grad_steps": 250, "env_steps_per_chunk": 1000},
           "replay": {"name": "arb", "capacity": 5000, "offline_fraction": 0.5, "priority_exponent": 0.6,
                      "is_exponent": 0.4, "is_exponent_final": 1.0, "score_mode": "log_prob", "arb_temperature": 2.0,
                      "arb_amortized_rows": 0, "reliability_exponent": 0.2, "berb_temperature": 5.0,
                      "berb_init_online_fraction": 0.5}}
    cfg = config_from_dict(old)
    assert cfg.replay.name == "arb" and cfg.replay.capacity == 5000 and cfg.agent.cql_n_actions == 4
    assert (cfg.replay.options.temperature, cfg.replay.options.score_mode,
            cfg.replay.options.refresh_every_grad_steps) == (2.0, "log_prob", 250)
    reaper = config_from_dict({"agent_kind": "ddqn", "replay": {"name": "reaper", "priority_exponent": 0.6,
                                                                "arb_temperature": 5.0}})
    assert reaper.replay.options.priority_exponent == 0.6  # the old run's value, not today's default
    with pytest.raises(ValueError, match="unknown setting"):
        config_from_dict({"agent": {"no_such": 1}})


def test_each_strategy_default_lives_in_its_config_dataclass():
    """The sampler a name builds carries exactly its options (one declaration: the constructor, ``config()`` and the
    CLI are the same dataclass); only the settings a run derives (None in the options) are filled from the run."""
    for name in REPLAY_NAMES:
        cfg = override(get_preset("sac"), [f"replay.name={name}"])
        sampler = build_sampler(cfg)
        expected = cfg.replay.to_dict()[cfg.replay.name]
        params = sampler.config()
        if cfg.replay.name == "mixture":  # a constant share: the checkpoint record has no schedule (as before them)
            assert expected.pop("schedule") == "constant" and params.get("schedule") is None
            for key in ("offline_fraction_final", "schedule_env_steps"):
                assert expected.pop(key) is None
            # no per-source parts: the record has none either (as before them)
            assert expected.pop("demonstration_fraction") is None and "demonstrations" not in params
            expected.pop("demonstrations")
        for part in ("offline", "online"):  # a mixture: each part's sampler carries that part's options
            if part in expected:
                spec = expected.pop(part)
                assert_carries(params.pop(part)["params"], spec[spec["name"]], name)
        assert_carries(params, expected, name)


def assert_carries(params: dict, options: dict, name: str) -> None:
    assert set(params) == set(options), name
    for key, value in options.items():
        if value is not None:  # (None: the sampler's own default, or a setting from_run fills from the run)
            assert params[key] == value, (name, key)


def test_agent_config_must_match_agent_kind():
    with pytest.raises(ValueError, match="needs a DDQNConfig"):
        dataclasses.replace(get_preset("sac"), agent_kind="ddqn")
    with pytest.raises(ValueError, match="unknown agent 'ppo'"):
        ExperimentConfig(agent_kind="ppo")


def test_utd_flag_keeps_the_agent_in_step():
    def cfg(*args):
        return config_from_args(build_parser().parse_args(["train", *args]))

    rlpd = cfg("rlpd", "--utd", "10")  # RLPD updates the actor once per env step: a rule, the flag sets the UTD only
    assert (rlpd.schedule.utd_ratio, rlpd.agent.actor_every, rlpd.agent.actor_per_env_step) == (10, 1, True)
    sac = cfg("sac", "--utd", "4")  # plain SAC keeps one actor step per critic step
    assert (sac.schedule.utd_ratio, sac.agent.actor_every) == (4, 1)
    assert not hasattr(cfg("ddqn", "--utd", "2").agent, "utd_ratio")  # one place: the schedule
    assert cfg("rlpd", "--offline-fraction", "0.25").replay.options.offline_fraction == 0.25
    with pytest.raises(ValueError, match="--offline-fraction"):
        cfg("sac", "--offline-fraction", "0.25")


def test_updates_per_chunk_and_a_utd_ratio_are_not_both_taken(tmp_path):
    """grad_steps_per_chunk replaces chunk x utd_ratio: both set would silently ignore one, so a run refuses it
    before anything is built."""
    from relive.train.trainer import train

    def cfg(*args):
        return config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(tmp_path / "r")]))

    both = cfg("rlpd", "--chunk", "10", "--grad-steps-per-chunk", "5")  # the RLPD preset's UTD is 20
    with pytest.raises(ValueError, match=r"grad_steps_per_chunk \(5 updates per chunk\) replaces utd_ratio \(20"):
        train(both)
    assert not (tmp_path / "r").exists()
    c = cfg("rlpd", "--chunk", "10", "--grad-steps-per-chunk", "5", "--utd", "1")  # in either order
    c.schedule.check_update_rule()
    assert (c.schedule.utd_ratio, c.schedule.grad_steps_per_chunk, c.schedule.env_steps_per_chunk) == (1, 5, 10)
    with pytest.raises(ValueError, match="set one of them"):
        override(get_preset("sac"), ["schedule.grad_steps_per_chunk=4", "schedule.utd_ratio=2"]).schedule\
            .check_update_rule()


def test_device_flags_and_the_replay_device_setting(tmp_path):
    def cfg(*args):
        return config_from_args(build_parser().parse_args(["train", *args]))

    c = cfg("rlpd", "--device", "cuda", "--replay-device", "cuda:1")
    assert (c.run.device, c.replay.device) == ("cuda", "cuda:1")
    assert cfg("rlpd").replay.device is None  # the default: NumPy on the host
    assert override(c, ["replay.name=per"]).replay.device == "cuda:1"  # a new strategy keeps the device
    assert override(c, ["replay.device=none"]).replay.device is None
    with pytest.raises(ValueError, match="replay.device must be 'cpu', 'cuda'"):
        cfg("rlpd", "--replay-device", "tpu")
    with pytest.raises(ValueError, match="run.device must be 'cpu', 'cuda', 'cuda:N'"):
        cfg("rlpd", "--device", "cuda:x")
    save_config(c, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == c
    assert "device" not in cfg("rlpd").to_dict()["replay"]  # config.json files of host runs are unchanged


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_a_device_that_is_not_there_is_refused_before_anything_is_built(tmp_path, capsys):
    for flags, key in ((["--device", "cuda"], "run.device"), (["--replay-device", "cuda:0"], "replay.device")):
        run_dir = tmp_path / key
        assert main(["train", "sac", "--env", "Pendulum-v1", "--run-dir", str(run_dir), *flags]) != 0
        assert f"{key} = " in capsys.readouterr().err and not run_dir.exists()


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
    assert main(["presets", "rlpd", "--json"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["agent"]["num_qs"] == 10
    assert main(["presets", "--show", "rlpd"]) == 0
    out = capsys.readouterr().out
    assert "agent.num_qs = 10" in out and "# critic ensemble size" in out
    assert "replay.mixture.offline_fraction = 0.5" in out and "# offline share of every batch" in out
    assert 'replay.mixture.online.name = "uniform"' in out
    assert main(["presets", "--show", "reaper"]) == 0
    assert "replay.reaper.priority_exponent = 0.4" in capsys.readouterr().out
    assert main(["presets", "--show", "replays"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in REPLAY_NAMES)
    with pytest.raises(ValueError, match="unknown preset"):
        main(["--debug", "train", "nope", "--env", "Pendulum-v1"])
    with pytest.raises(ValueError, match="unknown setting"):
        main(["--debug", "train", "sac", "--set", "agent.no_such_key=1"])
    with pytest.raises(SystemExit, match="PRESET"):
        main(["--debug", "train"])


def test_a_default_run_directory_names_a_replay_other_than_the_presets_and_one_directory_per_env_id():
    from relive.train.trainer import default_run_dir

    def cfg(*args):
        return config_from_args(build_parser().parse_args(["train", *args]))

    own = default_run_dir(cfg("rlpd", "--env", "Pendulum-v1")).name
    other = default_run_dir(cfg("rlpd", "--env", "Pendulum-v1", "--replay", "per")).name
    assert own.startswith("rlpd-Pendulum-v1-seed") and other.startswith("rlpd-per-Pendulum-v1-seed")
    atari = default_run_dir(cfg("ddqn", "--env", "ALE/Pong-v5"))
    assert atari.parent.name == "runs" and atari.name.startswith("ddqn-ALE_Pong-v5-seed")
