"""ReF-ER's math (rho, far predicate, KL, schedules) against closed forms, and DDPG's Rules 1 and 2 (Novati &
Koumoutsakos 2019, Sec. 3, Eq. 10-13) on hand-made batches."""

import math

import numpy as np
import pytest
import torch

from relive.agents import networks as nets
from relive.agents import refer
from relive.agents.ddpg import DDPG, DDPGConfig
from relive.replay import refer_schedule
from relive.replay.checkpoint import load_tree, save_tree
from relive.types import Acted, Batch, SampleInfo

torch.set_num_threads(1)
OBS, ACT, B = 4, 2, 16
LOW, HIGH = np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32)
SIGMA_ENV = 0.2 * (HIGH - LOW) / 2  # DDPG's exploration std in env units


def t(x):
    return torch.as_tensor(np.asarray(x, np.float32))


# -- the math ---------------------------------------------------------------------------------------------
def test_ddpg_rho_is_the_closed_form_and_its_log_is_clipped():
    rng = np.random.default_rng(0)
    m_w, m_t, a = (rng.normal(size=(50, 3)) * 0.3 for _ in range(3))
    sigma = 0.2
    expected = -(((a - m_w) ** 2).sum(1) - ((a - m_t) ** 2).sum(1)) / (2 * sigma**2)
    got = refer.gaussian_log_rho(t(m_w), t(np.full((50, 3), sigma)), t(m_t), t(np.full((50, 3), sigma)), t(a))
    np.testing.assert_allclose(got.numpy(), np.clip(expected, -7, 7), rtol=1e-4, atol=1e-4)
    assert (np.abs(expected) > 7).any() and (np.abs(expected) < 7).any()  # both branches exercised
    # a = m_t, |a - m_w| = 2 sigma in one dim: log rho = -2 exactly
    one = refer.gaussian_log_rho(t([[0.4]]), t([[0.2]]), t([[0.0]]), t([[0.2]]), t([[0.0]]))
    assert one.item() == pytest.approx(-2.0, abs=1e-6)


def test_gaussian_kl_closed_form_both_directions():
    # 1-D, by hand: KL(N(0, 1) || N(1, 2^2)) = log 2 + (1 + 1) / (2 * 4) - 1/2
    kl = refer.gaussian_kl(t([[0.0]]), t([[1.0]]), t([[1.0]]), t([[2.0]]))
    assert kl.item() == pytest.approx(math.log(2) + 2 / 8 - 0.5, abs=1e-6)
    rng = np.random.default_rng(1)
    pm, qm = rng.normal(size=(2, 8, 3))
    ps, qs = rng.uniform(0.2, 2.0, size=(2, 8, 3))
    p = torch.distributions.Normal(t(pm), t(ps))
    q = torch.distributions.Normal(t(qm), t(qs))
    ref_pq = torch.distributions.kl_divergence(p, q).sum(-1)
    ref_qp = torch.distributions.kl_divergence(q, p).sum(-1)
    # mu = p, pi = q: "mu_pi" is D_KL(mu || pi) (the paper), "pi_mu" the reverse (smarties)
    torch.testing.assert_close(refer.refer_kl(t(pm), t(ps), t(qm), t(qs), "mu_pi"), ref_pq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(refer.refer_kl(t(pm), t(ps), t(qm), t(qs), "pi_mu"), ref_qp, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ref_pq, ref_qp)
    # equal stds: both directions are |m_pi - m_mu|^2 / (2 sigma^2)
    s = np.full((8, 3), 0.3)
    expected = ((pm - qm) ** 2).sum(-1) / (2 * 0.09)
    for d in refer.KL_DIRECTIONS:
        np.testing.assert_allclose(refer.refer_kl(t(pm), t(s), t(qm), t(s), d).numpy(), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="KL direction"):
        refer.refer_kl(t(pm), t(s), t(qm), t(s), "both")


def test_tanh_gaussian_rho_is_the_ratio_of_squashed_densities():
    """The tanh Jacobian cancels: log rho on pre-squash parameters equals the difference of the two squashed
    log-densities of the stored action (networks.tanh_gaussian_log_prob)."""
    rng = np.random.default_rng(2)
    pm, mm = rng.normal(size=(2, 20, 2)) * 0.5
    ps, ms = rng.uniform(0.3, 1.0, size=(2, 20, 2))
    center, scale = t((HIGH + LOW) / 2), t((HIGH - LOW) / 2)
    u = t(rng.normal(size=(20, 2)))
    action = center + scale * torch.tanh(u)
    got = refer.tanh_gaussian_log_rho(t(pm), t(ps), t(mm), t(ms), action, center, scale)
    log_pi = nets.tanh_gaussian_log_prob(t(pm), torch.log(t(ps)), u).sum(-1)
    log_mu = nets.tanh_gaussian_log_prob(t(mm), torch.log(t(ms)), u).sum(-1)
    torch.testing.assert_close(got, (log_pi - log_mu).clamp(-7, 7), rtol=1e-4, atol=1e-4)


def test_far_predicate_at_the_boundaries():
    c = 4.0
    rho = np.array([0.25, np.nextafter(0.25, 1), 1.0, np.nextafter(4.0, 0), 4.0, 100.0, 1e-3])
    np.testing.assert_array_equal(refer_schedule.is_far(rho, c), [True, False, False, False, True, True, True])
    assert refer_schedule.is_far(torch.tensor([4.0, 1.0]), c).tolist() == [True, False]  # tensors too
    for c_off in (1.0, 0.5):  # c_max <= 1: ReF-ER is off, nothing is far
        assert not refer_schedule.is_far(rho, c_off).any()


def test_annealing_schedules_follow_eq_13():
    assert refer_schedule.c_max_at(0, 4.0, 5e-7) == 5.0
    assert refer_schedule.c_max_at(2_000_000, 4.0, 5e-7) == pytest.approx(3.0)
    assert refer_schedule.c_max_at(10_000_000, 4.0, 5e-7) == pytest.approx(1 + 4 / 6)
    assert refer_schedule.annealed_lr(1e-4, 0, 5e-7) == 1e-4
    assert refer_schedule.annealed_lr(1e-4, 2_000_000, 5e-7) == pytest.approx(5e-5)
    assert refer_schedule.smarties_eta(256, 2**18, 1000) == pytest.approx(0.1 * 256 / 2**18)


def test_beta_fixed_points():
    """Far fraction held above D: beta decays geometrically to 0; below: 1 - beta decays geometrically."""
    eta, beta = 0.01, 0.7
    for n in range(1, 200):
        beta = refer_schedule.beta_step(beta, far_fraction=0.3, D=0.1, eta=eta)
        assert beta == pytest.approx(0.7 * (1 - eta) ** n, rel=1e-12)
    beta = 0.7
    for n in range(1, 200):
        beta = refer_schedule.beta_step(beta, far_fraction=0.05, D=0.1, eta=eta)
        assert 1 - beta == pytest.approx(0.3 * (1 - eta) ** n, rel=1e-9)
    assert refer_schedule.beta_step(1.0, 0.0, 0.1, eta) == 1.0 and refer_schedule.beta_step(0.0, 0.5, 0.1, eta) == 0.0
    # smarties' clamped steps: (1 - min(eta, beta)) beta [+ min(eta, 1 - beta)], inside [0, 1] for any eta
    assert refer_schedule.beta_step(1e-4, 0.5, 0.1, 0.5, clamp=True) == pytest.approx((1 - 1e-4) * 1e-4)
    assert refer_schedule.beta_step(0.9, 0.0, 0.1, 0.5, clamp=True) == pytest.approx(0.5 * 0.9 + 0.1)
    for b0, eta_ in ((0.999, 1.0), (0.5, 1.0), (1e-6, 0.9)):
        for frac in (0.0, 0.5):
            assert 0.0 <= refer_schedule.beta_step(b0, frac, 0.1, eta_, clamp=True) <= 1.0
    assert refer_schedule.beta_step(1e-4, 0.0, 0.1, 1e-3, clamp=True) == pytest.approx((1 - 1e-4) * 1e-4 + 1e-3)


# -- DDPG -------------------------------------------------------------------------------------------------
def make(seed=0, **overrides):
    return DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(**(dict(hidden=(32, 32)) | overrides)), seed=seed)


def make_batch(agent, seed=0, n=B, far_rows=(), hints=None, is_weight=None, source=None, mu_std=None):
    """Rows whose stored action is the current actor's mean (rho = 1, near), except ``far_rows``: there the
    action is the behaviour mean, one box half-width (5 sigma) from m^w(s) in every dim, so rho = e^-7 (far)."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    with torch.no_grad():
        m = agent.actor(t(obs)).numpy()
    mu_mean = m.copy()
    far = np.zeros(n, bool)
    far[list(far_rows)] = True
    mu_mean[far] = np.clip(m[far] + np.where(m[far] > 0, -1, 1) * (HIGH - LOW) / 2, LOW, HIGH)
    action = np.where(far[:, None], mu_mean, m).astype(np.float32)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n),
                      np.ones(n, np.float32) if is_weight is None else np.asarray(is_weight, np.float32),
                      np.ones(n, np.int8) if source is None else np.asarray(source, np.int8), hints=hints or {})
    std = np.broadcast_to(SIGMA_ENV, (n, ACT)).astype(np.float32) if mu_std is None else mu_std
    return Batch(obs=obs, action=action, reward=rng.normal(size=n).astype(np.float32),
                 next_obs=rng.normal(size=(n, OBS)).astype(np.float32), terminated=rng.random(n) < 0.2,
                 truncated=np.zeros(n, bool), info=info, extras={"mu_mean": mu_mean, "mu_std": std})


def params(agent) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for m in (agent.actor, agent.critic, agent.target_actor,
                                                     agent.target_critic) for p in m.parameters()])


HINTS = {"c_max": 5.0, "beta": 0.6, "lr_scale": 1.0, "refer_source": -1}


def test_act_returns_the_behaviour_record():
    agent = make()
    obs = np.random.default_rng(0).normal(size=(64, OBS)).astype(np.float32) * 5
    out = agent.act(obs, explore=True)
    assert isinstance(out, Acted) and out.action.shape == (64, ACT) and out.action.dtype == np.float32
    assert (out.action >= LOW).all() and (out.action <= HIGH).all()
    with torch.no_grad():
        np.testing.assert_allclose(out.record["mu_mean"], agent.actor(t(obs)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(out.record["mu_std"], np.broadcast_to(SIGMA_ENV, (64, ACT)))
    assert {d.name: d.shape for d in agent.stored_columns()} == {"mu_mean": (ACT,), "mu_std": (ACT,)}
    np.testing.assert_array_equal(agent.act(obs, explore=False).action, out.record["mu_mean"])
    assert agent.act(obs[0], explore=False).shape == (ACT,)


def test_update_hands_back_the_closed_form_rho():
    agent = make()
    b = make_batch(agent, seed=1, far_rows=(3, 4), hints=HINTS)
    b = Batch(**{k: getattr(b, k) for k in ("obs", "reward", "next_obs", "terminated", "truncated")},
              action=(b.action + 0.05).astype(np.float32), info=b.info, extras=b.extras)  # not exactly m^w(s)
    with torch.no_grad():
        m_w = agent.actor(t(b.obs)).numpy()
    expected = -(((b.action - m_w) / SIGMA_ENV) ** 2 - ((b.action - b.mu_mean) / SIGMA_ENV) ** 2).sum(1) / 2
    np.testing.assert_allclose(agent.refer_log_rho(b.obs, b.action, b.mu_mean, b.mu_std), np.clip(expected, -7, 7),
                               rtol=1e-4, atol=1e-4)  # the recount's batched function
    res = agent.update(b)  # rho under the actor before its step
    np.testing.assert_allclose(np.log(res.signals["rho"]), np.clip(expected, -7, 7), rtol=1e-4, atol=1e-4)
    assert set(res.signals) == {"td_error", "rho"} and res.signals["rho"].dtype == np.float64
    assert set(agent.update(make_batch(agent, seed=1)).signals) == {"td_error"}  # plain DDPG: no hints, no rho


@pytest.mark.parametrize("rule2", [False, True])
def test_rule1_all_far_batch_leaves_every_parameter_bit_identical(rule2):
    """Rule 1 alone (or Rule 2 with beta = 1, where the KL term vanishes): an all-far batch takes no step, even
    after earlier steps left Adam momentum behind; the targets stay too."""
    agent = make(refer_rule2=rule2)
    for s in range(3):
        agent.update(make_batch(agent, seed=10 + s, hints=HINTS | {"beta": 1.0}))
    before = params(agent)
    res = agent.update(make_batch(agent, seed=1, far_rows=range(B), hints=HINTS | {"beta": 1.0}))
    torch.testing.assert_close(params(agent), before, rtol=0, atol=0)
    assert res.metrics["train/refer_near_fraction"] == 0.0
    np.testing.assert_allclose(res.signals["rho"], math.exp(-7), rtol=1e-5)
    # with beta < 1 Rule 2 still pulls the actor towards the behaviours on far rows
    agent.update(make_batch(agent, seed=1, far_rows=range(B), hints=HINTS | {"beta": 0.5}))
    assert torch.equal(params(agent), before) != rule2


def _grads(module, loss):
    module.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in module.parameters()])


def test_rule1_mixed_batch_is_the_update_on_its_near_rows():
    """The critic and actor gradients of a mixed batch are those of its near rows alone (times n_near / B: far
    rows count as zeros in the batch mean, Eq. 10); with Adam's scale invariance the first step matches too."""
    far_rows = (1, 5, 6, 11)
    near_rows = np.setdiff1d(np.arange(B), far_rows)
    agent = make(refer_rule2=False)
    mixed = make_batch(agent, seed=2, far_rows=far_rows, hints=HINTS)
    alone = gather_rows(mixed, near_rows)
    for which in ("critic", "actor"):
        g = []
        for b in (mixed, alone):
            tb = b.to_torch()
            _, near, _, _ = agent.refer_masks(tb)
            if which == "critic":
                g.append(_grads(agent.critic, agent.critic_loss(tb, near)[0]))
            else:
                g.append(_grads(agent.actor, agent.actor_loss(tb, near, torch.ones(len(b)), 1.0)[0]))
        assert (g[0] != 0).any()
        torch.testing.assert_close(g[0] * B, g[1] * near_rows.size, rtol=1e-4, atol=1e-6)
    a1, a2 = make(refer_rule2=False), make(refer_rule2=False)
    a1.update(mixed)
    a2.update(alone)
    torch.testing.assert_close(params(a1), params(a2), rtol=1e-4, atol=1e-5)


def gather_rows(b: Batch, rows) -> Batch:
    i = b.info
    info = SampleInfo(i.indices[rows], i.generation[rows], i.probability[rows], i.is_weight[rows], i.source[rows],
                      hints=i.hints)
    cols = {k: getattr(b, k)[rows] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    return Batch(**cols, info=info, extras={k: v[rows] for k, v in b.extras.items()})


def test_rule2_actor_gradient_is_beta_g_minus_one_minus_beta_grad_kl():
    """Autograd on the formula, written independently: g = grad of the mean over near rows of Q(s, m^w(s)) (the
    DPG), g^D = grad of the mean over all rows of |m^w(s) - m_t|^2 / (2 sigma^2); the agent's actor step descends
    -(beta g - (1 - beta) g^D)."""
    beta = 0.3
    agent = make()
    b = make_batch(agent, seed=4, far_rows=(0, 7), hints=HINTS | {"beta": beta})
    b = Batch(**{k: getattr(b, k) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")},
              info=b.info, extras={"mu_mean": (b.mu_mean + 0.1).astype(np.float32), "mu_std": b.mu_std})
    tb = b.to_torch()
    covered, near, _, _ = agent.refer_masks(tb)
    assert near.tolist() == [0.0 if i in (0, 7) else 1.0 for i in range(B)]
    agent.critic.requires_grad_(False)
    got = _grads(agent.actor, agent.actor_loss(tb, near, covered, beta)[0])
    m = agent.actor(tb.obs)
    q = agent.critic(tb.obs, m)[0]
    g = torch.autograd.grad((q * near).sum() / B, list(agent.actor.parameters()), retain_graph=True)
    kl = (((m - tb.mu_mean) / t(SIGMA_ENV)) ** 2).sum(-1) / 2
    g_d = torch.autograd.grad(kl.sum() / B, list(agent.actor.parameters()))
    ascent = torch.cat([(beta * x - (1 - beta) * y).flatten() for x, y in zip(g, g_d, strict=True)])
    torch.testing.assert_close(got, -ascent, rtol=1e-4, atol=1e-6)
    assert torch.cat([y.flatten() for y in g_d]).abs().max() > 1e-3  # the KL term is really there


def test_is_weight_weights_the_critic_loss_and_offline_rows_are_exempt():
    """PER: zero is_weight rows do not move the critic. Uncovered rows (ReF-ER on the online part only) are near
    and carry no KL, whatever their (filled) behaviour columns hold."""
    agent = make()
    w = np.r_[np.ones(B // 2), np.zeros(B // 2)]
    b = make_batch(agent, seed=3, is_weight=w)
    tb = b.to_torch()
    _, near, _, _ = agent.refer_masks(tb)
    g1 = _grads(agent.critic, agent.critic_loss(tb, near)[0])
    tb2 = gather_rows(b, np.arange(B // 2)).to_torch()
    g2 = _grads(agent.critic, agent.critic_loss(tb2, torch.ones(B // 2))[0])
    torch.testing.assert_close(g1 * 2, g2, rtol=1e-4, atol=1e-6)
    # offline rows (source 0) with zero-filled behaviour columns, ReF-ER covering online rows only
    source = np.r_[np.zeros(4), np.ones(B - 4)]
    std = np.broadcast_to(SIGMA_ENV, (B, ACT)).astype(np.float32).copy()
    std[:4] = 0.0
    mixed = make_batch(agent, seed=5, far_rows=(0, 1, 8), source=source, mu_std=std, hints=HINTS | {"refer_source": 1})
    covered, near, rho, _ = agent.refer_masks(mixed.to_torch())
    assert covered.tolist() == [0.0] * 4 + [1.0] * (B - 4)
    assert near.tolist() == [1.0 if i != 8 else 0.0 for i in range(B)]
    assert rho[:4].tolist() == [1.0] * 4
    res = agent.update(mixed)
    assert np.isfinite(res.metrics["train/refer_kl"]) and np.isfinite(res.signals["rho"]).all()


def test_lr_annealing_follows_the_hint():
    agent = make(actor_lr=1e-3, critic_lr=2e-3)
    agent.update(make_batch(agent, hints=HINTS | {"lr_scale": 1 / (1 + 5e-7 * 1e6)}))
    assert agent.actor_opt.param_groups[0]["lr"] == pytest.approx(1e-3 / 1.5)
    assert agent.critic_opt.param_groups[0]["lr"] == pytest.approx(2e-3 / 1.5)


def test_bad_input_is_refused_clearly():
    agent = make()
    b = make_batch(agent, hints=HINTS)
    no_mu = Batch(**{k: getattr(b, k) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")},
                  info=b.info, extras={"mu_mean": b.mu_mean})
    before = params(agent)
    with pytest.raises(ValueError, match="behaviour column 'mu_std'"):
        agent.update(no_mu)
    std = np.broadcast_to(SIGMA_ENV, (B, ACT)).astype(np.float32).copy()
    std[5, 1] = 0.0
    with pytest.raises(ValueError, match="mu_std of batch row 5"):
        agent.update(make_batch(agent, hints=HINTS, mu_std=std))
    with pytest.raises(ValueError, match="Gaussian exploration"):
        make(exploration_noise="ou").update(b)
    torch.testing.assert_close(params(agent), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="exploration_noise"):
        DDPGConfig(exploration_noise="uniform")


def test_ou_noise_is_temporally_correlated_and_reset():
    agent = make(exploration_noise="ou", sigma=0.2)
    obs = np.zeros((3, OBS), np.float32)
    mean = agent.act(obs, explore=False).action
    d = [agent.act(obs, explore=True).action - mean for _ in range(4)]
    assert not np.allclose(d[0], d[1])
    assert agent.ou_state.shape == (3, ACT)
    agent.reset_noise()
    assert agent.ou_state.numel() == 0
    assert len(agent.loop_hooks(None)) == 1 and make().loop_hooks(None) == []


def test_save_load_restores_everything(tmp_path):
    agent = make(exploration_noise="ou")
    for s in range(2):
        agent.update(make_batch(agent, seed=s))
    agent.act(np.zeros((2, OBS), np.float32), explore=True)
    save_tree(tmp_path / "agent", agent.state_dict(), kind="agent")
    clone = make(seed=9, exploration_noise="ou")
    clone.load_state_dict(load_tree(tmp_path / "agent", kind="agent"))
    obs = np.random.default_rng(1).normal(size=(2, OBS)).astype(np.float32)
    np.testing.assert_array_equal(agent.act(obs, True).action, clone.act(obs, True).action)
    b = make_batch(agent, seed=7)
    r1, r2 = agent.update(b), clone.update(b)
    torch.testing.assert_close(params(agent), params(clone), rtol=0, atol=0)
    assert r1.metrics == r2.metrics


def test_ddpg_learns_a_one_step_bandit():
    """r = -|a - a*|^2, every step terminal: the critic learns Q(s, a) = r and the actor climbs towards a* (within
    what a 32x32 ReLU critic resolves of the quadratic)."""
    agent = make(seed=0, actor_lr=3e-3, critic_lr=3e-3)
    rng = np.random.default_rng(0)
    target = np.array([0.8, -0.3], np.float32)
    obs = np.zeros((64, OBS), np.float32)
    start = np.abs(agent.act(obs[:1], explore=False).action[0] - target).max()
    for step in range(600):
        a = agent.act(obs, explore=True).action if step % 2 else rng.uniform(LOW, HIGH, (64, ACT)).astype(np.float32)
        r = -((a - target) ** 2).sum(1)
        info = SampleInfo(np.arange(64), np.ones(64, np.int64), np.full(64, 1 / 64), np.ones(64, np.float32),
                          np.ones(64, np.int8))
        agent.update(Batch(obs, a, r.astype(np.float32), obs, np.ones(64, bool), np.zeros(64, bool), info=info))
    end = np.abs(agent.act(obs[:1], explore=False).action[0] - target).max()
    assert end < 0.2 and end < start / 3, (start, end)


# -- SAC + ReF-ER (our extension) ----------------------------------------------------------------------------
from relive.agents.sac import SAC, SACConfig  # noqa: E402
from relive.agents.sac_refer import SACReFER, SACReFERConfig  # noqa: E402


def make_sac(seed=0, **overrides):
    return SACReFER(OBS, ACT, LOW, HIGH, SACReFERConfig(**(dict(hidden=(32, 32)) | overrides)), seed=seed)


def sac_batch(agent, seed=0, far_rows=(), hints=None):
    """Near rows: the stored action is the squashed policy mean and mu = pi (rho = 1). Far rows: mu's mean is 4
    pre-squash units (~4 policy stds) from pi's and the action is its squashed mean: log rho < -7."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(B, OBS)).astype(np.float32)
    with torch.no_grad():
        mean, log_std = agent.actor(t(obs))
    mu_mean, mu_std = mean.numpy().copy(), log_std.exp().numpy().copy()
    far = np.zeros(B, bool)
    far[list(far_rows)] = True
    mu_mean[far] = np.where(mu_mean[far] > 0, -4.0, 4.0)
    action = agent.actor.squash(t(mu_mean)).numpy()
    info = SampleInfo(np.arange(B), np.ones(B, np.int64), np.full(B, 1 / B), np.ones(B, np.float32),
                      np.ones(B, np.int8), hints=hints or {})
    return Batch(obs=obs, action=action, reward=rng.normal(size=B).astype(np.float32),
                 next_obs=rng.normal(size=(B, OBS)).astype(np.float32), terminated=rng.random(B) < 0.2,
                 truncated=np.zeros(B, bool), info=info, extras={"mu_mean": mu_mean, "mu_std": mu_std})


def sac_params(agent):
    return {name: torch.cat([p.detach().flatten() for p in m.parameters()])
            for name, m in (("actor", agent.actor), ("critic", agent.critic), ("target", agent.target_critic))}


def test_sac_refer_records_the_pre_squash_behaviour_and_its_rho():
    agent = make_sac()
    obs = np.random.default_rng(0).normal(size=(8, OBS)).astype(np.float32)
    out = agent.act(obs, explore=True)
    with torch.no_grad():
        mean, log_std = agent.actor(t(obs))
    np.testing.assert_allclose(out.record["mu_mean"], mean.numpy(), rtol=1e-6)
    np.testing.assert_allclose(out.record["mu_std"], log_std.exp().numpy(), rtol=1e-6)
    b = sac_batch(agent, seed=1, far_rows=(2,), hints=HINTS)
    b = Batch(**{k: getattr(b, k) for k in ("obs", "reward", "next_obs", "terminated", "truncated")},
              action=np.clip(b.action + 0.1, LOW, HIGH).astype(np.float32), info=b.info, extras=b.extras)
    tb = b.to_torch()
    with torch.no_grad():  # the squashed densities of the stored action; the Jacobian cancels in the ratio
        mean, log_std = agent.actor(tb.obs)
        log_pi = agent.actor.log_prob_from(mean, log_std, tb.action).sum(-1)
        log_mu = agent.actor.log_prob_from(tb.mu_mean, torch.log(tb.mu_std), tb.action).sum(-1)
    expected = (log_pi - log_mu).clamp(-7, 7).numpy()
    np.testing.assert_allclose(agent.refer_log_rho(b.obs, b.action, b.mu_mean, b.mu_std), expected, atol=2e-3)
    res = agent.update(b)
    np.testing.assert_allclose(np.log(res.signals["rho"]), expected, atol=2e-3)
    assert set(res.signals) == {"td_error", "log_likelihood", "rho"} and expected[2] == -7


def test_sac_refer_without_hints_is_sac():
    a, b = make_sac(seed=3), SAC(OBS, ACT, LOW, HIGH, SACConfig(hidden=(32, 32)), seed=3)
    for s in range(2):
        batch = sac_batch(a, seed=s)
        ra, rb = a.update(batch), b.update(batch)
        assert {k: v for k, v in ra.metrics.items() if k != "train/kl_behaviour"} == rb.metrics
    for name, value in sac_params(a).items():
        torch.testing.assert_close(value, sac_params(b)[name], rtol=0, atol=0)


def test_sac_refer_rule1_masks_critic_and_actor_and_the_temperature_is_untouched():
    """All rows far, Rule 1 alone: critic and actor keep every parameter; the temperature steps exactly as plain
    SAC's on the same batch (its loss uses log pi of fresh samples only)."""
    agent, plain = make_sac(refer_rule2=False), SAC(OBS, ACT, LOW, HIGH, SACConfig(hidden=(32, 32)), seed=0)
    before = sac_params(agent)
    b = sac_batch(agent, seed=2, far_rows=range(B), hints=HINTS)
    res = agent.update(b)
    assert res.metrics["train/refer_near_fraction"] == 0.0
    after = sac_params(agent)
    torch.testing.assert_close(after["actor"], before["actor"], rtol=0, atol=0)
    torch.testing.assert_close(after["critic"], before["critic"], rtol=0, atol=0)
    plain.update(b)
    assert agent.log_alpha.item() == plain.log_alpha.item() != 0.0


def test_sac_refer_rule2_actor_gradient():
    """The actor's gradient is beta * grad(SAC actor loss on near rows) + (1 - beta) * grad KL(mu || pi) over all
    rows, the KL from torch.distributions on the pre-squash Gaussians."""
    beta = 0.4
    agent = make_sac()
    b = sac_batch(agent, seed=5, far_rows=(1, 9), hints=HINTS | {"beta": beta})
    b = Batch(**{k: getattr(b, k) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")},
              info=b.info, extras={"mu_mean": b.mu_mean + 0.3, "mu_std": b.mu_std * 1.5})
    captured = []
    agent.actor_opt.step = lambda *a, **k: captured.append(
        torch.cat([p.grad.flatten() for p in agent.actor.parameters()]))
    # replay the generator: the critic target draws first, then the actor's reparameterized sample
    tb = b.to_torch()
    state = agent.gen.get_state()
    agent.update(b)
    ref = make_sac()
    ref.gen.set_state(state)
    ref.critic_target(tb.reward, tb.next_obs, tb.terminated)
    ref.critic.load_state_dict(agent.critic.state_dict())  # the actor step sees the critic after its step
    mean, log_std = ref.actor(tb.obs)
    per_sample, _ = ref.actor_loss(tb.obs, mean, log_std)
    near = torch.ones(B)
    near[[1, 9]] = 0
    g = torch.autograd.grad((near * per_sample).mean(), list(ref.actor.parameters()), retain_graph=True)
    mu = torch.distributions.Normal(tb.mu_mean, tb.mu_std)
    pi = torch.distributions.Normal(mean, log_std.exp())
    g_d = torch.autograd.grad(torch.distributions.kl_divergence(mu, pi).sum(-1).mean(), list(ref.actor.parameters()))
    expected = torch.cat([(beta * x + (1 - beta) * y).flatten() for x, y in zip(g, g_d, strict=True)])
    torch.testing.assert_close(captured[0], expected, rtol=1e-4, atol=1e-6)


# -- a manual loop through the plug-in seams (until the trainer serves them) ---------------------------------
def _run_loop(sampler, steps=300, seed=0, agent_cls=DDPG, config=None):
    """Pendulum-v1, one env step then one gradient step: ``act`` -> Acted record -> buffer columns; the sampler's
    hints -> ``update``; signals -> ``buffer.update``; the sampler's EveryGradSteps hooks before sampling."""
    import gymnasium as gym

    from relive.hooks import EveryGradSteps, LoopContext, collect_hooks, of_type
    from relive.replay import ReplayBuffer
    from relive.types import unpack_acted

    env = gym.make("Pendulum-v1")
    low, high = env.action_space.low, env.action_space.high
    agent = agent_cls(3, 1, low, high, config or DDPGConfig(hidden=(32, 32)), seed=seed)
    buf = ReplayBuffer(1000, 3, 1, sampler=sampler, seed=seed,
                       extra_columns={d.name: d.spec for d in agent.stored_columns()})
    hooks = of_type(collect_hooks(LoopContext(agent, buf, None, 0.99), agent, buf.sampler), EveryGradSteps)
    obs, _ = env.reset(seed=seed)
    metrics = []
    for step in range(steps):
        action, record, store = unpack_acted(agent.act(obs[None].astype(np.float32), explore=True))
        next_obs, reward, term, trunc, _ = env.step(action[0])
        buf.extend(dict(obs=obs[None], action=action, reward=np.float32([reward]), next_obs=next_obs[None],
                        terminated=[term], truncated=[trunc], **record))
        obs = env.reset()[0] if term or trunc else next_obs
        if step < 64:
            continue
        grad_step = step - 64
        for h in hooks:
            if h.phase == "online" and grad_step % h.every == 0:
                h.fn()
        b = buf.sample(64)
        res = agent.update(b)
        buf.update(b.info, **res.signals)
        metrics.append(res.metrics)
    return agent, buf, metrics


def test_ddpg_refer_runs_through_the_plug_in_seams_on_pendulum():
    from relive.replay.samplers.refer import ReFERSampler

    sampler = ReFERSampler(recount_every_grad_steps=50, beta_eta=0.02, A=1e-3, initial_beta=0.5)
    agent, buf, metrics = _run_loop(sampler, steps=300)
    assert all(np.isfinite(v) for m in metrics for v in m.values())
    s = buf.sampler
    assert s.t == 236 and s.num_recounts == 5
    assert s.c_max == pytest.approx(1 + 4 / (1 + 1e-3 * 236))
    assert buf.storage.columns["mu_std"][:300] == pytest.approx(0.2 * 2.0)  # sigma x half-width of [-2, 2]
    assert s.beta != 0.5 and 0 <= s.far_fraction() <= 1
    brute = np.exp(np.clip(agent.refer_log_rho(*(buf.storage.columns[c][:300] for c in
                                                 ("obs", "action", "mu_mean", "mu_std"))), -7, 7))
    s.recount(agent.refer_log_rho)
    assert s.far_fraction() == pytest.approx(is_far_fraction(brute, s.c_max))
    assert "train/refer_kl" in metrics[-1] and metrics[-1]["train/kl_behaviour"] > 0


def test_behaviour_kl_metric_is_the_mean_kl_over_rows_with_a_record():
    agent = make()
    std = np.broadcast_to(SIGMA_ENV, (B, ACT)).astype(np.float32).copy()
    std[:3] = 0.0  # no record (offline fill)
    b = make_batch(agent, seed=6, mu_std=std)
    b = Batch(**{k: getattr(b, k) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")},
              info=b.info, extras={"mu_mean": (b.mu_mean + 0.1).astype(np.float32), "mu_std": std})
    with torch.no_grad():
        m = agent.actor(t(b.obs[3:])).numpy()
    expected = ((((m - b.mu_mean[3:]) / SIGMA_ENV) ** 2).sum(1) / 2).mean()
    assert agent.behaviour_kl(b.to_torch())["train/kl_behaviour"] == pytest.approx(expected, rel=1e-4)
    assert agent.behaviour_kl(make_batch(agent, mu_std=np.zeros((B, ACT), np.float32)).to_torch()) == {}


def is_far_fraction(rho, c_max):
    return float(refer_schedule.is_far(rho, c_max).mean())


def test_ddpg_with_per_uses_td_errors_and_sac_refer_runs_the_loop():
    from relive.replay import PrioritizedSampler
    from relive.replay.samplers.refer import ReFERSampler

    _, buf, metrics = _run_loop(PrioritizedSampler(), steps=120)
    p = buf.sampler.probabilities()[:120]
    assert p.max() > 2 * p.min()  # priorities moved off the initial max
    assert "train/refer_beta" not in metrics[-1]
    _, buf, metrics = _run_loop(ReFERSampler(recount_every_grad_steps=20, initial_beta=0.5), steps=120,
                                agent_cls=SACReFER, config=SACReFERConfig(hidden=(32, 32)))
    assert buf.sampler.t == 56 and buf.sampler.num_recounts == 3
    assert "train/refer_kl" in metrics[-1] and all(np.isfinite(v) for m in metrics for v in m.values())
