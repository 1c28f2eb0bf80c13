"""relive's buffer behind TorchRL's interface with TorchRL's ``CatFrames`` (real torchrl, no mocks): each frame stored
once, and samples holding exactly what TorchRL's own replay buffer holds for the same transitions."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer  # noqa: E402
from torchrl.envs import CatFrames, GymEnv, GymWrapper, SerialEnv, TransformedEnv  # noqa: E402

from relive.integrations.torchrl import ReliveTensorDictReplayBuffer, catframes_frame_stack  # noqa: E402
from relive.replay.storage import FrameStack  # noqa: E402

pytestmark = pytest.mark.usefixtures("torchrl_quiet")  # (tests/integrations/conftest.py)


class FrameEnv(gym.Env):
    """Random uint8 frames (channels first), episodes of 1..9 steps ending in a termination or a truncation; the
    reward is a unique id of the step."""

    def __init__(self, env_id: int = 0):
        self.env_id = env_id
        self.observation_space = gym.spaces.Box(0, 255, (1, 5, 6), np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.rng = np.random.default_rng(100 + env_id)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.rng.integers(1, 10))
        return self.rng.integers(0, 256, (1, 5, 6), dtype=np.uint8), {}

    def step(self, action):
        self.count += 1
        self.left -= 1
        end = self.left == 0
        terminated = end and bool(self.rng.integers(2))
        obs = self.rng.integers(0, 256, (1, 5, 6), dtype=np.uint8)
        return obs, float(self.env_id * 100_000 + self.count), terminated, end and not terminated, {}


def _env(n_envs: int, padding: str):
    cat = CatFrames(N=4, dim=-3, in_keys=["observation"], padding=padding)
    if n_envs == 1:
        return TransformedEnv(GymWrapper(FrameEnv(0)), cat), cat
    makers = [lambda i=i: GymWrapper(FrameEnv(i)) for i in range(n_envs)]
    return TransformedEnv(SerialEnv(n_envs, makers), cat), cat


def _assert_same_rows(ours: ReliveTensorDictReplayBuffer, theirs: TensorDictReplayBuffer, n: int) -> None:
    """Every row TorchRL's buffer holds, found in relive's by its reward id, equal key by key."""
    want = theirs.storage.get(torch.arange(len(theirs)))
    st = ours.relive.storage
    where = {float(r): i for i, r in enumerate(st.read("reward", np.arange(st.num_rows)))}
    ids = want["next", "reward"].reshape(-1).tolist()
    assert all(r in where for r in ids) and len(ids) == n
    got = ours.to_tensordict(ours.relive.gather(np.array([where[r] for r in ids])))
    for key in ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"),
                ("next", "truncated"), ("next", "done")):
        a, b = got[key], want[key]
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key


@pytest.mark.parametrize("padding", ["same", "constant"])
@pytest.mark.parametrize("n_envs", [1, 2])
def test_samples_equal_torchrl_storage_across_episodes_and_ring_wrap(padding, n_envs):
    env, cat = _env(n_envs, padding)
    fs = catframes_frame_stack(cat)
    assert fs == FrameStack(4, -3, "reset" if padding == "same" else "zero")
    capacity = 150
    ours = ReliveTensorDictReplayBuffer(capacity, frame_stack=cat, batch_size=32)
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    data = env.rollout(240 // n_envs, break_when_any_done=False)  # [T] (one stream) or [E, T] (a stream each)
    for part in data.split(40 // n_envs, dim=-1):  # extended in pieces, as a collector's batches come
        ours.extend(part)
        theirs.extend(part.reshape(-1))
    st = ours.relive.storage
    assert st.num_online_written > st.online_capacity  # the ring wrapped
    assert st.specs["obs"].shape == (1, 5, 6)  # a frame a row
    _assert_same_rows(ours, theirs, capacity)
    sample = ours.sample()
    assert sample["observation"].shape == (32, 4, 5, 6) and sample["observation"].dtype == torch.uint8


def test_a_stack_that_does_not_follow_its_episode_is_refused():
    env, cat = _env(1, "same")
    data = env.rollout(20, break_when_any_done=False)
    ours = ReliveTensorDictReplayBuffer(100, frame_stack=cat)
    shuffled = data[torch.randperm(20, generator=torch.Generator().manual_seed(0))]
    with pytest.raises(ValueError, match="does not follow its episode"):
        ours.extend(shuffled)


def test_options_are_checked():
    with pytest.raises(ValueError, match="not the observation key"):
        catframes_frame_stack(CatFrames(N=4, dim=-3, in_keys=["pixels"]))
    with pytest.raises(ValueError, match="pads with"):
        catframes_frame_stack(CatFrames(N=4, dim=-3, in_keys=["observation"], padding="constant", padding_value=1))
    with pytest.raises(ValueError, match="CatFrames"):
        ReliveTensorDictReplayBuffer(10, frame_stack="4")
    assert ReliveTensorDictReplayBuffer(10, frame_stack=3).frame_stack == FrameStack(3)


def test_dqn_with_catframes_runs_and_the_state_reloads():
    """TorchRL's collector and DQNLoss on CartPole under CatFrames(4): relive stores a frame a row; the state dict
    (tensors only) reloads to the same stacks and the same next batch."""
    from tensordict.nn import TensorDictSequential
    from torchrl.collectors import Collector
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss

    cat = CatFrames(N=4, dim=-1, in_keys=["observation"])
    env = TransformedEnv(GymEnv("CartPole-v1"), cat)
    env.set_seed(0)
    actor = QValueActor(MLP(in_features=16, out_features=2, num_cells=[32]), in_keys=["observation"],
                        spec=env.action_spec)
    explore = TensorDictSequential(actor, EGreedyModule(env.action_spec, annealing_num_steps=200, eps_end=0.05))
    collector = Collector(env, explore, frames_per_batch=100, total_frames=300)
    loss_fn = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    optim = torch.optim.Adam(loss_fn.parameters(), lr=1e-3)
    rb = ReliveTensorDictReplayBuffer(1_000, frame_stack=cat, batch_size=32, seed=0)
    for data in collector:
        rb.extend(data.reshape(-1))
        for _ in range(4):
            loss = loss_fn(rb.sample())["loss"]
            optim.zero_grad()
            loss.backward()
            optim.step()
            assert torch.isfinite(loss)
    collector.shutdown()
    assert rb.relive.storage.specs["obs"].shape == (4,) and len(rb) == 300
    restored = ReliveTensorDictReplayBuffer(1_000, batch_size=32)
    restored.load_state_dict(rb.state_dict())
    assert restored.frame_stack == FrameStack(4, -1, "reset")
    a, b = restored.sample(), rb.sample()
    assert torch.equal(a["index"], b["index"]) and torch.equal(a["observation"], b["observation"])
    assert torch.equal(a["next", "observation"], b["next", "observation"])
