"""Frame stacks stored once (relive.replay.storage.frame_stack): every stacked obs / next_obs a buffer returns equals a
naive stack built from its episode's frames, over episode boundaries, ring wrap-around, several streams, the offline
prefix, n-step returns, sequences and checkpoints; stacks that do not follow their episode are refused; samplers see the
same distribution as over a buffer of full stacks."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relive.replay import MixtureSampler, PrioritizedSampler, ReaPERSampler, ReplayBuffer, UniformSampler
from relive.replay.storage.frame_stack import FrameStack

FRAME = (2, 3)  # a frame's (H, W) (channel axis added by the layout)


class Layout:
    """How an env presents a stack of k frames of shape FRAME: Gymnasium (k, H, W), SB3 channels-last (H, W, k) and
    channels-first (k * 1, H, W); ``sb3_rgb``: SB3's channels-last stack of an RGB camera, frames (H, W, 3) -> (H, W,
    3 k) (pieces of 3 bytes)."""

    def __init__(self, name: str, k: int, padding: str = "reset", frame: tuple = FRAME):
        self.name, self.k, self.padding = name, k, padding
        self.frame_shape = (*frame, 3) if name == "sb3_rgb" else FRAME
        if name == "sb3_rgb":
            self.fs, self.shape = FrameStack.sb3(k), (*frame, 3 * k)
        elif name == "gym":
            self.fs, self.shape = FrameStack(k, 0, padding), (k, *FRAME)
        elif name == "sb3_last":
            self.fs, self.shape = FrameStack.sb3(k), (*FRAME, k)
        else:
            self.fs, self.shape = FrameStack.sb3(k, "first"), (k, *FRAME)

    def stack(self, frames: np.ndarray, t: int) -> np.ndarray:
        """The env's stack at step t of an episode whose frames are ``frames`` [T + 1, H, W] (naive)."""
        pad = "zero" if self.name != "gym" else self.padding
        parts = [frames[j] if j >= 0 else (frames[0] if pad == "reset" else np.zeros_like(frames[0]))
                 for j in range(t - self.k + 1, t + 1)]
        if self.name == "sb3_rgb":
            return np.concatenate(parts, axis=-1)
        return np.stack(parts, axis=-1 if self.name == "sb3_last" else 0)


class World:
    """Streams of episodes with random frames; rows carry a ``row_id`` extra column keyed to the naive stacks."""

    def __init__(self, layout: Layout, seed: int, dict_obs: bool = False):
        self.layout, self.rng, self.dict_obs = layout, np.random.default_rng(seed), dict_obs
        self.ref_obs: list[np.ndarray] = []
        self.ref_next: list[np.ndarray] = []
        self.where: list[tuple[int, int]] = []  # row id -> (episode, step)
        self.episodes: list[dict] = []
        self.current: dict[int, int] = {}  # stream -> its open episode

    def rows(self, stream: int, n: int, end_p: float = 0.15) -> dict:
        obs, nxt, ids, term, trunc = [], [], [], [], []
        for _ in range(n):
            e = self.current.get(stream)
            if e is None:
                e = len(self.episodes)
                self.episodes.append({"frames": [self.new_frame()], "written": 0})
                self.current[stream] = e
            ep = self.episodes[e]
            t = ep["written"]
            ep["frames"].append(self.new_frame())
            frames = np.stack(ep["frames"])
            obs.append(self.layout.stack(frames, t))
            nxt.append(self.layout.stack(frames, t + 1))
            ep["written"] += 1
            ids.append(len(self.ref_obs))
            self.ref_obs.append(obs[-1])
            self.ref_next.append(nxt[-1])
            self.where.append((e, t))
            end = self.rng.random() < end_p
            is_term = end and self.rng.random() < 0.5
            term.append(is_term)
            trunc.append(end and not is_term)
            if end:
                del self.current[stream]
        o, x = np.stack(obs), np.stack(nxt)
        if self.dict_obs:
            state = self.rng.normal(size=(n, 2)).astype(np.float32)
            o, x = {"image": o, "state": state}, {"image": x, "state": state + 1}
        return {"obs": o, "action": self.rng.normal(size=(n, 1)).astype(np.float32),
                "reward": self.rng.normal(size=n).astype(np.float32), "next_obs": x,
                "terminated": np.array(term), "truncated": np.array(trunc), "row_id": np.array(ids, np.int64)}

    def new_frame(self) -> np.ndarray:
        return self.rng.integers(1, 255, self.layout.frame_shape, dtype=np.uint8)

    def buffer(self, capacity: int, **kwargs) -> ReplayBuffer:
        lay = self.layout
        obs = {"image": (lay.shape, np.uint8), "state": ((2,), np.float32)} if self.dict_obs else lay.shape
        fs = {"image": lay.fs} if self.dict_obs else lay.fs
        return ReplayBuffer(capacity, obs, (1,), obs_dtype=np.uint8, extra_columns={"row_id": ((), np.int64)},
                            frame_stack=fs, **kwargs)

    def check(self, buf: ReplayBuffer, slots=None) -> None:
        """Every stored row's obs / next_obs stacks equal the naive ones (and n-step next_obs the bootstrap row's)."""
        stor = buf.storage
        slots = np.flatnonzero(stor.stored_mask()) if slots is None else slots
        if slots.size == 0:
            return
        b = buf.gather(slots)
        ids = b.extras["row_id"]
        obs = b.obs["image"] if self.dict_obs else b.obs
        nxt = b.next_obs["image"] if self.dict_obs else b.next_obs
        np.testing.assert_array_equal(obs, np.stack([self.ref_obs[i] for i in ids]))
        want = []
        for i, left in zip(ids, self.rows_left(stor, slots), strict=True):
            e, t = self.where[i]
            frames = np.stack(self.episodes[e]["frames"])
            want.append(self.layout.stack(frames, t + min(buf.n_step, left)))
        np.testing.assert_array_equal(nxt, np.stack(want))
        if stor._gather_compiled:  # the NumPy reads (what runs without numba) return the same stacks
            obs_read = stor.read("obs", slots)  # (the compiled read of one column, w = k frames a row)
            stor._gather_compiled = False
            try:
                b2 = buf.gather(slots)
                pairs = [(b.obs, b2.obs), (b.next_obs, b2.next_obs), (obs_read, b2.obs)]
                for got, ref in pairs:
                    for key in (("image", "state") if self.dict_obs else (None,)):
                        np.testing.assert_array_equal(got if key is None else got[key],
                                                      ref if key is None else ref[key])
            finally:
                stor._gather_compiled = True

    @staticmethod
    def rows_left(stor, slots):
        return stor.episodes.end_of(stor.episode_ids(slots)) - stor.position_of(slots)


LAYOUTS = ("gym", "sb3_last", "sb3_first", "sb3_rgb")


@st.composite
def scenarios(draw):
    layout = Layout(draw(st.sampled_from(LAYOUTS)), draw(st.integers(2, 4)),
                    draw(st.sampled_from(("reset", "zero"))))
    writes = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9)), min_size=1, max_size=12))
    return {"layout": layout, "capacity": draw(st.integers(4, 30)), "offline": draw(st.integers(0, 12)),
            "writes": writes, "seed": draw(st.integers(0, 2**16)), "n_step": draw(st.sampled_from((1, 1, 3))),
            "dict_obs": draw(st.booleans()), "end_p": draw(st.sampled_from((0.0, 0.1, 0.4)))}


def run_scenario(s, save_at: int | None = None) -> None:
    world = World(s["layout"], s["seed"], s["dict_obs"])
    capacity = s["capacity"] + s["offline"]
    buf = world.buffer(capacity, n_step=s["n_step"])
    if s["offline"]:
        rows = world.rows(99, s["offline"], s["end_p"])
        buf.add_offline(rows)
        world.current.pop(99, None)  # (offline rows' last episode: open, continued by nothing)
    for j, (stream, n) in enumerate(s["writes"]):
        buf.extend(world.rows(stream, n, s["end_p"]), stream=stream)
        world.check(buf)
        if save_at == j:
            with tempfile.TemporaryDirectory() as d:
                buf.save(f"{d}/ckpt")
                buf = ReplayBuffer.load(f"{d}/ckpt")
            world.check(buf)
    world.check(buf)


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=40, **SETTINGS)
@given(scenarios())
def test_stacks_equal_naive_stacks(s):
    run_scenario(s)


@settings(max_examples=10, **SETTINGS)
@given(scenarios(), st.integers(0, 11))
def test_checkpoint_round_trip_then_more_writes(s, save_at):
    run_scenario(s, save_at=min(save_at, len(s["writes"]) - 1))


@pytest.mark.slow
@settings(max_examples=400, **SETTINGS)
@given(scenarios(), st.integers(0, 11))
def test_stacks_equal_naive_stacks_long(s, save_at):
    run_scenario(s, save_at=save_at)


def test_ring_wrap_keeps_the_frames_the_oldest_rows_look_back_at():
    world = World(Layout("gym", 4), 0)
    buf = world.buffer(10)
    for _ in range(7):  # one long episode over several wraps: every stored row's look-back reaches evicted frames
        buf.extend(world.rows(0, 4, end_p=0.0))
        world.check(buf)
    stor = buf.storage
    bound = int(stor.episodes.lane_evicted[0])
    assert sorted(stor._kept_pos[0].tolist()) == list(range(bound - 3, bound))
    # one write longer than the ring: its first rows are never stored, the kept frames come from them
    buf.extend(world.rows(0, 25, end_p=0.0))
    world.check(buf)


@pytest.mark.parametrize("k", [2, 3, 4])  # (k = 3: the compiled gather's own loop for a 3-frame RGB camera)
@pytest.mark.parametrize("dict_obs", [False, True])
@pytest.mark.parametrize("frame", [FRAME, (4, 5)])  # (H W a multiple of 4: k = 3's loop moves 4 pixels as words)
@pytest.mark.parametrize("n_step", [1, 2])  # (1: obs and next_obs stacks from one read of 4 frames a row)
def test_a_stacked_rgb_camera_channels_last_reads_the_naive_stacks(k, dict_obs, frame, n_step):
    """SB3's VecFrameStack of an RGB camera, (H, W, 3 k): streams, episode ends (zero padding), ring wrap-around,
    n-step next stacks; the compiled gather and the NumPy one return the naive stacks (World.check)."""
    world = World(Layout("sb3_rgb", k, frame=frame), 20 + k, dict_obs)
    buf = world.buffer(18, seed=k, n_step=n_step, gamma=0.9)
    for stream, n in ((0, 7), (1, 5), (0, 9), (1, 6), (0, 1), (0, 1), (1, 4), (0, 3)):  # wraps the ring
        buf.extend(world.rows(stream, n), stream=stream)
        world.check(buf)
    b = buf.sample(16)
    image = b.obs["image"] if dict_obs else b.obs
    assert image.shape == (16, *frame, 3 * k)
    np.testing.assert_array_equal(image, np.stack([world.ref_obs[i] for i in b.extras["row_id"]]))


def test_sample_and_sample_sequences_return_the_naive_stacks():
    world = World(Layout("sb3_last", 4), 1)
    buf = world.buffer(40, seed=3)
    for stream in (0, 1, 0, 1, 0):
        buf.extend(world.rows(stream, 13), stream=stream)
    b = buf.sample(32)
    np.testing.assert_array_equal(b.obs, np.stack([world.ref_obs[i] for i in b.extras["row_id"]]))
    seq = buf.sample_sequences(8, 5)
    ids, mask = seq.extras["row_id"], seq.mask
    want = np.stack([world.ref_obs[i] for i in ids[mask]])
    np.testing.assert_array_equal(seq.obs[mask], want)
    np.testing.assert_array_equal(seq.next_obs[mask], np.stack([world.ref_next[i] for i in ids[mask]]))
    assert (seq.obs[~mask] == 0).all()


@pytest.mark.parametrize(("name", "padding", "dict_obs"), [("gym", "reset", False), ("gym", "zero", True),
                                                          ("sb3_last", "zero", False), ("sb3_first", "zero", True)])
def test_read_pair_equals_the_two_reads_and_shares_the_k_minus_1_frames(name, padding, dict_obs):
    """The one-step batch path (one gather of k + 1 frames a row) returns what read("obs") and read("next_obs")
    return, over episode starts (padding), explicit next frames (episode ends), the offline prefix and frames kept
    below the ring's eviction bound; obs and next_obs are views of one gather (documented in read_pair)."""
    world = World(Layout(name, 3, padding), 11, dict_obs)
    buf = world.buffer(9 + 12)
    buf.add_offline(world.rows(99, 9, 0.3))
    world.current.pop(99, None)
    for stream, n in ((0, 7), (1, 5), (0, 9), (1, 6), (0, 4)):  # wraps the 12-row ring several times
        buf.extend(world.rows(stream, n, 0.25), stream=stream)
    stor = buf.storage
    slots = np.flatnonzero(stor.stored_mask())
    obs, nxt = stor.read_pair(slots)
    want_obs, want_next = stor.read("obs", slots), stor.read("next_obs", slots)
    if dict_obs:
        assert set(obs) == set(nxt) == {"image", "state"}
        np.testing.assert_array_equal(obs["state"], want_obs["state"])
        np.testing.assert_array_equal(nxt["state"], want_next["state"])
        obs, nxt, want_obs, want_next = obs["image"], nxt["image"], want_obs["image"], want_next["image"]
    np.testing.assert_array_equal(obs, want_obs)
    np.testing.assert_array_equal(nxt, want_next)
    # stacks along their first axis: obs and next_obs are views of one gather of k + 1 frames; other layouts (frames
    # interleaved) or the NumPy path for them: as documented in read_pair
    if name != "sb3_last":
        assert np.shares_memory(obs, nxt)
    elif stor._gather_compiled:  # (k = 3 one-byte frames: the compiled pass, two contiguous arrays)
        assert not np.shares_memory(obs, nxt) and obs.flags.c_contiguous and nxt.flags.c_contiguous
    ids = stor.read("row_id", slots)
    np.testing.assert_array_equal(obs, np.stack([world.ref_obs[i] for i in ids]))
    np.testing.assert_array_equal(nxt, np.stack([world.ref_next[i] for i in ids]))
    # rows whose next_obs comes from other rows (n-step bootstrap rows): two reads, no sharing
    last = np.roll(slots, 1)
    o2, n2 = stor.read_pair(slots, last)
    o2, n2 = (o2["image"], n2["image"]) if dict_obs else (o2, n2)
    np.testing.assert_array_equal(o2, want_obs)
    want_last = stor.read("next_obs", last)
    np.testing.assert_array_equal(n2, want_last["image"] if dict_obs else want_last)
    assert not np.shares_memory(o2, n2)


# -- refusals ---------------------------------------------------------------------------------------------
def good_rows(k=4, n=6):
    world = World(Layout("gym", k), 5)
    return world, world.rows(0, n, end_p=0.0)


def test_a_stack_that_does_not_follow_its_episode_is_refused_with_column_and_row():
    world, rows = good_rows()
    buf = world.buffer(20)
    bad = {k: v.copy() for k, v in rows.items()}
    bad["obs"][3, 1] += 1  # row 3's older frame is not row 2's newer one
    with pytest.raises(ValueError, match=r"column 'obs' row 3: the stack does not follow its episode"):
        buf.extend(bad)
    assert len(buf) == 0
    bad = {k: v.copy() for k, v in rows.items()}
    bad["obs"][0, 0] += 1  # an episode's first stack with a wrong padding frame
    with pytest.raises(ValueError, match=r"row 0: .*starts an episode.*padding 'reset'"):
        buf.extend(bad)
    bad = {k: v.copy() for k, v in rows.items()}
    bad["next_obs"][4, 2] += 1  # next_obs is not obs shifted by one frame
    with pytest.raises(ValueError, match=r"column 'next_obs' row 4"):
        buf.extend(bad)
    assert len(buf) == 0
    buf.extend(rows)
    world.rows(0, 1, end_p=0.0)  # a step left out: the next write does not follow the stored rows
    with pytest.raises(ValueError, match=r"column 'obs' row 0: .*previous 3 frames \(the stored rows'\)"):
        buf.extend(world.rows(0, 2, end_p=0.0))
    assert len(buf) == 6


def test_refusals_for_dict_keys_and_streams_name_the_key():
    world = World(Layout("gym", 3), 6, dict_obs=True)
    buf = world.buffer(20)
    buf.extend(world.rows(0, 4, end_p=0.0), stream=0)
    rows1 = world.rows(1, 4, end_p=0.0)
    rows1["obs"]["image"][2] = rows1["obs"]["image"][1]  # the stack stands still: not the next step
    with pytest.raises(ValueError, match=r"column 'obs' key 'image' row 2"):
        buf.extend(rows1, stream=1)
    assert len(buf) == 4


def test_single_frames_or_wrong_shapes_are_refused_clearly():
    world, rows = good_rows()
    buf = world.buffer(20)
    frames = dict(rows, obs=rows["obs"][:, -1])
    with pytest.raises(ValueError, match=r"expected stacks of 4 frames.*single frames"):
        buf.extend(frames)


def test_options_refused_where_frames_would_not_be_rebuilt(tmp_path):
    with pytest.raises(ValueError, match="backend 'ram' or 'memmap'"):  # (memmap: test_frame_stack_memmap.py)
        ReplayBuffer(10, (4, 2, 3), 1, obs_dtype=np.uint8, frame_stack=4, backend="torch")
    with pytest.raises(ValueError, match="dedup_next_obs=False"):
        ReplayBuffer(10, (4, 2, 3), 1, obs_dtype=np.uint8, frame_stack=4, dedup_next_obs=False)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        ReplayBuffer(10, (4, 2, 3), 1, obs_dtype=np.uint8, frame_stack=3)
    with pytest.raises(ValueError, match="name the stacked key"):
        ReplayBuffer(10, {"image": ((4, 2, 3), np.uint8)}, 1, frame_stack=4)
    with pytest.raises(ValueError, match="num_frames must be an integer >= 2"):
        FrameStack(1)
    with pytest.raises(ValueError, match="padding must be one of"):
        FrameStack(4, padding="edge")


def test_checkpoint_holds_frames_once_and_refuses_tampered_kept_frames(tmp_path):
    world = World(Layout("gym", 4), 7)
    buf = world.buffer(12)
    buf.extend(world.rows(0, 30, end_p=0.0))
    state = buf.state_dict()
    assert state["storage"]["columns"]["obs"].shape == (12, 1, *FRAME)  # frames, not stacks
    assert "next_obs" not in state["storage"]["columns"]
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    world.check(loaded)
    state["storage"]["frame_stack_kept"]["position"] = state["storage"]["frame_stack_kept"]["position"] - 1
    with pytest.raises(ValueError, match="frame_stack_kept"):
        ReplayBuffer.from_state_dict(state)


# -- real wrappers ------------------------------------------------------------------------------------------
class FramesEnv:
    """A tiny pixel env (gymnasium API): random uint8 frames, episodes of random length."""

    def __new__(cls, shape, seed):
        import gymnasium as gym

        class _Env(gym.Env):
            observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
            action_space = gym.spaces.Discrete(2)

            def __init__(self):
                self.rng = np.random.default_rng(seed)

            def reset(self, *, seed=None, options=None):
                self.t = 0
                return self.rng.integers(0, 256, shape, dtype=np.uint8), {}

            def step(self, action):
                self.t += 1
                end = self.rng.random() < 0.1
                return self.rng.integers(0, 256, shape, dtype=np.uint8), 1.0, end, self.t >= 15, {}

        return _Env()


def test_gymnasium_frame_stack_observation_output_is_taken_unchanged():
    from gymnasium.wrappers import FrameStackObservation

    env = FrameStackObservation(FramesEnv((5, 6), 0), 4)  # padding_type="reset", the default
    buf = ReplayBuffer(50, (4, 5, 6), (), obs_dtype=np.uint8, frame_stack=4)
    obs, _ = env.reset(seed=0)
    seen_obs, seen_next = [], []
    for _ in range(120):
        nxt, r, term, trunc, _ = env.step(0)
        buf.add(obs=obs, action=0.0, reward=r, next_obs=nxt, terminated=term, truncated=trunc)
        seen_obs.append(obs)
        seen_next.append(nxt)
        obs = env.reset()[0] if term or trunc else nxt
    b = buf.gather(np.flatnonzero(buf.storage.stored_mask()))
    pos = buf.storage.position_of(b.info.indices)
    np.testing.assert_array_equal(b.obs, np.stack(seen_obs)[pos])
    np.testing.assert_array_equal(b.next_obs, np.stack(seen_next)[pos])


def test_sb3_vec_frame_stack_output_is_taken_unchanged():
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

    venv = VecFrameStack(DummyVecEnv([lambda i=i: FramesEnv((5, 6, 1), i) for i in range(2)]), 4)
    assert venv.observation_space.shape == (5, 6, 4)  # channels-last: frames along the last axis, zeros before
    buf = ReplayBuffer(60, (5, 6, 4), (), obs_dtype=np.uint8, frame_stack=FrameStack.sb3(4))
    obs = venv.reset()
    seen: list[list] = [[], []]
    for _ in range(60):
        nxt, r, done, infos = venv.step(np.zeros(2, np.int64))
        for i in range(2):
            true_next = infos[i]["terminal_observation"] if done[i] else nxt[i]
            term = bool(done[i] and not infos[i].get("TimeLimit.truncated", False))
            buf.extend({"obs": obs[i:i + 1], "action": np.zeros(1, np.float32), "reward": r[i:i + 1],
                        "next_obs": true_next[None], "terminated": np.array([term]),
                        "truncated": np.array([bool(done[i]) and not term])}, stream=i)
            seen[i].append((obs[i].copy(), true_next.copy()))
        obs = nxt
    slots = np.flatnonzero(buf.storage.stored_mask())
    b = buf.gather(slots)
    streams, pos = buf.storage.stream_of(slots), buf.storage.position_of(slots) & ((1 << 40) - 1)
    for j in range(slots.size):
        o, x = seen[streams[j]][pos[j]]
        np.testing.assert_array_equal(b.obs[j], o)
        np.testing.assert_array_equal(b.next_obs[j], x)


# -- samplers see slots only ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    UniformSampler, PrioritizedSampler, lambda: ReaPERSampler(use_kernels=False),
    lambda: MixtureSampler(UniformSampler(), PrioritizedSampler()),
])
def test_sampling_probabilities_equal_a_buffer_of_full_stacks(make):
    world = World(Layout("gym", 4), 8)
    offline = world.rows(0, 10, end_p=0.2)
    online = [world.rows(s, 9, end_p=0.2) for s in (0, 1, 0, 1, 0)]
    bufs = []
    for fs in (FrameStack(4), None):
        buf = ReplayBuffer(40, (4, *FRAME), (1,), make(), seed=1, obs_dtype=np.uint8,
                           extra_columns={"row_id": ((), np.int64)}, frame_stack=fs)
        buf.add_offline(offline)
        for j, rows in enumerate(online):
            buf.extend(rows, stream=j % 2)
        bufs.append(buf)
    for _ in range(3):
        batches = [buf.sample(16) for buf in bufs]
        np.testing.assert_array_equal(batches[0].info.indices, batches[1].info.indices)
        np.testing.assert_array_equal(batches[0].obs, batches[1].obs)
        np.testing.assert_array_equal(batches[0].next_obs, batches[1].next_obs)
        td = np.random.default_rng(0).normal(size=16)
        for buf, b in zip(bufs, batches, strict=True):
            buf.update(b.info, td_error=td)
        np.testing.assert_array_equal(bufs[0].sampler.probabilities(), bufs[1].sampler.probabilities())


# -- the compiled paths against the NumPy ones -----------------------------------------------------------------
def numpy_only(buf: ReplayBuffer) -> ReplayBuffer:
    """The buffer with its frame-stack storage on the NumPy paths only (what runs without numba)."""
    buf.storage._step_plan = None
    buf.storage._gather_compiled = False
    return buf


def assert_same_state(a, b, where="state") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
        assert a.dtype == b.dtype, where
    else:
        assert a == b, where


def spoil(rows: dict, how: int, dict_obs: bool) -> dict:
    """A copy of one-row ``rows`` whose stack does not follow its episode (0: a byte of obs's oldest frame changed,
    1: of next_obs's oldest frame)."""
    bad = {k: ({kk: vv.copy() for kk, vv in v.items()} if isinstance(v, dict) else v.copy()) for k, v in rows.items()}
    obs = bad["obs"]["image"] if dict_obs else bad["obs"]
    nxt = bad["next_obs"]["image"] if dict_obs else bad["next_obs"]
    (obs if how == 0 else nxt).reshape(-1)[0] ^= 1  # (byte 0 belongs to the oldest frame in every layout)
    return bad


@st.composite
def one_stream_scenarios(draw):
    layout = Layout(draw(st.sampled_from(LAYOUTS)), draw(st.integers(2, 4)), draw(st.sampled_from(("reset", "zero"))))
    return {"layout": layout, "capacity": draw(st.integers(2, 24)), "offline": draw(st.integers(0, 6)),
            "writes": draw(st.lists(st.sampled_from((1, 1, 1, 1, 2, 7)), min_size=1, max_size=40)),
            "seed": draw(st.integers(0, 2**16)), "dict_obs": draw(st.booleans()),
            "end_p": draw(st.sampled_from((0.0, 0.1, 0.4))), "spoil": draw(st.lists(st.integers(0, 1), max_size=4)),
            "save_at": draw(st.integers(-1, 39))}


def run_one_stream(s) -> None:
    """One stream written mostly one row at a time (the one-step compiled path) into one buffer and the same rows into
    a buffer on the NumPy paths: the same stacks (the naive ones) and the same state after every write; a spoiled
    row is refused by both with the same message, nothing written."""
    worlds = [World(s["layout"], s["seed"], s["dict_obs"]) for _ in range(2)]
    capacity = s["capacity"] + s["offline"]
    bufs = [worlds[0].buffer(capacity), numpy_only(worlds[1].buffer(capacity))]
    if s["offline"]:
        for w, b in zip(worlds, bufs, strict=True):
            b.add_offline(w.rows(99, s["offline"], s["end_p"]))
            w.current.pop(99, None)
    spoils = list(s["spoil"])
    for j, n in enumerate(s["writes"]):
        rows = [w.rows(0, n, s["end_p"]) for w in worlds]
        if n == 1 and spoils and j % 3 == 1:
            how = spoils.pop()
            errors = []
            for b, r in zip(bufs, rows, strict=True):
                with pytest.raises(ValueError, match="does not follow its episode") as e:
                    b.extend(spoil(r, how, s["dict_obs"]))
                errors.append(str(e.value))
            assert errors[0] == errors[1]
        for b, r in zip(bufs, rows, strict=True):
            b.extend(r)
        worlds[0].check(bufs[0])
        assert_same_state(bufs[0].storage.state_dict(), bufs[1].storage.state_dict())
        if j == s["save_at"]:
            with tempfile.TemporaryDirectory() as d:
                bufs[0].save(f"{d}/ckpt")
                bufs[0] = ReplayBuffer.load(f"{d}/ckpt")
            worlds[0].check(bufs[0])


@settings(max_examples=30, **SETTINGS)
@given(one_stream_scenarios())
def test_one_step_writes_equal_the_numpy_path(s):
    run_one_stream(s)


@pytest.mark.slow
@settings(max_examples=300, **SETTINGS)
@given(one_stream_scenarios())
def test_one_step_writes_equal_the_numpy_path_long(s):
    run_one_stream(s)


def test_one_step_path_is_taken_and_refuses_like_the_general_path():
    world = World(Layout("sb3_last", 4), 3)
    buf = world.buffer(12)
    stor = buf.storage
    if stor._step_plan is None:
        pytest.skip("numba is not importable: the one-step path is off")
    buf.extend(world.rows(0, 2, end_p=0.0))  # (the first online write creates the stream: the general path)
    rows = world.rows(0, 1, end_p=0.0)
    assert stor._write_one_step(spoil(rows, 0, False), 0) == -1  # refused, nothing written
    assert len(buf) == 2
    with pytest.raises(ValueError, match=r"column 'obs' row 0: the stack does not follow its episode"):
        buf.extend(spoil(rows, 0, False))
    assert stor._write_one_step(rows, 0) >= 0
    assert len(buf) == 3
    world.check(buf)


def test_bookkeeping_is_at_most_10_bytes_a_transition():
    """Counted as bench/frame_stack_memory.py counts it: episode id, stamp and origin (9 bytes a slot) plus the next-obs
    bitmap and map (issue 45's target: <= 10 bytes a transition)."""
    world = World(Layout("gym", 4), 9)
    n = 4000
    buf = world.buffer(n)
    for _ in range(5):
        buf.extend(world.rows(0, 1000, end_p=0.002))  # episodes of ~500 steps, the ring wrapped
    stor = buf.storage
    per_row = (sum(a.nbytes for a in stor._meta.values()) + stor._nx.map_nbytes) / n
    assert per_row <= 10
    assert stor._nx.bits.nbytes == n // 8
