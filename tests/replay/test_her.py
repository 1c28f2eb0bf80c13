"""Hindsight Experience Replay (issue 30, item 2): relive.replay.samplers.her.HindsightSampler.

Rows are written so that a goal tells where it came from: in episode ``uid`` the achieved goal at step s is
``[uid, s]`` (so the next achieved goal of step s is ``[uid, s + 1]``); a relabeled row's new goal therefore names its
goal row's episode and step."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from scipy import stats

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.samplers.her import HindsightSampler

OBS = {"observation": (3,), "achieved_goal": (2,), "desired_goal": (2,)}


def reward_fn(achieved, desired, info):
    """Gymnasium-Robotics' sparse reward: 0 at the goal, -1 elsewhere (vectorized)."""
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.5).astype(np.float32)


def success_fn(achieved, desired, info):
    return np.linalg.norm(achieved - desired, axis=-1) <= 0.5


def episodes(rng, uids, lengths, open_last=False, terminated=False) -> dict:
    obs_a, nxt_a, term, trunc = [], [], [], []
    for i, (uid, length) in enumerate(zip(uids, lengths, strict=True)):
        s = np.arange(length + 1, dtype=np.float32)
        a = np.stack([np.full(length + 1, uid, np.float32), s], axis=1)
        obs_a.append(a[:-1])
        nxt_a.append(a[1:])
        end = np.arange(length) == length - 1
        if open_last and i == len(uids) - 1:
            end[:] = False
        term.append(end if terminated else np.zeros(length, bool))
        trunc.append(np.zeros(length, bool) if terminated else end)
    oa, na = np.concatenate(obs_a), np.concatenate(nxt_a)
    n = oa.shape[0]
    desired = np.full((n, 2), -100.0, np.float32)  # never reached: every stored reward is -1
    ob = rng.normal(size=(n, 3)).astype(np.float32)
    nb = np.concatenate([ob[1:], rng.normal(size=(1, 3)).astype(np.float32)])
    return {"obs": {"observation": ob, "achieved_goal": oa, "desired_goal": desired},
            "next_obs": {"observation": nb, "achieved_goal": na, "desired_goal": desired},
            "action": rng.normal(size=(n, 1)).astype(np.float32), "reward": -np.ones(n, np.float32),
            "terminated": np.concatenate(term), "truncated": np.concatenate(trunc)}


def cut(rows, a, b):
    return {k: ({kk: vv[a:b] for kk, vv in v.items()} if isinstance(v, dict) else v[a:b]) for k, v in rows.items()}


def her_buffer(sampler, capacity=200, n_offline=0, streams=1, seed=0, n_step=1, rng_seed=1, ep_len=(3, 12),
               rows_per_stream=120):
    """A buffer with an offline prefix of ``n_offline`` rows, ``streams`` online streams written in interleaved
    chunks (the ring wraps when they exceed capacity), each stream's last episode left open."""
    rng = np.random.default_rng(rng_seed)
    buf = ReplayBuffer(capacity, OBS, (1,), sampler=sampler, seed=seed, n_step=n_step)
    if n_offline:
        lengths = []
        while sum(lengths) < n_offline:
            lengths.append(int(rng.integers(*ep_len)))
        lengths[-1] -= sum(lengths) - n_offline
        if lengths[-1] == 0:
            lengths.pop()
        buf.add_offline(episodes(rng, [1000 + i for i in range(len(lengths))], lengths))
    data = []
    for s in range(streams):
        lengths = []
        while sum(lengths) < rows_per_stream:
            lengths.append(int(rng.integers(*ep_len)))
        data.append(episodes(rng, [10000 * (s + 1) + i for i in range(len(lengths))], lengths, open_last=True))
    done = [0] * streams
    while any(d < data[s]["reward"].size for s, d in enumerate(done)):
        s = int(rng.integers(streams))
        n = data[s]["reward"].size
        if done[s] >= n:
            continue
        k = min(int(rng.integers(1, 15)), n - done[s])
        buf.extend(cut(data[s], done[s], done[s] + k), stream=s)
        done[s] += k
    return buf


def stored_goal_check(buf, batch, strategy):
    """Every relabeled row's goal comes from its own episode's stored rows (future: the row's step or later)."""
    st = buf.storage
    relabeled = batch.info.hints["her/relabeled"]
    goal_slot = batch.info.hints["her/goal_slot"]
    assert (goal_slot[~relabeled] == -1).all()
    assert np.array_equal(batch.obs["desired_goal"], batch.next_obs["desired_goal"])
    rows = batch.info.indices
    own = st.read("obs", rows)["achieved_goal"]
    goal = batch.obs["desired_goal"]
    assert (goal[~relabeled] == -100).all()
    for i in np.flatnonzero(relabeled):
        j = goal_slot[i]
        assert 0 <= j < st.size
        assert np.array_equal(goal[i], st.read("next_obs", [j])["achieved_goal"][0])
        if strategy == "random":
            continue
        assert st.meta["episode_id"][j] == st.meta["episode_id"][rows[i]]
        assert goal[i][0] == own[i][0]  # same episode uid
        if strategy == "future":
            assert goal[i][1] >= own[i][1] + 1  # goal row j >= t
        if strategy == "final":
            end = st.episodes.end_of(st.meta["episode_id"][[rows[i]]])[0]
            assert st.position_of([j])[0] == end - 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams=hst.integers(1, 3), n_offline=hst.sampled_from([0, 37]), capacity=hst.integers(60, 160),
       strategy=hst.sampled_from(["future", "final", "episode", "random"]), seed=hst.integers(0, 2**16),
       mixture=hst.booleans())
def test_relabeled_goals_come_from_the_same_episode(streams, n_offline, capacity, strategy, seed, mixture):
    inner = MixtureSampler(UniformSampler(), UniformSampler()) if mixture and n_offline else UniformSampler()
    sampler = HindsightSampler(inner, strategy, k=4, reward_fn=reward_fn)
    buf = her_buffer(sampler, capacity=capacity + n_offline, n_offline=n_offline, streams=streams, seed=seed,
                     rng_seed=seed)
    for _ in range(3):
        stored_goal_check(buf, buf.sample(48), strategy)


def test_open_episode_uses_only_its_stored_rows():
    buf = her_buffer(HindsightSampler(UniformSampler(), "final", k=1e9, reward_fn=reward_fn), capacity=500,
                     rows_per_stream=60)
    st = buf.storage
    open_id = st.episodes.open_online_ids()[0]
    newest = st.read("next_obs", [st.size - 1])["achieved_goal"][0]
    seen = 0
    for _ in range(5):
        batch = buf.sample(50)
        rows = np.flatnonzero(st.meta["episode_id"][batch.info.indices] == open_id)
        assert (batch.obs["desired_goal"][rows] == newest).all()
        seen += rows.size
    assert seen  # "final" of an open episode: its newest stored row


def test_rewards_equal_compute_reward_row_by_row():
    buf = her_buffer(HindsightSampler(UniformSampler(), "future", k=4, reward_fn=reward_fn,
                                      terminate_on_success=True, success_fn=success_fn), streams=2)
    batch = buf.sample(150)
    for i in range(150):
        a, d = batch.next_obs["achieved_goal"][i:i + 1], batch.obs["desired_goal"][i:i + 1]
        assert batch.reward[i] == reward_fn(a, d, {})[0]
        if batch.info.hints["her/relabeled"][i]:
            assert batch.terminated[i] == success_fn(a, d, {})[0]
    relabeled = batch.info.hints["her/relabeled"]
    assert (batch.reward[relabeled] == 0).any() and (batch.reward[~relabeled] == -1).all()


def test_relabeled_share_is_k_over_k_plus_one():
    for k in (1, 4):
        buf = her_buffer(HindsightSampler(UniformSampler(), "future", k=k, reward_fn=reward_fn))
        n = 0
        for _ in range(40):
            n += int(buf.sample(100).info.hints["her/relabeled"].sum())
        assert stats.binomtest(n, 4000, k / (k + 1)).pvalue > 1e-3
        # and it rejects a wrong share
        assert stats.binomtest(n, 4000, k / (k + 2)).pvalue < 1e-3


def test_per_relabeled_rows_keep_their_source_rows_priority_and_is_weight():
    """Same data and seed with and without HER: the first batch draws the same rows; relabeled rows carry the
    probability and IS weight PER gave their source rows, and an update reaches the stored rows' priorities."""
    her = her_buffer(HindsightSampler(PrioritizedSampler(), "future", k=4, reward_fn=reward_fn), seed=3)
    plain = her_buffer(PrioritizedSampler(), seed=3)
    td = np.random.default_rng(0).normal(size=len(her)) * 5
    for buf in (her, plain):  # non-uniform priorities first
        buf.update(buf.gather(np.arange(len(buf))).info, td_error=td)
    a, b = her.sample(64), plain.sample(64)
    relabeled = a.info.hints["her/relabeled"]
    assert 0 < relabeled.sum() < 64
    assert np.array_equal(a.info.indices, b.info.indices)
    assert np.array_equal(a.info.probability[relabeled], b.info.probability[relabeled])
    assert np.array_equal(a.info.is_weight[relabeled], b.info.is_weight[relabeled])
    assert np.allclose(a.info.probability, her.sampler.probabilities()[a.info.indices])
    new_td = np.linspace(0.1, 9, 64)
    her.update(a.info, td_error=new_td)
    plain.update(b.info, td_error=new_td)
    assert np.array_equal(her.sampler.inner.leaf_values(), plain.sampler.leaf_values())


def test_k0_batches_equal_the_inner_samplers():
    her = her_buffer(HindsightSampler(PrioritizedSampler(), "future", k=0, reward_fn=reward_fn), seed=5, streams=2)
    plain = her_buffer(PrioritizedSampler(), seed=5, streams=2)
    for _ in range(5):
        a, b = her.sample(32), plain.sample(32)
        for key in OBS:
            assert np.array_equal(a.obs[key], b.obs[key]) and np.array_equal(a.next_obs[key], b.next_obs[key])
        for f in ("action", "reward", "terminated", "truncated"):
            assert np.array_equal(getattr(a, f), getattr(b, f))
        assert np.array_equal(a.info.indices, b.info.indices) and np.array_equal(a.info.is_weight, b.info.is_weight)
        her.update(a.info, td_error=a.reward + 1.5)
        plain.update(b.info, td_error=b.reward + 1.5)


def test_checkpoint_resume_gives_the_same_next_batches(tmp_path):
    buf = her_buffer(HindsightSampler(MixtureSampler(UniformSampler(), PrioritizedSampler()), "future", k=4,
                                      reward_fn=reward_fn), n_offline=40, capacity=240, streams=2)
    buf.sample(32)
    buf.save(tmp_path / "ckpt")
    back = ReplayBuffer.load(tmp_path / "ckpt")
    assert isinstance(back.sampler, HindsightSampler) and back.sampler.strategy == "future"
    with pytest.raises(ValueError, match="no reward_fn"):
        back.sample(32)
    back = ReplayBuffer.load(tmp_path / "ckpt")
    back.sampler.set_reward_fn(reward_fn)
    for _ in range(3):
        a, b = buf.sample(32), back.sample(32)
        assert np.array_equal(a.info.indices, b.info.indices)
        assert np.array_equal(a.info.hints["her/goal_slot"], b.info.hints["her/goal_slot"])
        assert np.array_equal(a.obs["desired_goal"], b.obs["desired_goal"]) and np.array_equal(a.reward, b.reward)


def test_n_step_sums_relabeled_rewards_hand_made():
    """One episode of 5 rows, achieved goals [7, 1..5]; a row relabeled with the goal of row j = 3 (next achieved
    [7, 4]): 3-step return from row 1 = r(row1) + g r(row2) + g^2 r(row3) = -1 - g + 0 under the new goal."""
    rng = np.random.default_rng(0)
    gamma = 0.5
    for terminate in (False, True):
        sampler = HindsightSampler(UniformSampler(), "future", k=1e12, reward_fn=reward_fn,
                                   terminate_on_success=terminate, success_fn=success_fn)
        buf = ReplayBuffer(10, OBS, (1,), sampler=sampler, n_step=3, gamma=gamma)
        buf.extend(episodes(rng, [7], [5]))
        # force the plan: row 1 relabeled with goal row 2 (next achieved [7, 3]), row 0 with goal row 4 ([7, 5])
        sampler._choose_goals = lambda idx, rng: (np.ones(2, bool), np.array([2, 4]))  # noqa: B023
        sampler.inner._draw = lambda b, rng: __import__("relive.replay.samplers", fromlist=["Draw"]).Draw(  # noqa
            np.array([1, 0]), np.full(2, 0.2), np.ones(2, np.float32))
        b = buf.sample(2)
        assert np.array_equal(b.obs["desired_goal"], [[7, 3], [7, 5]])
        if not terminate:
            # row 1: rows 1, 2, 3 -> rewards under [7,3]: next achieved [7,2] -1, [7,3] 0, [7,4] -1
            assert b.reward[0] == pytest.approx(-1 + 0 - gamma**2)
            assert b.discount[0] == pytest.approx(gamma**3)
            # row 0: rows 0..2 under [7, 5]: all -1
            assert b.reward[1] == pytest.approx(-1 - gamma - gamma**2)
        else:
            # the relabeled episode ends at its success (row 2): two rows summed, no bootstrap
            assert b.reward[0] == pytest.approx(-1 + 0)
            assert b.discount[0] == 0 and b.terminated[0]
            assert np.array_equal(b.next_obs["achieved_goal"][0], [7, 3])
            assert b.reward[1] == pytest.approx(-1 - gamma - gamma**2) and b.discount[1] == pytest.approx(gamma**3)


def test_non_goal_observations_are_a_clear_error():
    with pytest.raises(ValueError, match="goal-conditioned dict observations"):
        ReplayBuffer(10, (4,), (1,), sampler=HindsightSampler(reward_fn=reward_fn))
    with pytest.raises(ValueError, match="goal-conditioned dict observations"):
        ReplayBuffer(10, {"observation": (3,), "achieved_goal": (2,)}, (1,), sampler=HindsightSampler())
    with pytest.raises(ValueError, match="same shape"):
        ReplayBuffer(10, {"achieved_goal": (2,), "desired_goal": (3,)}, (1,), sampler=HindsightSampler())
    with pytest.raises(ValueError, match="strategy"):
        HindsightSampler(strategy="later")


def test_reward_fn_of_the_wrong_shape_is_a_clear_error():
    buf = her_buffer(HindsightSampler(UniformSampler(), k=1e9,
                                      reward_fn=lambda a, d, info: np.zeros((a.shape[0], 1))))
    with pytest.raises(ValueError, match="vectorized"):
        buf.sample(16)
    buf = her_buffer(HindsightSampler(UniformSampler(), k=1e9, reward_fn=lambda a, d, info: 0.0))
    with pytest.raises(ValueError, match="one number per row"):
        buf.sample(16)


def test_sequences_are_refused():
    buf = her_buffer(HindsightSampler(UniformSampler(), reward_fn=reward_fn))
    with pytest.raises(ValueError, match="sample_sequences does not relabel"):
        buf.sample_sequences(4, 3)


def test_make_env_keeps_goal_dicts_on_request():
    pytest.importorskip("gymnasium_robotics")
    from relive.envs import env_spec, make_env

    env = make_env("PointMaze_UMaze-v3", keep_goal_dict=True)
    spec = env_spec(env)
    assert set(spec.obs_shape) == {"observation", "achieved_goal", "desired_goal"}
    buf = ReplayBuffer(100, spec.obs_shape, spec.action_shape,
                       sampler=HindsightSampler(reward_fn=env.unwrapped.compute_reward))
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        a = env.action_space.sample()
        nxt, r, term, trunc, _ = env.step(a)
        buf.extend({"obs": {k: v[None] for k, v in obs.items()}, "action": a[None], "reward": np.float32([r]),
                    "next_obs": {k: v[None] for k, v in nxt.items()}, "terminated": np.array([term]),
                    "truncated": np.array([trunc])})
        obs = nxt
    b = buf.sample(16)
    assert b.reward.shape == (16,)
    assert make_env("PointMaze_UMaze-v3").observation_space.shape is not None  # default: flattened, as before
    with pytest.raises(ValueError, match="not a goal-conditioned task"):
        make_env("Pendulum-v1", keep_goal_dict=True)
