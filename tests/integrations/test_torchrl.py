"""relive's buffer behind TorchRL's interface, with TorchRL's own loss modules (no mocks): priorities from the
losses' td_error, IS weights in the losses, exact offline shares, pickle-free state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("torchrl")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule  # noqa: E402
from torchrl.envs import GymEnv  # noqa: E402
from torchrl.modules import MLP, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator  # noqa: E402
from torchrl.objectives import DQNLoss, SACLoss, SoftUpdate  # noqa: E402

from relive.integrations.torchrl import ReliveTensorDictReplayBuffer  # noqa: E402
from relive.replay import MixtureSampler, PrioritizedSampler, UniformSampler  # noqa: E402

pytestmark = pytest.mark.usefixtures("torchrl_quiet")  # (tests/integrations/conftest.py)


def _rollout(env_id: str, steps: int, seed: int = 0):
    env = GymEnv(env_id)
    env.set_seed(seed)
    return env, env.rollout(steps, break_when_any_done=False)


def _dqn(env):
    actor = QValueActor(MLP(out_features=env.action_spec.shape[-1], num_cells=[32]), in_keys=["observation"],
                        spec=env.action_spec)
    return DQNLoss(actor, action_space=env.action_spec, delay_value=True)


def test_dqn_loss_updates_relive_priorities():
    env, data = _rollout("CartPole-v1", 300)
    rb = ReliveTensorDictReplayBuffer(1_000, sampler=PrioritizedSampler(priority_exponent=0.7), batch_size=32)
    rb.extend(data)
    loss_fn = _dqn(env)
    updater = SoftUpdate(loss_fn, eps=0.95)
    opt = torch.optim.Adam(loss_fn.parameters(), lr=1e-3)
    for _ in range(10):
        sample = rb.sample()
        loss = loss_fn(sample)["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        updater.step()
        report = rb.update_tensordict_priority(sample)
        assert report.num_updated == 32
    # the last batch's rows now hold td_error^alpha (TorchRL's meaning of a priority; the last write of a row wins)
    idx, td = sample["index"].numpy(), sample["td_error"].reshape(-1).numpy()
    last = {int(i): float(v) for i, v in zip(idx, td, strict=True)}
    p = rb.relive.sampler.probabilities()
    a, b = list(last)[:2]
    assert p[a] / p[b] == pytest.approx((last[a] / last[b]) ** 0.7, rel=1e-4)
    assert rb.relive.num_updated == 320


def test_priority_weights_enter_the_dqn_loss():
    """TorchRL's DQNLoss reduces with the batch's ``priority_weight``: sum_i w_i l_i / sum_i w_i, l_i its td_error."""
    env, data = _rollout("CartPole-v1", 100)
    rb = ReliveTensorDictReplayBuffer(1_000, sampler=PrioritizedSampler(priority_exponent=1.0, is_exponent=1.0),
                                      batch_size=64)
    rb.extend(data)
    rb.update_priority(torch.arange(100), torch.linspace(0.1, 10.0, 100))
    sample = rb.sample()
    w = sample["priority_weight"]
    assert w.min() < 0.2 and w.max() == 1.0  # precondition: the weights differ
    loss_fn = _dqn(env)
    loss = loss_fn(sample)["loss"]
    per_row = sample["td_error"].reshape(-1)
    assert float(loss) == pytest.approx(float((w * per_row).sum() / w.sum()), rel=1e-5)
    assert float(loss) != pytest.approx(float(per_row.mean()), rel=1e-3)


def _sac(env):
    actor_net = torch.nn.Sequential(MLP(in_features=3, out_features=2, num_cells=[32]), NormalParamExtractor())
    actor = ProbabilisticActor(TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], distribution_class=TanhNormal,
                               distribution_kwargs={"low": -2.0, "high": 2.0}, spec=env.action_spec)
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[32]), in_keys=["observation", "action"])
    return SACLoss(actor, qvalue, num_qvalue_nets=2)


def test_sac_loss_on_offline_and_online_rows_exact_share():
    env, offline = _rollout("Pendulum-v1", 200, seed=1)
    _, online = _rollout("Pendulum-v1", 400, seed=2)
    rb = ReliveTensorDictReplayBuffer(
        150, batch_size=40, offline=offline,
        sampler=MixtureSampler(offline=UniformSampler(), online=PrioritizedSampler(), offline_fraction=0.25))
    loss_fn = _sac(env)
    opt = torch.optim.Adam(loss_fn.parameters(), lr=3e-4)
    for chunk in online.split(50):  # 400 online rows through a ring of 150: offline rows stay
        rb.extend(chunk)
        sample = rb.sample()
        assert int((sample["index"] < 200).sum()) == 10  # exactly round(40 * 0.25) offline rows
        losses = loss_fn(sample)
        total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
        opt.zero_grad()
        total.backward()
        opt.step()
        rb.update_tensordict_priority(sample)
    assert (rb.relive.num_offline, rb.relive.num_online) == (200, 150)
    torch.testing.assert_close(torch.as_tensor(rb.relive.storage.columns["obs"][:200]), offline["observation"])
    assert rb.relive.num_updated > 0


def test_state_dict_is_plain_tensors_and_reloads_to_the_same_batches(tmp_path):
    _, data = _rollout("CartPole-v1", 200)
    rb = ReliveTensorDictReplayBuffer(500, sampler=PrioritizedSampler(), batch_size=16, seed=3)
    rb.extend(data)
    s = rb.sample()
    rb.update_priority(s["index"], torch.rand(16) + 0.1)
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    rb.dumps(tmp_path / "rb_dir")
    a = ReliveTensorDictReplayBuffer(500, batch_size=16)
    a.load_state_dict(torch.load(tmp_path / "rb.pt", weights_only=True))
    b = ReliveTensorDictReplayBuffer(500, batch_size=16)
    b.loads(tmp_path / "rb_dir")
    for _ in range(3):
        want = rb.sample()
        for other in (a, b):
            got = other.sample()
            torch.testing.assert_close(got["index"], want["index"])
            torch.testing.assert_close(got["observation"], want["observation"])
            torch.testing.assert_close(got["priority_weight"], want["priority_weight"])


def test_stale_rows_are_skipped_and_streams_kept():
    _, data = _rollout("CartPole-v1", 60)
    rb = ReliveTensorDictReplayBuffer(50, sampler=PrioritizedSampler(), batch_size=8)
    rb.extend(data[:40])
    s = rb.sample()
    rb.extend(data[40:])  # overwrites the ring's first 10 slots
    report = rb.update_priority(s["index"], torch.ones(8))  # the generation comes from the matching draw
    overwritten = (s["index"] < 10).numpy()
    assert report.num_stale == int(overwritten.sum())
    two = TensorDict.stack([data[:30], data[30:60]])  # [2 envs, 30 steps]: two streams
    rb2 = ReliveTensorDictReplayBuffer(100)
    rb2.extend(two)
    assert sorted(np.unique(rb2.relive.storage.meta["stream"][:60]).tolist()) == [0, 1]
    with pytest.raises(ValueError, match="lacks the key"):
        rb2.extend(TensorDict({"observation": torch.zeros(3, 4)}, batch_size=[3]))


def _transitions(n: int, done) -> TensorDict:
    nxt = TensorDict({"observation": torch.randn(n, 4), "reward": torch.randn(n, 1),
                      "done": torch.as_tensor(done).reshape(n, 1)}, batch_size=[n])
    return TensorDict({"observation": torch.randn(n, 4), "action": torch.randn(n, 2), "next": nxt}, batch_size=[n])


def test_a_done_flag_other_than_0_or_1_is_refused_not_cast_to_true():
    """Issue 44: ``done = 2`` was cast to True; a flag is bool or 0 / 1, as relive's ``extend`` requires."""
    rb = ReliveTensorDictReplayBuffer(50)
    with pytest.raises(ValueError, match=r"\('next', 'done'\) row 2: expected a boolean flag .* got 2"):
        rb.extend(_transitions(4, [0, 0, 2, 0]))
    assert len(rb) == 0
    rb.extend(_transitions(4, [0, 0, 1, 0]))  # 0 / 1 numbers: fine
    rb.extend(_transitions(2, torch.tensor([False, True])))
    assert rb.relive.storage.columns["terminated"][:6].tolist() == [False, False, True, False, False, True]


@pytest.mark.parametrize("state", [{"relive": {}}, {"relive": {"config": {}}}, {"relive": None}])
def test_an_incomplete_state_is_one_checkpoint_error(state):
    """Issue 44: ``load_state_dict({"relive": {}})`` raised a raw KeyError."""
    from relive.replay.checkpoint import CheckpointError

    rb = ReliveTensorDictReplayBuffer(50)
    with pytest.raises(CheckpointError, match="from_state_dict: .*(has no field '(config|storage)'|mapping)"):
        rb.load_state_dict(state)
