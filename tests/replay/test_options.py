"""One declaration per option, one registry, compositions instead of flat names (issue 29, step 3).

A sampler's settings are its ``Config`` dataclass: the constructor, ``config()`` (checkpoints) and ``--set
replay.NAME.*`` are that one dataclass; ``register_replay`` fills the CLI's table and the checkpoints' table at once;
``mixture`` composes two parts (``replay.mixture.online = {name = "per", ...}``) and the old flat names
(``symmetric``, ``symmetric_per``, ``refer_online``, ``arb_transition``) are short names that expand to it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from relive.cli import main
from relive.config import ReplayConfig, config_from_dict, load_config, override, save_config
from relive.presets import get_preset
from relive.registry import ALIASES, REPLAYS, ReplayBuild, ReplaySpec, register_replay, replay_entry
from relive.replay.samplers import (
    SAMPLERS,
    MixtureSampler,
    PrioritizedSampler,
    UniformSampler,
    sampler_config,
    sampler_from_config,
)
from relive.replay.samplers.arb import ARBConfig, ARBSampler
from relive.replay.samplers.base import Sampler
from relive.replay.samplers.per import PERConfig
from relive.train.trainer import build_sampler

CTX = ReplayBuild(total_grad_steps=500, env_steps_per_chunk=1, seed=np.random.SeedSequence(0))


def test_a_sampler_takes_its_config_or_its_settings_and_config_is_that_dataclass():
    opts = PERConfig(priority_exponent=0.7, is_exponent=0.3, eps=1e-3)
    by_config, by_name = PrioritizedSampler(opts), PrioritizedSampler(priority_exponent=0.7, is_exponent=0.3, eps=1e-3)
    assert by_config.options == by_name.options == opts
    assert by_config.config() == dataclasses.asdict(opts)
    assert PrioritizedSampler(0.7, 0.3).options == PERConfig(0.7, 0.3)  # positionally, in field order
    assert PrioritizedSampler.from_config(by_config.config()).options == opts  # a checkpoint's record round-trips
    # one default per setting, the dataclass's (is_exponent_final was None in the constructor, 1.0 in the CLI)
    assert PrioritizedSampler().is_exponent_final == PERConfig().is_exponent_final == 1.0
    with pytest.raises(ValueError, match="priority_exponent"):
        PrioritizedSampler(priority_exponent=-1)
    with pytest.raises(TypeError):
        PrioritizedSampler(no_such_setting=1)


def test_run_derived_settings_are_filled_from_the_run_only_where_unset():
    built = replay_entry("per").target(PERConfig(), CTX)
    assert built.is_anneal_samples == 500 and built.config()["is_anneal_samples"] == 500
    assert replay_entry("per").target(PERConfig(is_anneal_samples=7), CTX).is_anneal_samples == 7
    assert PrioritizedSampler().is_anneal_samples == 0  # outside a run: beta stays at is_exponent
    # the CLI reaches every constructor setting (PER's eps was not settable from a shell)
    cfg = override(get_preset("sac"), ["replay.name=per", "replay.per.eps=0.01"])
    assert build_sampler(cfg).eps == 0.01


def test_one_registry_a_registered_sampler_class_loads_from_checkpoints():
    for name in ("uniform", "per", "arb", "reaper", "reaper_reference", "berb", "refer"):
        entry = replay_entry(name)
        assert entry.sampler_cls is not None and entry.config_cls is entry.sampler_cls.Config
        assert SAMPLERS[entry.sampler_cls.__name__] is entry.sampler_cls

    @dataclasses.dataclass(frozen=True)
    class HalfConfig:
        share: float = 0.5  # a toy setting

    @register_replay("toy_options_half")
    class ToyOptionsHalfSampler(UniformSampler):
        """toy: uniform with a setting"""

        Config = HalfConfig

    try:
        assert SAMPLERS["ToyOptionsHalfSampler"] is ToyOptionsHalfSampler
        assert REPLAYS["toy_options_half"].config_cls is HalfConfig
        assert REPLAYS["toy_options_half"].doc == "toy: uniform with a setting"
        cfg = override(get_preset("sac"), ["replay.name=toy_options_half", "replay.toy_options_half.share=0.25"])
        assert build_sampler(cfg).options == HalfConfig(0.25)
    finally:
        REPLAYS.pop("toy_options_half")
        SAMPLERS.pop("ToyOptionsHalfSampler")


def test_a_mixture_is_composed_from_parts_on_the_command_line_and_in_config_json(tmp_path):
    cfg = override(get_preset("sac"), ["replay.name=mixture", "replay.mixture.offline_fraction=0.25",
                                       "replay.mixture.online.name=per",
                                       "replay.mixture.online.per.priority_exponent=0.5"])
    opts = cfg.replay.options
    assert opts.offline_fraction == 0.25 and opts.offline == ReplaySpec("uniform")
    assert opts.online == ReplaySpec("per", PERConfig(priority_exponent=0.5))
    assert cfg.replay.to_dict()["mixture"]["online"] == {"name": "per", "per": dataclasses.asdict(opts.online.options)}
    save_config(cfg, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg
    sampler = build_sampler(cfg)
    assert isinstance(sampler, MixtureSampler) and isinstance(sampler.online, PrioritizedSampler)
    assert (sampler.offline_fraction, sampler.online.priority_exponent) == (0.25, 0.5)
    assert type(sampler.offline) is UniformSampler
    # any registered strategy is a part, e.g. ARB over the online rows
    arb = override(cfg, ["replay.mixture.online.name=arb", "replay.mixture.online.arb.temperature=2"])
    assert build_sampler(arb).online.temperature == 2.0 and isinstance(build_sampler(arb).online, ARBSampler)
    with pytest.raises(ValueError, match="apply only when online.name is 'per'.*this part is 'arb'"):
        override(arb, ["replay.mixture.online.per.priority_exponent=0.5"])
    with pytest.raises(ValueError, match="unknown replay 'fifo'"):
        override(cfg, ["replay.mixture.offline.name=fifo"])
    with pytest.raises(ValueError, match="online is a replay part"):
        override(cfg, ["replay.mixture.online=per"])


@pytest.mark.parametrize(("alias", "settings", "expected"), [
    ("symmetric", {"offline_fraction": 0.3}, "mixture(offline_fraction=0.3, offline=uniform, online=uniform)"),
    ("symmetric_per", {"priority_exponent": 0.7},
     "mixture(offline=uniform, online=per(priority_exponent=0.7))"),
    ("refer_online", {"offline_fraction": 0.25, "C": 2.0},
     "mixture(offline_fraction=0.25, offline=uniform, online=refer(C=2.0))"),
    ("arb_transition", {"temperature": 2.0}, "arb(temperature=2.0, level=transition)")])
def test_old_names_expand_to_the_composition_everywhere(alias, settings, expected):
    """ReplayConfig.of, --replay NAME + --set replay.NAME.*, and a config.json of an earlier version (the alias's
    name and its options) all give the same expansion."""
    by_of = ReplayConfig.of(alias, **settings)
    by_set = override(get_preset("sac"), [f"replay.name={alias}"]
                      + [f"replay.{alias}.{k}={v}" for k, v in settings.items()]).replay
    old_json = config_from_dict({"replay": {"name": alias, "capacity": 1_000_000, alias: settings}}).replay
    assert by_of.label == by_set.label == old_json.label == expected
    assert by_of == dataclasses.replace(by_set, capacity=by_of.capacity) == old_json
    assert by_of.name == ALIASES[alias].target  # a config names only registered strategies


def test_an_old_flat_name_builds_the_sampler_it_built_before():
    """What symmetric_per built before it became a short name: uniform offline, PER online, IS annealed over the
    run (the golden grid test checks this for every built-in grid's runs)."""
    cfg = override(get_preset("sac"), ["replay.name=symmetric_per", "replay.symmetric_per.priority_exponent=0.7",
                                       "schedule.num_online_env_steps=2000", "schedule.num_warmup_env_steps=1000"])
    assert sampler_config(build_sampler(cfg)) == {
        "type": "MixtureSampler", "params": {
            "offline": {"type": "UniformSampler", "params": {}},
            "online": {"type": "PrioritizedSampler", "params": {
                "priority_exponent": 0.7, "is_exponent": 0.4, "is_exponent_final": 1.0, "is_anneal_samples": 2000,
                "eps": 1e-6, "initial_priority": 1.0}},
            "offline_fraction": 0.5}}


def test_old_option_names_and_checkpoints_still_load():
    # the CLI's replay.arb.amortized_rows is the sampler's amortized_rows_per_refresh (one setting, one field)
    cfg = override(get_preset("sac"), ["replay.name=arb", "replay.arb.amortized_rows=64"])
    assert cfg.replay.options == ARBConfig(amortized_rows_per_refresh=64)
    assert config_from_dict({"replay": {"name": "arb", "arb": {"amortized_rows": 8}}}).replay.options == \
        ARBConfig(amortized_rows_per_refresh=8)
    # a checkpoint written before records PER's params as its constructor resolved them (beta_final = beta, no
    # anneal): the record loads to the same settings
    old = {"type": "MixtureSampler", "params": {
        "offline": {"type": "UniformSampler", "params": {}}, "offline_fraction": 0.5,
        "online": {"type": "PrioritizedSampler", "params": {"priority_exponent": 0.6, "is_exponent": 0.4,
                                                             "is_exponent_final": 0.4, "is_anneal_samples": 0,
                                                             "eps": 1e-6, "initial_priority": 1.0}}}}
    loaded = sampler_from_config(old)
    assert loaded.online.options == PERConfig(0.6, 0.4, 0.4, 0) and sampler_config(loaded) == old | {
        "params": old["params"]}


def test_presets_show_lists_a_short_name_with_its_expansion(capsys):
    assert main(["presets", "--show", "symmetric_per"]) == 0
    out = capsys.readouterr().out
    assert "replay.name = mixture with online.name=per" in out
    assert "replay.mixture.online.per.priority_exponent = 0.6" in out
    assert main(["presets", "--show", "replays"]) == 0
    out = capsys.readouterr().out
    assert "mixture" in out and "symmetric_per" in out and "shorthand: mixture with online.name=per" in out


def test_a_sampler_without_settings_has_none():
    assert Sampler().config() == {} and UniformSampler().config() == {}


# -- offline-share schedules (issue 32, item 3) ---------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_an_offline_share_schedule_gives_its_formula_and_exact_counts(schedule):
    """f(t) over t = online rows stored: constant f0; linear f0 + min(t/T,1)(f1 - f0); cosine
    f1 + (f0 - f1)(1 + cos(pi min(t/T,1)))/2 -- checked on hand-made points, and every batch holds exactly
    round(B f(t)) offline rows."""
    from relive.replay import ReplayBuffer
    from relive.testing import random_transitions

    f0, f1, T, B = 0.75, 0.25, 100, 64
    expected = {"constant": {0: 0.75, 50: 0.75, 100: 0.75, 150: 0.75},
                "linear": {0: 0.75, 50: 0.5, 100: 0.25, 150: 0.25},
                "cosine": {0: 0.75, 50: 0.5, 25: 0.25 + 0.5 * (1 + np.cos(np.pi / 4)) / 2, 100: 0.25, 150: 0.25}}
    buf = ReplayBuffer(400, (3,), (1,), sampler=MixtureSampler(UniformSampler(), UniformSampler(), f0, schedule,
                                                               f1, T), seed=0)
    buf.add_offline(random_transitions(100, 3, 1, rng=0))
    stored = 0
    for t, f in sorted(expected[schedule].items()):
        if t > stored:
            buf.extend(random_transitions(t - stored, 3, 1, rng=t))
            stored = t
        if t == 0:
            continue  # (no online rows yet: the whole batch is offline)
        assert buf.sampler.current_fraction() == pytest.approx(f, abs=1e-12), (schedule, t)
        batch = buf.sample(B)
        assert (batch.info.source == 0).sum() == round(B * f), (schedule, t)
        assert buf.sampler.stats()["replay/offline_fraction"] == pytest.approx(f)


def test_a_schedule_from_the_command_line_runs_over_the_online_phase_and_survives_a_checkpoint(tmp_path):
    from relive.replay import ReplayBuffer
    from relive.testing import random_transitions

    cfg = override(get_preset("sac"), ["replay.name=symmetric", "replay.mixture.schedule=linear",
                                       "replay.mixture.offline_fraction_final=0.1",
                                       "schedule.num_online_env_steps=400"])
    sampler = build_sampler(cfg)
    assert (sampler.schedule, sampler.offline_fraction_final, sampler.schedule_steps) == ("linear", 0.1, 400)
    buf = ReplayBuffer(1000, (3,), (1,), sampler=sampler, seed=0)
    buf.add_offline(random_transitions(50, 3, 1, rng=0))
    buf.extend(random_transitions(200, 3, 1, rng=1))
    assert sampler.current_fraction() == pytest.approx(0.3)
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    assert loaded.sampler.current_fraction() == pytest.approx(0.3)
    np.testing.assert_array_equal(loaded.sample(32).info.indices, buf.sample(32).info.indices)
    with pytest.raises(ValueError, match="schedule must be one of"):
        override(cfg, ["replay.mixture.schedule=exponential"])


def test_a_schedule_from_the_intervention_rate_follows_the_recent_share_of_intervened_rows():
    """f = f1 + (f0 - f1) r, r = intervened share of the last W online rows (storage.meta["origin"]), all streams;
    exact counts per batch; rows before the window do not count."""
    from relive.replay import ReplayBuffer
    from relive.testing import random_transitions
    from relive.types import AGENT, INTERVENTION

    buf = ReplayBuffer(500, (3,), (1,), sampler=MixtureSampler(UniformSampler(), UniformSampler(), 0.8,
                                                               "intervention_rate", 0.2, 40), seed=0)
    buf.add_offline(random_transitions(50, 3, 1, rng=0))
    buf.extend(random_transitions(40, 3, 1, rng=1), origin=INTERVENTION)  # a person drove the first 40 steps
    assert buf.sampler.recent_intervention_rate() == 1.0
    assert buf.sampler.current_fraction() == pytest.approx(0.8)
    buf.extend(random_transitions(10, 3, 1, rng=2), stream=1, origin=AGENT)  # another stream: the window spans both
    assert buf.sampler.recent_intervention_rate() == pytest.approx(30 / 40)
    f = 0.2 + 0.6 * 30 / 40
    assert buf.sampler.current_fraction() == pytest.approx(f)
    assert (buf.sample(100).info.source == 0).sum() == round(100 * f)
    buf.extend(random_transitions(40, 3, 1, rng=3), origin=AGENT)  # the person's rows left the window
    assert buf.sampler.recent_intervention_rate() == 0.0 and buf.sampler.current_fraction() == pytest.approx(0.2)
    cfg = override(get_preset("sac"), ["replay.name=symmetric", "replay.mixture.schedule=intervention_rate",
                                       "replay.mixture.offline_fraction_final=0.1"])
    assert build_sampler(cfg).schedule_steps == 1000  # the default window


def test_per_source_parts_are_set_from_the_command_line_and_named_in_the_label_only_when_used(tmp_path):
    cfg = override(get_preset("hil_rlpd"), ["replay.mixture.demonstration_fraction=0.5",
                                            "replay.mixture.demonstrations.name=per",
                                            "replay.mixture.demonstrations.per.priority_exponent=0.8"])
    assert get_preset("hil_rlpd").replay.label == "mixture(offline=uniform, online=uniform)"
    assert "demonstrations=per(priority_exponent=0.8)" in cfg.replay.label
    save_config(cfg, tmp_path / "config.json")
    assert load_config(tmp_path / "config.json") == cfg
    sampler = build_sampler(cfg)
    assert sampler.demonstration_fraction == 0.5 and sampler.demonstrations.priority_exponent == 0.8
    assert [name for name, _ in sampler.parts()] == ["offline", "demonstrations", "online"]
    assert build_sampler(get_preset("hil_rlpd")).demonstrations is None  # one offline part unless asked
    with pytest.raises(ValueError, match="demonstration_fraction"):
        override(cfg, ["replay.mixture.demonstration_fraction=2"])
