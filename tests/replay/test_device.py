"""Replay on a torch device (relive.replay.samplers.device), run on CPU tensors: the tree, the samplers' distributions
against their host twins, stale and invalid updates, checkpoints across backends, and the trainer end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst
from scipy import stats

from relive.replay import ReplayBuffer
from relive.replay.samplers import MixtureSampler, PrioritizedSampler, UniformSampler
from relive.replay.samplers.arb import ARBSampler
from relive.replay.samplers.device import (
    DeviceMixtureSampler,
    DevicePrioritizedSampler,
    DeviceUniformSampler,
    TorchScanLeaves,
    TorchSumTree,
    to_device_sampler,
)


def rows(n, start=0, obs_dim=3, end_every=0):
    t = np.arange(start, start + n, dtype=np.float32)
    terminated = np.zeros(n, bool)
    if end_every:
        terminated[(np.arange(n) + 1) % end_every == 0] = True
    return dict(obs=np.repeat(t[:, None], obs_dim, 1), action=np.stack([t, -t], 1), reward=t * 0.5,
                next_obs=np.repeat(t[:, None] + 1, obs_dim, 1), terminated=terminated, truncated=np.zeros(n, bool))


def chi2_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    keep = p > 0
    assert counts[~keep].sum() == 0, "a row of probability 0 was drawn"
    return stats.chisquare(counts[keep], p[keep] / p[keep].sum() * counts.sum()).pvalue


# -- the tree ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [1, 2, 7, 8, 9, 63, 64, 65, 517])
def test_tree_prefix_search_matches_cumsum(capacity):
    rng = np.random.default_rng(capacity)
    leaves = rng.random(capacity)
    leaves[rng.random(capacity) < 0.3] = 0.0
    leaves[rng.integers(capacity)] = 0.5  # at least one positive leaf
    tree = TorchSumTree(capacity, "cpu")
    tree.set_all(leaves)
    assert float(tree.total) == pytest.approx(leaves.sum(), rel=1e-12)
    mass = rng.random(5000) * leaves.sum()
    idx, value = tree.find_prefix(torch.as_tensor(mass))
    expected = np.minimum(np.searchsorted(np.cumsum(leaves), mass, side="right"), np.flatnonzero(leaves)[-1])
    np.testing.assert_array_equal(idx.numpy(), expected)
    np.testing.assert_array_equal(value.numpy(), leaves[expected])
    # the very top of the range (rounding) lands on the last positive leaf, never on a zero leaf
    idx, _ = tree.find_prefix(torch.tensor([leaves.sum() * (1 + 1e-12), np.nextafter(leaves.sum(), 0)]))
    assert (leaves[idx.numpy()] > 0).all()


@pytest.mark.parametrize("capacity", [1, 9, 517])
def test_scan_draws_the_same_leaves_as_the_tree(capacity):
    rng = np.random.default_rng(capacity)
    leaves = rng.random(capacity)
    leaves[rng.random(capacity) < 0.3] = 0.0
    leaves[rng.integers(capacity)] = 0.5
    tree, scan = TorchSumTree(capacity, "cpu"), TorchScanLeaves(capacity, "cpu")
    for layout in (tree, scan):
        layout.set_all(leaves)
    u = torch.as_tensor(np.r_[rng.random(3000), 0.0, np.nextafter(1.0, 0)])
    (i_tree, _, t_tree), (i_scan, v_scan, t_scan) = tree.draw(u), scan.draw(u)
    assert (leaves[i_scan.numpy()] > 0).all() and torch.equal(v_scan, torch.as_tensor(leaves)[i_scan])
    assert float(t_scan) == pytest.approx(float(t_tree), rel=1e-12)
    assert (i_tree == i_scan).float().mean() > 0.99  # (rounding differs only at a boundary between two leaves)
    scan.update(torch.tensor([3 % capacity, 3 % capacity]), torch.tensor([5.0, 7.0]))
    assert float(scan.leaves[3 % capacity]) == 7.0


def test_tree_update_recomputes_parents_and_last_duplicate_wins():
    tree = TorchSumTree(70, "cpu")
    tree.set_all(np.ones(70))
    idx = torch.tensor([3, 69, 3, 10, 69, 3])
    tree.update(idx, torch.tensor([5.0, 2.0, 7.0, 0.0, 4.0, 9.0]))
    expected = np.ones(70)
    expected[[3, 69, 10]] = [9.0, 4.0, 0.0]  # the last write of each index
    np.testing.assert_array_equal(tree.leaves.numpy(), expected)
    fresh = TorchSumTree(70, "cpu")
    fresh.set_all(expected)  # every level equals a tree built from the final leaves
    for a, b in zip(tree.levels, fresh.levels, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-12)


# -- samplers against their host twins ----------------------------------------------------------------------------
def twin_buffers(make_sampler, capacity=60, offline=20, online=75, seed=0):
    host = ReplayBuffer(capacity, 3, 2, sampler=make_sampler(), seed=seed)
    dev = ReplayBuffer(capacity, 3, 2, sampler=make_sampler(), seed=seed, backend="torch", device="cpu")
    for buf in (host, dev):
        if offline:
            buf.add_offline(rows(offline, 1000, end_every=7))
        buf.extend(rows(online, 0, end_every=9))  # wraps the ring: overwritten rows get the current max priority
    return host, dev


@pytest.mark.parametrize("layout", ["scan", "tree"])
def test_per_device_and_host_give_the_same_distribution_after_the_same_updates(layout):
    host, _ = twin_buffers(lambda: PrioritizedSampler(priority_exponent=0.7))
    _, dev = twin_buffers(lambda: DevicePrioritizedSampler(priority_exponent=0.7, layout=layout))
    rng = np.random.default_rng(1)
    for step in range(30):
        idx = rng.integers(0, len(host), 16)
        td = rng.normal(size=16) * (step + 1)
        for buf in (host, dev):
            info = buf.gather(idx).info
            buf.update(info, td_error=td)
        if step % 10 == 9:  # new rows while priorities vary: each gets the largest stored outside its slot
            for buf in (host, dev):
                buf.extend(rows(5, 500 + step))
    np.testing.assert_allclose(dev.sampler.probabilities(), host.sampler.probabilities(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("layout", ["scan", "tree"])
def test_per_device_draws_follow_its_probabilities_and_is_weights_are_exact(layout):
    _, dev = twin_buffers(lambda: DevicePrioritizedSampler(priority_exponent=1.0, is_exponent=0.5, layout=layout))
    assert dev.sampler.layout == layout
    slots = np.arange(len(dev))
    info = dev.gather(slots).info
    dev.update(info, td_error=np.linspace(0.0, 3.0, slots.size))  # priorities |td| + 1e-6: a wide spread
    p = dev.sampler.probabilities()
    counts = np.zeros(dev.capacity)
    for _ in range(800):
        batch = dev.sample(60)
        np.add.at(counts, batch.info.indices.numpy(), 1)
        got_p = batch.info.probability.numpy()
        np.testing.assert_allclose(got_p, p[batch.info.indices.numpy()], rtol=1e-12)
        # w_i = (N P_i)^-beta / max_j (N P_j)^-beta over the batch (Schaul et al. Sec. 3.4)
        w = (len(dev) * got_p) ** -0.5
        np.testing.assert_allclose(batch.info.is_weight.numpy(), w / w.max(), rtol=1e-6)
    assert chi2_pvalue(counts, p) > 1e-3
    swapped = p.copy()
    swapped[: len(dev)] = p[: len(dev)][::-1]  # a test that could not tell them apart would be worthless
    assert chi2_pvalue(counts, swapped) < 1e-6


@pytest.mark.parametrize("online", ["uniform", "per"])
def test_symmetric_split_is_exact_and_parts_follow_their_distributions(online):
    make_online = UniformSampler if online == "uniform" else PrioritizedSampler
    host, dev = twin_buffers(lambda: MixtureSampler(UniformSampler(), make_online(), offline_fraction=0.25))
    assert isinstance(dev.sampler, DeviceMixtureSampler)
    rng = np.random.default_rng(2)
    for _ in range(10):
        idx = rng.integers(0, len(host), 32)
        td = rng.normal(size=32) * 3
        for buf in (host, dev):
            buf.update(buf.gather(idx).info, td_error=td)
    np.testing.assert_allclose(dev.sampler.probabilities(40), host.sampler.probabilities(40), rtol=1e-12)
    counts = np.zeros(dev.capacity)
    for _ in range(300):
        batch = dev.sample(40)
        src = batch.info.source.numpy()
        assert (src == 0).sum() == 10 and (src == 1).sum() == 30  # round(40 * 0.25) offline, every batch
        np.add.at(counts, batch.info.indices.numpy(), 1)
    assert chi2_pvalue(counts, dev.sampler.probabilities(40)) > 1e-3


def test_uniform_device_sampler_is_uniform_over_the_stored_rows():
    _, dev = twin_buffers(UniformSampler, offline=0, online=45)
    assert isinstance(dev.sampler, DeviceUniformSampler)
    counts = np.zeros(dev.capacity)
    for _ in range(100):
        np.add.at(counts, dev.sample(40).info.indices.numpy(), 1)
    assert chi2_pvalue(counts, dev.sampler.probabilities()) > 1e-3
    assert counts[45:].sum() == 0


def test_strategies_without_a_device_version_are_refused_by_name():
    with pytest.raises(ValueError, match="ARBSampler has no device version.*uniform, per and mixtures"):
        to_device_sampler(ARBSampler())
    with pytest.raises(ValueError, match="n_step > 1 needs a host backend"):
        ReplayBuffer(10, 3, 2, backend="torch", n_step=3)
    with pytest.raises(ValueError, match="needs backend='torch'"):
        ReplayBuffer(10, 3, 2, device="cpu")


# -- batches and updates --------------------------------------------------------------------------------------------
def test_device_batch_holds_the_rows_of_its_indices_as_tensors():
    host, dev = twin_buffers(lambda: MixtureSampler(UniformSampler(), PrioritizedSampler()))
    batch = dev.sample(32)
    for value in (batch.obs, batch.action, batch.reward, batch.next_obs, batch.terminated, batch.info.indices,
                  batch.info.generation, batch.info.probability, batch.info.is_weight, batch.info.source):
        assert torch.is_tensor(value) and value.device.type == "cpu"
    ref = host.gather(batch.info.indices.numpy())
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(batch, name).numpy(), getattr(ref, name))
    np.testing.assert_array_equal(batch.info.generation.numpy(), ref.info.generation)
    np.testing.assert_array_equal(batch.info.source.numpy(), ref.info.source)


def test_dict_observations_and_extra_columns_on_the_device():
    obs = {"image": ((1, 2, 2), np.uint8), "state": (3,)}
    buf = ReplayBuffer(20, obs, 2, extra_columns={"mc_return": ()}, backend="torch")
    n = 6
    data = dict(obs={"image": np.arange(n * 4, dtype=np.uint8).reshape(n, 1, 2, 2), "state": np.ones((n, 3))},
                next_obs={"image": np.zeros((n, 1, 2, 2), np.uint8), "state": np.zeros((n, 3))},
                action=np.zeros((n, 2)), reward=np.arange(n, dtype=np.float32), terminated=np.zeros(n, bool),
                truncated=np.zeros(n, bool), mc_return=np.arange(n) * 2.0)
    buf.extend(data)
    buf.set_column("mc_return", [0, 1], [7.0, 8.0])
    batch = buf.sample(6)
    idx = batch.info.indices.numpy()
    assert batch.obs["image"].dtype == torch.uint8
    np.testing.assert_array_equal(batch.obs["image"].numpy(), data["obs"]["image"][idx])
    expected_mc = np.where(idx == 0, 7.0, np.where(idx == 1, 8.0, idx * 2.0))
    np.testing.assert_array_equal(batch.mc_return.numpy(), expected_mc)


@pytest.mark.parametrize("layout", ["scan", "tree"])
def test_stale_and_non_finite_updates_keep_the_priority_and_are_counted(layout):
    buf = ReplayBuffer(10, 3, 2, sampler=DevicePrioritizedSampler(priority_exponent=1.0, layout=layout),
                       backend="torch")
    buf.extend(rows(10))
    info = buf.gather(np.array([0, 1, 2, 3])).info
    buf.extend(rows(2, 100))  # overwrites slots 0 and 1: their updates are stale
    before = buf.sampler.tree.leaves.clone()
    report = buf.update(info, td_error=torch.tensor([5.0, 5.0, float("nan"), 2.0]))
    assert int(report.num_stale) == 2 and int(report.num_updated) == 1
    leaves = buf.sampler.tree.leaves
    assert torch.equal(leaves[:3], before[:3])  # stale rows 0, 1 and the NaN row 2 keep theirs
    assert float(leaves[3]) == pytest.approx(2.0 + 1e-6)
    with pytest.warns(UserWarning, match="1 replay update rows had a non-finite signal"):
        s = buf.stats()
    assert s["replay/num_stale"] == 2 and s["replay/num_invalid_signals"] == 1
    with pytest.raises(ValueError, match="signal 'td_error': expected shape"):
        buf.update(buf.gather(np.array([4, 5])).info, td_error=torch.zeros(3))
    buf.update(buf.gather(np.array([4, 5])).info, priority=torch.tensor([7, 9], dtype=torch.uint8))  # any real dtype
    assert buf.sampler.tree.leaves[4:6].tolist() == [7.0, 9.0]
    for bad in (torch.tensor([True, False]), torch.tensor([1 + 1j, 2j])):
        with pytest.raises(ValueError, match="expected numbers"):
            buf.update(buf.gather(np.array([4, 5])).info, priority=bad)


@pytest.mark.parametrize("layout", ["scan", "tree"])
def test_new_rows_get_the_largest_priority_stored_outside_the_rows_they_overwrite(layout):
    buf = ReplayBuffer(4, 3, 2, sampler=DevicePrioritizedSampler(priority_exponent=1.0, eps=0.0, layout=layout),
                       backend="torch")
    buf.extend(rows(4))
    buf.update(buf.gather(np.arange(4)).info, td_error=np.array([9.0, 1.0, 2.0, 3.0]))
    buf.extend(rows(1, 50))  # overwrites slot 0, which held the largest (9): the new row gets 3, not 9
    np.testing.assert_array_equal(buf.sampler.tree.leaves.numpy(), [3.0, 1.0, 2.0, 3.0])


# -- checkpoints ---------------------------------------------------------------------------------------------------
def test_device_checkpoint_round_trip_draws_the_same_next_batches(tmp_path):
    _, dev = twin_buffers(lambda: MixtureSampler(UniformSampler(), PrioritizedSampler()))
    dev.update(dev.sample(16).info, td_error=np.arange(16.0))
    dev.save(tmp_path / "b")
    loaded = ReplayBuffer.load(tmp_path / "b")
    assert loaded.on_device and isinstance(loaded.sampler, DeviceMixtureSampler)
    for _ in range(3):
        a, b = dev.sample(16), loaded.sample(16)
        assert torch.equal(a.info.indices, b.info.indices) and torch.equal(a.obs, b.obs)
        dev.update(a.info, td_error=a.reward)
        loaded.update(b.info, td_error=b.reward)
    np.testing.assert_array_equal(dev.sampler.probabilities(16), loaded.sampler.probabilities(16))
    config = json.loads((tmp_path / "b" / "MANIFEST.json").read_text())
    assert "torch" in json.dumps(config)


def test_host_checkpoint_loads_onto_a_device_and_back(tmp_path):
    host, _ = twin_buffers(lambda: PrioritizedSampler(priority_exponent=0.8))
    host.update(host.gather(np.arange(30)).info, td_error=np.linspace(-2, 2, 30))
    host.save(tmp_path / "host")
    dev = ReplayBuffer.load(tmp_path / "host", device="cpu")
    assert isinstance(dev.sampler, DevicePrioritizedSampler)
    np.testing.assert_allclose(dev.sampler.probabilities(), host.sampler.probabilities(), rtol=1e-12)
    np.testing.assert_array_equal(dev.storage.read("obs", np.arange(len(host))), host.storage.read("obs",
                                                                                                  np.arange(len(host))))
    dev.save(tmp_path / "dev")  # a device buffer's checkpoint loads back onto its device by default
    back = ReplayBuffer.load(tmp_path / "dev")
    assert back.on_device


def test_device_checkpoint_loads_onto_the_host(tmp_path):
    _, dev = twin_buffers(lambda: MixtureSampler(UniformSampler(), PrioritizedSampler(priority_exponent=0.7)))
    dev.update(dev.sample(32).info, td_error=np.linspace(-3, 3, 32))
    dev.save(tmp_path / "dev")
    host = ReplayBuffer.load(tmp_path / "dev", device="host")
    assert not host.on_device and host.storage.backend == "ram" and type(host.sampler) is MixtureSampler
    np.testing.assert_allclose(host.sampler.probabilities(), dev.sampler.probabilities(), rtol=1e-12)
    idx = np.arange(len(dev))
    for col in ("obs", "action", "reward", "next_obs"):
        np.testing.assert_array_equal(host.storage.read(col, idx), dev.storage.read(col, idx))
    assert host.num_updated == dev.num_updated == 32 and host.num_stale == dev.num_stale
    batch = host.sample(16)  # a working host buffer: NumPy batches, updates land in the host tree
    assert isinstance(batch.obs, np.ndarray)
    before = host.sampler.probabilities()
    host.update(batch.info, td_error=np.full(16, 50.0))
    online = np.unique(batch.info.indices[batch.info.source == 1])
    assert len(online) and (host.sampler.probabilities()[online] > before[online]).all()
    memmap = ReplayBuffer(8, 3, 2, backend="memmap", directory=tmp_path / "mm")  # a host backend: as it was saved
    memmap.extend(rows(8))
    memmap.save(tmp_path / "mm_ckpt")
    memmap.close()  # (one buffer per memmap directory)
    assert ReplayBuffer.load(tmp_path / "mm_ckpt", device="host").storage.backend == "memmap"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_buffer_samples_and_updates_on_the_gpu():
    buf = ReplayBuffer(1000, 3, 2, sampler=PrioritizedSampler(), backend="torch", device="cuda")
    buf.extend(rows(1000))
    batch = buf.sample(256)
    assert batch.obs.is_cuda and batch.info.indices.is_cuda and batch.info.is_weight.is_cuda
    buf.update(batch.info, td_error=torch.ones(256, device="cuda"))
    assert buf.stats()["replay/num_stale"] == 0


# -- agents and the trainer ----------------------------------------------------------------------------------------
def test_sac_and_ddqn_signals_stay_tensors_for_a_device_batch():
    from relive.agents.ddqn import DDQN, DDQNConfig
    from relive.agents.sac import SAC, SACConfig

    buf = ReplayBuffer(64, 3, 2, sampler=PrioritizedSampler(), backend="torch")
    buf.extend(rows(64))
    sac = SAC(3, 2, -np.ones(2), np.ones(2), SACConfig(hidden=(16, 16)), seed=0)
    result = sac.update(buf.sample(32))
    assert torch.is_tensor(result.signals["td_error"]) and result.signals["td_error"].shape == (32,)
    buf.update(buf.sample(32).info, **result.signals)
    host = ReplayBuffer(64, 3, 2, sampler=PrioritizedSampler())
    host.extend(rows(64))
    assert isinstance(sac.update(host.sample(32)).signals["td_error"], np.ndarray)
    dbuf = ReplayBuffer(64, 3, (), action_dtype=np.int64, sampler=PrioritizedSampler(), backend="torch")
    data = rows(64)
    dbuf.extend(data | {"action": np.arange(64) % 2})
    ddqn = DDQN(3, 2, DDQNConfig(hidden=(16,)), seed=0)
    out = ddqn.update(dbuf.sample(16))
    assert torch.is_tensor(out.signals["td_error"]) and np.isfinite(out.metrics["train/loss"])


def test_sac_trains_on_dict_observations_from_a_device_buffer():
    """Vector keys concatenated by the flat encoder on the device (no round trip through NumPy)."""
    from relive.agents.sac import SAC, SACConfig

    buf = ReplayBuffer(32, {"a": (2,), "b": (1,)}, 2, sampler=PrioritizedSampler(), backend="torch")
    n = 32
    rng = np.random.default_rng(0)
    obs = {"a": rng.normal(size=(n, 2)), "b": rng.normal(size=(n, 1))}
    buf.extend(dict(obs=obs, next_obs=obs, action=rng.uniform(-1, 1, (n, 2)), reward=rng.normal(size=n),
                    terminated=np.zeros(n, bool), truncated=np.zeros(n, bool)))
    sac = SAC(3, 2, -np.ones(2), np.ones(2), SACConfig(hidden=(16, 16), encoder="flat"), seed=0)
    batch = buf.sample(16)
    from relive.agents.networks import concat_keys

    flat = concat_keys(batch.obs)  # on the device's tensors, not through NumPy (which fails for CUDA tensors)
    assert torch.is_tensor(flat) and flat.shape == (16, 3) and flat.dtype == torch.float32
    np.testing.assert_array_equal(flat.numpy(), np.concatenate([batch.obs["a"].numpy(), batch.obs["b"].numpy()], 1))
    result = sac.update(batch)
    assert torch.is_tensor(result.signals["td_error"]) and np.isfinite(result.metrics["train/critic_loss"])
    buf.update(batch.info, **result.signals)


def test_trainer_runs_end_to_end_with_the_replay_on_a_device(tmp_path):
    from relive.config import override
    from relive.presets import get_preset
    from relive.train.trainer import train

    cfg = get_preset("sac")
    cfg = override(cfg, ["env.id=Pendulum-v1", "replay.name=per", "replay.device=cpu", "agent.hidden=[32,32]",
                         "schedule.num_online_env_steps=600", "schedule.num_warmup_env_steps=200",
                         "schedule.batch_size=32", "run.eval_every_env_steps=300", "run.eval_episodes=1",
                         "run.log_every_env_steps=200", "run.checkpoint_every_env_steps=400",
                         "replay.capacity=1000", f"run.run_dir={tmp_path / 'run'}", "run.progress=false"])
    train(cfg)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(np.isfinite(x.get("train/critic_loss", 0.0)) for x in lines)
    logged = [x for x in lines if "replay/num_stale" in x]
    assert logged and logged[-1]["replay/online_fraction"] == 1.0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["replay"]["device"] == "cpu"


# -- random operation sequences: the device buffer and the host buffer agree ------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(seed=hst.integers(0, 2**16), capacity=hst.integers(4, 40), offline=hst.integers(0, 10),
       kind=hst.sampled_from(["per", "symmetric_per", "per_tree"]), n_streams=hst.integers(1, 3))
def test_random_operations_keep_device_and_host_buffers_identical(seed, capacity, offline, kind, n_streams):
    """Writes of any length (longer than the ring too), several streams, updates with duplicate and stale rows,
    zero and huge TD errors: after every step the device sampler's probabilities equal the host sampler's, and a
    batch of given slots holds the same rows."""
    rng = np.random.default_rng(seed)
    offline = min(offline, capacity - 2)

    def make(device):
        if kind == "per_tree" and device:
            return DevicePrioritizedSampler(priority_exponent=0.7, layout="tree")
        per = PrioritizedSampler(priority_exponent=0.7)
        return per if kind != "symmetric_per" else MixtureSampler(UniformSampler(), per, 0.5)

    host = ReplayBuffer(capacity, 3, 2, sampler=make(False), seed=seed)
    dev = ReplayBuffer(capacity, 3, 2, sampler=make(True), seed=seed, backend="torch")
    if offline:
        for buf in (host, dev):
            buf.add_offline(rows(offline, 5000, end_every=3))
    written = [0] * n_streams
    for step in range(25):
        if rng.random() < 0.4 or len(host) == offline:
            k = int(rng.integers(n_streams))
            n = int(rng.integers(1, capacity + 4))
            data = rows(n, 10_000 * (k + 1) + written[k], end_every=int(rng.integers(2, 9)))
            written[k] += n
            for buf in (host, dev):
                buf.extend(data, stream=k)
        else:
            idx = rng.integers(0, len(host), int(rng.integers(1, 12)))
            td = rng.normal(size=idx.size) * 10.0 ** rng.integers(-8, 8)
            td[rng.random(idx.size) < 0.2] = 0.0
            infos = [buf.gather(idx).info for buf in (host, dev)]
            if rng.random() < 0.3:  # rows written after the gather: stale for both
                data = rows(2, 90_000 + step)
                for buf in (host, dev):
                    buf.extend(data, stream=0)
            host.update(infos[0], td_error=td)
            dev.update(infos[1], td_error=torch.as_tensor(td))
        p_host = host.sampler.probabilities(8) if kind == "symmetric_per" else host.sampler.probabilities()
        p_dev = dev.sampler.probabilities(8) if kind == "symmetric_per" else dev.sampler.probabilities()
        np.testing.assert_allclose(p_dev, p_host, rtol=1e-9, atol=1e-15)
    slots = np.arange(len(host))
    np.testing.assert_array_equal(dev.gather(slots).obs, host.gather(slots).obs)
    assert dev.stats()["replay/num_stale"] == host.stats()["replay/num_stale"]


@pytest.mark.parametrize("backend", ["ram", "torch"])
def test_updates_naming_slots_never_written_are_refused_by_index_on_both_backends(backend, monkeypatch):
    """Indices of slots never written (or outside the buffer) are refused with the same message on the host and on
    the device, before any priority changes; the device checks only indices it did not draw itself (a draw of its
    own names stored slots: no host check, no sync)."""
    import dataclasses

    buf = ReplayBuffer(10, 3, 2, sampler=PrioritizedSampler(priority_exponent=1.0), seed=0, backend=backend)
    buf.extend(rows(4))
    info = buf.sample(2).info
    gen = buf.storage.meta["generation"] if backend == "ram" else None
    before = buf.sampler.probabilities().copy()
    for bad, pos in (([2, 7], 1), ([-1, 0], 0), ([3, 10], 1)):
        as_t = torch.tensor(bad) if backend == "torch" else np.array(bad)
        stored_gen = (buf.storage.generation_tensor.index_select(0, torch.tensor(bad).clamp(0, 9)) if backend == "torch"
                      else gen.take(np.clip(bad, 0, 9)))
        forged = dataclasses.replace(info, indices=as_t, generation=stored_gen)
        msg = rf"index {bad[pos]} at position {pos} does not exist: stored slots are 0\.\.3"
        with pytest.raises(ValueError, match=msg):
            buf.update(forged, td_error=torch.ones(2) if backend == "torch" else np.ones(2))
    np.testing.assert_array_equal(buf.sampler.probabilities(), before)
    assert (buf.sampler.probabilities()[4:] == 0).all()
    if backend == "torch":  # the buffer's own draws go through without the host check
        calls = []
        real = buf.storage.check_slots
        monkeypatch.setattr(buf.storage, "check_slots", lambda s: calls.append(s) or real(s))
        buf.update(buf.sample(3).info, td_error=torch.ones(3))
        assert calls == []
        buf.update(dataclasses.replace(info, indices=info.indices.clone()), td_error=torch.ones(2))
        assert len(calls) == 1  # a copy is not known: checked (and accepted: its slots are stored)
