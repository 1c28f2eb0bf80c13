"""relive's buffer with SB3's VecFrameStack (real SB3, no mocks): each frame stored once, and the batches SB3's
algorithms receive hold exactly what SB3's own ReplayBuffer gives for the same steps."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack  # noqa: E402

from relive.integrations.sb3 import DQN, ReliveReplayBuffer, sb3_frame_stack  # noqa: E402
from relive.replay.storage import FrameStack  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # (tests/conftest.py)


class FrameEnv(gym.Env):
    """Random uint8 frames, episodes of 1..9 steps ending in a termination or a time limit (TimeLimit's truncation,
    which SB3's DummyVecEnv reports as ``TimeLimit.truncated``); the reward is a unique id of the step."""

    def __init__(self, env_id: int, shape=(5, 6, 1), dict_obs: bool = False):
        self.env_id, self.dict_obs = env_id, dict_obs
        image = gym.spaces.Box(0, 255, shape, np.uint8)
        self.observation_space = (gym.spaces.Dict({"image": image, "state": gym.spaces.Box(-1, 1, (3,), np.float32)})
                                  if dict_obs else image)
        self.action_space = gym.spaces.Discrete(2)
        self.rng = np.random.default_rng(100 + env_id)
        self.count = 0

    def _obs(self):
        image = self.rng.integers(0, 256, self.observation_space["image"].shape if self.dict_obs
                                  else self.observation_space.shape, dtype=np.uint8)
        if self.dict_obs:
            return {"image": image, "state": self.rng.uniform(-1, 1, 3).astype(np.float32)}
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.rng.integers(1, 10))
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        self.left -= 1
        terminated = self.left == 0 and bool(self.rng.integers(2))
        return self._obs(), float(self.env_id * 100_000 + self.count), terminated, False, {}


def _venv(n_envs: int, n_stack: int, **kw):
    def make(i):
        return lambda: gym.wrappers.TimeLimit(FrameEnv(i, **kw), max_episode_steps=7)

    return VecFrameStack(DummyVecEnv([make(i) for i in range(n_envs)]), n_stack)


def _drive(venv, buffers, steps: int, seed: int = 0) -> None:
    """SB3's OffPolicyAlgorithm._store_transition, step by step: next_obs is the stacked terminal observation where an
    env is done (VecFrameStack puts it in the infos)."""
    rng = np.random.default_rng(seed)
    obs = venv.reset()
    n = venv.num_envs
    for _ in range(steps):
        action = rng.integers(0, 2, n)
        new_obs, reward, done, infos = venv.step(action)
        next_obs = {k: v.copy() for k, v in new_obs.items()} if isinstance(new_obs, dict) else new_obs.copy()
        for i in np.flatnonzero(done):
            terminal = infos[i]["terminal_observation"]
            if isinstance(next_obs, dict):
                for k in next_obs:
                    next_obs[k][i] = terminal[k]
            else:
                next_obs[i] = terminal
        for buf in buffers:
            buf.add(obs, next_obs, action.reshape(n, 1), reward, done, infos)
        obs = new_obs


def _same_rows_as_sb3(ours: ReliveReplayBuffer, theirs, batch_size: int, seed: int) -> int:
    """SB3's own sample (its np.random draws, replayed to learn which rows) against relive's batch of the same rows."""
    # SB3's ReplayBuffer draws from NumPy's global generator: seeded, its draws replayed, its state restored after
    saved = np.random.get_state()  # noqa: NPY002
    np.random.seed(seed)  # noqa: NPY002
    upper = theirs.buffer_size if theirs.full else theirs.pos
    pos = np.random.randint(0, upper, size=batch_size)  # noqa: NPY002
    env = np.random.randint(0, theirs.n_envs, size=batch_size)  # noqa: NPY002
    np.random.seed(seed)  # noqa: NPY002
    want = theirs.sample(batch_size)
    np.random.set_state(saved)  # noqa: NPY002
    ids = theirs.rewards[pos, env]
    st = ours.relive.storage
    stored = st.read("reward", np.arange(st.num_rows))
    where = {float(r): i for i, r in enumerate(stored)}
    assert all(float(r) in where for r in ids)  # (relive's ring is larger here: it holds every row SB3 holds)
    got = ours.to_samples(ours.relive.gather(np.array([where[float(r)] for r in ids])))
    for name in ("observations", "next_observations", "actions", "rewards", "dones"):
        a, b = getattr(got, name), getattr(want, name)
        for key in (a if isinstance(a, dict) else [None]):
            x, y = (a, b) if key is None else (a[key], b[key])
            assert x.dtype == y.dtype and x.shape == y.shape, (name, key)
            assert torch.equal(x, y), (name, key)
    return int((want.dones == 0).sum())


@pytest.mark.parametrize("channels", ["last", "first"])
def test_batches_equal_sb3_replay_buffer_across_episodes_and_ring_wrap(channels):
    shape = (5, 6, 1) if channels == "last" else (1, 5, 6)
    venv = _venv(2, 4, shape=shape)
    space, n = venv.observation_space, venv.num_envs
    assert sb3_frame_stack(space, 4) == FrameStack.sb3(4, channels)  # (found from the space, as VecFrameStack does)
    theirs = ReplayBuffer(60, space, venv.action_space, device="cpu", n_envs=n)
    # relive's ring holds one staging block more than SB3's (commits are per block of steps), and still wraps
    ours = ReliveReplayBuffer(60 + 64, space, venv.action_space, device="cpu", n_envs=n, frame_stack=4)
    _drive(venv, [theirs, ours], steps=400)
    st = ours.relive.storage
    assert st.num_online_written > st.online_capacity  # the ring wrapped (kept frames below the eviction bound)
    assert st.specs["obs"].shape == shape  # one frame a row (the env's, before VecFrameStack)
    assert st.bytes_per_row() < 0.4 * 2 * space.shape[0] * space.shape[1] * space.shape[2]
    for seed in range(5):
        _same_rows_as_sb3(ours, theirs, 64, seed)


def test_dict_observations_every_key_stacked_as_vecframestack():
    venv = _venv(2, 3, dict_obs=True)
    space, n = venv.observation_space, venv.num_envs
    theirs = DictReplayBuffer(40, space, venv.action_space, device="cpu", n_envs=n)
    ours = ReliveReplayBuffer(40 + 64, space, venv.action_space, device="cpu", n_envs=n, frame_stack=3)
    assert ours.relive.storage.specs["obs.image"].shape == (5, 6, 1)
    assert ours.relive.storage.specs["obs.state"].shape == (3,)
    _drive(venv, [theirs, ours], steps=150)
    for seed in range(3):
        _same_rows_as_sb3(ours, theirs, 32, seed)


def test_a_stack_that_does_not_follow_its_episode_is_refused():
    venv = _venv(1, 4)
    ours = ReliveReplayBuffer(100, venv.observation_space, venv.action_space, device="cpu", frame_stack=4)
    obs = venv.reset()
    new_obs, reward, done, infos = venv.step(np.array([0]))
    ours.add(obs, new_obs, np.zeros((1, 1)), reward, done, infos)
    wrong = new_obs.copy()
    wrong[..., 0] = 7  # (the oldest frame is not the previous step's)
    ours.add(wrong, wrong, np.zeros((1, 1)), reward, np.array([False]), infos)
    with pytest.raises(ValueError, match="does not follow its episode"):
        ours.sample(1)


def test_options_are_checked():
    box = gym.spaces.Box(0, 1, (8,), np.float32)
    assert sb3_frame_stack(box, 4) == FrameStack(4, -1, "zero")  # (a vector: the last axis, as VecFrameStack)
    assert sb3_frame_stack(box, FrameStack(2, 0, "reset")) == FrameStack(2, 0, "reset")
    with pytest.raises(ValueError, match="Box"):
        sb3_frame_stack(gym.spaces.Discrete(3), 4)
    with pytest.raises(ValueError, match="unknown observation key"):
        sb3_frame_stack(gym.spaces.Dict({"a": box}), {"b": 2})
    with pytest.raises(ValueError, match="channels_order"):
        sb3_frame_stack(box, 4, channels_order="middle")
    with pytest.raises(ValueError, match="number of stacked frames"):
        sb3_frame_stack(box, "4")
    with pytest.raises(ValueError, match="frame_stack=n_stack"):
        ReliveReplayBuffer(10, box, gym.spaces.Discrete(2), optimize_memory_usage=True)


def test_dqn_learns_on_a_frame_stacked_env_with_frames_stored_once(tmp_path):
    """A tiny DQN run on CartPole under VecFrameStack(4): SB3's loop adds stacks, relive stores one frame a row,
    checkpoint and reload keep the stacks."""
    from stable_baselines3.common.env_util import make_vec_env

    venv = VecFrameStack(make_vec_env("CartPole-v1", n_envs=2, seed=0), 4)
    model = DQN("MlpPolicy", venv, seed=0, replay_buffer_kwargs=dict(frame_stack=4), learning_starts=100,
                train_freq=4, gradient_steps=1, buffer_size=500, batch_size=32, verbose=0)
    model.learn(600)
    buf = model.replay_buffer
    assert isinstance(buf, ReliveReplayBuffer)
    assert buf.relive.storage.specs["obs"].shape == (4,)
    before = buf.relive.gather(np.arange(buf.size()))
    model.save_replay_buffer(tmp_path / "rb")
    model.load_replay_buffer(tmp_path / "rb")
    after = model.replay_buffer.relive.gather(np.arange(model.replay_buffer.size()))
    assert np.array_equal(before.obs, after.obs) and np.array_equal(before.next_obs, after.next_obs)
    assert before.obs.shape == (buf.size(), 16)


def test_dqn_on_a_channels_last_image_stack_that_sb3_transposes():
    """SB3 wraps a channels-last image env in VecTransposeImage: the buffer sees (4, H, W) stacks, finds the axis
    (channels first) from the space, and stores (1, H, W) frames; SB3's own loop adds every step."""
    venv = _venv(2, 4)  # (5, 6, 1) frames -> VecFrameStack (5, 6, 4) -> VecTransposeImage (4, 5, 6)
    model = DQN("MlpPolicy", venv, seed=0, replay_buffer_kwargs=dict(frame_stack=4), learning_starts=50,
                train_freq=4, gradient_steps=1, buffer_size=300, batch_size=16, policy_kwargs=dict(net_arch=[16]))
    model.learn(400)
    st = model.replay_buffer.relive.storage
    assert st.obs_spec.shape == (4, 5, 6) and st.specs["obs"].shape == (1, 5, 6)
    assert st.num_online_written == 400 and st.num_online == 300  # (the ring wrapped)
    b = model.replay_buffer.sample(8)
    assert b.observations.shape == (8, 4, 5, 6) and b.observations.dtype == torch.uint8


def test_offline_rows_of_single_frames_get_vecframestack_stacks():
    """A dataset stores a frame a step: with frame_stack its rows are stacked as VecFrameStack stacks (zeros before an
    episode's first step) and stored a frame a row; batches of offline rows hold those stacks."""
    from tests.data.test_frame_stack_datasets import naive_stacks

    rng = np.random.default_rng(0)
    n = 23
    frames = rng.integers(0, 256, (n + 1, 5, 6, 1), dtype=np.uint8)
    ends = np.zeros(n, bool)
    ends[[2, 9, 10, 22]] = True
    nxt = frames[1:].copy()
    rows = {"obs": frames[:-1], "next_obs": nxt, "action": rng.integers(0, 2, n), "reward": np.zeros(n, np.float32),
            "terminated": ends & (np.arange(n) % 2 == 0), "truncated": ends & (np.arange(n) % 2 == 1)}
    for i in np.flatnonzero(ends[:-1]):  # a new episode starts from a fresh frame
        rows["obs"][i + 1] = rng.integers(0, 256, (5, 6, 1), dtype=np.uint8)
    space = gym.spaces.Box(0, 255, (5, 6, 4), np.uint8)
    buf = ReliveReplayBuffer(50, space, gym.spaces.Discrete(2), device="cpu", frame_stack=4, offline=rows)
    st = buf.relive.storage
    assert st.num_offline == n and st.specs["obs"].shape == (5, 6, 1)
    want_obs, want_next = naive_stacks(rows["obs"], rows["next_obs"], ends, FrameStack.sb3(4))
    got = buf.relive.gather(np.arange(n))
    np.testing.assert_array_equal(got.obs, want_obs)
    np.testing.assert_array_equal(got.next_obs, want_next)
