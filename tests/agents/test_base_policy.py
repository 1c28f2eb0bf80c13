"""Loading frozen base policies of every kind: BC directories, SAC run / agent directories, TorchScript and
safetensors MLPs; frozen parameters; shape checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from relive.agents.base_policy import BasePolicy, load_base_policy, save_mlp_safetensors
from relive.agents.bc import BCConfig, new_policy, save_bc_policy
from relive.agents.sac import SAC, SACConfig
from relive.replay.checkpoint import save_tree
from relive.train.envs import EnvSpec

OBS, ACT = 4, 2


@pytest.fixture(autouse=True)
def _one_thread():
    """The machine's cores are shared: one torch thread (and restore the caller's setting)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
LOW, HIGH = np.array([-1.0, -2.0], np.float32), np.array([1.0, 2.0], np.float32)


def spec(obs=OBS, act=ACT) -> EnvSpec:
    return EnvSpec("Toy-v0", (obs,), False, (act,), 0, -np.ones(act, np.float32), np.ones(act, np.float32), 20)


def obs_batch(n=16, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, OBS)).astype(np.float32)


def bc_policy(seed=0):
    return new_policy(OBS, ACT, LOW, HIGH, BCConfig(hidden=(16, 16)), seed)


def expected(module, obs):
    with torch.no_grad():
        return module(torch.as_tensor(obs)).numpy()


def test_bc_directory_loads_and_matches(tmp_path):
    policy = bc_policy()
    save_bc_policy(tmp_path / "bc", policy, {"note": "test"})
    obs = obs_batch()
    for path in (tmp_path / "bc", tmp_path / "bc" / "policy"):
        base = load_base_policy(path, spec())
        np.testing.assert_array_equal(base(obs), expected(policy, obs))
        assert base.action_dim == ACT and base(obs).dtype == np.float32
        assert "behaviour-cloning" in base.describe() and str(path) in base.describe()
    assert base(obs[0]).shape == (ACT,)  # a single observation gives a single action


def test_base_policy_is_frozen_and_bit_identical_after_use(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    base = load_base_policy(tmp_path / "bc", spec())
    before = {k: v.clone() for k, v in base.module.state_dict().items()}
    digest = base.digest()
    assert not base.module.training
    assert all(not p.requires_grad for p in base.module.parameters())
    for i in range(5):
        base(obs_batch(seed=i))
        out = base.torch(torch.as_tensor(obs_batch(seed=i), dtype=torch.float32))
        assert not out.requires_grad
    # an optimizer on anything downstream cannot reach the base: a loss through base.torch has no graph
    x = torch.tensor(obs_batch(), requires_grad=True)
    assert base.torch(x).grad_fn is None
    assert base.digest() == digest
    for k, v in base.module.state_dict().items():
        assert torch.equal(v, before[k]), k


def _sac(hidden=(32, 32), seed=3):
    return SAC(OBS, ACT, LOW, HIGH, SACConfig(hidden=hidden), seed=seed)


def _write_run(tmp_path, agent, hidden=(32, 32)):
    from relive.config import override, save_config
    from relive.presets import get_preset

    run = tmp_path / "run"
    save_tree(run / "agent_final", agent.state_dict(), kind="agent")
    cfg = override(get_preset("sac"), [f"agent.hidden={list(hidden)}"])
    save_config(cfg, run / "config.json")
    return run


def test_sac_run_and_agent_directories_give_the_deterministic_mean_action(tmp_path):
    agent = _sac()
    run = _write_run(tmp_path, agent)
    obs = obs_batch()
    want = agent.act(obs, explore=False)  # center + scale * tanh(mu(s)), clipped to the box
    for path in (run, run / "agent_final"):
        base = load_base_policy(path, spec())
        np.testing.assert_allclose(base(obs), want, rtol=0, atol=1e-6)
        assert "SAC actor" in base.describe()
    # an agent directory without a run around it: hidden sizes read off the weights
    save_tree(tmp_path / "lone_agent", agent.state_dict(), kind="agent")
    np.testing.assert_allclose(load_base_policy(tmp_path / "lone_agent", spec())(obs), want, atol=1e-6)


def test_ddpg_agent_directory_gives_its_deterministic_actor(tmp_path):
    from relive.agents.ddpg import DDPG, DDPGConfig

    agent = DDPG(OBS, ACT, LOW, HIGH, DDPGConfig(hidden=(16, 8)), seed=2)
    save_tree(tmp_path / "ddpg_agent", agent.state_dict(), kind="agent")
    base = load_base_policy(tmp_path / "ddpg_agent", spec())
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(agent.actor, obs), atol=1e-6)
    assert "DDPG" in base.describe()


def test_sac_run_whose_config_disagrees_with_the_weights_is_rejected(tmp_path):
    run = _write_run(tmp_path, _sac(hidden=(32, 32)), hidden=(64, 64))
    with pytest.raises(ValueError, match=r"hidden=\(64, 64\).*\(32, 32\)"):
        load_base_policy(run, spec())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_module_loads(tmp_path):
    class Lin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(OBS, ACT)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return torch.tanh(self.lin(obs))

    torch.manual_seed(0)
    m = Lin()
    path = tmp_path / "policy.pt"
    torch.jit.save(torch.jit.script(m), str(path))
    base = load_base_policy(path, spec())
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(m, obs), atol=1e-6)
    assert base.kind == "TorchScript"
    d = base.digest()
    base(obs)
    assert base.digest() == d


def test_safetensors_mlp_loads(tmp_path):
    pytest.importorskip("safetensors")
    policy = bc_policy(seed=5)
    with torch.no_grad():
        policy.obs_mean.fill_(0.5)
    path = save_mlp_safetensors(policy, tmp_path / "mlp")
    obs = obs_batch()
    for p in (path, path.with_suffix(".json")):
        np.testing.assert_array_equal(load_base_policy(p, spec())(obs), expected(policy, obs))
    # the description must match the tensors
    arch = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps(arch | {"hidden": [8, 8]}))
    with pytest.raises(ValueError, match="shape"):
        load_base_policy(path, spec())
    path.with_suffix(".json").unlink()
    with pytest.raises(ValueError, match="JSON description"):
        load_base_policy(path, spec())


def test_wrong_action_shape_names_both_shapes(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    with pytest.raises(ValueError, match=r"\(1, 2\).*expects \(1, 3\)"):
        load_base_policy(tmp_path / "bc", spec(act=3))


def test_wrong_observation_size_is_rejected(tmp_path):
    save_bc_policy(tmp_path / "bc", bc_policy(), {})
    with pytest.raises(ValueError, match=r"\(4,\).*\(5,\)"):
        load_base_policy(tmp_path / "bc", spec(obs=5))


def test_unknown_paths_and_discrete_specs_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_base_policy(tmp_path / "nothing", spec())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a run directory"):
        load_base_policy(tmp_path / "empty", spec())
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match="TorchScript"):
        load_base_policy(tmp_path / "x.txt", spec())
    discrete = EnvSpec("CartPole-v1", (4,), True, (), 2, None, None, 500)
    with pytest.raises(ValueError, match="continuous"):
        load_base_policy(tmp_path / "x.txt", discrete)


def test_base_policy_rejects_wrong_observation_batches(tmp_path):
    base = BasePolicy(bc_policy(), OBS, ACT, "test", "memory")
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        base(np.zeros((3, 5), np.float32))


def test_exported_program_loads(tmp_path):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(OBS, 8), torch.nn.ReLU(), torch.nn.Linear(8, ACT), torch.nn.Tanh())
    batch = torch.export.Dim("batch", min=1)
    prog = torch.export.export(m, (torch.zeros(2, OBS),), dynamic_shapes=({0: batch},))
    torch.export.save(prog, str(tmp_path / "policy.pt2"))
    base = load_base_policy(tmp_path / "policy.pt2", spec())
    obs = obs_batch()
    np.testing.assert_allclose(base(obs), expected(m, obs), atol=1e-6)
