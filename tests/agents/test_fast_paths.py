"""The optimized update paths (value head kernel, subset-only target members, shared actor forwards, one critic
pass for Cal-QL's data and sampled actions, metrics kept as tensors) against a straightforward reference: the
formulation before these optimizations, written out here with plain ops on a twin agent of the same seed.
One or more updates must give the same losses and the same parameters up to float tolerance."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from relive.agents import networks as nets
from relive.types import TensorMetrics
from tests.agents.factory import B, batch, flat_params, make

TOL = dict(rtol=1e-4, atol=1e-5)


# -- the critic -----------------------------------------------------------------------------------------
def plain_critic(critic: nets.EnsembleCritic, obs, action) -> torch.Tensor:
    """Every member through ``baddbmm`` / ``layer_norm`` / out-of-place ReLU: [E, B]."""
    x = torch.cat([obs, action], -1)
    x = x.unsqueeze(0).expand(critic.num_members, -1, -1) if x.dim() == 2 else x
    for layer in critic.net:
        if isinstance(layer, nets.EnsembleLinear):
            x = torch.baddbmm(layer.bias, x, layer.weight)
        elif isinstance(layer, nets.EnsembleLayerNorm):
            x = F.layer_norm(x, (layer.dim,)) * layer.weight + layer.bias
        else:
            x = torch.relu(x)
    return x.squeeze(-1)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_value_head_and_in_place_relu_match_plain_ops_with_gradients(layer_norm):
    critic = nets.init_(nets.EnsembleCritic(3, 5, 2, (16, 16), layer_norm), torch.Generator().manual_seed(0))
    obs, action = torch.randn(7, 5), torch.randn(7, 2, requires_grad=True)
    g = torch.randn(3, 7)
    q, ref = critic(obs, action), plain_critic(critic, obs, action)
    torch.testing.assert_close(q, ref, **TOL)
    params = [action, *critic.parameters()]
    for a, b in zip(torch.autograd.grad(q, params, g), torch.autograd.grad(ref, params, g), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_value_head_gradcheck_in_float64():
    x = torch.randn(3, 6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, 1, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 1, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(nets._EnsembleHead.apply, (x, w, b))
    torch.testing.assert_close(nets._EnsembleHead.apply(x, w, b), torch.baddbmm(b, x, w))


def test_members_subset_equals_indexing_the_full_ensemble():
    critic = nets.init_(nets.EnsembleCritic(5, 5, 2, (16, 16), True), torch.Generator().manual_seed(1))
    obs, action = torch.randn(9, 5), torch.randn(9, 2)
    members = torch.tensor([3, 0])
    torch.testing.assert_close(critic(obs, action, members=members), critic(obs, action)[members], **TOL)


# -- whole updates against the previous formulation ------------------------------------------------------
def reference_sac_update(agent, b):
    """SAC / RLPD's update as written before: every target member evaluated then the subset taken, the actor
    run separately at s' and s, metrics by ``.item()``."""
    cfg, w = agent.cfg, b.info.is_weight
    with torch.no_grad():
        next_a, next_logp = agent.actor.sample(b.next_obs, agent.gen)
        v_next = agent.subset_min(plain_critic(agent.target_critic, b.next_obs, next_a))
        if cfg.backup_entropy:
            v_next = v_next - agent.alpha * next_logp
        y = b.reward + cfg.gamma * (1.0 - b.terminated) * v_next
    q = plain_critic(agent.critic, b.obs, b.action)
    critic_loss = nets.weighted_mean(((q - y) ** 2).mean(0), w)
    nets.optimize(agent.critic_opt, critic_loss)
    agent.num_critic_steps += 1
    nets.polyak(agent.target_critic, agent.critic, cfg.tau)
    metrics = {"train/critic_loss": critic_loss.item(), "train/q_mean": q.mean().item(),
               "train/target_mean": y.mean().item()}
    metrics |= reference_actor_steps(agent, b)
    return metrics, (q.detach().mean(0) - y).numpy()


def reference_actor_steps(agent, b) -> dict:
    w = b.info.is_weight
    if agent.num_critic_steps % agent.critic_steps_per_actor_step != 0:
        return {}
    mean, log_std = agent.actor(b.obs)
    agent.critic.requires_grad_(False)
    a, logp = agent.actor.sample_from(mean, log_std, agent.gen)
    qa = plain_critic(agent.critic, b.obs, a)
    qa = qa.min(0).values if agent.cfg.actor_q_reduce == "min" else qa.mean(0)
    actor_loss = nets.weighted_mean(agent.alpha * logp - qa, w)
    nets.optimize(agent.actor_opt, actor_loss)
    agent.critic.requires_grad_(True)
    metrics = {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item()}
    nets.optimize(agent.alpha_opt, nets.weighted_mean(agent.temperature_loss(logp), w))
    return metrics | {"train/alpha": agent.alpha.item()}


def reference_calql_update(agent, b):
    """Cal-QL's update as written before: the actor on the n-times repeated states, the target members all
    evaluated, Q(s, a) and the sampled actions' values in separate critic passes."""
    cfg, w = agent.cfg, b.info.is_weight
    n = cfg.cql_n_actions
    with torch.no_grad():
        next_rep = b.next_obs.repeat_interleave(n, 0)
        next_a, _ = agent.actor.sample(next_rep, agent.gen)
        v = agent.subset_min(plain_critic(agent.target_critic, next_rep, next_a)).view(B, n).max(1).values
        y = b.reward + cfg.gamma * (1.0 - b.terminated) * v
    q = plain_critic(agent.critic, b.obs, b.action)
    obs_rep = b.obs.repeat_interleave(n, 0)
    with torch.no_grad():
        u = torch.rand((B * n, agent.action_dim), generator=agent.gen)
        rand_a = (2.0 * u - 1.0) * agent.actor.scale + agent.actor.center
        pi_a, pi_logp = agent.actor.sample(obs_rep, agent.gen)
        nx_a, nx_logp = agent.actor.sample(next_rep, agent.gen)
    q_ood = plain_critic(agent.critic, obs_rep.repeat(3, 1), torch.cat([rand_a, pi_a, nx_a]))
    q_rand, q_pi, q_next = q_ood.view(-1, 3, B, n).unbind(1)
    bound = b.mc_return.view(1, -1, 1)
    q_pi, q_next = torch.maximum(q_pi, bound), torch.maximum(q_next, bound)
    log_u = -torch.log(2.0 * agent.actor.scale).sum()
    cat = torch.cat([q_rand - log_u, q_next - nx_logp.view(1, B, n), q_pi - pi_logp.view(1, B, n)], -1)
    gap = torch.logsumexp(cat, -1) - q
    td = ((q - y) ** 2).mean(0)
    critic_loss = nets.weighted_mean(td + cfg.cql_alpha * gap.mean(0), w)
    nets.optimize(agent.critic_opt, critic_loss)
    agent.num_critic_steps += 1
    nets.polyak(agent.target_critic, agent.critic, cfg.tau)
    metrics = {"train/critic_loss": critic_loss.item(), "train/q_mean": q.mean().item(),
               "train/cql_gap": nets.weighted_mean(gap.detach().mean(0), w).item()}
    return metrics | reference_actor_steps(agent, b), (q.detach().mean(0) - y).numpy()


@pytest.mark.parametrize("kind,overrides", [
    ("sac", {}),
    ("rlpd", dict(num_qs=6, num_min_qs=2)),  # subset-min target, LayerNorm, mean actor reduce, xavier init
    # critic-only updates: the shared actor forward
    ("rlpd", dict(num_qs=6, num_min_qs=2, actor_per_env_step=False, actor_every=2)),
    ("calql", dict(num_qs=4, num_min_qs=2)),
])
def test_optimized_update_equals_the_previous_formulation(kind, overrides):
    fast, ref = make(kind, **overrides), make(kind, **overrides)
    torch.testing.assert_close(flat_params(fast), flat_params(ref), rtol=0, atol=0)
    reference = reference_calql_update if kind == "calql" else reference_sac_update
    for step in range(3):
        b = batch(kind, seed=step, is_weight=np.linspace(0.5, 1.5, B))
        result = fast.update(b)
        metrics, td_error = reference(ref, b.to_torch())
        assert isinstance(result.metrics, TensorMetrics)
        assert set(metrics) <= set(result.metrics), (set(metrics), set(result.metrics))
        for k, v in metrics.items():
            assert result.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-5), (step, k)
        np.testing.assert_allclose(result.signals["td_error"], td_error, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(flat_params(fast), flat_params(ref), **TOL)
        # the generators advanced identically: the same draws in the same order
        assert torch.equal(fast.gen.get_state(), ref.gen.get_state())


def test_tensor_metrics_read_as_floats_once():
    m = TensorMetrics({"train/a": torch.tensor(1.5), "train/b": 2.0, "train/c": torch.tensor([3.0]).sum()})
    assert dict(m) == {"train/a": 1.5, "train/b": 2.0, "train/c": 3.0}
    assert all(type(v) is float for v in m.values()) and list(m) == ["train/a", "train/b", "train/c"]
    assert m | {"x": 1} == {"train/a": 1.5, "train/b": 2.0, "train/c": 3.0, "x": 1}
    assert {"x": 1} | m == {"x": 1, "train/a": 1.5, "train/b": 2.0, "train/c": 3.0}
    assert m == {"train/a": 1.5, "train/b": 2.0, "train/c": 3.0} and len(m) == 3
    with pytest.raises(KeyError):
        m["missing"]


def test_lean_adam_steps_are_bit_identical_to_torch_fused_adam():
    torch.manual_seed(0)  # test data only
    params = [torch.randn(4, 3), torch.randn(3), torch.randn(())]
    lean_p = [p.clone().requires_grad_() for p in params]
    ref_p = [p.clone().requires_grad_() for p in params]
    lean = nets.adam(lean_p, 1e-2)
    ref = torch.optim.Adam(ref_p, lr=1e-2, fused=True)
    assert isinstance(lean, nets.LeanAdam)
    for step in range(5):
        grads = [torch.randn_like(p) for p in params]
        for ps in (lean_p, ref_p):
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.clone()
        if step == 3:  # a learning-rate change (ReF-ER anneals them) is read at every step
            for opt in (lean, ref):
                opt.param_groups[0]["lr"] = 3e-3
        lean.step()
        ref.step()
        for a, b in zip(lean_p, ref_p, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    for k, st in ref.state_dict()["state"].items():
        for name, v in st.items():
            torch.testing.assert_close(lean.state_dict()["state"][k][name], v, rtol=0, atol=0)


def test_sampled_log_prob_equals_the_density_of_the_sampled_action():
    """sample_from's log pi(a|s) (written with eps) equals the tanh-Gaussian density at the sampled u."""
    actor = nets.init_(nets.TanhGaussianActor(5, 2, (16,), np.array([-2.0, -1.0]), np.array([2.0, 1.0])),
                       torch.Generator().manual_seed(0))
    mean, log_std = actor(torch.randn(64, 5))
    for deterministic in (False, True):
        gen = torch.Generator().manual_seed(1)
        a, logp = actor.sample_from(mean, log_std, gen, deterministic)
        gen = torch.Generator().manual_seed(1)
        eps = torch.zeros_like(mean) if deterministic else torch.randn(mean.shape, generator=gen)
        u = mean + log_std.exp() * eps
        expected = nets.tanh_gaussian_log_prob(mean, log_std, u).sum(-1) - actor.log_scale_sum()
        torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a, actor.squash(u))


def test_lean_adam_minimize_equals_zero_grad_backward_step():
    torch.manual_seed(0)  # test data only
    x, target = torch.randn(16, 4), torch.randn(16)
    nets_ = [torch.nn.Linear(4, 1) for _ in range(2)]
    nets_[1].load_state_dict(nets_[0].state_dict())
    lean, ref = nets.adam(nets_[0].parameters(), 1e-2), torch.optim.Adam(nets_[1].parameters(), lr=1e-2, fused=True)
    for _ in range(4):
        lean.minimize(((nets_[0](x).squeeze(-1) - target) ** 2).mean())
        ref.zero_grad(set_to_none=True)
        ((nets_[1](x).squeeze(-1) - target) ** 2).mean().backward()
        ref.step()
        for a, b in zip(nets_[0].parameters(), nets_[1].parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ensemble_layer_norm_kernel_gradcheck_and_frozen_affine():
    x = torch.randn(3, 5, 6, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.1 * torch.randn(3, 1, 6, dtype=torch.float64)).requires_grad_()
    b = (0.1 * torch.randn(3, 1, 6, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(nets._EnsembleLayerNorm.apply, (x, w, b))
    torch.testing.assert_close(nets._EnsembleLayerNorm.apply(x, w, b), F.layer_norm(x, (6,)) * w + b)
    # the actor's pass through a frozen critic: only the input gradient
    g = torch.randn(3, 5, 6, dtype=torch.float64)
    (gx,) = torch.autograd.grad(nets._EnsembleLayerNorm.apply(x, w.detach(), b.detach()), x, g)
    (ref,) = torch.autograd.grad(F.layer_norm(x, (6,)) * w.detach() + b.detach(), x, g)
    torch.testing.assert_close(gx, ref)


def test_retain_freed_memory_is_a_safe_process_setting():
    from relive.train.malloc import retain_freed_memory

    assert retain_freed_memory() in (True, False)
    x = torch.randn(10, 256, 256)  # allocations work as before
    assert torch.equal(x.clone(), x)
