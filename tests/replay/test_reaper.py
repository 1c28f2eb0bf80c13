"""ReaPER (Pleiss et al., Eq. 15-18): exact probabilities against a from-scratch NumPy model, the locality of an
update, draws, IS weights and checkpoints -- for the compiled and the NumPy path."""

import numpy as np
import pytest

from relive.replay import MixtureSampler, ReaPERSampler, ReplayBuffer, UniformSampler
from relive.replay._tree_kernels import AVAILABLE
from tests.replay.adaptive_helpers import check_frequencies_with_power, rows

KERNELS = [False, True] if AVAILABLE else [False]
ALPHA, OMEGA, BETA, EPS = 0.7, 0.5, 0.5, 1e-6


class Model:
    """ReaPER from scratch: every row ever stored keeps its last d (evicted rows too, as the sampler documents),
    keyed by (episode id, step); reliabilities are recomputed over whole episodes for every query."""

    def __init__(self, buf, truncation="finished"):
        self.buf, self.truncation = buf, truncation
        self.d: dict[tuple[int, int], float] = {}
        self.max_d = 1.0

    def _keys(self, slots):
        meta = self.buf.storage.meta
        return list(zip(meta["episode_id"][slots].tolist(), meta["step_in_episode"][slots].tolist(), strict=True))

    def inserted(self, slots):
        for key in self._keys(np.asarray(slots)[np.asarray(slots) >= 0]):
            self.d[key] = self.max_d

    def updated(self, slots, td):
        for key, v in zip(self._keys(slots), np.abs(td) + EPS, strict=True):
            self.d[key] = v
        self.max_d = max(self.max_d, float(np.max(np.abs(td) + EPS)))

    def psi(self, source=None):
        st = self.buf.storage
        view = st.episodes.live(source)
        totals, finished = {}, {}
        for e, start, length, src, fin in zip(view.ids, view.start, view.length, view.source, view.finished,
                                              strict=True):
            totals[e] = sum(v for (ep, _), v in self.d.items() if ep == e)
            last = st.episode_slots([start], [length], [src])[-1]
            finished[e] = fin and (self.truncation == "finished" or st.columns["terminated"][last])
        F = max(totals.values())
        psi = np.zeros(st.capacity)
        lo, hi = st.slot_range(source)
        for slot in range(lo, hi):
            e, step = self._keys([slot])[0]
            C = sum(v for (ep, s), v in self.d.items() if ep == e and s <= step)
            R = C / (totals[e] if finished[e] else F)
            psi[slot] = R**OMEGA * self.d[(e, step)] ** ALPHA
        return psi

    def probabilities(self, source=None):
        psi = self.psi(source)
        return psi / psi.sum()


def make(capacity=40, use_kernels=True, truncation="finished", **kw):
    s = ReaPERSampler(priority_exponent=ALPHA, reliability_exponent=OMEGA, is_exponent=BETA, is_exponent_final=BETA,
                      truncation=truncation, use_kernels=use_kernels, **kw)
    buf = ReplayBuffer(capacity, (2,), (1,), sampler=s, seed=1)
    return buf, Model(buf, truncation)


def filled(use_kernels=True, truncation="finished", n_online=14, capacity=40, td_seed=0):
    """Offline: a terminated episode of 4 rows, a truncated one of 5, and the dataset's unfinished last one of 3
    (finished when the online phase starts). Online: episodes of 8 (truncated), one terminated at row 20, the
    last one ongoing; ``n_online`` > 28 wraps the ring of 28 slots."""
    buf, model = make(capacity, use_kernels, truncation)
    model.inserted(buf.add_offline(rows(np.arange(12), ends=(8,), terms=(3,))))
    ends = tuple(range(7, n_online - 1, 8))
    model.inserted(buf.extend(rows(np.arange(n_online), ends=ends, terms=(20,) if n_online > 21 else ())))
    if td_seed is not None:
        n = len(buf)
        td = np.random.default_rng(td_seed).normal(size=n) * 3
        buf.update(buf.gather(np.arange(n)).info, td_error=td)
        model.updated(np.arange(n), td)
    return buf, model


@pytest.mark.parametrize("use_kernels", KERNELS)
@pytest.mark.parametrize("truncation", ["finished", "ongoing"])
@pytest.mark.parametrize("n_online", [14, 45])
def test_probabilities_match_a_from_scratch_evaluation(use_kernels, truncation, n_online):
    """Finished (terminated and truncated), ongoing, the dataset's last episode, and (45 rows into a ring of 28)
    dead and half-evicted episodes."""
    buf, model = filled(use_kernels, truncation, n_online)
    np.testing.assert_allclose(buf.sampler.probabilities(), model.probabilities(), rtol=1e-10, atol=1e-15)
    # the terminal-row rule: the last row of an episode that uses S_e has reliability 1
    st = buf.storage
    view = st.episodes.live()
    s = buf.sampler
    for start, length, src in zip(view.start, view.length, view.source, strict=True):
        last = st.episode_slots([start], [length], [src])[-1:]
        if s.finished[s.slot_leaf[last[0]]]:
            np.testing.assert_allclose(s.reliability(last), 1.0, rtol=1e-12)
    # which episodes use F: the open online one, and with truncation="ongoing" every non-terminated one
    uses_F = {int(e) for e, leaf in zip(view.ids, s._leaf_of(view.ids), strict=True) if not s.finished[leaf]}
    open_id = st.episodes.is_open(1)
    if truncation == "finished":
        assert uses_F == {open_id}
    else:
        terminated = {int(st.meta["episode_id"][i]) for i in np.flatnonzero(st.columns["terminated"][: len(buf)])}
        assert uses_F == {int(e) for e in view.ids} - terminated


@pytest.mark.parametrize("use_kernels", KERNELS)
@pytest.mark.parametrize("seed,capacity,truncation", [(7, 30, "finished"), (8, 17, "ongoing"), (9, 45, "finished")])
def test_a_long_random_run_matches_the_model(use_kernels, seed, capacity, truncation):
    """Many extends (the ring wraps several times, one extend is longer than the ring) and updates, with
    duplicate indices in batches, against the from-scratch model after every step."""
    rng = np.random.default_rng(seed)
    buf, model = make(capacity=capacity, use_kernels=use_kernels, truncation=truncation)
    model.inserted(buf.add_offline(rows(np.zeros(6), ends=(2,))))
    t = 0
    for step in range(25):
        n = int(rng.integers(1, 9)) if step != 12 else capacity  # step 12: longer than the ring
        ends = tuple(int(i) for i in np.flatnonzero(rng.random(n) < 0.25))
        model.inserted(buf.extend(rows(np.arange(t, t + n), ends=ends, terms=ends[:1])))
        t += n
        b = buf.sample(6)
        td = rng.normal(size=6) * rng.uniform(0.1, 4)
        buf.update(b.info, td_error=td)
        model.updated(b.info.indices, td)  # duplicates: the last value wins in both
        np.testing.assert_allclose(buf.sampler.probabilities(), model.probabilities(), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("use_kernels", KERNELS)
def test_an_update_moves_only_its_episode_and_equals_a_recompute(use_kernels):
    buf, model = filled(use_kernels, td_seed=None)
    n = len(buf)
    td = np.random.default_rng(1).uniform(1, 2, n)
    buf.update(buf.gather(np.arange(n)).info, td_error=td)
    model.updated(np.arange(n), td)
    s = buf.sampler
    stored = np.arange(n)
    before = s._psi(stored)
    F_before = s.F
    slot = 1  # row 1 of the first offline episode (rows 0..3, terminated, not the largest total)
    buf.update(buf.gather([slot]).info, td_error=[0.3])
    model.updated([slot], [0.3])
    assert s.F == F_before
    changed = np.flatnonzero(s._psi(stored) != before)
    # rows 0..2 move (C_t / S_e changed); the terminal row keeps R = 1 and its own d
    assert set(changed.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(s._psi(stored), model.psi()[:n], rtol=1e-10)
    np.testing.assert_allclose(s.reliability(stored), [
        model.psi()[i] ** (1 / OMEGA) / model.d[k] ** (ALPHA / OMEGA) for i, k in enumerate(model._keys(stored))],
        rtol=1e-9)
    # raising the largest episode total moves F, and with it the ongoing episode only
    before = s._psi(stored)
    buf.update(buf.gather([5]).info, td_error=[100.0])
    model.updated([5], [100.0])
    assert s.F > F_before
    changed = set(np.flatnonzero(s._psi(stored) != before).tolist())
    episode_of = buf.storage.meta["episode_id"][:n]
    ongoing = set(np.flatnonzero(episode_of == buf.storage.episodes.is_open(1)).tolist())
    assert changed == set(np.flatnonzero(episode_of == episode_of[5]).tolist()) - {8} | ongoing
    np.testing.assert_allclose(s._psi(stored), model.psi()[:n], rtol=1e-10)


def test_an_update_costs_its_episode_not_the_buffer():
    """The work of an update is the suffix of the touched episodes: rows of other episodes keep their stored
    running sums bit for bit (checked on the per-slot arrays, not on timing)."""
    buf, _ = make(capacity=5000)
    buf.extend(rows(np.zeros(4000), ends=tuple(range(99, 4000, 100))))
    s = buf.sampler
    prefix, cum_u = s.prefix.copy(), s.cum_u.copy()
    buf.update(buf.gather([1250]).info, td_error=[3.0])  # episode 12 = rows 1200..1299, position 50
    moved = np.flatnonzero((s.prefix != prefix) | (s.cum_u != cum_u))
    assert moved.min() == 1250 and moved.max() == 1299


def test_new_rows_get_the_running_max_td():
    buf, model = filled()
    buf.update(buf.gather([0, 5]).info, td_error=[7.0, -2.0])
    (slot,) = buf.extend(rows([99.0]))
    assert buf.sampler.delta[slot] == pytest.approx(7.0 + EPS)


@pytest.mark.parametrize("use_kernels", KERNELS)
def test_draws_and_is_weights(use_kernels):
    buf, model = filled(use_kernels, n_online=45)
    p = model.probabilities()
    batch = buf.sample(32)
    idx = batch.info.indices
    np.testing.assert_allclose(batch.info.probability, p[idx], rtol=1e-9)
    w = (len(buf) * p[idx]) ** -BETA
    np.testing.assert_allclose(batch.info.is_weight, w / w.max(), rtol=1e-6)
    check_frequencies_with_power(buf, p)


def test_draws_inside_a_mixture_and_the_offline_part_sees_the_dataset_close():
    s = MixtureSampler(ReaPERSampler(ALPHA, OMEGA, BETA), UniformSampler())
    buf = ReplayBuffer(40, (2,), (1,), sampler=s, seed=3)
    buf.add_offline(rows(np.arange(12), ends=(3, 8)))  # the last episode (rows 9..11) is open
    off = s.offline
    assert not off.finished[off.slot_leaf[11]]
    buf.extend(rows(np.arange(10), ends=(4,)))  # the online phase starts: the dataset's last episode is finished
    model = Model(buf)
    model.inserted(np.arange(len(buf)))
    td = np.random.default_rng(0).normal(size=12) * 2
    buf.update(buf.gather(np.arange(12)).info, td_error=td)
    model.updated(np.arange(12), td)
    p_off = model.probabilities(source=0)
    np.testing.assert_allclose(off.probabilities(), p_off, rtol=1e-10, atol=1e-15)
    assert off.finished[off.slot_leaf[11]]
    check_frequencies_with_power(buf, s.probabilities(batch_size=len(buf)))


@pytest.mark.parametrize("use_kernels", KERNELS)
def test_save_load_round_trip(use_kernels, tmp_path):
    buf, _ = filled(use_kernels, n_online=45)
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    for _ in range(3):
        a, b = buf.sample(8).info, loaded.sample(8).info
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.probability, b.probability)
        buf.update(a, td_error=np.arange(8.0))
        loaded.update(b, td_error=np.arange(8.0))
        rows_ = rows(np.arange(5), ends=(2,))
        buf.extend(rows_)
        loaded.extend(rows_)
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())


def test_bad_input():
    with pytest.raises(ValueError, match="truncation"):
        ReaPERSampler(truncation="ignore")
    with pytest.raises(ValueError, match="eps"):
        ReaPERSampler(eps=0)
    buf, _ = filled()
    with pytest.raises(ValueError, match="td_error"):
        buf.update(buf.gather([0]).info, priority=[1.0])


def test_omega_zero_is_proportional_per():
    """With R^0 = 1 the priority is PER's (|delta| + eps)^alpha (Eq. 15 reduces to Schaul et al.)."""
    from relive.replay import PrioritizedSampler

    td = np.random.default_rng(4).normal(size=30)
    out = []
    for sampler in (ReaPERSampler(priority_exponent=0.6, reliability_exponent=0.0, eps=1e-6),
                    PrioritizedSampler(priority_exponent=0.6, eps=1e-6)):
        buf = ReplayBuffer(30, (2,), (1,), sampler=sampler)
        buf.extend(rows(np.arange(30), ends=(9, 19)))
        buf.update(buf.gather(np.arange(30)).info, td_error=td)
        out.append(sampler.probabilities())
    np.testing.assert_allclose(out[0], out[1], rtol=1e-12)


# -- the reference code's readings (ReaPERReferenceSampler) ----------------------------------------------------
def make_reference(capacity=40, **flags):
    from relive.replay import ReaPERReferenceSampler

    s = ReaPERReferenceSampler(priority_exponent=ALPHA, reliability_exponent=OMEGA, is_exponent=BETA,
                               is_exponent_final=BETA, **flags)
    return ReplayBuffer(capacity, (2,), (1,), sampler=s, seed=1)


def fill_like_filled(buf, td_seed=0):
    """The same rows and updates as ``filled(n_online=14)`` (the open online episode starts at row 8)."""
    buf.add_offline(rows(np.arange(12), ends=(8,), terms=(3,)))
    buf.extend(rows(np.arange(14), ends=(7,)))
    n = len(buf)
    td = np.random.default_rng(td_seed).normal(size=n) * 3
    buf.update(buf.gather(np.arange(n)).info, td_error=td)


def test_reference_sampler_with_its_switches_off_is_the_paper_sampler():
    buf = make_reference(fresh_unweighted=False, frozen_F=False, is_normalization="batch")
    fill_like_filled(buf)
    base, _ = filled(n_online=14)
    np.testing.assert_allclose(buf.sampler.probabilities(), base.sampler.probabilities(), rtol=1e-10, atol=1e-15)
    for _ in range(3):  # the same rows keep the same probabilities through further inserts and updates
        r = rows(np.arange(3))
        buf.extend(r)
        base.extend(r)
        idx = np.array([5, 20, 27, 28])
        buf.update(buf.gather(idx).info, td_error=[1.0, 2.0, 0.5, 4.0])
        base.update(base.gather(idx).info, td_error=[1.0, 2.0, 0.5, 4.0])
        np.testing.assert_allclose(buf.sampler.probabilities(), base.sampler.probabilities(), rtol=1e-10)
    check_frequencies_with_power(buf, buf.sampler.probabilities())


def test_reference_fresh_rows_skip_reliability_until_their_episode_is_updated():
    buf = make_reference(frozen_F=False)
    fill_like_filled(buf)
    s = buf.sampler
    fresh = buf.extend(rows([50.0, 51.0]))  # continue the open online episode (rows 8..13 were updated)
    # the episode was not updated since these rows arrived: no reliability factor for them, the rest keeps C/F
    np.testing.assert_allclose(s.reliability(fresh), 1.0)
    old = np.arange(20, 26)
    np.testing.assert_allclose(s.reliability(old), s.prefix[old] / s.F, rtol=1e-12)
    psi = s.max_delta**ALPHA  # Eq. 15 without R
    p = s.probabilities()
    np.testing.assert_allclose(p[fresh], psi / s._psi(np.arange(len(buf))).sum(), rtol=1e-12)
    # an update of any row of the episode ends that: every row of it now uses C_t / F
    buf.update(buf.gather([21]).info, td_error=[0.3])
    np.testing.assert_allclose(s.reliability(fresh), s.prefix[fresh] / s.F, rtol=1e-12)
    # a new episode's rows are fresh again, and a finished episode always uses S_e
    new = buf.extend(rows([60.0, 61.0, 62.0], ends=(2,)))
    np.testing.assert_allclose(s.reliability(new), s.prefix[new] / s.total[s.slot_leaf[new]], rtol=1e-12)
    more = buf.extend(rows([70.0]))
    np.testing.assert_allclose(s.reliability(more), 1.0)


def test_reference_ongoing_rows_divide_by_the_reference_codes_F_of_their_insert_time():
    """The reference code's F (a hand-worked case; d of a new row = the running max = 1 throughout until noted,
    eps = 1e-6): it starts at 1, is read when a row is stored, becomes max(F, S_e) when an episode ends, and
    after an update is the max over the stored rows of their denominators -- never the ongoing episode's running
    total (Eq. 17's live F, ``s.F``, counts it)."""
    buf = make_reference(fresh_unweighted=False)
    s = buf.sampler
    assert s.reference_F == 1.0
    # one chunk of 5 rows: episode A = slots 0, 1 (truncated at 1), then B = slots 2, 3, 4 (ongoing).
    # A's rows are stored with F = 1; A ends: S_A = 1 + 1 = 2, F = max(1, 2) = 2; B's rows, stored after A's
    # end, get F = 2. B's running totals C = 1, 2, 3, so R_B = C / 2 = 0.5, 1.0, 1.5 (R > 1 is kept), while the
    # live F = max(S_A, C_B) = 3 would give 1/3, 2/3, 1.
    buf.extend(rows(np.arange(5), ends=(1,)))
    assert s.reference_F == 2.0 and s.F == 3.0
    np.testing.assert_allclose(s.f_insert[:5], [1, 1, 2, 2, 2])
    np.testing.assert_allclose(s.reliability([0, 1, 2, 3, 4]), [0.5, 1.0, 0.5, 1.0, 1.5], rtol=1e-12)
    # an update lowers A's total: d_0 = 0.5 + 1e-6, S_A = 1.500001. F = max(S_A, B's frozen 2, 2, 2) = 2: the
    # ratchet (B's stored rows hold the old value)
    buf.update(buf.gather([0]).info, td_error=[0.5])
    assert s.reference_F == 2.0
    np.testing.assert_allclose(s.reliability([0, 1]), [0.500001 / 1.500001, 1.0], rtol=1e-12)
    # B's next row (slot 5) is stored with F = 2: C = 4, R = 4 / 2 = 2
    buf.extend(rows([13.0]))
    np.testing.assert_allclose(s.reliability([5]), [2.0], rtol=1e-12)
    # B terminates at slot 6: S_B = 5, F = max(2, 5) = 5; every row of B now uses S_B (slot 5: 4 / 5)
    buf.extend(rows([14.0], terms=(0,)))
    assert s.reference_F == 5.0
    np.testing.assert_allclose(s.reliability([2, 5, 6]), [0.2, 0.8, 1.0], rtol=1e-12)
    # with no ongoing row stored, an update can lower F: d_6 = 0.1 + 1e-6, S_B = 4.100001 = the new F
    buf.update(buf.gather([6]).info, td_error=[0.1])
    np.testing.assert_allclose(s.reference_F, 4.100001, rtol=1e-12)
    # a new episode's first row (slot 7) divides by it: C = 1, R = 1 / 4.100001
    buf.extend(rows([20.0]))
    np.testing.assert_allclose(s.reliability([7]), [1 / 4.100001], rtol=1e-12)
    # probabilities are Psi = R^omega d^alpha normalized, with these R
    r = s.reliability(np.arange(8))
    psi = r**OMEGA * s.delta[:8] ** ALPHA
    np.testing.assert_allclose(s.probabilities()[:8], psi / psi.sum(), rtol=1e-12)


def test_reference_keeps_the_first_occurrence_of_a_row_drawn_twice():
    """A finished episode of 4 rows (d = 1 each, S = 4) updated with slots [1, 1, 2], TD errors [0.5, 3, 2]:
    the reference code keeps slot 1's first value, d_1 = 0.500001, d_2 = 2.000001, and only kept values enter the
    running max (2.000001, not 3.000001). C = 1, 1.500001, 3.500002, 4.500002 = S, so R = C / 4.500002.
    ``ReaPERSampler`` keeps the last occurrence: d_1 = 3.000001, running max 3.000001, S = 7.000002."""
    idx, td = np.array([1, 1, 2]), np.array([0.5, 3.0, 2.0])
    ref = make_reference()
    ref.extend(rows(np.arange(4), ends=(3,)))
    ref.update(ref.gather(idx).info, td_error=td)
    s = ref.sampler
    np.testing.assert_allclose(s.delta[:4], [1.0, 0.500001, 2.000001, 1.0], rtol=1e-12)
    assert s.max_delta == pytest.approx(2.000001, rel=1e-12)
    np.testing.assert_allclose(s.reliability(np.arange(4)), np.array([1.0, 1.500001, 3.500002, 4.500002]) / 4.500002,
                               rtol=1e-12)
    assert s.reference_F == pytest.approx(4.500002, rel=1e-12)
    paper, _ = make()
    paper.extend(rows(np.arange(4), ends=(3,)))
    paper.update(paper.gather(idx).info, td_error=td)
    np.testing.assert_allclose(paper.sampler.delta[:4], [1.0, 3.000001, 2.000001, 1.0], rtol=1e-12)
    assert paper.sampler.max_delta == pytest.approx(3.000001, rel=1e-12)


def test_reference_is_weights_divide_by_the_least_likely_row():
    buf = make_reference()
    fill_like_filled(buf)
    p = buf.sampler.probabilities()
    stored = p[: len(buf)]
    b = buf.sample(20).info
    np.testing.assert_allclose(b.probability, p[b.indices], rtol=1e-12)
    np.testing.assert_allclose(b.is_weight, (stored.min() / p[b.indices]) ** BETA, rtol=1e-6)
    assert b.is_weight.max() <= 1.0
    check_frequencies_with_power(buf, p)


def test_reference_save_load_round_trip(tmp_path):
    buf = make_reference()
    fill_like_filled(buf)
    buf.extend(rows([50.0, 51.0]))
    buf.save(tmp_path / "c")
    loaded = ReplayBuffer.load(tmp_path / "c")
    assert type(loaded.sampler).__name__ == "ReaPERReferenceSampler"
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    for b in (buf, loaded):
        b.extend(rows([52.0]))
        b.update(b.gather([3, 21]).info, td_error=[2.0, 0.1])
    np.testing.assert_array_equal(loaded.sampler.probabilities(), buf.sampler.probabilities())
    with pytest.raises(ValueError, match="is_normalization"):
        make_reference(is_normalization="max")


@pytest.mark.parametrize("use_kernels", KERNELS)
def test_a_write_longer_than_the_ring_keeps_the_evicted_sums_of_the_last_evicted_row(use_kernels):
    """One episode of 4 rows in a ring of 4, then 5 more rows: the first new row is dropped and the write starts
    one slot past the oldest row, so the last row evicted in time (step 3) is not the last slot written; the
    survivors' C must start from C_3 (found by issue 16's stream tests; the sums took step 0's)."""
    buf, model = make(capacity=4, use_kernels=use_kernels)
    model.inserted(buf.extend(rows(np.arange(4))))
    model.inserted(buf.extend(rows(np.arange(4, 9))))
    np.testing.assert_allclose(buf.sampler.probabilities(), model.probabilities(), rtol=1e-12)
    np.testing.assert_allclose(np.sort(buf.sampler.prefix[:4]), [5, 6, 7, 8])  # d = 1 each; step 4 never stored
