"""Batch.to_jax (issue 49 item 2): the values of every column, dict observations and extras, flags as bool, the
dtype cast, and zero-copy where the docstring promises it (a 64-byte aligned, C-contiguous, writeable column of a
dtype JAX keeps) -- checked on the buffer pointer, not on timings."""

from __future__ import annotations

import numpy as np
import pytest

from relive.replay import MixtureSampler, PrioritizedSampler, ReplayBuffer
from relive.types import Batch, SampleInfo, as_jax

jax = pytest.importorskip("jax", reason="jax is not installed (the extra \"jax\": pip install -c constraints.txt "
                                        "-e \".[jax]\")")
jnp = jax.numpy


def aligned(values, align=64, offset=0) -> np.ndarray:
    """A copy of ``values`` whose data starts ``offset`` bytes past a multiple of ``align`` bytes."""
    values = np.asarray(values)
    raw = np.empty(values.nbytes + 2 * align, np.uint8)
    start = (-raw.ctypes.data) % align + offset
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    assert out.ctypes.data % align == offset
    return out


def shares(a: np.ndarray, j) -> bool:
    return j.unsafe_buffer_pointer() == a.ctypes.data and np.shares_memory(np.asarray(j), a)


def hand_batch(**over) -> Batch:
    n = 4
    cols = dict(obs=aligned(np.arange(12, dtype=np.float32).reshape(n, 3)),
                action=aligned(np.array([[0.5], [-1.0], [0.25], [1.0]], np.float32)),
                reward=aligned(np.array([1.0, 2.0, 3.0, 4.0], np.float32)),
                next_obs=aligned(np.arange(12, 24, dtype=np.float32).reshape(n, 3)),
                terminated=aligned(np.array([False, True, False, False])),
                truncated=aligned(np.array([False, False, False, True])))
    info = SampleInfo(indices=np.array([3, 1, 4, 1]), generation=np.zeros(n, np.int64),
                      probability=np.full(n, 0.25), is_weight=aligned(np.array([1.0, 0.5, 0.25, 1.0], np.float32)),
                      source=np.ones(n, np.int8), hints={"beta": 0.3, "c": aligned(np.arange(n, dtype=np.float32))})
    return Batch(**(cols | over), info=info, extras={"mc_return": aligned(np.array([9.0, 8.0, 7.0, 6.0], np.float32))})


def test_to_jax_values_and_zero_copy_of_aligned_columns():
    b = hand_batch()
    j = b.to_jax()
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "mc_return"):
        x, y = getattr(b, name), getattr(j, name)
        assert isinstance(y, jax.Array) and y.dtype == x.dtype and y.shape == x.shape, name
        np.testing.assert_array_equal(np.asarray(y), x)
        assert shares(x, y), f"{name}: an aligned C-contiguous column is promised zero-copy"
    assert j.terminated.dtype == jnp.bool_ and j.extras["mc_return"] is j.mc_return
    assert shares(b.info.is_weight, j.info.is_weight) and shares(b.info.hints["c"], j.info.hints["c"])
    assert j.info.hints["beta"] == 0.3 and j.info.indices is b.info.indices  # (info stays NumPy but for is_weight)
    b.reward[0] = 42.0  # shared: the JAX array sees the write (why the docstring says not to write afterwards)
    assert float(j.reward[0]) == 42.0
    del b
    import gc
    gc.collect()
    assert float(j.obs.sum()) == float(np.arange(12).sum())  # the JAX array keeps the NumPy memory alive


def test_to_jax_copies_where_the_layout_does_not_allow_sharing_and_keeps_values():
    obs = aligned(np.arange(24, dtype=np.float32).reshape(4, 6))
    readonly = aligned(np.array([1.0, 2.0, 3.0, 4.0], np.float32))
    readonly.flags.writeable = False
    unaligned = aligned(np.arange(12, dtype=np.float32).reshape(4, 3), offset=16)  # NumPy's usual 16-byte alignment
    float_flags = aligned(np.array([0.0, 1.0, 0.0, 1.0], np.float32))
    b = hand_batch(obs=obs[:, ::2], reward=readonly, next_obs=unaligned, terminated=float_flags)
    j = b.to_jax()
    np.testing.assert_array_equal(np.asarray(j.obs), obs[:, ::2])  # a strided view: copied (DLPack takes none)
    np.testing.assert_array_equal(np.asarray(j.reward), readonly)
    np.testing.assert_array_equal(np.asarray(j.next_obs), unaligned)
    np.testing.assert_array_equal(np.asarray(j.terminated), [False, True, False, True])
    assert j.terminated.dtype == jnp.bool_
    assert not np.shares_memory(np.asarray(j.next_obs), unaligned)  # (so a later write cannot reach it)
    assert shares(b.action, j.action)  # the other columns still shared


def test_to_jax_dtype_casts_float_columns_only():
    b = hand_batch(obs=aligned(np.arange(12, dtype=np.uint8).reshape(4, 3)))
    j = b.to_jax(dtype=jnp.bfloat16)
    assert j.reward.dtype == jnp.bfloat16 and j.action.dtype == jnp.bfloat16 and j.mc_return.dtype == jnp.bfloat16
    assert j.obs.dtype == jnp.uint8 and j.terminated.dtype == jnp.bool_  # images and flags are not floats
    np.testing.assert_array_equal(np.asarray(j.reward, dtype=np.float32), [1, 2, 3, 4])
    assert shares(b.obs, j.obs)


def test_to_jax_of_sampled_batches_dict_obs_nstep_and_device():
    obs = {"image": ((2, 3), np.uint8), "state": (2,)}
    buf = ReplayBuffer(30, obs, (1,), sampler=MixtureSampler(offline_fraction=0.5), seed=4, n_step=3)
    rng = np.random.default_rng(0)

    def rows(n, t0):
        return {"obs": {"image": rng.integers(0, 256, (n, 2, 3), dtype=np.uint8),
                        "state": np.arange(t0, t0 + n, dtype=np.float32)[:, None] * [1, -1]},
                "next_obs": {"image": rng.integers(0, 256, (n, 2, 3), dtype=np.uint8),
                             "state": np.arange(t0 + 1, t0 + n + 1, dtype=np.float32)[:, None] * [1, -1]},
                "action": rng.normal(size=(n, 1)).astype(np.float32), "reward": np.ones(n, np.float32),
                "terminated": np.arange(n) % 7 == 6, "truncated": np.zeros(n, bool)}

    buf.add_offline(rows(10, 0))
    buf.extend(rows(25, 100))
    b = buf.sample(16)
    j = b.to_jax(device=jax.devices("cpu")[0])
    for k in ("image", "state"):
        np.testing.assert_array_equal(np.asarray(j.obs[k]), b.obs[k])
        np.testing.assert_array_equal(np.asarray(j.next_obs[k]), b.next_obs[k])
    assert j.obs["image"].dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(j.discount), b.discount)
    np.testing.assert_array_equal(np.asarray(j.reward), b.reward)
    np.testing.assert_array_equal(np.asarray(j.terminated), b.terminated)
    assert list(j.obs["state"].devices()) == jax.devices("cpu")

    per = ReplayBuffer(64, (3,), (2,), sampler=PrioritizedSampler(), seed=1)
    per.extend({"obs": np.ones((40, 3), np.float32), "action": np.zeros((40, 2), np.float32),
                "reward": np.arange(40, dtype=np.float32), "next_obs": np.ones((40, 3), np.float32),
                "terminated": np.zeros(40, bool), "truncated": np.zeros(40, bool)})
    s = per.sample(8)
    js = s.to_jax()
    np.testing.assert_allclose(np.asarray(js.info.is_weight), s.info.is_weight.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(js.reward), s.reward)


def test_as_jax_scalars_and_jax_arrays():
    assert float(as_jax(2.5)) == 2.5
    x = jnp.arange(3)
    assert as_jax(x) is x or np.array_equal(np.asarray(as_jax(x)), [0, 1, 2])


def test_pack_unpack_inside_jit_equals_to_jax():
    """Batch.pack + JaxLayout.unpack (the one-buffer hand-over): inside a jitted function every column equals what
    to_jax gives, values and dtypes, dict observations and extras included; a NumPy buffer goes straight into jit."""
    from functools import partial

    b = hand_batch(obs={"image": np.arange(24, dtype=np.uint8).reshape(4, 2, 3),
                        "state": np.arange(8, dtype=np.float64).reshape(4, 2)})
    data, layout = b.pack()

    @partial(jax.jit, static_argnums=1)
    def unpack(d, lay):
        return lay.unpack(d)

    cols = unpack(data, layout)
    j = b.to_jax()
    for name in ("action", "reward", "next_obs", "terminated", "truncated", "mc_return"):
        assert cols[name].dtype == getattr(j, name).dtype and cols[name].shape == getattr(j, name).shape, name
        np.testing.assert_array_equal(np.asarray(cols[name]), np.asarray(getattr(j, name)), err_msg=name)
    for key in ("image", "state"):
        assert cols["obs"][key].dtype == j.obs[key].dtype, key  # (float64 -> float32 as to_jax without x64)
        np.testing.assert_array_equal(np.asarray(cols["obs"][key]), np.asarray(j.obs[key]))
    np.testing.assert_array_equal(np.asarray(cols["is_weight"]), np.asarray(j.info.is_weight))
    eager = layout.unpack(jnp.asarray(data))  # (also outside jit)
    np.testing.assert_array_equal(np.asarray(eager["reward"]), b.reward)
    with pytest.raises(ValueError, match="packed batch of"):
        layout.unpack(jnp.zeros(layout.nbytes + 1, jnp.uint8))


def test_pack_unpack_of_a_sampled_nstep_batch():
    buf = ReplayBuffer(30, {"image": ((2, 3), np.uint8), "state": (2,)}, (1,), seed=4, n_step=3)
    rng = np.random.default_rng(0)
    n = 25
    buf.extend({"obs": {"image": rng.integers(0, 256, (n, 2, 3), dtype=np.uint8),
                        "state": rng.normal(size=(n, 2)).astype(np.float32)},
                "next_obs": {"image": rng.integers(0, 256, (n, 2, 3), dtype=np.uint8),
                             "state": rng.normal(size=(n, 2)).astype(np.float32)},
                "action": rng.normal(size=(n, 1)).astype(np.float32), "reward": rng.normal(size=n).astype(np.float32),
                "terminated": np.arange(n) % 7 == 6, "truncated": np.zeros(n, bool)})
    b = buf.sample(16)
    data, layout = b.pack()
    cols = jax.jit(layout.unpack)(data)
    np.testing.assert_array_equal(np.asarray(cols["discount"]), b.discount)
    np.testing.assert_array_equal(np.asarray(cols["next_obs"]["image"]), b.next_obs["image"])
    np.testing.assert_array_equal(np.asarray(cols["terminated"]), b.terminated)
