import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay import OFFLINE, ONLINE, ReplayBuffer, Storage
from relive.testing import random_transitions


def _rows(tokens, ends_terminated, ends_truncated):
    n = len(tokens)
    obs = np.zeros((n, 2), np.float32)
    obs[:, 0] = tokens
    return dict(obs=obs, action=np.zeros((n, 1), np.float32), reward=np.asarray(tokens, np.float32),
                next_obs=obs + 1, terminated=np.asarray(ends_terminated, bool),
                truncated=np.asarray(ends_truncated, bool))


class Model:
    """Plain-Python reference: every row ever written, with its logical position and episode."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.rows = []  # dicts: token, source, pos, episode, step, end
        self.open = {OFFLINE: None, ONLINE: None}
        self.next_episode = 0
        self.num_offline = 0
        self.num_online_written = 0
        self.generation = [0] * capacity

    def write(self, source, tokens, term, trunc):
        if source == ONLINE and self.open[OFFLINE] is not None:
            self.open[OFFLINE] = None
        room = self.capacity - self.num_offline
        # rows of an online batch longer than the ring never land (later rows of the batch replace them)
        skip = max(0, len(tokens) - room) if source == ONLINE else 0
        for i, (tok, te, tr) in enumerate(zip(tokens, term, trunc, strict=True)):
            ep = self.open[source]
            if ep is None:
                ep = self.next_episode
                self.next_episode += 1
                step = 0
            else:
                step = sum(1 for r in self.rows if r["episode"] == ep)
            if source == OFFLINE:
                pos = self.num_offline
                self.num_offline += 1
                slot = pos
            else:
                pos = self.num_online_written
                self.num_online_written += 1
                slot = self.num_offline + pos % (self.capacity - self.num_offline)
            self.generation[slot] += i >= skip
            self.rows.append(dict(token=tok, source=source, pos=pos, slot=slot, episode=ep, step=step,
                                  end=bool(te or tr)))
            self.open[source] = None if (te or tr) else ep

    def live_rows(self):
        online_cap = self.capacity - self.num_offline
        cutoff = self.num_online_written - online_cap
        return [r for r in self.rows if r["source"] == OFFLINE or r["pos"] >= cutoff]


ops = st.lists(st.tuples(st.sampled_from([OFFLINE, ONLINE]), st.integers(0, 9),
                         st.lists(st.sampled_from(["", "term", "trunc"]), min_size=9, max_size=9)),
               min_size=1, max_size=10)


@settings(max_examples=120, deadline=None)
@given(capacity=st.integers(5, 24), ops=ops)
def test_storage_matches_plain_python_model(capacity, ops):
    storage, model = Storage(capacity, (2,), (1,)), Model(capacity)
    token = 1
    for source, n, ends in ops:
        tokens = list(range(token, token + n))
        term = [e == "term" for e in ends[:n]]
        trunc = [e == "trunc" for e in ends[:n]]
        if n == 0:  # an empty write is a no-op, whatever the state
            assert storage.write(source, _rows([], [], [])).size == 0
            continue
        online_started = model.num_online_written > 0
        room = capacity - model.num_offline
        if source == OFFLINE and (online_started or model.num_offline + n > capacity):
            with pytest.raises(ValueError):
                storage.write(source, _rows(tokens, term, trunc))
            continue
        if source == ONLINE and room <= 0:
            with pytest.raises(ValueError):
                storage.write(source, _rows(tokens, term, trunc))
            continue
        token += n
        storage.write(source, _rows(tokens, term, trunc))
        model.write(source, tokens, term, trunc)

        live = model.live_rows()
        assert storage.size == len(live)
        assert storage.num_offline == model.num_offline
        for r in live:
            s = r["slot"]
            assert storage.columns["obs"][s, 0] == r["token"]
            assert storage.meta["episode_id"][s] == r["episode"]
            assert storage.meta["step_in_episode"][s] == r["step"]
            assert storage.meta["source"][s] == r["source"]
        np.testing.assert_array_equal(storage.meta["generation"], model.generation)

        view = storage.episodes.live()
        expect = {}
        for r in live:
            e = expect.setdefault(r["episode"], dict(source=r["source"], start=r["pos"], length=0))
            e["length"] += 1
        assert view.ids.tolist() == sorted(expect)
        for i, ep in enumerate(view.ids.tolist()):
            e = expect[ep]
            all_rows = [r for r in model.rows if r["episode"] == ep]
            finished = all_rows[-1]["end"] or (e["source"] == OFFLINE and model.num_online_written > 0)
            assert (view.source[i], view.start[i], view.length[i]) == (e["source"], e["start"], e["length"])
            assert bool(view.finished[i]) == finished
            # the episode's slots, in time order, hold its live rows
            slots = storage.episode_slots(view.start[i:i + 1], view.length[i:i + 1], view.source[i:i + 1])
            toks = [r["token"] for r in live if r["episode"] == ep]
            np.testing.assert_array_equal(storage.columns["obs"][slots, 0], toks)


def test_ring_wrap_keeps_offline_prefix_and_evicts_oldest_online():
    buf = ReplayBuffer(100, (11,), (3,), seed=0)
    off = random_transitions(40, rng=0)
    buf.add_offline(off)
    for k in range(5):
        buf.extend(random_transitions(25, rng=k + 1, start_step=25 * k))
    assert len(buf) == 100 and buf.num_offline == 40 and buf.num_online == 60
    np.testing.assert_array_equal(buf.storage.columns["obs"][:40], off["obs"])
    # online rows 65..124 are stored; row t sits at slot 40 + t % 60
    gens = buf.storage.meta["generation"]
    assert gens[:40].tolist() == [1] * 40
    assert sorted(set(gens[40:].tolist())) == [2, 3]


def test_batch_longer_than_ring_keeps_the_last_rows():
    st_ = Storage(10, (2,), (1,))
    st_.write(OFFLINE, _rows([1, 2, 3, 4], [0, 0, 0, 1], [0] * 4))
    slots = st_.write(ONLINE, _rows(list(range(100, 115)), [0] * 15, [0] * 15))
    assert (slots[:9] == -1).all() and sorted(slots[9:].tolist()) == list(range(4, 10))
    assert sorted(st_.columns["obs"][4:10, 0].tolist()) == list(range(109, 115))
    view = st_.episodes.live(ONLINE)
    assert view.length.tolist() == [6] and view.start.tolist() == [9] and not view.finished[0]


def test_extra_columns_and_set_column():
    buf = ReplayBuffer(50, (3,), (2,), extra_columns={"mc_return": (), "base_action": ((2,), np.float32)})
    rows = random_transitions(10, 3, 2, rng=0)
    rows["mc_return"] = np.zeros(10)
    rows["base_action"] = np.ones((10, 2))
    idx = buf.extend(rows)
    buf.set_column("mc_return", idx[:3], [1.0, 2.0, 3.0])
    batch = buf.gather(idx[:3])
    np.testing.assert_array_equal(batch.mc_return, [1, 2, 3])
    assert batch.base_action.shape == (3, 2)
    assert buf.storage.meta["generation"][idx[:3]].tolist() == [1, 1, 1]


def test_discrete_actions_and_uint8_observations():
    buf = ReplayBuffer(20, (4, 4), (), obs_dtype=np.uint8, action_dtype=np.int64)
    n = 5
    buf.extend(dict(obs=np.zeros((n, 4, 4), np.uint8), action=np.arange(n), reward=np.zeros(n),
                    next_obs=np.zeros((n, 4, 4), np.uint8), terminated=np.zeros(n), truncated=np.zeros(n)))
    b = buf.sample(5)
    assert b.obs.dtype == np.uint8 and b.action.dtype == np.int64
    with pytest.raises(ValueError, match="'action'.*dtype"):
        img = np.zeros((1, 4, 4), np.uint8)
        buf.extend(dict(obs=img, action=np.array([0.5]), reward=np.zeros(1), next_obs=img,
                        terminated=np.zeros(1), truncated=np.zeros(1)))


def test_extra_columns_named_like_batch_or_sample_info_fields_are_refused():
    """batch.<name> finds Batch's own fields and methods before its extras: such a column would be stored and never
    read (batch.discount stayed None, batch.columns a method); SampleInfo's names (indices, is_weight) would be
    mistaken for batch.info's. Refused at declaration, naming the column."""
    for name in ("discount", "info", "mask", "extras", "columns", "to_torch", "indices", "is_weight", "probability",
                 "hints"):
        with pytest.raises(ValueError, match=rf"extra column '{name}' would be hidden"):
            ReplayBuffer(8, (2,), (1,), extra_columns={name: ()})
    ReplayBuffer(8, (2,), (1,), extra_columns={"mc_return": (), "discount_factor": ()})  # other names are fine
