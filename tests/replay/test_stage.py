"""Stage (relive.replay.stage): a staged commit stores exactly what ``extend`` of the same rows stores -- rows, episode
records, clocks, sampler state, later batches -- through ring wrap-around, episode ends anywhere in a commit, offline
rows before, several streams, samplers with insert checks, refused rows (NaN) and every backend; and it refuses bad
input with a message."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer, UniformSampler
from relive.replay.storage import _write_kernels
from relive.testing import random_transitions

SAMPLERS = {
    "uniform": lambda: UniformSampler(),
    "per": lambda: PrioritizedSampler(),
    "mixture": lambda: MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.25),  # insert checks
}


def assert_same(a, b, where="state"):
    """Two nested states (dicts, lists, tuples, arrays, numbers) are equal, arrays bit for bit with their dtypes."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def fill(stage, rows, i, k):
    for name, column in stage.columns.items():
        column[i, :k] = rows[name]


@settings(max_examples=60, deadline=None)
@given(data=st.data())
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_a_commit_stores_what_extend_of_the_same_rows_stores(data):
    """Random commits (1-9 rows each, episode ends anywhere, now and then a NaN) into a small ring that wraps, one or
    two streams, with or without offline rows first, under uniform, PER and a mixture: after every commit the whole
    state of the staged buffer, of one written by extend (its short path for a few rows of one stream) and of one
    written by extend's general path are equal, and so are their next batches."""
    kind = data.draw(st.sampled_from(sorted(SAMPLERS)), label="sampler")
    capacity = data.draw(st.integers(20, 48), label="capacity")
    num_streams = data.draw(st.integers(1, 2), label="streams")
    offline = data.draw(st.integers(0 if kind != "mixture" else 1, 8), label="offline rows")
    bufs = [ReplayBuffer(capacity, (3,), (2,), sampler=SAMPLERS[kind](), seed=0) for _ in range(3)]
    if offline:
        rows = random_transitions(offline, 3, 2, rng=1, episode_length=3)
        for buf in bufs:
            buf.add_offline(rows)
    extended, staged, general = bufs
    general.storage._write_one_lane = lambda *args: None  # every write of this one takes the general path
    stage = staged.stage(streams=num_streams, rows=9)
    for step in range(data.draw(st.integers(1, 14), label="commits")):
        k = data.draw(st.integers(1, 9), label="rows")
        per_stream = []
        for i in range(num_streams):
            rows = random_transitions(k, 3, 2, rng=step * 10 + i, episode_length=10**6)
            rows["terminated"] = np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
            rows["truncated"] = np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
            if data.draw(st.integers(0, 9), label="nan?") == 0:
                rows["obs"][data.draw(st.integers(0, k - 1)), 1] = np.nan
            per_stream.append(rows)
            fill(stage, rows, i, k)
        errors, results = [], []
        for buf in (general, extended, staged):
            try:
                if buf is not staged:
                    slots = np.array([buf.extend(r, stream=i) for i, r in enumerate(per_stream)])
                else:
                    slots = stage.commit(k)
                results.append(slots.reshape(num_streams, k))
                errors.append(None)
            except ValueError as e:
                errors.append(str(e))
        assert errors[0] == errors[1] == errors[2]
        if errors[0] is None:
            np.testing.assert_array_equal(results[0], results[1])
            np.testing.assert_array_equal(results[0], results[2])
        assert_same(general.state_dict(), extended.state_dict())
        assert_same(general.state_dict(), staged.state_dict())
        batches = []
        for buf in (general, extended, staged):
            try:
                batch = buf.sample(min(5, len(buf)) or 1)
                batches.append((batch.obs, batch.reward, batch.terminated, batch.info.indices, batch.info.generation))
            except ValueError as e:  # (nothing stored yet, or a mixture with an empty part)
                batches.append(str(e))
        assert_same(batches[0], batches[1])
        assert_same(batches[0], batches[2])


def test_a_commit_takes_the_compiled_path_in_the_common_case(monkeypatch):
    """One stream, rows in consecutive slots: the commit is the compiled call, not extend (the test above would also
    pass if every commit fell back to extend)."""
    if not _write_kernels.AVAILABLE:
        pytest.skip("numba is not installed: every commit is an extend")
    buf = ReplayBuffer(64, (3,), (2,), seed=0)
    stage = buf.stage(rows=8)
    fill(stage, random_transitions(8, 3, 2, rng=0, episode_length=3), 0, 8)
    calls = []
    extend = buf.extend
    monkeypatch.setattr(buf, "extend", lambda *a, **k: (calls.append(a), extend(*a, **k))[1])
    stage.commit(2)  # the first write of the stream makes its lane: extend
    assert len(calls) == 1
    stage.commit(8)
    stage.commit(5)
    assert len(calls) == 1


def test_rows_extend_refuses_are_refused_by_a_commit_with_the_same_message_and_nothing_written():
    buf = ReplayBuffer(32, (3,), (2,), seed=0)
    stage = buf.stage(rows=4)
    fill(stage, random_transitions(4, 3, 2, rng=0), 0, 4)
    stage.commit(4)
    before = buf.state_dict()
    stage.columns["reward"][0, 2] = np.inf
    with pytest.raises(ValueError, match=r"column 'reward' row 2: value inf is not finite"):
        stage.commit(3)
    assert_same(before, buf.state_dict())
    stage.commit(2)  # rows 0-1 are finite
    assert buf.storage.num_rows == 6


@pytest.mark.parametrize("path", ["compiled", "two streams", "no numba"])
@pytest.mark.parametrize("column", ["terminated", "truncated"])
def test_a_flag_holding_a_byte_other_than_0_or_1_is_refused_naming_column_and_row(path, column, monkeypatch):
    """Issue 44: a bool column written through a byte view holding 7 was stored as-is (neither False nor a clean
    True); refused, as extend refuses a flag other than 0 / 1, with nothing written for that stream."""
    if path == "no numba":
        monkeypatch.setattr(_write_kernels, "AVAILABLE", False)
    streams = 2 if path == "two streams" else 1
    buf = ReplayBuffer(32, (3,), (2,), seed=0)
    stage = buf.stage(streams=streams, rows=4)
    for i in range(streams):
        fill(stage, random_transitions(4, 3, 2, rng=i), i, 4)
    stage.commit(4)  # (the first commit makes the lanes: the next one takes the compiled path where it can)
    before = buf.state_dict()
    stage.columns[column].view(np.uint8)[streams - 1, 2] = 7
    with pytest.raises(ValueError, match=f"stage column '{column}' stream {streams - 1} row 2: expected a boolean "
                                         "flag .* got byte 7"):
        stage.commit(3)
    if streams == 1:
        assert_same(before, buf.state_dict())
    assert not (buf.storage.columns[column].view(np.uint8) > 1).any()
    stage.commit(2)  # rows 0-1 are fine
    assert buf.storage.num_rows == 4 * streams + 2 * streams + (3 if streams == 2 else 0)


@pytest.mark.parametrize("backend", ["memmap", "torch", "no numba"])
def test_a_commit_equals_extend_on_every_backend(backend, tmp_path, monkeypatch):
    if backend == "no numba":
        monkeypatch.setattr(_write_kernels, "AVAILABLE", False)
        kw = {}
    else:
        kw = {"backend": backend} | ({"directory": tmp_path / "a"} if backend == "memmap" else {})
    kw_b = dict(kw) | ({"directory": tmp_path / "b"} if backend == "memmap" else {})
    extended, staged = ReplayBuffer(16, (3,), (2,), seed=0, **kw), ReplayBuffer(16, (3,), (2,), seed=0, **kw_b)
    stage = staged.stage(rows=6)
    for step in range(9):
        rows = random_transitions(6, 3, 2, rng=step, episode_length=5, start_step=6 * step)
        extended.extend(rows)
        fill(stage, rows, 0, 6)
        stage.commit(6)
    a, b = extended.state_dict(), staged.state_dict()
    if backend == "memmap":  # (each refers to its own directory: its columns compared here)
        for state in (a, b):
            state["config"]["storage"].pop("directory"), state["storage"].pop("memmap")  # (its path, a token)
        for name, column in extended.storage.columns.items():
            np.testing.assert_array_equal(column, staged.storage.columns[name])
    assert_same(a, b)


def test_a_stage_refuses_bad_input_with_a_message():
    buf = ReplayBuffer(16, (3,), (2,), seed=0)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="rows must be a positive integer"):
            buf.stage(rows=bad)
    with pytest.raises(ValueError, match="streams must be a positive number"):
        buf.stage(streams=0)
    with pytest.raises(ValueError, match="distinct stream ids"):
        buf.stage(streams=[1, 1])
    stage = buf.stage(streams=[3, 7], rows=4)
    assert stage.columns["obs"].shape == (2, 4, 3) and stage.columns["action"].dtype == np.float32
    for bad in (5, -1, 1.0, True):
        with pytest.raises(ValueError, match=r"k must be an integer number of staged rows in \[0, 4\]"):
            stage.commit(bad)
    assert stage.commit(0).shape == (2, 0) and len(buf) == 0
    dict_buf = ReplayBuffer(16, {"image": (2, 2), "state": (3,)}, (2,), seed=0)
    with pytest.raises(ValueError, match="dict observations"):
        dict_buf.stage()
