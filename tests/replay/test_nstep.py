"""n-step returns at sample time and sequence sampling (issue 17, item 5).

Rows carry a token in obs[:, 0] that names them (offline: its index; online: (stream + 1) * 100_000 + its index in
the stream) and next_obs = obs + 0.25, so every row a batch holds can be checked against a plain Python model of the
written streams: which rows the ring still holds (the last ``online_capacity`` online rows in write order) and where
each stream's episodes end (a termination, a truncation, the stream's newest row; offline: the dataset's end)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.returns import n_step_returns

OFFLINE_KEY = -1
NONE, TERM, TRUNC = 0, 1, 2


def rows_of(tokens, rewards, flags) -> dict:
    tokens = np.asarray(tokens, np.float32)
    flags = np.asarray(flags)
    obs = np.stack([tokens, np.zeros_like(tokens)], 1)
    return dict(obs=obs, action=tokens[:, None].copy(), reward=np.asarray(rewards, np.float32), next_obs=obs + 0.25,
                terminated=flags == TERM, truncated=flags == TRUNC, mc_return=tokens.copy())


class Model:
    """What the buffer should hold, in plain Python: each stream's rows in time order and the ring's FIFO."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.streams: dict[int, list[tuple[float, float, int]]] = {}  # key -> [(token, reward, flag)]
        self.ring: list[tuple[int, int]] = []  # online rows (key, index) in write order
        self.num_offline = 0

    def write(self, key: int, rewards, flags) -> dict:
        rows = self.streams.setdefault(key, [])
        start = len(rows)
        tokens = [self.token(key, start + i) for i in range(len(rewards))]
        rows.extend(zip(tokens, rewards, flags, strict=True))
        if key == OFFLINE_KEY:
            self.num_offline += len(rewards)
        else:
            self.ring.extend((key, start + i) for i in range(len(rewards)))
        return rows_of(tokens, rewards, flags)

    @staticmethod
    def token(key: int, i: int) -> float:
        return float(i if key == OFFLINE_KEY else (key + 1) * 100_000 + i)

    @staticmethod
    def locate(token: float) -> tuple[int, int]:
        t = int(token)
        return (OFFLINE_KEY, t) if t < 100_000 else (t // 100_000 - 1, t % 100_000)

    def stored(self) -> set:
        online = self.ring[max(0, len(self.ring) - (self.capacity - self.num_offline)):]
        return {(OFFLINE_KEY, i) for i in range(self.num_offline)} | set(online)

    def episode_rest(self, key: int, i: int) -> list[int]:
        """Indices i, i + 1, ... of the stream up to its episode's last row (end flag, or the stream's newest)."""
        rows, out = self.streams[key], []
        for j in range(i, len(rows)):
            out.append(j)
            if rows[j][2] != NONE:
                break
        return out

    def n_step(self, token: float, n: int, gamma: float) -> tuple[float, float, float, int]:
        """(R, discount, bootstrap row's token, n') by the definition, one row at a time."""
        key, i = self.locate(token)
        rest = self.episode_rest(key, i)[:n]
        rows = self.streams[key]
        ret = sum(gamma**k * float(np.float32(rows[j][1])) for k, j in enumerate(rest))
        last = rows[rest[-1]]
        discount = 0.0 if last[2] == TERM else gamma ** len(rest)
        return ret, discount, last[0], len(rest)


def check_batch_against_model(buf: ReplayBuffer, model: Model, slots, n: int, gamma: float) -> None:
    b = buf.gather(slots)
    tokens = buf.storage.columns["obs"][slots, 0]
    expected = np.array([model.n_step(t, n, gamma) for t in tokens])
    np.testing.assert_allclose(b.reward, expected[:, 0].astype(np.float32), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(b.discount, expected[:, 1].astype(np.float32))
    np.testing.assert_array_equal(b.next_obs[:, 0], (expected[:, 2] + 0.25).astype(np.float32))
    last_flags = np.array([model.streams[model.locate(t)[0]][model.locate(t)[1]][2] for t in expected[:, 2]])
    np.testing.assert_array_equal(b.terminated, last_flags == TERM)
    np.testing.assert_array_equal(b.truncated, last_flags == TRUNC)
    np.testing.assert_array_equal(b.obs[:, 0], tokens)  # the row's own obs, action and extras
    np.testing.assert_array_equal(b.mc_return, tokens)


# -- hand computations ----------------------------------------------------------------------------------------
def test_n_step_by_hand_termination_truncation_open_episode_and_wrap():
    """gamma = 1/2 and integer rewards: every value below is exact in float32 and written out by hand."""
    g = 0.5
    buf = ReplayBuffer(10, (2,), (1,), n_step=3, gamma=g, extra_columns={"mc_return": ()})
    # offline: [r 1, 2 terminated] [r 3, 4, 5, 6 truncated at 6] [r 7, 8: the dataset ends mid-episode]
    model = Model(10)
    buf.add_offline(model.write(OFFLINE_KEY, [1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 0, 0, 0, 2, 0, 0]))
    b = buf.gather(np.arange(8))
    np.testing.assert_array_equal(b.reward, [1 + 2 / 2, 2, 3 + 4 / 2 + 5 / 4, 4 + 5 / 2 + 6 / 4, 5 + 6 / 2, 6,
                                             7 + 8 / 2, 8])
    np.testing.assert_array_equal(b.discount, [0, 0, 1 / 8, 1 / 8, 1 / 4, 1 / 2, 1 / 4, 1 / 2])
    np.testing.assert_array_equal(b.next_obs[:, 0], np.array([1, 1, 4, 5, 5, 5, 7, 7]) + 0.25)
    np.testing.assert_array_equal(b.terminated, [1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b.truncated, [0, 0, 0, 1, 1, 1, 0, 0])
    # online ring of 2 slots; an open episode: r 10, 20, 30 (no end yet) -> only 20, 30 are stored (wrap)
    buf.extend(model.write(0, [10, 20, 30], [0, 0, 0]))
    slots = buf.storage.online_slot(np.array([1, 2]))
    b = buf.gather(slots)
    np.testing.assert_array_equal(b.obs[:, 0], [100_001, 100_002])
    np.testing.assert_array_equal(b.reward, [20 + 30 / 2, 30])  # the newest row of the open episode ends the sum
    np.testing.assert_array_equal(b.discount, [1 / 4, 1 / 2])  # ... and is bootstrapped from
    np.testing.assert_array_equal(b.next_obs[:, 0], [100_002.25, 100_002.25])
    # the episode terminates at the next row, which evicts row "20": 30 + 40 / 2, no bootstrap
    buf.extend(model.write(0, [40], [1]))
    b = buf.gather(buf.storage.online_slot(np.array([2, 3])))
    np.testing.assert_array_equal(b.reward, [30 + 40 / 2, 40])
    np.testing.assert_array_equal(b.discount, [0, 0])
    check_batch_against_model(buf, model, np.arange(buf.storage.size), 3, g)


def test_n_step_by_hand_two_interleaved_streams():
    g = 0.5
    buf = ReplayBuffer(12, (2,), (1,), n_step=2, gamma=g, extra_columns={"mc_return": ()})
    model = Model(12)
    buf.extend(model.write(0, [1, 2], [0, 0]), stream=0)  # stream 0: 1, 2, | 3 truncated, 4 (open)
    buf.extend(model.write(1, [10, 20, 30], [0, 1, 0]), stream=1)  # stream 1: 10, 20 terminated, 30, | 40 (open)
    buf.extend(model.write(0, [3, 4], [2, 0]), stream=0)
    buf.extend(model.write(1, [40], [0]), stream=1)
    tokens = buf.storage.columns["obs"][: buf.storage.size, 0]
    order = np.argsort(tokens)  # 100000.. (stream 0), then 200000.. (stream 1)
    b = buf.gather(order)
    np.testing.assert_array_equal(b.obs[:, 0], [100_000, 100_001, 100_002, 100_003, 200_000, 200_001, 200_002,
                                                200_003])
    np.testing.assert_array_equal(b.reward, [1 + 2 / 2, 2 + 3 / 2, 3, 4, 10 + 20 / 2, 20, 30 + 40 / 2, 40])
    np.testing.assert_array_equal(b.discount, [1 / 4, 1 / 4, 1 / 2, 1 / 2, 0, 0, 1 / 4, 1 / 2])
    np.testing.assert_array_equal(b.next_obs[:, 0] - 0.25, [100_001, 100_002, 100_002, 100_003, 200_001, 200_001,
                                                            200_003, 200_003])


def test_n_step_one_is_the_one_step_batch_and_bad_settings_are_refused():
    rng = np.random.default_rng(0)
    model = Model(20)
    flags = rng.choice(3, 30, p=[0.7, 0.15, 0.15])
    rows = model.write(0, rng.integers(-5, 5, 30).astype(float), flags)
    one, plain = ReplayBuffer(20, (2,), (1,), n_step=1, gamma=0.3, extra_columns={"mc_return": ()}), \
        ReplayBuffer(20, (2,), (1,), extra_columns={"mc_return": ()})
    for buf in (one, plain):
        buf.extend(rows)
    slots = np.arange(20)
    a, b = one.gather(slots), plain.gather(slots)
    assert a.discount is None and b.discount is None and a.mask is None
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(a, name), buf.storage.columns[name][slots])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_step"):
            ReplayBuffer(8, (2,), (1,), n_step=bad)
    with pytest.raises(ValueError, match="gamma"):
        ReplayBuffer(8, (2,), (1,), n_step=2, gamma=1.5)


def test_n_step_survives_a_checkpoint(tmp_path):
    model = Model(9)
    buf = ReplayBuffer(9, (2,), (1,), n_step=4, gamma=0.9, extra_columns={"mc_return": ()})
    buf.extend(model.write(0, list(range(13)), [0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0]))
    buf.save(tmp_path / "buf")
    back = ReplayBuffer.load(tmp_path / "buf")
    assert (back.n_step, back.gamma) == (4, 0.9)
    check_batch_against_model(back, model, np.arange(back.storage.size), 4, 0.9)


# -- random streams: offline prefix, ring wrap, one or two interleaved streams ---------------------------------
chunk = hst.tuples(hst.integers(0, 1), hst.lists(hst.sampled_from([NONE, NONE, NONE, TERM, TRUNC]), min_size=1,
                                                  max_size=7))
close = hst.tuples(hst.integers(0, 1), hst.none())  # close_stream: the stream's open episode ends where it stands


def build(capacity, offline_flags, chunks, n_step=1, gamma=0.9, sampler=None, seed=0):
    model = Model(capacity)
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=sampler, n_step=n_step, gamma=gamma, seed=seed,
                       extra_columns={"mc_return": ()})
    rng = np.random.default_rng(seed)
    if offline_flags:
        buf.add_offline(model.write(OFFLINE_KEY, rng.integers(-9, 9, len(offline_flags)).tolist(), offline_flags))
    for stream, flags in chunks:
        if flags is None:
            buf.close_stream(stream)
            rows = model.streams.get(stream)
            if rows and rows[-1][2] == NONE:  # its last row becomes a truncation
                rows[-1] = (*rows[-1][:2], TRUNC)
            continue
        buf.extend(model.write(stream, rng.integers(-9, 9, len(flags)).tolist(), flags), stream=stream)
    return buf, model


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(offline=hst.lists(hst.sampled_from([NONE, NONE, TERM, TRUNC]), max_size=6),
       chunks=hst.lists(hst.one_of(chunk, chunk, close), min_size=1, max_size=12).filter(
           lambda c: any(f is not None for _, f in c)),
       n=hst.integers(1, 5), gamma=hst.sampled_from([0.5, 0.9]))
def test_n_step_matches_the_definition_on_random_streams(offline, chunks, n, gamma):
    buf, model = build(7 + len(offline), offline, chunks, n_step=max(n, 2), gamma=gamma)
    slots = np.arange(buf.storage.size)
    assert {model.locate(t) for t in buf.storage.columns["obs"][slots, 0]} == model.stored()
    check_batch_against_model(buf, model, slots, max(n, 2), gamma)
    ret = n_step_returns(buf.storage, slots, n, gamma)  # the function, any n (1 included)
    expected_n = [model.n_step(t, n, gamma)[3] for t in buf.storage.columns["obs"][slots, 0]]
    np.testing.assert_array_equal(ret.n, expected_n)


# -- sequences ----------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(offline=hst.lists(hst.sampled_from([NONE, NONE, TERM, TRUNC]), max_size=6),
       chunks=hst.lists(hst.one_of(chunk, chunk, close), min_size=1, max_size=12).filter(
           lambda c: any(f is not None for _, f in c)),
       length=hst.integers(1, 6), seed=hst.integers(0, 3))
def test_slices_stay_within_episodes_and_mask_the_padding(offline, chunks, length, seed):
    buf, model = build(7 + len(offline), offline, chunks, seed=seed)
    size = min(5, buf.storage.size)
    b = buf.sample_sequences(size, length)
    assert b.obs.shape == (size, length, 2) and b.action.shape == (size, length, 1)
    assert b.reward.shape == b.mask.shape == b.mc_return.shape == (size, length) and b.mask.dtype == bool
    starts = buf.storage.columns["obs"][b.info.indices, 0]
    for row in range(size):
        key, i = model.locate(starts[row])
        rest = model.episode_rest(key, i)[:length]  # the start row's episode from it on
        np.testing.assert_array_equal(b.mask[row], np.arange(length) < len(rest))
        np.testing.assert_array_equal(b.obs[row, : len(rest), 0], [model.token(key, j) for j in rest])
        np.testing.assert_array_equal(b.next_obs[row, : len(rest), 0], [model.token(key, j) + 0.25 for j in rest])
        np.testing.assert_array_equal(b.reward[row, : len(rest)], [model.streams[key][j][1] for j in rest])
        for col in (b.obs, b.action, b.reward, b.next_obs, b.terminated, b.truncated, b.mc_return):
            assert not np.any(col[row, len(rest):])  # padding is zeros (False)
        ends = b.terminated[row] | b.truncated[row]
        assert not ends[: len(rest) - 1].any()  # no episode end before the slice's last step
    if buf.storage.multi_stream or offline:
        assert all(model.locate(t) in model.stored() for t in b.obs[b.mask][:, 0])


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=hst.lists(chunk, min_size=1, max_size=12), length=hst.integers(1, 4), seed=hst.integers(0, 3))
def test_rejected_slices_are_full_and_within_one_episode(chunks, length, seed):
    buf, model = build(10, [], chunks, seed=seed)
    longest = max(len(model.episode_rest(*model.locate(t))) for t in buf.storage.columns["obs"][: buf.storage.size, 0])
    if longest < length:
        with pytest.raises(ValueError, match="no stored episode has"):
            buf.sample_sequences(1, length, at_episode_end="reject")
        return
    size = min(4, buf.storage.size)
    b = buf.sample_sequences(size, length, at_episode_end="reject")
    assert b.mask.all()
    for row in range(size):
        key, i = model.locate(b.obs[row, 0, 0])
        assert len(model.episode_rest(key, i)) >= length
        np.testing.assert_array_equal(b.obs[row, :, 0], [model.token(key, i + j) for j in range(length)])


def test_slice_priority_is_its_start_rows_and_updates_reach_the_start_rows():
    per = PrioritizedSampler(priority_exponent=1.0, is_exponent=0.0)
    buf, model = build(40, [], [(0, [NONE] * 9 + [TERM])] * 4, sampler=per, seed=1)
    buf.update(buf.gather(np.arange(40)).info, priority=np.arange(1, 41, dtype=float))
    b = buf.sample_sequences(32, 3)
    np.testing.assert_allclose(b.info.probability, per.probabilities()[b.info.indices])
    np.testing.assert_array_equal(b.obs[:, 0, 0], buf.storage.columns["obs"][b.info.indices, 0])
    buf.update(b.info, priority=np.full(32, 1000.0))
    leaves = np.array(per.sum_tree.leaves[:40])
    np.testing.assert_array_equal(np.flatnonzero(leaves == 1000.0), np.unique(b.info.indices))


def test_rejection_keeps_a_mixtures_exact_split():
    sampler = MixtureSampler(UniformSampler(), UniformSampler(), offline_fraction=0.25)
    buf, _ = build(60, [NONE, NONE, TERM] * 4, [(0, [NONE, NONE, NONE, TRUNC])] * 8, sampler=sampler, seed=2)
    for _ in range(5):
        b = buf.sample_sequences(16, 3, at_episode_end="reject")
        assert b.mask.all() and int((b.info.source == 0).sum()) == 4


def test_sequences_carry_n_step_fields_per_step():
    buf, model = build(30, [], [(0, [NONE, NONE, TERM, NONE, NONE, NONE, TRUNC, NONE])], n_step=2, gamma=0.5)
    b = buf.sample_sequences(8, 4)
    assert b.discount.shape == (8, 4)
    for row in range(8):
        for j in np.flatnonzero(b.mask[row]):
            ret, discount, last, _ = model.n_step(b.obs[row, j, 0], 2, 0.5)
            assert (b.reward[row, j], b.discount[row, j], b.next_obs[row, j, 0]) == (ret, discount, last + 0.25)
        assert not b.discount[row][~b.mask[row]].any()


def test_sequence_settings_are_checked():
    buf, _ = build(8, [], [(0, [NONE, NONE, TERM])])
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="sequence length"):
            buf.sample_sequences(2, bad)
    with pytest.raises(ValueError, match="larger than the buffer's capacity"):
        buf.sample_sequences(2, 9)
    with pytest.raises(ValueError, match="at_episode_end"):
        buf.sample_sequences(2, 2, at_episode_end="wrap")
    with pytest.raises(ValueError, match="only 3 rows"):
        buf.sample_sequences(4, 2)
    with pytest.raises(ValueError, match="no stored episode has 4 rows"):
        buf.sample_sequences(2, 4, at_episode_end="reject")


def test_torch_batches_keep_discount_and_mask():
    torch = pytest.importorskip("torch")
    buf, _ = build(12, [], [(0, [NONE, NONE, TERM, NONE])], n_step=2)
    t = buf.sample_sequences(3, 3).to_torch()
    assert t.mask.dtype == torch.bool and t.discount.dtype == torch.float32 and t.discount.shape == (3, 3)


def test_a_checkpoint_from_before_n_step_loads_as_one_step():
    buf, _ = build(8, [], [(0, [NONE, NONE, TERM])], n_step=3)
    state = buf.state_dict()
    state["config"] = {k: v for k, v in state["config"].items() if k not in ("n_step", "gamma")}
    back = ReplayBuffer.from_state_dict(state)
    assert back.n_step == 1 and back.gather(np.arange(3)).discount is None


def test_n_step_is_bounded_by_the_capacity_and_a_documented_maximum():
    """n_step = 10**6 used to be accepted and cost ~12 s per sample (one pass over the batch per step ahead): an
    n_step larger than the capacity or than MAX_N_STEP is refused by name, and a sample's passes stop at the
    longest n' a row of the batch uses."""
    from relive.replay.returns import MAX_N_STEP

    with pytest.raises(ValueError, match=r"n_step = 9 is larger than the buffer's capacity of 8 rows"):
        ReplayBuffer(8, (2,), (1,), n_step=9)
    with pytest.raises(ValueError, match=rf"n_step must be at most {MAX_N_STEP}.*got 1000000"):
        ReplayBuffer(2_000_000, (2,), (1,), n_step=10**6)
    buf = ReplayBuffer(MAX_N_STEP, (2,), (1,), n_step=MAX_N_STEP, gamma=0.5, extra_columns={"mc_return": ()})
    rng = np.random.default_rng(0)
    flags = np.zeros(40, int)
    flags[-1] = TERM
    buf.extend(rows_of(np.arange(40), rng.integers(-5, 5, 40).astype(float), flags))
    got = n_step_returns(buf.storage, np.arange(40), MAX_N_STEP, 0.5)
    want = n_step_returns(buf.storage, np.arange(40), 40, 0.5)  # the episode has 40 rows: n' <= 40 either way
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
