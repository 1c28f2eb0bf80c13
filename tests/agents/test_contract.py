"""The agent contract, checked for every agent the same way."""

import numpy as np
import pytest
import torch

from relive.agents.base import Agent
from relive.replay.checkpoint import load_tree, save_tree
from tests.agents.factory import (
    ACT,
    CONTINUOUS,
    HIGH,
    KINDS,
    LOW,
    NUM_ACTIONS,
    OBS,
    B,
    batch,
    flat_params,
    make,
    replace_rows,
)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def test_actions_have_the_promised_shape_dtype_and_bounds(kind):
    agent = make(kind)
    assert isinstance(agent, Agent)
    obs = np.random.default_rng(1).normal(size=(64, OBS)).astype(np.float32) * 10  # far from the data
    for explore in (True, False):
        a = agent.act(obs, explore)
        if kind == "ddqn":
            assert a.shape == (64,) and a.dtype == np.int64 and ((0 <= a) & (a < NUM_ACTIONS)).all()
        else:
            assert a.shape == (64, ACT) and a.dtype == np.float32
            assert (a >= LOW).all() and (a <= HIGH).all()
    single = agent.act(obs[0], explore=False)  # one observation -> one action
    assert np.shape(single) == (() if kind == "ddqn" else (ACT,))
    with pytest.raises(ValueError, match="obs must have shape"):
        agent.act(np.zeros((4, OBS + 1), np.float32), explore=False)


def test_update_returns_finite_metrics_and_per_sample_signals(kind):
    agent = make(kind)
    for step in range(3):
        res = agent.update(batch(kind, seed=step))
        assert res.metrics and all(k.startswith("train/") for k in res.metrics)
        assert all(isinstance(v, float) and np.isfinite(v) for v in res.metrics.values()), res.metrics
        expected = {"td_error"} if kind == "ddqn" else {"td_error", "log_likelihood"}
        assert set(res.signals) == expected
        for v in res.signals.values():
            assert isinstance(v, np.ndarray) and v.shape == (B,) and np.isfinite(v).all()


def test_zero_is_weight_rows_do_not_influence_the_update(kind):
    """With is_weight 0 on half the batch the whole update (critic, actor, temperature, alpha') depends on the
    other half only: replacing the zero-weight rows by other data gives bit-identical parameters; replacing a
    weighted row does not."""
    w = np.r_[np.ones(B // 2), np.zeros(B // 2)]
    b1, b2 = batch(kind, seed=1, is_weight=w), batch(kind, seed=2, is_weight=w)
    zero_rows, weighted_rows = np.arange(B // 2, B), np.arange(B // 2)
    results = []
    for b in (b1, replace_rows(b1, b2, zero_rows), replace_rows(b1, b2, weighted_rows)):
        agent = make(kind)
        agent.update(b)
        results.append(flat_params(agent))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert not torch.allclose(results[0], results[2])


def test_is_weight_scales_the_gradient_of_its_row(kind):
    """Doubling every is_weight doubles the critic / Q gradient (the loss is a weighted mean, not normalized
    by the weights' sum)."""
    grads = []
    for scale in (1.0, 2.0):
        agent = make(kind, seed=3)
        b = batch(kind, seed=5, is_weight=np.full(B, scale))
        net = agent.q if kind == "ddqn" else agent.critic
        opt = agent.opt if kind == "ddqn" else agent.critic_opt
        captured = []

        def capture(*args, net=net, captured=captured, **kwargs):
            captured.append(torch.cat([p.grad.flatten() for p in net.parameters()]))

        opt.step = capture
        if kind == "ddqn":
            agent.cfg = type(agent.cfg)(**{**agent.cfg.to_dict(), "max_grad_norm": None})
        agent.update(b)
        grads.append(captured[0])
    torch.testing.assert_close(grads[1], 2 * grads[0], rtol=1e-4, atol=1e-6)


def test_save_load_restores_everything(kind, tmp_path):
    agent = make(kind)
    for step in range(2):
        agent.update(batch(kind, seed=step))
    save_tree(tmp_path / "agent", agent.state_dict(), kind="agent")
    clone = make(kind, seed=123)
    clone.load_state_dict(load_tree(tmp_path / "agent", kind="agent"))
    obs = np.random.default_rng(1).normal(size=(7, OBS)).astype(np.float32)
    np.testing.assert_array_equal(agent.act(obs, explore=False), clone.act(obs, explore=False))
    np.testing.assert_array_equal(agent.act(obs, explore=True), clone.act(obs, explore=True))  # RNG restored
    b = batch(kind, seed=9)
    r1, r2 = agent.update(b), clone.update(b)
    torch.testing.assert_close(flat_params(agent), flat_params(clone), rtol=0, atol=0)
    assert r1.metrics == r2.metrics
    for name in r1.signals:
        np.testing.assert_array_equal(r1.signals[name], r2.signals[name])
    if hasattr(agent, "online"):
        assert clone.online == agent.online


def test_same_seed_same_parameters_and_no_global_rng(kind):
    torch.manual_seed(1234)
    global_state = torch.get_rng_state()
    np_state = np.random.get_state()[1].copy()  # noqa: NPY002 (the legacy global RNG must stay untouched)
    x, y = make(kind, seed=4), make(kind, seed=4)
    torch.testing.assert_close(flat_params(x), flat_params(y), rtol=0, atol=0)
    obs = np.random.default_rng(0).normal(size=(5, OBS)).astype(np.float32)
    for s in range(2):
        x.update(batch(kind, seed=s))
        y.update(batch(kind, seed=s))
        np.testing.assert_array_equal(x.act(obs, explore=True), y.act(obs, explore=True))
    torch.testing.assert_close(flat_params(x), flat_params(y), rtol=0, atol=0)
    assert not torch.equal(flat_params(make(kind, seed=4)), flat_params(make(kind, seed=5)))
    # the agents never read or advanced the global RNGs
    assert torch.equal(torch.get_rng_state(), global_state)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)  # noqa: NPY002


@pytest.mark.parametrize("kind", CONTINUOUS)
def test_score_fn_modes(kind):
    """score_fn evaluates the policy's Gaussian on the stored actions mapped back to [-1, 1]: "log_prob" is the
    tanh-corrected log-density averaged over dims, "standardized" the mean log N(z; 0, 1) of
    z = (atanh(a) - mu) / sigma, which is largest at the policy's own mean action."""
    agent = make(kind)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(50, OBS)).astype(np.float32)
    action = rng.uniform(LOW, HIGH, (50, ACT)).astype(np.float32)
    with torch.no_grad():
        mean, log_std = agent.actor(torch.as_tensor(obs))
    u = torch.atanh(torch.as_tensor((action - (LOW + HIGH) / 2) / ((HIGH - LOW) / 2)).clamp(-1 + 1e-6, 1 - 1e-6))
    z = (u - mean) / log_std.exp()
    standardized = (-0.5 * z**2 - 0.5 * np.log(2 * np.pi)).mean(-1).numpy()
    log_prob = (-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi) - torch.log(1 - torch.tanh(u) ** 2)).mean(-1).numpy()
    np.testing.assert_allclose(agent.score_fn("log_prob")(obs, action), log_prob, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(agent.score_fn("standardized")(obs, action), standardized, rtol=1e-4, atol=1e-4)
    mode = agent.act(obs, explore=False)
    assert (agent.score_fn("standardized")(obs, mode) > agent.score_fn("standardized")(obs, action)).all()
    with pytest.raises(ValueError, match="score mode"):
        agent.score_fn("nope")


@pytest.mark.parametrize("kind", CONTINUOUS)
def test_log_likelihood_signal_is_the_policy_density_of_the_stored_action(kind):
    agent = make(kind)
    b = batch(kind, seed=3)
    tb = b.to_torch()
    with torch.no_grad():
        expected = agent.actor.log_prob(tb.obs, tb.action).mean(-1).numpy()  # before the update's actor step
    # the "log_prob" ARB score is the same density up to the constant log-Jacobian of the box scaling
    offset = float(np.log((HIGH - LOW) / 2).mean())
    np.testing.assert_allclose(agent.score_fn("log_prob")(b.obs, b.action) - offset, expected, rtol=1e-4, atol=1e-4)
    got = agent.update(b).signals["log_likelihood"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_bad_batches_are_rejected(kind):
    agent = make(kind)
    b = batch(kind)
    wrong = type(b)(obs=b.obs[:, :-1], action=b.action, reward=b.reward, next_obs=b.next_obs,
                    terminated=b.terminated, truncated=b.truncated, info=b.info, extras=b.extras)
    with pytest.raises(ValueError, match="batch.obs"):
        agent.update(wrong)
    if kind.startswith("calql"):
        no_mc = type(b)(obs=b.obs, action=b.action, reward=b.reward, next_obs=b.next_obs,
                        terminated=b.terminated, truncated=b.truncated, info=b.info)
        with pytest.raises(ValueError, match="mc_return"):
            agent.update(no_mc)


@pytest.mark.slow
@pytest.mark.parametrize("kind,mode", [("rlpd", "default"), ("calql", "default"), ("rlpd", "reduce-overhead")])
def test_compiled_critics_match_eager(kind, mode, tmp_path):
    """compile=True (torch.compile of the critic ensembles, in each compile_mode) changes speed, not results or
    checkpoints."""
    eager, compiled = make(kind), make(kind, compile=True, compile_mode=mode)
    for step in range(3):
        b = batch(kind, seed=step)
        r1, r2 = eager.update(b), compiled.update(b)
        np.testing.assert_allclose(r1.signals["td_error"], r2.signals["td_error"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(flat_params(eager), flat_params(compiled), rtol=1e-4, atol=1e-4)
    save_tree(tmp_path / "agent", compiled.state_dict(), kind="agent")
    plain = make(kind)
    plain.load_state_dict(load_tree(tmp_path / "agent", kind="agent"))
    torch.testing.assert_close(flat_params(plain), flat_params(compiled), rtol=0, atol=0)
