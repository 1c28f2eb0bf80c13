"""V-RACER: Retrace targets (hand computation, lambda = 0, through the buffer's episodes), the densities and
ReF-ER pieces against closed forms, the off-policy policy gradient and both ReF-ER rules by autograd,
checkpoints, the hooks, and a small seeded learning test."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from relive.agents.vracer import Q_RET_UNSET, VRACER, VRACERConfig, clipped_gaussian_log_prob, retrace_targets
from relive.hooks import EveryGradSteps, OnEpisodeEnd
from relive.replay.buffer import ReplayBuffer
from relive.replay.checkpoint import load_tree, save_tree
from relive.replay.refer_schedule import is_far
from relive.types import Acted, Batch, SampleInfo

torch.set_num_threads(1)
OBS, ACT = 3, 2
LOW, HIGH = np.array([-1.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32)
SMALL = dict(hidden=(16, 16))


def make(seed=0, **overrides) -> VRACER:
    return VRACER(OBS, ACT, LOW, HIGH, VRACERConfig(**(SMALL | overrides)), seed=seed)


def make_buffer(agent, capacity) -> ReplayBuffer:
    return ReplayBuffer(capacity, (OBS,), (ACT,), extra_columns={d.name: d.spec for d in agent.stored_columns()})


def behaviour_batch(agent, n=32, seed=0, shift=0.3, q_ret=None, hints=None) -> Batch:
    """Rows whose behaviour is the agent's current policy with its mean shifted by ``shift`` std, actions
    drawn from that behaviour (and clipped), q_ret ~ N(0, 1) unless given."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    with torch.no_grad():
        _, mean, std = agent.net(torch.as_tensor(obs))
    mu_mean = (mean + shift * std).numpy()
    mu_std = (std * 1.2).numpy()
    action = np.clip(mu_mean + mu_std * rng.normal(size=(n, ACT)), LOW, HIGH).astype(np.float32)
    info = SampleInfo(np.arange(n), np.ones(n, np.int64), np.full(n, 1 / n), np.ones(n, np.float32),
                      np.ones(n, np.int8), hints=hints or {})
    q = rng.normal(size=n).astype(np.float32) if q_ret is None else np.asarray(q_ret, np.float32)
    return Batch(obs=obs, action=action, reward=rng.normal(size=n).astype(np.float32),
                 next_obs=rng.normal(size=(n, OBS)).astype(np.float32), terminated=rng.random(n) < 0.2,
                 truncated=np.zeros(n, bool), info=info,
                 extras={"mu_mean": mu_mean, "mu_std": mu_std, "q_ret": q})


def with_hints(b: Batch, **hints) -> Batch:
    i = b.info
    return Batch(b.obs, b.action, b.reward, b.next_obs, b.terminated, b.truncated,
                 SampleInfo(i.indices, i.generation, i.probability, i.is_weight, i.source, hints), b.extras)


def params(agent) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in agent.net.parameters()])


# -- Retrace targets --------------------------------------------------------------------------------------
def test_retrace_targets_match_a_hand_computation():
    """Three episodes end to end: terminated (3 rows), truncated (2), still running (2); gamma 0.9.
    Row t holds r_{t+1}; trace_next[t] = lambda min(1, rho_{t+1})."""
    reward = [1, 2, 3, 0, 1, -1, 0.5]
    terminated = [0, 0, 1, 0, 0, 0, 0]
    v_next = [10, 20, 99, 5, 7, 2, 4]  # the 99 follows a terminal step: never used
    trace = [0.5, 0.25, 0.7, 1.0, 0.7, 0.0, 0.7]  # at last rows unused
    q = retrace_targets(reward, terminated, v_next, trace, [3, 2, 2], gamma=0.9)
    # terminated: q2 = 3; q1 = 2 + .9 (20 + .25 (3 - 20)) = 16.175; q0 = 1 + .9 (10 + .5 (16.175 - 10))
    # truncated: q1 = 1 + .9 * 7 = 7.3; q0 = 0 + .9 (5 + 1 (7.3 - 5)) = 6.57
    # running (bootstraps like a truncated end): q1 = .5 + .9 * 4 = 4.1; q0 = -1 + .9 (2 + 0) = 0.8
    expected = [1 + 0.9 * (10 + 0.5 * 6.175), 16.175, 3.0, 6.57, 7.3, 0.8, 4.1]
    np.testing.assert_allclose(q, expected, rtol=1e-12)


def test_retrace_with_zero_trace_is_the_one_step_target():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, size=20)
    n = int(lengths.sum())
    reward, v_next = rng.normal(size=n), rng.normal(size=n)
    terminated = np.zeros(n, bool)
    terminated[np.cumsum(lengths)[rng.random(20) < 0.5] - 1] = True  # some episodes end in a terminal step
    q = retrace_targets(reward, terminated, v_next, np.zeros(n), lengths, gamma=0.97)
    np.testing.assert_allclose(q, reward + 0.97 * (1 - terminated) * v_next, rtol=1e-12)
    # and with a full trace (lambda = 1, rho >= 1) an episode's first target is its discounted return +
    # the discounted bootstrap
    q1 = retrace_targets(reward, terminated, v_next, np.ones(n), lengths, gamma=0.97)
    L = int(lengths[0])
    ret = sum(0.97**k * reward[k] for k in range(L)) + 0.97**L * (1 - terminated[L - 1]) * v_next[L - 1]
    assert q1[0] == pytest.approx(ret, rel=1e-12)


def fill_episodes(agent, behaviour, buf, lengths, ends, seed=0):
    """Write episodes (``ends``: "term", "trunc" or "open" per episode) acted by ``behaviour`` into ``buf``;
    next_obs[t] == obs[t+1] inside an episode, as a collector writes them. Returns the slots of each episode."""
    rng = np.random.default_rng(seed)
    all_slots = []
    for L, end in zip(lengths, ends, strict=True):
        o = rng.normal(size=(L + 1, OBS)).astype(np.float32)
        acted = behaviour.act(o[:-1], explore=True)
        term, trunc = np.zeros(L, bool), np.zeros(L, bool)
        term[-1], trunc[-1] = end == "term", end == "trunc"
        all_slots.append(buf.extend(dict(obs=o[:-1], action=acted.action, reward=rng.normal(size=L).astype(np.float32),
                                         next_obs=o[1:], terminated=term, truncated=trunc, **acted.record,
                                         q_ret=np.full(L, Q_RET_UNSET, np.float32))))
    return all_slots


def reference_targets(agent, buf, slots) -> np.ndarray:
    """Eq. 6 row by row in plain Python over one stored episode, with the agent's network."""
    cols = buf.storage.columns
    lam, gamma = agent.cfg.retrace_lambda, agent.cfg.gamma
    with torch.no_grad():
        v, mean, std = agent.net(torch.as_tensor(cols["obs"][slots]))
        a = torch.as_tensor(cols["action"][slots])
        log_mu = clipped_gaussian_log_prob(torch.as_tensor(cols["mu_mean"][slots]),
                                           torch.as_tensor(cols["mu_std"][slots]), a, agent.net.low, agent.net.high)
        rho = torch.exp(torch.clamp(agent.net.log_prob(mean, std, a) - log_mu, -7, 7)).numpy()
        v_end = agent.net(torch.as_tensor(cols["next_obs"][slots[-1:]]))[0].item()
    v, r = v.numpy().astype(np.float64), agent.reward_scale * cols["reward"][slots].astype(np.float64)
    q = np.zeros(len(slots))
    q[-1] = r[-1] + (0.0 if cols["terminated"][slots[-1]] else gamma * v_end)
    for t in range(len(slots) - 2, -1, -1):
        q[t] = r[t] + gamma * (v[t + 1] + lam * min(1.0, rho[t + 1]) * (q[t + 1] - v[t + 1]))
    return q


def test_refresh_rewrites_every_stored_episode_like_a_per_episode_loop_across_the_ring_wrap():
    agent = make(seed=0, gamma=0.9, retrace_lambda=0.8, refresh_chunk_rows=5)
    behaviour = make(seed=1)  # another policy acted: rho != 1
    buf = make_buffer(agent, capacity=40)
    lengths, ends = [7, 12, 9, 15, 8, 11], ["term", "trunc", "term", "trunc", "term", "open"]
    fill_episodes(agent, behaviour, buf, lengths, ends)  # 62 rows: the first 22 were overwritten
    agent.refresh_targets(buf)
    ep = buf.storage.episodes.live()
    assert ep.length.tolist() == [6, 15, 8, 11] and ep.finished.tolist() == [True, True, True, False]
    q_ret = buf.storage.columns["q_ret"]
    for start, length, source in zip(ep.start, ep.length, ep.source, strict=True):
        slots = buf.storage.episode_slots([start], [length], [source])
        np.testing.assert_allclose(q_ret[slots], reference_targets(agent, buf, slots), rtol=2e-5, atol=2e-5)
    chunked = q_ret.copy()
    whole = make(seed=0, gamma=0.9, retrace_lambda=0.8)  # one chunk: the same numbers (up to float32 matmuls)
    whole.refresh_targets(buf)
    np.testing.assert_allclose(q_ret, chunked, rtol=1e-5, atol=1e-6)
    assert (q_ret != Q_RET_UNSET).all() and agent.num_refreshes == 1
    rewards = buf.storage.columns["reward"].astype(np.float64)
    assert agent.reward_scale == pytest.approx(1 / np.sqrt(np.mean(rewards**2)), rel=1e-12)  # default: 1 / RMS


def test_episode_end_hook_fills_only_that_episode():
    agent = make(seed=0, gamma=0.9, retrace_lambda=0.8)
    buf = make_buffer(agent, capacity=100)
    slots = fill_episodes(agent, make(seed=1), buf, [5, 6], ["trunc", "term"])
    hooks = agent.loop_hooks(type("Ctx", (), {"buffer": buf})())
    assert {type(h) for h in hooks} == {EveryGradSteps, OnEpisodeEnd}
    assert sorted(h.phase for h in hooks if isinstance(h, EveryGradSteps)) == ["offline", "online"]
    [end_hook] = [h for h in hooks if isinstance(h, OnEpisodeEnd)]
    end_hook.fn(slots[1])
    q_ret = buf.storage.columns["q_ret"]
    np.testing.assert_allclose(q_ret[slots[1]], reference_targets(agent, buf, slots[1]), rtol=2e-5, atol=2e-5)
    assert (q_ret[slots[0]] == Q_RET_UNSET).all()


def test_rows_without_a_target_use_the_one_step_target():
    agent = make(seed=0)
    b = behaviour_batch(agent, n=8, q_ret=[Q_RET_UNSET] * 4 + [1.0] * 4).to_torch()
    v, mean, std = agent.net(b.obs)
    _, _, d = agent.losses(b, v, mean, std)
    with torch.no_grad():
        one_step = b.reward + agent.cfg.gamma * (1 - b.terminated) * agent.net(b.next_obs)[0]
    torch.testing.assert_close(d["q_ret"], torch.cat([one_step[:4], torch.ones(4)]))


# -- densities and ReF-ER pieces against closed forms ---------------------------------------------------
def test_clipped_gaussian_density_closed_forms():
    mean = torch.tensor([[0.3, -0.5], [0.9, 1.5]], dtype=torch.float64)
    std = torch.tensor([[0.4, 0.7], [0.2, 1.1]], dtype=torch.float64)
    low, high = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)
    action = torch.tensor([[0.1, -2.0], [1.0, 0.3]], dtype=torch.float64)  # row 0 dim 1 at low, row 1 dim 0 at high
    got = clipped_gaussian_log_prob(mean, std, action, low, high).numpy()
    m, s = mean.numpy(), std.numpy()
    expected = [norm.logpdf(0.1, m[0, 0], s[0, 0]) + norm.logcdf((-2.0 - m[0, 1]) / s[0, 1]),
                norm.logsf((1.0 - m[1, 0]) / s[1, 0]) + norm.logpdf(0.3, m[1, 1], s[1, 1])]
    np.testing.assert_allclose(got, expected, rtol=1e-10)


# -- the gradients ------------------------------------------------------------------------------------------
def hand_batch(hints=None) -> tuple[Batch, dict]:
    """Four rows, two action dims (row 1 dim 0 clipped at low, row 2 dim 1 at high), outputs chosen by hand."""
    out = dict(v=np.array([0.5, -1.0, 2.0, 0.0]),
               mean=np.array([[0.1, 0.2], [-0.6, 0.5], [0.3, 1.2], [-0.2, -0.4]]),
               std=np.array([[0.5, 0.8], [0.3, 1.0], [0.6, 0.9], [0.4, 0.7]]))
    action = np.array([[0.3, -0.1], [-1.0, 0.9], [0.0, 2.0], [-0.5, -1.0]], np.float32)
    mu_mean = out["mean"] + np.array([[0.1, -0.2], [0.2, 0.1], [-0.1, 0.3], [0.05, 0.0]])
    mu_std = out["std"] * np.array([[1.1, 0.9], [1.0, 1.2], [0.8, 1.0], [1.3, 1.0]])
    info = SampleInfo(np.arange(4), np.ones(4, np.int64), np.full(4, 0.25), np.ones(4, np.float32), np.ones(4, np.int8),
                      hints=hints or {})
    b = Batch(obs=np.zeros((4, OBS), np.float32), action=action, reward=np.zeros(4, np.float32),
              next_obs=np.zeros((4, OBS), np.float32), terminated=np.zeros(4, bool), truncated=np.zeros(4, bool),
              info=info, extras={"mu_mean": mu_mean.astype(np.float32), "mu_std": mu_std.astype(np.float32),
                                 "q_ret": np.array([1.0, -2.0, 0.5, 3.0], np.float32)})
    return b, out


def leaf_outputs(out):
    return [torch.tensor(out[k], dtype=torch.float32, requires_grad=True) for k in ("v", "mean", "std")]


def closed_form_log_prob_and_grads(a, m, s, low, high):
    """Per-dim log pi and its derivatives in the mean and the std, censored at the bounds (scipy)."""
    z = (a - m) / s
    logp, dm, ds = norm.logpdf(a, m, s), z / s, (z**2 - 1) / s
    lo, hi = a <= low, a >= high
    zl, zh = (low - m) / s, (m - high) / s
    hazard_l, hazard_h = np.exp(norm.logpdf(zl) - norm.logcdf(zl)), np.exp(norm.logpdf(zh) - norm.logcdf(zh))
    logp = np.where(lo, norm.logcdf(zl), np.where(hi, norm.logcdf(zh), logp))
    dm = np.where(lo, -hazard_l / s, np.where(hi, hazard_h / s, dm))
    ds = np.where(lo, -hazard_l * zl / s, np.where(hi, -hazard_h * zh / s, ds))
    return logp.sum(-1), dm, ds


def test_policy_and_value_gradients_equal_the_closed_forms():
    """d/dmean and d/dstd of the batch loss = -rho A-hat d log pi / B (Eq. 5, censored density at the bounds);
    d/dV = -min(1, rho) (Q^ret - V) / B (Eq. 7-9)."""
    agent = make()
    b, out = hand_batch()
    v, mean, std = leaf_outputs(out)
    task, _, d = agent.losses(b.to_torch(), v, mean, std)
    task.mean().backward()
    a, ex = b.action.astype(np.float64), b.extras
    logp, dm, ds = closed_form_log_prob_and_grads(a, out["mean"], out["std"], LOW, HIGH)
    logmu, _, _ = closed_form_log_prob_and_grads(a, ex["mu_mean"], ex["mu_std"], LOW, HIGH)
    rho = np.exp(logp - logmu)
    adv = ex["q_ret"] - out["v"]
    np.testing.assert_allclose(d["rho"].numpy(), rho, rtol=1e-5)
    assert 0.2 < rho.min() and rho.max() < 5 and (rho > 1).any() and (rho < 1).any()
    np.testing.assert_allclose(mean.grad.numpy(), -(rho * adv)[:, None] * dm / 4, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(std.grad.numpy(), -(rho * adv)[:, None] * ds / 4, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), -np.minimum(1, rho) * adv / 4, rtol=1e-5, atol=1e-7)


def test_refer_log_rho_of_stored_rows_equals_the_updates_rho_signal():
    agent = make(refresh_chunk_rows=7)  # the recount's chunks
    b = behaviour_batch(agent, n=32, shift=0.8)
    rho = np.exp(agent.refer_log_rho(b.obs, b.action, b.mu_mean, b.mu_std))
    np.testing.assert_allclose(rho, agent.update(b).signals["rho"], rtol=1e-5)
    assert rho.std() > 0.1


def test_rule1_far_rows_get_zero_gradient_and_near_rows_the_plain_one():
    agent = make()
    b, out = hand_batch()
    grads = {}
    for c_max in (math.inf, 1.3):
        outs = leaf_outputs(out)
        task, _, d = agent.losses(b.to_torch(), *outs, c_max=c_max)
        task.sum().backward()
        grads[c_max] = [t.grad for t in outs]
    far = is_far(d["rho"], 1.3)
    assert 0 < far.sum() < 4  # a mixed batch
    for g_plain, g_rule1 in zip(grads[math.inf], grads[1.3], strict=True):
        assert (g_rule1[far] == 0).all()
        torch.testing.assert_close(g_rule1[~far], g_plain[~far])


def test_rows_of_a_source_the_sampler_does_not_cover_are_exempt_from_both_rules():
    """``refer_source`` = 0 (ReF-ER on the offline part only, say) and every row online: nothing is far and no
    KL is charged, whatever c_max and beta say; covering the online source brings both rules back."""
    agent = make()
    b, out = hand_batch()  # every row has source 1
    plain_task, _, _ = agent.losses(b.to_torch(), *leaf_outputs(out))
    for source, expect_rules in ((0, False), (1, True)):
        bt = with_hints(b, c_max=1.3, beta=0.5, refer_source=source).to_torch()
        c_max, beta, covered = agent.refer_view(bt)
        task, kl, d = agent.losses(bt, *leaf_outputs(out), c_max=c_max, covered=covered)
        assert (c_max, beta) == (1.3, 0.5)
        assert bool((kl > 0).all()) == expect_rules and bool((~d["near"]).any()) == expect_rules
        if not expect_rules:
            assert (kl == 0).all()
            torch.testing.assert_close(task, plain_task)


def test_the_learning_rate_follows_the_samplers_lr_scale_or_its_own_annealing():
    agent = make(lr=1e-3, lr_anneal=0.01)
    b = behaviour_batch(agent)
    agent.update(b)
    agent.update(b)
    assert agent.lr_now() == pytest.approx(1e-3 / (1 + 0.01 * 2))
    assert agent.opt.param_groups[0]["lr"] == pytest.approx(1e-3 / (1 + 0.01 * 1))  # the lr of the last step
    agent.update(with_hints(b, c_max=5.0, beta=1.0, lr_scale=0.25))
    assert agent.opt.param_groups[0]["lr"] == pytest.approx(2.5e-4)  # the sampler's schedule, not both


def test_rule1_all_far_batch_leaves_every_parameter_bit_identical():
    agent = make(lr=1e-2)
    for s in range(3):  # Adam has momentum now: a zero-gradient step would still move the parameters
        agent.update(behaviour_batch(agent, seed=s))
    before = params(agent).clone()
    far_batch = behaviour_batch(agent, seed=9, shift=6.0)  # behaviour 6 std away: rho ~ 0
    res = agent.update(with_hints(far_batch, c_max=2.0, beta=1.0))
    assert res.metrics["train/refer_near_fraction"] == 0.0 and agent.num_skipped_steps == 1
    assert torch.equal(params(agent), before)
    assert agent.num_grad_steps == 4  # the step still counts (learning-rate annealing)
    agent.update(far_batch)  # without ReF-ER the same batch moves the parameters
    assert not torch.equal(params(agent), before)


def test_rule2_step_is_beta_times_the_task_gradient_minus_one_minus_beta_times_grad_kl():
    """With SGD at rate 1 the parameter change is the update direction itself: beta g - (1 - beta) grad KL,
    g = -grad of the task surrogate mean(-rho A-hat log pi - min(1, rho) A-hat V) (rho, A-hat held fixed),
    both by autograd on formulas written here (KL from torch.distributions)."""
    beta = 0.3
    agent = make(lr=1.0, lr_anneal=0.0)
    agent.opt = torch.optim.SGD(agent.net.parameters(), lr=1.0)
    b = behaviour_batch(agent, n=16, shift=0.5)
    ref = copy.deepcopy(agent.net)
    bt = b.to_torch()
    v, mean, std = ref(bt.obs)
    log_pi = ref.log_prob(mean, std, bt.action)
    with torch.no_grad():
        rho = torch.exp(torch.clamp(log_pi - ref.log_prob(bt.mu_mean, bt.mu_std, bt.action), -7, 7))
        adv = bt.q_ret - v
    task = (-rho * adv * log_pi - torch.clamp(rho, max=1) * adv * v).mean()
    kl = torch.distributions.kl_divergence(torch.distributions.Normal(bt.mu_mean, bt.mu_std),
                                           torch.distributions.Normal(mean, std)).sum(-1).mean()
    g_task = torch.autograd.grad(task, list(ref.parameters()), retain_graph=True)
    g_kl = torch.autograd.grad(kl, list(ref.parameters()))
    expected = torch.cat([(-beta * gt - (1 - beta) * gk).flatten() for gt, gk in zip(g_task, g_kl, strict=True)])
    before = params(agent).clone()
    res = agent.update(with_hints(b, beta=beta, c_max=math.inf))
    assert res.metrics["train/refer_kl"] > 1e-3
    torch.testing.assert_close(params(agent) - before, expected, rtol=1e-4, atol=1e-6)


# -- acting, checkpoints, registry -----------------------------------------------------------------------
def test_act_returns_clipped_actions_with_the_behaviour_record():
    agent = make(init_std=3.0)  # wide: many samples clipped
    obs = np.random.default_rng(0).normal(size=(64, OBS)).astype(np.float32)
    acted = agent.act(obs, explore=True)
    assert isinstance(acted, Acted) and acted.action.shape == (64, ACT) and acted.action.dtype == np.float32
    assert (acted.action >= LOW).all() and (acted.action <= HIGH).all() and (acted.action == HIGH).any()
    with torch.no_grad():
        _, mean, std = agent.net(torch.as_tensor(obs))
    np.testing.assert_array_equal(acted.record["mu_mean"], mean.numpy())
    np.testing.assert_array_equal(acted.record["mu_std"], std.numpy())
    np.testing.assert_allclose(std.numpy(), np.broadcast_to((HIGH - LOW) / 2 * 3.0, (64, ACT)), rtol=0.05)
    single = agent.act(obs[0], explore=False)
    np.testing.assert_allclose(single.action, np.clip(mean[0].numpy(), LOW, HIGH), rtol=1e-6, atol=1e-6)
    names = [c.name for c in agent.stored_columns()]
    assert names == ["mu_mean", "mu_std", "q_ret"]


def test_checkpoint_round_trip_is_exact(tmp_path):
    agent = make(seed=0)
    for s in range(3):
        agent.update(behaviour_batch(agent, seed=s))
    agent.act(np.zeros((2, OBS), np.float32), explore=True)  # advance the exploration RNG
    save_tree(tmp_path / "ckpt", agent.state_dict(), kind="agent")
    other = make(seed=5)
    other.load_state_dict(load_tree(tmp_path / "ckpt", kind="agent"))
    assert torch.equal(params(other), params(agent))
    obs = np.random.default_rng(3).normal(size=(8, OBS)).astype(np.float32)
    np.testing.assert_array_equal(other.act(obs, True).action, agent.act(obs, True).action)
    b = behaviour_batch(agent, seed=7, hints={"c_max": 3.0, "beta": 0.5})
    r1, r2 = agent.update(b), other.update(b)
    assert r1.metrics == r2.metrics and torch.equal(params(other), params(agent))
    np.testing.assert_array_equal(r1.signals["rho"], r2.signals["rho"])


def test_registered_and_built_from_an_env_spec():
    from relive.envs import EnvSpec
    from relive.registry import agent_entry

    entry = agent_entry("vracer")
    assert entry.config_cls is VRACERConfig
    spec = EnvSpec("Toy-v0", (OBS,), False, (ACT,), 0, LOW, HIGH, 100)
    a = entry.target.from_spec(spec, VRACERConfig(**SMALL), np.random.SeedSequence(0), "cpu")
    b = entry.target.from_spec(spec, VRACERConfig(**SMALL), np.random.SeedSequence(0), "cpu")
    assert torch.equal(params(a), params(b))
    with pytest.raises(ValueError, match="continuous"):
        entry.target.from_spec(EnvSpec("D-v0", (OBS,), True, (), 3, None, None, 100), VRACERConfig(),
                               np.random.SeedSequence(0), "cpu")


# -- learning -----------------------------------------------------------------------------------------------
def test_learns_a_continuous_bandit_through_buffer_and_hooks():
    """One-step episodes, reward -(a - a*)^2 with a* = (0.5, -1): the agent acts, rows are stored with their
    behaviour record, the episode-end hook writes the targets and updates sample the buffer."""
    agent = make(seed=0, lr=1e-3, lr_anneal=0.0, refresh_every_grad_steps=100)
    buf = make_buffer(agent, capacity=256)
    hooks = agent.loop_hooks(type("Ctx", (), {"buffer": buf})())
    [end_hook] = [h for h in hooks if isinstance(h, OnEpisodeEnd)]
    [refresh] = [h for h in hooks if isinstance(h, EveryGradSteps) and h.phase == "online"]
    target = np.array([0.5, -1.0], np.float32)
    rng = np.random.default_rng(0)
    test_obs = rng.normal(size=(256, OBS)).astype(np.float32)

    def score():
        a = agent.act(test_obs, explore=False).action
        return float(-((a - target) ** 2).sum(-1).mean())

    initial = score()
    for step in range(250):
        obs = rng.normal(size=(4, OBS)).astype(np.float32)
        acted = agent.act(obs, explore=True)
        reward = -((acted.action - target) ** 2).sum(-1).astype(np.float32)
        slots = buf.extend(dict(obs=obs, action=acted.action, reward=reward, next_obs=obs,
                                terminated=np.ones(4, bool), truncated=np.zeros(4, bool), **acted.record,
                                q_ret=np.full(4, Q_RET_UNSET, np.float32)))
        for s in slots:
            end_hook.fn(np.array([s]))
        if step % refresh.every == 0:
            refresh.fn()
        if len(buf) >= 64:
            agent.update(buf.sample(64))
    final = score()
    assert initial < -1.0 and final > -0.02, (initial, final)


def test_a_row_without_a_behaviour_record_is_refused_before_any_change():
    agent = make()
    b = behaviour_batch(agent, n=8)
    b.extras["mu_std"][5] = 0.0  # what a zero-filled record would look like
    before = params(agent).clone()
    with pytest.raises(ValueError, match=r"row 5 .*mu_std must be > 0"):
        agent.update(b)
    assert torch.equal(params(agent), before) and agent.num_grad_steps == 0


@pytest.mark.slow
def test_learns_a_ten_step_reach_task_with_refer_hints():
    """x' = x + a/2 from x ~ U(-2, 2), reward -x'^2, 10 steps then truncated (gamma 0.9): multi-step credit
    through Retrace. Batches carry fixed ReF-ER hints (c_max 2, beta 0.9) as the ReF-ER sampler would; the
    deterministic policy's return goes from about -14 to better than -1.5 (the optimum is about -0.8).
    (Without hints the same runs diverge on 2 of 3 seeds here: the unbounded rho of Eq. 5.)"""
    T = 10
    agent = VRACER(1, 1, [-1.0], [1.0], VRACERConfig(hidden=(32, 32), lr=1e-3, lr_anneal=0.0, gamma=0.9,
                                                     refresh_every_grad_steps=50), seed=0)
    buf = ReplayBuffer(2000, (1,), (1,), extra_columns={d.name: d.spec for d in agent.stored_columns()})
    hooks = agent.loop_hooks(type("Ctx", (), {"buffer": buf})())
    [end_hook] = [h for h in hooks if isinstance(h, OnEpisodeEnd)]
    [refresh] = [h for h in hooks if isinstance(h, EveryGradSteps) and h.phase == "online"]
    rng = np.random.default_rng(0)
    x_test = np.linspace(-2, 2, 64).astype(np.float32)[:, None]

    def evaluate():
        x, ret = x_test.copy(), 0.0
        for _ in range(T):
            x = x + 0.5 * agent.act(x, explore=False).action
            ret += float((-(x**2)).mean())
        return ret

    initial, grad_steps = evaluate(), 0
    for _ in range(150):
        x, rows = rng.uniform(-2, 2, (1, 1)).astype(np.float32), []
        for t in range(T):
            acted = agent.act(x, explore=True)
            x2 = (x + 0.5 * acted.action).astype(np.float32)
            rows.append(dict(obs=x, action=acted.action, reward=-(x2[:, 0] ** 2), next_obs=x2,
                             terminated=np.zeros(1, bool), truncated=np.array([t == T - 1]), **acted.record,
                             q_ret=np.full(1, Q_RET_UNSET, np.float32)))
            x = x2
        end_hook.fn(buf.extend({k: np.concatenate([r[k] for r in rows]) for k in rows[0]}))
        for _ in range(T if len(buf) >= 64 else 0):
            if grad_steps % refresh.every == 0:
                refresh.fn()
            agent.update(with_hints(buf.sample(64), c_max=2.0, beta=0.9))
            grad_steps += 1
    final = evaluate()
    assert initial < -10 and final > -1.5, (initial, final)


@pytest.mark.parametrize("preset", ["vracer", "vracer_refer"])
def test_relive_train_vracer_end_to_end(tmp_path, preset):
    """The presets through ``relive train``: behaviour records stored by the collector for every row (warm-up
    included), targets written by the hooks, the update's metrics logged; with ReF-ER the sampler's hints reach
    the update and its recount runs on the agent's refer_log_rho."""
    from relive.cli import main

    run = tmp_path / "run"
    code = main(["train", preset, "--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "100",
                 "--batch-size", "32", "--eval-every", "300", "--eval-episodes", "1", "--no-progress",
                 "--set", "agent.hidden=[16,16]", "--set", "agent.refresh_every_grad_steps=50",
                 "--set", "run.save_final_buffer=true", "--run-dir", str(run)])
    assert code == 0
    buf = ReplayBuffer.load(run / "buffer_final")
    cols = buf.storage.columns
    assert len(buf) == 300 and (cols["mu_std"][:300] > 0).all()
    assert cols["truncated"][199] and (cols["q_ret"][:200] != Q_RET_UNSET).all()  # the finished episode
    lines = (run / "metrics.jsonl").read_text().splitlines()
    last = [json.loads(ln) for ln in lines if "train/rho_mean" in ln][-1]
    assert np.isfinite(last["train/rho_mean"]) and last["grad_step"] == 200
    if preset == "vracer":
        assert "train/refer_beta" not in last
    else:
        assert 0 < last["train/refer_beta"] <= 1 and 0 <= last["replay/far_policy_fraction"] <= 1
        assert last["replay/refer_recounts"] >= 1


@pytest.mark.slow
def test_a_killed_vracer_run_resumes_to_the_uninterrupted_result(tmp_path):
    """Killed after a checkpoint, resumed: the same final parameters, optimizer state, RNG, counters and
    reward scale, hence the stored targets and behaviour records round-trip through the run checkpoint too."""
    from relive.train.trainer import train
    from tests.train.test_trainer import SimulatedKill, assert_same_agent, cfg_for, kill_at

    args = ["vracer", "--env", "Pendulum-v1", "--online-steps", "300", "--warmup", "60", "--batch-size", "32",
            "--eval-every", "300", "--eval-episodes", "1", "--no-progress", "--checkpoint-every", "150",
            "--set", "agent.hidden=[16,16]", "--set", "agent.refresh_every_grad_steps=40",
            "--set", "env.max_episode_steps=70"]
    full = train(cfg_for(args, tmp_path / "full"))
    with pytest.raises(SimulatedKill):
        train(cfg_for(args, tmp_path / "cut"), on_step=kill_at(env_step=220))
    assert load_tree(tmp_path / "cut" / "checkpoint", kind="run")["loop"]["env_steps"] == 210  # an episode end
    resumed = train(resume_dir=tmp_path / "cut")
    assert_same_agent(tmp_path / "full", tmp_path / "cut")
    assert resumed.final_return == full.final_return and resumed.num_grad_steps == full.num_grad_steps == 240
