"""ReFERSampler (Novati & Koumoutsakos 2019, Sec. 3): uniform draws, per-row rho and far counts under sampled
updates and recounts, beta's fixed-point iteration (Eq. 12), c_max and lr annealing (Eq. 13), hints, checkpoints,
refusals that leave the buffer unchanged, and composition with the offline/online mixture."""

import dataclasses

import numpy as np
import pytest
import torch

from relive.agents.ddpg import DDPG, DDPGConfig
from relive.config import ReplayConfig
from relive.hooks import EveryGradSteps
from relive.registry import ReplayBuild, replay_entry
from relive.replay import MixtureSampler, ReplayBuffer, UniformSampler
from relive.replay.refer_schedule import c_max_at, is_far
from relive.replay.samplers.refer import ReFERConfig, ReFERSampler
from relive.types import unpack_acted
from tests.replay.adaptive_helpers import check_frequencies_with_power

torch.set_num_threads(1)
OBS, ACT = 2, 1
COLS = {"mu_mean": (ACT,), "mu_std": (ACT,)}


def rows(n, seed=0, std=0.5, ends=()):
    """Rows whose obs[:, 0] is a token that ``log_rho_fn`` turns into a known log rho."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    trunc = np.zeros(n, bool)
    trunc[list(ends)] = True
    return dict(obs=obs, action=rng.uniform(-1, 1, (n, ACT)).astype(np.float32), reward=np.zeros(n, np.float32),
                next_obs=obs, terminated=np.zeros(n, bool), truncated=trunc,
                mu_mean=np.zeros((n, ACT), np.float32), mu_std=np.full((n, ACT), std, np.float32))


def log_rho_fn(obs, action, mu_mean, mu_std):
    """A stand-in policy: log rho = 3 * token (so |token| >= log(c_max) / 3 is far), not clipped."""
    return 3.0 * obs[:, 0].astype(np.float64)


def buffer(capacity=100, n=60, sampler=None, seed=0, **kw):
    buf = ReplayBuffer(capacity, OBS, ACT, sampler=sampler or ReFERSampler(**kw), seed=seed, extra_columns=COLS)
    buf.extend(rows(n, seed))
    return buf


def random_updates(buf, steps, seed=0, batch=16):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        b = buf.sample(batch)
        buf.update(b.info, rho=np.exp(rng.uniform(-3, 3, batch)))


def test_sampling_is_uniform_and_hints_carry_the_schedules():
    buf = buffer(A=1e-2, C=4.0)
    p = buf.sampler.probabilities()
    np.testing.assert_array_equal(p[:60], np.full(60, 1 / 60))
    assert p[60:].sum() == 0
    check_frequencies_with_power(buf, p[:60])
    random_updates(buf, 7)
    h = buf.sample(4).info.hints
    assert h == {"c_max": pytest.approx(1 + 4 / (1 + 1e-2 * 7)), "beta": buf.sampler.beta,
                 "lr_scale": pytest.approx(1 / (1 + 1e-2 * 7)), "refer_source": -1}
    assert buf.sampler.t == 7


@pytest.mark.parametrize("A", [0.0, 1e-2])
def test_far_counts_track_sampled_updates_and_recount_is_exact(A):
    """After random sampled updates (with repeated slots, and inserts overwriting far rows) the incremental far
    count equals a brute-force count of the stored rho (with a fixed c_max: A = 0; annealed, each flag uses the
    c_max of its update); after ``recount`` it equals a brute-force count of every row's fresh rho against the
    current c_max."""
    buf = buffer(capacity=50, n=80, A=A)  # the ring wrapped: overwritten rows start near (rho = 1)
    s = buf.sampler
    for step in range(30):
        random_updates(buf, 1, seed=step, batch=40)
        buf.extend(rows(3, seed=100 + step))
        assert s.num_far == int(s.far[:50].sum())
        if A == 0:
            assert s.num_far == int(is_far(s.rho[:50], s.c_max).sum())
    assert 0 < s.far_fraction() < 1
    s.recount(log_rho_fn, chunk_size=7)
    tokens = buf.storage.columns["obs"][:50, 0].astype(np.float64)
    rho = np.exp(np.clip(3 * tokens, -7, 7))  # the recount clips log rho as the agent does
    brute = is_far(rho, c_max_at(30, 4.0, A))
    assert 0 < brute.sum() < 50
    assert s.num_far == int(brute.sum()) and s.far_fraction() == brute.mean()
    np.testing.assert_allclose(s.rho[:50], rho)
    assert buf.stats()["replay/far_policy_fraction"] == brute.mean()
    assert buf.stats()["replay/refer_c_max"] == c_max_at(30, 4.0, A)
    assert s.num_recounts == 1


def test_overwritten_rows_leave_the_far_count():
    buf = buffer(capacity=10, n=10)
    b = buf.gather(np.arange(10))
    buf.update(b.info, rho=np.full(10, 1e-3))  # every row far
    assert buf.sampler.num_far == 10
    buf.extend(rows(4, seed=1))  # overwrites slots 0..3
    assert buf.sampler.num_far == 6 and (buf.sampler.rho[:4] == 1).all()
    report = buf.update(b.info, rho=np.full(10, 1e-3))  # the sampled info is stale for the overwritten rows
    assert report.num_stale == 4 and buf.sampler.num_far == 6


@pytest.mark.parametrize("schedule", ["paper", "smarties"])
def test_beta_follows_eq_12_after_every_update(schedule):
    """Far fraction held above D: beta decays geometrically (the paper: by 1 - eta / (1 + A t) per step; smarties:
    eta = 0.1 B / N); held below D: 1 - beta decays the same way, beta rises to 1."""
    cfg = ReFERConfig(A=1e-3, beta_eta=0.05, initial_beta=0.8) if schedule == "paper" else \
        ReFERConfig.smarties(A=1e-3)
    buf = buffer(capacity=40, n=40, **dataclasses.asdict(cfg))  # (ReFERSampler's settings are its config's fields)
    s = buf.sampler
    beta = s.beta
    for step in range(50):
        b = buf.sample(8)
        buf.update(b.info, rho=np.full(8, 1e-3))  # far rows accumulate; the fraction soon exceeds D
        eta = 0.05 / (1 + 1e-3 * step) if schedule == "paper" else 0.1 * 8 / 40
        above = s.far_fraction() > 0.1
        beta = (1 - min(eta, beta)) * beta + (0 if above else min(eta, 1 - beta)) if schedule == "smarties" \
            else (1 - eta) * beta + (0 if above else eta)
        assert s.beta == pytest.approx(beta, rel=1e-12, abs=1e-15)
    assert s.far_fraction() > 0.1 and s.beta < 0.8 * 0.9**20
    buf.update(buf.gather(np.arange(40)).info, rho=np.ones(40))  # nothing far any more: beta climbs back
    for _ in range(300):
        buf.update(buf.sample(8).info, rho=np.ones(8))
    assert s.far_fraction() == 0 and s.beta > 0.9


def test_checkpoint_keeps_rho_far_counts_beta_and_t_exactly(tmp_path):
    buf = buffer(capacity=50, n=70, A=1e-2, initial_beta=0.5)
    random_updates(buf, 25, batch=20)
    buf.sampler.recount(log_rho_fn)
    random_updates(buf, 5, seed=3, batch=20)
    buf.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    a, b = buf.sampler, loaded.sampler
    assert isinstance(b, ReFERSampler)
    np.testing.assert_array_equal(a.rho, b.rho)
    np.testing.assert_array_equal(a.far, b.far)
    assert (a.num_far, a.beta, a.t, a.num_recounts, a.batch_size) == (b.num_far, b.beta, b.t, b.num_recounts,
                                                                      b.batch_size)
    assert b.config() == a.config()
    for _ in range(3):  # and they go on identically
        x, y = buf.sample(20), loaded.sample(20)
        np.testing.assert_array_equal(x.info.indices, y.info.indices)
        assert x.info.hints == y.info.hints
        rho = np.exp(np.random.default_rng(5).uniform(-2, 2, 20))
        buf.update(x.info, rho=rho)
        loaded.update(y.info, rho=rho)
    assert (a.num_far, a.beta, a.t) == (b.num_far, b.beta, b.t)


def _snapshot(buf):
    s = buf.sampler
    return (len(buf), buf.storage.columns["mu_std"].copy(), s.rho.copy(), s.far.copy(), s.num_far, s.beta, s.t)


def _same(x, y):
    for u, v in zip(x, y, strict=True):
        np.testing.assert_array_equal(u, v)


def test_bad_input_is_refused_and_leaves_the_buffer_unchanged():
    with pytest.raises(ValueError, match="behaviour columns .* missing: \\['mu_mean', 'mu_std'\\]"):
        ReplayBuffer(10, OBS, ACT, sampler=ReFERSampler())
    buf = buffer(n=20)
    random_updates(buf, 3)
    before = _snapshot(buf)
    for std in (0.0, -1.0):
        bad = rows(5, seed=1)
        bad["mu_std"][3] = std
        with pytest.raises(ValueError, match="'mu_std' row 3"):
            buf.extend(bad)
        _same(before, _snapshot(buf))
    no_mu = {k: v for k, v in rows(5).items() if k != "mu_mean"}
    with pytest.raises(ValueError, match="missing column"):
        buf.extend(no_mu)
    b = buf.sample(6)
    for rho, match in ((np.nan, "not finite"), (0.0, "finite number > 0"), (-2.0, "finite number > 0")):
        values = np.ones(6)
        values[2] = rho
        with pytest.raises(ValueError, match=match):
            buf.update(b.info, rho=values)
        _same(before, _snapshot(buf))
    with pytest.raises(ValueError, match="needs a 'rho' signal"):
        buf.update(b.info, td_error=np.ones(6))
    with pytest.raises(ValueError, match="non-finite"):
        buf.sampler.recount(lambda *cols: np.where(cols[0][:, 0] > 0, np.nan, 0.0))
    _same(before, _snapshot(buf))
    with pytest.raises(ValueError, match="beta_schedule"):
        ReFERConfig(beta_schedule="fast")
    with pytest.raises(ValueError, match="0 < D < 1"):
        ReFERSampler(D=0.0)


def test_offline_rows_without_behaviour_records():
    """Decision: offline rows without a record (the agent's fill, std 0) are refused by a ReF-ER sampler that covers
    them, and accepted when ReF-ER covers only the online part of a mixture; the agent then treats them as near
    rows without KL (tested in tests/agents/test_refer.py) and only online rows reach the ReF-ER bookkeeping."""
    offline = rows(30, seed=2, std=0.0)
    whole = ReplayBuffer(100, OBS, ACT, sampler=ReFERSampler(), extra_columns=COLS)
    with pytest.raises(ValueError, match="online part"):
        whole.add_offline(offline)
    assert len(whole) == 0
    replay = ReplayConfig.of("refer_online", offline_fraction=0.25)  # a shorthand of a mixture, ReF-ER online
    sampler = replay_entry(replay.name).target(replay.options, ReplayBuild(1000, 100, np.random.SeedSequence(0)))
    assert isinstance(sampler, MixtureSampler) and isinstance(sampler.online, ReFERSampler)
    assert isinstance(sampler.offline, UniformSampler)
    buf = ReplayBuffer(100, OBS, ACT, sampler=sampler, extra_columns=COLS)
    buf.add_offline(offline)
    with pytest.raises(ValueError, match="'mu_std' row 0"):  # online rows still need their record
        buf.extend(rows(4, std=0.0))
    buf.extend(rows(40, seed=3))
    b = buf.sample(20)
    assert (b.info.source == 0).sum() == 5
    assert b.info.hints["refer_source"] == 1 and b.info.hints["c_max"] == pytest.approx(5.0)
    buf.update(b.info, rho=np.full(20, 1e-3))  # routed: only the online rows become far
    online = b.info.indices[b.info.source == 1]
    assert sampler.online.num_far == np.unique(online).size
    assert (sampler.online.rho[:30] == 1).all()  # offline slots untouched
    assert buf.stats()["replay/online/far_policy_fraction"] == np.unique(online).size / 40
    assert isinstance(replay_entry("refer").target(ReFERConfig(), ReplayBuild(1, 1, np.random.SeedSequence(0))),
                      ReFERSampler)


def test_loop_hook_recounts_with_the_agents_batched_log_rho():
    """The recount hook calls DDPG's ``refer_log_rho`` over every row; the far fraction is then the brute-force one
    under the current actor."""
    agent = DDPG(OBS, ACT, [-1.0], [1.0], DDPGConfig(hidden=(16,), actor_lr=0.05), seed=0)  # moves fast
    sampler = ReFERSampler(recount_every_grad_steps=5, recount_chunk_size=10, initial_beta=1.0)  # plain DPG steps
    buf = ReplayBuffer(64, OBS, ACT, sampler=sampler,
                       extra_columns={d.name: d.spec for d in agent.stored_columns()})
    rng = np.random.default_rng(0)
    for _ in range(4):
        obs = rng.normal(size=(16, OBS)).astype(np.float32)
        action, record, _ = unpack_acted(agent.act(obs, explore=True))
        buf.extend(dict(obs=obs, action=action, reward=rng.normal(size=16).astype(np.float32), next_obs=obs,
                        terminated=np.zeros(16, bool), truncated=np.zeros(16, bool), **record))
    for _ in range(30):  # move the actor away from the behaviours
        b = buf.sample(16)
        buf.update(b.info, **agent.update(b).signals)

    class Ctx:
        pass

    ctx = Ctx()
    ctx.agent = agent
    hooks = buf.sampler.loop_hooks(ctx)
    assert [type(h) for h in hooks] == [EveryGradSteps] * 2 and {h.every for h in hooks} == {5}
    assert {h.phase for h in hooks} == {"offline", "online"}
    hooks[1].fn()
    cols = buf.storage.columns
    with torch.no_grad():
        m = agent.actor(torch.as_tensor(cols["obs"])).numpy()
    log_rho = np.clip(-(((cols["action"] - m) ** 2) - (cols["action"] - cols["mu_mean"]) ** 2).sum(1)
                      / (2 * 0.2**2), -7, 7)
    brute = is_far(np.exp(log_rho), buf.sampler.c_max)
    assert brute.any() and buf.sampler.num_far == int(brute.sum())
    np.testing.assert_allclose(np.log(buf.sampler.rho), log_rho, rtol=1e-4, atol=1e-4)

    class Plain:
        pass

    ctx.agent = Plain()
    with pytest.raises(ValueError, match="refer_log_rho"):
        buf.sampler.loop_hooks(ctx)


def _hand_made(estimator, A=0.0, stored_rho=1.0):
    """10 rows whose current log rho (``log_rho_fn``: 3 * token) is far for rows 0-3 (|3 * 0.7| > log 5) and near
    for the others (token 0), every stored rho = ``stored_rho`` (their last sampling: near)."""
    buf = ReplayBuffer(10, OBS, ACT, sampler=ReFERSampler(A=A, D=0.1, beta_eta=0.1, initial_beta=0.5,
                                                          far_estimator=estimator), extra_columns=COLS)
    r = rows(10)
    r["obs"][:, 0] = [0.7, -0.7, 0.7, -0.7, 0, 0, 0, 0, 0, 0]
    buf.extend(r)
    buf.update(buf.gather(np.arange(10)).info, rho=np.full(10, stored_rho))
    return buf


def test_stale_and_recount_estimators_give_different_far_fractions_and_betas():
    """Issue 28 item 9. The paper's estimator ("stale") counts far rows from each row's last computed rho; relive's
    ("recount") replaces them by an exact recount. Hand-made: the stored rho are all 1 (near) but under the current
    policy 4 of 10 rows are far. After the pass: stale 0.0 (beta rises: 0 <= D), recount 0.4 (beta falls); both log
    the exact 0.4 and the stale 0.0 the pass found."""
    stale, exact = _hand_made("stale"), _hand_made("recount")
    for buf in (stale, exact):
        assert buf.sampler.far_fraction() == 0.0 and "replay/refer_far_fraction_exact" not in buf.stats()
        buf.sampler.recount(log_rho_fn)
        assert buf.stats()["replay/refer_far_fraction_exact"] == pytest.approx(0.4)
        assert buf.stats()["replay/refer_far_fraction_stale"] == 0.0
    assert stale.sampler.far_fraction() == 0.0 and (stale.sampler.rho[:10] == 1.0).all()  # rho kept: stale
    assert exact.sampler.far_fraction() == pytest.approx(0.4) and exact.sampler.far[:4].all()
    assert stale.stats()["replay/far_policy_fraction"] == 0.0
    assert exact.stats()["replay/far_policy_fraction"] == pytest.approx(0.4)
    beta = stale.sampler.beta
    assert exact.sampler.beta == beta == pytest.approx(0.55)  # (one beta step in _hand_made, from 0.5)
    for buf in (stale, exact):  # one gradient step on rows 4-9 (near either way): Eq. 12 with each estimate
        buf.update(buf.gather(np.arange(4, 10)).info, rho=np.ones(6))
    assert stale.sampler.beta == pytest.approx(0.9 * beta + 0.1) and exact.sampler.beta == pytest.approx(0.9 * beta)


def test_stale_estimator_reflags_the_stored_rho_against_the_annealed_c_max():
    """The stale pass keeps each row's last rho but judges it against the current c_max (the authors' code's
    periodic ``updateCumulative``): stored rho 3.0 is near at c_max 5 and far once c_max has annealed below 3."""
    buf = _hand_made("stale", A=1.0, stored_rho=3.0)  # c_max(1) = 1 + 4 / 2 = 3.0 after the update: rho 3 is far
    s = buf.sampler
    assert s.far_fraction() == 0.0  # flagged at c_max(0) = 5
    s.recount(log_rho_fn)
    assert s.c_max == pytest.approx(3.0) and s.far_fraction() == 1.0 and (s.rho[:10] == 3.0).all()
    assert buf.stats()["replay/refer_far_fraction_exact"] == pytest.approx(0.4)


def test_initial_beta_defaults_to_the_authors_code_and_is_an_option():
    """Issue 28 item 10: beta starts at 1e-4 (smarties MemoryBuffer.h; the paper gives no value), not 1.0."""
    assert ReFERConfig().initial_beta == 1e-4 and ReFERSampler().beta == 1e-4
    buf = buffer()
    assert buf.sample(4).info.hints["beta"] == 1e-4
    assert buffer(initial_beta=1.0).sample(4).info.hints["beta"] == 1.0
    assert ReFERConfig().far_estimator == "recount" and ReFERConfig.smarties().initial_beta == 1e-4
    with pytest.raises(ValueError, match="far_estimator must be one of"):
        ReFERConfig(far_estimator="exact")
    with pytest.raises(ValueError, match="initial_beta"):
        ReFERSampler(initial_beta=1.5)


def test_checkpoint_keeps_the_estimator_and_the_last_pass(tmp_path):
    buf = _hand_made("stale")
    buf.sampler.recount(log_rho_fn)
    buf.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    assert loaded.sampler.far_estimator == "stale" and loaded.sampler.config() == buf.sampler.config()
    for key in ("replay/refer_far_fraction_exact", "replay/refer_far_fraction_stale", "replay/far_policy_fraction"):
        assert loaded.stats()[key] == buf.stats()[key], key


@pytest.mark.parametrize(("field", "value", "match"), [
    ("rho", -1.0, "'rho' entry 0: value -1.0 is not allowed"),
    ("rho", float("nan"), "'rho' entry 0: value nan is not allowed"),
    ("num_far", 10**6, r"'num_far' must be an integer in \[0, 50\]"),
    ("beta", float("inf"), "'beta' must be a finite number"),
])
def test_a_checkpoint_with_a_wrong_refer_state_is_refused_naming_the_field(tmp_path, field, value, match):
    """Issue 27 item 11: ReF-ER's state is validated on load with the rules of its input."""
    from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

    buf = buffer(capacity=50, n=70, A=1e-2, initial_beta=0.5)
    random_updates(buf, 5, batch=20)
    buf.save(tmp_path / "good")
    tree = load_tree(tmp_path / "good")
    if field == "rho":
        tree["sampler"]["rho"][0] = value
    else:
        tree["sampler"][field] = value
    save_tree(tmp_path / "bad", tree, kind="replay_buffer")
    with pytest.raises(CheckpointError, match=match):
        ReplayBuffer.load(tmp_path / "bad")


def test_a_num_far_that_disagrees_with_the_far_rows_is_refused(tmp_path):
    from relive.replay.checkpoint import CheckpointError, load_tree, save_tree

    buf = buffer(capacity=50, n=70, A=1e-2, initial_beta=0.5)
    random_updates(buf, 25, batch=20)
    buf.save(tmp_path / "good")
    tree = load_tree(tmp_path / "good")
    tree["sampler"]["num_far"] = int(tree["sampler"]["far"].sum()) + 1
    save_tree(tmp_path / "bad", tree, kind="replay_buffer")
    with pytest.raises(CheckpointError, match="'num_far' is .* rows are marked far"):
        ReplayBuffer.load(tmp_path / "bad")
