"""The agent contract, checked for every registered agent the same way (d3rlpy-style: one parametrized suite).

The kinds come from the registry (``relive.registry.AGENTS`` after ``load_builtins``): every built-in agent runs
through every check in each configuration ``tests/agents/factory.REGISTERED`` lists for it, and a registered agent
without a factory entry fails (``test_every_registered_agent_has_a_factory``). A check that does not apply to an
agent says so below, with the reason, in a table keyed by kind -- never by skipping silently."""

import dataclasses

import numpy as np
import pytest
import torch

from relive.agents.contract import Agent
from relive.agents.encoders import concat_keys
from relive.envs import EnvSpec
from relive.registry import AGENTS, load_builtins
from relive.replay.buffer import ReplayBuffer
from relive.replay.checkpoint import load_tree, save_tree
from relive.train.ray_collectors import acting_state, check_agent, load_acting_state
from relive.types import Acted, unpack_acted
from tests.agents.factory import (
    ACT,
    AGENT_OF,
    DISCRETE,
    HIGH,
    KINDS,
    LOW,
    NUM_ACTIONS,
    OBS,
    REGISTERED,
    SIGNALS,
    B,
    batch,
    columns,
    flat_params,
    from_spec_kwargs,
    make,
    modules,
    replace_rows,
)


def builtin_agents() -> list[str]:
    """Every agent the package registers (agents a test file registers for itself are not the package's)."""
    load_builtins()
    return sorted(name for name, e in AGENTS.items() if e.target.__module__.startswith("relive."))


# one parameter per factory kind of every registered agent; an agent without a factory gets one that fails
CONTRACT = [k for name in builtin_agents() for k in REGISTERED.get(name, (f"missing:{name}",))]
SCORED = [k for k in CONTRACT if k in AGENT_OF and hasattr(AGENTS[AGENT_OF[k]].target, "score_fn")]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/agents/conftest.py


@pytest.fixture(params=CONTRACT)
def kind(request):
    if request.param.startswith("missing:"):
        pytest.fail(f"agent {request.param[8:]!r} is registered but the contract has no factory for it: add a "
                    f"factory for {request.param[8:]} (tests/agents/factory.py: make() and REGISTERED)")
    return request.param


def test_every_registered_agent_has_a_factory(kind):
    """Each kind builds the registered class it stands for (the table cannot point at the wrong agent)."""
    assert type(make(kind)) is AGENTS[AGENT_OF[kind]].target
    assert set(KINDS) == {k for name in builtin_agents() for k in REGISTERED.get(name, ())}, "a stale factory kind"


def _action_ok(kind, a, n):
    if kind in DISCRETE:
        assert a.shape == (n,) and a.dtype == np.int64 and ((0 <= a) & (a < NUM_ACTIONS)).all()
    else:
        assert a.shape == (n, ACT) and a.dtype == np.float32
        assert (a >= LOW).all() and (a <= HIGH).all()


def test_actions_have_the_promised_shape_dtype_and_bounds(kind):
    agent = make(kind)
    assert isinstance(agent, Agent)
    obs = np.random.default_rng(1).normal(size=(64, OBS)).astype(np.float32) * 10  # far from the data
    for explore in (True, False):
        a, _, store = unpack_acted(agent.act(obs, explore))
        _action_ok(kind, a, 64)
        assert store.shape == (64,) and store.dtype == bool
    single = agent.act(obs[0], explore=False)  # one observation -> one action
    single = single.action if isinstance(single, Acted) else single
    assert np.shape(single) == (() if kind in DISCRETE else (ACT,))
    with pytest.raises(ValueError, match="obs must have shape"):
        agent.act(np.zeros((4, OBS + 1), np.float32), explore=False)


def test_update_returns_finite_metrics_and_per_sample_signals(kind):
    """Metrics are finite floats under ``train/``; the signals are exactly the ones the kind promises
    (``factory.SIGNALS``), one finite number per row."""
    agent = make(kind)
    for step in range(3):
        res = agent.update(batch(kind, seed=step))
        assert res.metrics and all(k.startswith("train/") for k in res.metrics)
        assert all(isinstance(v, float) and np.isfinite(v) for v in res.metrics.values()), dict(res.metrics)
        assert set(res.signals) == SIGNALS[kind]
        for v in res.signals.values():
            assert isinstance(v, np.ndarray) and v.shape == (B,) and np.isfinite(v).all()


def test_acting_records_fit_the_declared_columns_and_a_buffer_stores_them(kind):
    """What ``act`` records is among the columns the agent declares, with the declared shape and dtype, and a
    buffer built from the declarations stores an acted step; the batches of every other check hold exactly the
    declared columns (what a buffer would hand the update)."""
    agent = make(kind)
    declared = {c.name: c for c in columns(kind)}
    assert len(declared) == len(columns(kind)), "a column declared twice"
    assert set(batch(kind).extras) == set(declared)
    obs = np.random.default_rng(2).normal(size=(3, OBS)).astype(np.float32)
    action, record, store = unpack_acted(agent.act(obs, explore=True))
    assert set(record) <= set(declared), f"act records {sorted(set(record) - set(declared))}, not declared"
    for name, value in record.items():
        shape, dtype = declared[name].spec
        assert np.shape(value) == (3, *shape) and np.asarray(value).dtype == dtype, name
    buf = ReplayBuffer(16, (OBS,), () if kind in DISCRETE else (ACT,),
                       action_dtype=np.int64 if kind in DISCRETE else np.float32,
                       extra_columns={c.name: c.spec for c in declared.values()} or None)
    rows = {"obs": obs, "action": action, "reward": np.zeros(3, np.float32), "next_obs": obs,
            "terminated": np.zeros(3, bool), "truncated": np.zeros(3, bool)}
    filled = {c.name: c.filled(3) for c in declared.values() if c.name not in record}  # as the collector does
    slots = buf.extend(rows | filled | dict(record))
    for name, value in record.items():
        np.testing.assert_array_equal(buf.storage.read(name, slots), value)


# A check that does not apply to a kind, with why. is_weight: modules whose update is, by the method's definition,
# not an is_weight-weighted mean over the batch (PER's weights correct the TD regression).
NOT_IS_WEIGHTED = {
    "ddpg": (("actor", "target_actor"), "the deterministic policy gradient (DDPG Eq. 6) averages over the batch's "
             "states unweighted; is_weight corrects the critic's TD loss only"),
    "ddpg_refer": (("actor", "target_actor"), "as ddpg; and ReF-ER's Rule 2 KL is over every covered row"),
    "td3": (("actor", "target_actor"), "as ddpg (TD3 changes the critic side: twin critics, smoothed targets)"),
    "ddpg_her": (("actor", "target_actor"), "as ddpg (the HER code's options change acting and the inputs)"),
    "sac_refer": (("actor",), "under ReF-ER hints the Rule 2 KL penalty (Eq. 10) is over every covered row, "
                  "unweighted (the SAC part of the actor loss is weighted)"),
}


def test_zero_is_weight_rows_do_not_influence_the_update(kind):
    """With is_weight 0 on half the batch the update (critic, actor, temperature, alpha') depends on the other half
    only: replacing the zero-weight rows by other data gives bit-identical parameters (but in the modules
    ``NOT_IS_WEIGHTED`` names); replacing a weighted row does not."""
    exempt = NOT_IS_WEIGHTED.get(kind, ((), ""))[0]
    w = np.r_[np.ones(B // 2), np.zeros(B // 2)]
    b1, b2 = batch(kind, seed=1, is_weight=w), batch(kind, seed=2, is_weight=w)
    zero_rows, weighted_rows = np.arange(B // 2, B), np.arange(B // 2)
    results = []
    for b in (b1, replace_rows(b1, b2, zero_rows), replace_rows(b1, b2, weighted_rows)):
        agent = make(kind)
        assert set(exempt) <= set(modules(agent))
        agent.update(b)
        results.append(flat_params(agent, exclude=exempt))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
    assert not torch.allclose(results[0], results[2])


# the network the TD / value regression trains, its optimizer, and the config that turns gradient clipping off
TD_NET = {"ddqn": ("q", "opt", {"max_grad_norm": None}), "vracer": ("net", "opt", {}),
          "vracer_refer": ("net", "opt", {}), "residual_sac": ("critic", "critic_opt", {"grad_clip_norm": 0.0}),
          "residual_sac_pretrain": ("critic", "critic_opt", {"grad_clip_norm": 0.0})}


def test_is_weight_scales_the_gradient_of_its_row(kind):
    """Doubling every is_weight doubles the critic / Q / value gradient (the loss is a weighted mean, not
    normalized by the weights' sum)."""
    net_name, opt_name, no_clip = TD_NET.get(kind, ("critic", "critic_opt", {}))
    grads = []
    for scale in (1.0, 2.0):
        agent = make(kind, seed=3, **no_clip)
        b = batch(kind, seed=5, is_weight=np.full(B, scale))
        net, opt = getattr(agent, net_name), getattr(agent, opt_name)
        captured = []

        def capture(*args, net=net, captured=captured, **kwargs):
            captured.append(torch.cat([p.grad.flatten() for p in net.parameters()]))

        opt.step = capture
        agent.update(b)
        grads.append(captured[0])
    torch.testing.assert_close(grads[1], 2 * grads[0], rtol=1e-4, atol=1e-6)


def _same_tree(x, y, path="state"):
    """Two state trees hold the same values (arrays bit-identical)."""
    if isinstance(x, dict):
        assert isinstance(y, dict) and set(x) == set(y), path
        for k in x:
            _same_tree(x[k], y[k], f"{path}.{k}")
    elif isinstance(x, (list, tuple)):
        assert len(x) == len(y), path
        for i, (a, b) in enumerate(zip(x, y, strict=True)):
            _same_tree(a, b, f"{path}[{i}]")
    else:
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=path)


def test_save_load_restores_everything_and_resumes_exactly(kind, tmp_path):
    """state_dict -> save_tree / load_tree -> load_state_dict into an agent of another seed: same actions (RNG
    included), and the next update gives bit-identical parameters, metrics, signals and state to the agent
    that was never interrupted."""
    agent = make(kind)
    for step in range(2):
        agent.update(batch(kind, seed=step))
    save_tree(tmp_path / "agent", agent.state_dict(), kind="agent")
    clone = make(kind, seed=123)
    clone.load_state_dict(load_tree(tmp_path / "agent", kind="agent"))
    obs = np.random.default_rng(1).normal(size=(7, OBS)).astype(np.float32)
    for explore in (False, True):  # (exploring: the RNG was restored)
        (a1, rec1, s1), (a2, rec2, s2) = (unpack_acted(x.act(obs, explore)) for x in (agent, clone))
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(s1, s2)
        _same_tree(dict(rec1), dict(rec2))
    b = batch(kind, seed=9)
    r1, r2 = agent.update(b), clone.update(b)
    torch.testing.assert_close(flat_params(agent), flat_params(clone), rtol=0, atol=0)
    assert dict(r1.metrics) == dict(r2.metrics)
    for name in r1.signals:
        np.testing.assert_array_equal(r1.signals[name], r2.signals[name])
    _same_tree(agent.state_dict(), clone.state_dict())


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
        np.testing.assert_array_equal(unpack_acted(x.act(obs, explore=True))[0],
                                      unpack_acted(y.act(obs, explore=True))[0])
    torch.testing.assert_close(flat_params(x), flat_params(y), rtol=0, atol=0)
    assert not torch.equal(flat_params(make(kind, seed=4)), flat_params(make(kind, seed=5)))
    # the agents never read or advanced the global RNGs
    assert torch.equal(torch.get_rng_state(), global_state)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)  # noqa: NPY002


# -- dict observations: taken (as the concatenation of the keys) or refused by from_spec with a clear message -------
DICT_OBS = {"pos": ((3,), np.float32), "vel": ((2,), np.float32)}  # 5 numbers, like the flat OBS


def _spec(kind, obs_shape):
    if kind in DISCRETE:
        return EnvSpec("Toy-v0", obs_shape, True, (), NUM_ACTIONS, None, None, 100)
    return EnvSpec("Toy-v0", obs_shape, False, (ACT,), 0, LOW, HIGH, 100)


def _as_dict(flat):
    return {"pos": flat[:, :3], "vel": flat[:, 3:]}


def test_dict_observations_are_taken_or_refused_clearly(kind):
    """``from_spec`` on a dict observation space either refuses it (a ValueError naming the dict observations)
    or builds an agent that acts and updates on dict observations exactly as on their concatenation."""
    cls, cfg = type(make(kind)), make(kind).cfg
    try:
        taker = cls.from_spec(_spec(kind, DICT_OBS), cfg, 3, "cpu", **from_spec_kwargs(kind))
    except ValueError as e:
        assert "observations" in str(e) and "Toy-v0" in str(e), str(e)
        return
    flat = cls.from_spec(_spec(kind, (OBS,)), cfg, 3, "cpu", **from_spec_kwargs(kind))
    for x in (taker, flat):
        if hasattr(make(kind), "online"):
            x.set_online(make(kind).online)
        if getattr(make(kind), "phase", None) == "offline":
            x.on_phase("offline")
    obs = np.random.default_rng(4).normal(size=(6, OBS)).astype(np.float32)
    np.testing.assert_array_equal(unpack_acted(taker.act(_as_dict(obs), explore=False))[0],
                                  unpack_acted(flat.act(obs, explore=False))[0])
    b = batch(kind, seed=1)
    d = dataclasses.replace(b, obs=_as_dict(b.obs), next_obs=_as_dict(b.next_obs))
    np.testing.assert_array_equal(concat_keys(d.obs), b.obs)
    r1, r2 = taker.update(d), flat.update(b)
    for name in r2.signals:
        np.testing.assert_array_equal(r1.signals[name], r2.signals[name])
    torch.testing.assert_close(flat_params(taker), flat_params(flat), rtol=0, atol=0)


# -- acting on a CPU copy (Ray collectors) -----------------------------------------------------------------------
def test_a_copy_acts_as_the_learner_from_the_acting_state_or_the_agent_says_why_not(kind):
    """A collector's copy (another seed) loaded with ``acting_state`` (the modules ``acting_modules`` names, and
    the ``acting_clock``) acts exactly as the learner; an agent that cannot act on a copy names why
    (``remote_acting_problem``) and ``check_agent`` refuses it with that reason."""
    learner = make(kind)
    problem = getattr(learner, "remote_acting_problem", None)
    if problem:
        with pytest.raises(ValueError, match="cannot act in collector processes"):
            check_agent(learner)
        return
    check_agent(learner)
    for step in range(2):  # the learner's weights move away from the copy's
        learner.update(batch(kind, seed=step))
    # 10,000 exploring steps: whatever act() advances (DDQN: epsilon's clock, decayed to eps_end) has moved
    learner.act(np.random.default_rng(6).normal(size=(10_000, OBS)).astype(np.float32), explore=True)
    copy = make(kind, seed=7)
    state = acting_state(learner)
    assert all(isinstance(v, np.ndarray) for m in state["modules"].values() for v in m.values())  # plain arrays
    load_acting_state(copy, state)
    clock = getattr(learner, "acting_clock", None)
    if clock:
        assert getattr(copy, clock) == getattr(learner, clock) == 10_000
    obs = np.random.default_rng(5).normal(size=(64, OBS)).astype(np.float32)
    (a1, rec1, _), (a2, rec2, _) = (unpack_acted(x.act(obs, explore=False)) for x in (learner, copy))
    np.testing.assert_array_equal(a1, a2)
    _same_tree(dict(rec1), dict(rec2))
    # exploring too: with the copy's random streams set to the learner's (a collector has its own), the acting
    # state is all that exploration reads (weights, and the clock of a schedule)
    for name, value in vars(learner).items():
        if isinstance(value, torch.Generator):
            getattr(copy, name).set_state(value.get_state())
        elif isinstance(value, np.random.Generator):
            getattr(copy, name).bit_generator.state = value.bit_generator.state
    (a1, rec1, _), (a2, rec2, _) = (unpack_acted(x.act(obs, explore=True)) for x in (learner, copy))
    np.testing.assert_array_equal(a1, a2)
    _same_tree(dict(rec1), dict(rec2))


@pytest.mark.parametrize("kind", SCORED)
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
    mode = unpack_acted(agent.act(obs, explore=False))[0]
    assert (agent.score_fn("standardized")(obs, mode) > agent.score_fn("standardized")(obs, action)).all()
    with pytest.raises(ValueError, match="score mode"):
        agent.score_fn("nope")


@pytest.mark.parametrize("kind", SCORED)
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
    """A batch of the wrong observation size, or without a declared column the update reads, is a ValueError
    naming it (not a shape error or a KeyError from inside the update)."""
    agent = make(kind)
    b = batch(kind)
    with pytest.raises(ValueError, match="batch.obs"):
        agent.update(dataclasses.replace(b, obs=b.obs[:, :-1]))
    for name in b.extras:  # each declared column left out in turn: not needed, or refused by name (ValueError, or
        # the Batch's own AttributeError "Batch has no column ...")
        try:
            make(kind).update(dataclasses.replace(b, extras={k: v for k, v in b.extras.items() if k != name}))
        except (ValueError, AttributeError) as e:
            assert repr(name) in str(e), str(e)


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
