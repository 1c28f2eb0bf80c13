"""Residual SAC (PLD stage 1): acting (warm-up, probing, clipping), the OTF target, the residual's log-prob in
the actor and temperature losses, beta schedules, the frozen base, Cal-QL pre-training, exact state, learning."""

import copy
import json
import math

import numpy as np
import pytest
import torch

from relive.agents import networks as nets
from relive.agents.residual_sac import ResidualSAC, ResidualSACConfig, beta_at, load_residual
from relive.envs import EnvSpec
from relive.hooks import OnEpisodeEnd, OnEpisodeStart, OnPhase
from relive.replay.buffer import ReplayBuffer
from relive.replay.checkpoint import load_tree, save_tree
from relive.types import Acted, Batch, SampleInfo, unpack_acted
from tests.agents.factory import ACT, HIGH, LOW, OBS, SMALL, B

HALF = (HIGH - LOW) / 2


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/agents/conftest.py


class LinearBase(torch.nn.Module):
    """A small fixed torch base policy: a = W x + b, called on NumPy arrays."""

    def __init__(self, seed=0, out_dim=ACT):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = torch.nn.Linear(OBS, out_dim)
        with torch.no_grad():
            self.lin.weight.copy_(0.3 * torch.randn(out_dim, OBS, generator=g))
            self.lin.bias.copy_(0.1 * torch.randn(out_dim, generator=g))

    def __call__(self, obs):
        with torch.no_grad():
            return self.lin(torch.as_tensor(obs, dtype=torch.float32)).numpy()


def make(seed=0, base=None, **overrides) -> ResidualSAC:
    cfg = ResidualSACConfig(**(dict(SMALL, warmup=0, probe_max_steps=0) | overrides))
    return ResidualSAC(OBS, ACT, LOW, HIGH, cfg, seed=seed, base_policy=base if base is not None else LinearBase())


def make_batch(seed=0, n=B, mc_return=True) -> Batch:
    rng = np.random.default_rng(seed)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n), np.ones(n, np.float32),
                      np.zeros(n, np.int8))
    extras = {"mc_return": rng.normal(size=n).astype(np.float32)} if mc_return else {}
    return Batch(obs=rng.normal(size=(n, OBS)).astype(np.float32),
                 action=rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32),
                 reward=rng.normal(size=n).astype(np.float32), next_obs=rng.normal(size=(n, OBS)).astype(np.float32),
                 terminated=rng.random(n) < 0.3, truncated=np.zeros(n, bool), info=info, extras=extras)


def obs_rows(n=1, seed=0):
    return np.random.default_rng(seed).normal(size=(n, OBS)).astype(np.float32)


def params(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


class FnCritic(torch.nn.Module):
    """A stand-in critic: member e returns fn(obs, action) + offsets[e]."""

    def __init__(self, fn, offsets):
        super().__init__()
        self.fn, self.offsets = fn, torch.as_tensor(offsets, dtype=torch.float32).view(-1, 1)

    def forward(self, obs, action):
        return self.fn(obs, action).unsqueeze(0) + self.offsets


# -- acting: init, clipping, warm-up, probing, evaluation -----------------------------------------------
def test_executed_action_equals_the_base_at_init():
    """Zero last layer: the deterministic residual is exactly 0 (a = clip(a_base)), and the initial std is small
    (init_log_std = -3: every sampled |a - a_base| < 5 sigma beta (high - low) / 2)."""
    agent, base = make(), LinearBase()
    obs = obs_rows(256)
    a_base = np.clip(base(obs), LOW, HIGH)
    np.testing.assert_array_equal(agent.act(obs, explore=False), a_base)
    a = unpack_acted(agent.act(obs, explore=True))[0]
    dev = np.abs(a - a_base)
    assert dev.max() < 5 * math.exp(-3.0) * 0.5 * HALF.max() and dev.max() > 0


def test_executed_action_is_clipped_to_the_bounds_and_records_its_parts():
    """A base far outside the box and beta = 1: every action is in the box and equals clip(base + beta delta)."""
    agent = make(base=lambda o: np.tile(np.array([[5.0, -0.95]], np.float32), (len(o), 1)), beta=1.0,
                 init_log_std=0.0)
    out = agent.act(obs_rows(500), explore=True)
    action, record, store = unpack_acted(out)
    assert store.all() and (action >= LOW).all() and (action <= HIGH).all()
    assert (action[:, 0] == HIGH[0]).all() and (action[:, 1] == LOW[1]).any()
    expected = np.clip(record["base_action"] + record["beta"][:, None] * record["delta_action"], LOW, HIGH)
    np.testing.assert_allclose(action, expected, rtol=0, atol=1e-6)
    assert (np.abs(record["delta_action"]) <= HALF).all()  # the residual lives in [-(high-low)/2, (high-low)/2]


def test_records_match_the_declared_columns():
    agent = make(calibrate=True)
    cols = {c.name: c for c in agent.stored_columns()}
    assert set(cols) == {"base_action", "delta_action", "beta", "mc_return"}
    assert all(cols[k].offline == "fill" and cols[k].fill == 0.0 for k in ("base_action", "delta_action", "beta"))
    assert cols["mc_return"].offline == "fill"  # the loader computes it from the rewards
    assert "mc_return" not in {c.name for c in make(calibrate=False).stored_columns()}
    _, record, _ = unpack_acted(agent.act(obs_rows(3), explore=True))
    for name in ("base_action", "delta_action", "beta"):
        assert record[name].shape == (3, *cols[name].shape) and record[name].dtype == np.float32


@pytest.mark.parametrize("unit", ["steps", "episodes"])
def test_warmup_acts_with_the_base_and_is_stored(unit):
    """warmup = 4 steps, or 2 episodes of 2 steps: those actions equal the base's, with delta = beta = 0 and
    store=True even with probing on (warm-up episodes are stored whole); afterwards steps probe or act with the
    residual (beta recorded)."""
    base = LinearBase()
    agent = make(base=base, warmup=4 if unit == "steps" else 2, warmup_unit=unit, probe_max_steps=1)
    after = []
    for step in range(12):
        if step % 2 == 0:
            agent.on_episode_start()
        obs = obs_rows(1, seed=step)
        action, record, store = unpack_acted(agent.act(obs, explore=True))
        if step < 4:
            np.testing.assert_array_equal(action, np.clip(base(obs), LOW, HIGH))
            assert store.all() and record["beta"][0] == 0 and not record["delta_action"].any()
        else:
            after.append((bool(store.all()), float(record["beta"][0])))
    assert set(after) == {(False, 0.0), (True, 0.5)}  # probing and residual steps, nothing else
    assert agent.num_env_steps + agent.num_probe_steps == 12 and agent.num_probe_steps == after.count((False, 0.0))


def test_probing_steps_are_base_only_and_never_stored():
    """Each episode: h ~ U{0..H_probe} from the agent's generator; the first h steps are the base's and are
    returned with store=False (counted in num_probe_steps, not in the beta / warm-up clock); then residual."""
    h_max, base = 3, LinearBase()
    agent = make(base=base, probe_max_steps=h_max)
    draws = copy.deepcopy(agent.rng)
    seen_h, stored = [], 0
    for episode in range(40):
        agent.on_episode_start()
        h = int(draws.integers(0, h_max + 1))
        seen_h.append(h)
        for t in range(6):
            obs = obs_rows(1, seed=100 * episode + t)
            action, record, store = unpack_acted(agent.act(obs, explore=True))
            assert store.all() == (t >= h)
            if t < h:
                np.testing.assert_array_equal(action, np.clip(base(obs), LOW, HIGH))
            else:
                assert record["beta"][0] == 0.5
            stored += int(store.all())
    assert set(seen_h) == set(range(h_max + 1))
    assert agent.num_probe_steps == sum(seen_h) and agent.num_env_steps == stored == 40 * 6 - sum(seen_h)


def test_evaluation_never_probes_and_never_advances_the_episode():
    agent, base = make(probe_max_steps=50, warmup=0), LinearBase()
    agent.set_base_policy(base)
    with torch.no_grad():
        agent.actor.trunk[-1].bias[:ACT] = 1.0  # a residual that is visibly non-zero: tanh(1)
    for env in range(4):  # row i of an act call is env i
        agent.on_episode_start(env)
    agent.probe_steps[:] = 10
    obs = obs_rows(4)
    a = agent.act(obs, explore=False)
    assert isinstance(a, np.ndarray) and (agent.episode_step.tolist(), agent.num_env_steps) == ([0] * 4, 0)
    np.testing.assert_allclose(a, np.clip(base(obs) + 0.5 * HALF * np.tanh(1.0), LOW, HIGH), atol=1e-6)
    assert not unpack_acted(agent.act(obs, explore=True))[2].any()  # while exploring, step 0 < h probes


def test_loop_hooks_reach_the_agent():
    agent = make(probe_max_steps=5)
    hooks = agent.loop_hooks(None)
    on_phase = next(h for h in hooks if isinstance(h, OnPhase))
    on_start = next(h for h in hooks if isinstance(h, OnEpisodeStart))
    on_phase.fn("offline")
    assert agent.phase == "offline"
    assert on_start.per_env
    on_start.fn(1)
    assert agent.num_episodes == 1 and agent.episode_step.tolist() == [0, 0] and agent.episode_index.tolist() == [0, 1]
    with pytest.raises(ValueError, match="phase must be one of"):
        on_phase.fn("test")


# -- beta schedules -------------------------------------------------------------------------------------
# the PLD implementation spec's §13 configuration template, transcribed; actor_every from its §10.2 loop
SPEC_TEMPLATE = {"gamma": 0.99, "tau": 0.005, "otf_candidates": 8, "warmup": 1000, "warmup_unit": "steps",
                 "probe_max_steps": 50, "beta_schedule": "constant", "beta": 0.5, "init_temperature": 0.1,
                 "target_entropy": None, "actor_lr": 3e-4, "critic_lr": 3e-4, "temp_lr": 3e-4, "actor_every": 1,
                 "residual_input": "obs", "pretrain_target": "sac"}  # §1.2's dpi(delta_a | x), §8.1's SAC target


def test_defaults_are_the_spec_template():
    """Issue 28 items 1, 3, 4: OTF with K = 8 (not K = 1, SAC's target), actor every step, and the rest of §13."""
    cfg = ResidualSACConfig()
    assert {k: getattr(cfg, k) for k in SPEC_TEMPLATE} == SPEC_TEMPLATE
    assert make(hidden=(8, 8)).target_entropy == -ACT  # -|A|
    table5 = ResidualSACConfig.table5(beta=0.3)
    assert (table5.actor_every, table5.warmup, table5.warmup_unit, table5.init_temperature, table5.beta) == \
        (2, 100, "episodes", 1.0, 0.3)


def test_residual_sac_preset_is_the_spec_template_and_names_its_sources(capsys):
    """`relive presets --show residual_sac`: the §13 values (batch 256, 1 gradient step per stored env step, no
    random warm-up, symmetric 50/50, capacity 1e6) and, for each, where it comes from."""
    from relive.presets import get_preset
    from relive.train.cli import show

    cfg = get_preset("residual_sac")
    assert {k: getattr(cfg.agent, k) for k in SPEC_TEMPLATE} == SPEC_TEMPLATE
    s = cfg.schedule
    assert (s.batch_size, s.utd_ratio, s.grad_steps_per_chunk, s.num_warmup_env_steps) == (256, 1, 0, 0)
    assert (cfg.replay.label, cfg.replay.options.offline_fraction, cfg.replay.capacity) == (
        "mixture(offline=uniform, online=uniform)", 0.5, 10**6)  # symmetric 50/50
    assert show("residual_sac") == 0
    out = capsys.readouterr().out
    head, lines = out.split("\n", 1)[0], {ln.split(" = ")[0]: ln for ln in out.splitlines() if " = " in ln}
    for phrase in ("§13", "gamma 0.99", "tau 0.005", "batch 256", "K = 8", "1 gradient step per stored env step",
                   "warm-up 1000 steps of base-only acting", "H_probe 50", "beta constant 0.5", "alpha init 0.1",
                   "target entropy -|A|", "learning rates 3e-4", "§10.2", "Table 5"):
        assert phrase in head, phrase
    for key in ("otf_candidates", "actor_every", "gamma", "tau", "actor_lr", "critic_lr", "temp_lr", "warmup",
                "probe_max_steps", "beta_schedule", "beta", "init_temperature", "target_entropy"):
        assert "spec §" in lines[f"agent.{key}"], lines[f"agent.{key}"]
    # issue 46 item 2: the residual's input and the pre-training target, each with its section number
    assert 'agent.residual_input = "obs"' in out and "spec §1.2" in lines["agent.residual_input"]
    assert 'agent.pretrain_target = "sac"' in out and "spec §8.1" in lines["agent.pretrain_target"]
    for phrase in ("§1.2", "dpi(delta_a | x)", "§8.1", "standard SAC / clipped-double-Q target"):
        assert phrase in head, phrase


@pytest.mark.parametrize("grid", ["pld", "pld-pendulum", "pld-reacher"])
def test_pld_grids_run_full_pld_at_k8_with_k1_and_k4_ablations(grid):  # (pld-metaworld has no K ablation)
    """The grids' "pld" variant is the spec's PLD (K = 8, actor every step); K = 1 (SAC's target) and K = 4 are the
    ablations (issue 28 item 1: the earlier "full PLD" ran K = 1)."""
    from relive.cli import build_parser
    from relive.experiments.grid import load_grid
    from relive.train.cli import config_from_args

    g = load_grid(grid)
    runs = {r.label: r for r in g.runs() if r.seed == 0}
    assert "pld-K8" not in runs and {"pld", "pld-K1", "pld-K4"} <= set(runs)
    ks = {}
    for label in ("pld", "pld-K1", "pld-K4"):
        r = runs[label]
        cfg = config_from_args(build_parser().parse_args(["train", r.preset, "--env", r.task, *r.args]))
        ks[label] = cfg.agent.otf_candidates
        assert cfg.agent.actor_every == 1 and cfg.schedule.utd_ratio == 1
    assert ks == {"pld": 8, "pld-K1": 1, "pld-K4": 4}
    assert "K = 8" in g.description and "K = 1 (SAC's target)" in g.description


PLD_GRIDS = ["pld", "pld-pendulum", "pld-reacher", "pld-metaworld"]
# issue 46 item 3: every cell at section 13's values (and the preset's where the spec is silent), but for the
# setting its label names; the ablations named here may differ in these settings and no others
SECTION_13 = {"agent.probe_max_steps": 50, "agent.warmup": 1000, "agent.hidden": (256, 256), "agent.cql_n_actions": 10,
              "schedule.num_offline_grad_steps": 5000, "agent.residual_input": "obs", "agent.pretrain_target": "sac"}
NAMED = {"base": {"schedule.num_offline_grad_steps"},  # beta = 0: the base alone, nothing it would pre-train is used
         "pld-no-probe": {"agent.probe_max_steps"}, "pld-no-calql": {"schedule.num_offline_grad_steps"},
         "pld-H8": {"agent.probe_max_steps"}, "pld-paper-input": {"agent.residual_input"},
         "pld-otf-pretrain": {"agent.pretrain_target"}, "pld-old": set(SECTION_13)}


def _setting(cfg, key):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@pytest.mark.parametrize("grid", PLD_GRIDS)
def test_pld_grid_cells_run_section_13s_values_and_name_every_override(grid):
    """A cell differs from section 13 (H_probe 50, warm-up 1000) and the preset's widths 256, 5,000 Cal-QL steps
    with 10 actions, only in what its label names (the old settings survive as the `pld-old` cell)."""
    from relive.cli import build_parser
    from relive.experiments.grid import load_grid
    from relive.train.cli import config_from_args

    runs = [r for r in load_grid(grid).runs() if r.seed == 0 and r.preset == "residual_sac"]
    assert {"pld", "pld-old", "pld-paper-input"} <= {r.label for r in runs}
    for r in runs:
        cfg = config_from_args(build_parser().parse_args(["train", r.preset, "--env", r.task, *r.args]))
        differs = {k for k, want in SECTION_13.items() if _setting(cfg, k) != want}
        assert differs <= NAMED.get(r.label, set()), (r.label, differs)
        if r.label in ("pld-H8", "pld-paper-input", "pld-otf-pretrain", "pld-old"):
            assert differs, r.label  # an ablation that no longer differs names nothing


def test_beta_schedules_give_their_formulas():
    const = ResidualSACConfig(beta=0.3)
    assert [beta_at(const, t) for t in (0, 10, 10**6)] == [0.3] * 3
    lin = ResidualSACConfig(beta_schedule="linear", beta=0.5, beta_ramp_steps=100)  # min(beta, beta t / T)
    assert [beta_at(lin, t) for t in (0, 25, 100, 1000)] == pytest.approx([0.0, 0.125, 0.5, 0.5])
    lin0 = ResidualSACConfig(beta_schedule="linear", beta=0.3, beta_start=0.01, beta_ramp_steps=400)
    assert beta_at(lin0, 200) == pytest.approx(0.01 + 0.29 * 0.5)
    step = ResidualSACConfig(beta_schedule="stepwise", beta_boundaries=(10, 20), beta_values=(0.1, 0.2, 0.4))
    assert [beta_at(step, t) for t in (0, 9, 10, 19, 20, 500)] == [0.1, 0.1, 0.2, 0.2, 0.4, 0.4]
    agent = make(beta_schedule="linear", beta=0.5, beta_ramp_steps=4)  # the agent's clock: stored env steps
    betas = [unpack_acted(agent.act(obs_rows(1), explore=True))[1]["beta"][0] for _ in range(6)]
    assert betas == pytest.approx([0.0, 0.125, 0.25, 0.375, 0.5, 0.5])


@pytest.mark.parametrize("bad, match", [
    (dict(beta_schedule="cosine"), "beta_schedule must be one of"),
    (dict(beta_schedule="stepwise", beta_boundaries=(10,), beta_values=(0.1,)), "len\\(beta_values\\)"),
    (dict(beta_schedule="stepwise", beta_boundaries=(20, 10), beta_values=(0.1, 0.2, 0.3)), "strictly increasing"),
    (dict(beta=-0.1), "beta values must be >= 0"),
    (dict(num_qs=1), "clipped double Q"),
    (dict(otf_candidates=0), "otf_candidates"),
    (dict(warmup_unit="minutes"), "warmup_unit"),
    (dict(residual_input="base"), "residual_input must be one of"),
    (dict(pretrain_target="max"), "pretrain_target must be one of"),
])
def test_bad_config_is_a_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        ResidualSACConfig(**bad)


# -- the residual's input (spec §1.2) and the pre-training target (spec §8.1) -----------------------------
def randomize_head(agent, seed=0):
    """A non-zero last actor layer (the zero init makes every input give delta = 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in agent.actor.trunk[-1].parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("residual_input, reads_base", [("obs", False), ("obs+base_action", True)])
def test_the_residual_reads_the_observation_alone_by_default(residual_input, reads_base):
    """Spec §1.2: delta_a ~ dpi_phi(. | x) -- the same observation with two different base actions gives the same
    residual (same generator state); "obs+base_action" (the PLD paper's) gives different ones."""
    assert ResidualSACConfig().residual_input == "obs"
    agent = make(residual_input=residual_input)
    randomize_head(agent)
    assert agent.actor.trunk[0].in_features == OBS + (ACT if reads_base else 0)
    obs = torch.as_tensor(obs_rows(4))
    state = agent.gen.get_state()
    d1, lp1 = agent.residual(obs, torch.zeros(4, ACT))
    agent.gen.set_state(state)
    d2, lp2 = agent.residual(obs, torch.full((4, ACT), 0.7))
    assert torch.equal(d1, d2) == (not reads_base) and torch.equal(lp1, lp2) == (not reads_base)


def soft_values(agent, next_obs, k, state, alpha):
    """min_e Qbar_e(x', a'_k) - alpha log dpi(delta_k) of the K candidates the target draws from ``state``: [B, K]."""
    base, delta, logp = redraw_candidates(agent, next_obs, k, state)
    a = torch.clamp(base + agent.beta() * delta, agent.low_t, agent.high_t).view(-1, ACT)
    q = agent.target_critic(next_obs.repeat_interleave(k, dim=0), a).min(dim=0).values.view(-1, k)
    return q - alpha * logp


@pytest.mark.parametrize("target", ["sac", "otf_max"])
def test_pretraining_target_is_sacs_by_default_and_the_otf_max_by_name(target):
    """Spec §8.1: the Cal-QL pre-training's TD term bootstraps r + gamma (1 - d) [min_i Qbar_i(x', a') - alpha log
    pi(a'|x')] with ONE a' ~ pi(.|x') (the standard SAC / CDQ target), not the online OTF max over K candidates;
    ``pretrain_target = "otf_max"`` keeps that max. Recomputed here by hand from the generator state (K = 6)."""
    agent = make(otf_candidates=6, init_temperature=0.8, init_log_std=-0.5, pretrain_target=target)
    randomize_head(agent, seed=2)
    agent.on_phase("offline")
    b = make_batch(seed=5)
    t = b.to_torch()
    state = agent.gen.get_state()
    k = 1 if target == "sac" else 6
    alpha = agent.alpha.item()
    soft = soft_values(agent, t.next_obs, k, state, alpha)
    expected = t.reward + 0.99 * (1 - t.terminated.float()) * soft.max(dim=1).values
    agent.gen.set_state(state)
    metrics = agent.update(b).metrics
    assert metrics["train/target_mean"] == pytest.approx(expected.mean().item(), rel=1e-5)
    other = soft_values(agent, t.next_obs, 6 if target == "sac" else 1, state, alpha)  # the other target differs
    other_y = t.reward + 0.99 * (1 - t.terminated.float()) * other.max(dim=1).values
    assert abs(other_y.mean().item() - expected.mean().item()) > 1e-3


@pytest.mark.parametrize("old, residual_input", [(True, "obs+base_action"), (False, "obs")])
def test_a_config_json_from_before_issue_46_keeps_what_it_ran(old, residual_input):
    """A run directory written with ``condition_on_base`` (every config.json before issue 46) resumes, evaluates and
    exports with the residual input and the pre-training target it trained with."""
    from relive.config import config_from_dict
    from relive.presets import get_preset

    d = get_preset("residual_sac").to_dict()
    agent = {k: v for k, v in d["agent"].items() if k not in ("residual_input", "pretrain_target")}
    cfg = config_from_dict(d | {"agent": agent | {"condition_on_base": old}})
    assert (cfg.agent.residual_input, cfg.agent.pretrain_target) == (residual_input, "otf_max")
    today = config_from_dict(d)  # today's files say both and are read as written
    assert (today.agent.residual_input, today.agent.pretrain_target) == ("obs", "sac")
    with pytest.raises(ValueError, match="unknown setting"):  # the old name is not a setting of today's configs
        config_from_dict(d | {"agent": d["agent"] | {"condition_on_bass": True}})


# -- the OTF target -------------------------------------------------------------------------------------
def redraw_candidates(agent, next_obs, k, state):
    """From the generator state ``state``: the K residual candidates at x' the target draws, as [B, K, ...]."""
    agent.gen.set_state(state)
    base = agent._base_t(next_obs).repeat_interleave(k, dim=0)
    delta, logp = agent.residual(next_obs.repeat_interleave(k, dim=0), base)
    n = next_obs.shape[0]
    return base.view(n, k, ACT), delta.view(n, k, ACT), logp.view(n, k)


def test_otf_target_is_the_max_over_k_of_the_soft_values():
    """Hand-made critic Q_e(x, a) = -|a - 0.2|^2 + c_e: y = r + gamma (1 - d) max_k (min_e Q_e(x', a'_k) - alpha
    log dpi(delta_k)), computed here candidate by candidate; it is >= every single candidate's backup and differs
    from the backup of the candidate with the largest Q (the max is over soft values, not Q)."""
    agent = make(otf_candidates=5, init_temperature=2.0, init_log_std=-0.5, beta=1.0)
    agent.target_critic = FnCritic(lambda o, a: -((a - 0.2) ** 2).sum(-1), [1.0, -0.5])
    b = make_batch().to_torch()
    next_base = agent._base_t(b.next_obs)
    state = agent.gen.get_state()
    y = agent.critic_target(b.reward, b.next_obs, next_base, b.terminated, beta=1.0)
    base, delta, logp = redraw_candidates(agent, b.next_obs, 5, state)
    soft = torch.empty(B, 5)
    for k in range(5):
        a_k = torch.clamp(base[:, k] + 1.0 * delta[:, k], agent.low_t, agent.high_t)
        soft[:, k] = -((a_k - 0.2) ** 2).sum(-1) - 0.5 - 2.0 * logp[:, k]  # min over c_e = -0.5
    expected = b.reward + 0.99 * (1 - b.terminated) * soft.max(dim=1).values
    torch.testing.assert_close(y, expected)
    q_only = soft + 2.0 * logp  # the candidates' Q values
    by_q = soft.gather(1, q_only.argmax(dim=1, keepdim=True)).squeeze(1)
    assert (soft.max(dim=1).values >= by_q).all() and (soft.max(dim=1).values > by_q + 1e-3).any()


def test_otf_with_one_candidate_is_sacs_target():
    """K = 1: y = r + gamma (1 - d) (min_e Qbar_e(x', a') - alpha log dpi(delta'|x', a_base')), a single a'."""
    agent = make(otf_candidates=1, init_temperature=0.7, init_log_std=-1.0)
    agent.target_critic = FnCritic(lambda o, a: o[:, 0] * a[:, 0] - a[:, 1], [0.3, 0.1])
    b = make_batch(seed=3).to_torch()
    next_base = agent._base_t(b.next_obs)
    state = agent.gen.get_state()
    y = agent.critic_target(b.reward, b.next_obs, next_base, b.terminated, beta=0.5)
    agent.gen.set_state(state)
    delta, logp = agent.residual(b.next_obs, next_base)
    a = torch.clamp(next_base + 0.5 * delta, agent.low_t, agent.high_t)
    v = b.next_obs[:, 0] * a[:, 0] - a[:, 1] + 0.1 - 0.7 * logp
    torch.testing.assert_close(y, b.reward + 0.99 * (1 - b.terminated) * v)


def test_critic_step_regresses_every_member_on_y_and_moves_the_targets_by_tau():
    """(13) critic loss = mean over members and samples of (Q_e(x, a) - y)^2 (constant members c_e here);
    (15) after the step Qbar = (1 - tau) Qbar_before + tau Q_after, parameter by parameter."""
    agent = make(tau=0.1)
    with torch.no_grad():
        head = agent.critic.net[-1]
        head.weight.zero_()
        head.bias.copy_(torch.tensor([1.5, -0.5]).view(-1, 1, 1))
    b = make_batch(seed=6)
    tb = b.to_torch()
    state = agent.gen.get_state()
    y = agent.critic_target(tb.reward, tb.next_obs, agent._base_t(tb.next_obs), tb.terminated, agent.beta())
    agent.gen.set_state(state)
    target_before = params(agent.target_critic)
    res = agent.update(b)
    expected = 0.5 * (((1.5 - y) ** 2).mean() + ((-0.5 - y) ** 2).mean())
    assert res.metrics["train/critic_loss"] == pytest.approx(expected.item(), rel=1e-5)
    np.testing.assert_allclose(res.signals["td_error"], (0.5 - y).numpy(), rtol=1e-5, atol=1e-5)
    for t0, t1, q in zip(target_before, params(agent.target_critic), params(agent.critic), strict=True):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * q)


def test_truncation_never_stops_the_bootstrap():
    results = []
    for trunc, term in ((False, False), (True, False), (False, True)):
        agent = make()
        b = make_batch(seed=1)
        b = Batch(b.obs, b.action, b.reward, b.next_obs, np.full(B, term), np.full(B, trunc), b.info, b.extras)
        agent.update(b)
        results.append(torch.cat([p.flatten() for p in params(agent.critic)]))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert not torch.allclose(results[0], results[2])


# -- the actor's and the temperature's log-prob ---------------------------------------------------------
def actor_input(agent, obs, base):
    """What the residual actor reads: x (spec §1.2, the default) or (x, a_base) ("obs+base_action")."""
    return torch.cat([obs, base], dim=-1) if agent.cfg.residual_input == "obs+base_action" else obs


def residual_log_prob(agent, obs, base, u):
    """log dpi(delta | x[, a_base]) of delta = half tanh(u), from the actor's Gaussian, independently of sample()."""
    mean, log_std = agent.actor(actor_input(agent, obs, base))
    return (nets.tanh_gaussian_log_prob(mean, log_std, u) - torch.log(agent.actor.scale)).sum(-1)


@pytest.mark.parametrize("residual_input", ["obs", "obs+base_action"])
def test_actor_entropy_term_is_the_residuals_log_prob(residual_input):
    """With a critic that ignores the action, the actor loss is alpha log dpi(delta | x, a_base): its value and its
    gradient match the residual's log-density recomputed from the same noise, and they do not depend on beta (a
    density of the executed action would carry -|A| log beta)."""
    losses, grads = [], []
    for beta in (0.1, 0.9):
        agent = make(init_temperature=0.4, init_log_std=-0.7, residual_input=residual_input)
        with torch.no_grad():  # a non-trivial residual mean
            agent.actor.trunk[-1].weight.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
        agent.critic = FnCritic(lambda o, a: 0.0 * a.sum(-1) + o[:, 0], [0.0, 0.0])
        b = make_batch(seed=2).to_torch()
        base = agent._base_t(b.obs)
        state = agent.gen.get_state()
        per_sample, logp = agent.actor_loss(b.obs, base, beta)
        agent.gen.set_state(state)
        mean, log_std = agent.actor(actor_input(agent, b.obs, base))
        eps = torch.randn(mean.shape, generator=agent.gen)
        u = mean + log_std.exp() * eps
        expected = 0.4 * residual_log_prob(agent, b.obs, base, u) - b.obs[:, 0]
        torch.testing.assert_close(per_sample, expected)
        g = torch.autograd.grad(per_sample.mean(), list(agent.actor.parameters()))
        g_expected = torch.autograd.grad(expected.mean(), list(agent.actor.parameters()))
        for x, y in zip(g, g_expected, strict=True):
            torch.testing.assert_close(x, y)
        losses.append(per_sample.detach())
        grads.append(torch.cat([x.flatten() for x in g]))
    torch.testing.assert_close(losses[0], losses[1])
    torch.testing.assert_close(grads[0], grads[1])


def test_temperature_loss_uses_the_residuals_log_prob():
    """d/d log(alpha) of -alpha (log dpi + H_tgt) = -alpha (log dpi + H_tgt), H_tgt = -|A|."""
    agent = make(init_temperature=0.3)
    logp = torch.tensor([1.0, -2.0, 0.5])
    loss = agent.temperature_loss(logp).mean()
    (g,) = torch.autograd.grad(loss, [agent.log_alpha])
    assert agent.target_entropy == -ACT
    assert g.item() == pytest.approx(-0.3 * (logp + agent.target_entropy).mean().item(), rel=1e-5)


def test_the_update_is_sacs_where_the_arithmetic_is_the_same():
    """Issue 48 item 3: the TD loss (13), the temperature loss (18), alpha and the n-step discount are SAC's own
    functions (bench/residual_sac_fingerprint.py checks the update bit for bit against the code before sharing)."""
    from relive.agents.sac import SAC

    assert ResidualSAC.td_loss is SAC.td_loss and ResidualSAC.temperature_loss is SAC.temperature_loss
    assert ResidualSAC.alpha is SAC.alpha and ResidualSAC._discount is SAC._discount


def test_optimize_clips_the_gradient_norm_of_the_optimizers_parameters():
    """(14), (17): ``nets.optimize(opt, loss, max_grad_norm)`` = zero_grad, backward, clip_grad_norm_, step -- the
    same parameters as a hand-written clipped step; 0 leaves the gradient alone."""
    def step(max_grad_norm, by_hand):
        torch.manual_seed(0)
        net = torch.nn.Linear(3, 2)
        opt = nets.adam(net.parameters(), 1e-2)
        loss = (100.0 * net(torch.ones(4, 3))).pow(2).mean()
        if by_hand:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
            opt.step()
        else:
            nets.optimize(opt, loss, max_grad_norm)
        return [p.detach().clone() for p in net.parameters()]

    for clip in (0.0, 1.0):
        for a, b in zip(step(clip, False), step(clip, True), strict=True):
            assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(step(0.0, False), step(1.0, False), strict=True))


def test_actor_and_temperature_step_at_every_critic_step_by_default():
    """The spec's loop (§10.2) and template update the actor and alpha at every gradient step (issue 28 item 3)."""
    agent = make()
    alpha = agent.alpha.item()
    for step in range(1, 4):
        res = agent.update(make_batch(seed=step))
        assert "train/actor_loss" in res.metrics and "train/alpha" in res.metrics
    assert (agent.num_critic_steps, agent.num_actor_steps) == (3, 3) and agent.alpha.item() != alpha


def test_actor_steps_every_second_critic_step():
    """PLD Table 5's critic-to-actor ratio 2, kept as an option: ``ResidualSACConfig.table5()``."""
    assert ResidualSACConfig.table5().actor_every == 2
    agent = make(actor_every=2)
    for step in range(1, 5):
        res = agent.update(make_batch(seed=step))
        assert ("train/actor_loss" in res.metrics) == (step % 2 == 0)
        assert res.signals["td_error"].shape == (B,) and np.isfinite(res.signals["td_error"]).all()
    assert (agent.num_critic_steps, agent.num_actor_steps) == (4, 2)


@pytest.mark.parametrize("phase", ["online", "offline"])
def test_zero_is_weight_rows_do_not_influence_the_update(phase):
    """is_weight 0 on half the batch: replacing those rows by other data gives bit-identical parameters (critic,
    actor, temperature; Cal-QL's gap offline); replacing a weighted row does not."""
    w = np.r_[np.ones(B // 2), np.zeros(B // 2)].astype(np.float32)

    def with_rows(b, other, rows):
        cols = {}
        for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
            x = np.array(getattr(b, k), copy=True)
            x[rows] = getattr(other, k)[rows]
            cols[k] = x
        mc = np.array(b.mc_return, copy=True)
        mc[rows] = other.mc_return[rows]
        info = SampleInfo(b.info.indices, b.info.generation, b.info.probability, w, b.info.source)
        return Batch(**cols, info=info, extras={"mc_return": mc})

    b1, b2 = make_batch(seed=1), make_batch(seed=2)
    results = []
    for rows in (np.arange(B // 2, B), np.arange(B // 2), None):
        agent = make()
        agent.on_phase(phase)
        agent.update(with_rows(b1, b1 if rows is None else b2, np.arange(B // 2, B) if rows is None else rows),
                     **({"update_actor": True} if phase == "online" else {}))
        results.append(torch.cat([p.flatten() for m in (agent.actor, agent.critic) for p in m.parameters()]
                                 + [agent.log_alpha.detach().reshape(1)]))
    torch.testing.assert_close(results[0], results[2], rtol=0, atol=0)  # zero-weight rows swapped: no change
    assert not torch.allclose(results[1], results[2])  # weighted rows swapped: a different update


def test_no_global_rng_is_read_or_advanced():
    base = LinearBase()  # (building the test's nn.Linear draws from the global RNG; the agent must not)
    torch.manual_seed(123)
    np.random.seed(123)  # noqa: NPY002 (the test checks the agent leaves the global RNG alone)
    torch_state, np_state = torch.random.get_rng_state(), np.random.get_state()[1].copy()  # noqa: NPY002
    agent = make(base=base, probe_max_steps=3, otf_candidates=2)
    agent.on_episode_start()
    agent.act(obs_rows(2), explore=True)
    agent.update(make_batch(), update_actor=True)
    agent.on_phase("offline")
    agent.update(make_batch())
    assert torch.equal(torch.random.get_rng_state(), torch_state)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)  # noqa: NPY002


def test_bad_batches_are_rejected():
    agent = make()
    b = make_batch()
    bad = Batch(b.obs[:, :3], b.action, b.reward, b.next_obs, b.terminated, b.truncated, b.info, b.extras)
    with pytest.raises(ValueError, match="batch.obs must have shape"):
        agent.update(bad)
    bad = Batch(b.obs, b.action[:, :1], b.reward, b.next_obs, b.terminated, b.truncated, b.info, b.extras)
    with pytest.raises(ValueError, match="batch.action must have shape"):
        agent.update(bad)
    with pytest.raises(ValueError, match="obs must have shape"):
        agent.act(np.zeros((2, OBS + 1), np.float32), explore=True)


# -- the frozen base ------------------------------------------------------------------------------------
def test_base_parameters_are_bit_identical_after_training():
    base = LinearBase()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    agent = make(base=base)
    actor_before = params(agent.actor)
    owned = {id(p) for opt in (agent.actor_opt, agent.critic_opt, agent.alpha_opt)
             for g in opt.param_groups for p in g["params"]}
    assert not owned & {id(p) for p in base.parameters()}
    agent.on_phase("offline")
    for step in range(3):
        agent.update(make_batch(seed=step))
    agent.on_phase("online")
    for step in range(4):
        agent.update(make_batch(seed=10 + step))
        agent.act(obs_rows(2), explore=True)
    for k, v in base.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
        assert base.lin.weight.grad is None
    assert any(not torch.equal(a, b) for a, b in zip(actor_before, params(agent.actor), strict=True))


def test_a_base_policy_with_the_wrong_shape_is_refused():
    agent = make()
    with pytest.raises(ValueError, match=r"actions \[N, 2\].*shape \(2, 3\)"):
        agent.set_base_policy(LinearBase(out_dim=3))
    with pytest.raises(ValueError, match="must be callable"):
        agent.set_base_policy("policy.pt")
    spec = EnvSpec("Toy-v0", (OBS,), False, (ACT,), 0, LOW, HIGH, 10)
    with pytest.raises(ValueError, match=r"actions \[N, 2\]"):
        ResidualSAC.from_spec(spec, ResidualSACConfig(**SMALL), np.random.SeedSequence(0),
                              base_policy=lambda o: np.zeros((len(o),), np.float32))
    with pytest.raises(ValueError, match="needs a frozen base policy: --base-policy PATH"):
        ResidualSAC.from_spec(spec, ResidualSACConfig(**SMALL), np.random.SeedSequence(0))
    no_base = ResidualSAC(OBS, ACT, LOW, HIGH, ResidualSACConfig(**SMALL))
    with pytest.raises(ValueError, match="no base policy"):
        no_base.act(obs_rows(1), explore=True)


def test_from_spec_loads_the_base_policy_named_in_the_config(monkeypatch):
    """config.base_policy = PATH: from_spec calls relive.agents.base_policy.load_base_policy(PATH, spec) (a stand-in
    module here, so the test does not depend on the loader's branch); a wrong shape from it is refused."""

    spec = EnvSpec("Toy-v0", (OBS,), False, (ACT,), 0, LOW, HIGH, 10)
    calls = []
    monkeypatch.setattr("relive.agents.residual_sac.load_base_policy",
                        lambda path, s, trusted=False: calls.append((path, s)) or LinearBase(out_dim=int(path[-1])))
    agent = ResidualSAC.from_spec(spec, ResidualSACConfig(**SMALL, base_policy="dir/base2"), np.random.SeedSequence(0))
    assert calls == [("dir/base2", spec)]
    np.testing.assert_array_equal(agent.act(obs_rows(3), explore=False), np.clip(LinearBase()(obs_rows(3)), LOW, HIGH))
    with pytest.raises(ValueError, match=r"actions \[N, 2\]"):
        ResidualSAC.from_spec(spec, ResidualSACConfig(**SMALL, base_policy="dir/base3"), np.random.SeedSequence(0))
    discrete = EnvSpec("Toy-v1", (OBS,), True, (), 3, None, None, 10)
    with pytest.raises(ValueError, match="flat Box observations and actions"):
        ResidualSAC.from_spec(discrete, ResidualSACConfig(**SMALL, base_policy="dir/base2"), np.random.SeedSequence(0))


# -- Cal-QL critic initialization -----------------------------------------------------------------------
def test_offline_phase_trains_the_critic_only_with_the_calibrated_gap():
    """OnPhase("offline"): update() is the Cal-QL critic step; actor and temperature do not move; the loss is
    TD + cql_alpha * gap (cql_alpha = 0 gives the TD loss alone); mc_return is required when calibrating."""
    agent = make(cql_alpha=2.0, cql_n_actions=3)
    agent.on_phase("offline")
    actor_before, alpha_before = params(agent.actor), agent.log_alpha.item()
    res = agent.update(make_batch())
    m = res.metrics
    assert m["train/critic_loss"] == pytest.approx(m["train/td_loss"] + 2.0 * m["train/cql_gap"], rel=1e-5)
    assert (agent.num_pretrain_steps, agent.num_critic_steps, agent.num_actor_steps) == (1, 0, 0)
    assert all(torch.equal(a, b) for a, b in zip(actor_before, params(agent.actor), strict=True))
    assert agent.log_alpha.item() == alpha_before
    with pytest.raises(ValueError, match="mc_return"):
        agent.update(make_batch(mc_return=False))
    plain = make(calibrate=False, cql_n_actions=3)
    plain.pretrain_critic(make_batch(mc_return=False))  # plain CQL needs no returns-to-go


def test_calibration_lifts_the_policy_values_to_the_returns_to_go():
    """The gap is the library's Cal-QL gap: with a huge mc_return the calibrated policy values dominate the
    logsumexp, so the gap is ~ mc_return - Q(data); without calibration it is not."""
    b = make_batch(seed=4)
    big = Batch(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.truncated, b.info,
                {"mc_return": np.full(B, 100.0, np.float32)})
    gaps = {}
    for calibrate in (True, False):
        agent = make(calibrate=calibrate, cql_n_actions=3)
        agent.on_phase("offline")
        gaps[calibrate] = agent.update(big).metrics["train/cql_gap"]
    assert gaps[True] > 99.0 and gaps[False] < 10.0


def test_cal_ql_pretraining_ranks_data_actions_above_random_ones():
    """A few hundred pre-training steps on base data (successes, reward 1 at the end): Q(x, a_data) > Q(x, a_rand)."""
    torch.manual_seed(0)
    base = LinearBase()
    rng = np.random.default_rng(0)
    n = 256
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n), np.ones(n, np.float32),
                      np.zeros(n, np.int8))
    data = Batch(obs, np.clip(base(obs), LOW, HIGH), np.ones(n, np.float32), obs, np.ones(n, bool),
                 np.zeros(n, bool), info, {"mc_return": np.ones(n, np.float32)})
    agent = make(base=base, cql_n_actions=4)
    agent.on_phase("offline")
    for _ in range(150):
        agent.update(data)
    with torch.no_grad():
        o = torch.as_tensor(obs)
        q_data = agent.critic(o, torch.as_tensor(data.action)).min(0).values
        q_rand = agent.critic(o, torch.as_tensor(rng.uniform(LOW, HIGH, (n, ACT)).astype(np.float32))).min(0).values
    assert q_data.mean() > q_rand.mean() + 0.3 and abs(q_data.mean().item() - 1.0) < 0.3


# -- state ----------------------------------------------------------------------------------------------
def test_checkpoint_resume_is_exact(tmp_path):
    """Mid-episode (probing), after updates: save -> load into a fresh agent; the next actions, the next probing
    draw and the next update are identical."""
    cfg = dict(probe_max_steps=4, warmup=2, otf_candidates=3)
    agent = make(seed=5, **cfg)
    for step in range(3):
        agent.on_episode_start()
        for t in range(3):
            agent.act(obs_rows(1, seed=10 * step + t), explore=True)
        agent.update(make_batch(seed=step))
    agent.on_episode_start()
    agent.act(obs_rows(1), explore=True)
    save_tree(tmp_path / "agent", agent.state_dict(), kind="agent")
    other = make(seed=99, **cfg)
    other.load_state_dict(load_tree(tmp_path / "agent", kind="agent"))

    def future(a: ResidualSAC):
        outs = [a.act(obs_rows(1, seed=t), explore=True) for t in range(6)]
        a.on_episode_start()
        outs.append(a.act(obs_rows(1), explore=True))
        a.update(make_batch(seed=7))
        a.update(make_batch(seed=8))
        return outs, torch.cat([p.flatten() for m in (a.actor, a.critic, a.target_critic) for p in m.parameters()])

    (outs_a, params_a), (outs_b, params_b) = future(agent), future(other)
    for x, y in zip(outs_a, outs_b, strict=True):
        assert isinstance(x, Acted) and bool(x.store) == bool(y.store)
        np.testing.assert_array_equal(x.action, y.action)
        for k in x.record:
            np.testing.assert_array_equal(x.record[k], y.record[k])
    torch.testing.assert_close(params_a, params_b, rtol=0, atol=0)
    assert agent.state_dict()["counters"] == other.state_dict()["counters"]


def test_same_seed_same_agent_and_from_spec_seeds():
    spec = EnvSpec("Toy-v0", (OBS,), False, (ACT,), 0, LOW, HIGH, 10)
    agents = [ResidualSAC.from_spec(spec, ResidualSACConfig(**SMALL), np.random.SeedSequence(3),
                                    base_policy=LinearBase()) for _ in range(2)]
    for a in agents:
        a.update(make_batch())
    for p, q in zip(agents[0].critic.parameters(), agents[1].critic.parameters(), strict=True):
        assert torch.equal(p, q)


# -- learning -------------------------------------------------------------------------------------------
def test_residual_learns_to_correct_a_base_that_is_off_by_a_constant():
    """1-D toy, one-step episodes: x ~ U(-1, 1), reward -(a - x)^2, base(x) = x - 0.4. With beta = 0.5 the residual
    must output ~ +0.8; after 50 base-only warm-up steps and 300 updates on the agent's own stored data (a
    ReplayBuffer with the declared record columns) the evaluation action's error drops from 0.4 to < 0.12."""
    rng = np.random.default_rng(0)

    def base(o):
        return (o[:, :1] - 0.4).astype(np.float32)

    cfg = ResidualSACConfig(hidden=(32, 32), warmup=50, probe_max_steps=0, actor_every=1, beta=0.5,
                            init_temperature=0.01, learn_temperature=False, init_log_std=-1.0, actor_lr=1e-3,
                            critic_lr=1e-3)
    agent = ResidualSAC(1, 1, [-1.0], [1.0], cfg, seed=0, base_policy=base)
    buffer = ReplayBuffer(1000, (1,), (1,), seed=0, extra_columns={c.name: c.spec for c in agent.stored_columns()
                                                                   if c.name != "mc_return"})
    test_obs = np.linspace(-0.5, 0.5, 21, dtype=np.float32)[:, None]
    err_before = np.abs(agent.act(test_obs, explore=False) - test_obs).mean()
    for step in range(350):
        agent.on_episode_start()
        obs = rng.uniform(-1, 1, (1, 1)).astype(np.float32)
        action, record, store = unpack_acted(agent.act(obs, explore=True))
        assert store.all() and (record["beta"][0] == 0) == (step < 50)
        reward = -((action - obs) ** 2).sum(-1).astype(np.float32)
        buffer.extend({"obs": obs, "action": action, "reward": reward, "next_obs": obs,
                       "terminated": np.ones(1, bool), "truncated": np.zeros(1, bool)} | dict(record))
        if step >= 50:
            agent.update(buffer.sample(32))
    err_after = np.abs(agent.act(test_obs, explore=False) - test_obs).mean()
    assert err_before == pytest.approx(0.4, abs=1e-5) and err_after < 0.12, (err_before, err_after)


# -- a short manual loop: hooks, offline pre-training, symmetric replay, probing --------------------------
class Reach1D:
    """x' = x + a (a in [-0.2, 0.2]), goal 1.0; reward 1 and terminated when |x' - 1| < 0.1; 15-step limit."""

    def reset(self, rng):
        self.x, self.t = float(rng.uniform(-0.5, 0.0)), 0
        return np.array([self.x], np.float32)

    def step(self, a):
        self.x, self.t = self.x + float(a[0]), self.t + 1
        success = abs(self.x - 1.0) < 0.1
        return np.array([self.x], np.float32), float(success), success, self.t >= 15 and not success


def test_manual_loop_serves_hooks_pretrains_offline_and_never_stores_probing_steps():
    """What the trainer will do, by hand: offline base successes with returns-to-go in a 50/50 mixture buffer
    (``OnPhase("offline")``: Cal-QL critic steps), then online episodes (``OnEpisodeStart`` before each) where the
    rows stored are exactly the non-probing steps, every batch is half offline, and the records are stored."""
    from relive.data.loaders import fill_offline
    from relive.hooks import LoopContext, collect_hooks, of_type
    from relive.replay.samplers.mixture import MixtureSampler

    rng = np.random.default_rng(0)
    env = Reach1D()

    def base(o):  # reaches the goal slowly: 0.15 per step (0.1 short of the box)
        return np.full((len(o), 1), 0.15, np.float32)

    cfg = ResidualSACConfig(hidden=(16, 16), warmup=1, warmup_unit="episodes", probe_max_steps=4, cql_n_actions=2)
    agent = ResidualSAC(1, 1, [-0.2], [0.2], cfg, seed=0, base_policy=base)
    buffer = ReplayBuffer(2000, (1,), (1,), sampler=MixtureSampler(offline_fraction=0.5), seed=0,
                          extra_columns={c.name: c.spec for c in agent.stored_columns()})
    rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    while sum(rows["terminated"]) < 5:  # D_off: 5 successful base episodes
        obs, done, episode = env.reset(rng), False, {k: [] for k in rows}
        while not done:
            a = base(obs[None])[0]
            nxt, r, term, trunc = env.step(a)
            for k, v in zip(rows, (obs, a, r, nxt, term, trunc), strict=True):
                episode[k].append(v)
            obs, done = nxt, term or trunc
        if episode["terminated"][-1]:
            for k in rows:
                rows[k] += episode[k]
    data = {k: np.asarray(v, np.float32 if k not in ("terminated", "truncated") else bool) for k, v in rows.items()}
    for c in agent.stored_columns():  # the trainer's job: offline rows get the "fill" columns' fill values
        if c.offline == "fill" and c.name != "mc_return":  # (the loader computes returns-to-go)
            data[c.name] = c.filled(len(data["reward"]))
    fill_offline(buffer, data, cfg.gamma)  # computes mc_return
    assert buffer.storage.columns["mc_return"][: buffer.num_offline].max() == pytest.approx(1.0)

    hooks = collect_hooks(LoopContext(agent, buffer, None, cfg.gamma), agent)
    for h in of_type(hooks, OnPhase):
        h.fn("offline")
    for _ in range(5):
        assert "train/cql_gap" in agent.update(buffer.sample(16)).metrics
    for h in of_type(hooks, OnPhase):
        h.fn("online")
    executed = probed = 0
    for _episode in range(6):
        for h in of_type(hooks, OnEpisodeStart):
            h.fn()
        obs, done, slots, rewards = env.reset(rng), False, [], []
        while not done:
            action, record, store = unpack_acted(agent.act(obs[None], explore=True))
            nxt, r, term, trunc = env.step(action[0])
            executed += 1
            if store.all():
                rewards.append(r)
                slots += list(buffer.extend({"obs": obs[None], "action": action, "reward": np.array([r], np.float32),
                               "next_obs": nxt[None], "terminated": np.array([term]), "truncated": np.array([trunc]),
                               "mc_return": np.zeros(1, np.float32)} | dict(record)))
            else:
                probed += 1
            obs, done = nxt, term or trunc
            if buffer.num_online >= 8:
                batch = buffer.sample(16)
                assert (batch.info.source == 1).sum() == 8
                assert "train/critic_loss" in agent.update(batch).metrics
        for h in of_type(hooks, OnEpisodeEnd):  # returns-to-go of the stored (takeover) rows only
            h.fn(np.asarray(slots))
        g = sum(cfg.gamma ** t * r for t, r in enumerate(rewards))
        assert buffer.storage.columns["mc_return"][slots[0]] == pytest.approx(g, rel=1e-5)
    assert probed > 0 and probed == agent.num_probe_steps
    assert buffer.num_online == executed - probed == agent.num_env_steps
    online = slice(buffer.num_offline, buffer.num_offline + buffer.num_online)
    assert (buffer.storage.columns["beta"][online] > 0).any()  # residual rows carry their beta


# -- end to end: relive train residual_sac ---------------------------------------------------------------
def test_relive_train_residual_sac_end_to_end(tmp_path, monkeypatch):
    """`relive train residual_sac --env Pendulum-v1 --base-policy PATH` in-process, with a stand-in loader module
    (the real one lives in relive.agents.base_policy, another branch) returning a tiny frozen torch policy: the run
    finishes, probing steps are executed but never stored (stored online rows = env steps - probing steps), the
    stored records are there, and the final agent state reloads."""

    from relive.cli import main
    from relive.envs import env_spec, make_env
    from relive.replay.checkpoint import load_tree

    base = torch.nn.Linear(3, 1)
    with torch.no_grad():
        base.weight.copy_(torch.tensor([[-0.5, 0.3, -0.1]]))
        base.bias.zero_()
    before = {k: v.clone() for k, v in base.state_dict().items()}

    def policy(obs):
        with torch.no_grad():
            return base(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    monkeypatch.setattr("relive.agents.residual_sac.load_base_policy", lambda path, spec, trusted=False: policy)
    run = tmp_path / "run"
    code = main(["train", "residual_sac", "--env", "Pendulum-v1", "--base-policy", "tiny", "--offline-steps", "0",
                 "--online-steps", "150", "--eval-every", "150", "--eval-episodes", "1", "--batch-size", "32",
                 "--set", "env.max_episode_steps=50", "--set", "agent.hidden=[16,16]", "--set", "agent.warmup=30",
                 "--set", "agent.probe_max_steps=20", "--run-dir", str(run), "--no-progress",
                 "--set", "run.save_final_buffer=true"])
    assert code == 0
    config = json.loads((run / "config.json").read_text())
    assert config["agent_kind"] == "residual_sac" and config["agent"]["base_policy"] == "tiny"
    state = load_tree(run / "agent_final", kind="agent")
    counters = state["counters"]
    assert counters["num_probe_steps"] > 0 and counters["num_env_steps"] + counters["num_probe_steps"] == 150
    assert counters["num_episodes"] == 3  # the OnEpisodeStart hook reached the agent
    assert counters["num_critic_steps"] > 0 and counters["num_actor_steps"] > 0
    buffer = ReplayBuffer.load(run / "buffer_final")
    assert buffer.num_online == counters["num_env_steps"]
    beta = buffer.storage.columns["beta"][: buffer.num_online]
    assert (beta[:30] == 0).all() and (beta[30:] == 0.5).all()  # warm-up rows, then residual rows
    for k, v in base.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    spec = env_spec(make_env("Pendulum-v1"))
    agent = ResidualSAC.from_spec(spec, ResidualSACConfig(hidden=(16, 16)), np.random.SeedSequence(9),
                                  base_policy=policy)
    agent.load_state_dict(state)
    assert agent.state_dict()["counters"] == counters
    residual = load_residual(run)  # what `relive pld distill --run` rolls out
    obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    np.testing.assert_allclose(residual(obs, policy(obs)), agent.act(obs, explore=False), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="not a finished run directory"):
        load_residual(tmp_path)


@pytest.mark.slow
def test_relive_train_residual_sac_resumes_exactly(tmp_path, monkeypatch):
    """Cal-QL pre-training on a dataset, then online with warm-up and probing (50-step episodes), killed after the
    env-step-100 checkpoint and resumed: the same final agent (networks, optimizers, generators, probing state,
    counters) as the uninterrupted run."""

    from relive.cli import build_parser
    from relive.data.npz_io import save_dataset
    from relive.train.cli import config_from_args
    from relive.train.collector import collect_dataset
    from relive.train.trainer import train

    monkeypatch.setattr("relive.agents.residual_sac.load_base_policy",
                        lambda path, spec, trusted=False: lambda o: (-0.4 * np.asarray(o)[:, :1]).astype(np.float32))
    data = save_dataset(tmp_path / "d.npz", collect_dataset("Pendulum-v1", 200, seed=0))
    args = ["residual_sac", "--env", "Pendulum-v1", "--base-policy", "lin", "--dataset", str(data),
            "--offline-steps", "20", "--online-steps", "200", "--eval-every", "100", "--eval-episodes", "1",
            "--checkpoint-every", "60", "--batch-size", "32", "--no-progress", "--set", "env.max_episode_steps=50",
            "--set", "agent.hidden=[16,16]", "--set", "agent.warmup=30", "--set", "agent.probe_max_steps=20",
            "--set", "agent.cql_n_actions=2", "--set", "agent.otf_candidates=2"]

    def cfg(run):
        return config_from_args(build_parser().parse_args(["train", *args, "--run-dir", str(tmp_path / run)]))

    class Kill(Exception):
        pass

    def kill(env_steps, grad_steps):
        if env_steps >= 130:
            raise Kill

    train(cfg("full"))
    with pytest.raises(Kill):
        train(cfg("cut"), on_step=kill)
    train(resume_dir=tmp_path / "cut")
    a, b = (load_tree(tmp_path / run / "agent_final", kind="agent") for run in ("full", "cut"))
    assert a["counters"] == b["counters"] and a["counters"]["num_probe_steps"] > 0
    assert a["counters"]["num_pretrain_steps"] == 20 and a["rng"] == b["rng"]
    for k in ("actor", "critic", "target_critic"):
        for name in a[k]:
            np.testing.assert_array_equal(a[k][name], b[k][name], err_msg=f"{k}.{name}")
    np.testing.assert_array_equal(a["generator"], b["generator"])


def test_probing_is_per_env_when_several_envs_act_together():
    """Row i of an act call is env i (``--num-envs``): each env draws its own probing length h_i at its own episode
    starts and its first h_i steps are executed unstored; an episode start of env 1 restarts env 1's probing only."""
    agent = make(seed=3, probe_max_steps=6, warmup=0)
    agent.set_base_policy(LinearBase())
    agent.on_episode_start(0)
    agent.on_episode_start(1)
    h = agent.probe_steps.tolist()
    stores = [unpack_acted(agent.act(obs_rows(2), explore=True))[2] for _ in range(8)]
    for env in (0, 1):
        assert [bool(s[env]) for s in stores] == [t >= h[env] for t in range(8)]
    agent.on_episode_start(1)
    h1 = int(agent.probe_steps[1])
    stores = [unpack_acted(agent.act(obs_rows(2), explore=True))[2] for _ in range(4)]
    assert [bool(s[0]) for s in stores] == [True] * 4  # env 0's episode goes on: past its probing
    assert [bool(s[1]) for s in stores] == [t >= h1 for t in range(4)]
    assert agent.num_probe_steps == sum(h) + min(h1, 4) and agent.num_episodes == 3
    assert h[0] != h[1] and min(h) > 0  # (this seed draws two different, non-zero lengths)


def test_a_mixed_call_takes_the_residual_only_where_it_took_over():
    """Env 0 probing, env 1 past its probing: row 0 is the base action (beta record 0), row 1 base + beta delta."""
    agent = make(probe_max_steps=5, warmup=0)
    base = LinearBase()
    agent.set_base_policy(base)
    with torch.no_grad():
        agent.actor.trunk[-1].bias[:ACT] = 1.0  # a visibly non-zero residual
    agent.on_episode_start(0)
    agent.on_episode_start(1)
    agent.probe_steps[:] = [3, 0]
    obs = obs_rows(2)
    action, record, store = unpack_acted(agent.act(obs, explore=True))
    assert store.tolist() == [False, True] and record["beta"].tolist() == [0.0, 0.5]
    np.testing.assert_allclose(action[0], np.clip(base(obs)[0], LOW, HIGH), atol=1e-6)
    assert not np.allclose(action[1], np.clip(base(obs)[1], LOW, HIGH))
    assert (record["delta_action"][0] == 0).all() and (record["delta_action"][1] != 0).all()


def test_the_trainers_random_warmup_is_refused_by_name_at_start(tmp_path, monkeypatch):
    """`relive train residual_sac --warmup N` (issue 28 item 5): the trainer's random warm-up stored uniform actions
    before an episode's probing steps and the run aborted mid-way ("act returned store=False after a stored step
    of the same episode"); now it is refused before anything runs, naming the agent's own warm-up. With
    --warmup-policy agent (the agent acts; the updates wait for N stored steps) the run goes through."""

    from relive.cli import build_parser
    from relive.train.cli import config_from_args
    from relive.train.trainer import train

    monkeypatch.setattr("relive.agents.residual_sac.load_base_policy",
                        lambda path, spec, trusted=False: lambda o: (-0.4 * np.asarray(o)[:, :1]).astype(np.float32))
    args = ["train", "residual_sac", "--env", "Pendulum-v1", "--base-policy", "lin", "--offline-steps", "0",
            "--online-steps", "160", "--eval-every", "1000", "--eval-episodes", "1", "--batch-size", "16",
            "--warmup", "120", "--no-progress", "--set", "env.max_episode_steps=50", "--set", "agent.hidden=[8,8]",
            "--set", "agent.warmup=0", "--set", "agent.probe_max_steps=20", "--set", "agent.otf_candidates=1"]
    with pytest.raises(ValueError, match=r"--warmup.*'residual_sac'.*--set agent\.warmup=N"):
        train(config_from_args(build_parser().parse_args([*args, "--run-dir", str(tmp_path / "random")])))
    assert not (tmp_path / "random").exists()
    summary = train(config_from_args(build_parser().parse_args(
        [*args, "--warmup-policy", "agent", "--run-dir", str(tmp_path / "agent")])))
    assert summary.num_online_env_steps == 160 and summary.num_probing_env_steps > 0
    assert summary.num_stored_online_env_steps == 160 - summary.num_probing_env_steps
    # no updates before 120 stored rows, then one per stored row
    assert summary.num_grad_steps == summary.num_stored_online_env_steps - 120


def test_docs_pld_says_what_the_code_does():
    """docs/pld.md (issue 28 items 6 and 11): the evaluation formula has the residual's (high - low)/2 scale (checked
    against act), probing steps vs budgets are stated with the summary.json fields that report them, online
    returns-to-go are said to be unread, no path outside the repository is cited, and every test it names exists."""
    import dataclasses
    import re
    from pathlib import Path

    from relive.train.trainer import RunSummary

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "pld.md").read_text()
    assert "clip(a_base + beta (high - low)/2 tanh(mu))" in doc
    agent = make(beta=0.7)
    with torch.no_grad():  # a residual mean away from 0: the scale shows
        agent.actor.trunk[-1].bias[:ACT] = torch.tensor([0.8, -1.5])
    obs = obs_rows(4)
    base = agent.base_action(obs)
    expected = np.clip(base + 0.7 * HALF * np.tanh([0.8, -1.5]), LOW, HIGH)
    np.testing.assert_allclose(agent.act(obs, explore=False), expected, rtol=0, atol=1e-5)

    fields = {f.name for f in dataclasses.fields(RunSummary)}
    for name in ("num_online_env_steps", "num_stored_online_env_steps", "num_probing_env_steps"):
        assert name in fields and f"`{name}`" in doc
    assert "`--online-steps` (`schedule.num_online_env_steps`) counts **executed** env steps" in doc
    assert "Online returns-to-go are written but never read" in doc
    assert "seeds/" not in doc and "research/" not in doc
    here = (root / "tests" / "agents" / "test_residual_sac.py").read_text()
    for name in set(re.findall(r"`(test_\w+)`", doc)):
        assert re.search(rf"def {name}\b", here) or any(
            re.search(rf"def {name}\b", p.read_text()) for p in (root / "tests").rglob("test_*.py")), name


def _bc_base(path, seed):
    """A tiny BC MLP base policy for Pendulum (obs 3, action 1) saved at ``path``; its weights depend on ``seed``."""
    from relive.agents.bc import BCConfig, new_policy, save_bc_policy

    return save_bc_policy(path, new_policy(3, 1, [-2.0], [2.0], BCConfig(hidden=(8,)), seed=seed), {},
                          overwrite=True)


def test_a_state_trained_on_another_base_is_refused_unless_allowed(tmp_path):
    """Issue 28 item 7: the agent records its base's digest (BasePolicy.digest()) in its state; loading that state
    with a base of another digest is refused unless allow_other_base; a plain callable cannot say (no check)."""
    from relive.agents.base_policy import load_base_policy
    from relive.envs import env_spec, make_env

    spec = env_spec(make_env("Pendulum-v1"))
    base_a, base_b = (load_base_policy(_bc_base(tmp_path / name, seed), spec) for name, seed in (("a", 0), ("b", 1)))
    cfg = ResidualSACConfig(hidden=(8, 8))
    a = ResidualSAC.from_spec(spec, cfg, np.random.SeedSequence(0), base_policy=base_a)
    state = a.state_dict()
    assert state["base_sha256"] == base_a.digest() != base_b.digest()
    ResidualSAC.from_spec(spec, cfg, np.random.SeedSequence(1), base_policy=base_a).load_state_dict(state)
    b = ResidualSAC.from_spec(spec, cfg, np.random.SeedSequence(1), base_policy=base_b)
    with pytest.raises(ValueError, match=r"trained on a base policy with SHA-256 .*--allow-other-base"):
        b.load_state_dict(state)
    b.allow_other_base = True
    b.load_state_dict(state)
    assert b.state_dict()["base_sha256"] == base_b.digest()  # from now on it trains on b
    plain = ResidualSAC.from_spec(spec, cfg, np.random.SeedSequence(1), base_policy=lambda o: np.zeros((len(o), 1)))
    plain.load_state_dict(state)  # (no digest to compare)


def test_resume_refuses_a_changed_base_policy_unless_allowed(tmp_path):
    """`relive train --resume RUN` after the file at agent.base_policy changed: refused, naming
    --allow-other-base; with it the run goes on (and --allow-other-base on an agent without a base is refused)."""
    from relive.cli import build_parser, main
    from relive.train.cli import config_from_args
    from relive.train.trainer import train

    base = _bc_base(tmp_path / "base", 0)
    argv = ["train", "residual_sac", "--env", "Pendulum-v1", "--base-policy", str(base), "--offline-steps", "0",
            "--online-steps", "120", "--eval-every", "1000", "--eval-episodes", "1", "--batch-size", "16",
            "--checkpoint-every", "40", "--no-progress", "--set", "env.max_episode_steps=40",
            "--set", "agent.hidden=[8,8]", "--set", "agent.warmup=20", "--set", "agent.probe_max_steps=5",
            "--set", "agent.otf_candidates=2", "--run-dir", str(tmp_path / "run")]

    class Kill(Exception):
        pass

    def kill(env_steps, grad_steps):
        if env_steps >= 90:
            raise Kill

    with pytest.raises(Kill):
        train(config_from_args(build_parser().parse_args(argv)), on_step=kill)
    _bc_base(tmp_path / "base", 1)  # the base policy file is replaced by another one
    with pytest.raises(ValueError, match="--allow-other-base"):
        main(["--debug", "train", "--resume", str(tmp_path / "run"), "--no-progress"])
    assert main(["train", "--resume", str(tmp_path / "run"), "--no-progress", "--allow-other-base"]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()
    with pytest.raises(ValueError, match="agent 'sac' has no frozen base policy"):
        main(["--debug", "train", "sac", "--env", "Pendulum-v1", "--allow-other-base", "--run-dir",
              str(tmp_path / "sac")])
    assert not (tmp_path / "sac").exists()
    with pytest.raises(ValueError, match="--allow-other-base does not combine with --seeds"):
        main(["--debug", "train", "residual_sac", "--env", "Pendulum-v1", "--seeds", "0,1", "--allow-other-base",
              "--run-dir", str(tmp_path / "s{seed}")])


def test_wsrl_preset_is_the_authors_code_and_starts_from_a_matching_pretraining():
    """Issue 46 item 5: zhouzypaul/wsrl at 891ee35 -- launch_wsrl_finetune.sh (SAC, --utd 4, --warmup_steps 5000,
    no offline data), wsrl_config.py l.9-13 (10 LayerNorm critics, subset of 2), sac.py l.302 (actor on the min of
    all members), sac_config.py (no backup entropy, lrs 1e-4 / 3e-4 / 1e-4, initial temperature 1); `wsrl_pretrain`
    has the same critic ensemble (its agent is what --init-from loads)."""
    from relive.presets import get_preset

    cfg, pre = get_preset("wsrl"), get_preset("wsrl_pretrain")
    a, s = cfg.agent, cfg.schedule
    assert (s.utd_ratio, s.num_warmup_env_steps, s.warmup_policy, s.num_offline_grad_steps) == (4, 5000, "agent", 0)
    assert (a.num_qs, a.num_min_qs, a.critic_layer_norm, a.actor_q_reduce, a.actor_per_env_step) == (
        10, 2, True, "min", True)
    assert (a.cql_alpha, a.calibrate, a.max_target_backup, a.backup_entropy) == (0.0, False, False, False)
    assert (a.actor_lr, a.critic_lr, a.temp_lr, a.init_temperature, a.hidden) == (1e-4, 3e-4, 1e-4, 1.0, (256, 256))
    assert cfg.replay.name == "uniform" and cfg.data.dataset is None
    assert pre.agent_kind == cfg.agent_kind == "calql" and pre.schedule.num_online_env_steps == 0
    assert (pre.agent.num_qs, pre.agent.num_min_qs, pre.agent.critic_layer_norm, pre.agent.hidden) == (
        10, 2, True, (256, 256))
    assert pre.agent.cql_alpha > 0 and pre.agent.calibrate  # Cal-QL offline
