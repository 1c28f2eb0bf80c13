"""relive's buffer under real Stable-Baselines3 algorithms (no mocks): learning, offline mixing, IS weights in the
loss, TD errors back to the sampler, pickle-free buffer checkpoints."""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.logger import configure  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from relive.integrations.sb3 import DDPG, DQN, SAC, TD3, ReliveReplayBuffer  # noqa: E402
from relive.replay import ARBSampler, PrioritizedSampler, ReplayBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


def _record_samples(model):
    """Keep every batch SB3's train() draws (the buffer's own sample, wrapped on this instance)."""
    seen = []
    sample = model.replay_buffer.sample

    def recording(*args, **kwargs):
        out = sample(*args, **kwargs)
        seen.append(out)
        return out

    model.replay_buffer.sample = recording
    return seen


def _random_rows(env_id: str, n: int, seed: int = 0) -> dict:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    cols = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    obs, _ = env.reset(seed=seed)
    for _ in range(n):
        a = env.action_space.sample()
        nxt, r, term, trunc, _ = env.step(a)
        for k, v in zip(cols, (obs, a, r, nxt, term, trunc), strict=True):
            cols[k].append(v)
        obs = env.reset()[0] if term or trunc else nxt
    return {k: np.asarray(v) for k, v in cols.items()}


def test_dqn_with_per_learns_cartpole():
    """Seeded, 3,000 steps: a uniform-random policy returns ~22 on CartPole (a 10-episode mean far below 100)."""
    env = gym.make("CartPole-v1")
    model = DQN("MlpPolicy", env, seed=0, replay_buffer_class=ReliveReplayBuffer,
                replay_buffer_kwargs=dict(sampler=PrioritizedSampler(priority_exponent=0.6, is_exponent=0.4)),
                learning_starts=300, train_freq=2, gradient_steps=1, target_update_interval=200,
                exploration_fraction=0.3, exploration_final_eps=0.04, learning_rate=2.3e-3, batch_size=64,
                buffer_size=50_000, policy_kwargs=dict(net_arch=[64, 64]))
    model.learn(3_000)
    mean_return, _ = evaluate_policy(model, gym.make("CartPole-v1"), n_eval_episodes=10, deterministic=True,
                                     warn=False)
    assert mean_return >= 100, mean_return
    buf = model.replay_buffer.relive
    assert buf.num_updated >= 64 * 1000  # TD errors reached the sampler on every gradient step
    p = buf.sampler.probabilities()[: len(buf)]
    assert p.max() > 3 * p.min()  # priorities moved away from the insertion maximum


def test_sac_offline_rows_symmetric_share_is_exact():
    rows = _random_rows("Pendulum-v1", 300)
    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, seed=0, buffer_size=200, learning_starts=100, batch_size=64,
                policy_kwargs=dict(net_arch=[32, 32]),
                replay_buffer_kwargs=dict(sampler=PrioritizedSampler(), offline=rows, offline_fraction=0.5))
    seen = _record_samples(model)
    model.learn(400)  # 400 online steps into a ring of 200: the ring wraps, the offline prefix stays
    assert len(seen) == 300
    for batch in seen:
        assert int((batch.info.source == 0).sum()) == 32  # exactly round(64 * 0.5) offline rows, every batch
    buf = model.replay_buffer.relive
    assert (buf.num_offline, buf.num_online) == (300, 200)
    st = buf.storage
    np.testing.assert_allclose(st.columns["obs"][:300], rows["obs"])
    # SB3 stores Box actions rescaled to [-1, 1]: Pendulum's [-2, 2] offline actions are halved on the way in
    np.testing.assert_allclose(st.columns["action"][:300], rows["action"] / 2.0, atol=1e-6)
    assert buf.num_updated > 0


def test_a_checkpoint_naming_another_dataset_does_not_make_load_replay_buffer_open_it(tmp_path):
    """A checkpoint edited to name a dataset the caller never gave (issue 44): nothing is opened, the load is refused
    naming the id (before, ``load_replay_buffer`` read whatever id the checkpoint named)."""
    from relive.data.npz_io import save_dataset

    path = save_dataset(tmp_path / "pendulum.npz", _random_rows("Pendulum-v1", 40))
    kw = dict(seed=0, buffer_size=60, learning_starts=30, batch_size=8, policy_kwargs=dict(net_arch=[8]))
    model = SAC("MlpPolicy", gym.make("Pendulum-v1"), replay_buffer_kwargs=dict(offline=str(path)), **kw)
    model.learn(40)
    model.save_replay_buffer(tmp_path / "buf")
    other = save_dataset(tmp_path / "other.npz", _random_rows("Pendulum-v1", 40, seed=1))
    opened = []
    import relive.data.loaders as loaders

    real = loaders.load_rows
    loaders.load_rows = lambda p, *a, **k: opened.append(str(p)) or real(p, *a, **k)
    try:
        from tests.replay.ckpt_edit import edit_state

        edit_state(tmp_path / "buf", lambda t: t["storage"]["offline_ref"].__setitem__("dataset_id", str(other)))
        fresh = SAC("MlpPolicy", gym.make("Pendulum-v1"), replay_buffer_kwargs=dict(offline=str(path)), **kw)
        opened.clear()
        with pytest.raises(ValueError, match=f"refers to offline dataset '{other}'"):
            fresh.load_replay_buffer(tmp_path / "buf")
        assert opened == [], opened
    finally:
        loaders.load_rows = real


def test_offline_dataset_by_path_and_a_checkpoint_that_refers_to_it(tmp_path):
    """``offline=path``: relive reads the dataset; the checkpoint refers to it by path + SHA-256 (no copy), and
    load_replay_buffer takes the rows from its caller -- the model's own buffer built from that dataset, or
    ``offline_rows`` -- never from the id the checkpoint names (Box actions rescaled as when it was added)."""
    from relive.data.npz_io import save_dataset

    path = save_dataset(tmp_path / "pendulum.npz", _random_rows("Pendulum-v1", 120))
    kw = dict(seed=0, buffer_size=100, learning_starts=60, batch_size=16, policy_kwargs=dict(net_arch=[16]))
    model = SAC("MlpPolicy", gym.make("Pendulum-v1"), replay_buffer_kwargs=dict(offline=str(path)), **kw)
    model.learn(80)
    model.save_replay_buffer(tmp_path / "buf")
    with pytest.raises(ValueError, match="refers to offline dataset"):  # the rows are not copied into it
        ReplayBuffer.load(tmp_path / "buf")
    # the checkpoint does not choose what is read (issue 44): a model not built from that dataset is refused, naming it
    bare = SAC("MlpPolicy", gym.make("Pendulum-v1"), **kw)
    with pytest.raises(ValueError, match=f"refers to offline dataset '{path}', which this model's buffer was not"):
        bare.load_replay_buffer(tmp_path / "buf")
    bare.load_replay_buffer(tmp_path / "buf", offline_rows=str(path))  # the caller names it: read and prepared
    assert bare.replay_buffer.relive.num_offline == 120
    again = SAC("MlpPolicy", gym.make("Pendulum-v1"), replay_buffer_kwargs=dict(offline=str(path)), **kw)
    again.load_replay_buffer(tmp_path / "buf")  # the model's own offline rows, from the same dataset id
    assert again.replay_buffer.relive.num_offline == 120
    np.testing.assert_array_equal(again.replay_buffer.relive.storage.columns["action"][:120],
                                  model.replay_buffer.relive.storage.columns["action"][:120])
    np.testing.assert_array_equal(again.replay_buffer.sample(16).info.indices,
                                  model.replay_buffer.sample(16).info.indices)


@pytest.mark.parametrize("algo", [TD3, DDPG])
def test_td3_and_ddpg_feed_td_errors_back(algo):
    model = algo("MlpPolicy", gym.make("Pendulum-v1"), seed=0, buffer_size=1_000, learning_starts=50, batch_size=32,
                 policy_kwargs=dict(net_arch=[32, 32]), replay_buffer_kwargs=dict(sampler=PrioritizedSampler()))
    model.learn(150)
    buf = model.replay_buffer.relive
    assert buf.num_updated == 32 * 100
    assert len(np.unique(buf.sampler.probabilities()[:150])) > 10


def test_arb_rescores_rows_with_the_sac_actor():
    """ARB's loop hook (relive.hooks.EveryGradSteps) is served by the subclass: 100 gradient steps, every 20 a
    re-score of every stored row with SAC's actor, and the weights are no longer uniform."""
    model = SAC("MlpPolicy", gym.make("Pendulum-v1"), seed=0, buffer_size=1_000, learning_starts=50, batch_size=32,
                policy_kwargs=dict(net_arch=[32, 32]),
                replay_buffer_kwargs=dict(sampler=ARBSampler(refresh_every_grad_steps=20, level="transition",
                                                                temperature=0.5)))
    model.learn(150)
    sampler = model.replay_buffer.relive.sampler
    assert sampler.num_refreshes == 5
    p = sampler.probabilities()[:150]
    assert p.max() > 1.5 * p.min()
    dqn = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=10, batch_size=8,
              replay_buffer_kwargs=dict(sampler=ARBSampler()))
    with pytest.raises(ValueError, match="use relive.integrations.sb3.SAC"):
        dqn.learn(20)


def test_is_weights_enter_the_dqn_loss():
    """Two rows with priorities 1 and 3 (alpha = beta = 1): P = (1/4, 3/4), the IS weight of a row is
    min_batch P / P_i; SB3's logged loss equals mean_i w_i huber(Q_i - y_i), not the unweighted mean."""
    env = gym.make("CartPole-v1")
    model = DQN("MlpPolicy", env, seed=3, learning_starts=0, batch_size=4, policy_kwargs=dict(net_arch=[8]),
                replay_buffer_class=ReliveReplayBuffer,
                replay_buffer_kwargs=dict(sampler=PrioritizedSampler(priority_exponent=1.0, is_exponent=1.0)))
    model.set_logger(configure(None, []))
    rb = model.replay_buffer
    obs = np.array([[0.1, 0.2, -0.1, 0.3], [-0.2, 0.0, 0.05, -0.4]], np.float32)
    for i in range(2):
        rb.add(obs[i:i + 1], obs[i:i + 1] * 0.5, np.array([i]), np.array([1.0 + i]), np.array([i == 1]), [{}])
    rb.relive.update(rb.relive.gather([0, 1]).info, priority=np.array([1.0, 3.0]))
    q_net, q_target = copy.deepcopy(model.q_net), copy.deepcopy(model.q_net_target)
    seen = _record_samples(model)
    model.train(gradient_steps=1, batch_size=4)
    data = seen[0]
    idx = data.info.indices
    assert set(idx.tolist()) == {0, 1}, "precondition: the seeded batch holds both rows"
    prob = np.where(idx == 0, 0.25, 0.75)
    w = torch.as_tensor(prob.min() / prob, dtype=torch.float32)
    with torch.no_grad():
        q = q_net(data.observations).gather(1, data.actions.long()).squeeze(1)
        next_q = q_target(data.next_observations).max(1)[0]
        y = data.rewards.squeeze(1) + (1 - data.dones.squeeze(1)) * model.gamma * next_q
        per_row = F.smooth_l1_loss(q, y, reduction="none")
    logged = model.logger.name_to_value["train/loss"]
    assert logged == pytest.approx(float((w * per_row).mean()), rel=1e-5)
    assert logged != pytest.approx(float(per_row.mean()), rel=1e-3)
    # and |TD error| went back: the priorities of the two rows are now |Q - y| + eps (alpha = 1)
    td = {int(i): abs(float(q[k] - y[k])) for k, i in enumerate(idx)}
    p = rb.relive.sampler.probabilities()[:2]
    assert p[0] / p[1] == pytest.approx((td[0] + 1e-6) / (td[1] + 1e-6), rel=1e-3)


def test_saved_buffer_reloads_to_the_same_next_batches(tmp_path):
    kw = dict(seed=0, learning_starts=100, buffer_size=400, batch_size=32, policy_kwargs=dict(net_arch=[16]))
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), replay_buffer_kwargs=dict(sampler=PrioritizedSampler()), **kw)
    model.learn(300)
    model.save_replay_buffer(tmp_path / "buffer")
    assert not [p for p in (tmp_path / "buffer").rglob("*") if p.suffix in (".pkl", ".pickle")]
    with pytest.raises(TypeError, match="not pickled"):
        pickle.dumps(model.replay_buffer)
    again = DQN("MlpPolicy", gym.make("CartPole-v1"), **kw)
    again.load_replay_buffer(tmp_path / "buffer")
    assert isinstance(again.replay_buffer, ReliveReplayBuffer)
    assert type(again.replay_buffer.relive.sampler).__name__ == "PrioritizedSampler"
    for _ in range(3):
        a, b = model.replay_buffer.sample(32), again.replay_buffer.sample(32)
        np.testing.assert_array_equal(a.info.indices, b.info.indices)
        for name in ("observations", "actions", "next_observations", "dones", "rewards", "is_weights"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name))
    model.save(tmp_path / "model.zip")  # the model's zip holds no buffer arguments (sampler, offline rows)
    loaded = DQN.load(tmp_path / "model.zip")
    assert "sampler" not in loaded.replay_buffer_kwargs


def test_vector_env_steps_go_to_one_stream_per_env():
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = DQN("MlpPolicy", env, seed=0, learning_starts=1_000, buffer_size=1_000)
    model.learn(200)
    buf = model.replay_buffer.relive
    st = buf.storage
    n = len(buf)
    assert n == 200 and model.replay_buffer.size() == 200
    for s in (0, 1):  # within a stream, each row's next_obs is the next row's obs unless the episode ended
        rows = np.flatnonzero(st.meta["stream"][:n] == s)
        assert rows.size == 100
        cont = ~(st.columns["terminated"][rows[:-1]] | st.columns["truncated"][rows[:-1]])
        np.testing.assert_array_equal(st.columns["next_obs"][rows[:-1]][cont], st.columns["obs"][rows[1:]][cont])


def test_n_step_returns_come_from_relive():
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=0, learning_starts=1_000, gamma=0.9,
                replay_buffer_kwargs=dict(n_steps=3))
    model.learn(100)
    data = model.replay_buffer.sample(64)
    d = np.round(data.discounts.squeeze(1).numpy().astype(np.float64), 6)
    # gamma^n' (1 - terminated) with n' <= 3 (shorter at an episode's end): the model's gamma, not SB3's default
    assert set(d.tolist()) <= {0.0, 0.9, 0.81, 0.729} and 0.729 in d
    one_step = model.replay_buffer.relive.storage.columns["reward"][data.info.indices]  # CartPole: all 1
    np.testing.assert_allclose(data.rewards.squeeze(1).numpy()[d == 0.729], 1 + 0.9 + 0.81 * one_step[d == 0.729])


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        DQN("MlpPolicy", gym.make("CartPole-v1"), optimize_memory_usage=True,
            replay_buffer_kwargs=dict(handle_timeout_termination=False))
    with pytest.raises(ValueError, match="missing column"):
        DQN("MlpPolicy", gym.make("CartPole-v1"), replay_buffer_kwargs=dict(offline={"obs": np.zeros((3, 4))}))
    env = gym.make("CartPole-v1")
    extra = ReplayBuffer(16, (4,), (1,), action_dtype=np.int64, extra_columns={"mc_return": ()})
    with pytest.raises(ValueError, match=r"extra columns \['mc_return'\], which SB3's add does not provide"):
        ReliveReplayBuffer.from_relive(extra, env.observation_space, env.action_space)


@pytest.mark.parametrize("handle_timeouts", [True, False])
def test_a_timeout_is_a_truncation_and_other_ends_terminate_as_sb3_counts_them(handle_timeouts):
    """Two envs, four steps: env 0 ends by a time limit at step 1, env 1 by termination at step 2. SB3's rule:
    with handle_timeout_termination a timeout is not a termination (stored truncated), without it it is."""
    space = gym.spaces.Box(-1, 1, (2,), np.float32)
    buf = ReliveReplayBuffer(100, space, space, device="cpu", n_envs=2, handle_timeout_termination=handle_timeouts)
    dones = [(False, False), (True, False), (False, True), (False, False)]
    for t, done in enumerate(dones):
        obs = np.full((2, 2), t, np.float32)
        infos = [{"TimeLimit.truncated": done[0]}, {}]
        buf.add(obs, obs + 0.5, np.zeros((2, 2), np.float32), np.zeros(2, np.float32), np.array(done), infos)
    st = buf.relive.storage
    rows = {s: np.flatnonzero(st.meta["stream"][: st.size] == s) for s in (0, 1)}
    term, trunc = st.columns["terminated"], st.columns["truncated"]
    assert term[rows[0]].tolist() == [False, not handle_timeouts, False, False]
    assert trunc[rows[0]].tolist() == [False, handle_timeouts, False, False]
    assert term[rows[1]].tolist() == [False, False, True, False]
    assert trunc[rows[1]].tolist() == [False, False, False, False]


def test_per_is_exponent_anneals_over_learn_unless_configured():
    """SB3's schedules run over learn(total_timesteps); so does an unconfigured IS exponent (beta 0.4 -> 1 at the
    last gradient step), while a configured is_anneal_samples is kept."""
    def run(sampler):
        model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=0, replay_buffer_class=ReliveReplayBuffer,
                    replay_buffer_kwargs=dict(sampler=sampler), learning_starts=100, train_freq=4, gradient_steps=2,
                    batch_size=16, buffer_size=1000, policy_kwargs=dict(net_arch=[8]))
        model.learn(500)
        return model.replay_buffer.relive.sampler

    s = run(PrioritizedSampler())
    assert s.num_samples == 2 * (500 - 100) // 4 == 200 and s.is_anneal_samples == 200
    assert s.beta == pytest.approx(1.0)
    kept = run(PrioritizedSampler(is_anneal_samples=10_000))
    assert kept.is_anneal_samples == 10_000 and kept.beta == pytest.approx(0.4 + 0.6 * 200 / 10_000)
