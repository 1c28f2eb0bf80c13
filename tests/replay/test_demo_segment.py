"""A demonstration segment that grows during online training (issue 32 item 1): offline rows (interventions) join
the never-evicted part after online rows exist; no online row moves, every invariant of the buffer holds (the
hypothesis state machine of test_fuzz.py, extended with a rule that adds demonstrations), old checkpoints load."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule, run_state_machine_as_test

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.storage import consistency
from relive.testing import chisquare_pvalue
from relive.types import AGENT, DATASET, INTERVENTION, OFFLINE, ONLINE
from tests.replay.test_fuzz import EXTRA, BufferMachine, _rows, _same

OBS, ACT = (3,), (2,)


def rows(rng, n, episode_length=4, obs_dim=3):
    t = np.arange(n)
    return {"obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
            "terminated": np.zeros(n, bool), "truncated": (t % episode_length) == episode_length - 1}


def mixture_per():
    return MixtureSampler(UniformSampler(), PrioritizedSampler(priority_exponent=1.0), offline_fraction=0.25)


def test_demonstrations_join_after_online_rows_without_moving_any_online_row():
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(40, OBS, ACT, sampler=mixture_per(), seed=1, demo_capacity=10)
    buf.add_offline(rows(rng, 8))
    buf.extend(rows(rng, 50))  # the ring (22 slots from slot 18) wrapped
    st_ = buf.storage
    assert (st_.ring_base, st_.size, len(buf)) == (18, 40, 30)
    b = buf.sample(24)
    buf.update(b.info, td_error=rng.normal(size=24))
    before = {name: np.array(col[18:40]) for name, col in st_.columns.items()}
    generations = st_.meta["generation"][18:40].copy()
    priorities = buf.sampler.online.leaf_values()
    demo = rows(rng, 3, episode_length=3)
    slots = buf.add_demonstrations(demo)
    np.testing.assert_array_equal(slots, [8, 9, 10])
    assert (st_.meta["origin"][slots] == INTERVENTION).all() and (st_.meta["source"][slots] == OFFLINE).all()
    assert (st_.meta["origin"][:8] == DATASET).all() and (st_.meta["origin"][18:40] == AGENT).all()
    assert buf.sampler.storage.num_before_online == 8  # the dataset [0, 8), the demonstrations [8, num_offline)
    for name, col in st_.columns.items():  # no online row moved, none was rewritten
        np.testing.assert_array_equal(col[18:40], before[name], err_msg=name)
    np.testing.assert_array_equal(st_.meta["generation"][18:40], generations)
    np.testing.assert_array_equal(buf.sampler.online.leaf_values(), priorities)  # PER state untouched
    p = buf.sampler.probabilities()
    assert p.sum() == pytest.approx(1.0) and not p[11:18].any()  # the segment's empty room is never drawn
    np.testing.assert_allclose(p[:11], 0.25 / 11)  # the offline part: dataset + demonstrations, uniform
    # the rows read back as written, and each demonstration is its own (finished) offline episode
    batch = buf.gather(slots)
    np.testing.assert_array_equal(batch.obs, demo["obs"])
    np.testing.assert_array_equal(batch.next_obs, demo["next_obs"])
    assert (batch.info.source == OFFLINE).all()
    live = st_.episodes.live(OFFLINE)
    assert live.ids.tolist() == [0, 1, 2] and live.length.tolist() == [4, 4, 3]
    assert (st_.episodes.live(ONLINE).ids >= 2 + 10).all()  # online ids after the reserved ones
    # sampling hits the demonstrations at their share: 8 of 32 rows offline, every batch
    for _ in range(20):
        info = buf.sample(32).info
        assert (info.source == OFFLINE).sum() == 8
        assert not ((info.indices >= 11) & (info.indices < 18)).any()


def test_a_full_segment_refuses_rows_changing_nothing():
    rng = np.random.default_rng(1)
    buf = ReplayBuffer(30, OBS, ACT, sampler=mixture_per(), demo_capacity=4)
    buf.extend(rows(rng, 10))
    buf.add_demonstrations(rows(rng, 3, 3))
    state = copy.deepcopy(buf.state_dict())
    with pytest.raises(ValueError, match="demonstration segment is full: demo_capacity=4 .* 1 left, 2 new"):
        buf.add_demonstrations(rows(rng, 2, 2))
    assert _same(state, buf.state_dict())
    buf.add_demonstrations(rows(rng, 1, 1))  # the last row of room
    assert buf.storage.num_offline == buf.storage.ring_base == 4 and not buf.storage.has_gap


def test_without_demo_capacity_offline_rows_after_online_are_refused_as_before():
    rng = np.random.default_rng(2)
    buf = ReplayBuffer(30, OBS, ACT, sampler=mixture_per())
    buf.extend(rows(rng, 5))
    with pytest.raises(ValueError, match="demo_capacity"):
        buf.add_demonstrations(rows(rng, 1, 1))


@pytest.mark.parametrize("sampler", [UniformSampler, PrioritizedSampler,
                                     lambda: MixtureSampler(UniformSampler(), UniformSampler())])
def test_demo_capacity_needs_a_mixture_of_uniform_or_per_parts(sampler):
    s = sampler()
    if type(s) is MixtureSampler:
        ReplayBuffer(10, OBS, ACT, sampler=s, demo_capacity=3)
        return
    with pytest.raises(ValueError, match="needs a MixtureSampler"):
        ReplayBuffer(10, OBS, ACT, sampler=s, demo_capacity=3)
    with pytest.raises(ValueError, match="demo_capacity must be"):
        ReplayBuffer(10, OBS, ACT, sampler=MixtureSampler(), demo_capacity=10)


def test_checkpoint_round_trip_with_demonstrations_streams_and_a_referenced_dataset(tmp_path):
    rng = np.random.default_rng(3)
    dataset = rows(rng, 12)
    buf = ReplayBuffer(60, OBS, ACT, sampler=mixture_per(), seed=4, demo_capacity=9, n_step=3)
    buf.add_offline(dataset, dataset_id="toy-v0")
    for i in range(6):
        buf.extend(rows(rng, 7, 5), stream=i % 2)
        if i % 2:
            buf.add_demonstrations(rows(rng, 2, 2))
        b = buf.sample(16)
        buf.update(b.info, td_error=rng.normal(size=16))
    buf.save(tmp_path / "c")  # "auto": the dataset is referenced, the demonstrations copied
    loaded = ReplayBuffer.load(tmp_path / "c", offline_rows=dataset)
    assert _same(loaded.state_dict(), buf.state_dict())
    for _ in range(3):
        a, b = buf.sample(16), loaded.sample(16)
        np.testing.assert_array_equal(a.info.indices, b.info.indices)
        np.testing.assert_array_equal(a.reward, b.reward)  # 3-step returns: a demonstration's stop at its end
    np.testing.assert_array_equal(buf.sampler.probabilities(), loaded.sampler.probabilities())
    loaded.add_demonstrations(rows(rng, 3, 3))  # the loaded buffer goes on growing its segment
    assert loaded.storage.num_offline == 21 and (loaded.storage.meta["origin"][18:21] == INTERVENTION).all()


def test_n_step_returns_of_a_demonstration_do_not_reach_into_the_empty_room():
    rng = np.random.default_rng(5)
    buf = ReplayBuffer(30, OBS, ACT, sampler=mixture_per(), demo_capacity=6, n_step=3, gamma=0.5)
    buf.extend(rows(rng, 8))
    demo = rows(rng, 2, 2)
    slots = buf.add_demonstrations(demo)
    b = buf.gather(slots)
    np.testing.assert_allclose(b.reward, [demo["reward"][0] + 0.5 * demo["reward"][1], demo["reward"][1]], rtol=1e-6)
    np.testing.assert_array_equal(b.next_obs, demo["next_obs"][[1, 1]])


def test_dict_observations_with_dedup_read_the_exact_next_obs():
    rng = np.random.default_rng(6)
    buf = ReplayBuffer(30, {"a": (2,), "b": ((3,), np.uint8)}, ACT, sampler=mixture_per(), demo_capacity=8)

    def dict_rows(n, end):
        obs = {"a": rng.normal(size=(n + 1, 2)).astype(np.float32),
               "b": rng.integers(0, 255, (n + 1, 3)).astype(np.uint8)}
        r = rows(rng, n, end)
        r["obs"] = {k: v[:-1] for k, v in obs.items()}
        r["next_obs"] = {k: v[1:] for k, v in obs.items()}
        return r

    buf.extend(dict_rows(9, 4))
    demo = dict_rows(5, 5)
    slots = buf.add_demonstrations(demo)
    buf.extend(dict_rows(30, 4))
    got = buf.gather(slots).next_obs
    for k in ("a", "b"):
        np.testing.assert_array_equal(got[k], demo["next_obs"][k])


def test_a_checkpoint_from_before_origins_and_ring_base_loads():
    """A state without the fields this change added (``origin``, ``ring_base``, ``id_base``) loads: rows keep their
    place, offline rows count as dataset rows and online ones as agent rows."""
    rng = np.random.default_rng(7)
    buf = ReplayBuffer(30, OBS, ACT, sampler=mixture_per(), seed=2)
    buf.add_offline(rows(rng, 6))
    buf.extend(rows(rng, 40))
    state = copy.deepcopy(buf.state_dict(offline="copy"))
    del state["storage"]["meta"]["origin"], state["storage"]["ring_base"], state["storage"]["episodes"]["id_base"]
    old = ReplayBuffer.from_state_dict(state)
    assert (old.storage.meta["origin"][:6] == DATASET).all() and (old.storage.meta["origin"][6:30] == AGENT).all()
    np.testing.assert_array_equal(old.sample(8).info.indices, buf.sample(8).info.indices)
    more = rows(rng, 5)
    old.extend(more)
    buf.extend(more)
    assert _same(old.state_dict(offline="copy"), buf.state_dict(offline="copy"))


def test_a_corrupted_origin_or_ring_base_is_refused():
    rng = np.random.default_rng(8)
    buf = ReplayBuffer(30, OBS, ACT, sampler=mixture_per(), demo_capacity=5)
    buf.add_offline(rows(rng, 4))
    buf.extend(rows(rng, 10))
    buf.add_demonstrations(rows(rng, 2, 2))
    bad = copy.deepcopy(buf.state_dict())
    bad["storage"]["meta"]["origin"][0] = 7
    with pytest.raises(ValueError, match="origin"):
        ReplayBuffer.from_state_dict(bad)
    bad = copy.deepcopy(buf.state_dict())
    bad["storage"]["ring_base"] = 7  # the ring would start inside the offline rows' room: the rows disagree
    with pytest.raises(ValueError):
        ReplayBuffer.from_state_dict(bad)


# -- the state machine of test_fuzz.py, with a demonstration segment -------------------------------------------------

class DemoMachine(BufferMachine):
    """Every rule of :class:`BufferMachine` (inserts, refused inserts, sample + update, save / load, killed saves,
    concurrent loads), on a buffer with a demonstration segment, plus a rule that adds demonstrations after online
    rows exist; the invariants also check that every demonstration row is still stored as written."""

    kind = "mixture_uniform_per"

    @initialize(capacity=st.integers(6, 48), seed=st.integers(0, 2**16), demo=st.integers(1, 12))
    def build(self, capacity, seed, demo):
        self.rng = np.random.default_rng(seed)
        self.demo_capacity = min(demo, capacity - 2)
        self.demos = {}  # slot -> obs of every demonstration row written
        sampler = (MixtureSampler(UniformSampler(), UniformSampler(), offline_fraction=0.5)
                   if self.kind == "mixture_uniform"
                   else MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.4,
                                       demonstrations=PrioritizedSampler(), demonstration_fraction=0.5)
                   if self.kind == "per_source"
                   else MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.3))
        self.buf = ReplayBuffer(capacity, OBS, ACT, sampler=sampler, seed=seed, extra_columns=EXTRA,
                                demo_capacity=self.demo_capacity)

    @precondition(lambda self: not self.online)
    @rule(n=st.integers(0, 12), episode_length=st.integers(1, 6), extreme=st.none() | st.just(1e30))
    def add_offline(self, n, episode_length, extreme):
        n = min(n, self.buf.capacity - self.demo_capacity - len(self.buf) - 1)  # leave room for the ring
        if n < 0:
            return
        self.buf.add_offline(_rows(self.rng, n, episode_length, self.step, extreme))
        self.step += n

    @precondition(lambda self: self.online)
    @rule(n=st.integers(1, 6), episode_length=st.integers(1, 4))
    def add_demonstrations(self, n, episode_length):
        st_ = self.buf.storage
        room = st_.ring_base - st_.num_offline
        data = _rows(self.rng, n, episode_length, 0)
        data["truncated"][-1] = ~data["terminated"][-1]  # a demonstration ends where it is handed over
        if n > room:
            before = self._snapshot()
            with pytest.raises(ValueError, match="demonstration segment is full"):
                self.buf.add_demonstrations(data)
            assert _same(before, self._snapshot()), "a refused demonstration changed the buffer"
            return
        slots = self.buf.add_demonstrations(data)
        assert slots.tolist() == list(range(st_.num_offline - n, st_.num_offline))
        self.demos.update({int(s): data["obs"][i].copy() for i, s in enumerate(slots)})

    @rule(problem=st.sampled_from(["nan_reward", "inf_obs", "beyond_float32", "int16_high", "int16_low", "flag_2",
                                   "missing", "unknown", "shape", "offline_after_online", "offline_overflow"]),
          n=st.integers(1, 6), row=st.integers(0, 5))
    def refused_insert(self, problem, n, row):
        if problem != "offline_after_online":
            return super().refused_insert(problem, n, row)
        if not self.online:  # offline rows after online ones are welcome now, up to the segment's room
            return
        st_ = self.buf.storage
        data = _rows(self.rng, st_.ring_base - st_.num_offline + n, 3, self.step)
        before = self._snapshot()
        with pytest.raises(ValueError, match="demonstration segment is full"):
            self.buf.add_offline(data)
        assert _same(before, self._snapshot()), "a refused demonstration changed the buffer"

    @invariant()
    def distribution_is_valid(self):
        if not hasattr(self, "buf") or len(self.buf) == 0:
            return
        st_ = self.buf.storage
        p = self.buf.sampler.probabilities()
        stored = np.zeros(self.buf.capacity, bool)
        stored[: st_.size] = st_.stored_mask()
        assert stored.sum() == len(self.buf) == st_.num_offline + st_.num_online
        assert np.isfinite(p).all() and (p >= 0).all()
        assert not p[~stored].any(), "probability on an empty slot (the segment's room or beyond)"
        assert p[stored].sum() == pytest.approx(1.0, rel=1e-6)
        if self.kind == "per_source":  # each source's mass is its share: dataset, demonstrations, agent
            nbo, k = st_.num_before_online, st_.num_offline
            masses = (p[:nbo].sum(), p[nbo:k].sum(), p[st_.ring_base :].sum())
            np.testing.assert_allclose(masses, self.buf.sampler.shares(), atol=1e-9)

    @invariant()
    def storage_is_consistent(self):
        if not hasattr(self, "buf"):
            return
        st_ = self.buf.storage
        k, base = st_.num_offline, st_.ring_base
        assert k <= base <= st_.capacity and base - k <= self.demo_capacity
        assert st_.size == (base + st_.num_online if st_.num_online_written else k)
        mask = st_.stored_mask()
        assert (st_.meta["generation"][: st_.size][mask] >= 1).all()
        assert (st_.meta["source"][:k] == OFFLINE).all() and (st_.meta["source"][base : st_.size] == ONLINE).all()
        for slot, obs in getattr(self, "demos", {}).items():  # never evicted, never moved
            assert slot < k and st_.meta["origin"][slot] == INTERVENTION
            np.testing.assert_array_equal(st_.columns["obs"][slot], obs)
        consistency.check_loaded(st_)  # every invariant a loaded checkpoint is held to (the episode table, flags, ...)


@pytest.mark.parametrize("kind", ["mixture_uniform", "mixture_uniform_per", "per_source"])
def test_fuzz_buffer_with_a_growing_demonstration_segment(kind):
    _run_demo(kind, examples=6, steps=20)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixture_uniform", "mixture_uniform_per", "per_source"])
def test_fuzz_buffer_with_a_growing_demonstration_segment_long(kind):
    _run_demo(kind, examples=25, steps=30)  # (about a minute per kind on 2 idle cores)


def _run_demo(kind, examples, steps):
    machine = type(f"DemoMachine_{kind}", (DemoMachine,), {"kind": kind})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]))


def test_a_memmap_buffer_grows_its_segment_and_loads_from_its_checkpoint(tmp_path):
    rng = np.random.default_rng(9)
    buf = ReplayBuffer(40, OBS, ACT, sampler=mixture_per(), seed=3, demo_capacity=6, backend="memmap",
                       directory=tmp_path / "cols")
    buf.add_offline(rows(rng, 5))
    buf.extend(rows(rng, 45))
    buf.add_demonstrations(rows(rng, 4, 4))
    buf.save(tmp_path / "c")
    expected = copy.deepcopy(buf.state_dict())
    buf.close()
    loaded = ReplayBuffer.load(tmp_path / "c")
    assert _same(loaded.state_dict(), expected)
    assert loaded.storage.num_offline == 9 and (loaded.storage.meta["origin"][5:9] == INTERVENTION).all()
    loaded.close()


def test_the_size_a_mixture_reports_counts_rows_not_the_segments_empty_slots():
    """replay/size (and the ESS fraction) over a segment with room left: the stored rows, not the slot extent."""
    buf = ReplayBuffer(40, OBS, ACT, sampler=mixture_per(), seed=1, demo_capacity=10)
    rng = np.random.default_rng(0)
    buf.add_offline(rows(rng, 5))
    buf.extend(rows(rng, 8))
    buf.add_demonstrations(rows(rng, 3))
    assert buf.storage.has_gap and len(buf) == 16 and buf.storage.size > 16
    stats = buf.sampler.stats()
    assert stats["replay/size"] == 16.0
    assert stats["replay/ess_fraction"] <= 1.0


# -- per-source parts: dataset, demonstrations and agent rows, each its own share and sampler -------------------------

def per_source(fraction=0.5, demo_fraction=0.25, demonstrations=None):
    return MixtureSampler(UniformSampler(), UniformSampler(), offline_fraction=fraction,
                          demonstrations=demonstrations or UniformSampler(), demonstration_fraction=demo_fraction)


def filled(sampler, rng, dataset, online, demos, capacity, seed, demo_capacity):
    """A buffer with ``dataset`` offline rows, then ``online`` agent rows, then ``demos`` demonstration rows (one
    episode)."""
    buf = ReplayBuffer(capacity, OBS, ACT, sampler=sampler, seed=seed, demo_capacity=demo_capacity)
    buf.add_offline(rows(rng, dataset))
    buf.extend(rows(rng, online))
    buf.add_demonstrations(rows(rng, demos, demos))
    return buf


def test_each_source_gets_its_exact_count_and_its_probabilities_by_hand():
    buf = filled(per_source(0.5, 0.25), np.random.default_rng(4), 8, 40, 3, capacity=60, seed=2, demo_capacity=10)
    st_ = buf.storage
    assert (st_.num_before_online, st_.num_offline, st_.ring_base) == (8, 11, 18)
    # B = 32: round(32 * 0.5) = 16 offline, round(16 * 0.25) = 4 of them demonstrations, 12 dataset, 16 agent
    assert buf.sampler.counts(32) == (12, 4, 16) and buf.sampler.split(32) == (16, 16)
    p = buf.sampler.probabilities(32)
    np.testing.assert_allclose(p[:8], 12 / 32 / 8)
    np.testing.assert_allclose(p[8:11], 4 / 32 / 3)
    np.testing.assert_allclose(p[18:58], 16 / 32 / 40)
    assert not p[11:18].any() and not p[58:].any()
    for _ in range(30):
        draw = buf.sample(32).info
        idx, prob = draw.indices, draw.probability
        assert ((idx < 8).sum(), ((idx >= 8) & (idx < 11)).sum(), (idx >= 18).sum()) == (12, 4, 16)
        np.testing.assert_allclose(prob, p[idx])  # the probability a batch reports is the row's own
    # B = 10: round(10 * 0.5) = 5 offline, round(5 * 0.25) = 1 of them demonstrations
    assert buf.sampler.counts(10) == (4, 1, 5)
    np.testing.assert_allclose(buf.sampler.shares(), (0.375, 0.125, 0.5))
    assert buf.sampler.stats()["replay/demonstration_fraction"] == pytest.approx(0.125)


def test_an_empty_part_gives_its_rows_to_its_sibling():
    rng = np.random.default_rng(5)
    buf = ReplayBuffer(60, OBS, ACT, sampler=per_source(0.5, 0.25), seed=2, demo_capacity=10)
    buf.add_offline(rows(rng, 8))
    assert buf.sampler.counts(32) == (32, 0, 0)  # no online rows, no demonstrations: the dataset draws them all
    buf.extend(rows(rng, 20))
    assert buf.sampler.counts(32) == (16, 0, 16)  # no demonstrations yet: the dataset draws the offline half
    np.testing.assert_allclose(buf.sampler.probabilities()[:8], 0.5 / 8)
    # no dataset (HIL from scratch): the demonstrations draw the whole offline share once there are some
    bare = ReplayBuffer(60, OBS, ACT, sampler=per_source(0.5, 0.25), seed=2, demo_capacity=10)
    bare.extend(rows(rng, 20))
    assert bare.sampler.counts(32) == (0, 0, 32)
    bare.add_demonstrations(rows(rng, 3, 3))
    assert bare.sampler.counts(32) == (0, 16, 16)
    np.testing.assert_allclose(bare.sampler.probabilities()[:3], 0.5 / 3)
    for _ in range(10):
        idx = bare.sample(16).info.indices
        assert (idx < 3).sum() == 8 and (idx >= 10).sum() == 8


def test_the_draws_follow_the_per_source_probabilities():
    """Chi-square of 40,000 draws against probabilities(): PER demonstrations after td-error updates routed to them
    (a prioritized part inside a per-source mixture), uniform dataset and agent rows."""
    sampler = per_source(0.6, 0.5, demonstrations=PrioritizedSampler(priority_exponent=1.0))
    buf = filled(sampler, np.random.default_rng(6), 6, 12, 5, capacity=60, seed=3, demo_capacity=10)
    demo_slots = np.arange(6, 11)
    batch = buf.gather(np.concatenate([demo_slots, [0, 20]]))
    buf.update(batch.info, td_error=np.array([1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 9.0]))
    leaves = sampler.demonstrations.leaf_values()
    np.testing.assert_allclose(leaves[demo_slots], np.array([1.0, 2.0, 3.0, 4.0, 5.0]) + 1e-6, rtol=1e-5)
    assert not leaves[:6].any() and not leaves[16:].any()  # the dataset's and the agent's rows are not its own
    assert sampler.counts(20) == (6, 6, 8)  # round(20 * 0.6) = 12 offline, half of them demonstrations
    p = sampler.probabilities(20)
    np.testing.assert_allclose(p[demo_slots], 6 / 20 * (np.arange(1, 6) + 1e-6) / (15 + 5e-6), rtol=1e-6)
    drawn = np.concatenate([buf.sample(20).info.indices for _ in range(2000)])
    assert chisquare_pvalue(drawn, p) > 1e-3
    swapped = p.copy()
    swapped[demo_slots] = swapped[demo_slots][::-1]  # the test can tell the priorities apart
    assert chisquare_pvalue(drawn, swapped) < 1e-6


def test_per_source_parts_survive_a_checkpoint_and_resume_the_same_draws(tmp_path):
    rng = np.random.default_rng(7)
    sampler = per_source(0.5, 0.5, demonstrations=PrioritizedSampler(priority_exponent=0.7))
    buf = filled(sampler, rng, 6, 15, 4, capacity=50, seed=4, demo_capacity=8)
    b = buf.sample(16)
    buf.update(b.info, td_error=rng.normal(size=16))
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    assert type(loaded.sampler.demonstrations) is PrioritizedSampler
    assert loaded.sampler.demonstration_fraction == 0.5
    assert loaded.sampler.demonstrations.priority_exponent == 0.7
    np.testing.assert_array_equal(loaded.sampler.demonstrations.leaf_values(), sampler.demonstrations.leaf_values())
    for _ in range(5):
        np.testing.assert_array_equal(loaded.sample(16).info.indices, buf.sample(16).info.indices)


def test_per_source_settings_are_checked():
    with pytest.raises(ValueError, match="demonstration_fraction"):
        MixtureSampler(demonstration_fraction=1.5)
    with pytest.raises(ValueError, match="needs its demonstration_fraction"):
        MixtureSampler(demonstrations=UniformSampler())
    part = UniformSampler()
    with pytest.raises(ValueError, match="same sampler instance"):
        MixtureSampler(UniformSampler(), part, demonstrations=part, demonstration_fraction=0.5)
