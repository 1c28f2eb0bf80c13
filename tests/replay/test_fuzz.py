"""Fuzzing the public buffer API with a hypothesis state machine, for every sampler (issue 14).

Each step is one public call: offline / online inserts (with episode ends, extreme finite values), inserts that must
be refused (NaN, inf, values beyond the column's dtype, bad flags, shapes, columns), sample + update with extreme
finite signals, updates that may be refused, ARB refreshes with a random score function, save / load round trips,
saves killed half-way, loads while another thread saves, and copied checkpoints. After every step:
``probabilities()`` is finite, >= 0, sums to 1 over the stored rows and is 0 elsewhere; the sampler state holds no
NaN. A refused call leaves the buffer exactly as it was (the whole ``state_dict`` compared); a loaded buffer draws
the same next batch as the original; a save killed at any file keeps the last complete checkpoint loadable.

The default run is short (a few examples per sampler); ``-m slow`` runs a longer one (about a minute per sampler
on 2 idle cores). Both are derandomized, so CI sees the same examples each time; for a wider search, set
``RELIVE_FUZZ_SEARCH=N``: the long run then draws N x its examples with hypothesis's random seed (a failure prints
the ``@reproduce_failure`` blob to replay it).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import relive.replay.checkpoint as ckpt
from relive.replay import (
    ARBSampler,
    BERBSampler,
    MixtureSampler,
    PrioritizedSampler,
    ReaPERReferenceSampler,
    ReaPERSampler,
    ReplayBuffer,
    UniformSampler,
)
from relive.replay.storage import consistency

OBS, ACT = (3,), (2,)
EXTRA = {"count": ((), np.int16)}

SAMPLERS = {
    "uniform": UniformSampler,
    "per": lambda: PrioritizedSampler(priority_exponent=1.0, is_exponent=0.4, is_exponent_final=1.0,
                                      is_anneal_samples=20),
    "mixture_uniform_per": lambda: MixtureSampler(UniformSampler(), PrioritizedSampler(), offline_fraction=0.3),
    "mixture_per_reaper": lambda: MixtureSampler(PrioritizedSampler(), ReaPERSampler(), offline_fraction=0.5),
    "arb": lambda: ARBSampler(temperature=1.0, is_correction=True),
    "arb_amortized": lambda: ARBSampler(temperature=0.5, level="transition", amortized_rows_per_refresh=5),
    "arb_cold": lambda: ARBSampler(temperature=0.01),  # exp(L / lambda) underflows
    "reaper": ReaPERSampler,
    "reaper_reference": ReaPERReferenceSampler,
    "berb": lambda: BERBSampler(hidden=(8,), ratio_batch_size=8, first_chunk_rows=5),
}

finite = st.one_of(st.sampled_from([0.0, 1.0, -1.0, 1e-300, -1e-300, 5e-324, 1e30, -1e30, 3e38, -3e38]),
                   st.floats(-1e6, 1e6, allow_nan=False))
signal_value = st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 1.0, 1e20, 1e200, 1e308, -1e308]),
                         st.floats(-1e3, 1e3, allow_nan=False))


def _rows(rng: np.random.Generator, n: int, episode_length: int, start: int, extreme: float | None = None) -> dict:
    t = np.arange(start, start + n)
    rows = {
        "obs": rng.normal(size=(n, *OBS)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, *ACT)).astype(np.float32),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, *OBS)).astype(np.float32),
        "terminated": (t % (2 * episode_length + 1)) == 2 * episode_length,
        "truncated": (t % episode_length) == episode_length - 1,
        "count": rng.integers(-32768, 32768, size=n).astype(np.int64),
    }
    rows["truncated"] &= ~rows["terminated"]
    if extreme is not None and n:  # an extreme value that fits float32: stored as is
        rows[str(rng.choice(["obs", "reward", "next_obs"]))].flat[int(rng.integers(n))] = extreme
    return rows


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype
                and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _float_leaves(tree, path=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _float_leaves(v, f"{path}/{k}")
    elif isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
        yield path, tree
    elif isinstance(tree, float):
        yield path, np.array([tree])


class BufferMachine(RuleBasedStateMachine):
    kind = "uniform"

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="relive-fuzz-"))
        self.path = self.dir / "ckpt"
        self.saved = None  # (state snapshot, next batch of it) of the last complete save
        self.step = 0  # logical online clock for the episode pattern
        self.online = False

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- setup ---------------------------------------------------------------------------------------------
    @initialize(capacity=st.integers(4, 48), seed=st.integers(0, 2**16))
    def build(self, capacity, seed):
        self.rng = np.random.default_rng(seed)
        self.buf = ReplayBuffer(capacity, OBS, ACT, sampler=SAMPLERS[self.kind](), seed=seed, extra_columns=EXTRA)

    # -- writes that must succeed ----------------------------------------------------------------------------
    @precondition(lambda self: not self.online)
    @rule(n=st.integers(0, 12), episode_length=st.integers(1, 6), extreme=st.none() | finite)
    def add_offline(self, n, episode_length, extreme):
        n = min(n, self.buf.capacity - len(self.buf) - 1)  # leave room for the online ring
        if n < 0:
            return
        self.buf.add_offline(_rows(self.rng, n, episode_length, self.step, extreme))
        self.step += n

    @rule(n=st.integers(1, 20), episode_length=st.integers(1, 6), extreme=st.none() | finite)
    def extend(self, n, episode_length, extreme):
        if self.buf.num_offline >= self.buf.capacity:
            return
        self.buf.extend(_rows(self.rng, n, episode_length, self.step, extreme))
        self.step += n
        self.online = True

    # -- writes that must be refused, changing nothing --------------------------------------------------------
    @rule(problem=st.sampled_from(["nan_reward", "inf_obs", "beyond_float32", "int16_high", "int16_low", "flag_2",
                                   "missing", "unknown", "shape", "offline_after_online", "offline_overflow"]),
          n=st.integers(1, 6), row=st.integers(0, 5))
    def refused_insert(self, problem, n, row):
        rows = _rows(self.rng, n, 3, self.step)
        row = row % n
        online = True
        if problem == "nan_reward":
            rows["reward"] = rows["reward"].astype(np.float64)
            rows["reward"][row] = np.nan
        elif problem == "inf_obs":
            rows["obs"][row, 0] = np.inf
        elif problem == "beyond_float32":
            rows["next_obs"] = rows["next_obs"].astype(np.float64)
            rows["next_obs"][row, 1] = 1e300
        elif problem == "int16_high":
            rows["count"][row] = 2**15
        elif problem == "int16_low":
            rows["count"][row] = -(2**15) - 1
        elif problem == "flag_2":
            rows["terminated"] = rows["terminated"].astype(np.int64)
            rows["terminated"][row] = 2
        elif problem == "missing":
            del rows["count"]
        elif problem == "unknown":
            rows["bonus"] = np.zeros(n)
        elif problem == "shape":
            rows["action"] = np.zeros((n, 3), np.float32)
        elif problem == "offline_after_online":
            if not self.online:
                return
            online = False
        elif problem == "offline_overflow":
            if self.online:
                return
            rows = _rows(self.rng, self.buf.capacity - len(self.buf) + 1, 3, self.step)
            online = False
        before = self._snapshot()
        with pytest.raises(ValueError):
            (self.buf.extend if online else self.buf.add_offline)(rows)
        assert _same(before, self._snapshot()), f"refused {problem} changed the buffer"

    # -- sampling and feedback ---------------------------------------------------------------------------------
    @precondition(lambda self: len(self.buf) > 0)
    @rule(batch=st.integers(1, 32), values=st.lists(signal_value, min_size=1, max_size=32),
          with_priority=st.booleans())
    def sample_and_update(self, batch, values, with_priority):
        b = self.buf.sample(min(batch, len(self.buf)))
        info = b.info
        assert np.isfinite(info.probability).all() and (info.probability > 0).all()
        assert np.isfinite(info.is_weight).all() and (info.is_weight >= 0).all() and (info.is_weight <= 1).all()
        k = info.indices.size
        td = np.resize(np.asarray(values, np.float64), k)
        signals = {"td_error": td}
        if with_priority:
            signals["priority"] = np.abs(td)
        self.buf.update(info, **signals)

    @precondition(lambda self: len(self.buf) > 0)
    @rule(problem=st.sampled_from(["nan", "inf", "negative_priority", "priority_only", "wrong_shape", "strings"]),
          batch=st.integers(1, 16))
    def maybe_refused_update(self, problem, batch):
        info = self.buf.sample(min(batch, len(self.buf))).info
        k = info.indices.size
        signals = {
            "nan": {"td_error": np.where(np.arange(k) == k - 1, np.nan, 1.0)},
            "inf": {"td_error": np.full(k, -np.inf)},
            "negative_priority": {"priority": np.where(np.arange(k) == 0, -1e-300, 1.0)},
            "priority_only": {"priority": np.full(k, 1e308)},  # PER takes it; ReaPER needs td_error
            "wrong_shape": {"td_error": np.ones(k + 1)},
            "strings": {"td_error": np.array(["x"] * k)},
        }[problem]
        before = self._snapshot()
        try:
            self.buf.update(info, **signals)
        except ValueError:
            assert _same(before, self._snapshot()), f"refused update ({problem}) changed the buffer"
            return
        assert problem == "priority_only", f"update with {problem} was accepted"

    @precondition(lambda self: len(self.buf) > 0)
    @rule(scale=st.sampled_from([0.0, 1.0, 30.0, 1e300]), seed=st.integers(0, 100))
    def refresh(self, scale, seed):
        rng = np.random.default_rng(seed)

        def score_fn(obs, action):
            return rng.normal(size=len(obs)) * scale

        self.buf.refresh(score_fn, chunk_size=7)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    @precondition(lambda self: len(self.buf) > 0)
    @rule(batch=st.integers(1, 16))
    def save_load_round_trip(self, batch):
        self.buf.save(self.path)
        snapshot = self._snapshot()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = ReplayBuffer.load(self.path)
        bs = min(batch, len(self.buf))
        self.saved = (snapshot, loaded.sample(bs).info)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = ReplayBuffer.load(self.path)
        a, b = self.buf.sample(bs).info, loaded.sample(bs).info
        for field in ("indices", "probability", "is_weight"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        np.testing.assert_array_equal(self.buf.sampler.probabilities(), loaded.sampler.probabilities())
        self.buf = loaded  # go on with the loaded one (same state)

    @precondition(lambda self: len(self.buf) > 0 and self.buf.num_offline < self.buf.capacity)
    @rule(loads=st.integers(1, 6), n=st.integers(1, 5))
    def load_while_saving(self, loads, n):
        """Another thread saves two different buffers in turn over the checkpoint while this one loads it: every
        load is one of the two saves, whole, or a CheckpointError (issue 27 item 7)."""
        other = ReplayBuffer.from_state_dict(copy.deepcopy(self.buf.state_dict()))
        other.extend(_rows(self.rng, n, 3, self.step))
        snaps = [self._snapshot(), self._snapshot(other)]
        self.buf.save(self.path)
        stop = threading.Event()
        failures = []

        def saver():
            try:
                i = 0
                while not stop.is_set() and i < 10:
                    (other if i % 2 == 0 else self.buf).save(self.path)
                    i += 1
            except BaseException as e:
                failures.append(e)

        thread = threading.Thread(target=saver, daemon=True)
        thread.start()
        try:
            for _ in range(loads):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        loaded = ReplayBuffer.load(self.path)
                except ckpt.CheckpointError:
                    continue
                got = self._snapshot(loaded)
                assert _same(got, snaps[0]) or _same(got, snaps[1]), "a load mixed two saves"
        finally:
            stop.set()
            thread.join(timeout=60)
        assert not failures, failures
        self.buf.save(self.path)
        self.saved = (snaps[0], None)

    @precondition(lambda self: self.saved is not None)
    @rule()
    def copied_checkpoint(self):
        """A copied checkpoint directory loads as the original, and the original still does (issue 27 item 8)."""
        copy_path = self.dir / "copied"
        shutil.rmtree(copy_path, ignore_errors=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            original = self._snapshot(ReplayBuffer.load(self.path))
            shutil.copytree(self.path if (self.path / "MANIFEST.json").exists() else
                            self.path.with_name(self.path.name + ".previous"), copy_path)
            assert _same(self._snapshot(ReplayBuffer.load(copy_path)), original)
            assert _same(self._snapshot(ReplayBuffer.load(self.path)), original)
        shutil.rmtree(copy_path)

    @precondition(lambda self: len(self.buf) > 0)
    @rule(stage=st.sampled_from(["write", "swap"]), at=st.integers(1, 40))
    def killed_save(self, stage, at):
        calls = [0]
        target = (np, "save") if stage == "write" else (ckpt.os, "replace")
        real = getattr(*target)

        def dies(*args, **kwargs):
            calls[0] += 1
            if calls[0] == at:
                raise KeyboardInterrupt("killed")  # a kill: no clean-up runs
            return real(*args, **kwargs)

        snapshot = self._snapshot()
        setattr(*target, dies)
        try:
            self.buf.save(self.path)
            completed = True
        except KeyboardInterrupt:
            completed = False
        finally:
            setattr(*target, real)
        if completed:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.saved = (snapshot, ReplayBuffer.load(self.path).sample(1).info)
            return
        if self.saved is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = ReplayBuffer.load(self.path)  # the last complete checkpoint (maybe from .previous)
        assert _same(self.saved[0], self._snapshot(loaded)), "a killed save lost the previous checkpoint"

    # -- invariants -------------------------------------------------------------------------------------------
    @invariant()
    def distribution_is_valid(self):
        if not hasattr(self, "buf") or len(self.buf) == 0:
            return
        s = self.buf.sampler
        n = len(self.buf)
        p = s.probabilities()
        assert p.shape == (self.buf.capacity,)
        assert np.isfinite(p).all() and (p >= 0).all(), f"{self.kind}: probabilities not finite / negative"
        assert not p[n:].any(), f"{self.kind}: probability on unstored slots"
        assert p[:n].sum() == pytest.approx(1.0, rel=1e-6), f"{self.kind}: probabilities sum to {p[:n].sum()}"

    @invariant()
    def state_has_no_nan(self):
        if not hasattr(self, "buf"):
            return
        state = self.buf.sampler.state_dict()
        for path, arr in _float_leaves(state):
            if path.endswith(("/score", "last_ratio_loss")) or "/alias" in path:  # nan = "not scored yet"
                continue
            assert not np.isnan(arr).any(), f"{self.kind}: NaN in sampler state {path}"

    @invariant()
    def storage_is_consistent(self):
        if not hasattr(self, "buf"):
            return
        st_ = self.buf.storage
        assert st_.size == st_.num_offline + st_.num_online <= st_.capacity
        assert (st_.meta["generation"][: st_.size] >= 1).all()
        consistency.check_loaded(st_)  # what a loaded checkpoint is held to, every live buffer holds
        assert not any(p.name.endswith(".partial") and not (p / "MANIFEST.json").exists() and
                       not (p / ckpt.PARTIAL_MARKER).exists() for p in self.dir.iterdir())

    def _snapshot(self, buf=None) -> dict:
        buf = self.buf if buf is None else buf
        return copy.deepcopy(buf.state_dict())


def _run(kind: str, examples: int, steps: int, derandomize: bool) -> None:
    machine = type(f"BufferMachine_{kind}", (BufferMachine,), {"kind": kind})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, derandomize=derandomize, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]))


@pytest.mark.parametrize("kind", list(SAMPLERS))
@pytest.mark.slow  # >= 5 s on 2 cores: the slow stage (make test-slow) runs it
def test_fuzz_buffer_api(kind):
    _run(kind, examples=4, steps=15, derandomize=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_fuzz_buffer_api_long(kind):
    search = int(os.environ.get("RELIVE_FUZZ_SEARCH", "0"))  # 0: CI's fixed examples; N: an N-times wider random search
    _run(kind, examples=20 * max(search, 1), steps=30, derandomize=not search)
