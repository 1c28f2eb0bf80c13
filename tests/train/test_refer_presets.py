"""The ReF-ER paper-setting presets (issue 28 items 8-10): each carries the paper's values (Novati & Koumoutsakos,
ICML 2019) and says where each comes from; the fast-setting presets stay beside them; the refer grid has both
cells."""

import numpy as np
import pytest
import torch

from relive.agents.ddpg import DDPG, DDPGConfig
from relive.experiments.grid import load_grid
from relive.presets import PRESETS, get_preset
from relive.replay import ReplayBuffer
from relive.train.cli import show
from relive.train.trainer import build_sampler
from relive.types import unpack_acted

torch.set_num_threads(1)
PAPER = ("ddpg_paper", "ddpg_per_paper", "ddpg_refer_paper", "ddpg_refer1_paper", "ddpg_refer2_paper")
FAST = ("ddpg", "ddpg_per", "ddpg_refer", "ddpg_refer1", "ddpg_refer2")


@pytest.mark.parametrize("name", PAPER)
def test_paper_presets_carry_the_papers_ddpg(name):
    cfg = get_preset(name)
    a = cfg.agent
    assert cfg.agent_kind == "ddpg" and cfg.preset == name and cfg.replay.capacity == 2**18  # N (Sec. 3)
    assert (a.critic_lr, a.actor_lr) == (1e-4, 1e-5)  # Sec. 5.1
    assert a.sigma == 0.2 and a.hidden == (128, 128) and a.critic_weight_decay == 1e-4
    assert cfg.schedule.warmup_policy == "agent"
    refer = "refer" in name
    # ER / PER: OU noise (Sec. 5.1, the authors' decay 0.85); ReF-ER: Gaussian (rho needs the density)
    assert a.exploration_noise == ("gaussian" if refer else "ou") and a.ou_theta == 0.15
    assert cfg.replay.name == ("refer" if refer else "per" if name.startswith("ddpg_per") else "uniform")
    assert (a.refer_rule1, a.refer_rule2) == (name != "ddpg_refer2_paper", name != "ddpg_refer1_paper")
    if refer:
        r = cfg.replay.options
        assert (r.C, r.D, r.A, r.beta_schedule) == (4.0, 0.1, 5e-7, "paper")  # Sec. 3
        assert r.beta_eta == a.critic_lr  # Eq. 12: beta's rate is the network's
        assert r.initial_beta == 1e-4 and r.far_estimator == "stale"  # authors' code; the paper's estimator
    assert PRESETS[name].__doc__ and "Sec. 5.1" in PRESETS[name].__doc__


@pytest.mark.parametrize("name", FAST)
def test_fast_presets_stay_beside_them(name):
    cfg = get_preset(name)
    assert (cfg.agent.critic_lr, cfg.agent.actor_lr) == (3e-4, 3e-4) and cfg.agent.exploration_noise == "gaussian"
    assert cfg.agent.critic_weight_decay == 0.0 and name + "_paper" in PRESETS
    if "refer" in name:
        assert cfg.replay.options.far_estimator == "recount" and cfg.replay.options.initial_beta == 1e-4


@pytest.mark.parametrize("name", ["ddpg_refer_paper", "ddpg_refer1_paper", "ddpg_refer2_paper"])
def test_show_prints_the_papers_values_with_their_sources(name, capsys):
    show(name)
    out = capsys.readouterr().out
    for text in (f"{name}: DDPG with ReF-ER", "at the paper's setting", "Sec. 5.1", "Eq. 12", "Eq. 13", "DPG.cpp",
                 "MemoryBuffer.h", "agent.actor_lr = 1e-05", "agent.critic_lr = 0.0001",
                 "agent.critic_weight_decay = 0.0001", 'replay.refer.far_estimator = "stale"',
                 "replay.refer.beta_eta = 0.0001", "replay.refer.initial_beta = 0.0001"):
        assert text in out, text
    show("ddpg_per_paper")
    assert "rank-based" in capsys.readouterr().out  # why proportional PER


def _buffer_and_agent(name, n=300, seed=0):
    cfg = get_preset(name)
    agent = DDPG(3, 1, [-2.0], [2.0], cfg.agent, seed=seed)
    buf = ReplayBuffer(1000, 3, 1, sampler=build_sampler(cfg), seed=seed,
                       extra_columns={d.name: d.spec for d in agent.stored_columns()})
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3)).astype(np.float32)
    action, record, _ = unpack_acted(agent.act(obs, explore=True))
    buf.extend(dict(obs=obs, action=action, reward=rng.normal(size=n).astype(np.float32), next_obs=obs,
                    terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), **record))
    return agent, buf


@pytest.mark.parametrize("name", ["ddpg_paper", "ddpg_per_paper", "ddpg_refer_paper"])
def test_learning_rates_anneal_under_refer_only_and_the_critic_decays(name):
    """Sec. 5.1: annealing eta "worsened the instability of DDPG with regular ER and PER" (so ER / PER keep their
    rates); Eq. 13 anneals them under ReF-ER. The critic's Adam carries the L2 penalty."""
    agent, buf = _buffer_and_agent(name)
    if name == "ddpg_refer_paper":
        buf.sampler.A = 0.5  # fast annealing, to see it in a few steps
    for _ in range(4):
        b = buf.sample(32)
        buf.update(b.info, **agent.update(b).signals)
    lr = agent.critic_opt.param_groups[0]["lr"], agent.actor_opt.param_groups[0]["lr"]
    if name == "ddpg_refer_paper":
        assert lr == (pytest.approx(1e-4 / 2.5), pytest.approx(1e-5 / 2.5))  # 1 / (1 + A t), t = 3 at the 4th step
    else:
        assert lr == (1e-4, 1e-5)
    assert agent.critic_opt.param_groups[0]["weight_decay"] == 1e-4
    assert agent.actor_opt.param_groups[0]["weight_decay"] == 0.0


def test_critic_weight_decay_is_an_l2_penalty_on_the_critic_step():
    """Adam's coupled L2 penalty: with a penalty that dominates the TD gradient (wd * w >> dL/dw), the first Adam
    step moves every critic parameter by ~ -lr * sign(w), toward 0; without it, many move away from 0. The actor
    has no penalty."""
    from tests.agents.test_refer import make_batch

    plain = DDPG(4, 2, [-2, -1], [2, 1], DDPGConfig(hidden=(8,), critic_lr=1e-3), seed=1)
    decayed = DDPG(4, 2, [-2, -1], [2, 1], DDPGConfig(hidden=(8,), critic_lr=1e-3, critic_weight_decay=1e4), seed=1)
    b = make_batch(plain, seed=3)
    shrunk = {}
    for name, agent in (("plain", plain), ("decayed", decayed)):
        before = torch.cat([p.detach().flatten().clone() for p in agent.critic.parameters()])
        agent.update(b)
        after = torch.cat([p.detach().flatten() for p in agent.critic.parameters()])
        big = before.abs() > 1e-2  # (|w| > lr: a step of lr cannot cross 0)
        shrunk[name] = (after[big].abs() < before[big].abs()).float().mean().item()
    assert shrunk["decayed"] == 1.0 and shrunk["plain"] < 0.9
    assert decayed.actor_opt.param_groups[0]["weight_decay"] == 0.0
    with pytest.raises(ValueError, match="critic_weight_decay"):
        DDPGConfig(critic_weight_decay=-1e-4)


def test_refer_grid_has_a_paper_cell_beside_the_fast_cell():
    grid = load_grid("refer")
    labels = {v.label: v for v in grid.variants}
    for fast in FAST:
        assert any(v.preset == fast for v in grid.variants), fast
    for paper in PAPER:
        assert any(v.preset == paper for v in grid.variants), paper
    recount = labels["refer_paper_recount"]
    assert recount.preset == "ddpg_refer_paper" and "replay.refer.far_estimator=recount" in recount.args
    assert "Paper setting" in grid.description and "Fast setting" in grid.description
    for v in grid.variants:
        get_preset(v.preset)


def test_a_paper_setting_run_logs_the_exact_and_the_stale_far_fraction(tmp_path):
    """Issue 28 item 9: a ddpg_refer_paper run (stale estimator) logs the exact count of each periodic pass beside
    the estimate beta used, so the grid's rerun can compare them."""
    import json

    from relive.cli import main

    run = tmp_path / "r"
    assert main(["train", "ddpg_refer_paper", "--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "100",
                 "--eval-every", "300", "--log-every", "100", "--set", "replay.refer.recount_every_grad_steps=50",
                 "--set", "agent.hidden=[16,16]", "--batch-size", "32", "--eval-episodes", "1", "--no-progress",
                 "--run-dir", str(run)]) == 0
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = lines[-2]  # the last online line
    assert last["replay/refer_recounts"] == 4
    for key in ("replay/refer_far_fraction_exact", "replay/refer_far_fraction_stale", "replay/far_policy_fraction",
                "replay/refer_beta", "train/kl_behaviour"):
        assert 0 <= last[key] < np.inf, key
    assert 0 < last["replay/refer_beta"] < 0.05  # from 1e-4, step 1e-4: ~0.02 after 200 updates
    assert json.loads((run / "config.json").read_text())["replay"]["refer"]["far_estimator"] == "stale"
