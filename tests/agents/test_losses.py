"""Exact checks of the agents' losses and targets on hand-made cases."""

import itertools
import math

import numpy as np
import pytest
import torch

from relive.agents import networks as nets
from relive.agents.cal_ql import CalQL, CalQLConfig
from relive.agents.ddpg import DDPGConfig
from relive.agents.sac import SAC, SACConfig
from relive.testing import chisquare_pvalue
from tests.agents.factory import ACT, HIGH, LOW, OBS, SMALL, B, batch, flat_params, make


def constant_members(critic: nets.EnsembleCritic, values) -> None:
    """Member e of the ensemble predicts the constant values[e] everywhere."""
    with torch.no_grad():
        head = critic.net[-1]
        head.weight.zero_()
        head.bias.copy_(torch.as_tensor(values, dtype=torch.float32).view(-1, 1, 1))


class FnCritic(torch.nn.Module):
    """A stand-in critic: every one of E members returns fn(obs, action) + offsets[e]."""

    def __init__(self, fn, offsets):
        super().__init__()
        self.fn, self.offsets = fn, torch.as_tensor(offsets, dtype=torch.float32).view(-1, 1)

    def forward(self, obs, action):
        return self.fn(obs, action).unsqueeze(0) + self.offsets


# -- SAC ---------------------------------------------------------------------------------------------
def test_sac_target_formula_and_terminated_only():
    agent = make("sac", backup_entropy=True, init_temperature=0.3)
    constant_members(agent.target_critic, [2.0, 5.0])
    b = batch("sac").to_torch()
    terminated = (torch.arange(B) % 3 == 0).float()
    state = agent.gen.get_state()
    y = agent.critic_target(b.reward, b.next_obs, terminated)
    agent.gen.set_state(state)
    _, next_logp = agent.actor.sample(b.next_obs, agent.gen)  # the same a' ~ pi(s')
    expected = b.reward + 0.99 * (1 - terminated) * (2.0 - 0.3 * next_logp)  # min over the twin = 2
    torch.testing.assert_close(y, expected)


def test_sac_truncation_never_stops_the_bootstrap():
    """The same batch with truncated all-true or all-false gives bit-identical updates; terminated does not."""
    kw = dict(terminated=np.zeros(B, bool))
    results = []
    for b in (batch("sac", truncated=np.zeros(B, bool), **kw), batch("sac", truncated=np.ones(B, bool), **kw),
              batch("sac", terminated=np.ones(B, bool))):
        agent = make("sac")
        agent.update(b)
        results.append(flat_params(agent))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert not torch.allclose(results[0], results[2])


def pair_min_probabilities(num_qs: int, m: int) -> np.ndarray:
    """P(min of a uniformly random m-subset of {0..E-1} = k)."""
    subsets = list(itertools.combinations(range(num_qs), m))
    return np.bincount([min(s) for s in subsets], minlength=num_qs) / len(subsets)


def test_subset_min_is_over_a_uniform_random_subset_of_num_min_qs_members():
    """Member e predicts e, so the target (no entropy, gamma folded out) is the smallest index of the drawn
    subset. Its frequencies match the law of the min of a uniform 2-subset of 6 (chi-square), and the same
    test rejects the law of a 3-subset: the check can fail."""
    agent = SAC(OBS, ACT, LOW, HIGH, SACConfig(**SMALL, num_qs=6, num_min_qs=2, backup_entropy=False), seed=0)
    constant_members(agent.target_critic, np.arange(6.0))
    b = batch("sac", n=4).to_torch()
    draws = []
    for _ in range(400):
        y = agent.critic_target(torch.zeros(4), b.next_obs, torch.zeros(4))
        assert torch.all(y == y[0])  # one subset per update, shared by the batch
        draws.append(int(round(float(y[0]) / 0.99)))
    assert chisquare_pvalue(np.array(draws), pair_min_probabilities(6, 2)) > 1e-3
    assert chisquare_pvalue(np.array(draws), pair_min_probabilities(6, 3)) < 1e-6
    # num_min_qs = num_qs: the plain min over all members, every time
    full = SAC(OBS, ACT, LOW, HIGH, SACConfig(**SMALL, num_qs=6, num_min_qs=6, backup_entropy=False), seed=0)
    constant_members(full.target_critic, np.arange(6.0) + 1)
    assert torch.all(full.critic_target(torch.zeros(4), b.next_obs, torch.zeros(4)) == 0.99)


@pytest.mark.parametrize("reduce,expected", [("min", -1.0), ("mean", 2.0)])
def test_actor_loss_reduces_members_by_min_or_mean(reduce, expected):
    agent = SAC(OBS, ACT, LOW, HIGH, SACConfig(**SMALL, num_qs=3, actor_q_reduce=reduce, init_temperature=0.5),
                seed=0)
    constant_members(agent.critic, [-1.0, 2.0, 5.0])
    obs = batch("sac").to_torch().obs
    mean, log_std = agent.actor(obs)
    state = agent.gen.get_state()
    loss, logp = agent.actor_loss(obs, mean, log_std)
    agent.gen.set_state(state)
    _, logp_again = agent.actor.sample_from(mean, log_std, agent.gen)
    torch.testing.assert_close(logp, logp_again)
    torch.testing.assert_close(loss, 0.5 * logp - expected)


def test_temperature_loss_moves_alpha_toward_the_target_entropy():
    agent = make("sac")
    logp = torch.full((B,), -10.0)  # entropy 10 > target -|A|: alpha must go down
    loss = agent.temperature_loss(logp).mean()
    loss.backward()
    assert agent.log_alpha.grad > 0
    torch.testing.assert_close(loss, -(agent.log_alpha.exp() * (-10.0 + agent.target_entropy)).detach())


def test_tanh_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)  # test data only
    mean, log_std, u = torch.randn(100, 3), torch.randn(100, 3) * 0.5, torch.randn(100, 3)
    base = torch.distributions.Normal(mean, log_std.exp())
    dist = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])
    expected = dist.log_prob(torch.tanh(u).clamp(-1 + 1e-6, 1 - 1e-6))
    torch.testing.assert_close(nets.tanh_gaussian_log_prob(mean, log_std, u), expected, rtol=1e-4, atol=2e-3)
    # and the actor's density includes the Jacobian of the box scaling
    actor = nets.TanhGaussianActor(OBS, ACT, (8,), LOW, HIGH)
    obs = torch.randn(10, OBS)
    m, ls = actor(obs)
    a, logp = actor.sample_from(m, ls, torch.Generator().manual_seed(0))
    torch.testing.assert_close(actor.log_prob(obs, a).sum(-1), logp, rtol=1e-3, atol=1e-3)


def test_ensemble_members_are_independent_networks():
    """One batched module, but member e's output depends on member e's weights only."""
    critic = nets.init_(nets.EnsembleCritic(4, OBS, ACT, (16, 16), layer_norm=True), torch.Generator().manual_seed(0))
    obs, action = torch.randn(8, OBS), torch.randn(8, ACT)
    q = critic(obs, action)
    assert q.shape == (4, 8)
    q[2].sum().backward()
    for p in critic.parameters():
        g = p.grad.abs().flatten(1).sum(1)
        assert g[2] > 0 and torch.all(g[[0, 1, 3]] == 0)
    # member e equals a plain MLP built from member e's slices
    x = torch.cat([obs, action], -1)
    for e in range(4):
        h = x
        for layer in critic.net:
            if isinstance(layer, nets.EnsembleLinear):
                h = h @ layer.weight[e] + layer.bias[e]
            elif isinstance(layer, nets.EnsembleLayerNorm):
                h = torch.nn.functional.layer_norm(h, (layer.dim,)) * layer.weight[e] + layer.bias[e]
            else:
                h = layer(h)
        torch.testing.assert_close(q[e], h.squeeze(-1))


def test_layer_norm_follows_every_hidden_critic_layer():
    critic = nets.EnsembleCritic(3, OBS, ACT, (16, 16, 16), layer_norm=True)
    kinds = [type(m).__name__ for m in critic.net]
    assert kinds == ["EnsembleLinear", "EnsembleLayerNorm", "ReLU"] * 3 + ["EnsembleLinear"]
    assert not any(isinstance(m, nets.EnsembleLayerNorm) for m in nets.EnsembleCritic(3, OBS, ACT, (16,)).net)


def test_rlpd_preset():
    cfg = SACConfig.rlpd()
    assert (cfg.num_qs, cfg.num_min_qs, cfg.critic_layer_norm, cfg.actor_every, cfg.actor_per_env_step,
            cfg.actor_q_reduce) == (10, 2, True, 1, True, "mean")
    agent = SAC(OBS, ACT, LOW, HIGH, SACConfig.rlpd(hidden=(8,)), seed=0)
    assert agent.target_entropy == -ACT / 2
    assert SACConfig.rlpd(num_min_qs=1).num_min_qs == 1
    with pytest.raises(ValueError, match="num_min_qs"):
        SACConfig(num_qs=2, num_min_qs=3)


def test_rlpd_actor_steps_once_per_utd_critic_steps():
    agent = make("rlpd", num_qs=3, actor_per_env_step=False, actor_every=4)
    actor_before = [p.clone() for p in agent.actor.parameters()]
    keys = [set(agent.update(batch("rlpd", seed=s)).metrics) for s in range(4)]
    assert all("train/actor_loss" not in k for k in keys[:3]) and "train/actor_loss" in keys[3]
    assert agent.num_critic_steps == 4 and agent.num_actor_steps == 1
    assert not all(torch.equal(a, b) for a, b in zip(actor_before, agent.actor.parameters(), strict=True))


def test_xavier_init_scheme():
    agent = SAC(OBS, ACT, LOW, HIGH, SACConfig(hidden=(64, 64), init="xavier"), seed=0)
    layer = agent.critic.net[2]
    bound = math.sqrt(6 / (64 + 64))
    assert torch.all(layer.bias == 0) and layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound


@pytest.mark.parametrize("scheme", ["torch", "xavier"])
def test_init_takes_layers_without_a_bias(scheme):
    # (found by mypy, issue 48: a bias-free Linear / Conv2d raised AttributeError on its None bias)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.Flatten(), torch.nn.Linear(4, 2),
                              torch.nn.Linear(2, 5, bias=False))
    nets.init_(net, torch.Generator().manual_seed(0), scheme)
    bound = 1.0 / math.sqrt(2) if scheme == "torch" else math.sqrt(6.0 / (2 + 5))
    assert net[3].bias is None and 0 < net[3].weight.abs().max() <= bound
    with_bias = torch.nn.Linear(2, 5)  # a layer with a bias draws the same weights as before
    nets.init_(with_bias, torch.Generator().manual_seed(0), scheme)
    free = torch.nn.Linear(2, 5, bias=False)
    nets.init_(free, torch.Generator().manual_seed(0), scheme)
    torch.testing.assert_close(free.weight, with_bias.weight)


# -- Double DQN ---------------------------------------------------------------------------------------
def test_ddqn_selects_with_the_online_net_and_evaluates_with_the_target_net():
    agent = make("ddqn")
    with torch.no_grad():
        for net, bias in ((agent.q, [0.0, 0.0, 1.0]), (agent.target_q, [10.0, 0.0, 5.0])):
            net[-1].weight.zero_()
            net[-1].bias.copy_(torch.tensor(bias))
    b = batch("ddqn").to_torch()
    terminated = (torch.arange(B) % 2).float()
    y = agent.target(b.reward, b.next_obs, terminated)
    # online argmax = action 2; its target value is 5 (plain DQN would bootstrap from the target max, 10)
    torch.testing.assert_close(y, b.reward + 0.99 * (1 - terminated) * 5.0)


def test_ddqn_huber_loss_and_hard_target_period():
    agent = make("ddqn", target_update_period=3, huber_delta=1.0)
    b = batch("ddqn")
    tb = b.to_torch()
    y = torch.tensor(np.r_[np.zeros(B // 2), np.full(B // 2, 10.0)], dtype=torch.float32)
    per_sample, q = agent.loss(tb, y)
    d = (q - y).abs()
    torch.testing.assert_close(per_sample, torch.where(d < 1, 0.5 * d**2, d - 0.5))
    for step in range(1, 7):
        agent.update(batch("ddqn", seed=step))
        same = all(torch.equal(p, t) for p, t in zip(agent.q.parameters(), agent.target_q.parameters(), strict=True))
        assert same == (step % 3 == 0), step


def test_ddqn_epsilon_schedule():
    """Linear in env steps: an exploring call for N observations (N envs) is N steps of the schedule."""
    agent = make("ddqn", eps_start=1.0, eps_end=0.1, eps_decay_steps=2000)
    obs = np.zeros((1000, OBS), np.float32)
    greedy = agent.act(obs, explore=False)  # greedy calls do not count
    assert agent.epsilon == 1.0 and np.all(greedy == greedy[0]) and agent.num_act_steps == 0
    first = agent.act(obs, explore=True)  # epsilon 1: uniform actions; then 1000 steps counted
    assert chisquare_pvalue(first, np.full(3, 1 / 3)) > 1e-3
    for _ in range(4):
        agent.act(obs[:1], explore=True)
    assert agent.num_act_steps == 1004 and agent.epsilon == pytest.approx(1.0 - 0.9 * 1004 / 2000)
    agent.act(obs[:996], explore=True)
    assert agent.epsilon == pytest.approx(0.1)
    for _ in range(20):
        agent.act(obs[:1], explore=True)
    assert agent.epsilon == pytest.approx(0.1)
    late = agent.act(obs, explore=True)  # 10% random: greedy action 90% + 10%/3
    p = np.full(3, 0.1 / 3)
    p[greedy[0]] += 0.9
    assert chisquare_pvalue(late, p) > 1e-3
    assert chisquare_pvalue(late, np.full(3, 1 / 3)) < 1e-6


# -- Cal-QL -------------------------------------------------------------------------------------------
def replay_cql_samples(agent: CalQL, b, state):
    """Re-draw, from the same generator state, the uniform / pi(s) / pi(s') actions of conservative_gap."""
    n = agent.cfg.cql_n_actions
    agent.gen.set_state(state)
    u = torch.rand((B * n, ACT), generator=agent.gen)
    rand_a = (2 * u - 1) * agent.actor.scale + agent.actor.center
    with torch.no_grad():
        pi_a, pi_logp = agent.actor.sample(b.obs.repeat_interleave(n, 0), agent.gen)
        next_a, next_logp = agent.actor.sample(b.next_obs.repeat_interleave(n, 0), agent.gen)
    return rand_a, pi_a, pi_logp.view(B, n), next_a, next_logp.view(B, n)


def test_calql_penalty_formula_with_the_calibration_on_policy_actions_only():
    """Critic Q(s, a) = c(a) known in closed form; the gap must be
    logsumexp([c(a_rand) - log U, max(c(a'_pi), G) - log pi(a'_pi|s'), max(c(a_pi), G) - log pi(a_pi|s)]) - Q(s,a)
    (random actions never calibrated, data action never calibrated), and with G = NaN no calibration."""
    agent = make("calql", cql_n_actions=4)
    n = 4
    agent.critic = FnCritic(lambda o, a: 3.0 * a[:, 0] - a[:, 1] ** 2, [0.0, 0.5])
    mc = np.where(np.arange(B) % 2 == 0, 50.0, -50.0).astype(np.float32)
    mc[5] = np.nan
    b = batch("calql", mc_return=mc).to_torch()
    q_data = agent.critic(b.obs, b.action)
    state = agent.gen.get_state()
    gap, info = agent.conservative_gap(b, q_data)
    rand_a, pi_a, pi_logp, next_a, next_logp = replay_cql_samples(agent, b, state)
    log_u = -math.log(4.0) - math.log(2.0)  # U over [-2, 2] x [-1, 1]
    for e, offset in enumerate([0.0, 0.5]):
        def c(a, offset=offset):
            return (3.0 * a[:, 0] - a[:, 1] ** 2 + offset).view(B, n)
        g = torch.as_tensor(mc).view(B, 1)
        cal = torch.where(torch.isnan(g), -torch.inf, g)
        terms = torch.cat([c(rand_a) - log_u, torch.maximum(c(next_a), cal) - next_logp,
                           torch.maximum(c(pi_a), cal) - pi_logp], dim=1)
        torch.testing.assert_close(gap[e], torch.logsumexp(terms, 1) - q_data[e], rtol=1e-5, atol=1e-4)
    # rows with G = 50 are dominated by the bound, rows with G = -50 are not bounded at all
    assert torch.all(gap[:, 0::2][:, [i for i in range(B // 2) if 2 * i != 5]] > 40)
    assert info["train/cql_bound_rate"] > 0.4
    # the same penalty without calibration (plain CQL) and with unknown returns-to-go everywhere agree
    object.__setattr__(agent, "cfg", CalQLConfig(**SMALL, cql_n_actions=4, calibrate=False))
    agent.gen.set_state(state)
    plain, _ = agent.conservative_gap(b, q_data)
    nan_b = batch("calql", mc_return=np.full(B, np.nan)).to_torch()
    object.__setattr__(agent, "cfg", CalQLConfig(**SMALL, cql_n_actions=4))
    agent.gen.set_state(state)
    unknown, _ = agent.conservative_gap(with_mc_return(b, nan_b.mc_return), q_data)
    torch.testing.assert_close(plain, unknown)
    agent.gen.set_state(state)  # the "unknown yet" placeholder a buffer can store: the lowest float32
    lowest = torch.full((B,), float(np.finfo(np.float32).min))
    torch.testing.assert_close(plain, agent.conservative_gap(with_mc_return(b, lowest), q_data)[0])
    assert torch.all(plain[:, 0::2] < gap[:, 0::2] + 1e-6) and torch.any(plain < gap - 1)


def with_mc_return(b, mc_return):
    cols = {k: getattr(b, k) for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    return type(b)(**cols, info=b.info, extras={"mc_return": mc_return})


def test_calql_returns_to_go_enter_only_the_penalty():
    """mc_return changes the critic step (through the penalty) but not the TD target, and not the actor's
    loss: with cql_alpha = 0 two batches that differ only in mc_return give identical updates."""
    b1 = batch("calql", mc_return=np.full(B, -100.0))
    b2 = batch("calql", mc_return=np.full(B, 100.0))
    agents = [make("calql", cql_alpha=0.0) for _ in range(2)]
    for agent, b in zip(agents, (b1, b2), strict=True):
        agent.update(b)
    torch.testing.assert_close(flat_params(agents[0]), flat_params(agents[1]), rtol=0, atol=0)
    agents = [make("calql") for _ in range(2)]
    for agent, b in zip(agents, (b1, b2), strict=True):
        agent.update(b)
    assert not torch.allclose(flat_params(agents[0]), flat_params(agents[1]))


def test_calql_corl_mode_switches_the_calibration_off_online():
    official, corl = make("calql"), make("calql", calibrate_online=False)
    assert official.calibrating and corl.calibrating
    official.set_online(True)
    corl.set_online(True)
    assert official.calibrating and not corl.calibrating
    # online, CORL's penalty is plain CQL's
    plain = make("calql", calibrate=False)
    b = batch("calql", mc_return=np.full(B, 100.0))
    for agent in (corl, plain):
        agent.update(b)
    torch.testing.assert_close(flat_params(corl), flat_params(plain), rtol=0, atol=0)


def test_calql_max_target_backup_takes_the_max_over_sampled_next_actions():
    agent = make("calql", cql_n_actions=5, max_target_backup=True, num_qs=2, num_min_qs=2)
    agent.target_critic = FnCritic(lambda o, a: -((a[:, 0] - 0.3) ** 2), [0.0, 1.0])
    b = batch("calql").to_torch()
    state = agent.gen.get_state()
    y = agent.critic_target(b.reward, b.next_obs, b.terminated)
    agent.gen.set_state(state)
    a, _ = agent.actor.sample(b.next_obs.repeat_interleave(5, 0), agent.gen)
    best = (-((a[:, 0] - 0.3) ** 2)).view(B, 5).max(1).values  # min over members = member 0
    torch.testing.assert_close(y, b.reward + 0.99 * (1 - b.terminated) * best)


def test_calql_lagrange_multiplier_ascends_on_the_gap():
    """alpha' grows when the penalty's gap exceeds target_action_gap and shrinks below it."""
    for target_gap, direction in ((-1e3, +1), (1e3, -1)):
        agent = make("calql", lagrange=True, target_action_gap=target_gap)
        before = agent.alpha_prime.item()
        metrics = agent.update(batch("calql")).metrics
        assert np.sign(metrics["train/alpha_prime"] - before) == direction
        assert before == pytest.approx(math.e)  # log alpha' starts at 1 (official / CORL)


def test_td3_target_is_the_min_of_the_target_critics_and_each_critic_regresses_on_it():
    """TD3 Eq. 10: y = r + gamma (1 - d) min_i Q'_i(s', a~'); the critic loss sums (Q_i - y)^2 over both critics."""
    agent = make("td3", target_noise=0.0)
    b = agent._to_torch(batch("td3", seed=3))
    with torch.no_grad():
        q_next = agent.target_critic(b.next_obs, agent.target_actor(b.next_obs))  # [2, B]
        assert q_next.shape[0] == 2 and not torch.equal(q_next[0], q_next[1])
        expected = b.reward + 0.99 * (1.0 - b.terminated) * torch.minimum(q_next[0], q_next[1])
        torch.testing.assert_close(agent.critic_target(b.reward, b.next_obs, b.terminated), expected)
        loss, q1, y = agent.critic_loss(b, torch.ones_like(b.reward))
        q = agent.critic(b.obs, b.action)
        torch.testing.assert_close(q1, q[0])
        torch.testing.assert_close(loss, (b.info.is_weight * ((q[0] - y) ** 2 + (q[1] - y) ** 2)).mean())


def test_td3_updates_the_actor_and_the_targets_every_second_critic_step():
    """TD3 Alg. 1 (d = 2): critic every step; actor and Polyak targets on the 2nd, 4th, ... update."""
    agent = make("td3", actor_every=2)

    def snap():
        return [[p.clone() for p in m.parameters()] for m in (agent.actor, agent.target_actor, agent.target_critic,
                                                              agent.critic)]

    def changed(before, after):
        return [not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) for a, b in zip(before, after,
                                                                                                strict=True)]

    for step in range(4):
        before = snap()
        metrics = agent.update(batch("td3", seed=step)).metrics
        moved = changed(before, snap())
        actor_turn = step % 2 == 1
        assert moved == [actor_turn, actor_turn, actor_turn, True], step  # actor, its target, critic target, critic
        assert ("train/actor_loss" in metrics) == actor_turn


def test_td3_preset_follows_the_authors_code():
    from relive.presets import get_preset

    cfg = get_preset("td3")
    a = cfg.agent
    assert (cfg.agent_kind, a.num_critics, a.actor_every, a.sigma, a.target_noise, a.target_noise_clip) == \
        ("ddpg", 2, 2, 0.1, 0.2, 0.5)
    assert (a.gamma, a.tau, a.hidden, a.actor_lr, a.critic_lr) == (0.99, 0.005, (256, 256), 3e-4, 3e-4)
    assert (cfg.schedule.batch_size, cfg.schedule.num_warmup_env_steps, cfg.schedule.warmup_policy) == \
        (256, 25_000, "random")
    assert (cfg.replay.name, cfg.replay.capacity) == ("uniform", 1_000_000)
    with pytest.raises(ValueError, match="num_critics must be an integer >= 1"):
        DDPGConfig(num_critics=0)
    with pytest.raises(ValueError, match="actor_every must be an integer >= 1"):
        DDPGConfig(actor_every=True)


def test_the_per_env_step_actor_rule_follows_the_utd_ratio_and_equals_the_fixed_count():
    """RLPD's rule (one actor step per env step) with UTD 4 trains exactly the agent actor_every = 4 trains; the
    rule and a count are never both set; outside a run the rule needs the ratio."""
    rule = make("rlpd", num_qs=3, actor_every=1, actor_per_env_step=True)
    count = make("rlpd", num_qs=3, actor_every=4, actor_per_env_step=False)
    rule.follow_utd_ratio(4)
    for s in range(8):
        rule.update(batch("rlpd", seed=s))
        count.update(batch("rlpd", seed=s))
    assert rule.num_actor_steps == count.num_actor_steps == 2
    for a, b in zip(flat_params(rule), flat_params(count), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="say two things"):
        SACConfig.rlpd(actor_every=4)
    with pytest.raises(ValueError, match="needs agent.actor_per_env_step"):
        make("sac").follow_utd_ratio(4)
