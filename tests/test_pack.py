"""Batch.pack (issue 49 item 2): one aligned byte buffer and its layout -- NumPy only, so it runs without jax; the
JAX side (JaxLayout.unpack inside jit) is in tests/test_jax.py."""

from __future__ import annotations

import numpy as np
import pytest

from relive.replay import MixtureSampler, ReplayBuffer
from relive.types import Batch, SampleInfo


def read(data: np.ndarray, layout, path: tuple[str, ...]) -> np.ndarray:
    """One column read back from the bytes with NumPy, by the layout's entry for ``path``."""
    (dtype, shape, at), = [(d, s, a) for p, d, s, a in layout.columns if p == path]
    count = int(np.prod(shape, dtype=np.int64))
    return data[at:at + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)


def hand_batch() -> Batch:
    info = SampleInfo(indices=np.array([3, 1, 4]), generation=np.zeros(3, np.int64), probability=np.full(3, 1 / 3),
                      is_weight=np.array([1.0, 0.5, 0.25]), source=np.ones(3, np.int8))
    return Batch(obs={"image": np.arange(12, dtype=np.uint8).reshape(3, 2, 2), "state": np.eye(3)},
                 action=np.array([[0.5], [-1.0], [0.25]], np.float32), reward=np.array([1.0, 2.0, 3.0], np.float32),
                 next_obs={"image": np.arange(12, 24, dtype=np.uint8).reshape(3, 2, 2), "state": -np.eye(3)},
                 terminated=np.array([0.0, 1.0, 0.0], np.float32), truncated=np.array([False, False, True]),
                 info=info, extras={"step": np.array([7, 8, 9], np.int64)}, discount=np.array([0.9, 0.0, 0.81]))


def test_pack_holds_every_column_at_its_offset_with_the_promised_dtypes():
    b = hand_batch()
    data, layout = b.pack()
    assert data.dtype == np.uint8 and data.ctypes.data % 64 == 0 and layout.nbytes == data.nbytes
    expect = {("obs", "image"): b.obs["image"], ("obs", "state"): b.obs["state"].astype(np.float32),
              ("next_obs", "image"): b.next_obs["image"], ("next_obs", "state"): -np.eye(3, dtype=np.float32),
              ("action",): b.action, ("reward",): b.reward, ("terminated",): np.array([False, True, False]),
              ("truncated",): b.truncated, ("step",): np.array([7, 8, 9], np.int32),
              ("discount",): b.discount.astype(np.float32), ("is_weight",): np.array([1.0, 0.5, 0.25], np.float32)}
    assert {p for p, *_ in layout.columns} == set(expect)
    for path, want in expect.items():
        got = read(data, layout, path)
        assert got.dtype == want.dtype, path  # (64-bit -> 32-bit, flags -> bool, is_weight float32)
        np.testing.assert_array_equal(got, want, err_msg=str(path))
    spans = sorted((a, a + int(np.prod(s)) * np.dtype(d).itemsize) for _, d, s, a in layout.columns)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))  # (no two columns overlap)
    dtypes = [d for _, d, _, _ in sorted(layout.columns, key=lambda c: c[3])]
    assert all(dtypes.index(d) == i or dtypes[i - 1] == d for i, d in enumerate(dtypes))  # one run per dtype


def test_pack_x64_cast_and_one_layout_object_per_layout():
    b = hand_batch()
    data, layout = b.pack(x64=True, dtype=np.float16)
    assert read(data, layout, ("step",)).dtype == np.int64  # (kept 64-bit on request)
    assert read(data, layout, ("obs", "state")).dtype == np.float16
    assert read(data, layout, ("reward",)).dtype == np.float16
    assert read(data, layout, ("obs", "image")).dtype == np.uint8  # (the cast is for float columns only)
    assert b.pack()[1] is b.pack()[1]  # the same layout, the same object (jit's static-argument cache hits)
    assert hash(layout) == hash(b.pack(x64=True, dtype=np.float16)[1]) and layout != b.pack()[1]


def test_pack_of_sampled_batches_and_sequences():
    buf = ReplayBuffer(40, (2,), (1,), sampler=MixtureSampler(offline_fraction=0.5), seed=2)
    n = 30
    rows = {"obs": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "action": np.zeros((n, 1), np.float32),
            "reward": np.arange(n, dtype=np.float32),
            "next_obs": np.arange(2, 2 * n + 2, dtype=np.float32).reshape(n, 2),
            "terminated": np.arange(n) % 9 == 8, "truncated": np.zeros(n, bool)}
    buf.add_offline({k: v[:10] for k, v in rows.items()})
    buf.extend({k: v[10:] for k, v in rows.items()})
    b = buf.sample(8)
    data, layout = b.pack()
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_array_equal(read(data, layout, (name,)), getattr(b, name))
    np.testing.assert_array_equal(read(data, layout, ("is_weight",)), b.info.is_weight.astype(np.float32))
    seq = buf.sample_sequences(4, 3)
    data, layout = seq.pack()
    np.testing.assert_array_equal(read(data, layout, ("mask",)), seq.mask)
    np.testing.assert_array_equal(read(data, layout, ("obs",)), seq.obs)
    assert read(data, layout, ("obs",)).shape == (4, 3, 2)


def test_unpack_without_jax_names_the_extra(monkeypatch):
    import sys

    data, layout = hand_batch().pack()
    monkeypatch.setitem(sys.modules, "jax", None)
    from relive.extras import MissingExtra

    with pytest.raises(MissingExtra, match="JaxLayout.unpack needs jax"):
        layout.unpack(data)
